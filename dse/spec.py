"""The sweep spec: which machines, which workloads, which objectives.

A spec is a YAML (`.yaml`, `.yml`) or JSON (`.json`) mapping; paths in it are relative to its
own folder, so a spec and its models travel together:

    base: standard                # a shipped config name, or a config path
    accelerator: kpu0             # optional: the KPU of a system-schema base with several
    workloads:                    # model files, each compiled for every point's machine
      - mobilenet_v1.dfg          # named by its stem...
      - {name: gemm, path: matmul_256.dfg}   # ...or by `name`
    axes:                         # the points are every combination of one value per axis
      - name: array               # the axis's column in results.csv
        keys: [compute.processor_array.rows, compute.processor_array.cols]   # tied: move together
        values: [8, 16, 32, 64]   # a scalar sets every key; a list sets one value per key
        label: "{0}x{1}"          # how a point shows this axis: {i} is key i's value
      - name: l2_kb
        key: on_chip_memory.l2.bank_capacity_kb
        range: {start: 64, stop: 256, factor: 4}   # or {start, stop, step}; stop included
        label: "{} KiB L2 banks"
    objectives: [latency, energy] # at least two of cycles, latency, energy, area, utilization
    dataflow: auto                # auto | os | ws | is, as kpu-kernel-compiler --dataflow
    fusion: true                  # as kpu-kernel-compiler --fusion/--no-fusion
    binder: cp-sat                # cp-sat | greedy, as kpu-loader --binder

A key path is the dotted path of a key in the config (`timing.clock_ghz`); `[i]` picks item i of
a list and `[*]` every item (the system schema lists every bank: `accelerators[0].kpu.memory.
l2_banks[*].capacity_kb`). A key the base config lacks is added, except under a `[*]`: that path
must be in every item it reaches. Two key paths where one holds the other (`timing`,
`timing.clock_ghz`) or that name the same item are a spec error, as is one the config reader does not
know, as is every other mistake the spec itself holds: `SpecError`, one line
naming the file, the place in it and the reason. A value the config reader refuses for a point,
or a combination of values, is not: that point is a failed row of the results.

A row's key (`Spec.job`) names all that decides what the row measures: the point's whole config,
the model's bytes, the compile and bind options, and the toolchain's code: a digest of the source
files of the packages that compile, bind, simulate and cost a point (`TOOLCHAIN`: dfx,
kernel_compiler, hardware, loader, and dse's own `point.py`), with OR-Tools' version when the
binder is CP-SAT. It is read once, when the spec is read, on the client: a rerun after a change to
the compiler, the simulator or the default energy and area figures evaluates every point again
instead of reusing rows the old code measured. Workers are expected to run the client's code.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import math
import re
import string
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator

from .point import Job

# the objectives: results column, whether larger is better, the unit shown and its scale
OBJECTIVES: dict[str, tuple[str, bool, str, float]] = {
    "cycles": ("cycles", False, "cycles", 1.0),
    "latency": ("latency_s", False, "µs", 1e6),
    "energy": ("energy_pj", False, "µJ", 1e-6),
    "area": ("area_mm2", False, "mm²", 1.0),
    "utilization": ("utilization", True, "%", 100.0),
}
DATAFLOWS = ("auto", "os", "ws", "is")
KB, MB, GB = 1 << 10, 1 << 20, 1 << 30
# Bounds that keep a typo (a step of 1 instead of 100) from making a sweep of years (a row takes
# seconds) that the client cannot even hold: it keeps every point's config document, and Dask a
# task per row.
MAX_AXIS_VALUES = 1000
MAX_ROWS = 100_000
# A spec is a few KB. Its nesting, keys and integer literals have the config reader's limits, as
# it is read by the config reader's parser (hardware.read_document).
MAX_SPEC_BYTES = 1 * MB
# The base config is read once, as the loader reads a config (hardware's own limit, which it does
# not export: a test holds the two equal), and each point's machine is made from that document.
MAX_CONFIG_BYTES = 32 * KB
# The client holds every model in memory and ships each to the cluster once. Protobuf refuses an
# ONNX model of 2 GB or more; a text model (.dfg, .hlo, .json) of a real network is a few MB.
MAX_ONNX_BYTES = 2 * GB
MAX_TEXT_MODEL_BYTES = 256 * MB
MAX_MODELS_BYTES = 4 * GB  # all the workloads of a sweep
# A key path names a key of a config, which nests at most 16 levels and whose lists are short:
# bounded before it is parsed (no int() of thousands of digits) and walked (one call a segment).
MAX_KEY_CHARS = 256
MAX_KEY_SEGMENTS = 32
MAX_INDEX_DIGITS = 9
# A label shows a point in the plot and the frontier tables: its fields' widths and precisions,
# and the text it gives for each value, are bounded before a stray `{:>1500000000}` builds 1.5 GB.
MAX_LABEL_FIELD = 100
MAX_SHOWN = 200
# the packages whose code decides what a row measures (see the module's docstring); and the
# module of dse that runs them
TOOLCHAIN = ("dfx", "kernel_compiler", "hardware", "loader")
TOOLCHAIN_MODULES = ("dse.point",)

_SPEC_KEYS = ("base", "accelerator", "workloads", "axes", "objectives", "dataflow", "fusion", "binder")
_AXIS_KEYS = ("name", "key", "keys", "values", "range", "label")
_RANGE_KEYS = ("start", "stop", "step", "factor")
_WORKLOAD_KEYS = ("name", "path")
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[(?:[0-9]+|\*)\])*)")
_INDEX = re.compile(r"\[([0-9]+|\*)\]")
_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class SpecError(ValueError):
    """A spec that cannot describe a sweep; str(e) is one line `file: place: reason`."""


@dataclass(frozen=True)
class Axis:
    name: str
    keys: tuple[str, ...]  # key paths of the config, all set by this axis
    values: tuple[Any, ...]  # as the spec gives them
    label: str  # a format string: {i} is the value key i gets

    def settings(self, value: Any) -> tuple[Any, ...]:
        """The value each key gets: a scalar sets every key, a list of one per key sets them apart."""
        if len(self.keys) > 1 and isinstance(value, list):
            return tuple(value)
        return (value,) * len(self.keys)

    def shown(self, value: Any) -> str:
        return self.label.format(*self.settings(value))


@dataclass(frozen=True)
class Workload:
    name: str
    path: str  # as shown in messages: the spec's folder joined with the path it gives
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class Point:
    values: tuple[Any, ...]  # one per axis, as the spec gives it
    config: dict[str, Any]  # the base config with the axes' values set


@dataclass(frozen=True)
class Spec:
    path: str
    base: str  # the base config as shown in messages
    document: dict[str, Any]  # the base config, parsed
    accelerator: str | None
    workloads: tuple[Workload, ...]
    axes: tuple[Axis, ...]
    objectives: tuple[str, ...]
    dataflow: str
    fusion: bool
    binder: str
    toolchain: str  # toolchain_digest(binder): the code that measures a row

    def points(self) -> Iterator[Point]:
        """Every combination of one value per axis, the last axis varying fastest."""
        for values in itertools.product(*(axis.values for axis in self.axes)):
            config = copy.deepcopy(self.document)
            for axis, value in zip(self.axes, values):
                for key, setting in zip(axis.keys, axis.settings(value)):
                    _set(config, _segments(key), setting)
            yield Point(values, config)

    def jobs(self) -> list[tuple[Point, Job]]:
        """One job per (point, workload), points outer: the order of the results table."""
        return [(point, self.job(point, w)) for point in self.points() for w in self.workloads]

    def job(self, point: Point, workload: Workload) -> Job:
        options = {"accelerator": self.accelerator, "dataflow": self.dataflow, "fusion": self.fusion,
                   "binder": self.binder}
        # the key names what the row measured: the whole machine (not only the axes' values, so
        # a changed base config is evaluated anew), the model's bytes, the options and the code
        identity = json.dumps({"config": point.config, "workload": workload.name, "model": workload.sha256,
                               "toolchain": self.toolchain, **options}, sort_keys=True, separators=(",", ":"),
                              ensure_ascii=True)
        return Job(key=hashlib.sha256(identity.encode()).hexdigest()[:16], workload=workload.name,
                   source=workload.path, config=point.config, config_source=self.base, **options)


def read_spec(path: str) -> Spec:
    """Read and check the spec at `path`; SpecError on any mistake in it."""
    from hardware import Unreadable
    from loader import BINDERS

    document = _parse(path)
    folder = Path(path).parent

    def fail(place: str, reason: str) -> SpecError:
        return SpecError(" ".join(f"{path}: {place}: {reason}".splitlines()))

    if not isinstance(document, dict):
        # an Unreadable says what it stands for: a JSON object with a key twice, a long integer
        got = f", got {document!r}" if isinstance(document, Unreadable) else ""
        raise SpecError(f"{path}: a spec is a mapping with the keys {', '.join(_SPEC_KEYS)}{got}")
    _closed(document, _SPEC_KEYS, "", fail)
    accelerator = _optional_str(document, "accelerator", "", fail)
    base, base_document = _base(document.get("base", "standard"), accelerator, folder, fail)
    workloads = _workloads(document.get("workloads"), folder, fail)
    axes = _axes(document.get("axes", []), base_document, accelerator, fail)
    rows = math.prod(len(a.values) for a in axes) * len(workloads)
    if rows > MAX_ROWS:
        raise fail("axes", f"{rows:,} rows ((point, workload) pairs), more than the {MAX_ROWS:,} a sweep may have")
    objectives = _objectives(document.get("objectives", ["latency", "area"]), fail)
    dataflow = _choice(document, "dataflow", DATAFLOWS, "auto", fail)
    fusion = _flag(document, "fusion", True, fail)
    binder = _choice(document, "binder", BINDERS, "cp-sat", fail)
    return Spec(path=path, base=base, document=base_document, accelerator=accelerator, workloads=workloads,
                axes=axes, objectives=objectives, dataflow=dataflow, fusion=fusion, binder=binder,
                toolchain=toolchain_digest(binder))


@functools.cache
def toolchain_digest(binder: str) -> str:
    """A digest of the code that measures a row with `binder` (`loader.source_digest` of the
    TOOLCHAIN packages and TOOLCHAIN_MODULES), read once per process."""
    from loader import source_digest

    return source_digest((*TOOLCHAIN, *TOOLCHAIN_MODULES), binder)


# ---- reading the file ------------------------------------------------------------------------


def _parse(path: str) -> Any:
    if "\0" in path:
        raise SpecError(f"{path!r}: a path cannot hold a NUL byte")
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise SpecError(f"{path}: unsupported spec type '{suffix}' (expected .yaml, .yml or .json)")
    from hardware import ConfigError, read_document_file

    try:
        return read_document_file(path, "spec", MAX_SPEC_BYTES)
    except ConfigError as e:  # the same one line `path: place: reason`
        raise SpecError(str(e)) from None


def _closed(mapping: dict[str, Any], keys: tuple[str, ...], place: str, fail) -> None:
    for key in mapping:
        if key not in keys:
            where = f"{place}.{key}" if place else str(key)
            raise fail(where, f"unknown key (expected one of: {', '.join(keys)})")


def _optional_str(mapping: dict[str, Any], key: str, place: str, fail) -> str | None:
    value = mapping.get(key)
    if value is not None and not (isinstance(value, str) and value):
        raise fail(f"{place}.{key}" if place else key, f"must be a non-empty string, got {value!r}")
    return value


def _choice(mapping: dict[str, Any], key: str, choices: tuple[str, ...], default: str, fail) -> str:
    value = mapping.get(key, default)
    if value not in choices:
        raise fail(key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _flag(mapping: dict[str, Any], key: str, default: bool, fail) -> bool:
    value = mapping.get(key, default)
    if not isinstance(value, bool):
        raise fail(key, f"must be true or false, got {value!r}")
    return value


# ---- the base config -------------------------------------------------------------------------


def _base(name: Any, accelerator: str | None, folder: Path, fail) -> tuple[str, dict[str, Any]]:
    """The base config's name for messages, and its document."""
    from hardware import ConfigError, machine_from_dict, read_document_file, resolve_config

    if not isinstance(name, str) or not name:
        raise fail("base", f"must be a shipped config name or a config path, got {name!r}")
    if "\0" in name:  # open() would raise ValueError: refused before any file is looked at
        raise fail("base", f"{name!r}: a path cannot hold a NUL byte")
    try:
        # a name with a suffix or a folder is a path, relative to the spec; else a shipped config
        shown = name if Path(name).is_absolute() or not (Path(name).suffix or "/" in name) else str(folder / name)
        source = resolve_config(shown)
        suffix = Path(source).suffix.lower()
        if suffix not in (".json", ".yaml", ".yml"):
            raise fail("base", f"{source}: unsupported extension {suffix!r}; expected .json, .yaml or .yml")
        # read once, and checked as the loader checks a config: the document the axes change is
        # the one that was checked
        document = read_document_file(source, "config", MAX_CONFIG_BYTES)
        machine_from_dict(document, source, accelerator)
    except ConfigError as e:
        raise fail("base", str(e)) from None
    return shown, document


