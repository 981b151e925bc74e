"""Streamer: L2 <-> L1 (row stream of A, column stream of B) and the drain REGISTER -> L2.

cycles = ceil(bytes / streamer_bytes_per_cycle). Holds its L2 bank port for the whole transfer.
"""

from __future__ import annotations

from ..machine import Machine
from ..task import Task
from .bandwidth import Bandwidth


class StreamerModel:
    __slots__ = ("tail_cycles", "_rate")
    timed_by = ("bytes",)

    def __init__(self, machine: Machine):
        self.tail_cycles = 0
        self._rate = Bandwidth(machine.engines.streamer_bytes_per_cycle)

    def cycles(self, task: Task) -> int:
        return self._rate.cycles(task.bytes)
