"""The binding cache: a program's bindings kept on disk, so a second run of the same object on
the same machine skips the binder (and never imports OR-Tools), as the CUDA driver keeps the
code it compiled from PTX.

An entry is one JSON file named by the hash of its key:
- `object`: the sha256 of the object file's bytes;
- `config`: the sha256 of the machine as the loader read it (every field of `hardware.Machine`
  but its energy and area models, canonical JSON), so a config's layout, comments or schema (flat or system) do not matter but
  any value the binders see does, defaults included; with `accelerator`, the `--accelerator` given;
- `binder`: `cp-sat` or `greedy`;
- `loader`: the loader's version, a sha256 of the sources of the packages a binding depends on
  (`dfx`, `hardware`, `loader`; `source_digest`) and, for CP-SAT, OR-Tools' version:
  a binding is only as current as the code that made it.

An entry holds its key, `format` and `version` (CACHE_VERSION), the field names and types of
the dataclasses it stores (`schema`), and the bindings, written by walking `dataclasses.fields`
so the entry follows those classes as they change. Nothing read is trusted: an entry that
cannot be read or parsed, of another format, version, schema or key, or whose bindings do not
bind exactly the kernels' buffers and streams inside this machine (see `check`), is a miss;
the program is bound again and the entry replaced. Entries are written to a temp file in the
cache directory and renamed into place, so a reader never sees half an entry.

The cache folder may be shared or tampered with, so an entry is read only where it is a regular
file of one name, at most MAX_ENTRY_BYTES: a link (to a file outside the cache, say), a hard link,
a FIFO or a device there is a miss, never followed or read, and the new entry replaces the name,
never what it points to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from dfx import InputFileError, Program, below_homes, read_input_file
from dfx.input_files import MB
from dfx.objfile import MAX_OBJECT_BYTES
from hardware import Machine

from .binding import Binding, engine_count
from .buffers import home_layout, kernel_demands, l2_home_layout, level_banks
from .chains import chains_overlap
from .schedule import workers_for

FORMAT = "kpu-binding-cache"
CACHE_VERSION = 1
PACKAGES = ("dfx", "hardware", "loader")  # whose code decides a binding
# An entry holds a few hundred bytes per bound buffer: a whole network's is well under 1 MB.
MAX_ENTRY_BYTES = 64 * MB
# The largest source file of the packages is about 50 KB.
MAX_SOURCE_BYTES = 16 * MB


class EntryError(ValueError):
    """A cache entry that must not be used; str(e) says why."""


@dataclass
class CacheUse:
    """What the cache did for one run: `state` is hit, miss or off; `reason` why a miss missed;
    `warning` one line when the entry could not be written."""

    state: str
    path: Path | None = None  # the entry
    reason: str = ""
    warning: str | None = None

    def line(self) -> str:
        if self.state == "off":
            return "binding cache: off (--no-cache)"
        if self.state == "hit":
            return f"binding cache: hit, bindings read from {self.path}"
        stored = "not stored" if self.warning or self.path is None else f"stored in {self.path}"
        return f"binding cache: miss ({self.reason}), bound and {stored}"


def cache_dir() -> Path:
    """`$KPU_CACHE_DIR`, else `$XDG_CACHE_HOME/kpu`, else `~/.cache/kpu`."""
    if os.environ.get("KPU_CACHE_DIR"):
        return Path(os.environ["KPU_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG spec has a relative XDG_CACHE_HOME ignored
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "kpu"


@cache
def loader_version(binder: str) -> str:
    """A digest of the code that makes a binding with `binder`, read once per process."""
    return source_digest(PACKAGES, binder)


def source_digest(names: tuple[str, ...], binder: str) -> str:
    """A digest of the code of the packages and modules `names`: their source files (.py, and the
    .json a package reads, such as the object file's schema), each named by its path within them,
    found without importing them; and OR-Tools' version when `binder` is CP-SAT (read from its
    metadata, not imported: that costs a third of a second)."""
    digest = hashlib.sha256()
    for name in names:
        found = importlib.util.find_spec(name)
        if found is None or found.origin is None:  # not installed: nothing can run with it anyway
            digest.update(f"{name}: missing\0".encode())
            continue
        origin = Path(found.origin)
        files = [origin]
        if found.submodule_search_locations:  # a package: every file under it, links not followed
            files = sorted(Path(folder, f) for folder, subfolders, names_ in os.walk(origin.parent)
                           if "__pycache__" not in Path(folder).parts
                           for f in names_ if Path(f).suffix in (".py", ".json"))
        for file in files:
            digest.update(f"{name}/{file.relative_to(origin.parent).as_posix()}\0".encode())
            try:
                digest.update(read_input_file(file, "source file", MAX_SOURCE_BYTES))
            except InputFileError as e:  # a FIFO or a huge file among the sources: its refusal is its content
                digest.update(str(e).encode())
            digest.update(b"\0")
    if binder == "cp-sat":
        try:
            digest.update(f"ortools {importlib.metadata.version('ortools')}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(b"ortools: missing")
    return digest.hexdigest()


def _canonical(value: Any) -> bytes:
    # not orjson: it writes an unlimited rate (inf) as null, the stdlib as Infinity; default=str
    # keys a value JSON lacks (an enum, say) by its text
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def _binding_machine(machine: Machine) -> dict[str, Any]:
    """The machine's fields a binding depends on: all but the energy and area models, which
    cost a run and place nothing."""
    fields = dataclasses.asdict(machine)
    del fields["energy"], fields["area"]
    return fields


def cache_key(object_path: str, machine: Machine, accelerator: str | None, binder: str,
              object_sha256: str | None = None) -> dict[str, Any]:
    """`object_sha256`: the object file's, where its reader took it (`dfx.objfile.read_hashed`);
    else the file is read again (InputFileError where it cannot be)."""
    if object_sha256 is None:
        object_sha256 = hashlib.sha256(read_input_file(object_path, "kpu object file", MAX_OBJECT_BYTES)).hexdigest()
    return {"object": object_sha256,
            "config": hashlib.sha256(_canonical(_binding_machine(machine))).hexdigest(),
            "accelerator": accelerator, "binder": binder, "loader": loader_version(binder)}


def entry_path(directory: Path, key: dict[str, Any]) -> Path:
    return directory / f"bindings-{hashlib.sha256(_canonical(key)).hexdigest()}.json"


# --- (de)serialisation, driven by the dataclasses' fields and type hints

@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(hint: Any) -> str:
    return hint.__qualname__ if isinstance(hint, type) else str(hint)


@cache
def schema() -> dict[str, list[list[str]]]:
    """Every dataclass an entry stores (Binding and those its fields hold): its fields' names and types."""
    out: dict[str, list[list[str]]] = {}

    def visit(hint: Any) -> None:
        if dataclasses.is_dataclass(hint):
            if hint.__qualname__ in out:
                return
            out[hint.__qualname__] = [[f.name, _type_name(_hints(hint)[f.name])] for f in dataclasses.fields(hint)]
            for f in dataclasses.fields(hint):
                visit(_hints(hint)[f.name])
        for arg in typing.get_args(hint):
            visit(arg)

    visit(Binding)
    return out


