"""The layout family: data moves that compute nothing (no tile COMPUTE, no vector work).

Each reference moves the operand's values, converted once to the output dtype; the same move of
the operands' magnitudes gives each element's (a pad value's own size where it pads).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..dtypes import dtype_of, is_integer
from .base import (
    REQUIRED, VARIADIC, OpDef, Shape, ShapeError, convert, elements, normalize_axis, on_magnitudes, register,
)

ShapeRule = Callable[[list[Shape], list[str], dict[str, Any]], list[Shape]]


def layout_op(name: str, infer_shapes: ShapeRule, move: Callable[..., np.ndarray], doc: str,
              attrs: dict[str, Any], max_inputs: int = 1, index_table: tuple[str, str] | None = None,
              fill_attr: str | None = None) -> OpDef:
    """Declare a layout op; `move(operands converted to the output dtype, **attrs)`;
    `index_table` and `fill_attr` as OpDef's."""

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        return [move([convert(x, out_dtypes[0]) for x in arrays], **attrs)]

    return register(OpDef(name=name, min_inputs=1, max_inputs=max_inputs, infer_shapes=infer_shapes,
                          reference=reference, compute_type=f"LAYOUT_{name}", doc=doc, family="layout",
                          attrs=attrs, magnitude=on_magnitudes(reference), index_table=index_table,
                          fill_attr=fill_attr))


def _check_rank(values: list, x: Shape, what: str) -> None:
    if len(values) != len(x):
        raise ShapeError(f"{what} {list(values)} has {len(values)} entries for the rank-{len(x)} operand {list(x)}")


# ---- RESHAPE ---------------------------------------------------------------------------------


