"""Machine configs: kpu-sim's two schemas, flat and system, plus our optional `timing`, `energy`
and `area` sections.

`load_machine(path, accelerator=None)` reads a `.json`, `.yaml` or `.yml` file, or a shipped config
by name; `machine_from_dict(document, source, accelerator=None)` takes an already parsed document.
Both return a `hardware.machine.Machine` or raise `ConfigError`, whose message is one line naming
the file, the dotted key (or the line) and the reason:

    configs/x.json: on_chip_memory.l2.bank_count: must be a positive integer up to 1048576, got 0

`read_document_file(path, what, max_bytes)` and `read_document(text, suffix, source)` are
load_machine's JSON and YAML reader, with the limits on size, nesting, keys, integers and YAML
features given below; kpu-dse reads its sweep specs with them.

A document with a top-level `system` or `accelerators` key is read as the system schema (second
table below); any other as the flat schema (first table). Units follow kpu-sim: KB = 1024 bytes,
MB = 1024 KB, bandwidth in GB/s = 1e9 bytes per second.
Unknown keys are errors everywhere except inside `address_map`; booleans are never numbers.
YAML is read as YAML 1.1, so write large floats with a dot (`1.0e9`; a bare `1e9` is a string).

A config file is a regular file (never a FIFO or a device) of at most 32 KB of UTF-8, nested
at most 16 levels, with no key twice in a mapping and no integer literal longer than 64
characters; YAML anchors and aliases are refused, as are tags other than YAML's own (such as `!!python/object`). Every number is bounded so that the
machine it describes stays inside the model: counts of at most 2^20 and capacities of at most
2^20 KB (on chip) or MB (a channel), so a level's total is at most 2^60 bytes and one on-chip
buffer moves in under 2^40 cycles even at the slowest rate; DRAM latency of at most 10^6 cycles;
at most 1024 cycles per element of a vector lane. Each bound's reason is beside its definition
below. (A system-schema file lists every bank, tile and engine, so the 32 KB holds a few hundred
of them; kpu-sim's examples take under 10 KB.)

The flat schema:

| key | type | default | meaning |
|---|---|---|---|
| `name` | printable string of 1 to 100 characters | the file's stem | machine name shown in reports |
| `description` | string | `""` | free text, not interpreted |
| `host_memory.{region_count, region_capacity_mb, bandwidth_gbps}` | ints in [1, 2^20], GB/s | optional | accepted for kpu-sim compatibility, unused |
| `external_memory.bank_count` | int in [1, 2^20] | required | independent DRAM channels |
| `external_memory.bank_capacity_mb` | int in [1, 2^20] | required | capacity of one channel |
| `external_memory.bandwidth_gbps` | finite number >= 0.001 or `"unlimited"` | required | bandwidth of one channel; bytes/cycle = `bandwidth_gbps / timing.clock_ghz` |
| `memory_controller.{controller_count, page_buffer_count, page_buffer_capacity_kb}` | ints in [1, 2^20] | optional | accepted for kpu-sim compatibility, unused |
| `on_chip_memory.l3.tile_count` | int in [1, 2^20] | required | L3 tiles, shared by all compute tiles |
| `on_chip_memory.l3.tile_capacity_kb` | int in [1, 2^20] | required | capacity of one L3 tile |
| `on_chip_memory.l2.bank_count` | int in [1, 2^20] | required | L2 banks, shared by all compute tiles |
| `on_chip_memory.l2.bank_capacity_kb` | int in [1, 2^20] | required | capacity of one L2 bank |
| `on_chip_memory.l1.buffer_capacity_kb` | int in [1, 2^20] | required | capacity of one L1 streaming buffer |
| `on_chip_memory.l1.buffer_count` | int in [1, 2^20] | `4 * (rows + cols)` | L1 buffers of ONE compute tile; kpu-sim counts all tiles together, an explicit kpu-sim value is read here as per tile |
| `data_movement.dma_engine_count` | int in [1, 2^20] | required | DMA engines: external memory <-> L3 |
| `data_movement.block_mover_count` | int in [1, 2^20] | required | BlockMovers: L3 <-> L2 |
| `data_movement.streamer_count` | int in [1, 2^20] | required | Streamers: L2 <-> L1 |
| `compute.tile_count` | int in [1, 2^20] | required | compute tiles, each with its own array and L1 |
| `compute.processor_array.rows` | int in [1, 2^20] | required | PE rows of one systolic array |
| `compute.processor_array.cols` | int in [1, 2^20] | required | PE columns of one systolic array |
| `compute.processor_array.topology` | `rectangular` | `rectangular` | the only topology modelled |
| `compute.systolic_mode` | `true` | `true` | the only mode modelled |
| `address_map.*` | int in [0, 2^64) or hex string | optional | accepted for kpu-sim compatibility, unused; any keys |
| `timing.clock_ghz` | number in [0.001, 1000] | `1.0` | clock of the whole KPU; all rates are per cycle of it |
| `timing.dram_latency_cycles` | int in [0, 10^6] | `100` | cycles before the first byte of an external-memory access |
| `timing.dma_bytes_per_cycle` | finite number >= 0.001 or `"unlimited"` | `64` | bytes per cycle of one DMA engine |
| `timing.block_mover_bytes_per_cycle` | finite number >= 0.001 or `"unlimited"` | `64` | bytes per cycle of one BlockMover |
| `timing.streamer_bytes_per_cycle` | finite number >= 0.001 or `"unlimited"` | `64` | bytes per cycle of one Streamer |
| `timing.l2_bank_ports` | int in [1, 2^20] | `1` | streams one L2 bank serves at once |
| `timing.line_bytes` | power of two up to 2^30 | `64` | allocation alignment at every on-chip level |
| `timing.dataflows` | list of names | all three | supported of `output_stationary`, `weight_stationary`, `input_stationary` |
| `timing.array_macs_per_pe_cycle.{f64, f32, f16, bf16, f8, i32, i16, i8, u8}` | ints in [1, 64] | `1` each (`hardware.machine`) | MACs one PE does per cycle on operands of that dtype: K streams through the array that many elements a cycle |
| `timing.vector_lanes` | int in [1, 2^20] | `compute.processor_array.cols` | lanes of one compute tile's vector unit (elements it works on at once) |
| `timing.vector_cycles_per_element.{simple, transcendental, reduction, requantize}` | ints in [1, 1024], cycles | `1`, `4`, `1`, `1` | cycles one lane spends per element of that op class (`hardware.machine`) |
| `energy.mac_pj.{f64, f32, f16, bf16, f8, i32, i16, i8, u8}` | numbers in [0, 10^9], pJ | Horowitz ISSCC 2014, 45 nm (`hardware.energy`) | energy of one MAC whose operands are of that dtype |
| `energy.access_pj_per_byte.{external, l3, l2, l1, register}` | numbers in [0, 10^9], pJ | 162.5, 12.5, 2.5, 1.25, 0.75 | energy of reading or writing one byte at that level |
| `energy.vector_pj_per_element.{simple, transcendental, reduction, requantize}` | numbers in [0, 10^9], pJ | 4.6, 18.4, 0.9, 4.6 | energy of one vector-lane element of that op class |
| `area.{pe_um2, vector_lane_um2}` | numbers in [0, 10^9], um2 | 11884 each (an f32 multiplier and adder) | area of one PE of the array, one lane of a vector unit |
| `area.sram_mm2_per_kb.{l3, l2, l1}` | numbers in [0, 10^9], mm2 | 0.00405 each | area of one KB of that on-chip level |
| `area.engine_mm2.{dma, block_mover, streamer}` | numbers in [0, 10^9], mm2 | 0.01 each (an estimate) | area of one engine of that kind |

The system schema (kpu-sim's `configs/examples/`): a host, its accelerators and their interconnect.
The loader reads one KPU of `accelerators`: the only one, or the one `--accelerator ID` names
(with several KPUs and no ID, the error lists their ids). `K` below is that accelerator's
`kpu_config` (kpu-sim's older name) or `kpu` (its newer one); one of the two. Every list must be
non-empty, and ids must be unique within their list. Each mapped list describes parts the model
holds alike (one size and rate for all the banks of a level, all the engines of a kind, all the
compute tiles), so its items must agree on every mapped value: unequal capacities, bandwidths,
latencies or array sizes are refused with the first differing item's key, naming both items.
They are refused, not modelled, because the compiler sizes tiles for one bank size and one
array, the binders place buffers and deal work to compute tiles as if all were equal, and the
simulator times all channels and engines of a kind alike; taking the smallest would drop what
the file gives without a word. Compute tiles of different array sizes are refused in the same
way (`...tiles[1].systolic_rows: tile_1's 8 differs from tile_0's 16`).

| key | type | default | maps to |
|---|---|---|---|
| `system.name` | printable string of 1 to 100 characters | the file's stem | machine name shown in reports |
| `system.clock_frequency_mhz` | number in [1, 10^6] | `1000` | the clock: `clock_ghz = clock_frequency_mhz / 1000` |
| `accelerators[].{type, id}` | one of `KPU`, `GPU`, `NPU`, `DSP`, `FPGA`; printable string | required | which accelerator is the KPU read |
| `K.memory.banks[]` | list | required | external memory channels: one per bank |
| `K.memory.banks[].capacity_mb` | int in [1, 2^20] | required | capacity of one channel (flat `external_memory.bank_capacity_mb`) |
| `K.memory.banks[].bandwidth_gbps` | finite number >= 0.001 or `"unlimited"` | required | bandwidth of one channel; bytes/cycle = `bandwidth_gbps / clock_ghz` |
| `K.memory.banks[].latency_ns` | number in [0, 10^6] | required | DRAM latency: cycles = `latency_ns * clock_ghz`, rounded up, at most 10^6 (flat `timing.dram_latency_cycles`) |
| `K.memory.l3_tiles[].capacity_kb` | int in [1, 2^20] | required | L3: one tile per item, of that capacity |
| `K.memory.l2_banks[].capacity_kb` | int in [1, 2^20] | required | L2: one bank per item, of that capacity |
| `K.memory.scratchpads[].capacity_kb` | int in [1, 2^20] | required | L1: the compute tiles' own memories in the kpu-sim that wrote this schema (later renamed page buffers); each compute tile gets an equal share, so their count must be a multiple of the tiles' |
| `K.compute_fabric.tiles[]` | list | required | compute tiles: one per item |
| `K.compute_fabric.tiles[].{systolic_rows, systolic_cols}` | ints in [1, 2^20] | required | PE rows and columns of the tile's array |
| `K.compute_fabric.tiles[].type` | `systolic` | `systolic` | the only compute tile modelled |
| `K.data_movement.dma_engines[].bandwidth_gbps` | finite number >= 0.001 or `"unlimited"` | required | one DMA engine per item; bytes/cycle = `bandwidth_gbps / clock_ghz` (flat `timing.dma_bytes_per_cycle`) |
| `K.data_movement.{block_movers, streamers}[]` | lists of `{id}` | required | one BlockMover, one Streamer per item; their rates from `timing` |
| `interconnect.host_to_accelerator.{pcie_config, cxl_config}.bandwidth_gbps` | finite number >= 0.001 | no host link | the host link: bytes/cycle each way = `bandwidth_gbps / clock_ghz`; one of the two |
| `timing.*` | as in the flat schema | as there | the same keys, except `clock_ghz`, `dram_latency_cycles` and `dma_bytes_per_cycle`, which this schema gives itself (above), so they are refused here |
| `timing.host_link_latency_cycles` | int in [0, 10^6] | `0` | cycles before the first byte of each host-link crossing; only with a host link |
| `energy.*`, `area.*` | as in the flat schema | as there | the energy and area models' figures |

With a host link the loader reports, apart from the run's cycles, the cycles the program's inputs
(and constants) take to cross it before the run and its outputs after: `host_transfer_cycles`.

Read and checked for type, then ignored, as the model has nothing they could set:

| key | why ignored |
|---|---|
| `system.description`, `accelerators[].description`, every `id` | names and free text (ids name parts in messages) |
| `host.*`: `cpu`, `memory.dram_controller`, `memory.modules[]`, `storage[]` | the host's own CPU, memory and disks; the run starts with its inputs on the KPU, and the host link has its own rate |
| the other accelerators: `GPU`, `NPU`, `DSP`, `FPGA` and KPUs not chosen, with `gpu_config`, `npu_config` | other devices |
| `K.memory.{type, form_factor}` | memory technology labels; the banks' numbers are what the model uses |
| `K.compute_fabric.tiles[].datatype` | a program's dtypes are its own; the MACs a PE does per cycle in each are `timing.array_macs_per_pe_cycle` |
| `K.data_movement.dma_engines[].channels` | transfers one engine keeps in flight: our DMA engine runs one transfer at a time at its bandwidth (kpu-sim's own system loader does not use it either) |
| `interconnect.host_to_accelerator.type`, `pcie_config.{generation, lanes}`, `cxl_config.version` | the link's rate is its `bandwidth_gbps` as given; kpu-sim's figures are not generation x lanes (a PCIe 5 x16 link moves about 63 GB/s each way, its datacenter example says 128) |
| `interconnect.{accelerator_to_accelerator, on_chip, network}` | links between devices, or inside the chip's fabric, which the model does not have |
| `system_services.{memory_manager, interrupt_controller, power_management}` | host software |

kpu-sim's `$ref` (an include of another file) is not followed: it is an unknown key.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from dfx import InputFileError, read_input_file  # the one file reader (docs/DESIGN.md, section 2)
from hardware.energy import (
    ACCESS_PJ_PER_BYTE,
    MAC_PJ,
    VECTOR_PJ_PER_ELEMENT,
    AreaModel,
    EnergyModel,
)
from hardware.machine import (
    ARRAY_MACS_PER_PE_CYCLE,
    DATAFLOWS,
    VECTOR_CYCLES_PER_ELEMENT,
    ComputeFabric,
    Engines,
    ExternalMemory,
    HostLink,
    Machine,
    MemoryLevel,
    VectorUnit,
)

KB = 1024
MB = 1024 * KB

# Limits on the file itself; a real config is a few KB, a few levels deep, with short numbers.
# 15 times the largest kpu-sim config; the pure-Python YAML parser reads it in under a second.
MAX_CONFIG_BYTES = 32 * KB
# json.loads and the YAML composer recurse once per level of nesting.
MAX_DEPTH = 16
# Python refuses to convert decimal literals past 4300 digits, and huge ints are slow to print.
MAX_INT_CHARS = 64


class ConfigError(ValueError):
    """A config that cannot describe a machine; the message is one line `file: key.path: reason`."""


def _fail(source: str, path: str, reason: str) -> NoReturn:
    # One line is the contract: callers print it as a diagnostic and tests grep it.
    message = ": ".join(part for part in (source, path, reason) if part)
    raise ConfigError(" ".join(message.splitlines()))


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ShortRepr(reprlib.Repr):
    """A repr that looks at only the first few items, levels and characters of a value, so
    showing a hostile value costs little however large it is."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 60, 60

    def repr_int(self, x: int, level: int) -> str:
        # repr of a huge int takes quadratic time, and raises past 4300 digits
        return repr(x) if x.bit_length() <= 256 else f"an integer of {x.bit_length()} bits"


