"""The reduction family: REDUCE_* over a set of axes, ARGMAX and ARGMIN (the position of a row's
extreme, an integer), and the row ops that reduce and then map back over the same elements
(SOFTMAX, LOG_SOFTMAX, LAYERNORM, RMSNORM, CUMSUM and the other running reductions), and SORT
and ARGSORT (a row in order).

A tile COMPUTE of a reduction holds the reduced axes whole (the tile has the tensor's rank).
REDUCE_SUM/MAX/MIN/PROD may also accumulate across tiles of the reduced axes: given a partial
result they combine it with the tile's, as a MATMUL does over k. The others cannot (a mean, a
position, a softmax, a norm or a running sum needs the whole row) and refuse a partial result.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..dtypes import numpy_dtype
from .base import (
    OpDef, Shape, ShapeError, broadcasts_to, compute_dtype, convert, elements, normalize_axes, normalize_axis,
    on_magnitudes, register, tile_compute_dtype,
)


def _whole_rows(name: str, partial: np.ndarray | None) -> None:
    if partial is not None:
        raise ValueError(f"{name} cannot accumulate: its tile must hold the reduced axes whole")


# ---- REDUCE_* --------------------------------------------------------------------------------


def _reduced_axes(shape: Shape, attrs: dict[str, Any]) -> tuple[int, ...]:
    rank = len(shape)
    return tuple(range(rank)) if attrs["axes"] is None else normalize_axes(attrs["axes"], rank)


def _reduce_result_dims(shape: Shape, attrs: dict[str, Any]) -> list[int | None]:
    axes = _reduced_axes(shape, attrs)
    if attrs["keepdims"]:
        return [None if j in axes else j for j in range(len(shape))]
    return [j for j in range(len(shape)) if j not in axes]


def _reduce_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    return [tuple(1 if j is None else shapes[0][j] for j in _reduce_result_dims(shapes[0], attrs))]


def lowest(dtype: np.dtype) -> int | float:
    """The value no other of `dtype` is below: MAX's identity, a max-pool's padding."""
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype: np.dtype) -> int | float:
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


# name -> (x, axes, keepdims) -> reduced x, in x's dtype. An empty reduction gives the identity:
# 0, 1, and for MAX/MIN the lowest/highest value (ONNX's -inf/+inf for floats).
_REDUCERS: dict[str, Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]] = {
    "SUM": lambda x, axes, keep: np.sum(x, axis=axes, keepdims=keep),
    "PROD": lambda x, axes, keep: np.prod(x, axis=axes, keepdims=keep),
    "MAX": lambda x, axes, keep: np.max(x, axis=axes, keepdims=keep, initial=lowest(x.dtype)),
    "MIN": lambda x, axes, keep: np.min(x, axis=axes, keepdims=keep, initial=_highest(x.dtype)),
    # the count is the product of the reduced dims; 0 of them gives NaN, as numpy's mean
    "MEAN": lambda x, axes, keep: np.sum(x, axis=axes, keepdims=keep) / elements([x.shape[a] for a in axes]),
}


def identity(op_type: str, dtype: np.dtype) -> int | float:
    """What REDUCE_SUM/PROD/MAX/MIN of no elements of `dtype` gives: a start that changes nothing."""
    return _REDUCERS[op_type.removeprefix("REDUCE_")](np.zeros(0, dtype), (0,), False).item()


# how a tile's result joins the partial result of earlier tiles of the same rows
_COMBINE = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}
# the reductions whose tile takes a partial result: a kernel may cut their reduced axes into tiles
ACCUMULATING = frozenset(f"REDUCE_{kind}" for kind in _COMBINE)


def _reduce_op(kind: str, doc: str) -> OpDef:
    name = f"REDUCE_{kind}"
    reducer, combine = _REDUCERS[kind], _COMBINE.get(kind)
    exact = kind != "MEAN"  # integer SUM/PROD/MAX/MIN stay integers; a mean is a float

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        x = arrays[0]
        x = x.astype(compute_dtype([x.dtype, numpy_dtype(out_dtypes[0])], exact))
        with np.errstate(all="ignore"):
            y = reducer(x, _reduced_axes(x.shape, attrs), attrs["keepdims"])
        return [convert(np.asarray(y), out_dtypes[0])]

    def tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
        if combine is None:
            _whole_rows(name, partial)
        x = tiles[0].astype(tile_compute_dtype(acc, exact), copy=False)
        with np.errstate(all="ignore"):
            y = np.asarray(reducer(x, _reduced_axes(x.shape, attrs), attrs["keepdims"]))
        return y if partial is None else combine(partial, y)

    def vector_work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
        # one step per element reduced (a mean's scaling is per output row, left out)
        return {"reduction": elements(in_shapes[0])}

    # the sum (mean, product) of the magnitudes bounds a sum's, however much it cancels; a min,
    # like a max, is as large as the largest magnitude at most
    bound = _REDUCERS["MAX" if kind == "MIN" else kind]

    def magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                  rtol: float) -> list[np.ndarray]:
        m = magnitudes[0]
        return [bound(m, _reduced_axes(m.shape, attrs), attrs["keepdims"])]

    return register(OpDef(name=name, min_inputs=1, max_inputs=1, infer_shapes=_reduce_shapes,
                          reference=reference, compute_type=f"{name}_TILE", doc=doc, family="reduction",
                          attrs={"axes": None, "keepdims": True}, tile=tile, vector_work=vector_work,
                          whole_axes=_reduced_axes, result_dims=_reduce_result_dims, magnitude=magnitude))


_reduce_op("SUM", "sum over `axes` (None: all); integers exactly, in int64")
_reduce_op("PROD", "product over `axes` (None: all); integers in int64, wrapping only beyond 2^63")
_reduce_op("MAX", "maximum over `axes` (None: all); NaN if any is NaN")
_reduce_op("MIN", "minimum over `axes` (None: all); NaN if any is NaN")
_reduce_op("MEAN", "mean over `axes` (None: all), in float")


# ---- ARGMAX, ARGMIN: where a row's extreme is ---------------------------------------------------


def _as_reduce(attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes of the REDUCE_* over the same axis: an ARG* result is shaped as its extreme's."""
    return {"axes": [attrs["axis"]], "keepdims": attrs["keepdims"]}


