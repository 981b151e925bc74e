"""Chrome / Perfetto trace-event JSON of a simulation (open it in ui.perfetto.dev)."""

from __future__ import annotations

from pathlib import Path

import orjson

from .machine import Machine
from .simulator import TRACE_PID, SimResult


def write_trace(path: str | Path, result: SimResult, machine: Machine) -> None:
    """Write one named track per unit, in `result.units` order, and the run's task slices.

    Slices (one per task, on its engine's track) come from `Simulator(trace=True)`, already in
    microseconds at the machine clock. DRAM channel and L2 bank tracks are named too, so every
    unit of the report appears; their occupancy is in `result.units`.
    """
    meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": TRACE_PID, "tid": 0,
             "args": {"name": f"KPU {machine.name} @ {machine.clock_ghz:g} GHz"}}]
    for tid, name in enumerate(result.units):
        track = {"ph": "M", "ts": 0, "pid": TRACE_PID, "tid": tid}
        meta.append({"name": "thread_name", **track, "args": {"name": name}})
        meta.append({"name": "thread_sort_index", **track, "args": {"sort_index": tid}})
    doc = {"traceEvents": meta + result.trace_events, "displayTimeUnit": "ns"}
    Path(path).write_bytes(orjson.dumps(doc))
