"""Frontend for XLA HLO text (`.hlo`): an HloModule as XLA and JAX print it. Three stages, each
its own module: `hlo_text` reads the text into computations of instructions (syntax only),
`hlo_build` walks the entry computation and makes the graph, asking `hlo_ops`, the op table,
what each opcode is in registry ops.

Graph. The entry's parameters are the graph's inputs, named as their instructions without `%`
(`Arg_0.1`); its ROOT is the output, under the ROOT's name (a tuple ROOT: one output per element,
`<root>.0`, `<root>.1`, ..., nested tuples `<root>.1.0`). `fusion` (`calls=`, of any `kind=`)
and `call` (`to_apply=`) computations are inlined, their tensors named `<caller>.<name>`, up to
MAX_INLINED instructions in all (counted before inlining); a `reduce`'s `to_apply` computation must
be one add, multiply, maximum or minimum (or, and for pred) of its two parameters. `constant` and
`iota` become graph constants with their values, so `--check` runs on them. An op whose operands are
all constants is folded into a constant with the registry's reference (a RESHAPE of any size, the
rest up to FOLD_LIMIT elements), so `convert(constant(8))` is the number 8 to the passes that look
for it.

HLO's `broadcast` is not materialised: its operand is RESHAPEd (or TRANSPOSEd) to the result's
rank with size-1 dims and the map ops that read it broadcast as numpy does. Such a value carries
its HLO shape beside its tensor's; an op that needs the whole tensor (a layout op, a contraction,
a reduction, a graph output) gets it made by a MUL with ones over the broadcast dims. Layout
helpers compose (a RESHAPE of a RESHAPE reads the first one's operand, a TRANSPOSE of a TRANSPOSE
composes the permutations), identical ops are made once, and ops no output needs are dropped.

Mapping (to the registry's names; the tables in `hlo_ops`): elementwise ops one to one
(`exponential-minus-one` EXPM1, `log-plus-one` LOG1P, `cbrt`, `atan2`, `sign`, `floor`, `ceil`,
`round-nearest-even` ROUND, `round-nearest-afz` ROUND halves away_from_zero, `remainder` MOD
fmod, `is-finite` IS_FINITE; `and` / `or` / `xor` / `not` the LOGICAL_* ops on pred, BITWISE_* on
integers; shifts, `popcnt` and `count-leading-zeros` are refused); `compare` to EQUAL / LESS /
..., NE as 1 - EQUAL, its `type=` the operands' order (TOTALORDER read as it: on floats they
differ only at -0 against +0 and at NaNs); `dot` to TRANSPOSE and RESHAPE of each operand into
[batch..., M, K] and [batch..., K, N], a MATMUL and a RESHAPE to the HLO result; `convolution`
to CONV2D NHWC/OHWI between TRANSPOSEs from any `dim_labels` (one spatial dim: a height of 1 put
in front), `feature_group_count` its groups, `batch_group_count` 1 only, `rhs_reversal` a GATHER
of the kernel reversed, `lhs_dilate` (a transposed convolution) the input spread by zeros and a
negative `pad` a SLICE first, as the ONNX ConvTranspose (`dilated.py`); `reverse` a GATHER per
dim; `dynamic-slice` a SLICE at the starts known when compiling and a GATHER of the positions
from each start computed at run time; `dynamic-update-slice` the update spread to the operand's
shape (PAD at a known start, a runtime GATHER of the clamped entries at a computed one) and a
SELECT with a u8 mask of the box; `gather` with one indexed dim and no batching dims a GATHER
along it (the ids of an embedding lookup read at run time, constant indices its attribute), any
other (batching dims, several indexed dims) a GATHER of rows of the operand viewed [rows, the
trailing dims every slice takes whole] at row numbers computed in i32, the dims then put where
`offset_dims` says. Every start index is clamped so its slice fits, as XLA does (MAXIMUM and
MINIMUM in i32 on a runtime one); `scatter` is refused. `reduce` to REDUCE_* with keepdims
false, then the init value combined in unless it
is the reduction's identity; a `reduce` of two operands, (x, iota) as jnp.argmax and argmin
write it, to REDUCE_MAX / MIN and ARGMAX / ARGMIN, its comparator recognised by running it on
every order of two values (NaN among them) and two positions (the tie rule gives
select_last_index); `reduce-window` of max, add or min over at most two window
dims to MAXPOOL2D, SUMPOOL2D or NEGATE(MAXPOOL2D(NEGATE)), those dims H and W (1-D: an H of
one), the first other dim N and the rest C (TRANSPOSEd there and back where they are not in
that order), window dilation the pool's, base dilation refused; a SUMPOOL2D (through views)
divided by its windows' sizes, or multiplied by their reciprocals (XLA's rewrite), is one
AVGPOOL2D, counting the padding or not as the sizes say (Flax's avg_pool); `slice` to SLICE (and
GATHER along a strided dim); `pad` to PAD (SLICE first for negative padding); `convert` to CAST
(to pred: x != 0); `bitcast` to RESHAPE when both layouts lay the elements out row-major (dims of 1
aside; any other bitcast refused), `copy` (to any layout) and `opt-barrier` to their operand;
`while` unrolled: its condition inlined on the loop's state must fold to a constant (an induction
variable starting, stepping and stopping at constants), and while it is true the body is inlined,
`<while>.<trip>.<name>`, up to MAX_TRIP_COUNT trips, each counted toward MAX_INLINED; `conditional`
on a constant predicate or branch index (out of range: the last branch) to the branch it takes,
inlined; `custom-call` with target `Sharding` (a placement hint) to its operand, any other target
refused by name (XLA's CPU backend prints matmuls and convolutions as `kind=kCustom` fusions, which
are inlined as every fusion kind is). A loop or conditional whose path depends on an input is
refused. pred is held as u8 0/1, as the `.dfg` frontend holds i1. Where HLO restates a type, the
declared one must be what the op makes: the operands' element type (SAME_ELEMENT; pred for compare),
and for the ops that make a whole tensor (WHOLE) its shape exactly. Errors are one line,
"<file>:<line>: <reason>", the line the instruction (or the token) is on.
"""

from __future__ import annotations

from dfx.graph import Graph

from . import hlo_ops
from .hlo_build import Builder
from .hlo_text import read_module


def parse_hlo(path: str, text: str) -> tuple[Graph, list[str]]:
    """Parse an HLO text module (the file `path`, which names it in messages) into a graph and warning lines."""
    warnings: list[str] = []
    graph = Builder(path, read_module(path, text), warnings, hlo_ops).build()
    return graph, warnings
