"""Homes between chains (kernel_compiler/chains.boundary_homes): a tensor one chain writes whole
and the next chain's pointwise reads whole, kept on chip, in L2 where L3 has no room beside the
chains; the loader binds its piece in every L2 bank, runs its moves there in place, and keeps
it in external memory where a machine has no room for it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dfx import ObjectFileError, dumps, loads
from dfx.validate import validate_program
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target
from loader import bind_program, execute, simulate
from loader.binding import bind_greedy
from loader.report import dram_bytes
from test_vector_kernels import STANDARD, graph_of, random

# a pointwise expanding 128 channels to 256 and a strided depthwise (28 x 28 -> 14 x 14), then a
# pointwise to 512 and a depthwise: MobileNet v1's dw11 .. dw13 at the size of its own. Each pair
# chains (the pointwise by channels of the 14 x 14 image it holds whole); t1 (200 KB) lies
# between the chains, and L3 holds it beside neither
S2 = {"padding": [[0, 1], [0, 1]], "stride": [2, 2]}
PAD = {"padding": [[1, 1], [1, 1]]}
OPS = [("CONV2D", ["x", "w0"], {}), ("DEPTHWISE_CONV2D", ["t0", "wd0"], S2), ("CONV2D", ["t1", "w2"], {}),
       ("DEPTHWISE_CONV2D", ["t2", "wd2"], PAD)]
SHAPES = {"x": ((1, 28, 28, 128), "f32"), "w0": ((256, 1, 1, 128), "f32"), "wd0": ((3, 3, 256, 1), "f32"),
          "w2": ((512, 1, 1, 256), "f32"), "wd2": ((3, 3, 512, 1), "f32")}


def _pointwise(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("nhwc,oc->nhwo", x, w[:, 0, 0, :])


def _depthwise(x: np.ndarray, w: np.ndarray, pad: list[list[int]], stride: int) -> np.ndarray:
    """A depthwise 3x3 in float64."""
    p = np.pad(x, [(0, 0), tuple(pad[0]), tuple(pad[1]), (0, 0)])
    h, wd = (p.shape[1] - 3) // stride + 1, (p.shape[2] - 3) // stride + 1
    return sum(p[:, i:i + stride * h:stride, j:j + stride * wd:stride, :] * w[i, j, :, 0]
               for i in range(3) for j in range(3))


@pytest.fixture(scope="module")
def program():
    # ranked by energy, where keeping t1 off the external memory link pays
    return loads(dumps(compile_graph(graph_of(OPS, SHAPES), "tail.dfg", load_target(STANDARD, objective="energy"))))


def _run(program, machine):
    bindings = bind_program(program, machine, "tail.kpu", bind_greedy)
    sim = simulate(program, machine, bindings)
    values = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}
    got = execute(program, bindings, values)
    want, terms = (_reference({n: f(a.astype(np.float64)) for n, a in values.items()}) for f in (np.asarray, np.abs))
    # f32 sums of 256 and 512 terms: each off by a few ulps of the terms' magnitude
    assert np.all(np.abs(got["t3"] - want) <= 1e-5 * terms)
    return bindings, sim


def _reference(v: dict[str, np.ndarray]) -> np.ndarray:
    t1 = _depthwise(_pointwise(v["x"], v["w0"]), v["wd0"], S2["padding"], 2)
    return _depthwise(_pointwise(t1, v["w2"]), v["wd2"], PAD["padding"], 1)


def test_a_tensor_between_two_chains_is_kept_in_l2_and_never_crosses_external_memory(program):
    assert program.chains == [[k.name for k in program.kernels[:2]], [k.name for k in program.kernels[2:]]]
    homes = {t.name: t.home for t in program.graph.tensors.values() if t.home is not None}
    assert homes["t1"] == "L2"
    # the reader's pointwise holds t1 whole, in its home: neither an L3 buffer for it nor an L2 one
    reader = program.kernels[2]
    assert [op.destination.level for op in reader.body if op.type == "DATA_MOVE"
            and op.destination.tensor == "t1"] == ["L3", "L2", "L1"]
    machine = load_machine(STANDARD)
    bindings, sim = _run(program, machine)
    # its piece at the top of every bank, live from its writer's chain to its reader's
    assert [[h.tensor for h in b.l2_homes] for b in bindings] == [["t1"]] * 4
    piece = bindings[0].l2_homes[0]
    assert piece.bytes == 14 * 14 * 256 * 4 // machine.l2.count and piece.address + piece.bytes == machine.l2.bytes
    assert all(bb.end <= piece.address for b in bindings for bb in b.buffers if bb.buffer.level == "L2")
    assert not [bb for b in bindings for bb in b.buffers if bb.buffer.tensor == "t1" and bb.buffer.level != "L1"]
    # the input, the weights and the output cross external memory, once each; t1 not at all
    size = {n: int(np.prod(shape)) * 4 for n, (shape, _) in SHAPES.items()}
    links = sum(2 * np.prod(program.graph.tensors[t].shape) * 4 for t in ("t0", "t2")
                if program.graph.tensors[t].home is None)
    assert sum(dram_bytes(sim).values()) == sum(size.values()) + 14 * 14 * 512 * 4 + links
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())


def test_a_machine_without_room_in_l2_keeps_the_tensor_in_external_memory(program):
    machine = load_machine(STANDARD)
    # L2 banks of 40 KB bind the kernels' own buffers, but not those and t1's piece (25 KB) at once
    small = dataclasses.replace(machine, l2=dataclasses.replace(machine.l2, bytes=40 * 1024))
    bindings, sim = _run(program, small)
    assert not any(b.l2_homes for b in bindings)
    assert any("'t1' stays in external memory: L2 has no room" in note for note in bindings[1].notes)
    with_home = _run(program, machine)[1]
    assert sum(dram_bytes(sim).values()) == sum(dram_bytes(with_home).values()) + 2 * 14 * 14 * 256 * 4


def test_the_validator_keeps_homes_in_l2_to_plain_tiles_of_tensors_no_chain_links(program):
    link = dataclasses.replace(program, graph=dataclasses.replace(program.graph, tensors={
        **program.graph.tensors, "t0": dataclasses.replace(program.graph.tensors["t0"], home="L2", ring=None)}))
    with pytest.raises(ObjectFileError, match="link 't0' has its home in L2; a link is kept in L3"):
        validate_program(link, "tail.kpu")
    # apart, the depthwise reads t0 in padded bands: no region of a home in L2
    apart = compile_graph(graph_of(OPS[:2], SHAPES), "pair.dfg", load_target(STANDARD), chain=False)
    padded = dataclasses.replace(apart, graph=dataclasses.replace(apart.graph, tensors={
        **apart.graph.tensors, "t0": dataclasses.replace(apart.graph.tensors["t0"], home="L2")}))
    with pytest.raises(ObjectFileError, match="moves a padded tile of 't0' at L3, whose home is in L2"):
        validate_program(padded, "pair.kpu")


def test_each_kernel_touching_a_home_ends_with_a_task_that_waits_for_its_last_use(program):
    """Later buffers over a home's bytes wait for the task its writer and each reader end with
    (`TaskStream.finish`): it ends with the last of their moves of it, whichever compute tile
    makes it (no one of them need end last, and the moves in place make no task)."""
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "tail.kpu", bind_greedy)
    result = simulate(program, machine, bindings, record_first=1 << 20)
    last_use = {task.phase: end for task, _, end, _ in result.first_tasks if task.label.endswith("last use of t1's home")}
    # the depthwise writing t1 and the pointwise reading it; not the kernels beside them in their chains
    assert sorted(last_use) == [1, 2]
    for phase, path in ((1, "t1 L1->L2"), (2, "t1 L2->L1")):
        ends = [end for task, _, end, _ in result.first_tasks if task.phase == phase and task.label == path]
        assert ends and last_use[phase] >= max(ends)
