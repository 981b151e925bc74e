"""Graph passes, each Graph -> Graph, as rule tables (STYLE.md items 2 and 3).

`canonicalise` runs `PASSES` in order, each to its own fixed point: BATCHNORM folds a per-channel
MUL and ADD into the convolution before them, CONVOLUTION expands the sliding-window ops in forms
the lowering does not take (NCHW, grouped, a mean over the inputs alone) into the ones it does,
LAYOUT sinks the TRANSPOSEs that NCHW leaves until they cancel (and BATCHNORM folds what then
meets its convolution), so fusion sees each convolution followed by its activation, and VIEWS
makes a RESHAPE of each TRANSPOSE left that moves dims of 1 alone. DECOMPOSE turns the ops the
lowering does not take into primitives, then RECOGNISE turns chains of primitives into the row
ops and activations they spell, and CONTRACTION folds a TRANSPOSE into the contraction that
loads it. `split_long_rows` runs after them (`compile.graph_passes`), since it needs the target:
it takes apart the row ops whose rows do not fit a tile of it.
"""

from __future__ import annotations

from dfx import Graph

from .batchnorm import BATCHNORM
from .contraction import CONTRACTION
from .convolution import CONVOLUTION
from .decompose import DECOMPOSE
from .layout import LAYOUT, VIEWS
from .long_rows import split_long_rows
from .recognise import FUSING_RULES, RECOGNISE
from .rewrite import Match, Pat, Rule, rewrite

# the graph passes, by stage name
PASSES: list[tuple[str, list[Rule]]] = [
    ("batchnorm", BATCHNORM),  # a convolution's per-channel MUL and ADD (inference batchnorm) -> its weights and bias
    ("convolution", CONVOLUTION),  # NCHW, grouped and pad-excluding window ops -> the forms the lowering takes
    # TRANSPOSEs sunk below the ops that do not care about layout until they cancel, those of
    # constants folded; a per-channel MUL or ADD that sank onto its convolution folds into it
    ("layout", LAYOUT + BATCHNORM),
    ("views", VIEWS),  # a TRANSPOSE left moving dims of 1 alone -> a RESHAPE (no data moves); RESHAPEs merged
    ("decompose", DECOMPOSE),  # ops the lowering does not take -> primitives
    ("recognise", RECOGNISE),  # chains of primitives -> the row ops and activations they spell
    ("contraction", CONTRACTION),  # a TRANSPOSE feeding a MATMUL's B -> its transposed load
]


def canonicalise(graph: Graph, warnings: list[str], fuse: bool = True) -> Graph:
    """`graph` after every pass, as a new graph; why a chain stays as ops goes to `warnings`.
    Without `fuse` the chains that spell one op (softmax, layer norm, GELU) stay their ops, each
    its own kernel: the program --no-fusion compares fusion against."""
    for _, rules in PASSES:
        if not fuse:
            rules = [rule for rule in rules if rule not in FUSING_RULES]
        graph = rewrite(graph, rules, warnings)
    return graph


__all__ = ["CONTRACTION", "CONVOLUTION", "DECOMPOSE", "LAYOUT", "PASSES", "RECOGNISE", "VIEWS", "Match", "Pat", "Rule",
           "canonicalise", "rewrite", "split_long_rows"]
