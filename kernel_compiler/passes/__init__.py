"""Graph passes, each Graph -> Graph, as rule tables (STYLE.md items 2 and 3).

`canonicalise` runs `PASSES` in order, each to its own fixed point (so `--dump STAGE` can show
the graph after either): DECOMPOSE turns the ops the lowering does not take into primitives,
then RECOGNISE turns chains of primitives into the row ops and activations they spell.
"""

from __future__ import annotations

from dfx import Graph

from .decompose import DECOMPOSE
from .recognise import RECOGNISE
from .rewrite import Match, Pat, Rule, rewrite

# the graph passes, by stage name
PASSES: list[tuple[str, list[Rule]]] = [
    ("decompose", DECOMPOSE),  # ops the lowering does not take -> primitives
    ("recognise", RECOGNISE),  # chains of primitives -> the row ops and activations they spell
]
# the compiler's stages in order, each a graph or program `--dump STAGE` can print
STAGES = ["parse", "infer", *(name for name, _ in PASSES), "fuse", "lower"]


def canonicalise(graph: Graph, warnings: list[str]) -> Graph:
    """`graph` after every pass, as a new graph; why a chain stays as ops goes to `warnings`."""
    for _, rules in PASSES:
        graph = rewrite(graph, rules, warnings)
    return graph


__all__ = ["DECOMPOSE", "PASSES", "RECOGNISE", "STAGES", "Match", "Pat", "Rule", "canonicalise", "rewrite"]
