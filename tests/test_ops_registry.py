"""The op registry: every op against a computation written independently of it (explicit
loops, Python floats and the `math` module per element), its shape errors, the tile meaning of
the computing ops and their vector work."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

from dfx import REGISTRY, ShapeError, accumulation_dtype, dtype_of, numpy_dtype, tolerance
from dfx import ops as registry
from dfx.ops.base import convert

RNG = np.random.default_rng(2024)
F32 = np.float32


def uniform(shape, low=-3.0, high=3.0, dtype=F32) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(dtype)


def name_of(x: np.ndarray) -> str:
    return "u8" if x.dtype == bool else dtype_of(x)  # DFX holds truth values in u8


def run(name: str, arrays: list[np.ndarray], out: str = "f32", **attrs) -> np.ndarray:
    """The reference result, after checking it has the shape the shape rule derives."""
    op = registry.lookup(name)
    attrs = op.normalize_attrs(attrs)
    [shape] = op.infer_shapes([x.shape for x in arrays], [name_of(x) for x in arrays], attrs)
    [y] = op.reference(arrays, attrs, [out])
    assert y.shape == shape
    return y


def assert_close(y: np.ndarray, expected, dtype: str) -> None:
    atol, rtol = tolerance(dtype)
    assert y.dtype == numpy_dtype(dtype)
    np.testing.assert_allclose(y.astype(np.float64), np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


def shape_error(name: str, shapes: list[tuple[int, ...]], **attrs) -> str:
    op = registry.lookup(name)
    with pytest.raises(ShapeError) as exc:
        op.infer_shapes(shapes, ["f32"] * len(shapes), op.normalize_attrs(attrs))
    message = str(exc.value)
    assert "\n" not in message
    return message


def attr_error(name: str, **attrs) -> str:
    with pytest.raises(ShapeError) as exc:
        registry.lookup(name).normalize_attrs(attrs)
    assert "\n" not in str(exc.value)
    return str(exc.value)


# ---- the independent computations -------------------------------------------------------------


def per_element(fn, *arrays: np.ndarray) -> np.ndarray:
    """fn on Python floats, one output element at a time; broadcasting done by index arithmetic."""
    rank = max(a.ndim for a in arrays)
    shapes = [(1,) * (rank - a.ndim) + a.shape for a in arrays]
    out_shape = tuple(max(dims) for dims in zip(*shapes))
    out = np.empty(out_shape, dtype=np.float64)
    for index in itertools.product(*map(range, out_shape)):
        args = [float(a.reshape(s)[tuple(0 if d == 1 else i for i, d in zip(index, s))]) for a, s in zip(arrays, shapes)]
        out[index] = fn(*args)
    return out


def groups(x: np.ndarray, axes: tuple[int, ...]) -> dict[tuple[int, ...], list[tuple[tuple[int, ...], float]]]:
    """kept index -> [(full index, value)] of the elements that reduce together over `axes`."""
    grouped: dict = {}
    for index in itertools.product(*map(range, x.shape)):
        kept = tuple(i for k, i in enumerate(index) if k not in axes)
        grouped.setdefault(kept, []).append((index, float(x[index])))
    return grouped


def reduce_by_loops(x: np.ndarray, axes: tuple[int, ...], keepdims: bool, fn) -> np.ndarray:
    kept_shape = tuple(d for k, d in enumerate(x.shape) if k not in axes)
    out = np.empty(kept_shape, dtype=np.float64)
    for kept, members in groups(x, axes).items():
        out[kept] = fn([v for _, v in members])
    if keepdims:
        out = out.reshape(tuple(1 if k in axes else d for k, d in enumerate(x.shape)))
    return out


def softmax_by_loops(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    out = np.empty(x.shape, dtype=np.float64)
    for members in groups(x, (axis % x.ndim,)).values():
        top = max(v for _, v in members)
        logsumexp = top + math.log(math.fsum(math.exp(v - top) for _, v in members))
        for index, v in members:
            out[index] = v - logsumexp if log else math.exp(v - logsumexp)
    return out


# ---- map ops ----------------------------------------------------------------------------------


def _gelu_erf(x):
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# name -> (per-element meaning, input range, attrs)
UNARY = {
    "ABS": (abs, (-3, 3), {}),
    "NEGATE": (lambda x: -x, (-3, 3), {}),
    "RECIPROCAL": (lambda x: 1 / x, (0.5, 3), {}),
    "EXP": (math.exp, (-3, 3), {}),
    "LOG": (math.log, (0.1, 5), {}),
    "SQRT": (math.sqrt, (0, 5), {}),
    "RSQRT": (lambda x: 1 / math.sqrt(x), (0.1, 5), {}),
    "RELU": (lambda x: x if x > 0 else 0.0, (-3, 3), {}),
    "LEAKY_RELU": (lambda x: x if x >= 0 else 0.2 * x, (-3, 3), {"alpha": 0.2}),
    "SIGMOID": (lambda x: 1 / (1 + math.exp(-x)), (-8, 8), {}),
    "TANH": (math.tanh, (-3, 3), {}),
    "ERF": (math.erf, (-3, 3), {}),
    "SIN": (math.sin, (-7, 7), {}),
    "COS": (math.cos, (-7, 7), {}),
    "TAN": (math.tan, (-1.4, 1.4), {}),
    "GELU": (_gelu_erf, (-4, 4), {}),
    "SILU": (lambda x: x / (1 + math.exp(-x)), (-8, 8), {}),
    "CLAMP": (lambda x: min(max(x, -1.0), 2.0), (-3, 3), {"min": -1, "max": 2.0}),
    "HARD_SIGMOID": (lambda x: max(0.0, min(1.0, 0.3 * x + 0.4)), (-5, 5), {"alpha": 0.3, "beta": 0.4}),
    "HARD_SWISH": (lambda x: x * max(0.0, min(1.0, x / 6 + 0.5)), (-5, 5), {}),
    "SOFTPLUS": (lambda x: math.log(math.exp(x) + 1), (-5, 5), {}),
    "ELU": (lambda x: x if x >= 0 else 0.7 * (math.exp(x) - 1), (-3, 3), {"alpha": 0.7}),
    "SELU": (lambda x: 1.5 * x if x > 0 else 1.5 * (2.0 * math.exp(x) - 2.0), (-3, 3), {"alpha": 2.0, "gamma": 1.5}),
    "MISH": (lambda x: x * math.tanh(math.log(1 + math.exp(x))), (-5, 5), {}),
    "FLOOR": (math.floor, (-3, 3), {}),
    "CEIL": (math.ceil, (-3, 3), {}),
    "ROUND": (round, (-3, 3), {}),  # Python's round: halves to even
    "SIGN": (lambda x: (x > 0) - (x < 0), (-3, 3), {}),
    "IS_NAN": (math.isnan, (-3, 3), {}),
    "IS_INF": (math.isinf, (-3, 3), {}),
    "LOGICAL_NOT": (lambda x: not x, (-3, 3), {}),
    "EXPM1": (math.expm1, (-3, 3), {}),
    "LOG1P": (math.log1p, (-0.9, 3), {}),
    "CBRT": (lambda x: math.copysign(abs(x) ** (1 / 3), x), (-3, 3), {}),
    "IS_FINITE": (math.isfinite, (-3, 3), {}),
}
BINARY = {
    "ADD": (lambda a, b: a + b, (-3, 3)),
    "SUB": (lambda a, b: a - b, (-3, 3)),
    "MUL": (lambda a, b: a * b, (-3, 3)),
    "DIV": (lambda a, b: a / b, (0.5, 3)),
    "POW": (math.pow, (0.5, 2)),
    "MAXIMUM": (max, (-3, 3)),
    "MINIMUM": (min, (-3, 3)),
    "EQUAL": (lambda a, b: a == b, (-3, 3)),
    "GREATER": (lambda a, b: a > b, (-3, 3)),
    "GREATER_EQUAL": (lambda a, b: a >= b, (-3, 3)),
    "LESS": (lambda a, b: a < b, (-3, 3)),
    "LESS_EQUAL": (lambda a, b: a <= b, (-3, 3)),
    "PRELU": (lambda x, slope: x if x >= 0 else slope * x, (-3, 3)),
    "MOD": (lambda a, b: a - math.floor(a / b) * b, (-3, 3)),
    "LOGICAL_AND": (lambda a, b: bool(a) and bool(b), (-3, 3)),
    "LOGICAL_OR": (lambda a, b: bool(a) or bool(b), (-3, 3)),
    "LOGICAL_XOR": (lambda a, b: bool(a) != bool(b), (-3, 3)),
    "ATAN2": (math.atan2, (-3, 3)),
}
PREDICATES = {"EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_XOR",
              "LOGICAL_NOT", "IS_NAN", "IS_INF", "IS_FINITE"}


@pytest.mark.parametrize("name", UNARY)
def test_unary_per_element(name):
    fn, (low, high), attrs = UNARY[name]
    x = uniform((3, 5), low, high)
    assert_close(run(name, [x], **attrs), per_element(fn, x), "f32")


@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasts(name):
    fn, (low, high) = BINARY[name]
    a, b = uniform((2, 1, 3), low, high), uniform((4, 1), low, high)
    b[0, 0] = a[0, 0, 0]  # one tie for the comparisons
    if name in PREDICATES:  # truth values, stored as 0/1 (a .dfg i1 is u8)
        y = run(name, [a, b], out="u8")
        assert y.dtype == np.uint8 and y.shape == (2, 4, 3)
        np.testing.assert_array_equal(y, per_element(fn, a, b))
    else:
        assert_close(run(name, [a, b]), per_element(fn, a, b), "f32")


def test_select_broadcasts_condition_and_operands():
    a, b = uniform((1, 3)), uniform((2, 1))
    cond = run("GREATER", [a, b], out="u8")
    y = run("SELECT", [cond, a, np.float32([7.0])])
    assert_close(y, per_element(lambda c, x, z: x if c else z, cond, a, np.float32([7.0])), "f32")
    y = run("SELECT", [np.array([[True], [False]]), np.int32([1, 2, 3]), np.int32([-1])], out="i32")
    np.testing.assert_array_equal(y, [[1, 2, 3], [-1, -1, -1]])


def test_erf_and_gelu_match_math_erf_per_element():
    x = np.concatenate([np.linspace(-6, 6, 49), [1e-300, -1e-12, 0.0, 30.0]])
    np.testing.assert_array_equal(run("ERF", [x], out="f64"), [math.erf(v) for v in x])
    assert_close(run("GELU", [x], out="f64"), [_gelu_erf(v) for v in x], "f64")
    assert_close(run("GELU", [x], out="f64", approximate="tanh"), [_gelu_tanh(v) for v in x], "f64")


def test_sigmoid_is_stable_at_the_extremes():
    with np.errstate(all="raise"):  # no overflow even in the reference's intermediate steps
        y = run("SIGMOID", [np.float32([-1000, -50, 0, 50, 1000])])
    assert_close(y, [0, 1 / (1 + math.exp(50)), 0.5, 1 / (1 + math.exp(-50)), 1], "f32")


def test_clamp_defaults_are_unbounded_and_integers_stay_exact():
    x = uniform((4,), -1e30, 1e30)
    np.testing.assert_array_equal(run("CLAMP", [x]), x)
    big = np.int32([-2**31, 16777217, 2**31 - 1])
    np.testing.assert_array_equal(run("CLAMP", [big], out="i32", min=0), [0, 16777217, 2**31 - 1])


def test_rounding_mod_and_truth_value_edges():
    halves = np.float32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0])
    np.testing.assert_array_equal(run("ROUND", [halves]), [-2, -2, -0.0, 0, 2, 2, -0.0])
    away = np.float32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.3])  # not x + 0.5, which rounds up
    np.testing.assert_array_equal(run("ROUND", [away], halves="away_from_zero"), [-3, -2, -1, 1, 2, 3, 0, -0.0])
    np.testing.assert_array_equal(run("FLOOR", [halves]), [-3, -2, -1, 0, 1, 2, 0])
    np.testing.assert_array_equal(run("CEIL", [halves]), [-2, -1, 0, 1, 2, 3, 0])
    big = np.int32([2**31 - 1, -2**31 + 1])  # integers are their own rounding, never through f32
    np.testing.assert_array_equal(run("FLOOR", [big], out="i32"), big)
    np.testing.assert_array_equal(run("SIGN", [np.float32([-2, 0, 3, np.nan])]), [-1, 0, 1, np.nan])
    a, b = np.int32([7, -7, 7, -7, 0]), np.int32([3, 3, -3, -3, 5])
    np.testing.assert_array_equal(run("MOD", [a, b], out="i32"), [1, 2, -2, -1, 0])  # the divisor's sign
    np.testing.assert_array_equal(run("MOD", [a, b], out="i32", fmod=True), [1, -1, 1, -1, 0])  # the dividend's
    np.testing.assert_array_equal(run("MOD", [np.float32([5.5, -5.5]), np.float32([-2])], fmod=True), [1.5, -1.5])
    x = np.float32([np.inf, -np.inf, np.nan, 0, 1])
    np.testing.assert_array_equal(run("IS_NAN", [x], out="u8"), [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(run("IS_INF", [x], out="u8"), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(run("IS_INF", [x], out="u8", detect_negative=False), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(run("IS_INF", [x], out="u8", detect_positive=False), [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(run("IS_FINITE", [x], out="u8"), [0, 0, 0, 1, 1])
    p, q = np.uint8([0, 0, 1, 1]), np.uint8([0, 1, 0, 1])
    for name, want in (("LOGICAL_AND", [0, 0, 0, 1]), ("LOGICAL_OR", [0, 1, 1, 1]), ("LOGICAL_XOR", [0, 1, 1, 0])):
        np.testing.assert_array_equal(run(name, [p, q], out="u8"), want)
    np.testing.assert_array_equal(run("LOGICAL_NOT", [p], out="u8"), [1, 1, 0, 0])
    with np.errstate(all="raise"):  # no overflow in the reference's steps
        y = run("SOFTPLUS", [np.float32([-200, 200])])
    np.testing.assert_array_equal(y, [0, 200])
    prelu = run("PRELU", [np.float32([[-2, 3], [-4, 0]]), np.float32([[0.5], [0.25]])])
    np.testing.assert_array_equal(prelu, [[-1, 3], [-1, 0]])


def test_bitwise_ops_take_integers_bit_by_bit():
    a, b = np.int32([-1, 12, 2**31 - 1, -2**31]), np.int32([0x0F0F0F0F, 10, -2, -1])
    for name, fn in (("BITWISE_AND", int.__and__), ("BITWISE_OR", int.__or__), ("BITWISE_XOR", int.__xor__)):
        np.testing.assert_array_equal(run(name, [a, b], out="i32"), [fn(x, y) for x, y in zip(a.tolist(), b.tolist())])
    np.testing.assert_array_equal(run("BITWISE_NOT", [a], out="i32"), [~x for x in a.tolist()])
    np.testing.assert_array_equal(run("BITWISE_NOT", [np.uint8([0, 1, 200])], out="u8"), [255, 254, 55])
    assert "BITWISE_AND takes integer operands, got f32" in shape_error("BITWISE_AND", [(2,), (2,)])


def test_integer_arithmetic_is_exact():
    a, b = np.int32([16777217, -7, 7, -8, 46340]), np.int32([0, 2, -2, 2, 46340])
    np.testing.assert_array_equal(run("ADD", [a, b], out="i32"), [x + y for x, y in zip(a.tolist(), b.tolist())])
    np.testing.assert_array_equal(run("MUL", [a[1:], b[1:]], out="i32"), [-14, -14, -16, 46340 * 46340])
    # truncation toward zero, as C and ONNX; x / 0 sets every bit and x mod 0 is x, as XLA's
    # CPU backend gives (jax.lax.div and jax.lax.rem)
    np.testing.assert_array_equal(run("DIV", [a, b], out="i32"), [-1, -3, -3, -4, 1])
    np.testing.assert_array_equal(run("MOD", [a, b], out="i32", fmod=True), [16777217, -1, 1, 0, 0])
    np.testing.assert_array_equal(run("MOD", [a, b], out="i32"), [16777217, 1, -1, 0, 0])
    np.testing.assert_array_equal(run("DIV", [np.uint8([7, 9]), np.uint8([0, 2])], out="u8"), [255, 4])
    np.testing.assert_array_equal(run("MAXIMUM", [a, b], out="i32"), np.int32([16777217, 2, 7, 2, 46340]))
    np.testing.assert_array_equal(run("LESS", [a, b], out="u8"), [0, 1, 0, 1, 0])
    # an i8 sum does not wrap in i8 on the way to an i32 result
    np.testing.assert_array_equal(run("REDUCE_SUM", [np.full((4,), 100, np.int8)], out="i32"), [400])


def test_cast_truncates_saturates_and_wraps():
    x = np.float32([-2.7, 2.7, np.nan, 1e20, -1e20, 127.9])
    np.testing.assert_array_equal(run("CAST", [x], out="i8", dtype="i8"), [-2, 2, 0, 127, -128, 127])
    np.testing.assert_array_equal(run("CAST", [np.int32([300, -129])], out="i8", dtype="i8"), [44, 127])
    np.testing.assert_array_equal(run("CAST", [np.array([True, False])], out="f32", dtype="f32"), [1.0, 0.0])
    # i32 to bf16 rounds once, straight from the integer
    y = run("CAST", [np.int32([16777217 + 2**17])], out="bf16", dtype="bf16")
    assert y.dtype == ml_dtypes.bfloat16 and float(y[0]) == float(ml_dtypes.bfloat16(16777217 + 2**17))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_inputs(dtype):
    npd = numpy_dtype(dtype)
    x, b = uniform((3, 4)).astype(npd), uniform((4,)).astype(npd)
    wide_x, wide_b = x.astype(np.float64), b.astype(np.float64)
    assert_close(run("ADD", [x, b], out=dtype), per_element(lambda p, q: p + q, wide_x, wide_b), dtype)
    assert_close(run("EXP", [x], out=dtype), per_element(math.exp, wide_x), dtype)
    assert_close(run("GELU", [x], out=dtype), per_element(_gelu_erf, wide_x), dtype)
    assert_close(run("SOFTMAX", [x], out=dtype), softmax_by_loops(wide_x, -1, log=False), dtype)
    mean = reduce_by_loops(wide_x, (0,), False, lambda v: math.fsum(v) / len(v))
    assert_close(run("REDUCE_MEAN", [x], out=dtype, axes=[0], keepdims=False), mean, dtype)
    assert_close(run("LAYERNORM", [x, b], out=dtype), layernorm_by_loops(wide_x, -1, 1e-5, wide_b, None), dtype)


# ---- reductions -------------------------------------------------------------------------------

REDUCERS = {
    "REDUCE_SUM": math.fsum,
    "REDUCE_PROD": math.prod,
    "REDUCE_MAX": max,
    "REDUCE_MIN": min,
    "REDUCE_MEAN": lambda v: math.fsum(v) / len(v),
}


@pytest.mark.parametrize("name", REDUCERS)
@pytest.mark.parametrize("axes,keepdims", [(None, True), ([0, 2], False), ([-1], True), ([1], False)])
def test_reductions(name, axes, keepdims):
    x = uniform((2, 3, 4), 0.5, 1.5)
    normalized = tuple(range(3)) if axes is None else tuple(a % 3 for a in axes)
    y = run(name, [x], axes=axes, keepdims=keepdims)
    assert_close(y, reduce_by_loops(x, normalized, keepdims, REDUCERS[name]), "f32")


def running_sums_by_loops(x: np.ndarray, axis: int, exclusive: bool, reverse: bool,
                          step=lambda total, v: total + v, start: float = 0.0) -> np.ndarray:
    """Each element's running reduction by `step` (a sum by default) from `start`, in float64."""
    out = np.empty(x.shape, dtype=np.float64)
    for members in groups(x, (axis,)).values():
        total = start
        for index, v in members[::-1] if reverse else members:
            out[index] = total if exclusive else step(total, v)
            total = step(total, v)
    return out


