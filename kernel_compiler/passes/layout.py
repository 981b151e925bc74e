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

and EPILOGUE_VIEWS, a stage after RECOGNISE (which sees the chains it spells as they were):

    map(.., RESHAPE(a), .., c)         RESHAPE(map(.., a, .., c')) where a is a contraction's
                                       or a window op's result (or a map op's of one) and map ops
                                       alone read the RESHAPE; c' is c as it broadcasts against a,
                                       where c runs wholly or not at all along each run of dims
                                       the RESHAPE merges or splits (a bias [N] stays itself where
                                       N stays the last dim; a residual is RESHAPEd), else the
                                       rule declines
    MATMUL{transpose_b}(RESHAPE(x), w, b)
                                       RESHAPE(CONV2D(x, w' [N, 1, 1, K], b)) where x is an image
                                       of one position, [1, 1, 1, K] (a classifier after a global
                                       pool and a flatten): the 1x1 convolution it is, which
                                       chains after the pool by channels; w' is RESHAPE(w), or
                                       constant weights read there alone as their bytes lie

A rule looks at its operands through `Match.computing`: a TRANSPOSE read by several ops sinks
below each in turn and goes when the last stops reading it (the readers of one tensor tend to
meet again: a residual, x * sigmoid(x), a dense block's CONCATs). Not below several SLICEs or
PADs of it: those boxes go their ways (a Split, a grouped convolution's inputs), and a TRANSPOSE
below each would be one per box. Nothing hoists a TRANSPOSE, so the rules end. A RESHAPE sinks
below a map op only where a is computed after the op's other operands of its whole shape (the
operand an epilogue follows), so the views it makes of those never sink back. Fusion then sees a
contraction followed by its bias, activation and residual, the RESHAPE after them a view. The
numbers are the same: layout ops move values exactly, a map op computes each element from the
same operand elements, and a reduction combines the same elements (in another order, as any
other tiling of it may).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from dfx import REGISTRY, Op, is_integer, lookup
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


# ---- reading through a view ------------------------------------------------------------------


def _prefix_products(shape: tuple[int, ...]) -> list[int]:
    out = [1]
    for d in shape:
        out.append(out[-1] * d)
    return out


def _regrouped(shape_in: tuple[int, ...], shape_out: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Per dim of each of two shapes of the same elements, the group it falls in: the finest cut
    of both into runs of dims of equal products, the runs a RESHAPE merges or splits (group 0:
    leading dims of 1)."""
    bounds = sorted(set(_prefix_products(shape_in)) & set(_prefix_products(shape_out)))
    return ([bisect.bisect_left(bounds, p) for p in _prefix_products(shape_in)[1:]],
            [bisect.bisect_left(bounds, p) for p in _prefix_products(shape_out)[1:]])


def _stripped(shape) -> tuple[int, ...]:
    """`shape` without its leading dims of 1: it broadcasts the same."""
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _regrouped_operand(m: Match, tensor: str, shape_in: tuple[int, ...], shape_out: tuple[int, ...]) -> str | None:
    """`tensor`, an operand that broadcasts against RESHAPE(a, shape_out), laid out to broadcast
    against a of `shape_in` alike: along each group of dims (`_regrouped`) it runs along all of
    them or along none (a bias [N] along the last dim, kept); None where it runs along part of one."""
    shape = m.graph.tensors[tensor].shape
    if len(shape) > len(shape_out):
        return None
    aligned = (1,) * (len(shape_out) - len(shape)) + shape
    groups_in, groups_out = _regrouped(shape_in, shape_out)
    along: dict[int, bool] = {}  # group -> the operand runs along its dims (else it broadcasts over them)
    for group, dim, extent in zip(groups_out, aligned, shape_out):
        if extent != 1 and along.setdefault(group, dim == extent) != (dim == extent):
            return None
    relaid = _stripped(d if along.get(group, False) else 1 for group, d in zip(groups_in, shape_in))
    if relaid == _stripped(shape) and len(shape) <= len(shape_in):
        return tensor
    relaid = relaid or (1,)
    values = m.graph.constant_values(tensor) if m.graph.tensors[tensor].role == "constant" else None
    if values is not None and len(m.readers(tensor)) == 1:  # read here alone: no copy of it stays
        return m.constant("regrouped", values.reshape(relaid), m.graph.tensors[tensor].dtype)
    for op in m.readers(tensor):  # the same view made already (a residual's, the matmul's A)
        if op.op_type == "RESHAPE" and m.graph.tensors[op.outputs[0]].shape == relaid and m.before(op):
            return op.outputs[0]
    return m.op("regrouped", "RESHAPE", tensor, new_shape=list(relaid))


def _viewed(m: Match, tensor: str) -> str | None:
    """a where `tensor` is RESHAPE(a) of the same dtype, else None."""
    op = m.computing(tensor)
    if op is None or op.op_type != "RESHAPE" or m.graph.tensors[op.inputs[0]].dtype != m.graph.tensors[tensor].dtype:
        return None
    return op.inputs[0]


def _contracted(m: Match, tensor: str) -> bool:
    """Whether `tensor` is a contraction's or a window op's result, or a map op's of one through
    map ops alone (its epilogue as far as fusion may take it)."""
    seen, todo = set(), [tensor]
    while todo:
        op = m.computing(todo.pop())
        if op is None or op.name in seen:
            continue
        seen.add(op.name)
        family = lookup(op.op_type).family
        if family in ("contraction", "window"):
            return True
        if family == "map":  # through its operands of its result's shape: those a tile of it holds whole
            todo += [t for t in op.inputs if m.graph.tensors[t].shape == m.graph.tensors[op.outputs[0]].shape]
    return False


def _ancestor(m: Match, tensor: str, of: str) -> bool:
    """Whether `of` is computed from `tensor`."""
    seen, todo = set(), [of]
    while todo:
        t = todo.pop()
        if t == tensor:
            return True
        op = m.computing(t)
        if op is not None and op.name not in seen:
            seen.add(op.name)
            todo += op.inputs
    return False


def _sink_view(m: Match) -> Op | None:
    if 0 in m.shape("y"):
        return None
    # the operands of the result's whole shape, each with what it views (None: no RESHAPE)
    viewed = {t: _viewed(m, t) for t in m.root.inputs if m.graph.tensors[t].shape == m.shape("y")}
    for a in dict.fromkeys(v for v in viewed.values() if v is not None):
        operands = _read_through(m, a, viewed)
        if operands is not None:
            inner = m.op("unreshaped", m.root.op_type, *operands, result_dtype=m.dtype("y"), **m.root.attrs)
            return m.replace("RESHAPE", inner, new_shape=list(m.shape("y")))
        m.discard()  # the views of operands made for this a
    return None


def _read_through(m: Match, a: str, viewed: dict[str, str | None]) -> list[str] | None:
    """The root's operands laid out to broadcast against `a`, which one of them views (RESHAPE(a)),
    where the root may read through that view; None where it may not."""
    shape_in, shape_out = m.graph.tensors[a].shape, m.shape("y")
    if not _contracted(m, a):
        return None  # an epilogue is what a view splits: a contraction's or a window op's (others' are left as they were)
    view = next(t for t, v in viewed.items() if v == a)
    # map ops alone read through it: a reduction reading it too keeps it (the chains RECOGNISE
    # spells read one tensor)
    if m.graph.tensors[view].role == "output" or any(op.op_type not in MAPS for op in m.readers(view)):
        return None
    same = {t for t, v in viewed.items() if v is not None and m.graph.tensors[v].shape == shape_in}
    # any other full operand computed before a, which is the operand a kernel's epilogue could
    # follow (and the rule never sinks a view back through the one it made of that operand)
    if not all(_ancestor(m, viewed[t] or t, a) for t in viewed if t not in same):
        return None
    operands = [viewed[t] if t in same else _regrouped_operand(m, t, shape_in, shape_out) for t in m.root.inputs]
    return None if None in operands else operands


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

def _one_position_conv(m: Match) -> Op | None:
    x, w, bias = m["x"], m["w"], m.root.inputs[2:]
    if len(m.shape("w")) != 2 or not m.attrs("y")["transpose_b"]:
        return None
    n, k = m.shape("w")
    if m.shape("x") != (1, 1, 1, k) or any(m.graph.tensors[b].shape != (n,) for b in bias):
        return None
    if is_integer(m.dtype("y")) and not (is_integer(m.dtype("x")) and is_integer(m.dtype("w"))):
        return None  # a float product converted to integers: MATMUL wraps it, CONV2D saturates
    # constant weights read here alone are the same bytes in the new shape: no RESHAPE kernel
    # between the pool and its classifier, which could then not chain
    if m.graph.tensors[w].role == "constant" and len(m.readers(w)) == 1:
        w_ohwi = m.reshaped_constant("w_ohwi", w, [n, 1, 1, k])
    else:
        w_ohwi = m.op("w_ohwi", "RESHAPE", w, new_shape=[n, 1, 1, k])
    y = m.op("conv", "CONV2D", x, w_ohwi, *bias, result_dtype=m.dtype("y"))
    return m.replace("RESHAPE", y, new_shape=list(m.shape("y")))


# after RECOGNISE, which sees the chains it spells reading one tensor: a contraction's or a window
# op's epilogue read through the view between them
EPILOGUE_VIEWS: list[Rule] = [
    (Pat(MAPS, name="y"), _sink_view),  # map(RESHAPE(a), c) -> RESHAPE(map(a, c regrouped))
    # MATMUL{transpose_b}(RESHAPE(x: [1, 1, 1, K]), w [N, K], b) -> RESHAPE(CONV2D(x, w as [N, 1, 1, K], b))
    (Pat("MATMUL", Pat("RESHAPE", Pat(name="x")), Pat(name="w"), name="y"), _one_position_conv),
    (Pat("MATMUL", Pat("RESHAPE", Pat(name="x")), Pat(name="w"), Pat(name="b"), name="y"), _one_position_conv),
    *RESHAPES,
]
