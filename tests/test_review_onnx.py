"""The ONNX frontend and the model readers against hostile input: model files that are not
regular files or are too large, external data that lies about its size or names no usable file,
attributes an op does not have, attributes that restate a shape wrongly, and graphs whose size
once made the frontend's time grow faster than the graph."""

from __future__ import annotations

import os
import time
import tracemalloc

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_one_line_error, run_cli
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import load_graph
from kernel_compiler.frontends.onnx import parse_onnx

IR_VERSION = 10  # onnx 1.23 writes 14, which onnxruntime 1.3x refuses
GIB = 1 << 30


def model(nodes: list, inputs: dict[str, list[int]], outputs: list[str], initializers: list | None = None,
          opset: int = 17) -> onnx.ModelProto:
    """A model of `nodes` on float inputs of the shapes given; its outputs typed by inference."""
    infos = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()]
    graph = helper.make_graph(nodes, "review", infos, [onnx.ValueInfoProto(name=o) for o in outputs],
                              initializers or [])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR_VERSION
    return m


def external(name: str, dims: list[int], entries: dict[str, str], data_type: int = TensorProto.FLOAT):
    """An initializer whose data lives in an external file, as `entries` (location, offset,
    length) say."""
    tensor = onnx.TensorProto(name=name, data_type=data_type, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return tensor


def save(m: onnx.ModelProto, path) -> str:
    path.write_bytes(m.SerializeToString())
    return str(path)


def refused(path: str) -> str:
    with pytest.raises(CompileError) as info:
        load_graph(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


# ---- model files: regular files only, bounded -------------------------------------------------


def test_cli_refuses_a_fifo_as_the_model_at_once(tmp_path):
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)  # reading it would block until a writer came
    out = tmp_path / "m.kpu"
    started = time.monotonic()
    proc = run_cli("compiler", fifo, "-o", out)
    line = assert_one_line_error(proc, str(fifo), "a FIFO, not a regular file")
    assert line.endswith(f"{fifo}: cannot read: a FIFO, not a regular file"), line
    assert time.monotonic() - started < 60 and not out.exists()


def test_a_model_linked_to_a_device_is_refused_unread(tmp_path):
    link = tmp_path / "zero.dfg"
    link.symlink_to("/dev/zero")  # read whole, it never ends
    assert refused(str(link)) == f"{link}: cannot read: a device, not a regular file"


@pytest.mark.parametrize("name, size, words", [("big.hlo", 300 << 20, "300 MB, larger than the 256 MB a .hlo"),
                                               ("big.json", 300 << 20, "300 MB, larger than the 256 MB a .json"),
                                               ("big.onnx", 3 * GIB, "3 GB, larger than the 2 GB a .onnx")])
def test_a_model_file_larger_than_its_kind_may_be_is_refused_before_reading(tmp_path, name, size, words):
    path = tmp_path / name
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no disk, and nothing is read
    tracemalloc.start()
    try:
        message = refused(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message == f"{path}: {words} model may be"
    assert peak < 16 << 20


# ---- external data: exactly the tensor's bytes, from a regular file in the model's folder -----


def test_external_data_without_length_reads_only_the_tensors_bytes_of_a_huge_file(tmp_path):
    """A tensor of 4 floats at offset 4096 of a 1 GiB sparse file, no `length`: 16 bytes are read
    (the whole file once was, and handed to shape inference)."""
    w = np.array([1.5, -2.0, 3.25, 0.5], np.float32)
    with open(tmp_path / "blob.bin", "wb") as f:
        f.truncate(GIB)
        f.seek(4096)
        f.write(w.tobytes())
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [4]}, ["y"],
              [external("w", [4], {"location": "blob.bin", "offset": "4096"})])
    path = save(m, tmp_path / "m.onnx")
    assert os.path.getsize(path) < 200
    tracemalloc.start()
    try:
        graph, _ = load_graph(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert graph.constants["w"] == w.tobytes()
    assert peak < 64 << 20


def test_shape_inference_never_sees_the_weights_but_reads_external_shapes(tmp_path, monkeypatch):
    """Weights kept external join the model after shape inference (which serializes the model it
    is given); an int64 shape kept external is there for it to read."""
    w = np.random.default_rng(0).uniform(-1, 1, 1 << 18).astype(np.float32)  # 1 MB
    shape = np.array([512, 512], np.int64)
    (tmp_path / "data.bin").write_bytes(w.tobytes() + shape.tobytes())
    nodes = [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["y"])]
    m = model(nodes, {"x": [1 << 18]}, ["y"],
              [external("w", [1 << 18], {"location": "data.bin", "length": str(w.nbytes)}),
               external("shape", [2], {"location": "data.bin", "offset": str(w.nbytes)}, TensorProto.INT64)])
    path = save(m, tmp_path / "m.onnx")
    seen = []
    infer = onnx.shape_inference.infer_shapes

    def spy(proto, *args, **kwargs):
        seen.append(proto.ByteSize())
        return infer(proto, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    graph, _ = load_graph(path)
    assert len(seen) == 1 and seen[0] < 4096
    assert graph.constants["w"] == w.tobytes()
    assert graph.tensors["y"].shape == (512, 512)
    assert "shape" not in graph.tensors  # read at compile time, as an inline shape is


@pytest.mark.parametrize("dims, entries, file_bytes, reason", [
    ([4], {"location": "w.bin", "length": "8"}, 16,
     "tensor 'w': external data length 8 differs from the 16 bytes its 4 FLOAT elements take"),
    ([4], {"location": "w.bin"}, 12,
     "tensor 'w': external data file 'w.bin': its 12 bytes end before the 16 its data takes from offset 0"),
    ([4], {"location": "w.bin", "offset": "8"}, 16,
     "tensor 'w': external data file 'w.bin': its 16 bytes end before the 16 its data takes from offset 8"),
    ([4], {"location": "w.bin", "offset": "-1"}, 16, "tensor 'w': external data offset '-1' is not a number of bytes"),
    ([1 << 30], {"location": "w.bin"}, 16,
     "tensor 'w': its external data (4 GB) would take the model's past the 2 GB the ONNX frontend reads"),
    ([4], {"location": "w\0.bin"}, 16,
     "tensor 'w': external data file 'w\\x00.bin': a file name cannot hold a NUL character"),
    ([4], {"location": "a" * 5000}, 16,
     f"tensor 'w': external data file '{'a' * 100}...{'a' * 60}': cannot read: File name too long"),
    ([4], {"location": "../w.bin"}, 16, "tensor 'w': external data file '../w.bin' is outside the model's folder"),
])
def test_external_data_that_does_not_hold_the_tensor_is_refused_naming_it(tmp_path, dims, entries, file_bytes,
                                                                          reason):
    (tmp_path / "w.bin").write_bytes(bytes(file_bytes))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(bytes(file_bytes))
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": dims}, ["y"], [external("w", dims, entries)])
    path = save(m, folder / "m.onnx")
    assert refused(path).startswith(f"{path}: {reason}")


@pytest.mark.parametrize("make, reason", [
    (lambda f: os.mkfifo(f), "cannot read: not a regular file"),
    (lambda f: f.symlink_to("/dev/zero"), "is outside the model's folder"),
])
def test_external_data_in_a_fifo_or_a_device_is_never_read(tmp_path, make, reason):
    make(tmp_path / "w.bin")
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [4]}, ["y"],
              [external("w", [4], {"location": "w.bin"})])
    path = save(m, tmp_path / "m.onnx")
    message = refused(path)
    assert message.startswith(f"{path}: tensor 'w': external data file 'w.bin'") and reason in message


