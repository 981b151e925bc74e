"""Machine configs: the flat kpu-sim schema (JSON or YAML) plus our optional `timing` section.

`load_machine(path)` reads a `.json`, `.yaml` or `.yml` file, or a shipped config by name;
`machine_from_dict(document, source)` takes an already parsed document. Both return a `hardware.machine.Machine` or raise `ConfigError`,
whose message is one line naming the file, the dotted key and the reason:

    configs/x.json: on_chip_memory.l2.bank_count: must be a positive integer, got 0

Units follow kpu-sim: KB = 1024 bytes, MB = 1024 KB, bandwidth in GB/s = 1e9 bytes per second.
Unknown keys are errors everywhere except inside `address_map`; booleans are never numbers.
YAML is read as YAML 1.1, so write large floats with a dot (`1.0e9`; a bare `1e9` is a string).

| key | type | default | meaning |
|---|---|---|---|
| `name` | string | the file's stem | machine name shown in reports |
| `description` | string | `""` | free text, not interpreted |
| `host_memory.{region_count, region_capacity_mb, bandwidth_gbps}` | counts, GB/s | optional | accepted for kpu-sim compatibility, unused |
| `external_memory.bank_count` | positive int | required | independent DRAM channels |
| `external_memory.bank_capacity_mb` | positive int | required | capacity of one channel |
| `external_memory.bandwidth_gbps` | number >= 0.001 or `"unlimited"` | required | bandwidth of one channel; bytes/cycle = `bandwidth_gbps / timing.clock_ghz` |
| `memory_controller.{controller_count, page_buffer_count, page_buffer_capacity_kb}` | positive ints | optional | accepted for kpu-sim compatibility, unused |
| `on_chip_memory.l3.tile_count` | positive int | required | L3 tiles, shared by all compute tiles |
| `on_chip_memory.l3.tile_capacity_kb` | positive int | required | capacity of one L3 tile |
| `on_chip_memory.l2.bank_count` | positive int | required | L2 banks, shared by all compute tiles |
| `on_chip_memory.l2.bank_capacity_kb` | positive int | required | capacity of one L2 bank |
| `on_chip_memory.l1.buffer_capacity_kb` | positive int | required | capacity of one L1 streaming buffer |
| `on_chip_memory.l1.buffer_count` | positive int | `4 * (rows + cols)` | L1 buffers of ONE compute tile; kpu-sim counts all tiles together, an explicit kpu-sim value is read here as per tile |
| `data_movement.dma_engine_count` | positive int | required | DMA engines: external memory <-> L3 |
| `data_movement.block_mover_count` | positive int | required | BlockMovers: L3 <-> L2 |
| `data_movement.streamer_count` | positive int | required | Streamers: L2 <-> L1 |
| `compute.tile_count` | positive int | required | compute tiles, each with its own array and L1 |
| `compute.processor_array.rows` | positive int | required | PE rows of one systolic array |
| `compute.processor_array.cols` | positive int | required | PE columns of one systolic array |
| `compute.processor_array.topology` | `rectangular` | `rectangular` | the only topology modelled |
| `compute.systolic_mode` | `true` | `true` | the only mode modelled |
| `address_map.*` | int >= 0 or hex string | optional | accepted for kpu-sim compatibility, unused; any keys |
| `timing.clock_ghz` | number in [0.001, 1000] | `1.0` | clock of the whole KPU; all rates are per cycle of it |
| `timing.dram_latency_cycles` | int >= 0 | `100` | cycles before the first byte of an external-memory access |
| `timing.dma_bytes_per_cycle` | number >= 0.001 or `"unlimited"` | `64` | bytes per cycle of one DMA engine |
| `timing.block_mover_bytes_per_cycle` | number >= 0.001 or `"unlimited"` | `64` | bytes per cycle of one BlockMover |
| `timing.streamer_bytes_per_cycle` | number >= 0.001 or `"unlimited"` | `64` | bytes per cycle of one Streamer |
| `timing.l2_bank_ports` | positive int | `1` | streams one L2 bank serves at once |
| `timing.line_bytes` | power of two | `64` | allocation alignment at every on-chip level |
| `timing.dataflows` | list of names | all three | supported of `output_stationary`, `weight_stationary`, `input_stationary` |
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from hardware.machine import (
    DATAFLOWS,
    ComputeFabric,
    Engines,
    ExternalMemory,
    Machine,
    MemoryLevel,
)

KB = 1024
MB = 1024 * KB


class ConfigError(ValueError):
    """A config that cannot describe a machine; the message is one line `file: key.path: reason`."""


def _fail(source: str, path: str, reason: str) -> NoReturn:
    # One line is the contract: callers print it as a diagnostic and tests grep it.
    message = ": ".join(part for part in (source, path, reason) if part)
    raise ConfigError(" ".join(message.splitlines()))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # bool subclasses int


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_address(value: Any) -> bool:
    if _is_int(value):
        return value >= 0
    if isinstance(value, str) and value.lower().startswith("0x"):  # JSON has no hex literals
        try:
            int(value, 16)
        except ValueError:
            return False
        return True
    return False


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
MAX_COUNT = 1 << 20
_COUNT = _Kind(f"a positive integer up to {MAX_COUNT}", lambda v: _is_int(v) and 0 < v <= MAX_COUNT)
_CYCLES = _Kind("a non-negative integer", lambda v: _is_int(v) and v >= 0)
# Rates have a floor so that a transfer's cycle count stays a 64-bit integer (the binder's CP-SAT
# model and trace viewers need that): a terabyte at the floor rate still takes under 2^51 cycles.
MIN_RATE = 0.001
_RATE = _Kind(f"a finite number of at least {MIN_RATE}", lambda v: _is_number(v) and MIN_RATE <= v < math.inf)
# Engine and channel rates may also be "unlimited": an ideal memory whose transfers take no time.
_RATE_OR_UNLIMITED = _Kind(f'a finite number of at least {MIN_RATE}, or "unlimited"',
                           lambda v: v == "unlimited" or _RATE.test(v))
MAX_CLOCK_GHZ = 1000
_CLOCK = _Kind(f"a number from {MIN_RATE} to {MAX_CLOCK_GHZ}",
               lambda v: _is_number(v) and MIN_RATE <= v <= MAX_CLOCK_GHZ)
_POW2 = _Kind("a positive power of two", lambda v: _is_int(v) and v > 0 and v & (v - 1) == 0)
_NAME = _Kind("a non-empty string", lambda v: isinstance(v, str) and v.strip() != "")
_TEXT = _Kind("a string", lambda v: isinstance(v, str))
_ADDRESS = _Kind("a non-negative integer or a hex string like '0x1000'", _is_address)
_TOPOLOGY = _Kind("'rectangular' (the only topology modelled)", lambda v: v == "rectangular")
_SYSTOLIC = _Kind("true (only the systolic array is modelled)", lambda v: v is True)
_DATAFLOW_LIST = _Kind(
    f"a non-empty list of distinct dataflows from {', '.join(DATAFLOWS)}", _is_dataflow_list
)

def _rate(value: Any) -> float:
    return math.inf if value == "unlimited" else float(value)


_REQUIRED = object()  # default of a key that must be present


@dataclass(frozen=True)
class _Key:
    kind: _Kind
    default: Any = _REQUIRED


@dataclass(frozen=True)
class _Section:
    """A mapping. `keys` is the closed set of keys, or a `_Kind` that every value of an open
    mapping (address_map) must be. An absent optional section reads as empty, so defaults apply."""

    keys: dict[str, _Key | _Section] | _Kind
    required: bool = True


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
            required=False,
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
            required=False,
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
        "address_map": _Section(_ADDRESS, required=False),
        "timing": _Section(
            {
                "clock_ghz": _Key(_CLOCK, 1.0),
                "dram_latency_cycles": _Key(_CYCLES, 100),
                "dma_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
                "block_mover_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
                "streamer_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
                "l2_bank_ports": _Key(_COUNT, 1),
                "line_bytes": _Key(_POW2, 64),
                "dataflows": _Key(_DATAFLOW_LIST, list(DATAFLOWS)),
            },
            required=False,
        ),
    }
)


def _read(value: Any, section: _Section, source: str, path: str) -> dict[str, Any]:
    """Check `value` against `section` and return it with every default filled in."""
    if not isinstance(value, dict):
        _fail(source, path, f"must be a mapping, got {_show(value)}")

    def where(key: Any) -> str:
        return f"{path}.{key}" if path else str(key)

    if isinstance(section.keys, _Kind):  # open mapping: any key, values of one kind
        for key, item in value.items():
            if not section.keys.test(item):
                _fail(source, where(key), f"must be {section.keys.what}, got {_show(item)}")
        return dict(value)

    for key in value:
        if key not in section.keys:
            _fail(source, where(key), f"unknown key (expected one of: {', '.join(section.keys)})")

    result: dict[str, Any] = {}
    for key, spec in section.keys.items():
        if isinstance(spec, _Section):
            if key not in value and spec.required:
                _fail(source, where(key), "missing required section")
            result[key] = _read(value.get(key, {}), spec, source, where(key))
        elif key not in value:
            if spec.default is _REQUIRED:
                _fail(source, where(key), "missing required key")
            result[key] = spec.default
        elif not spec.kind.test(value[key]):
            _fail(source, where(key), f"must be {spec.kind.what}, got {_show(value[key])}")
        else:
            result[key] = value[key]
    return result


def machine_from_dict(document: Any, source: str = "<config>") -> Machine:
    """Build a Machine from a parsed config; `source` names it in error messages."""
    config = _read(document, _SCHEMA, source, "")
    timing = config["timing"]
    external = config["external_memory"]
    on_chip = config["on_chip_memory"]
    moves = config["data_movement"]
    compute = config["compute"]
    array = compute["processor_array"]

    # GB/s over G cycles/s: bytes per cycle of the config clock.
    channel_bytes_per_cycle = _rate(external["bandwidth_gbps"]) / timing["clock_ghz"]
    if channel_bytes_per_cycle < MIN_RATE:
        _fail(source, "external_memory.bandwidth_gbps",
              f"gives {channel_bytes_per_cycle:g} bytes per cycle at timing.clock_ghz {timing['clock_ghz']}, "
              f"below the floor of {MIN_RATE}")

    l1_count = on_chip["l1"]["buffer_count"]
    if l1_count is None:
        # kpu-sim: every edge of the array has an ingress and an egress buffer per row/column.
        l1_count = 4 * (array["rows"] + array["cols"])

    return Machine(
        name=config["name"] if config["name"] is not None else Path(source).stem,
        clock_ghz=float(timing["clock_ghz"]),
        external=ExternalMemory(
            channels=external["bank_count"],
            channel_bytes=external["bank_capacity_mb"] * MB,
            channel_bytes_per_cycle=channel_bytes_per_cycle,
            latency_cycles=timing["dram_latency_cycles"],
        ),
        l3=MemoryLevel(on_chip["l3"]["tile_count"], on_chip["l3"]["tile_capacity_kb"] * KB),
        l2=MemoryLevel(on_chip["l2"]["bank_count"], on_chip["l2"]["bank_capacity_kb"] * KB),
        l1=MemoryLevel(l1_count, on_chip["l1"]["buffer_capacity_kb"] * KB),
        l2_bank_ports=timing["l2_bank_ports"],
        line_bytes=timing["line_bytes"],
        engines=Engines(
            dma=moves["dma_engine_count"],
            block_mover=moves["block_mover_count"],
            streamer=moves["streamer_count"],
            dma_bytes_per_cycle=_rate(timing["dma_bytes_per_cycle"]),
            block_mover_bytes_per_cycle=_rate(timing["block_mover_bytes_per_cycle"]),
            streamer_bytes_per_cycle=_rate(timing["streamer_bytes_per_cycle"]),
        ),
        compute=ComputeFabric(
            tiles=compute["tile_count"],
            rows=array["rows"],
            cols=array["cols"],
            dataflows=tuple(timing["dataflows"]),
        ),
    )


def _parse(text: str, suffix: str, source: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            _fail(source, f"line {e.lineno}, column {e.colno}", f"invalid JSON: {e.msg}")
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        _fail(source, where, f"invalid YAML: {e.problem or e.context}")
    except yaml.YAMLError as e:
        _fail(source, "", f"invalid YAML: {e}")


def load_machine(path: str | os.PathLike[str]) -> Machine:
    """Read a config file (.json, .yaml or .yml), or a shipped config by name, and build its Machine."""
    source = resolve_config(os.fspath(path))
    suffix = Path(source).suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        _fail(source, "", f"unsupported extension {suffix!r}; expected .json, .yaml or .yml")
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as e:
        _fail(source, "", f"cannot read: {e.strerror or e}")
    except UnicodeDecodeError:
        _fail(source, "", "cannot read: not UTF-8 text")
    return machine_from_dict(_parse(text, suffix, source), source)


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
