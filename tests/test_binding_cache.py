"""The binding cache: a second run of an object binds nothing (no OR-Tools), gives the same
bindings, cycles and outputs; an entry is never trusted; --no-cache, KPU_CACHE_DIR and
XDG_CACHE_HOME do what they say; a cache that cannot be written costs one warning line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from conftest import CONFIGS, DATA, gemm_dfg, run_cli
from dfx import read
from hardware import load_machine
from loader import Binding, bind_cpsat, bind_greedy, bind_program
from loader.cache import CACHE_VERSION, bind_cached, cache_dir, cache_key, decode, encode, entry_path

IDEAL = CONFIGS / "ideal_32x32.json"
STANDARD = CONFIGS / "standard.json"

# the loader's main in a fresh interpreter: the test process has OR-Tools imported already
DRIVE_MAIN = """\
import sys
from loader.cli import main
sys.argv = ["kpu-loader", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
print("MODULES", sorted(m for m in ("ortools", "loader.bind") if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, Path]:
    """A 64^3 GEMM for ideal_32x32, and four chained 256^3 matmuls for standard (two compute
    tiles each, so L1 buffers on both)."""
    d = tmp_path_factory.mktemp("objects")
    (d / "gemm.dfg").write_text(gemm_dfg(64, 64, 64))
    sources = {"gemm": (d / "gemm.dfg", IDEAL),
               "chained": (DATA / "dfg" / "workloads__nla__matmul_256x256_chained.dfg", STANDARD)}
    for name, (source, target) in sources.items():
        proc = run_cli("compiler", source, "-o", d / f"{name}.kpu", "--target", target)
        assert proc.returncode == 0, proc.stderr
    return {name: d / f"{name}.kpu" for name in sources}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("KPU_CACHE_DIR", str(path))
    return path


class Counted:
    """bind_program with a binder, counting its calls."""

    def __init__(self, program, machine, where, binder=bind_greedy):
        self.calls = 0
        self.args = (program, machine, where, binder)

    def __call__(self):
        self.calls += 1
        return bind_program(*self.args)


def bind(obj: Path, config: Path, binder: str = "greedy", **kw):
    program, machine = read(obj), load_machine(config)
    counted = Counted(program, machine, str(obj), {"greedy": bind_greedy, "cp-sat": bind_cpsat}[binder])
    bindings, use = bind_cached(program, machine, str(obj), None, binder, counted, **kw)
    return bindings, use, counted.calls


def unmeasured(bindings):
    """Bindings without their measured bind time, which differs from one binding to the next."""
    return [dataclasses.replace(b, bind_seconds=0.0) for b in bindings]


def load_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --- in-process: the cache as a function

@pytest.mark.parametrize("binder", ["greedy", "cp-sat"])
def test_second_bind_is_read_from_the_cache_unchanged(objects, cache, binder):
    first, use, calls = bind(objects["chained"], STANDARD, binder)
    assert (use.state, use.reason, calls) == ("miss", "no entry", 1)
    assert len(list(cache.iterdir())) == 1 and use.path.parent == cache
    again, use, calls = bind(objects["chained"], STANDARD, binder)
    assert (use.state, calls) == ("hit", 0)
    assert again == first  # every field, the measured bind time included


def test_bindings_round_trip_through_the_entry_format(objects):
    program, machine = read(objects["chained"]), load_machine(STANDARD)
    bindings = bind_program(program, machine, "x")
    assert decode(orjson.loads(orjson.dumps(encode(bindings))), list[Binding]) == bindings


def test_the_key_holds_object_config_accelerator_binder_and_loader(objects, tmp_path):
    machine = load_machine(IDEAL)
    key = cache_key(str(objects["gemm"]), machine, None, "greedy")
    assert sorted(key) == ["accelerator", "binder", "config", "loader", "object"]
    others = [cache_key(str(objects["chained"]), machine, None, "greedy"),
              cache_key(str(objects["gemm"]), load_machine(STANDARD), None, "greedy"),
              cache_key(str(objects["gemm"]), machine, "kpu0", "greedy"),
              cache_key(str(objects["gemm"]), machine, None, "cp-sat")]
    assert len({entry_path(Path("c"), k) for k in [key, *others]}) == 5
    # the config as read, not as written: the same machine in another layout is the same key
    relaid = tmp_path / "relaid.json"
    relaid.write_text(json.dumps(json.loads(IDEAL.read_text()), indent=4, sort_keys=True))
    assert cache_key(str(objects["gemm"]), load_machine(relaid), None, "greedy") == key
    # the energy and area models place nothing: another figure is the same key
    costed = tmp_path / "costed.json"
    costed.write_text(json.dumps({**json.loads(IDEAL.read_text()), "energy": {"mac_pj": {"f32": 1.0}},
                                  "area": {"pe_um2": 1.0}}))
    assert cache_key(str(objects["gemm"]), load_machine(costed), None, "greedy") == key


def _first(entry: dict, level: str, count: int = 1) -> list[dict]:
    found = [bb for bb in entry["bindings"][0]["buffers"] if bb["buffer"]["level"] == level]
    assert len(found) >= count
    return found[:count]


def _outside_address(entry):
    bb = _first(entry, "L2")[0]
    bb["address"] = load_machine(STANDARD).l2.bytes - bb["buffer"]["tile_bytes"] * bb["buffer"]["depth"] + 64


def _outside_bank(entry):
    _first(entry, "L1")[0]["bank"] = load_machine(STANDARD).l1.count


def _overlap(entry):
    a, b = _first(entry, "L2", 2)
    b["bank"], b["address"] = a["bank"], a["address"]


def _negative_address(entry):
    _first(entry, "L3")[0]["address"] = -64


def _buffer_dropped(entry):
    entry["bindings"][0]["buffers"].pop()


def _buffers_swapped(entry):
    buffers = entry["bindings"][0]["buffers"]
    buffers[0], buffers[1] = buffers[1], buffers[0]


def _buffer_twice(entry):
    buffers = entry["bindings"][0]["buffers"]
    buffers[-1] = buffers[0]


def _buffer_resized(entry):
    entry["bindings"][0]["buffers"][0]["buffer"]["tile_bytes"] //= 2


def _engine_missing(entry):
    entry["bindings"][0]["engines"].pop()


def _engine_absent_on_machine(entry):
    entry["bindings"][0]["engines"][0][1] = 99


def _other_workers(entry):
    entry["bindings"][0]["workers"] = 1


def _other_kernel(entry):
    entry["bindings"][0]["kernel"] = "elsewhere"


def _kernel_missing(entry):
    entry["bindings"].pop()


def _bank_a_string(entry):
    entry["bindings"][0]["buffers"][0]["bank"] = "0"


def _bank_a_bool(entry):
    entry["bindings"][0]["buffers"][0]["bank"] = False


def _extra_field(entry):
    entry["bindings"][0]["buffers"][0]["buffer"]["colour"] = "red"


def _other_key(entry):
    entry["key"]["object"] = "0" * 64


def _other_version(entry):
    entry["version"] = CACHE_VERSION + 1


def _other_schema(entry):
    entry["schema"]["Buffer"].pop()


def _other_format(entry):
    entry["format"] = "kpu-object"


MUTATIONS = {
    _outside_address: "outside the L2 banks", _outside_bank: "outside the L1 banks",
    _negative_address: "outside the L3 banks", _overlap: "overlap",
    _buffer_dropped: "not the kernel's", _buffers_swapped: "not the kernel's",
    _buffer_twice: "not the kernel's", _buffer_resized: "not the kernel's",
    _engine_missing: "engines are not assigned", _engine_absent_on_machine: "the machine lacks",
    _other_workers: "not the kernel's", _other_kernel: "the binding is of 'elsewhere'",
    _kernel_missing: "3 bindings for 4 kernels", _bank_a_string: "is not a", _bank_a_bool: "is not a",
    _extra_field: "fields differ", _other_key: "its key is another",
    _other_version: "another version", _other_schema: "another version", _other_format: "not a binding cache entry",
}


def _rewrite(mutate):
    def damage(data: bytes) -> bytes:
        entry = orjson.loads(data)
        mutate(entry)
        return orjson.dumps(entry)

    return damage


DAMAGE = {
    "garbage": (lambda data: bytes(range(256)) * (len(data) // 256), "not JSON"),
    "truncated": (lambda data: data[: len(data) // 2], "not JSON"),
    "empty": (lambda data: b"", "not JSON"),
    "a list": (lambda data: b"[]", "not a binding cache entry"),
    **{f.__name__.strip("_"): (_rewrite(f), reason) for f, reason in MUTATIONS.items()},
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_entry_is_ignored_rebound_and_replaced(objects, cache, damage):
    spoil, reason = DAMAGE[damage]
    first, use, _ = bind(objects["chained"], STANDARD)
    assert first[0].workers == 2  # so that L1 buffers of two compute tiles are checked
    use.path.write_bytes(spoil(use.path.read_bytes()))
    rebound, use, calls = bind(objects["chained"], STANDARD)
    assert (use.state, calls) == ("miss", 1)
    assert reason in use.reason
    assert unmeasured(rebound) == unmeasured(first)
    again, use, calls = bind(objects["chained"], STANDARD)
    assert (use.state, calls) == ("hit", 0)
    assert again == rebound


def test_the_l1_of_each_compute_tile_is_its_own(objects, cache):
    """Both workers' L1 buffers sit at the same banks and addresses: no overlap, a hit."""
    first, use, _ = bind(objects["chained"], STANDARD)
    l1 = {w: {(bb.bank, bb.address) for bb in first[0].buffers if bb.buffer.level == "L1" and bb.buffer.worker == w}
          for w in (0, 1)}
    assert l1[0] & l1[1]
    assert bind(objects["chained"], STANDARD)[1].state == "hit"


def test_no_cache_neither_reads_nor_writes_in_process(objects, cache):
    _, use, _ = bind(objects["gemm"], IDEAL, use_cache=False)
    assert use.state == "off" and not cache.exists()
    bind(objects["gemm"], IDEAL)
    _, use, calls = bind(objects["gemm"], IDEAL, use_cache=False)
    assert (use.state, calls) == ("off", 1)


def test_an_unwritable_cache_is_a_warning_in_process(objects, cache, monkeypatch):
    import loader.cache

    def refused(**_):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(loader.cache.tempfile, "mkstemp", refused)
    bindings, use, calls = bind(objects["gemm"], IDEAL)
    assert (use.state, calls, len(bindings)) == ("miss", 1, 1)
    assert use.warning == f"binding cache not written to {cache}: Permission denied"
    assert list(cache.iterdir()) == []


def test_cache_dir_follows_kpu_cache_dir_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KPU_CACHE_DIR", str(tmp_path / "kpu"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "kpu"
    monkeypatch.delenv("KPU_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "kpu"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec: ignored
    assert cache_dir() == tmp_path / "home" / ".cache" / "kpu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "kpu"


# --- the CLI contract

def test_second_run_binds_nothing_and_gives_the_same_run(objects, cache, tmp_path):
    args = [objects["gemm"], "--config", IDEAL, "--json"]
    first = load_json(run_cli("loader", *args, "--output-dir", tmp_path / "first"))
    assert first["binding_cache"] == "miss"
    proc = subprocess.run([sys.executable, "-c", DRIVE_MAIN, *map(str, args), "--profile",
                           "--output-dir", str(tmp_path / "second")], capture_output=True, text=True, timeout=300)
    second = load_json(proc)
    assert proc.stderr.splitlines()[-1] == "MODULES []"  # neither OR-Tools nor the CP-SAT binder
    assert "binding cache: hit, bindings read from " in proc.stderr
    assert second["binding_cache"] == "hit"
    for field in ("cycles", "bindings", "units", "kernels"):
        assert second[field] == first[field]
    for name in first["outputs"]:
        assert np.array_equal(np.load(tmp_path / "first" / f"{name}.npy"), np.load(tmp_path / "second" / f"{name}.npy"))


def test_a_rebinding_run_imports_the_solver(objects, cache):
    """The counterpart of the test above: the same driver does see OR-Tools when it binds."""
    proc = subprocess.run([sys.executable, "-c", DRIVE_MAIN, str(objects["gemm"]), "--config", str(IDEAL),
                           "--json", "--no-cache"], capture_output=True, text=True, timeout=300)
    assert load_json(proc)["binding_cache"] == "off"
    assert proc.stderr.splitlines()[-1] == "MODULES ['loader.bind', 'ortools']"


def test_no_cache_neither_reads_nor_writes(objects, cache):
    args = [objects["gemm"], "--config", IDEAL, "--json"]
    assert load_json(run_cli("loader", *args, "--no-cache"))["binding_cache"] == "off"
    assert not cache.exists()
    assert load_json(run_cli("loader", *args))["binding_cache"] == "miss"
    (entry,) = cache.iterdir()
    entry.write_bytes(b"not an entry")  # read, it would be a miss and be rewritten
    assert load_json(run_cli("loader", *args, "--no-cache"))["binding_cache"] == "off"
    assert entry.read_bytes() == b"not an entry" and list(cache.iterdir()) == [entry]


def test_dry_run_reports_the_cache_too(objects, cache):
    args = [objects["gemm"], "--config", IDEAL, "--dry-run", "--json"]
    assert [load_json(run_cli("loader", *args))["binding_cache"] for _ in range(2)] == ["miss", "hit"]


def test_xdg_cache_home_is_honoured_and_kpu_cache_dir_overrides_it(objects, tmp_path, monkeypatch):
    monkeypatch.delenv("KPU_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    args = [objects["gemm"], "--config", IDEAL, "--json", "--binder", "greedy"]
    assert load_json(run_cli("loader", *args))["binding_cache"] == "miss"
    assert len(list((tmp_path / "xdg" / "kpu").glob("bindings-*.json"))) == 1
    assert load_json(run_cli("loader", *args))["binding_cache"] == "hit"
    monkeypatch.setenv("KPU_CACHE_DIR", str(tmp_path / "kpu"))
    assert load_json(run_cli("loader", *args))["binding_cache"] == "miss"
    assert len(list((tmp_path / "kpu").glob("bindings-*.json"))) == 1


def _one_warning_and_the_run(proc: subprocess.CompletedProcess, directory: Path) -> None:
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.splitlines()[0]]
    assert proc.stderr.startswith(f"warning: binding cache not written to {directory}: ")
    assert json.loads(proc.stdout)["binding_cache"] == "miss"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_cache_dir_is_one_warning(objects, cache):
    cache.mkdir()
    cache.chmod(0o555)
    try:
        _one_warning_and_the_run(run_cli("loader", objects["gemm"], "--config", IDEAL, "--json"), cache)
    finally:
        cache.chmod(0o755)


def test_a_file_in_the_way_of_the_cache_dir_is_one_warning(objects, cache):
    cache.write_text("in the way")
    _one_warning_and_the_run(run_cli("loader", objects["gemm"], "--config", IDEAL, "--json"), cache)
    assert cache.read_text() == "in the way"
