"""What a kernel asks of a machine: its buffers and its streams, per worker (compute tile).

A buffer is one stream's tile at one on-chip level, times its buffering depth. A stream is
one data move of the body run by one worker; it needs one engine of the move's kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dfx import Barrier, DataMove, Kernel, Program, itemsize
from hardware import Machine

ON_CHIP = ("L3", "L2", "L1")


def engine_kind(src: str, dst: str) -> str:
    """The unit that moves data between two levels."""
    pair = {src, dst}
    if "EXTERNAL" in pair:
        return "dma"
    if pair == {"L3", "L2"}:
        return "block_mover"
    return "streamer"  # L2 <-> L1, and the array's drain/fill REGISTER <-> L2


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


def l2_port_op(op: DataMove) -> int | None:
    """The L2 buffer a move uses the bank port of: the one it fills, or the one it drains (filled
    by the move it depends on)."""
    if op.destination.level == "L2":
        return op.op_id
    if op.source.level == "L2" and op.depends_on:
        return op.depends_on[0]
    return None


def level_banks(machine: Machine, level: str) -> tuple[int, int]:
    """(banks one worker may choose from, bytes each). L1 buffers are per compute tile. The L3
    tiles are one address space, interleaved line by line across them, so a buffer (a resident
    panel) may spread over all of them: one bank of all their bytes."""
    if level == "L3":
        return 1, machine.l3.count * machine.l3.bytes
    if level == "L2":
        return machine.l2.count, machine.l2.bytes
    return machine.l1.count, machine.l1.bytes


def op_runs(kernel: Kernel, op) -> int:
    """How many times a body op runs in the whole kernel."""
    anchor, after = op.after or op.at, op.after is not None
    live = []
    for loop in kernel.tile_loops:
        if anchor is None or (after and loop.induction_var == anchor):
            break
        live.append(loop)
        if loop.induction_var == anchor:
            break
    # a loop within blocks counts its steps over all of them: its loop over blocks adds none
    blocks = {loop.within for loop in live}
    return math.prod(loop.trip_count for loop in live if loop.induction_var not in blocks)


def kernel_demands(kernel: Kernel, program: Program, workers: int) -> tuple[list[Buffer], list[StreamReq]]:
    g = program.graph
    buffers: list[Buffer] = []
    streams: list[StreamReq] = []
    shared = kernel.shared_moves()
    for op in kernel.body:
        # a view names bytes already in external memory: no buffer, no engine
        if isinstance(op, Barrier) or (isinstance(op, DataMove) and op.move_type == "VIEW"):
            continue
        # a move fills its destination; a compute whose result stays on chip (the vector unit's
        # result tile in L1) fills that buffer; the array's accumulators (REGISTER) are no buffer
        dst = op.destination if isinstance(op, DataMove) else op.output
        tile_bytes = math.prod(dst.tile_shape) * itemsize(g.tensors[dst.tensor].dtype)
        depth = op.depth if isinstance(op, DataMove) else 1
        runs = op_runs(kernel, op)
        # a shared move is worker 0's, its one buffer read by every worker
        copies = 1 if op.op_id in shared else workers
        for w in range(copies):
            if dst.level in ON_CHIP:
                buffers.append(Buffer(op.op_id, w, dst.tensor, dst.level, tile_bytes, depth, 0, len(kernel.body)))
            if isinstance(op, DataMove):
                streams.append(StreamReq(op.op_id, w, engine_kind(op.source.level, dst.level), dst.tensor,
                                         op.source.level, dst.level, tile_bytes, max(1, runs // copies),
                                         l2_port_op(op)))
    return buffers, streams
