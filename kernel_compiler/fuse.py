"""Fusion: group each op with the chain of map ops that follows it, so a bias, an activation or a
residual add is applied to the result tile on chip instead of a DRAM round trip per op.

A group is an anchor (a contraction, a window op, a map op, or a row op whose result has its
operand's shape: SOFTMAX, LOG_SOFTMAX, LAYERNORM) and an epilogue: the map ops right after it in graph order,
each reading the group's running result. An op joins the epilogue when that result is read by it
alone and is no graph output (so nothing else ever needs it in memory), and when its result has
the running result's shape (an epilogue never grows the tile). Its other operands (a bias, a
residual) are graph inputs or earlier kernels' results, loaded as more streams of the kernel,
but never one a contraction anchor sums over (its input or its weights): it holds those by
chunks of the dim it sums, its epilogue by result tiles, two tiles of one tensor at a level
where a kernel has one (EfficientNetV2's `y + SiLU(conv(y))` runs its add as a kernel of its own).
A view of such an operand (a RESHAPE, which moves nothing) between the group and the op that
joins it runs ahead of the group instead.

Fused, the running result stays on chip as its compute left it and is never rounded to its
dtype, where `--check`'s reference (and an unfused kernel's store) rounds it. So an op joins only
where that cannot change its result by more than a rounding:

- an integer result must be held exactly: a predicate's 0 or 1 (any dtype), or an i32 made by
  integer arithmetic in the i32 accumulators (an exact map or window op or a contraction, every
  operand and the result an integer, so i32 modulo 2^32 is the reference's int64 wrapped): an
  integer depthwise convolution's sums take their REQUANTIZE on chip. A narrower
  integer is not wrapped to its dtype on chip, a float-computed one not truncated: no fusion.
- a float held in its own dtype (f32 made in f32, f64 in f64) is the reference's, up to the
  order of a sum: anything may follow.
- a float the reference rounds and the tile does not (f16, bf16, f8; f32 made in f64), or one
  computed from such, is off by roundings the check's float tolerance allows: it is taken only
  by an op whose result is a float and moves with it by as little; not by a predicate or an op
  with an integer result, which a rounding can flip by a whole step.
"""

from __future__ import annotations

from collections import Counter

from dfx import Graph, Op, accumulation_dtype, is_integer, lookup

MAX_EPILOGUE = 8  # ops per epilogue: each adds a buffer at every level, the tile shrinks with them


def _anchors(op: Op, graph: Graph) -> bool:
    opdef = lookup(op.op_type)
    if opdef is None or opdef.tile is None or len(op.outputs) != 1:
        return False
    if opdef.family in ("contraction", "map", "window"):
        return True
    return opdef.family == "reduction" and graph.tensors[op.inputs[0]].shape == graph.tensors[op.outputs[0]].shape


def _held(op: Op, graph: Graph) -> bool:
    """Whether the tile of `op`'s COMPUTE, given its operands as the reference has them, holds its
    result as the reference stores it: in the result's own dtype, nothing left for a store to round."""
    opdef = lookup(op.op_type)
    dtypes = [graph.tensors[n].dtype for n in op.inputs + op.outputs]
    result = dtypes[-1]
    if opdef.predicate:
        return True  # 0 or 1, whatever the dtype
    if is_integer(result):
        return ((opdef.exact or opdef.family == "contraction") and all(is_integer(d) for d in dtypes)
                and result == accumulation_dtype(dtypes))
    return result == accumulation_dtype(dtypes)  # a float is computed in f32, or f64 beside an f64


def _joins(op: Op, group: list[Op], held: bool, graph: Graph, readers: Counter) -> bool:
    """Whether `op` joins `group`'s epilogue; `held`: every member of it is `_held`."""
    opdef = lookup(op.op_type)
    result = group[-1].outputs[0]
    if not (opdef is not None and opdef.family == "map" and opdef.tile is not None
            and result in op.inputs and readers[result] == 1 and graph.tensors[result].role == "intermediate"
            and len(op.outputs) == 1 and graph.tensors[op.outputs[0]].shape == graph.tensors[result].shape
            and not (lookup(group[0].op_type).family == "contraction" and set(op.inputs) & set(group[0].inputs[:2]))):
        return False
    if held:
        return True  # the running result is the reference's
    # off the reference by roundings: never an integer, and only into a float that moves with it
    return (not is_integer(graph.tensors[result].dtype) and not opdef.predicate
            and not is_integer(graph.tensors[op.outputs[0]].dtype))


def _aside(op: Op, group: list[Op]) -> bool:
    """Whether `op` is a view (a RESHAPE: its kernel moves nothing) of a tensor other than `group`'s
    running result, which may run ahead of the group (a bias regrouped to broadcast, made after
    the contraction in the graph's order)."""
    return op.op_type == "RESHAPE" and group[-1].outputs[0] not in op.inputs


def fusion_groups(graph: Graph, fuse: bool = True) -> list[list[Op]]:
    """The graph's ops, in order, as groups [anchor, *epilogue]; one op per group when `fuse` is off.
    Views between a group and an op that joins it run ahead of the group, each its own kernel."""
    # an op reading a tensor twice (MUL(x, x)) is one reader of it
    readers = Counter(name for op in graph.ops for name in set(op.inputs))
    groups: list[list[Op]] = []
    held = False  # every op of the last group is `_held`: kept as the group grows, not asked again
    views: list[Op] = []  # views met since the last group, which may still grow past them
    for op in graph.ops:
        group = groups[-1] if groups else None
        growing = fuse and group is not None and _anchors(group[0], graph) and len(group) <= MAX_EPILOGUE
        if growing and _aside(op, group):
            views.append(op)
        elif growing and _joins(op, group, held, graph, readers):
            groups[-1:-1] = [[view] for view in views]  # they read nothing of the group: ahead of it
            views = []
            group.append(op)
            held = held and _held(op, graph)
        else:
            groups += [[view] for view in views] + [[op]]  # the graph's order, as without them
            views = []
            held = fuse and _anchors(op, graph) and _held(op, graph)
    return groups + [[view] for view in views]
