"""Lower a layout op (RESHAPE, TRANSPOSE, CONCAT, SLICE, PAD, GATHER) to a kernel of data moves.

A layout op computes nothing, so its kernel has no COMPUTE. It walks the result in tiles, as a
map op's kernel does (`Space`: from the last dim backwards as much as fits, edge tiles partial,
double-buffered where that fits), and makes each tile with moves alone: DMA into L3 and DMA out.
The operand tile that feeds a result tile is a window on the operand (`TileRef.offset`) or one
entry of an index table (`TileRef.table`). A move copies the positions of its tile that lie
inside both its tensors, so a window reaching past its operand needs no case of its own, and a
move whose tile lies wholly outside its tensor moves nothing (the loader runs no task for it).

- RESHAPE: external memory holds every tensor dense and row-major, so the result's bytes are the
  operand's. The kernel is one VIEW move, EXTERNAL -> EXTERNAL: the loader makes the result name
  the operand's bytes, the simulator runs no task for it, and a later kernel reading the result
  waits for whatever wrote the operand. No bytes, no cycles. A TRANSPOSE that keeps the order of
  the dims longer than 1 is the same view. So is a SLICE, or a GATHER of consecutive indices
  known when compiling, whose result is one run of the operand's bytes (one element deep along
  every dim before the last it cuts, whole along every dim after): its VIEW names that run,
  the box at its start (`TileRef.offset`).
- TRANSPOSE: the operand's tile (the result tile's dims, permuted back) goes EXTERNAL -> L3; the
  BlockMover permutes it into the result's tile on its way L3 -> L2 (`permutation`); the result
  tile leaves L2 -> L3 -> EXTERNAL.
- SLICE: the operand's window at `start` goes EXTERNAL -> L3 as the result's tile, then out.
- PAD: the operand's window at minus the padding before goes EXTERNAL -> L3 as the result's
  tile; the DMA writes `pad_value` (the move's `fill`) where the window leaves the operand, so a
  tile wholly in the padding reads nothing. Then out.
- CONCAT: each operand's window at minus its position along the axis goes EXTERNAL -> L3 and
  from there into the result: a result tile across a boundary gets a part from each operand.
- GATHER: the result's tiles are one index deep along the axis, and along it the operand's tile
  is the entry for that step of the loop of the op's own `indices` attribute (`IndexTable`), or
  of its index operand, read from external memory at run time (`IndexTensor`): no list in the
  body, however many indices. It goes EXTERNAL -> L3 as the result's tile, then out. The index
  operand is no tile of the kernel: the DMA reads an entry with each row, and only the rows
  count as bytes moved.

Every operand element the result holds is read once and every result element written once, so
the exact DRAM count is the result's bytes plus the bytes its operands give it (0 for a view).
The moves do not convert: a layout op's result must have its operands' dtype.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dfx import DataMove, Graph, Kernel, Op, Tensor, TileLoop, TileRef, itemsize, lookup
from dfx.kernel import IndexTable, IndexTensor
from dfx.ops.base import normalize_axis
from dfx.ops.layout import gather_indices, keeps_order, one_run, transpose_perms

from .errors import CompileError
from .lower_vector import Space, SpaceBuffers, choose_space, dram_hints, tile_ref, traffic
from .requirements import ON_CHIP, Buffer, body_buffers, requirements
from .target import Target
from .tiling import Stream, parallel_loop


def lower_layout(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    op = ops[0]  # a layout op anchors no fusion group and joins none
    attrs = lookup(op.op_type).normalize_attrs(op.attrs)
    where = op.source or op.name
    ins = [graph.tensors[n] for n in op.inputs]
    out = graph.tensors[op.outputs[0]]
    for t in _moved(op, ins):
        if t.dtype != out.dtype:
            raise CompileError(f"{where}: {op.op_type} of '{t.name}' ({t.dtype}) into '{out.name}' ({out.dtype}): "
                               f"layout kernels move bytes and do not convert them")
    if op.op_type == "RESHAPE" or (op.op_type == "TRANSPOSE" and
                                   keeps_order(ins[0].shape, transpose_perms(len(ins[0].shape), attrs["perms"]))):
        return _view(op, name, ins[0], out, target)
    if out.size and (start := _run_start(op, attrs, ins[0], out)) is not None:
        return _view(op, name, ins[0], out, target, start)
    if 0 in out.shape:
        raise CompileError(f"{where}: {op.op_type} of shape {list(out.shape)} has an empty dimension; "
                           f"there is nothing to tile")
    if op.op_type == "PAD" and math.isnan(attrs["pad_value"]):
        raise CompileError(f"{where}: PAD value nan cannot be written to the object file (it writes +-inf, "
                           f"but has no NaN)")
    elem = itemsize(out.dtype)
    # tiles on chip at once: one per operand for CONCAT, the operand's and the result's for TRANSPOSE
    held = {"CONCAT": len(ins), "TRANSPOSE": 2}.get(op.op_type, 1)

    def bound(space: Space, depth: int) -> list[Buffer]:
        """What the tiles are sized by: each tile held at once, counted at every level. The body
        holds them at L3 (TRANSPOSE's result at L2 too), so this never falls short of its buffers.
        It over-counts on purpose: a layout kernel moves every byte once whatever its tiles, so
        larger ones gain it little, and tiles that fit an L1 bank too keep the object runnable on
        machines smaller than its target."""
        return [(level, math.prod(space.extents) * elem * depth) for level in ON_CHIP for _ in range(held)]

    space, depth = _space(op.op_type, out.shape, attrs, bound, elem, target, where)
    order = tuple(v for v in space.loops if v)
    trips = space.trips()
    parallel = parallel_loop(order, trips, target.compute_tiles)
    body = _body(op, ins, out, attrs, space, {"at": order[-1] if order else None}, depth if order else 1)
    # SLICE and GATHER read as many operand elements as the result holds; the others read all
    reads = [(t.name, (out.size if op.op_type in ("SLICE", "GATHER") else t.size) * elem) for t in _moved(op, ins)]
    streams = [Stream(n, order, b) for n, b in reads + [(out.name, out.size * elem)]]
    per_stream = traffic(streams, order, trips)
    return Kernel(
        name=name, op=op.op_type, graph_op=op.name,
        dataflow="moves",  # no unit computes: the kernel is data moves alone
        tiling={**{f"T{j}": e for j, e in enumerate(space.extents)}, "num_tiles": math.prod(trips.values())},
        tile_loops=[TileLoop(v, 0, trips[v], parallel=v == parallel.loop) for v in order],
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints=dram_hints(per_stream, sum(s.bytes for s in streams), target, parallel.workers),
        inputs=list(op.inputs),
        outputs=list(op.outputs),
    )


def _moved(op: Op, ins: list[Tensor]) -> list[Tensor]:
    """The operands whose elements the kernel moves: all but GATHER's index operand, which picks them."""
    return ins[:1] if op.op_type == "GATHER" else ins


def _run_start(op: Op, attrs: dict, x: Tensor, out: Tensor) -> list[int] | None:
    """Where in its operand a SLICE, or a GATHER of consecutive indices known when compiling,
    takes its result, where that is one run of the operand's bytes (`one_run`: the q, k and v
    a transformer picks from its stacked projection, the rows a shifted window slices off);
    else None."""
    if op.op_type == "SLICE":
        start = list(attrs["start"])
    elif op.op_type == "GATHER" and attrs["indices"] is not None:
        axis = normalize_axis(attrs["axis"], len(x.shape))
        picked = gather_indices([], attrs, x.shape[axis], axis).tolist()
        if picked != list(range(picked[0], picked[0] + len(picked))):
            return None
        start = [picked[0] if j == axis else 0 for j in range(len(x.shape))]
    else:
        return None
    return start if one_run(x.shape, start, list(out.shape)) else None


def _view(op: Op, name: str, x: Tensor, out: Tensor, target: Target, start: list[int] | None = None) -> Kernel:
    """A kernel naming the bytes of `x` (from `start`, a box of the result's extents) as `out`."""
    def whole(t: Tensor) -> TileRef:
        return TileRef(t.name, "EXTERNAL", ["0"] * len(t.shape), [max(d, 1) for d in t.shape])

    source = whole(x) if start is None else TileRef(x.name, "EXTERNAL", ["0"] * len(x.shape),
                                                    [max(d, 1) for d in out.shape], offset=start)
    body = [DataMove(0, "VIEW", source, whole(out))]
    return Kernel(
        name=name, op=op.op_type, graph_op=op.name, dataflow="moves", tiling={}, tile_loops=[], body=body,
        requirements=requirements([]),
        hints=dram_hints({}, 0, target, 1),
        inputs=list(op.inputs), outputs=list(op.outputs),
    )


def _space(op_type: str, shape: tuple[int, ...], attrs: dict, buffers: SpaceBuffers, elem: int, target: Target,
           where: str) -> tuple[Space, int]:
    """The result's tiles, sized by `buffers`; GATHER's are one index deep along its axis, a loop
    step per index."""
    if op_type != "GATHER":
        return choose_space(shape, (), buffers, elem, target, where)
    axis = normalize_axis(attrs["axis"], len(shape))
    space, depth = choose_space(shape[:axis] + (1,) + shape[axis + 1:], (), buffers, elem, target, where)
    loops = list(space.loops)
    loops[axis] = f"d{axis}" if shape[axis] > 1 else None
    return Space(shape, space.extents, tuple(loops)), depth


def _body(op: Op, ins: list[Tensor], out: Tensor, attrs: dict, space: Space, place: dict, depth: int) -> list:
    body: list[DataMove] = []

    def move(move_type: str, src: TileRef, dst: TileRef, after: list[int], **extra) -> list[int]:
        on_chip = dst.level != "EXTERNAL"
        body.append(DataMove(len(body), move_type, src, dst, depth=depth if on_chip else 1, depends_on=after,
                             **place, **extra))
        return [len(body) - 1]

    same = list(range(len(out.shape)))  # an operand's dims run along the result's, one to one

    def result(level: str) -> TileRef:
        return tile_ref(out.name, level, same, space)

    def window(t: Tensor, level: str, offset: list[int]) -> TileRef:
        return replace(tile_ref(t.name, level, same, space), offset=offset)

    x = ins[0]
    if op.op_type == "TRANSPOSE":
        perm = transpose_perms(len(out.shape), attrs["perms"])
        back = [perm.index(i) for i in range(len(perm))]  # operand dim i runs along result dim back[i]
        loaded = move("LOAD", tile_ref(x.name, "EXTERNAL", back, space), tile_ref(x.name, "L3", back, space), [])
        permuted = move("LOAD", tile_ref(x.name, "L3", back, space), result("L2"), loaded, permutation=perm)
        back_in_l3 = move("STORE", result("L2"), result("L3"), permuted)
        move("STORE", result("L3"), result("EXTERNAL"), back_in_l3)
    elif op.op_type == "CONCAT":
        axis = normalize_axis(attrs["axis"], len(out.shape))
        position = 0
        for t in ins:
            offset = [-position if j == axis else 0 for j in same]
            loaded = move("LOAD", window(t, "EXTERNAL", offset), window(t, "L3", offset), [])
            move("STORE", window(t, "L3", offset), result("EXTERNAL"), loaded)
            position += t.shape[axis]
    else:  # the operand's tile lands in L3 as the result's
        fill = None
        if op.op_type == "SLICE":
            src = window(x, "EXTERNAL", attrs["start"])
        elif op.op_type == "PAD":
            src = window(x, "EXTERNAL", [-before for before, _ in attrs["padding"]])
            fill = attrs[lookup(op.op_type).fill_attr]
        else:  # GATHER: along the axis, the tile is the index table's entry for the loop's step
            table, axis_attr = lookup(op.op_type).index_table
            axis = normalize_axis(attrs[axis_attr], len(out.shape))
            index = IndexTable(axis, op.name, table) if attrs[table] is not None else IndexTensor(axis, ins[1].name)
            src = replace(tile_ref(x.name, "EXTERNAL", same, space), table=index)
        loaded = move("LOAD", src, result("L3"), [], fill=fill)
        move("STORE", result("L3"), result("EXTERNAL"), loaded)
    return body
