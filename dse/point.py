"""One row of a sweep: a workload compiled for one point's machine, bound to it and simulated.

`evaluate(job, model)` is what a Dask worker runs (or the client itself, with --serial). It gets
all it needs in its arguments, the model's bytes and the point's config as a document, never a
path to open: a worker on another host needs the toolchain installed and nothing of the client's.
It runs what `kpu-kernel-compiler --target` and `kpu-loader --timing-only` run, in one process
and without files: read the config, parse and compile the model for that machine, read the
object back as the loader reads it, check that it fits, bind, simulate, summarise.

It never raises: a point that cannot be read, compiled, bound or run is a row with status
"failed" and a one-line reason, prefixed by the stage that refused it (`config`, `compile`, `fit`,
`bind`, `simulate`). A machine that was read still has its area in a failed row. A number that
comes out infinite or NaN (costs so large that a sum overflows a float) is no measurement: it is
left empty, and a row that has one is failed, naming it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterator

# What a row measures, after the point's key, its axes' values and the workload's name.
MEASURES = ("status", "reason", "cycles", "latency_s", "energy_pj", "area_mm2", "utilization", "dram_bytes",
            "macs", "compile_s", "bind_s", "simulate_s")
# wall-clock seconds: they differ run to run, the other columns never do
WALL_SECONDS = ("compile_s", "bind_s", "simulate_s")
# the measures that are numbers (None where unmeasured, never NaN or infinite), and a row's statuses
NUMBERS = MEASURES[2:]
STATUSES = ("ok", "failed")


@dataclass(frozen=True)
class Job:
    key: str  # the row's key in the results table
    workload: str  # the workload's name
    source: str  # the model's path as the spec gives it: its extension, and its name in messages
    config: dict[str, Any]  # the point's machine, a config document of either schema
    config_source: str  # the base config, naming the document in messages
    accelerator: str | None
    dataflow: str
    fusion: bool
    binder: str


def evaluate(job: Job, model: bytes) -> dict[str, Any]:
    """The row of `job`'s point on `model` (the workload file's bytes): MEASURES, None where unmeasured."""
    from dfx import ObjectFileError
    from hardware import ConfigError
    from kernel_compiler import CompileError
    from loader import BindError, LoadError

    row: dict[str, Any] = dict.fromkeys(MEASURES)
    stage = "config"
    try:
        for stage in _stages(job, model, row):  # each stage's name, before it runs
            pass
    except (ConfigError, CompileError, ObjectFileError, LoadError, BindError) as e:
        reason = str(e)
    except Exception as e:  # a fault of the toolchain on one point must not end the sweep: recorded, named
        reason = f"internal error: {type(e).__name__}: {e}"
    else:
        reason = None
    unmeasured = [c for c in NUMBERS if isinstance(row[c], float) and not math.isfinite(row[c])]
    if unmeasured and reason is None:
        stage = "config" if unmeasured == ["area_mm2"] else "simulate"
        reason = ", ".join(f"{c} came out {row[c]}" for c in unmeasured) + ", not a measurement"
    for c in unmeasured:
        row[c] = None
    if reason is None:
        row["status"] = "ok"
        return row
    row.update(status="failed", reason=" ".join(f"{stage}: {reason}".splitlines()))
    return row


def _stages(job: Job, model: bytes, row: dict[str, Any]) -> Iterator[str]:
    """Run the point, yielding each stage's name before it starts, and fill `row` as it goes."""
    from dfx import dumps, loads
    from hardware import machine_area, machine_from_dict
    from kernel_compiler import compile_graph, parse_graph, target_from_machine
    from loader import LoadError, RunResult, bind_program, binder_named, check_fits, simulate, summary

    yield "config"
    machine = machine_from_dict(job.config, job.config_source, job.accelerator)
    row["area_mm2"] = machine_area(machine)["total_mm2"]

    yield "compile"
    start = time.perf_counter()
    graph, _ = parse_graph(job.source, model)
    program = compile_graph(graph, job.source, target_from_machine(machine), job.dataflow, job.fusion, [])
    # read back as the loader reads a .kpu: an object it would refuse is not run here either
    program = loads(dumps(program), job.source)
    row["compile_s"] = round(time.perf_counter() - start, 3)

    yield "fit"
    check_fits(program, machine, job.source)

    yield "bind"
    start = time.perf_counter()
    # Bound afresh, without the loader's binding cache: its key hashes an object file, and this
    # program is compiled in memory and never written; each point is a machine of its own, so
    # only a rerun could find an entry, and a rerun skips the points it has; and workers on
    # other hosts would each fill their own home directory.
    bindings = bind_program(program, machine, job.source, binder_named(job.binder))
    row["bind_s"] = round(time.perf_counter() - start, 3)

    yield "simulate"
    start = time.perf_counter()
    try:
        result = RunResult(bindings, sim=simulate(program, machine, bindings))
    except ValueError as e:  # the simulator's last line of defence, worded as kpu-loader words it
        raise LoadError(f"{job.source}: cannot be simulated on '{machine.name}': {e}") from None
    row["simulate_s"] = round(time.perf_counter() - start, 3)
    s = summary(result, program, job.source, machine, {})
    row.update(cycles=s["cycles"], latency_s=s["seconds"], energy_pj=s["energy"]["total_pj"],
               utilization=s["utilization"], dram_bytes=s["dram_bytes"]["read"] + s["dram_bytes"]["write"],
               macs=s["macs"])

