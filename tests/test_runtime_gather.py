"""GATHER with its indices as an operand, read at run time (token ids): ONNX Gather, GatherElements
and GatherND of runtime indices against onnxruntime, in-process; the object's index tensor
(`IndexTensor`) written, read and validated; DRAM bytes of the rows moved whatever the indices;
an index out of range a one-line error of the loader."""

from __future__ import annotations

import numpy as np
import onnx
import orjson
import pytest
from onnx import helper

from conftest import assert_one_line_error, run_cli
from dfx import REGISTRY, DataMove, ObjectFileError, ShapeError, dumps, loads
from dfx.kernel import IndexTensor
from dfx.objfile import _digest
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.shape_inference import infer_shapes
from loader import bind_greedy, bind_program, program_tasks
from loader.execution import ExecutionError
from loader.report import dram_bytes
from loader.run import check_kernels, check_outputs
from test_frontend_onnx import MACHINE, TARGET, assert_matches_onnxruntime, kpu_run, model, rand
from test_vector_kernels import graph_of, random, run

VOCAB, WIDTH = 11, 8


def embedding(tokens: int) -> onnx.ModelProto:
    """Token ids (int64, [1, tokens]) look up rows of a [VOCAB, WIDTH] table, then a MatMul."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("MatMul", ["rows", "w"], ["y"])]
    return model(nodes, {"ids": np.zeros((1, tokens), np.int64)}, ["y"],
                 {"table": rand(VOCAB, WIDTH, seed=1), "w": rand(WIDTH, 5, seed=2)})


def compiled(m: onnx.ModelProto, name: str = "m.onnx") -> bytes:
    graph, warnings = parse_onnx(name, m.SerializeToString())
    return dumps(compile_graph(infer_shapes(graph, warnings), name, TARGET))


def test_an_embedding_lookup_then_a_matmul_matches_onnxruntime():
    ids = np.array([[3, -1, 0, VOCAB - 1, 3, -VOCAB]], np.int64)  # repeats, both ends, negatives
    program, _ = assert_matches_onnxruntime(embedding(ids.shape[1]), {"ids": ids})
    gather = next(k for k in program.kernels if k.op == "GATHER")
    (load,) = [op for op in gather.body if isinstance(op, DataMove) and op.source.table is not None]
    assert load.source.table == IndexTensor(0, load.source.table.tensor) and load.source.tensor == "table"
    assert program.graph.tensors["ids"].dtype == "i32"  # int64 ids held in i32


def test_the_gather_kernel_is_the_same_size_however_many_tokens():
    """The indices are a tensor the loader reads, not a list in the file: a thousand times the
    tokens changes the GATHER kernel by the digits of its numbers alone."""
    small, large = (next(k for k in orjson.loads(compiled(embedding(tokens)))["body"]["kernels"] if k["op"] == "GATHER")
                    for tokens in (6, 6000))
    assert small["body"] == large["body"] and len(orjson.dumps(large)) - len(orjson.dumps(small)) < 32
    assert small["tile_loops"][0]["end"] == 6 and large["tile_loops"][0]["end"] == 6000
    assert compiled(embedding(6)) == compiled(embedding(6))  # deterministic


def test_gather_along_axis_1_of_a_runtime_tensor_by_2d_indices():
    x = rand(3, 7, 4, seed=3)
    idx = np.array([[6, 0, -7], [2, 2, -1]], np.int64)
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"x": x, "i": idx}, ["y"])
    assert_matches_onnxruntime(m, {"x": x, "i": idx})


@pytest.mark.parametrize("axis", [0, 2])
def test_gather_elements_of_runtime_indices(axis):
    x = rand(3, 4, 5, seed=4)
    shape = [2, 3, 4]
    shape[axis] = 6  # along the axis the indices may be more than the data
    idx = np.random.default_rng(axis).integers(-x.shape[axis], x.shape[axis], shape).astype(np.int64)
    m = model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)], {"x": x, "i": idx}, ["y"])
    assert_matches_onnxruntime(m, {"x": x, "i": idx})
    # one index past its dim, whose flat position would be another element's: an error, not that element
    idx[1, 0, 0] = x.shape[axis]
    with pytest.raises(ExecutionError, match=r"index 60 at \[1, 0, 0\] of .* is out of range for dim 0"):
        kpu_run(m, {"x": x, "i": idx})


@pytest.mark.parametrize("batch_dims, idx", [
    (0, np.array([[1, -1], [0, 2], [1, 0]], np.int64)),  # pairs of (dim 0, dim 1): rows of 6
    (1, np.array([[[0, -1], [2, 3]], [[1, 0], [-3, 2]]], np.int64)),  # per batch, (dim 1, dim 2)
])
def test_gather_nd_of_runtime_indices(batch_dims, idx):
    x = rand(2, 3, 4, 6, seed=5)
    m = model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)], {"x": x, "i": idx}, ["y"])
    assert_matches_onnxruntime(m, {"x": x, "i": idx})


def test_the_registry_takes_the_indices_as_an_operand():
    gather = REGISTRY["GATHER"]
    attrs = gather.normalize_attrs({"axis": 1})
    x, idx = random((2, 5, 3)), np.array([4, -5, 2, 2], np.int32)
    assert gather.infer_shapes([x.shape, idx.shape], ["f32", "i32"], attrs) == [(2, 4, 3)]
    np.testing.assert_array_equal(gather.reference([x, idx], attrs, ["f32"])[0], np.take(x, idx, axis=1))
    # the picked elements' magnitudes, by the indices' values (never by their size)
    sizes = np.arange(30, dtype=np.float64).reshape(2, 5, 3)
    got = gather.magnitude([x.astype(np.float64), idx.astype(np.float64)], [sizes, np.zeros(4)], attrs, 1e-5)[0]
    np.testing.assert_array_equal(got, np.take(sizes, idx, axis=1))
    for shapes, dtypes, why in [([(5,), (2, 2)], ["f32", "i32"], r"index operand must be a 1-D integer tensor"),
                                ([(5,), (2,)], ["f32", "f32"], r"index operand must be a 1-D integer tensor"),
                                ([(5,)], ["f32"], r"as the attribute 'indices' or as a second operand")]:
        with pytest.raises(ShapeError, match=why):
            gather.infer_shapes(shapes, dtypes, gather.normalize_attrs({}))
    with pytest.raises(ShapeError, match="index 5 is out of range for axis 1 of size 5"):
        gather.reference([x, np.array([5], np.int32)], attrs, ["f32"])


def test_check_holds_a_runtime_gather_to_its_reference():
    picked = np.array([3, -1, 0], np.int32)
    program, values, _ = run(graph_of([("GATHER", ["x", "i"], {"axis": 0}), ("SIGMOID", ["t0"], {})],
                                      {"x": ((6, 10), "f32"), "i": ((3,), "i32")}),
                             {"x": random((6, 10)), "i": picked})
    assert all(c.passed for c in [*check_kernels(program, values).values(), *check_outputs(program, values).values()])
    values["t0"] = values["t0"][[1, 0, 2]]  # rows in another order than the indices say
    assert not check_kernels(program, values)[program.kernels[0].name].passed


def gather_program(rows: int, indices: np.ndarray):
    """GATHER of `rows` rows of a [rows, 24] f32 input by an i32 index input, run in-process."""
    g = graph_of([("GATHER", ["x", "i"], {"axis": 0})], {"x": ((rows, 24), "f32"), "i": (indices.shape, "i32")})
    x = random((rows, 24))
    program, values, sim = run(g, {"x": x, "i": indices})
    np.testing.assert_array_equal(values["t0"], np.take(x, indices, axis=0))
    return program, sim


def test_dram_bytes_are_the_rows_moved_whatever_the_indices():
    """Each row read and written once: rows x row bytes each way, the compiler's count and the
    simulator's alike. The simulator times the rows without their values (as --timing-only
    does): one DMA read of a row's bytes per index."""
    picked = np.array([0, 99, -1, 5, 5, 42, 7], np.int32)
    program, sim = gather_program(100, picked)
    moved = dram_bytes(sim)
    assert moved == {"read": len(picked) * 24 * 4, "write": len(picked) * 24 * 4}
    assert program.kernels[0].hints["estimated_dram_bytes"] == sum(moved.values())
    reads = [t.bytes for t in program_tasks(program, bind_program(program, MACHINE, "test", bind_greedy), MACHINE)
             if t.src_level == "EXTERNAL"]
    assert reads == [24 * 4] * len(picked)


