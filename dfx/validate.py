"""Semantic checks of a program that a JSON Schema cannot express: names resolve, ids are
unique, roles agree with the ops, graph shapes are the ones the registry derives, loop
variables exist, tile index lists match tensor ranks, and every loop's trip count is the one its
tile indices need, so no edited number can make the loader run longer than the tensors' shapes
say. Then the schedule (`_schedule_problem`): the loader executes and times exactly what the body
says, so an edited body must not make it do less work than the graph, or other work, silently:
the dataflow names where the computes run, one loop at most is parallel and never the one a
compute accumulates over, only ops that can accumulate do, from the loop's first step, each op
sits where its tile indices run, each on-chip read is of the tile its writer made there before
it (or, a K split's reload of partial sums, of the tile the last drain wrote a K block before),
no partial sum leaves the chip before its last accumulation, a compute's operand tiles are the
ones its result tile needs, every result is stored, and a move's fill and index table are the
ones its graph op gives. And the chains (`_chain_links`, `_bands_problem`): kernels the loader
runs at once, band by band, whose links need no barrier."""

from __future__ import annotations

import math
import re

from .dtypes import DTYPES, itemsize
from .errors import ObjectFileError
from .graph import Graph, Op, shape_problem, slices_along
from .kernel import (Barrier, BodyOp, Compute, DataMove, IndexTable, IndexTensor, Kernel, TileLoop, TileRef, condition,
                     tile_refs)
from .ops import REGISTRY, VARIADIC, OpDef, lookup
from .ops.layout import one_run
from .ops.reduction import ACCUMULATING
from .program import Program