@pytest.mark.parametrize("axis", [0, -1])
def test_positions_and_running_sums(axis):
    x = np.round(uniform((3, 4, 5)))  # few values: ties in every row
    a = axis % 3

    def first(v: list[float]) -> int:
        return v.index(max(v))

    def last(v: list[float]) -> int:
        return len(v) - 1 - v[::-1].index(max(v))

    for name, sign in (("ARGMAX", 1), ("ARGMIN", -1)):  # the ARGMIN of x is the ARGMAX of -x
        for pick, select_last_index in ((first, False), (last, True)):
            y = run(name, [x], out="i32", axis=axis, keepdims=False, select_last_index=select_last_index)
            np.testing.assert_array_equal(y, reduce_by_loops(sign * x, (a,), False, pick))
    for exclusive, reverse in itertools.product((False, True), repeat=2):
        y = run("CUMSUM", [x], axis=axis, exclusive=exclusive, reverse=reverse)
        assert_close(y, running_sums_by_loops(x, a, exclusive, reverse), "f32")
    x[1, 2, 3] = np.nan  # from there on along the axis: NaN
    for name, step, start in (("CUMPROD", lambda t, v: t * v, 1.0),
                              ("CUMMAX", lambda t, v: v if v > t or math.isnan(v) else t, -math.inf),
                              ("CUMMIN", lambda t, v: v if v < t or math.isnan(v) else t, math.inf)):
        for reverse in (False, True):
            y = run(name, [x], axis=axis, reverse=reverse)
            assert_close(y, running_sums_by_loops(x, a, False, reverse, step, start), "f32")
    assert "axis 1 of [2, 0] is empty" in shape_error("ARGMAX", [(2, 0)], axis=1)


