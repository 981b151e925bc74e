"""Lower a CONV2D (NHWC input, one group) to a tiled DFX kernel: an implicit GEMM on the array,
M = output positions, N = output channels, K = kh * kw * input channels.

External memory never holds the im2col matrix. The input comes on chip in bands: the rows and
columns an output tile needs, with their halo and their share of the zero border (a window
`TileRef`: step, offset, padding). The DMA brings each band into L3 once; chunks of its channels
go down to L1, and the array is fed the expanded rows from there (the tile COMPUTE reads every
window of its band: the registry's CONV2D_TILE), so each input element crosses the external
memory link once per band that holds it.

Loops: b0 (images), th and tw (output tiles of R rows by C columns), tj (Tn output channels), tk
(Tc input channels, innermost, so partial sums stay in the accumulators as MATMUL's K does).
Two orders: positions outer (b0, th, tw, tj, tk), where a band holding all its channels in L3
serves every tile of output channels, and the weights sit in L3 whole (loaded once, one copy for
every compute tile) or come chunk by chunk; channels outer (tj, b0, th, tw, tk), where a channel
tile's weights stay in L3 while the bands stream past (`HOLDINGS`). Weights in another order
than OHWI (`weight_layout`: HWIO as JAX passes them) are tiled in their own order and reach the
array OHWI: the BlockMover permutes each tile on its way L3 -> L2, as it transposes a MATMUL's B.

The tiling taken is the one with the fewest external-memory bytes among those whose array
cycles per compute tile are within CYCLE_SLACK of the fewest, its buffers fitting the target.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, replace

from dfx import Compute, DataMove, Graph, Kernel, Op, TileLoop, TileRef, itemsize, lookup
from dfx.ops.window import weight_layout, weight_perms

from .bands import Body, band_elements, band_ref, channel_splits, padding_fill, widths
from .errors import CompileError
from .lower_matmul import choose_dataflow
from .lower_vector import Space, dram_hints, epilogue, epilogue_work, kernel_reads, store, traffic
from .requirements import Buffer, body_buffers, could_fit, fits, requirements
from .target import Target
from .tiling import Stream, array_cycles, first_fit, parallel_loop, tile_sizes

ORDERS = {"positions": ("b0", "th", "tw", "tj", "tk"), "channels": ("tj", "b0", "th", "tw", "tk")}
CYCLE_SLACK = 1.05  # array cycles a tiling may spend over the fewest to move fewer bytes


@dataclass(frozen=True)
class ConvProblem:
    N: int
    H: int
    W: int
    Ci: int
    OH: int
    OW: int
    Co: int
    KH: int
    KW: int
    hw: tuple  # the H and W windows (dfx.ops.window.Window)
    x_bytes: int  # per element: input, weights, bias (0: none), the conv's result, the kernel's result
    w_bytes: int
    bias_bytes: int
    bias_along: bool  # one bias per output channel (else one for all)
    c_bytes: int
    out_bytes: int
    epilogue_operands: tuple[tuple[int, bool], ...]  # (bytes per element, varies along positions)
    depth: int  # buffers of a load that repeats


@dataclass(frozen=True)
class ConvTiling:
    R: int
    C: int
    Tn: int
    Tc: int
    order: str  # a key of ORDERS
    band_channels: str  # "all": the L3 band holds every input channel; "chunk": Tc of them
    weights: str  # in L3: "all" of them, a "tile" of output channels with every input one, or a "chunk"

    def trips(self, p: ConvProblem) -> dict[str, int]:
        return {"b0": p.N, "th": -(-p.OH // self.R), "tw": -(-p.OW // self.C), "tj": -(-p.Co // self.Tn),
                "tk": -(-p.Ci // self.Tc)}

    def loop_order(self, p: ConvProblem) -> tuple[str, ...]:
        trips = self.trips(p)
        return tuple(v for v in ORDERS[self.order] if trips[v] > 1)

    def band(self, p: ConvProblem) -> tuple[int, int]:
        return p.hw[0].band(self.R)[0], p.hw[1].band(self.C)[0]


def stream_loops(p: ConvProblem, t: ConvTiling) -> dict[str, tuple[str, ...]]:
    """Each stream's loops: those its tile index depends on (y: the kernel's result)."""
    positions = ("b0", "th", "tw", "tj")
    out = {"x": ("b0", "th", "tw") + (("tk",) if t.band_channels == "chunk" else ()),
           "w": {"all": (), "tile": ("tj",), "chunk": ("tj", "tk")}[t.weights],
           "y": positions}
    if p.bias_bytes:
        out["bias"] = ("tj",) if p.bias_along else ()
    for i, (_, along) in enumerate(p.epilogue_operands):
        out[f"epilogue{i}"] = positions if along else ("tj",)
    return out


def conv_streams(p: ConvProblem, t: ConvTiling) -> list[Stream]:
    """The kernel's streams, each with the bytes of one sweep over its tiles."""
    halo = band_elements(p.hw[0], p.OH, t.R, p.H) * band_elements(p.hw[1], p.OW, t.C, p.W)
    sizes = {"x": p.N * halo * p.Ci * p.x_bytes, "w": p.Co * p.KH * p.KW * p.Ci * p.w_bytes,
             "y": p.N * p.OH * p.OW * p.Co * p.out_bytes,
             "bias": (p.Co if p.bias_along else 1) * p.bias_bytes}
    for i, (size, along) in enumerate(p.epilogue_operands):
        sizes[f"epilogue{i}"] = (p.N * p.OH * p.OW if along else 1) * p.Co * size
    return [Stream(name, loops, sizes[name]) for name, loops in stream_loops(p, t).items()]


