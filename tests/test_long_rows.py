"""Row reductions whose rows do not fit a tile, end to end in-process on a machine with tiny
memories (1 KB banks: a tile holds at most 128 f32 per stream): REDUCE_SUM/MAX/MIN/PROD with a
reduction loop, accumulating into the partial result on chip; REDUCE_MEAN, SOFTMAX, LOG_SOFTMAX
and LAYERNORM taken apart by `split_long_rows` into kernels that lower. Values against numpy in
float64, DRAM bytes against the compiler's exact count; short rows stay one kernel."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import DATA, run_cli
from dfx import Compute, dumps, loads, numpy_dtype
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.passes import split_long_rows
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, program_inputs, simulate
from loader.report import dram_bytes
from test_vector_kernels import graph_of, random

REDUCERS = {"SUM": np.sum, "MAX": np.max, "MIN": np.min, "PROD": np.prod}


def run(graph, values: dict[str, np.ndarray], config: str, fuse: bool = True):
    """Compile, write and read the object, bind, simulate and execute, with the constants the
    compiler added; (program, every tensor's value, simulation result)."""
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(config), fuse=fuse)))
    machine = load_machine(config)
    bindings = bind_program(program, machine, "test", bind_greedy)
    sim = simulate(program, machine, bindings)
    return program, execute(program, bindings, program_inputs(program, values, 0)), sim


def reduction_loops(kernel) -> list[str]:
    return [op.accumulate for op in kernel.body if isinstance(op, Compute) and op.accumulate != "false"]


@pytest.mark.parametrize("kind", sorted(REDUCERS))
@pytest.mark.parametrize("shape, axis, keepdims", [
    ((5, 3001), 1, False),  # the last axis
    ((3001, 7), 0, True),  # the first axis, rows along the last
    ((3, 2001, 5), 1, False),  # a middle axis
])
def test_long_reduction_accumulates_over_a_reduction_loop(tiny, kind, shape, axis, keepdims):
    x = random(shape, seed=1)
    if kind == "PROD":  # a product of thousands of numbers near 1 stays finite
        x = np.random.default_rng(1).uniform(0.9, 1.1, shape).astype(np.float32)
    g = graph_of([(f"REDUCE_{kind}", ["x"], {"axes": [axis], "keepdims": keepdims})], {"x": (shape, "f32")})
    program, values, _ = run(g, {"x": x}, tiny)
    [kernel] = program.kernels
    loop = f"d{axis}"
    assert reduction_loops(kernel) == [f"{loop} > 0"]
    assert kernel.tile_loops[-1].induction_var == loop and not kernel.tile_loops[-1].parallel
    assert shape[axis] % kernel.tiling[f"T{axis}"]  # an edge tile along the reduced axis
    assert all(op.after == loop for op in kernel.body if op.type == "DATA_MOVE" and op.move_type == "STORE")
    want = REDUCERS[kind](x.astype(np.float64), axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(values["t0"], want, rtol=1e-4 if kind in ("SUM", "PROD") else 0, atol=1e-4)


@pytest.mark.parametrize("kind, shape, attrs", [
    ("SUM", (2, 40, 300), {"axes": [1, 2], "keepdims": False}),
    ("MIN", (40, 3, 300), {"axes": [0, 2], "keepdims": True}),
    ("MAX", (30, 300), {"axes": None, "keepdims": False}),
])
def test_reduction_cut_along_several_axes_becomes_two(tiny, kind, shape, attrs):
    x = random(shape, seed=2)
    g = graph_of([(f"REDUCE_{kind}", ["x"], attrs)], {"x": (shape, "f32")})
    program, values, _ = run(g, {"x": x}, tiny)
    first, second = program.kernels
    assert len(reduction_loops(first)) == 1 and first.op == second.op == f"REDUCE_{kind}"
    axes = tuple(attrs["axes"]) if attrs["axes"] is not None else None
    want = REDUCERS[kind](x.astype(np.float64), axis=axes, keepdims=attrs["keepdims"])
    np.testing.assert_allclose(values["t0"], want, rtol=1e-5, atol=1e-4)


def test_long_reduction_dram_count_equals_simulated_bytes(tiny):
    g = graph_of([("ADD", ["x", "bias"], {}), ("REDUCE_SUM", ["t0"], {"axes": [-1], "keepdims": True})],
                 {"x": ((6, 3001), "f32"), "bias": ((3001,), "f32")})
    program, _, sim = run(g, {"x": random((6, 3001)), "bias": random((3001,), seed=1)}, tiny)
    assert [k.op for k in program.kernels] == ["ADD", "REDUCE_SUM"] and reduction_loops(program.kernels[1])
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layernorm(x: np.ndarray, axis: int, epsilon: float) -> np.ndarray:
    axes = tuple(range(axis, x.ndim))
    centred = x - x.mean(axis=axes, keepdims=True)
    return centred / np.sqrt((centred * centred).mean(axis=axes, keepdims=True) + epsilon)


@pytest.mark.parametrize("op_type, shape, attrs, want", [
    ("SOFTMAX", (4, 3001), {"axis": -1}, lambda w: softmax(w, -1)),
    ("SOFTMAX", (3001, 5), {"axis": 0}, lambda w: softmax(w, 0)),
    ("LOG_SOFTMAX", (4, 3001), {"axis": -1}, lambda w: np.log(softmax(w, -1))),
    ("REDUCE_MEAN", (3001, 6), {"axes": [0], "keepdims": False}, lambda w: w.mean(axis=0)),
    ("REDUCE_MEAN", (40, 3, 300), {"axes": [0, 2], "keepdims": True}, lambda w: w.mean(axis=(0, 2), keepdims=True)),
])
def test_long_row_ops_split_into_kernels_that_lower(tiny, op_type, shape, attrs, want):
    x = random(shape, seed=3) * 4
    g = graph_of([(op_type, ["x"], attrs)], {"x": (shape, "f32")})
    program, values, sim = run(g, {"x": x}, tiny)
    assert len(program.kernels) > 1 and op_type not in {k.op for k in program.kernels}
    assert {op.source for op in program.graph.ops} == {"test op 0"}  # messages still name the row op
    np.testing.assert_allclose(values["t0"], want(x.astype(np.float64)), rtol=1e-5, atol=1e-5)
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())


