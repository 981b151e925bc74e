"""What a finished sweep shows: each workload's Pareto frontier as a table, and the plot's panels.

Both read the rows of the spec's points from the results table, as text, the same whether a row
was evaluated by this run or an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pareto import frontier
from .plot import Panel
from .point import Job
from .spec import OBJECTIVES, Point, Spec


@dataclass(frozen=True)
class Outcomes:
    """One workload's points that ran: each one's axis labels and objectives (None: not measured)."""

    workload: str
    labels: list[tuple[str, ...]]  # per point, one per axis
    values: list[dict[str, float | None]]  # per point, by objective name
    failed: int

    def front(self, objectives: tuple[str, ...]) -> list[int]:
        """The frontier over `objectives` of the points that have them all."""
        measured = [i for i, v in enumerate(self.values) if all(v[o] is not None for o in objectives)]
        vectors = [[self.values[i][o] for o in objectives] for i in measured]
        return [measured[j] for j in frontier(vectors, [OBJECTIVES[o][1] for o in objectives])]


def outcomes(spec: Spec, jobs: list[tuple[Point, Job]], rows: dict[str, dict[str, str]]) -> list[Outcomes]:
    """Per workload, in the spec's order, what its rows in `rows` (cells by column) measured."""
    found = {w.name: Outcomes(w.name, [], [], 0) for w in spec.workloads}
    failed = dict.fromkeys(found, 0)
    for point, job in jobs:
        row = rows.get(job.key)
        if row is None:  # lost with its worker: a rerun evaluates it
            continue
        if row["status"] != "ok":
            failed[job.workload] += 1
            continue
        found[job.workload].labels.append(tuple(a.shown(v) for a, v in zip(spec.axes, point.values)))
        found[job.workload].values.append({name: float(row[column]) if row[column] else None
                                           for name, (column, *_) in OBJECTIVES.items()})
    return [Outcomes(o.workload, o.labels, o.values, failed[o.workload]) for o in found.values()]


def panels(results: list[Outcomes], x: str, y: str, objectives: tuple[str, ...]) -> list[Panel]:
    """The plot's panels: the points that have both objectives, those on the frontier over the
    spec's `objectives` ringed where those are more than x and y."""
    out = []
    for o in results:
        shown = [i for i, v in enumerate(o.values) if v[x] is not None and v[y] is not None]
        front = set(o.front(objectives)) if set(objectives) - {x, y} else set()
        out.append(Panel(o.workload, [o.values[i][x] for i in shown], [o.values[i][y] for i in shown],
                         [", ".join(o.labels[i]) for i in shown], o.failed, [i in front for i in shown],
                         ", ".join(objectives)))
    return out


def frontier_tables(spec: Spec, results: list[Outcomes]) -> list:
    """One rich table per workload: its frontier over the spec's objectives, best first in the first."""
    from rich.table import Table
    from rich.markup import escape

    tables = []
    first = spec.objectives[0]
    for o in results:
        front = sorted(o.front(spec.objectives),
                       key=lambda i: o.values[i][first] * (-1 if OBJECTIVES[first][1] else 1))
        table = Table(title=f"{escape(o.workload)}: Pareto frontier over {', '.join(spec.objectives)} "
                            f"({len(front)} of {len(o.values)} points that ran"
                            + (f"; {o.failed} failed)" if o.failed else ")"), title_justify="left")
        for axis in spec.axes:
            table.add_column(axis.name)
        for name, (_, _, unit, _) in OBJECTIVES.items():
            table.add_column(f"{name} ({unit})" if name != "cycles" else name, justify="right",
                             style="bold" if name in spec.objectives else None)
        for i in front:
            table.add_row(*map(escape, o.labels[i]), *(_shown(name, o.values[i][name]) for name in OBJECTIVES))
        tables.append(table)
    return tables


def _shown(objective: str, value: float | None) -> str:
    if value is None:
        return "-"
    if objective == "cycles":
        return f"{int(value):,}"
    return f"{value * OBJECTIVES[objective][3]:.4g}"
