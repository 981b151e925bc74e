"""Energy per operation and area per part, and what a run's counts cost in them.

Defaults are published 45 nm figures, each source beside its number; a config's optional `energy`
and `area` sections override any of them (`hardware.config`). The figures are per access, so the
model is linear in the simulator's counts:

    energy = sum over kernels of MACs x mac_pj[operand dtype]
                                + MACs x 2 x itemsize x access_pj_per_byte.register
                                + array operand bytes read from L1 x access_pj_per_byte.l1
           + sum over op classes of vector elements x vector_pj_per_element[class]
           + sum over moves of bytes x (access_pj_per_byte[source] + access_pj_per_byte[destination])

- A move reads its bytes at its source level and writes them at its destination: it costs both
  levels' access energy per byte.
- Each MAC reads its two operands from the PE's registers (the accumulator stays in the adder:
  its update is in the MAC figure).
- Each array task reads its A and B tiles from L1 once: every element enters the array once
  whatever the dataflow.
- A vector element's figure includes its operand registers; its L1 traffic is in the moves.

Area = PEs x pe_um2 + vector lanes x vector_lane_um2 + KB of each SRAM level x its mm2 per KB
       + engines x their mm2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # machine.py imports the models from here
    from .machine import Machine

# M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, 45 nm, 0.9 V.
# A MAC is one multiply and one add of its operand type (integer MACs accumulate in 32 bits).
MAC_PJ = {
    "f64": 16.6,  # no 64-bit figure: the f32 multiply x4 (width squared) and add x2: 14.8 + 1.8
    "f32": 4.6,  # 32-bit float multiply 3.7 pJ + add 0.9 pJ
    "f16": 1.5,  # 16-bit float multiply 1.1 pJ + add 0.4 pJ
    "bf16": 1.5,  # no bf16 figure: as f16 (its 8-bit mantissa multiplier is smaller still)
    "f8": 0.3,  # no f8 figure: as i8
    "i32": 3.2,  # 32-bit integer multiply 3.1 pJ + add 0.1 pJ
    "i16": 0.875,  # no 16-bit figure: the 32-bit multiply / 4 (width squared) + a 32-bit add
    "i8": 0.3,  # 8-bit integer multiply 0.2 pJ + 32-bit accumulate 0.1 pJ
    "u8": 0.3,  # as i8
}

# pJ per byte read or written at each level.
ACCESS_PJ_PER_BYTE = {
    "external": 1300 / 8,  # Horowitz 2014: DRAM, 1.3-2.6 nJ per 64-bit access; the low end
    "l3": 100 / 8,  # Horowitz 2014: 1 MB SRAM, 100 pJ per 64-bit read
    "l2": 20 / 8,  # Horowitz 2014: 32 KB SRAM, 20 pJ per 64-bit read
    "l1": 10 / 8,  # Horowitz 2014: 8 KB SRAM, 10 pJ per 64-bit read
    # Chen, Emer and Sze, "Eyeriss", ISCA 2016: a register-file access costs about one MAC;
    # Horowitz's 16-bit float MAC (1.5 pJ) per 2-byte word
    "register": 1.5 / 2,
}

# pJ per element of each vector op class, on 32-bit float lanes (the lane is an FMA-style ALU,
# as hardware.machine times it): Horowitz 2014's f32 multiply + add per simple op, four of them
# per transcendental (its 4 cycles), one f32 add per reduction step, an f32 multiply and add per
# requantize (the scale, and the rounding add; the zero point and saturation are 8-bit work, ~0).
VECTOR_PJ_PER_ELEMENT = {"simple": 4.6, "transcendental": 18.4, "reduction": 0.9, "requantize": 4.6}

# Horowitz 2014, 45 nm: 32-bit float multiplier 7,700 um2, adder 4,184 um2. A PE is one f32 MAC,
# and so is a vector lane.
PE_UM2 = 7700 + 4184
VECTOR_LANE_UM2 = 7700 + 4184

# Mistry et al., "A 45nm logic technology...", IEDM 2007: a 0.346 um2 6T SRAM cell. 8,192 cells a
# KB over an assumed 70% array efficiency (decoders, sense amplifiers), the same at every level.
SRAM_MM2_PER_KB = 8192 * 0.346 / 0.7 / 1e6

# No published figure: an estimate of a 64-byte line buffer in flip-flops and its address
# generators, the same for each kind of engine. Set your own in the config's `area` section.
ENGINE_MM2 = 0.01

LEVELS = tuple(ACCESS_PJ_PER_BYTE)
ENGINE_KINDS = ("dma", "block_mover", "streamer")


@dataclass(frozen=True)
class EnergyModel:
    """pJ per MAC by operand dtype, per byte accessed at each level, per vector element by op class."""

    mac_pj: dict[str, float] = field(default_factory=lambda: dict(MAC_PJ), hash=False)
    access_pj_per_byte: dict[str, float] = field(default_factory=lambda: dict(ACCESS_PJ_PER_BYTE), hash=False)
    vector_pj_per_element: dict[str, float] = field(default_factory=lambda: dict(VECTOR_PJ_PER_ELEMENT),
                                                    hash=False)


@dataclass(frozen=True)
class AreaModel:
    """um2 per PE and per vector lane, mm2 per KB of each on-chip level, mm2 per engine by kind."""

    pe_um2: float = PE_UM2
    vector_lane_um2: float = VECTOR_LANE_UM2
    sram_mm2_per_kb: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("l3", "l2", "l1"), SRAM_MM2_PER_KB), hash=False)
    engine_mm2: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINE_KINDS, ENGINE_MM2),
                                         hash=False)


@dataclass
class EnergyCounts:
    """What one kernel did, as the energy model charges it. `moves` maps (source level,
    destination level), named as the simulator names them (EXTERNAL, L3, ...), to bytes."""

    dtype: str  # of the array's operands
    itemsize: int  # bytes of one such operand
    macs: int = 0
    array_operand_elements: int = 0
    vector_elements: Mapping[str, int] = field(default_factory=dict)  # by op class
    moves: Mapping[tuple[str, str], int] = field(default_factory=dict)


def no_energy() -> dict[str, Any]:
    """The shape of an energy report, all zero: pJ in all, by level and by unit."""
    return {"total_pj": 0.0, "by_level": dict.fromkeys(("compute", *LEVELS), 0.0),
            "by_unit": dict.fromkeys(("array", "vector", *ENGINE_KINDS), 0.0)}


def kernel_energy(model: EnergyModel, counts: EnergyCounts,
                  engine_kind: Callable[[str, str], str]) -> dict[str, Any]:
    """pJ one kernel spent, in all and two ways that each add up to it: by level (compute: the
    MACs and vector elements; then each level's accesses) and by unit (the array with its
    operand reads, the vector unit, and the engine kind `engine_kind(src, dst)` of each move)."""
    access = model.access_pj_per_byte
    energy = no_energy()
    by_level, by_unit = energy["by_level"], energy["by_unit"]
    mac = counts.macs * model.mac_pj[counts.dtype]
    vector = sum((n * model.vector_pj_per_element[cls] for cls, n in counts.vector_elements.items()), 0.0)
    operands = {"register": counts.macs * 2 * counts.itemsize * access["register"],
                "l1": counts.array_operand_elements * counts.itemsize * access["l1"]}
    by_level["compute"] = mac + vector
    for level, pj in operands.items():
        by_level[level] += pj
    by_unit["array"] = mac + sum(operands.values())
    by_unit["vector"] = vector
    for (src, dst), nbytes in counts.moves.items():
        for level in (src.lower(), dst.lower()):
            by_level[level] += nbytes * access[level]
            by_unit[engine_kind(src, dst)] += nbytes * access[level]
    energy["total_pj"] = sum(by_level.values())
    return energy


def total_energy(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The sum of energy reports (a run's kernels'), in the same shape."""
    total = no_energy()
    for part in parts:
        total["total_pj"] += part["total_pj"]
        for view in ("by_level", "by_unit"):
            for key, pj in part[view].items():
                total[view][key] += pj
    return total


def machine_area(machine: Machine) -> dict[str, Any]:
    """The machine's area in mm2, in all and by part."""
    a, c = machine.area, machine.compute
    sram_bytes = {"l3": machine.l3.total_bytes, "l2": machine.l2.total_bytes, "l1": c.tiles * machine.l1.total_bytes}
    engines = {"dma": machine.engines.dma, "block_mover": machine.engines.block_mover,
               "streamer": machine.engines.streamer}
    by_part = {
        "array": c.peak_macs_per_cycle * a.pe_um2 / 1e6,
        "vector": c.tiles * machine.vector.lanes * a.vector_lane_um2 / 1e6,
        **{level: n / 1024 * a.sram_mm2_per_kb[level] for level, n in sram_bytes.items()},
        **{kind: n * a.engine_mm2[kind] for kind, n in engines.items()},
    }
    return {"total_mm2": sum(by_part.values()), "by_part": by_part}
