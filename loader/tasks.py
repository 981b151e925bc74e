"""Turn the expanded schedule of bound kernels into the simulator's task stream, lazily.

Dependencies of a task:
- the body's `depends_on`: the latest instance of that op on the same worker;
- buffer reuse: instance n of a move into a buffer of depth d waits until the readers of
  instance n - d are done (depth 2 lets the next tile load while this one computes); a
  compute's result likewise, by its depth (the array's accumulators, drained by the REGISTER ->
  L2 store: where they are two deep, the array starts the next output tile while that store runs);
- barriers, the only order between kernels: a BARRIER becomes a task (no cycles) on each
  compute tile that waits for the last instance of each op it lists, on every compute tile of
  the kernel it names; the moves that depend on it start after it, but a load from external
  memory of bytes that earlier kernels' moves wrote there, which waits for those writes alone
  (`TaskStream._written`): a kernel starts on what the one before has stored before that ends;
- memory reuse across kernels: each kernel is bound on its own, so its buffers may sit where an
  earlier kernel's still are. The first `depth` fills of a buffer wait for the last use of every
  earlier buffer they overlap (same level, bank and bytes). Kernels overlap only where their
  buffers do not.
A DMA engine moves data through the external memory channel it is wired to (engine i to
channel i mod channels, as the simulator does), so balancing DMA engines balances channels. A
move whose whole tile is at least SPLIT_BYTES between external memory and L3 (a whole image a
pointwise layer reads at its start, say) goes in parts, one per channel, each on the DMA engine
wired to it, as a driver parts a large transfer; a task on the sync unit, taking no cycles,
ends when all parts have, and is what comes after the move waits for. The binders still count
such a move on the one engine they gave it.

A kernel runs each body op many times over, so what does not depend on the loop values (keys,
engines, labels, the bytes of a whole tile, the shape of a compute's tiles) is worked out once
per op and worker (`_Plan`); an instance only checks whether its tile is whole, and measures
the tile only where it is not (an edge tile, a window, a table, a permutation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

import numpy as np

from dfx import Barrier, BodyOp, Compute, DataMove, Graph, Home, Kernel, Program, TileRef, itemsize, tile_refs, widest
from hardware import Machine, Task

from .binding import Binding, BoundBuffer
from .execution import compute_ops
from .buffers import IN_PLACE, Buffer, engine_kind, home_move, move_levels
from .relocate import Occupancy, place_of
from .schedule import (accumulate_rule, expand, first_of_block, last_of_block, loop_ranges, move_slices, readers,
                       region_elements, table_values, tile_slices, unchecked_bounds, whole_move_bounds,
                       whole_tile_bounds, within_bounds)

DEP_WINDOW = 1 << 16  # the simulator's read-ahead: deps further back have surely finished
# a move to or from external memory of tiles this large goes in parts, one per channel: one
# engine and its channel would take it at 50 bytes a cycle while the other channel idles
# (MobileNet v1's 14 x 14 pointwise layers each waited 8,129 cycles for their 401,408-byte
# input); below it, a part's latency on every engine costs more than the channels gain (on two
# channels: 128 KiB took MobileNet v1 1,900 cycles longer, v2 3,600)
SPLIT_BYTES = 1 << 16
# a load of what earlier kernels wrote goes in pieces of at least this many bytes, each as soon
# as its writes have ended (`TaskStream._written`): smaller, what the last write holds back comes
# sooner, but each piece holds a DMA engine for the latency (MobileNet v1 / v2 in pieces of
# 64 KB: 1,716,766 / 1,513,332 cycles; 32 KB: 1,713,163 / 1,508,976; 16 KB: 1,712,515 /
# 1,508,095; 8 KB: 1,715,678 / 1,508,209; 4 KB: 1,731,444 / 1,532,063)
PIECE_BYTES = 1 << 14
# the writes of a tensor a load searches for those of what it reads: beyond them, its loads wait
# for the barrier (each write and each load instance tests its region against them: the onnx
# package's light VGG-19, its layers' stores by the thousand, unbounded, kept the loader busy
# for more than 10 minutes; with 128, 14.3 s against 10.8 s before loads waited for writes.
# MobileNet v1 / v2: 1,698,194 / 1,507,695 cycles, with 256 1,696,752 / 1,508,101, with 64
# 1,730,178 / 1,509,096)
MOST_STORES = 128
# a piece of a load (`TaskStream._written`): its elements, the ids of the writes it waits for,
# the regions of the tensor in external memory it holds
Piece = tuple[int, frozenset[int], tuple[tuple[slice, ...], ...]]
# the sync unit's queue of a parted move's end: apart from the BARRIERs' (an op id, the same
# for every kernel), so none waits behind another kernel's BARRIER
PARTED_STREAMS = 1 << 40
# the sync unit's queue of the task that ends with a kernel's every task, where homes are live
# (`TaskStream.finish`): one per kernel, apart from the others
HOMES_STREAMS = 1 << 41


class TaskStream:
    """Task ids and the kernel-to-kernel dependencies across one program."""

    def __init__(self, program: Program, machine: Machine):
        self.program = program
        # of a move of SPLIT_BYTES or more: the DMA engines on channels of their own (engine i on
        # channel i); 0 where there is one
        parts = min(machine.engines.dma, machine.external.channels)
        self.parts = parts if parts > 1 else 0
        self.next_id = 0
        # kernel -> (worker, op_id) -> the tasks whose end is that op's last instance ending: its
        # own task, or for an op that ran none (a view, a move of an empty window) what it waited on
        self.finished: dict[str, dict[tuple[int, int], frozenset[int]]] = {}
        self.occupied = Occupancy()  # tagged with the id of each buffer's last use
        self.l2_count = machine.l2.count  # the banks a home in L2 has a piece in
        self.writes: dict[str, _Writes] = {}  # tensor -> the moves that wrote it to external memory

    def kernel_tasks(self, kernel: Kernel, binding: Binding, phase: int = 0) -> Iterator[Task]:
        """The kernel's tasks, tagged with `phase` (its number in the program)."""
        running = self.start(kernel, binding, phase)
        for worker, op, env in expand(kernel, binding.workers):
            yield from self.instance(running, worker, op, env)[1]
        yield from self.finish(running)

    def start(self, kernel: Kernel, binding: Binding, phase: int, streams: int = 0) -> Running:
        """Set up the plans of a kernel about to run (several at once, for a chain, each with
        `streams` of its own: `_KernelFacts`)."""
        shared = kernel.shared_moves()  # worker 0's, read by every worker
        plans = _plans(_KernelFacts(kernel, self.program.graph, binding, shared, phase,
                                    self._previous_users(kernel, binding), streams, self.l2_count))
        return Running(kernel, binding, shared, plans, phase)

    def instance(self, running: Running, worker: int, op: BodyOp, env: dict[str, int],
                 waits: Iterable[int] = ()) -> tuple[int, tuple[Task, ...]]:
        """The id of one instance of a body op, and its tasks (none where it runs none; a large
        move's parts, then what ends with them, of that id); `waits`: ids it waits for beyond what
        its kernel says (a chain's rows)."""
        plan = running.plans[worker][op.op_id]
        pieces, in_place = self._written(plan, env)
        # ids before the instance's own: its pieces, or its parts
        parts = len(pieces) if pieces is not None and len(pieces) > 1 else self.parts if plan.may_split else 0
        first = self.next_id
        tid = first + parts
        self.next_id = tid + 1
        deps = set(waits)
        for dep in plan.deps:
            if pieces is not None and isinstance(dep, _BarrierPlan) and dep.op.kernel is not None:
                continue  # it waits for the writes of what it reads, not for the whole kernel
            if dep is plan.carried:  # a reload: what that op wrote of this tile a step before, in its ring
                written = dep.by_tile.get(tuple(env.get(v, 0) for v in plan.tile))
                if written is not None:
                    deps.add(written[0])
                    dep.readers[worker][written[1]] = tid
            elif dep.last is not None:
                held = ()
                if dep.pieces is not None and isinstance(plan, _MovePlan) and op.source.tensor == dep.op.destination.tensor:
                    # a load that came in pieces: wait for those holding what this move reads
                    region = move_slices(op, plan.src_shape, plan.dst_shape, env, plan.table)[0]
                    held = [piece for bounds, piece in dep.pieces if _overlap(region, bounds)]
                deps.update(held or (dep.last,))
                # this op reads the buffer `dep` filled: remember it for that buffer's next overwrite
                dep.readers[worker][dep.instances] = tid
            elif dep.skipped is not None:  # an op that ran no task: what it waited on
                deps.update(dep.skipped[1])
        if plan.fresh_while is None:
            fresh = plan.fresh
        else:  # a compute that adds into its last instance's result once `var > n`
            var, n = plan.fresh_while
            # over K blocks, each block's first step takes a new tile into the accumulators
            # (reloaded beside the last one's drain): it waits for that drain as a new instance
            fresh = env.get(var, 0) <= n or (plan.blocks is not None and first_of_block(plan.blocks, env))
        # a new instance of a buffer waits for the readers of the one `depth` back
        if fresh:
            plan.instances += 1
            for by_instance in plan.readers.values():
                old = by_instance.pop(plan.instances - plan.depth, None)
                if old is not None:
                    deps.add(old)
            if plan.instances <= plan.depth:  # a first fill of each slot of the buffer
                deps.update(plan.first_fill_waits)
        if isinstance(op, Barrier):
            done = self.finished[op.kernel] if op.kernel is not None else _ends(running.plans)
            deps.update(_waited_for(op, done))
        window = sorted(deps)
        if window and tid - window[0] >= DEP_WINDOW:  # the oldest is beyond the simulator's read-ahead
            window = [d for d in window if tid - d < DEP_WINDOW]
        task = plan.task(tid, tuple(window), env)
        if task is None:  # the op ran no task: who waits on it waits on what it waited on
            plan.skipped = (tid, frozenset(deps))
            return tid, ()
        plan.last = tid
        plan.pieces = None if pieces is None or len(pieces) == 1 or not in_place else \
            tuple((_bounds(regions), first + i) for i, (_, _, regions) in enumerate(pieces))
        if plan.by_tile is not None:
            plan.by_tile[tuple(env.get(v, 0) for v in plan.tile)] = (tid, plan.instances)
        if isinstance(plan, _MovePlan) and plan.dst_level == "EXTERNAL":
            self._store(plan, env, tid)
        if pieces is not None:
            if len(pieces) > 1:
                return tid, _pieces(task, first, pieces, self.parts, worker)
            task = replace(task, deps=tuple(sorted({*task.deps, *_recent(pieces[0][1], tid)})))  # one piece
            if parts:
                return tid, _parted(task, first, parts, worker)
            return tid, (task,)
        if parts:  # an edge tile too, so no id set aside goes unused
            return tid, _parted(task, first, parts, worker)
        return tid, (task,)

    def _store(self, plan: _MovePlan, env: dict[str, int], tid: int) -> None:
        """Remember what a move to external memory writes, for the loads that read it."""
        region = move_slices(plan.op, plan.src_shape, plan.dst_shape, env, plan.table)[1]
        self.writes.setdefault(plan.op.destination.tensor, _Writes()).add(region, tid)

    def _written(self, plan: _Plan, env: dict[str, int]) -> tuple[list[Piece] | None, bool]:
        """For a load from external memory that its kernel's BARRIER holds back, of bytes that
        earlier kernels' moves wrote there once each: the writes it reads, in pieces of at
        least PIECE_BYTES in the order they were written; so it starts as soon as what it reads
        is there, not once those kernels have ended, and what reads it on chip as soon as its
        pieces of it are. None for any other move, or where some of its bytes were written
        otherwise (a view). And whether the load's tile lies at the same place in its
        destination as in its source (not a window cut out or padded): then its pieces' regions
        are those of the tile its readers name."""
        if not isinstance(plan, _MovePlan):
            return None, False
        if plan.held is None:  # once per plan, its deps linked
            plan.held = plan.src_level == "EXTERNAL" and plan.unit == "dma" and plan.table is None \
                and any(isinstance(d, _BarrierPlan) for d in plan.deps)
        if not plan.held:
            return None, False
        writes = self.writes.get(plan.op.source.tensor)
        if writes is None or writes.barred or writes.elements != math.prod(plan.src_shape):
            return None, False
        region, placed = move_slices(plan.op, plan.src_shape, plan.dst_shape, env)
        read = [(_overlap(region, writes.regions[i]), writes.ids[i]) for i in writes.overlapping(region)]
        if sum(region_elements(common) for common, _ in read) != region_elements(region):
            return None, False
        if any(self.next_id - tid >= DEP_WINDOW for _, tid in read):
            return None, False  # a write beyond the simulator's read-ahead: the barrier is the nearer wait
        pieces: list[Piece] = []
        size, ids, regions = 0, set(), []
        for common, tid in sorted(read, key=lambda r: r[1]):
            size, ids = size + region_elements(common), ids | {tid}
            regions.append(common)
            if size * plan.itemsize >= PIECE_BYTES:
                pieces.append((size, frozenset(ids), tuple(regions)))
                size, ids, regions = 0, set(), []
        if ids:
            pieces.append((size, frozenset(ids), tuple(regions)))
        return pieces, plan.op.source.tensor == plan.op.destination.tensor and region == placed

    def finish(self, running: Running) -> list[Task]:
        """What a kernel that has made its last task leaves for the kernels after it; for each
        home it reads or writes, a task that ends with the last of those tasks, which its region
        is in use up to (no one task of them need end last, and some run none: in place)."""
        kernel, binding, plans = running.kernel, running.binding, running.plans
        self.finished[kernel.name] = ends = _ends(plans)
        last = {p.key: p.last for by_op in plans for p in by_op.values() if p.last is not None}
        self._occupy(kernel, binding, last, running.shared)
        uses = []
        for level, home, regions in _home_regions(binding, self.l2_count):
            ops = {op.op_id for op in kernel.body
                   if any(r.level == level and r.tensor == home.tensor for r in tile_refs(op))}
            deps = {d for (_, op_id), ids in ends.items() if op_id in ops for d in ids if self.next_id - d < DEP_WINDOW}
            if deps:
                tid = self.next_id
                self.next_id += 1
                for region in regions:
                    self.occupied.claim(region, tid)
                uses.append(Task(tid, "barrier", 0, tuple(sorted(deps)), stream=HOMES_STREAMS + running.phase,
                                 phase=running.phase, label=f"{kernel.name}: last use of {home.tensor}'s home"))
        return uses

    def _previous_users(self, kernel: Kernel, binding: Binding) -> dict[tuple[int, int], set[int]]:
        """(worker, op_id) of each buffer -> the last uses of earlier buffers under its bytes; of
        each move that first writes a home in L3, those under the home's region."""
        users: dict[tuple[int, int], set[int]] = {}
        for bb in binding.buffers:  # a buffer's slots: the first fill of each waits for all their bytes
            users.setdefault((bb.buffer.worker, bb.buffer.op_id), set()).update(
                user for _, _, user in self.occupied.under(place_of(bb), bb.address, bb.end))
        for level, home, regions in _home_regions(binding, self.l2_count):
            if home.tensor not in kernel.outputs:  # only its writer (a home's span may start before, in its chain)
                continue
            under = {user for r in regions for _, _, user in self.occupied.under(place_of(r), r.address, r.end)}
            for op in kernel.body:
                made = tile_refs(op)[-1:]  # what it writes: a move's destination, a compute's output (an epilogue's)
                if made and made[0].level == level and made[0].tensor == home.tensor:
                    for w in range(binding.workers):
                        users.setdefault((w, op.op_id), set()).update(under)
        return users

    def _occupy(self, kernel: Kernel, binding: Binding, last: dict[tuple[int, int], int], shared: set[int]) -> None:
        """This kernel's buffers hide the earlier ones they overlap: their last use is later. A
        buffer's last use is the latest task of the move that fills it or of an op that reads it
        (a shared buffer's readers: on any worker)."""
        consumers = readers(kernel)
        for bb in binding.buffers:
            w, op_id = bb.buffer.worker, bb.buffer.op_id
            users = range(binding.workers) if op_id in shared else (w,)
            uses = [last[u, o] for u in users for o in (op_id, *consumers[op_id]) if (u, o) in last]
            if uses:
                self.occupied.claim(bb, max(uses))


