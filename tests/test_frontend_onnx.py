"""The ONNX frontend: models built with onnx.helper, compiled, bound and executed in-process,
against onnxruntime's results on the same inputs; its refusals, each one line; one CLI run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import CONFIGS, assert_one_line_error, run_cli
from dfx import dumps, loads, numpy_dtype, tolerance
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import load_graph
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.passes import canonicalise
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs

STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
IR_VERSION = 10  # onnx 1.23 writes 14, which onnxruntime 1.3x refuses


def model(nodes: list, inputs: dict[str, np.ndarray], outputs: list[str],
          initializers: dict[str, np.ndarray] | None = None, opset: int = 17,
          dims: dict[str, list] | None = None) -> onnx.ModelProto:
    """A model of `nodes`; its inputs typed and shaped as the arrays given for them (or `dims`),
    its outputs typed by shape inference."""
    infos = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                           (dims or {}).get(name, list(a.shape))) for name, a in inputs.items()]
    inits = [numpy_helper.from_array(a, name) for name, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "test", infos, [onnx.ValueInfoProto(name=o) for o in outputs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR_VERSION
    return m


def kpu_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray], name: str = "test.onnx"):
    """Compile for `standard` (written and read back, so the validator sees it), bind and execute;
    (every tensor's value, program, frontend warnings)."""
    graph, warnings = parse_onnx(name, m.SerializeToString())
    graph = infer_shapes(graph, warnings)
    program = loads(dumps(compile_graph(graph, name, TARGET)))
    bindings = bind_program(program, MACHINE, name, bind_greedy)
    given = {k: v.astype(numpy_dtype(program.graph.tensors[k].dtype)) for k, v in feeds.items()
             if k in program.graph.tensors}
    return execute(program, bindings, program_inputs(program, given, 0)), program, warnings


def ort_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_matches_onnxruntime(m: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    values, program, warnings = kpu_run(m, feeds)
    want = ort_run(m, feeds)
    assert [t.name for t in program.graph.outputs] == list(want)  # the ONNX names, in order
    for name, expected in want.items():
        got = values[name]
        assert got.shape == expected.shape, name
        atol, rtol = tolerance(program.graph.tensors[name].dtype)
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=name)
    return program, warnings


def rand(*shape, seed=0, low=-2.0, high=2.0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


# ---- mappings against onnxruntime -------------------------------------------------------------


def test_mlp_with_gemm_and_initializers_keeps_onnx_names():
    w1, b1 = rand(16, 32, seed=1), rand(32, seed=2)
    w2, c2 = rand(10, 32, seed=3), rand(10, seed=4)
    nodes = [helper.make_node("MatMul", ["input.1", "w1"], ["h"], name="/fc1/MatMul"),
             helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w2", "c2"], ["logits/out"], transB=1, alpha=0.5, beta=2.0)]
    m = model(nodes, {"input.1": rand(8, 16)}, ["logits/out"], {"w1": w1, "b1": b1, "w2": w2, "c2": c2})
    program, _ = assert_matches_onnxruntime(m, {"input.1": rand(8, 16)})
    assert [t.name for t in program.graph.inputs if t.role == "input"] == ["input.1"]
    assert {"w1", "b1", "w2"} <= set(program.graph.constants)  # initializer values travel in the object
    assert program.graph.ops[0].source == "test.onnx: node '/fc1/MatMul' (MatMul)"


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, c_shape", [
    (0, 0, 1.0, 1.0, (5,)), (1, 0, 1.0, 0.0, None), (0, 1, 2.0, 0.5, (3, 5)), (1, 1, 0.25, 1.0, ()),
])
def test_gemm(trans_a, trans_b, alpha, beta, c_shape):
    a = rand(*((4, 3) if trans_a else (3, 4)), seed=1)
    b = rand(*((5, 4) if trans_b else (4, 5)), seed=2)
    inputs = {"a": a, "b": b} if c_shape is None else {"a": a, "b": b, "c": rand(*c_shape, seed=3)}
    node = helper.make_node("Gemm", list(inputs), ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    assert_matches_onnxruntime(model([node], inputs, ["y"]), inputs)


@pytest.mark.parametrize("a_shape, b_shape", [((5,), (2, 5, 3)), ((2, 3, 4), (4,)), ((4,), (4,)),
                                              ((2, 1, 3, 4), (5, 4, 6))])
def test_matmul_follows_numpy_matmul(a_shape, b_shape):
    feeds = {"a": rand(*a_shape, seed=1), "b": rand(*b_shape, seed=2)}
    assert_matches_onnxruntime(model([helper.make_node("MatMul", ["a", "b"], ["y"])], feeds, ["y"]), feeds)


def test_conv_batchnorm_relu_folds_the_batchnorm_into_the_conv():
    x = rand(1, 3, 9, 9)
    consts = {"w": rand(8, 3, 3, 3, seed=1), "b": rand(8, seed=2), "scale": rand(8, seed=3, low=0.5),
              "shift": rand(8, seed=4), "mean": rand(8, seed=5), "var": rand(8, seed=6, low=0.1, high=1)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    m = model(nodes, {"x": x}, ["y"], consts)
    program, _ = assert_matches_onnxruntime(m, {"x": x})
    graph, warnings = parse_onnx("t.onnx", m.SerializeToString())
    ops = [op.op_type for op in canonicalise(infer_shapes(graph, warnings), warnings).ops]
    assert "MUL" not in ops and "ADD" not in ops, ops  # folded into the CONV2D's weights and bias
    assert ops.count("CONV2D") == 1


def test_batchnorm_with_computed_statistics_is_the_formula():
    feeds = {"x": rand(2, 4, 3, 3), "scale": rand(4, seed=1), "bias": rand(4, seed=2), "mean": rand(4, seed=3),
             "var": rand(4, seed=4, low=0.1)}
    node = helper.make_node("BatchNormalization", list(feeds), ["y"])
    assert_matches_onnxruntime(model([node], feeds, ["y"], opset=15), feeds)


@pytest.mark.parametrize("attrs, x_shape, w_shape", [
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 4, 7, 8), (6, 4, 3, 3)),
    ({"auto_pad": "SAME_LOWER"}, (1, 4, 6, 6), (4, 4, 2, 2)),
    ({"auto_pad": "VALID", "group": 2}, (2, 4, 6, 5), (6, 2, 3, 2)),
    ({"group": 4, "pads": [1, 1, 1, 1]}, (1, 4, 5, 5), (8, 1, 3, 3)),  # depthwise, multiplier 2
    ({"pads": [2, 1], "strides": [2], "dilations": [2]}, (1, 3, 11), (5, 3, 3)),  # 1-D
])
def test_conv(attrs, x_shape, w_shape):
    feeds = {"x": rand(*x_shape)}
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    assert_matches_onnxruntime(model([node], feeds, ["y"], {"w": rand(*w_shape, seed=1)}), feeds)


@pytest.mark.parametrize("attrs, x_shape, w_shape, constant", [
    ({"strides": [2, 2]}, (1, 2, 3, 3), (2, 3, 3, 3), True),
    ({"strides": [3, 2], "pads": [1, 2, 1, 2], "output_padding": [1, 1]}, (1, 1, 3, 3), (1, 2, 3, 3), True),
    ({"group": 2, "dilations": [2, 1]}, (1, 4, 3, 4), (4, 1, 2, 3), False),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 1, 3, 3), (1, 2, 3, 3), True),
    ({"strides": [2], "pads": [3, 3]}, (1, 2, 4), (2, 2, 3), False),  # 1-D, pads beyond the kernel: cropped
])
def test_conv_transpose(attrs, x_shape, w_shape, constant):
    x, w, b = rand(*x_shape), rand(*w_shape, seed=1), rand(w_shape[1] * attrs.get("group", 1), seed=2)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    feeds = {"x": x} if constant else {"x": x, "w": w}
    m = model([node], feeds, ["y"], {"w": w, "b": b} if constant else {"b": b})
    assert_matches_onnxruntime(m, feeds)


