"""Fusion: map epilogues applied to a kernel's result tile on chip, and the chains the compiler
recognises as one op."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DATA, ROOT, run_cli
from dfx import dumps, loads, read
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.fuse import fusion_groups
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.report import dram_bytes
from loader.run import check_kernels
from test_vector_kernels import STANDARD, graph_of, random

MLP = ROOT / "examples" / "mlp3.dfg"


def summary(tmp_path, *flags) -> dict:
    obj = tmp_path / f"mlp{'_'.join(flags)}.kpu"
    assert run_cli("compiler", MLP, "-o", obj, *flags).returncode == 0
    proc = run_cli("loader", obj, "--config", STANDARD, "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fused_mlp_moves_fewer_bytes_in_fewer_cycles(tmp_path):
    fused, unfused = summary(tmp_path), summary(tmp_path, "--no-fusion")
    assert len(fused["kernels"]) == 3 and len(unfused["kernels"]) == 9
    assert sum(fused["dram_bytes"].values()) < sum(unfused["dram_bytes"].values())
    # only each layer's activation reaches external memory, not its matmul or bias result, but
    # for those L3 keeps (a home) between two kernels; unfused, every op's result does
    layers = 256 * (512 + 256 + 128) * 4
    kept_fused = [t for t in read(tmp_path / "mlp.kpu").graph.tensors.values() if t.home == "L3"]
    # the second layer's 256-wide activation: its reader's plain tile of it lies in its home
    assert [t.shape for t in kept_fused] == [(256, 256)]
    assert fused["dram_bytes"]["write"] == layers - sum(t.size * 4 for t in kept_fused)
    kept = [t for t in read(tmp_path / "mlp--no-fusion.kpu").graph.tensors.values() if t.home == "L3"]
    assert kept
    assert unfused["dram_bytes"]["write"] == 3 * layers - sum(t.size * 4 for t in kept)
    assert fused["cycles"] < unfused["cycles"]
    assert fused["check"]["passed"] and unfused["check"]["passed"]


def test_dump_shows_the_groups():
    proc = run_cli("compiler", MLP, "--dump")
    kernels = [l for l in proc.stdout.splitlines() if l.startswith("kernel ")]
    assert [l.split(" (")[1].split(",")[0] for l in kernels] == ["MATMUL + bias", "MATMUL + bias_1", "MATMUL + bias_2"]
    assert all("relu" in l or "sigmoid" in l for l in kernels)


def test_tosa_softmax_chain_is_one_kernel():
    proc = run_cli("compiler", DATA / "softmax_tosa.dfg", "--dump")
    assert proc.returncode == 0, proc.stderr
    kernels = [l for l in proc.stdout.splitlines() if l.startswith("kernel ")]
    assert len(kernels) == 1 and "(SOFTMAX, vector)" in kernels[0]


def run(graph, values, fuse=True):
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(STANDARD), fuse=fuse)))
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "test", bind_greedy)
    return program, simulate(program, machine, bindings), execute(program, bindings, values)


LAYER = [("MATMUL", ["x", "w"], {}), ("ADD", ["t0", "b"], {}), ("RELU", ["t1"], {})]
SHAPES = {"x": ((256, 512), "f32"), "w": ((512, 384), "f32"), "b": ((384,), "f32")}


def test_epilogue_overlaps_the_next_tiles_array_work():
    values = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}
    program, fused, out = run(graph_of(LAYER, SHAPES), values)
    assert len(program.kernels) == 1 and program.kernels[0].epilogue == ["op1", "op2"]
    want = np.maximum(values["x"].astype(np.float64) @ values["w"] + values["b"], 0)
    np.testing.assert_allclose(out["t2"], want, rtol=1e-4, atol=1e-4)
    _, matmul_alone, _ = run(graph_of(LAYER[:1], SHAPES), values)
    vector = sum(u.busy_cycles for name, u in fused.units.items() if name.startswith("vec"))
    assert vector > 0
    # the epilogue runs on the vector unit while the array computes the next blocks: the kernel
    # takes less than the matmul alone plus the epilogue's vector work
    assert fused.cycles < matmul_alone.cycles + vector
    _, unfused, _ = run(graph_of(LAYER, SHAPES), values, fuse=False)
    assert fused.cycles < unfused.cycles


@pytest.mark.parametrize("ops", [
    LAYER,
    [("ADD", ["x", "b"], {}), ("TANH", ["t0"], {}), ("MUL", ["t1", "b"], {})],  # a map anchor
    [("SOFTMAX", ["x"], {"axis": -1}), ("MUL", ["t0", "b"], {})],  # a row-op anchor
])
def test_fused_dram_count_equals_simulated_bytes(ops):
    shapes = SHAPES if ops is LAYER else {"x": ((300, 384), "f32"), "b": ((384,), "f32")}
    program, sim, _ = run(graph_of(ops, shapes), {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(shapes.items())})
    assert len(program.kernels) == 1
    assert program.kernels[0].hints["estimated_dram_bytes"] == sum(dram_bytes(sim).values())


def test_an_intermediate_needed_elsewhere_is_not_fused():
    g = graph_of([("MATMUL", ["x", "w"], {}), ("ADD", ["t0", "b"], {}), ("RELU", ["t1"], {}),
                  ("ADD", ["t2", "t1"], {})], SHAPES)  # t1 read twice
    assert [[op.name for op in group] for group in fusion_groups(g)] == [["op0", "op1"], ["op2", "op3"]]
    g.tensors["t0"].role = "output"  # a graph output must reach memory
    assert [[op.name for op in group] for group in fusion_groups(g)] == [["op0"], ["op1"], ["op2", "op3"]]


# ---- dtypes: a fused intermediate is never rounded on chip, so fusion must not need it to be ----


def groups_of(g) -> list[list[str]]:
    return [[op.name for op in group] for group in fusion_groups(g)]


def test_an_integer_intermediate_that_would_wrap_is_not_fused_across():
    """t0 = a + b in i8 wraps (100 + 100 = -56); kept on chip unwrapped it would reach the MUL
    as 200. So the MUL starts a kernel of its own, and the result is the wrapped one."""
    g = graph_of([("ADD", ["a", "b"], {}), ("MUL", ["t0", "c"], {})],
                 {"a": ((4, 40), "i8"), "b": ((4, 40), "i8"), "c": ((4, 40), "f32")})
    g.tensors["t0"].dtype = "i8"
    assert groups_of(g) == [["op0"], ["op1"]]
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-128, 128, (4, 40)).astype(np.int8) for _ in range(2))
    a[0, :4], b[0, :4] = 100, 100
    c = random((4, 40), seed=3)
    program, _, out = run(g, {"a": a, "b": b, "c": c})
    t0 = (a.astype(np.int64) + b.astype(np.int64)).astype(np.int8)  # int64, then one cast
    assert t0[0, 0] == -56
    np.testing.assert_array_equal(out["t0"], t0)
    np.testing.assert_array_equal(out["t1"], (t0.astype(np.float32) * c).astype(np.float32))
    assert all(c.passed for c in check_kernels(program, out).values())


def test_quantized_matmul_accumulates_in_i32_beside_a_float_epilogue():
    """i8 x i8 -> i32 with a dequantising f32 MUL fused: the MATMUL's partial sums are its own,
    i32 (exact), not the epilogue's f32 (sums past 2^24 would lose their low bits)."""
    K = 4096
    g = graph_of([("MATMUL", ["a", "b"], {}), ("MUL", ["t0", "scale"], {})],
                 {"a": ((16, K), "i8"), "b": ((K, 16), "i8"), "scale": ((16,), "f32")})
    g.tensors["t0"].dtype = "i32"
    assert groups_of(g) == [["op0", "op1"]]  # an i32 made in the i32 accumulators is held exactly
    rng = np.random.default_rng(1)
    a = rng.integers(100, 128, (16, K)).astype(np.int8)
    b = rng.integers(100, 128, (K, 16)).astype(np.int8)
    scale = np.float32([1, 0.5, 2, 3] * 4)
    program, _, out = run(g, {"a": a, "b": b, "scale": scale})
    assert len(program.kernels) == 1 and program.kernels[0].tiling["num_tiles_k"] > 1
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert exact.min() > 2**24  # an f32 accumulator would round these
    want = exact.astype(np.int32).astype(np.float32) * scale
    np.testing.assert_array_equal(out["t1"], want)


