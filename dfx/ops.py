"""The op registry: each operator declared once, with its shape rule and numpy reference.

Frontends map their operators onto these names; the lowering picks a kernel by name; the
loader's `--check` runs `reference`. No other module defines what an op computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .dtypes import accumulator, dtype_of, numpy_dtype

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """Operands do not fit the op's shape rule."""


@dataclass(frozen=True)
class OpDef:
    name: str
    min_inputs: int
    max_inputs: int
    # (input shapes, input dtypes, attrs) -> output shapes
    infer_shapes: Callable[[list[Shape], list[str], dict[str, Any]], list[Shape]]
    # (input arrays, attrs, output dtypes) -> output arrays
    reference: Callable[[list[np.ndarray], dict[str, Any], list[str]], list[np.ndarray]]
    compute_type: str  # the tile-level COMPUTE it lowers to
    doc: str
    # the tile COMPUTE's meaning, for ops that lower: (input tiles, partial result or None when
    # starting afresh, accumulation dtype) -> the new partial result, in that dtype
    tile: Callable[[list[np.ndarray], np.ndarray | None, np.dtype], np.ndarray] | None = None
    # the array work of one tile COMPUTE: (input tile shapes) -> (m, n, k) of C[m, n] += A[m, k] B[k, n]
    tile_mnk: Callable[[list[tuple[int, ...]]], tuple[int, int, int]] | None = None


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    REGISTRY[op.name] = op
    return op


def lookup(name: str) -> OpDef | None:
    return REGISTRY.get(name)


def accumulation_dtype(dtypes: list[str]) -> str:
    """Partial sums: f64 if any operand or result is f64, i32 if all are integer, else f32."""
    accs = {accumulator(d) for d in dtypes}
    if "f64" in accs:
        return "f64"
    return "i32" if accs == {"i32"} else "f32"


# ---- MATMUL ------------------------------------------------------------------------------


def _matmul_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    a, b = shapes[0], shapes[1]
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"operands must have rank >= 2, got {list(a)} and {list(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"inner dimensions differ: A {list(a)} has K={a[-1]}, B {list(b)} has K={b[-2]}")
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise ShapeError(f"batch dimensions do not broadcast: {list(a[:-2])} and {list(b[:-2])}") from None
    out = (*batch, a[-2], b[-1])
    if len(shapes) == 3:
        try:
            if np.broadcast_shapes(shapes[2], out) != out:
                raise ValueError
        except ValueError:
            raise ShapeError(f"accumulator {list(shapes[2])} does not broadcast to the result {list(out)}") from None
    return [out]


def _matmul_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype) -> np.ndarray:
    c = np.matmul(tiles[0].astype(acc, copy=False), tiles[1].astype(acc, copy=False))
    if partial is not None:
        return partial + c
    if len(tiles) == 3:
        c = c + tiles[2].astype(acc, copy=False)
    return c


def _matmul_mnk(shapes: list[tuple[int, ...]]) -> tuple[int, int, int]:
    a, b = shapes[0], shapes[1]
    return a[-2], b[-1], a[-1]


def _matmul_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    acc = numpy_dtype(accumulation_dtype([dtype_of(x) for x in arrays] + out_dtypes))
    return [_matmul_tile(arrays, None, acc).astype(numpy_dtype(out_dtypes[0]))]


MATMUL = register(OpDef(
    name="MATMUL",
    min_inputs=2,
    max_inputs=3,
    infer_shapes=_matmul_shapes,
    reference=_matmul_reference,
    compute_type="MATMUL_TILE",
    doc="C = A @ B (+ Cin with a third operand); leading dims batch and broadcast as numpy.matmul; "
        "partial sums in f32 (i32 for integers, f64 when any side is f64), rounded once to C's dtype",
    tile=_matmul_tile,
    tile_mnk=_matmul_mnk,
))



# ---- elementwise ---------------------------------------------------------------------------
# Graph-level ops with reference semantics and shape rules; they parse, infer and check, and
# lower once their kernels exist.


def _same_shape(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    return [shapes[0]]


def _broadcast(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    try:
        return [tuple(np.broadcast_shapes(*shapes))]
    except ValueError:
        raise ShapeError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def _unary(name: str, fn: Callable[[np.ndarray, dict[str, Any]], np.ndarray], doc: str) -> None:
    def reference(arrays, attrs, out_dtypes):
        x = arrays[0].astype(np.float64 if arrays[0].dtype == np.float64 else np.float32)
        return [fn(x, attrs).astype(numpy_dtype(out_dtypes[0]))]

    register(OpDef(name, 1, 1, _same_shape, reference, f"ELEMENTWISE_{name}", doc))


def _binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], doc: str) -> None:
    def reference(arrays, attrs, out_dtypes):
        acc = numpy_dtype(accumulation_dtype([dtype_of(x) for x in arrays] + out_dtypes))
        return [fn(arrays[0].astype(acc), arrays[1].astype(acc)).astype(numpy_dtype(out_dtypes[0]))]

    register(OpDef(name, 2, 2, _broadcast, reference, f"ELEMENTWISE_{name}", doc))


def _clamp(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    return np.clip(x, attrs.get("min_fp", -np.inf), attrs.get("max_fp", np.inf))


_unary("RELU", lambda x, a: np.maximum(x, 0), "max(x, 0)")
_unary("SIGMOID", lambda x, a: 1 / (1 + np.exp(-x)), "1 / (1 + exp(-x))")
_unary("EXP", lambda x, a: np.exp(x), "exp(x)")
_unary("ABS", lambda x, a: np.abs(x), "|x|")
_unary("NEGATE", lambda x, a: -x, "-x")
_unary("RECIPROCAL", lambda x, a: 1 / x, "1 / x")
_unary("CLAMP", _clamp, "min(max(x, min_fp), max_fp)")
_binary("ADD", np.add, "a + b, numpy broadcasting")
_binary("SUB", np.subtract, "a - b, numpy broadcasting")
_binary("MUL", np.multiply, "a * b, numpy broadcasting")
_binary("DIV", np.divide, "a / b, numpy broadcasting")
