"""Chains: a depthwise 3x3 (vector unit) and a pointwise 1x1 (array) run at once, band by band,
the depthwise result held in L3 (whole, or a ring of rows) and never in external memory; the
validator's chain rules; the binder keeping a chain's buffers apart."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from dfx import ObjectFileError, Program, dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph, graph_passes, lower_kernels
from kernel_compiler.residency import keep_on_chip
from kernel_compiler.synchronise import synchronise
from kernel_compiler.target import Level, load_target
from loader import BindError, LoadError, bind_cpsat, bind_greedy, bind_program, execute, program_tasks, simulate
from loader import tasks
from loader.binding import Binding, stream_cycles
from loader.buffers import StreamReq, home_layout, kernel_demands
from loader.cache import EntryError, check
from loader.report import dram_bytes, homes_view
from kernel_compiler import chains
from test_vector_kernels import STANDARD, graph_of, random

DW = ("DEPTHWISE_CONV2D", ["x", "wd"], {"padding": [[1, 1], [1, 1]]})
SHAPES = {"x": ((1, 16, 16, 16), "f32"), "wd": ((3, 3, 16, 1), "f32"), "wp": ((32, 1, 1, 16), "f32")}
CHAIN = [DW, ("CONV2D", ["t0", "wp"], {})]
ROW_BYTES = 16 * 16 * 4  # one row of t0, the link
# an L1 of 1 KB makes both kernels go by rows: the depthwise in bands of 5 rows (its channels
# innermost, dealt to the two compute tiles), the pointwise in bands of 2 (dealt to them)
SMALL_L1 = 1024
# the depthwise writes 5 rows at once while the pointwise reads the row before them: a ring of 6
RING = 6


def program(chained: bool, ring: int | None = None, ops=CHAIN, shapes=SHAPES, l1: int = SMALL_L1,
            chains: list[list[str]] | None = None, rings: dict[str, int] | None = None) -> Program:
    """The graph compiled by the compiler's stages, the intermediates it keeps in L3 made the
    links of one chain of all its kernels (no barrier on reading them) where `chained`, t0 (or
    each of `rings`) a ring of `ring` rows."""
    standard = load_target(STANDARD)
    target = dataclasses.replace(standard, l1=Level(standard.l1.banks, l1))
    graph = graph_passes(graph_of(ops, shapes), target, True, [])
    kernels = list(lower_kernels(graph, target, "auto", True))
    graph = keep_on_chip(kernels, graph, target)
    kept = frozenset(t.name for t in graph.tensors.values() if t.home == "L3")
    synchronise(kernels, kept if chained else frozenset())
    p = Program(graph.name, "chain.dfg", standard.name, graph, kernels)
    if chained:
        p.chains = chains if chains is not None else [[k.name for k in kernels]]
    for name, rows in (rings or ({"t0": ring} if ring is not None else {})).items():
        graph.tensors[name] = dataclasses.replace(graph.tensors[name], ring=rows)
    return p


def values() -> dict[str, np.ndarray]:
    return {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}


def _depthwise(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A depthwise 3x3, stride 1, padding 1, in float64."""
    h, wd = x.shape[1:3]
    p = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)])
    return sum(p[:, i:i + h, j:j + wd, :] * w[i, j, :, 0] for i in range(3) for j in range(3))


def reference(v: dict[str, np.ndarray]) -> np.ndarray:
    """The depthwise 3x3 (padding 1) then the 1x1 convolution, in float64."""
    return np.einsum("nhwc,oc->nhwo", _depthwise(v["x"], v["wd"]), v["wp"][:, 0, 0, :].astype(np.float64))


def run(p: Program, machine, trace: bool = False):
    bindings = bind_program(p, machine, "chain.kpu", bind_greedy)
    sim = simulate(p, machine, bindings, trace=trace, record_first=1 << 20)
    return bindings, sim, execute(p, bindings, values())


