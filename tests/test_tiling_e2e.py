"""Two-level matmul tiling end to end: a resident L3 panel with a loop within blocks, shared by the
compute tiles, moves what the compiler counts, and computes the right numbers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from conftest import CONFIGS, shrunk_config
from dfx import Graph, Op, Tensor, dumps, loads
from hardware import load_machine
from kernel_compiler import compile_graph, load_target
from kernel_compiler.chains import ENGINES, usage
from loader import bind_greedy, bind_program, execute, program_tasks, simulate
from loader.buffers import kernel_demands
from loader.report import dram_bytes

STANDARD = str(CONFIGS / "standard.json")
MOVE_UNITS = ("dma", "block_mover", "streamer")

# external-memory bytes (reads and writes) of each f32 GEMM M x N x K on standard, as
# benchmarks/RESULTS.md ("Tiling: external-memory traffic") shows them
PINNED_DRAM = {
    (1024, 1024, 1024): 71_303_168,
    (8192, 256, 256): 17_039_360,
    (256, 8192, 256): 17_039_360,
    (256, 256, 8192): 33_816_576,
    (4096, 4096, 64): 71_303_168,
}


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """standard's array and engines with 32 KB of L3: panels of a few hundred rows, in blocks."""
    return shrunk_config(tmp_path_factory, "standard", "small", (2, 16), (8, 8), (4, 4))


def gemm(M: int, N: int, K: int, batch: tuple[int, ...] = (), transpose_b: bool = False) -> Graph:
    g = Graph("gemm")
    g.tensors["A"] = Tensor("A", (*batch, M, K), "f32", "input")
    # a batch of products (B of its own for each: one B shared by the batch is one product of more rows)
    g.tensors["B"] = Tensor("B", (*batch, *((N, K) if transpose_b else (K, N))), "f32", "input")
    g.tensors["C"] = Tensor("C", (*batch, M, N), "f32", "output")
    g.ops.append(Op("mm", "MATMUL", ["A", "B"], ["C"], {"transpose_b": True} if transpose_b else {}, "test"))
    return g


def compiled(graph: Graph, config: str):
    """The program as the loader reads it (so the validator sees the loops within blocks)."""
    return loads(dumps(compile_graph(graph, "gemm.dfg", load_target(config))))


@pytest.mark.parametrize("shape", PINNED_DRAM, ids=lambda s: "x".join(map(str, s)))
def test_external_memory_bytes_are_pinned_and_counted_by_the_compiler(shape):
    program = compiled(gemm(*shape), STANDARD)
    machine = load_machine(STANDARD)
    sim = simulate(program, machine, bind_program(program, machine, "gemm.kpu", bind_greedy))
    moved = sum(dram_bytes(sim).values())
    assert moved == PINNED_DRAM[shape]
    assert moved == program.kernels[0].hints["estimated_dram_bytes"]


def test_a_k_split_moves_every_operand_once_as_counted():
    """256x256x8192 with `--objective energy`: K in blocks outside the four result tiles, their
    partial sums on chip between blocks (tests/test_partial_sums.py), so A and B cross external
    memory once each (the latency tiling reads each twice, 33,816,576 bytes), as counted."""
    program = loads(dumps(compile_graph(gemm(256, 256, 8192), "gemm.dfg", load_target(STANDARD, None, "energy"))))
    kernel = program.kernels[0]
    assert "partial_sums" in kernel.hints
    machine = load_machine(STANDARD)
    sim = simulate(program, machine, bind_program(program, machine, "gemm.kpu", bind_greedy))
    assert sum(dram_bytes(sim).values()) == kernel.hints["estimated_dram_bytes"] == (2 * 256 * 8192 + 256 * 256) * 4


@pytest.mark.parametrize("M, N, K, batch, transpose_b, resident", [
    (200, 200, 40, (), False, "A"),
    (200, 412, 40, (), False, "B"),
    (200, 200, 40, (), True, "A"),
    (200, 200, 40, (2,), False, "A"),
])
def test_resident_panel_in_blocks_computes_the_product(small, M, N, K, batch, transpose_b, resident):
    program = compiled(gemm(M, N, K, batch, transpose_b), small)
    kernel = program.kernels[0]
    blocks = {"A": "bi", "B": "bj"}[resident]
    within = [loop for loop in kernel.tile_loops if loop.within == blocks]
    # a panel in blocks of several tiles, the last block short, shared by both compute tiles
    assert within and within[0].trip_count % within[0].per_block != 0, kernel.tile_loops
    assert kernel.shared_moves() and kernel.hints["compute_tiles"] == 2
    bindings, sim = run_against_numpy(program, small, transpose_b, seed=7)
    assert bindings[0].workers == 2
    assert sum(dram_bytes(sim).values()) == kernel.hints["estimated_dram_bytes"]


