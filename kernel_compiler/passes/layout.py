"""LAYOUT: the graph run in the layout its window ops take (NHWC), with no TRANSPOSE between them.

CONVOLUTION writes each NCHW convolution as TRANSPOSE(CONV2D{NHWC}(TRANSPOSE(x), TRANSPOSE(w)))
and the ONNX frontend puts each pool between TRANSPOSEs. Each would be a kernel of moves, and one
between a convolution and its activation keeps fusion from joining them. These rules sink every
TRANSPOSE below the ops that do not care about layout until it meets the one that undoes it (the
next window op's) and both vanish, and fold those of constants at compile time (weights arrive
OHWI and HWCM). What stays is a TRANSPOSE after each NCHW graph input and before each NCHW graph
output that needs one (a graph output keeps its name and layout).

    TRANSPOSE(TRANSPOSE(x, p), q)      RESHAPE(x) where p[q] moves dims of 1 only (the identity)
    RESHAPE(RESHAPE(x))                RESHAPE(x)
    RESHAPE(x) to x's own shape        x; a graph output: the op computing x writes it
    TRANSPOSE(x, p) after an identical one     that one's result
    a layout op of constants           a constant, computed here by the registry's reference (of
                                       constants it alone reads: none is held twice)
    map(.., TRANSPOSE(a, p), .., c)    TRANSPOSE(map(.., a, .., c'), p): every other operand through
                                       the same p, or c' is c as it broadcasts in a's layout (a
                                       constant permuted here, a tensor RESHAPEd where only its
                                       dims of 1 move: a per-channel [C, 1, 1] becomes [1, 1, 1, C])
    CONCAT(TRANSPOSE(a_i, p)){axis}    TRANSPOSE(CONCAT(a_i){p[axis]}, p)
    SLICE, PAD(TRANSPOSE(a, p))        TRANSPOSE(SLICE, PAD(a), p), per-dim attributes permuted
    reduction(TRANSPOSE(a, p))         TRANSPOSE(reduction(a), q): its axes mapped by p, q the
                                       order of the dims it keeps (p without keepdims' dropped dims)

and then VIEWS, once nothing more sinks:

    TRANSPOSE(x) moving dims of 1 only RESHAPE(x)  (the same bytes: no data moves), merged as above

A rule looks at its operands through `Match.computing`: a TRANSPOSE read by several ops sinks
below each in turn and goes when the last stops reading it (the readers of one tensor tend to
meet again: a residual, x * sigmoid(x), a dense block's CONCATs). Not below several SLICEs or
PADs of it: those boxes go their ways (a Split, a grouped convolution's inputs), and a TRANSPOSE
below each would be one per box. Nothing hoists a TRANSPOSE, so the rules end. The numbers are
the same: layout ops move values exactly, a map op computes each element from the same operand
elements, and a reduction combines the same elements (in another order, as any other tiling of
it may).
"""

from __future__ import annotations

import math

import numpy as np

from dfx import REGISTRY, Op, lookup
from dfx.ops.base import normalize_axis
from dfx.ops.layout import keeps_order, transpose_perms

from .rewrite import Match, Pat, Rule

MAPS = frozenset(name for name, op in REGISTRY.items() if op.family == "map")
REDUCTIONS = frozenset(name for name, op in REGISTRY.items() if op.family == "reduction")
LAYOUT_OPS = frozenset(name for name, op in REGISTRY.items() if op.family == "layout")


def _perms(m: Match, op: Op) -> list[int]:
    """A TRANSPOSE's perms, the default filled."""
    rank = len(m.graph.tensors[op.inputs[0]].shape)
    return transpose_perms(rank, lookup("TRANSPOSE").normalize_attrs(op.attrs)["perms"])


def _through(m: Match, tensor: str) -> tuple[str, list[int]] | None:
    """(a, p) where `tensor` is TRANSPOSE(a, p) moving a's bytes unconverted, else None."""
    op = m.computing(tensor)
    if op is None or op.op_type != "TRANSPOSE" or m.graph.tensors[op.inputs[0]].dtype != m.graph.tensors[tensor].dtype:
        return None
    return op.inputs[0], _perms(m, op)


def _inverse(perms: list[int]) -> list[int]:
    return np.argsort(perms).tolist()


def _unpermuted(values: list, perms: list[int]) -> list:
    """Per-dim values of TRANSPOSE(a, perms) as a's dims: entry perms[i] is entry i."""
    out = list(values)
    for i, p in enumerate(perms):
        out[p] = values[i]
    return out


def _then(m: Match, op_type: str, operands: list[str], attrs: dict, perms: list[int]) -> Op:
    """The root's result as TRANSPOSE(op_type(operands), perms), or the op alone where perms
    leave every dim in place."""
    if perms == sorted(perms):
        return m.replace(op_type, *operands, **attrs)
    inner = m.op("unpermuted", op_type, *operands, result_dtype=m.dtype("y"), **attrs)
    return m.replace("TRANSPOSE", inner, perms=perms)


