"""The compiler's chains (kernel_compiler/chains.py): which fusion groups chain, their tilings
under one budget of the target, the rings of their links, and a chain compiled and run end to end
(its values against numpy, its external-memory bytes the graph's inputs, weights and output)."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import numpy as np
import pytest

from dfx import dumps, loads
from hardware import load_machine
from kernel_compiler.chains import Planner, link, ring_bytes
from kernel_compiler import compile as compile_module
from kernel_compiler.compile import compile_graph, graph_passes, lower_group, lower_kernels
from kernel_compiler.requirements import body_buffers, fits
from kernel_compiler.residency import l3_demand, workers
from kernel_compiler.target import load_target, target_from_machine
from loader import bind_cpsat, bind_greedy, bind_program, check_outputs, execute, program_inputs, simulate
from loader.report import dram_bytes
from loader.run import check_kernels
from conftest import DATA
from dfx import Graph, Program
from kernel_compiler import chains
from kernel_compiler.frontends import load_graph
from test_vector_kernels import STANDARD, graph_of, random

PAD = {"padding": [[1, 1], [1, 1]]}
# an inverted residual block without its residual: a 1x1 expanding 16 channels to 64, a
# depthwise 3x3, a 1x1 projecting back; on 32 x 32 its intermediates (256 KiB each) take rings
BLOCK = [("CONV2D", ["x", "we"], {}), ("DEPTHWISE_CONV2D", ["t0", "wd"], PAD), ("CONV2D", ["t1", "wp"], {})]
SHAPES = {"x": ((1, 32, 32, 16), "f32"), "we": ((64, 1, 1, 16), "f32"), "wd": ((3, 3, 64, 1), "f32"),
          "wp": ((16, 1, 1, 64), "f32")}


def lowered(ops, shapes):
    """The graph after the passes and its kernels, each lowered for the whole target."""
    target = load_target(STANDARD)
    graph = graph_passes(graph_of(ops, shapes), target, True, [])
    return graph, list(lower_kernels(graph, target, "auto", True)), target


def links(ops, shapes) -> list[str | None]:
    """Between each two consecutive kernels, the tensor through which they may chain."""
    graph, kernels, _ = lowered(ops, shapes)
    readers = Counter(t for k in kernels for t in set(k.inputs))
    return [link(a, b, graph, readers) for a, b in zip(kernels, kernels[1:])]


def test_window_kernels_chain_through_a_result_nothing_else_reads():
    assert links(BLOCK, SHAPES) == ["t0", "t1"]
    # the depthwise's result read by a second 1x1 too: it links neither
    branch = [*BLOCK, ("CONV2D", ["t1", "wp"], {})]
    assert links(branch, SHAPES) == ["t0", None, None]
    # a matmul between (on the array, but no sliding window): nothing links through it, nor
    # through the views of its operand and result as rows
    between = [BLOCK[0], ("MATMUL", ["t0", "wm"], {}), ("DEPTHWISE_CONV2D", ["t1", "wd"], PAD)]
    assert set(links(between, {**SHAPES, "wm": ((64, 64), "f32")})) == {None}
    # two images: a link holds one (its rows are those of one image)
    assert links(BLOCK, {**SHAPES, "x": ((2, 32, 32, 16), "f32")}) == [None, None]


def test_nchw_convolutions_chain_in_nhwc_and_the_transposes_around_them_never():
    shapes = {"x": ((1, 16, 32, 32), "f32"), "w0": ((64, 16, 1, 1), "f32"), "w1": ((16, 64, 3, 3), "f32")}
    ops = [("CONV2D", ["x", "w0"], {"layout": "NCHW"}), ("CONV2D", ["t0", "w1"], {"layout": "NCHW", **PAD})]
    # ranked by energy, where keeping t0 off the external memory link pays
    target = load_target(STANDARD, objective="energy")
    program = loads(dumps(compile_graph(graph_of(ops, shapes), "nchw.dfg", target)))
    assert [k.op for k in program.kernels] == ["TRANSPOSE", "RESHAPE", "CONV2D", "CONV2D", "TRANSPOSE"]
    assert program.chains == [[k.name for k in program.kernels[2:4]]]
    kept = program.graph.tensors[program.kernels[2].outputs[0]]
    assert kept.shape == (1, 32, 32, 64) and kept.home == "L3"  # NHWC: dim 1 is the rows


def test_a_chain_fits_the_target_at_once_going_by_rows_with_rings_its_bands_need():
    graph, kernels, target = lowered(BLOCK, SHAPES)
    planner = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    plan = planner.plan(0, 2)
    members = [planner.lowered(i, share) for i, share in enumerate(plan.shares)]
    # every member goes by rows: its outermost loop steps the rows of its links
    assert [m.tile_loops[0].induction_var for m in members] == ["th"] * 3
    assert all(m.tile_loops[0].trip_count > 1 for m in members)
    # each ring: the reader's bands on its compute tiles (consecutive bands apart) and the
    # writer's next bands on its own, once or RING_DEPTH times over; the whole tensor where that
    # is all of its 32 rows, but not both
    def band(k):  # (rows of a band of its input, rows between bands, compute tiles)
        return k.tiling["band_rows"], k.tiling["R"], workers(k, target.compute_tiles)

    for t, (writer, reader) in zip(("t0", "t1"), zip(members, members[1:])):
        rows, step, tiles = band(reader)
        in_flight = (tiles - 1) * step + rows + workers(writer, target.compute_tiles) * writer.tiling["R"]
        assert plan.rings[t] in (in_flight, chains.RING_DEPTH * in_flight) or (
            plan.rings[t] is None and chains.RING_DEPTH * in_flight >= 32)
    assert any(n is not None and n < 32 for n in plan.rings.values())
    # all the members' buffers and both rings fit at once: L3 on all compute tiles (a member's
    # plain tiles of a link lie in its home), and L1 and L2 per compute tile, packed into the
    # banks as the binder packs them
    line = target.line_bytes
    homes = sum(-(-ring_bytes(t, n, graph) // line) * line for t, n in plan.rings.items())
    links = [frozenset({"t0"}), frozenset({"t0", "t1"}), frozenset({"t1"})]
    assert sum(l3_demand(m, graph, target, kept) for m, kept in zip(members, links)) + homes \
        <= target.l3.bank_bytes * target.compute_tiles
    assert fits([b for m in members for b in body_buffers(m.body, graph) if b[0] != "L3"], target)
    # the pipeline the fill is counted by: each member's bands (dealt to the compute tiles where
    # its rows loop is the parallel one; the depthwise deals out its channels, each band on both
    # at once), the rows each reads of the link before (the depthwise's bands with their halo,
    # from row -1), the rows between the starts of those it writes
    rungs = [chains.Rung(m, (), workers(m, target.compute_tiles)) for m in members]
    stages = chains._stages([chains.Usage(1.0, 0.0)] * 3, rungs, graph, chains.BY_ROWS, target)
    assert [(s.bands, s.tiles) for s in stages] == [
        (m.band_loop().trip_count, workers(m, target.compute_tiles) if m.band_loop().parallel else 1) for m in members]
    assert [m.band_loop().parallel for m in members] == [True, False, True]
    assert [s.reads for s in stages] == [(0, 0, 0, 0), (members[1].tiling["band_rows"], members[1].tiling["R"], -1, 32),
                                         (members[2].tiling["R"], members[2].tiling["R"], 0, 32)]
    assert [s.writes for s in stages] == [members[0].tiling["R"], members[1].tiling["R"], 1]
    # alone, the depthwise would take the whole image in one tile of rows: in the chain it may not
    assert kernels[1].tiling["num_tiles_th"] == 1 < members[1].tiling["num_tiles_th"]


def _conv1x1(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("nhwc,oc->nhwo", x, w[:, 0, 0, :].astype(np.float64))


def _depthwise(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A depthwise 3x3, stride 1, padding 1, in float64."""
    h, wd = x.shape[1:3]
    p = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    return sum(p[:, i:i + h, j:j + wd, :] * w[i, j, :, 0] for i in range(3) for j in range(3))