def test_a_chain_runs_its_kernels_band_by_band_with_the_link_in_a_ring():
    standard = load_machine(STANDARD)
    chained = loads(dumps(program(True, ring=RING)))  # the chain and the ring as the object file holds them
    assert chained.chains == [["depthwise_conv2d_0", "conv2d_1"]] and chained.graph.tensors["t0"].ring == RING
    assert not any(op.type == "BARRIER" for op in chained.kernels[1].body)
    bindings, sim, got = run(chained, standard, trace=True)
    assert np.allclose(got["t1"], reference(values()), rtol=1e-4, atol=1e-4)
    assert [h.bytes for h in bindings[0].homes] == [RING * ROW_BYTES] == [h.bytes for h in bindings[1].homes]
    assert {k: homes_view(chained, bindings)["t0"][k] for k in ("ring", "ring_holds")} == {"ring": RING,
                                                                                           "ring_holds": "rows"}
    # t0 never crosses external memory: the input in its bands (22 rows of 16, each band with its
    # halo), both weights and the result, exactly
    assert dram_bytes(sim) == {"read": 22 * 16 * 16 * 4 + 3 * 3 * 16 * 4 + 32 * 16 * 4, "write": 16 * 16 * 32 * 4}
    assert sum(dram_bytes(sim).values()) == sum(k.hints["estimated_dram_bytes"] for k in chained.kernels)
    # by rows: each read of rows of t0 out of L3 starts once every write of them has ended, and
    # each write into the ring once every read of the rows it replaces has
    def moves(label: str, kernel: int) -> list[tuple[set[int], int, int]]:
        rows = chained.kernels[kernel].tiling["R"]
        return [(set(range(t.args["th"] * rows, min((t.args["th"] + 1) * rows, 16))), start, end)
                for t, start, end, _ in sim.first_tasks if t.label == label]
    writes, reads = moves("t0 L2->L3", 0), moves("t0 L3->L2", 1)
    assert (len(writes), len(reads)) == (4 * 16, 8 * 4)  # bands x channel tiles, bands x channel chunks
    assert all(w_end <= r_start for w_rows, _, w_end in writes for r_rows, r_start, _ in reads if w_rows & r_rows)
    assert all(r_end <= w_start for w_rows, w_start, _ in writes for r_rows, _, r_end in reads
               if {r + RING for r in r_rows} & w_rows)
    # the depthwise's vector tasks and the pointwise's array tasks run at the same time
    spans = {unit: [(start, end) for t, start, end, _ in sim.first_tasks if t.unit == unit and t.phase == phase]
             for unit, phase in (("vector", 0), ("array", 1))}
    assert any(a0 < v1 and v0 < a1 for v0, v1 in spans["vector"] for a0, a1 in spans["array"])
    # and so they do in the Perfetto trace
    slices = {name: [(e["ts"], e["ts"] + e["dur"]) for e in sim.trace_events
                     if e.get("ph") == "X" and e["name"].startswith(name)]
              for name in ("DEPTHWISE_CONV2D_TILE", "CONV2D_TILE")}
    assert any(a0 < v1 and v0 < a1 for v0, v1 in slices["DEPTHWISE_CONV2D_TILE"] for a0, a1 in slices["CONV2D_TILE"])

    # the same kernels one after the other (a barrier between them, t0 kept whole) take longer
    alone = loads(dumps(program(False)))
    _, sim_alone, got_alone = run(alone, standard)
    assert sim.cycles < sim_alone.cycles
    assert dram_bytes(sim_alone) == dram_bytes(sim)
    assert np.array_equal(got_alone["t1"], got["t1"])


# a pointwise 1x1 of 14 x 14 x 256 into 512 channels, then a depthwise 3x3 on its result: the
# compiler chains them by channels (the pointwise in 16 tiles of 32 output channels, eight to
# each compute tile; the depthwise in chunks of 16 of them), the link in a ring of channels in
# L3; bound by CP-SAT, as the loader binds (greedy binding packs the two kernels' buffers into
# shared L2 banks and the chain runs slower than the kernels one after the other)
BY_CHANNELS = [("CONV2D", ["x", "wp"], {}), ("DEPTHWISE_CONV2D", ["t0", "wd"], {"padding": [[1, 1], [1, 1]]})]
WIDE = {"x": ((1, 14, 14, 256), "f32"), "wp": ((512, 1, 1, 256), "f32"), "wd": ((3, 3, 512, 1), "f32")}


