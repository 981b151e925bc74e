"""DFX kernel IR: tile loops plus the loop body as op templates, never unrolled.

Placement rule: an op runs at the loop depth where its tile index changes. `at="tk"` runs it
once per iteration of loop `tk` (before any deeper loop); `after="tk"` runs it once when loop
`tk` has finished, inside the loop enclosing `tk`; `at=None` runs it once before all loops.
Ops at the same place run in body order. A `TileRef`'s `tile_indices` name, per tensor
dimension, the loop variable that indexes it ("0" for a dimension taken whole).

A data move copies the positions of its tile that lie inside both its source and its
destination tensor: tile i along a dimension starts at element `offset + i * extent`, and an edge
tile, or a window (`offset`) reaching past its tensor, holds only the part inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator


def condition(expr: str) -> tuple[str, int]:
    """A condition "<loop> > <int>" (a compute's `accumulate`, a move's `when`) as (loop, int)."""
    var, _, bound = expr.partition(">")
    return var.strip(), int(bound.strip() or 0)


@dataclass
class TileLoop:
    induction_var: str
    start: int
    end: int
    step: int = 1
    parallel: bool = False  # iterations are divided over the compute tiles
    # a loop over the tiles of a block: in iteration b of loop `within` (an enclosing loop over
    # blocks) it runs its steps b * per_block up to (b + 1) * per_block, below `end`. Its tile
    # indices stay global, so a tile ref indexed by it names the same tiles as without blocks
    within: str | None = None
    per_block: int | None = None

    @property
    def trip_count(self) -> int:
        """Steps over the whole kernel (a loop within blocks: over all of them)."""
        return max(0, -(-(self.end - self.start) // self.step))

    def steps(self, env: dict[str, int]) -> range:
        """Its steps where the enclosing loops have the values `env`."""
        if self.within is None:
            return range(self.start, self.end, self.step)
        first = env[self.within] * self.per_block
        return range(first, min(self.end, first + self.per_block))


@dataclass
class IndexTable:
    """Along `dim`, tile i is the single element `values[i]` of the tensor (negative counts from
    the end), `values` being the integer list attribute `attr` of graph op `op`: GATHER's
    constant indices, read where they already are."""

    dim: int
    op: str
    attr: str


@dataclass
class IndexTensor:
    """Along `dim`, tile i is the single element `indices[i]` of the tensor (negative counts from
    the end), `indices` being the 1-D integer tensor `tensor` in external memory, read at run
    time: GATHER's indices as an operand. Which rows they pick changes no byte count."""

    dim: int
    tensor: str


@dataclass
class TileRef:
    tensor: str
    level: str  # EXTERNAL | L3 | L2 | L1 | REGISTER
    tile_indices: list[str]
    tile_shape: list[int]
    # per dim, the element where tile 0 starts (None: all 0). With it the tiles are a window on
    # the tensor, which they need not cover: inside it (SLICE's start) or around it (CONCAT's
    # operand at minus its position, PAD's operand at minus its padding before)
    offset: list[int] | None = None
    table: IndexTable | IndexTensor | None = None  # one dim through a table: a move's source in external memory
    # per dim, the distance between the starts of consecutive tiles (None: their extents). Tiles
    # closer than their extent overlap: the input rows of a sliding window, each band with its halo
    step: list[int] | None = None
    # per dim, [before, after]: an on-chip tile holds its part of the tensor padded so, the
    # padding written by the fill of the move that makes it (a convolution's zero border, which
    # external memory never holds)
    padding: list[list[int]] | None = None

    @property
    def windowed(self) -> bool:
        """Whether its tiles are a window on the tensor rather than its plain grid of tiles."""
        return self.offset is not None or self.step is not None or self.padding is not None


