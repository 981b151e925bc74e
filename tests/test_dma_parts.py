"""A move of SPLIT_BYTES or more between external memory and L3 goes as one part per DMA engine,
each through its own channel (loader/tasks.py): a 14 x 14 pointwise layer's whole input, loaded
before its first tile, no longer waits for one engine at one channel's rate."""

from __future__ import annotations

import numpy as np

from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, program_tasks, simulate
from loader import tasks as loader_tasks
from test_vector_kernels import STANDARD, graph_of, random

# a 1x1 convolution over a 14 x 14 x 128 image (100,352 bytes, loaded whole into L3 at its start)
POINTWISE = ([("CONV2D", ["x", "w"], {})], {"x": ((1, 14, 14, 128), "f32"), "w": ((128, 1, 1, 128), "f32")})


def test_a_large_move_goes_in_parts_over_the_dma_engines_and_ends_when_they_all_have(monkeypatch):
    program = compile_graph(graph_of(*POINTWISE), "test.dfg", load_target(STANDARD))
    machine = load_machine(STANDARD)
    assert machine.engines.dma == 2
    bindings = bind_program(program, machine, "test", bind_greedy)
    tasks = list(program_tasks(program, bindings, machine))
    by_id = {t.id: t for t in tasks}
    ends = [t for t in tasks if t.unit == "barrier" and t.label.endswith("(2 parts)")]
    assert ends
    parts = {d for end in ends for d in end.deps}
    halves = {}
    for end in ends:
        moved = [by_id[d] for d in end.deps]
        assert [(t.unit, t.engine) for t in moved] == [("dma", 0), ("dma", 1)]
        assert all(t.id < end.id for t in moved) and moved[0].deps == moved[1].deps
        assert moved[0].bytes == moved[1].bytes
        halves[moved[0].label] = moved[0].bytes
    # the image (14 x 14 x 128 f32), loaded whole, halved (the weights come a chunk at a time)
    assert halves == {"x EXTERNAL->L3": 100_352 // 2}
    # what comes after a parted move waits for its end, never for one part
    assert not any(parts & set(t.deps) for t in tasks if t not in ends)
    # every byte moves once, as unparted
    parted = simulate(program, machine, bindings)
    monkeypatch.setattr(loader_tasks, "SPLIT_BYTES", 1 << 62)
    unparted = simulate(program, machine, bindings)
    assert parted.bytes_moved == unparted.bytes_moved
    assert parted.cycles < unparted.cycles

    values = execute(program, bindings, {"x": random((1, 14, 14, 128), seed=1), "w": random((128, 1, 1, 128), seed=2)})
    want = np.einsum("nhwc,oc->nhwo", random((1, 14, 14, 128), seed=1).astype(np.float64),
                     random((128, 1, 1, 128), seed=2)[:, 0, 0, :].astype(np.float64))
    np.testing.assert_allclose(values["t0"], want, rtol=1e-5, atol=1e-4)
