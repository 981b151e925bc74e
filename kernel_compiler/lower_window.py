"""Lower a window op (DEPTHWISE_CONV2D, MAXPOOL2D, AVGPOOL2D, SUMPOOL2D) to a tiled DFX kernel on
the vector unit.

Why not the array: a depthwise window reads one input channel per output channel, so as a
product it is C separate GEMMs of n = 1 (M = output positions, K = kh * kw), which is how
SCALE-Sim maps it: one column of the array busy, 1-3% of its MACs. The vector unit does the same
kh * kw multiply-adds per output element on all its lanes at once, and a pool's maxima and sums
are not products at all. Its utilization is reported as the vector unit's.

Tiled by bands as a convolution is (bands.py): loops b0, th, tw, then tc (Tc channels; all of
them when a channel has several results, so that a loop steps input and result channels alike).
Each band (padded with the registry's fill: zero, or the lowest value for a max) comes to L3 once
and down to L1 whole; the weights (and bias) sit in L3 whole where they fit, one copy for every
compute tile. The result tile is written to L1 (with an epilogue, to the registers, the
epilogue's last result to L1) and stored from there. The tiling taken moves the fewest
external-memory bytes among those within CYCLE_SLACK of the fewest cycles (the vector unit's on
the busiest compute tile, or a link's where longer), then has the largest tiles; for an
objective but latency, the one of least pJ or pJ x cycles, then the best balance of the compute
tiles. Its results are two deep (but in L3) where its loads are and it fits so.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from dfx import Compute, Graph, Kernel, Op, TileRef, lookup

from .bands import (
    CYCLE_SLACK, POSITIONS, BandTiling, Body, Layer, band_kernel, band_streams, busiest_share, channel_splits,
    copies_below_l3, dram_bytes, dram_moves, epilogue_buffers, layer, load_depth, output_ref, result_depth, tallest,
)
from .errors import CompileError
from .lower_vector import epilogue_work
from .requirements import Buffer, fits
from .target import Costs, Target
from .tiling import Stream, first_fit, link_cycles, stream_traffic


# result tiles in L3 one deep, whatever they are below: a second there takes room homes would
# have (MobileNet v2 on minimal: 7 MB more DRAM) and its store holds up no unit
L3_RESULTS = 1


@dataclass(frozen=True)
class WindowProblem(Layer):  # its weights, if any, HWCM
    @property
    def multiplier(self) -> int:  # results per input channel
        return self.Co // self.Ci


@dataclass(frozen=True)
class WindowTiling(BandTiling):
    CHANNEL = "tc"
    Tc: int
    weights_whole: bool  # the weights (and bias) sit in L3 whole, loaded once

    def channel_trips(self, p: WindowProblem) -> dict[str, int]:
        return {"tc": -(-p.Ci // self.Tc)}

    def channel_extent(self, p: WindowProblem) -> tuple[int, int]:
        return p.Ci, self.Tc

    def nest(self) -> tuple[str, ...]:
        return POSITIONS + ("tc",)

    def stream_loops(self, p: WindowProblem) -> dict[str, tuple[str, ...]]:
        channels = () if self.weights_whole else ("tc",)
        loops = {"x": self.nest(), "y": self.nest()}
        if p.weights is not None:
            loops["w"] = channels
        if p.bias_bytes:
            loops["bias"] = channels if p.bias_along else ()
        return loops


# a tiling's buffers depend on it and the problem alone: a chain's planner searches each problem
# again under many shares of the target
@functools.lru_cache(maxsize=1 << 16)
def window_buffers(p: WindowProblem, t: WindowTiling) -> tuple[tuple[Buffer, ...], tuple[int, ...]]:
    """One compute tile's buffers, as `_kernel` makes them, and the shared L3 ones."""
    runs = {v for v, n in t.trips(p).items() if n > 1}
    band_h, band_w = p.band(t.R, t.C)
    channels = t.Tc * p.multiplier
    out_tile = t.R * t.C * channels
    results = result_depth(p, t, runs)
    tiles = {"x": band_h * band_w * t.Tc * p.x_bytes,
             "w": (p.weights[0] * p.weights[1] * channels if p.weights else 0) * p.w_bytes,
             "bias": (channels if p.bias_along else 1) * p.bias_bytes}
    whole = {"w": math.prod(p.weights) * p.w_bytes if p.weights else 0,
             "bias": (p.Co if p.bias_along else 1) * p.bias_bytes}
    buffers: list[Buffer] = []
    for level in ("L1", "L2", "L3"):
        deep = results if level != "L3" else L3_RESULTS
        buffers += [(level, out_tile * p.out_bytes * deep)] + epilogue_buffers(p, t, runs, level, out_tile, channels)
    shared: list[int] = []
    for name, loops in t.stream_loops(p).items():
        if name not in tiles:
            continue
        if name in whole and t.weights_whole:
            shared.append(whole[name])
        else:
            buffers.append(("L3", tiles[name] * load_depth(p.depth, runs, loops)))
        # below L3, a weight or bias tile is the one of this tile of channels
        below = loops if name == "x" else ("tc",) if name == "w" or p.bias_along else ()
        buffers += [(level, tiles[name] * load_depth(p.depth, runs, below)) for level in ("L2", "L1")]
    return tuple(buffers), tuple(shared)