# ---- workloads --------------------------------------------------------------------------------


def _workloads(value: Any, folder: Path, fail) -> tuple[Workload, ...]:
    from dfx import InputFileError, read_input_file, size_words
    from kernel_compiler import GRAPH_EXTENSIONS, graph_extension

    if not isinstance(value, list) or not value:
        raise fail("workloads", "must be a non-empty list of model files (or {name, path} mappings)")
    workloads: dict[str, Workload] = {}
    held = 0  # bytes of the models read so far
    for i, item in enumerate(value):
        place = f"workloads[{i}]"
        if isinstance(item, dict):
            _closed(item, _WORKLOAD_KEYS, place, fail)
            given, name = item.get("path"), item.get("name")
        else:
            given, name = item, None
        if not isinstance(given, str) or not given:
            raise fail(place, f"must be a model path or a {{name, path}} mapping, got {item!r}")
        if "\0" in given:  # open() would raise ValueError: refused before any file is looked at
            raise fail(f"{place}.path" if isinstance(item, dict) else place,
                       f"{given!r}: a path cannot hold a NUL byte")
        path = given if Path(given).is_absolute() else str(folder / given)
        ext = graph_extension(path)  # as the compiler picks its frontend
        if ext is None:
            raise fail(place, f"{path}: unsupported model type (expected {', '.join(GRAPH_EXTENSIONS)})")
        if name is None:
            name = Path(path).name[: -len(ext)]
        if not isinstance(name, str) or not _plain(name):
            raise fail(f"{place}.name", f"must be a printable name of 1 to 100 characters, got {name!r}")
        if name in workloads:
            raise fail(place, f"the name '{name}' is also {workloads[name].path}'s; give one a `name`")
        try:
            data = read_input_file(path, f"{ext} model", MAX_ONNX_BYTES if ext == ".onnx" else MAX_TEXT_MODEL_BYTES)
        except InputFileError as e:
            raise fail(place, str(e)) from None
        held += len(data)
        if held > MAX_MODELS_BYTES:
            raise fail(place, f"{path}: the models up to this one come to {size_words(held)}, more than the "
                              f"{size_words(MAX_MODELS_BYTES)} a sweep's workloads may hold in all")
        if ext == ".onnx":
            _self_contained_onnx(path, data, place, fail)
        workloads[name] = Workload(name, path, data)
    return tuple(workloads.values())


