"""Matmul tile optimizer and the exact DRAM-traffic count of a tile loop order.

Start: the analytical formula of Goto & van de Geijn as upstream kpu-sim states it, for one
L2 bank. Then a bounded search over multiples of the array size picks the tiles whose exact
DRAM traffic (counted over the chosen loop order, not estimated by dividing by reuse) is least,
subject to every buffer (tile x buffering depth) fitting the target's banks at L3, L2 and L1.

That is the `latency` objective. The others (`Target.objective`: `energy`, `edp`) rank every
tiling that fits by what the loader's models say it costs (`estimate`): pJ by `hardware.energy`
from the bytes each pair of levels moves, and cycles by the array's model against each link's rate.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from hardware import matmul_cycles

from .requirements import Buffer, fits
from .target import Costs, Target

P = TypeVar("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Stream:
    """One operand's tiles as the loop nest visits them."""

    name: str  # the operand ("A", "B", "Cin", "C"; "x", "w", "y" of a band tiling), or its tensor
    loop_vars: tuple[str, ...]  # the loops its tile index depends on
    bytes: int  # the whole tensor
    # a loop on whose last step alone it moves, so that loop repeats none of it: the result of a
    # K split, stored once its last K block has added up (`KSplit`)
    final_over: str | None = None


@dataclass(frozen=True)
class KSplit:
    """K advancing in blocks outside the result tiles, loops bi, bj, kb, ti, tj, tk: A's block of
    `rows` row tiles and B's block of `cols` column tiles, one K block of `depth` K tiles deep
    each, stay in L3 while every result tile of the panel they make takes that K block. A result
    tile's partial sums drain from the accumulators after each K block and wait at `level` (L2 or
    L3), in a ring of `ring` tiles (those one compute tile makes per K block), until the array
    reloads them for the next; the result leaves the chip after the last."""

    rows: int
    cols: int
    depth: int
    level: str
    ring: int


@dataclass(frozen=True)
class MatmulTiling:
    Ti: int
    Tj: int
    Tk: int
    L1_Ki: int  # K depth of the A and B slices the streamers keep in L1: the whole Tk here
    loop_order: tuple[str, ...]  # outermost first, trip-1 loops dropped
    parallel: Parallel
    # the operand whose panel (a block of its tiles, all of K) stays in L3 while the other streams
    # past it in panels of one tile (all of K): "A" (loops bi, tj, ti, tk), "B" (bj, ti, tj, tk),
    # or None (ti, tj, tk or tj, ti, tk: every L3 tile is an L2 tile)
    resident: str | None = None
    per_block: int = 1  # the resident panel's tiles
    panel_depth: int = 1  # buffers of the resident panel in L3 (2: the next loads while this is read)
    # the streamed operand comes in its L2 tiles (Tk deep), not panels of all of K: beside a
    # resident operand whole in one tile, whose panel leaves too little room for the other's
    # panels; the other passes it once either way
    streamed_tiles: bool = False
    split: KSplit | None = None  # K in blocks, the partial sums on chip between them

    def whole_k(self, operand: str) -> bool:
        """Whether the operand's L3 tile holds all of K (a panel)."""
        return self.resident is not None and (operand == self.resident or not self.streamed_tiles)

    @property
    def within(self) -> dict[str, str]:
        """The loop over tiles in each block -> its loop over blocks (those that run)."""
        return {loop: BLOCK_LOOPS[loop] for loop in self.blocks}

    @property
    def blocks(self) -> dict[str, int]:
        """The loops over tiles in blocks whose loop over blocks runs -> their tiles per block."""
        if self.split is not None:
            sizes = {"ti": self.split.rows, "tj": self.split.cols, "tk": self.split.depth}
        else:
            sizes = {{"A": "ti", "B": "tj"}[self.resident]: self.per_block} if self.resident else {}
        return {loop: n for loop, n in sizes.items() if BLOCK_LOOPS[loop] in self.loop_order}


BLOCK_LOOPS = {"ti": "bi", "tj": "bj", "tk": "kb"}  # a loop over tiles -> its loop over blocks


def placement(stream: Stream, loop_order: tuple[str, ...]) -> int:
    """Index in `loop_order` of the loop the stream's op sits at (-1: before all loops).

    A tile is (re)loaded whenever a loop it is indexed by advances, so it sits at the
    innermost such loop."""
    depth = -1
    for i, var in enumerate(loop_order):
        if var in stream.loop_vars:
            depth = i
    return depth


@dataclass(frozen=True)
class Parallel:
    """The loop whose iterations are dealt to `workers` compute tiles (None: one tile)."""

    loop: str | None
    workers: int


def parallel_loop(loop_order: tuple[str, ...], trips: dict[str, int], compute_tiles: int) -> Parallel:
    """Work divides along the result's loop with most iterations (the outermost of equals)."""
    c_loops = [v for v in loop_order if v != "tk"]
    if not c_loops:
        return Parallel(None, 1)
    loop = max(c_loops, key=lambda v: trips[v])
    return Parallel(loop, max(1, min(compute_tiles, trips[loop])))


def stream_traffic(stream: Stream, loop_order: tuple[str, ...], trips: dict[str, int],
                   within: dict[str, str] | None = None) -> int:
    """Exact bytes a stream moves: the whole tensor once per iteration of every loop at or
    outside its placement that does not index it (each such iteration reloads all tiles). A loop
    within blocks counts its steps over all blocks, so its loop over blocks (`within`: tile loop
    -> block loop) adds nothing when both run there. A load outside the parallel loop is shared by
    the compute tiles (`Kernel.shared_moves`) and a result is indexed by the parallel loop, so
    no stream moves more for running on several tiles."""
    live = loop_order[: placement(stream, loop_order) + 1]
    blocks = {(within or {}).get(v) for v in live}
    repeats = 1
    for var in live:
        if var not in stream.loop_vars and var not in blocks and var != stream.final_over:
            repeats *= trips[var]
    return stream.bytes * repeats


