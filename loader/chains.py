"""Chains (`Program.chains`): consecutive kernels that run at once, band by band.

Each member after the first reads rows of a result of the one before it (a link tensor) while
they are written, from the link's home in L3: all of it, or a ring of `ring` rows (row r in slot
r mod ring); or from external memory, where it has no home. The validator has made every move
that reads or writes a link at its home go by its bands: its band dim (rows, dim 1, or
channels, the last: `Kernel.band_dim`) indexed by the kernel's band loop (`Kernel.band_loop`),
so each compute tile visits them in increasing order, once per step it takes of a parallel loop
outside that loop: the binder takes no fewer compute tiles than such steps where the link is a
ring (`ring_passes`). Below, "rows" are a link's slices along its band dim.

Binding: each member is bound on its own, then its buffers are moved off those of the members
before it (`away_from_chain`), since all of them live at once; once all are, the chain's L2
buffers go to banks and its streams to engines by load, over the whole chain (`balanced`).

Tasks: the members' op instances are merged into one stream (`chain_tasks`), taking each time
the downstream-most member with a ready instance among the next ones of its compute tiles (each
goes on in its own order, as `expand` deals them, so one waiting for rows holds up no other; a
shared move goes once all have reached it):
- an instance that neither reads nor writes a link at its home is ready;
- a home read of rows [a, b) (the move from the link's EXTERNAL side, which runs in place, as a
  copy or, where the machine had no room for the home, as the DMA's) is ready once the writer's
  issued writes cover every element of those rows; it waits for the tasks that wrote them (a
  move in place runs no task: the moves after it inherit what it waited for);
- a write of rows [a, b) into a ring is ready once b - ring is at most the first row of the
  oldest band a compute tile of a reader may still read: a band's reads are all issued before
  the next band's home read, so rows below each compute tile's latest home read (or the one
  that is its next instance) are done with. It waits for every task that read the rows it
  replaces (the readers' moves out of the home).
No member ready while some are not done: the ring is too small, a LoadError naming the link.
Values are computed kernel by kernel as ever (`execution.run_kernel`): a ring changes where
rows live, not what they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

from dfx import Barrier, BodyOp, DataMove, Kernel, Program, TileRef, in_lines, slices_along
from hardware import Machine, Task

from .binding import BindError, Binding, BoundBuffer, engine_count, port_loads, stream_cycles
from .buffers import COPY, StreamReq, home_move, in_home, level_banks
from .relocate import Occupancy, place_of, relocate
from .schedule import placement, worker_stream
from .tasks import Running, TaskStream

WRITE, READ, FETCH = "write", "read", "fetch"  # what an op does to a link's rows (`_roles`)
# between the move queues (`Task.stream`: an op id, plus this times the kernel's place in its chain)
# of a chain's kernels on one engine, more than the ops of a body: each kernel has its own queues,
# so a move waiting for rows holds up no move of another kernel
STREAMS_APART = 1 << 20


def chain_names(program: Program, position: int) -> str:
    """How messages name the chain of the kernel at `position`."""
    first, last = program.spans()[position]
    return f"chain [{', '.join(k.name for k in program.kernels[first:last + 1])}]"


# ---- binding -------------------------------------------------------------------------------


def ring_passes(program: Program, kernel: Kernel, workers: int, kept: frozenset[str]) -> str | None:
    """Why, on `workers` compute tiles, the kernel would read a link kept in a ring more than once
    (None if it would not): a parallel loop outside its band loop (`Kernel.band_loop`) with more
    steps than compute tiles, each going through the bands again for its next step, by then
    replaced in the ring. A whole link may be read so."""
    for name in dict.fromkeys(kernel.inputs):
        t = program.graph.tensors[name]
        if name not in kept or t.ring is None or t.ring >= t.shape[t.ring_dim]:
            continue
        if kernel.band_passes(name, t.ring_dim, workers) > 1:
            outer = kernel.band_loop()
            return (f"reads link '{name}' band by band once per step of its loop '{outer.induction_var}', "
                    f"{outer.trip_count} steps over {workers} compute tile(s): its ring of {t.ring} {t.ring_holds} "
                    f"would no longer hold the first bands when a compute tile goes through them again")
    return None


def away_from_chain(binding: Binding, earlier: list[Binding], machine: Machine, where: str,
                    chain: str) -> list[Binding]:
    """A chain member's `binding` moved off the buffers of the members bound before it
    (`earlier`), which live at the same time (`relocate` against them alone, then, where its
    whole banks find no free bank each, `_squeezed`, then, where those leave no stretch long
    enough, the level's buffers of all of them packed anew: `_packed`); the earlier members'
    bindings and its own. BindError naming the chain and the level where some would still share
    bytes."""
    taken = Occupancy()
    for tag, b in enumerate(earlier):
        for bb in b.buffers:
            taken.claim(bb, tag)
    moved = relocate(binding, taken, machine)
    if shared_level([*earlier, moved]) is not None:
        moved = _squeezed(moved, earlier, machine)
    members = [*earlier, moved]
    while (level := shared_level(members)) is not None:
        packed = _packed(members, level, machine)
        if packed is None:
            raise BindError(f"{where}: {chain}: kernel '{binding.kernel}' finds no room in {level} beside the "
                            f"buffers of the kernels before it in the chain, which run at the same time")
        members = packed
    return members


def balanced(members: list[Binding], streams: list[list[StreamReq]], machine: Machine) -> list[Binding]:
    """A whole chain's members (`streams`: each one's) with their L2 buffers and their streams'
    engines dealt out anew over the chain, which runs at once: heaviest first, each buffer into
    the L2 bank whose port the chain loads least so far, with room (packed from the bottom of
    each bank), each stream onto the engine of its kind the chain keeps least busy. Bound one by
    one, the members' busiest buffers came to the same banks: MobileNet v2's conv2d_3 ..
    conv2d_5 put 62% of its L2 traffic through two of the eight, its depthwise's small loads
    queueing behind the 1x1s' large moves. Where a buffer finds no room so, the buffers keep
    their places."""
    cycles = [stream_cycles(s, machine) for s in streams]
    placed = _ports_balanced(members, streams, cycles, machine) or members
    return _engines_balanced(placed, streams, cycles, machine)


def _ports_balanced(members: list[Binding], streams: list[list[StreamReq]], cycles: list[list[int]],
                    machine: Machine) -> list[Binding] | None:
    """The members with their L2 buffers placed by port load (`balanced`); None where one finds
    no room."""
    count, size = level_banks(machine, "L2")
    at_l2 = []  # (its port's load, bytes, member, buffer index)
    for m, (b, own, own_cycles) in enumerate(zip(members, streams, cycles)):
        loads = port_loads([bb.buffer for bb in b.buffers], own, own_cycles)
        at_l2 += [(loads.get(i, 0), bb.buffer.bytes, m, i) for i, bb in enumerate(b.buffers) if bb.buffer.level == "L2"]
    fill: dict[int, int] = {}  # bank -> bytes used
    load: dict[int, int] = {}  # bank -> the cycles its port carries
    where: dict[tuple[int, int], BoundBuffer] = {}
    for port_load, nbytes, m, i in sorted(at_l2, key=lambda x: (-x[0], -x[1], x[2], x[3])):
        room = [k for k in range(count) if fill.get(k, 0) + nbytes <= size]
        if not room:
            return None
        bank = min(room, key=lambda k: (load.get(k, 0), fill.get(k, 0), k))
        where[m, i] = BoundBuffer(members[m].buffers[i].buffer, bank, fill.get(bank, 0))
        fill[bank] = in_lines(fill.get(bank, 0) + nbytes, machine.line_bytes)
        load[bank] = load.get(bank, 0) + port_load
    return [replace(b, buffers=[where.get((m, i), bb) for i, bb in enumerate(b.buffers)])
            for m, b in enumerate(members)]


def _engines_balanced(members: list[Binding], streams: list[list[StreamReq]], cycles: list[list[int]],
                      machine: Machine) -> list[Binding]:
    """The members with their streams on engines by load (`balanced`)."""
    busy: dict[tuple[str, int], int] = {}  # (kind, engine) -> the chain's cycles on it so far
    engines = [dict(b.engines) for b in members]
    dealt = sorted(((c, m, s) for m, (own, own_cycles) in enumerate(zip(streams, cycles))
                    for s, c in zip(own, own_cycles)), key=lambda x: (-x[0], x[1], x[2].op_id, x[2].worker))
    for c, m, s in dealt:
        e = min(range(engine_count(s.kind, machine)), key=lambda e: (busy.get((s.kind, e), 0), e))
        engines[m][s.op_id, s.worker] = e
        busy[s.kind, e] = busy.get((s.kind, e), 0) + c
    return [replace(b, engines=e) for b, e in zip(members, engines)]


def _packed(members: list[Binding], level: str, machine: Machine) -> list[Binding] | None:
    """The members with their buffers at `level` placed anew, largest first: each into the bank of
    its pool with room that holds the fewest bytes yet, so the buffers spread over the banks and
    their ports (first fit put both compute tiles' copies of a 1x1's input in one L2 bank, whose
    port then served both: MobileNet v2's dw16 .. pw18 chain); where that leaves one without
    room, as the compiler's fit test packs them (`kernel_compiler.requirements`), each at the
    end of the first bank with room. None where even that finds none."""
    count, size = level_banks(machine, level)
    at_level = sorted(((m, i, bb) for m, b in enumerate(members) for i, bb in enumerate(b.buffers)
                       if bb.buffer.level == level), key=lambda x: -x[2].buffer.bytes)
    for spread in (True, False):
        fill: dict[tuple, int] = {}  # (pool, bank) -> bytes used
        where: dict[tuple[int, int], BoundBuffer] = {}  # (member, buffer) -> its new place
        for m, i, bb in at_level:
            pool = place_of(bb)[:2]
            room = [k for k in range(count) if fill.get((pool, k), 0) + bb.buffer.bytes <= size]
            if not room:
                break
            bank = min(room, key=lambda k: (fill.get((pool, k), 0), k)) if spread else room[0]
            start = fill.get((pool, bank), 0)
            where[m, i] = BoundBuffer(bb.buffer, bank, start)
            fill[pool, bank] = in_lines(start + bb.buffer.bytes, machine.line_bytes)
        else:
            return [replace(b, buffers=[where.get((m, i), bb) for i, bb in enumerate(b.buffers)])
                    for m, b in enumerate(members)]
    return None


def chain_head(binding: Binding, machine: Machine) -> Binding:
    """The first kernel of a chain with its L3 buffers shifted together to the top of L3 (below
    the homes): the kernels after it, which run at the same time, find one free stretch below
    them rather than two on either side."""
    l3 = [bb.end for bb in binding.buffers if bb.buffer.level == "L3"]
    if not l3:
        return binding
    shift = level_banks(machine, "L3")[1] - max(l3)
    return replace(binding, buffers=[BoundBuffer(bb.buffer, bb.bank, bb.address + shift)
                                     if bb.buffer.level == "L3" else bb for bb in binding.buffers])


def _squeezed(binding: Binding, earlier: list[Binding], machine: Machine) -> Binding:
    """`binding` with each buffer that shares bytes with one of `earlier` moved, largest first, to
    the first free bytes of a bank of its pool, beside its other buffers (several of its banks'
    contents may so share one bank, which `relocate` never makes them do); where one finds no
    room, as it was."""
    taken = Occupancy()
    for b in earlier:
        for bb in b.buffers:
            taken.claim(bb, 0)
    clash = {i for i, bb in enumerate(binding.buffers) if taken.under(place_of(bb), bb.address, bb.end)}
    out = list(binding.buffers)
    for i, bb in enumerate(out):
        if i not in clash:
            taken.claim(bb, 0)
    for i in sorted(clash, key=lambda i: -out[i].buffer.bytes):
        buffer = out[i].buffer
        count, size = level_banks(machine, buffer.level)
        used = sorted({k for level, owner, k in taken.spans if (level, owner) == (buffer.level, buffer.owner)})
        empty = next(k for k in range(count + 1) if k not in used)  # the lowest bank no buffer holds yet
        spot = next(((k, start) for k in [*used, *([empty] if empty < count else [])]
                     for start in [0, *(in_lines(e, machine.line_bytes) for _, e, _ in taken.spans.get(
                         (buffer.level, buffer.owner, k), []))]
                     if start + buffer.bytes <= size
                     and not taken.under((buffer.level, buffer.owner, k), start, start + buffer.bytes)), None)
        if spot is None:
            return binding
        out[i] = BoundBuffer(buffer, *spot)
        taken.claim(out[i], 0)
    return replace(binding, buffers=out)


def shared_level(bindings: list[Binding]) -> str | None:
    """The level where buffers of two of `bindings` share a byte (None: nowhere)."""
    spans: dict[tuple, list[tuple[int, int, int]]] = {}
    for i, b in enumerate(bindings):
        for bb in b.buffers:
            spans.setdefault(place_of(bb), []).append((bb.address, bb.end, i))
    for (level, _, _), held in spans.items():
        held.sort()
        reach, owner = 0, -1  # the furthest end so far, and whose
        for start, end, i in held:
            if start < reach and i != owner:
                return level
            if end > reach:
                reach, owner = end, i
    return None


def chains_overlap(program: Program, bindings: list[Binding]) -> str | None:
    """Why the bindings of a chain's members are not disjoint (None if they are)."""
    for chain in program.chains:
        names = set(chain)
        level = shared_level([b for b in bindings if b.kernel in names])
        if level is not None:
            return f"chain [{', '.join(chain)}]: buffers of two of its kernels share bytes of {level}"
    return None


# ---- tasks ---------------------------------------------------------------------------------


@dataclass
class Link:
    """A link tensor's rows as the merged stream has issued them."""

    tensor: str
    writer: str  # the member that writes it
    dim: int  # what its bands are of: rows (dim 1) or channels (the last dim)
    ring: int | None  # rows its home holds; None: all (or it stays in external memory)
    row_elements: int  # elements of one row (one channel, for a link by channels)
    covered: dict[int, int] = field(default_factory=dict)  # row -> elements the writer's issued moves wrote
    writers: dict[int, set[int]] = field(default_factory=dict)  # row -> tasks that wrote it
    readers: dict[int, set[int]] = field(default_factory=dict)  # row -> tasks that read it out of the ring
    # (reader member, compute tile) -> the first row of its latest home read: rows below are done with
    reading: dict[tuple[str, int], int] = field(default_factory=dict)

    def oldest(self, done: set[str]) -> float:
        """The first row some compute tile of a reader still running may read."""
        return min((row for (member, _), row in self.reading.items() if member not in done), default=float("inf"))


@dataclass
class _Instance:
    """The next op instance of a compute tile: its loop values (the tile's own, which stay put
    until it goes on) and what it does to links' rows, (link, role, first row, end row, elements)."""

    worker: int
    op: BodyOp
    env: dict[str, int]
    rows: list[tuple[Link, str, int, int, int]]


class _Member:
    """One kernel of the chain, each compute tile's instances in its own order (as `expand` deals
    them, but one tile waiting for rows holds up no other), and what each op does to links. A
    shared move goes once every compute tile still running has reached it, as compute tile 0's."""

    def __init__(self, running: Running, roles: dict[int, list[_Span]]):
        kernel, workers = running.kernel, running.binding.workers
        self.running, self.roles = running, roles
        place = placement(kernel)
        self.streams = [worker_stream(kernel, place, w, workers) for w in range(workers)]
        self.next: dict[int, _Instance] = {}  # compute tile -> its next instance, while it has one
        for w in range(workers):
            self._advance(w)
        self.turn = 0  # the compute tile looked at first: they take turns, as `expand` deals them
        self.waiting: int | None = None  # `_Clock.now` when none of its next instances could go

    @property
    def name(self) -> str:
        return self.running.kernel.name

    def heads(self) -> Iterator[_Instance]:
        """The instances that may go next, from compute tile `turn` on."""
        tiles, shared = len(self.streams), 0
        for w in range(self.turn, self.turn + tiles):
            item = self.next.get(w % tiles)
            if item is None:
                continue
            if item.op.op_id in self.running.shared:
                shared += 1
            else:
                yield item
        if shared and shared == len(self.next):  # every compute tile still running has reached it
            yield self.next[min(self.next)]

    def went(self, item: _Instance) -> None:
        """`item` has gone: its compute tile (every one, for a shared move) goes on."""
        tiles = list(self.next) if item.op.op_id in self.running.shared else [item.worker]
        for w in tiles:
            self._advance(w)
        self.turn = item.worker + 1

    def _advance(self, worker: int) -> None:
        step = next(self.streams[worker], None)
        if step is None:
            self.next.pop(worker, None)
            return
        _, op, env = step
        rows = [(span.link, span.role, *span.at(env)) for span in self.roles.get(op.op_id, ())]
        # a shared move is compute tile 0's
        self.next[worker] = _Instance(0 if op.op_id in self.running.shared else worker, op, env, rows)


@dataclass(frozen=True)
class _Span:
    """What a move does to a link (`role`: WRITE, READ or FETCH) and where its tile lies there:
    along each dim, tile i from offset + i * step, `extent` long, clipped to the tensor (a move
    within one tensor copies what lies inside it)."""

    link: Link
    role: str
    indices: tuple[str, ...]
    offsets: tuple[int, ...]
    steps: tuple[int, ...]
    extents: tuple[int, ...]
    shape: tuple[int, ...]

    @staticmethod
    def of(link: Link, role: str, ref: TileRef, shape: tuple[int, ...]) -> _Span:
        return _Span(link, role, tuple(ref.tile_indices), tuple(ref.offset or [0] * len(shape)),
                     tuple(ref.step or ref.tile_shape), tuple(ref.tile_shape), shape)

    def at(self, env: dict[str, int]) -> tuple[int, int, int]:
        """The rows [a, b) (channels, for a link by channels) the tile covers at these loop
        values, and its elements."""
        elements, rows = 1, (0, 0)
        for axis, (index, offset, step, extent, dim) in enumerate(zip(self.indices, self.offsets, self.steps,
                                                                      self.extents, self.shape)):
            start = offset + env.get(index, 0) * step
            low, high = max(start, 0), min(start + extent, dim)
            elements *= max(high - low, 0)
            if axis == self.link.dim:
                rows = (low, max(high, low))
        return rows[0], rows[1], elements


def _roles(kernel: Kernel, links: dict[str, Link], kept: frozenset[str],
           shapes: dict[str, tuple[int, ...]]) -> dict[int, list[_Span]]:
    """op_id -> what it does to each link at its home: WRITE (into the home, or to external memory
    where it has none; not a store in place, which writes nothing new), READ (the home read, from
    the EXTERNAL side), FETCH (reads the home's region in place, L3 -> L2)."""
    out: dict[int, list[_Span]] = {}
    for op in kernel.body:
        if not isinstance(op, DataMove) or op.move_type == "VIEW":
            continue
        src, dst = op.source, op.destination
        roles = []
        into_home = in_home(dst, kept) or home_move(op, kept) == COPY and dst.level == "EXTERNAL"
        if dst.tensor in links and kernel.name == links[dst.tensor].writer and (
                into_home or dst.level == "EXTERNAL" and dst.tensor not in kept):
            roles.append(_Span.of(links[dst.tensor], WRITE, dst, shapes[dst.tensor]))
        if src.tensor in links and src.tensor in kernel.inputs:
            if src.level == "EXTERNAL":
                roles.append(_Span.of(links[src.tensor], READ, src, shapes[src.tensor]))
            elif in_home(src, kept):
                roles.append(_Span.of(links[src.tensor], FETCH, src, shapes[src.tensor]))
        if roles:
            out[op.op_id] = roles
    return out


def _links(program: Program, members: list[int], bindings: list[Binding]) -> dict[str, Link]:
    """The chain's link tensors: results of a member that a later member reads."""
    kernels = [program.kernels[i] for i in members]
    kept = {h.tensor for i in members for h in bindings[i].homes}
    out = {}
    for k in kernels:
        for t in k.outputs:
            if any(t in later.inputs for later in kernels[kernels.index(k) + 1:]):
                tensor, dim = program.graph.tensors[t], k.band_dim(t)
                ring = tensor.ring if t in kept and tensor.ring is not None and tensor.ring < tensor.shape[dim] else None
                out[t] = Link(t, k.name, dim, ring, tensor.size // max(tensor.shape[dim], 1))
    return out


def _reading_tiles(kernel: Kernel, binding: Binding, reads: list[int]) -> range:
    """The compute tiles that make a kernel's home reads of a link: worker 0 alone where they are
    all shared moves (one copy for every compute tile), else every one."""
    shared = kernel.shared_moves()
    return range(1) if all(op_id in shared for op_id in reads) else range(binding.workers)


def chain_tasks(stream: TaskStream, program: Program, members: list[int], bindings: list[Binding]) -> Iterator[Task]:
    """The tasks of the chain of kernels at positions `members`, merged by bands (module doc)."""
    links = _links(program, members, bindings)
    shapes = {name: t.shape for name, t in program.graph.tensors.items()}
    chain: list[_Member] = []
    for i in members:
        kernel, binding = program.kernels[i], bindings[i]
        roles = _roles(kernel, links, frozenset(h.tensor for h in binding.homes), shapes)
        for link in links.values():
            reads = [op_id for op_id, spans in roles.items() if any(s.link is link and s.role == READ for s in spans)]
            if reads:
                link.reading.update(((kernel.name, w), 0) for w in _reading_tiles(kernel, binding, reads))
        running = stream.start(kernel, binding, i, streams=(i - members[0]) * STREAMS_APART)
        chain.append(_Member(running, roles))
    done: set[str] = set()
    clock = _Clock()
    while len(done) < len(chain):
        member, item = _next(chain, stream, done, clock)
        if member is None:
            raise _stuck(program, members, chain, done)
        tid, tasks = stream.instance(member.running, item.worker, item.op, item.env, _waits(item))
        _issued(item, tid, bool(tasks), clock)
        member.went(item)
        yield from tasks
        if not member.next:
            yield from stream.finish(member.running)
            done.add(member.name)
            clock.now += 1


class _Clock:
    """Counts what may let a waiting instance go: rows written, a compute tile's reads moving on
    to a later band, a kernel of the chain done. A kernel none of whose next instances could go
    is not asked again until it moves on."""

    def __init__(self) -> None:
        self.now = 0


def _next(chain: list[_Member], stream: TaskStream, done: set[str],
          clock: _Clock) -> tuple[_Member, _Instance] | tuple[None, None]:
    """The next instance of the downstream-most kernel that has one ready, and that kernel."""
    for member in reversed(chain):
        if member.name in done or member.waiting == clock.now:
            continue
        asked = clock.now
        item = next((item for item in member.heads() if _ready(member, item, stream, done, clock)), None)
        if item is not None:
            member.waiting = None
            return member, item
        member.waiting = asked
    return None, None


def _ready(member: _Member, item: _Instance, stream: TaskStream, done: set[str], clock: _Clock) -> bool:
    op = item.op
    if not item.rows and not isinstance(op, Barrier):
        return True
    if isinstance(op, Barrier) and op.kernel is not None and op.kernel not in stream.finished:
        return False  # on a kernel of the chain still running
    for link, role, a, b, _ in item.rows:
        if role == READ:  # its compute tile has issued every read of its bands before this one
            if link.reading.get((member.name, item.worker)) != a:
                link.reading[member.name, item.worker] = a
                clock.now += 1
            if any(link.covered.get(r, 0) < link.row_elements for r in range(a, b)):
                return False
        if role == WRITE and link.ring is not None and b > a and b - link.ring > link.oldest(done):
            return False
    return True


def _waits(item: _Instance) -> set[int]:
    """The tasks an instance waits for by rows: a read for the writes of its rows, a write into
    a ring for the reads (and the writes) of the rows it replaces."""
    waits: set[int] = set()
    for link, role, a, b, _ in item.rows:
        if role == READ:
            for r in range(a, b):
                waits |= link.writers.get(r, set())
        elif role == WRITE and link.ring is not None:
            for r in range(max(a - link.ring, 0), max(b - link.ring, 0)):
                waits |= link.readers.get(r, set()) | link.writers.get(r, set())
    return waits


def _issued(item: _Instance, tid: int, ran: bool, clock: _Clock) -> None:
    """Note what the instance just issued (`ran`: tasks) did to the links' rows."""
    for link, role, a, b, elements in item.rows:
        if not ran or b <= a:
            continue
        if role == WRITE:
            for r in range(a, b):
                link.covered[r] = link.covered.get(r, 0) + elements // (b - a)
                link.writers.setdefault(r, set()).add(tid)
            clock.now += 1
        elif link.ring is not None:  # a read out of the ring: the write of the row that replaces it waits
            for r in range(a, b):
                link.readers.setdefault(r, set()).add(tid)


def _stuck(program: Program, members: list[int], chain: list[_Member], done: set[str]) -> ValueError:
    """Why no member of the chain can go on, in one line: the link whose ring is too small."""
    from .run import LoadError  # run imports this module

    names = chain_names(program, members[0])
    waiting = [(m, item) for m in chain if m.name not in done for item in m.heads()]
    for _, item in waiting:
        for link, role, a, b, _ in item.rows:
            if role == WRITE and link.ring is not None:
                held = slices_along(link.dim)
                return LoadError(f"{names}: link '{link.tensor}' keeps a ring of {link.ring} {held} in L3, too few: "
                                 f"kernel '{link.writer}' would write {held} {a} to {b - 1} while a reader may still "
                                 f"read {held[:-1]} {int(link.oldest(done))}, so no kernel of the chain can go on")
    member, item = waiting[0]
    return LoadError(f"{names}: kernel '{member.name}' op {item.op.op_id} waits for what no kernel "
                     f"of the chain will do, so none can go on")