def _self_contained_onnx(path: str, data: bytes, place: str, fail) -> None:
    """The workers get the model's bytes alone: an ONNX model whose tensors keep their data in
    external files would send them looking for those files on their own disks."""
    import onnx
    from onnx import external_data_helper

    try:
        model = onnx.load_model_from_string(data)
    except Exception:  # protobuf's DecodeError and kin: the compiler words it, per point
        return
    for tensor in external_data_helper._get_all_tensors(model):
        if external_data_helper.uses_external_data(tensor):
            raise fail(place, f"{path}: tensor '{tensor.name}' keeps its data in an external file, which the "
                              "workers cannot read; save the model with its data inside "
                              "(onnx.save(model, path, save_as_external_data=False))")


def _plain(name: str) -> bool:
    return 0 < len(name) <= 100 and name.isprintable()


# ---- axes -------------------------------------------------------------------------------------


def _axes(value: Any, base: dict[str, Any], accelerator: str | None, fail) -> tuple[Axis, ...]:
    if not isinstance(value, list):
        raise fail("axes", "must be a list of axes, each {name, key or keys, values or range, label}")
    axes: list[Axis] = []
    setters: list[tuple[str, list[str | int | None], str]] = []  # (key path, its segments, the axis setting it)
    from .point import MEASURES
    from .results import key_columns

    reserved = set(key_columns(())) | set(MEASURES)
    for i, item in enumerate(value):
        place = f"axes[{i}]"
        if not isinstance(item, dict):
            raise fail(place, f"must be a mapping with the keys {', '.join(_AXIS_KEYS)}, got {item!r}")
        _closed(item, _AXIS_KEYS, place, fail)
        name = item.get("name")
        if not isinstance(name, str) or not _AXIS_NAME.fullmatch(name):
            raise fail(f"{place}.name", f"must be a name of letters, digits and _ (a results column), got {name!r}")
        if name in reserved or any(a.name == name for a in axes):
            raise fail(f"{place}.name", f"'{name}' is already a column of the results")
        keys = _keys(item, place, fail)
        where = f"{place}.{'key' if 'key' in item else 'keys'}"
        for key in keys:
            # two paths where one holds the other (timing, timing.clock_ghz) or that name the same
            # item (l2_banks[*].x, l2_banks[0].x): setting one would overwrite, or walk into, the other
            segments = _segments(key)
            for other, other_segments, owner in setters:
                if not _overlap(segments, other_segments):
                    continue
                if key == other:
                    raise fail(place, f"{key} is also set by axis '{owner}'")
                how = "is within" if len(segments) > len(other_segments) else \
                    "holds" if len(segments) < len(other_segments) else "names an item of"
                if owner == name:
                    raise fail(where, f"{key} {how} {other}, also a key of this axis; an axis sets each config "
                                      "value once")
                raise fail(where, f"{key} {how} {other}, set by axis '{owner}'; an axis may not set what another sets")
            setters.append((key, segments, name))
        values = _values(item, len(keys), place, fail)
        label = item.get("label", f"{name}=" + "/".join(f"{{{k}}}" for k in range(len(keys))))
        axis = Axis(name, keys, values, _label(label, len(keys), f"{place}.label", fail))
        for j, v in enumerate(values):
            try:
                shown = axis.shown(v)
            except (IndexError, KeyError, ValueError, TypeError) as e:  # `{:d}` of a string, `{:>5}` of a list
                raise fail(f"{place}.label", f"cannot show values[{j}] {v!r}: {e}") from None
            if len(shown) > MAX_SHOWN:
                raise fail(f"{place}.label", f"shows values[{j}] in {len(shown):,} characters, more than the "
                                             f"{MAX_SHOWN} a label may have")
        for key in keys:
            _check_key(base, key, axis.settings(values[0])[keys.index(key)], accelerator, f"{place}", fail)
        axes.append(axis)
    # every point sets the same paths, which no value changes the shape of (no path holds another):
    # if the first point can be made, every one can, and Spec.points() never fails
    document = copy.deepcopy(base)
    for i, axis in enumerate(axes):
        for key, setting in zip(axis.keys, axis.settings(axis.values[0])):
            try:
                _set(document, _segments(key), setting)
            except _Unset:
                raise fail(f"axes[{i}]", f"{key}: the base config has no place for this key") from None
    return tuple(axes)


