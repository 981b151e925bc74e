"""The band tiling the sliding-window lowerings share (lower_conv on the array, lower_window on
the vector unit): a `Layer` slides H and W windows over an NHWC input, a `BandTiling` cuts its
output into tiles of R rows by C columns (loops b0, th, tw, then the layer's channel loops), each
tile's input a band with its halo and padding, `Layer.band(R, C)`: the output band of the layer
before. Here: the streams over external memory, buffer depths (`load_depth`, for the body and the
counts that size it alike), the tallest tiles that fit, the body's input bands, epilogue and
stores (`Body`), the kernel around it. A lowering keeps its weights, its compute, its ranking.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterable, Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import ClassVar, TypeVar

from dfx import DataMove, Graph, Kernel, Op, TileLoop, TileRef, itemsize, lookup

from .lower_vector import Space, dram_hints, epilogue, kernel_reads, store, tile_ref, traffic
from .requirements import Buffer, body_buffers, requirements
from .target import Target
from .tiling import Stream, busiest_steps, parallel_loop, placement, stream_moves, stream_traffic, tile_sizes

POSITIONS = ("b0", "th", "tw")  # images, bands of output rows, bands of output columns
CYCLE_SLACK = 1.05  # cycles a tiling may spend over the fewest to move fewer bytes
L = TypeVar("L", bound="Layer")


@dataclass(frozen=True)
class Layer:
    """H and W windows (`hw`: dfx.ops.window.Window) over an input N x H x W x Ci making OH x OW
    positions of Co channels; bytes per element of the input, weights and bias (0: none), and
    of the kernel's result."""

    N: int
    H: int
    W: int
    Ci: int
    OH: int
    OW: int
    Co: int
    hw: tuple
    weights: tuple[int, ...] | None  # their shape in their own layout (None: a pool)
    x_bytes: int
    w_bytes: int
    bias_bytes: int
    bias_along: bool  # one bias per output channel (else one for all)
    out_bytes: int
    epilogue_operands: tuple[tuple[int, bool], ...]  # (bytes per element, varies along positions)
    depth: int  # buffers of a load that repeats
    results: int  # buffers of a result tile that repeats (`result_depth`)

    def band(self, R: int, C: int) -> tuple[int, int]:
        """Rows and columns of the input band an output tile of R x C positions needs."""
        return self.hw[0].band(R)[0], self.hw[1].band(C)[0]


def layer(kind: type[L], graph: Graph, ops: list[Op], depth: int, **own) -> L:
    """The layer (`kind`, with its `own` fields) of a group [window op (x, w?, bias?), *epilogue]."""
    op = ops[0]
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    w = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 else None
    N, H, W, Ci = x.shape
    _, OH, OW, Co = y.shape
    opdef = lookup(op.op_type)
    hw = opdef.windows(opdef.normalize_attrs(op.attrs), [graph.tensors[n].shape for n in op.inputs])
    epilogue_operands = [graph.tensors[n] for n in kernel_reads(ops)[len(op.inputs):]]
    return kind(N, H, W, Ci, OH, OW, Co, hw, w.shape if w else None, itemsize(x.dtype), itemsize(w.dtype) if w else 0,
                itemsize(bias.dtype) if bias else 0, bias is not None and bias.shape == (Co,) and Co > 1,
                itemsize(graph.tensors[ops[-1].outputs[0]].dtype),
                tuple((itemsize(t.dtype), math.prod(t.shape[:-1]) > 1) for t in epilogue_operands), depth, 1, **own)


