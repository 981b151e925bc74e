"""The concrete machine: one KPU as the loader and the simulator see it.

All sizes are bytes, all rates bytes per cycle of the config clock. `hardware.config`
builds a `Machine` from the flat kpu-sim schema plus our optional `timing` section.
"""

from __future__ import annotations

from dataclasses import dataclass

DATAFLOWS = ("output_stationary", "weight_stationary", "input_stationary")


@dataclass(frozen=True)
class ExternalMemory:
    channels: int  # kpu-sim `bank_count`: independent DRAM channels
    channel_bytes: int
    channel_bytes_per_cycle: float  # bandwidth_gbps / clock_ghz
    latency_cycles: int


@dataclass(frozen=True)
class MemoryLevel:
    """A software-managed on-chip level: `count` equal banks/tiles/buffers of `bytes` each."""

    count: int
    bytes: int

    @property
    def total_bytes(self) -> int:
        return self.count * self.bytes


@dataclass(frozen=True)
class Engines:
    dma: int  # external memory <-> L3
    block_mover: int  # L3 <-> L2
    streamer: int  # L2 <-> L1
    dma_bytes_per_cycle: float
    block_mover_bytes_per_cycle: float
    streamer_bytes_per_cycle: float


@dataclass(frozen=True)
class ComputeFabric:
    tiles: int
    rows: int
    cols: int
    dataflows: tuple[str, ...]  # the stationarity modes the array supports

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.tiles * self.rows * self.cols


@dataclass(frozen=True)
class Machine:
    name: str
    clock_ghz: float
    external: ExternalMemory
    l3: MemoryLevel  # L3 tiles, shared by all compute tiles
    l2: MemoryLevel  # L2 banks, shared by all compute tiles
    l1: MemoryLevel  # L1 streaming buffers of ONE compute tile (each tile has its own)
    l2_bank_ports: int  # streams one L2 bank serves at once
    line_bytes: int  # allocation alignment at every on-chip level
    engines: Engines
    compute: ComputeFabric