@pytest.mark.parametrize("op, attrs, shape", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, (1, 3, 8, 9)),
    ("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}, (1, 2, 7, 7)),
    ("MaxPool", {"kernel_shape": [3], "auto_pad": "SAME_UPPER"}, (2, 3, 10)),  # 1-D
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1, 3, 6, 6)),
    ("AveragePool", {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1}, (1, 2, 5, 6)),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, (1, 2, 5, 5)),
    ("GlobalAveragePool", {}, (2, 5, 4, 3)),
])
def test_pooling(op, attrs, shape):
    feeds = {"x": rand(*shape)}
    assert_matches_onnxruntime(model([helper.make_node(op, ["x"], ["y"], **attrs)], feeds, ["y"], opset=19), feeds)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, axis", [(11, 1), (11, -2), (13, 1), (13, -1)])
def test_softmax_by_opset(op, opset, axis):
    feeds = {"x": rand(2, 3, 4, 5)}
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    assert_matches_onnxruntime(model([node], feeds, ["y"], opset=opset), feeds)


def test_layer_normalization_with_its_mean_and_inverse_std():
    feeds = {"x": rand(3, 4, 6)}
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"], axis=-2, epsilon=1e-3)
    m = model([node], feeds, ["y", "mean", "inv_std"], {"s": rand(4, 6, seed=1), "b": rand(6, seed=2)})
    program, _ = assert_matches_onnxruntime(m, feeds)
    assert "LAYERNORM" in [op.op_type for op in program.graph.ops]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    feeds = {"x": rand(4, 7, low=-4, high=4)}
    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    assert_matches_onnxruntime(model([node], feeds, ["y"], opset=20), feeds)