_SHORT_REPR = _ShortRepr()


def _show(value: Any) -> str:
    return _clip(_SHORT_REPR.repr(value))


def _show_key(key: Any) -> str:
    # a key goes into the message as written, unless it would break the line or the terminal
    return _clip(key) if isinstance(key, str) and key.isprintable() else _show(key)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # bool subclasses int


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


ADDRESS_LIMIT = 1 << 64  # kpu-sim addresses are 64-bit


def _is_address(value: Any) -> bool:
    if isinstance(value, str) and value.lower().startswith("0x"):  # JSON has no hex literals
        try:
            value = int(value, 16)  # linear: a power-of-two base has no digit limit
        except ValueError:
            return False
    return _is_int(value) and 0 <= value < ADDRESS_LIMIT


def _is_dataflow_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(v, str) and v in DATAFLOWS for v in value)
        and len(set(value)) == len(value)
    )


@dataclass(frozen=True)
class _Kind:
    """What a leaf value must be: `what` completes the sentence 'must be ...'."""

    what: str
    test: Callable[[Any], bool]


# Counts are bounded so a typo cannot make the simulator build a billion engines or banks.
# Capacities (KB on chip, MB per channel) share the bound: a bank, tile or buffer holds at most
# 1 GiB and a channel 1 TiB, so a level's total bytes (at most 2^20 of them) stay within 2^60,
# well inside int64, as do peak MACs per cycle (tiles * rows * cols).
MAX_COUNT = 1 << 20
_COUNT = _Kind(f"a positive integer up to {MAX_COUNT}", lambda v: _is_int(v) and 0 < v <= MAX_COUNT)
# A millisecond at 1 GHz, thousands of times any real DRAM's; even 2^40 accesses (more than a
# run ever simulates) add at most 2^60 cycles, so cycle counts stay 64-bit integers.
MAX_LATENCY_CYCLES = 10**6
_LATENCY = _Kind(f"a non-negative integer up to {MAX_LATENCY_CYCLES}",
                 lambda v: _is_int(v) and 0 <= v <= MAX_LATENCY_CYCLES)
