"""A binding: where each buffer lives and which engine runs each stream, for one kernel.

`bind_greedy` is the baseline (first fit, round-robin engines) and the fallback when CP-SAT
finds nothing within its work limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from collections.abc import Callable

from dfx import Home, in_lines
from hardware import Machine, move_timer

from .buffers import Buffer, StreamReq, level_banks


class BindError(ValueError):
    """No binding exists; str(e) names the level and the bytes short."""


@dataclass(frozen=True)
class BoundBuffer:
    buffer: Buffer
    bank: int  # L3 tile, L2 bank or L1 buffer index (L1: within the worker's compute tile)
    address: int  # byte offset inside that bank

    @property
    def end(self) -> int:
        return self.address + self.buffer.bytes


@dataclass
class Binding:
    kernel: str
    workers: int
    buffers: list[BoundBuffer]
    engines: dict[tuple[int, int], int]  # (op_id, worker) -> engine index of the stream's kind
    method: str  # "cp-sat" or "greedy"
    makespan_estimate: int = 0  # the most-loaded engine's or bank port's estimated cycles
    bind_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # the tensors kept in L3 while the kernel runs (`buffers.home_layout`): its L3 buffers lie
    # below all of them
    homes: list[Home] = field(default_factory=list)
    # those kept in L2 (`buffers.l2_home_layout`): its L2 buffers lie below them in every bank
    l2_homes: list[Home] = field(default_factory=list)


# one bank of each level, and several; L3's tiles are one address space (buffers.level_banks)
UNIT_NAME = {"L3": ("L3 (its tiles interleaved as one)",) * 2, "L2": ("L2 bank", "L2 banks"),
             "L1": ("L1 buffer", "L1 buffers")}


def _kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


def check_capacity(kernel: str, buffers: list[Buffer], machine: Machine, where: str) -> None:
    """Fail with the one-line message when a buffer cannot fit its level at all."""
    for level in ("L3", "L2", "L1"):
        mine = [b for b in buffers if b.level == level]
        if not mine:
            continue
        count, size = level_banks(machine, level)
        one, many = UNIT_NAME[level]
        biggest = max(b.bytes for b in mine)
        if biggest > size:
            raise BindError(f"{where}: kernel '{kernel}' needs {_kib(biggest)} in one {one}, "
                            f"config '{machine.name}' has {_kib(size)} {many}")
        workers = max(b.worker for b in mine) + 1
        need = sum(b.bytes for b in mine) // (workers if level == "L1" else 1)
        have = count * size
        if need > have:
            raise BindError(f"{where}: kernel '{kernel}' needs {_kib(need)} of {level}, "
                            f"config '{machine.name}' has {_kib(have)} ({_kib(need - have)} short)")


def stream_cycles(streams: list[StreamReq], machine: Machine) -> list[int]:
    """Each stream's engine cycles over the kernel, timed as the simulator times its moves."""
    timer: Callable[[str, int], int] = move_timer(machine)
    return [timer(s.kind, s.bytes_per_tile) * s.tiles for s in streams]


def engine_count(kind: str, machine: Machine) -> int:
    return {"dma": machine.engines.dma, "block_mover": machine.engines.block_mover,
            "streamer": machine.engines.streamer}[kind]


def port_loads(buffers: list[Buffer], streams: list[StreamReq], per_stream: list[int]) -> dict[int, int]:
    """Index of each L2 buffer -> the load (`per_stream`, by stream index) of the streams using its
    bank's port: a stream's whole, or of a double-buffered one parted by slots, an equal share
    for each slot (it uses them in turn)."""
    l2: dict[tuple[int, int], list[int]] = {}
    for i, b in enumerate(buffers):
        if b.level == "L2":
            l2.setdefault((b.op_id, b.worker), []).append(i)
    loads: dict[int, int] = {}
    for s, load in zip(streams, per_stream):
        slots = l2.get((s.l2_buffer, s.worker), [])
        for i in slots:
            loads[i] = loads.get(i, 0) + -(-load // len(slots))
    return loads


def estimate_makespan(binding: Binding, streams: list[StreamReq], machine: Machine) -> int:
    """Cycles of the most-loaded engine or L2 bank port under a binding (any binder's; both
    keep `binding.buffers` in the kernel's buffer order)."""
    cycles = stream_cycles(streams, machine)
    loads: dict[tuple[str, int], int] = {}
    for s, c in zip(streams, cycles):
        key = (s.kind, binding.engines[s.op_id, s.worker])
        loads[key] = loads.get(key, 0) + c
    for i, c in port_loads([bb.buffer for bb in binding.buffers], streams, cycles).items():
        key = ("l2bank", binding.buffers[i].bank)
        loads[key] = loads.get(key, 0) + c
    ports = machine.l2_bank_ports
    return max((-(-v // ports) if kind == "l2bank" else v for (kind, _), v in loads.items()), default=0)


def bind_greedy(kernel: str, workers: int, buffers: list[Buffer], streams: list[StreamReq],
                machine: Machine, where: str) -> Binding:
    """First fit of buffers in order; engines of each kind dealt round-robin to streams."""
    check_capacity(kernel, buffers, machine, where)
    fill: dict[tuple[str, int, int], int] = {}  # (level, L1 owner worker or -1, bank) -> bytes used
    bound: list[BoundBuffer] = []
    for b in buffers:
        count, size = level_banks(machine, b.level)
        owner = b.owner
        for bank in range(count):
            used = fill.get((b.level, owner, bank), 0)
            if used + b.bytes <= size:
                bound.append(BoundBuffer(b, bank, used))
                fill[b.level, owner, bank] = in_lines(used + b.bytes, machine.line_bytes)
                break
        else:
            raise BindError(f"{where}: kernel '{kernel}': greedy first fit cannot place "
                            f"{_kib(b.bytes)} of '{b.tensor}' in {b.level}")
    engines: dict[tuple[int, int], int] = {}
    next_engine: dict[str, int] = {}
    for s in streams:
        i = next_engine.get(s.kind, 0)
        engines[s.op_id, s.worker] = i
        next_engine[s.kind] = (i + 1) % engine_count(s.kind, machine)
    binding = Binding(kernel, workers, bound, engines, "greedy")
    binding.makespan_estimate = estimate_makespan(binding, streams, machine)
    return binding


def reusing(binder: Callable[..., Binding]) -> Callable[..., Binding]:
    """The binder, binding a kernel whose demands on a machine match an earlier one's, tensor
    names aside, as that one was bound, without solving again: networks repeat their blocks
    (light resnet50's 59 kernels are 34 bindings), and each binder is deterministic and reads
    names only for its messages. Each call gets a binding of its own to amend."""
    found: dict[tuple, Binding] = {}

    def bind(kernel: str, workers: int, buffers: list[Buffer], streams: list[StreamReq], machine: Machine,
             where: str) -> Binding:
        names: dict[str, int] = {}
        key = (workers, machine,
               tuple(replace(b, tensor=names.setdefault(b.tensor, len(names))) for b in buffers),
               tuple(replace(s, tensor=names.setdefault(s.tensor, len(names))) for s in streams))
        if key not in found:
            found[key] = binder(kernel, workers, buffers, streams, machine, where)
        first = found[key]
        return Binding(kernel, workers, [BoundBuffer(b, bb.bank, bb.address) for b, bb in zip(buffers, first.buffers)],
                       dict(first.engines), first.method, first.makespan_estimate, notes=list(first.notes))

    return bind