def _keys(item: dict[str, Any], place: str, fail) -> tuple[str, ...]:
    if ("key" in item) == ("keys" in item):
        raise fail(place, "needs `key` (one config key path) or `keys` (several that move together), one of them")
    keys = [item["key"]] if "key" in item else item["keys"]
    where = f"{place}.{'key' if 'key' in item else 'keys'}"
    if not isinstance(keys, list) or not keys:
        raise fail(where, f"must be a non-empty list of config key paths, got {keys!r}")
    for key in keys:
        if not isinstance(key, str):
            raise fail(where, f"{key!r} is not a key path like compute.processor_array.rows")
        try:
            _segments(key)
        except _BadKey as e:
            raise fail(where, f"{_clip(key)!r}: {e}") from None
    if len(set(keys)) < len(keys):
        raise fail(where, "names a key path twice")
    return tuple(keys)


def _values(item: dict[str, Any], nkeys: int, place: str, fail) -> tuple[Any, ...]:
    if ("values" in item) == ("range" in item):
        raise fail(place, "needs `values` (a list) or `range` ({start, stop, step or factor}), one of them")
    if "range" in item:
        values = _range(item["range"], f"{place}.range", fail)
    else:
        values = item["values"]
        if not isinstance(values, list):
            raise fail(f"{place}.values", f"must be a list, got {values!r}")
    if not values:
        raise fail(f"{place}.values" if "values" in item else f"{place}.range", "an axis needs at least one value")
    if len(values) > MAX_AXIS_VALUES:
        raise fail(place, f"{len(values):,} values, more than the {MAX_AXIS_VALUES} an axis may have")
    seen: dict[str, int] = {}
    for j, v in enumerate(values):
        where = f"{place}.values[{j}]"
        if not _setting(v):
            raise fail(where, f"must be a finite number, a string, true/false or a list of them, got {_given(v)}")
        if nkeys > 1 and isinstance(v, list) and len(v) != nkeys:
            raise fail(where, f"a list sets one value per key: {nkeys} keys, {len(v)} values")
        text = json.dumps(v, sort_keys=True)
        if text in seen:
            raise fail(where, f"{v!r} is also values[{seen[text]}]")
        seen[text] = j
    return tuple(values)