# Rates have a floor so that a transfer's cycle count stays a 64-bit integer (the binder's CP-SAT
# model and trace viewers need that): one on-chip buffer (at most 1 GiB) at the floor rate takes
# under 2^40 cycles. A rate needs no ceiling beyond being a finite float: faster only shortens
# transfers.
MIN_RATE = 0.001
_RATE = _Kind(f"a finite number of at least {MIN_RATE}",
              lambda v: _is_number(v) and MIN_RATE <= v <= sys.float_info.max)
# Engine and channel rates may also be "unlimited": an ideal memory whose transfers take no time.
_RATE_OR_UNLIMITED = _Kind(f'a finite number of at least {MIN_RATE}, or "unlimited"',
                           lambda v: v == "unlimited" or _RATE.test(v))
MAX_CLOCK_GHZ = 1000
_CLOCK = _Kind(f"a number from {MIN_RATE} to {MAX_CLOCK_GHZ}",
               lambda v: _is_number(v) and MIN_RATE <= v <= MAX_CLOCK_GHZ)
# A line longer than the largest bank (2^20 KB) could never hold a buffer.
MAX_LINE_BYTES = MAX_COUNT * KB
_LINE = _Kind(f"a positive power of two up to {MAX_LINE_BYTES}",
              lambda v: _is_int(v) and 0 < v <= MAX_LINE_BYTES and v & (v - 1) == 0)
# Far above any real lane (a transcendental emulated in software takes tens of cycles). A tensor
# has at most 2^40 elements, so even one lane doing every class over a whole tensor takes under
# 3 * 2^40 * 2^10 < 2^52 cycles: one vector task's cycle count stays a 64-bit integer.
MAX_CYCLES_PER_ELEMENT = 1024
_CYCLES_PER_ELEMENT = _Kind(f"a positive integer up to {MAX_CYCLES_PER_ELEMENT}",
                            lambda v: _is_int(v) and 0 < v <= MAX_CYCLES_PER_ELEMENT)
MAX_PACKING = 64  # 8-bit products in a 512-bit operand path
_PACKING = _Kind(f"a positive integer up to {MAX_PACKING}", lambda v: _is_int(v) and 0 < v <= MAX_PACKING)
# The name is printed inside one-line messages and report headers.
MAX_NAME_CHARS = 100
_NAME = _Kind(f"a non-empty printable string of at most {MAX_NAME_CHARS} characters",
              lambda v: isinstance(v, str) and len(v) <= MAX_NAME_CHARS and v.isprintable() and v.strip() != "")
