"""Functional execution: every tile op of the schedule computed in numpy.

Each (tensor, level) holds the tile last moved there, so a schedule that loads the wrong
tile, or forgets one, computes wrong numbers and `--check` catches it. But a ring of partial
sums (a K split's): a move that reads back what a later op wrote on an earlier step of a loop
finds its tile among the last `depth` that op wrote, or the run stops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from dfx import (REGISTRY, Compute, DataMove, Kernel, OpDef, Program, TileRef, accumulation_dtype, convert, lookup,
                 numpy_dtype)
from dfx.kernel import IndexTensor

from .schedule import accumulating, expand, move_slices, region_elements, table_values, tile_slices, viewed


PROGRESS_EVERY = 4096  # tile ops between progress callbacks


class ExecutionError(ValueError):
    """A tile op that cannot execute; str(e) is one line naming the kernel and op."""


def run_kernel(kernel: Kernel, program: Program, memory: dict[str, np.ndarray], workers: int,
               progress: Callable[[int], None] | None = None, done: int = 0) -> int:
    """Execute `kernel`, reading its inputs from and writing its outputs to `memory`
    (external memory: tensor name -> whole array). Tile ops are counted on from `done`, with
    `progress(count)` every PROGRESS_EVERY of them; returns the count."""
    g = program.graph
    for name in kernel.outputs:
        t = g.tensors[name]
        memory[name] = np.zeros(t.shape, numpy_dtype(t.dtype))
    computes = compute_ops(kernel, g)
    accs = accumulation_dtypes(kernel, g)
    # (worker, tensor, level) -> the tile held there; a shared move's tile is worker 0's
    tiles: dict[tuple[int, str, str], np.ndarray] = {}
    # the region of its tensor each tile a move made holds: a panel, whose tiles later moves read
    regions: dict[tuple[int, str, str], tuple[slice, ...]] = {}
    shared_moves = kernel.shared_moves()
    shared = {(op.destination.tensor, op.destination.level) for op in kernel.body if op.op_id in shared_moves}
    tables = {op.op_id: _table(op, kernel, program, memory) for op in kernel.body
              if isinstance(op, DataMove) and op.source.table is not None}
    rings = Rings(kernel)
    for worker, op, env in expand(kernel, workers):
        done += 1
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done)
        try:
            _run_op(op, env, worker, tiles, regions, memory, g, accs, computes, shared, tables.get(op.op_id), rings)
        except KeyError as e:  # a well-formed object whose ops do not fit together
            key = e.args[0]  # (worker, tensor, level) of a tile, or a tensor in external memory
            what = f"{key[1]} at {key[2]}" if isinstance(key, tuple) else f"{key} at EXTERNAL"
            raise ExecutionError(f"kernel '{kernel.name}' op {op.op_id}: reads {what}, "
                                 f"which no earlier op filled") from None
        except ValueError as e:
            raise ExecutionError(f"kernel '{kernel.name}' op {op.op_id}: {str(e).splitlines()[0]}") from None
    return done


def _table(op: DataMove, kernel: Kernel, program: Program, memory: dict[str, np.ndarray]) -> Sequence[int]:
    """The entries of the index table a move's source is read through: the graph op's list, or
    the index tensor as it now is in external memory, every entry checked once against the dim
    it picks along (negative ones count from its end)."""
    table = op.source.table
    if not isinstance(table, IndexTensor):
        return table_values(op.source, program.graph)
    entries = memory[table.tensor].reshape(-1)
    size = program.graph.tensors[op.source.tensor].shape[table.dim]
    outside = (entries < -size) | (entries >= size)
    if outside.any():
        at = int(np.argmax(outside))
        name = viewed(table.tensor, program)
        position = [int(i) for i in np.unravel_index(at, program.graph.tensors[name].shape)]
        raise ExecutionError(f"kernel '{kernel.name}' op {op.op_id}: index {entries[at]} at {position} of '{name}' "
                             f"is out of range for dim {table.dim} of '{op.source.tensor}' (size {size}: "
                             f"{-size} to {size - 1})")
    return entries


class Rings:
    """The rings of partial sums a kernel keeps on chip: each (worker, tensor, level) a move that
    `Kernel.carried_reads` reads back holds the last `depth` tiles its writer put there."""

    def __init__(self, kernel: Kernel):
        carried = kernel.carried_reads()
        self.readers = set(carried)
        self.depth = {}
        for writer in carried.values():
            made = kernel.body_op(writer).destination
            self.depth[made.tensor, made.level] = kernel.body_op(writer).depth
        self.held: dict[tuple[int, str, str], deque] = {}  # (worker, tensor, level) -> (region, tile)s

    def keep(self, worker: int, ref: TileRef, region: tuple[slice, ...], tile: np.ndarray) -> None:
        depth = self.depth.get((ref.tensor, ref.level))
        if depth is not None:
            self.held.setdefault((worker, ref.tensor, ref.level), deque(maxlen=depth)).append((region, tile))

    def read(self, worker: int, ref: TileRef, region: tuple[slice, ...]) -> np.ndarray:
        for held, tile in reversed(self.held.get((worker, ref.tensor, ref.level), ())):  # the newest of the tile
            if held == region:
                return tile
        raise ValueError(f"reads the partial sums of {ref.tensor} at {ref.level} for its tile at "
                         f"{[s.start for s in region]}, which the ring there no longer holds")


def _run_op(op, env: dict, worker: int, tiles: dict, regions: dict, memory: dict[str, np.ndarray], g,
            accs: dict[int, np.dtype], computes: dict, shared: set[tuple[str, str]],
            table: Sequence[int] | None, rings: Rings) -> None:
    if isinstance(op, DataMove):
        _move(op, env, worker, tiles, regions, memory, g, shared, table, rings)
    elif isinstance(op, Compute):
        regions.pop((worker, op.output.tensor, op.output.level), None)
        _compute(op, env, worker, tiles, accs[op.op_id], computes[op.op_id])


def _move(op: DataMove, env: dict, worker: int, tiles: dict, regions: dict, memory: dict[str, np.ndarray], g,
          shared: set[tuple[str, str]], table: Sequence[int] | None, rings: Rings) -> None:
    """Copy the positions of the tile inside both tensors (kernel.py), the source's read through
    `table` where it has one. An on-chip tile is held whole: what the source does not cover
    there is the move's fill."""
    src, dst = op.source, op.destination
    if op.move_type == "VIEW":  # the destination names the source's bytes (from its offset: one run of them)
        named = memory[src.tensor]
        if src.offset is not None:
            named = named[tuple(slice(o, o + e) for o, e in zip(src.offset, src.tile_shape))]
        memory[dst.tensor] = named.reshape(g.tensors[dst.tensor].shape)
        return
    src_shape, dst_shape = g.tensors[src.tensor].shape, g.tensors[dst.tensor].shape
    src_part, dst_part = move_slices(op, src_shape, dst_shape, env, table)
    if src.level == "EXTERNAL":
        tile = memory[src.tensor][src_part]
    elif op.op_id in rings.readers:  # a tile a later op wrote on an earlier step, in its ring
        tile = rings.read(worker, src, tile_slices(src, src_shape, env))
    else:
        key = (0 if (src.tensor, src.level) in shared else worker, src.tensor, src.level)
        tile = tiles[key]
        held = regions.get(key) or tile_slices(src, src_shape, env)
        if src_part != held:  # a whole tile passes as held: a transposed one keeps its layout
            tile = tile[_within(src_part, held)]
    if op.permutation is not None:
        tile = np.transpose(tile, op.permutation)
    dtype = g.tensors[dst.tensor].dtype
    if dst.level == "EXTERNAL":
        memory[dst.tensor][dst_part] = convert(tile, dtype)
        return
    whole = tile_slices(dst, dst_shape, env)
    if region_elements(dst_part) < region_elements(whole):  # the part lies inside the whole tile
        if op.fill is None:
            raise ValueError(f"covers part of its tile of {dst.tensor} at {dst.level} and has no fill for the rest")
        full = np.full([s.stop - s.start for s in whole], convert(np.asarray(op.fill), dtype), tile.dtype)
        full[_within(dst_part, whole)] = tile
        tile = full
    tiles[worker, dst.tensor, dst.level] = np.swapaxes(tile, -1, -2) if op.transpose else tile
    regions[worker, dst.tensor, dst.level] = whole
    rings.keep(worker, dst, whole, tiles[worker, dst.tensor, dst.level])