def encode(value: Any) -> Any:
    """JSON values for a dataclass and what it holds; a dict becomes [key, value] pairs (its
    keys may be tuples), tuples become lists."""
    if dataclasses.is_dataclass(value):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [[encode(k), encode(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    raise TypeError(f"the binding cache cannot store a {type(value).__name__}")


def decode(value: Any, hint: Any) -> Any:
    """The value of type `hint` that `encode` wrote as `value`; EntryError where it does not fit."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        names = [f.name for f in dataclasses.fields(hint)]
        if not isinstance(value, dict) or sorted(value) != sorted(names):
            raise EntryError(f"{hint.__qualname__}: fields differ")
        values = {n: decode(value[n], _hints(hint)[n]) for n in names}
        try:
            return hint(**values)
        except (TypeError, ValueError) as e:  # a check of the class's own refused the values
            raise EntryError(f"{hint.__qualname__}: {e}") from None
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return decode(value, arm)
            except EntryError:
                continue
        raise EntryError(f"{value!r} is not a {hint}")
    if origin is list and isinstance(value, list):
        return [decode(v, args[0]) for v in value]
    if origin is tuple and isinstance(value, list):
        arms = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(arms) != len(value):
            raise EntryError(f"{value!r} is not a {hint}")
        return tuple(decode(v, a) for v, a in zip(value, arms))
    if origin is dict and isinstance(value, list):
        pairs = [decode(p, tuple[args[0], args[1]]) for p in value]
        out = dict(pairs)
        if len(out) != len(pairs):
            raise EntryError("a key repeats")
        return out
    if hint is type(None) and value is None:
        return None
    # bool is an int to isinstance: exact types only
    if hint in (str, int, float, bool) and type(value) is hint:
        return value
    raise EntryError(f"{value!r} is not a {hint}")


def entry_bytes(key: dict[str, Any], bindings: list[Binding]) -> bytes:
    return orjson.dumps({"format": FORMAT, "version": CACHE_VERSION, "schema": schema(), "key": key,
                         "bindings": encode(bindings)})


def parse_entry(data: bytes, key: dict[str, Any]) -> list[Binding]:
    """The bindings an entry holds, if it is an entry of this format, version, schema and key."""
    try:
        entry = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise EntryError(f"not JSON ({e})") from None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise EntryError("not a binding cache entry")
    if entry.get("version") != CACHE_VERSION or entry.get("schema") != schema():
        raise EntryError("written by another version of the loader")
    if entry.get("key") != key:
        raise EntryError("its key is another")
    return decode(entry.get("bindings"), list[Binding])


# --- validation: what the bindings claim, checked against the program and the machine

def check(bindings: list[Binding], program: Program, machine: Machine) -> None:
    """EntryError unless each binding is one the simulator can run as bound: one per kernel, in
    order, with a worker count the kernel allows; every buffer the kernel demands for that count
    bound exactly once, in the kernel's order, inside a bank of its level (L1: of its worker's compute tile), no two
    buffers live at once sharing a byte (a chain's kernels all live at once); an engine of the machine for every
    stream."""
    if len(bindings) != len(program.kernels):
        raise EntryError(f"{len(bindings)} bindings for {len(program.kernels)} kernels")
    l2_homes = l2_home_layout(program, machine)
    in_l2 = frozenset(h.tensor for h in l2_homes)
    homes = home_layout(program, machine, in_l2)
    kept = frozenset(h.tensor for h in homes)
    for i, (kernel, b) in enumerate(zip(program.kernels, bindings)):
        where = f"kernel '{kernel.name}'"
        if b.kernel != kernel.name:
            raise EntryError(f"{where}: the binding is of '{b.kernel}'")
        if not 1 <= b.workers <= workers_for(kernel, machine.compute.tiles):
            raise EntryError(f"{where}: {b.workers} compute tiles")
        if b.homes != [h for h in homes if h.live(i)] or b.l2_homes != [h for h in l2_homes if h.live(i)]:
            raise EntryError(f"{where}: the homes in L3 or L2 are not the program's")
        for level, level_homes in (("L3", homes), ("L2", l2_homes)):
            capacity = level_banks(machine, level)[1]
            limit = below_homes(level_homes, i, capacity)
            if limit < capacity and any(bb.buffer.level == level and bb.end > limit for bb in b.buffers):
                raise EntryError(f"{where}: an {level} buffer reaches into a home")
        buffers, streams = kernel_demands(kernel, program, b.workers, kept, machine.line_bytes, in_l2)
        # each once, in the kernel's order, as every binder keeps them (see estimate_makespan)
        if [bb.buffer for bb in b.buffers] != buffers:
            raise EntryError(f"{where}: the bound buffers are not the kernel's")
        by_bank: dict[tuple[str, int, int], list] = {}
        for bb in b.buffers:
            count, size = level_banks(machine, bb.buffer.level)
            if not (0 <= bb.bank < count and 0 <= bb.address and bb.end <= size):
                raise EntryError(f"{where}: buffer of op {bb.buffer.op_id} outside the {bb.buffer.level} banks")
            by_bank.setdefault((bb.buffer.level, bb.buffer.owner, bb.bank), []).append(bb)
        for members in by_bank.values():
            members.sort(key=lambda bb: bb.address)
            for i, x in enumerate(members):
                for y in members[i + 1:]:
                    if y.address >= x.end:
                        break
                    if x.buffer.live_start < y.buffer.live_end and y.buffer.live_start < x.buffer.live_end:
                        raise EntryError(f"{where}: buffers of ops {x.buffer.op_id} and {y.buffer.op_id} overlap")
        if set(b.engines) != {(s.op_id, s.worker) for s in streams}:
            raise EntryError(f"{where}: the engines are not assigned to the kernel's streams")
        for s in streams:
            if not 0 <= b.engines[s.op_id, s.worker] < engine_count(s.kind, machine):
                raise EntryError(f"{where}: op {s.op_id} on a {s.kind} the machine lacks")
    problem = chains_overlap(program, bindings)
    if problem is not None:
        raise EntryError(problem)


# --- reading and writing

# why an entry refused for what it is misses
_MISSES = {"missing": "no entry", "link": "the entry is a link, not followed",
           "hard link": "the entry has other names (hard links)"}


def load(path: Path, key: dict[str, Any], program: Program, machine: Machine) -> list[Binding]:
    """The entry's bindings; EntryError unless it is a regular file of one name (see the module
    doc), checked on the file opened, not its name, so an entry swapped meanwhile is not followed."""
    try:
        data = read_input_file(path, "binding cache entry", MAX_ENTRY_BYTES, follow_links=False)
    except InputFileError as e:
        if e.kind:
            raise EntryError(_MISSES.get(e.kind, "the entry is not a regular file")) from None
        raise EntryError(f"unreadable ({e})") from None
    bindings = parse_entry(data, key)
    check(bindings, program, machine)
    return bindings


def store(path: Path, data: bytes) -> None:
    """Write atomically: a temp file beside the entry, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".bindings-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def bind_cached(program: Program, machine: Machine, object_path: str, accelerator: str | None, binder: str,
                bind: Callable[[], list[Binding]], use_cache: bool = True,
                object_sha256: str | None = None) -> tuple[list[Binding], CacheUse]:
    """The program's bindings: from the cache when it holds a valid entry for this key, else from
    `bind()`, then stored. A cache that cannot be written costs a warning, never the run.
    `object_sha256`: as cache_key takes it."""
    if not use_cache:
        return bind(), CacheUse("off")
    directory = cache_dir()
    try:
        key = cache_key(object_path, machine, accelerator, binder, object_sha256)
    except InputFileError as e:  # the object went away since it was read: bind what was read
        return bind(), CacheUse("miss", reason=f"object unreadable: {e}")
    path = entry_path(directory, key)
    try:
        return load(path, key, program, machine), CacheUse("hit", path)
    except EntryError as e:
        use = CacheUse("miss", path, str(e))
    bindings = bind()
    try:
        store(path, entry_bytes(key, bindings))
    except OSError as e:
        use.warning = f"binding cache not written to {directory}: {e.strerror or e}"
    return bindings, use