_TEXT = _Kind("a string", lambda v: isinstance(v, str))
_ADDRESS = _Kind("a non-negative integer or a hex string like '0x1000', below 2^64", _is_address)
_TOPOLOGY = _Kind("'rectangular' (the only topology modelled)", lambda v: v == "rectangular")
_SYSTOLIC = _Kind("true (only the systolic array is modelled)", lambda v: v is True)
_DATAFLOW_LIST = _Kind(
    f"a non-empty list of distinct dataflows from {', '.join(DATAFLOWS)}", _is_dataflow_list
)
# kpu-sim's system schema gives latencies in ns and the clock in MHz: the same bounds as cycles
# and GHz at 1 GHz (the cycle count a latency gives at the file's clock is checked again).
_LATENCY_NS = _Kind(f"a non-negative number of nanoseconds up to {MAX_LATENCY_CYCLES}",
                    lambda v: _is_number(v) and 0 <= v <= MAX_LATENCY_CYCLES)
_CLOCK_MHZ = _Kind(f"a number from {MIN_RATE * 1000:g} to {MAX_CLOCK_GHZ * 1000}",
                   lambda v: _is_number(v) and MIN_RATE * 1000 <= v <= MAX_CLOCK_GHZ * 1000)
_SYSTOLIC_TILE = _Kind("'systolic' (only the systolic array is modelled)", lambda v: v == "systolic")
ACCELERATOR_TYPES = ("KPU", "GPU", "NPU", "DSP", "FPGA")  # the types kpu-sim's system loader knows
_ACCELERATOR_TYPE = _Kind(f"one of {', '.join(ACCELERATOR_TYPES)}", lambda v: v in ACCELERATOR_TYPES)
# Values the model ignores are still checked for their type, so a typo cannot pass for a setting.
_QUANTITY = _Kind("a finite non-negative number", lambda v: _is_number(v) and 0 <= v <= sys.float_info.max)
_FLAG = _Kind("true or false", lambda v: isinstance(v, bool))


def _rate(value: Any) -> float:
    return math.inf if value == "unlimited" else float(value)


_REQUIRED = object()  # default of a key, section or list that must be present
_FILLED = object()  # default of an optional section: absent, it reads as empty, so its defaults apply


@dataclass(frozen=True)
class _Key:
    kind: _Kind
    default: Any = _REQUIRED


@dataclass(frozen=True)
class _Section:
    """A mapping. `keys` is the closed set of keys, or a `_Kind` that every value of an open
    mapping (address_map) must be. `default` is _REQUIRED, _FILLED, or None for a section whose
    absence matters (a link the file may not have)."""

    keys: dict[str, _Key | _Section | _List] | _Kind
    default: Any = _REQUIRED


@dataclass(frozen=True)
class _List:
    """A list of mappings, each read as `item`; a required list must not be empty. Items that
    have an `id` must not share it."""

    item: _Section
    default: Any = _REQUIRED  # or () for an optional list


def _optional(**specs: _Kind | _Section | _List) -> _Section:
    """An optional section whose keys are all optional (a bare kind: a key without default)."""
    return _Section({key: _Key(spec, None) if isinstance(spec, _Kind) else spec for key, spec in specs.items()},
                    default=_FILLED)


# Our extension to kpu-sim, in both schemas: the timing of the units, in cycles of the clock.
_TIMING_KEYS: dict[str, _Key | _Section] = {
    "clock_ghz": _Key(_CLOCK, 1.0),
    "dram_latency_cycles": _Key(_LATENCY, 100),
    "dma_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
    "block_mover_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
    "streamer_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
    "l2_bank_ports": _Key(_COUNT, 1),
    "line_bytes": _Key(_LINE, 64),
    "dataflows": _Key(_DATAFLOW_LIST, list(DATAFLOWS)),
    "array_macs_per_pe_cycle": _Section(
        {dtype: _Key(_PACKING, rate) for dtype, rate in ARRAY_MACS_PER_PE_CYCLE.items()}, default=_FILLED),
    "vector_lanes": _Key(_COUNT, default=None),  # None: the array's column count
    "vector_cycles_per_element": _Section(
        {op_class: _Key(_CYCLES_PER_ELEMENT, cycles) for op_class, cycles in VECTOR_CYCLES_PER_ELEMENT.items()},
        default=_FILLED,
    ),
}

# Our extension too, in both schemas: the energy and area models' figures (hardware.energy),
# each defaulting to its published figure. The bound keeps a run's total finite and printable:
# 2^60 bytes at 10^9 pJ each is 10^27 pJ.
MAX_COST = 10**9
_COST = _Kind(f"a finite non-negative number up to {MAX_COST}", lambda v: _is_number(v) and 0 <= v <= MAX_COST)


def _costs(defaults: dict[str, float]) -> _Section:
    return _Section({key: _Key(_COST, value) for key, value in defaults.items()}, default=_FILLED)


_AREA_DEFAULTS = AreaModel()
_ENERGY_KEYS = {"mac_pj": _costs(MAC_PJ), "access_pj_per_byte": _costs(ACCESS_PJ_PER_BYTE),
                "vector_pj_per_element": _costs(VECTOR_PJ_PER_ELEMENT)}
_AREA_KEYS = {"pe_um2": _Key(_COST, _AREA_DEFAULTS.pe_um2),
              "vector_lane_um2": _Key(_COST, _AREA_DEFAULTS.vector_lane_um2),
              "sram_mm2_per_kb": _costs(_AREA_DEFAULTS.sram_mm2_per_kb),
              "engine_mm2": _costs(_AREA_DEFAULTS.engine_mm2)}

_SCHEMA = _Section(
    {
        "name": _Key(_NAME, default=None),  # None: the file's stem
        "description": _Key(_TEXT, default=""),
        # host_memory and memory_controller: kpu-sim keys we check but do not model.
        "host_memory": _Section(
            {
                "region_count": _Key(_COUNT, None),
                "region_capacity_mb": _Key(_COUNT, None),
                "bandwidth_gbps": _Key(_RATE, None),
            },
            default=_FILLED,
        ),
        "external_memory": _Section(
            {
                "bank_count": _Key(_COUNT),
                "bank_capacity_mb": _Key(_COUNT),
                "bandwidth_gbps": _Key(_RATE_OR_UNLIMITED),
            }
        ),
        "memory_controller": _Section(
            {
                "controller_count": _Key(_COUNT, None),
                "page_buffer_count": _Key(_COUNT, None),
                "page_buffer_capacity_kb": _Key(_COUNT, None),
            },
            default=_FILLED,
        ),
        "on_chip_memory": _Section(
            {
                "l3": _Section({"tile_count": _Key(_COUNT), "tile_capacity_kb": _Key(_COUNT)}),
                "l2": _Section({"bank_count": _Key(_COUNT), "bank_capacity_kb": _Key(_COUNT)}),
                "l1": _Section(
                    {
                        "buffer_capacity_kb": _Key(_COUNT),
                        "buffer_count": _Key(_COUNT, default=None),  # None: 4 * (rows + cols)
                    }
                ),
            }
        ),
        "data_movement": _Section(
            {
                "dma_engine_count": _Key(_COUNT),
                "block_mover_count": _Key(_COUNT),
                "streamer_count": _Key(_COUNT),
            }
        ),
        "compute": _Section(
            {
                "tile_count": _Key(_COUNT),
                "processor_array": _Section(
                    {
                        "rows": _Key(_COUNT),
                        "cols": _Key(_COUNT),
                        "topology": _Key(_TOPOLOGY, "rectangular"),
                    }
                ),
                "systolic_mode": _Key(_SYSTOLIC, True),
            }
        ),
        "address_map": _Section(_ADDRESS, default=_FILLED),
        "timing": _Section(_TIMING_KEYS, default=_FILLED),
        "energy": _Section(_ENERGY_KEYS, default=_FILLED),
        "area": _Section(_AREA_KEYS, default=_FILLED),
    }
)

