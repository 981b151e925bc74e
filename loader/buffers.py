"""What a kernel asks of a machine: its buffers and its streams, per worker (compute tile).

A buffer is one stream's tile at one on-chip level, times its buffering depth; a load into L2
more than one deep may be a buffer per slot (`kernel_demands`), which the binder may place in
different banks. A stream is one data move of the body run by one worker; it needs one
engine of the move's kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dfx import (Barrier, DataMove, Home, Kernel, Program, Resident, first_fit, freed, home_bytes, in_lines, itemsize,
                 l2_piece, pack_homes)
from hardware import Machine

from .schedule import workers_for

ON_CHIP = ("L3", "L2", "L1")


def engine_kind(src: str, dst: str) -> str:
    """The unit that moves data between two levels."""
    pair = {src, dst}
    if "EXTERNAL" in pair:
        return "dma"
    if pair <= {"L3", "L2"}:  # and within L3: a tensor's home into a padded band
        return "block_mover"
    return "streamer"  # L2 <-> L1, and the array's drain/fill REGISTER <-> L2


IN_PLACE, COPY = "in place", "copy"


def home_move(op: DataMove, homes: frozenset[str], in_l2: frozenset[str] = frozenset()) -> str | None:
    """How a move between external memory and L3 of a tensor kept in L3 (`homes`) runs: IN_PLACE
    where its L3 tile is plain, that region of the home (no task, no buffer of its own); COPY
    where it is a padded band, which a BlockMover fills from the home, writing the padding. Of a
    tensor kept in L2 (`in_l2`), a move between external memory and L3 or between L3 and L2 runs
    IN_PLACE: its L2 tile is that region of the home (the validator has made its tiles plain),
    and nothing of it lies in L3 or external memory. None for any other move."""
    src, dst = op.source, op.destination
    if op.move_type != "VIEW" and dst.tensor in in_l2 and {src.level, dst.level} <= {"EXTERNAL", "L3", "L2"}:
        return IN_PLACE
    if op.move_type == "VIEW" or not ((src.level == "EXTERNAL" and src.tensor in homes)
                                      or (dst.level == "EXTERNAL" and dst.tensor in homes)):
        return None
    l3 = dst if dst.level == "L3" else src
    return COPY if l3.padding is not None else IN_PLACE


def move_levels(op: DataMove, homes: frozenset[str]) -> tuple[str, str]:
    """The levels a move runs between: a home in L3 stands for external memory."""
    src, dst = op.source.level, op.destination.level
    if home_move(op, homes) is not None:
        return ("L3" if src == "EXTERNAL" else src), ("L3" if dst == "EXTERNAL" else dst)
    return src, dst


def in_home(ref, homes: frozenset[str], in_l2: frozenset[str] = frozenset()) -> bool:
    """Whether an L3 tile of a tensor kept in L3 (`homes`) is its home's region rather than a
    buffer; an L2 tile of one kept in L2 (`in_l2`) is, and an L3 tile of it is nothing."""
    if ref.tensor in in_l2 and ref.level in ("L3", "L2"):
        return True
    return ref.level == "L3" and ref.tensor in homes and ref.padding is None


@dataclass(frozen=True)
class Buffer:
    op_id: int  # the data move (or vector compute) that fills it
    worker: int
    tensor: str
    level: str  # L3 | L2 | L1
    tile_bytes: int
    depth: int
    # when it is live, in steps of the kernel's body; buffers whose spans overlap may not share
    # bytes. Inside one loop nest every buffer is live throughout: (0, len(body)).
    live_start: int = 0
    live_end: int = 1
    # which of its move's slots (a load `depth` deep into L2 is a buffer per slot, `kernel_demands`),
    # None for a buffer of all its slots
    slot: int | None = None

    @property
    def bytes(self) -> int:
        return self.tile_bytes * self.depth

    @property
    def owner(self) -> int:
        """Whose banks it may use: its worker's for L1 (per compute tile), -1 for shared L3/L2."""
        return self.worker if self.level == "L1" else -1


