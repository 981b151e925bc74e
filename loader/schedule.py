"""Expand a kernel's tile loops into the concrete op stream, lazily.

Nothing problem-sized is ever built: `expand` is a generator over (worker, op, env) with
`env` the live loop-variable values (copy what you keep). The parallel loop's iterations are
dealt round-robin to the workers (compute tiles), and the workers' streams are interleaved op
by op, the order in which a command processor would issue them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from dfx import BodyOp, Compute, DataMove, Graph, Kernel, Program, TileLoop, TileRef
from dfx.kernel import IndexTable, IndexTensor, condition


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


def worker_stream(kernel: Kernel, place: Placement, worker: int, workers: int) -> Iterator[tuple[int, BodyOp, dict]]:
    """One worker's ops in program order, as (worker, op, env) with `env` one dict updated in place.
    The loop nest runs in this one frame (a stack of its loops' step iterators), not a generator
    per level, and each op's tuple is made once, not per step: a kernel has many more steps
    than ops."""
    loops = kernel.tile_loops
    env: dict[str, int] = {}
    step = {op.op_id: (worker, op, env) for op in kernel.body}
    names = [loop.induction_var for loop in loops]
    # the moves that run only `when` their condition holds (a K split's partial sums)
    gates = {op.op_id: condition(op.when) for op in kernel.body if isinstance(op, DataMove) and op.when is not None}

    def placed(ops: tuple[BodyOp, ...]) -> tuple | _Gated:
        steps_here = tuple(step[op.op_id] for op in ops)
        if not any(op.op_id in gates for op in ops):
            return steps_here
        return _Gated(steps_here, gates, env)

    ops_at = [placed(place.at[var]) for var in names]
    ops_after = [placed(place.after[var]) for var in names]

    def steps(d: int) -> Iterator[int]:
        values = loops[d].steps(env)
        return iter(values[worker::workers] if loops[d].parallel else values)

    for op in place.before:
        yield step[op.op_id]
    running = [steps(0)] if loops else []  # the step iterators of the loops entered, outermost first
    while running:
        d = len(running) - 1
        value = next(running[d], None)
        if value is None:  # loop d is done
            running.pop()
            env.pop(names[d], None)
            yield from ops_after[d]
            continue
        env[names[d]] = value
        yield from ops_at[d]
        if d + 1 < len(loops):
            running.append(steps(d + 1))


class _Gated:
    """The ops at one place, those with a `when` only where it holds at the loop values `env`."""

    __slots__ = ("steps", "gates", "env")

    def __init__(self, steps: tuple, gates: dict[int, tuple[str, int]], env: dict[str, int]):
        self.steps, self.gates, self.env = steps, gates, env

    def __iter__(self) -> Iterator:
        for s in self.steps:
            gate = self.gates.get(s[1].op_id)
            if gate is None or self.env.get(gate[0], 0) > gate[1]:
                yield s


def expand(kernel: Kernel, workers: int) -> Iterator[tuple[int, BodyOp, dict]]:
    """A shared move (`Kernel.shared_moves`) runs once for all workers, as worker 0's: each
    worker that reaches it waits there until every worker has, so none is still reading the
    copy before it (every reader of a shared tile sits inside the loop the move sits at)."""
    place = placement(kernel)
    shared = kernel.shared_moves()
    running = [worker_stream(kernel, place, w, workers) for w in range(workers)]
    waiting: dict[int, tuple[Iterator, tuple[int, BodyOp, dict]]] = {}  # worker -> its stream, the shared move it reached
    while running:
        going = []
        for stream in running:  # one op of each worker not waiting, in worker order
            step = next(stream, None)
            if step is None:
                continue
            if step[1].op_id in shared:
                waiting[step[0]] = (stream, step)
            else:
                going.append(stream)
                yield step
        running = going
        if waiting and not running:  # every worker has reached the shared move
            _, op, env = waiting[min(waiting)][1]
            yield 0, op, env
            running = [waiting[w][0] for w in sorted(waiting)]
            waiting.clear()


def table_values(ref: TileRef, g: Graph) -> list[int] | None:
    """The entries of a tile's index table known before the run (None: it has none, or they are
    an index tensor's, read at run time: `IndexTensor`)."""
    if not isinstance(ref.table, IndexTable):
        return None
    return next(op.attrs[ref.table.attr] for op in g.ops if op.name == ref.table.op)


def viewed(tensor: str, program: Program, runs: bool = False) -> str:
    """The tensor whose bytes `tensor` names through views of all of them (itself if none): the
    one a user gave, its elements in the same row-major order; with `runs`, through views of one
    run of them too, its elements some of that tensor's."""
    source = {m.destination.tensor: m.source.tensor for k in program.kernels for m in k.body
              if isinstance(m, DataMove) and m.move_type == "VIEW" and (runs or m.source.offset is None)}
    while tensor in source:
        tensor = source[tensor]
    return tensor


def index_sizes(program: Program) -> dict[str, int]:
    """Each tensor that index tensors name through views -> the size of the smallest dim their
    entries pick along: its entries must lie from -size to size - 1."""
    sizes: dict[str, int] = {}
    for k in program.kernels:
        for m in k.body:
            if isinstance(m, DataMove) and isinstance(m.source.table, IndexTensor):
                name = viewed(m.source.table.tensor, program, runs=True)
                size = program.graph.tensors[m.source.tensor].shape[m.source.table.dim]
                sizes[name] = min(size, sizes.get(name, size))
    return sizes


def tile_origin(ref: TileRef, shape: tuple[int, ...], env: dict[str, int],
                table: Sequence[int] | None = None) -> list[int]:
    """Where the tile starts in each dim of its tensor: tile i at `offset + i * step` (the extent
    unless given), or along a table's dim at the table's entry i (negative counts from the end).
    Without the entries (an index tensor's, where no values are computed) the tile is taken at
    0 there: it is one element deep along that dim, so any entry in range moves the same bytes."""
    origin = [env.get(index, 0) * step for index, step in zip(ref.tile_indices, ref.step or ref.tile_shape)]
    if ref.offset is not None:
        origin = [o + offset for o, offset in zip(origin, ref.offset)]
    if ref.table is not None:
        dim = ref.table.dim
        origin[dim] = int(table[env.get(ref.tile_indices[dim], 0)]) % shape[dim] if table is not None else 0
    return origin


def tile_slices(ref: TileRef, shape: tuple[int, ...], env: dict[str, int]) -> tuple[slice, ...]:
    """The region of the tensor a tile reference covers at these loop values: the tile clipped to
    the tensor, padded by the ref's padding (edge tiles are partial, a window's tile may be
    empty). Not for a tile indexed through a table (only a move's source in external memory is,
    read by `move_slices`)."""
    padding = ref.padding or [(0, 0)] * len(shape)
    return tuple(slice(min(max(o, -before), dim + after), min(max(o + extent, -before), dim + after))
                 for o, extent, dim, (before, after) in zip(tile_origin(ref, shape, env), ref.tile_shape, shape,
                                                           padding))


def move_slices(op: DataMove, src_shape: tuple[int, ...], dst_shape: tuple[int, ...], env: dict[str, int],
                table: Sequence[int] | None = None) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """What a move copies: the positions of its tile inside both tensors, as the regions of the
    source and of the destination they are (`table`: the source's). Destination dim j is source
    dim permutation[j] (into another tensor: within one, the move reorders the tile it holds,
    not the region)."""
    src_origin = tile_origin(op.source, src_shape, env, table)
    dst_origin = tile_origin(op.destination, dst_shape, env)
    src: list[slice] = [slice(0)] * len(src_shape)
    dst: list[slice] = []
    renamed = op.permutation is not None and op.source.tensor != op.destination.tensor
    for j, i in enumerate(op.permutation if renamed else range(len(dst_shape))):
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


def loop_ranges(kernel: Kernel) -> dict[str, tuple[int, int]]:
    """Bounds on the value each loop variable reads as anywhere in the kernel: its loop's steps,
    or 0 (an unset variable's value) outside that loop."""
    out: dict[str, tuple[int, int]] = {}
    for loop in kernel.tile_loops:
        if loop.within is None:
            steps = range(loop.start, loop.end, loop.step)
            low, high = (min(steps[0], steps[-1]), max(steps[0], steps[-1])) if steps else (0, 0)
        else:  # a block's steps start at its block's number times per_block and stop before `end`
            block_low, block_high = out[loop.within]
            low, high = min(block_low * loop.per_block, block_high * loop.per_block), loop.end - 1
        out[loop.induction_var] = (min(low, 0), max(high, 0))
    return out


def whole_move_bounds(op: DataMove, src_shape: tuple[int, ...], dst_shape: tuple[int, ...]) -> list[tuple[str, int, int]] | None:
    """Where a move copies its whole destination tile: (loop variable, low, high) bounds on the
    tile indices within which `move_slices` gives that tile in both tensors. None where the
    geometry is not that plain (a window, a table, a permutation): ask `move_slices` each time."""
    src, dst = op.source, op.destination
    if op.permutation is not None or any(r.windowed or r.table is not None for r in (src, dst)):
        return None
    refs = ((src, src_shape), (dst, dst_shape))
    if any(not len(r.tile_indices) == len(r.tile_shape) == len(shape) == len(dst_shape) for r, shape in refs):
        return None
    if any(extent <= 0 for r in (src, dst) for extent in r.tile_shape):
        return None
    # along dim j both tiles start at their index times their own extent, and the copy is as long
    # as the destination tile
    return [(ref.tile_indices[j], 0, (shape[j] - extent) // ref.tile_shape[j])
            for j, extent in enumerate(dst.tile_shape) for ref, shape in refs]


def whole_tile_bounds(ref: TileRef, shape: tuple[int, ...]) -> list[tuple[str, int, int]] | None:
    """As `whole_move_bounds`, for `tile_slices`: where it gives the whole tile."""
    if ref.windowed or ref.table is not None or not len(ref.tile_indices) == len(ref.tile_shape) == len(shape):
        return None
    if any(extent <= 0 for extent in ref.tile_shape):
        return None
    return [(index, 0, (dim - extent) // extent) for index, extent, dim in zip(ref.tile_indices, ref.tile_shape, shape)]


def unchecked_bounds(bounds: list[tuple[str, int, int]], ranges: dict[str, tuple[int, int]]) -> tuple[tuple[str, int, int], ...]:
    """Of `bounds`, one per variable (the tightest), those the loops' ranges (`loop_ranges`) do
    not already keep; a name that is no loop variable reads as 0."""
    tightest: dict[str, tuple[int, int]] = {}
    for var, low, high in bounds:
        was_low, was_high = tightest.get(var, (low, high))
        tightest[var] = (max(low, was_low), min(high, was_high))
    unchecked = []
    for var, (low, high) in tightest.items():
        least, most = ranges.get(var, (0, 0))
        if not low <= least <= most <= high:
            unchecked.append((var, low, high))
    return tuple(unchecked)


def within_bounds(bounds: tuple[tuple[str, int, int], ...], env: dict[str, int]) -> bool:
    """Whether the loop values `env` keep every (variable, low, high) bound."""
    for var, low, high in bounds:
        if not low <= env.get(var, 0) <= high:
            return False
    return True


def accumulate_rule(op: Compute) -> bool | tuple[str, int]:
    """A compute's `accumulate` expression parsed: "false", "true", or "<var> > <n>" as (var, n)."""
    expr = op.accumulate.strip()
    if expr in ("false", "true"):
        return expr == "true"
    return condition(expr)


def first_of_block(loop: TileLoop, env: dict[str, int]) -> bool:
    """Whether a loop within blocks is at the first step of its block."""
    return env[loop.induction_var] == env[loop.within] * loop.per_block


def last_of_block(loop: TileLoop, env: dict[str, int]) -> int:
    """The last step of a loop where the enclosing loops have the values `env`: of its block, for
    a loop within blocks."""
    if loop.within is None:
        return loop.end - 1
    return min(loop.end, (env[loop.within] + 1) * loop.per_block) - 1


def ring_shortfall(kernel: Kernel, workers: int) -> str | None:
    """Why, on `workers` compute tiles, a ring of partial sums would not hold every tile one of
    them writes there per step of the loop its reload waits on (None if it would): the reload
    would find its tile overwritten. Each compute tile takes its share of the parallel loop's
    steps in that loop (of a block, for a loop within blocks)."""
    order = [l.induction_var for l in kernel.tile_loops]
    loops = {l.induction_var: l for l in kernel.tile_loops}
    for reader, writer_id in kernel.carried_reads().items():
        var, _ = condition(kernel.body_op(reader).when)
        writer = kernel.body_op(writer_id)
        anchor = writer.after or writer.at
        inside = order[order.index(var) + 1: order.index(anchor) + (writer.after is None)]
        tiles = 1
        for v in inside:
            loop = loops[v]
            block = loop.within
            steps = loop.per_block if block is not None and order.index(block) < order.index(var) else loop.trip_count
            tiles *= -(-steps // workers) if loop.parallel else steps
        if tiles > writer.depth:
            return (f"op {writer_id} keeps partial sums in a ring of {writer.depth} tile(s), but each of {workers} "
                    f"compute tile(s) writes {tiles} there per step of loop '{var}' before reading them back")
    return None


def accumulating(op: Compute, env: dict[str, int]) -> bool:
    """Evaluate a compute's `accumulate` expression at these loop values."""
    rule = accumulate_rule(op)
    if isinstance(rule, bool):
        return rule
    var, bound = rule
    return env.get(var, 0) > bound


def readers(kernel: Kernel) -> dict[int, list[int]]:
    """For each data move or compute, the ops that read the buffer it fills (its consumers)."""
    out: dict[int, list[int]] = {op.op_id: [] for op in kernel.body if isinstance(op, (DataMove, Compute))}
    for op in kernel.body:
        for dep in op.depends_on:
            if dep in out:
                out[dep].append(op.op_id)
    return out