def test_cli_refuses_a_nul_in_an_external_location_in_one_line(tmp_path):
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [4]}, ["y"],
              [external("w", [4], {"location": "w\0.bin"})])
    path = save(m, tmp_path / "m.onnx")
    assert_one_line_error(run_cli("compiler", path, "-o", tmp_path / "m.kpu"), path, "tensor 'w'", "NUL")
    assert not (tmp_path / "m.kpu").exists()


# ---- attributes: only those of the op's schema, and none restating a shape wrongly ------------


W3 = numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")


def _duplicated(node):
    node.attribute.extend([helper.make_attribute("axis", 0)])
    return node


@pytest.mark.parametrize("node, x, inits, opset, reason", [
    (helper.make_node("Conv", ["x", "w"], ["y"], name="c", stride=[2, 2]), [1, 2, 6, 6], [W3], 17,
     "node 'c' (Conv): attribute 'stride' is not one of Conv's in opset 17 (those are: auto_pad, dilations, group, "
     "kernel_shape, pads, strides)"),
    (helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.1), [4], [], 17,
     "node 'r' (Relu): attribute 'alpha' is not one of Relu's in opset 17 (those are: none)"),
    (helper.make_node("Softmax", ["x"], ["y"], name="s", axes=[1]), [2, 4], [], 11,
     "node 's' (Softmax): attribute 'axes' is not one of Softmax's in opset 11 (those are: axis)"),
    (helper.make_node("MaxPool", ["x"], ["y"], name="p", kernel=[2, 2]), [1, 2, 6, 6], [], 17,
     "node 'p' (MaxPool): attribute 'kernel' is not one of MaxPool's in opset 17"),
    (helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=1.0), [1, 2, 6, 6], [W3], 17,
     "node 'c' (Conv): attribute 'group' must be of type INT, got FLOAT"),
    (_duplicated(helper.make_node("Softmax", ["x"], ["y"], name="s", axis=1)), [2, 4], [], 17,
     "node 's' (Softmax): attribute 'axis' is given twice"),
    (helper.make_node("Cast", ["x"], ["y"], name="k"), [4], [], 17, "node 'k' (Cast): required attribute 'to' is missing"),
    (helper.make_node("Gelu", ["x"], ["y"], name="g"), [4], [], 17,
     "node 'g' (Gelu): not an op of opset 17, which the model imports"),
    (helper.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[2, 2]), [1, 2, 6, 6], [W3], 17,
     "node 'c' (Conv): kernel_shape [2, 2] differs from the weights' spatial dims [3, 3]"),
    (helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="t", kernel_shape=[3, 2]), [1, 3, 5, 5], [W3], 17,
     "node 't' (ConvTranspose): kernel_shape [3, 2] differs from the weights' spatial dims [3, 3]"),
    (helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=2), [1, 2, 6, 6], [W3], 17,
     "node 'c' (Conv): input [1, 2, 6, 6] has 2 channels, weights [3, 2, 3, 3] take 2 per group x 2 group(s) = 4"),
])
def test_a_node_onnxruntime_refuses_is_refused_naming_it(node, x, inits, opset, reason):
    m = model([node], {"x": x}, ["y"], inits, opset)
    with pytest.raises(CompileError) as info:
        parse_onnx("bad.onnx", m.SerializeToString())
    assert str(info.value).startswith(f"bad.onnx: {reason}"), str(info.value)
    with pytest.raises(Exception):  # the reference refuses the model too, when loaded or when run
        session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones(x, np.float32)})


