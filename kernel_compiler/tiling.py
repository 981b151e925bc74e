"""Matmul tile optimizer and the exact DRAM-traffic count of a tile loop order.

Start: the analytical formula of Goto & van de Geijn as upstream kpu-sim states it, for one
L2 bank. Then a bounded search over multiples of the array size picks the tiles whose exact
DRAM traffic (counted over the chosen loop order, not estimated by dividing by reuse) is least,
subject to every buffer (tile x buffering depth) fitting the target's banks at L3, L2 and L1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .requirements import Buffer, fits
from .target import Target


@dataclass(frozen=True)
class Stream:
    """One operand's tiles as the loop nest visits them."""

    name: str  # "A", "B", "Cin", "C"
    loop_vars: tuple[str, ...]  # the loops its tile index depends on
    bytes: int  # the whole tensor


@dataclass(frozen=True)
class MatmulTiling:
    Ti: int
    Tj: int
    Tk: int
    L1_Ki: int  # K depth of the A and B slices the streamers keep in L1: the whole Tk here
    loop_order: tuple[str, ...]  # outermost first, trip-1 loops dropped
    parallel: Parallel


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
                   parallel: Parallel) -> int:
    """Exact bytes a stream moves: the whole tensor once per iteration of every loop at or
    outside its placement that does not index it (each such iteration reloads all tiles), and
    once per compute tile when it sits outside the parallel loop (every tile runs it)."""
    depth = placement(stream, loop_order)
    repeats = 1
    for var in loop_order[: depth + 1]:
        if var not in stream.loop_vars:
            repeats *= trips[var]
    if parallel.loop is not None and depth < loop_order.index(parallel.loop):
        repeats *= parallel.workers
    return stream.bytes * repeats


def dram_traffic(streams: list[Stream], loop_order: tuple[str, ...], trips: dict[str, int],
                 parallel: Parallel) -> int:
    return sum(stream_traffic(s, loop_order, trips, parallel) for s in streams)


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


def streams(p: MatmulProblem, Ti: int, Tj: int, Tk: int) -> list[Stream]:
    batch_size = math.prod(p.batch_trips)
    a_b = math.prod(t for v, t in zip(p.batch, p.batch_trips) if v in p.a_batch)
    b_b = math.prod(t for v, t in zip(p.batch, p.batch_trips) if v in p.b_batch)
    out = [
        Stream("A", (*p.a_batch, "ti", "tk"), a_b * p.M * p.K * p.elem_a),
        Stream("B", (*p.b_batch, "tk", "tj"), b_b * p.K * p.N * p.elem_b),
    ]
    if p.cin_batch is not None:
        c_b = math.prod(t for v, t in zip(p.batch, p.batch_trips) if v in p.cin_batch)
        rows = p.M if p.cin_rows else 1
        cols = p.N if p.cin_cols else 1
        out.append(Stream("Cin", (*p.cin_batch, *(["ti"] if p.cin_rows else []), *(["tj"] if p.cin_cols else [])),
                          c_b * rows * cols * p.elem_cin))
    out.append(Stream("C", (*p.batch, "ti", "tj"), batch_size * p.M * p.N * p.elem_c))
    return out


def _loop_orders(p: MatmulProblem, trips: dict[str, int]) -> list[tuple[str, ...]]:
    """Output-stationary orders (K innermost, so partial sums never leave the tile)."""
    orders = [(*p.batch, "ti", "tj", "tk"), (*p.batch, "tj", "ti", "tk")]
    return [tuple(v for v in order if trips[v] > 1) for order in orders]


def tile_buffers(p: MatmulProblem, Ti: int, Tj: int, Tk: int) -> list[Buffer]:
    """What the tiles are sized by: the kernel body's buffers as (level, bytes), each at its
    largest. A and B tiles `depth` deep at L3, L2 and L1; a whole tile of Cin at L3 and L2; the
    accumulators' tile drained to L2 and, unless an epilogue takes it there, on to L3; each
    epilogue operand's tile (a bias row one row high) `depth` deep at L3 and L2, and the final
    result's at both. The body double-buffers only loads that repeat and holds C in its own
    dtype, never wider than the accumulators', so it needs no more than this; the kernel's
    requirements are its buffers exactly (`requirements.body_buffers`)."""
    a, b = Ti * Tk * p.elem_a * p.depth, Tk * Tj * p.elem_b * p.depth
    acc = Ti * Tj * p.elem_acc
    out = [(level, tile) for level in ("L3", "L2", "L1") for tile in (a, b)]
    out += [("L2", acc)] if p.epilogue is not None else [("L3", acc), ("L2", acc)]
    if p.cin_batch is not None:
        out += [("L3", Ti * Tj * p.elem_cin), ("L2", Ti * Tj * p.elem_cin)]
    if p.epilogue is not None:
        for elem, rows, cols in p.epilogue:
            operand = (Ti if rows else 1) * (Tj if cols else 1) * elem * p.depth
            out += [("L3", operand), ("L2", operand)]
        out += [("L3", Ti * Tj * p.elem_c), ("L2", Ti * Tj * p.elem_c)]
    return out


def choose_tiling(p: MatmulProblem, target: Target) -> MatmulTiling:
    """The feasible tiling with least exact DRAM traffic; ties go to fewer, larger tiles."""
    s = min(target.rows, target.cols)
    best: tuple[tuple, MatmulTiling] | None = None
    for Ti in _candidates(p.M, target.rows):
        for Tj in _candidates(p.N, target.cols):
            for Tk in reversed(_candidates(p.K, s)):
                if not fits(tile_buffers(p, Ti, Tj, Tk), target):
                    continue
                trips = dict(zip(p.batch, p.batch_trips))
                trips.update(ti=math.ceil(p.M / Ti), tj=math.ceil(p.N / Tj), tk=math.ceil(p.K / Tk))
                for order in _loop_orders(p, trips):
                    parallel = parallel_loop(order, trips, target.compute_tiles)
                    dram = dram_traffic(streams(p, Ti, Tj, Tk), order, trips, parallel)
                    tiles = trips["ti"] * trips["tj"] * trips["tk"]
                    key = (dram, tiles, -Ti * Tj, order)
                    if best is None or key < best[0]:
                        best = (key, MatmulTiling(Ti, Tj, Tk, Tk, order, parallel))
                break  # the largest Tk that fits this (Ti, Tj) is the one worth having
    if best is None:
        raise ValueError("no tile of the array size fits the target's memories")
    return best[1]
