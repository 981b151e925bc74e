"""XLA's elementwise set, reduce-window (Flax's max_pool and avg_pool) and argmax/argmin as
reduces of two operands, in HLO text as JAX prints it: each compiled, bound and executed in
process on the standard config, against numpy computed here."""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest

from test_frontend_hlo import error, parse, run_hlo

RNG = np.random.default_rng(21)


def window_reduce(x, init, fn, size, stride=None, pad=None, dilation=None) -> np.ndarray:
    """XLA's reduce-window by loops, in float64: x padded with `init`, each window's elements
    reduced by `fn` starting from `init`."""
    rank = x.ndim
    stride, dilation = stride or [1] * rank, dilation or [1] * rank
    padded = np.pad(x.astype(np.float64), pad or [(0, 0)] * rank, constant_values=init)
    span = [(k - 1) * d + 1 for k, d in zip(size, dilation)]
    out = np.empty([(n - s) // t + 1 for n, s, t in zip(padded.shape, span, stride)])
    for at in np.ndindex(*out.shape):
        window = padded[tuple(slice(i * t, i * t + s, d) for i, t, s, d in zip(at, stride, span, dilation))]
        out[at] = functools.reduce(fn, window.ravel().tolist(), init)
    return out


def ops_of(text: str) -> list[str]:
    graph, _ = parse(text)
    return [op.op_type for op in graph.ops]


# ---- elementwise -----------------------------------------------------------------------------

FLOAT_OPS = """HloModule jit_f, entry_computation_layout={(f32[4,6]{1,0}, f32[4,6]{1,0})->(f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, /*index=5*/f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, /*index=10*/f32[4,6]{1,0}, f32[4,6]{1,0})}

ENTRY main.2 {
  a.1 = f32[4,6]{1,0} parameter(0)
  b.1 = f32[4,6]{1,0} parameter(1)
  sign.1 = f32[4,6]{1,0} sign(a.1)
  floor.1 = f32[4,6]{1,0} floor(a.1)
  ceil.1 = f32[4,6]{1,0} ceil(a.1)
  round.1 = f32[4,6]{1,0} round-nearest-even(a.1)
  round.2 = f32[4,6]{1,0} round-nearest-afz(a.1)
  expm1.1 = f32[4,6]{1,0} exponential-minus-one(a.1)
  abs.1 = f32[4,6]{1,0} abs(a.1)
  log1p.1 = f32[4,6]{1,0} log-plus-one(abs.1)
  cbrt.1 = f32[4,6]{1,0} cbrt(a.1)
  logistic.1 = f32[4,6]{1,0} logistic(a.1)
  atan2.1 = f32[4,6]{1,0} atan2(a.1, b.1)
  rem.1 = f32[4,6]{1,0} remainder(a.1, b.1)
  lo.1 = f32[] constant(-1)
  hi.1 = f32[] constant(1.5)
  clamp.1 = f32[4,6]{1,0} clamp(lo.1, a.1, hi.1)
  ROOT tuple.1 = (f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, /*index=5*/f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}, /*index=10*/f32[4,6]{1,0}, f32[4,6]{1,0}) tuple(sign.1, floor.1, ceil.1, round.1, round.2, /*index=5*/expm1.1, log1p.1, cbrt.1, logistic.1, atan2.1, /*index=10*/rem.1, clamp.1)
}
"""


def test_float_elementwise_ops():
    halves = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.3, 0.49999997]
    a = np.concatenate([np.float32(halves), RNG.uniform(-3, 3, 16).astype(np.float32)]).reshape(4, 6)
    b = RNG.uniform(-3, 3, (4, 6)).astype(np.float32)
    out = run_hlo(FLOAT_OPS, {"a.1": a, "b.1": b})
    x, y = a.astype(np.float64), b.astype(np.float64)
    exact = {0: np.sign(x), 1: np.floor(x), 2: np.ceil(x), 3: np.rint(x),
             4: np.trunc(x + np.copysign(0.5, x)),  # halves away from zero (exact in float64)
             11: np.clip(x, -1, 1.5)}
    for k, want in exact.items():
        np.testing.assert_array_equal(out[f"tuple.1.{k}"], want, err_msg=str(k))
    near = {5: np.expm1(x), 6: np.log1p(np.abs(x)), 7: np.cbrt(x), 8: 1 / (1 + np.exp(-x)), 9: np.arctan2(x, y),
            10: np.fmod(x, y)}  # remainder is C's fmod: the dividend's sign
    for k, want in near.items():
        np.testing.assert_allclose(out[f"tuple.1.{k}"], want, rtol=1e-5, atol=1e-6, err_msg=str(k))


TRIGONOMETRY = """HloModule jit_rotary, entry_computation_layout={(f32[4,6]{1,0})->(f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0})}

ENTRY main.3 {
  a.1 = f32[4,6]{1,0} parameter(0)
  sine.1 = f32[4,6]{1,0} sine(a.1)
  cosine.1 = f32[4,6]{1,0} cosine(a.1)
  tan.1 = f32[4,6]{1,0} tan(a.1)
  ROOT tuple.1 = (f32[4,6]{1,0}, f32[4,6]{1,0}, f32[4,6]{1,0}) tuple(sine.1, cosine.1, tan.1)
}
"""


def test_sine_cosine_and_tan():
    a = RNG.uniform(-1.5, 1.5, (4, 6)).astype(np.float32)
    assert ops_of(TRIGONOMETRY) == ["SIN", "COS", "TAN"]
    out = run_hlo(TRIGONOMETRY, {"a.1": a})
    for k, fn in enumerate((np.sin, np.cos, np.tan)):
        np.testing.assert_allclose(out[f"tuple.1.{k}"], fn(a.astype(np.float64)), rtol=1e-5, atol=1e-6, err_msg=str(k))


# jnp.remainder (Python's %, the divisor's sign) as JAX writes it: XLA's remainder, then fixed up
JNP_REMAINDER_AND_COMPARES = """HloModule jit_f, entry_computation_layout={(f32[3,5]{1,0}, f32[3,5]{1,0})->(f32[3,5]{1,0}, pred[3,5]{1,0}, pred[3,5]{1,0}, pred[3,5]{1,0}, pred[3,5]{1,0}, /*index=5*/pred[3,5]{1,0}, pred[3,5]{1,0})}

remainder.1 {
  Arg_0.1 = f32[3,5]{1,0} parameter(0)
  Arg_1.1 = f32[3,5]{1,0} parameter(1)
  rem.1 = f32[3,5]{1,0} remainder(Arg_0.1, Arg_1.1)
  constant.1 = f32[] constant(0)
  broadcast.1 = f32[3,5]{1,0} broadcast(constant.1), dimensions={}
  lt.2 = pred[3,5]{1,0} compare(rem.1, broadcast.1), direction=LT
  lt.3 = pred[3,5]{1,0} compare(Arg_1.1, broadcast.1), direction=LT
  ne.3 = pred[3,5]{1,0} compare(lt.2, lt.3), direction=NE
  ne.2 = pred[3,5]{1,0} compare(rem.1, broadcast.1), direction=NE
  and.1 = pred[3,5]{1,0} and(ne.3, ne.2)
  add.1 = f32[3,5]{1,0} add(rem.1, Arg_1.1)
  ROOT select_n.1 = f32[3,5]{1,0} select(and.1, add.1, rem.1)
}

ENTRY main.2 {
  x1.1 = f32[3,5]{1,0} parameter(0)
  x2.1 = f32[3,5]{1,0} parameter(1)
  jit_remainder_.1 = f32[3,5]{1,0} call(x1.1, x2.1), to_apply=remainder.1
  eq.1 = pred[3,5]{1,0} compare(x1.1, x2.1), direction=EQ
  ne.1 = pred[3,5]{1,0} compare(x1.1, x2.1), direction=NE, type=FLOAT
  lt.1 = pred[3,5]{1,0} compare(x1.1, x2.1), direction=LT
  le.1 = pred[3,5]{1,0} compare(x1.1, x2.1), direction=LE
  gt.1 = pred[3,5]{1,0} compare(x1.1, x2.1), direction=GT
  ge.1 = pred[3,5]{1,0} compare(x1.1, x2.1), direction=GE
  ROOT tuple.1 = (f32[3,5]{1,0}, pred[3,5]{1,0}, pred[3,5]{1,0}, pred[3,5]{1,0}, pred[3,5]{1,0}, /*index=5*/pred[3,5]{1,0}, pred[3,5]{1,0}) tuple(jit_remainder_.1, eq.1, ne.1, lt.1, le.1, /*index=5*/gt.1, ge.1)
}
"""


def test_jnp_remainder_and_every_compare_direction():
    a = RNG.uniform(-5, 5, (3, 5)).astype(np.float32)
    b = np.where(RNG.random((3, 5)) < 0.3, a, RNG.uniform(-3, 3, (3, 5))).astype(np.float32)  # some ties
    out = run_hlo(JNP_REMAINDER_AND_COMPARES, {"x1.1": a, "x2.1": b})
    np.testing.assert_allclose(out["tuple.1.0"], np.remainder(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)
    for k, want in enumerate([a == b, a != b, a < b, a <= b, a > b, a >= b], 1):
        np.testing.assert_array_equal(out[f"tuple.1.{k}"], want.astype(np.uint8), err_msg=str(k))


INTEGER_AND_PRED_LOGIC = """HloModule jit_f, entry_computation_layout={(s32[2,4]{1,0}, s32[2,4]{1,0})->(s32[2,4]{1,0}, s32[2,4]{1,0}, s32[2,4]{1,0}, s32[2,4]{1,0}, s32[2,4]{1,0}, /*index=5*/s32[2,4]{1,0}, pred[2,4]{1,0}, pred[2,4]{1,0}, pred[2,4]{1,0}, pred[2,4]{1,0}, /*index=10*/pred[2,4]{1,0})}

ENTRY main.1 {
  a.1 = s32[2,4]{1,0} parameter(0)
  b.1 = s32[2,4]{1,0} parameter(1)
  and.1 = s32[2,4]{1,0} and(a.1, b.1)
  or.1 = s32[2,4]{1,0} or(a.1, b.1)
  xor.1 = s32[2,4]{1,0} xor(a.1, b.1)
  not.1 = s32[2,4]{1,0} not(a.1)
  rem.1 = s32[2,4]{1,0} remainder(a.1, b.1)
  sign.1 = s32[2,4]{1,0} sign(a.1)
  lt.1 = pred[2,4]{1,0} compare(a.1, b.1), direction=LT, type=SIGNED
  ge.1 = pred[2,4]{1,0} compare(a.1, b.1), direction=GE, type=TOTALORDER
  xor.2 = pred[2,4]{1,0} xor(lt.1, ge.1)
  not.2 = pred[2,4]{1,0} not(lt.1)
  and.2 = pred[2,4]{1,0} and(lt.1, not.2)
  ROOT tuple.1 = (s32[2,4]{1,0}, s32[2,4]{1,0}, s32[2,4]{1,0}, s32[2,4]{1,0}, s32[2,4]{1,0}, /*index=5*/s32[2,4]{1,0}, pred[2,4]{1,0}, pred[2,4]{1,0}, pred[2,4]{1,0}, pred[2,4]{1,0}, /*index=10*/pred[2,4]{1,0}) tuple(and.1, or.1, xor.1, not.1, rem.1, /*index=5*/sign.1, lt.1, ge.1, xor.2, not.2, /*index=10*/and.2)
}
"""


def test_bitwise_on_integers_and_logic_on_pred():
    a = np.int32([[-7, 7, 2**31 - 1, -2**31], [0, 12, -1, 100]])
    b = np.int32([[3, -3, 0x0F0F0F0F, -1], [5, 10, 7, -9]])
    assert ops_of(INTEGER_AND_PRED_LOGIC)[:4] == ["BITWISE_AND", "BITWISE_OR", "BITWISE_XOR", "BITWISE_NOT"]
    out = run_hlo(INTEGER_AND_PRED_LOGIC, {"a.1": a, "b.1": b})
    pairs = list(zip(a.ravel().tolist(), b.ravel().tolist()))
    fmod = [abs(x) % abs(y) * (1 if x >= 0 else -1) for x, y in pairs]  # C's %: the dividend's sign
    wants = [[x & y for x, y in pairs], [x | y for x, y in pairs], [x ^ y for x, y in pairs],
             [~x for x, _ in pairs], fmod, [(x > 0) - (x < 0) for x, _ in pairs]]
    for k, want in enumerate(wants):
        np.testing.assert_array_equal(out[f"tuple.1.{k}"].ravel(), want, err_msg=str(k))
    lt, ge = a < b, a >= b
    for k, want in enumerate([lt, ge, lt ^ ge, ~lt, lt & ~lt], 6):
        np.testing.assert_array_equal(out[f"tuple.1.{k}"], want.astype(np.uint8), err_msg=str(k))


# jax.nn.logsumexp(a, axis=-1) as JAX prints it: is-finite guards the max it subtracts
LOGSUMEXP = """HloModule jit__lambda, entry_computation_layout={(f32[4,6]{1,0})->f32[4]{0}}

region_0.1 {
  reduce_max.3 = f32[] parameter(0)
  reduce_max.4 = f32[] parameter(1)
  ROOT reduce_max.5 = f32[] maximum(reduce_max.3, reduce_max.4)
}

region_1.2 {
  reduce_sum.3 = f32[] parameter(0)
  reduce_sum.4 = f32[] parameter(1)
  ROOT reduce_sum.5 = f32[] add(reduce_sum.3, reduce_sum.4)
}

ENTRY main.3 {
  a.1 = f32[4,6]{1,0} parameter(0)
  constant.7 = f32[] constant(-inf)
  reduce_max.7 = f32[4]{0} reduce(a.1, constant.7), dimensions={1}, to_apply=region_0.1
  constant.5 = f32[] constant(-inf)
  broadcast.3 = f32[4]{0} broadcast(constant.5), dimensions={}
  max.1 = f32[4]{0} maximum(reduce_max.7, broadcast.3)
  is_finite.1 = pred[4]{0} is-finite(max.1)
  constant.4 = f32[] constant(0)
  broadcast.2 = f32[4]{0} broadcast(constant.4), dimensions={}
  select_n.1 = f32[4]{0} select(is_finite.1, max.1, broadcast.2)
  broadcast_in_dim.1 = f32[4,1]{1,0} reshape(select_n.1)
  sub.4 = f32[4,1]{1,0} broadcast(broadcast_in_dim.1), dimensions={0,1}
  sub.5 = f32[4]{0} reshape(sub.4)
  sub.6 = f32[4,6]{1,0} broadcast(sub.5), dimensions={0}
  sub.7 = f32[4,6]{1,0} subtract(a.1, sub.6)
  exp.1 = f32[4,6]{1,0} exponential(sub.7)
  constant.6 = f32[] constant(0)
  reduce_sum.7 = f32[4]{0} reduce(exp.1, constant.6), dimensions={1}, to_apply=region_1.2
  abs.1 = f32[4]{0} abs(reduce_sum.7)
  log.1 = f32[4]{0} log(abs.1)
  ROOT add.1 = f32[4]{0} add(log.1, select_n.1)
}
"""


def test_logsumexp_with_its_is_finite_guard():
    assert "IS_FINITE" in ops_of(LOGSUMEXP)
    a = RNG.uniform(-30, 30, (4, 6)).astype(np.float32)
    a[2] = -np.inf  # a row of no mass: its max is not finite, so 0 is subtracted, and the result is -inf
    x = a.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        top = np.where(np.isfinite(x.max(1)), x.max(1), 0)
        want = np.log(np.exp(x - top[:, None]).sum(1)) + top
    np.testing.assert_allclose(run_hlo(LOGSUMEXP, {"a.1": a})["add.1"], want, rtol=1e-6)


# ---- reduce-window: the pools ----------------------------------------------------------------

ADD = """region_0.1 {
  reduce_window_sum.3 = f32[] parameter(0)
  reduce_window_sum.4 = f32[] parameter(1)
  ROOT reduce_window_sum.5 = f32[] add(reduce_window_sum.3, reduce_window_sum.4)
}
"""
MAX = ADD.replace("sum", "max").replace("add(", "maximum(")
MIN = ADD.replace("sum", "min").replace("add(", "minimum(")

# nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME") of an NHWC image
FLAX_MAX_POOL = f"""HloModule jit__lambda, entry_computation_layout={{(f32[2,9,7,3]{{3,2,1,0}})->f32[2,5,4,3]{{3,2,1,0}}}}

{MAX}
ENTRY main.2 {{
  a.1 = f32[2,9,7,3]{{3,2,1,0}} parameter(0)
  constant.1 = f32[] constant(-inf)
  ROOT reduce_window_max.7 = f32[2,5,4,3]{{3,2,1,0}} reduce-window(a.1, constant.1), window={{size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0}}, to_apply=region_0.1
}}
"""


def test_flax_max_pool_is_one_maxpool2d_with_padding_never_chosen():
    assert ops_of(FLAX_MAX_POOL) == ["MAXPOOL2D"]
    x = RNG.uniform(-5, -1, (2, 9, 7, 3)).astype(np.float32)  # all below the zero a padding of zeros would be
    want = window_reduce(x, -np.inf, max, [1, 3, 3, 1], [1, 2, 2, 1], [(0, 0), (1, 1), (1, 1), (0, 0)])
    np.testing.assert_array_equal(run_hlo(FLAX_MAX_POOL, {"a.1": x})["reduce_window_max.7"], want)


def _avg_pool_a(window: str, out: str, counts: str) -> str:
    return f"""HloModule jit__lambda, entry_computation_layout={{(f32[2,9,7,3]{{3,2,1,0}})->f32[{out}]{{3,2,1,0}}}}

{ADD}
ENTRY main.2 {{
  a.1 = f32[2,9,7,3]{{3,2,1,0}} parameter(0)
  constant.3 = f32[] constant(0)
  reduce_window_sum.7 = f32[{out}]{{3,2,1,0}} reduce-window(a.1, constant.3), window={{{window}}}, to_apply=region_0.1
{counts}
}}
"""


# nn.avg_pool(x, (3, 3), padding="SAME"): divided by the window's 9, padding counted
AVG_SAME = _avg_pool_a("size=1x3x3x1 pad=0_0x1_1x1_1x0_0", "2,9,7,3", """  constant.2 = f32[] constant(9)
  div.2 = f32[2,9,7,3]{3,2,1,0} broadcast(constant.2), dimensions={}
  ROOT div.3 = f32[2,9,7,3]{3,2,1,0} divide(reduce_window_sum.7, div.2)""")
# ... count_include_pad=False, strides (2, 2): by a reduce-window of ones, the inputs in each window
AVG_INPUTS = _avg_pool_a("size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0", "2,5,4,3", """  constant.2 = f32[] constant(1)
  broadcast_in_dim.1 = f32[1,9,7,1]{3,2,1,0} broadcast(constant.2), dimensions={}
  reduce_window_sum.15 = f32[1,5,4,1]{3,2,1,0} reduce-window(broadcast_in_dim.1, constant.3), window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0}, to_apply=region_0.1
  div.4 = f32[1,5,4,1]{3,2,1,0} broadcast(reduce_window_sum.15), dimensions={0,1,2,3}
  div.5 = f32[1,5,4]{2,1,0} reshape(div.4)
  div.6 = f32[2,5,4,3]{3,2,1,0} broadcast(div.5), dimensions={0,1,2}
  ROOT div.7 = f32[2,5,4,3]{3,2,1,0} divide(reduce_window_sum.7, div.6)""")
# nn.avg_pool(x, (2, 2), strides=(2, 2)) after XLA's optimizations: times 0.25, in fusions
AVG_OPTIMIZED = f"""HloModule jit__lambda, is_scheduled=true, entry_computation_layout={{(f32[2,9,7,3]{{3,2,1,0}})->f32[2,4,3,3]{{3,2,1,0}}}}

%fused_computation (param_0: f32[2,4,3,3]) -> f32[2,4,3,3] {{
  %param_0 = f32[2,4,3,3]{{3,2,1,0}} parameter(0)
  %constant.1 = f32[] constant(0.25)
  %broadcast.1 = f32[2,4,3,3]{{3,2,1,0}} broadcast(%constant.1), dimensions={{}}
  ROOT %multiply.1 = f32[2,4,3,3]{{3,2,1,0}} multiply(%param_0, %broadcast.1)
}}

{ADD}
%wrapped_reduce-window_computation (param_0.1: f32[2,9,7,3], param_1.2: f32[]) -> f32[2,4,3,3] {{
  %param_0.1 = f32[2,9,7,3]{{3,2,1,0}} parameter(0)
  %param_1.2 = f32[] parameter(1)
  ROOT %reduce_window_sum.0 = f32[2,4,3,3]{{3,2,1,0}} reduce-window(%param_0.1, %param_1.2), window={{size=1x2x2x1 stride=1x2x2x1}}, to_apply=%region_0.1
}}

ENTRY %main.2 (a.1: f32[2,9,7,3]) -> f32[2,4,3,3] {{
  %a.1 = f32[2,9,7,3]{{3,2,1,0}} parameter(0)
  %constant.3 = f32[] constant(0)
  %wrapped_reduce-window = f32[2,4,3,3]{{3,2,1,0}} fusion(%a.1, %constant.3), kind=kLoop, calls=%wrapped_reduce-window_computation
  ROOT %broadcast_multiply_fusion = f32[2,4,3,3]{{3,2,1,0}} fusion(%wrapped_reduce-window), kind=kLoop, calls=%fused_computation
}}
"""
AVG_POOLS = {  # text, (size, stride, padding), padding counted
    "same": (AVG_SAME, ([3, 3], [1, 1], [(1, 1), (1, 1)]), True),
    "inputs": (AVG_INPUTS, ([3, 3], [2, 2], [(1, 1), (1, 1)]), False),
    "optimized": (AVG_OPTIMIZED, ([2, 2], [2, 2], [(0, 0), (0, 0)]), True),
}


@pytest.mark.parametrize("form", AVG_POOLS)
def test_flax_avg_pool_is_one_avgpool2d(form):
    text, (size, stride, pad), counted = AVG_POOLS[form]
    graph, _ = parse(text)
    [op] = graph.ops
    assert op.op_type == "AVGPOOL2D" and op.attrs["count_include_pad"] is counted
    x = RNG.uniform(-2, 2, (2, 9, 7, 3)).astype(np.float32)
    size4, stride4, pad4 = [1, *size, 1], [1, *stride, 1], [(0, 0), *pad, (0, 0)]
    sums = window_reduce(x, 0.0, float.__add__, size4, stride4, pad4)
    counts = window_reduce(np.ones_like(x), 0.0, float.__add__, size4, stride4, pad4) if not counted else math.prod(size)
    [got] = run_hlo(text, {"a.1": x}).values()
    np.testing.assert_allclose(got, sums / counts, rtol=1e-6, atol=1e-7)


# lax.reduce_window over an NCHW tensor's H and W: a sum and a min, the pools between TRANSPOSEs
NCHW_WINDOWS = f"""HloModule jit__lambda, entry_computation_layout={{(f32[2,3,9,7]{{3,2,1,0}})->(f32[2,3,5,4]{{3,2,1,0}}, f32[2,3,5,7]{{3,2,1,0}})}}

{ADD}
{MIN.replace("region_0.1", "region_1.2")}
ENTRY main.3 {{
  a.1 = f32[2,3,9,7]{{3,2,1,0}} parameter(0)
  constant.1 = f32[] constant(0)
  reduce_window_sum.7 = f32[2,3,5,4]{{3,2,1,0}} reduce-window(a.1, constant.1), window={{size=1x1x3x3 stride=1x1x2x2 pad=0_0x0_0x1_1x1_1}}, to_apply=region_0.1
  constant.2 = f32[] constant(inf)
  reduce_window_min.7 = f32[2,3,5,7]{{3,2,1,0}} reduce-window(a.1, constant.2), window={{size=1x1x3x2 stride=1x1x2x1 pad=0_0x0_0x1_1x0_1}}, to_apply=region_1.2
  ROOT tuple.1 = (f32[2,3,5,4]{{3,2,1,0}}, f32[2,3,5,7]{{3,2,1,0}}) tuple(reduce_window_sum.7, reduce_window_min.7)
}}
"""


def test_nchw_windows_sum_and_min():
    ops = ops_of(NCHW_WINDOWS)
    assert ops.count("SUMPOOL2D") == 1 and ops.count("MAXPOOL2D") == 1 and set(ops) == {
        "TRANSPOSE", "SUMPOOL2D", "NEGATE", "MAXPOOL2D"}
    x = RNG.uniform(-2, 2, (2, 3, 9, 7)).astype(np.float32)
    out = run_hlo(NCHW_WINDOWS, {"a.1": x})
    np.testing.assert_allclose(out["tuple.1.0"], window_reduce(x, 0.0, float.__add__, [1, 1, 3, 3], [1, 1, 2, 2],
                                                               [(0, 0), (0, 0), (1, 1), (1, 1)]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["tuple.1.1"], window_reduce(x, np.inf, min, [1, 1, 3, 2], [1, 1, 2, 1],
                                                                  [(0, 0), (0, 0), (1, 1), (0, 1)]))


# a 1-D window over [N, L, C] (Flax's max_pool of a sequence) and a dilated 2-D one
ONE_D_AND_DILATED = f"""HloModule jit__lambda, entry_computation_layout={{(f32[2,9,3]{{2,1,0}}, f32[2,9,7,3]{{3,2,1,0}})->(f32[2,4,3]{{2,1,0}}, f32[2,9,7,3]{{3,2,1,0}})}}

{MAX}
ENTRY main.2 {{
  a.1 = f32[2,9,3]{{2,1,0}} parameter(0)
  b.1 = f32[2,9,7,3]{{3,2,1,0}} parameter(1)
  constant.1 = f32[] constant(-inf)
  pool.1 = f32[2,4,3]{{2,1,0}} reduce-window(a.1, constant.1), window={{size=1x2x1 stride=1x2x1}}, to_apply=region_0.1
  pool.2 = f32[2,9,7,3]{{3,2,1,0}} reduce-window(b.1, constant.1), window={{size=1x2x2x1 pad=0_0x1_1x1_1x0_0 rhs_dilate=1x2x2x1}}, to_apply=region_0.1
  ROOT tuple.1 = (f32[2,4,3]{{2,1,0}}, f32[2,9,7,3]{{3,2,1,0}}) tuple(pool.1, pool.2)
}}
"""


def test_one_d_and_dilated_windows():
    graph, _ = parse(ONE_D_AND_DILATED)
    pools = [op for op in graph.ops if op.op_type == "MAXPOOL2D"]
    assert [p.attrs["kernel"] for p in pools] == [[1, 2], [2, 2]] and pools[1].attrs["dilation"] == [2, 2]
    a, b = RNG.uniform(-2, 2, (2, 9, 3)).astype(np.float32), RNG.uniform(-2, 2, (2, 9, 7, 3)).astype(np.float32)
    out = run_hlo(ONE_D_AND_DILATED, {"a.1": a, "b.1": b})
    np.testing.assert_array_equal(out["tuple.1.0"], window_reduce(a, -np.inf, max, [1, 2, 1], [1, 2, 1]))
    np.testing.assert_array_equal(out["tuple.1.1"], window_reduce(b, -np.inf, max, [1, 2, 2, 1], None,
                                                                  [(0, 0), (1, 1), (1, 1), (0, 0)], [1, 2, 2, 1]))


# ---- reduce of two operands: argmax and argmin -----------------------------------------------

COMPARATOR = """region_0.1 {
  reduce.4 = f32[] parameter(0)
  reduce.6 = f32[] parameter(2)
  gt.1 = pred[] compare(reduce.4, reduce.6), direction=GT
  ne.1 = pred[] compare(reduce.4, reduce.4), direction=NE
  or.2 = pred[] or(gt.1, ne.1)
  select_n.2 = f32[] select(or.2, reduce.4, reduce.6)
  eq.1 = pred[] compare(reduce.4, reduce.6), direction=EQ
  reduce.5 = s32[] parameter(1)
  reduce.7 = s32[] parameter(3)
  lt.1 = pred[] compare(reduce.5, reduce.7), direction=LT
  and.1 = pred[] and(eq.1, lt.1)
  or.3 = pred[] or(or.2, and.1)
  select_n.3 = s32[] select(or.3, reduce.5, reduce.7)
  ROOT tuple.1 = (f32[], s32[]) tuple(select_n.2, select_n.3)
}
"""

# (jnp.max(a, -1), jnp.argmax(a, -1)), and jnp.argmin(a, 0), as JAX prints them
ARGMAX_ARGMIN = f"""HloModule jit__lambda, entry_computation_layout={{(f32[3,4]{{1,0}})->(f32[3]{{0}}, s32[3]{{0}}, s32[4]{{0}})}}

{COMPARATOR}
{COMPARATOR.replace("region_0.1", "region_1.3").replace("direction=GT", "direction=LT")}
argmax.2 {{
  jit__lambda__.1 = f32[3,4]{{1,0}} parameter(0)
  iota.2 = s32[4]{{0}} iota(), iota_dimension=0
  iota.3 = s32[3,4]{{1,0}} broadcast(iota.2), dimensions={{1}}
  constant.4 = f32[] constant(-inf)
  constant.3 = s32[] constant(0)
  ROOT reduce.11 = (f32[3]{{0}}, s32[3]{{0}}) reduce(jit__lambda__.1, iota.3, constant.4, constant.3), dimensions={{1}}, to_apply=region_0.1
}}

ENTRY main.8 {{
  a.1 = f32[3,4]{{1,0}} parameter(0)
  both.1 = (f32[3]{{0}}, s32[3]{{0}}) call(a.1), to_apply=argmax.2
  max.1 = f32[3]{{0}} get-tuple-element(both.1), index=0
  argmax.1 = s32[3]{{0}} get-tuple-element(both.1), index=1
  iota.4 = s32[3,4]{{1,0}} iota(), iota_dimension=0
  constant.5 = f32[] constant(inf)
  constant.6 = s32[] constant(0)
  reduce.12 = (f32[4]{{0}}, s32[4]{{0}}) reduce(a.1, iota.4, constant.5, constant.6), dimensions={{0}}, to_apply=region_1.3
  argmin.1 = s32[4]{{0}} get-tuple-element(reduce.12), index=1
  ROOT tuple.7 = (f32[3]{{0}}, s32[3]{{0}}, s32[4]{{0}}) tuple(max.1, argmax.1, argmin.1)
}}
"""


# each row's maximum twice or more, and columns 0 and 3's minimum twice
TIES = np.float32([[1, 3, 3, 0], [2, 2, 2, 0], [1, 5, -1, 5]])


def test_argmax_and_argmin_take_the_first_of_ties():
    graph, _ = parse(ARGMAX_ARGMIN)
    assert sorted(op.op_type for op in graph.ops) == ["ARGMAX", "ARGMIN", "REDUCE_MAX"]
    assert not any(op.attrs.get("select_last_index") for op in graph.ops)
    out = run_hlo(ARGMAX_ARGMIN, {"a.1": TIES})
    np.testing.assert_array_equal(out["tuple.7.0"], [3, 2, 5])
    np.testing.assert_array_equal(out["tuple.7.1"], [1, 0, 1])  # the first of equal maxima
    np.testing.assert_array_equal(out["tuple.7.2"], [0, 1, 2, 0])  # and of equal minima


def test_a_comparator_keeping_the_last_position_sets_select_last_index():
    last = ARGMAX_ARGMIN.replace("lt.1 = pred[] compare(reduce.5, reduce.7), direction=LT",
                                 "lt.1 = pred[] compare(reduce.5, reduce.7), direction=GT")
    graph, _ = parse(last)
    assert all(op.attrs["select_last_index"] for op in graph.ops if op.op_type.startswith("ARG"))
    out = run_hlo(last, {"a.1": TIES})
    np.testing.assert_array_equal(out["tuple.7.1"], [2, 2, 3])
    np.testing.assert_array_equal(out["tuple.7.2"], [2, 1, 2, 1])


# jnp.argmax(a, axis=-1) after XLA's optimizations: the iota and the reduce in one fusion
ARGMAX_OPTIMIZED = """HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[3,4]{1,0})->s32[3]{0}}

%region_0.1 (reduce.4: f32[], reduce.5: s32[], reduce.6: f32[], reduce.7: s32[]) -> (f32[], s32[]) {
  %reduce.4 = f32[] parameter(0)
  %reduce.5 = s32[] parameter(1)
  %reduce.6 = f32[] parameter(2)
  %reduce.7 = s32[] parameter(3)
  %ne.1 = pred[] compare(%reduce.4, %reduce.4), direction=NE
  %gt.1 = pred[] compare(%reduce.4, %reduce.6), direction=GT
  %eq.1 = pred[] compare(%reduce.4, %reduce.6), direction=EQ
  %lt.1 = pred[] compare(%reduce.5, %reduce.7), direction=LT
  %or.2 = pred[] or(%gt.1, %ne.1)
  %and.1 = pred[] and(%eq.1, %lt.1)
  %select_n.2 = f32[] select(%or.2, %reduce.4, %reduce.6)
  %or.3 = pred[] or(%or.2, %and.1)
  %select_n.3 = s32[] select(%or.3, %reduce.5, %reduce.7)
  ROOT %tuple.1 = (f32[], s32[]) tuple(%select_n.2, %select_n.3)
}

%fused_computation (param_0: f32[3,4]) -> (f32[3], s32[3]) {
  %param_0 = f32[3,4]{1,0} parameter(0)
  %iota.5 = s32[3,4]{1,0} iota(), iota_dimension=1
  %constant.5 = f32[] constant(-inf)
  %constant.4 = s32[] constant(0)
  ROOT %reduce.2 = (f32[3]{0}, s32[3]{0}) reduce(%param_0, %iota.5, %constant.5, %constant.4), dimensions={1}, to_apply=%region_0.1
}

ENTRY %main.3 (a.1: f32[3,4]) -> s32[3] {
  %a.1 = f32[3,4]{1,0} parameter(0)
  %iota_reduce_fusion = (f32[3]{0}, s32[3]{0}) fusion(%a.1), kind=kLoop, calls=%fused_computation
  ROOT %reduce.1 = s32[3]{0} get-tuple-element(%iota_reduce_fusion), index=1
}
"""


def test_argmax_after_xla_optimizations():
    assert ops_of(ARGMAX_OPTIMIZED) == ["ARGMAX"]
    np.testing.assert_array_equal(run_hlo(ARGMAX_OPTIMIZED, {"a.1": TIES})["reduce.1"], [1, 0, 1])


# ---- refusals --------------------------------------------------------------------------------


TOP_K = """HloModule m
ENTRY e {
  x = f32[1,5] parameter(0)
  ROOT t = (f32[1,5], s32[1,5]) topk(x), k=5, largest=true
}
"""


def test_top_k_orders_floats_as_xla_does_in_ieee_total_order():
    """XLA's TopK compares the floats' bits: 0.0 before -0.0, a NaN by its sign (+NaN largest,
    -NaN smallest); jnp.sort's comparator makes them canonical, which SORT's default order is."""
    x = np.float32([[1, -0.0, 0.0, -0.0, np.nan]])
    np.testing.assert_array_equal(run_hlo(TOP_K, {"x": x})["t.1"], [[4, 0, 2, 1, 3]])
    x[0, 4] = -np.float32(np.nan)  # as x86 makes 0/0
    assert np.signbit(x[0, 4])
    np.testing.assert_array_equal(run_hlo(TOP_K, {"x": x})["t.1"], [[0, 2, 1, 3, 4]])


def test_a_sort_of_float8_values():
    """f8e4m3fn holds no infinity: the comparator is tried on the values the type holds."""
    x = np.float32([[3, -2, 0.5, 1.5, -0.25]]).astype(ml_dtypes.float8_e4m3fn)
    text = _sort_results(SORT, 1).replace("f32", "f8e4m3fn").replace("f8e4m3fn[3,5]", "f8e4m3fn[1,5]").replace(
        "s32[3,5]", "s32[1,5]")
    np.testing.assert_array_equal(run_hlo(text, {"a.1": x})["tuple.4.0"], [[1, 4, 2, 3, 0]])


def _running_module(pad: str, length: int, region: str = ADD, init: str = "0") -> str:
    """A reduce-window by `region` over dim 1 of a [3, 6], the window all 6 long, padded by `pad`."""
    return f"""HloModule m

{region}
ENTRY e {{
  a = f32[3,6] parameter(0)
  c = f32[] constant({init})
  ROOT r = f32[3,{length}] reduce-window(a, c), window={{size=1x6 pad=0_0x{pad}}}, to_apply=region_0.1
}}
"""


RUNNING = {"add": (ADD, "0", "CUMSUM", np.add), "multiply": (ADD.replace("add(", "multiply("), "1", "CUMPROD", np.multiply),
           "maximum": (MAX, "-inf", "CUMMAX", np.maximum), "minimum": (MIN, "inf", "CUMMIN", np.minimum)}


@pytest.mark.parametrize("kind", RUNNING)
@pytest.mark.parametrize("pad, length, reverse, first", [
    ("5_0", 6, False, False),  # jnp.cumsum
    ("0_5", 6, True, False),  # from the end
    ("6_0", 7, False, True),  # XLA's blocks of a long one: a result of none first
    ("0_6", 7, True, True),
])
def test_a_window_all_of_an_axis_long_is_a_running_reduction(kind, pad, length, reverse, first):
    """jnp.cumsum's reduce-window (cumprod's, cummax's, cummin's) is a CUMSUM (CUMPROD, ...), one
    step per element, not a pool of n steps each."""
    region, init, op, ufunc = RUNNING[kind]
    text = _running_module(pad, length, region, init)
    graph, _ = parse(text)
    assert op in [o.op_type for o in graph.ops] and not any(o.op_type.endswith("POOL2D") for o in graph.ops)
    a = np.float32(np.arange(18).reshape(3, 6) % 7 - 3) / 2
    start = np.full((3, 1), float(init), np.float32)
    padded = np.concatenate([a, start] if reverse else [start, a], axis=1) if first else a
    want = ufunc.accumulate(padded[:, ::-1], axis=1)[:, ::-1] if reverse else ufunc.accumulate(padded, axis=1)
    np.testing.assert_array_equal(run_hlo(text, {"a": a})["r"], want)


def _window_module(window: str, region: str = MAX, element: str = "f32", init: str = "-inf") -> str:
    return f"""HloModule m

{region.replace("f32", element)}
ENTRY e {{
  a = {element}[2,4,4,3] parameter(0)
  c = {element}[] constant({init})
  ROOT r = {element}[2,2,2,3] reduce-window(a, c), window={{{window}}}, to_apply=region_0.1
}}
"""


# jnp.sort(a) and jnp.argsort(a) over the last dimension, as JAX lowers them: NaN and -0.0 made
# canonical, then a total order
SORT = """HloModule jit_sort
region_0.1 {
  p0 = f32[] parameter(0)
  p1 = f32[] parameter(1)
  p2 = s32[] parameter(2)
  p3 = s32[] parameter(3)
  nan = f32[] constant(nan)
  zero = f32[] constant(0)
  ne.0 = pred[] compare(p0, p0), direction=NE
  eq.0 = pred[] compare(p0, zero), direction=EQ
  s.0 = f32[] select(eq.0, zero, p0)
  c.0 = f32[] select(ne.0, nan, s.0)
  ne.1 = pred[] compare(p1, p1), direction=NE
  eq.1 = pred[] compare(p1, zero), direction=EQ
  s.1 = f32[] select(eq.1, zero, p1)
  c.1 = f32[] select(ne.1, nan, s.1)
  ROOT lt = pred[] compare(c.0, c.1), direction=LT, type=TOTALORDER
}
ENTRY e {
  a.1 = f32[3,5]{1,0} parameter(0)
  iota.2 = s32[3,5]{1,0} iota(), iota_dimension=1
  sort.3 = (f32[3,5]{1,0}, s32[3,5]{1,0}) sort(a.1, iota.2), dimensions={1}, is_stable=true, to_apply=region_0.1
  ROOT tuple.4 = (f32[3,5]{1,0}, s32[3,5]{1,0}) tuple(sort.3)
}
"""


def _sort_results(text: str, *indices: int) -> str:
    """SORT with the sort's results `indices` (0: values, 1: positions) its root's tuple."""
    types = {0: "f32[3,5]{1,0}", 1: "s32[3,5]{1,0}"}
    picked = "".join(f"  gte.{k} = {types[k]} get-tuple-element(sort.3), index={k}\n" for k in indices)
    return text.replace("  ROOT tuple.4 = (f32[3,5]{1,0}, s32[3,5]{1,0}) tuple(sort.3)",
                        f"{picked}  ROOT tuple.4 = ({', '.join(types[k] for k in indices)}) "
                        f"tuple({', '.join(f'gte.{k}' for k in indices)})")


def test_sort_and_argsort_keep_equal_values_in_order_and_nan_last():
    text = _sort_results(SORT, 0, 1)
    graph, _ = parse(text)
    assert sorted(op.op_type for op in graph.ops) == ["ARGSORT", "SORT"]
    a = np.float32([[2, np.nan, -1, 2, 0], [1, 1, 1, 1, 1], [np.inf, -0.0, 0.0, -np.inf, 3]])
    out = run_hlo(text, {"a.1": a})
    np.testing.assert_array_equal(out["tuple.4.1"], [[2, 4, 0, 3, 1], [0, 1, 2, 3, 4], [3, 1, 2, 4, 0]])
    np.testing.assert_array_equal(out["tuple.4.0"], np.take_along_axis(a, out["tuple.4.1"], axis=1))


def test_a_sort_carries_any_operand_in_its_keys_order():
    """jax.lax.sort_key_val: the values go where their keys go (a GATHER at the ARGSORTed keys'
    flat positions), here an iota along the other dimension and an f32 tensor."""
    text = _sort_results(SORT.replace("iota(), iota_dimension=1", "iota(), iota_dimension=0"), 0, 1)
    a = np.float32([[2, np.nan, -1, 2, 0], [1, 1, 1, 1, 1], [np.inf, -0.0, 0.0, -np.inf, 3]])
    order = np.argsort(np.where(np.isnan(a), np.inf, a), axis=1, kind="stable")
    order[0] = [2, 4, 0, 3, 1]  # NaN after inf
    out = run_hlo(text, {"a.1": a})
    np.testing.assert_array_equal(out["tuple.4.1"], np.take_along_axis(np.broadcast_to(np.arange(3)[:, None], (3, 5)),
                                                                       order, axis=1))
    values = text.replace("  iota.2 = s32[3,5]{1,0} iota(), iota_dimension=0\n", "  v.2 = f32[3,5]{1,0} parameter(1)\n")
    values = values.replace("sort(a.1, iota.2)", "sort(a.1, v.2)").replace("p2 = s32[]", "p2 = f32[]").replace(
        "p3 = s32[]", "p3 = f32[]").replace("s32[3,5]{1,0} get-tuple-element", "f32[3,5]{1,0} get-tuple-element").replace(
        "(f32[3,5]{1,0}, s32[3,5]{1,0})", "(f32[3,5]{1,0}, f32[3,5]{1,0})")
    v = np.float32(np.arange(15).reshape(3, 5) * 1.5 - 4)
    np.testing.assert_array_equal(run_hlo(values, {"a.1": a, "v.2": v})["tuple.4.1"], np.take_along_axis(v, order, axis=1))


def test_a_greater_than_comparator_sorts_largest_first():
    text = _sort_results(SORT.replace("direction=LT, type=TOTALORDER", "direction=GT, type=TOTALORDER"), 1)
    out = run_hlo(text, {"a.1": np.float32([[2, np.nan, -1, 2, 0], [1, 1, 1, 1, 1], [5, 4, 3, 2, 1]])})
    np.testing.assert_array_equal(out["tuple.4.0"], [[1, 0, 3, 4, 2], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]])


def _unary(opcode: str, element: str = "f32", result: str | None = None, extra: str = "") -> str:
    return (f"HloModule m\nENTRY e {{\n  a = {element}[4] parameter(0)\n  b = {element}[4] parameter(1)\n"
            f"  ROOT r = {result or element}[4] {opcode}{extra}\n}}\n")


REFUSED = [
    (_window_module("size=2x2x2x1 stride=2x2x2x1"), "a window over 3 dimensions does not map onto the 2-D pools"),
    (_window_module("size=1x2x2x1 stride=1x2x2x1 lhs_dilate=1x2x1x1"), "base dilation (lhs_dilate) is not supported"),
    (_window_module("size=1x2x2x1 stride=1x2x2x1", ADD.replace("add(", "multiply("), init="1"),
     "a reduce-window by 'multiply' is not supported"),
    (_window_module("size=1x2x2x1 stride=1x2x2x1", MIN, "s32", "2147483647"), "'minimum' of integers is not supported"),
    (_window_module("size=1x2x2x1 stride=1x2x2x1 pad=0_0x1_0x1_0x0_0", ADD, init="1"),
     "from an init value other than 0 is not supported"),
    (_window_module("size=1x2x2x1 stride=1x2x2x1 pad=0_0x-1_0x0_0x0_0"), "negative window padding is not supported"),
    (_window_module("size=1x2x2x1 stride=1x2x2x1 windowed=3"), "window field 'windowed' is not supported"),
    (ARGMAX_ARGMIN.replace("direction=NE", "direction=EQ"), "is not an argmax or argmin comparator"),
    (ARGMAX_ARGMIN.replace("iota(), iota_dimension=0\n  constant.5", "iota(), iota_dimension=1\n  constant.5"),
     "operand 1 is not the positions along dimension 0 (an iota)"),
    (ARGMAX_ARGMIN.replace("constant.6 = s32[] constant(0)", "constant.6 = s32[] constant(-1)"),
     "the init values must be the minimum's identity and position 0"),
    (ARGMAX_ARGMIN.replace("or.3 = pred[] or(or.2, and.1)", "or.3 = pred[] add(or.2, and.1)"),
     "instruction 'or.3' (add) of to_apply computation 'region_0.1' is not one an argmax or argmin comparator"),
    (SORT.replace("  ROOT lt = pred[] compare(c.0, c.1), direction=LT, type=TOTALORDER",
                  "  lt = pred[] compare(c.0, c.1), direction=LT, type=TOTALORDER\n"
                  "  eq = pred[] compare(c.0, c.1), direction=EQ, type=TOTALORDER\n"
                  "  later = pred[] compare(p2, p3), direction=GT\n  tie = pred[] and(eq, later)\n"
                  "  ROOT before = pred[] or(lt, tie)"),
     "is not an ascending or descending comparator of operand 0 alone"),  # ties broken by the last position
    (SORT.replace("direction=LT, type=TOTALORDER", "direction=EQ"),
     "to_apply computation 'region_0.1' is not an ascending or descending comparator of operand 0"),
    (SORT.replace("s.1 = f32[] select(eq.1, zero, p1)", "s.1 = f32[] add(zero, p1)"),
     "instruction 's.1' (add) of computation 'region_0.1' is not one a sort's comparator is made of"),
    (_unary("popcnt(a)", "s32"), "HLO op 'popcnt' is not supported"),
    (_unary("count-leading-zeros(a)", "s32"), "HLO op 'count-leading-zeros' is not supported"),
    (_unary("shift-left(a, b)", "s32"), "HLO op 'shift-left' is not supported"),
    (_unary("and(a, b)"), "'and' takes pred or integer operands, not f32"),
    (_unary("is-finite(a)", "s32", "pred"), "is-finite takes a floating-point operand and gives pred"),
    (_unary("cbrt(a)", "s32"), "cbrt takes a floating-point operand"),
    (_unary("compare(a, b)", "s32", "pred", ", direction=LT, type=FLOAT"), "type=FLOAT is not the order of i32"),
]


@pytest.mark.parametrize("text, reason", REFUSED, ids=[r for _, r in REFUSED])
def test_refusals_are_one_line_naming_the_instruction(text, reason):
    message = error(text)
    assert reason in message, message
    assert message.startswith("t.hlo:"), message
