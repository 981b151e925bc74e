"""The map family: ops applied element by element, n-ary ones with numpy broadcasting.

Each op is one line or one small function `fn(*operands, **attrs)`, called on operands already
in the compute dtype. `work` is the vector-unit work per output element (see OpDef.vector_work),
one simple op unless the declaration says otherwise: a broadcast operand costs nothing extra,
each output element is computed once.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..dtypes import is_integer, numpy_dtype
from .base import (
    REQUIRED, MagnitudeRule, OpDef, Shape, ShapeError, broadcast, compute_dtype, convert, elements, register,
    tile_compute_dtype,
)

SIMPLE = {"simple": 1}
TRANSCENDENTAL = {"transcendental": 1}


def map_op(name: str, arity: int | tuple[int, int], fn: Callable[..., np.ndarray], doc: str,
           work: dict[str, int] | Callable[[dict[str, Any]], dict[str, int]] = SIMPLE,
           exact: bool = False, predicate: bool = False, attrs: dict[str, Any] | None = None,
           magnitude: MapRule | None = None, integers: bool = False,
           shapes: Callable[[list[Shape], list[str], dict[str, Any]], list[Shape]] | None = None,
           rule: MagnitudeRule | None = None) -> OpDef:
    """Declare a map op of `arity` operands (or (fewest, most)). `exact`: integer operands and results compute in integers (else in
    float, see base). `predicate`: the result is a truth value (bool, stored as 0/1 in the
    declared dtype: DFX has no bool type, a `.dfg` i1 is u8), so the operands alone choose the
    compute dtype. `magnitude(operand values, their magnitudes, attrs)`: each element's
    (OpDef.magnitude), None for its own size alone; `rule`, OpDef.magnitude itself, where it needs
    the check's rtol. `integers`: the shape rule refuses operands
    of another dtype (bitwise ops). `shapes`: a shape rule of its own (broadcasting, and a check of
    the attributes)."""

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
        results = [] if predicate else [numpy_dtype(d) for d in out_dtypes]
        ct = compute_dtype([x.dtype for x in arrays] + results, exact)
        y = _apply(fn, [x.astype(ct) for x in arrays], attrs)
        return [convert(y, out_dtypes[0])]

    def tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
        # a predicate compares in its operands' dtype, as the reference: the accumulation dtype
        # counts the result, and an f32 truth value would compare i32 operands in f32
        ct = _operands_dtype(tiles, exact) if predicate else tile_compute_dtype(acc, exact)
        return _apply(fn, [t.astype(ct, copy=False) for t in tiles], attrs)

    def vector_work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
        per_element = work(attrs) if callable(work) else work
        return {cls: n * elements(out_shape) for cls, n in per_element.items()}

    def magnitudes(values: list[np.ndarray], magnitudes: list[np.ndarray], attrs: dict[str, Any],
                   rtol: float) -> list[np.ndarray]:
        return [magnitude(values, magnitudes, attrs)]

    fewest, most = arity if isinstance(arity, tuple) else (arity, arity)
    return register(OpDef(name=name, min_inputs=fewest, max_inputs=most,
                          infer_shapes=shapes or (_integer_shapes(name) if integers else _broadcast_shapes),
                          reference=reference,
                          compute_type=f"ELEMENTWISE_{name}", doc=doc, family="map",
                          attrs=attrs or {}, tile=tile, vector_work=vector_work, exact=exact, predicate=predicate,
                          magnitude=rule or (None if magnitude is None else magnitudes)))


def _operands_dtype(tiles: list[np.ndarray], exact: bool) -> np.dtype:
    """The dtype a predicate's tile compares in, from its operand tiles as they are held (a fused
    operand in its compute dtype): the reference's rule without the result, with i32 for its
    int64 (no DFX integer, nor a tile's, is wider, so the comparison is as exact)."""
    ct = compute_dtype([t.dtype for t in tiles], exact)
    return np.dtype(np.int32) if ct.kind in "iu" else ct


def _broadcast_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    return [broadcast(shapes)]


def _integer_shapes(name: str) -> Callable[[list[Shape], list[str], dict[str, Any]], list[Shape]]:
    def rule(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
        other = next((d for d in dtypes if not is_integer(d)), None)
        if other is not None:
            raise ShapeError(f"{name} takes integer operands, got {other}")
        return [broadcast(shapes)]
    return rule


def _apply(fn: Callable[..., np.ndarray], operands: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    # inf and NaN are the IEEE answers (log 0, 1/0, exp overflow), not errors to warn about
    with np.errstate(all="ignore"):
        return np.asarray(fn(*operands, **attrs))


# ---- magnitudes ------------------------------------------------------------------------------
# How far the operands' errors (each about the unit roundoff times its magnitude) move an
# element, to first order: the sum of their magnitudes for a sum, |f'(x)| times x's for a
# function of one operand. An op that moves its result no further than its operand (a selection,
# a clamp) passes the operand's on. Comparisons have none: each is exact, 0 or 1.

# a map op's rule: OpDef.magnitude's for its one result
MapRule = Callable[[list[np.ndarray], list[np.ndarray], dict[str, Any]], np.ndarray]


def _sum(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return m[0] + m[1]


def _follows(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return m[0]


def _either(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """The larger of the last two operands' (a SELECT's condition is exact)."""
    return np.maximum(m[-2], m[-1])


def _product(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return np.abs(x[1]) * m[0] + np.abs(x[0]) * m[1]


def _quotient(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return (m[0] + np.abs(x[0] / x[1]) * m[1]) / np.abs(x[1])


def _power(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    a, b = x
    return np.abs(np.power(a, b)) * (np.abs(b) * m[0] / np.abs(a) + np.abs(np.log(np.abs(a))) * m[1])


def _slope(derivative: Callable[[np.ndarray], np.ndarray]) -> MapRule:
    """The rule of a function of one operand: |f'(x)| times x's magnitude."""
    return lambda x, m, attrs: np.abs(derivative(x[0])) * m[0]


# ---- arithmetic ------------------------------------------------------------------------------


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return a / b
    # integers (only when every operand and the result is one): truncate toward zero as C,
    # ONNX and TOSA's INTDIV do; numpy floors, so step back toward zero where signs differ. A
    # division by zero sets every bit (-1; an unsigned type's largest), as XLA's CPU and GPU
    # backends and RISC-V's divider give (C, ONNX and XLA's spec leave it open)
    by_zero, b = b == 0, np.where(b == 0, np.ones_like(b), b)
    q = np.floor_divide(a, b)
    q = np.where((q < 0) & (q * b != a), q + 1, q)
    return np.where(by_zero, np.array(-1).astype(q.dtype), q)


map_op("ADD", 2, np.add, "a + b", exact=True, magnitude=_sum)
map_op("SUB", 2, np.subtract, "a - b", exact=True, magnitude=_sum)
map_op("MUL", 2, np.multiply, "a * b", exact=True, magnitude=_product)
map_op("DIV", 2, _divide, "a / b; on integers truncated toward zero, x / 0 = -1 (every bit set)", TRANSCENDENTAL, exact=True,
       magnitude=_quotient)
map_op("POW", 2, np.power, "a ** b, in float", TRANSCENDENTAL, magnitude=_power)
# NaN propagates, as numpy.maximum and IEEE 754-2019 maximum
map_op("MAXIMUM", 2, np.maximum, "max(a, b); NaN if either is NaN", exact=True, magnitude=_either)
map_op("MINIMUM", 2, np.minimum, "min(a, b); NaN if either is NaN", exact=True, magnitude=_either)
map_op("ABS", 1, np.abs, "|x|", exact=True, magnitude=_follows)
map_op("NEGATE", 1, np.negative, "-x", exact=True, magnitude=_follows)
map_op("RECIPROCAL", 1, lambda x: 1 / x, "1 / x", TRANSCENDENTAL, magnitude=_slope(lambda x: 1 / (x * x)))


# ---- transcendental --------------------------------------------------------------------------

# numpy has no erf: math.erf per element, in float64 (exact to the double), rounded back
_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf64(x.astype(np.float64)), dtype=np.float64).astype(x.dtype, copy=False)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| only, so neither branch overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) below
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _sigmoid_slope(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return s * (1 - s)


map_op("EXP", 1, np.exp, "e ** x", TRANSCENDENTAL, magnitude=_slope(np.exp))
map_op("LOG", 1, np.log, "natural log; -inf at 0, NaN below", TRANSCENDENTAL, magnitude=_slope(lambda x: 1 / x))
map_op("SQRT", 1, np.sqrt, "square root; NaN below 0", TRANSCENDENTAL, magnitude=_slope(lambda x: 0.5 / np.sqrt(x)))
map_op("RSQRT", 1, lambda x: 1 / np.sqrt(x), "1 / sqrt(x)", TRANSCENDENTAL,
       magnitude=_slope(lambda x: 0.5 / (x * np.sqrt(x))))
map_op("TANH", 1, np.tanh, "tanh(x)", TRANSCENDENTAL, magnitude=_slope(lambda x: 1 - np.tanh(x) ** 2))
map_op("SIGMOID", 1, _sigmoid, "1 / (1 + exp(-x)), without overflow for large |x|", TRANSCENDENTAL,
       magnitude=_slope(_sigmoid_slope))
map_op("ERF", 1, _erf, "the error function", TRANSCENDENTAL,
       magnitude=_slope(lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x)))
# in radians (a rotary embedding's angles)
map_op("SIN", 1, np.sin, "sine of x", TRANSCENDENTAL, magnitude=_slope(np.cos))
map_op("COS", 1, np.cos, "cosine of x", TRANSCENDENTAL, magnitude=_slope(np.sin))
map_op("TAN", 1, np.tan, "tangent of x", TRANSCENDENTAL, magnitude=_slope(lambda x: 1 / np.cos(x) ** 2))


# ---- activations -----------------------------------------------------------------------------


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x * (1 / math.sqrt(2))))


def _gelu_slope(x: np.ndarray) -> np.ndarray:
    """Phi(x) + x phi(x), the erf form's; the tanh approximation's differs by less than 1e-3."""
    return 0.5 * (1 + _erf(x * (1 / math.sqrt(2)))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


# erf form: scale by 1/sqrt(2), erf, add 1, two multiplies (0.5 and x).
# tanh form: cube (2 multiplies), multiply by 0.044715, add x, scale, tanh, add 1, two multiplies.
_GELU_WORK = {"none": {"simple": 4, "transcendental": 1}, "tanh": {"simple": 8, "transcendental": 1}}

map_op("RELU", 1, lambda x: np.maximum(x, 0), "max(x, 0)", exact=True, magnitude=_follows)
map_op("LEAKY_RELU", 1, lambda x, alpha: np.where(x < 0, alpha * x, x), "x if x >= 0 else alpha * x",
       {"simple": 2}, attrs={"alpha": 0.01},  # multiply, select
       magnitude=lambda x, m, attrs: m[0] * max(1.0, abs(attrs["alpha"])))
map_op("GELU", 1, _gelu, "x * Phi(x): 0.5 x (1 + erf(x / sqrt 2)), or its tanh approximation",
       lambda attrs: _GELU_WORK[attrs["approximate"]], attrs={"approximate": "none"}, magnitude=_slope(_gelu_slope))
map_op("SILU", 1, lambda x: x * _sigmoid(x), "x * sigmoid(x) (swish)", {"simple": 1, "transcendental": 1},
       magnitude=_slope(lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))))
map_op("CLAMP", 1, lambda x, min, max: np.minimum(np.maximum(x, min), max),
       "min(max(x, min), max) (max wins where min > max, as numpy.clip)", {"simple": 2},
       exact=True, attrs={"min": -math.inf, "max": math.inf}, magnitude=_follows)


# ---- conversion, comparison, selection -------------------------------------------------------

# CAST is the rounding alone: converted straight from the operand's dtype, never through a
# compute dtype (an i32 through f32 to bf16 would round twice).


def _cast_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    return [convert(convert(arrays[0], attrs["dtype"]), out_dtypes[0])]


def _cast_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
    return convert(tiles[0], attrs["dtype"])


register(OpDef(name="CAST", min_inputs=1, max_inputs=1, infer_shapes=_broadcast_shapes, reference=_cast_reference,
               compute_type="ELEMENTWISE_CAST", family="map", attrs={"dtype": REQUIRED}, tile=_cast_tile,
               magnitude=lambda values, magnitudes, attrs, rtol: magnitudes[:1],
               vector_work=lambda in_shapes, out_shape, attrs: {"simple": elements(out_shape)},
               doc="x converted to `dtype` (the graph's output dtype should be the same): float to integer "
                   "truncates toward zero and saturates, NaN giving 0; integer to integer wraps"))

map_op("EQUAL", 2, np.equal, "a == b, 1 or 0", exact=True, predicate=True)
map_op("GREATER", 2, np.greater, "a > b, 1 or 0", exact=True, predicate=True)
map_op("GREATER_EQUAL", 2, np.greater_equal, "a >= b, 1 or 0", exact=True, predicate=True)
map_op("LESS", 2, np.less, "a < b, 1 or 0", exact=True, predicate=True)
map_op("LESS_EQUAL", 2, np.less_equal, "a <= b, 1 or 0", exact=True, predicate=True)
# the condition arrives in the compute dtype: nonzero selects a, as numpy.where
map_op("SELECT", 3, np.where, "a where cond (nonzero) else b; operands cond, a, b", exact=True,
       magnitude=_either)


# ---- more activations, rounding, logic (the ONNX ops real models use) -------------------------
# Each as its ONNX spec defines it; an integer operand of a rounding op is its own result.


def _integral(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda x, **attrs: x if x.dtype.kind in "iub" else fn(x, **attrs)


def _round(x: np.ndarray, halves: str) -> np.ndarray:
    if halves == "to_even":
        return np.rint(x)
    # away from zero: the integer part, one step further out where the fraction (exact: x minus
    # its integer part never rounds) is a half or more; never x + 0.5, which rounds 0.49999997 up
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole)


def _softplus(x: np.ndarray) -> np.ndarray:
    """ln(exp(x) + 1) as max(x, 0) + ln(1 + exp(-|x|)): neither overflows nor loses the small ones."""
    return np.logaddexp(np.zeros_like(x), x)


def _mish_slope(x: np.ndarray) -> np.ndarray:
    t = np.tanh(_softplus(x))
    return t + x * (1 - t * t) * _sigmoid(x)


def _hard_swish_slope(x: np.ndarray) -> np.ndarray:
    return np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6))


def _is_inf(x: np.ndarray, detect_positive: bool, detect_negative: bool) -> np.ndarray:
    return (detect_positive & (x == np.inf)) | (detect_negative & (x == -np.inf))


def _mod(a: np.ndarray, b: np.ndarray, fmod: bool) -> np.ndarray:
    # fmod: a - trunc(a / b) * b, the dividend's sign (C's fmod); else a - floor(a / b) * b, the
    # divisor's (numpy.mod, Python's %, on floats too: -0 and inf as ONNX says). Integers: x mod 0
    # = x, the remainder XLA's CPU and GPU backends and RISC-V's divider leave (as DIV's x / 0)
    if a.dtype.kind == "f":
        return np.fmod(a, b) if fmod else np.mod(a, b)
    by_zero, b = b == 0, np.where(b == 0, np.ones_like(b), b)
    return np.where(by_zero, a, np.fmod(a, b) if fmod else np.mod(a, b))


def _mod_work(attrs: dict[str, Any]) -> dict[str, int]:
    # divide; truncate, multiply, subtract; floor mod: compare signs, select, add the divisor
    return {"transcendental": 1, "simple": 3 if attrs["fmod"] else 6}


_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875

map_op("HARD_SIGMOID", 1, lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1), "max(0, min(1, alpha x + beta))",
       {"simple": 4}, attrs={"alpha": 0.2, "beta": 0.5},  # multiply, add, max, min
       magnitude=lambda x, m, attrs: abs(attrs["alpha"]) * m[0])
map_op("HARD_SWISH", 1, lambda x: x * np.clip(x * (1 / 6) + 0.5, 0, 1), "x max(0, min(1, x / 6 + 1/2))",
       {"simple": 5}, magnitude=_slope(_hard_swish_slope))
map_op("SOFTPLUS", 1, _softplus, "ln(exp(x) + 1), without overflow", {"simple": 3, "transcendental": 2},
       magnitude=_slope(_sigmoid))
map_op("ELU", 1, lambda x, alpha: np.where(x < 0, alpha * np.expm1(np.minimum(x, 0)), x),
       "x if x >= 0 else alpha (exp(x) - 1)", {"simple": 3, "transcendental": 1}, attrs={"alpha": 1.0},
       magnitude=lambda x, m, attrs: m[0] * np.where(x[0] < 0, abs(attrs["alpha"]) * np.exp(np.minimum(x[0], 0)), 1))
map_op("SELU", 1, lambda x, alpha, gamma: gamma * np.where(x <= 0, alpha * np.expm1(np.minimum(x, 0)), x),
       "gamma x if x > 0 else gamma alpha (exp(x) - 1)", {"simple": 4, "transcendental": 1},
       attrs={"alpha": _SELU_ALPHA, "gamma": _SELU_GAMMA},
       magnitude=lambda x, m, attrs: m[0] * abs(attrs["gamma"]) * np.where(
           x[0] <= 0, abs(attrs["alpha"]) * np.exp(np.minimum(x[0], 0)), 1))
map_op("MISH", 1, lambda x: x * np.tanh(_softplus(x)), "x tanh(softplus(x))", {"simple": 4, "transcendental": 3},
       magnitude=_slope(_mish_slope))
map_op("PRELU", 2, lambda x, slope: np.where(x < 0, slope * x, x), "x if x >= 0 else slope * x; operands x, slope",
       {"simple": 2}, exact=True,  # multiply, select
       magnitude=lambda x, m, attrs: np.where(x[0] < 0, np.abs(x[1]) * m[0] + np.abs(x[0]) * m[1], m[0]))
map_op("FLOOR", 1, _integral(np.floor), "the largest integer <= x", exact=True, magnitude=_follows)
map_op("CEIL", 1, _integral(np.ceil), "the smallest integer >= x", exact=True, magnitude=_follows)
map_op("ROUND", 1, _integral(_round), "the nearest integer, halves to even (or with halves 'away_from_zero', "
       "away from zero, as C's round)", lambda attrs: SIMPLE if attrs["halves"] == "to_even" else {"simple": 5},
       exact=True, attrs={"halves": "to_even"}, magnitude=_follows)  # trunc, subtract, abs, compare, select
map_op("SIGN", 1, np.sign, "1, 0 or -1 as x is above, at or below 0; NaN for NaN", {"simple": 2}, exact=True)
map_op("MOD", 2, _mod, "a mod b: with fmod, the dividend's sign (C fmod); else the divisor's (a - floor(a/b) b)",
       _mod_work, exact=True, attrs={"fmod": False},
       magnitude=lambda x, m, attrs: m[0] + np.abs(x[0] / x[1]) * m[1])
map_op("IS_NAN", 1, np.isnan, "x is NaN, 1 or 0", exact=True, predicate=True)
map_op("IS_INF", 1, _is_inf, "x is +inf (if detect_positive) or -inf (if detect_negative), 1 or 0", {"simple": 2},
       exact=True, predicate=True, attrs={"detect_positive": True, "detect_negative": True})
# truth values: nonzero is true
map_op("LOGICAL_AND", 2, np.logical_and, "a and b, 1 or 0", exact=True, predicate=True)
map_op("LOGICAL_OR", 2, np.logical_or, "a or b, 1 or 0", exact=True, predicate=True)
map_op("LOGICAL_XOR", 2, np.logical_xor, "a xor b, 1 or 0", exact=True, predicate=True)
map_op("LOGICAL_NOT", 1, np.logical_not, "not x, 1 or 0", exact=True, predicate=True)


# ---- the rest of XLA's elementwise set ---------------------------------------------------------


def _angle(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """atan2(a, b)'s: its slopes are b / (a^2 + b^2) along a and -a / (a^2 + b^2) along b."""
    a, b = x
    return (np.abs(b) * m[0] + np.abs(a) * m[1]) / (a * a + b * b)


def _bitwise(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    # on integers whatever dtype a tile holds them in: a truth value a compare fused before it
    # made arrives as a bool, or as a float 0 or 1 in a float kernel
    return lambda *xs: fn(*(x if x.dtype.kind in "iu" else x.astype(np.int64) for x in xs))


map_op("EXPM1", 1, np.expm1, "e ** x - 1, without exp's cancellation near 0", TRANSCENDENTAL, magnitude=_slope(np.exp))
map_op("LOG1P", 1, np.log1p, "ln(1 + x), without the rounding of 1 + x near 0; -inf at -1, NaN below",
       TRANSCENDENTAL, magnitude=_slope(lambda x: 1 / (1 + x)))
map_op("CBRT", 1, np.cbrt, "the real cube root, negative below 0", TRANSCENDENTAL,
       magnitude=_slope(lambda x: 1 / (3 * np.cbrt(x) ** 2)))
# the quotient's angle, then its quadrant from the signs: divide and arctangent; 2 compares, a select, an add
map_op("ATAN2", 2, np.arctan2, "the angle of the point (b, a) from the x axis, in [-pi, pi] (C's atan2(a, b)); "
       "operands a (y), b (x)", {"transcendental": 2, "simple": 4}, magnitude=_angle)
map_op("IS_FINITE", 1, np.isfinite, "x is neither inf nor NaN, 1 or 0", {"simple": 2}, exact=True, predicate=True)
map_op("BITWISE_AND", 2, _bitwise(np.bitwise_and), "a & b, bit by bit", exact=True, integers=True)
map_op("BITWISE_OR", 2, _bitwise(np.bitwise_or), "a | b, bit by bit", exact=True, integers=True)
map_op("BITWISE_XOR", 2, _bitwise(np.bitwise_xor), "a ^ b, bit by bit", exact=True, integers=True)
map_op("BITWISE_NOT", 1, _bitwise(np.invert), "~x, every bit flipped (-x - 1 of a signed integer)", exact=True,
       integers=True)
