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
from kernel_compiler.chains import TIE
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
    # one position still, but its window reads the padding
    ("CONV2D", [(1, 1, 1, 64), (10, 1, 1, 64)], {"padding": [[1, 0], [1, 0]], "stride": [2, 2]}, None),
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
    1152 1 x 1 on one position takes the array 3 x 72 folds of 16 x 16 weights, one row through
    each, the vector unit a multiply-add per lane a cycle."""
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


@pytest.mark.parametrize("objective, unit", [("latency", "array"), ("edp", "vector"), ("energy", "vector")])
def test_a_classifier_bound_by_its_weights(monkeypatch, objective, unit):
    """MobileNet v1's classifier streams 4 MB of weights either way, in as many cycles. By cycles
    the array's kernel is kept. By energy x cycles the vector unit's, its multiply-adds cheaper
    than the array's MACs with their operands' reads. By energy the two tie within their
    estimates' rounding, and the faster is taken: the array's least-energy tiling holds all 1000
    outputs in one tile, on one compute tile."""
    graph = graph_of([("CONV2D", ["x", "w", "b"], {})],
                     {"x": ((1, 1, 1, 1024), "f32"), "w": ((1000, 1, 1, 1024), "f32"), "b": ((1000,), "f32")})
    values = {"x": random((1, 1, 1, 1024)), "w": random((1000, 1, 1, 1024), seed=1), "b": random((1000,), seed=2)}
    kernel, out, cycles = run(graph, values, objective=objective)
    monkeypatch.setattr(compile_module, "gemv_dims", lambda graph, op: None)
    _, array_out, array_cycles = run(graph, values, objective=objective)
    assert (kernel.dataflow == "vector") == (unit == "vector"), kernel.dataflow
    if objective == "energy":
        assert cycles < array_cycles / 2, (cycles, array_cycles)
    else:
        assert cycles <= array_cycles * (1 + TIE), (cycles, array_cycles)
    want = values["x"].reshape(1, 1024).astype(np.float64) @ values["w"].reshape(1000, 1024).T + values["b"]
    np.testing.assert_allclose(out.reshape(1, 1000), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype, out_dtype", [("i8", "i32"), ("f32", "f32")])
def test_the_choice_prices_the_computes_as_the_loader_does(monkeypatch, dtype, out_dtype):
    """`preferred` weighs the units by the pJ of their computes too (`compute_pj`), which differ
    between them: on the array each MAC of the operand dtype with its register reads and its
    weight's read from L1, on the vector unit a multiply-add. Against the loader's energy of the
    same kernels' units, simulated (the array's A reads are K a tile besides: within 1/Tn)."""
    from hardware import kernel_energy
    from kernel_compiler import lower_gemv as gemv
    from loader.report import energy_counts

    graph = graph_of([("MATMUL", ["a", "w"], {"transpose_b": True})], {"a": ((1, 576), dtype), "w": ((144, 576), dtype)},
                     out_dtype=out_dtype)
    target = load_target(STANDARD)
    machine = load_machine(STANDARD)
    for on_the_vector_unit in (False, True):
        monkeypatch.setattr(compile_module, "preferred", lambda kernels, graph, target: kernels[-1])
        if not on_the_vector_unit:
            monkeypatch.setattr(compile_module, "gemv_dims", lambda graph, op: None)
        program = loads(dumps(compile_graph(graph, "test.dfg", target)))
        monkeypatch.undo()
        kernel = program.kernels[0]
        assert (kernel.dataflow == "vector") == on_the_vector_unit
        sim = simulate(program, machine, bind_program(program, machine, "test", bind_cpsat))
        spent = kernel_energy(machine.energy, energy_counts(sim.phases[0], program.graph.ops[0], program.graph),
                              lambda src, dst: "dma")["by_unit"]
        np.testing.assert_allclose(gemv.compute_pj(kernel, program.graph, target), spent["array"] + spent["vector"],
                                   rtol=1 / kernel.tiling.get("Tj", kernel.tiling.get("Tn", 16)) + 1e-9)


@pytest.mark.parametrize("objective", ["latency", "edp"])
def test_products_of_one_row_one_after_another(objective):
    """1 x 1s on one position feeding one another (as Keras's MobileNet v3 ends: 576 -> 1024 ->
    1000): the chain planner weighs chaining them, and one on the vector unit, which goes by no
    bands, is no member. Values against numpy."""
    graph = graph_of([("CONV2D", ["x", "w1"], {}), ("RELU", ["t0"], {}), ("CONV2D", ["t1", "w2"], {})],
                     {"x": ((1, 1, 1, 256), "f32"), "w1": ((512, 1, 1, 256), "f32"), "w2": ((128, 1, 1, 512), "f32")})
    values = {"x": random((1, 1, 1, 256)), "w1": random((512, 1, 1, 256), seed=1) / 16,
              "w2": random((128, 1, 1, 512), seed=2) / 16}
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(STANDARD, objective=objective))))
    assert not program.chains and any(k.dataflow == "vector" for k in program.kernels), program.kernels
    machine = load_machine(STANDARD)
    out = execute(program, bind_program(program, machine, "test", bind_cpsat), values)[program.graph.outputs[0].name]
    hidden = np.maximum(values["x"].reshape(1, 256).astype(np.float64) @ values["w1"].reshape(512, 256).T, 0)
    np.testing.assert_allclose(out.reshape(1, 128), hidden @ values["w2"].reshape(128, 512).T, rtol=1e-5, atol=1e-5)


def test_the_roofline_and_the_budget_count_a_product_on_the_vector_unit():
    """The arrays' MACs (and their utilization) are theirs alone; the run's MACs, which the
    roofline and the cycle bound of any program of the graph take, count the products the
    vector unit did too."""
    from loader.report import array_work, dram_bytes, mac_work, roofline

    graph = graph_of([("CONV2D", ["x", "w"], {})], {"x": ((1, 1, 1, 48), "f32"), "w": ((1152, 1, 1, 48), "f32")})
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(STANDARD))))
    assert program.kernels[0].dataflow == "vector"
    machine = load_machine(STANDARD)
    sim = simulate(program, machine, bind_program(program, machine, "test", bind_cpsat))
    assert sim.macs == 0 and array_work(sim, program, machine) == 0
    assert mac_work(sim, program, machine, array_work(sim, program, machine)) == 48 * 1152
    intensity = roofline(sim, machine, mac_work(sim, program, machine, array_work(sim, program, machine)))["arithmetic_intensity"]
    assert intensity == 2 * 48 * 1152 / sum(dram_bytes(sim).values())