def test_a_kernel_shape_that_agrees_with_the_weights_is_taken():
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2])], {"x": [1, 2, 7, 7]},
              ["y"], [W3])
    graph, _ = parse_onnx("ok.onnx", m.SerializeToString())
    assert graph.tensors["y"].shape == (1, 3, 3, 3)  # (7 - 3) // 2 + 1: the strides were read


# ---- the frontend's time grows with the graph, no faster --------------------------------------


def _same_named_chain(n: int) -> onnx.ModelProto:
    names = ["x", *[f"t{i}" for i in range(1, n)], "y"]
    return model([helper.make_node("Relu", [names[i]], [names[i + 1]], name="n") for i in range(n)], {"x": [4]}, ["y"])


def _max_of_many(n: int) -> onnx.ModelProto:
    return model([helper.make_node("Max", [f"x{i}" for i in range(n)], ["y"])], {f"x{i}": [2] for i in range(n)},
                 ["y"])


def _constant_outputs(n: int) -> onnx.ModelProto:
    """Each initializer read by an Add and itself a graph output."""
    inits = [numpy_helper.from_array(np.full([2], i, np.float32), f"c{i}") for i in range(n)]
    nodes = [helper.make_node("Add", ["x", f"c{i}"], [f"y{i}"]) for i in range(n)]
    return model(nodes, {"x": [2]}, [*[f"y{i}" for i in range(n)], *[f"c{i}" for i in range(n)]], inits)