def test_a_pointwise_and_a_depthwise_chain_by_channels_through_a_ring_of_channels(monkeypatch):
    standard = load_machine(STANDARD)
    compiled = {chain: loads(dumps(compile_graph(graph_of(BY_CHANNELS, WIDE), "chain.dfg", load_target(STANDARD),
                                                 chain=chain)), "chain.kpu") for chain in (True, False)}
    chained = compiled[True]
    pointwise, depthwise = chained.kernels
    assert chained.chains == [["conv2d_0", "depthwise_conv2d_1"]]
    assert pointwise.band_dim("t0") == depthwise.band_dim("t0") == 3 and pointwise.band_loop().trip_count > 2
    # its home holds the channels the bands of both span on the two compute tiles (a tile of 32
    # written on each, a chunk of 16 read on each), once or twice over: not all 512
    t0 = chained.graph.tensors["t0"]
    in_flight = 2 * pointwise.tiling["Tn"] + 2 * depthwise.tiling["Tc"]
    assert (t0.home, t0.ring_dim) == ("L3", 3) and t0.ring in (in_flight, chains.RING_DEPTH * in_flight)
    assert t0.ring < 512
    bindings = bind_program(chained, standard, "chain.kpu", bind_cpsat)
    assert [h.bytes for h in bindings[0].homes] == [14 * 14 * t0.ring * 4]
    assert (homes_view(chained, bindings)["t0"]["ring"], homes_view(chained, bindings)["t0"]["ring_holds"]) \
        == (t0.ring, "channels")
    sim = simulate(chained, standard, bindings, record_first=1 << 20)
    v = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(WIDE.items())}
    assert np.allclose(execute(chained, bindings, v)["t1"], _reference_by_channels(v, 14), rtol=1e-4, atol=1e-3)
    # t0 never crosses external memory: the input, both weights and the result, exactly
    assert dram_bytes(sim) == {"read": (14 * 14 * 256 + 512 * 256 + 9 * 512) * 4, "write": 14 * 14 * 512 * 4}

    def channels(sim, label: str, loop: str, tile: int) -> list[tuple[set[int], int, int]]:
        return [(set(range(t.args[loop] * tile, (t.args[loop] + 1) * tile)), start, end)
                for t, start, end, _ in sim.first_tasks if t.label == label]
    # the pointwise's stores into the ring, the depthwise's padded chunks copied out of it
    writes = channels(sim, "t0 L2->L3", "tj", pointwise.tiling["Tn"])
    reads = channels(sim, "t0 L3->L3", "tc", depthwise.tiling["Tc"])
    assert (len(writes), len(reads)) == (16, 32)
    # each read of channels starts once every write of them has ended, and each write into the
    # ring once every read of the channels it replaces has
    assert all(w_end <= r_start for w, _, w_end in writes for r, r_start, _ in reads if w & r)
    assert all(r_end <= w_start for w, w_start, _ in writes for r, _, r_end in reads if {c + t0.ring for c in r} & w)
    spans = {unit: [(start, end) for t, start, end, _ in sim.first_tasks if t.unit == unit and t.phase == phase]
             for unit, phase in (("vector", 1), ("array", 0))}
    assert any(a0 < v1 and v0 < a1 for v0, v1 in spans["vector"] for a0, a1 in spans["array"])

    # without the home (a machine with no room for it), the link passes through external memory
    # channels by channels, the kernels still overlapping
    through = loads(dumps(chained), "chain.kpu")
    through.graph.tensors["t0"] = dataclasses.replace(t0, home=None, ring=None, ring_dim=1)
    through_sim = simulate(through, standard, bind_program(through, standard, "chain.kpu", bind_cpsat),
                           record_first=1 << 20)
    writes = channels(through_sim, "t0 L3->EXTERNAL", "tj", pointwise.tiling["Tn"])
    reads = channels(through_sim, "t0 EXTERNAL->L3", "tc", depthwise.tiling["Tc"])
    assert (len(writes), len(reads)) == (16, 32)
    assert all(w_end <= r_start for w, _, w_end in writes for r, r_start, _ in reads if w & r)
    assert min(start for _, start, _ in reads) < max(end for _, _, end in writes)
    link_bytes = 14 * 14 * 512 * 4
    assert sum(dram_bytes(through_sim).values()) == sum(dram_bytes(sim).values()) + 2 * link_bytes
    # unchained, the same kernels move those bytes too; the depthwise's loads wait only for the
    # pointwise's stores of what they read, not for its end, so its computes start before the
    # pointwise has ended (and without those waits, after)
    alone = compiled[False]
    alone_sim = simulate(alone, standard, bind_program(alone, standard, "chain.kpu", bind_cpsat))
    assert dram_bytes(alone_sim) == dram_bytes(through_sim)
    assert alone_sim.phases[1].compute_start < alone_sim.phases[0].end
    monkeypatch.setattr(tasks.TaskStream, "_written", lambda *args: (None, False))
    barred = simulate(alone, standard, bind_program(alone, standard, "chain.kpu", bind_cpsat))
    assert barred.phases[1].compute_start > barred.phases[0].end
    assert sim.cycles < barred.cycles and alone_sim.cycles < barred.cycles


# the same pair on 16 x 16 x 16 into 64 channels, as the compiler's stages tile it for standard's
# L1: the pointwise in 2 tiles of 32 output channels, the depthwise in 8 chunks of 8 channels
NARROW = {"x": ((1, 16, 16, 16), "f32"), "wp": ((64, 1, 1, 16), "f32"), "wd": ((3, 3, 64, 1), "f32")}


def _reference_by_channels(v: dict[str, np.ndarray], size: int) -> np.ndarray:
    """The pointwise then the depthwise 3x3 (padding 1) on `size` x `size`, in float64."""
    t0 = np.einsum("nhwc,oc->nhwo", v["x"].astype(np.float64), v["wp"][:, 0, 0, :].astype(np.float64))
    p = np.pad(t0, [(0, 0), (1, 1), (1, 1), (0, 0)])
    return sum(p[:, i:i + size, j:j + size, :] * v["wd"][i, j, :, 0] for i in range(3) for j in range(3))


