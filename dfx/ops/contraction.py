"""The contraction family: ops that run on the systolic array as C[m, n] += A[m, k] B[k, n].

MATMUL is the array primitive (tile meaning and array work). LINEAR is declared for its shape
rule and reference; a compiler pass rewrites it into a MATMUL with `transpose_b`, so it has no
tile of its own.

A MATMUL with `transpose_b` takes B as [..., N, K] and uses it transposed. Its tile meaning is
the plain one: the move that brings a B tile from L3 to L2 transposes it, so the compute always
sees B's tile as [k, n].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import dtype_of, numpy_dtype
from .base import OpDef, Shape, ShapeError, accumulation_dtype, broadcasts_to, elements, on_sizes, register

# ---- MATMUL ----------------------------------------------------------------------------------


def _matmul_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    a, b = shapes[0], shapes[1]
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"operands must have rank >= 2, got {list(a)} and {list(b)}")
    k, n = (b[-1], b[-2]) if attrs["transpose_b"] else (b[-2], b[-1])
    if a[-1] != k:
        given = " (transposed)" if attrs["transpose_b"] else ""
        raise ShapeError(f"inner dimensions differ: A {list(a)} has K={a[-1]}, B {list(b)}{given} has K={k}")
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise ShapeError(f"batch dimensions do not broadcast: {list(a[:-2])} and {list(b[:-2])}") from None
    out = (*batch, a[-2], n)
    if len(shapes) == 3:
        broadcasts_to(shapes[2], out, "accumulator", "the result")
    return [out]


def _matmul_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype,
                 attrs: dict[str, Any]) -> np.ndarray:
    c = np.matmul(tiles[0].astype(acc, copy=False), tiles[1].astype(acc, copy=False))
    if partial is not None:
        return partial + c
    if len(tiles) == 3:
        c = c + tiles[2].astype(acc, copy=False)
    return c


def _matmul_mnk(shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> tuple[int, int, int]:
    """(m, n, k) from the operand tiles' extents along their tensors' dims (B's are [n, k] when
    it is given transposed)."""
    a, b = shapes[0], shapes[1]
    return a[-2], b[-2] if attrs["transpose_b"] else b[-1], a[-1]


def _matmul_operand_order(shapes: list[Shape], attrs: dict[str, Any]) -> list[list[int] | None]:
    """B given transposed reaches the tile with its last two dims swapped back."""
    rank = len(shapes[1])
    swapped = [*range(rank - 2), rank - 1, rank - 2] if attrs["transpose_b"] else None
    return [None, swapped, *([None] * (len(shapes) - 2))]


def _matmul_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    acc = numpy_dtype(accumulation_dtype([dtype_of(x) for x in arrays] + out_dtypes))
    if attrs["transpose_b"]:  # what the L3 -> L2 move does to each B tile
        arrays = [arrays[0], np.swapaxes(arrays[1], -1, -2), *arrays[2:]]
    return [_matmul_tile(arrays, None, acc, attrs).astype(numpy_dtype(out_dtypes[0]))]


def _matmul_work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
    """One multiply-add per product: K of them for each element of C."""
    return {"simple": elements(out_shape) * in_shapes[0][-1]}


MATMUL = register(OpDef(
    name="MATMUL",
    min_inputs=2,
    max_inputs=3,
    infer_shapes=_matmul_shapes,
    reference=_matmul_reference,
    compute_type="MATMUL_TILE",
    doc="C = A @ B (+ Cin with a third operand), A @ B^T with transpose_b (B given as [..., N, K]); "
        "leading dims batch and broadcast as numpy.matmul; partial sums in f32 (i32 for integers, "
        "f64 when any side is f64), rounded once to C's dtype",
    family="contraction",
    attrs={"transpose_b": False},
    tile=_matmul_tile,
    tile_mnk=_matmul_mnk,
    vector_work=_matmul_work,
    operand_order=_matmul_operand_order,
    magnitude=on_sizes(_matmul_reference),
))


# ---- LINEAR ----------------------------------------------------------------------------------


def _linear_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x, w = shapes[0], shapes[1]
    if len(x) < 1 or len(w) != 2:
        raise ShapeError(f"LINEAR takes x [..., in] and weight [out, in], got {list(x)} and {list(w)}")
    if x[-1] != w[1]:
        raise ShapeError(f"input features differ: x {list(x)} has {x[-1]}, weight {list(w)} has {w[1]}")
    if len(shapes) == 3:
        broadcasts_to(shapes[2], (w[0],), "bias", "the output features")
    return [(*x[:-1], w[0])]


def _linear_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    # the MATMUL it becomes: x @ W^T (+ bias as Cin)
    return _matmul_reference(arrays, {"transpose_b": True}, out_dtypes)


LINEAR = register(OpDef(
    name="LINEAR",
    min_inputs=2,
    max_inputs=3,
    infer_shapes=_linear_shapes,
    reference=_linear_reference,
    compute_type="MATMUL_TILE",  # after the pass that rewrites it into a MATMUL
    doc="y = x @ W^T (+ bias) for x [..., in], W [out, in], bias [out]; accumulates as MATMUL",
    family="contraction",
    magnitude=on_sizes(_linear_reference),
))
