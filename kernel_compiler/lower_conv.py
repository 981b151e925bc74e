"""Lower a CONV2D (NHWC input, one group) to a tiled DFX kernel: an implicit GEMM on the array,
M = output positions, N = output channels, K = kh * kw * input channels.

External memory never holds the im2col matrix. The input comes on chip in bands (bands.py: the
rows and columns an output tile needs, halo and zero border included), each into L3 once; chunks
of its channels go down to L1, and the array is fed the expanded rows from there (the tile
COMPUTE reads every window of its band: the registry's CONV2D_TILE).

Loops: b0, th, tw (the band tiling's), tj (Tn output channels), tk (Tc input channels,
innermost, so partial sums stay in the accumulators as MATMUL's K does).
Two orders: positions outer (b0, th, tw, tj, tk), where a band holding all its channels in L3
serves every tile of output channels, and the weights sit in L3 whole (loaded once, one copy for
every compute tile) or come chunk by chunk; channels outer (tj, b0, th, tw, tk), where a channel
tile's weights stay in L3 while the bands stream past (`HOLDINGS`). Weights in another order
than OHWI (`weight_layout`: HWIO as JAX passes them) are tiled in their own order and reach the
array OHWI: the BlockMover permutes each tile on its way L3 -> L2, as it transposes a MATMUL's B.

The tiling taken is the one with the fewest external-memory bytes among those whose cycles per
compute tile (the array's, or a link's where longer: `_moves_bound`) are within CYCLE_SLACK of the
fewest, its buffers fitting the target; of those that tie, the one whose DMAs the run shows least
beyond the estimate (`_exposed`). Under the `energy` and `edp` objectives, the one of least pJ
(`conv_pj`), or pJ x cycles, over all of them; ties as for latency.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from dfx import Compute, DataMove, Graph, Kernel, Op, TileRef, itemsize, lookup
from dfx.ops.window import weight_layout, weight_perms

from .bands import (
    CYCLE_SLACK, POSITIONS, BandTiling, Body, Layer, band_kernel, band_streams, busiest_share, channel_splits,
    copies_below_l3, dram_moves, epilogue_buffers, layer, load_depth, output_ref, result_depth, tallest, widths,
)
from .errors import CompileError
from .lower_matmul import choose_dataflow
from .lower_vector import epilogue_work
from .requirements import Buffer, extents, extents_fit, fits
from .target import Costs, Level, Target
from .tiling import (
    Stream, array_cycles, busiest_steps, first_fit, link_cycles, parallel_loop, stream_traffic, tile_sizes,
)

ORDERS = {"positions": ("b0", "th", "tw", "tj", "tk"), "channels": ("tj", "b0", "th", "tw", "tk")}


@dataclass(frozen=True)
class ConvProblem(Layer):
    c_bytes: int  # per element of the convolution's result (before its epilogue)
    # each op that follows it: its vector elements by op class over the whole result (none: no
    # epilogue); their result is a buffer in L2 of its own
    epilogue_work: tuple[tuple[tuple[str, int], ...], ...]
    dtype: str  # its operands': what a MAC costs in pJ
    # where its input is kept on chip (`Target.in_l3`, `in_l2`): its tiles there and above take no room
    x_home: str | None = None

    @property
    def KH(self) -> int:
        return self.hw[0].kernel

    @property
    def KW(self) -> int:
        return self.hw[1].kernel


@dataclass(frozen=True)
class ConvTiling(BandTiling):
    CHANNEL = "tj"
    Tn: int
    Tc: int
    order: str  # a key of ORDERS
    band_channels: str  # "all": the L3 band holds every input channel; "chunk": Tc of them
    weights: str  # in L3: "all" of them, a "tile" of output channels with every input one, or a "chunk"

    @property
    def bias_whole(self) -> bool:
        """Whether the bias comes into L3 whole, once: positions outer, a tile of it per step of
        tj would come again for every band (MobileNet v1's pw4 chained in tiles of 32 output
        channels: 448 moves of 128 bytes, each holding a DMA engine for the latency), as a window
        op's does."""
        return self.order == "positions"

    def channel_trips(self, p: ConvProblem) -> dict[str, int]:
        return {"tj": -(-p.Co // self.Tn), "tk": -(-p.Ci // self.Tc)}

    def channel_extent(self, p: ConvProblem) -> tuple[int, int]:
        return p.Co, self.Tn

    def nest(self) -> tuple[str, ...]:
        return ORDERS[self.order]

    def stream_loops(self, p: ConvProblem) -> dict[str, tuple[str, ...]]:
        loops = {"x": POSITIONS + (("tk",) if self.band_channels == "chunk" else ()),
                 "w": {"all": (), "tile": ("tj",), "chunk": ("tj", "tk")}[self.weights],
                 "y": POSITIONS + ("tj",)}
        if p.bias_bytes:
            loops["bias"] = ("tj",) if p.bias_along and not self.bias_whole else ()
        return loops


# the buffers of a tiling depend on it and the problem alone: a chain's planner tries one
# problem under many shares of the target, each search asking again for the same tilings
@functools.lru_cache(maxsize=1 << 16)
def tile_buffers(p: ConvProblem, t: ConvTiling) -> tuple[Buffer, ...]:
    """One compute tile's L2 and L1 buffers, as `_kernel` makes them: the same for every holding
    of the operands (a load repeats or not by which loops run, whatever their order)."""
    runs = {v for v, n in t.trips(p).items() if n > 1}
    band_h, band_w = p.band(t.R, t.C)
    out_tile = t.R * t.C * t.Tn * result_depth(p, t, runs)
    x = band_h * band_w * t.Tc * p.x_bytes * load_depth(p.depth, runs, POSITIONS + ("tk",))
    w = t.Tn * p.KH * p.KW * t.Tc * p.w_bytes * load_depth(p.depth, runs, ("tj", "tk"))
    buffers: list[Buffer] = [("L2", out_tile * p.c_bytes), ("L2", 0 if p.x_home == "L2" else x), ("L1", x), ("L2", w),
                             ("L1", w)]
    if p.bias_bytes:
        buffers.append(("L2", (t.Tn if p.bias_along else 1) * p.bias_bytes))
    buffers += epilogue_buffers(p, t, runs, "L2", t.R * t.C * t.Tn, t.Tn)
    if p.epilogue_work:
        buffers.append(("L2", out_tile * p.out_bytes))  # the epilogue's result, before it leaves
    return tuple(buffers)


def _l3_tiles(p: ConvProblem, t: ConvTiling) -> dict[str, int]:
    """The bytes of one L3 tile of the input band and of the weights, as the holding takes them."""
    band_h, band_w = p.band(t.R, t.C)
    return {"x": 0 if p.x_home is not None else band_h * band_w * (p.Ci if t.band_channels == "all" else t.Tc) * p.x_bytes,
            "w": {"all": p.Co * p.Ci, "tile": t.Tn * p.Ci, "chunk": t.Tn * t.Tc}[t.weights] * p.KH * p.KW * p.w_bytes}


@functools.lru_cache(maxsize=1 << 16)
def l3_buffers(p: ConvProblem, t: ConvTiling) -> tuple[tuple[Buffer, ...], tuple[int, ...]]:
    """One compute tile's L3 buffers, as `_kernel` makes them, and apart the shared ones: a load
    into L3 placed outside the parallel loop, one copy of which serves every compute tile."""
    trips = t.trips(p)
    order = tuple(v for v in t.nest() if trips[v] > 1)
    runs = set(order)
    parallel = parallel_loop(order, trips, 1 << 30).loop
    inner = set(order[order.index(parallel):]) if parallel is not None else runs
    loops = t.stream_loops(p)
    out_tile = t.R * t.C * t.Tn
    buffers: list[Buffer] = [("L3", out_tile * p.out_bytes * result_depth(p, t, runs))]
    shared: list[int] = []
    loads = {name: size * load_depth(p.depth, runs, loops[name]) for name, size in _l3_tiles(p, t).items()}
    if p.bias_bytes:  # single-buffered: the body loads it without repeating
        loads["bias"] = ((p.Co if t.bias_whole else t.Tn) if p.bias_along else 1) * p.bias_bytes
    for name, size in loads.items():
        if inner.isdisjoint(loops[name]):
            shared.append(size)
        else:
            buffers.append(("L3", size))
    buffers += epilogue_buffers(p, t, runs, "L3", out_tile, t.Tn)
    return tuple(buffers), tuple(shared)


def _cycles(p: ConvProblem, t: ConvTiling, target: Target, dataflow: str) -> int:
    """Array cycles of the compute tile with the most work, with its waits for its result tiles."""
    array = _array_cycles(p, t, target.rows, target.cols, target.compute_tiles, dataflow)
    return math.ceil(array + _result_wait(p, t, target, array))


def _result_wait(p: ConvProblem, t: ConvTiling, target: Target, array: float) -> float:
    """What the array of the busiest compute tile (`array` cycles of work) waits for its result
    tiles beyond its work. Each goes through steps (`_result_pace`): the drain, each epilogue op,
    the store into L3 and the one out to external memory. With one buffer of them the array
    waits for each tile's drain before it starts the next, and each step for the one after it to
    have taken the tile before: the slowest two consecutive steps pace the tiles. With two, none:
    a step slower than the array (an epilogue, mostly) is as slow for every tiling, and counted it
    hid the arrays' differences (torchvision's MobileNet v2 and EfficientNet-B0 ran 1.4 to 1.7%
    slower). Nothing without the target's costs."""
    if target.costs is None:
        return 0.0
    single, drain, pair = _result_pace(p, t, target.costs, target.compute_tiles)
    return max(drain, pair - array) if single else 0.0


@functools.lru_cache(maxsize=1 << 16)
def _result_pace(p: ConvProblem, t: ConvTiling, costs: Costs,
                 compute_tiles: int) -> tuple[bool, float, float]:
    """Whether the result tiles have one buffer (`result_depth`), and, for the busiest compute
    tile, their drain's cycles and the slowest two consecutive steps'."""
    trips = t.trips(p)
    share = busiest_share(p, t, compute_tiles, POSITIONS + ("tj",))
    out = p.N * p.OH * p.OW * p.Co * share
    tiles = p.N * -(-p.OH // t.R) * -(-p.OW // t.C) * -(-p.Co // t.Tn) * share
    drain = out * p.c_bytes / costs.streamer_bytes_per_cycle
    steps = [drain, *(costs.vector_cycles(dict(work)) * share for work in p.epilogue_work),
             out * p.out_bytes / costs.block_mover_bytes_per_cycle,
             out * p.out_bytes / costs.dma_engine_bytes_per_cycle + tiles * costs.dma_cycles_per_move]
    single = result_depth(p, t, {v for v, n in trips.items() if n > 1}) == 1
    return single, drain, max(a + b for a, b in zip(steps, steps[1:]))


# the estimates depend on the tiling and the target's array, engines and compute tiles, not on
# its memories: a chain's planner asks them again for the same tilings under many shares of those
@functools.lru_cache(maxsize=1 << 16)
def _array_cycles(p: ConvProblem, t: ConvTiling, rows: int, cols: int, compute_tiles: int, dataflow: str) -> int:
    """The loader deals the parallel loop's steps round-robin, and the last step may be short (a
    tile of 64 of 320 output channels beside one of 256): the busiest compute tile's steps are
    summed, not the whole's share."""
    sizes = t.step_sizes(p)
    k = [(p.KH * p.KW * size, count) for size, count in tile_sizes(p.Ci, t.Tc)]

    def work(along: str | None = None, extent: int = 0) -> int:
        """The array's cycles over every loop but `along`, which takes one step of `extent`."""
        mine = {**sizes, along: [(extent, 1)]} if along else sizes
        m = [(r * c, n * cr * cc) for _, n in mine["b0"] for r, cr in mine["th"] for c, cc in mine["tw"]]
        return array_cycles(m, mine["tj"], k, rows, cols, dataflow)

    parallel = parallel_loop(t.loop_order(p), t.trips(p), compute_tiles)
    if parallel.loop is None:
        return work()
    return int(busiest_steps(sizes[parallel.loop], parallel.workers, lambda extent: work(parallel.loop, extent)))


def _moves_bound(p: ConvProblem, t: ConvTiling, target: Target) -> tuple[float, int]:
    """What the busiest compute tile waits for besides its array, and the external-memory bytes:
    the busiest link (`link_cycles`: the streams over external memory, the chunks of input and
    weights each task takes from L3 down to L1 and the result's tiles coming up) or L2 bank (each
    operand's L2 tiles sit in one bank, whose ports take every byte a BlockMover writes there and
    a Streamer reads back); without the target's costs, nothing."""
    return _moves_bound_on(p, t, target.costs, target.compute_tiles)


@functools.lru_cache(maxsize=1 << 16)
def _moves_bound_on(p: ConvProblem, t: ConvTiling, costs: Costs | None, compute_tiles: int) -> tuple[float, int]:
    dram, moves = dram_moves(p, t)
    if costs is None:
        return 0.0, dram
    chunks = _chunks(p, t)
    bank = 2 * max(chunks[name] * busiest_share(p, t, compute_tiles, along) for name, along in CHUNKED.items()) \
        / costs.l2_bank_bytes_per_cycle
    return max(link_cycles(costs, dram, moves, sum(chunks.values()), sum(chunks.values())), bank), dram


# the loops each operand's chunks between L3 and L1 (and the result's tiles) step with
CHUNKED = {"x": POSITIONS + ("tk",), "w": ("tj", "tk"), "y": POSITIONS + ("tj",)}


def _chunk_streams(p: ConvProblem, t: ConvTiling) -> dict[str, Stream]:
    """x, w and y as they move between L3 and L1 (y: up from the accumulators)."""
    size = {s.name: s.bytes for s in band_streams(p, t)}
    return {name: Stream(name, along, size[name]) for name, along in CHUNKED.items()}


def _chunks(p: ConvProblem, t: ConvTiling) -> dict[str, int]:
    """The bytes each of x, w and y moves between L3 and L1."""
    order, trips = t.loop_order(p), t.trips(p)
    return {name: stream_traffic(s, order, trips) for name, s in _chunk_streams(p, t).items()}


@functools.lru_cache(maxsize=1 << 16)
def conv_pj(p: ConvProblem, t: ConvTiling, costs: Costs, compute_tiles: int) -> float:
    """The tiling's pJ as `hardware.energy` prices the simulator's counts: its external-memory
    bytes at both ends, each chunk of input and weights from L3 to L2 to L1 (`copies_below_l3`),
    the array's reads there (each task reads its windows, the input of every output position
    once per tile of output channels, and its weights, all of them once per tile of positions),
    each result tile from the accumulators up to L3, each MAC with its register reads (a bias's
    and an epilogue's moves and vector work are left out)."""
    pj = costs.energy.access_pj_per_byte
    order, trips, streams = t.loop_order(p), t.trips(p), _chunk_streams(p, t)
    down = sum(copies_below_l3(streams[name], order, trips, compute_tiles) for name in ("x", "w"))
    windows = p.N * p.OH * p.OW * p.KH * p.KW * p.Ci
    read = windows * p.x_bytes * trips["tj"] + streams["w"].bytes * trips["b0"] * trips["th"] * trips["tw"]
    return (dram_moves(p, t)[0] * (pj["external"] + pj["l3"])
            + down * (pj["l3"] + 2 * pj["l2"] + pj["l1"]) + read * pj["l1"]
            + stream_traffic(streams["y"], order, trips) * (pj["register"] + 2 * pj["l2"] + pj["l3"])
            + costs.mac_pj(windows * p.Co, p.dtype, p.x_bytes))


# How the operands are held, (loop order, input band in L3, weights in L3); the others are
# dominated: they move the same bytes with larger buffers. Positions outer, the weights are
# loaded once (all) or with each chunk (chunk: a tile with every input channel would be
# reloaded as often, for each tile of positions); channels outer, a tile of output channels'
# weights stays while every band streams past once per such tile (in chunks, as any larger band
# would be reloaded as often).
HOLDINGS = (("positions", "all", "all"), ("positions", "all", "chunk"), ("positions", "chunk", "all"),
            ("positions", "chunk", "chunk"), ("channels", "chunk", "tile"))
# A layer of one output position (a classifier after a global pooling) is the stream of its
# weights: its input, whole in L3, is loaded once in any order, and the weights of a tile of
# output channels may come in one move, not a move per chunk, each holding a DMA engine for the
# DRAM latency. Its tilings are tried first, and of those that tie the fewest moves go first
# (`_exposed`; MobileNet v1's classifier, 4.1 MB: 59,245 cycles in 16 KB moves, 51,582 in 64 KB)
WEIGHT_STREAM = ("channels", "all", "tile")
MIN_CHUNK = 4  # input channels per chunk: fewer only where no tiling with more fits


def _fits(p: ConvProblem, target: Target, R: int, C: int, Tn: int, Tc: int, holding: tuple[str, str, str],
          on_tile: dict[tuple[int, int, int, int], bool]) -> bool:
    """Whether the tiling's buffers fit; `on_tile`: whether its L2 and L1 ones do, per (R, C, Tn, Tc)."""
    band_h, band_w = p.band(R, C)
    if band_h * band_w * Tc * p.x_bytes > target.l1.bank_bytes:  # a band's chunk alone: many tries end here
        return False
    t = ConvTiling(R, C, Tn, Tc, *holding)
    near = on_tile.get((R, C, Tn, Tc))
    if near is None:
        near = on_tile[R, C, Tn, Tc] = fits(tile_buffers(p, t), target)
    if not near:
        return False
    private, shared = l3_buffers(p, t)
    return fits(private, target, shared)


# the channel tilings to try depend on the problem alone: a chain's planner searches each problem
# again under many shares of the target
@functools.lru_cache(maxsize=4096)
def _channel_tilings(p: ConvProblem, narrowest: tuple[int, int], line: int) -> tuple[tuple, ...]:
    """For each way of holding the operands and each tile of output channels (at least
    `narrowest`'s or all), the tiles of input channels (likewise), each with the extents of the
    least buffers any tiling with them takes: those of one row of the narrowest tiles, the
    problem single-buffered ((holding, Tn, ((Tc, extents), ...)), ...)."""
    least = replace(p, depth=1, results=1)  # single-buffered: no tiling of p has smaller buffers than the same of this
    narrowest_C = widths(p.OW)[-1]
    fewest_out, fewest_in = narrowest
    out = []
    for holding in ((WEIGHT_STREAM,) if p.N * p.OH * p.OW == 1 else ()) + HOLDINGS:
        order, band_channels, _ = holding
        for Tn in [n for n in channel_splits(p.Co) if n == p.Co or n >= fewest_out]:
            chunks = []
            for Tc in [c for c in channel_splits(p.Ci) if c == p.Ci or c >= fewest_in]:
                if Tc == p.Ci and order == "positions" and band_channels == "chunk":
                    continue  # with one chunk, a chunk is all the channels
                t = ConvTiling(1, narrowest_C, Tn, Tc, *holding)
                private, shared = l3_buffers(least, t)
                chunks.append((Tc, extents([*tile_buffers(least, t), *private, *(("L3", s) for s in shared)], line)))
            out.append((holding, Tn, tuple(chunks)))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _on_tile(p: ConvProblem, l1: Level, l2: Level, line: int) -> dict[tuple[int, int, int, int], bool]:
    """The record, which `_fits` fills, of whether a tiling's L2 and L1 buffers fit these levels,
    per (R, C, Tn, Tc): one for every share of L3 and of the rows a chain's planner tries."""
    return {}


def _candidates(p: ConvProblem, target: Target, narrowest: tuple[int, int],
                within: dict[tuple, tuple[int, int]] | None = None) -> list[ConvTiling]:
    """For each way of holding the operands and each channel tiling, the tallest output tiles
    that fit, as wide as fit, and those cut down to whole blocks of array rows. Output and input
    channels in tiles of at least `narrowest` (or all of them); smaller input chunks only while
    they let the output tiles grow. With `within`, only tiles no taller nor wider than its
    (R, C) for the holding and channel tiles (those of the same problem with less to hold)."""
    out = []
    on_tile = _on_tile(p, target.l1, target.l2, target.line_bytes)
    for holding, Tn, chunks in _channel_tilings(p, narrowest, target.line_bytes):
        for Tc, least_extents in chunks:
            if target.reads_by_channels and holding[1] == "all":
                continue
            if not extents_fit(least_extents, target):
                continue  # not even one row of the narrowest tiles fits: none of these channels does
            most = (p.OH, p.OW) if within is None else within.get((*holding, Tn, Tc))
            if most is None:
                continue
            found = tallest(p, lambda R, C: R <= most[0] and C <= most[1]
                            and _fits(p, target, R, C, Tn, Tc, holding, on_tile), target)
            if found is None:
                continue
            R, C = found
            out.append(ConvTiling(R, C, Tn, Tc, *holding))
            aligned = max((r for r in range(R, 0, -1) if r * C % target.rows == 0), default=None)
            if aligned is not None and aligned != R:
                out.append(ConvTiling(aligned, C, Tn, Tc, *holding))
            if (R, C) == (p.OH, p.OW):
                break  # the whole image fits: smaller chunks would only cost steps
    return out


def choose_conv_tiling(p: ConvProblem, target: Target, dataflows: tuple[str, ...],
                       narrowest: tuple[int, int]) -> tuple[ConvProblem, ConvTiling, str]:
    """The tiling (and dataflow, and the problem with its result tiles one or two deep) with the
    fewest external-memory bytes among those within CYCLE_SLACK of the fewest array cycles, or
    for an objective but latency of its least figure, its channel tiles at least `narrowest`
    (output, input); ValueError when none fits."""
    found = _best_tiling(p, target, dataflows, narrowest)
    if found is None:
        raise ValueError("no tiling fits")
    return found


# The choice depends on its arguments alone, and networks repeat their convolutions (ResNet-50's
# 53 are 23 problems, ShuffleNet's 129 per-group ones 8): each is searched once per process.
# Result tiles double-buffered (where loads are) or single, whichever ranks better: two cost
# room the tiles could have, one costs the array a wait for each tile's drain and the steps after
# it (`_result_wait`). Two are searched only where the fastest single tiling waits for them longer
# than CYCLE_SLACK lets a tiling be slower (else two could buy little more than the slack). Under
# every objective: by energy a second buffer moves no byte more, so it wins only where its tiling
# costs no more pJ (MobileNet v2's 112 x 112 and 56 x 56 expansions by edp take it: 1,602,453 ->
# 1,526,542 cycles).
@functools.lru_cache(maxsize=4096)
def _best_tiling(p: ConvProblem, target: Target, dataflows: tuple[str, ...],
                 narrowest: tuple[int, int]) -> tuple[ConvProblem, ConvTiling, str] | None:
    single = _candidates(p, target, narrowest)
    scored = _scored(p, single, target, dataflows)
    if scored and p.depth == 2 and target.costs is not None:
        fastest = min(scored, key=lambda s: s.cycles)
        array = _array_cycles(p, fastest.tiling, target.rows, target.cols, target.compute_tiles, fastest.dataflow)
        if _result_wait(p, fastest.tiling, target, array) > (CYCLE_SLACK - 1) * fastest.cycles:
            within: dict[tuple, tuple[int, int]] = {}
            for t in single:  # the tallest first
                within.setdefault((t.order, t.band_channels, t.weights, t.Tn, t.Tc), (t.R, t.C))
            doubled = replace(p, results=2)
            scored += _scored(doubled, _candidates(doubled, target, narrowest, within), target, dataflows)
    if not scored:
        return None
    fewest = min(s.cycles for s in scored)
    one = replace(p, results=1)  # what the exposure and the pJ count: not the result buffers

    def rank(s: Scored) -> tuple:
        t = s.tiling
        exposed = _exposed(one, t, target.costs, s.link_bound)
        return s.dram, s.cycles, exposed, -t.R * t.C, s.dataflow, -s.problem.results

    if target.costs is not None and target.objective != "latency":
        def figure(s: Scored) -> float:
            pj = conv_pj(one, s.tiling, target.costs, target.compute_tiles)
            return pj if target.objective == "energy" else pj * s.cycles

        best = min(scored, key=lambda s: (figure(s), *rank(s)))
    else:
        best = min((s for s in scored if s.cycles <= fewest * CYCLE_SLACK), key=rank)
    return best.problem, best.tiling, best.dataflow


@functools.lru_cache(maxsize=1 << 16)
def _exposed(p: ConvProblem, t: ConvTiling, costs: Costs | None, link_bound: bool) -> float:
    """What of the DMAs' time shows in the run beyond the estimate's cycles: where the array
    bounds the kernel, the cycles it waits at the start for its first band and weights (bytes,
    without costs); where the link does, the DRAM latency its moves hold the DMA engines for
    (the link's estimate may be its bytes' time alone, the channels being slower)."""
    if link_bound:
        return dram_moves(p, t)[1] * costs.dma_cycles_per_move / costs.dma_engines
    first = sum(_l3_tiles(p, t).values())
    return first if costs is None else first / costs.dram_bytes_per_cycle


class Scored(NamedTuple):
    """A candidate tiling in one dataflow, as `_best_tiling` ranks it."""

    cycles: int  # the array's, with its drains, or the moves' where longer
    dram: int  # external-memory bytes
    tiling: ConvTiling
    dataflow: str
    problem: ConvProblem
    link_bound: bool  # whether the moves bound it


def _scored(p: ConvProblem, candidates: list[ConvTiling], target: Target,
            dataflows: tuple[str, ...]) -> list[Scored]:
    """Each candidate in each dataflow, scored."""
    scored = []
    single = replace(p, results=1)  # the array's work and the moves do not depend on it: cached once for both
    for t in candidates:
        moves, dram = _moves_bound(single, t, target)
        for dataflow in dataflows:
            array = _array_cycles(single, t, target.rows, target.cols, target.compute_tiles, dataflow)
            array += _result_wait(p, t, target, array)
            scored.append(Scored(math.ceil(max(array, moves)), dram, t, dataflow, p, moves > array))
    return scored


def lower_conv(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """A CONV2D and its epilogue (applied on the vector unit to each result tile in L2)."""
    op = ops[0]
    where = op.source or op.name
    attrs = lookup(op.op_type).normalize_attrs(op.attrs)
    if attrs["layout"] != "NHWC" or attrs["groups"] != 1:
        raise CompileError(f"{where}: CONV2D with layout {attrs['layout']} and {attrs['groups']} groups reaches "
                           f"the lowering; only NHWC with one group lowers (a compiler pass rewrites the others)")
    x, w, c = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
    if 0 in x.shape or 0 in w.shape:
        raise CompileError(f"{where}: CONV2D of {list(x.shape)} by {list(w.shape)} has an empty dimension; "
                           f"there is nothing to tile")
    dataflows = (choose_dataflow(dataflow, None, target, where),) if dataflow != "auto" else target.dataflows

    epilogue_ops = tuple(tuple(sorted(epilogue_work(graph, [o]).items())) for o in ops[1:])
    p = layer(ConvProblem, graph, ops, 2, c_bytes=itemsize(c.dtype), epilogue_work=epilogue_ops, dtype=x.dtype,
              x_home="L2" if x.name in target.in_l2 else "L3" if x.name in target.in_l3 else None)
    # double-buffered loads where they fit, and channel tiles of at least the array's columns and
    # MIN_CHUNK input channels; narrower ones only where no such tiling fits (a small L1)
    found = first_fit(((replace(p, depth=depth), narrowest)
                       for narrowest, depth in (((target.cols, MIN_CHUNK), 2), ((target.cols, MIN_CHUNK), 1),
                                                ((1, 1), 2), ((1, 1), 1))),
                      lambda attempt: choose_conv_tiling(attempt[0], target, dataflows, attempt[1]))
    if found is None:
        raise CompileError(f"{where}: no tiling of CONV2D {list(x.shape)} by {list(w.shape)} fits target "
                           f"'{target.name}'")
    _, (problem, tiling, chosen) = found
    return _kernel(graph, ops, name, target, problem, tiling, chosen)


def _kernel(graph: Graph, ops: list[Op], name: str, target: Target, p: ConvProblem, t: ConvTiling,
            dataflow: str) -> Kernel:
    op, epi = ops[0], ops[1:]
    w = graph.tensors[op.inputs[1]]
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) == 3 else None
    attrs = lookup(op.op_type).normalize_attrs(op.attrs)
    order = t.loop_order(p)
    builder = Body(order, p.depth)
    body, idx = builder.ops, builder.index

    def w_ref(level: str, held: str) -> TileRef:
        if held == "all":
            return TileRef(w.name, level, ["0"] * 4, list(w.shape))
        # (loop, extent) of the tile along each weight dim, in the weights' own order
        dims = {"O": ("tj", t.Tn), "H": ("0", p.KH), "W": ("0", p.KW),
                "I": ("tk", t.Tc) if held == "chunk" else ("0", p.Ci)}
        layout = weight_layout(attrs)
        return TileRef(w.name, level, idx(*(dims[d][0] for d in layout)), [dims[d][1] for d in layout])

    # a move names its destination's tile at both ends: L3 -> L2 reads a chunk out of the L3 tile
    x_l1, x_tile = builder.input_bands(graph, op, p, t, "tk", t.Tc, all_channels=t.band_channels == "all")
    w_l1 = builder.loads([(w_ref("EXTERNAL", t.weights), w_ref("L3", t.weights)),
                          (w_ref("L3", "chunk"), w_ref("L2", "chunk")),
                          (w_ref("L2", "chunk"), w_ref("L1", "chunk"))])
    to_ohwi = weight_perms(attrs, "OHWI")
    if to_ohwi != sorted(to_ohwi):  # the BlockMover hands the array OHWI tiles (the L3 -> L2 hop)
        body[w_l1 - 1] = replace(body[w_l1 - 1], permutation=to_ohwi)
    inputs = [x_tile, w_ref("L1", "chunk")]
    deps = [x_l1, w_l1]
    if bias is not None:  # into the accumulators, as MATMUL's Cin: the first K step adds to it
        def b_ref(level: str, whole: bool = False) -> TileRef:
            along = p.bias_along and not whole
            return TileRef(bias.name, level, idx("tj") if along else ["0"] * len(bias.shape),
                           [t.Tn] if along else list(bias.shape))

        deps.append(builder.loads([(b_ref("EXTERNAL", t.bias_whole), b_ref("L3", t.bias_whole)),
                                   (b_ref("L3"), b_ref("L2")),
                                   (b_ref("L2"), b_ref("REGISTER"))], repeat=False))
        inputs.append(b_ref("REGISTER"))
    inner = order[-1] if order else None
    space = builder.output_space(p, t, t.Tn)
    c_ref = lambda level: output_ref(op.outputs[0], level, space)
    depth = result_depth(p, t, set(order))
    body.append(Compute(len(body), "CONV2D_TILE", inputs, c_ref("REGISTER"), at=inner,
                        accumulate="tk > 0" if "tk" in order else "false", depends_on=deps, depth=depth))
    # the accumulators drain to L2 after the last chunk of input channels; an epilogue runs there
    place = {"after": "tk"} if "tk" in order else {"at": inner}
    body.append(DataMove(len(body), "STORE", c_ref("REGISTER"), c_ref("L2"), depth=depth,
                         depends_on=[len(body) - 1], **place))
    extra = builder.finish(graph, ops, "L2", space, place, level="L2", depth=depth)

    macs = p.N * p.OH * p.OW * p.Co * p.KH * p.KW * p.Ci
    return band_kernel(graph, ops, name, target, p, t, body, extra, dataflow, {"Tn": t.Tn, "Tc": t.Tc}, lambda dram: {
        "macs": macs,
        "implicit_gemm": {"M": p.N * p.OH * p.OW, "N": p.Co, "K": p.KH * p.KW * p.Ci},
        "l3_resident": {"all": "all weights, shared", "tile": f"weights of {t.Tn} output channels",
                        "chunk": "none"}[t.weights],
        "estimated_compute_cycles": _cycles(p, t, target, dataflow),
        "arithmetic_intensity": round(2 * macs / dram, 3),
        **({"vector_elements": dict(sorted(epilogue_work(graph, epi).items()))} if epi else {})})
