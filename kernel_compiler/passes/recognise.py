"""RECOGNISE: chains of primitives that spell a row op or an activation, rewritten into that op.

A rule fires only when the op means exactly what the chain does: the reductions run over the
op's axis (one axis for SOFTMAX; axis..last for LAYERNORM) and keep it, every matched op's
result has one float dtype (the op then rounds once where the chain rounded at each step), the
intermediates are read inside the chain alone (the engine's condition), and every constant is
the number the formula needs. A constant's value is known only when the frontend gives it
(`graph.constants`); a `.dfg` gives none, so there a layer norm with an epsilon and the GELU
chains stay as ops, with a warning. The small rules (a sum times 1/n is a mean, c ** 2 is c * c,
the max a softmax subtracts is its own) turn other spellings into the ones the big rules match,
and LAYERNORM takes its scale and bias one rule at a time.

Frontends that spell reductions as XLA does get two more small rules: a REDUCE_* that drops its
axes, RESHAPEd to the shape that keeps them as size 1, is the REDUCE_* that keeps them (HLO's
reduce always drops them and broadcasts back); and a reduction of a narrow float (f16, bf16,
f8) widened to f32 and rounded back after is the reduction of the narrow tensor itself, since
the registry's reduction computes in f32 and rounds once, the same numbers. XLA's layer norm
(`x * s + (bias - s * mean)` with `s = rsqrt(var + eps) * scale`) is one more LAYERNORM form.
"""

from __future__ import annotations

import math

import numpy as np

from dfx import Op, lookup
from dfx.ops.base import normalize_axis
from dfx.ops.reduction import ACCUMULATING

from .rewrite import Match, Pat, Rule


def _axes(m: Match, name: str) -> tuple[int, ...]:
    """The axes the REDUCE_* bound to `name` reduces, counted from the front, in order."""
    op = m.producer(name)
    return tuple(sorted(lookup(op.op_type).whole_axes(m.graph.tensors[op.inputs[0]].shape, m.attrs(name))))


def _keeps(attrs: dict) -> bool:
    """A reduction that keeps its axes as size 1, so its result broadcasts back along them."""
    return attrs["keepdims"]


# ---- reductions as XLA writes them -------------------------------------------------------------

REDUCTIONS = ACCUMULATING | {"REDUCE_MEAN"}
# floats whose reductions the registry computes in f32 and rounds once to them
NARROW_FLOATS = frozenset({"f16", "bf16", "f8"})


def _keep_reduced(m: Match) -> Op | None:
    reduction = m.producer("r")
    kept = {**m.attrs("r"), "keepdims": True}
    (shape,) = lookup(reduction.op_type).infer_shapes([m.shape("x")], [m.dtype("x")], kept)
    result = m.graph.tensors[m.root.outputs[0]]
    if tuple(shape) != result.shape or result.dtype != m.dtype("r"):
        return None  # the RESHAPE does more than put the reduced axes back as size 1
    return m.replace(reduction.op_type, m["x"], **kept)


def _narrow_reduction(m: Match) -> Op | None:
    narrow = m.dtype("x")
    if narrow not in NARROW_FLOATS or m.graph.tensors[m.root.outputs[0]].dtype != narrow \
            or m.dtype("wide") != "f32" or m.dtype("r") != "f32":
        return None
    return m.replace(m.producer("r").op_type, m["x"], **m.attrs("r"))


_x = Pat(name="x")

REDUCTION_RULES: list[Rule] = [
    (Pat("RESHAPE", Pat(REDUCTIONS, _x, name="r", where=lambda a: not a["keepdims"])),
     _keep_reduced),  # reshape(reduce(x){keepdims: false}) to the kept shape -> reduce(x){keepdims: true}
    (Pat("CAST", Pat(REDUCTIONS, Pat("CAST", _x, name="wide"), name="r")),
     _narrow_reduction),  # cast<f16>(reduce(cast<f32>(x: f16))) -> reduce(x) (computed in f32 all the same)
]


# ---- SOFTMAX ---------------------------------------------------------------------------------


def _softmax(m: Match) -> Op | None:
    axes = _axes(m, "sum")
    if len(axes) != 1 or not m.same_float_dtype():
        return None
    return m.replace("SOFTMAX", m["x"], axis=axes[0])


def _unshifted_softmax(m: Match) -> Op | None:
    # SOFTMAX subtracts the row's max itself: of x - max(x) that max is 0, so the same numbers
    axis = normalize_axis(m.attrs("softmax")["axis"], len(m.shape("x")))
    if _axes(m, "max") != (axis,) or not m.same_float_dtype():
        return None
    return m.replace("SOFTMAX", m["x"], axis=axis)