# --- kpu-sim's system schema: a host, its accelerators and their interconnect -------------------

# A document with either key at the top is read as the system schema; the flat one has neither.
SYSTEM_KEYS = frozenset({"system", "accelerators"})
# The system schema states these itself, so its timing section refuses them rather than have two
# sources that may disagree.
_STATED_BY_SYSTEM = {
    "clock_ghz": "system.clock_frequency_mhz",
    "dram_latency_cycles": "memory.banks[].latency_ns",
    "dma_bytes_per_cycle": "data_movement.dma_engines[].bandwidth_gbps",
}


def _items(**keys: _Key) -> _List:
    """A list of named parts (banks, tiles, engines): an optional `id` beside `keys`."""
    return _List(_Section({"id": _Key(_NAME, None), **keys}))


_CAPACITY_KB = _items(capacity_kb=_Key(_COUNT))
_KPU = _Section(
    {
        "memory": _Section(
            {
                "type": _Key(_TEXT, None),
                "form_factor": _Key(_TEXT, None),
                "banks": _items(capacity_mb=_Key(_COUNT), bandwidth_gbps=_Key(_RATE_OR_UNLIMITED),
                                latency_ns=_Key(_LATENCY_NS)),
                "l3_tiles": _CAPACITY_KB,
                "l2_banks": _CAPACITY_KB,
                "scratchpads": _CAPACITY_KB,
            }
        ),
        "compute_fabric": _Section(
            {"tiles": _items(type=_Key(_SYSTOLIC_TILE, "systolic"), systolic_rows=_Key(_COUNT),
                             systolic_cols=_Key(_COUNT), datatype=_Key(_TEXT, None))}
        ),
        "data_movement": _Section(
            {
                "dma_engines": _items(bandwidth_gbps=_Key(_RATE_OR_UNLIMITED), channels=_Key(_COUNT, None)),
                "block_movers": _items(),
                "streamers": _items(),
            }
        ),
    },
    default=None,
)
_DEVICE_MEMORY = _optional(type=_TEXT, form_factor=_TEXT, capacity_gb=_QUANTITY, capacity_mb=_QUANTITY,
                           bandwidth_gbps=_QUANTITY, bus_width_bits=_QUANTITY)

_SYSTEM_SCHEMA = _Section(
    {
        "system": _Section(
            {"name": _Key(_NAME, None), "description": _Key(_TEXT, None),
             "clock_frequency_mhz": _Key(_CLOCK_MHZ, 1000)},
            default=_FILLED,
        ),
        "host": _optional(
            cpu=_optional(core_count=_QUANTITY, frequency_mhz=_QUANTITY, cache_l1_kb=_QUANTITY,
                          cache_l2_kb=_QUANTITY, cache_l3_kb=_QUANTITY),
            memory=_optional(
                dram_controller=_optional(channel_count=_QUANTITY, data_width_bits=_QUANTITY),
                modules=_List(_optional(id=_NAME, type=_TEXT, form_factor=_TEXT, capacity_gb=_QUANTITY,
                                        frequency_mhz=_QUANTITY, bandwidth_gbps=_QUANTITY,
                                        latency_ns=_QUANTITY, channels=_QUANTITY), default=()),
            ),
            storage=_List(_optional(id=_NAME, type=_TEXT, capacity_gb=_QUANTITY, read_bandwidth_mbps=_QUANTITY,
                                    write_bandwidth_mbps=_QUANTITY, latency_us=_QUANTITY), default=()),
        ),
        "accelerators": _List(
            _Section(
                {
                    "type": _Key(_ACCELERATOR_TYPE),
                    "id": _Key(_NAME),
                    "description": _Key(_TEXT, None),
                    "kpu_config": _KPU,
                    "kpu": _KPU,  # kpu-sim's newer name for kpu_config
                    "gpu_config": _optional(compute_units=_QUANTITY, clock_mhz=_QUANTITY, memory=_DEVICE_MEMORY),
                    "npu_config": _optional(tops_int8=_QUANTITY, tops_fp16=_QUANTITY, memory=_DEVICE_MEMORY),
                }
            )
        ),
        "interconnect": _optional(
            host_to_accelerator=_optional(
                type=_TEXT,
                # None: the file has no such link
                pcie_config=_Section({"bandwidth_gbps": _Key(_RATE), "generation": _Key(_COUNT, None),
                                      "lanes": _Key(_COUNT, None)}, default=None),
                cxl_config=_Section({"bandwidth_gbps": _Key(_RATE), "version": _Key(_TEXT, None)}, default=None),
            ),
            accelerator_to_accelerator=_optional(
                type=_TEXT, noc_config=_optional(topology=_TEXT, router_count=_QUANTITY, link_bandwidth_gbps=_QUANTITY)
            ),
            on_chip=_optional(type=_TEXT, amba_config=_optional(protocol=_TEXT)),
            network=_optional(enabled=_FLAG, type=_TEXT, speed_gbps=_QUANTITY),
        ),
        "system_services": _optional(
            memory_manager=_optional(enabled=_FLAG, pool_size_mb=_QUANTITY, alignment_bytes=_QUANTITY),
            interrupt_controller=_optional(enabled=_FLAG),
            power_management=_optional(enabled=_FLAG),
        ),
        "timing": _Section(
            {
                **_TIMING_KEYS,
                **{key: _Key(_Kind(f"left out: this schema gives it as {given}", lambda v: False), None)
                   for key, given in _STATED_BY_SYSTEM.items()},
                "host_link_latency_cycles": _Key(_LATENCY, None),  # None: 0, if the file has a host link
            },
            default=_FILLED,
        ),
        "energy": _Section(_ENERGY_KEYS, default=_FILLED),
        "area": _Section(_AREA_KEYS, default=_FILLED),
    }
)