def _range(value: Any, place: str, fail) -> list[Any]:
    """start, start + step, ... or start, start * factor, ... up to stop, stop included."""
    if not isinstance(value, dict):
        raise fail(place, f"must be a mapping {{start, stop, step}} or {{start, stop, factor}}, got {value!r}")
    _closed(value, _RANGE_KEYS, place, fail)
    for key in ("start", "stop"):
        if not _number(value.get(key)):
            raise fail(f"{place}.{key}", f"must be a finite number, got {value.get(key)!r}")
    if ("step" in value) == ("factor" in value):
        raise fail(place, "needs `step` (added) or `factor` (multiplied), one of them")
    start, stop = value["start"], value["stop"]
    if stop < start:
        raise fail(place, f"stop {stop} is below start {start}")
    by = "step" if "step" in value else "factor"
    amount = value[by]
    if not _number(amount) or (amount <= 0 if by == "step" else amount <= 1) or (by == "factor" and start <= 0):
        need = "a number above 0" if by == "step" else "a number above 1, with a start above 0"
        raise fail(f"{place}.{by}", f"must be {need}, got {amount!r}")
    integral = all(isinstance(v, int) for v in (start, amount))
    values: list[Any] = []
    if by == "step":
        # start + n * step computed exactly from the numbers as the spec writes them (0.1 is the
        # decimal 0.1, not the float nearest it), then made a float: -0.3 + 3 * 0.1 is 0, 0.1 + 2 *
        # 0.1 reaches a stop of 0.3
        first, step, last = (_decimal(v) for v in (start, amount, stop))
        for n in itertools.count():
            exact = first + n * step
            if exact > last:
                break
            if len(values) == MAX_AXIS_VALUES:
                raise fail(place, f"gives more than the {MAX_AXIS_VALUES} values an axis may have")
            values.append(int(exact) if integral else float(exact))  # at most stop: a finite float
        return values
    slack = 1e-9 * max(abs(start), abs(stop), 1)
    for n in itertools.count():
        v = _power(start, amount, n)
        if v > stop + slack or not math.isfinite(v):  # a float past the largest one is inf
            break
        if len(values) == MAX_AXIS_VALUES:
            raise fail(place, f"gives more than the {MAX_AXIS_VALUES} values an axis may have")
        # each value computed from start, not multiplied up, and rounded so that 0.1 * 3 shows as 0.3
        values.append(v if integral else float(f"{v:.12g}"))
    return values