def test_elementwise_chain():
    feeds = {"a": rand(3, 4, seed=1), "b": rand(4, seed=2, low=0.5), "c": rand(3, 1, seed=3)}
    nodes = [helper.make_node("Sub", ["a", "c"], ["t0"]), helper.make_node("Div", ["t0", "b"], ["t1"]),
             helper.make_node("Abs", ["t1"], ["t2"]), helper.make_node("Sqrt", ["t2"], ["t3"]),
             helper.make_node("Pow", ["t3", "p"], ["t4"]), helper.make_node("Neg", ["t4"], ["t5"]),
             helper.make_node("Exp", ["t5"], ["t6"]), helper.make_node("Log", ["t6"], ["t7"]),
             helper.make_node("Reciprocal", ["b"], ["t8"]), helper.make_node("Mul", ["t7", "t8"], ["t9"]),
             helper.make_node("LeakyRelu", ["t9"], ["t10"], alpha=0.2), helper.make_node("Tanh", ["t10"], ["t11"]),
             helper.make_node("Sigmoid", ["t11"], ["t12"]), helper.make_node("Erf", ["t12"], ["y"])]
    assert_matches_onnxruntime(model(nodes, feeds, ["y"], {"p": np.array(1.5, np.float32)}), feeds)


def test_min_max_clip_where_and_comparisons():
    feeds = {"a": rand(3, 4, seed=1), "b": rand(4, seed=2), "c": rand(3, 1, seed=3), "lo": np.array(-0.5, np.float32)}
    nodes = [helper.make_node("Max", ["a", "b", "c"], ["mx"]), helper.make_node("Min", ["a", "b", "c"], ["mn"]),
             helper.make_node("Clip", ["mx", "", "one"], ["c1"]),  # constant bound: CLAMP
             helper.make_node("Clip", ["mn", "lo"], ["c2"]),  # computed bound: MAXIMUM
             helper.make_node("Less", ["c1", "c2"], ["lt"]), helper.make_node("Where", ["lt", "a", "c2"], ["w"]),
             helper.make_node("GreaterOrEqual", ["w", "c1"], ["ge"]), helper.make_node("Cast", ["ge"], ["y"], to=1)]
    m = model(nodes, feeds, ["y", "w"], {"one": np.array(1.0, np.float32)})
    program, _ = assert_matches_onnxruntime(m, feeds)
    assert "CLAMP" in [op.op_type for op in program.graph.ops]


