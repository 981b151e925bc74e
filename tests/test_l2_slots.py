"""A double-buffered load into L2 is a buffer per slot, which the CP-SAT binder may put in
different banks: the BlockMover filling one slot and the Streamer draining the other then go
through two banks' ports, not one port taking every byte twice (a GEMV streaming its weights)."""

from __future__ import annotations

import pytest

from dfx import DataMove
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target
from loader import bind_cpsat, bind_greedy, bind_program, simulate
from loader.buffers import kernel_demands
from conftest import shrunk_config
from test_partial_sums import gemm, split_program
from test_vector_kernels import STANDARD, graph_of

# MobileNet v1's classifier as a product: one row of 1024 by 1024 x 1000 weights (4 MB)
GEMV = ([("MATMUL", ["x", "w"], {})], {"x": ((1, 1024), "f32"), "w": ((1024, 1000), "f32")})


def _run(binder):
    program = compile_graph(graph_of(*GEMV), "test.dfg", load_target(STANDARD))
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "test", binder)
    return program, bindings, simulate(program, machine, bindings)


def test_a_double_buffered_l2_load_is_a_buffer_per_slot():
    program, _, _ = _run(bind_greedy)
    k = program.kernels[0]
    buffers, _ = kernel_demands(k, program, 2, line=64)
    for op in k.body:
        if isinstance(op, DataMove) and op.move_type == "LOAD" and op.destination.level == "L2" and op.depth == 2:
            slots = [b for b in buffers if b.op_id == op.op_id and b.worker == 0]
            assert [b.slot for b in slots] == [0, 1] and {b.depth for b in slots} == {1}
            assert slots[0].bytes == slots[1].bytes > 0
            break
    else:
        raise AssertionError("the GEMV loads nothing double-buffered into L2")


def test_cp_sat_parts_the_weights_slots_over_two_banks_and_the_gemv_runs_faster():
    program, bindings, sim = _run(bind_cpsat)
    banks = {}
    for bb in bindings[0].buffers:
        if bb.buffer.level == "L2" and bb.buffer.tensor == "w":
            banks.setdefault(bb.buffer.worker, set()).add(bb.bank)
    assert banks and all(len(b) == 2 for b in banks.values()), banks
    # each weight byte crosses its L2 bank's port twice (filled, then drained): through one port
    # per compute tile that takes 4,096,000 bytes * 2 / 2 tiles / 64 bytes a cycle = 64,000 cycles
    # at least (66,853 when the slots were one buffer); through two ports, less
    assert sim.cycles < 60_000


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """standard with 8 KB L2 banks and 128 KB of L3, as tests/test_partial_sums.py splits K on."""
    return shrunk_config(tmp_path_factory, "standard", "split", (2, 64), (8, 8), (4, 4))


def test_a_ring_of_partial_sums_in_l2_stays_one_buffer(small, monkeypatch):
    """A K split's ring of partial sums in L2 is read back by the tile it holds, not by the latest
    drain's: its slots are not parted (only loads are), so every reload finds its bank."""
    program = split_program(gemm(96, 160, 512), small, monkeypatch, "L2", "tj", 2, 2, 2)
    k = program.kernels[0]
    ring = [op for op in k.body
            if isinstance(op, DataMove) and op.move_type == "STORE" and op.destination.level == "L2"]
    assert ring and ring[0].depth > 1
    buffers, _ = kernel_demands(k, program, 2, line=64)
    assert [b.slot for b in buffers if b.op_id == ring[0].op_id] == [None, None]  # one buffer per compute tile
    assert any(b.slot is not None for b in buffers)  # while its double-buffered loads are parted
