"""Fusion: group each op with the chain of map ops that follows it, so a bias, an activation or a
residual add is applied to the result tile on chip instead of a DRAM round trip per op.

A group is an anchor (a MATMUL, a map op, or a row op whose result has its operand's shape:
SOFTMAX, LOG_SOFTMAX, LAYERNORM) and an epilogue: the map ops right after it in graph order,
each reading the group's running result. An op joins the epilogue when that result is read by it
alone and is no graph output (so nothing else ever needs it in memory), and when its result has
the running result's shape (an epilogue never grows the tile). Its other operands (a bias, a
residual) are graph inputs or earlier kernels' results, loaded as more streams of the kernel.
"""

from __future__ import annotations

from collections import Counter

from dfx import Graph, Op, lookup

MAX_EPILOGUE = 8  # ops per epilogue: each adds a buffer at every level, the tile shrinks with them


def _anchors(op: Op, graph: Graph) -> bool:
    opdef = lookup(op.op_type)
    if opdef is None or opdef.tile is None or len(op.outputs) != 1:
        return False
    if opdef.family in ("contraction", "map"):
        return True
    return opdef.family == "reduction" and graph.tensors[op.inputs[0]].shape == graph.tensors[op.outputs[0]].shape


def _joins(op: Op, result: str, graph: Graph, readers: Counter) -> bool:
    opdef = lookup(op.op_type)
    return (opdef is not None and opdef.family == "map" and opdef.tile is not None
            and result in op.inputs and readers[result] == 1 and graph.tensors[result].role == "intermediate"
            and len(op.outputs) == 1 and graph.tensors[op.outputs[0]].shape == graph.tensors[result].shape)


def fusion_groups(graph: Graph, fuse: bool = True) -> list[list[Op]]:
    """The graph's ops, in order, as groups [anchor, *epilogue]; one op per group when `fuse` is off."""
    # an op reading a tensor twice (MUL(x, x)) is one reader of it
    readers = Counter(name for op in graph.ops for name in set(op.inputs))
    groups: list[list[Op]] = []
    for op in graph.ops:
        group = groups[-1] if groups else None
        if (fuse and group is not None and _anchors(group[0], graph) and len(group) <= MAX_EPILOGUE
                and _joins(op, group[-1].outputs[0], graph, readers)):
            group.append(op)
        else:
            groups.append([op])
    return groups