def test_cast_to_half_and_to_bool():
    feeds = {"x": np.array([[0.0, 0.25, -3.5, np.nan], [6e4, -0.0, 2.0, 7.0]], np.float32)}
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["x"], ["t"], to=TensorProto.BOOL),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT)]
    assert_matches_onnxruntime(model(nodes, feeds, ["h", "y"]), feeds)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_layout_ops_by_opset(opset):
    """Reshape (0 and -1), Flatten, Squeeze and Unsqueeze (axes an attribute before 13, an input
    from it), Transpose, Split (sizes, then num_outputs from 18), Slice (steps 2 and -1), Gather
    (2-D indices), Concat, Identity."""
    x = rand(2, 3, 4, 1)
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    consts = {"shape": ints(0, -1, 2), "starts": ints(3, 0), "ends": ints(-5, 4), "axes2": ints(1, 2),
              "steps": ints(-1, 2), "idx": ints([[1, 0], [2, 2]])}
    axes_by_opset = opset >= 13
    if axes_by_opset:
        consts.update(sq=ints(3), unsq=ints(0, -1), split=ints(1, 2))
    nodes = [
        helper.make_node("Squeeze", ["x", "sq"] if axes_by_opset else ["x"], ["s"],
                         **({} if axes_by_opset else {"axes": [3]})),
        helper.make_node("Reshape", ["s", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Unsqueeze", ["t", "unsq"] if axes_by_opset else ["t"], ["u"],
                         **({} if axes_by_opset else {"axes": [0, -1]})),
        helper.make_node("Flatten", ["u"], ["f"], axis=2),
        helper.make_node("Slice", ["s", "starts", "ends", "axes2", "steps"], ["sl"]),
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=1),
        helper.make_node("Concat", ["g", "g"], ["cc"], axis=-1),
        helper.make_node("Identity", ["cc"], ["id"]),
    ]
    if opset >= 18:
        nodes.append(helper.make_node("Split", ["s"], ["p0", "p1"], axis=1, num_outputs=2))
    elif opset >= 13:
        nodes.append(helper.make_node("Split", ["s", "split"], ["p0", "p1"], axis=1))
    else:
        nodes.append(helper.make_node("Split", ["s"], ["p0", "p1"], axis=1, split=[1, 2]))
    m = model(nodes, {"x": x}, ["f", "sl", "id", "p0", "p1"], consts, opset=opset)
    program, _ = assert_matches_onnxruntime(m, {"x": x})
    assert not [t for t in program.graph.tensors.values() if t.dtype == "i32"]  # int64 shapes stay at compile time


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("axes, keepdims", [([1, -1], 1), ([0], 0), (None, 0)])
def test_reductions_by_opset(op, opset, axes, keepdims):
    feeds = {"x": rand(3, 4, 5)}
    as_input = axes is not None and (opset >= 18 or (op == "ReduceSum" and opset >= 13))
    inputs = ["x", "axes"] if as_input else ["x"]
    attrs = {"keepdims": keepdims, **({"axes": axes} if axes is not None and not as_input else {})}
    consts = {"axes": np.array(axes, np.int64)} if as_input else {}
    m = model([helper.make_node(op, inputs, ["y"], **attrs)], feeds, ["y"], consts, opset=opset)
    assert_matches_onnxruntime(m, feeds)


def test_reduce_with_empty_axes_and_noop_is_the_identity():
    feeds = {"x": rand(3, 4)}
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], noop_with_empty_axes=1)
    m = model([node], feeds, ["y"], {"axes": np.array([], np.int64)}, opset=13)
    program, _ = assert_matches_onnxruntime(m, feeds)
    assert [op.op_type for op in program.graph.ops] == ["RESHAPE"]


def test_constant_nodes_and_shape_arithmetic_are_evaluated_at_compile_time():
    feeds = {"x": rand(2, 6)}
    nodes = [helper.make_node("Constant", [], ["k"], value_ints=[3, 2]),
             helper.make_node("Constant", [], ["two"], value_int=2),
             helper.make_node("Mul", ["k", "two"], ["k2"]),  # [6, 4]: integer arithmetic, folded
             helper.make_node("Concat", ["one", "k2"], ["shape"], axis=0),
             helper.make_node("Constant", [], ["half"], value_float=0.5),
             helper.make_node("Reshape", ["x", "two_by"], ["r"]),
             helper.make_node("Mul", ["r", "half"], ["y"]),
             helper.make_node("Identity", ["shape"], ["shape_out"])]
    m = model(nodes, feeds, ["y", "shape_out"], {"one": np.array([1], np.int64), "two_by": np.array([3, 4], np.int64)})
    values, program, warnings = kpu_run(m, feeds)
    np.testing.assert_array_equal(values["shape_out"], [1, 6, 4])  # a known value, copied to the output
    np.testing.assert_allclose(values["y"], feeds["x"].reshape(3, 4) * 0.5)
    assert any("held in i32" in w and "shape_out" in w for w in warnings)


