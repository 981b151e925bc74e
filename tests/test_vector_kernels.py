"""Map and row-reduction kernels on the vector unit, end to end in-process: compile, bind,
simulate, execute tile by tile; values against numpy computed here, DRAM bytes against the
compiler's exact count, vector cycles against hand-worked numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import CONFIGS
from dfx import Graph, Op, Tensor, dumps, loads, numpy_dtype
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.report import dram_bytes

STANDARD = str(CONFIGS / "standard.json")


def graph_of(ops: list[tuple[str, list[str], dict]], inputs: dict[str, tuple[tuple[int, ...], str]],
             out_dtype: str = "f32") -> Graph:
    """A chain of ops: op i reads the named tensors (inputs or earlier results `t0`, `t1`, ...)
    and writes `t<i>`; the last result is the graph's output."""
    g = Graph("test")
    for name, (shape, dtype) in inputs.items():
        g.tensors[name] = Tensor(name, shape, dtype, "input")
    for i, (op_type, args, attrs) in enumerate(ops):
        out = f"t{i}"
        g.tensors[out] = Tensor(out, (), out_dtype, "output" if i == len(ops) - 1 else "intermediate")
        g.ops.append(Op(f"op{i}", op_type, args, [out], attrs, f"test op {i}"))
    return infer_shapes(g, [])


def run(graph: Graph, values: dict[str, np.ndarray], config: str = STANDARD):
    """Compile for `config`, write and read the object (so the validator sees it), bind, simulate
    and execute; (program, every tensor's value, simulation result)."""
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(config))))
    machine = load_machine(config)
    bindings = bind_program(program, machine, "test", bind_greedy)
    sim = simulate(program, machine, bindings)
    return program, execute(program, bindings, values), sim


