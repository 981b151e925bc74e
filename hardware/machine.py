"""The concrete machine: one KPU as the loader and the simulator see it.

All sizes are bytes, all rates bytes per cycle of the config clock. `hardware.config`
builds a `Machine` from either of kpu-sim's schemas (flat, or system) plus our optional `timing`
section.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from .energy import AreaModel, EnergyModel

DATAFLOWS = ("output_stationary", "weight_stationary", "input_stationary")

# Cycles one vector lane spends per element of each op class, unless the config says otherwise.
# A lane is a pipelined FMA-style ALU: one simple op (add, mul, compare, select, max, convert) per
# cycle. Transcendentals (exp, log, tanh, erf, divide, rsqrt...) run as a short polynomial or a
# table lookup plus a refinement step, a few dependent ops: 4. A reduction step is one add or max
# into the running value per element reduced: 1. A requantize (an i32 sum scaled in f32, rounded,
# offset by a zero point, saturated to 8 bits) is one pass of a fused stage, as int8 accelerators
# have it at the array's output (NVDLA's SDP converter, Arm Ethos-U's output unit): 1.
VECTOR_CYCLES_PER_ELEMENT = MappingProxyType({"simple": 1, "transcendental": 4, "reduction": 1, "requantize": 1})
VECTOR_OP_CLASSES = tuple(VECTOR_CYCLES_PER_ELEMENT)

# MACs one PE of the array does per cycle, by the dtype of its operands, unless the config says
# otherwise: one in every dtype, as kpu-sim models its PE. A PE that packs four 8-bit products into
# its 32-bit operand path (as x86's VNNI VPDPBUSD and Arm's SDOT do per 32-bit lane) is i8 and u8
# at 4: K streams through it four elements a cycle.
ARRAY_MACS_PER_PE_CYCLE = MappingProxyType(
    {dtype: 1 for dtype in ("f64", "f32", "f16", "bf16", "f8", "i32", "i16", "i8", "u8")})


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
    # dtype of the operands -> MACs one PE does per cycle; out of the hash, as a dict has none
    macs_per_pe_cycle: dict[str, int] = field(default_factory=lambda: dict(ARRAY_MACS_PER_PE_CYCLE), hash=False)

    @property
    def peak_macs_per_cycle(self) -> int:
        """Of all the arrays, at one MAC per PE per cycle (operands of a dtype packed several to a
        PE go that many times faster: `macs_per_pe_cycle`)."""
        return self.tiles * self.rows * self.cols


@dataclass(frozen=True)
class VectorUnit:
    """The vector unit of ONE compute tile (each tile has its own, beside its array): `lanes`
    elements at a time, each taking `cycles_per_element[op class]` cycles."""

    lanes: int
    # every class of VECTOR_OP_CLASSES; out of the hash, as a dict has none (equality still sees it)
    cycles_per_element: dict[str, int] = field(default_factory=lambda: dict(VECTOR_CYCLES_PER_ELEMENT),
                                               hash=False)


@dataclass(frozen=True)
class HostLink:
    """The link between the host and the KPU (PCIe, CXL). A program's inputs cross it before the
    run and its outputs after, one direction at a time; the loader times that apart from the
    kernels' cycles, which start with the inputs already in external memory."""

    bytes_per_cycle: float  # each direction: bandwidth_gbps / clock_ghz
    latency_cycles: int = 0  # before the first byte of each crossing


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
    # The vector unit of each compute tile. Left out, it gets the default rates and one lane per
    # array column, so it keeps up with the array's output rate; __post_init__ fills it in, so a
    # Machine's `vector` is never None.
    vector: VectorUnit = None  # type: ignore[assignment]
    host_link: HostLink | None = None  # None: the config describes no host link
    energy: EnergyModel = field(default_factory=EnergyModel)
    area: AreaModel = field(default_factory=AreaModel)

    def __post_init__(self) -> None:
        if self.vector is None:
            object.__setattr__(self, "vector", VectorUnit(self.compute.cols))  # frozen: only here

    def unit_counts(self) -> dict[str, int]:
        """How many units of each kind it has: its DMA engines, BlockMovers and Streamers, and on
        each compute tile an array, a vector unit and a barrier (sync) unit."""
        e, tiles = self.engines, self.compute.tiles
        return {"dma": e.dma, "block_mover": e.block_mover, "streamer": e.streamer,
                "array": tiles, "vector": tiles, "barrier": tiles}

    def view(self) -> dict[str, Any]:
        """The machine as JSON values: every level, engine and rate, in bytes and cycles of
        `clock_ghz`. An unlimited rate is "unlimited", as configs write it (JSON has no infinity)."""
        x, e, c = self.external, self.engines, self.compute
        link = self.host_link
        return {
            "name": self.name,
            "clock_ghz": self.clock_ghz,
            "line_bytes": self.line_bytes,
            "levels": {
                "external": {"count": x.channels, "bytes": x.channel_bytes,
                             "bytes_per_cycle": _rate(x.channel_bytes_per_cycle), "latency_cycles": x.latency_cycles},
                "l3": {"count": self.l3.count, "bytes": self.l3.bytes},
                "l2": {"count": self.l2.count, "bytes": self.l2.bytes, "ports": self.l2_bank_ports},
                "l1": {"count": self.l1.count, "bytes": self.l1.bytes, "per_compute_tile": True},
            },
            "engines": {
                "dma": {"count": e.dma, "bytes_per_cycle": _rate(e.dma_bytes_per_cycle)},
                "block_mover": {"count": e.block_mover, "bytes_per_cycle": _rate(e.block_mover_bytes_per_cycle)},
                "streamer": {"count": e.streamer, "bytes_per_cycle": _rate(e.streamer_bytes_per_cycle)},
            },
            "compute": {"tiles": c.tiles, "rows": c.rows, "cols": c.cols, "dataflows": list(c.dataflows),
                        "peak_macs_per_cycle": c.peak_macs_per_cycle, "macs_per_pe_cycle": dict(c.macs_per_pe_cycle)},
            "vector": {"lanes": self.vector.lanes, "cycles_per_element": dict(self.vector.cycles_per_element)},
            "host_link": None if link is None else {"bytes_per_cycle": link.bytes_per_cycle,
                                                    "latency_cycles": link.latency_cycles},
            "energy": asdict(self.energy),
            "area": asdict(self.area),
        }


def _rate(bytes_per_cycle: float) -> float | str:
    return "unlimited" if bytes_per_cycle == float("inf") else bytes_per_cycle