@pytest.mark.parametrize("shape, axis", [((4, 3001), -1), ((2, 20, 300), 1)])
def test_long_layernorm_with_scale_and_bias(tiny, shape, axis):
    x = random(shape, seed=4)
    normalized = shape[axis:]
    scale, bias = random(normalized, seed=5), random(normalized[-1:], seed=6)
    g = graph_of([("LAYERNORM", ["x", "scale", "bias"], {"axis": axis, "epsilon": 1e-3})],
                 {"x": (shape, "f32"), "scale": (normalized, "f32"), "bias": (normalized[-1:], "f32")})
    program, values, _ = run(g, {"x": x, "scale": scale, "bias": bias}, tiny)
    assert "LAYERNORM" not in {k.op for k in program.kernels}
    want = layernorm(x.astype(np.float64), axis % len(shape), 1e-3) * scale + bias
    np.testing.assert_allclose(values["t0"], want, rtol=1e-4, atol=1e-5)


def test_a_row_that_fits_alone_but_not_beside_its_epilogue_is_split(tiny):
    # a row of 200 f32 (800 B) fits a 1 KB bank: alone, the row's tile and its result's fit; beside
    # four operands the six buffers (x, a, b, c, d and the result; the results between stay in
    # registers) do not fit four banks
    shape = (4, 200)
    names = ["a", "b", "c", "d"]
    ops = [("SOFTMAX", ["x"], {"axis": -1})] + [("ADD", [f"t{i}", n], {}) for i, n in enumerate(names)]
    g = graph_of(ops, {n: (shape, "f32") for n in ["x", *names]})
    values = {n: random(shape, seed=i) for i, n in enumerate(["x", *names])}
    fused, got, _ = run(g, values, tiny)
    assert "SOFTMAX" not in {k.op for k in fused.kernels}
    want = softmax(values["x"].astype(np.float64), -1) + sum(values[n].astype(np.float64) for n in names)
    np.testing.assert_allclose(got["t4"], want, rtol=1e-5, atol=1e-6)
    unfused, _, _ = run(g, values, tiny, fuse=False)  # alone, the row fits: one kernel
    assert [k.op for k in unfused.kernels] == ["SOFTMAX", "ADD", "ADD", "ADD", "ADD"]


@pytest.mark.parametrize("op_type, n_inputs, attrs", [
    ("REDUCE_SUM", 1, {"axes": [-1]}),
    ("REDUCE_MEAN", 1, {"axes": [-1]}),
    ("SOFTMAX", 1, {"axis": -1}),
    ("LOG_SOFTMAX", 1, {"axis": -1}),
    ("LAYERNORM", 3, {"axis": -1}),
])
def test_short_rows_stay_one_kernel(tiny, op_type, n_inputs, attrs):
    names = ["x", "scale", "bias"][:n_inputs]
    g = graph_of([(op_type, names, attrs)], {n: ((4, 100) if n == "x" else (100,), "f32") for n in names})
    assert split_long_rows(g, load_target(tiny)).ops == g.ops
    program, _, _ = run(g, {n: random(g.tensors[n].shape, seed=i) for i, n in enumerate(names)}, tiny)
    [kernel] = program.kernels
    assert kernel.op == op_type and not reduction_loops(kernel)


def test_dump_shows_the_split_for_the_target(tiny):
    proc = run_cli("compiler", DATA / "softmax_tosa.dfg", "--dump", "--target", tiny)
    assert proc.returncode == 0, proc.stderr
    kernels = [line.split()[2] for line in proc.stdout.splitlines() if line.startswith("kernel ")]
    assert kernels == ["(REDUCE_MAX,", "(SUB", "(REDUCE_SUM,", "(DIV,"]
    assert "(no kernel)" not in proc.stdout


@pytest.mark.parametrize("kind", sorted(REDUCERS))
@pytest.mark.parametrize("out", ["i8", "u8", "i32"])
def test_integer_reduction_split_in_two_rounds_once(tiny, kind, out):
    """An integer reduction taken apart gives the reference's int64 result cast once to the output
    dtype: a max or min compares the operand's values, never ones already wrapped to a narrower
    output (200 is -56 in i8, below 100); a sum or product wraps the same at every step."""
    shape = (40, 3, 300)
    rng = np.random.default_rng(5)
    if kind == "PROD":  # odd factors: the product stays nonzero modulo 2^8
        x = rng.choice(np.int32([-3, -1, 1, 3]), shape)
    else:
        x = rng.integers(-100, 101, shape).astype(np.int32)
        x[7, 1, 250], x[31, 2, 20] = 200, -200  # one row's max, another's min, beyond i8
    g = graph_of([(f"REDUCE_{kind}", ["x"], {"axes": [0, 2], "keepdims": True})], {"x": (shape, "i32")},
                 out_dtype=out)
    program, values, _ = run(g, {"x": x}, tiny)
    assert [k.op for k in program.kernels] == [f"REDUCE_{kind}"] * 2
    want = REDUCERS[kind](x.astype(np.int64), axis=(0, 2), keepdims=True).astype(numpy_dtype(out))
    np.testing.assert_array_equal(values["t0"], want)
