"""Event-driven, cycle-level simulator of the KPU's engines, systolic arrays and vector units.

Input: a lazy stream of `Task`s in program order. Model:
- Every engine (DMA, BlockMover, Streamer; each compute tile's array and its vector unit, two
  engines that run at once) runs one task at a time and has one command queue per stream
  (`Task.stream`), like a DMA engine's descriptor channels. A stream's tasks run in program
  order: only its head task can start, and it becomes a candidate when its deps have finished.
  An idle engine starts the candidate of the lowest `Task.priority` (the earliest kernel's), of
  those the one that became ready first, ties broken by task id; so a task waiting on a late dep
  blocks its own stream only, not the engine's others (no head-of-line blocking). With one
  stream per engine this is a plain in-order queue, as the array's tasks of one compute tile
  are (the loader gives them one stream). Tasks waiting for a port (below) take it in the
  order they asked, whatever their priority.
- What a unit does is looked up by `Task.unit` in MOVE_MODELS, COMPUTE_MODELS and SYNC_MODELS
  (hardware.units): moves count bytes per pair of levels, computes start their phase's compute
  and count MACs, and a barrier (one sync engine per compute tile) takes no cycles: it ends when
  its last dependency has, and marks that moment in the trace.
- A started task that needs a shared resource also waits for a free port of it: its DRAM channel
  (`dram_channel`; a DMA task naming none uses channel engine % channels) or its L2 bank
  (`l2_bank`; a bank has `machine.l2_bank_ports` ports). Its engine is committed to it meanwhile.
  Tasks waiting on one resource are served in the order they asked (the cycle their engine chose
  them), ties broken by task id.
- Time advances from one completion event to the next (a heap); nothing steps cycle by cycle.

Memory is O(dep_window), however long the input:
- At most `dep_window` tasks are read ahead of the oldest unfinished one (in flight), like a
  command processor with that many outstanding commands. For real programs this never binds: an
  input that keeps an idle engine waiting behind dep_window unrelated tasks is pathological.
- No end times are stored: deps point backwards, so a dep that is no longer in flight has
  finished, and a stream's head task is re-examined exactly when a dep or its predecessor in
  the stream finishes. The loader guarantees that a dep is never more than `dep_window` tasks
  back; the ids of the last `dep_window` tasks are remembered only to reject a dep that breaks
  that promise.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from heapq import heappop, heappush
from operator import attrgetter

from .machine import Machine
from .task import UNIT_PREFIX, Task
from .units import COMPUTE_MODELS, MOVE_MODELS, SYNC_MODELS

TRACE_PID = 1  # every trace slice belongs to one process: the KPU
PROGRESS_EVERY = 4096  # completions between progress callbacks
COSTS_KEPT = 1 << 12  # durations remembered per unit kind: bounded memory however varied the tasks


@dataclass(slots=True)
class UnitStats:
    busy_cycles: int = 0
    tasks: int = 0
    bytes: int = 0


@dataclass(slots=True)
class PhaseSpan:
    """When a phase's tasks ran: first start, first compute task's start (array or vector), last
    end; the MACs its array tasks did and the operand elements they read (each task's A and B
    tiles), the elements its vector tasks processed by op class, and the bytes its
    moves carried, by pair of levels as SimResult.bytes_moved; the cycles it kept each kind of
    unit busy."""

    start: int
    end: int
    compute_start: int | None = None
    macs: int = 0
    array_operand_elements: int = 0
    vector_work: dict[str, int] = field(default_factory=dict)
    bytes_moved: dict[str, int] = field(default_factory=dict)
    # the cycles its tasks held each kind of unit (dma, block_mover, streamer, array, vector),
    # summed over the units of that kind
    busy: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class SimResult:
    cycles: int  # makespan
    units: dict[str, UnitStats]  # dram0.., dma0.., bm0.., str0.., array0.., vec0.., then each L2 bank used
    bytes_moved: dict[str, int]  # "EXTERNAL->L3": bytes, ... as they occur
    macs: int
    trace_events: list[dict] = field(default_factory=list)  # Chrome trace events, if trace=True
    first_tasks: list[tuple[Task, int, int, str]] = field(default_factory=list)
    phases: dict[int, PhaseSpan] = field(default_factory=dict)  # by Task.phase


class _Queue(deque):
    """One stream's command queue on an engine, in program order; its head is waiting on a dep,
    a candidate of its engine, or running (or waiting for a resource port)."""

    __slots__ = ("eng",)

    def __init__(self, eng):
        super().__init__()
        self.eng = eng


class _Engine:
    """One engine: the candidates among its streams' queue heads, and the running task."""

    __slots__ = ("name", "tid", "stats", "cands", "running", "cost", "timing", "costs", "tail",
                 "compute", "moves", "channel", "held", "moved", "busy")

    def __init__(self, name, tid, model, role, channel, costs):
        self.name = name
        self.tid = tid  # trace track
        self.stats = UnitStats()
        # Heads whose deps are done, not started: a heap of (priority, ready cycle, task id, queue).
        self.cands: list[tuple[int, int, int, _Queue]] = []
        self.running: _Queue | None = None  # the queue whose head runs or holds the engine
        self.cost = model.cycles
        # The fields of a task its duration depends on, and the durations timed so far by those
        # (one dict per unit kind): a program repeats a few tile shapes over and over.
        self.timing = attrgetter(*model.timed_by) if model.timed_by else lambda task: ()
        self.costs: dict = costs
        self.tail = model.tail_cycles
        self.compute = model if role == "compute" else None  # compute engines: the model, for its work
        self.moves = role == "move"  # engines that move bytes between levels
        self.channel = channel  # DMA engines: the home channel, for tasks that name none
        self.held = None  # the port its running task holds, released when it completes
        # bytes by (phase, source level, destination level): the run's totals and each phase's,
        # summed once at the end rather than twice per task
        self.moved: defaultdict[tuple[int, str, str], int] = defaultdict(int)
        self.busy: defaultdict[int, int] = defaultdict(int)  # cycles by phase, summed likewise


