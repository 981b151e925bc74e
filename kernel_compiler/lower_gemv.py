"""Lower a contraction of one row (a GEMV) to a tiled DFX kernel on the vector unit.

Which: a MATMUL whose A is one row (every dim of A but K is 1), or a CONV2D of one output
position through a 1 x 1 kernel (a squeeze-and-excitation block's or a classifier's 1 x 1
convolution on a pooled image): y[n] = sum over k of x[k] w[k, n] (+ bias[n]).

Why: each weight meets one element of x, so the array, which keeps a fold of weights while rows
of A stream through, streams one row per fold: R + 1 + R + C - 2 cycles for R x C MACs (about
five a cycle on 16 x 16), where the vector unit does one multiply-add per lane a cycle (16).
`compile.lower_contraction` takes this kernel where the target's objective ranks it better than
the array's.

The kernel walks the space (N, K): a loop over tiles of Tn results (parallel over the compute
tiles), and inside it, where a tile's weights do not fit L1 whole, a loop over chunks of Tk of
the contracted dim, each step adding its products into the result tile (`accumulate`). The
operands come to L3 whole, once; or x does and the weights come by panels of Tn results, each in
one move, two deep, so the DMAs move large tiles while the vector unit works on the panel
before (`preferred` weighs both where both fit); or, reading x by bands of its channels in a
chain, every operand comes by its chunks of K. Chunks go down to L1 (a B given as [N, K]
transposed on its way into L2, as `lower_matmul` does); the result tile, after the epilogue,
leaves L1 -> L2 -> L3 -> EXTERNAL.
Tiles: of every power of two of results (or all of them), each with the largest even chunk of K
that fits, whole or by panels, the kernel `preferred` takes.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dfx import Compute, DataMove, Graph, Kernel, Op, TileLoop, itemsize, lookup, widest

from .chains import TIE, figure, group_signature, usage
from .lower_vector import (
    LEVELS, Space, dram_hints, epilogue, epilogue_work, kernel_reads, loops_of, placement_of, store, tile_ref, traffic,
)
from .requirements import body_buffers, fits, requirements
from .target import Target
from .tiling import Stream

N_DIM, K_DIM = 0, 1  # the space's dims: the results, the contracted dim
PANELS, CHUNKS = "tj", "tk"  # the loops over them


def gemv_dims(graph: Graph, op: Op) -> list[list[int | None]] | None:
    """Each operand's dims, then the result's, as dims of the space (N, K) (None: a dim of 1);
    None where the op is no contraction of one row."""
    shapes = [graph.tensors[t].shape for t in [*op.inputs, op.outputs[0]]]
    attrs = lookup(op.op_type).normalize_attrs(op.attrs)
    if op.op_type == "CONV2D":
        x, w, *_, out = shapes
        plain = (attrs["groups"], attrs["layout"], attrs["weight_layout"]) == (1, "NHWC", None)
        one = plain and attrs["padding"] == [[0, 0], [0, 0]] and x[:3] == (1, 1, 1) and w[1:3] == (1, 1)
        dims = [[None, None, None, K_DIM], [N_DIM, None, None, K_DIM]]
    elif op.op_type == "MATMUL":
        a, b, *_, out = shapes
        one = len(b) == 2 and all(d == 1 for d in a[:-1])
        dims = [[None] * (len(a) - 1) + [K_DIM], [N_DIM, K_DIM] if attrs["transpose_b"] else [K_DIM, N_DIM]]
    else:
        return None
    if not one:
        return None
    n = shapes[-1][-1]
    bias = [[N_DIM if i == len(s) - 1 and d == n > 1 else None for i, d in enumerate(s)] for s in shapes[2:-1]]
    return [*dims, *bias, [None] * (len(shapes[-1]) - 1) + [N_DIM]]


def _body(graph: Graph, ops: list[Op], dims: list[list[int | None]], n: int, k: int, tn: int, tk: int,
          held: str) -> tuple[list, list[Stream]]:
    """The body for tiles of `tn` results by chunks of `tk`, the operands in L3 as `held`
    ("whole"; "panels": x whole, the weights by panels of `tn` results; "chunks": every operand
    by its chunks), and its streams over external memory. The result and the epilogue go over
    the result's own dims, tiled as its N."""
    op = ops[0]
    transpose = op.op_type == "MATMUL" and lookup("MATMUL").normalize_attrs(op.attrs)["transpose_b"]
    panels, chunks = PANELS if tn < n else None, CHUNKS if tk < k else None
    order = tuple(v for v in (panels, chunks) if v)
    chunk = Space((n, k), (tn, tk), (panels, chunks))
    panel = {"whole": Space((n, k), (n, k), (None, None)), "panels": Space((n, k), (tn, k), (panels, None)),
             "chunks": chunk}[held]
    out = graph.tensors[op.outputs[0]]
    rank = len(out.shape)
    results = Space(out.shape, (1,) * (rank - 1) + (tn,), (None,) * (rank - 1) + (panels,))
    own = list(range(rank))
    inner = order[-1] if order else None
    place = {"after": chunks} if chunks else {"at": inner}
    body: list = []
    l1_ops = []
    for i, (name, d) in enumerate(zip(op.inputs, dims)):
        prev: list[int] = []
        for src, dst in zip(LEVELS, LEVELS[1:]):
            space = panel if dst == "L3" else chunk
            at = placement_of(d, space, order)
            # a move copies its destination's tile: into L2, a chunk out of what L3 holds
            body.append(DataMove(len(body), "LOAD", tile_ref(name, src, d, space), tile_ref(name, dst, d, space), at=at,
                                 depth=2 if at is not None else 1, transpose=i == 1 and transpose and dst == "L2",
                                 depends_on=prev))
            prev = [len(body) - 1]
        l1_ops.append(prev[0])
    body.append(Compute(len(body), lookup(op.op_type).compute_type,
                        [tile_ref(name, "L1", d, chunk) for name, d in zip(op.inputs, dims)],
                        tile_ref(out.name, "REGISTER" if ops[1:] else "L1", own, results), at=inner,
                        accumulate=f"{chunks} > 0" if chunks else "false", depends_on=l1_ops))
    final, last, extra = epilogue(body, graph, ops[1:], out.name, "REGISTER", len(body) - 1, results, order, 2, place)
    store(body, final, own, results, last, place)
    tensors = [graph.tensors[t] for t in [*op.inputs, final]]
    spaces = [panel] * len(op.inputs) + [results]
    streams = [Stream(t.name, loops_of(d, s), t.size * itemsize(t.dtype))
               for t, d, s in zip(tensors, [*dims[:-1], own], spaces)]
    return body, streams + extra