def test_a_link_by_channels_kept_whole_in_l3_never_reaches_external_memory():
    standard = load_machine(STANDARD)
    chained = loads(dumps(program(True, ops=BY_CHANNELS, shapes=NARROW, l1=32 * 1024)), "chain.kpu")
    pointwise, depthwise = chained.kernels
    assert chained.graph.tensors["t0"].home == "L3" and pointwise.band_dim("t0") == depthwise.band_dim("t0") == 3
    v = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(NARROW.items())}
    bindings = bind_program(chained, standard, "chain.kpu", bind_greedy)
    sim = simulate(chained, standard, bindings, record_first=1 << 20)
    assert np.allclose(execute(chained, bindings, v)["t1"], _reference_by_channels(v, 16), rtol=1e-4, atol=1e-4)
    # the input, both weights and the result, exactly: t0 stays in L3
    assert dram_bytes(sim) == {"read": 16 * 16 * 16 * 4 + 64 * 16 * 4 + 3 * 3 * 64 * 4, "write": 16 * 16 * 64 * 4}
    # each padded band the depthwise copies out of the home starts once the pointwise's stores of
    # its channels into the home have ended
    tiles = {"tj": pointwise.tiling["Tn"], "tc": depthwise.tiling["Tc"]}
    moves = {label: [(set(range(t.args[loop] * tiles[loop], (t.args[loop] + 1) * tiles[loop])), start, end)
                     for t, start, end, _ in sim.first_tasks if t.label == label]
             for label, loop in (("t0 L2->L3", "tj"), ("t0 L3->L3", "tc"))}
    assert len(moves["t0 L3->L3"]) == 8
    assert all(w_end <= r_start for w, _, w_end in moves["t0 L2->L3"] for r, r_start, _ in moves["t0 L3->L3"] if w & r)


# a depthwise 3x3 on 8 x 8 x 128, then a 1x1 into 32 channels: the compiler chains them by
# channels, the pointwise in two tiles of 16 output channels, one to each compute tile, each going
# through the depthwise's result chunk by chunk of input channels (MobileNet v2's projections)
PROJECTION = [DW, ("CONV2D", ["t0", "wp"], {})]
DEEP = {"x": ((1, 8, 8, 128), "f32"), "wd": ((3, 3, 128, 1), "f32"), "wp": ((32, 1, 1, 128), "f32")}


def test_a_pointwise_reads_its_link_by_channels_with_its_output_tiles_on_both_compute_tiles():
    standard = load_machine(STANDARD)
    chained = loads(dumps(compile_graph(graph_of(PROJECTION, DEEP), "chain.dfg", load_target(STANDARD))), "chain.kpu")
    depthwise, pointwise = chained.kernels
    assert chained.chains == [["depthwise_conv2d_0", "conv2d_1"]]
    outer, band = pointwise.band_loop(), pointwise.band_loop("t0", 3)
    assert (outer.induction_var, outer.trip_count, outer.parallel) == ("tj", 2, True)
    assert band.induction_var == "tk" and band.trip_count > 2 and pointwise.band_dim("t1") == 3
    t0 = chained.graph.tensors["t0"]
    assert (t0.home, t0.ring_dim) == ("L3", 3) and t0.ring < 128
    bindings = bind_program(chained, standard, "chain.kpu", bind_cpsat)
    sim = simulate(chained, standard, bindings, record_first=1 << 20)
    v = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(DEEP.items())}
    t1 = np.einsum("nhwc,oc->nhwo", _depthwise(v["x"], v["wd"]), v["wp"][:, 0, 0, :].astype(np.float64))
    assert np.allclose(execute(chained, bindings, v)["t1"], t1, rtol=1e-4, atol=1e-4)
    # t0 never crosses external memory: the input, both weights and the result, exactly
    assert dram_bytes(sim) == {"read": (8 * 8 * 128 + 9 * 128 + 32 * 128) * 4, "write": 8 * 8 * 32 * 4}
    # both arrays take the pointwise, each under the depthwise on the vector units
    arrays = [(t.engine, start, end) for t, start, end, _ in sim.first_tasks if t.unit == "array" and t.phase == 1]
    vectors = [(start, end) for t, start, end, _ in sim.first_tasks if t.unit == "vector" and t.phase == 0]
    assert {engine for engine, _, _ in arrays} == {0, 1}
    assert all(any(a0 < v1 and v0 < a1 for v0, v1 in vectors for e, a0, a1 in arrays if e == engine)
               for engine in (0, 1))
    # each chunk of channels the pointwise reads out of the ring waits for the depthwise's writes
    # of them, on both compute tiles
    tiles = {"tc": depthwise.tiling["Tc"], "tk": pointwise.tiling["Tc"]}
    moves = {label: [(set(range(t.args[loop] * tiles[loop], (t.args[loop] + 1) * tiles[loop])), start, end)
                     for t, start, end, _ in sim.first_tasks if t.label == label]
             for label, loop in (("t0 L2->L3", "tc"), ("t0 L3->L2", "tk"))}
    assert len(moves["t0 L3->L2"]) == 2 * band.trip_count
    assert all(w_end <= r_start for w, _, w_end in moves["t0 L2->L3"] for r, r_start, _ in moves["t0 L3->L2"] if w & r)
    # and each write into the ring once every read of the channels it replaces has
    assert all(r_end <= w_start for w, w_start, _ in moves["t0 L2->L3"] for r, _, r_end in moves["t0 L3->L2"]
               if {c + t0.ring for c in r} & w)
    # on one compute tile, the pointwise would go through the ring once for each tile of output
    # channels, the first bands long replaced: the binder says so; the link kept whole, it runs
    one = dataclasses.replace(standard, compute=dataclasses.replace(standard.compute, tiles=1))
    with pytest.raises(BindError, match=r"^chain.kpu: kernel 'conv2d_1': reads link 't0' band by band once per step "
                                        r"of its loop 'tj', 2 steps over 1 compute tile\(s\): its ring of "
                                        rf"{t0.ring} channels would no longer hold"):
        bind_program(chained, one, "chain.kpu", bind_greedy)
    chained.graph.tensors["t0"] = dataclasses.replace(t0, ring=None, ring_dim=1)
    whole = simulate(chained, one, bind_program(chained, one, "chain.kpu", bind_greedy))
    assert dram_bytes(whole) == dram_bytes(sim)