def run_against_numpy(program, config, transpose_b: bool, seed: int):
    """Bind the GEMM greedily on `config`, compute C and compare it with numpy's product in f64;
    the bindings and the simulated run."""
    machine = load_machine(config)
    bindings = bind_program(program, machine, "gemm.kpu", bind_greedy)
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, program.graph.tensors["A"].shape).astype(np.float32)
    b = rng.uniform(-1, 1, program.graph.tensors["B"].shape).astype(np.float32)
    c = execute(program, bindings, {"A": a, "B": b})["C"]
    want = a.astype(np.float64) @ (np.swapaxes(b, -1, -2) if transpose_b else b).astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4)
    return bindings, simulate(program, machine, bindings)


def test_a_tile_held_transposed_is_never_read_in_parts(small):
    """A panel loaded transposed into L3 and its tiles moved out transposed again would cancel
    the swaps tile by tile but slice the panel along the wrong axes: the reader refuses it."""
    import orjson

    from dfx import ObjectFileError
    from dfx.objfile import _digest

    doc = orjson.loads(dumps(compile_graph(gemm(200, 200, 40), "gemm.dfg", load_target(small))))
    for op in doc["body"]["kernels"][0]["body"]:
        if op["type"] == "DATA_MOVE" and op["source"]["tensor"] == "A" and op["destination"]["level"] in ("L3", "L2"):
            op["transpose"] = True
    doc["sha256"] = _digest(doc["body"])
    with pytest.raises(ObjectFileError, match="reads part of the A tile at L3 that op 0 holds transposed"):
        loads(orjson.dumps(doc))


def test_a_whole_operand_beside_k_tiles_moves_every_operand_once():
    """GPT-2's first FFN matmul on standard: A (128 x 768) stays in L3, loaded once for both
    compute tiles, while B streams past it in K tiles: the simulator moves the compulsory bytes,
    as the compiler counts them (20,447,232 without the resident A: A read 24 times)."""
    M, N, K = 128, 3072, 768
    program = compiled(gemm(M, N, K), STANDARD)
    kernel = program.kernels[0]
    assert kernel.hints["l3_resident"] == "A panel of 128 x 768, 1 deep, the other in K tiles"
    machine = load_machine(STANDARD)
    sim = simulate(program, machine, bind_program(program, machine, "gemm.kpu", bind_greedy))
    moved = sum(dram_bytes(sim).values())
    assert moved == kernel.hints["estimated_dram_bytes"] == (M * K + K * N + M * N) * 4


@pytest.mark.parametrize("M, N, K, batch, transpose_b, resident", [
    (16, 300, 200, (), False, "A"),
    (20, 300, 120, (), True, "A"),
    (16, 412, 100, (2,), False, "A"),
    (300, 16, 120, (), False, "B"),
])
def test_whole_operand_beside_k_tiles_computes_the_product(small, M, N, K, batch, transpose_b, resident):
    program = compiled(gemm(M, N, K, batch, transpose_b), small)
    kernel = program.kernels[0]
    assert kernel.hints["l3_resident"].startswith(f"{resident} panel") and "K tiles" in kernel.hints["l3_resident"]
    # the resident panel, loaded outside the parallel loop, serves both compute tiles
    assert kernel.shared_moves() and kernel.hints["compute_tiles"] == 2
    _, sim = run_against_numpy(program, small, transpose_b, seed=11)
    # every operand crosses once per batch step (each step its own A and B)
    assert sum(dram_bytes(sim).values()) == kernel.hints["estimated_dram_bytes"] == \
        int(np.prod(batch)) * (M * K + K * N + M * N) * 4