def sorted_by_loops(row: list[float], descending: bool) -> list[int]:
    """The positions of `row` in SORT's order, by insertion: each element goes after every one
    it does not come before (so equal ones keep their order); NaN is the largest."""
    def before(p: float, q: float) -> bool:
        if math.isnan(p) or math.isnan(q):
            return math.isnan(q) != descending and math.isnan(p) != math.isnan(q)
        return p > q if descending else p < q

    order: list[int] = []
    for i, v in enumerate(row):
        at = len(order)
        while at > 0 and before(v, row[order[at - 1]]):
            at -= 1
        order.insert(at, i)
    return order


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_keep_equal_values_in_order(axis, descending):
    x = np.round(uniform((4, 3, 6)))  # few values: ties in every row
    x[1, 2, 0] = x[0, 0, 3] = np.nan
    x[2, 1, 4], x[3, 1, 4] = -0.0, 0.0
    positions = run("ARGSORT", [x], out="i32", axis=axis, descending=descending)
    values = run("SORT", [x], axis=axis, descending=descending)
    moved = np.moveaxis(x, axis, -1)
    want = np.array([sorted_by_loops(list(r), descending) for r in moved.reshape(-1, moved.shape[-1])])
    np.testing.assert_array_equal(np.moveaxis(positions, axis, -1).reshape(want.shape), want)
    np.testing.assert_array_equal(np.moveaxis(values, axis, -1).reshape(want.shape),
                                  np.take_along_axis(moved.reshape(want.shape), want, axis=1))
    # bf16 as the f32 values it holds (numpy's own sort of ml_dtypes' bf16 puts them out of order)
    np.testing.assert_array_equal(run("ARGSORT", [x.astype(ml_dtypes.bfloat16)], out="i32", axis=axis,
                                      descending=descending), positions)
    integers = np.int8([[3, -128, 127, 3, 0]])
    assert run("ARGSORT", [integers], out="i32", descending=descending).tolist() == \
        [sorted_by_loops(integers[0].tolist(), descending)]


def test_reduction_edge_cases():
    x = uniform((2, 3))
    np.testing.assert_array_equal(run("REDUCE_SUM", [x], axes=[]), x)  # no axes: nothing reduced
    assert run("REDUCE_SUM", [x], axes=None, keepdims=False).shape == ()
    assert run("REDUCE_MAX", [np.zeros((0, 2), F32)], axes=[0]).tolist() == [[-math.inf, -math.inf]]
    ints = np.int32([[3, -9], [7, 2]])
    np.testing.assert_array_equal(run("REDUCE_PROD", [ints], out="i32", axes=[1], keepdims=False), [-27, 14])
    np.testing.assert_array_equal(run("REDUCE_MIN", [ints], out="i32", axes=[0]), [[3, -9]])


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("name", ["SOFTMAX", "LOG_SOFTMAX"])
def test_softmax_any_axis(name, axis):
    x = uniform((3, 4, 2), -5, 5)
    x[0, 0, 0] = 1000.0  # a naive exp overflows here
    assert_close(run(name, [x], axis=axis), softmax_by_loops(x, axis, log=name == "LOG_SOFTMAX"), "f32")


def layernorm_by_loops(x, axis, epsilon, scale, bias) -> np.ndarray:
    first = axis % x.ndim
    normalized = x.shape[first:]
    out = np.empty(x.shape, dtype=np.float64)
    for members in groups(x, tuple(range(first, x.ndim))).values():
        mean = math.fsum(v for _, v in members) / len(members)
        variance = math.fsum((v - mean) ** 2 for _, v in members) / len(members)
        for index, v in members:
            y = (v - mean) / math.sqrt(variance + epsilon)
            inner = index[first:]
            for operand, combine in ((scale, lambda p, q: p * q), (bias, lambda p, q: p + q)):
                if operand is not None:
                    full = np.broadcast_to(operand, normalized)  # only picks the element
                    y = combine(y, float(full[inner]))
            out[index] = y
    return out


def test_layernorm():
    x = uniform((2, 3, 4))
    assert_close(run("LAYERNORM", [x]), layernorm_by_loops(x, -1, 1e-5, None, None), "f32")
    scale, bias = uniform((4,)), uniform((3, 4))
    y = run("LAYERNORM", [x, scale, bias], axis=1, epsilon=0.5)
    assert_close(y, layernorm_by_loops(x, 1, 0.5, scale, bias), "f32")
    constant_rows = np.ones((2, 5), F32)  # zero variance: epsilon keeps it finite
    assert_close(run("LAYERNORM", [constant_rows]), np.zeros((2, 5)), "f32")


