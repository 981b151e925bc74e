"""The registry's contract: what an op declaration holds, the registry itself, and the shape,
attribute and dtype helpers every op family shares.

An op's functions see attributes after `OpDef.normalize_attrs`: every declared name present,
defaults filled, values of their canonical type. Numbers follow one rule across the families:
an op computes in f32, in f64 when any operand or result is f64; an op marked exact (integer
arithmetic, comparisons, selection, min/max) computes in int64 when every operand and result is
an integer, so no intermediate wraps (only a REDUCE_PROD beyond 2^63 would). The result is then
rounded once to the output dtype with `convert`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..dtypes import DTYPES, accumulator, numpy_dtype

Shape = tuple[int, ...]
VARIADIC = sys.maxsize  # max_inputs of an op that takes any number of operands (CONCAT)


class ShapeError(ValueError):
    """Operands or attributes do not fit the op's rule; str(e) is one line."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of an attribute the graph must give


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
    family: str  # contraction | map | reduction | window | layout
    # attribute name -> default, REQUIRED when the graph must give it
    attrs: dict[str, Any] = field(default_factory=dict, hash=False)
    # the tile COMPUTE's meaning, for ops that compute: (input tiles, partial result or None when
    # starting afresh, accumulation dtype, attrs) -> the new partial result, in a compute dtype
    # (the store rounds it to the output dtype). Map ops get broadcast-compatible tiles; row
    # reductions a tile that holds the reduced axes whole. None for layout ops (data moves) and
    # for ops a compiler pass decomposes first (LINEAR).
    tile: Callable[[list[np.ndarray], np.ndarray | None, np.dtype, dict[str, Any]], np.ndarray] | None = None
    # the array work of one tile COMPUTE: (input tile shapes) -> (m, n, k) of C[m, n] += A[m, k] B[k, n]
    # (a contraction's: it runs there but in a kernel of dataflow "vector", `on_array`)
    tile_mnk: Callable[[list[tuple[int, ...]], dict[str, Any]], tuple[int, int, int]] | None = None
    # the vector-unit work of one COMPUTE: (input shapes, output shape, attrs) -> elements
    # processed per op class: "simple" (add, mul, compare, select, max, convert), "transcendental"
    # (exp, log, sqrt, rsqrt, tanh, erf, sigmoid, pow, divide, reciprocal), "reduction" (one step
    # of a reduction per element reduced). Scalar work once per reduced row (the reciprocal of a
    # softmax sum, the rsqrt of a variance) is left out. A contraction's: one multiply-add per
    # product, where a kernel of dataflow "vector" runs it. None for layout ops and LINEAR.
    vector_work: Callable[[list[Shape], Shape, dict[str, Any]], dict[str, int]] | None = None
    # reduction family only, for tiling: (first operand's shape, attrs) -> the axes a tile must
    # hold whole, and -> for each result dim, the operand dim it runs along (None: reduced, kept as 1)
    whole_axes: Callable[[Shape, dict[str, Any]], tuple[int, ...]] | None = None
    result_dims: Callable[[Shape, dict[str, Any]], list[int | None]] | None = None
    # `exact`: integer operands and results compute in integers (so a tile holds an all-integer
    # result in i32, as the reference's int64 modulo 2^32): map ops as declared (see
    # elementwise.map_op), and the window ops that sum or take a max in the accumulation dtype.
    # `predicate` (map family): the result is a truth value, 0 or 1 whatever its dtype
    exact: bool = False
    predicate: bool = False
    # for the validator, where the op's operands do not simply align right on its result (numpy
    # broadcasting): (input shapes, attrs) -> per operand, per dim, the result dim it runs along
    # (None: contracted or taken whole)
    operand_dims: Callable[[list[Shape], dict[str, Any]], list[list[int | None]]] | None = None
    # (input shapes, attrs) -> per operand, the order of its dims in the tile its COMPUTE takes
    # (tile dim j is the tensor's dim order[j]; None: as the tensor lays them out), where the
    # moves that bring it permute them (MATMUL's B given transposed, CONV2D's weights in another
    # order). None: every operand as laid out
    operand_order: Callable[[list[Shape], dict[str, Any]], list[list[int] | None]] | None = None
    # sliding-window ops (window.py): (attrs, input shapes) -> the H and W windows of the first
    # operand, and the value of its padding, by attrs and dtype (None: zero)
    windows: Callable[[dict[str, Any], list[Shape]], tuple[Any, Any]] | None = None
    window_fill: Callable[[dict[str, Any], str], int | float] | None = None
    # layout ops whose kernel reads the operand through an index table (`TileRef.table`): the
    # attribute holding the table and the one naming the axis it indexes
    index_table: tuple[str, str] | None = None
    # layout ops that write a value of their own around the operand: the attribute holding it
    fill_attr: str | None = None
    # for --check: (the operands' values and their magnitudes, float64 arrays shaped as the
    # operands, a magnitude at least its value's size; attrs; rtol, the check's relative
    # tolerance: an element may be off by about rtol times its magnitude, which a rule that holds
    # beyond first order needs, softmax's) -> per result, each element's
    # magnitude (broadcastable to the result): rounding, here or in the ops before, moves the
    # element by about the unit roundoff times it, so the element is held to a tolerance
    # relative to it, never to values it does not depend on. A contraction's is its own
    # (`on_sizes`); every other op carries its operands' to its result to first order
    # (`on_magnitudes`, or the op's own rule). None: the element's own size alone.
    magnitude: MagnitudeRule | None = None
    # for --check of a kernel, whose operands are what it read, exact: an op that first takes
    # from its first operand what its result does not change by, found exactly (softmax: each
    # row's max), gives that operand so shifted; its kernel's own rounding starts there,
    # relative to the shifted value, so an exact first operand's magnitude is that one's size,
    # not its own (logits near 5,000 each held off by up to 0.5 at rtol 1e-4 let a softmax pass
    # 0.1 off). None: the operand's size.
    shifted: Callable[[np.ndarray, dict[str, Any]], np.ndarray] | None = None

    def on_array(self, dataflow: str) -> bool:
        """Whether a COMPUTE of this op runs on the array in a kernel of `dataflow`: a
        contraction's does, but in a kernel of dataflow "vector" (a contraction of one row)."""
        return self.tile_mnk is not None and dataflow != "vector"

    def padding_value(self, attrs: dict[str, Any], dtype: str) -> int | float:
        """What a sliding-window op's input holds in its padding, in `dtype`, by its normalized
        attrs: zero unless the op says."""
        return 0 if self.window_fill is None else self.window_fill(attrs, dtype)

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """`attrs` with defaults filled and values in canonical form; ShapeError for an unknown
        attribute, a missing required one or a value of the wrong type or range."""
        unknown = sorted(set(attrs) - set(self.attrs))
        if unknown:
            takes = ", ".join(self.attrs) or "no attributes"
            raise ShapeError(f"attribute '{unknown[0]}' is unknown ({self.name} takes {takes})")
        normalized = {}
        for name, default in self.attrs.items():
            if name in attrs:
                normalized[name] = ATTRIBUTES[name](name, attrs[name])
            elif default is REQUIRED:
                raise ShapeError(f"attribute '{name}' is required by {self.name}")
            else:
                normalized[name] = default
        return normalized


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    # every attribute name has one meaning and one checker across the registry
    undefined = set(op.attrs) - set(ATTRIBUTES)
    assert not undefined, f"{op.name}: attributes {sorted(undefined)} have no checker in ATTRIBUTES"
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


