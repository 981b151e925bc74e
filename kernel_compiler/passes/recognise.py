"""RECOGNISE: chains of primitives that spell a row op or an activation, rewritten into that op.

A rule fires only when the op means exactly what the chain does: the reductions run over the
op's axis (one axis for SOFTMAX; axis..last for LAYERNORM and RMSNORM) and keep it, every
matched op's result has one float dtype (the op then rounds once where the chain rounded at each
step), the intermediates are read inside the chain alone (the engine's condition), and every
constant is the number the formula needs. A constant's value is known only when the frontend
gives it (`graph.constants`); a `.dfg` gives none, so there a layer norm with an epsilon and the
GELU chains stay as ops, with a warning. The small rules (a sum times 1/n is a mean, c ** 2 is c * c,
the max a softmax subtracts is its own) turn other spellings into the ones the big rules match,
and LAYERNORM takes its scale and bias one rule at a time. Two sums in a row, each keeping its
axes, of one dtype throughout, are one sum over both (the corpus MobileNets pool by H, then by
W); `global_pools`, which needs the target, makes such a sum over H and W a window op.

Frontends that spell reductions as XLA does get two more small rules: a REDUCE_* that drops its
axes, RESHAPEd to the shape that keeps them as size 1, is the REDUCE_* that keeps them (HLO's
reduce always drops them and broadcasts back); and a reduction of a narrow float (f16, bf16,
f8) widened to f32 and rounded back after is the reduction of the narrow tensor itself, since
the registry's reduction computes in f32 and rounds once, the same numbers. Where a reduction's
result is read twice that first rule cannot fire, so the big rules also take a row's values
computed with the axes dropped and RESHAPEd back anywhere along the chain (`_view`), as long as
every one meets x's elements in the kept shape (`_rows_kept`). XLA's layer norm (`x * s + (bias -
s * mean)` with `s = rsqrt(var + eps) * scale`) is one more LAYERNORM form; Flax's computes the
variance in one pass, `max(mean(x^2) - mean(x)^2, 0)`: LAYERNORM's two passes give the same
function without the cancellation (a variance it makes is never below 0, which the clamp is
there for), so the numbers differ from the chain's by its rounding alone; where a row's mean
dwarfs its spread that rounding is large (the cancellation), and LAYERNORM's are the closer to
the exact values. An RMS norm (`x * rsqrt(mean(x^2) + eps) * scale`, LLaMA's and Flax's) is
RMSNORM; torch exports its rsqrt as `1 / sqrt`, which two small rules respell.

Three rules respell what XLA's optimizer leaves: an op equal to an earlier one but for holding a
constant of the same value under another name (a mean computed again in each fusion that reads
it) is that op; `max(y, -inf)` (`jax.nn.softmax`'s guard) and `min(y, inf)` are y, for every y
(an all -inf row's softmax is NaN either way); `1 / y` is RECIPROCAL(y). They run as the first
stage of `passes.PASSES` (so the layout passes never see one value twice, which they would lay
out apart: a masking SELECT that XLA computes again in the fusion of the subtraction) and here
again, for what the stages between leave.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from dfx import REGISTRY, Graph, Op, is_integer, lookup
from dfx.ops.base import normalize_axis
from dfx.ops.reduction import ACCUMULATING

from .layout import EPILOGUE_VIEWS
from .rewrite import Match, Pat, Rule, rewrite


def _axes(m: Match, name: str) -> tuple[int, ...]:
    """The axes the REDUCE_* bound to `name` reduces, counted from the front, in order."""
    op = m.producer(name)
    return tuple(sorted(lookup(op.op_type).whole_axes(m.graph.tensors[op.inputs[0]].shape, m.attrs(name))))


def _view(p: Pat) -> Pat:
    """p, or a RESHAPE of it: a row's value computed with the reduced axes dropped, put back as
    size 1 for the broadcast (XLA's `broadcast`) at any step of the chain."""
    return Pat.any(p, Pat("RESHAPE", p))


def _rows_kept(m: Match, axes: tuple[int, ...]) -> bool:
    """Every matched result is x-shaped or a row's value, shaped as a reduction over `axes` of x
    that keeps them as size 1 or drops them; and every row's value meets an x-shaped one in the
    kept shape (or in it without its leading 1s, the same broadcast). So each RESHAPE of the chain only puts the reduced axes back, and no step
    broadcasts a row's values along another axis."""
    x = m.shape("x")
    kept = tuple(1 if a in axes else d for a, d in enumerate(x))
    dropped = tuple(d for a, d in enumerate(x) if a not in axes)
    # leading axes dropped broadcast as kept ones do: a row's value over axis 0 meets x as it is
    meets_x = {x, kept, kept[next((a for a, d in enumerate(kept) if d != 1), len(kept)):]}
    results = {op.outputs[0] for op in m.ops.values()}
    for op in m.ops.values():
        shape = m.graph.tensors[op.outputs[0]].shape
        if shape == x:
            if any(m.graph.tensors[t].shape not in meets_x for t in op.inputs if t in results):
                return False
        elif shape not in (dropped, kept):
            return False
    return True


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


def _sums_merged(m: Match) -> Op | None:
    # of one dtype throughout: an inner sum rounded (or truncated, to an integer) to another would
    # not give what one sum gives
    if not (m.attrs("inner")["keepdims"] and m.attrs("r")["keepdims"]):
        return None
    if not m.dtype("x") == m.dtype("inner") == m.dtype("r"):
        return None
    return m.replace("REDUCE_SUM", m["x"], axes=sorted({*_axes(m, "inner"), *_axes(m, "r")}), keepdims=True)


_x = Pat(name="x")

REDUCTION_RULES: list[Rule] = [
    (Pat("REDUCE_SUM", Pat("REDUCE_SUM", _x, name="inner"), name="r"),
     _sums_merged),  # reduce_sum{b}(reduce_sum{a}(x)), both keeping their axes -> reduce_sum{a, b}(x)
    (Pat("RESHAPE", Pat(REDUCTIONS, _x, name="r", where=lambda a: not a["keepdims"])),
     _keep_reduced),  # reshape(reduce(x){keepdims: false}) to the kept shape -> reduce(x){keepdims: true}
    (Pat("CAST", Pat(REDUCTIONS, Pat("CAST", _x, name="wide"), name="r")),
     _narrow_reduction),  # cast<f16>(reduce(cast<f32>(x: f16))) -> reduce(x) (computed in f32 all the same)
]


# ---- XLA's leftovers ---------------------------------------------------------------------------

def _same(m: Match, a: str, b: str) -> bool:
    """The same tensor, or constants of one shape, dtype and bytes."""
    if a == b:
        return True
    ta, tb = m.graph.tensors[a], m.graph.tensors[b]
    if ta.role != "constant" or tb.role != "constant" or (ta.shape, ta.dtype) != (tb.shape, tb.dtype):
        return False
    va, vb = m.graph.constant_values(a), m.graph.constant_values(b)
    return va is not None and vb is not None and va.tobytes() == vb.tobytes()


def _twin(m: Match) -> str | None:
    op = m.root
    computed = [t for t in op.inputs if m.graph.tensors[t].role != "constant"]
    if len(op.outputs) != 1 or not computed:
        return None  # an op of constants alone is the frontend's to fold
    for other in m.readers(computed[0]):
        if (other is not op and other.op_type == op.op_type and other.attrs == op.attrs and m.before(other)
                and len(other.outputs) == 1 and len(other.inputs) == len(op.inputs)
                and all(_same(m, a, b) for a, b in zip(other.inputs, op.inputs))):
            return other.outputs[0]
    return None


def _no_bound(m: Match) -> str | None:
    bound = -math.inf if m.root.op_type == "MAXIMUM" else math.inf
    return m["y"] if not is_integer(m.dtype("y")) and m.value("c") == bound else None


def _reciprocal(m: Match) -> Op | None:
    return m.replace("RECIPROCAL", m["y"]) if m.same_float_dtype() and m.value("one") == 1 else None


SPELLING_RULES: list[Rule] = [
    (Pat(frozenset(REGISTRY), name="z"), _twin),  # op(a, c2) after op(a, c1), c1 == c2 -> the first one's result
    (Pat(frozenset({"MAXIMUM", "MINIMUM"}), Pat(name="y"), Pat(name="c")),
     _no_bound),  # max(y, -inf), min(y, inf) -> y
    (Pat("DIV", Pat(name="one"), Pat(name="y")), _reciprocal),  # 1 / y -> RECIPROCAL(y)
]


# ---- SOFTMAX ---------------------------------------------------------------------------------


def _softmax(m: Match) -> Op | None:
    axes = _axes(m, "sum")
    if len(axes) != 1 or not m.same_float_dtype() or not _rows_kept(m, axes):
        return None
    return m.replace("SOFTMAX", m["x"], axis=axes[0])


def _unshifted_softmax(m: Match) -> Op | None:
    # SOFTMAX subtracts the row's max itself: of x - max(x) that max is 0, so the same numbers
    axis = normalize_axis(m.attrs("softmax")["axis"], len(m.shape("x")))
    if _axes(m, "max") != (axis,) or not m.same_float_dtype() or not _rows_kept(m, (axis,)):
        return None
    return m.replace("SOFTMAX", m["x"], axis=axis)


_exp = Pat("EXP", _x, name="e")
_sum_exp = _view(Pat("REDUCE_SUM", _exp, name="sum"))

SOFTMAX_RULES: list[Rule] = [
    (Pat("MUL", _exp, _view(Pat("RECIPROCAL", _sum_exp))),
     _softmax),  # exp(x) * 1/sum(exp(x)) -> SOFTMAX (TOSA; XLA's after optimization)
    (Pat("DIV", _exp, _sum_exp), _softmax),  # exp(x) / sum(exp(x)) -> SOFTMAX
    (Pat("SOFTMAX", Pat("SUB", _x, _view(Pat("REDUCE_MAX", _x, name="max"))), name="softmax"),
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


def _normalised(m: Match, moment: str = "var") -> tuple[int, float] | None:
    """(first axis, epsilon) of a layer norm (or RMS norm) chain that normalises trailing axes of
    `x` with a known epsilon (and clamps its variance at exactly 0, if at all), or None (warned
    about where only the epsilon's value is missing). `moment` names the reduction giving the
    variance (the mean square); a layer norm's mean reduces over the same axes."""
    axes, rank = _axes(m, moment), len(m.shape("x"))
    if not axes or axes != tuple(range(axes[0], rank)) or ("mean" in m and axes != _axes(m, "mean")) \
            or not m.same_float_dtype() or not _rows_kept(m, axes) or ("zero" in m and m.value("zero") != 0):
        return None
    epsilon = m.value("eps") if "eps" in m else 0.0
    if epsilon is None:
        centred = (m.computing(m["x"]) or m.root).op_type == "SUB"  # a layer norm's chain, said once
        kind = "a layer norm" if moment == "var" or centred else "an RMS norm"
        m.warn(f"{kind} chain is left as ops: its epsilon '{m['eps']}' is not a constant of known value")
        return None
    return axes[0], epsilon


def _affine(m: Match, axis: int, *names: str) -> list[str]:
    """The scale and bias the names bound (those bound), without the leading dims of 1 they may
    have beyond the normalized ones (an HLO broadcast's view, [1, C] of a [C]): the row op takes
    them shaped over the normalized dims alone."""
    rank = len(m.shape("x"))
    normalized = rank - normalize_axis(axis, rank)
    tensors = []
    for name in (n for n in names if n in m):
        tensor = m[name]
        shape = m.graph.tensors[tensor].shape
        extra, view = len(shape) - normalized, m.computing(tensor)
        if extra > 0 and set(shape[:extra]) == {1}:
            viewed = view.inputs[0] if view is not None and view.op_type == "RESHAPE" else None
            if viewed is not None and m.graph.tensors[viewed].shape == shape[extra:]:
                tensor = viewed  # the view's own operand
            else:
                tensor = m.op(name, "RESHAPE", tensor, new_shape=list(shape[extra:]))
        tensors.append(tensor)
    return tensors


def _norm(op_type: str, moment: str):
    """The rule making `op_type` of a chain whose variance (mean square) `moment` names, its scale
    the bound one if the chain multiplies by one inside the normaliser."""
    def rule(m: Match) -> Op | None:
        found = _normalised(m, moment)
        if found is None:
            return None
        return m.replace(op_type, m["x"], *_affine(m, found[0], "scale"), axis=found[0], epsilon=found[1])
    return rule


def _folded_layernorm(m: Match) -> Op | None:
    # x * s + (bias - s * mean), s = rsqrt(var + eps) (* scale): (x - mean) * s + bias rearranged
    found = _normalised(m)
    if found is None:
        return None
    scale = _affine(m, found[0], "scale") or [m.constant("scale", np.ones(()), m.dtype("x"))]
    return m.replace("LAYERNORM", m["x"], *scale, *_affine(m, found[0], "bias"), axis=found[0], epsilon=found[1])


def _with_scale(m: Match) -> Op | None:
    attrs = m.attrs("ln")
    if not m.same_float_dtype():
        return None
    return m.replace(m.producer("ln").op_type, m["x"], *_affine(m, attrs["axis"], "scale"), **attrs)


def _with_bias(m: Match) -> Op | None:
    attrs = m.attrs("ln")
    if not m.same_float_dtype():
        return None
    return m.replace("LAYERNORM", m["x"], *_affine(m, attrs["axis"], "scale", "bias"), **attrs)


def _centred_rms(m: Match) -> Op | None:
    # LAYERNORM(x) is RMSNORM(x - mean(x)) over the same axes, epsilon and scale alike
    attrs = m.attrs("rms")
    rank = len(m.shape("x"))
    axes = tuple(range(normalize_axis(attrs["axis"], rank), rank))
    if _axes(m, "mean") != axes or not m.same_float_dtype() or not _rows_kept(m, axes):
        return None
    return m.replace("LAYERNORM", m["x"], *_affine(m, attrs["axis"], "scale"), **attrs)


def _rsqrt(m: Match) -> Op | None:
    return m.replace("RSQRT", m["v"]) if m.same_float_dtype() else None


_reduce_sum = Pat("REDUCE_SUM", _x, name="sum")
_mean_rows = Pat("REDUCE_MEAN", _x, name="mean")
_centred = Pat("SUB", _x, _view(_mean_rows), name="c")
_variance = Pat.any(Pat("REDUCE_MEAN", Pat("MUL", _centred, _centred), name="var"),  # mean((x - mean)^2)
                    Pat("SUB", Pat("REDUCE_MEAN", Pat("MUL", _x, _x), name="var"),
                        Pat("MUL", _mean_rows, _mean_rows)))  # mean(x^2) - mean^2 (Flax's fast variance)
_clamped = _view(Pat.any(Pat("MAXIMUM", _view(_variance), Pat(name="zero")), _variance))  # max(var, 0) or var


def _inverse_root(moment: Pat) -> tuple[Pat, Pat]:
    """rsqrt(moment + eps) (* scale), and sqrt(moment + eps), each maybe viewed, eps maybe left out.
    The first is named "s": XLA's layer norm reads it twice, which must be one value."""
    plus_eps = _view(Pat.any(Pat("ADD", moment, Pat(name="eps")), moment))
    rsqrt = Pat("RSQRT", plus_eps)
    inv = Pat.any(Pat("MUL", _view(rsqrt), Pat(name="scale"), name="s"), Pat("RSQRT", plus_eps, name="s"),
                  Pat("RESHAPE", rsqrt, name="s"))
    return inv, _view(Pat("SQRT", plus_eps))


_inv_std, _std = _inverse_root(_clamped)
_inv_rms, _rms = _inverse_root(_view(Pat("REDUCE_MEAN", Pat("MUL", _x, _x), name="ms")))

LAYERNORM_RULES: list[Rule] = [
    (Pat("MUL", _reduce_sum, Pat(name="k")), _mean_times),  # sum(x) * 1/n -> REDUCE_MEAN
    (Pat("DIV", _reduce_sum, Pat(name="k")), _mean_over),  # sum(x) / n -> REDUCE_MEAN
    (Pat("POW", _x, Pat(name="k")), _square),  # x ** 2 -> x * x
    (Pat("RECIPROCAL", Pat("SQRT", Pat(name="v"))), _rsqrt),  # 1 / sqrt(v) -> RSQRT(v) (torch's rsqrt)
    (Pat("MUL", _centred, _inv_std),
     _norm("LAYERNORM", "var")),  # (x-mean) * rsqrt(var+eps) (* scale) -> LAYERNORM (Flax's in both variances)
    (Pat("DIV", _centred, _std), _norm("LAYERNORM", "var")),  # (x-mean) / sqrt(var+eps) -> LAYERNORM
    (Pat("ADD", Pat("MUL", _x, _inv_std), Pat("SUB", Pat(name="bias"), Pat("MUL", _inv_std, _view(_mean_rows)))),
     _folded_layernorm),  # x * s + (bias - s * mean), s = rsqrt(var+eps) * scale -> LAYERNORM (XLA)
    (Pat.any(Pat("RMSNORM", _centred, name="rms"), Pat("RMSNORM", _centred, Pat(name="scale"), name="rms")),
     _centred_rms),  # rmsnorm(x - mean(x)) (* s) -> LAYERNORM(x) (* s): a chain that met RMSNORM's rule first
    (Pat("MUL", Pat(frozenset({"LAYERNORM", "RMSNORM"}), _x, name="ln"), Pat(name="scale")),
     _with_scale),  # ln(x) * s -> LAYERNORM(x, s), and RMSNORM's
    (Pat("ADD", Pat("LAYERNORM", _x, Pat(name="scale"), name="ln"), Pat(name="bias")),
     _with_bias),  # ln(x, s) + b -> LAYERNORM(x, s, b)
]

# ---- RMSNORM ---------------------------------------------------------------------------------

RMSNORM_RULES: list[Rule] = [
    (Pat("MUL", _x, _inv_rms),
     _norm("RMSNORM", "ms")),  # x * rsqrt(mean(x^2)+eps) (* scale) -> RMSNORM (LLaMA's, Flax's)
    (Pat("DIV", _x, _rms), _norm("RMSNORM", "ms")),  # x / sqrt(mean(x^2)+eps) -> RMSNORM
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
# out (the REDUCTION_RULES and SPELLING_RULES only respell one op as another, or drop one)
FUSING_RULES: list[Rule] = SOFTMAX_RULES + LAYERNORM_RULES + RMSNORM_RULES + GELU_RULES + SILU_RULES
RECOGNISE: list[Rule] = REDUCTION_RULES + SPELLING_RULES + FUSING_RULES


# ---- global pools (`compile.graph_passes`: they need the target) -----------------------------

POOLS = {"REDUCE_SUM": "SUMPOOL2D", "REDUCE_MEAN": "AVGPOOL2D"}


def _global_pool(fits: Callable[[Graph, Op], bool], m: Match) -> Op | None:
    x = m.shape("x")
    if len(x) != 4 or _axes(m, "r") != (1, 2) or not m.attrs("r")["keepdims"]:
        return None
    pool = m.replace(POOLS[m.root.op_type], m["x"], kernel=[x[1], x[2]])
    return pool if fits(m.graph, pool) else None


def global_pools(graph: Graph, fits: Callable[[Graph, Op], bool], warnings: list[str]) -> Graph:
    """Each REDUCE_SUM or REDUCE_MEAN over axes 1 and 2 of a rank-4 tensor, keeping them, as the
    SUMPOOL2D or AVGPOOL2D over the whole image, a window op, which chains after the convolution
    before it by channels; where `fits(graph, the pool)` (a window op's band holds its image whole:
    EfficientNet-B0's first squeeze-and-excitation pool, 112 x 112 x 32, fits no tiling on
    standard and stays a reduction, taken apart by rows as long rows are). Then EPILOGUE_VIEWS
    again: the views its result meets sink below the map ops after it, as a window op's do."""
    pools = rewrite(graph, [(Pat(frozenset(POOLS), _x, name="r"), functools.partial(_global_pool, fits))], warnings)
    return graph if pools.ops == graph.ops else rewrite(pools, EPILOGUE_VIEWS, warnings)