@dataclass
class Running:
    """A kernel while its tasks are made: its plans (`_plans`) and what `finish` needs."""

    kernel: Kernel
    binding: Binding
    shared: set[int]  # its shared moves (`Kernel.shared_moves`)
    plans: list[dict[int, _Plan]]
    phase: int  # its number in the program


def _parted(task: Task, first: int, parts: int, worker: int) -> tuple[Task, ...]:
    """A DMA move as `parts` moves of ids from `first`, one on each of the first DMA engines (each
    through its own channel), then a task of the move's id that ends when they all have."""
    share, extra = divmod(task.bytes, parts)
    moves = tuple(replace(task, id=first + e, engine=e, bytes=share + (e < extra)) for e in range(parts))
    return (*moves, Task(task.id, "barrier", worker, tuple(m.id for m in moves), stream=PARTED_STREAMS + task.stream,
                         phase=task.phase, label=f"{task.label} ({parts} parts)"))


@dataclass
class _Writes:
    """The moves that wrote one tensor to external memory (`TaskStream._written`): their regions
    and task ids, the elements they hold; barred where it was written twice somewhere or more
    than MOST_STORES times (its loads then wait for the barrier)."""

    regions: list[tuple[slice, ...]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    elements: int = 0
    barred: bool = False
    bounds: tuple[np.ndarray, np.ndarray] | None = None  # the regions' starts and stops, made when asked

    def add(self, region: tuple[slice, ...], tid: int) -> None:
        if self.barred:
            return
        if len(self.regions) >= MOST_STORES or any(_overlap(region, where) for where in self.regions):
            self.regions, self.ids, self.barred = [], [], True
            return
        self.regions.append(region)
        self.ids.append(tid)
        self.elements += region_elements(region)
        self.bounds = None

    def overlapping(self, region: tuple[slice, ...]) -> np.ndarray:
        """The indices of the writes whose regions `region` overlaps."""
        if self.bounds is None:
            self.bounds = (np.array([[s.start for s in where] for where in self.regions]),
                           np.array([[s.stop for s in where] for where in self.regions]))
        starts, stops = self.bounds
        low, high = np.array([s.start for s in region]), np.array([s.stop for s in region])
        return np.flatnonzero(np.all((starts < high) & (stops > low), axis=1))


def _pieces(task: Task, first: int, pieces: list[Piece], engines: int, worker: int) -> tuple[Task, ...]:
    """A load as moves of ids from `first`, one per piece of what it reads (`_written`), each
    waiting for the writes of its piece, dealt round the DMA engines on channels of their own
    (`engines`; 0: the load's own), then a task of the load's id that ends when they all have."""
    total = sum(n for n, _, _ in pieces)
    moves, done = [], 0
    for i, (n, writes, _) in enumerate(pieces):
        share = task.bytes * (done + n) // total - task.bytes * done // total
        done += n
        moves.append(replace(task, id=first + i, engine=i % engines if engines else task.engine, bytes=share,
                             deps=tuple(sorted({*task.deps, *_recent(writes, task.id)}))))
    return (*moves, Task(task.id, "barrier", worker, tuple(m.id for m in moves), stream=PARTED_STREAMS + task.stream,
                         phase=task.phase, label=f"{task.label} ({len(moves)} pieces)"))


def _recent(ids: Iterable[int], tid: int) -> list[int]:
    """Those of `ids` within the simulator's read-ahead of task `tid` (older ones have finished)."""
    return [d for d in ids if tid - d < DEP_WINDOW]


def _overlap(a: tuple[slice, ...], b: tuple[slice, ...]) -> tuple[slice, ...] | None:
    """The region two regions of one tensor share (None: none)."""
    common = []
    for x, y in zip(a, b):
        start, stop = max(x.start, y.start), min(x.stop, y.stop)
        if stop <= start:
            return None
        common.append(slice(start, stop))
    return tuple(common)


def _bounds(regions: tuple[tuple[slice, ...], ...]) -> tuple[slice, ...]:
    """The least region holding all of `regions` (more than the piece holds where they do not
    lie next to each other: its readers may wait for it needlessly, never too little)."""
    return tuple(slice(min(r[d].start for r in regions), max(r[d].stop for r in regions))
                 for d in range(len(regions[0])))


def _home_regions(binding: Binding, l2_banks: int) -> list[tuple[str, Home, list[BoundBuffer]]]:
    """(level, home, its bytes as buffers there would hold them) of each home live while the
    kernel runs: its region of L3, or its piece in each of the `l2_banks`."""
    def region(level: str, home: Home, bank: int) -> BoundBuffer:
        return BoundBuffer(Buffer(-1, 0, home.tensor, level, home.bytes, 1), bank, home.address)

    return [*(("L3", h, [region("L3", h, 0)]) for h in binding.homes),
            *(("L2", h, [region("L2", h, bank) for bank in range(l2_banks)]) for h in binding.l2_homes)]


def _ends(plans: list[dict[int, _Plan]]) -> dict[tuple[int, int], frozenset[int]]:
    """(worker, op_id) -> the tasks whose end is its latest instance ending, so far: that
    instance's task, or what it waited on if it ran none."""
    ends = {}
    for by_op in plans:
        for p in by_op.values():
            if p.skipped is not None and (p.last is None or p.skipped[0] > p.last):
                ends[p.key] = p.skipped[1]
            elif p.last is not None:
                ends[p.key] = frozenset((p.last,))
    return ends


def _waited_for(barrier: Barrier, done: dict[tuple[int, int], frozenset[int]]) -> set[int]:
    """The last instance of each op the barrier waits for, on every compute tile of its kernel
    (`done`: that kernel's `_ends`, so far if it is this one)."""
    waited = set(barrier.wait_for)
    return {t for (_, op_id), tasks in done.items() if op_id in waited for t in tasks}


@dataclass
class _KernelFacts:
    """What the plans of one kernel's ops are made from."""

    kernel: Kernel
    g: Graph
    binding: Binding
    shared: set[int]
    phase: int
    previous_users: dict[tuple[int, int], set[int]]  # (worker, op_id) -> ids its first fills wait for
    # added to an op id to name its moves' queue on their engine (`Task.stream`), and its computes'
    # queue on their unit: 0 but for the kernels of a chain, which run at once, each with queues
    # of its own
    streams: int = 0
    l2_count: int = 1  # the machine's L2 banks
    homes: frozenset[str] = field(init=False)  # the tensors kept in L3 while it runs
    in_l2: frozenset[str] = field(init=False)  # and in L2
    ranges: dict[str, tuple[int, int]] = field(init=False)  # `loop_ranges`
    last_step: dict[str, int] = field(init=False)  # each loop's last step
    computes: dict = field(init=False)  # `compute_ops`
    l2_banks: dict[tuple[int, int], tuple[int, ...]] = field(init=False)  # `_l2_banks`

    def __post_init__(self):
        self.homes = frozenset(h.tensor for h in self.binding.homes)
        self.in_l2 = frozenset(h.tensor for h in self.binding.l2_homes)
        self.ranges = loop_ranges(self.kernel)
        self.last_step = {l.induction_var: l.end - 1 for l in self.kernel.tile_loops}
        self.computes = compute_ops(self.kernel, self.g)
        self.l2_banks = _l2_banks(self.kernel, self.binding)


def _plans(facts: _KernelFacts) -> list[dict[int, _Plan]]:
    """worker -> op_id -> its plan, for the ops that worker issues (a shared move: worker 0 only)."""
    out = []
    for worker in range(facts.binding.workers):
        plans = {}
        for op in facts.kernel.body:
            if worker and op.op_id in facts.shared:
                continue
            if isinstance(op, DataMove):
                cls = _ViewPlan if op.move_type == "VIEW" else _MovePlan
            elif isinstance(op, Compute):
                # the registry and the kernel's dataflow say whether the array runs it, else the vector unit
                cls = _ArrayPlan if facts.computes[op.op_id][0].on_array(facts.kernel.dataflow) else _VectorPlan
            else:
                cls = _BarrierPlan
            plans[op.op_id] = cls(op, worker, facts)
        out.append(plans)
    for worker, plans in enumerate(out):
        for op in facts.kernel.body:
            if op.op_id in plans:  # a shared move is worker 0's: every worker reads its instances
                plans[op.op_id].deps = tuple(out[0 if d in facts.shared else worker][d] for d in op.depends_on)
    _link_partial_sums(facts.kernel, out)
    return out


def _link_partial_sums(kernel: Kernel, plans: list[dict[int, _Plan]]) -> None:
    """A K split's reload of partial sums waits for what its ring's writer wrote of the same tile a
    step before, not for that writer's latest tile."""
    for by_op in plans:
        for reader, writer in kernel.carried_reads().items():
            by_op[reader].carried, by_op[reader].tile = by_op[writer], tuple(kernel.body_op(reader).source.tile_indices)
            by_op[writer].by_tile, by_op[writer].tile = {}, tuple(kernel.body_op(writer).destination.tile_indices)


def _running(kernel: Kernel, op: BodyOp) -> set[str]:
    """The loop variables set while `op` runs: those of the loops around its place."""
    order = [l.induction_var for l in kernel.tile_loops]
    anchor = op.after or op.at
    if anchor is None:
        return set()
    return set(order[:order.index(anchor) + (op.after is None)])


class _Plan:
    """One body op on one worker: what all its instances share, and where they have got to.
    `task` makes an instance's task from its id, deps and loop values, or None where the
    instance runs none."""

    __slots__ = ("op", "op_id", "worker", "key", "deps", "depth", "first_fill_waits", "fresh", "fresh_while", "may_split",
                 "phase", "label", "whole", "last", "skipped", "instances", "readers", "carried", "tile", "by_tile",
                 "blocks", "pieces")

    def __init__(self, op: BodyOp, worker: int, facts: _KernelFacts):
        self.op, self.op_id, self.worker = op, op.op_id, worker
        self.key = (worker, op.op_id)
        self.may_split = False  # a move whose whole tile is SPLIT_BYTES or more, by a DMA
        self.deps: tuple[_Plan, ...] = ()  # the plans of the ops it depends on, linked by `_plans`
        self.depth = 1 if isinstance(op, Barrier) else op.depth
        self.first_fill_waits = facts.previous_users.get(self.key, ())
        # each instance is a new one of its buffer, except a compute's that accumulate into the last
        rule = accumulate_rule(op) if isinstance(op, Compute) else False
        self.fresh = rule is False
        self.fresh_while = None if isinstance(rule, bool) else rule  # (var, n): new while var <= n
        self.phase = facts.phase
        self.label = ""
        # bounds on the loop values within which its tiles are whole (`unchecked_bounds`); None:
        # no such bounds are known, every instance measures its tiles
        self.whole: tuple[tuple[str, int, int], ...] | None = None
        self.last: int | None = None  # id of its latest task
        # a load that came in pieces (`TaskStream._written`), its latest instance's: (the bounds of
        # the regions it holds, id) of each
        self.pieces: tuple[tuple[tuple[slice, ...], int], ...] | None = None
        self.skipped: tuple[int, frozenset[int]] | None = None  # (id, deps) of its latest instance that ran no task
        self.instances = 0  # of its buffer, so far
        # worker -> instance -> id of its latest reader there (a shared move's: on every worker)
        workers = range(facts.binding.workers) if op.op_id in facts.shared else (worker,)
        self.readers: dict[int, dict[int, int]] = {w: {} for w in workers}
        # a K split's partial sums (`_link_partial_sums`): the writer of the ring a reload reads, the
        # loop variables naming the tile read or written there, and the writer's (task, instance) of
        # each tile so far
        self.carried: _Plan | None = None
        self.tile: tuple[str, ...] = ()
        self.by_tile: dict[tuple[int, ...], tuple[int, int]] | None = None
        # the loop within blocks a compute accumulates over (a K split's), each block a new tile
        self.blocks = next((l for l in facts.kernel.tile_loops if l.within and l.induction_var == self.fresh_while[0]),
                           None) if self.fresh_while else None

    def task(self, tid: int, deps: tuple[int, ...], env: dict[str, int]) -> Task | None:
        raise NotImplementedError


class _ViewPlan(_Plan):
    """Nothing moves: the view is ready when its source is."""

    __slots__ = ()

    def task(self, tid, deps, env):
        return None


class _MovePlan(_Plan):
    __slots__ = ("unit", "engine", "src_level", "dst_level", "l2_bank", "l2_slots", "l2_spread", "port", "transpose",
                 "args", "bytes", "src_shape", "dst_shape", "table", "itemsize", "in_place", "stream", "held")

    def __init__(self, op: DataMove, worker: int, facts: _KernelFacts):
        super().__init__(op, worker, facts)
        g = facts.g
        src, dst = op.source, op.destination
        # between a home in L3 and its region: no task (a padded band is a BlockMover's copy)
        self.in_place = home_move(op, facts.homes, facts.in_l2) == IN_PLACE
        self.src_level, self.dst_level = move_levels(op, facts.homes)
        self.unit = engine_kind(self.src_level, self.dst_level)
        self.engine = None if self.in_place else facts.binding.engines[op.op_id, worker]
        self.stream = facts.streams + op.op_id
        # the bank of the L2 buffer whose port it uses; a double-buffered one's slots may lie in
        # several: the one its filler's latest instance wrote (`port`: that filler's plan, linked
        # after the plans are made)
        banks = facts.l2_banks.get((op.op_id, worker), (None,))
        self.l2_bank, self.l2_slots = banks[0], banks if len(set(banks)) > 1 else None
        # a tile of a home in L2 lies in pieces in every bank: its moves take the banks' ports in turn
        self.l2_spread = facts.l2_count if any(r.level == "L2" and r.tensor in facts.in_l2 for r in (src, dst)) else 0
        self.port: _Plan | None = None
        self.transpose = op.transpose or op.permutation is not None
        self.label = f"{dst.tensor} {self.src_level}->{self.dst_level}"
        running = _running(facts.kernel, op)
        self.args = tuple(v for v in dst.tile_indices if v in running)
        self.src_shape, self.dst_shape = g.tensors[src.tensor].shape, g.tensors[dst.tensor].shape
        self.table = table_values(src, g)
        self.itemsize = itemsize(g.tensors[dst.tensor].dtype)  # a fill costs no external-memory bytes
        self.bytes = math.prod(dst.tile_shape) * self.itemsize  # of a whole tile
        self.may_split = self.unit == "dma" and not self.in_place and self.bytes >= SPLIT_BYTES
        # a load from external memory that its kernel's BARRIER holds back (`TaskStream._written`);
        # None until its deps are linked
        self.held: bool | None = None
        bounds = whole_move_bounds(op, self.src_shape, self.dst_shape)
        self.whole = None if bounds is None else unchecked_bounds(bounds, facts.ranges)

    def task(self, tid, deps, env):
        if self.in_place:
            return None
        if self.whole is not None and (not self.whole or within_bounds(self.whole, env)):
            nbytes = self.bytes
        else:
            _, part = move_slices(self.op, self.src_shape, self.dst_shape, env, self.table)
            nbytes = region_elements(part) * self.itemsize
        if not nbytes:  # a window's tile wholly outside its tensor: no task
            return None
        args = {}  # a loop, not a comprehension: no function made per task
        for v in self.args:
            args[v] = env[v]
        bank = tid % self.l2_spread if self.l2_spread else self.l2_bank
        if self.l2_slots is not None:
            if self.port is None:
                port = self.op.l2_port()
                self.port = self if port == self.op_id else next(d for d in self.deps if d.op_id == port)
            bank = self.l2_slots[(self.port.instances - 1) % len(self.l2_slots)]
        # Task's fields in order: most tasks are moves, and keywords would cost more than the task.
        # Its stream is the op: one queue per op across kernels, a later kernel's move waits
        # behind the earlier kernel's (but in a chain, whose kernels run at once)
        return Task(tid, self.unit, self.engine, deps, self.stream, self.phase, self.label, args,
                    nbytes, self.src_level, self.dst_level, bank, self.transpose)


class _ComputePlan(_Plan):
    """Its tile shapes are its tiles' (`refs`) where those are whole."""

    __slots__ = ("opdef", "attrs", "over", "args", "tensors", "stream")

    def __init__(self, op: Compute, worker: int, facts: _KernelFacts, refs: list[TileRef]):
        super().__init__(op, worker, facts)
        # a unit runs one kernel's computes in program order; a chain's kernels each in their own
        # queue, so one waiting for rows holds up none of another's
        self.stream = facts.streams
        self.opdef, self.attrs = facts.computes[op.op_id]
        self.label = f"{op.compute_type} {op.output.tensor}"
        # the loop the compute accumulates over, if any: its tiles add into one result
        self.over = op.accumulate.partition(">")[0].strip() if ">" in op.accumulate else None
        running = _running(facts.kernel, op)
        self.args = tuple(v for v in [*op.output.tile_indices, self.over] if v in running)
        self.tensors = facts.g.tensors
        bounds = [whole_tile_bounds(r, self.tensors[r.tensor].shape) for r in refs]
        if None not in bounds:
            self.whole = unchecked_bounds([b for ref_bounds in bounds for b in ref_bounds], facts.ranges)

    def shape(self, ref: TileRef, env: dict[str, int]) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in tile_slices(ref, self.tensors[ref.tensor].shape, env))