def test_what_fuses_across_which_intermediate():
    f32, i32, i8, f16 = ((8, 32), "f32"), ((8, 32), "i32"), ((8, 32), "i8"), ((8, 32), "f16")

    def groups(ops, inputs, dtypes):
        g = graph_of(ops, inputs)
        for name, dtype in dtypes.items():
            g.tensors[name].dtype = dtype
        return groups_of(g)

    # integer arithmetic in i32: the accumulators hold it exactly
    assert groups([("ADD", ["a", "b"], {}), ("MUL", ["t0", "b"], {})], {"a": i32, "b": i32},
                  {"t0": "i32", "t1": "i32"}) == [["op0", "op1"]]
    # a truth value is 0 or 1 in any dtype: a compare-and-select fuses
    assert groups([("GREATER", ["x", "y"], {}), ("SELECT", ["t0", "x", "y"], {})], {"x": f32, "y": f32},
                  {"t0": "u8"}) == [["op0", "op1"]]
    # an integer computed in float is not truncated on chip, one narrower than i32 not wrapped
    assert groups([("EXP", ["a"], {}), ("ADD", ["t0", "a"], {})], {"a": i32},
                  {"t0": "i32", "t1": "i32"}) == [["op0"], ["op1"]]
    assert groups([("ADD", ["a", "b"], {}), ("ADD", ["t0", "b"], {})], {"a": i8, "b": i8},
                  {"t0": "i8", "t1": "i32"}) == [["op0"], ["op1"]]
    # a float rounded by the reference only: fine into a float, not into a comparison or an integer
    assert groups([("ADD", ["h", "k"], {}), ("MUL", ["t0", "k"], {}), ("TANH", ["t1"], {})], {"h": f16, "k": f16},
                  {"t0": "f16", "t1": "f16", "t2": "f16"}) == [["op0", "op1", "op2"]]
    assert groups([("ADD", ["h", "k"], {}), ("EQUAL", ["t0", "k"], {})], {"h": f16, "k": f16},
                  {"t0": "f16"}) == [["op0"], ["op1"]]
    assert groups([("ADD", ["h", "k"], {}), ("MUL", ["t0", "k"], {}), ("CAST", ["t1"], {"dtype": "i8"})],
                  {"h": f16, "k": f16}, {"t0": "f16", "t1": "f16", "t2": "i8"}) == [["op0", "op1"], ["op2"]]
    # f32 made in f32 is the reference's: a comparison may follow
    assert groups([("ADD", ["x", "y"], {}), ("GREATER", ["t0", "y"], {})], {"x": f32, "y": f32},
                  {"t1": "u8"}) == [["op0", "op1"]]


