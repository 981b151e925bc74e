"""Lower a window op (DEPTHWISE_CONV2D, MAXPOOL2D, AVGPOOL2D, SUMPOOL2D) to a tiled DFX kernel on
the vector unit.

Why not the array: a depthwise window reads one input channel per output channel, so as a
product it is C separate GEMMs of n = 1 (M = output positions, K = kh * kw), which is how
SCALE-Sim maps it: one column of the array busy, 1-3% of its MACs. The vector unit does the same
kh * kw multiply-adds per output element on all its lanes at once, and a pool's maxima and sums
are not products at all. Its utilization is reported as the vector unit's.

Tiles are NHWC like a convolution's (lower_conv): loops b0 (images), th and tw (output tiles of R
rows by C columns), tc (Tc channels; all of them when a channel has several results, so that a
loop steps input and result channels alike). The input comes in bands with their halo and
their share of the padding (the registry's fill: zero, or the lowest value for a max), brought
to L3 once and down to L1 whole; the weights (and bias) sit in L3 whole where they fit, one copy
for every compute tile. The result tile is written to L1 (with an epilogue, to the registers,
the epilogue's last result to L1) and stored from there. The tiling taken balances the compute tiles, then moves the fewest external-memory
bytes, then has the largest tiles.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from dfx import Compute, Graph, Kernel, Op, TileLoop, TileRef, itemsize, lookup

from .errors import CompileError
from .bands import Body, band_elements, band_ref, channel_splits, padding_fill, widths
from .lower_vector import Space, dram_hints, epilogue, epilogue_work, kernel_reads, store, traffic
from .requirements import Buffer, body_buffers, fits, requirements
from .target import Target
from .tiling import Parallel, Stream, first_fit, parallel_loop, placement

ORDER = ("b0", "th", "tw", "tc")


@dataclass(frozen=True)
class WindowProblem:
    N: int
    H: int
    W: int
    Ci: int
    OH: int
    OW: int
    multiplier: int  # results per input channel
    hw: tuple  # the H and W windows
    weights: tuple[int, ...] | None  # HWCM, or None for a pool
    x_bytes: int
    w_bytes: int
    bias_bytes: int  # 0: none
    bias_along: bool  # one bias per result channel (else one for all)
    out_bytes: int
    epilogue_operands: tuple[tuple[int, bool], ...]  # (bytes per element, varies along positions)
    depth: int


@dataclass(frozen=True)
class WindowTiling:
    R: int
    C: int
    Tc: int
    weights_whole: bool  # the weights (and bias) sit in L3 whole, loaded once

    def trips(self, p: WindowProblem) -> dict[str, int]:
        return {"b0": p.N, "th": -(-p.OH // self.R), "tw": -(-p.OW // self.C), "tc": -(-p.Ci // self.Tc)}

    def loop_order(self, p: WindowProblem) -> tuple[str, ...]:
        trips = self.trips(p)
        return tuple(v for v in ORDER if trips[v] > 1)


def window_streams(p: WindowProblem, t: WindowTiling) -> list[Stream]:
    halo = band_elements(p.hw[0], p.OH, t.R, p.H) * band_elements(p.hw[1], p.OW, t.C, p.W)
    positions = ("b0", "th", "tw", "tc")
    channels = () if t.weights_whole else ("tc",)
    out = [Stream("x", positions, p.N * halo * p.Ci * p.x_bytes),
           Stream("y", positions, p.N * p.OH * p.OW * p.Ci * p.multiplier * p.out_bytes)]
    if p.weights is not None:
        out.append(Stream("w", channels, math.prod(p.weights) * p.w_bytes))
    if p.bias_bytes:
        out.append(Stream("bias", channels if p.bias_along else (),
                          (p.Ci * p.multiplier if p.bias_along else 1) * p.bias_bytes))
    for i, (size, along) in enumerate(p.epilogue_operands):
        out.append(Stream(f"epilogue{i}", positions if along else ("tc",),
                          (p.N * p.OH * p.OW if along else 1) * p.Ci * p.multiplier * size))
    return out


def window_buffers(p: WindowProblem, t: WindowTiling) -> tuple[list[Buffer], list[int]]:
    """One compute tile's buffers, as `_kernel` makes them, and the shared L3 ones."""
    order = t.loop_order(p)
    band_h, band_w = p.hw[0].band(t.R)[0], p.hw[1].band(t.C)[0]
    out_tile = t.R * t.C * t.Tc * p.multiplier
    tiles = {"x": band_h * band_w * t.Tc * p.x_bytes,
             "w": (p.weights[0] * p.weights[1] * t.Tc * p.multiplier if p.weights else 0) * p.w_bytes,
             "bias": (t.Tc * p.multiplier if p.bias_along else 1) * p.bias_bytes}
    whole = {"w": math.prod(p.weights) * p.w_bytes if p.weights else 0,
             "bias": (p.Ci * p.multiplier if p.bias_along else 1) * p.bias_bytes}
    buffers: list[Buffer] = [("L1", out_tile * p.out_bytes), ("L2", out_tile * p.out_bytes),
                             ("L3", out_tile * p.out_bytes)]
    shared: list[int] = []
    def depth(loops: tuple[str, ...]) -> int:  # a load that repeats is double-buffered
        return p.depth if placement(Stream("", loops, 0), order) >= 0 else 1

    for s in window_streams(p, t):
        if s.name == "y":
            continue
        if s.name.startswith("epilogue"):
            size, along = p.epilogue_operands[int(s.name[len("epilogue"):])]
            tile = (out_tile if along else t.Tc * p.multiplier) * size * depth(s.loop_vars)
            buffers += [(level, tile) for level in ("L3", "L2", "L1")]
            continue
        if s.name in whole and t.weights_whole:
            shared.append(whole[s.name])
        else:
            buffers.append(("L3", tiles[s.name] * depth(s.loop_vars)))
        # below L3, a weight or bias tile is the one of this tile of channels
        below = s.loop_vars if s.name == "x" else ("tc",) if s.name == "w" or p.bias_along else ()
        buffers += [("L2", tiles[s.name] * depth(below)), ("L1", tiles[s.name] * depth(below))]
    return buffers, shared