class _Resource:
    """A shared resource with `free` ports: a DRAM channel or an L2 bank."""

    __slots__ = ("name", "stats", "free", "waiters")

    def __init__(self, name, ports):
        self.name = name
        self.stats = UnitStats()
        self.free = ports
        self.waiters: list[tuple[int, int, _Engine]] = []  # heap of (asked cycle, task id, engine)


class _Banks:
    """The L2 banks, each made on its first task: a machine may have a million banks and a
    program use four."""

    def __init__(self, count: int, ports: int):
        self.count, self.ports = count, ports
        self.used: dict[int, _Resource] = {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, b: int) -> _Resource:
        bank = self.used.get(b)
        if bank is None:
            bank = self.used[b] = _Resource(f"l2bank{b}", self.ports)
        return bank


class Simulator:
    def __init__(self, machine: Machine, trace: bool = False, record_first: int = 0,
                 dep_window: int = 1 << 16):
        if dep_window < 1:
            raise ValueError(f"dep_window must be at least 1, got {dep_window}")
        self.machine = machine
        self.trace = trace
        self.record_first = record_first
        self.dep_window = dep_window
        self._in_flight: set[int] = set()
        self._recent: deque[int] = deque()

    @property
    def tasks_held(self) -> int:
        """Task ids the running simulation holds: at most dep_window in flight plus dep_window
        recent ones. This is its memory bound, whatever the length of the stream."""
        return len(self._in_flight) + len(self._recent)

    def _build(self):
        """The machine's resources and engines; trace track ids follow SimResult.units order."""
        mc = self.machine
        channels = [_Resource(f"dram{c}", 1) for c in range(mc.external.channels)]
        counts = mc.unit_counts()
        kinds = [(unit, model, counts[unit], "move") for unit, model in MOVE_MODELS.items()]
        kinds += [(unit, model, counts[unit], "compute") for unit, model in COMPUTE_MODELS.items()]
        kinds += [(unit, model, counts[unit], "sync") for unit, model in SYNC_MODELS.items()]
        engines: dict[str, dict[int, _Engine]] = {}
        track = len(channels)
        for unit, model_cls, count, role in kinds:
            model = model_cls(mc)
            costs = {}
            engines[unit] = {}
            for e in range(count):
                home = channels[e % len(channels)] if unit == "dma" else None
                engines[unit][e] = _Engine(f"{UNIT_PREFIX[unit]}{e}", track, model, role, home, costs)
                track += 1
        return channels, engines, _Banks(mc.l2.count, mc.l2_bank_ports)

    def run(self, tasks: Iterable[Task],
            progress: Callable[[int], None] | None = None) -> SimResult:
        """Simulate `tasks` (read lazily, once); `progress(n_done)` every few thousand tasks."""
        channels, engines, banks = self._build()
        window = self.dep_window
        record_first = self.record_first
        trace = self.trace
        us_per_cycle = 1.0 / (self.machine.clock_ghz * 1e3)
        events: list[dict] = []
        first: list = [None] * record_first
        first_index: dict[int, int] = {}  # task id -> program position, for the first tasks
        phases: dict[int, PhaseSpan] = {}

        # (cycle, task id, its engine's completion | its DMA channel's release). A release comes
        # the DMA's latency tail before its task's end, so no two entries tie and the heap never
        # compares the objects.
        heap: list[tuple[int, int, _Engine | _Resource]] = []
        in_flight = self._in_flight = set()  # ids read but not finished
        recent = self._recent = deque(maxlen=window)  # the last `window` ids read, oldest first
        queues: dict[tuple[str, int, int], _Queue] = {}  # (unit, engine, stream) -> its queue
        dep_waiters: dict[int, list[_Queue]] = {}  # unfinished task id -> queues whose head needs it
        ready: list[_Queue] = []  # queues whose head task must be (re)examined now
        idle: list[_Engine] = []  # engines that may be idle with candidates: choose one now
        dirty: list[_Resource] = []  # resources with new waiters or freed ports
        starting: list[_Engine] = []  # engines whose chosen task starts now (holding its port, if any)
        it = iter(tasks)
        now = admitted = done = 0
        last_id = None
        exhausted = False
        report_at = PROGRESS_EVERY if progress is not None else -1  # the next count to report

        while True:
            # Read ahead: tasks join their engine's stream queue in program order.
            if not exhausted and admitted - done < window:
                for task in it:
                    tid = task.id
                    if last_id is not None and tid <= last_id:
                        raise ValueError(f"task {tid}: ids must increase in program order "
                                         f"(after task {last_id})")
                    last_id = tid
                    if task.deps:
                        oldest = recent[0] if recent else tid  # nothing read yet: no dep can be valid
                        for d in task.deps:
                            if not oldest <= d < tid:
                                raise ValueError(f"task {tid}: dep {d} is not one of the {window} tasks "
                                                 f"before it (dep_window)")
                    key = (task.unit, task.engine, task.stream)
                    q = queues.get(key)
                    if q is None:
                        q = queues[key] = _Queue(_engine(task, engines))
                    if not q:
                        ready.append(q)
                    q.append(task)
                    in_flight.add(tid)
                    recent.append(tid)
                    if admitted < record_first:
                        first_index[tid] = admitted
                    admitted += 1
                    if admitted - done == window:
                        break
                else:
                    exhausted = True

            # Examine stream heads: wait on an unfinished dep, or become a candidate of the engine.
            for q in ready:
                task = q[0]
                for d in task.deps:
                    if d in in_flight:
                        dep_waiters.setdefault(d, []).append(q)
                        break
                else:
                    eng = q.eng
                    heappush(eng.cands, (task.priority, now, task.id, q))
                    if eng.running is None:
                        idle.append(eng)
            ready.clear()

            # Idle engines take their first candidate: start it, or queue for its resource.
            for eng in idle:
                if eng.running is not None or not eng.cands:
                    continue  # listed twice
                q = eng.running = heappop(eng.cands)[3]
                task = q[0]
                if task.dram_channel is None and task.l2_bank is None:
                    res = eng.channel
                else:
                    res = _resource(task, channels, banks)
                if res is None:
                    starting.append(eng)
                else:
                    heappush(res.waiters, (now, task.id, eng))
                    dirty.append(res)
            idle.clear()

            # Grant freed ports to the waiters that asked first.
            for res in dirty:
                waiters = res.waiters
                while res.free and waiters:
                    res.free -= 1
                    eng = heappop(waiters)[2]
                    eng.held = res
                    starting.append(eng)
            dirty.clear()

            # Start the chosen tasks: time them, count their work, and schedule their end.
            for eng in starting:
                task = eng.running[0]
                timing = eng.timing(task)
                cycles = eng.costs.get(timing)
                if cycles is None:
                    cycles = eng.cost(task)
                    if len(eng.costs) < COSTS_KEPT:
                        eng.costs[timing] = cycles
                end = now + cycles
                nbytes = task.bytes
                st = eng.stats
                st.busy_cycles += cycles
                st.tasks += 1
                st.bytes += nbytes
                eng.busy[task.phase] += cycles
                span = phases.get(task.phase)
                if span is None:  # tasks start in time order: the first seen starts the phase
                    span = phases[task.phase] = PhaseSpan(now, end)
                elif end > span.end:
                    span.end = end
                compute = eng.compute
                if compute is not None:
                    span.macs += compute.macs(task)
                    span.array_operand_elements += compute.operand_elements(task)
                    for op_class, elements in task.vector_work:  # none on an array task
                        span.vector_work[op_class] = span.vector_work.get(op_class, 0) + elements
                    if span.compute_start is None:
                        span.compute_start = now
                elif eng.moves:
                    eng.moved[task.phase, task.src_level, task.dst_level] += nbytes
                res = eng.held
                if res is not None:
                    hold = cycles - eng.tail
                    rs = res.stats
                    rs.busy_cycles += hold
                    rs.tasks += 1
                    rs.bytes += nbytes
                    if eng.tail:  # the port is free for the latency tail: released by its own event
                        heappush(heap, (now + hold, task.id, res))
                        eng.held = None
                heappush(heap, (end, task.id, eng))
                if first_index:
                    i = first_index.pop(task.id, None)
                    if i is not None:
                        first[i] = (task, now, end, eng.name)
                if trace:
                    events.append(_slice(task, eng, res, cycles, now, us_per_cycle))
            starting.clear()

            if not heap:
                break
            # Advance to the next event time and apply everything that happens then.
            now = heap[0][0]
            while heap and heap[0][0] == now:
                _, _, obj = heappop(heap)
                if type(obj) is _Resource:  # a DMA's channel release, before its latency tail
                    obj.free += 1
                    dirty.append(obj)
                    continue
                eng = obj
                q = eng.running
                eng.running = None
                tid = q.popleft().id
                in_flight.remove(tid)
                waiting = dep_waiters.pop(tid, None)
                if waiting:
                    ready.extend(waiting)
                if q:
                    ready.append(q)
                if eng.cands:
                    idle.append(eng)
                res = eng.held
                if res is not None:
                    eng.held = None
                    res.free += 1
                    dirty.append(res)
                done += 1
                if done == report_at:
                    progress(done)
                    report_at += PROGRESS_EVERY

        if admitted != done:  # unreachable unless the model above is broken
            raise RuntimeError(f"simulation stalled with {admitted - done} tasks unfinished")
        if progress is not None:
            progress(done)
        recent.clear()
        return self._result(now, channels, engines, banks, events, first[:admitted], phases)

    @staticmethod
    def _result(cycles, channels, engines, banks, events, first, phases) -> SimResult:
        units: dict[str, UnitStats] = {}
        bytes_moved: dict[str, int] = {}
        for r in channels:
            units[r.name] = r.stats
        for unit, kind in engines.items():
            for eng in kind.values():
                units[eng.name] = eng.stats
                for phase, n in eng.busy.items():
                    if n:  # no entry for a kind that took no cycles (a barrier)
                        per_phase = phases[phase].busy
                        per_phase[unit] = per_phase.get(unit, 0) + n
                for (phase, src, dst), n in eng.moved.items():
                    key = f"{src}->{dst}"
                    bytes_moved[key] = bytes_moved.get(key, 0) + n
                    per_phase = phases[phase].bytes_moved
                    per_phase[key] = per_phase.get(key, 0) + n
        for b in sorted(banks.used):
            units[banks.used[b].name] = banks.used[b].stats
        macs = sum(span.macs for span in phases.values())
        return SimResult(cycles, units, bytes_moved, macs, events, first, phases)


