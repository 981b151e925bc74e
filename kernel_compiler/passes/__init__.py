"""Graph passes, each Graph -> Graph, as rule tables (STYLE.md items 2 and 3).

`canonicalise` runs `PASSES` in order, each to its own fixed point: QUANTIZE turns a quantized
model's DEQUANTIZE -> op -> QUANTIZE islands into integer ops, and the DEQUANTIZEs of constants
it leaves fold into float values; SPELLING respells what XLA's
optimizer leaves (an op repeated with equal constants, `max(y, -inf)`), so no later pass sees two
copies of one value; BATCHNORM folds a per-channel
MUL and ADD into the convolution before them, CONVOLUTION expands the sliding-window ops in forms
the lowering does not take (NCHW, grouped, a mean over the inputs alone) into the ones it does,
LAYOUT sinks the TRANSPOSEs that NCHW leaves until they cancel (and BATCHNORM folds what then
meets its convolution), so fusion sees each convolution followed by its activation, and VIEWS
makes a RESHAPE of each TRANSPOSE left that moves dims of 1 alone. DECOMPOSE turns the ops the
lowering does not take into primitives, then RECOGNISE turns chains of primitives into the row
ops and activations they spell, CONTRACTION folds a TRANSPOSE into the contraction that
loads it and a per-channel gate on a convolution's input into its weights, EPILOGUE_VIEWS
sinks a RESHAPE of a contraction's or a window op's result below the map ops that read it (its
epilogue reads through the view) and makes a product of a flattened image of one position its
1x1 convolution, and OPERANDS gives a MATMUL that reads one tensor as two operands a view of
it as the second. `global_pools`, `products_by_rows` and `split_long_rows` run after
them (`compile.graph_passes`), since they need the target: the first makes a sum or a mean over
H and W of an image the window op over all of it where one fits, the second a batch of products
by one B one product of more rows where that costs less, the third takes apart the row ops
whose rows do not fit a tile of it.
"""

from __future__ import annotations

from dfx import Graph

from .batchnorm import BATCHNORM
from .contraction import CONTRACTION, OPERANDS, products_by_rows
from .convolution import CONVOLUTION
from .decompose import DECOMPOSE
from .layout import EPILOGUE_VIEWS, LAYOUT, VIEWS
from .long_rows import split_long_rows
from .quantize import FOLD_DEQUANTIZED, QUANTIZE
from .recognise import FUSING_RULES, RECOGNISE, SPELLING_RULES, global_pools
from .rewrite import Match, Pat, Rule, rewrite

# the graph passes, by stage name
PASSES: list[tuple[str, list[Rule]]] = [
    ("quantize", QUANTIZE),  # DEQUANTIZE -> conv|matmul -> QUANTIZE -> the integer op and REQUANTIZE; DQ sunk, Q(DQ) gone
    ("fold dequantized", FOLD_DEQUANTIZED),  # a DEQUANTIZE of constants no integer op took -> its float value
    ("spelling", SPELLING_RULES),  # an op equal to an earlier one -> its result; max(y, -inf) -> y; 1 / y -> RECIPROCAL
    ("batchnorm", BATCHNORM),  # a convolution's per-channel MUL and ADD (inference batchnorm) -> its weights and bias
    ("convolution", CONVOLUTION),  # NCHW, grouped and pad-excluding window ops -> the forms the lowering takes
    # TRANSPOSEs sunk below the ops that do not care about layout until they cancel, those of
    # constants folded; a per-channel MUL or ADD that sank onto its convolution folds into it
    ("layout", LAYOUT + BATCHNORM),
    ("views", VIEWS),  # a TRANSPOSE left moving dims of 1 alone -> a RESHAPE (no data moves); RESHAPEs merged
    ("decompose", DECOMPOSE),  # ops the lowering does not take -> primitives
    ("recognise", RECOGNISE),  # chains of primitives -> the row ops and activations they spell
    # a TRANSPOSE feeding a MATMUL's B -> its transposed load; one of a CONV2D's weights -> their
    # weight_layout; conv(x * gate, w) -> conv(x, w * gate)
    ("contraction", CONTRACTION),
    # map(RESHAPE(a contraction's or window op's result), c) -> RESHAPE(map(the result, c regrouped));
    # MATMUL(RESHAPE(x [1, 1, 1, K]), w^T) -> RESHAPE(CONV2D(x, w as [N, 1, 1, K]))
    ("epilogue views", EPILOGUE_VIEWS),
    ("operands", OPERANDS),  # MATMUL(x, x) -> MATMUL(x, RESHAPE(x)), a view: each operand its own tile
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


__all__ = ["CONTRACTION", "CONVOLUTION", "DECOMPOSE", "EPILOGUE_VIEWS", "LAYOUT", "OPERANDS", "PASSES", "RECOGNISE", "VIEWS", "Match",
           "Pat", "Rule", "canonicalise", "global_pools", "products_by_rows", "rewrite", "split_long_rows"]