@dataclass(frozen=True)
class StreamReq:
    op_id: int
    worker: int
    kind: str  # dma | block_mover | streamer
    tensor: str
    src_level: str
    dst_level: str
    bytes_per_tile: int
    tiles: int  # how many times it runs in the kernel (for load balancing)
    l2_buffer: int | None  # op_id of the L2 buffer whose bank port it uses (same worker)


def level_banks(machine: Machine, level: str) -> tuple[int, int]:
    """(banks one worker may choose from, bytes each). L1 buffers are per compute tile. The L3
    tiles are one address space, interleaved line by line across them, so a buffer (a resident
    panel) may spread over all of them: one bank of all their bytes."""
    if level == "L3":
        return 1, machine.l3.count * machine.l3.bytes
    if level == "L2":
        return machine.l2.count, machine.l2.bytes
    return machine.l1.count, machine.l1.bytes


def kernel_demands(kernel: Kernel, program: Program, workers: int, homes: frozenset[str] = frozenset(),
                   line: int | None = None, in_l2: frozenset[str] = frozenset()) -> tuple[list[Buffer], list[StreamReq]]:
    """Its buffers and streams on `workers` compute tiles, the tensors `homes` kept in L3 and
    `in_l2` in L2. With
    the machine's `line`, a load more than one deep into L2 whose tile is whole lines (so its
    slots take the lines the compiler counted for all of them) is a buffer per slot, but in a
    chain, whose members are bound one by one and run at once (MobileNet v1's first chain took
    40% longer with its members' slots parted)."""
    g = program.graph
    buffers: list[Buffer] = []
    streams: list[StreamReq] = []
    shared = kernel.shared_moves()
    slots = line is not None and not any(kernel.name in chain for chain in program.chains)
    for op in kernel.body:
        # a view names bytes already in external memory: no buffer, no engine
        if isinstance(op, Barrier) or (isinstance(op, DataMove) and op.move_type == "VIEW"):
            continue
        # a move in place between a home and its region holds nothing and runs on no engine
        if isinstance(op, DataMove) and home_move(op, homes, in_l2) == IN_PLACE:
            continue
        # a move fills its destination; a compute whose result stays on chip (the vector unit's
        # result tile in L1) fills that buffer; the array's accumulators (REGISTER) are no buffer
        dst = op.destination if isinstance(op, DataMove) else op.output
        tile_bytes = math.prod(dst.tile_shape) * itemsize(g.tensors[dst.tensor].dtype)
        # a shared move is worker 0's, its one buffer read by every worker; outside the parallel
        # loop, each worker runs every step, inside it they share them
        copies = 1 if op.op_id in shared else workers
        runs = kernel.runs(op)
        if kernel.in_parallel_loop(op):
            runs //= copies
        for w in range(copies):
            if slots and op.depth > 1 and dst.level == "L2" and isinstance(op, DataMove) and op.move_type == "LOAD" \
                    and tile_bytes % line == 0:
                # the binder may put the slots in different banks: the move filling one and the
                # one draining the other then go through two banks' ports
                buffers += [Buffer(op.op_id, w, dst.tensor, "L2", tile_bytes, 1, 0, len(kernel.body), slot)
                            for slot in range(op.depth)]
            elif dst.level in ON_CHIP and not in_home(dst, homes, in_l2):
                buffers.append(Buffer(op.op_id, w, dst.tensor, dst.level, tile_bytes, op.depth, 0, len(kernel.body)))
            if isinstance(op, DataMove):
                src_level, dst_level = move_levels(op, homes)
                streams.append(StreamReq(op.op_id, w, engine_kind(src_level, dst_level), dst.tensor,
                                         src_level, dst_level, tile_bytes, max(1, runs), op.l2_port()))
    return buffers, streams


