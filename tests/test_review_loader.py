"""The loader against hostile files and sizes: every read is of a regular file of a bounded size
(a FIFO or /dev/zero is refused at once); a binding-cache entry that is a link is never
followed; a small object with an enormous run is refused unless asked for; unused L2 banks cost
the binder nothing; a failed commit leaves every output path as it was; a repeated `--input`
and an empty output path are refused."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import CONFIGS, assert_one_line_error, fifo, gemm_dfg, run_cli
from dfx import ObjectFileError, OutputError, OutputFiles, read, write
from dfx.objfile import MAX_OBJECT_BYTES
from hardware import ConfigError, load_machine
from hardware.config import MAX_CONFIG_BYTES
from kernel_compiler import compile_graph, load_graph, load_target
from loader import bind_cpsat, bind_greedy, bind_program, source_digest
from loader.budget import BudgetError, check_tile_ops, tile_ops
from loader.cache import MAX_ENTRY_BYTES, bind_cached, check
from loader.cli import MAX_TILE_OPS
from loader.inputs import InputError, read_input, read_inputs

MINIMAL = CONFIGS / "minimal.json"


@contextmanager
def at_once():
    """The block must end well before a blocked FIFO is released."""
    start = time.monotonic()
    yield
    assert time.monotonic() - start < 5, "the file was read only once the FIFO was released"


def compiled(folder: Path, m: int, n: int, k: int, target: str | Path = "minimal"):
    (folder / "g.dfg").write_text(gemm_dfg(m, n, k))
    graph, _ = load_graph(str(folder / "g.dfg"))
    return compile_graph(graph, "g.dfg", load_target(str(target)))


@pytest.fixture(scope="module")
def gemm(tmp_path_factory) -> Path:
    """A 16x24x8 GEMM's object, for minimal."""
    d = tmp_path_factory.mktemp("gemm")
    write(compiled(d, 16, 24, 8), d / "g.kpu")
    return d / "g.kpu"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("KPU_CACHE_DIR", str(path))
    return path


def cached_bind(obj: Path):
    program, machine = read(obj), load_machine(MINIMAL)
    return bind_cached(program, machine, str(obj), None, "greedy",
                       lambda: bind_program(program, machine, str(obj), bind_greedy))


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# ---- (B) every read is of a regular file, bounded before it is read ---------------------------


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_object_config_or_input_that_never_ends_is_refused_at_once(gemm, tmp_path, kind):
    program = read(gemm)
    for name, refuse, error in (("o.kpu", read, ObjectFileError), ("c.json", load_machine, ConfigError),
                                ("a.npy", lambda p: read_input(f"A={p}", program), InputError)):
        path = tmp_path / name
        with fifo(path) if kind == "fifo" else _link(path, "/dev/zero"), at_once():
            with pytest.raises(error) as info:
                refuse(str(path))
        what = "a FIFO" if kind == "fifo" else "a device"
        assert str(info.value) == f"{path}: cannot read: {what}, not a regular file"


@contextmanager
def _link(path: Path, target: str):
    path.symlink_to(target)
    yield path


def test_sizes_are_refused_before_reading(gemm, tmp_path):
    with pytest.raises(ObjectFileError, match="o.kpu: 5 GB, larger than the 4 GB a kpu object file may be"):
        read(sparse(tmp_path / "o.kpu", MAX_OBJECT_BYTES + (1 << 30)))
    with pytest.raises(ConfigError, match="c.json: 64 KB, larger than the 32 KB a config may be"):
        load_machine(sparse(tmp_path / "c.json", 2 * MAX_CONFIG_BYTES))
    # an input: at most its tensor (A: 16x8) in the widest dtype accepted, plus a header
    a = tmp_path / "a.npy"
    np.save(a, np.ones((16, 8), np.float32))
    with open(a, "ab") as f:
        f.truncate(1 << 20)
    with pytest.raises(InputError, match=r"1 MB, larger than the .* a \.npy file for 'A' may be"):
        read_input(f"A={a}", read(gemm))


def test_a_cache_entry_that_never_ends_or_is_huge_is_a_miss(gemm, cache):
    _, first = cached_bind(gemm)
    first.path.unlink()
    with fifo(first.path), at_once():
        _, use = cached_bind(gemm)
    assert (use.state, use.reason) == ("miss", "the entry is not a regular file")
    first.path.unlink()
    sparse(first.path, MAX_ENTRY_BYTES + 1)
    _, use = cached_bind(gemm)
    assert use.state == "miss" and "larger than the 64 MB a binding cache entry may be" in use.reason


