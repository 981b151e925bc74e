"""Barrier: a point of the program that waits for the tasks it names (its deps) on every compute
tile, so the tasks after it may start. It takes no cycles and holds no resource; its slice in the
trace marks when it was passed.
"""

from __future__ import annotations

from ..machine import Machine
from ..task import Task


class BarrierModel:
    __slots__ = ("tail_cycles",)
    timed_by = ()

    def __init__(self, machine: Machine):
        self.tail_cycles = 0

    def cycles(self, task: Task) -> int:
        return 0
