"""Frontend for XLA HLO text (`.hlo`): an HloModule as XLA and JAX print it. Three stages, each
its own module: `hlo_text` reads the text into computations of instructions (syntax only),
`hlo_build` walks the entry computation and makes the graph, asking `hlo_ops`, the op table,
what each opcode is in registry ops.

Graph. The entry's parameters are the graph's inputs, named as their instructions without `%`
(`Arg_0.1`); its ROOT is the output, under the ROOT's name (a tuple ROOT: one output per element,
`<root>.0`, `<root>.1`, ..., nested tuples `<root>.1.0`). `fusion` (`calls=`) and `call`
(`to_apply=`) computations are inlined, their tensors named `<caller>.<name>`, up to MAX_INLINED
instructions in all (counted before inlining); a `reduce`'s `to_apply` computation must be one
add, multiply, maximum or minimum (or, and for pred) of its two parameters. `constant` and
`iota` become graph constants with their values, so `--check` runs on them. An op whose operands
are all constants is folded into a constant with the registry's reference (a RESHAPE of any size,
the rest up to FOLD_LIMIT elements), so `convert(constant(8))` is the number 8 to the passes that
look for it.

HLO's `broadcast` is not materialised: its operand is RESHAPEd (or TRANSPOSEd) to the result's
rank with size-1 dims and the map ops that read it broadcast as numpy does. Such a value carries
its HLO shape beside its tensor's; an op that needs the whole tensor (a layout op, a contraction,
a reduction, a graph output) gets it made by a MUL with ones over the broadcast dims. Layout
helpers compose (a RESHAPE of a RESHAPE reads the first one's operand, a TRANSPOSE of a TRANSPOSE
composes the permutations), identical ops are made once, and ops no output needs are dropped.

Mapping (to the registry's names; the tables in `hlo_ops`): elementwise ops one to one; `compare` to EQUAL /
LESS / ..., NE as 1 - EQUAL; `dot` to TRANSPOSE and RESHAPE of each operand into [batch..., M, K]
and [batch..., K, N], a MATMUL and a RESHAPE to the HLO result; `convolution` with two spatial
dims to CONV2D NHWC/OHWI between TRANSPOSEs; `reduce` to REDUCE_* with keepdims false, then the
init value combined in unless it is the reduction's identity; `slice` to SLICE (and GATHER along
a strided dim); `pad` to PAD (SLICE first for negative padding); `convert` to CAST (to pred:
x != 0). pred is held as u8 0/1, as the `.dfg` frontend holds i1. Where HLO restates a type, the
declared one must be what the op makes: the operands' element type (SAME_ELEMENT; pred for
compare), and for the ops that make a whole tensor (WHOLE) its shape exactly. Errors are one line,
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