def _decimal(v: int | float) -> Fraction:
    """A number as the spec writes it: a float by its shortest text (0.1 is 1/10)."""
    return Fraction(v) if isinstance(v, int) else Fraction(repr(v))


def _power(start: int | float, factor: int | float, n: int) -> int | float:
    """start * factor**n; a float beyond the largest float is inf."""
    try:
        return start * factor**n
    except OverflowError:  # a float factor**n past the largest float, which a start below 1 may bring back
        try:
            return float(Fraction(start) * Fraction(factor) ** n)
        except OverflowError:
            return math.inf


def _setting(v: Any) -> bool:
    """A value a config key can take, as JSON holds it (YAML also reads dates and NaN)."""
    if isinstance(v, list):
        return all(map(_setting, v))
    return isinstance(v, (str, bool)) or _number(v)


def _number(v: Any) -> bool:
    """A finite number; an integer of more than MAX_INT_CHARS digits is none (a range can make one)."""
    from hardware import MAX_INT_CHARS

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return len(str(abs(v))) <= MAX_INT_CHARS if isinstance(v, int) else math.isfinite(v)


def _given(v: Any) -> str:
    """A value as a message shows it: a long integer by its length, as the config reader words it."""
    from hardware import MAX_INT_CHARS

    if isinstance(v, int) and not isinstance(v, bool) and len(str(abs(v))) > MAX_INT_CHARS:
        return f"an integer of {len(str(abs(v)))} digits (at most {MAX_INT_CHARS})"
    return repr(v)


