"""Machine configs: the flat kpu-sim schema (JSON or YAML) plus our optional `timing` section.

`load_machine(path)` reads a `.json`, `.yaml` or `.yml` file, or a shipped config by name;
`machine_from_dict(document, source)` takes an already parsed document. Both return a `hardware.machine.Machine` or raise `ConfigError`,
whose message is one line naming the file, the dotted key (or the line) and the reason:

    configs/x.json: on_chip_memory.l2.bank_count: must be a positive integer up to 1048576, got 0

Units follow kpu-sim: KB = 1024 bytes, MB = 1024 KB, bandwidth in GB/s = 1e9 bytes per second.
Unknown keys are errors everywhere except inside `address_map`; booleans are never numbers.
YAML is read as YAML 1.1, so write large floats with a dot (`1.0e9`; a bare `1e9` is a string).

A config file is at most 32 KB of UTF-8, nested at most 16 levels, with no key twice in a mapping
and no integer literal longer than 64 characters; YAML anchors and aliases are refused, as are
tags other than YAML's own (such as `!!python/object`). Every number is bounded so that the
machine it describes stays inside the model: counts of at most 2^20 and capacities of at most
2^20 KB (on chip) or MB (a channel), so a level's total is at most 2^60 bytes and one on-chip
buffer moves in under 2^40 cycles even at the slowest rate; DRAM latency of at most 10^6 cycles;
at most 1024 cycles per element of a vector lane. Each bound's reason is beside its definition
below.

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
| `timing.vector_lanes` | int in [1, 2^20] | `compute.processor_array.cols` | lanes of one compute tile's vector unit (elements it works on at once) |
| `timing.vector_cycles_per_element.{simple, transcendental, reduction}` | ints in [1, 1024], cycles | `1`, `4`, `1` | cycles one lane spends per element of that op class |
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
from pathlib import Path
from typing import Any, NoReturn

import yaml

from hardware.machine import (
    DATAFLOWS,
    VECTOR_CYCLES_PER_ELEMENT,
    ComputeFabric,
    Engines,
    ExternalMemory,
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
                "dram_latency_cycles": _Key(_LATENCY, 100),
                "dma_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
                "block_mover_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
                "streamer_bytes_per_cycle": _Key(_RATE_OR_UNLIMITED, 64),
                "l2_bank_ports": _Key(_COUNT, 1),
                "line_bytes": _Key(_LINE, 64),
                "dataflows": _Key(_DATAFLOW_LIST, list(DATAFLOWS)),
                "vector_lanes": _Key(_COUNT, default=None),  # None: compute.processor_array.cols
                "vector_cycles_per_element": _Section(
                    {op_class: _Key(_CYCLES_PER_ELEMENT, cycles)
                     for op_class, cycles in VECTOR_CYCLES_PER_ELEMENT.items()},
                    required=False,
                ),
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
        return f"{path}.{_show_key(key)}" if path else _show_key(key)

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
        vector=VectorUnit(
            # as Machine's default: one lane per array column, to keep up with the array's output
            lanes=timing["vector_lanes"] if timing["vector_lanes"] is not None else array["cols"],
            cycles_per_element=timing["vector_cycles_per_element"],
        ),
    )


class _Unreadable:
    """Stands in for a value the parser must not build (an integer literal too long to convert, a
    JSON object with a key twice). It fails every kind, so the schema check names its key; for
    JSON that is the only place we can name, as json.loads reports no position to its hooks."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


def _long_int(literal: str) -> _Unreadable:
    return _Unreadable(f"an integer literal of {len(literal)} characters (at most {MAX_INT_CHARS})")


def _json_int(literal: str) -> int | _Unreadable:
    return _long_int(literal) if len(literal) > MAX_INT_CHARS else int(literal)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Unreadable:
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:  # json.loads would keep the last silently
            return _Unreadable(f"a mapping with the key {_show(key)} twice")
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


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python tags), refusing also what a config never needs and a
    hostile file could abuse, each as a YAML error at its line."""

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

    def construct_yaml_int(self, node: yaml.Node) -> int | _Unreadable:
        literal = self.construct_scalar(node)
        return _long_int(literal) if len(literal) > MAX_INT_CHARS else super().construct_yaml_int(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep)
        seen = set()
        for key_node, _ in node.value:  # a YAML mapping keeps the last of a key given twice
            key = self.construct_object(key_node)  # already built: this returns it
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {_show(key)} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return mapping


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)


def _parse(text: str, suffix: str, source: str) -> Any:
    if suffix == ".json":
        _check_json_depth(text, source)
        try:
            return json.loads(text, parse_int=_json_int, object_pairs_hook=_json_object)
        except json.JSONDecodeError as e:
            _fail(source, f"line {e.lineno}, column {e.colno}", f"invalid JSON: {e.msg}")
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = ", ".join(part for part in (e.context, e.problem) if part)
        _fail(source, where, f"invalid YAML: {_clip(reason, 200)}")
    except yaml.reader.ReaderError as e:  # a character YAML does not allow, such as NUL
        line = text.count("\n", 0, e.position) + 1
        _fail(source, f"line {line}", f"invalid YAML: unacceptable character #x{e.character:04x}")


def load_machine(path: str | os.PathLike[str]) -> Machine:
    """Read a config file (.json, .yaml or .yml), or a shipped config by name, and build its Machine."""
    source = resolve_config(os.fspath(path))
    suffix = Path(source).suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        _fail(source, "", f"unsupported extension {suffix!r}; expected .json, .yaml or .yml")
    try:
        with open(source, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)  # no further: the file may be huge, or endless
    except OSError as e:
        _fail(source, "", f"cannot read: {e.strerror or e}")
    if len(data) > MAX_CONFIG_BYTES:
        _fail(source, "", f"larger than {MAX_CONFIG_BYTES // KB} KB; a config is a few KB")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, as some editors write, is fine
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        _fail(source, f"line {line}", "cannot read: not UTF-8 text")
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
