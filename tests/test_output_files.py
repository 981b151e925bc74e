"""Where the tools write: inside the named places only, all outputs or none, never through a
link or over an input; usage errors as one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_one_line_error, examples, gemm_dfg, run_cli
from dfx import OutputError, OutputFiles
from dfx.objfile import _digest
from loader.outputs import claim_outputs, output_file_name, stage_array

HOSTILE = ["../../x", "/abs/path", "a\nb", "nul\x00x", ".", "..", "~", "[red]C", "é" * 300, "a/b/../../../c"]


def renamed_object(tmp_path: Path, new_name: str) -> Path:
    """A 16^3 GEMM object whose output tensor C is renamed, re-signed as an attacker would."""
    dfg = tmp_path / "g.dfg"
    dfg.write_text(gemm_dfg(16, 16, 16))
    obj = tmp_path / "g.kpu"
    assert run_cli("compiler", dfg, "-o", obj).returncode == 0
    doc = json.loads(obj.read_text())

    def rename(v):
        if isinstance(v, dict):
            return {(new_name if k == "C" else k): rename(x) for k, x in v.items()}
        if isinstance(v, list):
            return [rename(x) for x in v]
        return new_name if v == "C" else v

    doc["body"] = rename(doc["body"])
    doc["sha256"] = _digest(doc["body"])
    obj.write_text(json.dumps(doc))
    return obj


# --- tensor names: every output file inside --output-dir, distinct names distinct files -------------


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(min_size=1, max_size=300) | st.sampled_from(HOSTILE), min_size=1, max_size=6, unique=True))
def test_output_files_land_inside_output_dir(tmp_path_factory, names):
    out = tmp_path_factory.mktemp("out")
    files = [output_file_name(n) for n in names]
    assert len(set(files)) == len(names)
    for f in files:
        assert "/" not in f and "\x00" not in f and f not in (".", "..") and len(f.encode()) <= 255
    with OutputFiles() as written:
        paths = claim_outputs(written, str(out / "sub"), names)
        for n in names:
            stage_array(written, paths[n], np.arange(3, dtype=np.float32))
        written.commit()
    made = sorted(p.name for p in (out / "sub").iterdir())
    assert made == sorted(files)
    assert [p.name for p in out.iterdir()] == ["sub"]


@pytest.mark.parametrize("name", ["../../x", "/abs/path", "a\nb", "nul\x00x"])
def test_hostile_output_name_runs_and_stays_inside(tmp_path, name):
    obj = renamed_object(tmp_path, name)
    out = tmp_path / "out"
    proc = run_cli("loader", obj, "--config", "standard", "--binder", "greedy", "--output-dir", out,
                   "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    written = Path(report["outputs"][name])
    assert written.parent == out and written.is_file()
    assert sorted(tmp_path.rglob("*")) == sorted([tmp_path / "g.dfg", tmp_path / "g.kpu", out, written])
    assert len(np.load(written)) == 16
    # the output's line (its name escaped onto one line) and the worst kernel's
    checks = [l for l in proc.stderr.splitlines() if l.startswith("check ")]
    assert len(checks) == 2 and all("pass" in l for l in checks) and "kernel" in checks[1]


# --- links, FIFOs and folders in the way ----------------------------------------------------------


def _occupy(path: Path, kind: str, target: Path) -> None:
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
@pytest.mark.parametrize("where", ["object", "object.tmp", "npy", "trace"])
def test_nothing_in_the_way_is_followed(tmp_path, kind, where):
    dfg = tmp_path / "g.dfg"
    dfg.write_text(gemm_dfg(16, 16, 16))
    obj, out, trace = tmp_path / "g.kpu", tmp_path / "out", tmp_path / "trace.json"
    target = tmp_path / "precious"
    target.write_text("keep me")
    if where.startswith("object"):
        _occupy(tmp_path / ("g.kpu" if where == "object" else "g.kpu.tmp"), kind, target)
        proc = run_cli("compiler", dfg, "-o", obj)
        made = obj
    else:
        assert run_cli("compiler", dfg, "-o", obj).returncode == 0
        out.mkdir()
        made = out / "C.npy" if where == "npy" else trace
        _occupy(made, kind, target)
        proc = run_cli("loader", obj, "--config", "standard", "--binder", "greedy", "--output-dir", out,
                       "--trace-output", trace)
    assert target.read_text() == "keep me"
    if kind == "symlink" or where == "object.tmp":
        # the link itself is replaced by the output (or was never on the way): a correct result
        assert proc.returncode == 0, proc.stderr
        assert made.is_file() and not made.is_symlink()
    else:
        assert_one_line_error(proc, str(made), "in the way")
        assert not (out / "C.npy").is_file() or where == "npy"
    assert not list(tmp_path.rglob("*.partial"))


def test_output_over_an_input_is_refused(tmp_path):
    dfg = tmp_path / "g.dfg"
    dfg.write_text(gemm_dfg(16, 16, 16))
    before = dfg.read_text()
    assert_one_line_error(run_cli("compiler", dfg, "-o", dfg), str(dfg), "is an input")
    assert dfg.read_text() == before
    obj = tmp_path / "g.kpu"
    assert run_cli("compiler", dfg, "-o", obj).returncode == 0
    kept = obj.read_bytes()
    assert_one_line_error(run_cli("loader", obj, "--config", "standard", "--trace-output", obj), "is an input")
    assert obj.read_bytes() == kept
    clash = run_cli("loader", obj, "--config", "standard", "--output-dir", tmp_path, "--trace-output",
                    tmp_path / "C.npy")
    assert_one_line_error(clash, "two outputs")
    assert not (tmp_path / "C.npy").exists()


def test_failed_write_leaves_nothing(tmp_path):
    """A write that fails midway (a full disk, say) removes every staged file and any folder it
    made, and the paths keep what they held."""
    old = tmp_path / "a.npy"
    old.write_text("old")

    def full_disk(f):
        f.write(b"x" * 100)
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"new/b.npy: cannot write: No space left"):
        with OutputFiles() as files:
            a, b = files.claim(old), files.claim(tmp_path / "new" / "b.npy")
            files.stage(a, b"new")
            files.stage(b, full_disk)
            files.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]
    assert old.read_text() == "old"


def test_missing_output_folder_is_made(tmp_path):
    dfg = tmp_path / "g.dfg"
    dfg.write_text(gemm_dfg(16, 16, 16))
    obj = tmp_path / "build" / "deeper" / "g.kpu"
    proc = run_cli("compiler", dfg, "-o", obj)
    assert proc.returncode == 0, proc.stderr
    assert obj.is_file()


# --- arguments: checked before any work, one line -------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--seed", "-1"], "--seed"),
    (["--ops", str(10**20)], "--ops"),
    (["--bogus"], "--bogus"),
    (["--binder", "magic"], "--binder"),
])
def test_bad_loader_arguments_are_one_line(tmp_path, args, fragment):
    proc = run_cli("loader", tmp_path / "missing.kpu", "--config", "standard", *args)
    assert_one_line_error(proc, fragment)
    assert "Usage" not in proc.stderr + proc.stdout and "╭" not in proc.stderr


def test_missing_argument_is_one_line():
    assert_one_line_error(run_cli("compiler"), "Missing argument")
    assert_one_line_error(run_cli("loader", "x.kpu"), "--config")