@dataclass
class DataMove:
    op_id: int
    # LOAD | STORE | PREFETCH | FLUSH, or VIEW: EXTERNAL -> EXTERNAL, the destination tensor names
    # the source's bytes (external memory holds every tensor dense, row-major); nothing moves
    move_type: str
    source: TileRef
    destination: TileRef
    at: str | None = None
    after: str | None = None
    # "<loop> > <int>": it runs only at the steps of that loop where this holds, where it runs at
    # all. A K split's moves of partial sums: into the accumulators before every K block but the
    # first (reading what the drain of the block before left on chip), out of the chip after the
    # last block alone
    when: str | None = None
    depth: int = 1  # buffers of this stream at the destination level (2 = double buffering)
    # the destination holds the same region of the same tensor, its last two axes swapped in the
    # buffer (MATMUL's B given transposed)
    transpose: bool = False
    broadcast: bool = False
    # the destination is a tile of a tensor whose dims are the source's permuted (TRANSPOSE's
    # result): destination tile dim j is source tile dim permutation[j]. Of the same tensor, the
    # same region held with its dims so permuted in the buffer (a convolution's weights given in
    # another order, held as the array takes them). The BlockMover's, L3 -> L2
    permutation: list[int] | None = None
    # written to the positions of an on-chip destination tile that the source does not cover
    # (PAD's value where the window leaves the operand); costs no external-memory bytes
    fill: int | float | None = None
    depends_on: list[int] = field(default_factory=list)
    type: str = "DATA_MOVE"

    def external_reads(self) -> list[str]:
        """The tensors it reads in external memory: its source's, and the index tensor that
        source is read through."""
        if self.source.level != "EXTERNAL":
            return []
        table = self.source.table
        return [self.source.tensor, *([table.tensor] if isinstance(table, IndexTensor) else [])]

    def l2_port(self) -> int | None:
        """The L2 buffer whose bank's port it holds while it runs: the one it fills, or the one
        it drains (filled by the move it depends on); None where it touches no L2 buffer."""
        if self.destination.level == "L2":
            return self.op_id
        if self.source.level == "L2" and self.depends_on:
            return self.depends_on[0]
        return None


@dataclass
class Compute:
    op_id: int
    compute_type: str
    inputs: list[TileRef]
    output: TileRef
    at: str | None = None
    after: str | None = None
    accumulate: str = "false"  # expression over loop variables, e.g. "tk > 0"
    depends_on: list[int] = field(default_factory=list)
    # buffers of its result, as a move's: 2 lets the next result tile be computed while this
    # one drains or is stored (the array's accumulators, an epilogue's result in L2 or L1); left
    # out of the object at 1, so an object without deeper results reads as it did before them
    depth: int = field(default=1, metadata={"omit_default": True})
    type: str = "COMPUTE"


@dataclass
class Barrier:
    """Waits until the last instance of each `wait_for` op has finished on every compute tile:
    ops of kernel `kernel` (an earlier kernel, whose results this one reads), or of this kernel
    when it is None. The ops that depend on the barrier start after it."""

    op_id: int
    wait_for: list[int]
    kernel: str | None = None
    at: str | None = None
    after: str | None = None
    depends_on: list[int] = field(default_factory=list)
    type: str = "BARRIER"


BodyOp = DataMove | Compute | Barrier


def tile_refs(op: BodyOp) -> list[TileRef]:
    """The tiles an op reads, then the one it writes (none for a barrier)."""
    if isinstance(op, DataMove):
        return [op.source, op.destination]
    if isinstance(op, Compute):
        return [*op.inputs, op.output]
    return []