def test_dynamic_dims_read_as_one_with_a_warning():
    feeds = {"x": rand(1, 5)}
    m = model([helper.make_node("Relu", ["x"], ["y"])], feeds, ["y"], dims={"x": ["batch", 5]})
    program, warnings = assert_matches_onnxruntime(m, feeds)
    assert program.graph.tensors["x"].shape == (1, 5)
    assert warnings == ["test.onnx: dynamic dimensions read as 1: 'x' dim 0 ('batch')"]


def test_int64_data_is_held_in_i32_with_a_warning():
    feeds = {"a": np.array([[3, -7], [100, 5]], np.int64), "b": np.array([2, -3], np.int64)}
    m = model([helper.make_node("Add", ["a", "b"], ["y"])], feeds, ["y"])
    program, warnings = assert_matches_onnxruntime(m, feeds)
    assert program.graph.tensors["a"].dtype == "i32"
    assert any("held in i32" in w for w in warnings)


def test_int64_constant_beyond_i32_is_refused():
    feeds = {"a": np.array([1, 2], np.int64)}
    m = model([helper.make_node("Add", ["a", "big"], ["y"])], feeds, ["y"], {"big": np.array([2**40, 1], np.int64)})
    with pytest.raises(CompileError) as info:
        parse_onnx("big.onnx", m.SerializeToString())
    assert str(info.value) == ("big.onnx: node #0 (Add): constant 'big' holds values that i32, the type it would "
                               "be held in, cannot hold exactly")


def test_external_data_is_read_from_the_models_folder(tmp_path):
    w = rand(64, 32, seed=1)
    feeds = {"x": rand(4, 64)}
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], feeds, ["y"], {"w": w})
    onnx.save_model(m, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.weights", size_threshold=0)
    assert (tmp_path / "ext.weights").stat().st_size == w.nbytes
    graph, _ = load_graph(str(tmp_path / "ext.onnx"))
    assert np.frombuffer(graph.constants["w"], np.float32).tolist() == w.reshape(-1).tolist()
    (tmp_path / "ext.weights").unlink()
    with pytest.raises(CompileError) as info:
        load_graph(str(tmp_path / "ext.onnx"))
    assert str(info.value) == (f"{tmp_path / 'ext.onnx'}: tensor 'w': external data file 'ext.weights' not found "
                               f"in {tmp_path}")


@pytest.mark.parametrize("weight", ["inline", "external", "constant"])
def test_shape_inference_sees_the_tensors_it_reads_and_no_weights(tmp_path, monkeypatch, weight):
    # a 128 KB weight (inline, as the legacy exporter writes it; in a file; or a Constant node's,
    # listed after the initializers), a Resize whose float scales shape inference must read to
    # know its output's shape, and a 78 KB int64 table it propagates through Slice and Cast
    w = rand(256, 128, seed=2)
    feeds = {"x": rand(1, 1, 4, 256)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Resize", ["h", "", "scales"], ["r"], mode="nearest"),
             helper.make_node("Slice", ["table", "start", "end"], ["row"]),
             helper.make_node("Cast", ["row"], ["offset"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["r", "offset"], ["y"])]
    initializers = {"w": w, "scales": np.array([1, 1, 2, 0.5], np.float32),
                    "table": np.arange(10_000, dtype=np.int64) % 7, "start": np.array([3]), "end": np.array([67])}
    if weight == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(initializers.pop("w"))))
    m = model(nodes, feeds, ["y"], initializers)
    path, saved = tmp_path / "m.onnx", onnx.ModelProto()
    saved.CopyFrom(m)  # saving with external data moves the weights out of the proto it is given
    onnx.save_model(saved, path, save_as_external_data=weight == "external", location="m.weights", size_threshold=0)
    seen = []
    infer = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, **kw: seen.append(model.ByteSize()) or infer(model, **kw))
    graph, _ = load_graph(str(path))
    assert len(seen) == 1 and seen[0] < w.nbytes
    assert graph.tensors["y"].shape == (1, 1, 8, 64)
    assert np.frombuffer(graph.constants["w"], np.float32).tolist() == w.reshape(-1).tolist()
    assert_matches_onnxruntime(m, feeds)


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 64 * 1024])
def test_an_initializer_of_an_element_type_onnx_does_not_define_is_refused(size):
    # small, it is in the model shape inference sees; large, it is held aside: refused alike
    w = numpy_helper.from_array(np.zeros(size, np.float32), "w")
    w.data_type = 999
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": rand(size)}, ["y"], {})
    m.graph.initializer.append(w)
    with pytest.raises(CompileError) as info:
        parse_onnx("type.onnx", m.SerializeToString())
    assert str(info.value) == "type.onnx: initializer 'w': element type 999 is none ONNX defines"