def _pools_then_relus(n: int) -> onnx.ModelProto:
    """n MaxPools whose Indices outputs nothing reads, then 5n Relus."""
    names = ["x", *[f"t{i}" for i in range(1, 6 * n)], "y"]
    pools = [helper.make_node("MaxPool", [names[i]], [names[i + 1], f"idx{i}"], kernel_shape=[1, 1]) for i in range(n)]
    relus = [helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(n, 6 * n)]
    return model(pools + relus, {"x": [1, 2, 4, 4]}, ["y"])


@pytest.mark.parametrize("make, n", [(_same_named_chain, 10000), (_max_of_many, 10000), (_constant_outputs, 3000),
                                     (_pools_then_relus, 2000)])
def test_large_graphs_parse_in_time_linear_in_their_size(make, n):
    """Each took 30 s to minutes (here about 2 s at most) when names were found by trying one
    suffix after another from the start, a result's readers by scanning the later nodes, and
    constant outputs renamed by a pass over the graph each."""
    data = make(n).SerializeToString()
    started = time.perf_counter()
    graph, _ = parse_onnx("big.onnx", data)
    assert time.perf_counter() - started < 10
    assert max(len(op.name) for op in graph.ops) < 20  # names do not grow with the graph


def test_op_names_of_same_named_nodes_are_numbered():
    graph, _ = parse_onnx("n.onnx", _same_named_chain(4).SerializeToString())
    assert [op.name for op in graph.ops] == ["n", "n_1", "n_2", "n_3"]


def test_a_pools_indices_read_by_a_later_node_are_refused():
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[1, 1], name="p"),
             helper.make_node("Relu", ["p"], ["r"]), helper.make_node("Cast", ["idx"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, {"x": [1, 2, 4, 4]}, ["r", "y"])
    with pytest.raises(CompileError) as info:
        parse_onnx("bad.onnx", m.SerializeToString())
    assert str(info.value) == "bad.onnx: node 'p' (MaxPool): its Indices output is not supported"


def test_a_constant_output_read_by_ops_keeps_its_name_and_value():
    c = np.array([1.0, -2.0], np.float32)
    m = model([helper.make_node("Add", ["x", "c"], ["y"])], {"x": [2]}, ["y", "c"], [numpy_helper.from_array(c, "c")])
    graph, _ = parse_onnx("c.onnx", m.SerializeToString())
    assert [t.name for t in graph.outputs] == ["y", "c"]
    (copy,) = [op for op in graph.ops if op.outputs == ["c"]]
    (add,) = [op for op in graph.ops if op.outputs == ["y"]]
    assert add.inputs[1] == copy.inputs[0] and graph.constants[copy.inputs[0]] == c.tobytes()


def test_numeric_warnings_on_constants_never_reach_stderr(tmp_path):
    """Folding a BatchNormalization whose variance is negative takes the square root of it: NaN
    is the model's data, and numpy's RuntimeWarning (two lines of source on stderr) is not for
    the user."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    constants = {"w": np.ones((2, 2, 1, 1), np.float32), "s": np.ones(2, np.float32), "b": np.zeros(2, np.float32),
                 "m": np.zeros(2, np.float32), "v": np.array([-4.0, 1.0], np.float32)}
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]),
                               helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
                              "g", [x], [y], [numpy_helper.from_array(v, n) for n, v in constants.items()])
    path = tmp_path / "negative_variance.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    proc = run_cli("compiler", path, "-o", tmp_path / "m.kpu")
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