def _slice(task: Task, eng: _Engine, res: _Resource | None, cycles: int, now: int,
           us_per_cycle: float) -> dict:
    """A started task's trace event: a slice on its engine's track."""
    args = dict(task.args) if task.args else {}
    args["task"] = task.id
    args["stream"] = task.stream
    if eng.compute is not None:
        args.update(eng.compute.trace_args(task))
    elif eng.moves:
        args["bytes"] = task.bytes
    args["cycles"] = cycles
    if res is not None:
        args["port"] = res.name
    return {"name": task.label or eng.name, "ph": "X", "pid": TRACE_PID, "tid": eng.tid,
            "ts": now * us_per_cycle, "dur": cycles * us_per_cycle, "args": args}


def _resource(task: Task, channels: list[_Resource], banks: _Banks) -> _Resource:
    """The shared resource a task that names a DRAM channel or an L2 bank holds while it transfers."""
    ch, bank = task.dram_channel, task.l2_bank
    if bank is None:
        pool, index, what = channels, ch, "DRAM channel"
    elif ch is None:
        pool, index, what = banks, bank, "L2 bank"
    else:
        raise ValueError(f"task {task.id}: names both DRAM channel {ch} and L2 bank {bank}; "
                         f"a task uses at most one shared resource")
    if 0 <= index < len(pool):
        return pool[index]
    raise ValueError(f"task {task.id}: no {what} {index}; the machine has {len(pool)}")


def _engine(task: Task, engines: dict[str, dict[int, _Engine]]) -> _Engine:
    """The engine a task runs on; ValueError if the machine has none such."""
    kind = engines.get(task.unit)
    if kind is None:
        raise ValueError(f"task {task.id}: unknown unit {task.unit!r} (expected one of {', '.join(engines)})")
    eng = kind.get(task.engine)
    if eng is None:
        raise ValueError(f"task {task.id}: no {task.unit} engine {task.engine}; the machine has {len(kind)}")
    return eng