def test_a_chain_runs_band_by_band_and_moves_only_its_input_weights_and_output():
    target = load_target(STANDARD, objective="energy")  # the chain of all three saves the most pJ
    program = loads(dumps(compile_graph(graph_of(BLOCK, SHAPES), "block.dfg", target)))
    assert program.chains == [[k.name for k in program.kernels]]
    rings = {t.name: t.ring for t in program.graph.tensors.values() if t.home == "L3"}
    # both links on chip, the depthwise's result in a ring of rows (the expanded one, 256 KB at
    # 32 x 32, may fit whole beside the members' buffers)
    assert set(rings) == {"t0", "t1"} and rings["t1"] is not None and rings["t1"] < 32
    assert not any(op.type == "BARRIER" for k in program.kernels for op in k.body)
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "block.kpu", bind_greedy)
    sim = simulate(program, machine, bindings)
    values = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}
    got = execute(program, bindings, values)
    v = {n: a.astype(np.float64) for n, a in values.items()}
    want = _conv1x1(_depthwise(_conv1x1(v["x"], v["we"]), v["wd"]), v["wp"])
    np.testing.assert_allclose(got["t2"], want, rtol=1e-4, atol=1e-4)
    # t0 and t1 never cross external memory: the input, the three weights and the output, once
    size = {n: int(np.prod(shape)) * 4 for n, (shape, _) in SHAPES.items()}
    assert dram_bytes(sim) == {"read": size["x"] + size["we"] + size["wd"] + size["wp"], "write": 32 * 32 * 16 * 4}
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())


def test_a_chain_that_fits_no_other_way_takes_rings_of_one_band_of_each_member(monkeypatch):
    """By energy, where the links fit L3 beside the members in no rings that hold the bands in
    flight on both compute tiles, all four chain in rings of one band of each member (as MobileNet
    v1's 56 x 56 block does): only the input, the weights and the result cross external memory,
    the loader runs it, its rating (its units taking turns) is no lower than the cycles it runs,
    and its result is the block's. A reader whose bands are dealt to the compute tiles keeps them
    a step apart in its ring: the second 1x1 reads its link so, in 6 rows, not 5. (Before, the
    last depthwise's bands were dealt, 4 rows apart, from a ring of 7: a compute tile done with
    its last band held it while the other needed the next, and the loader stopped.)"""
    ops = [("CONV2D", ["x", "w0"], {}), ("DEPTHWISE_CONV2D", ["t0", "w1"], PAD), ("CONV2D", ["t1", "w2"], {}),
           ("DEPTHWISE_CONV2D", ["t2", "w3"], PAD)]
    shapes = {"x": ((1, 112, 112, 48), "f32"), "w0": ((48, 1, 1, 48), "f32"), "w1": ((3, 3, 48, 1), "f32"),
              "w2": ((48, 1, 1, 48), "f32"), "w3": ((3, 3, 48, 1), "f32")}
    target, machine = load_target(STANDARD, objective="energy"), load_machine(STANDARD)
    graph = graph_passes(graph_of(ops, shapes), target, True, [])

    with monkeypatch.context() as m:
        m.setattr(chains, "TIGHT_OBJECTIVES", frozenset())
        assert Planner(list(lower_kernels(graph, target, "auto", True)), graph, target,
                       functools.partial(lower_group, dataflow="auto")).plan(0, 3) is None
    planners, chosen = [], Planner.chains
    monkeypatch.setattr(Planner, "chains", lambda self: planners.append(self) or chosen(self))
    program = compile_graph(graph_of(ops, shapes), "block.dfg", target)
    assert program.chains == [[k.name for k in program.kernels]]
    plan = planners[0].plan(0, 3)  # as the compile planned it
    assert list(plan.rings.values()) == [7, 6, 7]
    assert {t: program.graph.tensors[t].ring for t in plan.rings} == plan.rings
    bindings = bind_program(program, machine, "block.kpu", bind_greedy)
    sim = simulate(program, machine, bindings)
    assert sim.cycles <= plan.usage.cycles
    size = {n: int(np.prod(shape)) * 4 for n, (shape, _) in shapes.items()}
    out = int(np.prod(program.graph.tensors["t3"].shape)) * 4
    assert dram_bytes(sim) == {"read": sum(size.values()), "write": out}
    inputs = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(shapes.items())}

    def block(v):
        return _depthwise(_conv1x1(_depthwise(_conv1x1(v["x"], v["w0"]), v["w1"]), v["w2"]), v["w3"])

    want = block({n: a.astype(np.float64) for n, a in inputs.items()})
    # f32's rounding of each output's sums: a few ulps of the magnitude of its terms
    terms = block({n: np.abs(a.astype(np.float64)) for n, a in inputs.items()})
    assert np.all(np.abs(execute(program, bindings, inputs)["t3"] - want) <= 1e-6 * terms)