def _fits(p: WindowProblem, t: WindowTiling, target: Target) -> bool:
    buffers, shared = window_buffers(p, t)
    return fits(buffers, target, shared)


def _candidates(p: WindowProblem, target: Target) -> list[WindowTiling]:
    """For each channel tiling and way of holding the weights, the tallest output tiles that fit,
    as wide as fit."""
    holdings = (True, False) if p.weights is not None or p.bias_bytes else (False,)
    channel_tiles = [p.Ci] if p.multiplier > 1 else channel_splits(p.Ci)
    return [WindowTiling(*found, Tc, whole) for whole in holdings for Tc in channel_tiles
            if (found := tallest(p, lambda R, C: _fits(p, WindowTiling(R, C, Tc, whole), target), target))]


def _balance(p: WindowProblem, t: WindowTiling, target: Target) -> float:
    """The busiest compute tile's share of the work over an even share: the loader deals the
    parallel loop's steps round-robin, and the last one may be short."""
    return busiest_share(p, t, target.compute_tiles) * target.compute_tiles


def _estimate(p: WindowProblem, t: WindowTiling, target: Target, work: float) -> float:
    """The busiest compute tile's cycles: its vector unit's share of `work` (the vector cycles of
    the whole layer on one compute tile), or a link's where longer (`link_cycles`: the DMAs with
    the tiling's external-memory bytes and moves, the bands going on down and the results up)."""
    vector = work / target.compute_tiles * _balance(p, t, target)
    dram, moves = dram_moves(p, t)
    return max(vector, link_cycles(target.costs, dram, moves, dram, dram))


@functools.lru_cache(maxsize=1 << 16)
def window_pj(p: WindowProblem, t: WindowTiling, costs: Costs, compute_tiles: int, vector_pj: float) -> float:
    """The tiling's pJ as `hardware.energy` prices the simulator's counts: its external-memory
    bytes at both ends, each band, weight, bias and epilogue operand tile from L3 to L2 to L1
    where the vector unit reads it (`copies_below_l3`), each result tile from L1 up to L3, and
    the vector work (`vector_pj`, the same for every tiling)."""
    pj = costs.energy.access_pj_per_byte
    order, trips, streams = t.loop_order(p), t.trips(p), band_streams(p, t)
    # below L3, a weight or bias tile is the one of this tile of channels (`window_buffers`)
    below = {"x": t.nest(), "w": ("tc",), "bias": ("tc",) if p.bias_along else ()}
    down = sum(copies_below_l3(Stream(s.name, below.get(s.name, s.loop_vars), s.bytes), order, trips, compute_tiles)
               for s in streams if s.name != "y")
    up = sum(stream_traffic(s, order, trips) for s in streams if s.name == "y")
    return dram_bytes(p, t) * (pj["external"] + pj["l3"]) + (down + up) * (pj["l3"] + 2 * pj["l2"] + pj["l1"]) \
        + vector_pj


