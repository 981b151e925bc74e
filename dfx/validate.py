"""Semantic checks of a program that a JSON Schema cannot express: names resolve, ids are
unique, roles agree with the ops, loop variables exist, tile index lists match tensor ranks,
and every loop's trip count is the one its tile indices need, so no edited number can make the
loader run longer than the tensors' shapes say."""

from __future__ import annotations

import re

from .dtypes import DTYPES, itemsize
from .errors import ObjectFileError
from .graph import Graph, shape_problem
from .kernel import Barrier, Compute, DataMove, TileRef
from .ops import ShapeError, lookup
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
    # with no graph op there is no kernel either (each op must have one, checked last)
    if not g.ops:
        fail("graph", "has no ops: the program computes nothing")
    producer: dict[str, str] = {}
    for op in g.ops:
        for name in op.inputs + op.outputs:
            if name not in g.tensors:
                fail(f"graph op '{op.name}'", f"unknown tensor '{name}'")
        opdef = lookup(op.op_type)
        if opdef is not None:
            try:
                opdef.normalize_attrs(op.attrs)
            except ShapeError as e:
                fail(f"graph op '{op.name}'", str(e))
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
    graph_ops = {op.name: op for op in g.ops}
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
        for t in made - set(k.outputs):
            # a fused intermediate never leaves the compute tile: nothing else may want it
            if g.tensors[t].role != "intermediate" or any(t in op.inputs for op in g.ops if op not in group):
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
        for l in k.tile_loops:
            if l.end < l.start:
                fail(f"{place} loop '{l.induction_var}'", f"end {l.end} < start {l.start}")
        ids: set[int] = set()
        indexing: set[str] = set()  # loop variables some tile index uses, bounded by its tensor
        stored: set[str] = set()  # tensors the kernel's moves write to external memory
        barriers: dict[int, Barrier] = {}
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
            # a read of what an earlier kernel wrote must be ordered after it by a barrier
            if isinstance(op, DataMove) and op.source.level == "EXTERNAL" and op.source.tensor in written:
                producer, stores = written[op.source.tensor]
                if not any(d in barriers and barriers[d].kernel == producer and stores <= set(barriers[d].wait_for)
                           for d in op.depends_on):
                    fail(op_place, f"reads intermediate '{op.source.tensor}' with no BARRIER ordering it after "
                         f"kernel '{producer}' wrote it")
            for dep in op.depends_on:
                if dep not in ids:
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
                computed.add(source.name)
            if isinstance(op, Compute) and not _accumulate_ok(op.accumulate, loop_vars):
                fail(op_place, f"accumulate '{op.accumulate}' is not 'true', 'false' or '<loop> > <int>'")
            refs: list[TileRef] = []
            if isinstance(op, DataMove):
                refs = [op.source, op.destination]
            elif isinstance(op, Compute):
                refs = [*op.inputs, op.output]
            for ref in refs:
                t = g.tensors.get(ref.tensor)
                if t is None:
                    fail(op_place, f"unknown tensor '{ref.tensor}'")
                if len(ref.tile_indices) != len(t.shape) or len(ref.tile_shape) != len(t.shape) \
                        or len(ref.offset or t.shape) != len(t.shape):
                    fail(op_place, f"tile of '{ref.tensor}' has {len(ref.tile_indices)} indices, "
                         f"{len(ref.tile_shape)} extents and {len(ref.offset or t.shape)} offsets for a "
                         f"rank-{len(t.shape)} tensor")
                if (ref.offset is not None or ref.table is not None) and not isinstance(op, DataMove):
                    fail(op_place, f"tile of '{ref.tensor}' has an offset or a table, which only a data move's may")
                table = _table(ref, t.shape, g) if ref.table is not None else []
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
        body_ids[k.name] = ids
        for op in k.body:
            if isinstance(op, DataMove) and op.destination.level == "EXTERNAL":
                writer = written.setdefault(op.destination.tensor, (k.name, set()))
                writer[1].add(op.op_id)

    for name in graph_ops:
        fail(f"graph op '{name}'", "has no kernel")


def _dim_problem(ref: TileRef, axis: int, trips: int, dim: int, table: list[int]) -> tuple[str | None, bool]:
    """Why the tiles of `ref` along `axis` do not fit dimension `dim` of their tensor (None if
    they do), and whether that bounds the trips of the loop indexing them."""
    index, extent = ref.tile_indices[axis], ref.tile_shape[axis]
    start = ref.offset[axis] if ref.offset is not None else 0
    if ref.table is not None and ref.table.dim == axis:
        # one element per tile, an entry of the table: the loop steps through the table
        if extent == 1 and start == 0 and trips == len(table):
            return None, True
        return (f"tiles of {extent} at offset {start} along '{index}' ({trips} trips) do not step one by one "
                f"through the {len(table)} entries of table '{ref.table.attr}'"), False
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


def _table(ref: TileRef, shape: tuple[int, ...], g: Graph) -> list[int] | str:
    """The entries of a tile's index table, or why it has none."""
    table = ref.table
    op = next((o for o in g.ops if o.name == table.op), None)
    values = op.attrs.get(table.attr) if op is not None else None
    dim = shape[table.dim] if table.dim < len(shape) else 0
    if table.dim >= len(shape) or not isinstance(values, list) \
            or not all(type(v) is int and -dim <= v < dim for v in values):
        return (f"table '{table.attr}' of graph op '{table.op}' is not a list of indices into dimension "
                f"{table.dim} of '{ref.tensor}'")
    return values


def _move_problem(op: DataMove, g: Graph) -> str | None:
    """Why a data move cannot run as written, or None."""
    src, dst = op.source, op.destination
    ts, td = g.tensors[src.tensor], g.tensors[dst.tensor]
    if ts.dtype != td.dtype and src.tensor != dst.tensor:
        return f"moves '{src.tensor}' ({ts.dtype}) into '{dst.tensor}' ({td.dtype}); a move does not convert"
    if dst.table is not None or (src.table is not None and src.level != "EXTERNAL"):
        return "indexes a tile through a table; only a source in external memory may be"
    if op.move_type == "VIEW":
        whole = all(r.tile_shape == [max(d, 1) for d in t.shape] and r.offset is None and r.table is None
                    for r, t in ((src, ts), (dst, td)))
        if (src.level, dst.level) != ("EXTERNAL", "EXTERNAL") or ts.size != td.size or not whole \
                or op.transpose or op.permutation is not None or op.fill is not None:
            return (f"a VIEW names all of '{src.tensor}' in external memory as '{dst.tensor}', which must hold "
                    f"as many elements, with no window, table, permutation or fill")
        return None
    perm = op.permutation
    if perm is not None:
        if sorted(perm) != list(range(len(ts.shape))) or len(td.shape) != len(perm):
            return f"permutation {perm} does not permute the {len(ts.shape)} dims of '{src.tensor}' into '{dst.tensor}'"
        if (src.level, dst.level) != ("L3", "L2") or op.transpose:
            return "permutes a tile, which only the BlockMover does, L3 -> L2, and not beside 'transpose'"
    extents = [src.tile_shape[p] for p in perm] if perm is not None else src.tile_shape
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
