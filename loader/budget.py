"""What a run will cost, told before it starts: host memory and tile ops.

A functional run keeps every graph tensor in host memory as a whole numpy array and steps
through every tile op twice (timing, then values). A problem too large for memory would fail
with numpy's ArrayMemoryError after the whole simulation; a very long one would give no sign.
Every run, timing only or a dry run too, simulates every tile op, and a small object can ask
for a great many (a large GEMM re-tiled to tiny tiles): `check_tile_ops` refuses a program above
a limit the user may raise, before anything is bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from dfx import Compute, Kernel, Program, accumulation_dtype, itemsize

from .binding import Binding

# Tile ops a functional run gets through per second, timing and values together: measured on a
# 2-core AMD EPYC (Python 3.11) with 1024^3 f32 GEMMs on `standard` and `minimal`, which simulate
# about 60,000 tile ops/s and compute values at 210,000-330,000 tile ops/s.
TILE_OPS_PER_SECOND = 50_000
LONG_RUN_SECONDS = 60  # a run expected to take longer than this is announced


class BudgetError(ValueError):
    """A program of more tile ops than allowed; str(e) is one line."""


def tile_ops(program: Program) -> int:
    """Body-op runs over all kernels, as the progress bar counts them."""
    return sum(k.runs(op) for k in program.kernels for op in k.body)


def check_tile_ops(program: Program, limit: int, where: str) -> None:
    """BudgetError when the program runs more than `limit` tile ops; `where` names it."""
    ops = tile_ops(program)
    if ops > limit:
        time = _size(ops / TILE_OPS_PER_SECOND, _TIME_UNITS)
        raise BudgetError(f"{where}: {ops:,} tile ops to simulate ({time} with values), more than "
                          f"the {limit:,} allowed; --max-tile-ops {ops} runs it")


@dataclass(frozen=True)
class Budget:
    host_bytes: int  # every graph tensor at its numpy dtype, plus the largest kernel's tiles
    tile_ops: int  # body-op runs over all kernels, as the progress bar counts them

    @property
    def seconds(self) -> float:
        return self.tile_ops / TILE_OPS_PER_SECOND


def _tile_bytes(kernel: Kernel, program: Program, workers: int) -> int:
    """Host bytes a kernel's execution adds to the tensors: a compute's input tiles converted to
    the accumulation dtype and its result tile, per worker. Moved tiles are views of the tensors."""
    g = program.graph
    acc = itemsize(accumulation_dtype([g.tensors[n].dtype for n in kernel.inputs + kernel.outputs]))
    elements = [sum(math.prod(r.tile_shape) for r in [*op.inputs, op.output])
                for op in kernel.body if isinstance(op, Compute)]
    return workers * acc * max(elements, default=0)


def estimate(program: Program, bindings: Sequence[Binding] | None = None) -> Budget:
    """The cost of a functional run; `bindings` give each kernel's workers (default 1 each)."""
    workers = [b.workers for b in bindings] if bindings else [1] * len(program.kernels)
    tensors = sum(t.size * itemsize(t.dtype) for t in program.graph.tensors.values())
    tiles = max((_tile_bytes(k, program, w) for k, w in zip(program.kernels, workers)), default=0)
    return Budget(tensors + tiles, tile_ops(program))


def available_memory() -> int | None:
    """Memory the run can take, in bytes: Linux's MemAvailable (free memory plus the page cache it
    can drop), else free physical pages; None where the platform cannot say (nothing is refused)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name (macOS)
        return None
    return free if free > 0 else None  # sysconf answers -1 when it does not know


@dataclass(frozen=True)
class Advice:
    fatal: bool  # True: do not start the functional run; False: warn and go on
    message: str  # one line naming `where`


_TIME_UNITS = [("days", 86400), ("hours", 3600), ("minutes", 60), ("seconds", 1)]


def _size(n: float, units: Sequence[tuple[str, float]]) -> str:
    """`n` in the largest of `units` it reaches (the last one otherwise)."""
    unit, scale = next(((u, s) for u, s in units if n >= s), units[-1])
    if n < scale:  # below the smallest unit: "under 1 second", never "about 0 seconds"
        return f"under 1 {unit.rstrip('s')}"
    return f"about {n / scale:,.{1 if scale > 1 else 0}f} {unit}"


def advise(budget: Budget, where: str, available: int | None = None) -> Advice | None:
    """An error if the run cannot fit in host memory, a warning if it will be long, else None.
    `available` defaults to `available_memory()`."""
    available = available_memory() if available is None else available
    gib = [("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1)]
    if available is not None and budget.host_bytes > available:
        return Advice(True, f"{where}: computing values needs about {_size(budget.host_bytes, gib)} of host "
                            f"memory, {_size(available, gib)} is free; use --timing-only for the cycles alone")
    if budget.seconds > LONG_RUN_SECONDS:
        time = _size(budget.seconds, _TIME_UNITS)
        return Advice(False, f"{where}: {budget.tile_ops:,} tile ops to simulate and compute, {time} at "
                             f"{TILE_OPS_PER_SECOND:,} tile ops/s; --timing-only skips the values")
    return None