def test_the_chain_planner_counts_a_move_once_per_step_over_all_blocks(small):
    """A loop within blocks takes its steps over all of them, so its loop over blocks multiplies
    nothing inside it: every op runs as often as the loop nest's walk finds it, and the chain
    planner's BlockMover figure carries the bytes the simulator moves between L3 and L2 (it took
    the blocks' count once more: MobileNet v2's classifier by edp, rated at 1,290,240 cycles, ran
    61,072)."""
    program = compiled(gemm(200, 412, 40), small)
    kernel = program.kernels[0]
    assert any(loop.within for loop in kernel.tile_loops), kernel.tile_loops
    loops = kernel.tile_loops

    def walked(op) -> int:
        anchor = op.at or op.after
        depth = 0 if anchor is None else [l.induction_var for l in loops].index(anchor) + (op.at is not None)

        def walk(d: int, env: dict[str, int]) -> int:
            if d == depth:
                return 1
            return sum(walk(d + 1, {**env, loops[d].induction_var: v}) for v in loops[d].steps(env))
        return walk(0, {})

    assert all(kernel.runs(op) == walked(op) for op in kernel.body)
    target = load_target(small)
    machine = load_machine(small)
    sim = simulate(program, machine, bind_program(program, machine, "gemm.kpu", bind_greedy))
    moved = sim.bytes_moved.get("L3->L2", 0) + sim.bytes_moved.get("L2->L3", 0)
    estimated = usage(kernel, program.graph, target).busy[ENGINES.index("block_mover")] \
        * target.costs.l3_l2_bytes_per_cycle
    assert moved <= estimated <= 1.25 * moved  # whole tiles where the edge ones are short


def test_the_binder_counts_each_move_as_often_as_the_simulator_runs_it():
    """A move outside the parallel loop (on datacenter, the whole of A before the loop over column
    tiles, each compute tile loading its own copy for the columns it takes) runs on every compute
    tile, a move inside it on one at a time: the loads the binder balances are the tasks the
    simulator runs, move by move (each tile under 64 KiB: larger ones go in parts, SPLIT_BYTES)."""
    datacenter = str(CONFIGS / "datacenter.json")
    program = compiled(gemm(200, 64, 40), datacenter)
    machine = load_machine(datacenter)
    bindings = bind_program(program, machine, "gemm.kpu", bind_greedy)
    kernel = program.kernels[0]
    _, streams = kernel_demands(kernel, program, bindings[0].workers, frozenset(), machine.line_bytes)
    counted = Counter()
    for s in streams:
        counted[s.op_id] += s.tiles
    ran = Counter(t.stream for t in program_tasks(program, bindings, machine) if t.unit in MOVE_UNITS)
    outside = [op for op in kernel.body if op.op_id in counted and not kernel.in_parallel_loop(op)
               and op.op_id not in kernel.shared_moves()]
    assert outside and bindings[0].workers > 1
    assert counted == ran


def test_latency_takes_tiles_that_deal_evenly_where_the_fewest_bytes_do_not(monkeypatch):
    """Swin-T's last-stage MLP product, 196 x 1536 x 384: its fewest bytes come in 128 x 128 tiles,
    3 along N for 2 compute tiles, one of which takes two. The estimate, counting the busiest
    compute tile's share, finds tiles dealt evenly quicker, and the simulator agrees; the kernel's
    array cycles are that compute tile's, as the simulator keeps it busy."""
    import kernel_compiler.tiling as tiling

    machine = load_machine(STANDARD)

    def run_once() -> tuple[dict, int, int, int]:
        tiling._best_tiling.cache_clear()  # the choice is cached per problem and target
        program = compiled(gemm(196, 384, 1536), STANDARD)
        sim = simulate(program, machine, bind_program(program, machine, "gemm.kpu", bind_greedy))
        array = max(u.busy_cycles for name, u in sim.units.items() if name.startswith("array"))
        return program.kernels[0], sim.cycles, array, sum(dram_bytes(sim).values())

    kernel, cycles, array, dram = run_once()
    monkeypatch.setattr(tiling, "FASTER", 1.0)  # the fewest bytes, whatever the estimate finds
    fewest, fewest_cycles, _, fewest_dram = run_once()
    tiling._best_tiling.cache_clear()
    assert (fewest.tiling["Ti"], fewest.tiling["Tj"]) == (128, 128) and fewest.tiling["num_tiles_n"] == 3
    assert kernel.tiling["num_tiles_n"] % 2 == 0 and cycles < 0.8 * fewest_cycles
    assert fewest_dram < dram < 1.2 * fewest_dram
    assert kernel.hints["estimated_compute_cycles"] == array