def _kernel(graph: Graph, ops: list[Op], name: str, target: Target, dims: list[list[int | None]], n: int, k: int,
            tn: int, held: str) -> Kernel | None:
    """The kernel in tiles of `tn` results by the largest even chunk of K that fits the target,
    the operands in L3 as `held` (None: no chunk fits)."""
    chunks = sorted({math.ceil(k / pieces) for pieces in range(1, k + 1)})
    low, high = 0, len(chunks)  # the chunks that fit are the shortest ones: find where they end
    while low < high:
        mid = (low + high) // 2
        if fits(body_buffers(_body(graph, ops, dims, n, k, tn, chunks[mid], held)[0], graph), target):
            low = mid + 1
        else:
            high = mid
    if low == 0:
        return None
    tk = chunks[low - 1]
    op = ops[0]
    trips = {v: t for v, t in ((PANELS, math.ceil(n / tn)), (CHUNKS, math.ceil(k / tk))) if t > 1}
    order = tuple(trips)
    body, streams = _body(graph, ops, dims, n, k, tn, tk, held)
    return Kernel(
        name=name, op=op.op_type, graph_op=op.name, dataflow="vector",
        tiling={"Tn": tn, "Tk": tk, "L3_Bn": n if held == "whole" else tn, "num_tiles_tj": trips.get(PANELS, 1),
                "num_tiles_tk": trips.get(CHUNKS, 1)},
        tile_loops=[TileLoop(v, 0, trips[v], parallel=v == PANELS) for v in order],
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints={"macs": n * k, "implicit_gemm": {"M": 1, "N": n, "K": k},
               "vector_elements": dict(sorted(epilogue_work(graph, ops).items())),
               **dram_hints(traffic(streams, order, trips), sum(s.bytes for s in streams), target,
                            min(target.compute_tiles, trips.get(PANELS, 1)))},
        epilogue=[o.name for o in ops[1:]],
        inputs=kernel_reads(ops),
        outputs=list(ops[-1].outputs),
    )