class _ArrayPlan(_ComputePlan):
    __slots__ = ("mnk", "over_last", "dataflow", "dtype")

    def __init__(self, op: Compute, worker: int, facts: _KernelFacts):
        super().__init__(op, worker, facts, op.inputs)
        if self.whole is not None:
            self.mnk = self.opdef.tile_mnk([tuple(r.tile_shape) for r in op.inputs], self.attrs)
        self.over_last = facts.last_step.get(self.over)
        self.dataflow = facts.kernel.dataflow
        # A's and B's, the wider: the MACs a PE does a cycle
        self.dtype = widest([self.tensors[r.tensor].dtype for r in op.inputs[:2]])

    def task(self, tid, deps, env):
        if self.whole is not None and (not self.whole or within_bounds(self.whole, env)):
            m, n, k = self.mnk
        else:
            m, n, k = self.opdef.tile_mnk([self.shape(r, env) for r in self.op.inputs], self.attrs)
        # the accumulators drain on the last step of that loop, of each block (a K split's)
        drain = self.over is None or env[self.over] == (
            self.over_last if self.blocks is None else last_of_block(self.blocks, env))
        return Task(tid, "array", self.worker, deps, stream=self.stream, m=m, n=n, k=k, dataflow=self.dataflow,
                    drain=drain, dtype=self.dtype, phase=self.phase, label=self.label,
                    args={v: env[v] for v in self.args})