def test_the_object_turned_fifo_after_it_was_read_is_a_miss_not_a_hang(gemm, cache, tmp_path):
    program, machine = read(gemm), load_machine(MINIMAL)
    with fifo(tmp_path / "gone.kpu") as path, at_once():
        _, use = bind_cached(program, machine, str(path), None, "greedy",
                             lambda: bind_program(program, machine, str(path), bind_greedy))
    assert use.state == "miss" and use.reason.startswith("object unreadable: ") and "a FIFO" in use.reason


def test_a_fifo_among_the_sources_does_not_block_their_digest(tmp_path, monkeypatch):
    package = tmp_path / "fifo_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = source_digest(("fifo_pkg",), "greedy")
    with fifo(package / "stuck.py"), at_once():
        assert source_digest(("fifo_pkg",), "greedy") != plain


def test_loader_cli_refuses_a_fifo_object_in_one_line(tmp_path):
    with fifo(tmp_path / "m.kpu") as path:
        assert_one_line_error(run_cli("loader", path, "--config", "minimal"), str(path), "a FIFO")


# ---- (I) a cache entry that is a link is never followed -----------------------------------------


def test_a_cache_entry_linked_outside_the_cache_is_a_miss_and_not_written_through(gemm, cache, tmp_path):
    _, first = cached_bind(gemm)
    outside = tmp_path / "outside.json"
    first.path.rename(outside)  # a valid entry, which a followed link would hit
    first.path.symlink_to(outside)
    before = outside.read_bytes()
    _, use = cached_bind(gemm)
    assert (use.state, use.reason) == ("miss", "the entry is a link, not followed")
    assert outside.read_bytes() == before
    assert not first.path.is_symlink() and cached_bind(gemm)[1].state == "hit"


def test_a_hard_linked_cache_entry_is_a_miss_and_not_written_through(gemm, cache, tmp_path):
    _, first = cached_bind(gemm)
    outside = tmp_path / "outside.json"
    os.link(first.path, outside)
    before = outside.read_bytes()
    _, use = cached_bind(gemm)
    assert (use.state, use.reason) == ("miss", "the entry has other names (hard links)")
    assert outside.read_bytes() == before and first.path.stat().st_nlink == 1
    assert cached_bind(gemm)[1].state == "hit"


# ---- (H) a small object, an enormous run -------------------------------------------------------


@pytest.fixture(scope="module")
def enormous(tmp_path_factory) -> tuple[Path, Path]:
    """A 1024^3 GEMM tiled for a 1x1 array with 1 KB memories: a 12 KB object of 29 M tile ops."""
    d = tmp_path_factory.mktemp("enormous")
    config = json.loads(MINIMAL.read_text())
    config["name"] = "tiny"
    config["on_chip_memory"] = {"l3": {"tile_count": 1, "tile_capacity_kb": 1},
                                "l2": {"bank_count": 1, "bank_capacity_kb": 1},
                                "l1": {"buffer_count": 1, "buffer_capacity_kb": 1}}
    config["compute"]["processor_array"] = {"rows": 1, "cols": 1, "topology": "rectangular"}
    (d / "tiny.json").write_text(json.dumps(config))
    write(compiled(d, 1024, 1024, 1024, d / "tiny.json"), d / "mm.kpu")
    return d / "mm.kpu", d / "tiny.json"


def test_more_tile_ops_than_the_budget_are_refused_in_process(enormous):
    obj, _ = enormous
    program = read(obj)
    assert obj.stat().st_size < 16_000 and tile_ops(program) == 29_384_704
    with pytest.raises(BudgetError) as info:
        check_tile_ops(program, MAX_TILE_OPS, "mm.kpu")
    assert str(info.value) == ("mm.kpu: 29,384,704 tile ops to simulate (about 9.8 minutes with values), more "
                               "than the 20,000,000 allowed; --max-tile-ops 29384704 runs it")
    check_tile_ops(program, 29_384_704, "mm.kpu")


@pytest.mark.parametrize("mode", [[], ["--timing-only"], ["--dry-run"]], ids=["values", "timing-only", "dry-run"])
def test_every_mode_refuses_a_run_over_the_budget(enormous, mode):
    obj, config = enormous
    assert_one_line_error(run_cli("loader", obj, "--config", config, *mode), str(obj), "29,384,704 tile ops",
                          "--max-tile-ops")


def test_max_tile_ops_sets_the_budget(gemm):
    ops = tile_ops(read(gemm))
    run = ["loader", gemm, "--config", "minimal", "--dry-run", "--no-cache", "--max-tile-ops"]
    assert_one_line_error(run_cli(*run, ops - 1), f"{ops:,} tile ops", f"the {ops - 1:,} allowed")
    assert run_cli(*run, ops).returncode == 0


# ---- (J) unused L2 banks cost the binder nothing ---------------------------------------------


def banks_config(tmp_path: Path, banks: int) -> Path:
    config = json.loads(MINIMAL.read_text())
    config["on_chip_memory"]["l2"]["bank_count"] = banks
    path = tmp_path / f"banks{banks}.json"
    path.write_text(json.dumps(config))
    return path


