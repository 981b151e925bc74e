"""The example design-space sweep (`examples/sweep.yaml`) run twice by `kpu-dse`: on a local Dask
cluster of two worker processes and serially in one process. Writes the sweep's size, both wall
times and the speed-up, whether the two gave the same rows, and each workload's Pareto frontier
to the "Design-space exploration" section of RESULTS.md, and the cluster run's plot to
docs/pareto.png and docs/pareto.svg (the README shows the PNG).

    .venv/bin/python benchmarks/sweep.py
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
import tempfile
from pathlib import Path

from results import machine, measure, today, write_section

from dse import OBJECTIVES, frontier, read_spec
from dse.point import WALL_SECONDS

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "sweep.yaml"
DSE = str(Path(sys.executable).parent / "kpu-dse")
SECTION = "Design-space exploration"


def rows(outdir: Path) -> list[dict[str, str]]:
    with open(outdir / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def frontier_table(table: list[dict[str, str]], axes: list[str], objectives: tuple[str, ...], workload: str) -> str:
    """The workload's frontier over the spec's objectives, as markdown, by its first objective."""
    ok = [r for r in table if r["workload"] == workload and r["status"] == "ok"]
    vectors = [[float(r[OBJECTIVES[o][0]]) for o in objectives] for r in ok]
    front = sorted((ok[i] for i in frontier(vectors, [OBJECTIVES[o][1] for o in objectives])),
                   key=lambda r: float(r[OBJECTIVES[objectives[0]][0]]))
    head = [*axes, "cycles", *(f"{o} ({OBJECTIVES[o][2]})" for o in objectives if o != "cycles")]
    lines = [f"| {' | '.join(head)} |", "|" + "---|" * len(axes) + "---:|" * (len(head) - len(axes))]
    for r in front:
        shown = [f"{float(r[OBJECTIVES[o][0]]) * OBJECTIVES[o][3]:.4g}" for o in objectives if o != "cycles"]
        lines.append(f"| {' | '.join(r[a] for a in axes)} | {int(r['cycles']):,} | {' | '.join(shown)} |")
    return f"{workload}: {len(front)} of {len(ok)} points on the frontier\n\n" + "\n".join(lines)


def main() -> None:
    spec = read_spec(str(SPEC))
    axes = [a.name for a in spec.axes]
    work = Path(tempfile.mkdtemp(prefix="kpu-dse-bench-"))
    try:
        start_load = os.getloadavg()[0]
        cluster_s, _ = measure([DSE, str(SPEC), "-o", str(work / "cluster"), "--workers", "2"])
        serial_s, _ = measure([DSE, str(SPEC), "-o", str(work / "serial"), "--serial"])
        end_load = os.getloadavg()[0]
        cluster, serial = rows(work / "cluster"), rows(work / "serial")

        def kept(table):
            return [{k: v for k, v in r.items() if k not in WALL_SECONDS} for r in table]

        same = "the same rows, row for row (wall-time columns aside)" if kept(cluster) == kept(serial) else \
            "DIFFERENT rows"
        failed = sum(r["status"] != "ok" for r in cluster)
        for suffix in ("png", "svg"):
            shutil.copyfile(work / "cluster" / f"pareto.{suffix}", ROOT / "docs" / f"pareto.{suffix}")
        points = len(cluster) // len(spec.workloads)
        tables = "\n\n".join(frontier_table(cluster, axes, spec.objectives, w.name) for w in spec.workloads)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    text = f"""Machine: {machine()}, 1-minute load average {start_load:.1f} at the start and {end_load:.1f} at the end.
Date: {today()}.
Reproduce: `.venv/bin/python benchmarks/sweep.py`.

`examples/sweep.yaml`: {len(spec.axes)} axes ({', '.join(axes)}) on `{spec.base}`, {points} points
x {len(spec.workloads)} workloads ({', '.join(w.name for w in spec.workloads)}) = {len(cluster)} rows,
{failed} failed. Each row compiles the workload for that point's machine and simulates it timing-only
(CP-SAT binder, no binding cache). Wall time of the whole command, Dask's start-up and shutdown included:

| engine | wall s |
|---|---:|
| `kpu-dse ... --workers 2` (a local Dask cluster, two worker processes) | {cluster_s:.1f} |
| `kpu-dse ... --serial` (one process, no Dask) | {serial_s:.1f} |
| speed-up | {serial_s / cluster_s:.2f}x |

The two runs gave {same}. Pareto frontiers over {', '.join(spec.objectives)}, by {spec.objectives[0]}:

{tables}

The plot of the cluster run (first two objectives; frontier in red): `docs/pareto.png`, `docs/pareto.svg`."""
    write_section(SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