def _depth(p: ConvProblem, runs: set[str], loops: tuple[str, ...]) -> int:
    """Buffers of a load: double where it repeats (a loop it is indexed by runs)."""
    return p.depth if not runs.isdisjoint(loops) else 1


def tile_buffers(p: ConvProblem, t: ConvTiling) -> list[Buffer]:
    """One compute tile's L2 and L1 buffers, as `_kernel` makes them: the same for every holding
    of the operands (a load repeats or not by which loops run, whatever their order)."""
    runs = {v for v, n in t.trips(p).items() if n > 1}
    loops = stream_loops(p, t)
    band_h, band_w = t.band(p)
    out_tile = t.R * t.C * t.Tn
    x = band_h * band_w * t.Tc * p.x_bytes * _depth(p, runs, ("b0", "th", "tw", "tk"))
    w = t.Tn * p.KH * p.KW * t.Tc * p.w_bytes * _depth(p, runs, ("tj", "tk"))
    buffers: list[Buffer] = [("L2", out_tile * p.c_bytes), ("L2", x), ("L1", x), ("L2", w), ("L1", w)]
    if p.bias_bytes:
        buffers.append(("L2", (t.Tn if p.bias_along else 1) * p.bias_bytes))
    for i, (size, along) in enumerate(p.epilogue_operands):
        buffers.append(("L2", (out_tile if along else t.Tn) * size * _depth(p, runs, loops[f"epilogue{i}"])))
    if p.epilogue_operands:
        buffers.append(("L2", out_tile * p.out_bytes))  # the epilogue's result, before it leaves
    return buffers


def l3_buffers(p: ConvProblem, t: ConvTiling) -> tuple[list[Buffer], list[int]]:
    """One compute tile's L3 buffers, as `_kernel` makes them, and apart the shared ones: a load
    into L3 placed outside the parallel loop, one copy of which serves every compute tile."""
    trips = t.trips(p)
    order = tuple(v for v in ORDERS[t.order] if trips[v] > 1)
    runs = set(order)
    parallel = parallel_loop(order, trips, 1 << 30).loop
    inner = set(order[order.index(parallel):]) if parallel is not None else runs
    loops = stream_loops(p, t)
    band_h, band_w = t.band(p)
    out_tile = t.R * t.C * t.Tn
    buffers: list[Buffer] = [("L3", out_tile * p.out_bytes)]
    shared: list[int] = []
    loads = {"x": band_h * band_w * (p.Ci if t.band_channels == "all" else t.Tc) * p.x_bytes
                  * _depth(p, runs, loops["x"]),
             "w": {"all": p.Co * p.KH * p.KW * p.Ci, "tile": t.Tn * p.KH * p.KW * p.Ci,
                   "chunk": t.Tn * p.KH * p.KW * t.Tc}[t.weights] * p.w_bytes * _depth(p, runs, loops["w"])}
    if p.bias_bytes:  # single-buffered: the body loads it without repeating
        loads["bias"] = (t.Tn if p.bias_along else 1) * p.bias_bytes
    for name, size in loads.items():
        if inner.isdisjoint(loops[name]):
            shared.append(size)
        else:
            buffers.append(("L3", size))
    for i, (size, along) in enumerate(p.epilogue_operands):
        buffers.append(("L3", (out_tile if along else t.Tn) * size * _depth(p, runs, loops[f"epilogue{i}"])))
    return buffers, shared