def rmsnorm_by_loops(x, axis, epsilon, scale) -> np.ndarray:
    first = axis % x.ndim
    out = np.empty(x.shape, dtype=np.float64)
    for members in groups(x, tuple(range(first, x.ndim))).values():
        rms = math.sqrt(math.fsum(v * v for _, v in members) / len(members) + epsilon)
        for index, v in members:
            s = 1.0 if scale is None else float(np.broadcast_to(scale, x.shape[first:])[index[first:]])
            out[index] = v / rms * s
    return out


def test_rmsnorm():
    rng = np.random.default_rng(5)  # its own draws: the module's stay as they were
    x, scale = rng.uniform(-3, 3, (2, 3, 4)).astype(F32), rng.uniform(-3, 3, (4,)).astype(F32)
    assert_close(run("RMSNORM", [x]), rmsnorm_by_loops(x, -1, 1e-5, None), "f32")
    assert_close(run("RMSNORM", [x, scale], axis=1, epsilon=0.5), rmsnorm_by_loops(x, 1, 0.5, scale), "f32")
    assert_close(run("RMSNORM", [np.zeros((2, 5), F32)]), np.zeros((2, 5)), "f32")  # epsilon keeps it finite
    op = REGISTRY["RMSNORM"]
    attrs = op.normalize_attrs({})
    assert attrs == {"axis": -1, "epsilon": 1e-5}
    assert shape_error("RMSNORM", [(2, 4), (5,)]) == "scale [5] does not broadcast to the normalized shape [4]"
    assert op.vector_work([(4, 8), (8,)], (4, 8), attrs) == {"reduction": 32, "simple": 96}
    assert tuple(op.whole_axes((2, 3, 4), op.normalize_attrs({"axis": 1}))) == (1, 2)
    with pytest.raises(ValueError, match="cannot accumulate"):
        op.tile([x], x[..., :1], np.dtype(F32), attrs)


def test_rmsnorm_magnitude_bounds_how_far_errors_in_its_operands_move_it():
    rng = np.random.default_rng(6)
    op = REGISTRY["RMSNORM"]
    attrs = op.normalize_attrs({"epsilon": 1e-3})
    x, scale = rng.uniform(-3, 3, (3, 8)), rng.uniform(-2, 2, (8,))
    sizes = [np.abs(x) + 0.5, np.abs(scale) + 0.5]  # magnitudes: at least the values' sizes
    h = 1e-7  # relative errors this small move the result to first order
    [bound] = op.magnitude([x, scale], sizes, attrs, h)

    def y(a, s):
        return op.reference([a, s], attrs, ["f64"])[0]

    for _ in range(20):
        dx, ds = (rng.uniform(-1, 1, m.shape) * m * h for m in sizes)
        assert (np.abs(y(x + dx, scale + ds) - y(x, scale)) <= bound * h * 1.001).all()


@pytest.mark.parametrize("name", ["SOFTMAX", "LOG_SOFTMAX"])
@pytest.mark.parametrize("rtol", [1e-7, 1e-3, 0.05, 0.5])
def test_softmax_magnitude_bounds_errors_of_any_size(name, rtol):
    """Each operand element off by up to rtol times its magnitude: softmax and log-softmax move
    by at most rtol times theirs (at least their own size, as the check holds them), also where
    the errors exceed the gaps between the largest logits (rtol 0.05 on logits spread over
    +-100: which is largest changes), where first order holds the largest element to almost
    nothing. The worst errors are at the corners: x_i up and every other x_j down, or the
    reverse; those bound it exactly."""
    rng = np.random.default_rng(7)
    op = REGISTRY[name]
    attrs = op.normalize_attrs({"axis": -1})
    x = rng.uniform(-100, 100, (6, 10))
    x[0, :2] = [90.0, 89.0]  # two close largest logits
    sizes = np.abs(x) + 1.0
    [bound] = op.magnitude([x], [sizes], attrs, rtol)
    y = op.reference([x], attrs, ["f64"])[0]
    allowed = np.maximum(bound, np.abs(y)) * rtol * (1 + 1e-6) + 1e-12  # rounding: tiny moves cancel digits
    flipped, reached = 0, np.zeros_like(y)
    corners = [np.where(np.arange(10) == i, sign, -sign) for i in range(10) for sign in (1.0, -1.0)]
    signs = corners + [rng.choice([-1.0, 1.0], x.shape) for _ in range(200)]
    for sign in signs:
        moved = op.reference([x + sign * sizes * rtol], attrs, ["f64"])[0]
        assert (np.abs(moved - y) <= allowed).all()
        reached = np.maximum(reached, np.abs(moved - y))
        flipped += int(np.argmax(moved[0]) != np.argmax(y[0]))
    assert (flipped > 0) == (rtol >= 0.05)
    # the corners reach the bound: it is no looser than the errors allow
    assert np.allclose(reached, np.maximum(bound * rtol, 0), rtol=1e-6, atol=1e-12 * np.abs(y).max())


@pytest.mark.parametrize("fill", [-1e9, -np.inf])
def test_softmax_magnitude_is_not_loosened_by_masked_elements(fill):
    """An attention row's masked logits (-1e9, its own errors some 1e5 in f32; or -inf, its
    magnitude inf) have no weight: the kept elements are held as in a row without them, and a
    softmax 10% off fails."""
    op = REGISTRY["SOFTMAX"]
    attrs = op.normalize_attrs({"axis": -1})
    rtol = 1e-4
    kept = np.random.default_rng(8).normal(0, 2, (4, 64))
    masked = np.concatenate([kept, np.full((4, 64), fill)], axis=1)
    [alone] = op.magnitude([kept], [np.abs(kept)], attrs, rtol)
    with np.errstate(all="ignore"):  # as the check calls it: -inf - -inf is no fault of the data
        [bound] = op.magnitude([masked], [np.abs(masked)], attrs, rtol)
    np.testing.assert_allclose(bound[:, :64], alone, rtol=1e-6)
    y = op.reference([masked], attrs, ["f64"])[0]
    assert (np.abs(1.1 * y - y) > np.maximum(bound, y) * rtol * 3).any()


# ---- layout -----------------------------------------------------------------------------------


def test_reshape():
    x = uniform((2, 3, 4))
    for new_shape, shape in [([4, -1], (4, 6)), ([24], (24,)), ([-1], (24,)), ([2, 1, 12], (2, 1, 12))]:
        y = run("RESHAPE", [x], new_shape=new_shape)
        assert y.shape == shape and y.ravel().tolist() == [float(v) for v in x.flat]


def test_transpose():
    x = uniform((2, 3, 4))
    for perms in ([1, 2, 0], [0, 2, 1], None):
        y = run("TRANSPOSE", [x], perms=perms)
        order = perms or [2, 1, 0]
        for out_index in itertools.product(*map(range, y.shape)):
            in_index = [0] * 3
            for k, p in enumerate(order):
                in_index[p] = out_index[k]
            assert y[out_index] == x[tuple(in_index)]


def test_concat():
    a, b, c = uniform((2, 1, 3)), uniform((2, 4, 3)), uniform((2, 2, 3))
    y = run("CONCAT", [a, b, c], axis=-2)
    rows = [a[:, i] for i in range(1)] + [b[:, i] for i in range(4)] + [c[:, i] for i in range(2)]
    assert y.shape == (2, 7, 3)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(y[:, i], row)
    # operands of other dtypes are converted to the output's
    np.testing.assert_array_equal(run("CONCAT", [np.int32([1]), np.float32([2.5])], axis=0), [1.0, 2.5])


def test_slice():
    x = uniform((3, 4, 5))
    y = run("SLICE", [x], start=[1, 0, 2], size=[2, -1, 1])
    assert y.shape == (2, 4, 1)
    for i, j, k in itertools.product(range(2), range(4), range(1)):
        assert y[i, j, k] == x[1 + i, j, 2 + k]
    assert run("SLICE", [x], start=[3, 4, 5], size=[-1, -1, 0]).shape == (0, 0, 0)


def test_pad():
    x = uniform((2, 3))
    y = run("PAD", [x], padding=[[1, 2], [0, 1]], pad_value=-1.5)
    assert y.shape == (5, 4)
    for i, j in itertools.product(range(5), range(4)):
        inside = 1 <= i < 3 and j < 3
        assert y[i, j] == (x[i - 1, j] if inside else -1.5)
    np.testing.assert_array_equal(run("PAD", [x], padding=[[0, 0], [0, 0]]), x)
    ints = run("PAD", [np.int8([5])], out="i8", padding=[[1, 0]], pad_value=-math.inf)
    np.testing.assert_array_equal(ints, [-128, 5])