def stream_moves(stream: Stream, loop_order: tuple[str, ...], trips: dict[str, int],
                 within: dict[str, str] | None = None) -> int:
    """The moves a stream makes: all its tiles (one per value of the loops indexing it) each time
    it moves its tensor."""
    if not stream.bytes:
        return 0
    sweeps = stream_traffic(stream, loop_order, trips, within) // stream.bytes
    return sweeps * math.prod(trips[v] for v in stream.loop_vars)


def dram_traffic(streams: list[Stream], loop_order: tuple[str, ...], trips: dict[str, int],
                 within: dict[str, str] | None = None) -> int:
    return sum(stream_traffic(s, loop_order, trips, within) for s in streams)


def _round_down(x: float, s: int) -> int:
    return int(x // s) * s


def analytical_tiles(M: int, N: int, K: int, elem: int, bank_bytes: int, s: int) -> tuple[int, int, int]:
    """Upstream's ANALYTICAL strategy for one L2 bank of `bank_bytes` (C included)."""
    C = bank_bytes // elem
    Ti = max(s, _round_down(min(M, math.sqrt(C * M / (2 * K + M))), s))
    Tj = max(s, _round_down(min(N, math.sqrt(C * N / (2 * K + N))), s))
    Tk = max(s, _round_down(min(K, (C - Ti * Tj) / (Ti + Tj)), s))
    while (Ti * Tk + Tk * Tj + Ti * Tj) * elem > bank_bytes:
        if Tk > s:
            Tk -= s
        elif Tj > s:
            Tj -= s
        elif Ti > s:
            Ti -= s
        else:
            break
    return Ti, Tj, Tk


def _candidates(dim: int, s: int) -> list[int]:
    """Tile edges worth trying: powers-of-two multiples of s and even splits of the dim."""
    top = max(s, math.ceil(dim / s) * s)
    out = {min(dim, top)}
    t = s
    while t < top:
        out.add(t)
        t *= 2
    for parts in range(1, 17):
        out.add(min(top, math.ceil(dim / parts / s) * s))
    return sorted({min(c, dim) for c in out})


@dataclass(frozen=True)
class MatmulProblem:
    M: int
    N: int
    K: int
    batch: tuple[str, ...]  # batch loop variables, outermost first
    batch_trips: tuple[int, ...]
    a_batch: tuple[str, ...]  # batch loops A / B / Cin are indexed by
    b_batch: tuple[str, ...]
    cin_batch: tuple[str, ...] | None  # None: no accumulator input
    cin_rows: bool  # Cin varies along M (else broadcast over rows)
    cin_cols: bool
    elem_a: int
    elem_b: int
    elem_cin: int
    elem_c: int
    elem_acc: int  # partial sums as the array keeps them
    depth: int  # buffering depth for loads
    # a fused epilogue's operands, as (bytes per element, varies along M, along N); None: no epilogue
    epilogue: tuple[tuple[int, bool, bool], ...] | None = None
    dtype: str = "f32"  # A's, which prices a MAC (`hardware.energy`)


def streams(p: MatmulProblem, t: MatmulTiling) -> list[Stream]:
    """Each operand's and the result's stream through external memory: its L3 tile's loops."""
    batch_size = math.prod(p.batch_trips)
    a_b = math.prod(t for v, t in zip(p.batch, p.batch_trips) if v in p.a_batch)
    b_b = math.prod(t for v, t in zip(p.batch, p.batch_trips) if v in p.b_batch)
    # a resident operand's L3 tiles are indexed by its blocks, and a panel's by no K tile; with K
    # split, both are blocks of tiles one K block deep
    if t.split is not None:
        a_loops, b_loops = ("bi", "kb"), ("bj", "kb")
    else:
        a_loops = ("bi" if t.resident == "A" else "ti", *(() if t.whole_k("A") else ("tk",)))
        b_loops = ("bj" if t.resident == "B" else "tj", *(() if t.whole_k("B") else ("tk",)))
    out = [
        Stream("A", (*p.a_batch, *a_loops), a_b * p.M * p.K * p.elem_a),
        Stream("B", (*p.b_batch, *b_loops), b_b * p.K * p.N * p.elem_b),
    ]
    if p.cin_batch is not None:
        c_b = math.prod(t for v, t in zip(p.batch, p.batch_trips) if v in p.cin_batch)
        rows = p.M if p.cin_rows else 1
        cols = p.N if p.cin_cols else 1
        out.append(Stream("Cin", (*p.cin_batch, *(["ti"] if p.cin_rows else []), *(["tj"] if p.cin_cols else [])),
                          c_b * rows * cols * p.elem_cin))
    out.append(Stream("C", (*p.batch, "ti", "tj"), batch_size * p.M * p.N * p.elem_c,
                      final_over="kb" if t.split is not None else None))
    return out


def trips_of(p: MatmulProblem, Ti: int, Tj: int, Tk: int, per_block: int = 1,
             split: KSplit | None = None) -> dict[str, int]:
    trips = dict(zip(p.batch, p.batch_trips))
    trips.update(ti=math.ceil(p.M / Ti), tj=math.ceil(p.N / Tj), tk=math.ceil(p.K / Tk))
    rows, cols, depth = (split.rows, split.cols, split.depth) if split is not None else (per_block, per_block, 1)
    trips.update(bi=math.ceil(trips["ti"] / rows), bj=math.ceil(trips["tj"] / cols), kb=math.ceil(trips["tk"] / depth))
    return trips


def tiling_trips(p: MatmulProblem, t: MatmulTiling) -> dict[str, int]:
    """The trips of every loop a tiling may run."""
    return trips_of(p, t.Ti, t.Tj, t.Tk, t.per_block, t.split)


ORDERS = {  # outermost first, after the batch loops; K innermost, so partial sums never leave the array
    None: [("ti", "tj", "tk"), ("tj", "ti", "tk")],
    "A": [("bi", "tj", "ti", "tk")],
    "B": [("bj", "ti", "tj", "tk")],
}
# but with K split: its blocks outside the result tiles of a panel, partial sums on chip between them
SPLIT_ORDER = ("bi", "bj", "kb", "ti", "tj", "tk")


def _outside_parallel(stream: Stream, t: MatmulTiling) -> bool:
    """Whether a stream's load into L3 sits outside the parallel loop (or before all loops), so
    that one copy serves every compute tile (`Kernel.shared_moves`)."""
    return t.parallel.loop is not None and placement(stream, t.loop_order) < t.loop_order.index(t.parallel.loop)


def l3_tiles(p: MatmulProblem, t: MatmulTiling) -> dict[str, int]:
    """Bytes of one L3 tile of A and of B: the resident block's rows or columns, the others' one
    tile's, all of K for a panel, else Tk."""
    if t.split is not None:
        rows, cols = min(p.M, t.Ti * t.split.rows), min(p.N, t.Tj * t.split.cols)
        depth = dict.fromkeys("AB", min(p.K, t.Tk * t.split.depth))
        return {"A": rows * depth["A"] * p.elem_a, "B": depth["B"] * cols * p.elem_b}
    rows = min(p.M, t.Ti * (t.per_block if t.resident == "A" else 1))
    cols = min(p.N, t.Tj * (t.per_block if t.resident == "B" else 1))
    depth = {name: p.K if t.whole_k(name) else min(p.K, t.Tk) for name in "AB"}
    return {"A": rows * depth["A"] * p.elem_a, "B": depth["B"] * cols * p.elem_b}


def tile_buffers(p: MatmulProblem, t: MatmulTiling) -> tuple[list[Buffer], list[int]]:
    """What the tiles are sized by: the kernel body's buffers as (level, bytes), each at its
    largest, and apart the L3 buffers one copy of which serves every compute tile (a resident
    panel, and a streamed panel loaded outside the parallel loop). L3 holds the operands' L3 tiles:
    A and B tiles `depth` deep, or the resident panel `panel_depth` deep and the streamed one's
    panels (or K tiles) `depth` deep. L2 and L1 hold A and B tiles `depth` deep; L3 and L2 a
    whole tile of Cin; the accumulators' tile drains to L2 and, unless an epilogue takes it
    there, on to L3; each epilogue operand's tile (a bias row one row high) sits `depth` deep at
    L3 and L2, and the final result's at both. With K split (`KSplit`), L3 holds A's and B's
    blocks `depth` deep, and the result's drain and reload each a tile of L2 beside the ring of
    partial tiles in L3, or the ring is the drain's buffer in L2 and the result passes L3 once.
    The body double-buffers only loads that repeat and holds C in its own dtype, never wider
    than the accumulators', so it needs no more than this; the kernel's requirements are its
    buffers exactly (`requirements.body_buffers`)."""
    Ti, Tj, Tk = t.Ti, t.Tj, t.Tk
    a, b = Ti * Tk * p.elem_a * p.depth, Tk * Tj * p.elem_b * p.depth
    out = [(level, tile) for level in ("L2", "L1") for tile in (a, b)]
    shared: list[int] = []
    if t.resident is None and t.split is None:
        out += [("L3", a), ("L3", b)]
    else:
        l3 = l3_tiles(p, t)
        for stream in streams(p, t)[:2]:
            size = l3[stream.name] * (t.panel_depth if stream.name == t.resident else p.depth)
            if _outside_parallel(stream, t):
                shared.append(size)
            else:
                out.append(("L3", size))
    acc = Ti * Tj * p.elem_acc
    if t.split is not None:
        ring = acc * t.split.ring
        out += [("L2", acc), ("L2", acc), ("L3", ring)] if t.split.level == "L3" else [("L2", ring), ("L3", acc)]
    else:
        out += [("L2", acc)] if p.epilogue is not None else [("L3", acc), ("L2", acc)]
    if p.cin_batch is not None:
        out += [("L3", Ti * Tj * p.elem_cin), ("L2", Ti * Tj * p.elem_cin)]
    if p.epilogue is not None:
        for elem, rows, cols in p.epilogue:
            operand = (Ti if rows else 1) * (Tj if cols else 1) * elem * p.depth
            out += [("L3", operand), ("L2", operand)]
        out += [("L3", Ti * Tj * p.elem_c), ("L2", Ti * Tj * p.elem_c)]
    return out, shared


def _panel_blocks(tiles: int, workers: int) -> list[int]:
    """Panel sizes worth trying, in tiles, smallest first: each count of blocks from one tile per
    panel up to one panel of the whole operand, as few tiles as that count needs; a multiple of
    `workers` when the compute tiles share a panel's tiles."""
    sizes = {math.ceil(tiles / blocks) for blocks in range(1, tiles + 1)}
    if workers > 1:
        sizes = {min(tiles, math.ceil(n / workers) * workers) for n in sizes}
    return sorted(sizes)


def _tilings(p: MatmulProblem, target: Target, Ti: int, Tj: int, Tk: int):
    """The feasible tilings with these tiles, as (tiling, trips): each order without a resident
    panel, and for each resident operand, panel buffering depth and parallel loop the largest
    panel that fits and is worth its wait (a larger panel never moves more). Ranked by cost (an
    objective but latency), the largest panel that fits, its wait being in the cost, and the
    other operand streaming past it in panels or in K tiles whatever the panel's size."""
    # L2 and L1 hold the same tiles whichever operand is resident: when they do not fit, none does
    on_l2_l1 = [b for b in tile_buffers(p, MatmulTiling(Ti, Tj, Tk, Tk, (), Parallel(None, 1)))[0] if b[0] != "L3"]
    if not fits(on_l2_l1, target):
        return
    by_cost = target.objective != "latency"
    takes = _fitting if by_cost else _acceptable
    for order in ORDERS[None]:
        trips = trips_of(p, Ti, Tj, Tk)
        order = tuple(v for v in (*p.batch, *order) if trips[v] > 1)
        t = MatmulTiling(Ti, Tj, Tk, Tk, order, parallel_loop(order, trips, target.compute_tiles))
        private, shared = tile_buffers(p, t)
        if fits(private, target, shared):
            yield t, trips
    for resident in ("A", "B"):
        inner, outer = ("ti", "tj") if resident == "A" else ("tj", "ti")
        tiles = trips_of(p, Ti, Tj, Tk)[inner]
        for panel_depth in ((2, 1) if p.depth == 2 else (1,)):
            # the compute tiles deal out the panel's tiles (sharing both panels) or the other
            # operand's panels
            for parallel_on, workers in ((inner, target.compute_tiles), (outer, 1)):
                for streamed_tiles in ((False, True) if by_cost else (False,)):
                    make = functools.partial(_resident_tiling, p, target, Ti, Tj, Tk, resident, panel_depth,
                                             parallel_on, streamed_tiles=streamed_tiles)
                    sizes = _panel_blocks(tiles, workers)
                    # the largest size that fits (and, for latency, is worth its wait): a larger
                    # panel takes more room and keeps the array waiting longer, and moves fewer bytes
                    n = bisect.bisect_left(sizes, True, key=lambda size: not takes(p, target, *make(size)))
                    if n:
                        yield make(sizes[n - 1])
        # the whole operand in one tile's panel, loaded once and shared, the other streaming past
        # it once in its K tiles: room for the panel where the other's panels would leave none
        if tiles == 1 and not by_cost:
            whole = _resident_tiling(p, target, Ti, Tj, Tk, resident, 1, outer, 1, streamed_tiles=True)
            if _acceptable(p, target, *whole):
                yield whole


def _split_tilings(p: MatmulProblem, target: Target, Ti: int, Tj: int, Tk: int):
    """The K splits with these tiles that fit, as (tiling, trips): for each level the partial
    sums wait at, result loop the compute tiles deal out and K block depth (powers of two of K
    tiles, at least two blocks), the panel that moves the fewest DRAM bytes of those with the
    widest panel that fits for each count of rows (a wider panel reads A fewer times; the bytes
    moved on chip are the same for every panel). Not for a MATMUL with Cin or an epilogue (they
    belong to the first K block and to the last), nor one whose result is narrower than its
    partial sums (they would be rounded between blocks)."""
    if p.cin_batch is not None or p.epilogue is not None or p.elem_c != p.elem_acc:
        return
    tiles = trips_of(p, Ti, Tj, Tk)
    depths = [1 << e for e in range(max(0, tiles["tk"] - 1).bit_length()) if 1 << e < tiles["tk"]]
    for level in ("L3", "L2"):
        for parallel_on in [v for v in ("ti", "tj") if tiles[v] > 1] or [None]:
            workers = min(target.compute_tiles, tiles[parallel_on]) if parallel_on else 1
            rows = _panel_blocks(tiles["ti"], workers if parallel_on == "ti" else 1)
            cols = _panel_blocks(tiles["tj"], workers if parallel_on == "tj" else 1)
            for depth in depths:
                widest, n = [], len(cols)
                for r in rows:
                    make = functools.partial(split_tiling, p, target, Ti, Tj, Tk, level, parallel_on, depth, r)
                    # more rows fit no more columns
                    n = bisect.bisect_left(cols, True, hi=n, key=lambda c: not _ring_fits(p, target, *make(c)))
                    if not n:
                        break  # more rows only take more room
                    widest.append(make(cols[n - 1]))
                if not widest:
                    break  # deeper blocks only take more room
                yield min(widest, key=lambda found: dram_traffic(streams(p, found[0]), found[0].loop_order, found[1],
                                                                 found[0].within))


RING_LIMIT = 8  # the largest buffering depth the object format takes


def _ring_fits(p: MatmulProblem, target: Target, t: MatmulTiling, trips: dict[str, int]) -> bool:
    return t.split.ring <= RING_LIMIT and _fitting(p, target, t, trips)


def split_tiling(p: MatmulProblem, target: Target, Ti: int, Tj: int, Tk: int, level: str, parallel_on: str | None,
                  depth: int, rows: int, cols: int) -> tuple[MatmulTiling, dict[str, int]]:
    """The K split with panels of `rows` x `cols` tiles and K blocks of `depth` K tiles, the compute
    tiles dealing out the steps of loop `parallel_on` in each panel, and its trips. The ring holds
    the result tiles the busiest compute tile makes per K block."""
    trips = trips_of(p, Ti, Tj, Tk, split=KSplit(rows, cols, depth, level, ring=0))  # the ring moves no loop
    loops = tuple(v for v in (*p.batch, *SPLIT_ORDER) if trips[v] > 1)
    panel = {"ti": min(rows, trips["ti"]), "tj": min(cols, trips["tj"])}
    workers = min(target.compute_tiles, panel[parallel_on]) if parallel_on in loops else 1
    ring = math.prod(-(-n // workers) if v == parallel_on else n for v, n in panel.items())
    split = KSplit(rows, cols, depth, level, ring)
    return MatmulTiling(Ti, Tj, Tk, Tk, loops, Parallel(parallel_on if workers > 1 else None, workers),
                        split=split), trips


def _resident_tiling(p: MatmulProblem, target: Target, Ti: int, Tj: int, Tk: int, resident: str, panel_depth: int,
                     parallel_on: str, per_block: int, streamed_tiles: bool = False
                     ) -> tuple[MatmulTiling, dict[str, int]]:
    """The tiling with `resident`'s panel of `per_block` tiles, the compute tiles dealing out the
    steps of loop `parallel_on` (a loop within blocks: those of one block), and its trips."""
    trips = trips_of(p, Ti, Tj, Tk, per_block)
    loops = tuple(v for v in (*p.batch, *ORDERS[resident][0]) if trips[v] > 1)
    inner = "ti" if resident == "A" else "tj"
    runs = min(trips[parallel_on], per_block) if parallel_on == inner else trips[parallel_on]
    parallel = Parallel(parallel_on, max(1, min(target.compute_tiles, runs))) \
        if parallel_on in loops else parallel_loop(loops, trips, target.compute_tiles)
    return MatmulTiling(Ti, Tj, Tk, Tk, loops, parallel, resident, per_block, panel_depth, streamed_tiles), trips


def _fitting(p: MatmulProblem, target: Target, t: MatmulTiling, trips: dict[str, int]) -> bool:
    private, shared = tile_buffers(p, t)
    return fits(private, target, shared)


def _acceptable(p: MatmulProblem, target: Target, t: MatmulTiling, trips: dict[str, int]) -> bool:
    return _fitting(p, target, t, trips) and worth_waiting_for(p, t, trips)


# the array waits for a resident panel's loads that nothing else overlaps: a panel is worth it
# only when those are at most 1/PANEL_SHARE of the kernel's traffic (the rest streams while the
# array computes)
PANEL_SHARE = 16


def worth_waiting_for(p: MatmulProblem, t: MatmulTiling, trips: dict[str, int]) -> bool:
    """Whether the bytes the array waits for are few enough: each operand's first L3 tile, and
    with a one-deep resident panel every load of it too (its next load starts when its last
    reader is done), but for the whole operand's panel beside K tiles (`streamed_tiles`) when it
    is loaded once, before all loops."""
    every = streams(p, t)  # A, B, ...
    return PANEL_SHARE * waited_bytes(p, t, trips) <= dram_traffic(every, t.loop_order, trips, t.within)


def waited_bytes(p: MatmulProblem, t: MatmulTiling, trips: dict[str, int]) -> int:
    """The bytes the array waits for (`worth_waiting_for`): each operand's first L3 tile, and
    each load of a one-deep resident panel."""
    waited = sum(l3_tiles(p, t).values())
    if t.resident is None:
        return waited
    resident = streams(p, t)[0 if t.resident == "A" else 1]
    if t.panel_depth == 1 and (not t.streamed_tiles or placement(resident, t.loop_order) >= 0):
        waited += stream_traffic(resident, t.loop_order, trips, t.within)
    return waited


# a resident panel may not shrink the L2 tiles below 1/TILE_SHRINK of the area they have without
# one: smaller tiles are read from L3 more often, and the BlockMovers, not DRAM, become the limit
# (unless the estimate finds it faster all the same: a product of one row, whose weights pass
# L3 once whatever the tiles, comes in fewer, larger moves, each holding a DMA for the latency)
TILE_SHRINK = 2
# by how much of the fewest bytes' cycles the latency objective's quickest tiling by the estimate
# must be quicker to be taken over it (and within it of the quickest, tilings count as quick as
# it): the estimate's error between tilings of one product. At 1%, Swin-T's 3136 x 96 x 384 took
# tiles of 224 x 64, rated 1 to 5% quicker, that ran 2.3% slower for twice the DRAM bytes
FASTER = 0.05


def first_fit(attempts: Iterable[P], choose: Callable[[P], T]) -> tuple[P, T] | None:
    """The first of `attempts` (problems, most ambitious first: double-buffered before single)
    that `choose` finds a tiling for, and that tiling; `choose` raises ValueError when none fits."""
    for attempt in attempts:
        try:
            return attempt, choose(attempt)
        except ValueError:
            continue
    return None


def choose_tiling(p: MatmulProblem, target: Target) -> MatmulTiling:
    """The feasible tiling with least exact DRAM traffic, a resident panel only where the array
    waits for little of it (`worth_waiting_for`) and its tiles stay within TILE_SHRINK of the
    area they have without one; ties go to fewer, larger tiles, then to a double-buffered
    resident panel, then to larger panels. The whole operand resident beside the other's K tiles
    (`streamed_tiles`) is taken over that only where it moves fewer bytes, on the same terms.
    Under latency, a tiling `estimate` finds more than FASTER quicker (its tiles dealt more
    evenly to the compute tiles) is taken over the fewest bytes. ValueError when no tiling fits."""
    found = _best_tiling(p, target)
    if found is None:
        raise ValueError("no tile of the array size fits the target's memories")
    return found


# The choice depends on its arguments alone, and a transformer repeats its products (a layer's
# Q, K and V projections; every layer's): each is searched once per process.
@functools.lru_cache(maxsize=4096)
def _best_tiling(p: MatmulProblem, target: Target) -> MatmulTiling | None:
    if target.objective != "latency":
        return _cheapest(p, target)
    best: dict[bool, tuple[tuple, MatmulTiling, dict[str, int]]] = {}  # with a resident panel or not -> the best
    whole: list[tuple[tuple, MatmulTiling, dict[str, int]]] = []  # the tilings with `streamed_tiles`
    every: list[tuple[tuple, MatmulTiling, dict[str, int]]] = []
    for Ti in _candidates(p.M, target.rows):
        for Tj in _candidates(p.N, target.cols):
            for Tk in reversed(_candidates(p.K, min(target.rows, target.cols))):
                found = False
                for t, trips in _tilings(p, target, Ti, Tj, Tk):
                    found = True
                    dram = dram_traffic(streams(p, t), t.loop_order, trips, t.within)
                    tiles = trips["ti"] * trips["tj"] * trips["tk"]
                    # blocks of tiles dealt evenly to the compute tiles before larger blocks
                    key = (dram, tiles, -Ti * Tj, -t.panel_depth, _uneven(t), -t.per_block, t.loop_order)
                    panel = t.resident is not None
                    every.append((key, t, trips))
                    if t.streamed_tiles:
                        whole.append((key, t, trips))
                    elif panel not in best or key < best[panel][0]:
                        best[panel] = (key, t, trips)
                if found:
                    break  # the largest Tk that fits this (Ti, Tj) is the one worth having
    plain, panel = best.get(False), best.get(True)

    def shrinks(t: MatmulTiling) -> bool:
        """Whether a panel's tiles are too small beside the plain tiling's (`TILE_SHRINK`)."""
        return plain is not None and TILE_SHRINK * t.Ti * t.Tj < plain[1].Ti * plain[1].Tj

    choice = plain if panel is None or (plain is not None and (plain[0] <= panel[0] or shrinks(panel[1]))) else panel
    shrunk = [panel] if choice is plain and panel is not None and panel[0] < plain[0] else []
    for candidate in sorted(whole, key=lambda c: c[0]):
        if choice is not None and candidate[0][0] >= choice[0][0]:
            break
        if not shrinks(candidate[1]):
            choice = candidate
            break
        shrunk.append(candidate)
    # tiles smaller than TILE_SHRINK allows, where they move no more bytes, the BlockMovers are
    # far from the limit (`_fed`), and the estimate finds them faster: of those, the fewest bytes
    if choice is not None and target.costs is not None and shrunk:
        cycles = estimate(p, choice[1], choice[2], target).cycles
        faster = [c for c in shrunk if c[0][0] <= choice[0][0] and _fed(p, *c[1:], target.costs)
                  and estimate(p, c[1], c[2], target).cycles < cycles]
        if faster:
            choice = min(faster, key=lambda c: c[0])
    # the fewest bytes keep the array fed only where the tiles deal evenly to the compute tiles:
    # where the estimate finds tiles at most TILE_SHRINK smaller more than FASTER quicker, the
    # quickest (within FASTER of it, the fewest bytes). Swin-T's 196 x 1536 x 384: 128 x 128
    # tiles, 3 along N for 2 compute tiles, 331,225 cycles; 128 x 96, 4 along N, 249,003
    if choice is not None and target.costs is not None:
        area = choice[1].Ti * choice[1].Tj
        every = [c for c in every if TILE_SHRINK * c[1].Ti * c[1].Tj >= area] + [choice]
        cycles = {id(c[1]): estimate(p, c[1], c[2], target).cycles for c in every}
        quickest = min(cycles.values())
        if quickest < (1 - FASTER) * cycles[id(choice[1])]:
            choice = min((c for c in every if cycles[id(c[1])] <= (1 + FASTER) * quickest), key=lambda c: c[0])
    return None if choice is None else choice[1]


def _fed(p: MatmulProblem, t: MatmulTiling, trips: dict[str, int], costs: Costs) -> bool:
    """Whether the BlockMovers take the tiling's tiles from L3 in 1/TILE_SHRINK of the time DRAM
    takes to bring its bytes, or less: however small its tiles, they are not the limit."""
    read = sum(stream_traffic(s, t.loop_order, trips, t.within) for s in hops(p, t)["L3", "L2"])
    dram = dram_traffic(streams(p, t), t.loop_order, trips, t.within)
    return TILE_SHRINK * read / costs.l3_l2_bytes_per_cycle <= dram / costs.dram_bytes_per_cycle


def _uneven(t: MatmulTiling) -> int:
    """The compute tiles idle at the end of each block of tiles, where those are dealt out."""
    per = t.blocks.get(t.parallel.loop) if t.parallel.loop else None
    return 0 if per is None else -per % t.parallel.workers


def tile_sizes(dim: int, tile: int) -> list[tuple[int, int]]:
    """Tiles of `dim` in tiles of `tile`: (extent, how many tiles have it)."""
    return [(tile, dim // tile)] + ([(dim % tile, 1)] if dim % tile else [])


def busiest_steps(sizes: list[tuple[int, int]], workers: int, cost: Callable[[int], float]) -> float:
    """What the compute tile with the most takes of a parallel loop's steps, tiles of these
    (extent, count) sizes in order, which the loader deals round-robin (the last may be short):
    the sum of `cost` (of an extent) over its own."""
    totals = [0] * workers
    start = 0
    for extent, count in sizes:
        each = cost(extent)
        for w in range(workers):  # the steps start + i of the block with (start + i) % workers == w
            totals[w] += each * len(range(start + (w - start) % workers, start + count, workers))
        start += count
    return max(totals)


def array_cycles(m_sizes: list[tuple[int, int]], n_sizes: list[tuple[int, int]], k_sizes: list[tuple[int, int]],
                 rows: int, cols: int, dataflow: str) -> int:
    """The array's cycles (`rows` x `cols`) for a product in tiles of these (extent, count) sizes,
    as the simulator counts them: each result tile's K steps back to back, the accumulators
    drained after the last."""
    def cycles(m: int, n: int, k: int, drain: bool) -> int:
        return matmul_cycles(m, n, k, rows, cols, dataflow, drain)

    last = k_sizes[-1][0]
    total = 0
    for m, cm in m_sizes:
        for n, cn in n_sizes:
            steps = sum(count * cycles(m, n, k, False) for k, count in k_sizes)
            total += cm * cn * (steps + cycles(m, n, last, True) - cycles(m, n, last, False))
    return total


def tiled_cycles(M: int, N: int, K: int, Ti: int, Tj: int, Tk: int, target: Target, dataflow: str,
                 k_block: int | None = None) -> int:
    """The array's cycles for one matrix product in tiles; with `k_block` (a multiple of Tk), K in
    blocks of that many elements, each result tile's accumulators drained after each block."""
    m, n = tile_sizes(M, Ti), tile_sizes(N, Tj)
    if k_block is None:
        return array_cycles(m, n, tile_sizes(K, Tk), target.rows, target.cols, dataflow)
    return sum(count * array_cycles(m, n, tile_sizes(block, Tk), target.rows, target.cols, dataflow)
               for block, count in tile_sizes(K, k_block))


@dataclass(frozen=True)
class Estimate:
    """What a tiling costs by the loader's models."""

    cycles: int
    pj: float
    dram: int  # bytes


def hops(p: MatmulProblem, t: MatmulTiling) -> dict[tuple[str, str], list[Stream]]:
    """The streams each pair of levels moves, (source, destination) -> streams: the loads' L3
    tiles in from external memory, their L2 tiles (the L1 tiles are these) on down, Cin to the
    accumulators, and the result's tiles out (with an epilogue, its result's)."""
    dram = streams(p, t)
    # the L2 tiles are those of a tiling without a resident panel: Ti or Tj by Tk
    l2 = streams(p, MatmulTiling(t.Ti, t.Tj, t.Tk, t.L1_Ki, t.loop_order, t.parallel))
    c = dram[-1]
    epilogue = [Stream("E", (*(["ti"] if rows else []), *(["tj"] if cols else [])),
                       math.prod(p.batch_trips) * (p.M if rows else 1) * (p.N if cols else 1) * elem)
                for elem, rows, cols in p.epilogue or ()]
    # with K split the result's on-chip moves repeat per K block (`partial_bytes`); it leaves once
    on_chip = [] if t.split is not None else [c]
    return {("EXTERNAL", "L3"): dram[:-1] + epilogue, ("L3", "L2"): l2[:-1] + epilogue,
            ("L2", "L1"): l2[:2], ("L2", "REGISTER"): l2[2:-1],
            ("REGISTER", "L2"): on_chip, ("L2", "L3"): on_chip, ("L3", "EXTERNAL"): [c]}


def partial_bytes(p: MatmulProblem, t: MatmulTiling, trips: dict[str, int]) -> dict[tuple[str, str], int]:
    """The bytes a K split's result moves on chip, by pair of levels: each tile drained after
    every K block and reloaded before every one but the first, through L2 to its ring in L3 and
    back, or to its ring in L2 and back, then once to L3."""
    c = math.prod(p.batch_trips) * p.M * p.N * p.elem_c
    blocks = trips["kb"]
    if t.split.level == "L3":
        return {("REGISTER", "L2"): c * blocks, ("L2", "L3"): c * blocks,
                ("L3", "L2"): c * (blocks - 1), ("L2", "REGISTER"): c * (blocks - 1)}
    return {("REGISTER", "L2"): c * blocks, ("L2", "REGISTER"): c * (blocks - 1), ("L2", "L3"): c}


def estimate(p: MatmulProblem, t: MatmulTiling, trips: dict[str, int], target: Target) -> Estimate:
    """The tiling's cycles, pJ and DRAM bytes. pJ as `hardware.energy` charges the simulator's
    counts: each hop's bytes at both its levels, the array's reads of its L1 tiles (one per
    task: the L2 -> L1 bytes again at L1), and each MAC with its two register reads (an
    epilogue's vector work, the same for every tiling, is left out). Cycles: the array's on the
    busiest compute tile, or a link's bytes over its rate where that is longer (the DMA engines'
    also holding the DRAM latency per move), plus the bytes the array waits for
    (`waited_bytes`) over external memory's rate."""
    costs = target.costs
    pj = costs.energy.access_pj_per_byte
    by_hop = hops(p, t)
    moved = {hop: sum(stream_traffic(s, t.loop_order, trips, t.within) for s in hop_streams)
             for hop, hop_streams in by_hop.items()}
    if t.split is not None:
        for hop, n in partial_bytes(p, t, trips).items():
            moved[hop] += n
    macs = math.prod(p.batch_trips) * p.M * p.N * p.K
    # the same for every tiling: without a figure for the dtype, energy x cycles counts the moves alone
    energy = (sum(n * (pj[src.lower()] + pj[dst.lower()]) for (src, dst), n in moved.items())
              + moved["L2", "L1"] * pj["l1"] + costs.mac_pj(macs, p.dtype, p.elem_a))
    k_block = t.Tk * t.split.depth if t.split is not None else None
    share = busiest_array_share(p, t, trips, target, k_block)
    array = math.prod(p.batch_trips) * _fewest_array_cycles(p.M, p.N, p.K, t.Ti, t.Tj, t.Tk, target, k_block) * share
    if t.split is not None:
        # every K block but the first takes each result tile into the accumulators anew: the array
        # waits for the last tile's drain, or this one's reload, through a Streamer
        tile = min(t.Ti, p.M) * min(t.Tj, p.N) * p.elem_c
        array += math.prod(p.batch_trips) * (trips["kb"] - 1) * trips["ti"] * trips["tj"] * share \
            * tile / costs.streamer_bytes_per_cycle
    dram = moved["EXTERNAL", "L3"] + moved["L3", "EXTERNAL"]
    dma_moves = sum(stream_moves(s, t.loop_order, trips, t.within)
                    for s in (*by_hop["EXTERNAL", "L3"], *by_hop["L3", "EXTERNAL"]))
    links = link_cycles(costs, dram, dma_moves, moved["L3", "L2"] + moved["L2", "L3"],
                        moved["L2", "L1"] + moved["REGISTER", "L2"] + moved["L2", "REGISTER"])
    waits = waited_bytes(p, t, trips) / costs.dram_bytes_per_cycle
    return Estimate(math.ceil(max(array, links) + waits), energy, dram)


def busiest_array_share(p: MatmulProblem, t: MatmulTiling, trips: dict[str, int], target: Target,
                        k_block: int | None, dataflow: str | None = None) -> float:
    """The busiest compute tile's share of the array's cycles: the parallel loop's steps dealt
    round-robin, each block's from the first compute tile (as the loader deals them), a step
    along M or N costing what its tiles do in `dataflow` (None: the one `auto` takes) (an edge
    tile of a few rows less than a whole one: Swin-T's 196 rows in tiles of 64 gave one compute
    tile 128 rows, the other 68)."""
    loop, workers = t.parallel.loop, t.parallel.workers
    steps = trips[loop] if loop else 1
    per = t.blocks.get(loop, steps) if loop else 1
    if loop not in ("ti", "tj"):
        return sum(count * -(-size // workers) for size, count in tile_sizes(steps, per)) / steps
    dim, tile = (p.M, t.Ti) if loop == "ti" else (p.N, t.Tj)
    rows, cols = tile_sizes(p.M, t.Ti), tile_sizes(p.N, t.Tj)
    depths = tile_sizes(p.K, t.Tk) if k_block is None else tile_sizes(k_block, t.Tk)
    dataflow = dataflow or min(target.dataflows,
                               key=lambda d: (tiled_cycles(p.M, p.N, p.K, t.Ti, t.Tj, t.Tk, target, d, k_block), d))

    @functools.cache
    def cost(extent: int) -> int:
        own = [(extent, 1)]
        return array_cycles(own if loop == "ti" else rows, own if loop == "tj" else cols, depths, target.rows,
                            target.cols, dataflow)

    load = [0] * workers
    for step in range(steps):
        load[step % per % workers] += cost(min(tile, dim - step * tile))
    return max(load) / sum(load)


def link_busy(costs: Costs, dram: int, dma_moves: int, l3_l2: int, l2_l1: int) -> tuple[float, float, float]:
    """The cycles of each link between levels for these bytes (both ways) and DMA moves, (DMAs,
    BlockMovers, Streamers): its bytes over its engines' rate, a DMA also holding its engine for
    the DRAM latency."""
    dma = max(dram / costs.dram_bytes_per_cycle,
              (dma_moves * costs.dma_cycles_per_move + dram / costs.dma_engine_bytes_per_cycle) / costs.dma_engines)
    return dma, l3_l2 / costs.l3_l2_bytes_per_cycle, l2_l1 / costs.l2_l1_bytes_per_cycle


def link_cycles(costs: Costs, dram: int, dma_moves: int, l3_l2: int, l2_l1: int) -> float:
    """The cycles of the busiest link (`link_busy`)."""
    return max(link_busy(costs, dram, dma_moves, l3_l2, l2_l1))


@functools.lru_cache(maxsize=4096)
def _fewest_array_cycles(M: int, N: int, K: int, Ti: int, Tj: int, Tk: int, target: Target,
                         k_block: int | None = None) -> int:
    """The array's cycles for the product in these tiles with the dataflow `auto` would take."""
    return min(tiled_cycles(M, N, K, Ti, Tj, Tk, target, d, k_block) for d in target.dataflows)


def _cheapest(p: MatmulProblem, target: Target) -> MatmulTiling | None:
    """The feasible tiling with least energy (`energy`) or energy x cycles (`edp`) by `estimate`;
    ties go to fewer DRAM bytes, then as the latency objective breaks them, then to fewer cycles.
    Tk moves no bytes, it only takes room: for each Ti x Tj the largest Tk that fits, as the
    latency objective takes it, and the smallest, which leaves a resident panel most room. Then
    K splits, with the largest Tk (their blocks are powers of two of it deep): the tiles whose
    least possible figure (`_split_floor`) is lowest first, while that is below the best found."""
    best: tuple[tuple, MatmulTiling] | None = None

    def rank(found: Iterable[tuple[MatmulTiling, dict[str, int]]]) -> None:
        nonlocal best
        for t, trips in found:
            e = estimate(p, t, trips, target)
            figure = e.pj * e.cycles if target.objective == "edp" else e.pj
            tiles = trips["ti"] * trips["tj"] * trips["tk"]
            key = (figure, e.dram, tiles, -t.Ti * t.Tj, -t.panel_depth, -t.per_block, e.cycles, t.loop_order,
                   dataclasses.astuple(t.split) if t.split else ())
            if best is None or key < best[0]:
                best = (key, t)

    splits = []  # (least figure, Ti, Tj, Tk) of the tiles a K split may take
    for Ti in _candidates(p.M, target.rows):
        for Tj in _candidates(p.N, target.cols):
            depths = _candidates(p.K, min(target.rows, target.cols))
            largest = next((Tk for Tk in reversed(depths) if next(_tilings(p, target, Ti, Tj, Tk), None)), None)
            for Tk in sorted({largest, depths[0]} - {None}):
                rank(_tilings(p, target, Ti, Tj, Tk))
            if largest is not None:
                splits.append((_split_floor(p, Ti, Tj, largest, target), Ti, Tj, largest))
    for floor, Ti, Tj, Tk in sorted(splits):
        if best is not None and floor >= best[0][0]:
            break
        rank(_split_tilings(p, target, Ti, Tj, Tk))
    return None if best is None else best[1]


def _split_floor(p: MatmulProblem, Ti: int, Tj: int, Tk: int, target: Target) -> float:
    """The least figure any K split with these tiles could have: pJ of its MACs, of every operand
    and the result crossing DRAM once, of the L2 tiles of A and B these tiles read (on to L1 and
    the array), and of the result drained twice, reloaded once and passing L3; for `edp` times
    the cycles of the arrays at their peak."""
    costs = target.costs
    pj = costs.energy.access_pj_per_byte
    trips = trips_of(p, Ti, Tj, Tk)
    order = tuple(v for v in (*p.batch, "ti", "tj", "tk") if trips[v] > 1)
    tiles = streams(p, MatmulTiling(Ti, Tj, Tk, Tk, order, Parallel(None, 1)))
    l2 = dram_traffic(tiles[:2], order, trips)
    once = sum(s.bytes for s in tiles)
    macs = math.prod(p.batch_trips) * p.M * p.N * p.K
    c = tiles[-1].bytes
    energy = (costs.mac_pj(macs, p.dtype, p.elem_a)
              + once * (pj["external"] + pj["l3"]) + l2 * (pj["l3"] + 2 * pj["l2"] + 2 * pj["l1"])
              + c * (3 * (pj["register"] + pj["l2"]) + pj["l2"] + pj["l3"]))
    if target.objective == "edp":
        return energy * macs / (target.rows * target.cols * target.compute_tiles)
    return energy