def refusal(m: onnx.ModelProto | bytes, name: str = "bad.onnx") -> str:
    data = m if isinstance(m, bytes) else m.SerializeToString()
    with pytest.raises(CompileError) as info:
        graph, warnings = parse_onnx(name, data)
        compile_graph(infer_shapes(graph, warnings), name, TARGET)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{name}: "), message
    return message


def test_unknown_op_names_its_type_and_node():
    feeds = {"x": rand(2, 3)}
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unique", ["r"], ["y"], name="act/2")],
              feeds, ["y"])
    assert refusal(m) == "bad.onnx: 1 op type is not supported by the ONNX frontend: Unique (1 node: 'act/2')"
    unnamed = model([helper.make_node("StringNormalizer", ["x"], ["y"])], feeds, ["y"])
    assert refusal(unnamed) == ("bad.onnx: 1 op type is not supported by the ONNX frontend: StringNormalizer "
                                "(1 node: #0)")
    custom = model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="g")], feeds, ["y"])
    assert refusal(custom) == ("bad.onnx: 1 op type is not supported by the ONNX frontend: Gelu of domain "
                               "'com.microsoft' (1 node: 'g')")


def test_a_value_made_twice_is_refused():
    """ONNX assigns each value once; onnxruntime refuses a second writer, and so does the compiler
    rather than let the last one win."""
    twice = model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
                  {"x": rand(2, 3)}, ["y"])
    assert refusal(twice) == ("bad.onnx: node #1 (Neg): output 'y' is already defined (an input, an initializer or an "
                              "earlier node's output); each value is made once")


@pytest.mark.parametrize("cut", [1, 7, 0.5, -3])
def test_truncated_file(cut):
    data = model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(2, 3)}, ["y"]).SerializeToString()
    end = int(len(data) * cut) if isinstance(cut, float) else cut
    assert refusal(data[:end]).startswith("bad.onnx: ")


def test_refusals_name_the_node_and_the_reason():
    feeds = {"x": rand(2, 3)}
    shape_from_input = model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                             {"x": rand(2, 3), "s": np.array([3, 2], np.int64)}, ["y"])
    assert refusal(shape_from_input) == ("bad.onnx: node #0 (Reshape): its shape (input 1, 's') must be a constant: "
                                         "the ONNX frontend reads it at compile time")
    old = model([helper.make_node("Relu", ["x"], ["y"])], feeds, ["y"], opset=6)
    assert refusal(old).startswith("bad.onnx: opset 6 is not supported (the ONNX frontend reads opsets 7 to ")
    conv3d = model([helper.make_node("Conv", ["v", "w"], ["y"])], {"v": rand(1, 1, 3, 3, 3)}, ["y"],
                   {"w": rand(1, 1, 2, 2, 2)})
    assert "(Conv): Conv over 3 spatial dims is not supported" in refusal(conv3d)
    training = model([helper.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y", "m", "v"],
                                       training_mode=1)], {"x": rand(2, 3)}, ["y", "m", "v"], {"s": rand(3)}, opset=15)
    assert refusal(training) == ("bad.onnx: node #0 (BatchNormalization): training_mode 1 is not supported "
                                 "(inference only)")
    string = model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING)], feeds, ["y"])
    assert "element type STRING has no DFX dtype" in refusal(string)


