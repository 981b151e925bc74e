"""The README's tour runs as written in a fresh checkout after `make demo`, so the README
cannot drift from the tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def tour_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("\n## A tour\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```\n(.*?)^```$", tour, flags=re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def fresh_checkout(dest):
    """The files a clone would have (tracked, plus new ones not ignored), without .venv or build/."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() or src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def test_make_demo_runs_in_a_fresh_checkout(tmp_path):
    """`make demo` makes its own .venv, installs the project and passes its check."""
    checkout = tmp_path / "kpu"
    fresh_checkout(checkout)
    assert not (checkout / ".venv").exists() and not (checkout / "build").exists()
    demo = subprocess.run(["make", "demo"], cwd=checkout, env=clean_env(), capture_output=True, text=True)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert re.search(r"check C: pass", demo.stderr + demo.stdout)


def test_readme_tour_runs_as_written(tmp_path):
    """Every command of the tour, in order, in a fresh checkout whose .venv holds the installed
    tools (the test above shows `make demo` makes one): apart from the install, the two tests
    run on separate workers."""
    checkout = tmp_path / "kpu"
    fresh_checkout(checkout)
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    commands = tour_commands()
    assert len(commands) >= 9
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], cwd=checkout, env=clean_env(), capture_output=True, text=True)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, command
    assert (checkout / "build" / "out" / "C.npy").is_file()