def choose_window_tiling(p: WindowProblem, target: Target, work: float,
                         vector_pj: float) -> tuple[WindowProblem, WindowTiling]:
    """The tiling with the fewest external-memory bytes among those within CYCLE_SLACK of the
    fewest cycles (`_estimate`), the largest tiles of those; its result tiles two deep where that
    tiling fits so (with loads two deep), else one (and the problem so). Without the target's
    costs, among those of the best balance of the work over the compute tiles; for an objective
    but latency, the one of least pJ (`window_pj`, with `vector_pj` for the vector work), or pJ x
    cycles, then as without costs."""
    latency = target.costs is not None and target.objective == "latency"
    rank = (lambda t: _estimate(p, t, target, work)) if latency else (lambda t: round(_balance(p, t, target), 2))
    scored = [(rank(t), dram_bytes(p, t), -t.R * t.C * t.Tc, t) for t in _candidates(p, target)]
    if not scored:
        raise ValueError("no tiling fits")
    if target.costs is not None and not latency:
        def figure(t: WindowTiling) -> float:
            pj = window_pj(p, t, target.costs, target.compute_tiles, vector_pj)
            return pj if target.objective == "energy" else pj * _estimate(p, t, target, work)

        t = min(scored, key=lambda s: (figure(s[3]), *s[:3]))[3]
    else:
        fewest = min(s[0] for s in scored)
        t = min((s for s in scored if s[0] <= fewest * CYCLE_SLACK), key=lambda s: s[1:3])[3]
    deeper = replace(p, results=2)
    return (deeper, t) if p.depth == 2 and _fits(deeper, t, target) else (p, t)


def lower_window(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """A window op and its epilogue, on the vector unit."""
    op = ops[0]
    where = op.source or op.name
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if 0 in x.shape or 0 in y.shape:
        raise CompileError(f"{where}: {op.op_type} of {list(x.shape)} has an empty dimension; there is nothing to tile")
    p = layer(WindowProblem, graph, ops, 2)
    work, vector_pj = 0.0, 0.0
    if target.costs is not None:
        elements = epilogue_work(graph, ops)
        work, vector_pj = target.costs.vector_cycles(elements), target.costs.vector_pj(elements)
    found = first_fit((replace(p, depth=depth) for depth in (2, 1)),
                      lambda q: choose_window_tiling(q, target, work, vector_pj))
    if found is None:
        raise CompileError(f"{where}: no tiling of {op.op_type} over {list(x.shape)} fits target '{target.name}'")
    return _kernel(graph, ops, name, target, *found[1])


def _kernel(graph: Graph, ops: list[Op], name: str, target: Target, p: WindowProblem, t: WindowTiling) -> Kernel:
    op = ops[0]
    w = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 else None
    order = t.loop_order(p)
    builder = Body(order, p.depth)
    body = builder.ops

    x_l1, x_tile = builder.input_bands(graph, op, p, t, "tc", t.Tc)
    inputs, deps = [x_tile], [x_l1]
    for tensor, channel_axis in ((w, 2), (bias, 0)):
        if tensor is None:
            continue
        per_tile = t.Tc * (1 if tensor is w else p.multiplier)
        along = tensor is w or p.bias_along  # a bias of one value is taken whole

        def ref(level: str, tile: bool) -> TileRef:
            shape = list(tensor.shape)
            indices = ["0"] * len(shape)
            if tile and along:
                shape[channel_axis] = per_tile
                indices[channel_axis] = builder.index("tc")[0]
            return TileRef(tensor.name, level, indices, shape)

        whole = t.weights_whole
        deps.append(builder.loads([(ref("EXTERNAL", not whole), ref("L3", not whole)),
                                   (ref("L3", True), ref("L2", True)), (ref("L2", True), ref("L1", True))]))
        inputs.append(ref("L1", True))
    inner = order[-1] if order else None
    space = builder.output_space(p, t, t.Tc * p.multiplier)
    # the vector unit keeps the result in its registers for an epilogue, else writes it to L1
    level = "REGISTER" if ops[1:] else "L1"
    depth = result_depth(p, t, set(order))
    body.append(Compute(len(body), lookup(op.op_type).compute_type, inputs, output_ref(op.outputs[0], level, space),
                        at=inner, depends_on=deps, depth=depth if level == "L1" else 1))
    # result tiles two deep where they fit as large: the vector unit computes the next while the
    # last is stored; one deep, each waits for the last one's stores (MobileNet v1 ranked by
    # energy, its depthwise layers chained: 1,894,117 cycles one deep, 1,880,532 two deep)
    extra = builder.finish(graph, ops, level, space, {"at": inner}, level="L1", depth=depth, l3_depth=L3_RESULTS)
    return band_kernel(graph, ops, name, target, p, t, body, extra, "vector", {"Tc": t.Tc},
                       lambda dram: {"vector_elements": dict(sorted(epilogue_work(graph, ops).items()))})
