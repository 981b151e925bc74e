"""The README's tour runs as written in a fresh checkout after `make demo`, so the README
cannot drift from the tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
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


def venv_seeing_our_dependencies(checkout: Path) -> Path:
    """A new .venv (pip in it, nothing installed) that finds the dependencies in this one's
    site-packages through a .pth file read after its own: installing them from the package index
    into an empty .venv is what `make test` does on CI's clean clone, and takes most of a minute."""
    venv = checkout / ".venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv], check=True)
    site_packages = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site_packages / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_make_demo_runs_in_a_fresh_checkout(tmp_path):
    """`make demo` installs the project into the checkout's .venv, whose tools then compile and
    run the example and pass its check."""
    checkout = tmp_path / "kpu"
    fresh_checkout(checkout)
    assert not (checkout / "build").exists()
    venv = venv_seeing_our_dependencies(checkout)
    demo = subprocess.run(["make", "demo"], cwd=checkout, env=clean_env(), capture_output=True, text=True)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert re.search(r"check C: pass", demo.stderr + demo.stdout)
    # the tools ran from the checkout's own install, not from this environment's
    compiler = (venv / "bin" / "kpu-kernel-compiler").read_text()
    assert compiler.startswith(f"#!{venv}"), compiler[:200]
    located = subprocess.run([venv / "bin" / "python", "-c", "import dfx; print(dfx.__file__)"], cwd=tmp_path,
                             env=clean_env(), capture_output=True, text=True, check=True).stdout.strip()
    assert Path(located).is_relative_to(checkout), located


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
