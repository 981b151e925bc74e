"""Lower a map or row-reduction op to a tiled DFX kernel on the vector unit.

The kernel walks an iteration space: the result's shape for a map op, the first operand's for a
reduction. Its tile holds the reduced axes whole (the registry's `whole_axes`) and, from the last
dimension backwards, as much of the rest as fits the target's banks, so rows stay contiguous.
Where the reduced axes alone do not fit, the tile is the largest that does, from the last
dimension backwards like any other, and cuts the rows: a REDUCE_SUM/MAX/MIN/PROD whose tiles cut
one reduced axis gets a reduction loop, innermost, its COMPUTE combining each tile into the
partial result held in L1 (`accumulate: "<loop> > 0"`) and its store placed after that loop.
Other cuts (a softmax's row, two reduced axes) are for `passes.split_long_rows` to take apart
first; `split_axes` tells it which axes a kernel would cut. A row op it does not take apart
(ARGMAX, ARGMIN, the running reductions CUM*, SORT, ARGSORT), whose rows the tiles cut where
they are kept small enough for every compute tile to get two, gets tiles as large as a bank
holds instead, which keep them whole.
Every operand is a stream of three hops (EXTERNAL -> L3 -> L2 -> L1), its tile indexed by the
space's loops it varies along: an operand broadcast along a dimension (a bias, a scale) takes
that dimension whole ("0") and, by the placement rule, is loaded once per tile it varies over,
not once per tile of the result. The vector unit writes the result tile into L1; it leaves by
L1 -> L2 -> L3 -> EXTERNAL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from dfx import Compute, DataMove, Graph, Kernel, Op, TileLoop, TileRef, itemsize, lookup
from dfx.ops.reduction import ACCUMULATING

from .errors import CompileError
from .requirements import Buffer, body_buffers, fits, requirements
from .target import Target
from .tiling import Stream, parallel_loop, placement, stream_traffic

LEVELS = ("EXTERNAL", "L3", "L2", "L1")


@dataclass(frozen=True)
class Space:
    """The iteration space: its shape, the tile extent along each dim, and the loop variable of
    each dim the tiles split (None: the dim is whole in every tile)."""

    shape: tuple[int, ...]
    extents: tuple[int, ...]
    loops: tuple[str | None, ...]

    def trips(self) -> dict[str, int]:
        return {v: math.ceil(d / e) for v, d, e in zip(self.loops, self.shape, self.extents) if v}


def aligned_dims(shape: tuple[int, ...], space: tuple[int, ...]) -> list[int | None]:
    """The space dim each dim of an operand runs along, numpy broadcasting (aligned right);
    None where the operand is broadcast (size 1 against a larger space dim)."""
    offset = len(space) - len(shape)
    return [None if d == 1 and space[i + offset] != 1 else i + offset for i, d in enumerate(shape)]


def tile_ref(tensor: str, level: str, dims: list[int | None], space: Space) -> TileRef:
    indices = [space.loops[j] or "0" if j is not None else "0" for j in dims]
    extents = [space.extents[j] if j is not None else 1 for j in dims]
    return TileRef(tensor, level, indices, extents)


def tile_extents(shape: tuple[int, ...], whole: tuple[int, ...], budget: int) -> tuple[int, ...] | None:
    """Extents of a tile of at most `budget` elements: the `whole` dims whole, then from the last
    dim backwards whole dims while they fit, then an even split of the next; None if the whole
    dims alone are too big."""
    extents = [1] * len(shape)
    size = 1
    for j in whole:
        extents[j] = shape[j]
        size *= shape[j]
    if size > budget:
        return None
    for j in reversed(range(len(shape))):
        if j in whole:
            continue
        room = budget // max(size, 1)
        if room >= shape[j]:
            extents[j] = shape[j]
            size *= shape[j]
            continue
        pieces = math.ceil(shape[j] / room)
        extents[j] = math.ceil(shape[j] / pieces)  # equal tiles, the last one no smaller than needed
        break
    return tuple(extents)


# the buffers of the kernel body over the tiles of a space, its loads `depth` deep
SpaceBuffers = Callable[[Space, int], list[Buffer]]


MIN_PIPELINED_TILE = 1024  # elements: 4 KB of f32, 64 cycles of a 64 B/cycle DMA beside its ~100 of latency


def _largest_tile(shape: tuple[int, ...], whole: tuple[int, ...], buffers: SpaceBuffers, elem: int,
                  target: Target, balanced: bool = True) -> tuple[Space, int] | None:
    """The largest tile (a power of two of elements, or the whole space) holding the `whole` dims
    whole whose body's `buffers` fit the target; double-buffered when that fits. (Space, depth),
    or None when no tile holding them whole fits. `elem`, the fewest bytes any of the kernel's
    elements takes, bounds the first try: no bank holds more of them. `balanced`: no larger than
    gives every compute tile two tiles, unless tiles get smaller than MIN_PIPELINED_TILE."""
    total = max(1, math.prod(shape))
    # at most what one bank holds, and small enough that every compute tile gets two tiles to
    # overlap loads with compute, unless that makes tiles so small their transfers' latency rules
    top = max(b.bank_bytes for b in (target.l1, target.l2, target.l3)) // elem
    if balanced:
        top = min(top, max(MIN_PIPELINED_TILE, total // (2 * target.compute_tiles)))
    for depth in (2, 1):  # double-buffered tiles, so loads overlap the vector unit, where they fit
        budget = min(total, 1 << max(0, top.bit_length() - 1))
        while budget >= 1:
            extents = tile_extents(shape, whole, budget)
            if extents is None:
                break
            loops = tuple(f"d{j}" if e < d else None for j, (d, e) in enumerate(zip(shape, extents)))
            space = Space(shape, extents, loops)
            if fits(buffers(space, depth), target):
                return space, depth
            budget //= 2
    return None


def choose_space(shape: tuple[int, ...], whole: tuple[int, ...], buffers: SpaceBuffers, elem: int, target: Target,
                 where: str, balanced: bool = True) -> tuple[Space, int]:
    """The tiles of a kernel: the largest holding the `whole` dims whole where one fits (`balanced`
    as `_largest_tile`'s), else the largest that fits, which cuts them (see `_cut_axes`)."""
    found = (_largest_tile(shape, whole, buffers, elem, target, balanced)
             or _largest_tile(shape, (), buffers, elem, target))
    if found is None:
        raise CompileError(f"{where}: not even a tile of one element of each of its streams fits "
                           f"target '{target.name}'")
    return found


def _cut_axes(space: Space, whole: tuple[int, ...]) -> tuple[int, ...]:
    """The `whole` dims the tiles of `space` cut after all: each is a reduction loop."""
    return tuple(j for j in whole if space.loops[j])


def _iteration_space(graph: Graph, ops: list[Op]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What a kernel of the group `ops` tiles: (the iteration space's shape, the axes its tiles
    should hold whole)."""
    op = ops[0]
    opdef = lookup(op.op_type)
    attrs = opdef.normalize_attrs(op.attrs)
    shape = graph.tensors[op.outputs[0] if opdef.family == "map" else op.inputs[0]].shape
    whole = tuple(opdef.whole_axes(shape, attrs)) if opdef.family == "reduction" else ()
    return shape, whole


def _loops(space: Space, whole: tuple[int, ...]) -> tuple[tuple[str, ...], str | None]:
    """The loop order over the tiles of `space`, and its reduction loop (a cut reduced axis), if
    any: innermost, so the partial result stays on chip across it."""
    cut = _cut_axes(space, whole)
    reduction = space.loops[cut[0]] if cut else None
    return tuple(v for v in space.loops if v and v != reduction) + ((reduction,) if reduction else ()), reduction


def _choose(graph: Graph, ops: list[Op], target: Target, balanced: bool = True) -> tuple[Space, int]:
    """The tiles of the kernel of the group `ops`, sized by the buffers its body will have."""
    shape, whole = _iteration_space(graph, ops)
    tensors = [graph.tensors[n] for n in kernel_reads(ops)] + [graph.tensors[o.outputs[0]] for o in ops]

    def buffers(space: Space, depth: int) -> list[Buffer]:
        return body_buffers(_body(graph, ops, space, depth)[0], graph)

    return choose_space(shape, whole, buffers, min(itemsize(t.dtype) for t in tensors), target,
                        ops[0].source or ops[0].name, balanced)


def split_axes(graph: Graph, ops: list[Op], target: Target) -> tuple[int, ...]:
    """The reduced axes a kernel of the group `ops` would cut into tiles for `target`: () when its
    rows fit a tile whole. The same rule the lowering tiles by, for a pass deciding to split."""
    shape, whole = _iteration_space(graph, ops)
    if 0 in shape:  # nothing to tile: the lowering says so
        return ()
    return _cut_axes(_choose(graph, ops, target)[0], whole)


def load(body: list, tensor: str, dims: list[int | None], space: Space, at: str | None, depth: int,
         to: str = "L1") -> int:
    """Append the hops that bring an operand's tile from external memory to level `to`; the id
    of the last move."""
    prev: list[int] = []
    hops = LEVELS[: LEVELS.index(to) + 1]
    for src, dst in zip(hops, hops[1:]):
        body.append(DataMove(len(body), "LOAD", tile_ref(tensor, src, dims, space), tile_ref(tensor, dst, dims, space),
                             at=at, depth=depth if at is not None else 1, depends_on=prev))
        prev = [len(body) - 1]
    return prev[0]


def store(body: list, tensor: str, dims: list[int | None], space: Space, after: int, place: dict,
          source: str = "L1", depth: int = 1, l3_depth: int | None = None) -> None:
    """Append the hops that take a result tile from level `source` back to external memory, each
    on-chip one `depth` deep (in L3, `l3_depth` where given)."""
    prev = [after]
    hops = LEVELS[: LEVELS.index(source) + 1][::-1]
    for src, dst in zip(hops, hops[1:]):
        deep = 1 if dst == "EXTERNAL" else l3_depth if dst == "L3" and l3_depth is not None else depth
        body.append(DataMove(len(body), "STORE", tile_ref(tensor, src, dims, space), tile_ref(tensor, dst, dims, space),
                             depth=deep, depends_on=prev, **place))
        prev = [len(body) - 1]


def loops_of(dims: list[int | None], space: Space) -> tuple[str, ...]:
    """The loops a tile indexed by `dims` (space dims, None: taken whole) varies along."""
    return tuple(space.loops[j] for j in dims if j is not None and space.loops[j])


def placement_of(dims: list[int | None], space: Space, order: tuple[str, ...]) -> str | None:
    """The loop an operand's moves sit at: the innermost that indexes it (None: before all)."""
    p = placement(Stream("", loops_of(dims, space), 0), order)
    return order[p] if p >= 0 else None


def epilogue(body: list, graph: Graph, ops: list[Op], result: str, result_level: str, result_at: int, space: Space,
             order: tuple[str, ...], depth: int, place: dict, level: str = "L1",
             result_depth: int = 1) -> tuple[str, int, list[Stream]]:
    """Append the epilogue's ops, applied on the vector unit to the result tile: the loads of each
    op's other operands to `level` (indexed by the loops they vary along, `depth` deep where they
    repeat) and its compute, reading the running result where it names it, its result
    `result_depth` deep; the last result is written to `level`. (final result tensor, id of its
    last compute, the operand streams)."""
    streams = []
    for op in ops:
        inputs, deps = [], [result_at]
        for name in op.inputs:
            t = graph.tensors[name]
            dims = aligned_dims(t.shape, space.shape)
            if name == result:
                inputs.append(tile_ref(name, result_level, dims, space))
                continue
            deps.append(load(body, name, dims, space, placement_of(dims, space, order), depth, level))
            inputs.append(tile_ref(name, level, dims, space))
            streams.append(Stream(name, loops_of(dims, space), t.size * itemsize(t.dtype)))
        result = op.outputs[0]
        # the vector unit runs the chain over each chunk of the tile in its registers: only the
        # last result is written back to an L1 buffer
        out_level = level if op is ops[-1] else "REGISTER"
        body.append(Compute(len(body), lookup(op.op_type).compute_type, inputs,
                            tile_ref(result, out_level, aligned_dims(graph.tensors[result].shape, space.shape), space),
                            depends_on=deps, depth=result_depth, **place))
        result_at, result_level = len(body) - 1, out_level
    return result, result_at, streams


def epilogue_work(graph: Graph, ops: list[Op]) -> dict[str, int]:
    """The vector elements of an epilogue over whole tensors, per op class."""
    work: dict[str, int] = {}
    for op in ops:
        opdef = lookup(op.op_type)
        shapes = [graph.tensors[n].shape for n in op.inputs]
        for cls, n in opdef.vector_work(shapes, graph.tensors[op.outputs[0]].shape,
                                        opdef.normalize_attrs(op.attrs)).items():
            work[cls] = work.get(cls, 0) + n
    return work


def _body(graph: Graph, ops: list[Op], space: Space, depth: int) -> tuple[list, list[Stream]]:
    """The body of the group's kernel over the tiles of `space`, loads that repeat `depth` deep;
    and its streams: each operand's, the epilogue's, and the final result's."""
    op = ops[0]
    opdef = lookup(op.op_type)
    attrs = opdef.normalize_attrs(op.attrs)
    ins = [graph.tensors[n] for n in op.inputs]
    out = graph.tensors[op.outputs[0]]
    order, reduction = _loops(space, _iteration_space(graph, ops)[1])
    in_dims = [aligned_dims(t.shape, space.shape) for t in ins]
    out_dims = aligned_dims(out.shape, space.shape) if opdef.family == "map" else opdef.result_dims(space.shape, attrs)
    inner = order[-1] if order else None
    # what follows the compute runs once per result tile: after the reduction loop, else with the compute
    place = {"after": reduction} if reduction else {"at": inner}

    body: list = []
    l1_ops = [load(body, t.name, dims, space, placement_of(dims, space, order), depth) for t, dims in zip(ins, in_dims)]
    body.append(Compute(len(body), opdef.compute_type, [tile_ref(t.name, "L1", d, space) for t, d in zip(ins, in_dims)],
                        tile_ref(out.name, "REGISTER" if ops[1:] else "L1", out_dims, space), at=inner,
                        accumulate=f"{reduction} > 0" if reduction else "false", depends_on=l1_ops))
    final, last, extra = epilogue(body, graph, ops[1:], out.name, "REGISTER", len(body) - 1, space, order, depth,
                                  place)
    final_dims = out_dims if final == out.name else aligned_dims(graph.tensors[final].shape, space.shape)
    store(body, final, final_dims, space, last, place)

    streams = [Stream(t.name, loops_of(d, space), t.size * itemsize(t.dtype)) for t, d in zip(ins, in_dims)] + extra
    final_t = graph.tensors[final]
    streams.append(Stream(final, loops_of(final_dims, space), final_t.size * itemsize(final_t.dtype)))
    return body, streams


def lower_vector_op(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """A map op (the space is its result) or a row reduction (the space is its first operand),
    with its epilogue."""
    op = ops[0]
    where = op.source or op.name
    space_shape, whole = _iteration_space(graph, ops)
    if 0 in space_shape:
        raise CompileError(f"{where}: {op.op_type} of shape {list(space_shape)} has an empty dimension; "
                           f"there is nothing to tile")
    space, depth = _choose(graph, ops, target)
    cut = _cut_axes(space, whole)
    if cut and op.op_type not in ACCUMULATING:
        # rows that balanced tiles cut and no pass takes apart (ARGMAX, CUMSUM): fewer tiles, as
        # large as the banks hold, keep them whole
        space, depth = _choose(graph, ops, target, balanced=False)
        cut = _cut_axes(space, whole)
    if len(cut) > 1 or (cut and op.op_type not in ACCUMULATING):
        raise CompileError(f"{where}: no tile of target '{target.name}' holds the rows of {op.op_type} over axes "
                           f"{list(whole)} of shape {list(space_shape)} whole, nor cuts them along one axis it can "
                           f"accumulate over; passes.split_long_rows takes such an op apart first")
    order, reduction = _loops(space, whole)
    trips = space.trips()
    parallel = parallel_loop(order[:-1] if reduction else order, trips, target.compute_tiles)
    body, streams = _body(graph, ops, space, depth)
    per_stream = traffic(streams, order, trips)
    work = epilogue_work(graph, ops)
    return Kernel(
        name=name, op=op.op_type, graph_op=op.name, dataflow="vector",
        tiling={**{f"T{j}": e for j, e in enumerate(space.extents)}, "num_tiles": math.prod(trips.values())},
        tile_loops=[TileLoop(v, 0, trips[v], parallel=v == parallel.loop) for v in order],
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints={"vector_elements": dict(sorted(work.items())),
               **dram_hints(per_stream, sum(s.bytes for s in streams), target, parallel.workers)},
        epilogue=[o.name for o in ops[1:]],
        inputs=kernel_reads(ops),
        outputs=list(ops[-1].outputs),
    )


def traffic(streams: list[Stream], order: tuple[str, ...], trips: dict[str, int],
            within: dict[str, str] | None = None) -> dict[str, int]:
    """Exact DRAM bytes per tensor (a tensor two operands read is two streams)."""
    out: dict[str, int] = {}
    for s in streams:
        out[s.name] = out.get(s.name, 0) + stream_traffic(s, order, trips, within)
    return out


def dram_hints(per_stream: dict[str, int], compulsory: int, target: Target, workers: int) -> dict:
    """The hints every kernel carries about external memory: its bytes in all and by stream, the
    bytes no program of its ops moves less than, and the target and compute tiles it is tiled for."""
    return {"estimated_dram_bytes": sum(per_stream.values()), "dram_bytes_per_stream": per_stream,
            "compulsory_dram_bytes": compulsory, "target": target.name, "compute_tiles": workers}


def kernel_reads(ops: list[Op]) -> list[str]:
    """The tensors a group reads from memory, in operand order: every operand that no op of the
    group makes."""
    made = {t for op in ops for t in op.outputs}
    return [t for op in ops for t in op.inputs if t not in made]