@pytest.mark.parametrize("options", [{"fuse": False}, {"keep": False}, {"chain": False}])
def test_no_chains_without_fusion_homes_or_chains(options):
    program = compile_graph(graph_of(BLOCK, SHAPES), "block.dfg", load_target(STANDARD), **options)
    assert program.chains == [] and not any(t.ring for t in program.graph.tensors.values())


def first_layers(count: int = 3, model: str = "v1") -> Graph:
    """A corpus MobileNet up to its `count`th convolution (depthwise ones counted) and its
    activation, where it has one: conv 3x3, depthwise 3x3, pointwise, depthwise ..., each with its
    CLAMP (v2's third, a projection, has none)."""
    g, _ = load_graph(str(DATA / "dfg" / f"dfg__mobilenet_{model}.dfg"))
    convs = [i for i, op in enumerate(g.ops) if op.op_type in ("CONV2D", "DEPTHWISE_CONV2D")]
    ops = g.ops[:convs[count - 1] + 1]
    ops += [op for op in g.ops[convs[count - 1] + 1:convs[count - 1] + 2] if op.op_type == "CLAMP"]
    used = {t for op in ops for t in op.inputs + op.outputs}
    tensors = {n: t for n, t in g.tensors.items() if n in used}
    tensors[ops[-1].outputs[0]].role = "output"
    return Graph(f"first{count}", tensors, ops, {n: v for n, v in g.constants.items() if n in used})


def test_a_depthwise_given_larger_banks_takes_more_channels_a_tile_not_taller_bands(monkeypatch):
    """MobileNet v1's first four layers chained by edp, as in the whole network. The cut leaves the
    last depthwise a row and one channel a tile; the next larger banks would have it take bands
    of 4 rows, whose ring does not fit. At the rows that keep it a row a tile, they take it to 2
    channels a tile: its result leaves for external memory in half the DMA moves (each holds
    an engine for the memory's latency), the chain runs 15% fewer cycles, moving the same bytes,
    and every kernel and the output pass the check. (The descent after the growth,
    `Planner._descended`, finds those shares too: it is left out of both runs.)"""
    graph, machine = first_layers(4), load_machine(STANDARD)
    target = load_target(STANDARD, objective="edp")

    def run(trading: bool) -> tuple:
        with monkeypatch.context() as m:
            m.setattr(Planner, "_descended", lambda self, fit, *args: fit)
            if not trading:
                m.setattr(Planner, "_as_tall", lambda self, *args: [])
            program = loads(dumps(compile_graph(graph, "four.dfg", target)))
        assert program.chains == [[k.name for k in program.kernels]]
        bindings = bind_program(program, machine, "four.kpu", bind_greedy)
        return program, bindings, simulate(program, machine, bindings)

    (before, _, slow), (after, bindings, fast) = run(False), run(True)
    tiles = [{name: p.kernels[-1].tiling[name] for name in ("R", "C", "Tc")} for p in (before, after)]
    assert tiles == [{"R": 1, "C": 56, "Tc": 1}, {"R": 1, "C": 56, "Tc": 2}]

    def stores(p: Program) -> int:  # the last depthwise's moves of its result to external memory
        k = p.kernels[-1]
        return sum(k.runs(op) for op in k.body if getattr(op, "move_type", None) == "STORE"
                   and op.destination.level == "EXTERNAL")

    assert stores(after) * 2 == stores(before) == 56 * 64
    assert fast.cycles < 0.9 * slow.cycles
    assert dram_bytes(fast) == dram_bytes(slow)
    values = execute(after, bindings, program_inputs(after, {}, 0))
    assert all(c.passed for c in check_kernels(after, values).values())
    assert all(c.passed for c in check_outputs(after, values).values())


def last_layers(count: int, model: str = "v1") -> Graph:
    """A corpus MobileNet from its `count`th last convolution (depthwise ones counted) to its
    output, the tensor that convolution reads a graph input."""
    g, _ = load_graph(str(DATA / "dfg" / f"dfg__mobilenet_{model}.dfg"))
    convs = [i for i, op in enumerate(g.ops) if op.op_type in ("CONV2D", "DEPTHWISE_CONV2D")]
    ops = g.ops[convs[-count]:]
    used = {t for op in ops for t in op.inputs + op.outputs}
    tensors = {n: t for n, t in g.tensors.items() if n in used}
    tensors[ops[0].inputs[0]] = dataclasses.replace(tensors[ops[0].inputs[0]], role="input")
    return Graph(f"last{count}", tensors, ops, {n: v for n, v in g.constants.items() if n in used})