def _cycles(p: ConvProblem, t: ConvTiling, target: Target, dataflow: str) -> int:
    """Array cycles of the compute tile with the most tiles."""
    m = [(r * c, cr * cc * p.N) for r, cr in tile_sizes(p.OH, t.R) for c, cc in tile_sizes(p.OW, t.C)]
    k = [(p.KH * p.KW * size, count) for size, count in tile_sizes(p.Ci, t.Tc)]
    total = array_cycles(m, tile_sizes(p.Co, t.Tn), k, target, dataflow)
    trips = t.trips(p)
    parallel = parallel_loop(t.loop_order(p), trips, target.compute_tiles)
    if parallel.loop is None:
        return total
    return total * -(-trips[parallel.loop] // parallel.workers) // trips[parallel.loop]


# How the operands are held, (loop order, input band in L3, weights in L3); the others are
# dominated: they move the same bytes with larger buffers. Positions outer, the weights are
# loaded once (all) or with each chunk (chunk: a tile with every input channel would be
# reloaded as often, for each tile of positions); channels outer, a tile of output channels'
# weights stays while every band streams past once per such tile (in chunks, as any larger band
# would be reloaded as often).
HOLDINGS = (("positions", "all", "all"), ("positions", "all", "chunk"), ("positions", "chunk", "all"),
            ("positions", "chunk", "chunk"), ("channels", "chunk", "tile"))
MIN_CHUNK = 4  # input channels per chunk: fewer only where no tiling with more fits


def _tallest(p: ConvProblem, target: Target, C: int, Tn: int, Tc: int, holding: tuple[str, str, str],
             on_tile: dict[tuple[int, int, int, int], bool]) -> int:
    """The largest R whose tiling (with these C, Tn, Tc, holding) fits (a binary search: fitting
    shrinks with R), 0 for none. `on_tile` keeps whether the L2 and L1 buffers of each (R, C, Tn,
    Tc) fit, the same for every holding."""
    l1 = target.l1.bank_bytes
    band_row = p.hw[1].band(C)[0] * Tc * p.x_bytes  # bytes of one row of a band's chunk

    def fit(R: int) -> bool:
        if p.hw[0].band(R)[0] * band_row > l1:  # no need to count the rest (many tries end here)
            return False
        t = ConvTiling(R, C, Tn, Tc, *holding)
        near = on_tile.get((R, C, Tn, Tc))
        if near is None:
            near = on_tile[R, C, Tn, Tc] = fits(tile_buffers(p, t), target)
        if not near:
            return False
        private, shared = l3_buffers(p, t)
        return fits(private, target, shared)
    return bisect.bisect_left(range(1, p.OH + 1), True, key=lambda R: not fit(R))


def _could_fit(least: ConvProblem, target: Target, C: int, Tn: int, Tc: int, holding: tuple[str, str, str]) -> bool:
    """Whether any tiling with these (or larger) C, Tn, Tc and this holding could fit: each buffer
    of any of them is at least its size in the tiling of one row of `least`, the problem
    single-buffered."""
    t = ConvTiling(1, C, Tn, Tc, *holding)
    private, shared = l3_buffers(least, t)
    return could_fit(tile_buffers(least, t) + private + [("L3", s) for s in shared], target)


def _candidates(p: ConvProblem, target: Target, narrowest: tuple[int, int]) -> list[ConvTiling]:
    """For each way of holding the operands and each channel tiling, the tallest output tiles
    that fit, as wide as fit, and those cut down to whole blocks of array rows. Output and input
    channels in tiles of at least `narrowest` (or all of them); smaller input chunks only while
    they let the output tiles grow."""
    out = []
    least = replace(p, depth=1)  # single-buffered: no tiling of p has smaller buffers than the same of this
    tile_widths = widths(p.OW)
    on_tile: dict[tuple[int, int, int, int], bool] = {}
    fewest_out, fewest_in = narrowest
    for holding in HOLDINGS:
        order, band_channels, _ = holding
        for Tn in [n for n in channel_splits(p.Co) if n == p.Co or n >= fewest_out]:
            for Tc in [c for c in channel_splits(p.Ci) if c == p.Ci or c >= fewest_in]:
                if Tc == p.Ci and order == "positions" and band_channels == "chunk":
                    continue  # with one chunk, a chunk is all the channels
                if not _could_fit(least, target, tile_widths[-1], Tn, Tc, holding):
                    continue  # not even one row of the narrowest tiles fits: none of these channels does
                for C in tile_widths:
                    R = _tallest(p, target, C, Tn, Tc, holding, on_tile)
                    if R:
                        break
                if not R:
                    continue
                out.append(ConvTiling(R, C, Tn, Tc, *holding))
                aligned = max((r for r in range(R, 0, -1) if r * C % target.rows == 0), default=None)
                if aligned is not None and aligned != R:
                    out.append(ConvTiling(aligned, C, Tn, Tc, *holding))
                if (R, C) == (p.OH, p.OW):
                    break  # the whole image fits: smaller chunks would only cost steps
    return out


def choose_conv_tiling(p: ConvProblem, target: Target, dataflows: tuple[str, ...],
                       narrowest: tuple[int, int]) -> tuple[ConvTiling, str]:
    """The tiling (and dataflow) with the fewest external-memory bytes among those within
    CYCLE_SLACK of the fewest array cycles, its channel tiles at least `narrowest` (output,
    input); ValueError when none fits."""
    found = _best_tiling(p, target, dataflows, narrowest)
    if found is None:
        raise ValueError("no tiling fits")
    return found


# The choice depends on its arguments alone, and networks repeat their convolutions (ResNet-50's
# 53 are 23 problems, ShuffleNet's 129 per-group ones 8): each is searched once per process.
@functools.lru_cache(maxsize=4096)
def _best_tiling(p: ConvProblem, target: Target, dataflows: tuple[str, ...],
                 narrowest: tuple[int, int]) -> tuple[ConvTiling, str] | None:
    scored = []  # (array cycles, tiling, dataflow)
    cycles = {}  # they depend on the tiles and the loop order, not on where the operands are held
    for t in _candidates(p, target, narrowest):
        for dataflow in dataflows:
            key = (t.R, t.C, t.Tn, t.Tc, t.order, dataflow)
            if key not in cycles:
                cycles[key] = _cycles(p, t, target, dataflow)
            scored.append((cycles[key], t, dataflow))
    if not scored:
        return None
    fewest = min(s[0] for s in scored)
    within = [s for s in scored if s[0] <= fewest * CYCLE_SLACK]
    dram = {t: sum(traffic(conv_streams(p, t), t.loop_order(p), t.trips(p)).values()) for _, t, _ in within}
    _, t, dataflow = min(within, key=lambda s: (dram[s[1]], s[0], -s[1].R * s[1].C, s[2]))
    return t, dataflow


def lower_conv(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """A CONV2D and its epilogue (applied on the vector unit to each result tile in L2)."""
    op = ops[0]
    where = op.source or op.name
    opdef = lookup(op.op_type)
    attrs = opdef.normalize_attrs(op.attrs)
    if attrs["layout"] != "NHWC" or attrs["groups"] != 1:
        raise CompileError(f"{where}: CONV2D with layout {attrs['layout']} and {attrs['groups']} groups reaches "
                           f"the lowering; only NHWC with one group lowers (a compiler pass rewrites the others)")
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) == 3 else None
    c = graph.tensors[op.outputs[0]]
    final = graph.tensors[ops[-1].outputs[0]]
    if 0 in x.shape or 0 in w.shape:
        raise CompileError(f"{where}: CONV2D of {list(x.shape)} by {list(w.shape)} has an empty dimension; "
                           f"there is nothing to tile")
    epi_operands = [graph.tensors[n] for n in kernel_reads(ops)[len(op.inputs):]]
    hw = opdef.windows(attrs, [x.shape, w.shape])
    N, H, W, Ci = x.shape
    _, OH, OW, Co = c.shape
    if dataflow != "auto":
        dataflows = (choose_dataflow(dataflow, None, target, where),)
    else:
        dataflows = target.dataflows
    # double-buffered loads where they fit, and channel tiles of at least the array's columns and
    # MIN_CHUNK input channels; narrower ones only where no such tiling fits (a small L1)
    found = first_fit(((ConvProblem(N, H, W, Ci, OH, OW, Co, hw[0].kernel, hw[1].kernel, hw, itemsize(x.dtype),
                                    itemsize(w.dtype), itemsize(bias.dtype) if bias else 0,
                                    bias is not None and bias.shape == (Co,) and Co > 1, itemsize(c.dtype),
                                    itemsize(final.dtype),
                                    tuple((itemsize(t.dtype), len(t.shape) >= 2 and math.prod(t.shape[:-1]) > 1)
                                          for t in epi_operands), depth), narrowest)
                       for narrowest, depth in (((target.cols, MIN_CHUNK), 2), ((target.cols, MIN_CHUNK), 1),
                                                ((1, 1), 2), ((1, 1), 1))),
                      lambda attempt: choose_conv_tiling(attempt[0], target, dataflows, attempt[1]))
    if found is None:
        raise CompileError(f"{where}: no tiling of CONV2D {list(x.shape)} by {list(w.shape)} fits target "
                           f"'{target.name}'")
    (problem, _), (tiling, chosen) = found
    return _kernel(graph, ops, name, target, problem, tiling, chosen)


def _kernel(graph: Graph, ops: list[Op], name: str, target: Target, p: ConvProblem, t: ConvTiling,
            dataflow: str) -> Kernel:
    op, epi = ops[0], ops[1:]
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) == 3 else None
    c = graph.tensors[op.outputs[0]]
    attrs = lookup(op.op_type).normalize_attrs(op.attrs)
    order, trips = t.loop_order(p), t.trips(p)
    parallel = parallel_loop(order, trips, target.compute_tiles)

    builder = Body(order, p.depth)
    body, idx = builder.ops, builder.index
    band_h, band_w = t.band(p)

    def x_ref(level: str, channels: str) -> TileRef:
        return band_ref(x.name, level, idx("b0", "th", "tw", "tk" if channels == "chunk" else "0"), p.hw, t.R, t.C,
                        p.Ci if channels == "all" else t.Tc)

    def w_ref(level: str, held: str) -> TileRef:
        if held == "all":
            return TileRef(w.name, level, ["0"] * 4, list(w.shape))
        # (loop, extent) of the tile along each weight dim, in the weights' own order
        dims = {"O": ("tj", t.Tn), "H": ("0", p.KH), "W": ("0", p.KW),
                "I": ("tk", t.Tc) if held == "chunk" else ("0", p.Ci)}
        layout = weight_layout(attrs)
        return TileRef(w.name, level, idx(*(dims[d][0] for d in layout)), [dims[d][1] for d in layout])

    # a move names its destination's tile at both ends: L3 -> L2 reads a chunk out of the L3 tile
    x_l1 = builder.loads([(x_ref("EXTERNAL", t.band_channels), x_ref("L3", t.band_channels)),
                          (x_ref("L3", "chunk"), x_ref("L2", "chunk")),
                          (x_ref("L2", "chunk"), x_ref("L1", "chunk"))], padding_fill(op, x.dtype, p.hw))
    w_l1 = builder.loads([(w_ref("EXTERNAL", t.weights), w_ref("L3", t.weights)),
                          (w_ref("L3", "chunk"), w_ref("L2", "chunk")),
                          (w_ref("L2", "chunk"), w_ref("L1", "chunk"))])
    to_ohwi = weight_perms(attrs, "OHWI")
    if to_ohwi != sorted(to_ohwi):  # the BlockMover hands the array OHWI tiles (the L3 -> L2 hop)
        body[w_l1 - 1] = replace(body[w_l1 - 1], permutation=to_ohwi)
    inputs = [x_ref("L1", "chunk"), w_ref("L1", "chunk")]
    deps = [x_l1, w_l1]
    if bias is not None:  # into the accumulators, as MATMUL's Cin: the first K step adds to it
        def b_ref(level: str) -> TileRef:
            return TileRef(bias.name, level, idx("tj") if p.bias_along else ["0"] * len(bias.shape),
                           [t.Tn] if p.bias_along else list(bias.shape))

        deps.append(builder.loads([(b_ref("EXTERNAL"), b_ref("L3")), (b_ref("L3"), b_ref("L2")),
                                   (b_ref("L2"), b_ref("REGISTER"))], repeat=False))
        inputs.append(b_ref("REGISTER"))
    inner = order[-1] if order else None
    c_ref = lambda level: TileRef(c.name, level, idx("b0", "th", "tw", "tj"), [1, t.R, t.C, t.Tn])
    compute = len(body)
    body.append(Compute(compute, "CONV2D_TILE", inputs, c_ref("REGISTER"), at=inner,
                        accumulate="tk > 0" if "tk" in order else "false", depends_on=deps))
    store_place = {"after": "tk"} if "tk" in order else {"at": inner}
    extra: list[Stream] = []
    if epi:
        loops = tuple(v if v in order else None for v in ("b0", "th", "tw", "tj"))
        space = Space(c.shape, (1, t.R, t.C, t.Tn), loops)
        body.append(DataMove(len(body), "STORE", c_ref("REGISTER"), c_ref("L2"), depends_on=[compute], **store_place))
        last_name, last, extra = epilogue(body, graph, epi, c.name, "L2", len(body) - 1, space, order, p.depth,
                                          store_place, level="L2")
        store(body, last_name, list(range(4)), space, last, store_place, source="L2")
    else:
        prev = [compute]
        for src, dst in (("REGISTER", "L2"), ("L2", "L3"), ("L3", "EXTERNAL")):
            body.append(DataMove(len(body), "STORE", c_ref(src), c_ref(dst), depends_on=prev, **store_place))
            prev = [len(body) - 1]

    streams = conv_streams(p, t)
    named = {"x": x.name, "w": w.name, "y": ops[-1].outputs[0], "bias": bias.name if bias else ""}
    per_stream = traffic([Stream(named.get(s.name, s.name), s.loop_vars, s.bytes) for s in streams
                          if not s.name.startswith("epilogue")] + extra, order, trips)
    dram = sum(per_stream.values())
    macs = p.N * p.OH * p.OW * p.Co * p.KH * p.KW * p.Ci
    compulsory = (x.size * p.x_bytes + w.size * p.w_bytes + (bias.size * p.bias_bytes if bias else 0)
                  + graph.tensors[ops[-1].outputs[0]].size * p.out_bytes + sum(s.bytes for s in extra))
    return Kernel(
        name=name, op="CONV2D", graph_op=op.name, dataflow=dataflow,
        tiling={"R": t.R, "C": t.C, "Tn": t.Tn, "Tc": t.Tc, "band_rows": band_h, "band_cols": band_w,
                **{f"num_tiles_{v}": n for v, n in trips.items()}},
        tile_loops=[TileLoop(v, 0, trips[v], parallel=v == parallel.loop) for v in order],
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints={
            "macs": macs,
            "implicit_gemm": {"M": p.N * p.OH * p.OW, "N": p.Co, "K": p.KH * p.KW * p.Ci},
            "l3_resident": {"all": "all weights, shared", "tile": f"weights of {t.Tn} output channels",
                            "chunk": "none"}[t.weights],
            "estimated_compute_cycles": _cycles(p, t, target, dataflow),
            "arithmetic_intensity": round(2 * macs / dram, 3),
            **({"vector_elements": dict(sorted(epilogue_work(graph, epi).items()))} if epi else {}),
            **dram_hints(per_stream, compulsory, target, parallel.workers),
        },
        epilogue=[o.name for o in epi],
        inputs=kernel_reads(ops),
        outputs=list(ops[-1].outputs),
    )