def validate_program(program: Program, where: str) -> None:
    """Raise ObjectFileError naming the first problem found."""
    def fail(place: str, reason: str) -> None:
        raise ObjectFileError(f"{where}: {place}: {reason}")

    g = program.graph
    for t in g.tensors.values():
        if t.dtype not in DTYPES:
            fail(f"tensor '{t.name}'", f"unknown dtype '{t.dtype}'")
        problem = shape_problem(t.shape)
        if problem:
            fail(f"tensor '{t.name}'", problem)
        if t.home is not None and t.role != "intermediate":
            fail(f"tensor '{t.name}'", f"has its home in {t.home}, but a graph {t.role} lives in external memory")
        if t.ring is not None and t.home != "L3":
            fail(f"tensor '{t.name}'", f"has a ring of {t.ring} {t.ring_holds} but no home in L3 to hold them")
        if t.ring is None and t.ring_dim != 1:
            fail(f"tensor '{t.name}'", f"has ring_dim {t.ring_dim} but no ring")
        if t.ring_dim not in (1, len(t.shape) - 1):
            fail(f"tensor '{t.name}'", f"has ring_dim {t.ring_dim}: a ring holds rows (dim 1) or channels (dim "
                 f"{len(t.shape) - 1}, the last)")
    # with no graph op there is no kernel either (each op must have one, checked last)
    if not g.ops:
        fail("graph", "has no ops: the program computes nothing")
    producer: dict[str, str] = {}
    readers: dict[str, set[str]] = {}  # tensor -> the graph ops reading it
    graph_ops: dict[str, Op] = {}
    for op in g.ops:
        # a second op of one name would hide behind the first: its kernel, its check
        if op.name in graph_ops:
            fail(f"graph op '{op.name}'", "listed twice in the graph")
        graph_ops[op.name] = op
        for name in op.inputs:
            readers.setdefault(name, set()).add(op.name)
        for name in op.inputs + op.outputs:
            if name not in g.tensors:
                fail(f"graph op '{op.name}'", f"unknown tensor '{name}'")
        opdef = lookup(op.op_type)
        if opdef is None:  # every graph op is in a kernel, and a kernel runs only registry ops
            fail(f"graph op '{op.name}'", f"unknown op '{op.op_type}'")
        # the shapes the registry derives: a kernel tiles the declared ones, --check computes the derived
        if not opdef.min_inputs <= len(op.inputs) <= opdef.max_inputs:
            most = "or more" if opdef.max_inputs == VARIADIC else f"to {opdef.max_inputs}"
            fail(f"graph op '{op.name}'",
                 f"{op.op_type} takes {opdef.min_inputs} {most} operands, got {len(op.inputs)}")
        try:
            attrs = opdef.normalize_attrs(op.attrs)
            derived = opdef.infer_shapes([g.tensors[n].shape for n in op.inputs],
                                         [g.tensors[n].dtype for n in op.inputs], attrs)
        except ValueError as e:  # ShapeError, or a shape rule meeting shapes no frontend lets through
            fail(f"graph op '{op.name}'", str(e).splitlines()[0] if str(e) else type(e).__name__)
        declared = [list(g.tensors[n].shape) for n in op.outputs]
        if [[int(d) for d in shape] for shape in derived] != declared:
            fail(f"graph op '{op.name}'", f"{op.op_type} of {[list(g.tensors[n].shape) for n in op.inputs]} makes "
                 f"{[[int(d) for d in shape] for shape in derived]}, the graph declares {declared}")
        for name in op.outputs:
            if name in producer:
                fail(f"graph op '{op.name}'", f"writes '{name}', which graph op '{producer[name]}' writes too")
            producer[name] = op.name
    # roles must agree with the ops, or a run would overwrite an input or check nothing
    for t in g.tensors.values():
        if t.name in producer and t.role in ("input", "constant"):
            fail(f"tensor '{t.name}'", f"has role '{t.role}' but graph op '{producer[t.name]}' produces it")
        if t.name not in producer and t.role in ("output", "intermediate"):
            fail(f"tensor '{t.name}'", f"has role '{t.role}' but no graph op produces it")
    if not g.outputs:
        fail("graph", "has no output tensor, so a run would compute and check nothing")
    for name, raw in g.constants.items():
        t = g.tensors.get(name)
        if t is None:
            fail(f"constants/{name}", "not a tensor of the graph")
        if t.role not in ("input", "constant"):
            fail(f"constants/{name}", f"gives a value to a tensor of role '{t.role}', which a graph op computes")
        if len(raw) != t.size * itemsize(t.dtype):
            fail(f"constants/{name}", f"holds {len(raw)} bytes, tensor {list(t.shape)} {t.dtype} "
                 f"needs {t.size * itemsize(t.dtype)}")
    links = _chain_links(program, fail)  # link tensor -> the names of its chain's kernels
    kernel_names: set[str] = set()
    body_ids: dict[str, set[int]] = {}  # kernel -> its op ids
    written: dict[str, tuple[str, set[int]]] = {}  # tensor -> (kernel, its ops writing it to EXTERNAL)
    # tensors in external memory before a kernel runs: inputs, constants, earlier kernels' outputs
    ready = {t.name for t in g.tensors.values() if t.role in ("input", "constant")}
    for k in program.kernels:
        place = f"kernel '{k.name}'"
        if k.name in kernel_names:
            fail(place, "duplicate kernel name")
        if lookup(k.op) is None:
            fail(place, f"unknown op '{k.op}'")
        for dep in k.depends_on:
            if dep not in kernel_names:
                fail(place, f"depends on '{dep}', which is not an earlier kernel")
        kernel_names.add(k.name)
        group = [graph_ops.pop(name, None) for name in [k.graph_op, *k.epilogue]]
        if None in group or group[0].op_type != k.op:
            fail(place, f"does not match graph op '{k.graph_op}' and its epilogue (each graph op in "
                 f"exactly one kernel, the first of the kernel's op type)")
        made = {t for op in group for t in op.outputs}
        reads = [t for op in group for t in op.inputs if t not in made]
        if reads != k.inputs or group[-1].outputs != k.outputs:
            fail(place, f"reads [{', '.join(k.inputs)}] and writes [{', '.join(k.outputs)}], its graph ops "
                 f"read [{', '.join(reads)}] and write [{', '.join(group[-1].outputs)}]")
        members = {op.name for op in group}
        for t in made - set(k.outputs):
            # a fused intermediate never leaves the compute tile: nothing else may want it
            if g.tensors[t].role != "intermediate" or readers.get(t, set()) - members:
                fail(place, f"keeps '{t}' on chip, but it is a graph output or read by another kernel")
        op_of = {t: op for op in group for t in op.outputs}
        computed: set[str] = set()
        for name in k.inputs:
            if name not in ready:
                fail(place, f"reads '{name}' before any kernel computes it")
        ready.update(k.outputs)
        loop_vars = [l.induction_var for l in k.tile_loops]
        if len(set(loop_vars)) != len(loop_vars):
            fail(place, "duplicate tile loop variable")
        for i, l in enumerate(k.tile_loops):
            if l.end < l.start:
                fail(f"{place} loop '{l.induction_var}'", f"end {l.end} < start {l.start}")
            problem = _block_problem(l, k.tile_loops[:i], k.tile_loops)
            if problem:
                fail(f"{place} loop '{l.induction_var}'", problem)
        ids: set[int] = set()
        indexing: set[str] = set()  # loop variables some tile index uses, bounded by its tensor
        stored: set[str] = set()  # tensors the kernel's moves write to external memory
        barriers: dict[int, Barrier] = {}
        carried = k.carried_reads()
        for op in k.body:
            op_place = f"{place} op {op.op_id}"
            if op.op_id in ids:
                fail(op_place, "duplicate op_id")
            if isinstance(op, Barrier):
                waits_on = body_ids.get(op.kernel) if op.kernel is not None else ids
                if waits_on is None:
                    fail(op_place, f"waits for kernel '{op.kernel}', which is not an earlier kernel")
                if not set(op.wait_for) <= waits_on:
                    fail(op_place, f"waits for ops {sorted(set(op.wait_for) - waits_on)}, which "
                         f"{'kernel ' + repr(op.kernel) if op.kernel else 'the kernel'} does not have before it")
                barriers[op.op_id] = op
            # a read of what an earlier kernel wrote (a source, or the index tensor a source is
            # read through) must be ordered after it by a barrier
            for tensor in op.external_reads() if isinstance(op, DataMove) else []:
                # but a link within a chain: the loader orders its reads after its writes by rows
                if tensor not in written or k.name in links.get(tensor, ()):
                    continue
                producer, stores = written[tensor]
                if not any(d in barriers and barriers[d].kernel == producer and stores <= set(barriers[d].wait_for)
                           for d in op.depends_on):
                    fail(op_place, f"reads intermediate '{tensor}' with no BARRIER ordering it after "
                         f"kernel '{producer}' wrote it")
            for dep in op.depends_on:
                # but a K split's reload, on what a later op wrote a step before (`_split_problem`)
                if dep not in ids and carried.get(op.op_id) != dep:
                    fail(op_place, f"depends on op {dep}, which is not an earlier op of the kernel")
            ids.add(op.op_id)
            for anchor in (op.at, op.after):
                if anchor is not None and anchor not in loop_vars:
                    fail(op_place, f"placed at unknown loop '{anchor}'")
            if op.at is not None and op.after is not None:
                fail(op_place, "has both 'at' and 'after'")
            # a COMPUTE is one of the kernel's graph ops: one tile of each of its inputs, in order,
            # into its result
            if isinstance(op, Compute):
                source = op_of.get(op.output.tensor)
                want = lookup(source.op_type).compute_type if source is not None else None
                if source is None or op.compute_type != want or [r.tensor for r in op.inputs] != source.inputs \
                        or [op.output.tensor] != source.outputs:
                    got = f"{op.compute_type} from [{', '.join(r.tensor for r in op.inputs)}] into {op.output.tensor}"
                    fail(op_place, f"computes {got}, which is none of the kernel's graph ops")
                opdef = lookup(source.op_type)
                if opdef.tile is None or (opdef.tile_mnk is None and opdef.vector_work is None):
                    fail(op_place, f"computes {source.op_type}, which has no tile computation on the array or the "
                         f"vector unit (a compiler pass rewrites it first)")
                computed.add(source.name)
            if isinstance(op, Compute) and not _accumulate_ok(op.accumulate, loop_vars):
                fail(op_place, f"accumulate '{op.accumulate}' is not 'true', 'false' or '<loop> > <int>'")
            if isinstance(op, DataMove) and op.when is not None and (
                    op.when in ("true", "false") or not _accumulate_ok(op.when, loop_vars)):
                fail(op_place, f"when '{op.when}' is not '<loop> > <int>'")
            for ref in tile_refs(op):
                t = g.tensors.get(ref.tensor)
                if t is None:
                    fail(op_place, f"unknown tensor '{ref.tensor}'")
                counts = [len(ref.tile_indices), len(ref.tile_shape), len(ref.offset or t.shape),
                          len(ref.step or t.shape), len(ref.padding or t.shape)]
                if counts != [len(t.shape)] * 5:
                    fail(op_place, f"tile of '{ref.tensor}' has {counts[0]} indices, {counts[1]} extents, "
                         f"{counts[2]} offsets, {counts[3]} steps and {counts[4]} paddings for a "
                         f"rank-{len(t.shape)} tensor")
                if (ref.table is not None and not isinstance(op, DataMove)) \
                        or (ref.windowed and isinstance(op, Compute) and ref is op.output):
                    fail(op_place, f"tile of '{ref.tensor}' has a window or a table, which only a data move's "
                         f"may (and a compute's operand, read as a move left it)")
                table = _table(ref, t.shape, group, g) if ref.table is not None else 0
                if isinstance(table, str):
                    fail(op_place, table)
                for axis, (index, extent, dim) in enumerate(zip(ref.tile_indices, ref.tile_shape, t.shape)):
                    if index == "0":
                        trips = 1
                    elif index in loop_vars:
                        loop = k.tile_loops[loop_vars.index(index)]
                        trips = loop.end if loop.step == 1 and loop.start == 0 else -1
                    else:
                        fail(op_place, f"tile index '{index}' is not a loop variable")
                    problem, bounded = _dim_problem(ref, axis, trips, dim, table)
                    if problem:
                        fail(op_place, problem)
                    if bounded:
                        indexing.add(index)
            if isinstance(op, DataMove):
                problem = _move_problem(op, g)
                if problem:
                    fail(op_place, problem)
                if op.destination.level == "EXTERNAL":
                    stored.add(op.destination.tensor)
        for op in group:
            opdef = lookup(op.op_type)
            if opdef is not None and opdef.family == "layout":  # it computes nothing: moves write its result
                if op.outputs[0] not in stored:
                    fail(place, f"writes no tile of '{op.outputs[0]}', the result of its graph op '{op.name}'")
            elif op.name not in computed:
                fail(place, f"has no COMPUTE of its graph op '{op.name}'")
        for l in k.tile_loops:
            if l.induction_var not in indexing:
                # nothing would bound its trips but the number written in the file
                fail(f"{place} loop '{l.induction_var}'", "indexes no tile dimension")
        problem = _schedule_problem(k, g, op_of)
        if problem:
            fail(*problem)
        body_ids[k.name] = ids
        for op in k.body:
            if isinstance(op, DataMove) and op.destination.level == "EXTERNAL":
                writer = written.setdefault(op.destination.tensor, (k.name, set()))
                writer[1].add(op.op_id)

    for name in graph_ops:
        fail(f"graph op '{name}'", "has no kernel")
    problem = _bands_problem(program, links)
    if problem:
        fail(*problem)


