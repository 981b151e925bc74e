"""A load of what earlier kernels wrote to external memory waits for those writes, in pieces, not
for the writers' ends; and what reads it on chip waits for its pieces, or, where the load's tile
lies elsewhere in its destination than in its source (a SLICE's window), for the whole load."""

from __future__ import annotations

from hardware import load_machine
from kernel_compiler import compile_graph, load_target
from loader import bind_greedy, bind_program, tasks
from loader.run import program_tasks
from test_vector_kernels import graph_of

DATACENTER = "datacenter"


def _tasks(ops, inputs, monkeypatch):
    monkeypatch.setattr(tasks, "PIECE_BYTES", 4096)  # many pieces
    program = compile_graph(graph_of(ops, inputs), "t.dfg", load_target(DATACENTER), keep=False, chain=False)
    machine = load_machine(DATACENTER)
    return program, list(program_tasks(program, bind_program(program, machine, "t", bind_greedy), machine))


def test_a_slice_waits_for_the_load_of_its_window(monkeypatch):
    """The SLICE loads channels 128.. of t0 as t1's channels 0..: its store of t1 reads the
    load's tile at other coordinates than the pieces of t0 it came in, so it waits for the load."""
    program, stream = _tasks([("CONV2D", ["x", "w"], {}), ("SLICE", ["t0"], {"start": [0, 0, 0, 128],
                                                                              "size": [1, 8, 224, 128]})],
                             {"x": ((1, 8, 224, 256), "f32"), "w": ((256, 1, 1, 256), "f32")}, monkeypatch)
    by_id = {t.id: t for t in stream}
    loads = {t.id for t in stream if t.label.startswith("t1 EXTERNAL->L3")}
    stores = [t for t in stream if t.label == "t1 L3->EXTERNAL"]
    assert loads and stores
    for store in stores:
        waited = set(store.deps)
        while waited and not waited & loads:  # through the moves between them on chip, if any
            waited = {d for w in waited for d in by_id[w].deps}
        assert waited & loads, store


def test_a_pointwise_input_loads_in_pieces_as_it_is_written(monkeypatch):
    """Without homes, a depthwise's result reaches the pointwise after it through external
    memory: the pointwise's load goes in pieces, each waiting for the stores of what it holds
    (not the depthwise's barrier), and its moves on chip wait for the pieces they read."""
    program, stream = _tasks([("DEPTHWISE_CONV2D", ["x", "wd"], {"padding": [[1, 1], [1, 1]]}), ("CONV2D", ["t0", "wp"], {})],
                             {"x": ((1, 14, 14, 256), "f32"), "wd": ((3, 3, 256, 1), "f32"),
                              "wp": ((64, 1, 1, 256), "f32")}, monkeypatch)
    stores = {t.id for t in stream if t.label == "t0 L3->EXTERNAL"}
    ends = [t for t in stream if t.label.startswith("t0 EXTERNAL->L3") and t.label.endswith("pieces)")]
    assert ends
    by_id = {t.id: t for t in stream}
    for end in ends:
        pieces = [by_id[d] for d in end.deps]
        assert len(pieces) > 1 and all(p.unit == "dma" for p in pieces)
        # each piece waits for stores of t0 and for no barrier
        assert all(set(p.deps) & stores and not any(by_id[d].unit == "barrier" for d in p.deps if d in by_id)
                   for p in pieces)
        # the pieces are written one after another: the first waits for fewer stores than the last
        assert len(set(pieces[0].deps) & stores) < len({d for p in pieces for d in p.deps} & stores)
    readers = [t for t in stream if t.label == "t0 L3->L2"]
    piece_ids = {d for end in ends for d in end.deps}
    assert any(set(r.deps) & piece_ids for r in readers)