def test_a_comparison_of_a_low_precision_intermediate_sees_it_rounded():
    """1 + 2^-11 is a tie in f16 and rounds to 1: EQUAL(x + y, 1) is 1 in the reference, 0 on an
    f32 value the store never rounded."""
    h = ((2, 64), "f16")
    g = graph_of([("ADD", ["x", "y"], {}), ("EQUAL", ["t0", "one"], {})], {"x": h, "y": h, "one": h})
    g.tensors["t0"].dtype = "f16"
    x, y, one = (np.full((2, 64), v, np.float16) for v in (1.0, 2.0**-11, 1.0))
    program, _, out = run(g, {"x": x, "y": y, "one": one})
    np.testing.assert_array_equal(out["t1"], np.ones((2, 64), np.float32))
    assert all(c.passed for c in check_kernels(program, {"x": x, "y": y, "one": one, **out}).values())


@pytest.mark.parametrize("contraction", ["Conv", "MatMul"])
def test_a_residual_of_a_contractions_own_input_is_added_by_a_kernel_of_its_own(contraction):
    """EfficientNetV2's first blocks add y + act(conv(y)): a contraction holds y by chunks of the
    channels it sums over, its epilogue would hold it by result tiles, two tiles of y at one
    level in one kernel. The add runs after it; both match onnxruntime and pass --check."""
    from onnx import helper, numpy_helper
    from test_onnx_map_ops import run_both

    rng = np.random.default_rng(5)
    if contraction == "Conv":
        x, shape = rng.standard_normal((1, 3, 32, 32)).astype(np.float32), [1, 24, 32, 32]
        weights = [rng.standard_normal((24, 3, 3, 3)), rng.standard_normal((24, 24, 3, 3))]
        attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    else:
        x, shape = rng.standard_normal((32, 112)).astype(np.float32), [32, 112]
        weights, attrs = [rng.standard_normal((112, 112)), rng.standard_normal((112, 112))], {}
    nodes = [helper.make_node(contraction, ["x", "w0"], ["c0"], **attrs), helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node(contraction, ["r", "w1"], ["c1"], **attrs), helper.make_node("Relu", ["c1"], ["a"]),
             helper.make_node("Add", ["a", "r"], ["y"])]
    inits = [numpy_helper.from_array((w * 0.1).astype(np.float32), f"w{i}") for i, w in enumerate(weights)]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", 1, list(x.shape))],
                              [helper.make_tensor_value_info("y", 1, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    got, want, program = run_both(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ops = {op.name: op.op_type for op in program.graph.ops}
    # the second contraction's kernel takes its relu, and the add is a kernel of its own
    assert [[ops[k.graph_op], *(ops[o] for o in k.epilogue)] for k in program.kernels
            if ops[k.graph_op] != "TRANSPOSE"][1:] == [[contraction.upper().replace("CONV", "CONV2D"), "RELU"], ["ADD"]]


def test_only_what_a_contraction_sums_over_keeps_an_epilogue_op_out():
    """Its input and weights are held by chunks of the summed dim; its accumulator input (Cin, held
    by result tiles like any epilogue operand) may be read again by the epilogue."""
    shapes = {"a": ((16, 16), "f32"), "b": ((16, 16), "f32"), "c": ((16, 16), "f32")}
    for again, groups in (("a", [["op0"], ["op1"]]), ("b", [["op0"], ["op1"]]), ("c", [["op0", "op1"]])):
        g = graph_of([("MATMUL", ["a", "b", "c"], {}), ("ADD", ["t0", again], {})], shapes)
        assert groups_of(g) == groups, again
