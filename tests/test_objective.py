"""`kpu-kernel-compiler --objective latency|energy|edp`: the default tiles as before; energy moves
fewer bytes for less energy and edp takes the least energy x cycles, both as the loader measures
them; the matmul, convolution and window tilers price a tiling as the loader does; the choice
is in the object, in --dump and -v."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from conftest import assert_one_line_error, run_cli
from dfx import encode, read
from hardware import kernel_energy, load_machine
from kernel_compiler.bands import layer
from kernel_compiler.compile import compile_graph
from kernel_compiler import lower_conv, lower_window
from kernel_compiler.lower_conv import MIN_CHUNK, ConvProblem, conv_pj
from kernel_compiler.lower_vector import epilogue_work
from kernel_compiler.lower_window import WindowProblem, window_pj
from kernel_compiler.target import load_target
from kernel_compiler.tiling import MatmulProblem, choose_tiling, estimate, trips_of
from loader import bind_cpsat, bind_program, simulate
from loader.buffers import engine_kind
from loader.report import energy_counts
from test_vector_kernels import STANDARD, graph_of

GEMM_384 = ([("MATMUL", ["a", "b"], {})], {"a": ((384, 384), "f32"), "b": ((384, 384), "f32")})

# Each kernel's tiling, DRAM bytes and array cycles as the compiler chose them before there was an
# objective (the objects were byte-identical to these programs' then), but the 384^3 GEMM's: its
# tiles of 128 x 128, the fewest bytes, came 9 to 2 compute tiles (168,268 simulated cycles), and
# the estimate, counting the busiest compute tile's, takes 12 tiles of 96 x 128 (126,978 cycles,
# 14% more bytes). The cycles are the busiest compute tile's (an even share before: 1.5 of the
# batched product's 3 elements, the 200-row product's 60 columns as many as its 80); the
# convolution's with its wait for its one buffer of result tiles to drain: counting that wait,
# the tiler takes tiles of 16 output channels with all 24 input ones, not 32 with chunks of 8
# (4,128 simulated cycles, not 4,500)
BEFORE = [
    (GEMM_384, [({"Ti": 96, "Tj": 128, "Tk": 32, "L1_Ki": 32, "num_tiles_m": 4, "num_tiles_n": 3,
                  "num_tiles_k": 12}, 4718592, 119232)]),
    (([("MATMUL", ["a", "b"], {}), ("ADD", ["t0", "c"], {})],
      {"a": ((200, 500), "f32"), "b": ((500, 300), "f32"), "c": ((300,), "f32")}),
     [({"Ti": 200, "Tj": 80, "Tk": 16, "L1_Ki": 16, "num_tiles_m": 1, "num_tiles_n": 4, "num_tiles_k": 32},
       2441200, 68900)]),
    (([("MATMUL", ["a", "b"], {})], {"a": ((3, 96, 160), "f32"), "b": ((3, 160, 80), "f32")}),
     [({"Ti": 96, "Tj": 80, "Tk": 32, "L1_Ki": 32, "num_tiles_m": 1, "num_tiles_n": 1, "num_tiles_k": 5},
       430080, 11400)]),
    (([("CONV2D", ["x", "w", "b"], {"stride": [2, 2], "padding": [[1, 1], [1, 1]]}), ("ADD", ["t0", "c"], {})],
      {"x": ((1, 17, 13, 24), "f32"), "w": ((40, 3, 3, 24), "f32"), "b": ((40,), "f32"), "c": ((40,), "f32")}),
     [({"R": 9, "C": 7, "Tn": 16, "Tc": 24, "band_rows": 19, "band_cols": 15, "num_tiles_b0": 1, "num_tiles_th": 1,
        "num_tiles_tw": 1, "num_tiles_tj": 3, "num_tiles_tk": 1}, 66176, 2063)]),
]


@pytest.mark.parametrize("graph, kernels", BEFORE)
def test_the_default_objective_tiles_as_before(graph, kernels):
    program = compile_graph(graph_of(*graph), "test.dfg", load_target(STANDARD))
    assert program.objective == "latency"
    assert [(k.tiling, k.hints["estimated_dram_bytes"], k.hints["estimated_compute_cycles"])
            for k in program.kernels] == kernels
    assert "objective" not in orjson.loads(b"".join(encode(program).pieces()))["body"]  # the file as before


@pytest.mark.parametrize("M, N, K, tiles", [  # the GEMMs: Ti, Tj, Tk before
    (1024, 1024, 1024, (128, 128, 32)), (256, 256, 8192, (128, 128, 32)), (2048, 512, 3072, (128, 128, 32))])
def test_the_default_objective_tiles_large_gemms_as_before(M, N, K, tiles):
    problem = MatmulProblem(M, N, K, (), (), (), (), None, False, False, 4, 4, 0, 4, 4, 2)
    t = choose_tiling(problem, load_target(STANDARD))
    assert ((t.Ti, t.Tj, t.Tk), t.loop_order, t.resident) == (tiles, ("ti", "tj", "tk"), None)


@pytest.fixture(scope="module")
def gemm_runs():
    """The 384^3 GEMM compiled for each objective and run on standard as `kpu-loader` runs it
    (CP-SAT binding): objective -> (program, cycles, DRAM bytes, pJ by the loader's model)."""
    machine = load_machine(STANDARD)
    runs = {}
    for objective in ("latency", "energy", "edp"):
        program = compile_graph(graph_of(*GEMM_384), "test.dfg", load_target(STANDARD, None, objective))
        sim = simulate(program, machine, bind_program(program, machine, "test", bind_cpsat))
        pj = kernel_energy(machine.energy, energy_counts(sim.phases[0], program.graph.ops[0], program.graph),
                           engine_kind)["total_pj"]
        dram = sum(n for path, n in sim.bytes_moved.items() if "EXTERNAL" in path)
        runs[objective] = program, sim.cycles, dram, pj
    return runs


def test_energy_moves_fewer_bytes_for_less_energy(gemm_runs):
    _, cycles, dram, pj = gemm_runs["latency"]
    program, e_cycles, e_dram, e_pj = gemm_runs["energy"]
    assert e_dram < 0.6 * dram  # 2,359,296 bytes against 4,718,592
    assert e_pj < 0.8 * pj
    assert e_cycles < 1.25 * cycles  # 150,118 against 126,978
    # the tiler priced it as the loader does
    assert program.kernels[0].hints["estimated_dram_bytes"] == e_dram


def test_edp_takes_the_least_energy_times_cycles(gemm_runs):
    edp = {objective: cycles * pj for objective, (_, cycles, _, pj) in gemm_runs.items()}
    assert edp["edp"] < edp["energy"] < edp["latency"]
    assert gemm_runs["edp"][0].kernels[0].tiling != gemm_runs["energy"][0].kernels[0].tiling


def test_the_tilers_energy_is_the_loaders(gemm_runs):
    """`estimate` prices a tiling from the bytes each pair of levels moves and the MACs, as
    `hardware.energy` prices what the simulator counted."""
    target = load_target(STANDARD, None, "energy")
    problem = MatmulProblem(384, 384, 384, (), (), (), (), None, False, False, 4, 4, 0, 4, 4, 2)
    for objective, (program, _, _, pj) in gemm_runs.items():
        t = choose_tiling(problem, load_target(STANDARD, None, objective))
        assert program.kernels[0].tiling["Ti"] == t.Ti and program.kernels[0].tiling["Tj"] == t.Tj
        assert estimate(problem, t, trips_of(problem, t.Ti, t.Tj, t.Tk, t.per_block), target).pj == pytest.approx(pj)


def test_the_objective_is_in_the_object_dump_and_verbose(gemm_file, tmp_path):
    src, out = gemm_file(64, 96, 80), tmp_path / "g.kpu"
    proc = run_cli("compiler", src, "-o", out, "--objective", "edp", "-v")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == "objective edp"
    assert read(out).objective == "edp"
    assert orjson.loads(out.read_bytes())["body"]["objective"] == "edp"
    dump = run_cli("compiler", src, "--objective", "energy", "--dump")
    assert dump.returncode == 0 and "objective energy" in dump.stdout.splitlines()
    assert "objective latency" in run_cli("compiler", src, "--dump").stdout.splitlines()


def test_an_unknown_objective_is_one_line(gemm_file, tmp_path):
    out = tmp_path / "g.kpu"
    assert_one_line_error(run_cli("compiler", gemm_file(16, 16, 16), "-o", out, "--objective", "power"),
                          "--objective", "latency, energy or edp", "'power'")
    assert not out.exists()


CONV = ([("CONV2D", ["x", "w"], {"stride": [1, 1], "padding": [[1, 1], [1, 1]]})],
        {"x": ((1, 28, 28, 64), "f32"), "w": ((96, 3, 3, 64), "f32")})
POINTWISE = ([("CONV2D", ["x", "w"], {})], {"x": ((1, 56, 56, 16), "f32"), "w": ((32, 1, 1, 16), "f32")})


def loader_pj(program, machine) -> float:
    """The one-kernel program run on `machine` as `kpu-loader` runs it: its pJ by the loader's model."""
    sim = simulate(program, machine, bind_program(program, machine, "test", bind_cpsat))
    return kernel_energy(machine.energy, energy_counts(sim.phases[0], program.graph.ops[0], program.graph),
                         engine_kind)["total_pj"]


def forced(program, kernel):
    """The one-kernel program with `kernel` in place of its own."""
    return dataclasses.replace(program, kernels=[dataclasses.replace(kernel, depends_on=program.kernels[0].depends_on)])


@pytest.mark.parametrize("graph", [CONV, POINTWISE])
def test_the_conv_tilers_energy_is_the_loaders(graph):
    """`conv_pj` prices every holding's tiling (weights resident in L1 across tiles of positions,
    loads outside the parallel loop copied on each compute tile) as `hardware.energy` prices what
    the simulator counted."""
    machine, target = load_machine(STANDARD), load_target(STANDARD, None, "energy")
    program = compile_graph(graph_of(*graph), "test.dfg", target)
    problem = layer(ConvProblem, program.graph, program.graph.ops, 2, c_bytes=4, epilogue_work=(), dtype="f32")
    tilings = {(t.order, t.band_channels, t.weights): t
               for t in lower_conv._candidates(problem, target, (target.cols, MIN_CHUNK))}
    assert len(tilings) >= 4
    for t in tilings.values():
        kernel = lower_conv._kernel(program.graph, program.graph.ops, program.kernels[0].name, target, problem, t,
                                    "output_stationary")
        assert conv_pj(problem, t, target.costs, target.compute_tiles) == \
            pytest.approx(loader_pj(forced(program, kernel), machine)), t


@pytest.fixture(scope="module")
def conv_runs():
    """The 3 x 3 convolution compiled for each objective and run on standard: objective ->
    (its kernel, cycles, pJ by the loader's model)."""
    machine = load_machine(STANDARD)
    runs = {}
    for objective in ("latency", "energy", "edp"):
        program = compile_graph(graph_of(*CONV), "test.dfg", load_target(STANDARD, None, objective))
        sim = simulate(program, machine, bind_program(program, machine, "test", bind_cpsat))
        runs[objective] = program.kernels[0], sim.cycles, loader_pj(program, machine)
    return runs


def test_energy_tiles_a_convolution_for_less_energy(conv_runs):
    """The 5% of cycles the latency objective may give up kept the whole image in one tile of
    16 output channels, reading every window six times; ranked by energy, bands of rows with all
    96 output channels read each once."""
    latency, cycles, pj = conv_runs["latency"]
    energy, e_cycles, e_pj = conv_runs["energy"]
    assert (latency.tiling["R"], latency.tiling["Tn"], energy.tiling["Tn"]) == (28, 16, 96)
    assert e_pj < pj and e_cycles > cycles


def test_edp_tiles_a_convolution_for_the_least_energy_times_cycles(conv_runs):
    """Of every tiling the tiler weighs, edp takes the one of least pJ x cycles by its estimates."""
    target = load_target(STANDARD, None, "edp")
    program = compile_graph(graph_of(*CONV), "test.dfg", target)
    problem = layer(ConvProblem, program.graph, program.graph.ops, 2, c_bytes=4, epilogue_work=(), dtype="f32")
    scored = lower_conv._scored(problem, lower_conv._candidates(problem, target, (target.cols, MIN_CHUNK)), target,
                                target.dataflows)
    least = min(conv_pj(problem, s.tiling, target.costs, target.compute_tiles) * s.cycles for s in scored)
    s = next(s for s in scored if s.dataflow == conv_runs["edp"][0].dataflow
             and all(getattr(s.tiling, k) == conv_runs["edp"][0].tiling[k] for k in ("R", "C", "Tn", "Tc")))
    assert conv_pj(problem, s.tiling, target.costs, target.compute_tiles) * s.cycles == pytest.approx(least)


@pytest.mark.parametrize("graph", [
    ([("DEPTHWISE_CONV2D", ["x", "w"], {"stride": [2, 2], "padding": [[1, 1], [1, 1]]}),
      ("CLAMP", ["t0"], {"min": 0.0, "max": 6.0})], {"x": ((1, 56, 56, 144), "f32"), "w": ((3, 3, 144, 1), "f32")}),
    ([("DEPTHWISE_CONV2D", ["x", "w", "b"], {"stride": [1, 1], "padding": [[1, 1], [1, 1]]})],
     {"x": ((1, 28, 28, 96), "f32"), "w": ((3, 3, 96, 1), "f32"), "b": ((96,), "f32")}),
    ([("DEPTHWISE_CONV2D", ["x", "w", "b"], {"stride": [1, 1], "padding": [[1, 1], [1, 1]]})],
     {"x": ((1, 56, 56, 16), "f32"), "w": ((3, 3, 16, 1), "f32"), "b": ((16,), "f32")}),
    ([("DEPTHWISE_CONV2D", ["x", "w"], {"stride": [1, 1], "padding": [[1, 1], [1, 1]]}), ("ADD", ["t0", "r"], {})],
     {"x": ((1, 28, 28, 96), "f32"), "w": ((3, 3, 96, 1), "f32"), "r": ((1, 28, 28, 96), "f32")}),
    ([("MAXPOOL2D", ["x"], {"kernel": [3, 3], "stride": [2, 2], "padding": [[1, 1], [1, 1]]})],
     {"x": ((1, 48, 48, 64), "f32")})])
def test_the_window_tilers_energy_is_the_loaders(graph):
    """`window_pj` prices every tiling the window tiler weighs, with its bias and its epilogue's
    operands and work, as `hardware.energy` prices what the simulator counted."""
    machine, target = load_machine(STANDARD), load_target(STANDARD, None, "energy")
    program = compile_graph(graph_of(*graph), "test.dfg", target)
    assert len(program.kernels) == 1
    ops = program.graph.ops
    problem = layer(WindowProblem, program.graph, ops, 2)
    vector_pj = target.costs.vector_pj(epilogue_work(program.graph, ops))
    for t in lower_window._candidates(problem, target):
        kernel = lower_window._kernel(program.graph, ops, program.kernels[0].name, target, problem, t)
        assert window_pj(problem, t, target.costs, target.compute_tiles, vector_pj) == \
            pytest.approx(loader_pj(forced(program, kernel), machine)), t