def _arg_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x = shapes[0]
    axis = normalize_axis(attrs["axis"], len(x))
    if x[axis] == 0:
        raise ShapeError(f"axis {axis} of {list(x)} is empty: it has no extreme to find")
    return _reduce_shapes(shapes, dtypes, _as_reduce(attrs))


def _arg_op(kind: str, pick: Callable[..., np.ndarray]) -> OpDef:
    """ARGMAX or ARGMIN along `axis`: `pick` (numpy's argmax or argmin) gives the first of equal
    extremes, so the last is the first from the end."""
    name = f"ARG{kind}"

    def position(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        axis = normalize_axis(attrs["axis"], x.ndim)
        if attrs["select_last_index"]:
            found = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis)
        else:
            found = pick(x, axis=axis)
        return np.expand_dims(found, axis) if attrs["keepdims"] else np.asarray(found)

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        return [convert(position(arrays[0], attrs), out_dtypes[0])]  # compared as they are: no rounding

    def tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
        _whole_rows(name, partial)
        return position(tiles[0], attrs)  # the tile holds the axis whole: its positions are the tensor's

    return register(OpDef(
        name=name, min_inputs=1, max_inputs=1, infer_shapes=_arg_shapes, reference=reference,
        compute_type=f"{name}_TILE", family="reduction", attrs={"axis": -1, "keepdims": True,
                                                                  "select_last_index": False},
        doc=f"the position along `axis` of the {kind.lower()}imum, an integer (NaN counts as the {kind.lower()}imum); "
            "the first of equal ones, the last with select_last_index",
        tile=tile, whole_axes=lambda shape, attrs: _reduced_axes(shape, _as_reduce(attrs)),
        result_dims=lambda shape, attrs: _reduce_result_dims(shape, _as_reduce(attrs)),
        # one compare-and-select per element; a position is exact, held to its own size alone
        vector_work=lambda in_shapes, out_shape, attrs: {"reduction": elements(in_shapes[0])}))


_arg_op("MAX", np.argmax)
_arg_op("MIN", np.argmin)


