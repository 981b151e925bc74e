"""The machine class the compiler tiles for: capacities and array size, and what to rank by.

The compiler never sees addresses; it reads a config to learn how much fits where, so the object
it writes runs on any machine at least this large, and, for an objective other than latency, the
engines' rates and the energies the loader's simulator and report take from the same config.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import ConfigError, EnergyModel, Machine, VectorUnit, load_machine

from .errors import CompileError


@dataclass(frozen=True)
class Level:
    banks: int  # banks (L2), tiles (L3) or buffers (L1) one compute tile may use
    bank_bytes: int


# what the tiler ranks candidates by (`kpu-kernel-compiler --objective`): latency, the fewest DRAM
# bytes among the tilings that keep the array fed; energy, the least pJ; edp, the least pJ x cycles
OBJECTIVES = ("latency", "energy", "edp")


@dataclass(frozen=True)
class Costs:
    """What a tiling costs beside room: bytes per cycle each link moves with all its engines, and
    pJ per MAC and per byte at each level."""

    dram_bytes_per_cycle: float  # external memory <-> L3: its channels' or the DMA engines', the lesser
    dma_engines: int
    dma_cycles_per_move: int  # besides its bytes, a DMA holds its engine for the DRAM latency
    dma_engine_bytes_per_cycle: float  # one DMA's rate: its engine's or a channel's, the lesser
    l3_l2_bytes_per_cycle: float  # the BlockMovers'
    l2_l1_bytes_per_cycle: float  # the Streamers'
    streamer_bytes_per_cycle: float  # one Streamer's: an accumulator tile drains or reloads through one
    block_mover_bytes_per_cycle: float  # one BlockMover's: a result tile goes up into L3 through one
    l2_bank_bytes_per_cycle: float  # one L2 bank's ports: each serves one move at a time, at a Streamer's rate
    energy: EnergyModel
    vector: VectorUnit  # each compute tile's: its lanes and cycles per element by op class

    def vector_cycles(self, work: dict[str, int]) -> float:
        """One vector unit's cycles for `work`, elements by op class, on all its lanes."""
        return sum(n * self.vector.cycles_per_element[kind] for kind, n in work.items()) / self.vector.lanes

    def mac_pj(self, macs: int, dtype: str, operand_bytes: int) -> float:
        """The pJ of `macs` MACs on the array in `dtype` (none without a figure for it), each with
        its two operands' register reads of `operand_bytes` each (as `hardware.energy` prices them)."""
        register = self.energy.access_pj_per_byte["register"]
        return macs * (self.energy.mac_pj.get(dtype, 0.0) + 2 * operand_bytes * register)

    def vector_pj(self, work: dict[str, int]) -> float:
        """The pJ of `work`, elements by op class, on the vector unit (as `hardware.energy` prices it)."""
        return sum(n * self.energy.vector_pj_per_element[kind] for kind, n in work.items())


@dataclass(frozen=True)
class Target:
    name: str
    rows: int
    cols: int
    compute_tiles: int
    l3: Level
    l2: Level
    l1: Level
    dataflows: tuple[str, ...]
    line_bytes: int = 1  # the binder starts every buffer on a line: each takes whole lines
    objective: str = "latency"  # one of OBJECTIVES
    costs: Costs | None = None  # what the objectives but latency rank by (None: latency only)
    # an output tile of a sliding-window op holds at most this share of its rows (a chain's member
    # that must go by bands of rows takes less than 1); None: the whole image, no less (a chain's
    # member that goes by bands of channels)
    rows_share: float | None = 1.0
    # a chain's member that reads its window input by bands of channels: its input band in L3
    # holds a chunk of them, never all (which it could not start on before the whole is written)
    reads_by_channels: bool = False
    # intermediates kept on chip (`Tensor.home`) while the kernels lowered for this target run,
    # the room of their homes already taken off the levels above: their plain tiles in L3 (and
    # those in L2, of one kept in L2) are regions of their homes, no buffers
    in_l3: frozenset[str] = frozenset()
    in_l2: frozenset[str] = frozenset()


def load_target(config: str, accelerator: str | None = None, objective: str = "latency") -> Target:
    """The target of a config file, or of a shipped config named without suffix; `accelerator`
    picks the KPU of a system-schema file that has several."""
    try:
        m = load_machine(config, accelerator)
    except ConfigError as e:
        raise CompileError(str(e)) from None
    return target_from_machine(m, objective)


def target_from_machine(m: Machine, objective: str = "latency") -> Target:
    """The target of a machine already read (by `kpu-dse`, from a config document it built)."""
    tiles = m.compute.tiles
    e, x = m.engines, m.external
    # L3 and L2 are shared: each compute tile plans with its share of the banks. The L3 tiles
    # are one address space, interleaved across them: one bank, a share of its bytes.
    return Target(
        name=m.name,
        rows=m.compute.rows,
        cols=m.compute.cols,
        compute_tiles=tiles,
        l3=Level(1, m.l3.count * m.l3.bytes // tiles),
        l2=Level(max(1, m.l2.count // tiles), m.l2.bytes),
        l1=Level(m.l1.count, m.l1.bytes),
        dataflows=m.compute.dataflows,
        line_bytes=m.line_bytes,
        objective=objective,
        costs=Costs(min(x.channels * x.channel_bytes_per_cycle, e.dma * e.dma_bytes_per_cycle), e.dma,
                    x.latency_cycles, min(e.dma_bytes_per_cycle, x.channel_bytes_per_cycle),
                    e.block_mover * e.block_mover_bytes_per_cycle, e.streamer * e.streamer_bytes_per_cycle,
                    e.streamer_bytes_per_cycle, e.block_mover_bytes_per_cycle,
                    e.streamer_bytes_per_cycle * m.l2_bank_ports, m.energy, m.vector),
    )
