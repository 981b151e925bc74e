"""Expand a kernel's tile loops into the concrete op stream, lazily.

Nothing problem-sized is ever built: `expand` is a generator over (worker, op, env) with
`env` the live loop-variable values (copy what you keep). The parallel loop's iterations are
dealt round-robin to the workers (compute tiles), and the workers' streams are interleaved op
by op, the order in which a command processor would issue them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from dfx import BodyOp, Compute, DataMove, Kernel, TileRef


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
            return max(1, min(compute_tiles, loop.trip_count))
    return 1


def _worker_stream(kernel: Kernel, place: Placement, worker: int, workers: int) -> Iterator[tuple[BodyOp, dict]]:
    loops = kernel.tile_loops
    env: dict[str, int] = {}

    def level(d: int) -> Iterator[tuple[BodyOp, dict]]:
        loop = loops[d]
        var = loop.induction_var
        if loop.parallel:
            iterations = range(loop.start + worker * loop.step, loop.end, workers * loop.step)
        else:
            iterations = range(loop.start, loop.end, loop.step)
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
    place = placement(kernel)
    streams = [(w, _worker_stream(kernel, place, w, workers)) for w in range(workers)]
    while streams:
        live = []
        for w, stream in streams:
            step = next(stream, None)
            if step is not None:
                live.append((w, stream))
                yield w, step[0], step[1]
        streams = live


def tile_slices(ref: TileRef, shape: tuple[int, ...], env: dict[str, int]) -> tuple[slice, ...]:
    """The region of the tensor a tile reference covers at these loop values (edge tiles
    are partial)."""
    out = []
    for index, extent, dim in zip(ref.tile_indices, ref.tile_shape, shape):
        i = env.get(index, 0)
        out.append(slice(i * extent, min((i + 1) * extent, dim)))
    return tuple(out)


def tile_elements(ref: TileRef, shape: tuple[int, ...], env: dict[str, int]) -> int:
    n = 1
    for index, extent, dim in zip(ref.tile_indices, ref.tile_shape, shape):
        i = env.get(index, 0)
        n *= max(0, min((i + 1) * extent, dim) - i * extent)
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