def test_a_link_by_rows_without_a_home_passes_through_external_memory_band_by_band():
    standard = load_machine(STANDARD)
    kept, through = (loads(dumps(p), "chain.kpu") for p in (program(True, ring=RING), _homeless(program(True))))
    bindings = bind_program(through, standard, "chain.kpu", bind_greedy)
    sim = simulate(through, standard, bindings, record_first=1 << 20)
    assert np.allclose(execute(through, bindings, values())["t1"], reference(values()), rtol=1e-4, atol=1e-4)
    # t0 out once and back once, beside what the chain with t0 in a ring moves
    kept_bytes = dram_bytes(simulate(kept, standard, bind_program(kept, standard, "chain.kpu", bind_greedy)))
    assert dram_bytes(sim) == {side: n + ROW_BYTES * 16 for side, n in kept_bytes.items()}
    rows = {k: through.kernels[k].tiling["R"] for k in (0, 1)}
    moves = {label: [(set(range(t.args["th"] * rows[k], min((t.args["th"] + 1) * rows[k], 16))), start, end)
                     for t, start, end, _ in sim.first_tasks if t.label == label]
             for label, k in (("t0 L3->EXTERNAL", 0), ("t0 EXTERNAL->L3", 1))}
    assert all(w_end <= r_start for w, _, w_end in moves["t0 L3->EXTERNAL"]
               for r, r_start, _ in moves["t0 EXTERNAL->L3"] if w & r)
    assert min(start for _, start, _ in moves["t0 EXTERNAL->L3"]) < max(end for _, _, end in moves["t0 L3->EXTERNAL"])


def test_a_chain_of_three_reads_padded_bands_out_of_a_ring():
    # a second depthwise 3x3 after the pair reads the pointwise's result in bands with their halo
    # and padding, copied out of its ring by the BlockMovers; t0 and t1 never leave the chip
    ops = [DW, ("CONV2D", ["t0", "wq"], {}), ("DEPTHWISE_CONV2D", ["t1", "wd"], {"padding": [[1, 1], [1, 1]]})]
    chained = loads(dumps(program(True, ops=ops, shapes=WQ, rings={"t0": RING, "t1": 8})))
    standard = load_machine(STANDARD)
    bindings = bind_program(chained, standard, "chain.kpu", bind_greedy)
    sim = simulate(chained, standard, bindings)
    v = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(WQ.items())}
    got = execute(chained, bindings, v)
    t1 = np.einsum("nhwc,oc->nhwo", _depthwise(v["x"], v["wd"]), v["wq"][:, 0, 0, :].astype(np.float64))
    assert np.allclose(got["t2"], _depthwise(t1, v["wd"]), rtol=1e-4, atol=1e-4)
    # every kernel of the chain holds both homes (t1's writer is its second kernel)
    homes = [("t0", RING * ROW_BYTES), ("t1", 8 * ROW_BYTES)]
    assert [[(h.tensor, h.bytes) for h in b.homes] for b in bindings] == [homes] * 3
    # the input's bands, the depthwise weights for each depthwise, the pointwise's, the result
    assert dram_bytes(sim) == {"read": 22 * ROW_BYTES + 2 * 3 * 3 * 16 * 4 + 16 * 16 * 4, "write": 16 * ROW_BYTES}
    assert sim.bytes_moved["L3->L3"] == 22 * ROW_BYTES  # the second depthwise's bands, 22 rows of 16


