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

A MATMUL of A [..., M, K] with batch dims by one B [K, N] (a layer's weights, shared by all of
them: a Linear on a [1, H, W, C] image, as Swin's and ConvNeXt's MLPs are exported) becomes one
product of A viewed as [.. * M, K]: its kernel tiled by batch element would read all of B once
per element (Swin-T's last stage, 49 tokens in 7 batches of 7: each 9.4 MB weight matrix read
7 times). The views of A and of the result are RESHAPEs (no data moves); EPILOGUE_VIEWS then
sinks the result's below the epilogue, so the bias, the activation and the residual still fuse.

OPERANDS, the last stage: a MATMUL reading one tensor as two of its operands (x @ x, or x @ x^T
once the TRANSPOSE folded) reads the second through a RESHAPE to its own shape, a view: its
kernel holds A's tiles and B's, which differ, as tiles of two tensors, where one tensor may have
one tile at a level. Last, since RESHAPES would take the view back out.
"""

from __future__ import annotations

import math

from dfx import Op, lookup
from dfx.ops.layout import transpose_perms
from dfx.ops.window import weight_layout

from .rewrite import Match, Pat, Rule


def _transposed_b(m: Match) -> Op | None:
    if lookup("MATMUL").normalize_attrs(m.root.attrs)["transpose_b"]:
        return None  # B^T given transposed again: a plain B, which the TRANSPOSE's kernel may as well make
    rank = len(m.shape("b"))
    if rank < 2 or transpose_perms(rank, m.attrs("bt")["perms"]) != [*range(rank - 2), rank - 1, rank - 2]:
        return None
    rest = [m["cin"]] if "cin" in m else []
    return m.replace("MATMUL", m["a"], m["b"], *rest, transpose_b=True)


def _batch_by_rows(m: Match) -> Op | None:
    a, b, out = m.shape("a"), m.shape("b"), m.graph.tensors[m.root.outputs[0]].shape
    if len(b) != 2 or len(a) < 3 or math.prod(a[:-2]) == 1:
        return None
    rows = [math.prod(a[:-1]), out[-1]]
    cin = m.shape("cin") if "cin" in m else None
    if cin is not None and cin != out and math.prod(cin[:-1]) != 1:
        return None  # a Cin along some of the batch dims alone: no view of it runs along the rows
    product = [m.op("rows", "RESHAPE", m["a"], new_shape=[rows[0], a[-1]]), m["b"]]
    if cin == out:  # the partial sums of each element
        product.append(m.op("rows", "RESHAPE", m["cin"], new_shape=rows))
    elif cin is not None:  # one along N (a bias) or a single value, for every row alike
        product.append(m["cin"] if len(cin) <= 2 else m.op("rows", "RESHAPE", m["cin"], new_shape=[cin[-1]]))
    flat = m.op("product", "MATMUL", *product, result_dtype=m.graph.tensors[m.root.outputs[0]].dtype,
                **m.root.attrs)
    return m.replace("RESHAPE", flat, new_shape=list(out))


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

CONTRACTION: list[Rule] = [
    (Pat("MATMUL", _a, _bt), _transposed_b),  # A @ transpose(B) -> MATMUL(A, B){transpose_b}
    (Pat("MATMUL", _a, _bt, Pat(name="cin")), _transposed_b),  # A @ transpose(B) + Cin -> the same with Cin
    (Pat("MATMUL", _a, Pat(name="b")), _batch_by_rows),  # A[.., M, K] @ B[K, N] -> (A as [.. * M, K]) @ B
    (Pat("MATMUL", _a, Pat(name="b"), Pat(name="cin")), _batch_by_rows),  # the same with Cin
    (Pat("CONV2D", _x, _wt, name="conv"), _weights_as_given),  # conv(x, transpose(w)) -> CONV2D(x, w){weight_layout}
    (Pat("CONV2D", _x, _wt, Pat(name="bias"), name="conv"), _weights_as_given),  # the same with a bias
]

OPERANDS: list[Rule] = [
    (Pat("MATMUL"), _operand_viewed),  # MATMUL(x, x) -> MATMUL(x, RESHAPE(x)): two tensors, two tiles
]