def _read(value: Any, section: _Section, source: str, path: str) -> dict[str, Any]:
    """Check `value` against `section` and return it with every default filled in."""
    if not isinstance(value, dict):
        _fail(source, path, f"must be a mapping, got {_show(value)}")

    def where(key: Any) -> str:
        return f"{path}.{_show_key(key)}" if path else _show_key(key)

    if isinstance(section.keys, _Kind):  # open mapping: any name as a key, values of one kind
        for key, item in value.items():
            if not isinstance(key, str):  # YAML also allows numbers (and over-long ones) as keys
                _fail(source, path, f"a key is a name, got {_show(key)}")
            if not section.keys.test(item):
                _fail(source, where(key), f"must be {section.keys.what}, got {_show(item)}")
        return dict(value)

    for key in value:
        if key not in section.keys:
            _fail(source, where(key), f"unknown key (expected one of: {', '.join(section.keys)})")

    return {key: _read_value(value[key], spec, source, where(key)) if key in value
            else _absent(spec, source, where(key)) for key, spec in section.keys.items()}


def _absent(spec: _Key | _Section | _List, source: str, path: str) -> Any:
    if spec.default is _REQUIRED:
        _fail(source, path, "missing required section" if isinstance(spec, _Section) else "missing required key")
    return _read({}, spec, source, path) if spec.default is _FILLED else spec.default


def _read_value(value: Any, spec: _Key | _Section | _List, source: str, path: str) -> Any:
    if isinstance(spec, _Section):
        return _read(value, spec, source, path)
    if isinstance(spec, _List):
        return _read_list(value, spec, source, path)
    if not spec.kind.test(value):
        _fail(source, path, f"must be {spec.kind.what}, got {_show(value)}")
    return value


def _read_list(value: Any, spec: _List, source: str, path: str) -> list[dict[str, Any]]:
    required = spec.default is _REQUIRED
    if not isinstance(value, list) or (required and not value):
        _fail(source, path, f"must be a {'non-empty ' if required else ''}list of mappings, got {_show(value)}")
    items = [_read(item, spec.item, source, f"{path}[{i}]") for i, item in enumerate(value)]
    first_with: dict[str, int] = {}  # id -> index of the first item with it
    for i, item in enumerate(items):
        if item.get("id") is not None and first_with.setdefault(item["id"], i) != i:
            _fail(source, f"{path}[{i}].id",
                  f"{_show(item['id'])} is also the id of {_last(path)}[{first_with[item['id']]}]")
    return items


