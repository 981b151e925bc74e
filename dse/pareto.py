"""The Pareto frontier: the points no other point beats on every objective at once.

Point a dominates point b when a is at least as good as b in every objective and better in at
least one (smaller, or larger for an objective to maximise). The frontier is the points nothing
dominates; two points with equal objectives do not dominate each other, so both stay.
"""

from __future__ import annotations

from typing import Sequence


def frontier(vectors: Sequence[Sequence[float]], maximise: Sequence[bool]) -> list[int]:
    """The indices of the non-dominated `vectors` (each one value per objective), ascending."""
    # each objective turned into one to minimise
    costs = [tuple(-v if up else v for v, up in zip(vector, maximise)) for vector in vectors]
    # In lexicographic order a point can be dominated only by points before it (a dominating
    # point is no worse in the first objective, and if equal there, no worse in the next...),
    # and a dominated point's dominator is dominated by, or is, a frontier point: so each point
    # need only be compared with the frontier found so far.
    kept: list[int] = []
    for i in sorted(range(len(costs)), key=lambda i: costs[i]):
        if not any(_dominates(costs[j], costs[i]) for j in kept):
            kept.append(i)
    return sorted(kept)


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and a != b