class _VectorPlan(_ComputePlan):
    """The vector unit beside the array, for the elements of each op class."""

    __slots__ = ("work",)

    def __init__(self, op: Compute, worker: int, facts: _KernelFacts):
        super().__init__(op, worker, facts, [*op.inputs, op.output])
        if self.whole is not None:
            self.work = self._work([tuple(r.tile_shape) for r in op.inputs], tuple(op.output.tile_shape))

    def _work(self, shapes: list[tuple[int, ...]], out_shape: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(self.opdef.vector_work(shapes, out_shape, self.attrs).items()))

    def task(self, tid, deps, env):
        if self.whole is not None and (not self.whole or within_bounds(self.whole, env)):
            work = self.work
        else:
            work = self._work([self.shape(r, env) for r in self.op.inputs], self.shape(self.op.output, env))
        return Task(tid, "vector", self.worker, deps, stream=self.stream, vector_work=work, phase=self.phase,
                    label=self.label, args={v: env[v] for v in self.args})


class _BarrierPlan(_Plan):
    """Passed on this compute tile when what it waits for has finished."""

    __slots__ = ()

    def __init__(self, op: Barrier, worker: int, facts: _KernelFacts):
        super().__init__(op, worker, facts)
        self.label = f"BARRIER {op.kernel or facts.kernel.name} {op.wait_for}"

    def task(self, tid, deps, env):
        return Task(tid, "barrier", self.worker, deps, stream=self.op_id, phase=self.phase, label=self.label)


def _l2_banks(kernel: Kernel, binding: Binding) -> dict[tuple[int, int], tuple[int, ...]]:
    """(op_id, worker) -> the banks, slot by slot, of the L2 buffer whose port a move uses."""
    slots: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for b in binding.buffers:
        if b.buffer.level == "L2":
            slots.setdefault((b.buffer.op_id, b.buffer.worker), []).append((b.buffer.slot or 0, b.bank))
    filled = {key: tuple(bank for _, bank in sorted(banks)) for key, banks in slots.items()}
    out = {}
    for op in kernel.body:
        port = op.l2_port() if isinstance(op, DataMove) else None
        for w in range(binding.workers):
            if (port, w) in filled:
                out[op.op_id, w] = filled[port, w]
    return out
