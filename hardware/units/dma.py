"""DMA engine: external memory <-> L3.

cycles = latency + ceil(bytes / min(dma_bytes_per_cycle, channel_bytes_per_cycle)).
The engine is held for all of it. The DRAM channel is held only for the data transfer: we model a
task as [transfer on the channel][latency tail], which equals the real [latency][data] in total
time and in channel occupancy, because DRAM pipelines one request's latency under another's data.
So two DMAs on one channel take 2 * transfer + latency, not 2 * (transfer + latency).
"""

from __future__ import annotations

from ..machine import Machine
from ..task import Task
from .bandwidth import Bandwidth
from .dram import DramChannel


class DmaModel:
    __slots__ = ("tail_cycles", "_rate")
    timed_by = ("bytes",)

    def __init__(self, machine: Machine):
        channel = DramChannel(machine)
        self.tail_cycles = channel.latency_cycles
        self._rate = Bandwidth(min(machine.engines.dma_bytes_per_cycle, channel.bytes_per_cycle))

    def cycles(self, task: Task) -> int:
        return self.tail_cycles + self._rate.cycles(task.bytes)
