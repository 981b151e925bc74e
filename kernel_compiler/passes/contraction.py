"""CONTRACTION: a TRANSPOSE feeding a contraction, read by it alone, becomes the way the
contraction loads that operand (the BlockMover transposes each tile on its L3 -> L2 move), not a
kernel of its own that writes the transposed tensor to external memory and reads it back.

MATMUL takes its B transposed (`transpose_b`: B given as [..., N, K]), so a TRANSPOSE that swaps
B's last two dims, and only them, folds into it. A TRANSPOSE of A, or one that also moves batch
dims, stays: the registry's MATMUL has no transposed A.

CONV2D takes its weights in any order of their dims (`weight_layout`), so any TRANSPOSE of them
folds into it: the weights JAX passes as parameters (HWIO, transposed to OHWI by the frontend),
an ONNX model's OIHW ones given as inputs. Those of constants were folded at compile time by
LAYOUT before this stage, into the order the array reads without a permutation.

A convolution of an image scaled per channel (`conv(x * s, w)`, s one value per input channel:
squeeze-and-excitation's gate before the block's projection in EfficientNet and MobileNet v3)
scales its weights instead (`conv(x, w * s)`): where the image holds more elements than the
weights, its scaling is a kernel that reads and writes the whole image, that of the weights a
few; the products are the same, summed in another order (as BATCHNORM's folding does).

BATCH ROWS (`products_by_rows`, which needs the target: `compile.graph_passes` runs it after
`canonicalise`): a MATMUL of A [..., M, K] with batch dims by one B [K, N] for all of them (or
[1, .., K, N]: a layer's weights; a Linear on a [1, H, W, C] image, as Swin's and ConvNeXt's
MLPs export) becomes one product of A viewed as [.. * M, K] where that kernel costs less by the
target's objective (`pays`): tiled by batch element, all of a B larger than L3 crosses external
memory once per element (Swin-T's last stage, 49 tokens in 7 batches of 7: each 9.4 MB weight
matrix read 7 times), and each element's few rows use few of the array's; a small B stays on
chip and the batch's elements go to the compute tiles in parallel, where one product of as many
rows might be a single tile. The views are RESHAPEs (no data moves); EPILOGUE_VIEWS then sinks
the result's below the epilogue, so a bias and a residual of the whole result still fuse. One
that runs along the batch dims but not every row (a position embedding [1, S, C]) would not:
such a product stays a batch.

OPERANDS, the last stage: a MATMUL reading one tensor as two of its operands (x @ x, or x @ x^T
once the TRANSPOSE folded) reads the second through a RESHAPE to its own shape, a view: its
kernel holds A's tiles and B's, which differ, as tiles of two tensors, where one tensor may have
one tile at a level. Last, since RESHAPES would take the view back out.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

from dfx import Graph, Op, is_integer, lookup
from dfx.ops.layout import transpose_perms
from dfx.ops.window import weight_layout

from .layout import EPILOGUE_VIEWS, MAPS, _ancestor
from .rewrite import Match, Pat, Rule, rewrite


def _transposed_b(m: Match) -> Op | None:
    if lookup("MATMUL").normalize_attrs(m.root.attrs)["transpose_b"]:
        return None  # B^T given transposed again: a plain B, which the TRANSPOSE's kernel may as well make
    rank = len(m.shape("b"))
    if rank < 2 or transpose_perms(rank, m.attrs("bt")["perms"]) != [*range(rank - 2), rank - 1, rank - 2]:
        return None
    rest = [m["cin"]] if "cin" in m else []
    return m.replace("MATMUL", m["a"], m["b"], *rest, transpose_b=True)


def _batch_by_rows(pays: Callable[[Graph, Op, Op], bool], m: Match) -> Op | None:
    a, b = m.shape("a"), m.shape("b")
    out = m.graph.tensors[m.root.outputs[0]]
    if math.prod(b[:-2]) != 1 or math.prod(a[:-2]) == 1 or not _regroups(m, m.root.outputs[0]):
        return None
    flat = [math.prod(a[:-1]), out.shape[-1]]  # the result's shape as one product
    cin = m.shape("cin") if "cin" in m else None
    if cin is not None and cin != out.shape and math.prod(cin[:-1]) != 1:
        return None  # a Cin that runs along some of the dims of the rows but not all: no view of it does
    product = [m.op("rows", "RESHAPE", m["a"], new_shape=[flat[0], a[-1]]),
               m["b"] if len(b) == 2 else m.op("matrix", "RESHAPE", m["b"], new_shape=list(b[-2:]))]
    if cin == out.shape:  # the partial sums of each element
        product.append(m.op("cin_rows", "RESHAPE", m["cin"], new_shape=flat))
    elif cin is not None:  # one along N (a bias) or a single value, for every row alike
        product.append(m["cin"] if len(cin) <= 2 else m.op("cin_rows", "RESHAPE", m["cin"], new_shape=[cin[-1]]))
    m.op("product", "MATMUL", *product, result_dtype=out.dtype, **m.root.attrs)
    if not pays(m.graph, m.root, m.added[-1]):
        return None
    return m.replace("RESHAPE", m.added[-1].outputs[0], new_shape=list(out.shape))


def _regroups(m: Match, result: str) -> bool:
    """Whether the map ops an epilogue would take after `result` (each the one reader of the one
    before) read, beside it, only operands EPILOGUE_VIEWS regroups onto the product's rows: one
    along the last dim alone (a bias), or one of the whole result computed before it (a residual)."""
    shape = m.graph.tensors[result].shape
    while len(readers := m.readers(result)) == 1 and readers[0].op_type in MAPS:
        for t in readers[0].inputs:
            other = m.graph.tensors[t].shape
            if t != result and math.prod(other[:-1]) != 1 and (other != shape or not _ancestor(m, t, result)):
                return False
        result = readers[0].outputs[0]
        shape = m.graph.tensors[result].shape
    return True


def products_by_rows(graph: Graph, pays: Callable[[Graph, Op, Op], bool], warnings: list[str]) -> Graph:
    """BATCH ROWS, then where it made a product of rows, EPILOGUE_VIEWS and OPERANDS again (whose
    views of a MATMUL's second operand EPILOGUE_VIEWS takes back out): `pays(graph, batched, flat)`
    says whether the one product costs less than the batch (both MATMULs in `graph`)."""
    rule = functools.partial(_batch_by_rows, pays)
    rows = rewrite(graph, [(Pat("MATMUL", _a, Pat(name="b")), rule),
                           (Pat("MATMUL", _a, Pat(name="b"), Pat(name="cin")), rule)], warnings)
    if rows.ops == graph.ops:
        return graph
    return rewrite(rewrite(rows, EPILOGUE_VIEWS, warnings), OPERANDS, warnings)


def _scaled_weights(m: Match) -> Op | None:
    attrs = m.attrs("conv")
    y, w, gate = (m.graph.tensors[t] for t in (m.root.inputs[0], m["w"], m["s"]))
    channels = y.shape[-1]
    if (m.shape("x") != y.shape or gate.shape[-1:] != (channels,) or math.prod(gate.shape[:-1]) != 1
            or attrs["groups"] != 1 or attrs["layout"] != "NHWC"):
        return None  # no gate on the input channels, or weights that do not each take all of them
    if attrs["pad_value"] != 0 or is_integer(y.dtype) or len({y.dtype, w.dtype, gate.dtype}) != 1:
        return None  # a padding the gate would scale too; integers or mixed dtypes: no other order of the products
    if y.size <= w.size or (len(m.readers(m["x"])) == 1 and m.computing(m["x"]) is not None):
        return None  # the weights are the larger, or the MUL is free in the epilogue of the image's producer
    along = [1] * 4  # the gate along the weights' input channels
    along[weight_layout(attrs).index("I")] = channels
    broadcasts = along[len(along) - len(gate.shape):] == list(gate.shape)
    s = m["s"] if broadcasts else m.op("per_input", "RESHAPE", m["s"], new_shape=along)
    scaled = m.op("scaled", "MUL", m["w"], s)
    return m.replace("CONV2D", m["x"], scaled, *m.root.inputs[2:], **m.root.attrs)


def _weights_as_given(m: Match) -> Op:
    # dim j of the weights the convolution reads is w's dim perms[j]: it names that dim of w so
    layout = weight_layout(m.attrs("conv"))
    given = [""] * 4
    for j, p in enumerate(transpose_perms(4, m.attrs("wt")["perms"])):
        given[p] = layout[j]
    return m.replace("CONV2D", m["x"], m["w"], *m.root.inputs[2:],
                     **{**m.root.attrs, "weight_layout": "".join(given)})


def _operand_viewed(m: Match) -> Op | None:
    seen: set[str] = set()
    inputs = []
    for t in m.root.inputs:
        inputs.append(m.op("operand", "RESHAPE", t, new_shape=list(m.graph.tensors[t].shape)) if t in seen else t)
        seen.add(t)
    return m.replace("MATMUL", *inputs, **m.root.attrs) if m.made else None


_a, _bt = Pat(name="a"), Pat("TRANSPOSE", Pat(name="b"), name="bt")
_x, _wt = Pat(name="x"), Pat("TRANSPOSE", Pat(name="w"), name="wt")
_gated = Pat("MUL", Pat(name="x"), Pat(name="s"))  # either way round: MUL is commutative

CONTRACTION: list[Rule] = [
    (Pat("MATMUL", _a, _bt), _transposed_b),  # A @ transpose(B) -> MATMUL(A, B){transpose_b}
    (Pat("MATMUL", _a, _bt, Pat(name="cin")), _transposed_b),  # A @ transpose(B) + Cin -> the same with Cin
    (Pat("CONV2D", _x, _wt, name="conv"), _weights_as_given),  # conv(x, transpose(w)) -> CONV2D(x, w){weight_layout}
    (Pat("CONV2D", _x, _wt, Pat(name="bias"), name="conv"), _weights_as_given),  # the same with a bias
    # after those, so weights given transposed are read so before the gate scales them
    (Pat("CONV2D", _gated, Pat(name="w"), name="conv"), _scaled_weights),  # conv(x * s, w) -> conv(x, w * s)
    (Pat("CONV2D", _gated, Pat(name="w"), Pat(name="bias"), name="conv"), _scaled_weights),  # the same with a bias
]

OPERANDS: list[Rule] = [
    (Pat("MATMUL"), _operand_viewed),  # MATMUL(x, x) -> MATMUL(x, RESHAPE(x)): two tensors, two tiles
]
