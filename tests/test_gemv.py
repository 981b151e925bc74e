"""A contraction of one row (a GEMV) on the vector unit: which ops are one, the kernel's values
against numpy however its tiles go, and where the compiler takes it, against the array's kernel
for the same product simulated beside it."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CONFIGS
from dfx import dumps, loads
from hardware import load_machine
from kernel_compiler import compile as compile_module
from kernel_compiler import compile_graph, load_target
from kernel_compiler.lower_gemv import gemv_dims
from loader import bind_cpsat, bind_program, execute, simulate
from test_vector_kernels import STANDARD, graph_of, random


def run(graph, values, config=STANDARD, objective="latency"):
    """Compiled for `config`, bound, executed and simulated: (its kernel, the result, cycles)."""
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(config, objective=objective))))
    machine = load_machine(config)
    bindings = bind_program(program, machine, "test", bind_cpsat)
    out = execute(program, bindings, values)[program.graph.outputs[0].name]
    return program.kernels[0], out, simulate(program, machine, bindings).cycles


@pytest.fixture
def on_the_vector_unit(monkeypatch):
    """Of the array's kernel and the vector unit's, the compiler takes the vector unit's."""
    monkeypatch.setattr(compile_module, "preferred", lambda kernels, graph, target: kernels[-1])


@pytest.mark.parametrize("op, shapes, attrs, dims", [
    ("MATMUL", [(1, 64), (64, 10)], {}, [[None, 1], [1, 0], [None, 0]]),
    ("MATMUL", [(1, 1, 64), (10, 64), (10,)], {"transpose_b": True}, [[None, None, 1], [0, 1], [0], [None, None, 0]]),
    ("MATMUL", [(2, 64), (64, 10)], {}, None),  # two rows
    ("MATMUL", [(3, 1, 64), (3, 64, 10)], {}, None),  # a batch of them
    ("CONV2D", [(1, 1, 1, 64), (10, 1, 1, 64), (10,)], {},
     [[None, None, None, 1], [0, None, None, 1], [0], [None, None, None, 0]]),
    ("CONV2D", [(1, 2, 2, 64), (10, 1, 1, 64)], {}, None),  # four positions
    ("CONV2D", [(1, 3, 3, 64), (10, 3, 3, 64)], {}, None),  # one position through a 3 x 3 kernel
    ("CONV2D", [(1, 1, 1, 64), (10, 1, 1, 32)], {"groups": 2}, None),
])
def test_which_contractions_are_of_one_row(op, shapes, attrs, dims):
    names = ["a", "b", "c"][:len(shapes)]
    graph = graph_of([(op, names, attrs)], {n: (s, "f32") for n, s in zip(names, shapes)})
    assert gemv_dims(graph, graph.ops[0]) == dims


