"""Shared helpers: run the two CLIs as a user would, and build small programs in-process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# `make test` (profile "ci") draws the same examples every run, so CI passes or fails on the code,
# never on the draw. `make fuzz` (profile "fuzz") draws fresh examples, twenty times as many.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("fuzz", derandomize=False, deadline=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """How many examples a property test draws: n under `make test`, 20n under `make fuzz`."""
    return n * (20 if PROFILE == "fuzz" else 1)


ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CONFIGS = ROOT / "configs"

_spec = importlib.util.spec_from_file_location("make_gemm", ROOT / "examples" / "make_gemm.py")
make_gemm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_gemm)
gemm_dfg = make_gemm.gemm_dfg


def run_cli(tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `kpu-kernel-compiler` (tool="compiler") or `kpu-loader` (tool="loader"), with a
    deadline, so an input that makes a tool hang fails its test instead of stalling the suite."""
    module = {"compiler": "kernel_compiler", "loader": "loader"}[tool]
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr, no traceback, naming each fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture(scope="session", autouse=True)
def binding_cache_dir(tmp_path_factory):
    """The loader's binding cache of the whole session, in a temp dir: never the user's. Set in
    os.environ, so the CLIs the tests start use it too."""
    path = tmp_path_factory.mktemp("binding-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KPU_CACHE_DIR", str(path))
        yield path


def shrunk_config(tmp_path_factory, base: str, name: str, l3: tuple[int, int], l2: tuple[int, int],
                  l1: tuple[int, int]) -> str:
    """A shipped config with other on-chip memories, each (count, KB), written under `name`."""
    config = json.loads((CONFIGS / f"{base}.json").read_text())
    config["name"] = name
    config["on_chip_memory"] = {"l3": {"tile_count": l3[0], "tile_capacity_kb": l3[1]},
                                "l2": {"bank_count": l2[0], "bank_capacity_kb": l2[1]},
                                "l1": {"buffer_count": l1[0], "buffer_capacity_kb": l1[1]}}
    path = tmp_path_factory.mktemp("configs") / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> str:
    """The minimal config with 4 KB of L3 and 1 KB banks at L2 and L1."""
    return shrunk_config(tmp_path_factory, "minimal", "tiny", (1, 4), (4, 1), (4, 1))


def config_error(tmp_path: Path, document: dict) -> str:
    """The one-line ConfigError that loading `document` as a .json file gives."""
    from hardware import ConfigError, load_machine

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as info:
        load_machine(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


@pytest.fixture
def gemm_file(tmp_path):
    def make(M: int, N: int, K: int, dtype: str = "f32") -> Path:
        path = tmp_path / f"gemm_{M}x{N}x{K}_{dtype}.dfg"
        path.write_text(gemm_dfg(M, N, K, dtype))
        return path

    return make