# ---- row ops: reduce, then map over the same elements ----------------------------------------


def _row_op(name: str, min_inputs: int, max_inputs: int, infer_shapes, whole_axes, fn, work, doc: str,
            attrs: dict, magnitude=None, shifted=None) -> OpDef:
    """Declare a float row op, its result shaped as its first operand: fn(operands in the compute
    dtype, attrs) -> result; `work` the vector work per element of the first operand;
    `magnitude` and `shifted` as OpDef's."""

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        ct = compute_dtype([x.dtype for x in arrays] + [numpy_dtype(out_dtypes[0])], exact=False)
        with np.errstate(all="ignore"):
            y = fn([x.astype(ct) for x in arrays], attrs)
        return [convert(y, out_dtypes[0])]

    def tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
        _whole_rows(name, partial)
        ct = tile_compute_dtype(acc, exact=False)
        with np.errstate(all="ignore"):
            return fn([t.astype(ct, copy=False) for t in tiles], attrs)

    def vector_work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
        return {cls: n * elements(in_shapes[0]) for cls, n in work(len(in_shapes)).items()}

    return register(OpDef(name=name, min_inputs=min_inputs, max_inputs=max_inputs, infer_shapes=infer_shapes,
                          reference=reference, compute_type=f"{name}_TILE", doc=doc, family="reduction",
                          attrs=attrs, tile=tile, vector_work=vector_work, whole_axes=whole_axes,
                          result_dims=lambda shape, attrs: list(range(len(shape))), magnitude=magnitude,
                          shifted=shifted))


def _axis_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    normalize_axis(attrs["axis"], len(shapes[0]))
    return [shapes[0]]


def _the_axis(shape: Shape, attrs: dict[str, Any]) -> tuple[int, ...]:
    return (normalize_axis(attrs["axis"], len(shape)),)


def _axis_to_last(shape: Shape, attrs: dict[str, Any]) -> tuple[int, ...]:
    return tuple(range(normalize_axis(attrs["axis"], len(shape)), len(shape)))