def test_gather():
    x = uniform((3, 4))
    y = run("GATHER", [x], indices=[3, -1, 0, 0], axis=1)
    for i, (j, source) in itertools.product(range(3), enumerate([3, 3, 0, 0])):
        assert y[i, j] == x[i, source]
    np.testing.assert_array_equal(run("GATHER", [x], indices=[-3]), x[:1])


# ---- contraction ------------------------------------------------------------------------------


def test_linear():
    x, w, b = uniform((2, 3, 5)), uniform((4, 5)), uniform((4,))
    y = run("LINEAR", [x, w, b])
    expected = np.empty((2, 3, 4))
    for i, j, o in itertools.product(range(2), range(3), range(4)):
        expected[i, j, o] = math.fsum(float(x[i, j, k]) * float(w[o, k]) for k in range(5)) + float(b[o])
    assert_close(y, expected, "f32")
    assert run("LINEAR", [x, w]).shape == (2, 3, 4)


def test_matmul():
    a, b = uniform((3, 5)), uniform((5, 2))
    expected = [[math.fsum(float(a[i, k]) * float(b[k, j]) for k in range(5)) for j in range(2)] for i in range(3)]
    assert_close(run("MATMUL", [a, b]), expected, "f32")


def test_matmul_transpose_b():
    # B given as [..., N, K]: a LINEAR's weight [out, in]
    a, b, cin = uniform((2, 3, 5)), uniform((4, 5)), uniform((4,))
    expected = [[[math.fsum(float(a[n, i, k]) * float(b[j, k]) for k in range(5)) + float(cin[j]) for j in range(4)]
                 for i in range(3)] for n in range(2)]
    y = run("MATMUL", [a, b, cin], transpose_b=True)
    assert_close(y, expected, "f32")
    batched = uniform((2, 4, 5))
    assert_close(run("MATMUL", [a, batched], transpose_b=True), np.matmul(a, np.swapaxes(batched, 1, 2)), "f32")
    assert shape_error("MATMUL", [(2, 5), (5, 4)], transpose_b=True) == \
        "inner dimensions differ: A [2, 5] has K=5, B [5, 4] (transposed) has K=4"
    assert REGISTRY["MATMUL"].normalize_attrs({}) == {"transpose_b": False}
    # the tile meaning is the plain product: the L3 -> L2 move hands the compute B's tile transposed
    op = REGISTRY["MATMUL"]
    tile = op.tile([a, b.T, cin], None, np.dtype(F32), op.normalize_attrs({"transpose_b": True}))
    np.testing.assert_array_equal(tile.astype(F32), y)


# ---- sliding windows --------------------------------------------------------------------------


def window_taps(i: int, j: int, kernel, stride, padding, dilation, height: int, width: int):
    """(p, q, r, s) for each tap (p, q) of output position (i, j) that reads input element (r, s)
    rather than the padding: r = i * stride - top + p * dilation."""
    (top, _), (left, _) = padding
    for p, q in itertools.product(range(kernel[0]), range(kernel[1])):
        r, s = i * stride[0] - top + p * dilation[0], j * stride[1] - left + q * dilation[1]
        if 0 <= r < height and 0 <= s < width:
            yield p, q, r, s


def window_out(height: int, width: int, kernel, stride, padding, dilation) -> tuple[int, int]:
    return tuple((extent + before + after - (k - 1) * d - 1) // st + 1
                 for extent, k, st, (before, after), d in zip((height, width), kernel, stride, padding, dilation))


def conv_by_loops(x, w, bias, stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, exact=False):
    """NHWC x, OHWI w: y[n, i, j, o] = bias[o] + the sum over the taps inside the input and the
    input channels of o's group of x[n, r, s, channel] * w[o, p, q, channel]; Python floats and
    math.fsum (Python ints with `exact`)."""
    number, total = (int, sum) if exact else (float, math.fsum)
    n, height, width, _ = x.shape
    outputs, kh, kw, per_group = w.shape
    oh, ow = window_out(height, width, (kh, kw), stride, padding, dilation)
    y = np.empty((n, oh, ow, outputs), dtype=np.int64 if exact else np.float64)
    for b, i, j, o in itertools.product(range(n), range(oh), range(ow), range(outputs)):
        first = o // (outputs // groups) * per_group
        terms = [number(x[b, r, s, first + c]) * number(w[o, p, q, c])
                 for p, q, r, s in window_taps(i, j, (kh, kw), stride, padding, dilation, height, width)
                 for c in range(per_group)]
        y[b, i, j, o] = total(terms + ([number(bias[o])] if bias is not None else []))
    return y


def depthwise_by_loops(x, w, bias, stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1)):
    """NHWC x, HWCM w: y[n, i, j, c * M + m] = bias[c * M + m] + the sum over the taps of
    x[n, r, s, c] * w[p, q, c, m]."""
    n, height, width, channels = x.shape
    kh, kw, _, multiplier = w.shape
    oh, ow = window_out(height, width, (kh, kw), stride, padding, dilation)
    y = np.empty((n, oh, ow, channels * multiplier))
    for b, i, j, c, m in itertools.product(range(n), range(oh), range(ow), range(channels), range(multiplier)):
        terms = [float(x[b, r, s, c]) * float(w[p, q, c, m])
                 for p, q, r, s in window_taps(i, j, (kh, kw), stride, padding, dilation, height, width)]
        y[b, i, j, c * multiplier + m] = math.fsum(terms) + (0.0 if bias is None else float(bias[c * multiplier + m]))
    return y


def pool_by_loops(x, kernel, stride, padding, fn):
    """fn(the window's elements inside the input, the window's size) per output element."""
    n, height, width, channels = x.shape
    oh, ow = window_out(height, width, kernel, stride, padding, (1, 1))
    y = np.empty((n, oh, ow, channels))
    for b, i, j, c in itertools.product(range(n), range(oh), range(ow), range(channels)):
        taps = window_taps(i, j, kernel, stride, padding, (1, 1), height, width)
        inside = [float(x[b, r, s, c]) for _, _, r, s in taps]
        y[b, i, j, c] = fn(inside, kernel[0] * kernel[1])
    return y


def test_conv2d_nhwc_with_stride_dilation_uneven_padding_and_bias():
    x, w, b = uniform((2, 9, 8, 3)), uniform((4, 3, 2, 3)), uniform((4,))
    attrs = {"stride": [2, 1], "dilation": [1, 2], "padding": [[1, 2], [0, 3]]}
    y = run("CONV2D", [x, w, b], **attrs)
    assert y.shape == (2, 5, 9, 4)  # (9 + 3 - 3) // 2 + 1, (8 + 3 - 3) // 1 + 1
    assert_close(y, conv_by_loops(x, w, b, [2, 1], [[1, 2], [0, 3]], [1, 2]), "f32")
    assert_close(run("CONV2D", [x, w]), conv_by_loops(x, w, None), "f32")
    # a bias broadcast from one value
    assert_close(run("CONV2D", [x, w, b[:1]], **attrs), conv_by_loops(x, w, np.repeat(b[:1], 4), [2, 1],
                                                                      [[1, 2], [0, 3]], [1, 2]), "f32")


def test_conv2d_nchw_and_groups():
    x, w, b = uniform((2, 6, 7, 6)), uniform((6, 2, 3, 2)), uniform((6,))  # 3 groups of 2 inputs, 2 outputs
    attrs = {"stride": [1, 2], "padding": [[1, 1], [2, 0]], "groups": 3}
    nhwc = run("CONV2D", [x, w, b], **attrs)
    assert_close(nhwc, conv_by_loops(x, w, b, [1, 2], [[1, 1], [2, 0]], groups=3), "f32")
    # output channel 0 reads input channels 0-1 only, channel 5 reads 4-5 only
    assert_close(run("CONV2D", [x[..., :2], w[:2]], stride=[1, 2], padding=[[1, 1], [2, 0]]), nhwc[..., :2] - b[:2],
                 "f32")
    # the same sums with NCHW x and OIHW w, and an NCHW result
    nchw = run("CONV2D", [x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), b], layout="NCHW", **attrs)
    assert nchw.shape == (2, 6, 7, 4)
    assert_close(nchw.transpose(0, 2, 3, 1), conv_by_loops(x, w, b, [1, 2], [[1, 1], [2, 0]], groups=3), "f32")


