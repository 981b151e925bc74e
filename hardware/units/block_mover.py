"""BlockMover: L3 <-> L2, identity or transpose.

cycles = ceil(bytes / block_mover_bytes_per_cycle). A transpose costs the same: the mover reads
and writes whole lines either way and only permutes addresses, so its bandwidth is unchanged.
Holds its L2 bank port for the whole transfer.
"""

from __future__ import annotations

from ..machine import Machine
from ..task import Task
from .bandwidth import Bandwidth


class BlockMoverModel:
    __slots__ = ("tail_cycles", "_rate")
    timed_by = ("bytes",)

    def __init__(self, machine: Machine):
        self.tail_cycles = 0
        self._rate = Bandwidth(machine.engines.block_mover_bytes_per_cycle)

    def cycles(self, task: Task) -> int:
        return self._rate.cycles(task.bytes)
