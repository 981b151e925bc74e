"""Partial sums on chip (a K split): K advances in blocks outside the result tiles, each tile's
partial sums wait in a ring on chip between blocks and the array reloads them. Values against
numpy, the compiler's DRAM count against the simulator's bytes, the reloads and drains as the
simulator counts them, and what the validator and the loader refuse."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from conftest import shrunk_config
from dfx import Graph, ObjectFileError, Op, Tensor, dumps, loads
from dfx.objfile import _digest
from hardware import kernel_energy, load_machine
from kernel_compiler import compile_graph, load_target
from kernel_compiler import lower_matmul
from kernel_compiler.tiling import MatmulProblem, choose_tiling, estimate, split_tiling, tiled_cycles, tiling_trips
from loader import BindError, bind_greedy, bind_program, execute, simulate
from loader.buffers import engine_kind
from loader.report import dram_bytes, energy_counts


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """standard's arrays and engines with 128 KB of L3 and 8 KB L2 banks: K splits of a few tiles."""
    return shrunk_config(tmp_path_factory, "standard", "split", (2, 64), (8, 8), (4, 4))


def gemm(M: int, N: int, K: int, batch: tuple[int, ...] = ()) -> Graph:
    g = Graph("gemm")
    g.tensors["A"] = Tensor("A", (*batch, M, K), "f32", "input")
    # a batch of products (B of its own for each: one B shared by the batch is one product of more rows)
    g.tensors["B"] = Tensor("B", (*batch, K, N), "f32", "input")
    g.tensors["C"] = Tensor("C", (*batch, M, N), "f32", "output")
    g.ops.append(Op("mm", "MATMUL", ["A", "B"], ["C"], {}, "test"))
    return g


def split_program(graph: Graph, config: str, monkeypatch, level: str, parallel: str, depth: int, rows: int,
                  cols: int):
    """The GEMM compiled with 32 x 32 x 16 tiles split so (K blocks of `depth` K tiles, panels of
    `rows` x `cols` tiles), as the loader reads it."""
    monkeypatch.setattr(lower_matmul, "choose_tiling", lambda p, target: split_tiling(
        p, target, 32, 32, 16, level, parallel, depth, rows, cols)[0])
    return loads(dumps(compile_graph(graph, "gemm.dfg", load_target(config))))


def run(program, config: str, seed: int = 3):
    """Bound greedily, executed on random inputs and simulated: (inputs, values, simulation)."""
    machine = load_machine(config)
    bindings = bind_program(program, machine, "gemm.kpu", bind_greedy)
    rng = np.random.default_rng(seed)
    inputs = {t.name: rng.uniform(-1, 1, t.shape).astype(np.float32) for t in program.graph.inputs}
    return inputs, execute(program, bindings, inputs), simulate(program, machine, bindings)