def test_conv2d_of_integers_is_exact():
    """i8 x i8 summed in i32: no rounding, whatever the size of the sum."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 6, 6, 16)).astype(np.int8)
    w = rng.integers(-128, 128, (3, 3, 3, 16)).astype(np.int8)
    x[0, :3, :3, :], w[0] = -128, -128  # the largest sum: 144 * 2^14
    y = run("CONV2D", [x, w], out="i32", padding=[[1, 1], [1, 1]])
    want = conv_by_loops(x, w, None, padding=[[1, 1], [1, 1]], exact=True)
    assert y.dtype == np.int32 and want[0, 1, 1, 0] == 144 * 2**14
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_conv2d(multiplier):
    x, w, b = uniform((2, 7, 8, 3)), uniform((3, 2, 3, multiplier)), uniform((3 * multiplier,))
    attrs = {"stride": [2, 1], "dilation": [2, 1], "padding": [[2, 1], [0, 1]]}
    y = run("DEPTHWISE_CONV2D", [x, w, b], **attrs)
    assert y.shape == (2, 3, 8, 3 * multiplier)  # (7 + 3 - 5) // 2 + 1, (8 + 1 - 2) + 1
    assert_close(y, depthwise_by_loops(x, w, b, [2, 1], [[2, 1], [0, 1]], [2, 1]), "f32")
    assert_close(run("DEPTHWISE_CONV2D", [x, w]), depthwise_by_loops(x, w, None), "f32")


def test_maxpool2d_never_chooses_the_padding():
    x = uniform((2, 7, 6, 3), -5.0, -1.0)  # all below the zero a padding of zeros would be
    attrs = {"kernel": [3, 2], "stride": [2, 2], "padding": [[1, 2], [1, 0]]}
    y = run("MAXPOOL2D", [x], **attrs)
    assert y.shape == (2, 4, 3, 3)
    np.testing.assert_array_equal(y, pool_by_loops(x, [3, 2], [2, 2], [[1, 2], [1, 0]], lambda v, _: max(v)))
    ints = np.full((1, 3, 3, 1), -128, np.int8)  # the lowest i8: the padding is no lower
    np.testing.assert_array_equal(run("MAXPOOL2D", [ints], out="i8", kernel=[2, 2], padding=[[1, 1], [1, 1]]),
                                  np.full((1, 4, 4, 1), -128))
    assert REGISTRY["MAXPOOL2D"].padding_value({}, "f32") == -math.inf
    assert REGISTRY["MAXPOOL2D"].padding_value({}, "i8") == -128 and REGISTRY["MAXPOOL2D"].padding_value({}, "i32") == -2**31


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avgpool2d_counts_the_padding_or_not(count_include_pad):
    x = uniform((2, 7, 6, 3))
    attrs = {"kernel": [3, 3], "stride": [2, 1], "padding": [[1, 2], [2, 0]], "count_include_pad": count_include_pad}
    y = run("AVGPOOL2D", [x], **attrs)
    assert y.shape == (2, 4, 6, 3)
    want = pool_by_loops(x, [3, 3], [2, 1], [[1, 2], [2, 0]],
                         lambda v, size: math.fsum(v) / (size if count_include_pad else len(v)))
    assert_close(y, want, "f32")
    assert REGISTRY["AVGPOOL2D"].normalize_attrs({"kernel": [2, 2]})["count_include_pad"] is False


def test_sumpool2d_adds_each_window_with_zeros_around():
    x = uniform((2, 7, 6, 3))
    attrs = {"kernel": [3, 2], "stride": [2, 1], "padding": [[1, 2], [1, 0]]}
    assert_close(run("SUMPOOL2D", [x], **attrs), pool_by_loops(x, [3, 2], [2, 1], [[1, 2], [1, 0]],
                                                                lambda v, _: math.fsum(v)), "f32")
    big = np.full((1, 2, 2, 1), 2**30, np.int32)  # integers sum exactly, wrapping as i32 does
    np.testing.assert_array_equal(run("SUMPOOL2D", [big], out="i32", kernel=[2, 2]), [[[[0]]]])


def test_window_shape_rules():
    def shape(name, shapes, **attrs):
        op = REGISTRY[name]
        return op.infer_shapes(shapes, ["f32"] * len(shapes), op.normalize_attrs(attrs))

    assert shape("CONV2D", [(2, 9, 8, 3), (4, 3, 2, 3)], stride=[2, 1], dilation=[1, 2],
                 padding=[[1, 1], [0, 2]]) == [(2, 5, 8, 4)]
    assert shape("CONV2D", [(2, 3, 9, 8), (4, 3, 3, 2)], layout="NCHW") == [(2, 4, 7, 7)]
    assert shape("CONV2D", [(1, 5, 5, 6), (9, 3, 3, 2)], groups=3) == [(1, 3, 3, 9)]
    assert shape("CONV2D", [(1, 2, 2, 4), (2, 3, 3, 4)], padding=[[0, 1], [1, 0]]) == [(1, 1, 1, 2)]  # just fits
    assert shape("DEPTHWISE_CONV2D", [(1, 7, 7, 3), (3, 3, 3, 2), (6,)], stride=[2, 2],
                 padding=[[1, 1], [1, 1]]) == [(1, 4, 4, 6)]
    assert shape("MAXPOOL2D", [(1, 7, 6, 2)], kernel=[3, 2], stride=[2, 2], padding=[[1, 1], [0, 0]]) == [(1, 4, 3, 2)]
    assert shape("AVGPOOL2D", [(3, 7, 7, 5)], kernel=[7, 7]) == [(3, 1, 1, 5)]


def test_window_shape_errors():
    assert shape_error("CONV2D", [(1, 5, 5, 4), (2, 3, 3, 3)]) == \
        "input [1, 5, 5, 4] has 4 channels, weights [2, 3, 3, 3] take 3 per group x 1 group(s) = 3"
    assert shape_error("CONV2D", [(1, 5, 5, 4), (2, 3, 3, 1)], groups=2) == \
        "input [1, 5, 5, 4] has 4 channels, weights [2, 3, 3, 1] take 1 per group x 2 group(s) = 2"
    assert shape_error("CONV2D", [(1, 4, 5, 5), (2, 3, 3, 4)], layout="NCHW") == \
        "input [1, 4, 5, 5] has 4 channels, weights [2, 3, 3, 4] take 3 per group x 1 group(s) = 3"
    assert shape_error("CONV2D", [(1, 5, 5, 4), (3, 3, 3, 2)], groups=2) == \
        "3 output channels do not split into 2 groups"
    assert shape_error("CONV2D", [(1, 2, 5, 4), (2, 3, 3, 4)]) == \
        "the window spans 3 elements, more than the 2 of input [1, 2, 5, 4] padded by [0, 0]"
    assert shape_error("CONV2D", [(1, 5, 4, 4), (2, 3, 3, 4)], dilation=[1, 2], padding=[[0, 0], [0, 0]]) == \
        "the window spans 5 elements, more than the 4 of input [1, 5, 4, 4] padded by [0, 0]"
    assert shape_error("CONV2D", [(5, 5, 4), (2, 3, 3, 4)]) == \
        "CONV2D takes a rank-4 input and rank-4 weights, got [5, 5, 4] and [2, 3, 3, 4]"
    assert shape_error("CONV2D", [(1, 5, 5, 4), (2, 3, 3, 4)], stride=[1]) == \
        "stride, dilation and padding must give the 2 spatial dims, got stride [1], dilation [1, 1], " \
        "padding [[0, 0], [0, 0]]"
    assert shape_error("CONV2D", [(1, 5, 5, 4), (2, 3, 3, 4), (3,)]) == \
        "bias [3] does not broadcast to the output channels [2]"
    assert shape_error("DEPTHWISE_CONV2D", [(1, 5, 5, 3), (3, 3, 4, 1)]) == \
        "input [1, 5, 5, 3] has 3 channels, weights [3, 3, 4, 1] (HWCM) take 4"
    assert shape_error("DEPTHWISE_CONV2D", [(1, 5, 5, 3), (3, 3, 3)]).startswith(
        "DEPTHWISE_CONV2D takes NHWC input and HWCM weights, got [1, 5, 5, 3] and [3, 3, 3]")
    assert shape_error("DEPTHWISE_CONV2D", [(1, 5, 5, 3), (3, 3, 3, 2), (3,)]) == \
        "bias [3] does not broadcast to the output channels [6]"
    assert shape_error("DEPTHWISE_CONV2D", [(1, 4, 9, 2), (3, 3, 2, 1)], dilation=[2, 2]) == \
        "the window spans 5 elements, more than the 4 of input [1, 4, 9, 2] padded by [0, 0]"
    assert shape_error("MAXPOOL2D", [(1, 5, 5, 1)], kernel=[2, 2], padding=[[2, 0], [0, 0]]) == \
        "padding [[2, 0], [0, 0]] is not smaller than the kernel [2, 2]: a window would hold no element"
    assert "is not smaller than the kernel" in shape_error("AVGPOOL2D", [(1, 5, 5, 1)], kernel=[3, 1],
                                                           padding=[[0, 0], [0, 1]])
    assert shape_error("AVGPOOL2D", [(1, 2, 9, 1)], kernel=[3, 3]) == \
        "the window spans 3 elements, more than the 2 of input [1, 2, 9, 1] padded by [0, 0]"
    assert shape_error("MAXPOOL2D", [(5, 5, 1)], kernel=[2, 2]) == "pooling takes an NHWC input, got [5, 5, 1]"
    assert shape_error("MAXPOOL2D", [(1, 5, 5, 1)], kernel=[2]) == "kernel must give the 2 spatial dims, got [2]"


def test_window_attribute_errors():
    assert attr_error("CONV2D", stride=[0, 1]) == "attribute 'stride' must be a list of integers >= 1, got [0, 1]"
    assert attr_error("DEPTHWISE_CONV2D", dilation=[1, 0]) == \
        "attribute 'dilation' must be a list of integers >= 1, got [1, 0]"
    assert attr_error("MAXPOOL2D", kernel=[0, 2]) == "attribute 'kernel' must be a list of integers >= 1, got [0, 2]"
    assert attr_error("CONV2D", groups=0) == "attribute 'groups' must be an integer >= 1, got 0"
    assert attr_error("CONV2D", layout="NCWH") == "attribute 'layout' must be 'NHWC' or 'NCHW', got 'NCWH'"
    assert ">= 0" in attr_error("CONV2D", padding=[[1, -1], [0, 0]])
    assert attr_error("MAXPOOL2D") == "attribute 'kernel' is required by MAXPOOL2D"
    assert attr_error("AVGPOOL2D", kernel=[2, 2], count_include_pad=1) == \
        "attribute 'count_include_pad' must be true or false, got 1"
    assert attr_error("MAXPOOL2D", kernel=[2, 2], count_include_pad=True) == \
        "attribute 'count_include_pad' is unknown (MAXPOOL2D takes kernel, stride, dilation, padding)"
    assert attr_error("DEPTHWISE_CONV2D", groups=2) == \
        "attribute 'groups' is unknown (DEPTHWISE_CONV2D takes stride, dilation, padding, pad_value)"
    assert attr_error("CONV2D", weight_layout="OHWW") == \
        "attribute 'weight_layout' must be None or an order of the letters O, H, W, I, got 'OHWW'"
    assert REGISTRY["CONV2D"].normalize_attrs({}) == \
        {"stride": [1, 1], "dilation": [1, 1], "padding": [[0, 0], [0, 0]], "pad_value": 0, "groups": 1,
         "layout": "NHWC", "weight_layout": None}


def test_window_tiles_compute_bands_that_hold_their_padding():
    """A tile COMPUTE sees a band already padded: the rows of output tile t of R rows are input
    rows t * R * stride - top .. + (R - 1) * stride + span of the padded tensor (Window.band), and
    CONV2D's partial sums accumulate over chunks of input channels."""
    x, w, b = uniform((2, 11, 6, 4)), uniform((3, 3, 2, 4)), uniform((3,))
    attrs = REGISTRY["CONV2D"].normalize_attrs({"stride": [2, 1], "dilation": [1, 2], "padding": [[1, 2], [0, 1]]})
    rows, cols = REGISTRY["CONV2D"].windows(attrs, [x.shape, w.shape])
    assert (rows.kernel, rows.stride, rows.dilation, rows.before, rows.after) == (3, 2, 1, 1, 2)
    assert (cols.kernel, cols.stride, cols.dilation, cols.before, cols.after) == (2, 1, 2, 0, 1)
    R = 2
    extent, step, offset = rows.band(R)
    assert (extent, step, offset) == ((R - 1) * 2 + 3, R * 2, -1)
    want = conv_by_loops(x, w, b, [2, 1], [[1, 2], [0, 1]], [1, 2])  # [2, 6, 5, 3]
    xp = np.pad(x, [(0, 0), (1, 2), (0, 1), (0, 0)])
    acc = np.dtype(F32)
    op = REGISTRY["CONV2D"]
    for t in range(3):  # output rows 0-1, 2-3, 4-5
        band = xp[:, t * step:t * step + extent]
        partial = op.tile([band[..., :3], w[..., :3], b], None, acc, attrs)
        total = op.tile([band[..., 3:], w[..., 3:]], partial, acc, attrs)
        assert_close(convert(total, "f32"), want[:, t * R:(t + 1) * R], "f32")
    # the array's work: m = output positions of the band, n = output channels, k = taps x channels
    assert op.tile_mnk([(2, extent, 7, 4), w.shape], attrs) == (2 * R * 5, 3, 3 * 2 * 4)

    dw_w = uniform((3, 3, 4, 2))
    dw_attrs = REGISTRY["DEPTHWISE_CONV2D"].normalize_attrs({"padding": [[1, 1], [1, 1]]})
    tile = REGISTRY["DEPTHWISE_CONV2D"].tile([np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)]), dw_w], None, acc, dw_attrs)
    assert_close(convert(tile, "f32"), depthwise_by_loops(x, dw_w, None, padding=[[1, 1], [1, 1]]), "f32")
    # a mean over the inputs alone is the compiler's to rewrite (a band does not say where the input ends)
    avg = REGISTRY["AVGPOOL2D"]
    with pytest.raises(ValueError, match="rewritten by the compiler"):
        avg.tile([xp], None, acc, avg.normalize_attrs({"kernel": [2, 2], "padding": [[1, 0], [0, 0]]}))
    counted = avg.normalize_attrs({"kernel": [2, 2], "padding": [[1, 0], [0, 0]], "count_include_pad": True})
    tile = avg.tile([np.pad(x, [(0, 0), (1, 0), (0, 0), (0, 0)])], None, acc, counted)
    mean = pool_by_loops(x, [2, 2], [1, 1], [[1, 0], [0, 0]], lambda v, n: math.fsum(v) / n)
    assert_close(convert(tile, "f32"), mean, "f32")


