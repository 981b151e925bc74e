"""Expand a kernel's tile loops into the concrete op stream, lazily.

Nothing problem-sized is ever built: `expand` is a generator over (worker, op, env) with
`env` the live loop-variable values (copy what you keep). The parallel loop's iterations are
dealt round-robin to the workers (compute tiles), and the workers' streams are interleaved op
by op, the order in which a command processor would issue them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from dfx import BodyOp, Compute, DataMove, Graph, Kernel, TileRef


@dataclass(frozen=True)
class Placement:
    """Which body ops run at / after each loop, precomputed once per kernel."""

    before: tuple[BodyOp, ...]  # at=None: once before all loops
    at: dict[str, tuple[BodyOp, ...]]
    after: dict[str, tuple[BodyOp, ...]]


def placement(kernel: Kernel) -> Placement:
    at: dict[str, list[BodyOp]] = {l.induction_var: [] for l in kernel.tile_loops}
    after: dict[str, list[BodyOp]] = {l.induction_var: [] for l in kernel.tile_loops}
    before: list[BodyOp] = []
    for op in kernel.body:
        if op.after is not None:
            after[op.after].append(op)
        elif op.at is not None:
            at[op.at].append(op)
        else:
            before.append(op)
    return Placement(tuple(before), {k: tuple(v) for k, v in at.items()}, {k: tuple(v) for k, v in after.items()})


def workers_for(kernel: Kernel, compute_tiles: int) -> int:
    """Compute tiles a kernel can use: at most one per iteration of its parallel loop."""
    for loop in kernel.tile_loops:
        if loop.parallel:
            return max(1, min(compute_tiles, loop.trip_count, loop.per_block or loop.trip_count))
    return 1


def _worker_stream(kernel: Kernel, place: Placement, worker: int, workers: int) -> Iterator[tuple[BodyOp, dict]]:
    loops = kernel.tile_loops
    env: dict[str, int] = {}

    def level(d: int) -> Iterator[tuple[BodyOp, dict]]:
        loop = loops[d]
        var = loop.induction_var
        iterations = loop.steps(env)
        if loop.parallel:
            iterations = iterations[worker::workers]
        ops_at = place.at[var]
        for value in iterations:
            env[var] = value
            for op in ops_at:
                yield op, env
            if d + 1 < len(loops):
                yield from level(d + 1)
        env.pop(var, None)
        for op in place.after[var]:
            yield op, env

    for op in place.before:
        yield op, env
    if loops:
        yield from level(0)


def expand(kernel: Kernel, workers: int) -> Iterator[tuple[int, BodyOp, dict]]:
    """A shared move (`Kernel.shared_moves`) runs once for all workers, as worker 0's: each
    worker that reaches it waits there until every worker has, so none is still reading the
    copy before it (every reader of a shared tile sits inside the loop the move sits at)."""
    place = placement(kernel)
    shared = kernel.shared_moves() if workers > 1 else set()
    streams = [(w, _worker_stream(kernel, place, w, workers)) for w in range(workers)]
    waiting: dict[int, tuple[BodyOp, dict]] = {}  # worker -> the shared move it reached
    while streams:
        live = []
        for w, stream in streams:
            if w in waiting:
                live.append((w, stream))
                continue
            step = next(stream, None)
            if step is None:
                continue
            live.append((w, stream))
            if step[0].op_id in shared:
                waiting[w] = step
            else:
                yield w, step[0], step[1]
        streams = live
        if waiting and len(waiting) == len(streams):
            op, env = waiting[min(waiting)]
            yield 0, op, env
            waiting.clear()


def table_values(ref: TileRef, g: Graph) -> list[int] | None:
    """The entries of a tile's index table (None: it has none)."""
    if ref.table is None:
        return None
    return next(op.attrs[ref.table.attr] for op in g.ops if op.name == ref.table.op)


def tile_origin(ref: TileRef, shape: tuple[int, ...], env: dict[str, int],
                table: list[int] | None = None) -> list[int]:
    """Where the tile starts in each dim of its tensor: tile i at `offset + i * extent`, or along
    a table's dim at the table's entry i (negative counts from the end)."""
    origin = [env.get(index, 0) * extent for index, extent in zip(ref.tile_indices, ref.tile_shape)]
    if ref.offset is not None:
        origin = [o + offset for o, offset in zip(origin, ref.offset)]
    if ref.table is not None:
        dim = ref.table.dim
        origin[dim] = table[env.get(ref.tile_indices[dim], 0)] % shape[dim]
    return origin


def tile_slices(ref: TileRef, shape: tuple[int, ...], env: dict[str, int]) -> tuple[slice, ...]:
    """The region of the tensor a tile reference covers at these loop values: the tile clipped to
    the tensor (edge tiles are partial, a window's tile may be empty). Not for a tile indexed
    through a table (only a move's source in external memory is, read by `move_slices`)."""
    return tuple(slice(min(max(o, 0), dim), min(max(o + extent, 0), dim))
                 for o, extent, dim in zip(tile_origin(ref, shape, env), ref.tile_shape, shape))


def move_slices(op: DataMove, src_shape: tuple[int, ...], dst_shape: tuple[int, ...], env: dict[str, int],
                table: list[int] | None = None) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """What a move copies: the positions of its tile inside both tensors, as the regions of the
    source and of the destination they are (`table`: the source's). Destination dim j is source
    dim permutation[j]."""
    src_origin = tile_origin(op.source, src_shape, env, table)
    dst_origin = tile_origin(op.destination, dst_shape, env)
    src: list[slice] = [slice(0)] * len(src_shape)
    dst: list[slice] = []
    for j, i in enumerate(op.permutation or range(len(dst_shape))):
        s, d = src_origin[i], dst_origin[j]
        low = max(0, -s, -d)
        high = max(low, min(op.destination.tile_shape[j], src_shape[i] - s, dst_shape[j] - d))
        src[i] = slice(s + low, s + high)
        dst.append(slice(d + low, d + high))
    return tuple(src), tuple(dst)


def region_elements(region: tuple[slice, ...]) -> int:
    n = 1
    for s in region:
        n *= s.stop - s.start
    return n


def accumulating(op: Compute, env: dict[str, int]) -> bool:
    """Evaluate a compute's `accumulate` expression: "false", "true" or "<var> > 0"."""
    expr = op.accumulate.strip()
    if expr in ("false", "true"):
        return expr == "true"
    var, _, rest = expr.partition(">")
    return env.get(var.strip(), 0) > int(rest.strip() or 0)


def readers(kernel: Kernel) -> dict[int, list[int]]:
    """For each data move or compute, the ops that read the buffer it fills (its consumers)."""
    out: dict[int, list[int]] = {op.op_id: [] for op in kernel.body if isinstance(op, (DataMove, Compute))}
    for op in kernel.body:
        for dep in op.depends_on:
            if dep in out:
                out[dep].append(op.op_id)
    return out