_exp = Pat("EXP", _x, name="e")
_sum_exp = Pat("REDUCE_SUM", _exp, name="sum", where=_keeps)

SOFTMAX_RULES: list[Rule] = [
    (Pat("MUL", _exp, Pat("RECIPROCAL", _sum_exp)), _softmax),  # exp(x) * 1/sum(exp(x)) -> SOFTMAX (TOSA)
    (Pat("DIV", _exp, _sum_exp), _softmax),  # exp(x) / sum(exp(x)) -> SOFTMAX
    (Pat("SOFTMAX", Pat("SUB", _x, Pat("REDUCE_MAX", _x, name="max", where=_keeps)), name="softmax"),
     _unshifted_softmax),  # softmax(x - max(x)) -> SOFTMAX(x)
]


# ---- LAYERNORM -------------------------------------------------------------------------------


def _reduced_count(m: Match, name: str) -> int:
    """How many elements the REDUCE_* bound to `name` reduces into each of its results."""
    shape = m.graph.tensors[m.producer(name).inputs[0]].shape
    return math.prod(shape[a] for a in _axes(m, name))


def _mean_times(m: Match) -> Op | None:
    n = _reduced_count(m, "sum")
    if n == 0 or not m.same_float_dtype() or not m.is_near("k", 1 / n):
        return None
    return m.replace("REDUCE_MEAN", m["x"], **m.attrs("sum"))


def _mean_over(m: Match) -> Op | None:
    if not m.same_float_dtype() or m.value("k") != _reduced_count(m, "sum"):
        return None
    return m.replace("REDUCE_MEAN", m["x"], **m.attrs("sum"))


def _square(m: Match) -> Op | None:
    return m.replace("MUL", m["x"], m["x"]) if m.same_float_dtype() and m.value("k") == 2 else None


def _normalised(m: Match) -> tuple[int, float] | None:
    """(first axis, epsilon) of a layer norm chain that normalises trailing axes of `x` with a
    known epsilon, or None (warned about where only the epsilon's value is missing)."""
    axes, rank = _axes(m, "mean"), len(m.shape("x"))
    if not axes or axes != _axes(m, "var") or axes != tuple(range(axes[0], rank)) or not m.same_float_dtype():
        return None
    epsilon = m.value("eps") if "eps" in m else 0.0
    if epsilon is None:
        m.warn(f"a layer norm chain is left as ops: its epsilon '{m['eps']}' is not a constant of known value")
        return None
    return axes[0], epsilon


def _layernorm(m: Match) -> Op | None:
    found = _normalised(m)
    return None if found is None else m.replace("LAYERNORM", m["x"], axis=found[0], epsilon=found[1])


def _folded_layernorm(m: Match) -> Op | None:
    # x * s + (bias - s * mean), s = rsqrt(var + eps) (* scale): (x - mean) * s + bias rearranged
    found = _normalised(m)
    if found is None:
        return None
    scale = m["scale"] if "scale" in m else m.constant("scale", np.ones(()), m.dtype("x"))
    return m.replace("LAYERNORM", m["x"], scale, m["bias"], axis=found[0], epsilon=found[1])


def _with_scale(m: Match) -> Op | None:
    return m.replace("LAYERNORM", m["x"], m["scale"], **m.attrs("ln")) if m.same_float_dtype() else None


def _with_bias(m: Match) -> Op | None:
    return m.replace("LAYERNORM", m["x"], m["scale"], m["bias"], **m.attrs("ln")) if m.same_float_dtype() else None


_reduce_sum = Pat("REDUCE_SUM", _x, name="sum")
_mean = Pat("REDUCE_MEAN", _x, name="mean", where=_keeps)
_centred = Pat("SUB", _x, _mean, name="c")
_variance = Pat("REDUCE_MEAN", Pat("MUL", _centred, _centred), name="var", where=_keeps)
_plus_eps = Pat.any(Pat("ADD", _variance, Pat(name="eps")), _variance)
_inv_std = Pat.any(Pat("MUL", Pat("RSQRT", _plus_eps), Pat(name="scale"), name="s"),
                   Pat("RSQRT", _plus_eps, name="s"))  # rsqrt(var + eps), times the scale or not