def test_window_vector_work_is_one_simple_op_per_tap():
    def work(name, in_shapes, out_shape, **attrs):
        op = REGISTRY[name]
        return op.vector_work(in_shapes, out_shape, op.normalize_attrs(attrs))

    assert work("DEPTHWISE_CONV2D", [(2, 6, 6, 3), (3, 3, 3, 2)], (2, 4, 4, 6)) == {"simple": 2 * 4 * 4 * 6 * 9}
    assert work("MAXPOOL2D", [(1, 6, 5, 2)], (1, 3, 3, 2), kernel=[2, 3]) == {"simple": 18 * 6}
    assert work("AVGPOOL2D", [(1, 7, 7, 4)], (1, 1, 1, 4), kernel=[7, 7]) == {"simple": 4 * 49}
    # a contraction's, where the vector unit runs it (a GEMV): a multiply-add per product
    assert work("CONV2D", [(1, 1, 1, 64), (10, 1, 1, 64)], (1, 1, 1, 10)) == {"simple": 640}
    assert work("CONV2D", [(1, 5, 5, 4), (6, 3, 3, 2)], (1, 3, 3, 6), groups=2) == {"simple": 9 * 6 * 3 * 3 * 2}


# ---- errors -----------------------------------------------------------------------------------


def test_shape_errors_are_one_line():
    assert shape_error("ADD", [(2, 3), (4,)]) == "shapes [2, 3] and [4] do not broadcast"
    assert shape_error("SOFTMAX", [(2, 3)], axis=3) == "axis 3 is out of range for rank 2"
    assert shape_error("REDUCE_SUM", [(2, 3)], axes=[-3]) == "axis -3 is out of range for rank 2"
    assert "name an axis twice" in shape_error("REDUCE_SUM", [(2, 3)], axes=[1, -1])
    assert shape_error("RESHAPE", [(2, 3)], new_shape=[4, 2]) == "cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)"
    assert "no size fits the -1" in shape_error("RESHAPE", [(2, 3)], new_shape=[4, -1])
    assert "outside axis 1" in shape_error("CONCAT", [(2, 3), (3, 3)], axis=1)
    assert "outside axis 0" in shape_error("CONCAT", [(2, 3), (2, 3, 1)], axis=0)
    assert "leaves the dim of 4" in shape_error("SLICE", [(3, 4)], start=[0, 2], size=[1, 3])
    assert "entries for the rank-2 operand" in shape_error("PAD", [(3, 4)], padding=[[1, 1]])
    assert shape_error("GATHER", [(3, 4)], indices=[4], axis=1) == "index 4 is out of range for axis 1 of size 4"
    assert "entries for the rank-3 operand" in shape_error("TRANSPOSE", [(1, 2, 3)], perms=[1, 0])
    assert shape_error("LAYERNORM", [(2, 4), (5,)]) == "scale [5] does not broadcast to the normalized shape [4]"
    assert "input features differ" in shape_error("LINEAR", [(2, 5), (4, 3)])
    assert shape_error("MATMUL", [(2, 3), (3, 4), (3, 4)]) == "accumulator [3, 4] does not broadcast to the result [2, 4]"
    assert shape_error("LINEAR", [(2, 5), (4, 5), (3,)]) == "bias [3] does not broadcast to the output features [4]"


