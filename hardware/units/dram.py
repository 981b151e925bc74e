"""External memory channel: a per-channel data rate and a fixed access latency."""

from __future__ import annotations

from ..machine import Machine


class DramChannel:
    """One DRAM channel. Its data bus is the shared resource: transfers on it serialise, but the
    access latency of one transfer overlaps the data of another (requests are pipelined)."""

    __slots__ = ("bytes_per_cycle", "latency_cycles")

    def __init__(self, machine: Machine):
        self.bytes_per_cycle = machine.external.channel_bytes_per_cycle
        self.latency_cycles = machine.external.latency_cycles