def _label(label: Any, nkeys: int, place: str, fail) -> str:
    """A format string whose fields are only {} or {i}, i below the key count: no attribute or
    item access, no nested fields, no width or precision above MAX_LABEL_FIELD."""
    if not isinstance(label, str) or not _plain(label):
        raise fail(place, f"must be a printable format string like '{{}} GB/s', got {label!r}")
    try:
        fields = [(field, spec) for _, field, spec, _ in string.Formatter().parse(label) if field is not None]
    except ValueError as e:
        raise fail(place, f"{label!r}: {e}") from None
    for field, spec in fields:
        if not (field == "" or (field.isascii() and field.isdigit() and int(field) < nkeys)) or "{" in (spec or ""):
            fields = "{} or {0} (the value)" if nkeys == 1 else f"{{}} or {{0}} to {{{nkeys - 1}}} (each key's value)"
            raise fail(place, f"{label!r}: the fields are {fields}, not {{{field}{':' + spec if spec else ''}}}")
        # the numbers of a format spec are its width and precision (and a fill that is a digit)
        widest = max(map(int, re.findall(r"[0-9]+", spec or "")), default=0)
        if widest > MAX_LABEL_FIELD:
            raise fail(place, f"{label!r}: a field's width and precision are at most {MAX_LABEL_FIELD}, not {widest}")
    return label


def _objectives(value: Any, fail) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) < 2:
        raise fail("objectives", f"must be a list of at least two of {', '.join(OBJECTIVES)} (a frontier trades "
                                 f"one against another), got {value!r}")
    for i, name in enumerate(value):
        if not isinstance(name, str) or name not in OBJECTIVES:  # a list or mapping is no key of it
            raise fail(f"objectives[{i}]", f"unknown objective {name!r} (expected one of: {', '.join(OBJECTIVES)})")
        if name in value[:i]:
            raise fail(f"objectives[{i}]", f"{name} is given twice")
    return tuple(value)


# ---- key paths ----------------------------------------------------------------------------------


class _BadKey(ValueError):
    """Why a text is no key path."""


def _segments(key: str) -> list[str | int | None]:
    """`a.b[2][*]` -> ['a', 'b', 2, None]: a name, an index, or None for every item. _BadKey
    for a text that is no key path, or one longer or deeper than a config key can be."""
    if len(key) > MAX_KEY_CHARS:
        raise _BadKey(f"{len(key):,} characters, more than the {MAX_KEY_CHARS} a key path may have")
    out: list[str | int | None] = []
    for part in key.split("."):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise _BadKey("not a key path like compute.processor_array.rows")
        out.append(match.group(1))
        for index in _INDEX.findall(match.group(2)):
            if len(index) > MAX_INDEX_DIGITS:
                raise _BadKey(f"an index of {len(index)} digits; a list's index has at most {MAX_INDEX_DIGITS}")
            out.append(None if index == "*" else int(index))
    if len(out) > MAX_KEY_SEGMENTS:
        raise _BadKey(f"{len(out)} names and indices deep, more than the {MAX_KEY_SEGMENTS} a key path may be")
    return out


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Unset(Exception):
    """A key path the config does not have the shape for (see _check_key, which refuses them)."""