def _last(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def machine_from_dict(document: Any, source: str = "<config>", accelerator: str | None = None) -> Machine:
    """Build a Machine from a parsed config of either schema; `source` names it in error messages,
    `accelerator` is the id of the KPU to read from a system-schema file."""
    if isinstance(document, dict) and SYSTEM_KEYS & document.keys():
        return _system_machine(document, source, accelerator)
    if accelerator is not None:
        _fail(source, "", f"accelerator {_show(accelerator)} asked for, but this is a flat-schema config, "
                          "which describes one KPU")
    return _flat_machine(document, source)


_Clock = tuple[float, str]  # GHz, and the key and value that gave it, for messages


def _per_cycle(gbps: Any, clock: _Clock, source: str, path: str) -> float:
    """GB/s over G cycles/s: bytes per cycle of the config clock."""
    rate = _rate(gbps) / clock[0]
    if rate < MIN_RATE:
        _fail(source, path, f"gives {rate:g} bytes per cycle at {clock[1]}, below the floor of {MIN_RATE}")
    return rate


def _machine(name: str | None, source: str, config: dict[str, Any], *, external: ExternalMemory,
             l3: MemoryLevel, l2: MemoryLevel, l1: MemoryLevel, movers: tuple[int, int, int],
             dma_bytes_per_cycle: float, array: tuple[int, int, int], host_link: HostLink | None = None) -> Machine:
    """The Machine both schemas describe: what they share comes from the timing, energy and area
    sections of `config`."""
    tiles, rows, cols = array
    timing = config["timing"]
    return Machine(
        name=name if name is not None else Path(source).stem,
        clock_ghz=float(timing["clock_ghz"]),
        external=external,
        l3=l3,
        l2=l2,
        l1=l1,
        l2_bank_ports=timing["l2_bank_ports"],
        line_bytes=timing["line_bytes"],
        engines=Engines(*movers, dma_bytes_per_cycle, _rate(timing["block_mover_bytes_per_cycle"]),
                        _rate(timing["streamer_bytes_per_cycle"])),
        compute=ComputeFabric(tiles=tiles, rows=rows, cols=cols, dataflows=tuple(timing["dataflows"]),
                              macs_per_pe_cycle=timing["array_macs_per_pe_cycle"]),
        vector=VectorUnit(
            # as Machine's default: one lane per array column, to keep up with the array's output
            lanes=timing["vector_lanes"] if timing["vector_lanes"] is not None else cols,
            cycles_per_element=timing["vector_cycles_per_element"],
        ),
        host_link=host_link,
        energy=EnergyModel(**config["energy"]),
        area=AreaModel(**config["area"]),
    )


def _flat_machine(document: Any, source: str) -> Machine:
    config = _read(document, _SCHEMA, source, "")
    timing = config["timing"]
    external = config["external_memory"]
    on_chip = config["on_chip_memory"]
    moves = config["data_movement"]
    compute = config["compute"]
    array = compute["processor_array"]
    clock = (timing["clock_ghz"], f"timing.clock_ghz {timing['clock_ghz']}")

    l1_count = on_chip["l1"]["buffer_count"]
    if l1_count is None:
        # kpu-sim: every edge of the array has an ingress and an egress buffer per row/column.
        l1_count = 4 * (array["rows"] + array["cols"])

    return _machine(
        config["name"], source, config,
        external=ExternalMemory(
            channels=external["bank_count"],
            channel_bytes=external["bank_capacity_mb"] * MB,
            channel_bytes_per_cycle=_per_cycle(external["bandwidth_gbps"], clock, source,
                                               "external_memory.bandwidth_gbps"),
            latency_cycles=timing["dram_latency_cycles"],
        ),
        l3=MemoryLevel(on_chip["l3"]["tile_count"], on_chip["l3"]["tile_capacity_kb"] * KB),
        l2=MemoryLevel(on_chip["l2"]["bank_count"], on_chip["l2"]["bank_capacity_kb"] * KB),
        l1=MemoryLevel(l1_count, on_chip["l1"]["buffer_capacity_kb"] * KB),
        movers=(moves["dma_engine_count"], moves["block_mover_count"], moves["streamer_count"]),
        dma_bytes_per_cycle=_rate(timing["dma_bytes_per_cycle"]),
        array=(compute["tile_count"], array["rows"], array["cols"]),
    )


def _system_machine(document: dict[str, Any], source: str, accelerator: str | None) -> Machine:
    config = _read(document, _SYSTEM_SCHEMA, source, "")
    at, kpu = _pick_kpu(config["accelerators"], source, accelerator)
    mhz = config["system"]["clock_frequency_mhz"]
    clock = (mhz / 1000, f"system.clock_frequency_mhz {mhz}")
    memory, moves, tiles = kpu["memory"], kpu["data_movement"], kpu["compute_fabric"]["tiles"]
    bank = _alike(memory["banks"], ("capacity_mb", "bandwidth_gbps", "latency_ns"), source, f"{at}.memory.banks")
    l3 = _alike(memory["l3_tiles"], ("capacity_kb",), source, f"{at}.memory.l3_tiles")
    l2 = _alike(memory["l2_banks"], ("capacity_kb",), source, f"{at}.memory.l2_banks")
    scratchpad = _alike(memory["scratchpads"], ("capacity_kb",), source, f"{at}.memory.scratchpads")
    tile = _alike(tiles, ("systolic_rows", "systolic_cols"), source, f"{at}.compute_fabric.tiles")
    dma = _alike(moves["dma_engines"], ("bandwidth_gbps",), source, f"{at}.data_movement.dma_engines")
    # The scratchpads are the compute tiles' own memories (L1): each tile gets an equal share.
    scratchpads_per_tile, unshared = divmod(len(memory["scratchpads"]), len(tiles))
    if unshared:
        _fail(source, f"{at}.memory.scratchpads", f"{len(memory['scratchpads'])} scratchpads cannot be shared "
                                                  f"equally by {len(tiles)} compute tiles, each with its own L1")

    return _machine(
        config["system"]["name"], source, {**config, "timing": {**config["timing"], "clock_ghz": clock[0]}},
        external=ExternalMemory(
            channels=len(memory["banks"]),
            channel_bytes=bank["capacity_mb"] * MB,
            channel_bytes_per_cycle=_per_cycle(bank["bandwidth_gbps"], clock, source,
                                               f"{at}.memory.banks[0].bandwidth_gbps"),
            latency_cycles=_ns_to_cycles(bank["latency_ns"], clock, source, f"{at}.memory.banks[0].latency_ns"),
        ),
        l3=MemoryLevel(len(memory["l3_tiles"]), l3["capacity_kb"] * KB),
        l2=MemoryLevel(len(memory["l2_banks"]), l2["capacity_kb"] * KB),
        l1=MemoryLevel(scratchpads_per_tile, scratchpad["capacity_kb"] * KB),
        movers=(len(moves["dma_engines"]), len(moves["block_movers"]), len(moves["streamers"])),
        dma_bytes_per_cycle=_per_cycle(dma["bandwidth_gbps"], clock, source,
                                       f"{at}.data_movement.dma_engines[0].bandwidth_gbps"),
        array=(len(tiles), tile["systolic_rows"], tile["systolic_cols"]),
        host_link=_host_link(config, clock, source),
    )


def _pick_kpu(accelerators: list[dict[str, Any]], source: str, wanted: str | None) -> tuple[str, dict[str, Any]]:
    """The key path and configuration of the KPU to read: the file's only one, or the one `wanted` names."""
    kpus = [i for i, a in enumerate(accelerators) if a["type"] == "KPU"]
    known = f"the KPUs are {_clip(', '.join(accelerators[i]['id'] for i in kpus), 200)}" if kpus else "it has no KPU"
    if wanted is not None:
        index = next((i for i, a in enumerate(accelerators) if a["id"] == wanted), None)
        if index is None:
            _fail(source, "accelerators", f"no accelerator has the id {_show(wanted)}; {known}")
        if index not in kpus:
            _fail(source, f"accelerators[{index}]",
                  f"{_show(wanted)} is a {accelerators[index]['type']}, not a KPU; {known}")
    elif not kpus:
        others = ", ".join(f"{a['id']} ({a['type']})" for a in accelerators)
        _fail(source, "accelerators", f"no KPU among the accelerators: {_clip(others, 200)}")
    elif len(kpus) > 1:
        _fail(source, "accelerators", f"{len(kpus)} KPUs, choose one with --accelerator ID; {known}")
    else:
        index = kpus[0]
    path = f"accelerators[{index}]"
    given = [key for key in ("kpu_config", "kpu") if accelerators[index][key] is not None]
    if len(given) != 1:
        _fail(source, path,
              "gives both kpu_config and kpu; keep one" if given else "a KPU needs its kpu_config (or kpu)")
    return f"{path}.{given[0]}", accelerators[index][given[0]]


def _alike(items: list[dict[str, Any]], keys: tuple[str, ...], source: str, path: str) -> dict[str, Any]:
    """The first of `items`, once every other agrees with it on `keys`: the model gives all the
    banks of a level one size and rate, all the engines of a kind one rate, and all the compute
    tiles one array. Unequal parts are refused: the compiler, the binders and the simulator plan
    with that one value, and taking the smallest would drop what the file gives without a word."""
    name = _last(path)
    for i, item in enumerate(items):
        for key in keys:
            if item[key] != items[0][key]:
                _fail(source, f"{path}[{i}].{key}",
                      f"{item['id'] or f'{name}[{i}]'}'s {_show(item[key])} differs from "
                      f"{items[0]['id'] or f'{name}[0]'}'s {_show(items[0][key])}; the model needs all "
                      f"{name} alike, so unequal ones are refused")
    return items[0]


def _ns_to_cycles(ns: float, clock: _Clock, source: str, path: str) -> int:
    # Rounded to a millionth of a cycle before the ceiling, so that float error cannot add a cycle
    # (20 ns at 1.1 GHz is 22.000000000000004 in floats).
    cycles = math.ceil(round(ns * clock[0], 6))
    if cycles > MAX_LATENCY_CYCLES:
        _fail(source, path, f"gives {cycles} cycles at {clock[1]}, above the bound of {MAX_LATENCY_CYCLES}")
    return cycles


def _host_link(config: dict[str, Any], clock: _Clock, source: str) -> HostLink | None:
    path = "interconnect.host_to_accelerator"
    link = config["interconnect"]["host_to_accelerator"]
    latency = config["timing"]["host_link_latency_cycles"]
    given = [key for key in ("pcie_config", "cxl_config") if link[key] is not None]
    if len(given) > 1:
        _fail(source, path, "gives both pcie_config and cxl_config; the host link is one of them")
    if not given:
        if latency is not None:
            _fail(source, "timing.host_link_latency_cycles", f"the file has no host link ({path}.pcie_config "
                                                             "or cxl_config) for it to apply to")
        return None
    rate = _per_cycle(link[given[0]]["bandwidth_gbps"], clock, source, f"{path}.{given[0]}.bandwidth_gbps")
    return HostLink(bytes_per_cycle=rate, latency_cycles=latency or 0)


# --- the document reader, shared with kpu-dse's sweep specs ------------------------------------


class Unreadable:
    """Stands in for a value the reader must not build: an integer literal too long to convert, or
    a JSON object with a key twice. It is no number, string, list or mapping, so the caller's check
    of the place that holds it refuses it there, and its repr says what it was (`must be ..., got
    an integer literal of 5000 characters (at most 64)`). For a JSON object that place is the only
    one we can name, as json.loads reports no position to its hooks."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


def _long_int(literal: str) -> Unreadable:
    return Unreadable(f"an integer literal of {len(literal)} characters (at most {MAX_INT_CHARS})")


def _json_int(literal: str) -> int | Unreadable:
    return _long_int(literal) if len(literal) > MAX_INT_CHARS else int(literal)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | Unreadable:
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:  # json.loads would keep the last silently
            return Unreadable(f"a mapping with the key {_show(key)} twice")
        mapping[key] = value
    return mapping


# A JSON string (brackets inside it do not nest; an unterminated one runs to the end, which keeps
# the scan linear) or a bracket.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def _check_json_depth(text: str, source: str) -> None:
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        if token.group() in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, token.start()) + 1
                _fail(source, f"line {line}", f"nested deeper than {MAX_DEPTH} levels")
        elif token.group() in ("]", "}"):
            depth -= 1


@cache
def _yaml_loader() -> type:
    """PyYAML's safe loader (no Python tags), refusing also what a document never needs and a
    hostile file could abuse, each as a YAML error at its line. Built (and PyYAML imported) on
    the first YAML document: a run with a JSON config does without both."""
    import yaml

    class ConfigLoader(yaml.SafeLoader):
        _depth = 0  # collections open around the node being composed

        def compose_node(self, parent: Any, index: Any) -> yaml.Node:
            event = self.peek_event()
            if event.anchor is not None:  # set on anchors and aliases alike
                # a few hundred bytes of nested aliases expand to billions of values ("billion laughs")
                raise yaml.composer.ComposerError(None, None, "anchors and aliases are not allowed",
                                                  event.start_mark)
            if self._depth == MAX_DEPTH and not isinstance(event, yaml.ScalarEvent):
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  event.start_mark)
            self._depth += 1
            node = super().compose_node(parent, index)
            self._depth -= 1
            return node

        def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except yaml.YAMLError:
                raise
            except Exception:  # PyYAML's constructors raise plain errors on `!!int ""`, `2001-13-45`...
                kind = node.tag.rsplit(":", 1)[-1]
                raise yaml.constructor.ConstructorError(None, None, f"{_show(node.value)} is not a valid {kind}",
                                                        node.start_mark) from None

        def construct_yaml_int(self, node: yaml.Node) -> int | Unreadable:
            literal = self.construct_scalar(node)
            return _long_int(literal) if len(literal) > MAX_INT_CHARS else super().construct_yaml_int(node)

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            # A YAML mapping keeps the last of a key given twice. The keys are checked before
            # PyYAML builds the mapping, so that a list or mapping as a key is refused in our
            # words; merge keys (`<<: {...}`) are expanded first, as PyYAML would.
            self.flatten_mapping(node)
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:  # `? [a, b]`: a list, a mapping or a set as a key
                    raise yaml.constructor.ConstructorError(
                        None, None, f"a key is a name, not a {'list' if isinstance(key, list) else 'mapping'}",
                        key_node.start_mark) from None
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"the key {_show(key)} is given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    ConfigLoader.add_constructor("tag:yaml.org,2002:int", ConfigLoader.construct_yaml_int)
    return ConfigLoader


def read_document(text: str, suffix: str, source: str) -> Any:
    """Parse `text`, JSON if `suffix` is `.json` and YAML otherwise (the caller has checked the
    suffix), refusing what a config or a sweep spec never needs and a hostile file could abuse:
    nesting deeper than MAX_DEPTH levels, a key twice in a YAML mapping, YAML anchors, aliases
    and tags other than YAML's own. A refusal is a ConfigError, one line `source: place: reason`.
    An integer literal longer than MAX_INT_CHARS characters, and a JSON object with a key twice,
    are read as an Unreadable, for the caller to refuse at the key that holds it."""
    if suffix == ".json":
        _check_json_depth(text, source)
        try:
            return json.loads(text, parse_int=_json_int, object_pairs_hook=_json_object)
        except json.JSONDecodeError as e:
            _fail(source, f"line {e.lineno}, column {e.colno}", f"invalid JSON: {e.msg}")
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = ", ".join(part for part in (e.context, e.problem) if part)
        _fail(source, where, f"invalid YAML: {_clip(reason, 200)}")
    except yaml.reader.ReaderError as e:  # a character YAML does not allow, such as NUL
        line = text.count("\n", 0, e.position) + 1
        _fail(source, f"line {line}", f"invalid YAML: unacceptable character #x{e.character:04x}")


def load_machine(path: str | os.PathLike[str], accelerator: str | None = None) -> Machine:
    """Read a config file (.json, .yaml or .yml), or a shipped config by name, and build its Machine;
    `accelerator` is the id of the KPU to read from a system-schema file with several."""
    source = resolve_config(os.fspath(path))
    suffix = Path(source).suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        _fail(source, "", f"unsupported extension {suffix!r}; expected .json, .yaml or .yml")
    return machine_from_dict(read_document_file(source, "config", MAX_CONFIG_BYTES), source, accelerator)


def read_document_file(path: str, what: str, max_bytes: int) -> Any:
    """The document in the file at `path`, JSON if its suffix is `.json` and YAML otherwise (the
    caller has checked the suffix), read as `read_document` reads text; a file that is not a
    regular file, of more than `max_bytes` (`what`, a config or a spec, is a few KB) or not UTF-8
    is a ConfigError."""
    try:
        data = read_input_file(path, what, max_bytes)  # a regular file only: a FIFO or /dev/zero never ends
    except InputFileError as e:
        raise ConfigError(str(e)) from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, as some editors write, is fine
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        _fail(path, f"line {line}", "cannot read: not UTF-8 text")
    return read_document(text, Path(path).suffix.lower(), path)


SHIPPED = Path(__file__).parent / "configs"  # the repo's configs/, installed with the package


def resolve_config(name: str) -> str:
    """A config path as given, or the path of a shipped config named without a suffix
    (`standard`, `minimal`, `datacenter`, `ideal_32x32`)."""
    if Path(name).suffix or "/" in name:
        return name
    shipped = SHIPPED / f"{name}.json"
    if not shipped.is_file():
        names = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.json")))
        raise ConfigError(f"{name}: not a config file (.json, .yaml, .yml) nor a shipped config ({names})")
    return str(shipped)