@pytest.mark.parametrize("k, n, config, whole, chunked", [
    (96, 40, STANDARD, True, False),  # everything in L3 at once, K whole in L1
    (1280, 1000, STANDARD, False, True),  # a classifier: the weights by panels, K by chunks
    (1152, 48, str(CONFIGS / "minimal.json"), False, True),
])
def test_a_gemv_on_the_vector_unit_computes_numpy_s_values(on_the_vector_unit, k, n, config, whole, chunked):
    """With its bias and a sigmoid after it, as a squeeze-and-excitation block's second 1 x 1."""
    graph = graph_of([("MATMUL", ["a", "w", "b"], {"transpose_b": True}), ("SIGMOID", ["t0"], {})],
                     {"a": ((1, k), "f32"), "w": ((n, k), "f32"), "b": ((n,), "f32")})
    values = {"a": random((1, k)), "w": random((n, k), seed=1) / np.sqrt(k), "b": random((n,), seed=2)}
    kernel, out, _ = run(graph, values, config)
    assert kernel.dataflow == "vector" and kernel.epilogue == ["op1"]
    assert kernel.tiling["L3_Bn"] == (n if whole else kernel.tiling["Tn"]), kernel.tiling
    assert (kernel.tiling["num_tiles_tk"] > 1) == chunked, kernel.tiling
    want = 1 / (1 + np.exp(-(values["a"].astype(np.float64) @ values["w"].T.astype(np.float64) + values["b"])))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_squeeze_and_excitation_1x1_goes_to_the_vector_unit_and_runs_faster(monkeypatch):
    """EfficientNet-B0's last blocks squeeze 1152 channels to 48 and excite them back: the 48 ->
    1152 1 x 1 on one position holds the array 32 x 32 folds of one row each, the vector unit
    a multiply-add per lane a cycle."""
    graph = graph_of([("CONV2D", ["x", "w", "b"], {}), ("SIGMOID", ["t0"], {})],
                     {"x": ((1, 1, 1, 48), "f32"), "w": ((1152, 1, 1, 48), "f32"), "b": ((1152,), "f32")})
    values = {"x": random((1, 1, 1, 48)), "w": random((1152, 1, 1, 48), seed=1), "b": random((1152,), seed=2)}
    kernel, out, cycles = run(graph, values)
    monkeypatch.setattr(compile_module, "gemv_dims", lambda graph, op: None)  # the array's kernel alone
    array_kernel, array_out, array_cycles = run(graph, values)
    assert array_kernel.dataflow != "vector"
    assert kernel.dataflow == "vector"
    assert cycles < 0.9 * array_cycles, (cycles, array_cycles)
    want = values["x"].reshape(1, 48).astype(np.float64) @ values["w"].reshape(1152, 48).T + values["b"]
    np.testing.assert_allclose(out.reshape(1, 1152), 1 / (1 + np.exp(-want)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, array_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("objective, unit", [("latency", "array"), ("edp", "array"), ("energy", "vector")])
def test_a_classifier_bound_by_its_weights(monkeypatch, objective, unit):
    """MobileNet v1's classifier streams 4 MB of weights either way. By cycles the vector unit's
    kernel is no faster, and the array's is kept. By energy the two tie within their estimates'
    rounding, and the faster is taken: the array's least-energy tiling holds all 1000 outputs
    in one tile, on one compute tile."""
    graph = graph_of([("CONV2D", ["x", "w", "b"], {})],
                     {"x": ((1, 1, 1, 1024), "f32"), "w": ((1000, 1, 1, 1024), "f32"), "b": ((1000,), "f32")})
    values = {"x": random((1, 1, 1, 1024)), "w": random((1000, 1, 1, 1024), seed=1), "b": random((1000,), seed=2)}
    kernel, out, cycles = run(graph, values, objective=objective)
    monkeypatch.setattr(compile_module, "gemv_dims", lambda graph, op: None)
    _, array_out, array_cycles = run(graph, values, objective=objective)
    assert (kernel.dataflow == "vector") == (unit == "vector"), kernel.dataflow
    assert cycles < array_cycles / 2 if unit == "vector" else cycles == array_cycles, (cycles, array_cycles)
    want = values["x"].reshape(1, 1024).astype(np.float64) @ values["w"].reshape(1000, 1024).T + values["b"]
    np.testing.assert_allclose(out.reshape(1, 1000), want, rtol=1e-4, atol=1e-4)


def test_an_int8_product_of_one_row_stays_on_the_array_by_energy(monkeypatch):
    """An i8 MAC on the array, its operands' register reads with it, costs 1.8 pJ against a
    vector multiply-add's 4.6: by energy the array's kernel is kept, though the vector unit's is
    faster (the weights a quarter of f32's bytes, the array at one MAC a PE a cycle on standard)."""
    graph = graph_of([("MATMUL", ["a", "w"], {"transpose_b": True})], {"a": ((1, 576), "i8"), "w": ((144, 576), "i8")},
                     out_dtype="i32")
    rng = np.random.default_rng(0)
    values = {"a": rng.integers(-128, 128, (1, 576), dtype=np.int8), "w": rng.integers(-128, 128, (144, 576), dtype=np.int8)}
    want = values["a"].astype(np.int64) @ values["w"].T.astype(np.int64)
    runs = {}
    for objective in ("latency", "energy"):
        kernel, out, cycles = run(graph, values, objective=objective)
        np.testing.assert_array_equal(out, want)
        runs[objective] = kernel.dataflow, cycles
    assert runs["latency"][0] == "vector" and runs["energy"][0] != "vector", runs
    assert runs["latency"][1] < runs["energy"][1], runs