def _set(node: Any, segments: list[str | int | None], value: Any, add: bool = True) -> None:
    """Set the key at `segments` (checked by _check_key) to a copy of `value`, adding missing
    sections, but none under a [*]. _Unset where the config has not the shape the path needs."""
    head, rest = segments[0], segments[1:]
    if head is None or isinstance(head, int):
        if not isinstance(node, list) or (head is not None and head >= len(node)):
            raise _Unset
        if head is None:  # every item of the list
            for index in range(len(node)):
                _set(node, [index, *rest], value, False)
            return
    elif not isinstance(node, dict) or (not add and head not in node):
        raise _Unset
    if not rest:
        node[head] = copy.deepcopy(value)
        return
    if isinstance(head, str) and head not in node:
        node[head] = {}
    _set(node[head], rest, value, add)


def _text(segments: list[str | int | None]) -> str:
    out = ""
    for s in segments:
        out += f"[{'*' if s is None else s}]" if not isinstance(s, str) else (f".{s}" if out else s)
    return out


def _overlap(a: list[str | int | None], b: list[str | int | None]) -> bool:
    """Whether two key paths touch the same config value: one is a prefix of the other, item by
    item, with [*] matching every index."""
    for x, y in zip(a, b):
        if isinstance(x, str) or isinstance(y, str) or (x is not None and y is not None):
            if x != y:
                return False
    return True


def _check_key(base: dict[str, Any], key: str, probe: Any, accelerator: str | None, place: str, fail) -> None:
    """A key path must lead through the base config's sections and lists to a key the config
    reader knows. Where the base has the key, it is known; where it lacks it, the reader is asked,
    with the key set to the axis's first value: only its 'unknown key' refusal makes a spec error.
    A path through a [*] must be in every item the [*] reaches, whole: the base has it, and each
    [i] after it is in range; nothing is added under a [*] (an item of another kind, such as a GPU
    among KPUs, would get sections it never has)."""
    from hardware import ConfigError, machine_from_dict

    segments = _segments(key)
    missing: list[int] = []  # where the path leaves the base config, on a path without [*]

    def walk(node: Any, n: int, trail: list[str | int | None], every: bool) -> None:
        if n == len(segments):
            return
        s = segments[n]
        if isinstance(s, str):
            if not isinstance(node, dict):
                raise fail(place, f"{key}: {_text(trail)} is a value ({node!r}), not a section")
            if s not in node:
                if every:
                    raise fail(place, f"{key}: {_text(trail)} has no key '{s}'; a path through [*] must be in "
                                      "every item it reaches")
                if any(not isinstance(t, str) for t in segments[n:]):
                    raise fail(place, f"{key}: the base config has no list at {_text(segments[: n + 1])} to index")
                missing.append(n)
                return
            walk(node[s], n + 1, [*trail, s], every)
        elif not isinstance(node, list):
            raise fail(place, f"{key}: {_text(trail)} is not a list in the base config")
        elif not node:
            raise fail(place, f"{key}: {_text(trail)} is an empty list")
        elif s is not None:
            if s >= len(node):
                raise fail(place, f"{key}: {_text(trail)} has {len(node)} items, no [{s}]")
            walk(node[s], n + 1, [*trail, s], every)
        else:
            for i, item in enumerate(node):
                walk(item, n + 1, [*trail, i], True)

    walk(base, 0, [], False)
    if not missing:
        return  # the base config has the key (in every item a [*] reaches)
    n = missing[0]
    document = copy.deepcopy(base)
    _set(document, segments, probe)
    try:
        machine_from_dict(document, "<spec>", accelerator)
    except ConfigError as e:
        named = [_text(segments[: m + 1]) for m in range(n, len(segments))]
        if any(str(e).startswith(f"<spec>: {p}: unknown key") for p in named):
            reason = str(e).split(": unknown key", 1)[1].strip()
            raise fail(place, f"{key}: not a key of the config {reason}") from None