def test_a_link_takes_a_shallower_ring_where_that_leaves_a_result_room_in_l3(monkeypatch):
    """MobileNet v1 from its 7 x 7 expansion (pw12), by edp. [pw12, dw13] goes by channels in a
    ring of 640 of pw12's 1024 (twice the channels in flight, which their figure does not tell
    from once); then dw13's result (7 x 7 x 1024, 200 KB) misses L3 by 17 KB beside it. With the
    ring of 320 the planner offers, it stays: its 200 KB are neither written to external memory
    nor read back, the run takes at most 2% more cycles, and every kernel and the output pass
    the check."""
    graph, machine = last_layers(4), load_machine(STANDARD)
    target = load_target(STANDARD, objective="edp")
    dw13 = next(op for op in graph.ops if op.op_type == "DEPTHWISE_CONV2D" and op.attrs["stride"] == [1, 1])
    result = next(op.outputs[0] for op in graph.ops if op.inputs[0] == dw13.outputs[0])  # its CLAMP's

    def run(offered: bool) -> tuple:
        real = compile_module.form_chains

        def form(*args):
            g, c, links, offer = real(*args)
            return g, c, links, offer if offered else {}

        with monkeypatch.context() as m:
            m.setattr(compile_module, "form_chains", form)
            program = loads(dumps(compile_graph(graph, "tail.dfg", target)))
        bindings = bind_program(program, machine, "tail.kpu", bind_greedy)
        return program, bindings, simulate(program, machine, bindings)

    (before, _, deep), (after, bindings, shallow) = run(False), run(True)
    link = next(t for t in before.graph.tensors.values() if t.ring is not None)
    assert (link.ring, after.graph.tensors[link.name].ring) == (640, 320)
    assert before.graph.tensors[result].home is None and after.graph.tensors[result].home == "L3"
    size = 7 * 7 * 1024 * 4
    assert {way: dram_bytes(deep)[way] - n for way, n in dram_bytes(shallow).items()} == {"read": size, "write": size}
    # 245,401 against 242,906: with the chain after it ([pw26, its pool, the classifier] by
    # channels), the result kept costs 1% of the cycles for its 400 KB
    assert shallow.cycles < 1.02 * deep.cycles
    values = execute(after, bindings, program_inputs(after, {}, 0))
    assert all(c.passed for c in check_kernels(after, values).values())
    assert all(c.passed for c in check_outputs(after, values).values())