def test_a_million_l2_banks_bind(gemm, tmp_path):
    program, machine = read(gemm), load_machine(banks_config(tmp_path, 10**6))
    bindings = bind_program(program, machine, str(gemm), bind_cpsat)
    check(bindings, program, machine)  # every buffer inside its banks, none overlapping
    l2 = [bb.bank for b in bindings for bb in b.buffers if bb.buffer.level == "L2"]
    assert l2 and max(l2) < len(l2)


def test_the_binding_model_does_not_grow_with_unused_banks(gemm, tmp_path):
    from loader.bind import build_model
    from loader.buffers import kernel_demands

    program = read(gemm)
    buffers, streams = kernel_demands(program.kernels[0], program, 1)
    sizes = {banks: len(build_model(buffers, streams, load_machine(banks_config(tmp_path, banks)))[0].Proto()
                        .variables) for banks in (len(buffers), 10**6)}
    assert sizes[len(buffers)] == sizes[10**6]


# ---- (F) all outputs or none -------------------------------------------------------------------


def staged(folder: Path) -> tuple[OutputFiles, list[Path]]:
    """Three staged outputs: a.npy (over an existing file), t.json (over a link), p.png (new)."""
    (folder / "a.npy").write_bytes(b"old a")
    (folder / "target").write_bytes(b"old target")
    (folder / "t.json").symlink_to("target")
    files = OutputFiles()
    paths = [files.claim(folder / name) for name in ("a.npy", "t.json", "p.png")]
    for p in paths:
        files.stage(p, b"new")
    return files, paths


def assert_as_before(folder: Path) -> None:
    assert (folder / "a.npy").read_bytes() == b"old a"
    assert os.readlink(folder / "t.json") == "target" and (folder / "target").read_bytes() == b"old target"
    assert sorted(p.name for p in folder.iterdir()) == ["a.npy", "p.png", "t.json", "target"]  # nothing left over


def test_a_target_that_became_a_folder_is_found_before_the_first_rename(tmp_path):
    files, _ = staged(tmp_path)
    (tmp_path / "p.png").mkdir()  # during the run
    with files, pytest.raises(OutputError) as info:
        files.commit()
    assert str(info.value) == f"{tmp_path / 'p.png'}: cannot write: a folder is in the way"
    assert_as_before(tmp_path)


def test_a_rename_that_fails_undoes_the_ones_before(tmp_path, monkeypatch):
    files, paths = staged(tmp_path)
    rename = os.replace

    def failing(src, dst):
        if Path(dst) == paths[-1]:
            (tmp_path / "p.png").mkdir()  # in the way after the check, as a race would put it
            raise IsADirectoryError(21, "Is a directory")
        rename(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with files, pytest.raises(OutputError, match="p.png: cannot write: Is a directory"):
        files.commit()
    assert_as_before(tmp_path)


# ---- (G) a repeated --input, an empty output path ----------------------------------------------


def test_a_repeated_input_is_refused_before_any_file_is_read(gemm):
    with pytest.raises(InputError) as info:
        read_inputs(["A=missing1.npy", "B=missing2.npy", "A=missing3.npy"], read(gemm))
    assert str(info.value) == "--input A: given twice (missing1.npy and missing3.npy); give each input once"


def test_an_empty_output_path_is_refused():
    with pytest.raises(OutputError, match="an empty output path"):
        OutputFiles().claim("")


@pytest.mark.parametrize("args, option", [
    (["compiler", "{dfg}", "-o", ""], "-o"),
    (["loader", "{kpu}", "--config", "minimal", "--output-dir", ""], "--output-dir"),
    (["loader", "{kpu}", "--config", "minimal", "--trace-output", ""], "--trace-output"),
    (["loader", "{kpu}", "--config", "minimal", "--plot", ""], "--plot"),
    (["loader", "{kpu}", "--config", "minimal", "--input", "A={npy}", "--input", "A={npy}"], "--input A"),
], ids=["-o", "--output-dir", "--trace-output", "--plot", "--input twice"])
def test_cli_refuses_in_one_line_and_writes_nothing(gemm, tmp_path, args, option):
    np.save(tmp_path / "a.npy", np.ones((16, 8), np.float32))
    (tmp_path / "g.dfg").write_text(gemm_dfg(16, 24, 8))
    before = sorted(tmp_path.iterdir())
    values = {"dfg": tmp_path / "g.dfg", "kpu": gemm, "npy": tmp_path / "a.npy"}
    proc = run_cli(*[a.format(**values) for a in args], cwd=tmp_path)
    assert assert_one_line_error(proc).startswith(f"error: {option}: ")
    assert sorted(tmp_path.iterdir()) == before