LAYERNORM_RULES: list[Rule] = [
    (Pat("MUL", _reduce_sum, Pat(name="k")), _mean_times),  # sum(x) * 1/n -> REDUCE_MEAN
    (Pat("DIV", _reduce_sum, Pat(name="k")), _mean_over),  # sum(x) / n -> REDUCE_MEAN
    (Pat("POW", _x, Pat(name="k")), _square),  # x ** 2 -> x * x
    (Pat("MUL", _centred, Pat("RSQRT", _plus_eps)), _layernorm),  # (x-mean) * rsqrt(var+eps) -> LAYERNORM
    (Pat("DIV", _centred, Pat("SQRT", _plus_eps)), _layernorm),  # (x-mean) / sqrt(var+eps) -> LAYERNORM
    (Pat("ADD", Pat("MUL", _x, _inv_std), Pat("SUB", Pat(name="bias"), Pat("MUL", _inv_std, _mean))),
     _folded_layernorm),  # x * s + (bias - s * mean), s = rsqrt(var+eps) * scale -> LAYERNORM (XLA)
    (Pat("MUL", Pat("LAYERNORM", _x, name="ln"), Pat(name="scale")), _with_scale),  # ln(x) * s -> LAYERNORM(x, s)
    (Pat("ADD", Pat("LAYERNORM", _x, Pat(name="scale"), name="ln"), Pat(name="bias")),
     _with_bias),  # ln(x, s) + b -> LAYERNORM(x, s, b)
]


# ---- GELU ------------------------------------------------------------------------------------

# the constants each form's chain binds -> the number it must hold: exactly for those in _EXACT
# (no frontend writes 0.5 or 3 approximately), else as Match.is_near says
_GELU_TANH = {"half": 0.5, "one": 1.0, "c": 0.044715, "k": math.sqrt(2 / math.pi), "three": 3.0}
_GELU_ERF = {"half": 0.5, "one": 1.0, "k": 1 / math.sqrt(2), "sqrt2": math.sqrt(2)}
_EXACT = {"half", "one", "three"}


def _gelu(approximate: str, constants: dict[str, float]):
    def rule(m: Match) -> Op | None:
        bound = [name for name in constants if name in m]
        if not m.same_float_dtype():
            return None
        if any(m.value(name) is None for name in bound):
            m.warn(f"a chain of the {approximate} form of GELU is left as ops: not every constant has a known value")
            return None
        if not all(m.value(n) == constants[n] if n in _EXACT else m.is_near(n, constants[n]) for n in bound):
            return None
        return m.replace("GELU", m["x"], approximate=approximate)
    return rule


def _times_half_x(p: Pat) -> Pat:
    """0.5 * x * p, in any grouping."""
    half = Pat(name="half")
    return Pat.any(Pat("MUL", Pat("MUL", _x, half), p), Pat("MUL", _x, Pat("MUL", half, p)),
                   Pat("MUL", Pat("MUL", _x, p), half))


_cube = Pat.any(Pat("POW", _x, Pat(name="three")), Pat("MUL", Pat("MUL", _x, _x), _x))
_tanh_inner = Pat("MUL", Pat("ADD", _x, Pat("MUL", _cube, Pat(name="c"))), Pat(name="k"))
_erf_inner = Pat.any(Pat("MUL", _x, Pat(name="k")), Pat("DIV", _x, Pat(name="sqrt2")))

GELU_RULES: list[Rule] = [
    (_times_half_x(Pat("ADD", Pat("TANH", _tanh_inner), Pat(name="one"))),
     _gelu("tanh", _GELU_TANH)),  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> GELU{tanh}
    (_times_half_x(Pat("ADD", Pat("ERF", _erf_inner), Pat(name="one"))),
     _gelu("none", _GELU_ERF)),  # 0.5 x (1 + erf(x / sqrt 2)) -> GELU
]


# ---- SiLU ------------------------------------------------------------------------------------


def _silu(m: Match) -> Op | None:
    return m.replace("SILU", m["x"]) if m.same_float_dtype() else None


SILU_RULES: list[Rule] = [
    (Pat.any(Pat("MUL", _x, Pat("SIGMOID", _x)), Pat("MUL", Pat("SIGMOID", _x), _x)),
     _silu),  # x * sigmoid(x) -> SILU (EfficientNet's activation, as PyTorch exports nn.SiLU)
]

# the rules that make one op of a chain of several computations: fusion, which --no-fusion leaves
# out (the REDUCTION_RULES only respell one op as another)
FUSING_RULES: list[Rule] = SOFTMAX_RULES + LAYERNORM_RULES + GELU_RULES + SILU_RULES
RECOGNISE: list[Rule] = REDUCTION_RULES + FUSING_RULES
