"""Intermediates kept on chip: a tensor whose home is L3 never crosses external memory, its values
still checked, and a machine without the room keeps it in external memory."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dfx import Home, ObjectFileError, Resident, dumps, freed, loads, pack_homes
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.report import dram_bytes
from loader.run import check_kernels
from test_vector_kernels import STANDARD, graph_of, random

# a 3x3 convolution with its ReLU, then another 3x3 convolution padded by 1, which reads the
# first one's result as padded bands
CHAIN = [("CONV2D", ["x", "w0"], {"padding": [[1, 1], [1, 1]]}), ("RELU", ["t0"], {}),
         ("CONV2D", ["t1", "w1"], {"padding": [[1, 1], [1, 1]]})]
SHAPES = {"x": ((1, 12, 12, 8), "f32"), "w0": ((16, 3, 3, 8), "f32"), "w1": ((16, 3, 3, 16), "f32")}
KEPT_BYTES = 12 * 12 * 16 * 4  # t1


def chain_values():
    return {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}


def compiled():
    """Its two kernels one after the other, t1 kept in L3 between them (chained, they would run
    at once, t1 a link: tests/test_chain_planning.py)."""
    return loads(dumps(compile_graph(graph_of(CHAIN, SHAPES), "chain.dfg", load_target(STANDARD), chain=False)))


def run(program, machine):
    bindings = bind_program(program, machine, "chain.kpu", bind_greedy)
    return bindings, simulate(program, machine, bindings), execute(program, bindings, chain_values())


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NHWC x OHWI, stride 1, padding 1, in float64: the independent reference."""
    p = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)])
    h, wd = x.shape[1], x.shape[2]
    cols = np.stack([p[:, i:i + h, j:j + wd, :] for i in range(3) for j in range(3)], axis=3)  # N H W 9 C
    return np.einsum("nhwkc,okc->nhwo", cols, w.reshape(w.shape[0], 9, -1).astype(np.float64))


def test_the_conv_result_stays_in_l3_and_never_crosses_external_memory():
    program = compiled()
    assert [t.name for t in program.graph.tensors.values() if t.home == "L3"] == ["t1"]
    standard = load_machine(STANDARD)
    bindings, sim, values = run(program, standard)
    assert [h.tensor for h in bindings[0].homes] == ["t1"] == [h.tensor for h in bindings[1].homes]
    # the compiler's exact count is what the simulator moves, t1 not in it
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())
    # the second convolution's padded bands are copied out of the home by the BlockMovers
    assert sim.bytes_moved.get("L3->L3", 0) >= KEPT_BYTES
    assert all(c.passed for c in check_kernels(program, values).values())
    x = chain_values()
    want = _conv(np.maximum(_conv(x["x"], x["w0"]), 0), x["w1"])
    assert np.allclose(values["t2"], want, rtol=1e-4, atol=1e-4)

    # a machine whose L3 has no room for it keeps t1 in external memory: the same object runs,
    # with t1 written once and read at least once more
    small = dataclasses.replace(standard, l3=dataclasses.replace(standard.l3, count=1, bytes=36 * 1024))
    bindings, sim_small, values = run(program, small)
    assert not any(b.homes for b in bindings)
    assert "'t1' stays in external memory" in " ".join(bindings[0].notes)
    assert sum(dram_bytes(sim_small).values()) - sum(dram_bytes(sim).values()) >= 2 * KEPT_BYTES
    assert sim_small.bytes_moved.get("L3->L3", 0) == 0
    assert np.allclose(values["t2"], want, rtol=1e-4, atol=1e-4)


def test_a_home_is_refused_on_a_graph_input():
    program = compiled()
    g = program.graph
    g.tensors["x"] = dataclasses.replace(g.tensors["x"], home="L3")
    with pytest.raises(ObjectFileError, match="tensor 'x': has its home in L3, but a graph input lives"):
        loads(dumps(program))


def test_homes_pack_from_the_top_below_each_other_and_leave_room_for_the_kernels():
    wanted = [Resident("a", 100, 0, 1), Resident("b", 64, 1, 2), Resident("c", 64, 3, 4), Resident("d", 300, 0, 4)]
    homes = pack_homes(wanted, demands=[200, 100, 100, 50, 50], capacity=512, line=64)
    assert homes == [Home("a", 384, 100, 0, 1), Home("b", 320, 64, 1, 2), Home("c", 448, 64, 3, 4)]
    # d would leave kernel 0 less than its 200 bytes below the homes live while it runs


def test_a_home_frees_the_l3_buffers_of_the_tiles_that_lie_in_it():
    # kernels 0 and 1 each need 320 bytes, of which 192 are their plain tiles of the tensor
    # their chain (both kernels) would keep: with its home, those lie in it
    spans = [(0, 1), (0, 1)]
    frees = freed({0: 128, 1: 64}, spans)
    assert frees == ((0, 192), (1, 192))  # the chain's kernels run at once: each counts both
    homes = pack_homes([Resident("t", 256, 0, 1, frees)], demands=[320, 320], capacity=512, line=64)
    assert homes == [Home("t", 256, 256, 0, 1)]
    # without the tiles freed, kernels needing 320 bytes leave no room for 256
    assert pack_homes([Resident("t", 256, 0, 1)], demands=[320, 320], capacity=512, line=64) == []


def test_homes_of_one_span_are_taken_together_where_each_frees_more_than_it_takes():
    # a chain's two links, each freeing 192 bytes of the chain's 640 for its 128: alone, the first
    # leaves 384 for 640 - 192; both together leave 256 for 640 - 384
    wanted = [Resident("a", 128, 0, 1, ((0, 192), (1, 192))), Resident("b", 128, 0, 1, ((0, 192), (1, 192)))]
    assert pack_homes(wanted[:1], demands=[640, 640], capacity=512, line=64) == []
    homes = pack_homes(wanted, demands=[640, 640], capacity=512, line=64)
    assert homes == [Home("a", 384, 128, 0, 1), Home("b", 256, 128, 0, 1)]
    # where they do not fit together, each is tried alone: the first fits on its own, the second
    # (too large for any room left) does not
    alone = [Resident("a", 128, 0, 1), Resident("b", 448, 0, 1)]
    assert pack_homes(alone, demands=[256, 256], capacity=512, line=64) == [Home("a", 384, 128, 0, 1)]


def test_homes_pack_longest_lived_first_where_that_holds_more():
    # a link's short ring and the chain's result start together, and the next kernel's result
    # starts as the ring ends. In writer order the ring sits on top and the result below it, so
    # the next result must go below both and leaves kernel 2 no room; with the longest-lived
    # first, the next result takes the ring's place when it ends
    wanted = [Resident("ring", 128, 0, 1), Resident("y", 192, 0, 2), Resident("p", 192, 2, 3)]
    demands = [128, 128, 128, 64]
    assert pack_homes(wanted[:2], demands, capacity=512, line=64) == [Home("ring", 384, 128, 0, 1),
                                                                      Home("y", 192, 192, 0, 2)]
    assert pack_homes(wanted, demands, capacity=512, line=64) == [
        Home("y", 320, 192, 0, 2), Home("ring", 192, 128, 0, 1), Home("p", 128, 192, 2, 3)]
    # the second packing is taken only where it holds all the first does: here it would hold the
    # long one (more bytes) for the ring, which may be a chain's link
    wanted = [Resident("ring", 128, 0, 1), Resident("long", 320, 0, 3)]
    assert pack_homes(wanted, [128, 128, 192, 192], capacity=512, line=64) == [Home("ring", 384, 128, 0, 1)]
