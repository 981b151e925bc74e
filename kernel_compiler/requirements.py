"""A kernel's on-chip buffers, read off its body, and what it therefore requires of a machine.

The loader binds exactly these (`loader/buffers.kernel_demands`, per compute tile): one buffer
for each data move whose destination is on chip, the tile's bytes times the move's depth (a load
into L2 of a tile of whole lines, outside chains: a buffer per slot, which may lie in its own
bank), and one for each COMPUTE whose result stays on chip (L3, L2 or L1), its `depth` deep. The array's
accumulators and the vector unit's registers (REGISTER) hold no buffer, nor does a VIEW (its destination is
external memory). Every lowering records them as the kernel's `requirements`, so the compiler
and the binder agree on what a kernel needs. Vector kernels size their tiles by exactly these
buffers (`lower_vector.choose_space`); matmul and layout kernels by a count that never falls short
of them (`tiling.tile_buffers`, `lower_layout`), so what the compiler checked fits, binds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from dfx import Compute, DataMove, Graph, first_fit, in_lines, itemsize

from .target import Level, Target

ON_CHIP = ("L3", "L2", "L1")

Buffer = tuple[str, int]  # (level, bytes)


def body_buffers(body: list, graph: Graph, in_l2: frozenset[str] = frozenset()) -> list[Buffer]:
    """The on-chip buffers of a kernel body, one compute tile's; a plain L2 or L3 tile of a tensor
    kept in L2 (`in_l2`) is none: it is that region of its home."""
    out: list[Buffer] = []
    for op in body:
        if isinstance(op, DataMove):
            ref, depth = op.destination, op.depth
        elif isinstance(op, Compute):
            ref, depth = op.output, op.depth
        else:  # a barrier holds nothing
            continue
        if ref.tensor in in_l2 and ref.level in ("L3", "L2") and ref.padding is None:
            continue
        if ref.level in ON_CHIP:
            out.append((ref.level, math.prod(ref.tile_shape) * itemsize(graph.tensors[ref.tensor].dtype) * depth))
    return out


def _level_fits(sizes: list[int], level: Level) -> bool:
    """First-fit decreasing of buffers (in whole lines, as the binder places them) into the
    level's banks (the binder does it exactly)."""
    return first_fit(sizes, level.banks, level.bank_bytes)


def fits(buffers: Sequence[Buffer], target: Target, shared_l3: Sequence[int] | None = None) -> bool:
    """Whether the buffers fit one compute tile's share of the target's banks at every level.
    With `shared_l3`, L3 buffers one copy of which serves every compute tile, L3 is packed whole:
    those once and the others once per compute tile."""
    line = target.line_bytes
    sizes: dict[str, list[int]] = {"L1": [], "L2": [], "L3": []}
    for level, size in buffers:
        sizes[level].append(in_lines(size, line))
    if not (_level_fits(sizes["L1"], target.l1) and _level_fits(sizes["L2"], target.l2)):
        return False
    if shared_l3:
        whole = Level(1, target.l3.banks * target.l3.bank_bytes * target.compute_tiles)
        return _level_fits([*sizes["L3"] * target.compute_tiles, *(in_lines(s, line) for s in shared_l3)], whole)
    return _level_fits(sizes["L3"], target.l3)


def extents(buffers: Iterable[Buffer], line: int) -> dict[str, tuple[int, int]]:
    """Level -> (largest, total) of the buffers in whole lines: what `extents_fit` compares."""
    sizes: dict[str, list[int]] = {}
    for level, size in buffers:
        sizes.setdefault(level, []).append(in_lines(size, line))
    return {level: (max(s), sum(s)) for level, s in sizes.items()}


def extents_fit(held: dict[str, tuple[int, int]], target: Target) -> bool:
    """Whether buffers no smaller than those of these `extents` could fit, whichever of the L3
    ones are shared: at every level none larger than a bank and all within the level's bytes
    (L3: all its tiles' bytes, as if every one were shared). `fits` refuses whatever this
    refuses, so a search may pass over the tilings whose buffers only grow from these."""
    whole = Level(1, target.l3.banks * target.l3.bank_bytes * target.compute_tiles)
    for name, level in (("L1", target.l1), ("L2", target.l2), ("L3", whole)):
        largest, total = held.get(name, (0, 0))
        if largest > level.bank_bytes or total > level.banks * level.bank_bytes:
            return False
    return True


def requirements(buffers: list[Buffer]) -> dict:
    """A kernel's `requirements`: bytes and largest buffer per on-chip level, and the array size."""
    sizes = {level: [b for lvl, b in buffers if lvl == level] for level in ON_CHIP}
    return {
        "bytes": {level: sum(s) for level, s in sizes.items()},
        "largest_buffer": {level: max(s, default=0) for level, s in sizes.items()},
        "min_array": {"rows": 1, "cols": 1},
    }
