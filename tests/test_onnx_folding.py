"""Constant folding in the ONNX frontend: nodes whose inputs are all known are evaluated at
compile time (shape chains as legacy exporters write them, float arithmetic on initializers),
Identity and Dropout vanish, and a folded result past the limit is a one-line refusal. Each
compiled model runs against onnxruntime."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from test_frontend_onnx import assert_matches_onnxruntime, model, rand, refusal


def ops_of(program) -> list[str]:
    return [op.op_type for op in program.graph.ops]


def fill(value: float, dtype=np.float32):
    """ConstantOfShape's `value` attribute."""
    return numpy_helper.from_array(np.array([value], dtype))


def test_constant_of_shape_of_an_initializer_folds():
    m = model([helper.make_node("ConstantOfShape", ["s"], ["c"], value=fill(1.5)),
               helper.make_node("Add", ["x", "c"], ["y"])],
              {"x": rand(2, 3)}, ["y"], {"s": np.array([2, 3], np.int64)})
    program, _ = assert_matches_onnxruntime(m, {"x": rand(2, 3)})
    assert ops_of(program) == ["ADD"]
    np.testing.assert_array_equal(program.graph.constant_values("c"), np.full((2, 3), 1.5, np.float32))


def test_legacy_shape_chain_folds():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape of a runtime tensor; ConstantOfShape and
    Expand of its shape; Range: all known at compile time, only the arithmetic on x is left."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus_one"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["flat"]),
        helper.make_node("Shape", ["flat"], ["flat_shape"]),
        helper.make_node("ConstantOfShape", ["flat_shape"], ["ones"], value=fill(2.0)),
        helper.make_node("Expand", ["bias", "flat_shape"], ["bias_wide"]),
        helper.make_node("Range", ["start", "limit", "delta"], ["ramp"]),
        helper.make_node("Mul", ["flat", "ones"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias_wide"], ["shifted"]),
        helper.make_node("Add", ["shifted", "ramp"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
             "minus_one": np.array([-1], np.int64), "bias": rand(1, 12, seed=1),
             "start": np.array(0, np.float32), "limit": np.array(6, np.float32), "delta": np.array(0.5, np.float32)}
    m = model(nodes, {"x": rand(2, 3, 4)}, ["y"], inits)
    program, _ = assert_matches_onnxruntime(m, {"x": rand(2, 3, 4, seed=2)})
    assert ops_of(program) == ["RESHAPE", "MUL", "ADD", "ADD"]


def test_dropout_and_identity_vanish():
    nodes = [helper.make_node("Identity", ["x"], ["x1"]),
             helper.make_node("Dropout", ["x1", "ratio"], ["dropped"]),
             helper.make_node("Relu", ["dropped"], ["y"])]
    m = model(nodes, {"x": rand(3, 4)}, ["y"], {"ratio": np.array(0.5, np.float32)})
    program, _ = assert_matches_onnxruntime(m, {"x": rand(3, 4, seed=3)})
    assert ops_of(program) == ["RELU"]


def test_dropout_mask_is_all_true():
    nodes = [helper.make_node("Dropout", ["x"], ["dropped", "mask"]),
             helper.make_node("Relu", ["dropped"], ["y"])]
    m = model(nodes, {"x": rand(3, 4)}, ["y", "mask"])
    program, _ = assert_matches_onnxruntime(m, {"x": rand(3, 4, seed=4)})
    assert ops_of(program) == ["RELU", "RESHAPE"]  # the mask's copy of its constant


def test_dropout_in_training_mode_is_refused():
    m = model([helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])], {"x": rand(3, 4)}, ["y"],
              {"ratio": np.array(0.5, np.float32), "training": np.array(True)})
    assert refusal(m) == "bad.onnx: node #0 (Dropout): training_mode true is not supported (inference only)"


def test_float_mul_of_initializers_folds_by_the_registry():
    a, b = rand(4, 5, seed=5), rand(4, 5, seed=6)
    m = model([helper.make_node("Mul", ["a", "b"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
              {"x": rand(4, 5)}, ["y"], {"a": a, "b": b})
    program, _ = assert_matches_onnxruntime(m, {"x": rand(4, 5, seed=7)})
    assert ops_of(program) == ["ADD"]
    np.testing.assert_array_equal(program.graph.constant_values("c"), a * b)


def test_a_billion_element_constant_is_refused_without_allocating():
    """Past the fold limit a ConstantOfShape is computed on the KPU as the product of two constants
    about the square root of its size; one of 10^9 elements along one dim has no such two (a 2-D
    shape: onnx's shape inference itself materializes a 1-D ConstantOfShape to propagate it)."""
    m = model([helper.make_node("ConstantOfShape", ["s"], ["c"], value=fill(1.0)),
               helper.make_node("Add", ["x", "c"], ["y"])],
              {"x": rand(1)}, ["y"], {"s": np.array([1, 1000_000_000], np.int64)})
    tracemalloc.start()
    started = time.perf_counter()
    try:
        message = refusal(m)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message == ("bad.onnx: node #0 (ConstantOfShape): its result would hold 1,000,000,000 elements, more "
                       "than the 16,777,216 the ONNX frontend folds at compile time, and its dims [1, 1000000000] "
                       "split into no two parts of at most that")
    assert time.perf_counter() - started < 5 and peak < 64 << 20


def test_fold_only_op_of_a_runtime_tensor_is_refused():
    m = model([helper.make_node("Range", ["start", "limit", "delta"], ["y"])], {"limit": np.array(5, np.float32)},
              ["y"], {"start": np.array(0, np.float32), "delta": np.array(1, np.float32)})
    assert refusal(m) == ("bad.onnx: node #0 (Range): its input 1 ('limit') must be a constant: the ONNX frontend "
                          "evaluates Range at compile time")


def test_shape_and_size_read_a_static_shape():
    nodes = [helper.make_node("Size", ["x"], ["n"]), helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Shape", ["x"], ["tail"], start=-1),
             helper.make_node("Cast", ["tail"], ["tailf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "nf"], ["y0"]), helper.make_node("Mul", ["y0", "tailf"], ["y"])]
    m = model(nodes, {"x": rand(2, 5)}, ["y"])
    program, _ = assert_matches_onnxruntime(m, {"x": rand(2, 5, seed=8)})
    assert ops_of(program) == ["ADD", "MUL"]


def test_past_the_limit_float_work_stays_on_the_kpu(monkeypatch):
    import kernel_compiler.frontends.onnx as frontend

    monkeypatch.setattr(frontend, "FOLD_LIMIT", 10)
    m = model([helper.make_node("Mul", ["a", "b"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
              {"x": rand(4, 5)}, ["y"], {"a": rand(4, 5, seed=9), "b": rand(4, 5, seed=10)})
    program, _ = assert_matches_onnxruntime(m, {"x": rand(4, 5, seed=11)})
    assert ops_of(program) == ["MUL", "ADD"]


def test_gather_elements_of_known_ids_folds_where_the_indices_are_narrower():
    """BERT's token-type ids as transformers exports them: a [1, 64] buffer picked by positions
    [1, 16] (onnx's reference evaluator fails on indices of another shape than the data's)."""
    nodes = [helper.make_node("GatherElements", ["buffer", "positions"], ["ids"], axis=1),
             helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("Add", ["x", "rows"], ["y"])]
    inits = {"buffer": np.arange(64, dtype=np.int64).reshape(1, 64) % 2,
             "positions": np.arange(15, -1, -1, dtype=np.int64).reshape(1, 16), "table": rand(2, 8, seed=3)}
    m = model(nodes, {"x": rand(1, 16, 8)}, ["y"], inits)
    program, _ = assert_matches_onnxruntime(m, {"x": rand(1, 16, 8, seed=4)})
    assert "ids" not in program.graph.tensors or program.graph.tensors["ids"].role == "constant"


def test_a_constant_of_shape_past_the_limit_is_computed_on_the_kpu(monkeypatch):
    """As the light VGG-19's 102 M-element weights: the value over the leading dims times ones
    over the others, neither larger than the limit."""
    import kernel_compiler.frontends.onnx as frontend

    monkeypatch.setattr(frontend, "FOLD_LIMIT", 40)
    m = model([helper.make_node("ConstantOfShape", ["s"], ["c"], value=fill(1.5)),
               helper.make_node("Add", ["x", "c"], ["y"])],
              {"x": rand(6, 4, 5)}, ["y"], {"s": np.array([6, 4, 5], np.int64)})
    program, _ = assert_matches_onnxruntime(m, {"x": rand(6, 4, 5, seed=12)})
    assert ops_of(program) == ["MUL", "ADD"]
    constants = sorted(program.graph.constant_values(t).shape for t in program.graph.ops[0].inputs)
    assert constants == [(1, 4, 5), (6, 1, 1)]