@pytest.mark.parametrize("M, N, K, batch, level, parallel, depth, rows, cols", [
    (100, 70, 200, (), "L3", "ti", 3, 2, 2),  # edge tiles; the last column panel and K block short
    (100, 70, 200, (), "L3", "tj", 2, 3, 3),
    (96, 160, 512, (), "L2", "tj", 2, 2, 2),
    (70, 50, 100, (3,), "L2", "ti", 2, 2, 1),
])
def test_a_k_split_computes_the_product_and_moves_what_the_compiler_counts(
        small, monkeypatch, M, N, K, batch, level, parallel, depth, rows, cols):
    program = split_program(gemm(M, N, K, batch), small, monkeypatch, level, parallel, depth, rows, cols)
    kernel = program.kernels[0]
    loops = {loop.induction_var: loop for loop in kernel.tile_loops}
    blocks = -(-K // (16 * depth))
    assert loops["tk"].within == "kb" and loops["kb"].end == blocks > 1
    assert kernel.hints["partial_sums"].startswith(level)
    inputs, values, sim = run(program, small)
    want = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
    np.testing.assert_allclose(values["C"], want, rtol=1e-5, atol=1e-4)
    assert sum(dram_bytes(sim).values()) == kernel.hints["estimated_dram_bytes"]
    # every K block drains each result tile, every one but the first reloads it: real moves
    c = int(np.prod(batch)) * M * N * 4
    assert sim.bytes_moved["REGISTER->L2"] == c * blocks and sim.bytes_moved["L2->REGISTER"] == c * (blocks - 1)
    # the array pays its drain once per K block of each result tile
    drained = int(np.prod(batch)) * tiled_cycles(M, N, K, 32, 32, 16, load_target(small), kernel.dataflow, 16 * depth)
    assert sum(u.busy_cycles for name, u in sim.units.items() if name.startswith("array")) == drained


def test_the_energy_objective_splits_k_for_less_energy_and_compulsory_bytes(small):
    """Where the result does not fit one L2 bank, K innermost reads A once per column tile; a K
    split holds the whole result on chip and moves each operand once, for less energy by the
    loader's model. The default objective tiles as before, without a split."""
    M, N, K = 96, 96, 1024
    machine = load_machine(small)
    measured = {}
    for objective in ("latency", "energy"):
        program = loads(dumps(compile_graph(gemm(M, N, K), "gemm.dfg", load_target(small, None, objective))))
        again = dumps(compile_graph(gemm(M, N, K), "gemm.dfg", load_target(small, None, objective)))
        assert dumps(program) == again  # deterministic
        sim = simulate(program, machine, bind_program(program, machine, "gemm.kpu", bind_greedy))
        pj = kernel_energy(machine.energy, energy_counts(sim.phases[0], program.graph.ops[0], program.graph),
                           engine_kind)["total_pj"]
        measured[objective] = program.kernels[0], sum(dram_bytes(sim).values()), pj
    (latency, latency_dram, latency_pj), (energy, energy_dram, energy_pj) = measured["latency"], measured["energy"]
    assert "partial_sums" not in latency.hints and "partial_sums" in energy.hints
    assert energy_dram == energy.hints["estimated_dram_bytes"] == (M * K + K * N + M * N) * 4 < latency_dram
    assert energy_pj < latency_pj
    # the tiler priced the split as the loader does: its reloads and drains too
    problem = MatmulProblem(M, N, K, (), (), (), (), None, False, False, 4, 4, 0, 4, 4, 2)
    target = load_target(small, None, "energy")
    t = choose_tiling(problem, target)
    assert t.split is not None and estimate(problem, t, tiling_trips(problem, t), target).pj == pytest.approx(energy_pj)


@pytest.fixture
def split_doc(small, monkeypatch) -> dict:
    """The object of a K split with its partial sums in L3, as JSON, and where its ops are."""
    program = split_program(gemm(100, 70, 200), small, monkeypatch, "L3", "ti", 3, 2, 2)
    return orjson.loads(dumps(program))


def refused(doc: dict) -> str:
    doc["sha256"] = _digest(doc["body"])
    with pytest.raises(ObjectFileError) as info:
        loads(orjson.dumps(doc))
    assert "\n" not in str(info.value)
    return str(info.value)


def body_op(doc: dict, **match) -> dict:
    """The op of the kernel's body whose source and destination are as given (src=, dst= levels)."""
    return next(op for op in doc["body"]["kernels"][0]["body"] if op["type"] == "DATA_MOVE"
                and op["source"]["level"] == match["src"] and op["destination"]["level"] == match["dst"]
                and op["source"]["tensor"] == "C")


def test_no_partial_sum_leaves_the_chip_before_its_last_accumulation(split_doc):
    store = body_op(split_doc, src="L3", dst="EXTERNAL")
    assert store["when"] == "kb > 3"  # the last of 5 K blocks
    del store["when"]
    assert "stores 'C' to external memory before the last K block adds to the partial sums of 'C'" \
        in refused(split_doc)


def test_a_reload_reads_the_tile_the_last_drain_wrote(split_doc):
    reload = body_op(split_doc, src="L3", dst="L2")
    ring = body_op(split_doc, src="L2", dst="L3")
    assert reload["depends_on"] == [ring["op_id"]] and reload["when"] == "kb > 0"
    # the final store, later in the body too, is not what writes the ring last
    reload["depends_on"] = [body_op(split_doc, src="L3", dst="EXTERNAL")["op_id"]]
    assert "reloads tiles ['ti', 'tj'] of [32, 32] of C at L3, which op" in refused(split_doc)


def test_the_accumulators_are_reloaded_before_every_k_block_but_the_first(split_doc):
    body_op(split_doc, src="L2", dst="REGISTER")["when"] = "tj > 0"
    assert "reloads the accumulators of op" in refused(split_doc)


def test_a_ring_too_small_for_fewer_compute_tiles_is_refused_at_binding(small, monkeypatch, tmp_path):
    """Tiled for two compute tiles, each writes 2 partial tiles of its panel per K block; on one
    compute tile that one would write 4 into a ring of 2, and a reload would find its tile gone."""
    program = split_program(gemm(100, 70, 200), small, monkeypatch, "L3", "ti", 3, 2, 2)
    config = json.loads(open(small).read())
    config["compute"]["tile_count"] = 1
    one = tmp_path / "one.json"
    one.write_text(json.dumps(config))
    with pytest.raises(BindError, match=r"ring of 2 tile\(s\), but each of 1 compute tile\(s\) writes 4 there "
                                        r"per step of loop 'kb'"):
        bind_program(program, load_machine(one), "gemm.kpu", bind_greedy)