def _chain_links(program: Program, fail) -> dict[str, set[str]]:
    """Each link tensor (written by a kernel of a chain, read by a later one) -> the names of its
    chain's kernels, once the chains are as the loader runs them: consecutive kernels, each after
    the first reading a result of the one before it, their links read by them alone (kept in L3,
    or passing through external memory), one image along dim 0, and a ring only on a link."""
    position = {k.name: i for i, k in enumerate(program.kernels)}
    chain_of: dict[str, str] = {}
    links: dict[str, set[str]] = {}
    for chain in program.chains:
        place = f"chain [{', '.join(chain)}]"
        for name in chain:
            if name not in position:
                fail(place, f"'{name}' is no kernel of the program")
            if name in chain_of:
                fail(place, f"kernel '{name}' is in chain {chain_of[name]} too")
            chain_of[name] = place.removeprefix("chain ")
        first = position[chain[0]]
        if [position[name] for name in chain] != list(range(first, first + len(chain))):
            fail(place, "its kernels are not consecutive in program order")
        members = [program.kernels[position[name]] for name in chain]
        for before, k in zip(members, members[1:]):
            if not set(before.outputs) & set(k.inputs):
                fail(place, f"kernel '{k.name}' reads no result of kernel '{before.name}', the one before it")
        made = {t for k in members[:-1] for t in k.outputs}
        for t in sorted(made & {t for k in members[1:] for t in k.inputs}):
            tensor = program.graph.tensors[t]
            outside = [k.name for k in program.kernels if t in k.inputs and k.name not in chain]
            if outside:
                fail(place, f"link '{t}' is read by kernel '{outside[0]}', which is not in the chain")
            if len(tensor.shape) < 2 or tensor.shape[0] != 1:
                fail(place, f"link '{t}' has shape {list(tensor.shape)}; a link holds one image (dim 0 of 1) "
                     f"whose rows (dim 1) the kernels go by")
            if tensor.home == "L2":
                fail(place, f"link '{t}' has its home in L2; a link is kept in L3, or in external memory")
            links[t] = set(chain)
    for t in program.graph.tensors.values():
        if t.ring is not None and t.name not in links:
            fail(f"tensor '{t.name}'", f"has a ring of {t.ring} {t.ring_holds} but links no chain's kernels: "
                 f"only a chain reads them while they are written")
    return links


def _bands_problem(program: Program, links: dict[str, set[str]]) -> tuple[str, str] | None:
    """Why a chain's kernels would not go by bands of a link (None if they do): each move that
    reads or writes a link at its home (its EXTERNAL side, or its plain L3 tile) indexes the
    link's band dim, the one its writer's band loop steps (rows, dim 1, or channels, the last),
    by its kernel's band loop (`Kernel.band_loop`: the outermost loop of more than one trip, or,
    reading it, the next where that is a parallel loop not indexing its band dim), so each compute
    tile visits the bands in order (loops step upward), once per step it takes of such a parallel
    loop. A ring holds slices along the dim its link goes by."""
    writer = {t: k for k in program.kernels for t in k.outputs}
    for tensor in sorted(links):
        k = writer[tensor]
        dim = k.band_dim(tensor)
        chain = next(c for c in program.chains if links[tensor] <= set(c))
        place = f"chain [{', '.join(chain)}]"
        if k.band_loop() is None:
            return place, (f"link '{tensor}' goes by no bands: its writer, kernel '{k.name}', has no loop of more "
                           f"than one trip")
        if dim not in (1, len(program.graph.tensors[tensor].shape) - 1):
            return place, (f"link '{tensor}' goes by no band of rows or channels: kernel '{k.name}', its writer, "
                           f"moves it at its home by its outermost loop of more than one trip "
                           f"('{k.band_loop().induction_var}') along neither dim 1 nor the last")
        t = program.graph.tensors[tensor]
        if t.ring is not None and dim != t.ring_dim:
            return place, f"link '{tensor}' goes by {slices_along(dim)}, but its home is a ring of {t.ring_holds}"
        for k in (k for k in program.kernels if k.name in links[tensor]):
            found = k.off_band(tensor, dim)
            if found is None:
                continue
            (op, ref), band = found, k.band_loop(tensor, dim)
            outer = f"'{band.induction_var}'" if band is not None else "none: it has no loop of more than one trip"
            return place, (f"kernel '{k.name}' op {op.op_id} moves link '{ref.tensor}' at {ref.level} by "
                           f"'{ref.tile_indices[dim]}' along dim {dim}; a chain's kernels go by its bands, each by its "
                           f"band loop ({outer})")
    return None


ARRAY_DATAFLOWS = ("output_stationary", "weight_stationary", "input_stationary")
# the ops whose tile COMPUTE adds to a partial result: the array's (C += A B over k) and the
# reductions that combine the tiles of their reduced axes
ACCUMULATES = frozenset(n for n, d in REGISTRY.items() if d.tile_mnk is not None and d.tile is not None) | ACCUMULATING
# what the engines move: DMA EXTERNAL <-> L3, BlockMover L3 <-> L2, Streamer L2 <-> L1 and the
# array's fill and drain L2 <-> REGISTER (a VIEW moves nothing, EXTERNAL -> EXTERNAL)
HOPS = frozenset(frozenset(p) for p in (("EXTERNAL", "L3"), ("L3", "L2"), ("L2", "L1"), ("L2", "REGISTER")))
ON_CHIP = ("L3", "L2", "L1", "REGISTER")


