"""Chrome / Perfetto trace-event JSON of a simulation (open it in ui.perfetto.dev)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from .machine import Machine
from .simulator import TRACE_PID, SimResult


def trace_json(result: SimResult, machine: Machine, phase_names: Sequence[str] = ()) -> bytes:
    """The trace document: one named track per unit, in `result.units` order, and the run's task slices.

    Slices (one per task, on its engine's track) come from `Simulator(trace=True)`, already in
    microseconds at the machine clock. DRAM channel and L2 bank tracks are named too, so every
    unit of the report appears; their occupancy is in `result.units`. Below them, a track per
    named phase (phases overlap) holds its span, and within it the span from its first compute.
    """
    meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": TRACE_PID, "tid": 0,
             "args": {"name": f"KPU {machine.name} @ {machine.clock_ghz:g} GHz"}}]
    for tid, name in enumerate(result.units):
        meta += _track(tid, name)
    us = 1.0 / (machine.clock_ghz * 1e3)
    spans = []
    for tid, (phase, name) in enumerate(enumerate(phase_names), start=len(result.units)):
        span = result.phases.get(phase)
        if span is None:
            continue
        meta += _track(tid, name)
        spans.append({"name": name, "ph": "X", "pid": TRACE_PID, "tid": tid, "ts": span.start * us,
                      "dur": (span.end - span.start) * us, "args": {"macs": span.macs}})
        if span.compute_start is not None:
            spans.append({"name": "compute", "ph": "X", "pid": TRACE_PID, "tid": tid, "ts": span.compute_start * us,
                          "dur": (span.end - span.compute_start) * us, "args": {}})
    doc = {"traceEvents": meta + result.trace_events + spans, "displayTimeUnit": "ns"}
    return orjson.dumps(doc)


def _track(tid: int, name: str) -> list[dict]:
    """The metadata events that name a track and keep tracks in `tid` order."""
    track = {"ph": "M", "ts": 0, "pid": TRACE_PID, "tid": tid}
    return [{"name": "thread_name", **track, "args": {"name": name}},
            {"name": "thread_sort_index", **track, "args": {"sort_index": tid}}]