# ---- numbers ---------------------------------------------------------------------------------


def compute_dtype(dtypes: list[np.dtype], exact: bool) -> np.dtype:
    """The dtype a reference computes in, from its operands' and results' numpy dtypes."""
    if exact and all(d.kind in "iub" for d in dtypes):
        return np.dtype(np.int64)
    return np.dtype(np.float64) if any(d == np.float64 for d in dtypes) else np.dtype(np.float32)


def tile_compute_dtype(acc: np.dtype, exact: bool) -> np.dtype:
    """The dtype a tile computes in: the kernel's accumulation dtype, f32 where that is an
    integer type and the op is not exact. i32 where the reference takes int64 gives the same
    result modulo 2^32, so the same values once stored in an output of 32 bits or fewer."""
    return acc if exact or acc.kind == "f" else np.dtype(np.float32)


def convert(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` rounded once to the DFX dtype `dtype`. Float to integer truncates toward zero and
    saturates, NaN giving 0 (XLA's convert; numpy leaves those cases undefined). Integer to a
    narrower integer wraps, as numpy does; float to float rounds to nearest even (ml_dtypes:
    beyond f8's range gives NaN)."""
    target = numpy_dtype(dtype)
    if target.kind in "iu" and x.dtype.kind not in "iub":
        info = np.iinfo(target)
        with np.errstate(invalid="ignore"):  # NaN compares false: nan_to_num handles it
            x = np.clip(np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0), info.min, info.max)
    return x.astype(target, copy=False)


def elements(shape: Shape) -> int:
    return math.prod(shape)


Reference = Callable[[list[np.ndarray], dict[str, Any], list[str]], list[np.ndarray]]
MagnitudeRule = Callable[[list[np.ndarray], list[np.ndarray], dict[str, Any], float], list[np.ndarray]]


def on_magnitudes(reference: Reference) -> MagnitudeRule:
    """The magnitude rule of an op whose result elements are moves, maxima or sums of a few
    (products of) operand elements: its reference on the operands' magnitudes, in float64, which
    bounds how far its operands' errors move each element."""

    def magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                  rtol: float) -> list[np.ndarray]:
        return [np.abs(y) for y in reference(magnitudes, attrs, ["f64"])]

    return magnitude


def on_sizes(reference: Reference) -> MagnitudeRule:
    """A contraction's magnitude rule: its reference on the sizes of its operands' values, in
    float64 (|A| @ |B|), the scale of its own rounding however much its sums cancel. The errors
    its operands carry are of the same order: among the many products of a sum, the few operand
    elements whose magnitude exceeds their size (results of cancellation themselves) count little.
    Carrying magnitudes through contractions instead would bound layer upon layer of worst cases
    and let a deep network's outputs be off by more than their size."""

    def magnitude(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                  rtol: float) -> list[np.ndarray]:
        return [np.abs(y) for y in reference([np.abs(v) for v in values], attrs, ["f64"])]

    return magnitude


# ---- shapes ----------------------------------------------------------------------------------


def broadcast(shapes: list[Shape]) -> Shape:
    """numpy's broadcast of `shapes`, or ShapeError."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def broadcasts_to(shape: Shape, target: Shape, what: str, onto: str) -> None:
    """ShapeError unless `shape` broadcasts to exactly `target` (one-way, as a bias does)."""
    try:
        if np.broadcast_shapes(shape, target) == target:
            return
    except ValueError:
        pass
    raise ShapeError(f"{what} {list(shape)} does not broadcast to {onto} {list(target)}")


def normalize_axis(axis: int, rank: int) -> int:
    """`axis` counted from the front (negative counts from the end), or ShapeError."""
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def normalize_axes(axes: list[int], rank: int) -> tuple[int, ...]:
    normalized = tuple(normalize_axis(a, rank) for a in axes)
    if len(set(normalized)) < len(normalized):
        raise ShapeError(f"axes {list(axes)} name an axis twice for rank {rank}")
    return normalized


# ---- attributes ------------------------------------------------------------------------------
# One checker per canonical attribute name: (name, value) -> the value in canonical form.


def _fail(name: str, wanted: str, value: Any) -> ShapeError:
    shown = repr(value)  # repr keeps it one line; a long list is cut
    return ShapeError(f"attribute '{name}' must be {wanted}, got {shown if len(shown) <= 80 else shown[:77] + '...'}")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, (float, np.floating))


def _int(name: str, value: Any) -> int:
    if not _is_int(value):
        raise _fail(name, "an integer", value)
    return int(value)


def _ints(name: str, value: Any, low: int | None = None) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) and (low is None or v >= low) for v in value):
        raise _fail(name, "a list of integers" + ("" if low is None else f" >= {low}"), value)
    return [int(v) for v in value]


def _optional_ints(name: str, value: Any) -> list[int] | None:
    return None if value is None else _ints(name, value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _fail(name, "true or false", value)
    return bool(value)


def _float(name: str, value: Any) -> float:
    if not _is_number(value):
        raise _fail(name, "a number", value)
    return float(value)


def _number(name: str, value: Any) -> int | float:
    """An int stays an int: an integer CLAMP or PAD keeps its exact bound."""
    if not _is_number(value):
        raise _fail(name, "a number", value)
    return int(value) if _is_int(value) else float(value)


def _quantization(name: str, value: Any) -> list:
    """[scale, zero point]: a positive finite scale and an integer zero point."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and _is_number(value[0]) and value[0] > 0
            and math.isfinite(value[0]) and _is_int(value[1])):
        raise _fail(name, "[scale, zero point]: a positive finite number and an integer", value)
    return [float(value[0]), int(value[1])]


def _positive(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise _fail(name, "an integer >= 1", value)
    return int(value)


def _epsilon(name: str, value: Any) -> float:
    if not _is_number(value) or not value >= 0:
        raise _fail(name, "a number >= 0", value)
    return float(value)


def _new_shape(name: str, value: Any) -> list[int]:
    dims = _ints(name, value, low=-1)
    if dims.count(-1) > 1:
        raise _fail(name, "a shape with at most one -1", value)
    return dims


def _perms(name: str, value: Any) -> list[int] | None:
    perms = _optional_ints(name, value)
    if perms is not None and sorted(perms) != list(range(len(perms))):
        raise _fail(name, f"a permutation of 0..{len(perms) - 1}", value)
    return perms


def _padding(name: str, value: Any) -> list[list[int]]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise _fail(name, "a list of [before, after] pairs", value)
    return [_ints(name, p, low=0) for p in value]


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if value not in allowed:
            raise _fail(name, " or ".join(repr(a) for a in allowed), value)
        return value
    return check


def _dim_order(letters: str) -> Callable[[str, Any], str | None]:
    """None, or a string naming each of `letters` once: the order of a tensor's dims."""
    def check(name: str, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or sorted(value) != sorted(letters)):
            raise _fail(name, f"None or an order of the letters {', '.join(letters)}", value)
        return value
    return check


ATTRIBUTES: dict[str, Callable[[str, Any], Any]] = {
    "axis": _int,  # negative counts from the end
    "axes": _optional_ints,  # None: every axis; [] reduces none, as numpy's axis=()
    "keepdims": _bool,
    "transpose_b": _bool,  # MATMUL: B given as [..., N, K], used transposed (a LINEAR's weight)
    "new_shape": _new_shape,  # one -1 allowed, taking what the others leave
    "perms": _perms,  # None: the dims reversed
    "start": lambda name, value: _ints(name, value, low=0),
    "size": lambda name, value: _ints(name, value, low=-1),  # -1: to the end of the dim
    "padding": _padding,  # [before, after] per dim
    "pad_value": _number,
    "indices": _ints,  # negative counts from the end of the axis
    "epsilon": _epsilon,
    "alpha": _float,
    "approximate": _choice("none", "tanh"),
    "min": _number,
    "max": _number,
    "dtype": _choice(*DTYPES),
    "stride": lambda name, value: _ints(name, value, low=1),  # per spatial dim
    "dilation": lambda name, value: _ints(name, value, low=1),
    "kernel": lambda name, value: _ints(name, value, low=1),  # a pooling window's extent per spatial dim
    "groups": lambda name, value: _positive(name, value),
    "layout": _choice("NHWC", "NCHW"),
    "weight_layout": _dim_order("OHWI"),  # CONV2D: its weights' dim order (None: the layout's, OHWI or OIHW)
    "count_include_pad": _bool,
    "beta": _float,  # HARD_SIGMOID's offset
    "gamma": _float,  # SELU's scale
    "detect_positive": _bool,  # IS_INF: +inf counts
    "detect_negative": _bool,  # IS_INF: -inf counts
    "fmod": _bool,  # MOD: C's fmod (the dividend's sign), else the divisor's sign (Python's %)
    "halves": _choice("to_even", "away_from_zero"),  # ROUND: where a value halfway between integers goes
    "select_last_index": _bool,  # ARGMAX, ARGMIN: the last of equal extremes, else the first
    "exclusive": _bool,  # CUMSUM: each element's own value left out of its sum
    "reverse": _bool,  # CUMSUM: summed from the end of the axis
    "descending": _bool,  # SORT, ARGSORT: the largest first
    "total_order": _bool,  # SORT, ARGSORT: floats in IEEE's total order (-0.0 before 0.0, a NaN by its sign)
    # QUANTIZED_ADD: each operand's and the result's quantization, [scale, zero point]
    "a_quantization": _quantization,
    "b_quantization": _quantization,
    "quantization": _quantization,
}
