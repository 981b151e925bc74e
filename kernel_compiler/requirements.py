"""A kernel's on-chip buffers, read off its body, and what it therefore requires of a machine.

The loader binds exactly these (`loader/buffers.kernel_demands`, per compute tile): one buffer
for each data move whose destination is on chip, the tile's bytes times the move's depth, and one
for each COMPUTE whose result stays on chip (L3, L2 or L1), one deep. The array's accumulators
and the vector unit's registers (REGISTER) hold no buffer, nor does a VIEW (its destination is
external memory). Every lowering records them as the kernel's `requirements`, so the compiler
and the binder agree on what a kernel needs. Vector kernels size their tiles by exactly these
buffers (`lower_vector.choose_space`); matmul and layout kernels by a count that never falls short
of them (`tiling.tile_buffers`, `lower_layout`), so what the compiler checked fits, binds.
"""

from __future__ import annotations

import math

from dfx import Compute, DataMove, Graph, itemsize

from .target import Level, Target

ON_CHIP = ("L3", "L2", "L1")

Buffer = tuple[str, int]  # (level, bytes)


def body_buffers(body: list, graph: Graph) -> list[Buffer]:
    """The on-chip buffers of a kernel body, one compute tile's."""
    out: list[Buffer] = []
    for op in body:
        if isinstance(op, DataMove):
            ref, depth = op.destination, op.depth
        elif isinstance(op, Compute):
            ref, depth = op.output, 1
        else:  # a barrier holds nothing
            continue
        if ref.level in ON_CHIP:
            out.append((ref.level, math.prod(ref.tile_shape) * itemsize(graph.tensors[ref.tensor].dtype) * depth))
    return out


def _level_fits(sizes: list[int], level: Level, line: int) -> bool:
    """First-fit decreasing of buffers, each in whole lines of `line` bytes as the binder places
    them, into the level's banks (the binder does it exactly)."""
    free = [level.bank_bytes] * level.banks
    for size in sorted((-(-s // line) * line for s in sizes), reverse=True):
        for i, room in enumerate(free):
            if size <= room:
                free[i] -= size
                break
        else:
            return False
    return True


def fits(buffers: list[Buffer], target: Target, shared_l3: list[int] | None = None) -> bool:
    """Whether the buffers fit one compute tile's share of the target's banks at every level.
    With `shared_l3`, L3 buffers one copy of which serves every compute tile, L3 is packed whole:
    those once and the others once per compute tile."""
    levels = {"L3": target.l3, "L2": target.l2, "L1": target.l1}
    if shared_l3:
        whole = Level(1, target.l3.banks * target.l3.bank_bytes * target.compute_tiles)
        l3 = [b for lvl, b in buffers if lvl == "L3"] * target.compute_tiles + shared_l3
        if not _level_fits(l3, whole, target.line_bytes):
            return False
        del levels["L3"]
    return all(_level_fits([b for lvl, b in buffers if lvl == name], level, target.line_bytes)
               for name, level in levels.items())


def requirements(buffers: list[Buffer]) -> dict:
    """A kernel's `requirements`: bytes and largest buffer per on-chip level, and the array size."""
    sizes = {level: [b for lvl, b in buffers if lvl == level] for level in ON_CHIP}
    return {
        "bytes": {level: sum(s) for level, s in sizes.items()},
        "largest_buffer": {level: max(s, default=0) for level, s in sizes.items()},
        "min_array": {"rows": 1, "cols": 1},
    }