@dataclass(frozen=True)
class BandTiling:
    """Output tiles of R rows by C columns. A lowering's tiling names its other loops: `CHANNEL`
    (over output channels), `nest()` (all, outermost first), `channel_trips(p)`,
    `channel_extent(p)` (the channels `CHANNEL` steps over, and a tile's), and `stream_loops(p)`,
    those each stream's tile index depends on (x: the input, w: the weights, y:
    the kernel's result, bias)."""

    CHANNEL: ClassVar[str]
    R: int
    C: int

    def trips(self, p: Layer) -> dict[str, int]:
        return {"b0": p.N, "th": -(-p.OH // self.R), "tw": -(-p.OW // self.C), **self.channel_trips(p)}

    def loop_order(self, p: Layer) -> tuple[str, ...]:
        """The loops that run (more than one trip), outermost first."""
        trips = self.trips(p)
        return tuple(v for v in self.nest() if trips[v] > 1)

    def step_sizes(self, p: Layer) -> dict[str, list[tuple[int, int]]]:
        """The (extent, count) sizes of the tiles each loop over positions or the channels of the
        result steps (`channel_extent`: the channels and a tile's)."""
        channels, tile = self.channel_extent(p)
        return {"b0": [(1, p.N)], "th": tile_sizes(p.OH, self.R), "tw": tile_sizes(p.OW, self.C),
                self.CHANNEL: tile_sizes(channels, tile)}


# a chain's planner asks again for the same tilings under many shares of the target
@functools.lru_cache(maxsize=1 << 16)
def busiest_share(p: Layer, t: BandTiling, compute_tiles: int, along: tuple[str, ...] | None = None) -> float:
    """The share of work (or of a stream whose tiles the loops `along` index) that the busiest
    compute tile takes: where the parallel loop grows it (any, without `along`), the extents of
    that tile's own steps of the loop (dealt round-robin, the last maybe short:
    `tiling.busiest_steps`) over the loop's whole; else its count of steps over all of them."""
    parallel = parallel_loop(t.loop_order(p), t.trips(p), compute_tiles)
    if parallel.loop is None:
        return 1.0
    sizes = t.step_sizes(p)[parallel.loop]
    if along is not None and parallel.loop not in along:
        sizes = [(1, count) for _, count in sizes]
    return busiest_steps(sizes, parallel.workers, lambda extent: extent) / sum(e * n for e, n in sizes)


def load_depth(depth: int, runs: AbstractSet[str], loops: Iterable[str]) -> int:
    """Buffers of a load whose tile is indexed by `loops`: `depth` where it repeats (a loop that
    runs indexes it), else one."""
    return depth if not runs.isdisjoint(loops) else 1


def result_depth(p: Layer, t: BandTiling, runs: AbstractSet[str]) -> int:
    """Buffers of the result tile at every level it goes through (the accumulators, the
    epilogue's results, the stores'): `p.results` where output tiles repeat, so the next one is
    computed while this one drains, goes through its epilogue and is stored."""
    return load_depth(p.results, runs, POSITIONS + (t.CHANNEL,))


def band_elements(window, out_dim: int, out_tile: int, dim: int) -> int:
    """Input elements inside the tensor summed over the bands of one spatial dim: what crosses
    the external memory link for them, halo included."""
    extent, step, offset = window.band(out_tile)
    bands = -(-out_dim // out_tile)
    # the bands from `first` (the first to start inside the tensor) up to `last` lie wholly
    # inside it and hold `extent` each; only those over its start's padding and from `last` on
    # (at its end, or past it) are cut, and counted one by one
    first = min(bands, max(0, -(offset // step)))
    last = max(first, min(bands, (dim - extent - offset) // step + 1))
    cut = (offset + i * step for i in (*range(first), *range(last, bands)))
    return (last - first) * extent + sum(max(0, min(start + extent, dim) - max(start, 0)) for start in cut)


def epilogue_loops(along: bool, channel: str) -> tuple[str, ...]:
    """An epilogue operand's loops: an output tile's where it varies along positions, else its channel's."""
    return POSITIONS + (channel,) if along else (channel,)


def band_streams(p: Layer, t: BandTiling) -> list[Stream]:
    """The streams of `t.stream_loops` and the epilogue's (`epilogue<i>`), each with the bytes of
    one sweep over its tiles: the input once per band."""
    halo = band_elements(p.hw[0], p.OH, t.R, p.H) * band_elements(p.hw[1], p.OW, t.C, p.W)
    sizes = {"x": p.N * halo * p.Ci * p.x_bytes, "w": math.prod(p.weights or ()) * p.w_bytes,
             "y": p.N * p.OH * p.OW * p.Co * p.out_bytes, "bias": (p.Co if p.bias_along else 1) * p.bias_bytes}
    return [Stream(name, v, sizes[name]) for name, v in t.stream_loops(p).items()] + [
        Stream(f"epilogue{i}", epilogue_loops(along, t.CHANNEL), (p.N * p.OH * p.OW if along else 1) * p.Co * size)
        for i, (size, along) in enumerate(p.epilogue_operands)]


def epilogue_buffers(p: Layer, t: BandTiling, runs: AbstractSet[str], level: str, out_tile: int,
                     channel_tile: int) -> list[Buffer]:
    """Each epilogue operand's buffer at a level its tiles go through: an output tile (or its
    `channel_tile` channels), as deep as its loads."""
    return [(level, (out_tile if along else channel_tile) * size
             * load_depth(p.depth, runs, epilogue_loops(along, t.CHANNEL))) for size, along in p.epilogue_operands]


def widths(out_dim: int) -> list[int]:
    """Output tile extents to try along W, widest first: the whole row, then halves of it."""
    return sorted({-(-out_dim // 2 ** j) for j in range(out_dim.bit_length())}, reverse=True)


def channel_splits(dim: int) -> list[int]:
    """Tile extents to try along a channel dim: all of it, then the powers of two below it."""
    return [dim] + [1 << j for j in range((dim - 1).bit_length() - 1, -1, -1)]


def tallest(p: Layer, fit: Callable[[int, int], bool], target: Target) -> tuple[int, int] | None:
    """(R, C) of the tallest output tiles that fit, at most the target's `rows_share` of the rows,
    as wide as fit (a binary search on R: fitting mostly shrinks as R grows; where it does not,
    as where the loop dealt to the compute tiles changes with R, the search's probes decide), or
    the whole image alone for a target whose share is None; None where none fits. All the rows
    are tried first: one band of them is loaded once, single-buffered, so it may fit where a
    band of fewer rows, double-buffered as it repeats, does not (a 1x1 convolution holding all
    its input channels in L3: MobileNet v1's 14 x 14 x 512 layers)."""
    if target.rows_share is None:
        return (p.OH, p.OW) if fit(p.OH, p.OW) else None
    most = max(1, math.ceil(p.OH * target.rows_share))
    for C in widths(p.OW):
        top = most
        if most == p.OH:  # all the rows first: the search, on a fit not monotone in R, may miss them
            if fit(most, C):
                return most, C
            top -= 1  # the search below them
        R = bisect.bisect_left(range(1, top + 1), True, key=lambda R: not fit(R, C))
        if R:
            return R, C
    return None


def band_ref(tensor: str, level: str, indices: list[str], hw: tuple, R: int, C: int, channels: int) -> TileRef:
    """The input bands that output tiles of R x C positions (and `channels` channels) need:
    NHWC tiles of rows and columns with their halo, holding their share of the padding."""
    (top, bottom), (left, right) = (hw[0].before, hw[0].after), (hw[1].before, hw[1].after)
    return TileRef(tensor, level, indices, [1, hw[0].band(R)[0], hw[1].band(C)[0], channels],
                   offset=[0, -top, -left, 0], step=[1, R * hw[0].stride, C * hw[1].stride, channels],
                   padding=[[0, 0], [top, bottom], [left, right], [0, 0]] if any((top, bottom, left, right)) else None)


@dataclass
class Body:
    """A kernel body being built over a loop order (outermost first, loops of one trip left out)."""

    order: tuple[str, ...]
    depth: int  # buffers of a load that repeats
    ops: list = field(default_factory=list)

    def index(self, *loops: str) -> list[str]:
        """Tile indices by these loops, "0" for one that does not run."""
        return [v if v in self.order else "0" for v in loops]

    def at(self, tile: TileRef) -> str | None:
        """A move sits at the innermost loop indexing its destination tile (None: before all)."""
        deepest = max((self.order.index(i) for i in tile.tile_indices if i in self.order), default=-1)
        return self.order[deepest] if deepest >= 0 else None

    def loads(self, hops: list[tuple[TileRef, TileRef]], fill: int | float | None = None,
              repeat: bool = True) -> int:
        """Append the loads of one operand hop by hop, each double-buffered where it repeats
        (and `repeat`); the id of the last. A move names its destination's tile at both ends."""
        prev: list[int] = []
        for src, dst in hops:
            self.ops.append(DataMove(len(self.ops), "LOAD", src, dst, at=self.at(dst),
                                     depth=load_depth(self.depth, set(self.order), dst.tile_indices) if repeat else 1,
                                     depends_on=prev, fill=fill))
            prev = [len(self.ops) - 1]
        return prev[0]

    def input_bands(self, graph: Graph, op: Op, p: Layer, t: BandTiling, chunk_loop: str, chunk: int,
                    all_channels: bool = False) -> tuple[int, TileRef]:
        """Append the loads of the input's bands: into L3 with all their channels or a chunk of
        `chunk` (stepped by `chunk_loop`), the chunk on to L2 and L1, the padding written with
        the registry's value for the op. (id of the last, its L1 tile.)"""
        x = graph.tensors[op.inputs[0]]
        padded = any((p.hw[0].before, p.hw[0].after, p.hw[1].before, p.hw[1].after))

        def ref(level: str, whole: bool) -> TileRef:
            return band_ref(x.name, level, self.index(*POSITIONS, "0" if whole else chunk_loop), p.hw, t.R, t.C,
                            p.Ci if whole else chunk)

        opdef = lookup(op.op_type)
        last = self.loads([(ref("EXTERNAL", all_channels), ref("L3", all_channels)),
                           (ref("L3", False), ref("L2", False)), (ref("L2", False), ref("L1", False))],
                          opdef.padding_value(opdef.normalize_attrs(op.attrs), x.dtype) if padded else None)
        return last, ref("L1", False)

    def output_space(self, p: Layer, t: BandTiling, channels: int) -> Space:
        """The output as its tiles (1 x R x C x `channels`) go through the epilogue and the stores."""
        return Space((p.N, p.OH, p.OW, p.Co), (1, t.R, t.C, channels),
                     tuple(v if v in self.order else None for v in (*POSITIONS, t.CHANNEL)))

    def finish(self, graph: Graph, ops: list[Op], result_level: str, space: Space, place: dict,
               level: str, depth: int, l3_depth: int | None = None) -> list[Stream]:
        """Append, after the op just appended (the anchor's result at `result_level`), the epilogue
        (its operands loaded to `level`) and the stores of its result from `level`, the result
        tile's buffers `depth` deep (`result_depth`; in L3, `l3_depth` where given); its streams."""
        final, last, streams = epilogue(self.ops, graph, ops[1:], ops[0].outputs[0], result_level,
                                        len(self.ops) - 1, space, self.order, self.depth, place, level, depth)
        store(self.ops, final, list(range(4)), space, last, place, source=level, depth=depth, l3_depth=l3_depth)
        return streams


def output_ref(tensor: str, level: str, space: Space) -> TileRef:
    """A tile of the output (or of an epilogue's result) at `level`."""
    return tile_ref(tensor, level, list(range(4)), space)


def copies_below_l3(stream: Stream, order: tuple[str, ...], trips: dict[str, int], compute_tiles: int) -> int:
    """The bytes a load moves on each hop below L3: its traffic, on every compute tile where it
    sits outside the parallel loop (there each makes its own copy; only the L3 load is shared)."""
    parallel = parallel_loop(order, trips, compute_tiles)
    outside = parallel.loop is None or placement(stream, order) < order.index(parallel.loop)
    return stream_traffic(stream, order, trips) * (parallel.workers if outside else 1)


def dram_bytes(p: Layer, t: BandTiling) -> int:
    """The bytes the tiling's streams move over external memory, exactly."""
    return sum(traffic(band_streams(p, t), t.loop_order(p), t.trips(p)).values())


def dram_moves(p: Layer, t: BandTiling) -> tuple[int, int]:
    """The bytes the tiling's streams move over external memory, and in how many moves: each
    sweep of a stream moves each of its tiles once."""
    order, trips = t.loop_order(p), t.trips(p)
    streams = band_streams(p, t)
    return (sum(stream_traffic(s, order, trips) for s in streams),
            sum(stream_moves(s, order, trips) for s in streams))


def band_kernel(graph: Graph, ops: list[Op], name: str, target: Target, p: Layer, t: BandTiling, body: list,
                extra: list[Stream], dataflow: str, extents: dict[str, int], hints: Callable[[int], dict]) -> Kernel:
    """The kernel around a band tiling's body: the exact DRAM bytes per tensor of its streams (x,
    w, bias, y by their tensors' names) and the epilogue's (`extra`), the lowering's `hints` given
    those bytes; the tiling with the channel `extents`; the loop with most trips parallel."""
    order, trips = t.loop_order(p), t.trips(p)
    parallel = parallel_loop(order, trips, target.compute_tiles)
    names = dict(zip(("x", "w", "bias"), ops[0].inputs), y=ops[-1].outputs[0])
    per_stream = traffic([replace(s, name=names[s.name]) for s in band_streams(p, t) if s.name in names] + extra,
                         order, trips)
    band_h, band_w = p.band(t.R, t.C)
    final = graph.tensors[ops[-1].outputs[0]]
    compulsory = sum(graph.tensors[n].size * itemsize(graph.tensors[n].dtype) for n in kernel_reads(ops)) \
        + final.size * itemsize(final.dtype)
    return Kernel(
        name=name, op=ops[0].op_type, graph_op=ops[0].name, dataflow=dataflow,
        tiling={"R": t.R, "C": t.C, **extents, "band_rows": band_h, "band_cols": band_w,
                **{f"num_tiles_{v}": n for v, n in trips.items()}},
        tile_loops=[TileLoop(v, 0, trips[v], parallel=v == parallel.loop) for v in order],
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints={**hints(sum(per_stream.values())), **dram_hints(per_stream, compulsory, target, parallel.workers)},
        epilogue=[o.name for o in ops[1:]],
        inputs=kernel_reads(ops),
        outputs=list(ops[-1].outputs),
    )