def _reshape_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x, new = shapes[0], attrs["new_shape"]
    known = elements([d for d in new if d != -1])
    if -1 in new:
        if known == 0:  # any size would do
            raise ShapeError(f"cannot reshape {list(x)} to {new}: a -1 beside a 0 is ambiguous")
        if elements(x) % known:
            raise ShapeError(f"cannot reshape {list(x)} ({elements(x)} elements) to {new}: no size fits the -1")
        new = [elements(x) // known if d == -1 else d for d in new]
    elif known != elements(x):
        raise ShapeError(f"cannot reshape {list(x)} ({elements(x)} elements) to {new} ({known} elements)")
    return [tuple(new)]


layout_op("RESHAPE", _reshape_shapes, lambda xs, new_shape: xs[0].reshape(new_shape),
          "the same elements in row-major order under `new_shape` (one -1 takes what is left)",
          {"new_shape": REQUIRED})


# ---- TRANSPOSE -------------------------------------------------------------------------------


def keeps_order(shape: tuple[int, ...], perms: list[int]) -> bool:
    """Permuting `shape` by `perms` moves dims of 1 only: the row-major order of the elements
    stays, so such a TRANSPOSE is a view of the same bytes."""
    moved = [p for p in perms if shape[p] != 1]
    return moved == sorted(moved)


def one_run(shape: tuple[int, ...], start: list[int], extents: list[int]) -> bool:
    """Whether the box of `extents` at `start` in a row-major tensor of `shape` is one run of its
    elements: whole along every dim after the last it cuts short, one element deep along every
    dim before. A SLICE or a GATHER taking such a box is a view of those bytes."""
    cut = [j for j, (d, e) in enumerate(zip(shape, extents)) if e != d]
    return (all(0 <= s and s + e <= d for s, e, d in zip(start, extents, shape))
            and (not cut or all(e == 1 for e in extents[:cut[-1]])))


def transpose_perms(rank: int, perms: list[int] | None) -> list[int]:
    """TRANSPOSE's `perms` attribute with its default filled: output dim i is input dim perms[i]."""
    return list(reversed(range(rank))) if perms is None else perms


def _transpose_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x = shapes[0]
    perms = transpose_perms(len(x), attrs["perms"])
    _check_rank(perms, x, "perms")
    return [tuple(x[p] for p in perms)]


layout_op("TRANSPOSE", _transpose_shapes,
          lambda xs, perms: np.transpose(xs[0], transpose_perms(xs[0].ndim, perms)),
          "output dim i is input dim perms[i] (None: reversed)", {"perms": None})


# ---- CONCAT ----------------------------------------------------------------------------------


def _concat_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    first = shapes[0]
    axis = normalize_axis(attrs["axis"], len(first))
    for i, s in enumerate(shapes[1:], start=1):
        if len(s) != len(first) or any(a != b for k, (a, b) in enumerate(zip(s, first)) if k != axis):
            raise ShapeError(f"operand {i} {list(s)} does not match operand 0 {list(first)} outside axis {axis}")
    return [tuple(sum(s[axis] for s in shapes) if k == axis else d for k, d in enumerate(first))]


layout_op("CONCAT", _concat_shapes, lambda xs, axis: np.concatenate(xs, axis=axis),
          "the operands joined along `axis`", {"axis": REQUIRED}, max_inputs=VARIADIC)


# ---- SLICE -----------------------------------------------------------------------------------


def _slice_sizes(x: Shape, start: list[int], size: list[int]) -> list[int]:
    _check_rank(start, x, "start")
    _check_rank(size, x, "size")
    sizes = [d - s if n == -1 else n for d, s, n in zip(x, start, size)]
    for axis, (d, s, n) in enumerate(zip(x, start, sizes)):
        if n < 0 or s + n > d:
            raise ShapeError(f"slice of axis {axis} from {s} for {size[axis]} leaves the dim of {d}")
    return sizes


def _slice(xs: list[np.ndarray], start: list[int], size: list[int]) -> np.ndarray:
    sizes = _slice_sizes(xs[0].shape, start, size)
    return xs[0][tuple(slice(s, s + n) for s, n in zip(start, sizes))]


layout_op("SLICE", lambda shapes, dtypes, attrs: [tuple(_slice_sizes(shapes[0], attrs["start"], attrs["size"]))],
          _slice, "the box of `size` elements from `start` (size -1: to the end of the dim)",
          {"start": REQUIRED, "size": REQUIRED})


# ---- PAD -------------------------------------------------------------------------------------


def _pad_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x = shapes[0]
    _check_rank(attrs["padding"], x, "padding")
    return [tuple(before + d + after for d, (before, after) in zip(x, attrs["padding"]))]


def _pad(xs: list[np.ndarray], padding: list[list[int]], pad_value: int | float) -> np.ndarray:
    x = xs[0]
    # the value is converted as the operand was: -inf padding an integer tensor is its lowest value
    fill = convert(np.asarray(pad_value), dtype_of(x))
    return np.pad(x, padding, constant_values=fill)


layout_op("PAD", _pad_shapes, _pad, "`padding` [before, after] elements of `pad_value` around each dim",
          {"padding": REQUIRED, "pad_value": 0}, fill_attr="pad_value")


# ---- GATHER ----------------------------------------------------------------------------------
# Its indices are the attribute `indices` (known when compiling: the kernel reads the operand
# through that list) or a second operand, a 1-D integer tensor read at run time (token ids). Both
# count negative entries from the end of the axis; an entry outside the axis is an error, never a
# read elsewhere.


def _gather_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x = shapes[0]
    axis = normalize_axis(attrs["axis"], len(x))
    if (attrs["indices"] is None) == (len(shapes) == 1):
        raise ShapeError("takes its indices as the attribute 'indices' or as a second operand, exactly one of them")
    if attrs["indices"] is None:
        if len(shapes[1]) != 1 or not is_integer(dtypes[1]):
            raise ShapeError(f"its index operand must be a 1-D integer tensor, got {list(shapes[1])} {dtypes[1]}")
        count = shapes[1][0]
        if count and not x[axis]:
            raise ShapeError(f"its {count} indices pick along axis {axis} of size 0, which has no entry to pick")
    else:
        gather_indices([], attrs, x[axis], axis)
        count = len(attrs["indices"])
    return [(*x[:axis], count, *x[axis + 1:])]


def gather_indices(arrays: list[np.ndarray], attrs: dict[str, Any], size: int, axis: int) -> np.ndarray:
    """GATHER's entries as int64 positions along an axis of `size`, negative ones counted from the
    end; ShapeError naming the first entry outside the axis."""
    given = attrs["indices"] if attrs["indices"] is not None else arrays[1]
    indices = np.asarray(given).astype(np.int64).reshape(-1)
    outside = (indices < -size) | (indices >= size)
    if outside.any():
        at = int(np.argmax(outside))
        raise ShapeError(f"index {indices[at]} is out of range for axis {axis} of size {size}")
    return indices % max(size, 1)


def _gather(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    x = convert(arrays[0], out_dtypes[0])  # the indices pick, they are not moved
    axis = normalize_axis(attrs["axis"], x.ndim)
    return [np.take(x, gather_indices(arrays, attrs, x.shape[axis], axis), axis=axis)]


def _gather_magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray],
                      attrs: dict[str, Any], rtol: float) -> list[np.ndarray]:
    """The picked elements' magnitudes: indices are exact, they carry no error of their own."""
    x = magnitudes[0]
    axis = normalize_axis(attrs["axis"], x.ndim)
    return [np.take(x, gather_indices(values, attrs, x.shape[axis], axis), axis=axis)]


register(OpDef(name="GATHER", min_inputs=1, max_inputs=2, infer_shapes=_gather_shapes, reference=_gather,
               compute_type="LAYOUT_GATHER", family="layout",
               doc="the entries `indices` of `axis` (the attribute, or a 1-D integer second operand read at run "
                   "time; negative counts from the end)",
               attrs={"indices": None, "axis": 0}, magnitude=_gather_magnitude, index_table=("indices", "axis")))