def _fits(p: WindowProblem, t: WindowTiling, target: Target) -> bool:
    buffers, shared = window_buffers(p, t)
    return fits(buffers, target, shared)


def _candidates(p: WindowProblem, target: Target) -> list[WindowTiling]:
    """For each channel tiling and way of holding the weights, the tallest output tiles that fit,
    as wide as fit."""
    out = []
    channel_tiles = [p.Ci] if p.multiplier > 1 else channel_splits(p.Ci)
    for weights_whole in (True, False) if p.weights is not None or p.bias_bytes else (False,):
        for Tc in channel_tiles:
            for C in widths(p.OW):
                def tiling(R: int) -> WindowTiling:
                    return WindowTiling(R, C, Tc, weights_whole)
                R = bisect.bisect_left(range(1, p.OH + 1), True, key=lambda r: not _fits(p, tiling(r), target))
                if R:
                    out.append(tiling(R))
                    break
    return out


def _balance(p: WindowProblem, t: WindowTiling, target: Target) -> float:
    """The busiest compute tile's share of the work over an even share."""
    trips = t.trips(p)
    parallel = parallel_loop(t.loop_order(p), trips, target.compute_tiles)
    if parallel.loop is None:
        return float(target.compute_tiles)
    n = trips[parallel.loop]
    return -(-n // parallel.workers) * target.compute_tiles / n


def choose_window_tiling(p: WindowProblem, target: Target) -> WindowTiling:
    scored = []
    for t in _candidates(p, target):
        dram = sum(traffic(window_streams(p, t), t.loop_order(p), t.trips(p)).values())
        scored.append((round(_balance(p, t, target), 2), dram, -t.R * t.C * t.Tc, t))
    if not scored:
        raise ValueError("no tiling fits")
    return min(scored, key=lambda s: s[:3])[3]


def lower_window(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """A window op and its epilogue, on the vector unit."""
    op = ops[0]
    where = op.source or op.name
    opdef = lookup(op.op_type)
    attrs = opdef.normalize_attrs(op.attrs)
    x = graph.tensors[op.inputs[0]]
    w = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 else None
    y = graph.tensors[op.outputs[0]]
    final = graph.tensors[ops[-1].outputs[0]]
    if 0 in x.shape or 0 in y.shape:
        raise CompileError(f"{where}: {op.op_type} of {list(x.shape)} has an empty dimension; there is nothing to tile")
    epi_operands = [graph.tensors[n] for n in kernel_reads(ops)[len(op.inputs):]]
    N, H, W, Ci = x.shape
    found = first_fit((WindowProblem(N, H, W, Ci, y.shape[1], y.shape[2], y.shape[3] // Ci,
                                     opdef.windows(attrs, [x.shape] + ([w.shape] if w else [])),
                                     w.shape if w else None, itemsize(x.dtype), itemsize(w.dtype) if w else 0,
                                     itemsize(bias.dtype) if bias else 0,
                                     bias is not None and bias.shape == (y.shape[3],) and y.shape[3] > 1,
                                     itemsize(final.dtype),
                                     tuple((itemsize(t.dtype), math.prod(t.shape[:-1]) > 1) for t in epi_operands),
                                     depth) for depth in (2, 1)),
                      lambda problem: choose_window_tiling(problem, target))
    if found is None:
        raise CompileError(f"{where}: no tiling of {op.op_type} over {list(x.shape)} fits target '{target.name}'")
    return _kernel(graph, ops, name, target, *found)


def _kernel(graph: Graph, ops: list[Op], name: str, target: Target, p: WindowProblem, t: WindowTiling) -> Kernel:
    op, epi = ops[0], ops[1:]
    x = graph.tensors[op.inputs[0]]
    w = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 else None
    y = graph.tensors[op.outputs[0]]
    order, trips = t.loop_order(p), t.trips(p)
    parallel: Parallel = parallel_loop(order, trips, target.compute_tiles)
    M = p.multiplier

    builder = Body(order, p.depth)
    body, idx = builder.ops, builder.index

    def x_ref(level: str) -> TileRef:
        return band_ref(x.name, level, idx("b0", "th", "tw", "tc"), p.hw, t.R, t.C, t.Tc)

    inputs = [x_ref("L1")]
    deps = [builder.loads([(x_ref("EXTERNAL"), x_ref("L3")), (x_ref("L3"), x_ref("L2")), (x_ref("L2"), x_ref("L1"))],
                          padding_fill(op, x.dtype, p.hw))]
    for tensor, channel_axis in ((w, 2), (bias, 0)):
        if tensor is None:
            continue
        per_tile = t.Tc * (1 if tensor is w else M)
        along = tensor is w or p.bias_along  # a bias of one value is taken whole

        def ref(level: str, tile: bool) -> TileRef:
            shape = list(tensor.shape)
            indices = ["0"] * len(shape)
            if tile and along:
                shape[channel_axis] = per_tile
                indices[channel_axis] = idx("tc")[0]
            return TileRef(tensor.name, level, indices, shape)

        whole = t.weights_whole
        deps.append(builder.loads([(ref("EXTERNAL", not whole), ref("L3", not whole)),
                                   (ref("L3", True), ref("L2", True)), (ref("L2", True), ref("L1", True))]))
        inputs.append(ref("L1", True))
    inner = order[-1] if order else None
    space = Space(y.shape, (1, t.R, t.C, t.Tc * M), tuple(v if v in order else None for v in ("b0", "th", "tw", "tc")))
    y_ref = TileRef(y.name, "REGISTER" if epi else "L1", idx("b0", "th", "tw", "tc"), [1, t.R, t.C, t.Tc * M])
    body.append(Compute(len(body), lookup(op.op_type).compute_type, inputs, y_ref, at=inner, depends_on=deps))
    place = {"at": inner}
    final, last, extra = epilogue(body, graph, epi, y.name, y_ref.level, len(body) - 1, space, order, p.depth, place)
    store(body, final, list(range(4)), space, last, place)

    streams = window_streams(p, t)
    named = {"x": x.name, "y": final, "w": w.name if w else "", "bias": bias.name if bias else ""}
    per_stream = traffic([Stream(named[s.name], s.loop_vars, s.bytes) for s in streams
                          if not s.name.startswith("epilogue")] + extra, order, trips)
    work = epilogue_work(graph, ops)
    compulsory = sum(graph.tensors[n].size * itemsize(graph.tensors[n].dtype) for n in kernel_reads(ops)) \
        + graph.tensors[final].size * itemsize(graph.tensors[final].dtype)
    return Kernel(
        name=name, op=op.op_type, graph_op=op.name, dataflow="vector",
        tiling={"R": t.R, "C": t.C, "Tc": t.Tc, "band_rows": p.hw[0].band(t.R)[0], "band_cols": p.hw[1].band(t.C)[0],
                **{f"num_tiles_{v}": n for v, n in trips.items()}},
        tile_loops=[TileLoop(v, 0, trips[v], parallel=v == parallel.loop) for v in order],
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints={"vector_elements": dict(sorted(work.items())),
               **dram_hints(per_stream, compulsory, target, parallel.workers)},
        epilogue=[o.name for o in epi],
        inputs=kernel_reads(ops),
        outputs=list(ops[-1].outputs),
    )