# the tiles taken for a group's problem on a target, (Tn, holding) or None: networks repeat their
# blocks, and each problem is weighed once per process
_TAKEN: dict[tuple, tuple[int, str] | None] = {}


def lower_gemv(graph: Graph, ops: list[Op], name: str, target: Target, dims: list[list[int | None]]) -> Kernel | None:
    """The group's kernel on the vector unit, `dims` its operands' and result's (`gemv_dims`):
    of the tiles of a power of two of results (or all of them), each by the largest chunk of K
    that fits, with the operands whole in L3 or the weights by panels, the one `preferred`; None
    where none fits (x whole in L3 beside a panel of one result: VGG-19's 25,088 -> 4,096).
    Reading x by bands of its channels (a chain's last member, `Target.reads_by_channels`): a
    tile of results on each compute tile, every operand by chunks of K, so each goes once
    through x's bands, adding each chunk's products to its results."""
    op = ops[0]
    n, k = graph.tensors[op.outputs[0]].shape[-1], graph.tensors[op.inputs[0]].shape[-1]
    key = (group_signature(ops, graph), target)
    if key in _TAKEN:
        taken = _TAKEN[key]
        return None if taken is None else _kernel(graph, ops, name, target, dims, n, k, *taken)
    if target.reads_by_channels:
        tiles = [(-(-n // target.compute_tiles), "chunks")]
    else:
        tiles = [(tn, held) for held in ("whole", "panels")
                 for tn in [n] + [1 << e for e in reversed(range(n.bit_length())) if 1 << e < n]]
    found = {(tn, held): kernel for tn, held in tiles
             if (kernel := _kernel(graph, ops, name, target, dims, n, k, tn, held)) is not None}
    kernel = preferred(list(found.values()), graph, target) if found else None
    _TAKEN[key] = next((tiles for tiles, each in found.items() if each is kernel), None)
    return kernel


def preferred(kernels: list[Kernel], graph: Graph, target: Target) -> Kernel:
    """Of kernels of one group, those within `TIE` of the least figure of the target's objective
    (`chains.usage`: its estimates' rounding, with the pJ of the computes, which differ between
    the units), the one of fewest cycles; the first of equals. Under energy, where a GEMV's
    tilings and it on the array or the vector unit differ by a fraction of a percent, the least
    figure alone took EfficientNet-B0's classifier to the vector unit untiled by results:
    68,202 -> 124,800 cycles for 0.1% less energy."""
    ranked = []
    for kernel in kernels:
        u = usage(kernel, graph, target)
        ranked.append((kernel, replace(u, pj=u.pj + compute_pj(kernel, graph, target))))
    least = min(figure(u, target.objective) for _, u in ranked)
    return min(((kernel, u) for kernel, u in ranked if figure(u, target.objective) <= least * (1 + TIE)),
               key=lambda ranked_kernel: ranked_kernel[1].cycles)[0]


def compute_pj(kernel: Kernel, graph: Graph, target: Target) -> float:
    """The pJ of a kernel's computes, as `hardware.energy` prices them: its vector elements, and on
    the array each MAC with its operands' reads (an i8 MAC there, its reads with it, under
    two-thirds of a vector unit's multiply-add; an f32 one three times as much)."""
    costs = target.costs
    pj = costs.vector_pj(kernel.hints.get("vector_elements", {}))
    if kernel.dataflow == "vector":
        return pj
    dtype = widest([graph.tensors[t].dtype for t in kernel.inputs[:2]])
    macs = kernel.hints["macs"]
    # and each weight's read from L1 into the array (of a product of one row's K x (1 + N)
    # operand elements, the K x N weights)
    l1 = costs.energy.access_pj_per_byte["l1"]
    return pj + costs.mac_pj(macs, dtype, itemsize(dtype)) + macs * itemsize(dtype) * l1