def test_a_ring_too_small_to_go_on_is_one_line():
    # the pointwise waits for row 5 to read rows 4 and 5, which the depthwise writes with rows 6 to 9
    chained = loads(dumps(program(True, ring=RING - 1)))
    with pytest.raises(LoadError, match=r"^chain \[depthwise_conv2d_0, conv2d_1\]: link 't0' keeps a ring of 5 rows "
                                        r"in L3, too few: kernel 'depthwise_conv2d_0' would write rows 5 to 9 while a "
                                        r"reader may still read row 4") as e:
        run(chained, load_machine(STANDARD))
    assert "\n" not in str(e.value)


def test_a_chain_binds_its_kernels_apart_or_says_where_they_do_not_fit():
    standard = load_machine(STANDARD)
    chained = loads(dumps(program(True, ring=RING)))
    bindings = bind_program(chained, standard, "chain.kpu", bind_greedy)
    check(bindings, chained, standard)  # the binding cache's check: no two of the chain's buffers share bytes
    # moved onto the depthwise's L1 buffers, the pointwise's are refused there
    low = min(bb.address for bb in bindings[1].buffers if bb.buffer.level == "L1")
    onto = [dataclasses.replace(bb, address=bb.address - low) if bb.buffer.level == "L1" else bb
            for bb in bindings[1].buffers]
    with pytest.raises(EntryError, match=r"chain \[depthwise_conv2d_0, conv2d_1\]: buffers of two of its kernels "
                                         r"share bytes of L1"):
        check([bindings[0], dataclasses.replace(bindings[1], buffers=onto)], chained, standard)
    # an L1 that holds each kernel's buffers but not both at once
    small = dataclasses.replace(standard, l1=dataclasses.replace(standard.l1, count=1, bytes=3200))
    with pytest.raises(BindError, match=r"^chain.kpu: chain \[depthwise_conv2d_0, conv2d_1\]: kernel 'conv2d_1' "
                                        r"finds no room in L1 beside the buffers of the kernels before it"):
        bind_program(chained, small, "chain.kpu", bind_greedy)
    assert bind_program(loads(dumps(program(False))), small, "chain.kpu", bind_greedy)  # one after the other, they fit


def test_objects_without_chains_write_neither_field():
    text = dumps(program(False))
    assert b'"chains"' not in text and b'"ring"' not in text


def _renamed(p: Program, chains: list[list[str]]) -> Program:
    p.chains = chains
    return p


def _homeless(p: Program) -> Program:
    p.graph.tensors["t0"] = dataclasses.replace(p.graph.tensors["t0"], home=None)
    return p


def _ring_dim(p: Program, dim: int) -> Program:
    """The program with t0's ring holding slices along `dim`."""
    p.graph.tensors["t0"] = dataclasses.replace(p.graph.tensors["t0"], ring_dim=dim)
    return p


# a second pointwise reads t0 too; a convolution beside the depthwise reads x, not t0
BRANCH = [*CHAIN, ("CONV2D", ["t0", "wq"], {})]
BESIDE = [DW, ("CONV2D", ["x", "wq"], {})]
WQ = {**SHAPES, "wq": ((16, 1, 1, 16), "f32")}
BATCH2 = {**SHAPES, "x": ((2, 16, 16, 16), "f32")}
TINY = {"x": ((1, 2, 2, 4), "f32"), "wd": ((3, 3, 4, 1), "f32"), "wp": ((8, 1, 1, 4), "f32")}  # one tile each
PAIR = ["depthwise_conv2d_0", "conv2d_1"]