def _relaid(m: Match, tensor: str, perms: list[int]) -> str | None:
    """`tensor`, an operand that broadcasts against TRANSPOSE(a, perms), laid out as a is: itself
    where its dims longer than 1 stay in place, a constant permuted here, a RESHAPE where only its
    dims of 1 move; None where it is none of these."""
    shape = m.graph.tensors[tensor].shape
    rank = len(perms)
    if len(shape) > rank:
        return None
    aligned = (1,) * (rank - len(shape)) + shape  # as it broadcasts
    inverse = _inverse(perms)
    moved = tuple(aligned[i] for i in inverse)
    a_view = keeps_order(aligned, inverse)
    if a_view and moved == aligned:
        return tensor
    values = m.graph.constant_values(tensor) if m.graph.tensors[tensor].role == "constant" else None
    if values is not None:
        return m.constant("relaid", values.reshape(aligned).transpose(inverse), m.graph.tensors[tensor].dtype)
    return m.op("relaid", "RESHAPE", tensor, new_shape=list(moved)) if a_view else None


# ---- TRANSPOSE and RESHAPE ---------------------------------------------------------------------


def _fold(m: Match) -> str | None:
    # each constant read by this op alone: its folded form replaces it, never doubles the weights
    # the object file carries (a tied embedding's TRANSPOSE stays, for CONTRACTION to load); nor
    # does a result larger than its operands (a GATHER or PAD that grows them) replace them
    if not all(t in m.graph.constants and m.graph.tensors[t].role == "constant" and len(m.readers(t)) == 1
               for t in m.root.inputs):
        return None
    if math.prod(m.shape("y")) > sum(math.prod(m.graph.tensors[t].shape) for t in m.root.inputs):
        return None
    values = [m.graph.constant_values(t) for t in m.root.inputs]
    opdef = lookup(m.root.op_type)
    (result,) = opdef.reference(values, opdef.normalize_attrs(m.root.attrs), [m.dtype("y")])
    return m.constant("folded", result, m.dtype("y"))


def _cancel(m: Match) -> Op | None:
    found = _through(m, m.root.inputs[0])
    if found is None:
        return None
    x, inner = found
    if not keeps_order(m.graph.tensors[x].shape, [inner[q] for q in _perms(m, m.root)]):
        return None  # two that do not cancel stay two: CONTRACTION may take the second into a MATMUL's load
    return m.replace("RESHAPE", x, new_shape=list(m.shape("y")))


def _as_reshape(m: Match) -> Op | None:
    x = m.root.inputs[0]
    if not keeps_order(m.graph.tensors[x].shape, _perms(m, m.root)):
        return None
    return m.replace("RESHAPE", x, new_shape=list(m.shape("y")))


def _twin(m: Match) -> str | None:
    x, perms = m.root.inputs[0], _perms(m, m.root)
    for op in m.readers(x):
        if (op is not m.root and op.op_type == "TRANSPOSE" and _perms(m, op) == perms and m.before(op)
                and m.graph.tensors[op.outputs[0]].dtype == m.dtype("y")):
            return op.outputs[0]
    return None


def _merge_reshapes(m: Match) -> Op | None:
    inner = m.computing(m.root.inputs[0])
    if inner is None or inner.op_type != "RESHAPE" or m.graph.tensors[inner.inputs[0]].dtype != m.dtype("y"):
        return None
    return m.replace("RESHAPE", inner.inputs[0], new_shape=list(m.shape("y")))


def _same_shape(m: Match) -> str | None:
    x = m.root.inputs[0]
    return x if m.graph.tensors[x].shape == m.shape("y") else None


def _writes_output(m: Match) -> Op | None:
    # a graph output keeps its name: the op computing x writes it, under the RESHAPE's name
    op = m.producer("x")
    if (m.shape("x"), m.dtype("x")) != (m.shape("y"), m.dtype("y")):
        return None
    return Op(m.root.name, op.op_type, list(op.inputs), list(m.root.outputs), dict(op.attrs), op.source)


# ---- sinking a TRANSPOSE ----------------------------------------------------------------------


def _sink_map(m: Match) -> Op | None:
    through = [_through(m, t) for t in m.root.inputs]
    # the first TRANSPOSE's p; an operand through another is relaid (one moving dims of 1 alone)
    p = next((found[1] for found in through if found is not None), None)
    if p is None or len(p) != len(m.shape("y")):
        return None  # that operand is broadcast up to a higher rank: p does not say how the result moves
    operands = []
    for t, found in zip(m.root.inputs, through):
        operand = found[0] if found is not None and found[1] == p else _relaid(m, t, p)
        if operand is None:
            return None
        operands.append(operand)
    return _then(m, m.root.op_type, operands, m.root.attrs, p)


def _sink_concat(m: Match) -> Op | None:
    through = [_through(m, t) for t in m.root.inputs]
    if through[0] is None:
        return None
    p = through[0][1]
    operands = [found[0] if found is not None and found[1] == p else _relaid(m, t, p)
                for t, found in zip(m.root.inputs, through)]
    if None in operands:
        return None
    axis = normalize_axis(lookup("CONCAT").normalize_attrs(m.root.attrs)["axis"], len(p))
    return _then(m, "CONCAT", operands, {"axis": p[axis]}, p)