def _block_problem(loop: TileLoop, outer: list[TileLoop], loops: list[TileLoop]) -> str | None:
    """Why a loop's blocks would not cover its steps exactly once (None if they would): a loop
    within blocks and its loop over blocks both count from 0 by 1, the blocks of `per_block`
    steps tiling the loop's range, the block loop enclosing it and no other."""
    if loop.within is None:
        return None
    block = next((l for l in outer if l.induction_var == loop.within), None)
    if block is None:
        return f"runs within loop '{loop.within}', which does not enclose it"
    if block.within is not None or sum(l.within == block.induction_var for l in loops) > 1:
        return f"runs within loop '{block.induction_var}', which must be a loop over blocks of this loop alone"
    if (loop.start, loop.step, block.start, block.step) != (0, 1, 0, 1):
        return "and its loop over blocks must count from 0 by 1"
    if block.end != -(-loop.end // loop.per_block):
        return (f"has {loop.end} steps in blocks of {loop.per_block}, which loop '{block.induction_var}' "
                f"runs {block.end} of, not {-(-loop.end // loop.per_block)}")
    return None


def _held(made: TileRef, ref: TileRef, loops: dict[str, TileLoop], shape: tuple[int, ...]) -> bool:
    """Whether tile `ref` lies inside tile `made` at every step: the same tile, or along each
    dim the same tiles, a tile of a block `made` holds (its loop runs within `made`'s, whose
    tiles are its blocks) or any tile of a dim `made` holds whole."""
    if _geometry(made) == _geometry(ref):
        return True
    for axis, (index, extent, outer, outer_extent, dim) in enumerate(zip(ref.tile_indices, ref.tile_shape,
                                                                         made.tile_indices, made.tile_shape, shape)):
        if _dim_geometry(made, axis) == _dim_geometry(ref, axis):
            continue
        if _dim_windowed(made, axis) or _dim_windowed(ref, axis):
            return False
        if outer == "0" and outer_extent >= dim:
            continue
        loop = loops.get(index)
        if loop is not None and loop.within == outer and extent * loop.per_block == outer_extent:
            continue
        return False
    return True


def _dim_geometry(ref: TileRef, axis: int) -> tuple:
    """How the tiles of `ref` lie along `axis`: index, extent, offset, step and padding."""
    return (ref.tile_indices[axis], ref.tile_shape[axis], ref.offset[axis] if ref.offset else 0,
            ref.step[axis] if ref.step else ref.tile_shape[axis], tuple(ref.padding[axis]) if ref.padding else (0, 0))


def _dim_windowed(ref: TileRef, axis: int) -> bool:
    _, extent, offset, step, padding = _dim_geometry(ref, axis)
    return offset != 0 or step != extent or padding != (0, 0)


def _geometry(ref: TileRef) -> tuple:
    return tuple(_dim_geometry(ref, axis) for axis in range(len(ref.tile_indices)))


def _position(op: BodyOp, order: list[str]) -> tuple[int, int]:
    """Where an op runs in the loop nest (kernel.py): (scope, phase). Inside an iteration of loop
    scope - 1 (scope 0: the whole kernel), the ops of phase 0 run first, then loop `scope` with
    everything deeper, then the ops of phase 1. The loops live at the op are order[:scope]."""
    if op.after is not None:
        return order.index(op.after), 1
    if op.at is not None:
        return order.index(op.at) + 1, 0
    return 0, 0


def _shown(op: BodyOp) -> str:
    return f"after '{op.after}'" if op.after is not None else f"at '{op.at}'" if op.at is not None else \
        "before all loops"


def _runs_before(writer: tuple[int, int], reader: tuple[int, int]) -> bool:
    """Whether an op at position `writer` has run, in the current iterations, when one at
    position `reader` runs (at one place, body order decides: the writer comes first)."""
    (sw, pw), (sr, pr) = writer, reader
    if sw < sr:  # an outer place: its ops before the loop holding the reader
        return pw == 0
    if sw > sr:  # inside the loop the reader sits before or after
        return pr == 1
    return pw <= pr


def _reads(op: BodyOp) -> list[TileRef]:
    """The on-chip tiles an op reads."""
    if isinstance(op, DataMove):
        return [op.source] if op.source.level in ON_CHIP else []
    return list(op.inputs) if isinstance(op, Compute) else []


def _written(op: BodyOp) -> TileRef | None:
    """The on-chip tile an op writes."""
    ref = op.destination if isinstance(op, DataMove) else op.output if isinstance(op, Compute) else None
    return ref if ref is not None and ref.level in ON_CHIP else None


def _move_made(op: BodyOp) -> tuple | int:
    """What a move writes, where and from what (a compute: its id, a copy of nothing else)."""
    if not isinstance(op, DataMove):
        return op.op_id
    def geometry(r: TileRef) -> tuple:
        table = (type(r.table).__name__, *vars(r.table).values()) if r.table is not None else None
        return r.tensor, r.level, _geometry(r), table

    return (geometry(op.source), geometry(op.destination), op.at, op.after, op.transpose,
            tuple(op.permutation or ()), op.fill)


def _reordered(op: DataMove, order: list[int] | None, rank: int) -> list[int] | None:
    """The order of the dims of the tile `op` writes, as held, from its source's (None: as laid
    out): `transpose` swaps the last two, a `permutation` within one tensor permutes them."""
    order = list(order or range(rank))
    if op.transpose:
        order[-2:] = order[:-3:-1]
    if op.permutation is not None and op.source.tensor == op.destination.tensor:
        order = [order[p] for p in op.permutation]
    return None if order == sorted(order) else order


def _held_words(order: list[int] | None) -> str:
    if order is None:
        return "as laid out"
    if order == [*range(len(order) - 2), len(order) - 1, len(order) - 2]:
        return "transposed"
    return f"with its dims in the order {order}"


def _tile(ref: TileRef) -> str:
    offset = f" from {ref.offset}" if ref.offset is not None else ""
    step = f" by {ref.step}" if ref.step is not None else ""
    padding = f" padded {ref.padding}" if ref.padding is not None else ""
    return f"{ref.tile_indices} of {ref.tile_shape}{offset}{step}{padding}"


def _schedule_problem(k: Kernel, g: Graph, op_of: dict[str, Op]) -> tuple[str, str] | None:
    """Why the kernel's loops and body would do less work than its graph ops, or other work (None
    if they would not): the place and the reason. A run executes and times what the body says, op
    by op, each tile op on the tile last written to its (tensor, level), so every read must be of
    the tile its writer made, where and when that writer made it."""
    place = f"kernel '{k.name}'"
    order = [l.induction_var for l in k.tile_loops]
    loops = {l.induction_var: l for l in k.tile_loops}
    by_id = {op.op_id: op for op in k.body}
    computes = [op for op in k.body if isinstance(op, Compute)]
    graph_op = {op.op_id: op_of[op.output.tensor] for op in computes}
    opdef = {i: lookup(o.op_type) for i, o in graph_op.items()}
    layout = lookup(k.op).family == "layout"

    # the dataflow says where the computes run: the array's stationarity, the vector unit, none
    array = [op for op in computes if opdef[op.op_id].on_array(k.dataflow)]
    if computes and k.dataflow == "moves":
        return f"{place} op {computes[0].op_id}", "is a COMPUTE in a kernel of dataflow 'moves', which only moves data"
    if array and k.dataflow not in ARRAY_DATAFLOWS:
        return (f"{place} op {array[0].op_id}", f"runs {array[0].compute_type} on the array, but the kernel's dataflow "
                f"'{k.dataflow}' is no array stationarity ({', '.join(ARRAY_DATAFLOWS)})")
    want = ("moves" if not computes else "an array stationarity" if array else "vector")
    if (not computes and k.dataflow != "moves") or (computes and not array and k.dataflow != "vector"):
        return place, f"has dataflow '{k.dataflow}', but its computes make it {want}"

    # the parallel loop's iterations are dealt to the compute tiles: a second one would deal its
    # own and drop the rest
    parallel = [l.induction_var for l in k.tile_loops if l.parallel]
    if len(parallel) > 1:
        return (f"{place} loop '{parallel[1]}'", f"is parallel as well as loop '{parallel[0]}': a kernel divides one "
                f"loop over the compute tiles, and a second would skip iterations")

    extent: dict[str, tuple[int, str]] = {}  # loop -> the tile extent it steps, and a tensor it indexes
    # each sliding-window op's input -> the op: along H and W its bands are as large as its windows
    # need, whatever the loops step (`_band_problem` checks them against the result tile), and their
    # padding holds the op's value (zero unless the registry says otherwise)
    bands = {op.inputs[0].tensor: graph_op[op.op_id] for op in computes if opdef[op.op_id].windows is not None}
    carried = k.carried_reads()  # reload -> the later op whose tile of a step before it reads
    problem = _split_problem(k, order, loops, computes, carried)
    if problem:
        return problem
    fills = {f.op_id for f in _fills(k, loops, computes).values()}
    for op in k.body:
        op_place = f"{place} op {op.op_id}"
        scope, _ = _position(op, order)
        for ref in tile_refs(op):
            for axis, (index, size) in enumerate(zip(ref.tile_indices, ref.tile_shape)):
                if index == "0":
                    continue
                if index not in order[:scope]:  # its value there would be 0: every run the first tile
                    return (op_place, f"indexes its tile of '{ref.tensor}' by loop '{index}', which does not run "
                            f"where the op is placed ({_shown(op)})")
                if _dim_windowed(ref, axis) or (ref.tensor in bands and axis in (1, 2)):
                    continue
                first = extent.setdefault(index, (size, ref.tensor))
                if first[0] != size:
                    return (op_place, f"steps tiles of {size} of '{ref.tensor}' along loop '{index}', which steps "
                            f"tiles of {first[0]} of '{first[1]}'")
        deps = list(op.depends_on) + (list(op.wait_for) if isinstance(op, Barrier) and op.kernel is None else [])
        for d in deps:
            if carried.get(op.op_id) != d and not _runs_before(_position(by_id[d], order),
                                                               (scope, _position(op, order)[1])):
                return (op_place, f"is placed {_shown(op)} but depends on op {d}, placed {_shown(by_id[d])}, which "
                        f"runs only after it there")
        if isinstance(op, DataMove):
            src, dst = op.source, op.destination
            if op.move_type != "VIEW" and frozenset((src.level, dst.level)) not in HOPS:
                return (op_place, f"moves {src.level} -> {dst.level}, which no engine does (EXTERNAL <-> L3 <-> L2 "
                        f"<-> L1, L2 <-> REGISTER)")
            if src.level == "EXTERNAL" and src.tensor not in k.inputs:
                return op_place, f"reads '{src.tensor}' from external memory, which is none of the kernel's inputs"
            if dst.level == "EXTERNAL" and dst.tensor not in k.outputs:
                return op_place, f"writes '{dst.tensor}' to external memory, which is none of the kernel's results"
            if src.tensor != dst.tensor and not layout:
                return op_place, f"moves '{src.tensor}' into '{dst.tensor}'; only a layout kernel's moves change tensor"
            if not layout and any(r.table is not None for r in (src, dst)):
                return op_place, "takes an index table, which only a layout kernel's moves do"
            if src.tensor == dst.tensor and (src.offset, src.step, src.padding) != (dst.offset, dst.step, dst.padding):
                return (op_place, f"moves the tiles of '{src.tensor}' from {_tile(src)} to {_tile(dst)}; a move "
                        f"within a tensor keeps its tiles where they are")
            problem = _fill_problem(op, g, op_of, bands)
            if problem:
                return op_place, problem
    for name in k.outputs:
        if not any(isinstance(op, DataMove) and op.destination.level == "EXTERNAL" and op.destination.tensor == name
                   for op in k.body):
            return place, f"writes no tile of its result '{name}' to external memory"

    # on chip, each read is of the tile the last earlier writer of that (tensor, level) made: the
    # op it depends on, with the same tiles, run before it where it is placed
    writers: dict[tuple[str, str], list[BodyOp]] = {}
    readers: dict[tuple[str, str], list[BodyOp]] = {}
    # op id -> the order of the dims of the tile it writes, as held (tile dim j is its tensor's dim
    # order[j]; None: as the tensor lays them out): an operand its COMPUTE takes in another order
    # (`OpDef.operand_order`: MATMUL's B given transposed, CONV2D's weights in another layout)
    # arrives so through the moves that reorder it, every other tile is held as laid out
    held_as: dict[int, list[int] | None] = {}
    last_writer = {(made.tensor, made.level): op for op in k.body if (made := _written(op)) is not None}
    read_from: dict[tuple[str, str], list[tuple[BodyOp, BodyOp]]] = {}  # (tensor, level) -> (reader, writer)s
    for op in k.body:
        op_place = f"{place} op {op.op_id}"
        held: list[list[int] | None] = []
        for ref in _reads(op):
            key = (ref.tensor, ref.level)
            readers.setdefault(key, []).append(op)
            if op.op_id in carried:  # a reload of what the last writer in the body left a step before
                w = last_writer.get(key)
                if w is None or w.op_id != carried[op.op_id] or _geometry(_written(w)) != _geometry(ref):
                    return (op_place, f"reloads tiles {_tile(ref)} of {ref.tensor} at {ref.level}, which op "
                            f"{carried[op.op_id]} does not write last ({ref.tensor} at {ref.level} is reloaded "
                            f"as the tile the last drain wrote)")
                held.append(None)
                continue
            if not writers.get(key):
                return op_place, f"reads {ref.tensor} at {ref.level}, which no earlier op of the kernel writes"
            w = writers[key][-1]
            if w.op_id not in op.depends_on:
                return op_place, f"reads {ref.tensor} at {ref.level} without depending on op {w.op_id}, which writes it"
            if isinstance(op, DataMove) and op.depends_on[0] != w.op_id:
                return op_place, f"must depend first on op {w.op_id}, which fills the {ref.tensor} tile it moves"
            made = _written(w)
            whole = _geometry(made) == _geometry(ref)
            if not whole and held_as[w.op_id] is not None:
                return (op_place, f"reads part of the {ref.tensor} tile at {ref.level} that op {w.op_id} holds "
                        f"{_held_words(held_as[w.op_id])}; only a tile held as laid out can be read in parts")
            if not _held(made, ref, loops, g.tensors[ref.tensor].shape):
                return (op_place, f"reads tiles {_tile(ref)} of {ref.tensor} at {ref.level}, op {w.op_id} writes "
                        f"tiles {_tile(made)}")
            held.append(held_as[w.op_id])
            read_from.setdefault(key, []).append((op, w))
        if isinstance(op, DataMove):
            made_as = _reordered(op, held[0] if held else None, len(g.tensors[op.destination.tensor].shape))
            if made_as is not None and op.destination.level == "EXTERNAL":
                return (op_place, f"writes a tile of '{op.destination.tensor}' held {_held_words(made_as)} to "
                        f"external memory")
            held_as[op.op_id] = made_as
        elif isinstance(op, Compute):
            d = opdef[op.op_id]
            attrs = d.normalize_attrs(graph_op[op.op_id].attrs)
            wants = (d.operand_order([g.tensors[r.tensor].shape for r in op.inputs], attrs)
                     if d.operand_order is not None else [None] * len(op.inputs))
            for ref, read_as, want in zip(op.inputs, held, wants):
                if read_as != want:
                    return (op_place, f"reads {ref.tensor} at {ref.level} {_held_words(read_as)}, but "
                            f"{graph_op[op.op_id].op_type} '{graph_op[op.op_id].name}' takes it {_held_words(want)}")
            held_as[op.op_id] = None
        made = _written(op)
        if made is not None:
            writers.setdefault((made.tensor, made.level), []).append(op)
    # several writers of one (tensor, level): each reader gets the tile of the last one before it
    # in body order only if they all sit at one place with their readers, or each reader at the
    # place of the writer it reads (nothing runs between them there), or if they are copies of
    # one move (an operand two ops of a fusion group read, loaded for each). A reload of the
    # accumulators is the partial sum their compute adds to (`_split_problem`)
    for (tensor, level), ops in writers.items():
        ops = [o for o in ops if o.op_id not in fills]
        if len(ops) > 1:
            spots = {(o.at, o.after) for o in ops + readers.get((tensor, level), [])}
            copies = len({_move_made(o) for o in ops}) == 1
            paired = all((r.at, r.after) == (w.at, w.after) for r, w in read_from.get((tensor, level), []))
            if not (len(spots) == 1 or copies or paired) or \
                    any(isinstance(o, Compute) and o.accumulate != "false" for o in ops):
                return (f"{place} op {ops[1].op_id}", f"writes {tensor} at {level} as op {ops[0].op_id} does; ops may "
                        f"share a tile only as copies of one move, or at one place with its readers, and never "
                        f"with an accumulation")

    # a COMPUTE makes its result tile once per iteration of every loop it sits in that indexes the
    # tile; it may sit in one more, innermost, only to add up the tiles of its operands along it
    for op in computes:
        op_place = f"{place} op {op.op_id}"
        d = opdef[op.op_id]
        for ref in [*op.inputs, op.output]:
            if ref.level == "L3":
                return op_place, f"computes on {ref.tensor} at L3; a compute works on tiles in L2, L1 and registers"
        if d.on_array(k.dataflow) and (op.output.level != "REGISTER"
                                       or any(r.level not in ("L1", "REGISTER") for r in op.inputs)):
            return (op_place, "runs on the array, which takes its operands from L1 (an accumulator input from its "
                    "registers) and writes its registers")
        problem = _operand_problem(op, d, d.normalize_attrs(graph_op[op.op_id].attrs), g)
        if problem:
            return op_place, problem
        live = order[:_position(op, order)[0]]
        made = {v for v in op.output.tile_indices if v != "0"}
        # a loop over blocks steps the tiles of the loop within it
        made |= {loops[v].within for v in made if loops[v].within is not None}
        expr = op.accumulate.strip()
        acc = None
        if expr == "true":
            return (op_place, "accumulate 'true' adds every tile to a partial result that no op made; a compute "
                    "accumulates over a loop ('<loop> > 0')")
        if expr != "false":
            var, _, bound = expr.partition(">")
            acc, loop = var.strip(), loops[var.strip()]
            if d.name not in ACCUMULATES:
                return (op_place, f"accumulates over loop '{acc}', but {d.name} cannot add to a partial result "
                        f"(only {', '.join(sorted(ACCUMULATES))} can)")
            if loop.parallel:
                return (op_place, f"accumulates over loop '{acc}', which is parallel: each compute tile would add up "
                        f"only its share of the tiles")
            if loop.within is not None and op.op_id not in _fills(k, loops, computes):
                return (op_place, f"accumulates over loop '{acc}', which runs within blocks, and no move reloads "
                        f"its accumulators from the partial sums on chip when loop '{loop.within}' advances "
                        f"('when': '{loop.within} > {loops[loop.within].start}'): they would be lost between blocks")
            if int(bound) != loop.start:
                return (op_place, f"accumulate '{expr}' must start afresh on the loop's first step only "
                        f"('{acc} > {loop.start}'), or it drops the tiles before")
            if acc in made:
                return op_place, f"accumulates over loop '{acc}', which indexes its result tile"
            if not any(acc in r.tile_indices for r in op.inputs):
                return op_place, f"accumulates over loop '{acc}', which indexes none of its operand tiles"
        # a K split's loop over K blocks: the compute adds each block to the partial sums reloaded
        blocks = loops[acc].within if acc is not None else None
        for v in live:
            if v not in made and v != acc and v != blocks:
                return (op_place, f"sits in loop '{v}', which neither indexes its result tile nor is accumulated "
                        f"over: each step would overwrite the last")
        if acc is not None and live[-1] != acc:
            return (op_place, f"accumulates over loop '{acc}' inside loop '{live[-1]}', which changes its result "
                    f"tile between the steps it adds up")
    return None


def _fills(k: Kernel, loops: dict[str, TileLoop], computes: list[Compute]) -> dict[int, DataMove]:
    """Each compute that accumulates over a loop within blocks (K in blocks, a K split) -> the move
    that reloads its accumulators with the partial sums on chip: a move into its result there,
    run `when` its condition holds."""
    out = {}
    for op in computes:
        if op.accumulate.strip() in ("true", "false") or loops[condition(op.accumulate)[0]].within is None:
            continue
        fill = next((m for m in k.body if isinstance(m, DataMove) and m.when is not None
                     and (m.destination.tensor, m.destination.level) == (op.output.tensor, op.output.level)), None)
        if fill is not None:
            out[op.op_id] = fill
    return out


def _split_problem(k: Kernel, order: list[str], loops: dict[str, TileLoop], computes: list[Compute],
                   carried: dict[int, int]) -> tuple[str, str] | None:
    """Why a K split would lose or leak partial sums (None if it would not): a compute that adds
    up its result over K blocks gets its accumulators reloaded before every block but the first,
    by a move of its result tile at the loop outside its K tiles that it depends on; a move runs
    `when` only as such a reload (into the chip's inner levels) or as a store after the last
    block alone; a reload of what a later op wrote reads it from a step before, inside that loop;
    and no store to external memory inside the loop runs before the last block."""
    place = f"kernel '{k.name}'"
    splits: dict[str, Compute] = {}  # loop over K blocks -> the compute adding up its result across them
    for op_id, fill in _fills(k, loops, computes).items():
        op = next(c for c in computes if c.op_id == op_id)
        acc = condition(op.accumulate)[0]
        blocks = loops[acc].within
        splits[blocks] = op
        at = order[order.index(acc) - 1]
        if condition(fill.when) != (blocks, loops[blocks].start) or _position(fill, order) != (order.index(acc), 0) \
                or _geometry(fill.destination) != _geometry(op.output) or fill.op_id not in op.depends_on:
            return (f"{place} op {fill.op_id}", f"reloads the accumulators of op {op.op_id} otherwise than with its "
                    f"result tile at '{at}', when '{blocks} > {loops[blocks].start}', before op {op.op_id} (which "
                    f"depends on it)")
    for m in k.body:
        if not isinstance(m, DataMove) or m.when is None:
            continue
        op_place = f"{place} op {m.op_id}"
        var, bound = condition(m.when)
        if var not in order[:_position(m, order)[0]]:
            return op_place, f"runs when '{m.when}', but loop '{var}' does not run where it is placed ({_shown(m)})"
        compute = splits.get(var)
        if compute is None:
            return (op_place, f"runs when '{m.when}', but no compute adds up partial sums over the K blocks of loop "
                    f"'{var}' (reloading its accumulators): only a K split's moves run on some steps of a loop")
        loop, levels = loops[var], ("EXTERNAL", *ON_CHIP)
        inward = m.source.level != "EXTERNAL" and m.destination.tensor == compute.output.tensor \
            and levels.index(m.destination.level) > levels.index(m.source.level)
        reload, last = bound == loop.start and inward, bound == loop.end - 2 and m.move_type == "STORE"
        if not (reload or last):
            return (op_place, f"runs when '{m.when}', neither as a reload of the partial sums of "
                    f"'{compute.output.tensor}' into the chip's inner levels before every K block but the first "
                    f"('{var} > {loop.start}') nor as a store after the last alone ('{var} > {loop.end - 2}')")
        writer = k.body_op(carried[m.op_id]) if m.op_id in carried else None
        if writer is not None and (not reload or var not in order[:_position(writer, order)[0]]):
            return (op_place, f"reads what op {writer.op_id}, later in the body, writes; only a reload reads so, "
                    f"what that op wrote a step of loop '{var}' before")
    for blocks, compute in splits.items():
        last = (blocks, loops[blocks].end - 2)
        for m in k.body:
            if isinstance(m, DataMove) and m.destination.level == "EXTERNAL" \
                    and blocks in order[:_position(m, order)[0]] and (m.when is None or condition(m.when) != last):
                return (f"{place} op {m.op_id}", f"stores '{m.destination.tensor}' to external memory before the "
                        f"last K block adds to the partial sums of '{compute.output.tensor}': inside loop "
                        f"'{blocks}' a store runs after its last block alone (when '{blocks} > {last[1]}')")
    return None


def _operand_problem(op: Compute, d: OpDef, attrs: dict, g: Graph) -> str | None:
    """Why a COMPUTE's operand tiles are not the ones its result tile needs (None if they are):
    along each operand dim that runs along a result dim, the same loop as the result's (a map
    operand aligned right, numpy broadcasting; a reduction's first operand through its result
    dims; MATMUL's A rows and B columns, batch dims aligned right), A's and B's K by one loop, and
    a reduction's operand holding its reduced axes whole but along the loop it accumulates over."""
    out = g.tensors[op.output.tensor].shape
    shapes = [g.tensors[r.tensor].shape for r in op.inputs]
    acc = op.accumulate.partition(">")[0].strip() if op.accumulate not in ("true", "false") else None

    def aligned(shape: tuple[int, ...], within: int = len(out)) -> list[int | None]:
        """Result dims the dims of `shape` run along, aligned right on the first `within`."""
        lead = within - len(shape)
        return [j + lead if j + lead >= 0 and (dim != 1 or out[j + lead] == 1) else None
                for j, dim in enumerate(shape)]

    runs: list[list[int | None]] = [aligned(s) for s in shapes]
    for i, ref in enumerate(op.inputs):
        for axis in range(len(ref.tile_indices)):
            if _dim_windowed(ref, axis) and not (d.windows is not None and i == 0 and axis in (1, 2)):
                return (f"reads '{ref.tensor}' through a window along dim {axis}; only a sliding-window op's "
                        f"input is read so, along H and W")
    if d.windows is not None:
        problem = _band_problem(op, d.windows(attrs, shapes))
        if problem:
            return problem
    if d.operand_dims is not None:
        runs = d.operand_dims(shapes, attrs)
        if d.tile_mnk is not None:  # the contracted channels: last in both tiles as the compute takes them
            held = d.operand_order(shapes, attrs)[1] if d.operand_order is not None else None
            channels = op.inputs[1].tile_indices[held[-1] if held is not None else -1]
            if op.inputs[0].tile_indices[-1] != channels:
                return (f"steps the contracted channels of '{op.inputs[0].tensor}' and '{op.inputs[1].tensor}' by "
                        f"different loops ('{op.inputs[0].tile_indices[-1]}', '{channels}')")
    elif d.tile_mnk is not None:  # MATMUL: C[..., m, n] += A[..., m, k] B[..., k, n]
        a, b = shapes[0], shapes[1]
        n_axis, k_axis = (len(b) - 2, len(b) - 1) if attrs.get("transpose_b") else (len(b) - 1, len(b) - 2)
        runs[0] = aligned(a[:-2], len(out) - 2) + [len(out) - 2, None]
        runs[1] = aligned(b[:-2], len(out) - 2) + [None, None]
        runs[1][n_axis] = len(out) - 1
        if op.inputs[0].tile_indices[-1] != op.inputs[1].tile_indices[k_axis]:
            return (f"steps the K dims of '{op.inputs[0].tensor}' and '{op.inputs[1].tensor}' by different loops "
                    f"('{op.inputs[0].tile_indices[-1]}', '{op.inputs[1].tile_indices[k_axis]}')")
    elif d.family == "reduction":
        dims = d.result_dims(shapes[0], attrs)
        runs[0] = [dims.index(i) if i in dims else None for i in range(len(shapes[0]))]
        ref = op.inputs[0]
        for axis in d.whole_axes(shapes[0], attrs):
            if ref.tile_shape[axis] < max(shapes[0][axis], 1) and ref.tile_indices[axis] != acc:
                return (f"cuts the reduced axis {axis} of '{ref.tensor}' into tiles of {ref.tile_shape[axis]}, "
                        f"and {d.name} needs it whole in a tile")
    for ref, dims in zip(op.inputs, runs):
        for index, j in zip(ref.tile_indices, dims):
            if j is not None and index != op.output.tile_indices[j]:
                return (f"steps '{ref.tensor}' by loop '{index}' along the dim that runs along dim {j} of its result "
                        f"'{op.output.tensor}', which loop '{op.output.tile_indices[j]}' steps")
    return None


def _band_problem(op: Compute, hw) -> str | None:
    """Why the first operand's tiles are not, along H and W, the bands of input with their halo
    and padding that the result's tiles need (None if they are)."""
    band, result = op.inputs[0], op.output
    for axis, window in zip((1, 2), hw):
        extent, step, offset = window.band(result.tile_shape[axis])
        want = (result.tile_indices[axis], extent, offset, step, (window.before, window.after))
        if _dim_geometry(band, axis) != want:
            _, got_extent, got_offset, got_step, got_padding = _dim_geometry(band, axis)
            return (f"reads '{band.tensor}' along dim {axis} in tiles of {got_extent} by {got_step} from "
                    f"{got_offset} padded {list(got_padding)}; result tiles of {result.tile_shape[axis]} need "
                    f"{extent} by {step} from {offset} padded {[window.before, window.after]}")
    return None


def _dim_problem(ref: TileRef, axis: int, trips: int, dim: int, entries: int) -> tuple[str | None, bool]:
    """Why the tiles of `ref` along `axis` do not fit dimension `dim` of their tensor (None if
    they do), and whether that bounds the trips of the loop indexing them (`entries`: of its
    index table)."""
    index, extent = ref.tile_indices[axis], ref.tile_shape[axis]
    start = ref.offset[axis] if ref.offset is not None else 0
    if ref.table is not None and ref.table.dim == axis:
        # one element per tile, an entry of the table: the loop steps through the table
        if extent == 1 and start == 0 and trips == entries:
            return None, True
        return (f"tiles of {extent} at offset {start} along '{index}' ({trips} trips) do not step one by one "
                f"through the {entries} entries of {_table_shown(ref.table)}"), False
    step = ref.step[axis] if ref.step is not None else extent
    before, after = ref.padding[axis] if ref.padding is not None else (0, 0)
    if step != extent or before or after:
        # a sliding window's bands: each starts inside the tensor as padded
        if trips >= 1 and -before <= start and start + (trips - 1) * step < dim + after:
            return None, True
        return (f"bands of {extent} by {step} from offset {start} along '{index}' ({trips} trips) do not all start "
                f"inside dimension {dim} of '{ref.tensor}' padded by [{before}, {after}]"), False
    if ref.offset is None:
        # the tiles must cover the dimension exactly: trips = ceil(dim / extent), no tile wholly
        # outside it and none larger than the dimension
        if trips >= 1 and (trips - 1) * extent < max(dim, 1) <= trips * extent and extent <= max(dim, 1):
            return None, True
        return (f"tiles of {extent} along '{index}' ({trips} trips) do not cover dimension {dim} of "
                f"'{ref.tensor}' exactly"), False
    # a window: every tile starts inside the tensor (a part of it, as SLICE's operand), or the
    # tensor lies inside the window (as CONCAT's and PAD's operands: other moves or a fill make
    # the rest); only the first bounds the loop
    inside = trips >= 1 and 0 <= start and start + (trips - 1) * extent < max(dim, 1)
    around = trips >= 1 and start <= 0 and dim <= start + trips * extent
    if inside or around:
        return None, inside
    return (f"tiles of {extent} from offset {start} along '{index}' ({trips} trips) neither stay inside "
            f"dimension {dim} of '{ref.tensor}' nor hold it whole"), False


def _table_shown(table: IndexTable | IndexTensor) -> str:
    return f"index tensor '{table.tensor}'" if isinstance(table, IndexTensor) else f"table '{table.attr}'"


def _table(ref: TileRef, shape: tuple[int, ...], group: list[Op], g: Graph) -> int | str:
    """How many entries a tile's index table has, or why it has none: it must be the index table
    of the kernel's own graph op (its registry entry's `index_table`), along that op's axis, or
    that op's index operand (its second) when it takes its indices so."""
    if isinstance(ref.table, IndexTensor):
        return _index_tensor(ref, shape, group, g)
    table = ref.table
    op = next((o for o in group if o.name == table.op), None)
    if op is None:
        return f"table '{table.attr}' of graph op '{table.op}' is not of the kernel's own graph op"
    index_table = lookup(op.op_type).index_table
    if index_table is None or index_table[0] != table.attr:
        has = f"'{index_table[0]}'" if index_table is not None else "none"
        return (f"table '{table.attr}' of graph op '{op.name}' is not the index table of {op.op_type} "
                f"(which has {has})")
    attr, axis_attr = index_table
    axis = lookup(op.op_type).normalize_attrs(op.attrs)[axis_attr]
    if table.dim < len(shape) and table.dim != axis % len(shape):
        return (f"table '{attr}' of graph op '{op.name}' indexes dim {table.dim} of '{ref.tensor}'; "
                f"{op.op_type} takes its entries along dim {axis % len(shape)}")
    values = op.attrs.get(attr)
    dim = shape[table.dim] if table.dim < len(shape) else 0
    if table.dim >= len(shape) or not isinstance(values, list) \
            or not all(type(v) is int and -dim <= v < dim for v in values):
        return (f"table '{table.attr}' of graph op '{table.op}' is not a list of indices into dimension "
                f"{table.dim} of '{ref.tensor}'")
    return len(values)


def _index_tensor(ref: TileRef, shape: tuple[int, ...], group: list[Op], g: Graph) -> int | str:
    """The entries of the index tensor a tile is read through, or why it may not be: it is the
    index operand of a graph op of the kernel that gathers from the tile's tensor, along that
    op's axis. Its values are read at run time, where an entry outside the axis is an error."""
    table = ref.table
    op = next((o for o in group if len(o.inputs) > 1 and o.inputs[1] == table.tensor and o.inputs[0] == ref.tensor
               and lookup(o.op_type).index_table is not None), None)
    if op is None:
        return (f"index tensor '{table.tensor}' is not the index operand of a graph op of the kernel that gathers "
                f"from '{ref.tensor}'")
    axis_attr = lookup(op.op_type).index_table[1]
    axis = lookup(op.op_type).normalize_attrs(op.attrs)[axis_attr] % max(len(shape), 1)
    if table.dim != axis:
        return (f"index tensor '{table.tensor}' indexes dim {table.dim} of '{ref.tensor}'; {op.op_type} "
                f"'{op.name}' takes its entries along dim {axis}")
    return g.tensors[table.tensor].size


def _fill_problem(op: DataMove, g: Graph, op_of: dict[str, Op], bands: dict[str, Op]) -> str | None:
    """Why a move's fill is not the value the kernel's graph op gives the padding it writes (None
    if it is): an on-chip band of a sliding-window op's input is padded with the op's padding
    value, the tile of a PAD's result made from its operand's window with its pad value, and no
    other move fills (whatever it wrote would reach no result but by mistake)."""
    src, dst = op.source, op.destination
    if dst.level == "EXTERNAL":
        return None  # a fill there is refused as a move that cannot run
    maker = op_of.get(dst.tensor)
    if any(b or a for b, a in dst.padding or []):
        window_op = bands.get(dst.tensor)
        if window_op is None:
            return f"pads its tile of '{dst.tensor}', which no sliding-window op of the kernel reads"
        window_def = lookup(window_op.op_type)
        want = window_def.padding_value(window_def.normalize_attrs(window_op.attrs), g.tensors[dst.tensor].dtype)
        who = window_op.op_type
    elif maker is not None and lookup(maker.op_type).fill_attr is not None and src.tensor in maker.inputs:
        maker_def = lookup(maker.op_type)
        want = maker_def.normalize_attrs(maker.attrs)[maker_def.fill_attr]
        who = f"{maker.op_type} '{maker.name}'"
    elif op.fill is not None:
        return f"fills its tile of '{dst.tensor}' with {op.fill}, but no graph op of the kernel pads it"
    else:
        return None
    if op.fill is None:
        return f"leaves the padding of '{dst.tensor}' unfilled; {who} pads with {want}"
    if op.fill != want:
        return f"fills the padding of '{dst.tensor}' with {op.fill}; {who} pads with {want}"
    return None


def _move_problem(op: DataMove, g: Graph) -> str | None:
    """Why a data move cannot run as written, or None."""
    src, dst = op.source, op.destination
    ts, td = g.tensors[src.tensor], g.tensors[dst.tensor]
    if ts.dtype != td.dtype and src.tensor != dst.tensor:
        return f"moves '{src.tensor}' ({ts.dtype}) into '{dst.tensor}' ({td.dtype}); a move does not convert"
    if dst.table is not None or (src.table is not None and src.level != "EXTERNAL"):
        return "indexes a tile through a table; only a source in external memory may be"
    # a home in L3 is not external memory: no view names its bytes, no table reads through it
    index = src.table.tensor if isinstance(src.table, IndexTensor) else None
    kept = [t for t in (src.tensor, dst.tensor, index) if t is not None and g.tensors[t].home is not None]
    if kept and (op.move_type == "VIEW" or src.table is not None):
        return (f"{'views' if op.move_type == 'VIEW' else 'reads through a table'} '{kept[0]}', whose home is in "
                f"{g.tensors[kept[0]].home}; only a tensor in external memory may be")
    # a tensor kept in L2 is read and written there, and in L3, in place: as regions of its home
    padded = [r for r in (src, dst) if r.level in ("L3", "L2") and g.tensors[r.tensor].home == "L2"
              and r.padding is not None]
    if padded:
        return (f"moves a padded tile of '{padded[0].tensor}' at {padded[0].level}, whose home is in L2; its "
                f"tiles in L3 and L2 are regions of that home, without padding")
    if op.move_type == "VIEW":
        whole = all(r.tile_shape == [max(d, 1) for d in t.shape] and r.offset is None and r.table is None
                    for r, t in ((src, ts), (dst, td)))
        # or the box at the source's offset, one run of its bytes (a SLICE's, a GATHER's)
        run = (src.offset is not None and src.table is None and src.step is None and src.padding is None
               and len(src.tile_shape) == len(ts.shape) == len(src.offset)
               and one_run(ts.shape, src.offset, src.tile_shape) and math.prod(src.tile_shape) == td.size
               and dst.tile_shape == [max(d, 1) for d in td.shape] and dst.offset is None and dst.table is None)
        if (src.level, dst.level) != ("EXTERNAL", "EXTERNAL") or not (whole and ts.size == td.size or run) \
                or op.transpose or op.permutation is not None or op.fill is not None:
            return (f"a VIEW names all of '{src.tensor}' in external memory, or one run of its bytes, as "
                    f"'{dst.tensor}', which must hold as many elements, with no table, permutation or fill")
        return None
    perm = op.permutation
    if perm is not None:
        if sorted(perm) != list(range(len(ts.shape))) or len(td.shape) != len(perm):
            return f"permutation {perm} does not permute the {len(ts.shape)} dims of '{src.tensor}' into '{dst.tensor}'"
        if (src.level, dst.level) != ("L3", "L2") or op.transpose:
            return "permutes a tile, which only the BlockMover does, L3 -> L2, and not beside 'transpose'"
    # within one tensor a permutation reorders the held tile, not the region it holds
    extents = [src.tile_shape[p] for p in perm] if perm is not None and src.tensor != dst.tensor else src.tile_shape
    if extents != dst.tile_shape:
        under = f" under permutation {perm}" if perm is not None else ""
        return f"moves tiles of {src.tile_shape} into tiles of {dst.tile_shape}{under}"
    if op.fill is not None and dst.level == "EXTERNAL":
        return "fills a tile in external memory; a fill writes only on-chip tiles"
    return None


_BOUND = re.compile(r"[0-9]{1,18}")  # ASCII digits that int() reads into a 64-bit value


def _accumulate_ok(expr: str, loop_vars: list[str]) -> bool:
    if expr in ("true", "false"):
        return True
    var, sep, bound = expr.partition(">")
    return bool(sep) and var.strip() in loop_vars and _BOUND.fullmatch(bound.strip()) is not None