def _within(part: tuple[slice, ...], region: tuple[slice, ...]) -> tuple[slice, ...]:
    """`part` of a tensor as slices of the array holding `region` of it."""
    return tuple(slice(p.start - r.start, p.stop - r.start) for p, r in zip(part, region))


# the tile computes this loader executes and times: those of registry ops that say what a tile
# does and what it costs, on the array or on the vector unit
COMPUTES = {op.compute_type: op for op in REGISTRY.values()
            if op.tile is not None and (op.tile_mnk is not None or op.vector_work is not None)}


def compute_ops(kernel: Kernel, g) -> dict[int, tuple[OpDef, dict]]:
    """Each COMPUTE of the kernel -> the registry op it runs and the attributes of the graph op
    whose result it makes (a fused kernel runs several graph ops), defaults filled."""
    producer = {t: op for op in g.ops for t in op.outputs}
    out = {}
    for op in kernel.body:
        if isinstance(op, Compute):
            source = producer[op.output.tensor]
            out[op.op_id] = (COMPUTES[op.compute_type], COMPUTES[op.compute_type].normalize_attrs(source.attrs))
    return out


def accumulation_dtypes(kernel: Kernel, g) -> dict[int, np.dtype]:
    """Each COMPUTE of the kernel -> its accumulation dtype: that of the graph op whose result it
    makes, from that op's own operands and results. Not the kernel's: an i8 x i8 -> i32 product
    on the array sums in i32 whatever float its epilogue goes on in, and each epilogue op
    computes as its own reference does."""
    producer = {t: op for op in g.ops for t in op.outputs}
    out = {}
    for op in kernel.body:
        if isinstance(op, Compute):
            source = producer[op.output.tensor]
            dtypes = [g.tensors[n].dtype for n in source.inputs + source.outputs]
            out[op.op_id] = numpy_dtype(accumulation_dtype(dtypes))
    return out


def _compute(op: Compute, env: dict, worker: int, tiles: dict, acc: np.dtype, compute: tuple[OpDef, dict]) -> None:
    key = (worker, op.output.tensor, op.output.level)
    partial = tiles[key] if accumulating(op, env) else None
    opdef, attrs = compute
    tiles[key] = opdef.tile([tiles[worker, r.tensor, r.level] for r in op.inputs], partial, acc, attrs)


def reference_op(op, values: dict[str, np.ndarray], g) -> list[np.ndarray]:
    """The registry's numpy reference of graph op `op` on the values its inputs have in `values`."""
    opdef = lookup(op.op_type)
    return opdef.reference([values[n] for n in op.inputs], opdef.normalize_attrs(op.attrs),
                           [g.tensors[n].dtype for n in op.outputs])