def test_cli_refuses_an_unknown_op_with_exit_2_and_one_line(tmp_path):
    path = tmp_path / "bad.onnx"
    feeds = {"x": rand(2, 3)}
    onnx.save(model([helper.make_node("Unique", ["x"], ["y"], name="sp")], feeds, ["y"]), path)
    proc = run_cli("compiler", path, "-o", tmp_path / "bad.kpu")
    assert_one_line_error(proc, f"{path}: 1 op type is not supported by the ONNX frontend: Unique (1 node: 'sp')")
    assert not (tmp_path / "bad.kpu").exists()


def test_cli_compiles_and_the_loader_checks_an_onnx_model(tmp_path):
    path = tmp_path / "mlp.onnx"
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
    onnx.save(model(nodes, {"x": rand(4, 8)}, ["y"], {"w": rand(6, 8, seed=1), "b": rand(6, seed=2)}), path)
    compiled = run_cli("compiler", path, "-o", tmp_path / "mlp.kpu")
    assert compiled.returncode == 0, compiled.stderr
    checked = run_cli("loader", tmp_path / "mlp.kpu", "--config", STANDARD, "--check")
    assert checked.returncode == 0, checked.stderr


def test_a_small_transformer_encoder_layer_as_exporters_write_it():
    """Attention with reshaped heads and K transposed, softmax, residual adds, LayerNormalization
    and the erf GELU chain, against onnxruntime."""
    s, h, heads, ffn = 8, 16, 2, 32
    d = h // heads
    w = lambda *shape, seed: rand(*shape, seed=seed, low=-0.5, high=0.5)  # noqa: E731
    consts = {"wq": w(h, h, seed=1), "wk": w(h, h, seed=2), "wv": w(h, h, seed=3), "wo": w(h, h, seed=4),
              "w1": w(h, ffn, seed=5), "b1": w(ffn, seed=6), "w2": w(ffn, h, seed=7), "g": w(h, seed=8) + 1,
              "heads": np.array([1, s, heads, d], np.int64), "merged": np.array([1, s, h], np.int64),
              "scale": np.array(np.sqrt(d), np.float32), "sqrt2": np.array(np.sqrt(2), np.float32),
              "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "wq"], ["q0"]), mk("MatMul", ["x", "wk"], ["k0"]), mk("MatMul", ["x", "wv"], ["v0"]),
             mk("Reshape", ["q0", "heads"], ["q1"]), mk("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
             mk("Reshape", ["k0", "heads"], ["k1"]), mk("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             mk("Reshape", ["v0", "heads"], ["v1"]), mk("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
             mk("MatMul", ["q", "kt"], ["s0"]), mk("Div", ["s0", "scale"], ["s1"]),
             mk("Softmax", ["s1"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["a0"]),
             mk("Transpose", ["a0"], ["a1"], perm=[0, 2, 1, 3]), mk("Reshape", ["a1", "merged"], ["a2"]),
             mk("MatMul", ["a2", "wo"], ["a3"]), mk("Add", ["a3", "x"], ["r1"]),
             mk("LayerNormalization", ["r1", "g"], ["n1"], axis=-1, epsilon=1e-5),
             mk("MatMul", ["n1", "w1"], ["f0"]), mk("Add", ["f0", "b1"], ["f1"]),
             mk("Div", ["f1", "sqrt2"], ["e0"]), mk("Erf", ["e0"], ["e1"]), mk("Add", ["e1", "one"], ["e2"]),
             mk("Mul", ["f1", "e2"], ["e3"]), mk("Mul", ["e3", "half"], ["gelu"]),
             mk("MatMul", ["gelu", "w2"], ["f2"]), mk("Add", ["f2", "n1"], ["r2"]),
             mk("LayerNormalization", ["r2", "g"], ["y"], axis=-1)]
    feeds = {"x": rand(1, s, h)}
    program, _ = assert_matches_onnxruntime(model(nodes, feeds, ["y"], consts), feeds)
    assert [op.op_type for op in program.graph.ops].count("SOFTMAX") == 1