def test_a_chain_by_channels_offers_its_whole_links_as_rings_of_channels():
    """MobileNet v2's last blocks by energy go by channels, their 960-channel links whole (a ring
    of None, which the graph records by rows) and twice the channels in flight deep: the rings
    they offer once as deep are of channels, fewer than the link's."""
    target = load_target(STANDARD, objective="energy")
    graph = graph_passes(last_layers(7, "v2"), target, True, [])
    kernels = list(lower_kernels(graph, target, "auto", True))
    shaped, _, _, offers = chains.form_chains(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    whole = [t for t in offers if shaped.tensors[t].ring is None]
    assert whole and all(offers[t][1] == 3 and offers[t][0] < shaped.tensors[t].shape[3] for t in whole)
    assert all(offers[t][0] < shaped.tensors[t].ring for t in offers if t not in whole)


def test_rings_twice_as_deep_keep_the_writer_and_the_reader_from_waiting_on_each_other(monkeypatch):
    graph, target, machine = first_layers(), load_target(STANDARD), load_machine(STANDARD)
    # rated as if its units overlapped with rings of one band's slack too, as they were before
    # (test_three_members_in_rings_of_one_bands_slack_are_rated_as_taking_turns), so the planner
    # takes all three chained at either depth
    monkeypatch.setattr(chains.Usage, "in_turn", property(lambda u: 0.0))
    cycles, rings = {}, {}
    for depth in (1, chains.RING_DEPTH):
        monkeypatch.setattr(chains, "RING_DEPTH", depth)
        program = compile_graph(graph, "three.dfg", target)
        assert program.chains == [[k.name for k in program.kernels]]
        rings[depth] = sorted(t.ring for t in program.graph.tensors.values() if t.home)
        cycles[depth] = simulate(program, machine, bind_program(program, machine, "three.kpu", bind_cpsat)).cycles
    assert rings == {1: [6, 10], 2: [12, 16]}
    # with room for one band of each, the vector units waited on the array and back (261,591
    # cycles against 230,281)
    assert cycles[2] < 0.96 * cycles[1]


def test_the_cut_takes_members_to_fewer_rows_a_band_where_their_rings_fit_no_other_way():
    """MobileNet v2's 28 x 28 inverted residual block (32 -> 192 -> 32): going by the rows its
    members start from, no cut of their shares of the banks makes the three and their rings fit
    (the cut ended 49% over L3, in rings of 18 and 14 rows); members going by fewer rows a band
    do."""
    shapes = {"x": ((1, 28, 28, 32), "f32"), "we": ((192, 1, 1, 32), "f32"), "wd": ((3, 3, 192, 1), "f32"),
              "wp": ((32, 1, 1, 192), "f32")}
    graph, kernels, target = lowered(BLOCK, shapes)
    planner = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    plan = planner.plan(0, 2)
    assert plan is not None and plan.dim == chains.BY_ROWS and plan.on_chip
    assert all(ring is not None and ring < 28 for ring in plan.rings.values())
    first = [planner._first(i, (i > 0, i < 2), chains.BY_ROWS) for i in range(3)]
    assert any(share[2] > start[2] for share, start in zip(plan.shares, first))


def test_a_wide_expansion_chains_with_its_strided_depthwise_going_by_a_row_or_two_a_band():
    """MobileNet v2's 112 x 112 expansion to 96 channels (43 KB a row) and its stride-2 depthwise:
    apart they take 179,121 cycles, the 4.8 MB link written and read back. With a sixteenth of
    its rows a band the least share, no chain of them paid (the energy objective's, in a ring of
    7 rows, took 357,006 cycles). Going by a row or two (ROWS down to 1/64) they chain in a ring
    of 11 rows: 138,617 cycles, and only the input, the weights and the result cross."""
    stride2 = {"padding": [[1, 1], [1, 1]], "stride": [2, 2]}
    ops = [("CONV2D", ["x", "we"], {}), ("DEPTHWISE_CONV2D", ["t0", "wd"], stride2)]
    shapes = {"x": ((1, 112, 112, 16), "f32"), "we": ((96, 1, 1, 16), "f32"), "wd": ((3, 3, 96, 1), "f32")}
    target, machine = load_target(STANDARD), load_machine(STANDARD)

    def run(**options) -> tuple[Program, int, dict]:
        program = compile_graph(graph_of(ops, shapes), "pair.dfg", target, **options)
        sim = simulate(program, machine, bind_program(program, machine, "pair.kpu", bind_cpsat))
        return program, sim.cycles, dram_bytes(sim)

    chained, cycles, moved = run()
    assert chained.chains == [[k.name for k in chained.kernels]]
    assert 0 < chained.graph.tensors["t0"].ring < 112
    size = {n: int(np.prod(shape)) * 4 for n, (shape, _) in shapes.items()}
    assert moved == {"read": sum(size.values()), "write": 56 * 56 * 96 * 4}
    _, apart, _ = run(chain=False)
    assert cycles < 0.85 * apart


def test_the_cut_of_the_banks_alone_may_end_better_than_the_cut_of_the_rows_too(monkeypatch):
    """MobileNet v2's first three layers: cut of their banks and their rows at once, the greedy
    cut ends where the first layer runs better apart (172,958 cycles, its 1.6 MB result written
    and read back); the cut of their banks alone keeps the three chained: 167,112 cycles, and of
    what they write only the result crosses."""
    graph, target, machine = first_layers(model="v2"), load_target(STANDARD), load_machine(STANDARD)
    ran = {}
    for cuts in ("both", "rows too"):
        with monkeypatch.context() as m:
            if cuts == "rows too":
                steps = Planner._steps
                m.setattr(Planner, "_steps", lambda self, *args, rows=True, **kw: steps(self, *args, rows=True, **kw))
            program = compile_graph(graph, "v2.dfg", target)
        sim = simulate(program, machine, bind_program(program, machine, "v2.kpu", bind_cpsat))
        ran[cuts] = (program.chains == [[k.name for k in program.kernels]], sim.cycles, dram_bytes(sim))
    assert ran["both"][0] and not ran["rows too"][0]
    assert ran["both"][1] < ran["rows too"][1]
    result, first_result = 112 * 112 * 16 * 4, 112 * 112 * 32 * 4
    assert ran["both"][2]["write"] == result and ran["rows too"][2]["write"] == result + first_result
    assert ran["both"][2]["read"] <= ran["rows too"][2]["read"] - first_result


def test_a_depthwise_in_a_chain_stores_its_result_tiles_two_deep(monkeypatch):
    """MobileNet v1's first three layers chained: the depthwise's result tiles two deep in L1 and
    L2 (they fit as large) let its vector unit go on while the last tile is stored behind the
    members' other moves; the same object with them one deep runs longer."""
    graph, target, machine = first_layers(), load_target(STANDARD), load_machine(STANDARD)
    monkeypatch.setattr(Planner, "chains", lambda self: [self.plan(0, 2)])
    program = loads(dumps(compile_graph(graph, "three.dfg", target)))
    depthwise = program.kernels[1]
    assert depthwise.dataflow == "vector"
    stores = [op for op in depthwise.body if getattr(op, "move_type", None) == "STORE"]
    assert [(op.source.level, op.destination.level, op.depth) for op in stores] == [
        ("L1", "L2", 2), ("L2", "L3", 1), ("L3", "EXTERNAL", 1)]

    def one_deep(kernel):  # its result tiles (its CLAMP's and the STOREs'), not its loads
        return dataclasses.replace(kernel, body=[
            dataclasses.replace(op, depth=1) if getattr(op, "move_type", "STORE") == "STORE" else op
            for op in kernel.body])

    shallow = loads(dumps(dataclasses.replace(program, kernels=[program.kernels[0], one_deep(depthwise),
                                                                 program.kernels[2]])))
    assert [op.depth for op in shallow.kernels[1].body if getattr(op, "move_type", None) == "STORE"] == [1, 1, 1]
    cycles = [simulate(p, machine, bind_program(p, machine, "three.kpu", bind_cpsat)).cycles for p in (program, shallow)]
    assert cycles[0] < 0.98 * cycles[1], cycles


def test_three_members_in_rings_of_one_bands_slack_are_rated_as_taking_turns(monkeypatch):
    """MobileNet v1's first three layers chained in rings of one band's slack: each member waits on
    the next band by band, so the array and the vector units take turns more than they overlap.
    Rated as overlapping, the chain was promised 14% fewer cycles than it ran; rated as taking
    turns it is promised no fewer, and the planner takes a way that runs faster than the one the
    overlapping rating picks."""
    graph, target, machine = first_layers(), load_target(STANDARD), load_machine(STANDARD)
    monkeypatch.setattr(chains, "RING_DEPTH", 1)

    def all_three(overlapping: bool) -> tuple[float, int]:
        """The three chained as planned: their rating, their cycles run."""
        plans = []
        with monkeypatch.context() as m:
            m.setattr(Planner, "chains", lambda self: plans.append(self.plan(0, 2)) or plans)
            if overlapping:
                m.setattr(chains.Usage, "in_turn", property(lambda u: 0.0))
            program = compile_graph(graph, "three.dfg", target)
        assert program.chains == [[k.name for k in program.kernels]]
        return plans[0].usage.cycles, simulate(program, machine, bind_program(program, machine, "three.kpu",
                                                                           bind_cpsat)).cycles

    rated, ran = all_three(overlapping=False)
    assert rated >= ran
    rated, ran_overlapping = all_three(overlapping=True)
    assert rated < 0.9 * ran_overlapping  # 217,752 promised, 253,411 run
    program = compile_graph(graph, "three.dfg", target)
    assert program.chains != [[k.name for k in program.kernels]]
    assert simulate(program, machine, bind_program(program, machine, "three.kpu", bind_cpsat)).cycles \
        < 0.9 * ran_overlapping


def test_a_chain_pays_against_what_its_members_cost_apart_not_the_whole_network():
    """A chain is taken where it saves more than TIE of its members' figure on their own, wherever
    in the network it sits: 10 M cycles before it do not raise the bar."""
    before = chains.Way(10_000_000.0, 0.0, [])
    apart = chains.Usage(100_000.0, 1e9)  # the members each on their own
    for saved, taken in ((5_000.0, True), (500.0, False)):
        chained = before.then(chains.Usage(apart.cycles - saved, apart.pj))
        assert chained.better(before.then(apart), "latency", apart) is taken, saved
    # by pJ alike, under the energy objective; and under edp, by the product
    before = chains.Way(10_000_000.0, 1e11, [])
    for objective, saving, taken in (("energy", 0.02, True), ("energy", 0.002, False),
                                     ("edp", 0.02, True), ("edp", 0.002, False)):
        cheaper = before.then(chains.Usage(apart.cycles * (1 - saving), apart.pj * (1 - saving)))
        assert cheaper.better(before.then(apart), objective, apart) is taken, (objective, saving)


def test_a_reader_waits_for_as_much_of_its_writer_as_its_first_band_reads():
    """The pipeline a chain's estimate counts its fill by: a depthwise in 7 bands of 2 rows of 14,
    then a pointwise."""
    depthwise = chains.Stage(7000.0, bands=7, tiles=1, writes=2)
    # reading 9 rows a band, its first band waits for 5 of the depthwise's (rows 0 .. 9), its
    # second for the last: 5,000 cycles after the depthwise's start, not 1,000
    nine = chains.Stage(20000.0, bands=2, tiles=1, reads=(9, 9, 0, 14))
    assert chains.pipeline([depthwise, nine]) == pytest.approx(5000 + 20000)
    # reading 2 rows a band, it waits for the first band alone, then keeps pace
    two = chains.Stage(20000.0, bands=7, tiles=1, reads=(2, 2, 0, 14))
    assert chains.pipeline([depthwise, two]) == pytest.approx(1000 + 20000)
    # a band with a halo row before and after reads one more row, the first band none before
    halo = chains.Stage(20000.0, bands=2, tiles=1, reads=(9, 7, -1, 14))
    assert chains.pipeline([depthwise, halo]) == pytest.approx(4000 + 20000)
    # dealt to two compute tiles, the depthwise's bands end two at a time (1,750 cycles each),
    # rows 0 .. 9 by 5,250
    dealt = chains.Stage(7000.0, bands=7, tiles=2, writes=2)
    assert chains.pipeline([dealt, nine]) == pytest.approx(5250 + 20000)


def test_a_member_bringing_its_weights_down_for_every_row_is_rated_by_its_l2_bank_port(monkeypatch):
    """A 14 x 14 depthwise and a 576 -> 96 pointwise chained (MobileNet v2's last stage but one):
    the pointwise taken a row at a time brings all its weights (216 KiB) down through the one L2
    bank holding them for every row, so that bank's port, not its array, would set its pace.
    Rated by its array alone it is taken so, and the chain runs 26% longer."""
    shapes = {"x": ((1, 14, 14, 576), "f32"), "wd": ((3, 3, 576, 1), "f32"), "wp": ((96, 1, 1, 576), "f32")}
    ops = [("DEPTHWISE_CONV2D", ["x", "wd"], PAD), ("CONV2D", ["t0", "wp"], {})]
    target, machine = load_target(STANDARD), load_machine(STANDARD)

    def run() -> tuple[Program, int]:
        program = compile_graph(graph_of(ops, shapes), "block.dfg", target)
        assert program.chains == [[k.name for k in program.kernels]]
        return program, simulate(program, machine, bind_program(program, machine, "block.kpu", bind_cpsat)).cycles

    program, cycles = run()
    pointwise = program.kernels[1]
    rated = chains.usage(pointwise, program.graph, target, chained=True)
    # its weights into the bank and out to L1 for every band of rows, half the bands on each
    # compute tile; the slots of its weights in one bank, as a chain's members are bound
    bands = pointwise.tiling["num_tiles_th"]
    assert rated.port == 2 * 96 * 576 * 4 * bands / 2 / target.costs.l2_bank_bytes_per_cycle
    assert pointwise.tiling["R"] > 1
    # a bank of four ports serves four moves at once: the same bytes take a quarter of the time
    four_ports = target_from_machine(dataclasses.replace(machine, l2_bank_ports=4))
    assert chains.usage(pointwise, program.graph, four_ports, chained=True).port == rated.port / 4
    rated_with_port = chains.usage

    def rated_by_array(*args, **kwargs) -> chains.Usage:
        u = rated_with_port(*args, **kwargs)
        return dataclasses.replace(u, port=0.0, cycles=max(u.busy))

    monkeypatch.setattr(chains, "usage", rated_by_array)
    program, by_array = run()
    assert program.kernels[1].tiling["R"] == 1
    assert by_array > 1.25 * cycles


def test_a_pointwise_reading_its_link_by_channels_holds_a_chunk_of_them_in_l3():
    # MobileNet v2's 14 x 14 projection from 384 channels to 64: for the whole target it holds all
    # its input channels in its L3 band, which it could not start on before the whole is written;
    # lowered to read its window input by channels, chunks of them, by the loop its band loop is
    graph, (depthwise, pointwise), target = lowered(
        [("DEPTHWISE_CONV2D", ["x", "wd"], PAD), ("CONV2D", ["t0", "wp"], {})],
        {"x": ((1, 14, 14, 384), "f32"), "wd": ((3, 3, 384, 1), "f32"), "wp": ((64, 1, 1, 384), "f32")})
    ops = {op.name: op for op in graph.ops}

    def x_at_home(k):
        return next(op.source for op in k.body if op.type == "DATA_MOVE" and op.source.tensor == "t0"
                    and op.source.level == "EXTERNAL")

    assert x_at_home(pointwise).tile_shape[3] == 384 and not chains.goes_along(pointwise, "t0", chains.BY_CHANNELS)
    by_channels = lower_group(graph, [ops[pointwise.graph_op]], pointwise.name,
                              chains.share_of(target, 1, 1, None, by_channels=True), dataflow="auto")
    band = by_channels.band_loop("t0", chains.BY_CHANNELS)
    assert x_at_home(by_channels).tile_shape[3] < 384
    assert x_at_home(by_channels).tile_indices[3] == band.induction_var == "tk"
    assert chains.goes_along(by_channels, "t0", chains.BY_CHANNELS)


def test_a_writer_goes_by_the_bands_its_outermost_loop_steps_even_a_parallel_one():
    # MobileNet v2's 7 x 7 expansion from 160 channels to 960 before its depthwise: under shares
    # that cut its rows, its outermost loop, the parallel one, steps tiles of output channels with
    # rows inside. It writes its link by channels; the step past a parallel loop is a reader's
    # alone, so the planner never takes it as going by rows
    graph, kernels, target = lowered(
        [("CONV2D", ["x", "we"], {}), ("DEPTHWISE_CONV2D", ["t0", "wd"], PAD)],
        {"x": ((1, 7, 7, 160), "f32"), "we": ((960, 1, 1, 160), "f32"), "wd": ((3, 3, 960, 1), "f32")})
    planner = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    seen = 0
    for share in [(n, n, r) for n in range(2) for r in range(len(chains.ROWS))]:
        rung = planner.rung(0, share)
        loops = [loop.induction_var for loop in rung.kernel.tile_loops if loop.trip_count > 1]
        if loops[:2] != ["tj", "th"]:
            continue
        seen += 1
        assert rung.kernel.band_loop().parallel and rung.kernel.band_dim("t0") == chains.BY_CHANNELS
        assert rung.kernel.band_loop("t0", chains.BY_ROWS) == rung.kernel.band_loop()
        assert not planner._usable(0, share, (False, True), chains.BY_ROWS)
    assert seen


def test_a_block_repeated_is_planned_as_its_first_was_with_rings_of_its_own_links():
    """Kernels of the signatures of a chain planned before take its plan without weighing its
    ways again, their rings named by their own links, as a planner seeing them first plans them."""
    again = [("CONV2D", ["t2", "we"], {}), ("DEPTHWISE_CONV2D", ["t3", "wd"], PAD), ("CONV2D", ["t4", "wp"], {}),
             ("CONV2D", ["t5", "we"], {}), ("DEPTHWISE_CONV2D", ["t6", "wd"], PAD), ("CONV2D", ["t7", "wp"], {})]
    graph, kernels, target = lowered([*BLOCK, *again], SHAPES)
    planner = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    weighed = []
    ways = planner._ways
    planner._ways = lambda first, last, search: weighed.append(first) or ways(first, last, search)
    # the first 1x1 reads the graph's input and the last writes its output: other signatures
    first = planner.plan(1, 3)
    second = planner.plan(4, 6)
    assert set(weighed) == {1}
    assert second.first == 4 and list(second.rings) == ["t4", "t5"]
    assert (second.shares, list(second.rings.values()), second.usage) == \
        (first.shares, list(first.rings.values()), first.usage)
    fresh = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto")).plan(4, 6)
    assert second == fresh


def test_a_reader_holding_its_result_tiles_until_its_last_chunk_ends_its_chain_with_their_drain():
    # a 14 x 14 pointwise from 384 channels to 64 with a ReLU6, reading its depthwise's result by
    # channels: each compute tile holds a tile of output channels until its last chunk of input
    # channels, then runs the epilogue on the whole tile and moves it up to L3, the array waiting
    graph, (depthwise, pointwise), target = lowered(
        [("DEPTHWISE_CONV2D", ["x", "wd"], PAD), ("CONV2D", ["t0", "wp"], {}),
         ("CLAMP", ["t1"], {"min": 0.0, "max": 6.0})],
        {"x": ((1, 14, 14, 384), "f32"), "wd": ((3, 3, 384, 1), "f32"), "wp": ((64, 1, 1, 384), "f32")})
    planner = Planner([depthwise, pointwise], graph, target, functools.partial(lower_group, dataflow="auto"))
    reader = next(r for share in [(n, l, chains.CHANNEL_BANDS) for n in range(3) for l in range(3)]
                  if planner._usable(1, share, (True, False), chains.BY_CHANNELS) and (r := planner.rung(1, share))
                  and r.loop(False, chains.BY_CHANNELS) != r.kernel.band_loop())
    k, costs = reader.kernel, target.costs
    band = reader.loop(False, chains.BY_CHANNELS)
    assert band.induction_var == "tk" and k.band_loop().parallel
    # one result tile: its elements through the ReLU6 (a max and a min each) on a vector unit's
    # lanes, its bytes up through a Streamer into L2 and a BlockMover into L3
    elements = 14 * 14 * k.tiling["Tn"]
    expected = (2 * elements / costs.vector.lanes * costs.vector.cycles_per_element["simple"]
                + elements * 4 / costs.streamer_bytes_per_cycle + elements * 4 / costs.block_mover_bytes_per_cycle)
    assert chains.tail(k, graph, target) == pytest.approx(expected)
    # the chain ends that much after the pointwise's last chunk
    stages = chains._stages([chains.Usage(5000.0, 0.0), chains.Usage(9000.0, 0.0)],
                            [planner.rung(0, (0, 0, len(chains.ROWS) - 1)), reader], graph, chains.BY_CHANNELS, target)
    assert stages[-1].tail == pytest.approx(expected)
    untailed = [*stages[:-1], dataclasses.replace(stages[-1], tail=0.0)]
    assert chains.pipeline(stages) == pytest.approx(chains.pipeline(untailed) + expected)
    # going by rows, it stores each band's result tile in its band loop: the last band's is left
    rows = planner.rung(1, (0, 0, 3)).kernel
    assert rows.tiling["R"] < 14 and rows.tiling["Tn"] == 64
    assert chains.tail(rows, graph, target) == pytest.approx(
        rows.tiling["R"] * 14 * 64 * (2 / costs.vector.lanes + 4 / costs.streamer_bytes_per_cycle
                                      + 4 / costs.block_mover_bytes_per_cycle))


def test_two_small_convolutions_chain_where_the_first_ones_tail_then_runs_under_the_second(monkeypatch):
    # alone, each ends with its last result tile's epilogue and its moves up, the array idle;
    # chained, the first's runs under the second's work, and the chain pays by that
    shapes = {"x": ((1, 12, 12, 8), "f32"), "w0": ((16, 3, 3, 8), "f32"), "w1": ((16, 3, 3, 16), "f32")}
    ops = [("CONV2D", ["x", "w0"], PAD), ("RELU", ["t0"], {}), ("CONV2D", ["t1", "w1"], PAD)]
    graph = graph_of(ops, shapes)
    target = load_target(STANDARD)
    chained = loads(dumps(compile_graph(graph, "two.dfg", target)))
    apart = loads(dumps(compile_graph(graph, "two.dfg", target, chain=False)))
    assert chained.chains == [[k.name for k in chained.kernels]] and not apart.chains
    machine = load_machine(STANDARD)
    cycles = []
    for program in (chained, apart):
        bindings = bind_program(program, machine, "two.kpu", bind_greedy)
        cycles.append(simulate(program, machine, bindings).cycles)
    assert cycles[0] < cycles[1]
    values = execute(chained, bind_program(chained, machine, "two.kpu", bind_greedy),
                     {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(shapes.items())})
    x = {n: random(shape, seed=i).astype(np.float64) for i, (n, (shape, _)) in enumerate(shapes.items())}

    def conv(a, w):  # NHWC x OHWI, padding 1
        p = np.pad(a, [(0, 0), (1, 1), (1, 1), (0, 0)])
        return np.stack([np.einsum("nhwc,ohwc->no", p[:, i:i + 3, j:j + 3, :], w)
                         for i in range(12) for j in range(12)], axis=1).reshape(1, 12, 12, -1)

    assert np.allclose(values["t2"], conv(np.maximum(conv(x["x"], x["w0"]), 0), x["w1"]), rtol=1e-4, atol=1e-4)
    # without the tails, the chain is not worth its fill
    monkeypatch.setattr(chains, "tail", lambda *args: 0.0)
    assert not compile_graph(graph, "two.dfg", target).chains


@pytest.mark.parametrize("channels", [256, 640])
def test_a_pair_whose_fill_outweighs_the_tail_it_would_hide_is_never_planned(monkeypatch, channels):
    # a 1x1 to 128 channels and a 3x3 to 32 on 14 x 14, as in DenseNet's blocks: chained, the
    # first's tail would run under the second's work, but the second waits longer than that for
    # the first's bands. Counting the fill no pipeline of theirs avoids (`least`), the planner
    # sees the chain would not pay, and plans none
    ops = [("CONV2D", ["x", "w0"], {}), ("RELU", ["t0"], {}), ("CONV2D", ["t1", "w1"], PAD)]
    shapes = {"x": ((1, 14, 14, channels), "f32"), "w0": ((128, 1, 1, channels), "f32"),
              "w1": ((32, 3, 3, 128), "f32")}
    graph, kernels, target = lowered(ops, shapes)
    planner = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    alone = sum(chains.usage(k, graph, target).cycles + chains.tail(k, graph, target) for k in kernels)

    def pays(u: chains.Usage) -> bool:  # by more than the estimates' rounding
        return u.cycles < alone * (1 - chains.TIE)

    assert pays(planner.unshared(0, 1))  # tiled for the whole target, no fill: it would pay
    assert not pays(planner.least(0, 1))
    assert not pays(planner.plan(0, 1).usage)  # planned in full, it does not pay
    planned = []
    monkeypatch.setattr(Planner, "plan", lambda self, first, last, search=True: planned.append((first, last)))
    assert not compile_graph(graph_of(ops, shapes), "pair.dfg", target).chains and not planned
    monkeypatch.setattr(Planner, "least", Planner.unshared)  # without the fill, it is planned
    compile_graph(graph_of(ops, shapes), "pair.dfg", target)
    assert planned == [(0, 1)]


def test_the_pair_search_runs_only_where_the_least_cost_leaves_enough_to_gain(monkeypatch):
    # the pair above, its least cost set to 1.5% and to 5% under its members' alone: both pass
    # the planner's check (1%), but only the second is worth lowering each member under every
    # usable share for
    ops = [("CONV2D", ["x", "w0"], {}), ("RELU", ["t0"], {}), ("CONV2D", ["t1", "w1"], PAD)]
    shapes = {"x": ((1, 14, 14, 640), "f32"), "w0": ((128, 1, 1, 640), "f32"), "w1": ((32, 3, 3, 128), "f32")}
    graph, kernels, target = lowered(ops, shapes)
    alone = sum(chains.usage(k, graph, target).cycles + chains.tail(k, graph, target) for k in kernels)
    least = Planner.least
    searches, plan = [], Planner.plan
    monkeypatch.setattr(Planner, "plan", lambda self, first, last, search=True:
                        searches.append(search) or plan(self, first, last, search))
    for gain in (0.015, 0.05):
        monkeypatch.setattr(Planner, "least", lambda self, first, last:
                            dataclasses.replace(least(self, first, last), cycles=alone * (1 - gain)))
        compile_graph(graph_of(ops, shapes), "pair.dfg", target)
    assert searches == [False, True]
    # two such blocks in a row: the first pair planned without the search, the second, of the same
    # signatures, searched when it asks for it, once, and the first then planned as it was
    ops = [("RELU", ["x"], {}), ("CONV2D", ["t0", "w0"], {}), ("RELU", ["t1"], {}), ("CONV2D", ["t2", "w1"], PAD),
           ("CONV2D", ["t3", "w0"], {}), ("RELU", ["t4"], {}), ("CONV2D", ["t5", "w1"], PAD),
           ("MAXPOOL2D", ["t6"], {"kernel": [2, 2], "stride": [2, 2]})]
    shapes = {"x": ((1, 14, 14, 256), "f32"), "w0": ((128, 1, 1, 256), "f32"), "w1": ((256, 3, 3, 128), "f32")}
    graph, kernels, target = lowered(ops, shapes)
    planner = Planner(kernels, graph, target, functools.partial(lower_group, dataflow="auto"))
    assert planner.proxy[3:5] == planner.proxy[1:3] and planner.links[1:4] == ["t2", "t3", "t5"]
    ways = []
    ways_of = Planner._ways
    monkeypatch.setattr(Planner, "_ways", lambda self, first, last, search: ways.append(search)
                        or ways_of(self, first, last, search))
    quick = planner.plan(1, 2, search=False)
    assert ways == [False] and planner._short([quick], 1, 2)  # the cut falls short: a search would run
    second = planner.plan(3, 4)
    assert ways == [False, True] and second.first == 3 and list(second.rings) == ["t5"]
    first = planner.plan(1, 2)
    assert ways == [False, True] and first.first == 1 and list(first.rings) == ["t2"]
    assert (first.shares, first.usage) == (second.shares, second.usage) != (quick.shares, quick.usage)