def test_the_object_round_trips_and_a_gather_reading_an_unwritten_index_tensor_is_refused():
    data = compiled(embedding(4))
    assert dumps(loads(data)) == data
    gather = next(k for k in orjson.loads(data)["body"]["kernels"] if k["op"] == "GATHER")
    load = next(op for op in gather["body"] if "table" in op.get("source", {}))
    index = load["source"]["table"]["tensor"]  # the ids flattened: a view of them another kernel makes
    assert set(load["source"]["table"]) == {"dim", "tensor"}

    def refusal(edit) -> str:
        edited = orjson.loads(data)
        kernels = edited["body"]["kernels"]
        edit(kernels, next(k for k in kernels if k["op"] == "GATHER"))
        edited["sha256"] = _digest(edited["body"])
        with pytest.raises(ObjectFileError) as e:
            loads(orjson.dumps(edited), "e.kpu")
        return str(e.value)

    def without_barrier(kernels, gather):
        for op in gather["body"]:
            op["depends_on"] = [d for d in op.get("depends_on", []) if gather["body"][d]["type"] != "BARRIER"]

    def first(kernels, gather):  # before the kernel that writes its index tensor
        kernels.remove(gather)
        kernels.insert(0, gather)
        gather["depends_on"] = []

    def other_tensor(kernels, gather):
        next(op for op in gather["body"] if "table" in op.get("source", {}))["source"]["table"]["tensor"] = "w"

    assert f"reads intermediate '{index}' with no BARRIER ordering it after" in refusal(without_barrier)
    assert f"reads '{index}' before any kernel computes it" in refusal(first)
    assert "index tensor 'w' is not the index operand of a graph op of the kernel" in refusal(other_tensor)


def test_an_index_out_of_range_is_one_line_naming_the_tensor_and_the_index(tmp_path):
    obj, ids = tmp_path / "e.kpu", tmp_path / "ids.npy"
    obj.write_bytes(compiled(embedding(4)))
    np.save(ids, np.array([[2, -VOCAB, VOCAB, 0]], np.int64))  # -VOCAB wraps to row 0; VOCAB is past the end
    assert_one_line_error(run_cli("loader", obj, "--config", "standard", "--binder", "greedy", "--input", f"ids={ids}"),
                          f"index {VOCAB} at [0, 2] of 'ids' is out of range for dim 0 of 'table'")