def test_attribute_errors_name_the_attribute():
    assert attr_error("CLAMP", min_fp=0.0) == "attribute 'min_fp' is unknown (CLAMP takes min, max)"
    assert attr_error("ADD", shift=0) == "attribute 'shift' is unknown (ADD takes no attributes)"
    assert attr_error("CONCAT") == "attribute 'axis' is required by CONCAT"
    assert attr_error("REDUCE_SUM", keepdims=1) == "attribute 'keepdims' must be true or false, got 1"
    assert attr_error("SOFTMAX", axis=1.0).startswith("attribute 'axis' must be an integer")
    assert "at most one -1" in attr_error("RESHAPE", new_shape=[-1, -1])
    assert "a permutation" in attr_error("TRANSPOSE", perms=[0, 0])
    assert "'none' or 'tanh'" in attr_error("GELU", approximate="fast")
    assert attr_error("CAST", dtype="f128").startswith("attribute 'dtype' must be 'f64' or")
    assert "[before, after] pairs" in attr_error("PAD", padding=[1, 1])
    assert ">= 0" in attr_error("PAD", padding=[[1, -1]])
    assert ">= 0" in attr_error("LAYERNORM", epsilon=-1e-5)


def test_normalize_attrs_fills_defaults_in_canonical_form():
    assert REGISTRY["REDUCE_MEAN"].normalize_attrs({"axes": (np.int64(1),)}) == {"axes": [1], "keepdims": True}
    assert REGISTRY["CLAMP"].normalize_attrs({"min": 0}) == {"min": 0, "max": math.inf}
    assert REGISTRY["LAYERNORM"].normalize_attrs({}) == {"axis": -1, "epsilon": 1e-5}
    assert REGISTRY["ADD"].normalize_attrs({}) == {}


# ---- the registry as a whole ------------------------------------------------------------------


def test_every_op_is_declared_completely():
    tested = set(UNARY) | set(BINARY) | set(REDUCERS) | {
        "SELECT", "CAST", "SOFTMAX", "LOG_SOFTMAX", "LAYERNORM", "RMSNORM", "RESHAPE", "TRANSPOSE", "CONCAT", "SLICE",
        "PAD", "GATHER", "LINEAR", "MATMUL", "CONV2D", "DEPTHWISE_CONV2D", "MAXPOOL2D", "AVGPOOL2D", "SUMPOOL2D",
        "ARGMAX", "ARGMIN", "CUMSUM", "CUMPROD", "CUMMAX", "CUMMIN", "SORT", "ARGSORT", "BITWISE_AND", "BITWISE_OR", "BITWISE_XOR", "BITWISE_NOT",
        "QUANTIZE", "DEQUANTIZE", "REQUANTIZE", "QUANTIZED_ADD"}  # the last four in test_quantize_ops.py
    assert tested == set(REGISTRY)
    for op in REGISTRY.values():
        assert op.family in ("contraction", "map", "reduction", "window", "layout"), op.name
        assert (op.tile is None) == (op.family == "layout" or op.name == "LINEAR"), op.name
        assert (op.vector_work is None) == (op.family == "layout" or op.name == "LINEAR"), op.name
        assert (op.tile_mnk is not None) == (op.name in ("MATMUL", "CONV2D")), op.name
        assert (op.windows is not None) == (op.family == "window" or op.name == "CONV2D"), op.name
        # the others pad with zeros, or the pad_value the graph gives (a quantized input's zero point)
        assert (op.window_fill is not None) == (op.name in ("MAXPOOL2D", "CONV2D", "DEPTHWISE_CONV2D")), op.name
        assert (op.whole_axes is not None) == (op.result_dims is not None) == (op.family == "reduction"), op.name


def sample(op) -> tuple[list[np.ndarray], dict]:
    """Inputs and attrs for `op` where every value is finite."""
    attrs = {"CAST": {"dtype": "f32"}, "CONCAT": {"axis": 0},
             "QUANTIZED_ADD": {"a_quantization": [0.5, 1], "b_quantization": [0.25, 0], "quantization": [1.0, 2]},
             }.get(op.name, {})
    if op.name == "SELECT":
        return [(uniform((2, 3)) > 1).astype(np.uint8), uniform((2, 3)), uniform((1, 3))], attrs
    return [uniform((2, 3), 1.0, 4.0) for _ in range(op.min_inputs)], attrs


COMPUTING = [op.name for op in REGISTRY.values() if op.family in ("map", "reduction")]


@pytest.mark.parametrize("name", COMPUTING)
@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_tile_on_the_whole_tensor_is_the_reference(name, dtype):
    op = REGISTRY[name]
    arrays, attrs = sample(op)
    arrays = [x if x.dtype == np.uint8 else x.astype(numpy_dtype(dtype)) for x in arrays]
    attrs = op.normalize_attrs(attrs)
    out = "u8" if name in PREDICATES else dtype
    [expected] = op.reference(arrays, attrs, [out])
    acc = numpy_dtype(accumulation_dtype([dtype_of(x) for x in arrays] + [out]))
    tile = op.tile(arrays, None, acc, attrs)  # then stored: rounded once to the output dtype
    np.testing.assert_array_equal(convert(tile, out), expected)


def test_reductions_accumulate_across_tiles_where_they_can():
    x = uniform((3, 6))
    attrs = REGISTRY["REDUCE_SUM"].normalize_attrs({"axes": [1]})
    acc = np.dtype(F32)
    partial = REGISTRY["REDUCE_SUM"].tile([x[:, :4]], None, acc, attrs)
    total = REGISTRY["REDUCE_SUM"].tile([x[:, 4:]], partial, acc, attrs)
    np.testing.assert_allclose(total, run("REDUCE_SUM", [x], axes=[1]), rtol=1e-6)
    for name in ("REDUCE_MEAN", "SOFTMAX", "LAYERNORM"):
        op = REGISTRY[name]
        with pytest.raises(ValueError, match="cannot accumulate"):
            op.tile([x], partial, acc, op.normalize_attrs({}))


def test_vector_work_as_documented():
    def work(name, in_shapes, out_shape, **attrs):
        op = REGISTRY[name]
        return op.vector_work(in_shapes, out_shape, op.normalize_attrs(attrs))

    assert work("ADD", [(4, 1), (1, 6)], (4, 6)) == {"simple": 24}
    assert work("EXP", [(4, 6)], (4, 6)) == {"transcendental": 24}
    assert work("GELU", [(10,)], (10,), approximate="tanh") == {"simple": 80, "transcendental": 10}
    assert work("MOD", [(4, 6), (6,)], (4, 6)) == {"transcendental": 24, "simple": 144}
    assert work("MOD", [(4, 6), (6,)], (4, 6), fmod=True) == {"transcendental": 24, "simple": 72}
    assert work("MISH", [(10,)], (10,)) == {"simple": 40, "transcendental": 30}
    assert work("LOGICAL_AND", [(10,), (10,)], (10,)) == {"simple": 10}
    assert work("REDUCE_SUM", [(4, 6)], (4, 1), axes=[1]) == {"reduction": 24}
    assert work("SOFTMAX", [(4, 8)], (4, 8)) == {"reduction": 64, "transcendental": 32, "simple": 64}
    assert work("LAYERNORM", [(4, 8), (8,), (8,)], (4, 8)) == {"reduction": 64, "simple": 160}
    assert work("MATMUL", [(1, 3, 1, 64), (64, 10)], (1, 3, 1, 10)) == {"simple": 30 * 64}
    assert work("MATMUL", [(1, 64), (10, 64)], (1, 10), transpose_b=True) == {"simple": 640}
    assert REGISTRY["TRANSPOSE"].vector_work is None


def test_reductions_say_which_axes_a_tile_holds_whole():
    def axes(name, shape, **attrs):
        op = REGISTRY[name]
        attrs = op.normalize_attrs(attrs)
        return tuple(op.whole_axes(shape, attrs)), op.result_dims(shape, attrs)

    assert axes("REDUCE_SUM", (2, 3, 4), axes=[-1, 0]) == ((2, 0), [None, 1, None])
    assert axes("REDUCE_MAX", (2, 3, 4), axes=[1], keepdims=False) == ((1,), [0, 2])
    assert axes("REDUCE_MEAN", (2, 3)) == ((0, 1), [None, None])
    assert axes("SOFTMAX", (2, 3, 4), axis=-2) == ((1,), [0, 1, 2])
    assert axes("LAYERNORM", (2, 3, 4), axis=1) == ((1, 2), [0, 1, 2])
    assert axes("ARGMAX", (2, 3, 4), axis=1, keepdims=False) == ((1,), [0, 2])
    assert axes("CUMSUM", (2, 3, 4), axis=0) == ((0,), [0, 1, 2])