# the per-dim attributes of layout ops that move a box of their operand
PER_DIM = {"SLICE": ("start", "size"), "PAD": ("padding",)}


def _sink_per_dim(m: Match) -> Op | None:
    found = _through(m, m.root.inputs[0])
    if found is None or len(m.readers(m.root.inputs[0])) > 1:
        return None  # several boxes of one tensor (a Split's) go their ways: below each, a TRANSPOSE per box
    a, p = found
    attrs = lookup(m.root.op_type).normalize_attrs(m.root.attrs)
    moved = {name: _unpermuted(attrs[name], p) for name in PER_DIM[m.root.op_type]}
    return _then(m, m.root.op_type, [a], {**m.root.attrs, **moved}, p)


def _reduced_attrs(attrs: dict, p: list[int]) -> dict | None:
    """A reduction's axis attributes over TRANSPOSE(a, p), as a's dims; None for one without them."""
    rank = len(p)
    if "axes" in attrs:
        return {"axes": None if attrs["axes"] is None else [p[normalize_axis(a, rank)] for a in attrs["axes"]]}
    if "axis" in attrs:
        return {"axis": p[normalize_axis(attrs["axis"], rank)]}
    return None


def _sink_reduction(m: Match) -> Op | None:
    found = _through(m, m.root.inputs[0])
    if found is None:
        return None
    a, p = found
    opdef = lookup(m.root.op_type)
    attrs = opdef.normalize_attrs(m.root.attrs)
    moved = _reduced_attrs(attrs, p)
    if moved is None:
        return None
    new_attrs = {**attrs, **moved}
    shape, a_shape = m.graph.tensors[m.root.inputs[0]].shape, m.graph.tensors[a].shape
    whole = opdef.whole_axes(shape, attrs)
    if sorted(p[i] for i in whole) != sorted(opdef.whole_axes(a_shape, new_attrs)):
        return None  # an axis..last of a LAYERNORM that p does not keep at the end
    if len(m.root.inputs) > 1 and any(p[i] != i for i in whole):
        return None  # a scale or bias lies along the reduced dims in their order
    kept, kept_in_a = opdef.result_dims(shape, attrs), opdef.result_dims(a_shape, new_attrs)
    # with its reduced dims kept the result moves as the operand did; else as the dims left of it
    q = p if len(kept) == len(p) else [kept_in_a.index(p[d]) for d in kept]
    return _then(m, m.root.op_type, [a, *m.root.inputs[1:]], {**m.root.attrs, **moved}, q)


# every rule matches its root alone (but one), bound as "y", and looks at the root's operands itself
RESHAPES: list[Rule] = [
    (Pat("RESHAPE", name="y"), _merge_reshapes),  # RESHAPE(RESHAPE(x)) -> RESHAPE(x)
    (Pat("RESHAPE", name="y"), _same_shape),  # RESHAPE(x) to x's shape -> x
    # a graph output RESHAPE(op(..)) to op's own shape -> op(..) writing it
    (Pat("RESHAPE", Pat(frozenset(REGISTRY), name="x"), name="y"), _writes_output),
]

LAYOUT: list[Rule] = [
    (Pat(LAYOUT_OPS, name="y"), _fold),  # a layout op of constants -> the constant it makes
    (Pat("TRANSPOSE", name="y"), _cancel),  # TRANSPOSE(TRANSPOSE(x, p), q), p[q] the identity -> RESHAPE(x)
    (Pat("TRANSPOSE", name="y"), _twin),  # TRANSPOSE(x, p) after the same TRANSPOSE(x, p) -> its result
    *RESHAPES,
    (Pat(MAPS, name="y"), _sink_map),  # map(TRANSPOSE(a, p), c) -> TRANSPOSE(map(a, c relaid), p)
    (Pat("CONCAT", name="y"), _sink_concat),  # CONCAT(TRANSPOSE(a_i, p)) -> TRANSPOSE(CONCAT(a_i), p)
    (Pat(frozenset(PER_DIM), name="y"), _sink_per_dim),  # SLICE/PAD(TRANSPOSE(a, p)) -> TRANSPOSE(SLICE/PAD(a), p)
    (Pat(REDUCTIONS, name="y"), _sink_reduction),  # reduction(TRANSPOSE(a, p)) -> TRANSPOSE(reduction(a), q)
]

# after LAYOUT: a TRANSPOSE that stayed (before a graph output or a contraction) and moves dims of
# 1 alone is a view. Not sooner: as a TRANSPOSE it still sinks and cancels (a 1 x 1 image's)
VIEWS: list[Rule] = [
    (Pat("TRANSPOSE", name="y"), _as_reshape),  # TRANSPOSE moving dims of 1 alone -> RESHAPE
    *RESHAPES,
]