def random(shape, dtype="f32", seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(numpy_dtype(dtype))


@pytest.mark.parametrize("a_shape, b_shape", [
    ((37, 129), (129,)),  # a bias row, edge tiles in both dims
    ((5, 1, 7), (1, 6, 7)),  # both operands broadcast
    ((3, 300, 41), (3, 300, 41)),
    ((2000,), ()),  # a scalar operand
])
def test_map_broadcasts_with_edge_tiles(a_shape, b_shape):
    a, b = random(a_shape, seed=1), random(b_shape, seed=2)
    _, values, _ = run(graph_of([("ADD", ["a", "b"], {}), ("SIGMOID", ["t0"], {})],
                                {"a": (a_shape, "f32"), "b": (b_shape, "f32")}), {"a": a, "b": b})
    s = a.astype(np.float64) + b.astype(np.float64)
    np.testing.assert_allclose(values["t1"], 1 / (1 + np.exp(-s)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_map_in_low_precision(dtype):
    x = random((65, 33), dtype, seed=3)
    _, values, _ = run(graph_of([("MUL", ["x", "x"], {}), ("CLAMP", ["t0"], {"min": 0.0, "max": 2.0})],
                                {"x": ((65, 33), dtype)}, out_dtype=dtype), {"x": x})
    wide = x.astype(np.float64)
    square = (wide * wide).astype(numpy_dtype(dtype)).astype(np.float64)  # rounded once per op
    want = np.minimum(np.maximum(square, 0), 2)
    rtol = {"f16": 1e-3, "bf16": 1e-2}[dtype]
    np.testing.assert_allclose(values["t1"].astype(np.float64), want, rtol=rtol)


def test_softmax_reduce_and_layernorm_on_non_last_axes():
    x = random((6, 50, 40), seed=4)
    scale, bias = random((50, 40), seed=5), random((40,), seed=6)
    g = graph_of([("SOFTMAX", ["x"], {"axis": 1}),
                  ("REDUCE_SUM", ["t0"], {"axes": [1], "keepdims": False}),
                  ("LAYERNORM", ["x", "scale", "bias"], {"axis": 1, "epsilon": 1e-5})],
                 {"x": ((6, 50, 40), "f32"), "scale": ((50, 40), "f32"), "bias": ((40,), "f32")})
    g.tensors["t1"].role = "output"
    _, values, _ = run(g, {"x": x, "scale": scale, "bias": bias})
    w = x.astype(np.float64)
    e = np.exp(w - w.max(axis=1, keepdims=True))
    softmax = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(values["t0"], softmax, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(values["t1"], np.ones((6, 40)), rtol=1e-5)  # each column sums to 1
    flat = w.reshape(6, -1)
    norm = (flat - flat.mean(axis=1, keepdims=True)) / np.sqrt(flat.var(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(values["t2"], norm.reshape(w.shape) * scale + bias, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", ["standard", "minimal", "datacenter"])
def test_compiler_dram_count_equals_simulated_bytes(config):
    path = str(CONFIGS / f"{config}.json")
    g = graph_of([("ADD", ["a", "bias"], {}), ("REDUCE_MAX", ["t0"], {"axes": [-1]}),
                  ("SOFTMAX", ["t0"], {"axis": -1})],
                 {"a": ((300, 700), "f32"), "bias": ((700,), "f32")})
    g.tensors["t1"].role = "output"
    program, _, sim = run(g, {"a": random((300, 700)), "bias": random((700,))}, path)
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())


def one_tile(op_type: str, shape: tuple[int, ...], attrs: dict, n_inputs: int):
    names = [f"x{i}" for i in range(n_inputs)]
    g = graph_of([(op_type, names, attrs)], {n: (shape, "f32") for n in names})
    program, _, sim = run(g, {n: random(shape, seed=i) for i, n in enumerate(names)})
    assert program.kernels[0].tiling["num_tiles"] == 1
    return sim.units["vec0"].busy_cycles


def test_hand_worked_vector_cycles():
    machine = load_machine(STANDARD)
    lanes, cycles = machine.vector.lanes, machine.vector.cycles_per_element
    assert lanes == 16 and cycles == {"simple": 1, "transcendental": 4, "reduction": 1, "requantize": 1}
    # ADD of two 16x64 tiles: 1024 simple elements over 16 lanes
    assert one_tile("ADD", (16, 64), {}, 2) == math.ceil(1024 / 16) * 1 == 64
    # SOFTMAX of an 8x128 tile: max and sum (2 reduction steps), exp (1 transcendental),
    # subtract and scale (2 simple) per element
    assert one_tile("SOFTMAX", (8, 128), {"axis": -1}, 1) == 128 * 1 + 64 * 4 + 128 * 1 == 512


def test_loader_and_hardware_name_no_operator():
    """They execute and time every tile compute through the registry, so adding an operator
    touches neither."""
    import re

    from conftest import ROOT
    from dfx import REGISTRY

    names = set(REGISTRY) | {op.compute_type for op in REGISTRY.values()}
    pattern = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    found = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group()}"
             for package in ("loader", "hardware") for path in sorted((ROOT / package).rglob("*.py"))
             for text in [path.read_text()] for m in pattern.finditer(text)]
    assert not found


def test_check_names_a_faulty_intermediate_kernel(tmp_path):
    """A wrong intermediate kernel fails --check by name, even though every later kernel is
    right about the values it received."""
    import json

    from conftest import run_cli
    from dfx.objfile import _digest

    g = graph_of([("MATMUL", ["a", "w"], {}), ("ADD", ["t0", "bias"], {}), ("MATMUL", ["t1", "w2"], {}),
                  ("SIGMOID", ["t2"], {})],
                 {"a": ((256, 256), "f32"), "w": ((256, 1024), "f32"), "bias": ((1024,), "f32"),
                  "w2": ((1024, 256), "f32")})
    obj = tmp_path / "chain.kpu"
    obj.write_bytes(dumps(compile_graph(g, "chain.dfg", load_target(STANDARD), fuse=False)))
    assert run_cli("loader", obj, "--config", STANDARD, "--check").returncode == 0
    doc = json.loads(obj.read_text())
    kernel = doc["body"]["kernels"][2]
    assert kernel["name"] == "matmul_2" and kernel["tiling"]["Ti"] == kernel["tiling"]["Tj"]
    store = next(op for op in kernel["body"] if op["type"] == "DATA_MOVE" and op["destination"]["level"] == "EXTERNAL")
    assert store["destination"]["tile_indices"] == ["ti", "tj"]
    # square tiles and as many along M as along N: a well-formed object that writes each result
    # block where its transpose belongs
    store["destination"]["tile_indices"] = ["tj", "ti"]
    doc["sha256"] = _digest(doc["body"])
    obj.write_text(json.dumps(doc))
    proc = run_cli("loader", obj, "--config", STANDARD, "--check", "--json")
    assert proc.returncode == 1, proc.stderr
    failing = [l for l in proc.stderr.splitlines() if "FAIL" in l and "kernel" in l]
    assert len(failing) == 1 and "kernel matmul_2" in failing[0], proc.stderr
    report = json.loads(proc.stdout)["check"]
    assert report["worst_kernel"] == "matmul_2"
    assert [k for k, c in report["kernels"].items() if not c["passed"]] == ["matmul_2"]


# ---- every map and reduction op as a kernel with edge tiles, against per-element Python math -----

from test_ops_registry import BINARY, PREDICATES, REDUCERS, UNARY, per_element, reduce_by_loops  # noqa: E402


def uniform_in(shape, low, high, seed):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_kernel(name):
    fn, (low, high), attrs = UNARY[name]
    x = uniform_in((37, 300), low, high, 11)  # 11,100 elements: several tiles, the last ones partial
    _, values, _ = run(graph_of([(name, ["x"], attrs)], {"x": ((37, 300), "f32")}), {"x": x})
    np.testing.assert_allclose(values["t0"], per_element(fn, x.astype(np.float64)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_kernel_broadcasts(name):
    fn, (low, high) = BINARY[name]
    a, b = uniform_in((37, 300), low, high, 12), uniform_in((300,), low, high, 13)
    b[:5] = a[0, :5]  # some equal pairs for the comparisons
    out = "u8" if name in PREDICATES else "f32"
    _, values, _ = run(graph_of([(name, ["a", "b"], {})], {"a": ((37, 300), "f32"), "b": ((300,), "f32")},
                                out_dtype=out), {"a": a, "b": b})
    want = per_element(lambda p, q: float(fn(p, q)), a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(values["t0"].astype(np.float64), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", sorted(REDUCERS))
@pytest.mark.parametrize("axes, keepdims", [([0], False), ([-1], True)])
def test_reduction_kernel(name, axes, keepdims):
    x = uniform_in((37, 300), 0.9, 1.1, 14)  # near 1, so a product of 300 stays finite
    _, values, _ = run(graph_of([(name, ["x"], {"axes": axes, "keepdims": keepdims})], {"x": ((37, 300), "f32")}),
                       {"x": x})
    want = reduce_by_loops(x.astype(np.float64), tuple(a % 2 for a in axes), keepdims, REDUCERS[name])
    np.testing.assert_allclose(values["t0"], want, rtol=1e-5)


# ---- integers: exact ops against int64 arithmetic and one cast -----------------------------------

# pairs an f32 cannot tell apart (2^24 + 1 rounds to 2^24) or only just can
BIG_A = np.int32([16777217, 16777216, 16777216, -16777217, 2**31 - 1, -2**31, 5, -5])
BIG_B = np.int32([16777216, 16777217, 16777216, -16777216, 2**31 - 2, -2**31 + 1, 5, 4])
NUMPY_PREDICATES = {"EQUAL": np.equal, "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal,
                    "LESS": np.less, "LESS_EQUAL": np.less_equal}


@pytest.mark.parametrize("name", sorted(NUMPY_PREDICATES))
@pytest.mark.parametrize("out", ["f32", "f16", "bf16", "u8"])
def test_integer_comparison_with_a_float_result_compares_the_integers(name, out):
    """A truth value's dtype does not choose the precision of the comparison: i32 operands compare
    as integers (in f32, 2^24 + 1 == 2^24)."""
    g = graph_of([(name, ["a", "b"], {})], {"a": ((8,), "i32"), "b": ((8,), "i32")}, out_dtype=out)
    _, values, _ = run(g, {"a": BIG_A, "b": BIG_B})
    want = NUMPY_PREDICATES[name](BIG_A.astype(np.int64), BIG_B.astype(np.int64)).astype(numpy_dtype(out))
    np.testing.assert_array_equal(values["t0"], want)


@pytest.mark.parametrize("out", ["f32", "i32", "i8"])
def test_integer_select_and_extrema_are_rounded_once(out):
    """SELECT, MAXIMUM and MINIMUM of i32: the int64 result cast once to the output dtype (a
    float result rounds the chosen integer, an i8 one wraps it)."""
    cond = np.uint8([1, 0, 1, 0, 1, 0, 1, 0])
    inputs = {"cond": ((8,), "u8"), "a": ((8,), "i32"), "b": ((8,), "i32")}
    values = {"cond": cond, "a": BIG_A, "b": BIG_B}
    g = graph_of([("SELECT", ["cond", "a", "b"], {}), ("MAXIMUM", ["a", "b"], {}), ("MINIMUM", ["a", "b"], {})],
                 inputs, out_dtype=out)
    for t in ("t0", "t1"):
        g.tensors[t].role = "output"
    _, got, _ = run(g, values)
    a, b = BIG_A.astype(np.int64), BIG_B.astype(np.int64)
    for name, want in (("t0", np.where(cond != 0, a, b)), ("t1", np.maximum(a, b)), ("t2", np.minimum(a, b))):
        np.testing.assert_array_equal(got[name], want.astype(numpy_dtype(out)), err_msg=name)