@pytest.mark.parametrize("make, error", [
    (lambda: _renamed(program(True), [["conv2d_1", "depthwise_conv2d_0"]]),
     "chain [conv2d_1, depthwise_conv2d_0]: its kernels are not consecutive in program order"),
    (lambda: _renamed(program(True), [["depthwise_conv2d_0", "nope"]]),
     "chain [depthwise_conv2d_0, nope]: 'nope' is no kernel of the program"),
    (lambda: _renamed(program(True), [PAIR, PAIR]),
     "chain [depthwise_conv2d_0, conv2d_1]: kernel 'depthwise_conv2d_0' is in chain [depthwise_conv2d_0, conv2d_1] "
     "too"),
    (lambda: program(True, ops=BESIDE, shapes=WQ, chains=[PAIR]),
     "chain [depthwise_conv2d_0, conv2d_1]: kernel 'conv2d_1' reads no result of kernel 'depthwise_conv2d_0'"),
    (lambda: program(True, ops=BRANCH, shapes=WQ, chains=[PAIR]),
     "chain [depthwise_conv2d_0, conv2d_1]: link 't0' is read by kernel 'conv2d_2', which is not in the chain"),
    (lambda: program(True, shapes=BATCH2, l1=32 * 1024),
     "chain [depthwise_conv2d_0, conv2d_1]: link 't0' has shape [2, 16, 16, 16]; a link holds one image"),
    # tiled for standard's L1, the depthwise goes by channels, but the pointwise by output
    # channels, reading every input channel of each
    (lambda: program(True, l1=32 * 1024),
     "chain [depthwise_conv2d_0, conv2d_1]: kernel 'conv2d_1' op 0 moves link 't0' at EXTERNAL by '0' along dim 3; "
     "a chain's kernels go by its bands, each by its band loop ('tj')"),
    (lambda: program(True, l1=32 * 1024, ring=8),
     "chain [depthwise_conv2d_0, conv2d_1]: link 't0' goes by channels, but its home is a ring of rows"),
    (lambda: _ring_dim(program(True, ring=8), 3),
     "chain [depthwise_conv2d_0, conv2d_1]: link 't0' goes by rows, but its home is a ring of channels"),
    (lambda: _ring_dim(program(True, ring=8), 2),
     "tensor 't0': has ring_dim 2: a ring holds rows (dim 1) or channels (dim 3, the last)"),
    (lambda: program(True, shapes=TINY, l1=32 * 1024),
     "chain [depthwise_conv2d_0, conv2d_1]: link 't0' goes by no bands: its writer, kernel 'depthwise_conv2d_0', has "
     "no loop of more than one trip"),
    (lambda: _homeless(program(True, ring=8)), "tensor 't0': has a ring of 8 rows but no home in L3"),
    (lambda: program(False, ring=8), "tensor 't0': has a ring of 8 rows but links no chain's kernels"),
    # a link read outside a chain is ordered by a barrier as any intermediate
    (lambda: _renamed(program(True), []),
     "kernel 'conv2d_1' op 0: reads intermediate 't0' with no BARRIER ordering it after kernel 'depthwise_conv2d_0'"),
])
def test_the_validator_refuses_what_breaks_a_chain_rule(make, error):
    with pytest.raises(ObjectFileError) as e:
        loads(dumps(make()), "chain.kpu")
    assert str(e.value).startswith(f"chain.kpu: {error}"), str(e.value)
    assert "\n" not in str(e.value)


def test_a_kernel_whose_banks_find_no_free_bank_each_is_squeezed_in_beside_the_chain():
    # as in MobileNet: the kernel before fills one L1 buffer and most of another; the next spreads
    # four small buffers over four. Moved bank for bank, one of them would land on the full one
    from loader import Buffer, Binding, BoundBuffer
    from loader.chains import away_from_chain, shared_level

    standard = load_machine(STANDARD)  # L1: 4 buffers of 32 KiB per compute tile

    def bound(kernel: str, placed: list[tuple[int, int, int]]) -> Binding:
        return Binding(kernel, 1, [BoundBuffer(Buffer(i, 0, "t", "L1", size, 1), bank, address)
                                   for i, (bank, address, size) in enumerate(placed)], {}, "greedy")

    before = bound("a", [(3, 320, 28672), (2, 0, 32768)])
    same, after = away_from_chain(bound("b", [(0, 0, 1368), (1, 0, 72), (2, 0, 8), (3, 0, 112)]), [before],
                                  standard, "chain.kpu", "chain [a, b]")
    assert same == before and shared_level([before, after]) is None
    assert sorted(bb.buffer.bytes for bb in after.buffers) == [8, 72, 112, 1368]
    # the kernel before in the middle of every bank: no free stretch holds 24 KiB, so the level is
    # packed anew, largest first, the earlier kernel's buffers moved too
    middle = bound("a", [(bank, 10000, 4000) for bank in range(4)])
    moved, big = away_from_chain(bound("b", [(0, 0, 24576)]), [middle], standard, "chain.kpu", "chain [a, b]")
    assert shared_level([moved, big]) is None and (big.buffers[0].bank, big.buffers[0].address) == (0, 0)
    assert sorted(bb.buffer.bytes for bb in moved.buffers) == [4000] * 4
    # two whole buffers and 8 KiB beside 60 KiB: 4 KiB more than the four buffers hold
    with pytest.raises(BindError, match=r"^chain.kpu: chain \[a, b\]: kernel 'b' finds no room in L1"):
        away_from_chain(bound("b", [(0, 0, 32768), (1, 0, 32768), (2, 0, 8192)]), [before], standard, "chain.kpu",
                        "chain [a, b]")