def _below_max(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """x less its row's max, what a softmax takes first (the max exact, one of the row's; the
    difference rounded relative to itself)."""
    return x - np.max(x, axis=attrs["axis"], keepdims=True)


def _softmax(operands: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    e = np.exp(_below_max(operands[0], attrs))  # <= 1: no overflow
    return e * (1 / np.sum(e, axis=attrs["axis"], keepdims=True))


def _log_softmax(operands: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    shifted = _below_max(operands[0], attrs)
    return shifted - np.log(np.sum(np.exp(shifted), axis=attrs["axis"], keepdims=True))


def _lse(v: np.ndarray, axis: int) -> np.ndarray:
    """log(sum(exp(v))) along `axis`, kept; -inf for a row of -inf."""
    top = np.max(v, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return top + np.log(np.sum(np.exp(v - top), axis=axis, keepdims=True))


def _softmax_reach(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                   rtol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log s for s the softmax of x, and the largest and the least log s_i may become with each
    x_j off by up to e_j = rtol m_j: log s_i grows with x_i and falls with every other x_j, so
    its extremes are at the corners x_i + e_i, x_j - e_j (j != i) and the opposite one. Exact,
    not first order: logits that may be off by more than the gaps between the largest (a deep
    network's on generated weights) may change which is largest; and a masked element (-1e9, -inf)
    moves nothing, however large its own error."""
    x, axis = values[0], attrs["axis"]
    e = np.where(x == -np.inf, 0.0, rtol * magnitudes[0])  # a -inf mask stays -inf: no error moves it
    log_s = _log_softmax([x], attrs)
    # the sum of exp(x - e) with element i's term exp(x_i - e_i) raised to exp(x_i + e_i)
    raised = np.logaddexp(_lse(x - e, axis), x + e + np.log(-np.expm1(-2 * e)))  # x - e + log(e^2e - 1)
    # the sum of exp(x + e) without element i's term: taken from the whole sum where that term
    # is at most half of it, summed afresh without the largest term for the largest (else all
    # its digits would cancel)
    up = x + e
    full = _lse(up, axis)
    top = np.expand_dims(np.argmax(up, axis=axis), axis)
    is_top, without_top = np.zeros(x.shape, bool), up.copy()
    np.put_along_axis(is_top, top, True, axis)
    np.put_along_axis(without_top, top, -np.inf, axis)
    others = np.where(is_top, _lse(without_top, axis), full + np.log1p(-np.minimum(0.5, np.exp(up - full))))
    return log_s, x + e - raised, x - e - np.logaddexp(others, x - e)


def _reach_magnitude(spread: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]):
    """The magnitude rule of a softmax-like row op: how far its result may move (`spread` of the
    log-result and its reach up and down, `_softmax_reach`) in units of rtol."""

    def rule(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
             rtol: float) -> list[np.ndarray]:
        if rtol == 0:  # the check allows no relative error: no magnitude counts
            return [np.zeros_like(values[0])]
        return [spread(*_softmax_reach(values, magnitudes, attrs, rtol)) / rtol]

    return rule


_softmax_magnitude = _reach_magnitude(
    lambda log_s, most, least: np.maximum(np.exp(most) - np.exp(log_s), np.exp(log_s) - np.exp(least)))
_log_softmax_magnitude = _reach_magnitude(lambda log_s, most, least: np.maximum(most - log_s, log_s - least))


# max and sum (reductions), exp, subtract the max and multiply by the sum's reciprocal
_row_op("SOFTMAX", 1, 1, _axis_shapes, _the_axis, _softmax,
        lambda n: {"reduction": 2, "transcendental": 1, "simple": 2},
        "exp(x - max) / sum(exp(x - max)) along `axis`", {"axis": -1}, _softmax_magnitude, _below_max)
# max and sum (reductions), exp, subtract the max and subtract the log of the sum
_row_op("LOG_SOFTMAX", 1, 1, _axis_shapes, _the_axis, _log_softmax,
        lambda n: {"reduction": 2, "transcendental": 1, "simple": 2},
        "x - max - log(sum(exp(x - max))) along `axis`", {"axis": -1},
        _log_softmax_magnitude, _below_max)


def _layernorm_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x = shapes[0]
    normalized = x[normalize_axis(attrs["axis"], len(x)):]
    for what, shape in zip(("scale", "bias"), shapes[1:]):
        broadcasts_to(shape, normalized, what, "the normalized shape")
    return [x]


def _layernorm(operands: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = operands[0]
    axes = _axis_to_last(x.shape, attrs)
    centred = x - np.mean(x, axis=axes, keepdims=True)
    variance = np.mean(centred * centred, axis=axes, keepdims=True)
    y = centred * (1 / np.sqrt(variance + attrs["epsilon"]))
    for operand, apply in zip(operands[1:], (np.multiply, np.add)):
        y = apply(y, operand)
    return y


def _layernorm_magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                         rtol: float) -> list[np.ndarray]:
    """First order: x's errors move the normalized value n_i = (x_i - mean) / sigma by
    (dx_i - mean(dx) - n_i mean(n dx)) / sigma, at most (m_i + mean(m) + |n_i| mean(|n| m)) /
    sigma; a scale and a bias add |scale| times that, |n| times the scale's and the bias's."""
    x, m = values[0], magnitudes[0]
    axes = _axis_to_last(x.shape, attrs)
    centred = x - np.mean(x, axis=axes, keepdims=True)
    sigma = np.sqrt(np.mean(centred * centred, axis=axes, keepdims=True) + attrs["epsilon"])
    n = centred / sigma
    spread = (m + np.mean(m, axis=axes, keepdims=True) + np.abs(n) * np.mean(np.abs(n) * m, axis=axes, keepdims=True)) \
        / sigma
    if len(values) > 1:
        spread = np.abs(values[1]) * spread + np.abs(n) * magnitudes[1]
    if len(values) > 2:
        spread = spread + magnitudes[2]
    return [spread]


# mean and variance sums (reductions); subtract the mean, square, multiply by the rsqrt; one
# more multiply for a scale and one add for a bias
_row_op("LAYERNORM", 1, 3, _layernorm_shapes, _axis_to_last, _layernorm,
        lambda n: {"reduction": 2, "simple": 3 + (n - 1)},
        "(x - mean) / sqrt(var + epsilon) * scale + bias over axes axis..last (ONNX LayerNormalization, "
        "Y only); operands x, optional scale, optional bias (a bias needs a scale)",
        {"axis": -1, "epsilon": 1e-5}, _layernorm_magnitude)


def _rmsnorm(operands: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = operands[0]
    mean_square = np.mean(x * x, axis=_axis_to_last(x.shape, attrs), keepdims=True)
    y = x * (1 / np.sqrt(mean_square + attrs["epsilon"]))
    return y if len(operands) == 1 else y * operands[1]


def _rmsnorm_magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                       rtol: float) -> list[np.ndarray]:
    """First order: x's errors move n_i = x_i / r, r = sqrt(mean(x^2) + epsilon), by
    (dx_i - n_i mean(n dx)) / r, at most (m_i + |n_i| mean(|n| m)) / r; a scale adds |scale| times
    that, |n| times the scale's."""
    x, m = values[0], magnitudes[0]
    axes = _axis_to_last(x.shape, attrs)
    r = np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + attrs["epsilon"])
    n = x / r
    spread = (m + np.abs(n) * np.mean(np.abs(n) * m, axis=axes, keepdims=True)) / r
    if len(values) > 1:
        spread = np.abs(values[1]) * spread + np.abs(n) * magnitudes[1]
    return [spread]


# the sum of squares (a reduction); square and multiply by the rsqrt; one more multiply for a scale
_row_op("RMSNORM", 1, 2, _layernorm_shapes, _axis_to_last, _rmsnorm,
        lambda n: {"reduction": 1, "simple": 2 + (n - 1)},
        "x / sqrt(mean(x^2) + epsilon) * scale over axes axis..last (ONNX RMSNormalization, LLaMA's and "
        "Flax's RMSNorm); operands x, optional scale",
        {"axis": -1, "epsilon": 1e-5}, _rmsnorm_magnitude)


# ---- CUMSUM, CUMPROD, CUMMAX, CUMMIN: a running reduction along an axis -----------------------


def _running(kind: str, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The running reduction by `kind` (a _COMBINE key) of x along `axis`, in x's dtype."""
    axis = normalize_axis(attrs["axis"], x.ndim)
    if attrs["reverse"]:
        x = np.flip(x, axis)
    y = _COMBINE[kind].accumulate(x, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive"):  # each result one step later along the axis, the first the identity
        shifted = np.full_like(y, identity(f"REDUCE_{kind}", y.dtype))
        later, earlier = ([slice(None)] * x.ndim for _ in range(2))
        later[axis], earlier[axis] = slice(1, None), slice(None, -1)
        shifted[tuple(later)] = y[tuple(earlier)]
        y = shifted
    return np.flip(y, axis) if attrs["reverse"] else y


def _running_op(kind: str, doc: str, attrs: dict[str, Any]) -> OpDef:
    """CUM<kind> along `axis`, shaped as x: one step of the reduction per element, in order along
    the axis (integers exactly, in int64, as REDUCE_*); a tile holds the axis whole."""
    name = f"CUM{kind}"

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        x = arrays[0]
        x = x.astype(compute_dtype([x.dtype, numpy_dtype(out_dtypes[0])], exact=True))
        with np.errstate(all="ignore"):
            return [convert(_running(kind, x, attrs), out_dtypes[0])]

    def tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
        _whole_rows(name, partial)
        with np.errstate(all="ignore"):
            return _running(kind, tiles[0].astype(tile_compute_dtype(acc, exact=True), copy=False), attrs)

    return register(OpDef(name=name, min_inputs=1, max_inputs=1, infer_shapes=_axis_shapes, reference=reference,
                          compute_type=f"{name}_TILE", family="reduction", attrs={"axis": -1, **attrs}, doc=doc,
                          tile=tile, whole_axes=_the_axis, result_dims=lambda shape, attrs: list(range(len(shape))),
                          vector_work=lambda in_shapes, out_shape, attrs: {"reduction": elements(in_shapes[0])},
                          magnitude=on_magnitudes(reference)))


_running_op("SUM", "the running sum along `axis`, shaped as x: y[i] = x[0] + ... + x[i]; exclusive leaves x[i] out "
                   "(y[0] = 0), reverse sums from the end", {"exclusive": False, "reverse": False})
_running_op("PROD", "the running product along `axis`, shaped as x: y[i] = x[0] * ... * x[i]; reverse from the end",
            {"reverse": False})
_running_op("MAX", "the running maximum along `axis`, shaped as x (NaN from the first NaN on); reverse from the end",
            {"reverse": False})
_running_op("MIN", "the running minimum along `axis`, shaped as x (NaN from the first NaN on); reverse from the end",
            {"reverse": False})


# ---- SORT, ARGSORT: a row in order --------------------------------------------------------------


def total_order(x: np.ndarray) -> np.ndarray:
    """Each float's place in IEEE's total order, a signed integer of its width: -NaN first, then
    -inf .. -0.0, 0.0 .. inf, +NaN last (integers and truth values as they are)."""
    if x.dtype.kind in "iub":
        return x
    bits = np.ascontiguousarray(x).view(np.dtype(f"i{x.dtype.itemsize}"))
    return bits ^ ((bits >> (8 * x.dtype.itemsize - 1)) & np.iinfo(bits.dtype).max)


def _sorted_positions(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The positions that put x in order along `axis`, stably (equal elements keep their order):
    ascending, NaN last (numpy's order, -0.0 and 0.0 equal); descending, the largest and NaN
    first. With `total_order`, floats in IEEE's total order (XLA's TopK): -0.0 before 0.0, a NaN
    by its sign."""
    axis = normalize_axis(attrs["axis"], x.ndim)
    if attrs["total_order"]:
        x = total_order(x)
    elif x.dtype.kind not in "iub":
        x = x.astype(np.float64)  # exact for every float type; numpy sorts bf16 and f8 (ml_dtypes) wrongly
    if not attrs["descending"]:
        return np.argsort(x, axis=axis, kind="stable")
    if x.dtype.kind in "iub":
        return np.argsort(~x, axis=axis, kind="stable")  # ~x reverses the order of any integer type, no overflow
    with np.errstate(invalid="ignore"):
        # NaN first, then the others largest first: sort by (not NaN, -x), stably
        return np.lexsort((np.negative(x), ~np.isnan(x)), axis=axis)


def _sort_op(name: str, positions: bool, doc: str) -> OpDef:
    """SORT (the values in order) or ARGSORT (`positions`: where each came from, an integer) along
    `axis`; a tile holds the axis whole."""

    def ordered(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        where = _sorted_positions(x, attrs)
        return where if positions else np.take_along_axis(x, where, normalize_axis(attrs["axis"], x.ndim))

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        return [convert(ordered(arrays[0], attrs), out_dtypes[0])]  # moves or positions: no rounding

    def tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
        _whole_rows(name, partial)
        return ordered(tiles[0], attrs)

    def work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
        # a merge sort: each element compared and moved once per halving of the row
        length = in_shapes[0][normalize_axis(attrs["axis"], len(in_shapes[0]))]
        return {"reduction": elements(in_shapes[0]) * max(1, (length - 1).bit_length())}

    def magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                  rtol: float) -> list[np.ndarray]:
        # each value moved with its own magnitude (a position is exact: its own size)
        where = _sorted_positions(values[0], attrs)
        return [np.abs(where.astype(np.float64)) if positions
                else np.take_along_axis(magnitudes[0], where, normalize_axis(attrs["axis"], values[0].ndim))]

    return register(OpDef(name=name, min_inputs=1, max_inputs=1, infer_shapes=_axis_shapes, reference=reference,
                          compute_type=f"{name}_TILE", family="reduction",
                          attrs={"axis": -1, "descending": False, "total_order": False},
                          doc=doc, tile=tile, whole_axes=_the_axis,
                          result_dims=lambda shape, attrs: list(range(len(shape))), vector_work=work,
                          magnitude=magnitude))


_sort_op("SORT", False, "x in order along `axis`, stably: ascending with NaN last, or descending with NaN first; "
                        "total_order: floats in IEEE's total order (-0.0 before 0.0, a NaN by its sign)")
_sort_op("ARGSORT", True, "the positions along `axis` that put x in order (SORT's), an integer: of equal elements "
                          "the first first")
