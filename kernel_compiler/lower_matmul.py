"""Lower one graph MATMUL to a tiled DFX kernel.

Each operand is a stream with three hops (EXTERNAL -> L3 -> L2 -> L1 for loads; REGISTER ->
L2 -> L3 -> EXTERNAL for the result). A stream's ops sit at the innermost loop that indexes
it, so reuse is in the program: with loops (ti, tj) and no K loop, an A tile indexed [ti] is
loaded once per ti and stays while tj advances.

The result tile lives at the REGISTER level (the compute tile's accumulators) while the K loop
runs: each output block's K chunks stream through the array back to back, so the array's fill
and drain are paid once per block, and the tile leaves once, after the K loop. With K split
(`tiling.KSplit`) the K loop runs in blocks outside the result tiles: after each block the
accumulators drain to the tile's place in a ring on chip, before the next the array reloads
them from there (moves that run only `when` the block is not the first), and the result
leaves after the last block.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dfx import Compute, DataMove, Graph, Kernel, Op, TileLoop, TileRef, accumulation_dtype, itemsize, lookup

from .errors import CompileError
from .lower_vector import Space, dram_hints, epilogue, epilogue_work, kernel_reads, store, traffic
from .requirements import body_buffers, requirements
from .target import Target
from .tiling import (MatmulProblem, MatmulTiling, Stream, busiest_array_share, choose_tiling, first_fit, streams,
                     tiled_cycles, tiling_trips)

DATAFLOW_NAMES = {"os": "output_stationary", "ws": "weight_stationary", "is": "input_stationary"}


def _batch_indices(shape: tuple[int, ...], out_batch: tuple[int, ...]) -> list[str]:
    """Tile indices of an operand's batch dims, aligned right to the result's batch dims."""
    offset = len(out_batch) - len(shape)
    return ["0" if d == 1 and out_batch[offset + i] != 1 else f"b{offset + i}" for i, d in enumerate(shape)]


def choose_dataflow(requested: str, cycles, target: Target, where: str) -> str:
    """The requested dataflow, or the one whose tiled product takes the array fewest cycles."""
    if requested != "auto":
        dataflow = DATAFLOW_NAMES[requested]
        if dataflow not in target.dataflows:
            raise CompileError(f"{where}: dataflow '{dataflow}' is not supported by target '{target.name}'")
        return dataflow
    return min(target.dataflows, key=lambda d: (cycles(d), d))


def _resident_hint(tiling: MatmulTiling, Bi: int, Bj: int, K: int, k_block: int | None, depth: int) -> str:
    """What stays in L3 while the other tiles stream past (the hint `l3_resident`)."""
    if tiling.split:
        return f"A block of {Bi} x {k_block} and B block of {k_block} x {Bj} per K block, {depth} deep"
    if tiling.resident is None:
        return "none"
    return (f"{tiling.resident} panel of {f'{Bi} x {K}' if tiling.resident == 'A' else f'{K} x {Bj}'}, "
            f"{tiling.panel_depth} deep{', the other in K tiles' if tiling.streamed_tiles else ''}")


def _reload(body: list, c_ref, level: str, order: tuple[str, ...]) -> int:
    """Append the moves that fill the accumulators with a result tile's partial sums before every
    K block but the first, from its place in the ring at `level` (L3: through L2), where the
    drain after the last block put it (`_drain` appends that move: it comes later in the body, an
    earlier step of the K block loop); the id of the last."""
    place = order[order.index("tk") - 1]  # the result tile's loop: every K block, before its K tiles
    first = len(body)
    ring = first + (4 if level == "L3" else 2)  # the drain's move into the ring, `_drain`'s
    hops = (("L3", "L2"), ("L2", "REGISTER")) if level == "L3" else (("L2", "REGISTER"),)
    for i, (src, dst) in enumerate(hops):
        body.append(DataMove(first + i, "LOAD", c_ref(src), c_ref(dst), at=place, when="kb > 0",
                             depends_on=[ring if i == 0 else first + i - 1]))
    return len(body) - 1


def _drain(body: list, c_ref, tiling: MatmulTiling, k_blocks: int) -> None:
    """Append the moves that take a result tile from the accumulators after each K block into its
    place in the ring at the split's level, and out to external memory after the last block only
    (`when` that block), through the levels between."""
    level, last = tiling.split.level, f"kb > {k_blocks - 2}"
    hops = [("REGISTER", "L2", None), ("L2", "L3", None), ("L3", "EXTERNAL", last)] if level == "L3" else \
        [("REGISTER", "L2", None), ("L2", "L3", last), ("L3", "EXTERNAL", last)]
    prev = len(body) - 1  # the compute
    for src, dst, when in hops:
        ring = dst == level
        body.append(DataMove(len(body), "STORE", c_ref(src), c_ref(dst), after="tk", when=when, depends_on=[prev],
                             depth=tiling.split.ring if ring else 1))
        prev = len(body) - 1


def lower_matmul(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """A MATMUL and its epilogue: the map ops applied on the vector unit to each result tile once
    the accumulators have drained it into L2, before it goes back to external memory."""
    op, epi = ops[0], ops[1:]
    a, b = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    cin = graph.tensors[op.inputs[2]] if len(op.inputs) == 3 else None
    c = graph.tensors[op.outputs[0]]
    # B given as [..., N, K] (a LINEAR's weight): the BlockMover transposes each tile into L2
    transpose_b = lookup("MATMUL").normalize_attrs(op.attrs)["transpose_b"]
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-2] if transpose_b else b.shape[-1]
    out_batch = c.shape[:-2]
    batch_vars = tuple(f"b{i}" for i in range(len(out_batch)))
    a_idx = _batch_indices(a.shape[:-2], out_batch)
    b_idx = _batch_indices(b.shape[:-2], out_batch)
    cin_idx: list[str] = []
    cin_rows = cin_cols = False
    if cin is not None:
        cin_shape = (1,) * max(0, 2 - len(cin.shape)) + cin.shape
        cin_idx = _batch_indices(cin_shape[:-2], out_batch)
        cin_rows, cin_cols = cin_shape[-2] == M and M > 1, cin_shape[-1] == N and N > 1
    dtypes = [a.dtype, b.dtype, c.dtype] + ([cin.dtype] if cin else [])
    acc = accumulation_dtype(dtypes)
    final = graph.tensors[ops[-1].outputs[0]]
    epi_operands = [graph.tensors[n] for n in kernel_reads(ops)[len(op.inputs):]]
    # the epilogue's operands, each loaded as a stream of its own (a bias row varies along N only)
    epilogue_operands = tuple((itemsize(t.dtype), len(t.shape) >= 2 and t.shape[-2] > 1,
                               len(t.shape) >= 1 and t.shape[-1] > 1) for t in epi_operands) if epi else None
    where = op.source or op.name
    if 0 in c.shape or K == 0:
        raise CompileError(f"{where}: MATMUL {M}x{N}x{K} has an empty dimension; there is nothing to tile")

    found = first_fit((MatmulProblem(
        M, N, K, batch_vars, tuple(out_batch),
        tuple(v for v in a_idx if v != "0"), tuple(v for v in b_idx if v != "0"),
        tuple(v for v in cin_idx if v != "0") if cin is not None else None, cin_rows, cin_cols,
        itemsize(a.dtype), itemsize(b.dtype), itemsize(cin.dtype) if cin else 0, itemsize(final.dtype),
        itemsize(acc), depth, epilogue_operands, a.dtype) for depth in (2, 1)),  # double-buffered loads where they fit
        lambda problem: choose_tiling(problem, target))
    if found is None:
        raise CompileError(f"{where}: no tiling of MATMUL {M}x{N}x{K} fits target '{target.name}'")
    problem, tiling = found
    Ti, Tj, Tk = tiling.Ti, tiling.Tj, tiling.Tk
    split = tiling.split
    k_block = min(K, Tk * split.depth) if split else None
    dataflow = choose_dataflow(dataflow, lambda d: tiled_cycles(M, N, K, Ti, Tj, Tk, target, d, k_block), target,
                               where)
    order = tiling.loop_order
    trips = tiling_trips(problem, tiling)
    within = tiling.within
    tile_loops = [TileLoop(v, 0, trips[v], parallel=v == tiling.parallel.loop, within=within.get(v),
                           per_block=tiling.blocks.get(v)) for v in order]

    def ref(tensor, level, batch_idx, inner_idx, inner_shape):
        # Dimensions without a loop in the nest are taken whole ("0").
        idx = [i if i in order else "0" for i in batch_idx + inner_idx]
        return TileRef(tensor.name, level, idx, [1] * len(batch_idx) + inner_shape)

    # each operand's tile at each level: (loop, extent) along M or N, and along K. In L3 a panel
    # (all of K) when one operand is resident: its block of tiles, the other's single tiles (a
    # panel, or its K tiles with `streamed_tiles`)
    Bi = min(M, Ti * (split.rows if split else tiling.per_block))
    Bj = min(N, Tj * (split.cols if split else tiling.per_block))
    l3_rows = ("bi", Bi) if tiling.resident == "A" or split else ("ti", min(Ti, M))
    l3_cols = ("bj", Bj) if tiling.resident == "B" or split else ("tj", min(Tj, N))
    k = ("tk", min(Tk, K))
    l3_k = {name: ("kb", k_block) if split else ("0", K) if tiling.whole_k(name) else k for name in "AB"}

    # a move copies its destination's tile: the L3 -> L2 move reads an L2 tile out of the L3 panel
    def a_ref(lvl, tile_level):
        (m_loop, m_size), (k_loop, k_size) = (l3_rows, l3_k["A"]) if tile_level == "L3" else (("ti", min(Ti, M)), k)
        return ref(a, lvl, a_idx, [m_loop, k_loop], [m_size, k_size])

    def b_ref(lvl, tile_level):
        (n_loop, n_size), (k_loop, k_size) = (l3_cols, l3_k["B"]) if tile_level == "L3" else (("tj", min(Tj, N)), k)
        if transpose_b:
            return ref(b, lvl, b_idx, [n_loop, k_loop], [n_size, k_size])
        return ref(b, lvl, b_idx, [k_loop, n_loop], [k_size, n_size])

    operand_refs = {"A": (a, a_ref), "B": (b, b_ref)}
    if cin is not None:
        inner = [("ti", min(Ti, M)) if cin_rows else ("0", 1), ("tj", min(Tj, N)) if cin_cols else ("0", 1)]
        inner = inner[2 - min(2, len(cin.shape)):]
        operand_refs["Cin"] = (cin, lambda lvl, _: ref(cin, lvl, cin_idx, [i for i, _ in inner],
                                                         [s for _, s in inner]))

    # the streams over external memory by the tensors they move, as every lowering names them
    names = dict(zip(("A", "B", "Cin"), op.inputs)) | {"C": ops[-1].outputs[0]}
    dram_streams = [replace(s, name=names[s.name]) for s in streams(problem, tiling)]

    def at(tile: TileRef) -> str | None:
        """A move sits at the innermost loop indexing its destination tile (None: before all)."""
        p = max((order.index(i) for i in tile.tile_indices if i in order), default=-1)
        return order[p] if p >= 0 else None

    body: list = []
    l1_ops: list[int] = []
    for key, (tensor, make) in operand_refs.items():
        prev: list[int] = []
        # The accumulator input goes straight into the PE registers; A and B stream via L1.
        last = "REGISTER" if key == "Cin" else "L1"
        for src, dst in (("EXTERNAL", "L3"), ("L3", "L2"), ("L2", last)):
            op_id = len(body)
            place = at(make(dst, dst))
            # double-buffer only a stream that runs more than once
            depth = 1 if key == "Cin" or place is None else \
                tiling.panel_depth if key == tiling.resident and dst == "L3" else problem.depth
            body.append(DataMove(op_id, "LOAD", make(src, dst), make(dst, dst), at=place, depth=depth, depends_on=prev,
                                 transpose=key == "B" and transpose_b and dst == "L2"))
            prev = [op_id]
        l1_ops.append(prev[0])
    inner_loop = order[-1] if order else None
    c_ref = lambda lvl: ref(c, lvl, [f"b{i}" for i in range(len(out_batch))], ["ti", "tj"], [min(Ti, M), min(Tj, N)])
    if split:  # the accumulators reloaded from the partial sums on chip, before every K block but the first
        l1_ops.append(_reload(body, c_ref, split.level, order))
    compute_id = len(body)
    body.append(Compute(compute_id, "MATMUL_TILE", [make(*["REGISTER" if key == "Cin" else "L1"] * 2)
                                                    for key, (_, make) in operand_refs.items()],
                        c_ref("REGISTER"), at=inner_loop,
                        accumulate="tk > 0" if "tk" in order else "false", depends_on=l1_ops))
    store_place = {"after": "tk"} if "tk" in order else {"at": inner_loop}
    extra: list[Stream] = []
    if split:
        _drain(body, c_ref, tiling, trips["kb"])
    elif epi:
        # the result space, for the epilogue's operands: C's dims, tiled by the loops that run
        loops = tuple(v if v in order else None for v in (*batch_vars, "ti", "tj"))
        space = Space(c.shape, (1,) * len(out_batch) + (min(Ti, M), min(Tj, N)), loops)
        # the accumulators drain to L2 as without an epilogue, so the array goes on with the next
        # block while the vector unit applies the epilogue to this one there
        body.append(DataMove(len(body), "STORE", c_ref("REGISTER"), c_ref("L2"), depends_on=[compute_id],
                             **store_place))
        last_name, last, extra = epilogue(body, graph, epi, c.name, "L2", len(body) - 1, space, order,
                                          problem.depth, store_place, level="L2")
        store(body, last_name, list(range(len(c.shape))), space, last, store_place, source="L2")
    else:
        prev = [compute_id]
        for src, dst in (("REGISTER", "L2"), ("L2", "L3"), ("L3", "EXTERNAL")):
            op_id = len(body)
            body.append(DataMove(op_id, "STORE", c_ref(src), c_ref(dst), depends_on=prev, **store_place))
            prev = [op_id]

    macs = math.prod(out_batch) * M * N * K
    per_stream = traffic([*dram_streams, *extra], order, trips, within)
    dram = sum(per_stream.values())
    compute_cycles = math.prod(out_batch) * tiled_cycles(M, N, K, Ti, Tj, Tk, target, dataflow, k_block)
    busiest = busiest_array_share(problem, tiling, trips, target, k_block, dataflow)  # of compute_cycles
    blocks = {"L3_Bi": Bi, "L3_Bj": Bj, "K_block": k_block} if split else \
        {"L3_Bi": Bi} if tiling.resident == "A" else {"L3_Bj": Bj} if tiling.resident == "B" else {}
    return Kernel(
        name=name, op="MATMUL", graph_op=op.name, dataflow=dataflow,
        tiling={"Ti": Ti, "Tj": Tj, "Tk": Tk, "L1_Ki": tiling.L1_Ki,
                "num_tiles_m": trips["ti"], "num_tiles_n": trips["tj"], "num_tiles_k": trips["tk"], **blocks},
        tile_loops=tile_loops,
        body=body,
        requirements=requirements(body_buffers(body, graph)),
        hints={
            "macs": macs,
            "l3_resident": _resident_hint(tiling, Bi, Bj, K, k_block, problem.depth),
            **({"partial_sums": f"{split.level}, a ring of {split.ring} result tile(s) per compute tile, over "
                                f"{trips['kb']} K blocks"} if split else {}),
            "estimated_compute_cycles": math.ceil(compute_cycles * busiest),
            "arithmetic_intensity": round(2 * macs / dram, 3),
            **({"vector_elements": dict(sorted(epilogue_work(graph, epi).items()))} if epi else {}),
            **dram_hints(per_stream, sum(s.bytes for s in [*dram_streams, *extra]), target,
                         tiling.parallel.workers),
        },
        epilogue=[o.name for o in epi],
        inputs=kernel_reads(ops),
        outputs=list(ops[-1].outputs),
    )