def test_a_level_packed_anew_spreads_its_buffers_over_the_banks_where_they_fit_so():
    # two members' L2 tiles on each of two compute tiles: first fit would put each second
    # member's tile in a bank with the first's tile of the same compute tile, two streams on
    # one port; spread, each has a bank of its own
    from loader import Buffer, Binding, BoundBuffer
    from loader.chains import _packed, shared_level

    standard = load_machine(STANDARD)  # L2: 8 banks of 64 KiB, one pool for both compute tiles
    kib = 1024

    def bound(kernel: str, level: str, sizes: list[int], workers: list[int]) -> Binding:
        return Binding(kernel, 2, [BoundBuffer(Buffer(i, w, kernel, level, size * kib, 1), 0, 0)
                                   for i, (size, w) in enumerate(zip(sizes, workers))], {}, "greedy")

    members = _packed([bound("a", "L2", [40, 40], [0, 1]), bound("b", "L2", [20, 20], [0, 1])], "L2", standard)
    assert shared_level(members) is None
    assert len({bb.bank for m in members for bb in m.buffers}) == 4
    # where spreading leaves a buffer without room, first fit (the compiler's test) still packs
    # them: 32, 28, 16, 16, 12, 12 and 8 KiB in four 32 KiB L1 buffers
    sizes = [32, 28, 16, 16, 12, 12, 8]
    (packed,) = _packed([bound("a", "L1", sizes, [0] * len(sizes))], "L1", standard)
    fill = Counter()
    for bb in packed.buffers:
        fill[bb.bank] += bb.buffer.bytes
    assert sorted(fill.values()) == [28 * kib, 32 * kib, 32 * kib, 32 * kib]
    # 100 KiB in 128, but no two of them in one bank
    assert _packed([bound("a", "L1", [20] * 5, [0] * 5)], "L1", standard) is None


def test_a_whole_chain_deals_its_l2_buffers_and_streams_out_by_load():
    """Bound one by one, each member put its busy tile in the first L2 bank and its stream on the
    first Streamer, behind the other's; the whole chain dealt out by load, heaviest first, each
    busy tile has a bank (and its stream an engine) of its own and the light one the least
    loaded left, so no port or engine carries two busy streams."""
    from loader import Buffer, BoundBuffer
    from loader.chains import balanced, shared_level

    standard = load_machine(STANDARD)  # L2: 8 banks of 64 KiB; 8 Streamers at 64 bytes a cycle

    def stream(op: int, nbytes: int) -> StreamReq:
        return StreamReq(op, 0, "streamer", "t", "L2", "L1", nbytes, 10, op)

    a = Binding("a", 1, [BoundBuffer(Buffer(1, 0, "x", "L2", 4096, 1), 0, 0),
                         BoundBuffer(Buffer(2, 0, "y", "L2", 4096, 1), 0, 4096)], {(1, 0): 0, (2, 0): 0}, "cp-sat")
    b = Binding("b", 1, [BoundBuffer(Buffer(1, 0, "z", "L2", 4096, 1), 0, 8192)], {(1, 0): 0}, "cp-sat")
    # 10 tiles of 6,400 bytes keep a port (a Streamer) 1,000 cycles; of 640 bytes, 100
    streams = [[stream(1, 6400), stream(2, 640)], [stream(1, 6400)]]
    dealt = balanced([a, b], streams, standard)
    assert shared_level(dealt) is None
    assert [[(bb.bank, bb.address) for bb in m.buffers] for m in dealt] == [[(0, 0), (2, 0)], [(1, 0)]]
    assert [m.engines for m in dealt] == [{(1, 0): 0, (2, 0): 2}, {(1, 0): 1}]
    # the two busy streams, 1,000 cycles each, on ports and Streamers apart
    assert [stream_cycles(s, standard) for s in streams] == [[1000, 100], [1000]]


def test_the_loader_deals_a_bound_chains_busiest_l2_tiles_a_bank_each():
    """Bound as a program, the chain's L2 tiles most loaded (the bytes their streams move through
    the bank's port) lie in banks of their own, as many as there are banks."""
    machine = load_machine(STANDARD)
    p = program(True, ring=RING)
    kept = frozenset(h.tensor for h in home_layout(p, machine))
    loads = []  # (port cycles, bank) of each L2 tile of the chain
    for kernel, binding in zip(p.kernels, bind_program(p, machine, "chain.kpu", bind_greedy)):
        _, streams = kernel_demands(kernel, p, binding.workers, kept, machine.line_bytes)
        cycles = stream_cycles(streams, machine)
        for bb in binding.buffers:
            if bb.buffer.level == "L2":
                loads.append((sum(c for s, c in zip(streams, cycles)
                                  if (s.l2_buffer, s.worker) == (bb.buffer.op_id, bb.buffer.worker)), bb.bank))
    ranked = sorted(loads, reverse=True)
    # those busier than the first left without a bank of its own (ties may take either)
    busiest = [(load, bank) for load, bank in ranked if load > ranked[machine.l2.count][0]]
    assert len(busiest) >= 4, ranked
    assert len({bank for _, bank in busiest}) == len(busiest)


def test_each_task_goes_with_its_chains_first_kernel():
    """An engine serves an earlier kernel's tasks first (`Task.priority`): the kernels' own places
    unchained, the chain's first kernel's for all its members chained."""
    machine = load_machine(STANDARD)
    for chained, want in ((False, {0: {0}, 1: {1}}), (True, {0: {0}, 1: {0}})):
        p = program(chained, ring=RING if chained else None)
        by_phase: dict[int, set[int]] = {}
        for task in program_tasks(p, bind_program(p, machine, "chain.kpu", bind_greedy), machine):
            by_phase.setdefault(task.phase, set()).add(task.priority)
        assert by_phase == want