@dataclass
class Kernel:
    name: str
    op: str  # the registry op it computes
    graph_op: str  # the graph op it came from
    dataflow: str
    tiling: dict[str, int]
    tile_loops: list[TileLoop]
    body: list[BodyOp]
    requirements: dict[str, Any]
    hints: dict[str, Any]
    # graph ops fused after `graph_op`, in order: map ops applied to its result tile on chip, whose
    # intermediates never leave the compute tile
    epilogue: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # graph tensors the kernel reads, operand order
    outputs: list[str] = field(default_factory=list)  # graph tensors it writes (the last op's results)
    # kernels whose results it reads; informational: the BARRIERs in its body are what orders it
    depends_on: list[str] = field(default_factory=list)

    def shared_moves(self) -> set[int]:
        """The loads into L3 placed outside the parallel loop: L3 is shared by the compute tiles,
        and outside that loop every tile wants the same tile there, so one copy serves them all.
        Any other op runs on each compute tile, into buffers of its own."""
        order = [l.induction_var for l in self.tile_loops]
        parallel = next((i for i, l in enumerate(self.tile_loops) if l.parallel), None)
        if parallel is None:
            return set()
        out = set()
        for op in self.body:
            if isinstance(op, DataMove) and op.destination.level == "L3" and op.source.level == "EXTERNAL":
                anchor = op.after or op.at
                if anchor is None or order.index(anchor) < parallel:
                    out.add(op.op_id)
        return out

    def runs(self, op: BodyOp) -> int:
        """How many times a body op runs in one walk of the kernel's loop nest: once per step of
        the loops enclosing its place (`at` inside that loop, `after` outside). An op outside the
        parallel loop runs this often on each compute tile (but a shared load once)."""
        anchor, after = op.after or op.at, op.after is not None
        live = []
        for loop in self.tile_loops:
            if anchor is None or (after and loop.induction_var == anchor):
                break
            live.append(loop)
            if loop.induction_var == anchor:
                break
        # a loop within blocks counts its steps over all of them: its loop over blocks adds none
        blocks = {loop.within for loop in live}
        return math.prod(loop.trip_count for loop in live if loop.induction_var not in blocks)

    def in_parallel_loop(self, op: BodyOp) -> bool:
        """Whether a body op sits inside the parallel loop, its runs dealt to the compute tiles
        (outside it, each compute tile makes every one of them)."""
        parallel = next((d for d, l in enumerate(self.tile_loops) if l.parallel), None)
        anchor = op.at or op.after
        if parallel is None or anchor is None:
            return False
        return [l.induction_var for l in self.tile_loops].index(anchor) + (op.at is not None) > parallel

    def band_loop(self, tensor: str | None = None, dim: int | None = None) -> TileLoop | None:
        """The loop a kernel of a chain steps its links by, band after band (bands of rows, or of
        channels): its outermost loop of more than one trip; for a link `tensor` it reads (not
        one it writes) along `dim`, the next such loop where that one is a parallel loop
        indexing `dim` of no tile of `tensor` at its home. Each compute tile then goes through
        every band of it once per step of the parallel loop it takes: a 1x1 convolution reading
        its input by chunks of channels, its tiles of output channels or of rows dealt to the
        compute tiles, the arrays working at once."""
        loops = [l for l in self.tile_loops if l.trip_count > 1]
        if tensor is not None and tensor not in self.outputs and len(loops) > 1 and loops[0].parallel and all(
                ref.tile_indices[dim] != loops[0].induction_var for _, ref in self._at_home(tensor)):
            return loops[1]
        return loops[0] if loops else None

    def band_passes(self, tensor: str, dim: int, workers: int) -> int:
        """How often each of `workers` compute tiles goes through the bands of a link `tensor` it
        reads along `dim`: once per step it takes of a parallel loop outside its band loop."""
        outer = self.band_loop()
        return 1 if outer == self.band_loop(tensor, dim) else -(-outer.trip_count // workers)

    def _at_home(self, tensor: str) -> Iterator[tuple[DataMove, TileRef]]:
        """The moves (and their ends) of `tensor` at its home: its EXTERNAL side or a plain L3 tile."""
        for op in self.body:
            if not isinstance(op, DataMove) or op.move_type == "VIEW":
                continue
            for ref in (op.source, op.destination):
                if ref.tensor == tensor and (ref.level == "EXTERNAL" or (ref.level == "L3" and ref.padding is None)):
                    yield op, ref

    def band_dim(self, tensor: str) -> int | None:
        """The dim of `tensor`, a result, that `band_loop` (its outermost loop of more than one trip)
        steps at its home (the first such move's): 1, rows, or the last, channels, for a chain's
        link; None where no move there indexes it so."""
        band = self.band_loop()
        return next((ref.tile_indices.index(band.induction_var) for _, ref in self._at_home(tensor)
                     if band is not None and band.induction_var in ref.tile_indices), None)

    def off_band(self, tensor: str, dim: int) -> tuple[DataMove, TileRef] | None:
        """The first move (and its end) of `tensor` at its home that indexes `dim` by another loop
        than its `band_loop` of them (None: there is none)."""
        band = self.band_loop(tensor, dim)
        return next(((op, ref) for op, ref in self._at_home(tensor)
                     if ref.tile_indices[dim] != (band.induction_var if band else None)), None)

    def carried_reads(self) -> dict[int, int]:
        """The moves that read what a later op of the body wrote on an earlier step of their
        `when` loop (a K split's reload of partial sums) -> that op, the first they depend on."""
        position = {op.op_id: i for i, op in enumerate(self.body)}
        return {op.op_id: op.depends_on[0] for i, op in enumerate(self.body)
                if isinstance(op, DataMove) and op.when is not None and op.depends_on
                and position.get(op.depends_on[0], -1) > i}

    def body_op(self, op_id: int) -> BodyOp:
        for o in self.body:
            if o.op_id == op_id:
                return o
        raise KeyError(op_id)