def l2_home_layout(program: Program, machine: Machine) -> list[Home]:
    """Where in L2 the tensors the object keeps there live: each in an equal piece at the top of
    every bank (`dfx.l2_piece`), below the pieces of those live beside it (`dfx.pack_homes`, each
    bank standing for all), while the L2 buffers of every kernel of its span, on all the compute
    tiles each can use, still pack into the banks below (first fit, largest first); a tensor
    the machine has no room for is left out and goes through L3 and external memory. Its tiles
    in the kernels that write and read it are regions of its home, no buffers: the room each
    kernel needs is counted with the tensors taken so far in their homes, again, with those left
    out no longer counted, until every one counted is taken (one taken but not counted had its
    tiles counted as buffers: room to spare)."""
    kept = [t for t in program.graph.tensors.values() if t.home == "L2"]
    if not kept:
        return []
    kernels, spans = program.kernels, program.spans()
    banks, capacity = level_banks(machine, "L2")
    line = machine.line_bytes
    wanted = []
    for t in kept:
        first = next(i for i, k in enumerate(kernels) if t.name in k.outputs)
        last = max(i for i, k in enumerate(kernels) if t.name in k.inputs)
        wanted.append((first, Resident(t.name, l2_piece(home_bytes(t), banks, line), spans[first][0], spans[last][1])))
    wanted = [r for _, r in sorted(wanted, key=lambda w: w[0])]
    counted = frozenset(t.name for t in kept)
    while True:
        sizes = [[in_lines(b.bytes, line) for b in kernel_demands(k, program, workers_for(k, machine.compute.tiles),
                                                                  line=line, in_l2=counted)[0] if b.level == "L2"]
                 for k in kernels]
        demands = [_bank_room([s for j in range(first, last + 1) for s in sizes[j]], banks, capacity, line)
                   for first, last in spans]
        homes = pack_homes(wanted, demands, capacity, line)
        taken = frozenset(h.tensor for h in homes)
        if counted <= taken:
            return homes
        counted &= taken


def _bank_room(sizes: list[int], banks: int, capacity: int, line: int) -> int:
    """The fewest bytes (whole lines) a bank must have for `sizes` to pack into `banks` of them
    (`dfx.first_fit`); past `capacity` where even that does not hold them."""
    low, high = max(sizes, default=0) // line, capacity // line
    if not first_fit(sizes, banks, high * line):
        return capacity + line
    while low < high:  # the fewest lines that pack
        mid = (low + high) // 2
        low, high = (low, mid) if first_fit(sizes, banks, mid * line) else (mid + 1, high)
    return low * line


def home_layout(program: Program, machine: Machine, in_l2: frozenset[str] = frozenset()) -> list[Home]:
    """Where in L3 the tensors the object keeps there live (`dfx.pack_homes`), each kernel
    needing the L3 bytes of its buffers on all the compute tiles it can use; a tensor the
    machine has no room for is left out: it stays in external memory, the moves naming its home
    running as the DMA's. A ring takes its slices' bytes (`dfx.home_bytes`); a kernel's plain L3
    tiles of a kept tensor lie in its home (`Resident.frees`). The kernels of a chain
    run at once: a home is held across the whole chain of its writer and of its last reader, and
    each of them needs room for the buffers of all. The tensors `in_l2` kept in L2
    (`l2_home_layout`) have no L3 tiles."""
    kernels = program.kernels
    spans = program.spans()
    kept = [t for t in program.graph.tensors.values() if t.home == "L3"]
    if not kept:
        return []
    count, capacity = level_banks(machine, "L3")
    line = machine.line_bytes

    def l3(k: Kernel, homes: frozenset[str] = frozenset()) -> int:
        return sum(in_lines(b.bytes, line) for b in kernel_demands(k, program, workers_for(k, machine.compute.tiles),
                                                                   homes, in_l2=in_l2)[0] if b.level == "L3")

    own = [l3(k) for k in kernels]
    demands = [sum(own[first:last + 1]) for first, last in spans]
    wanted = []
    for t in kept:
        first = next(i for i, k in enumerate(kernels) if t.name in k.outputs)
        last = max(i for i, k in enumerate(kernels) if t.name in k.inputs)
        frees = freed({j: own[j] - l3(k, frozenset({t.name})) for j, k in enumerate(kernels)
                       if t.name in k.inputs or t.name in k.outputs}, spans)
        wanted.append((first, Resident(t.name, home_bytes(t), spans[first][0], spans[last][1], frees)))
    return pack_homes([r for _, r in sorted(wanted, key=lambda w: w[0])], demands, capacity, line)
