"""Shared by the benchmark scripts: the machine line, and replacing one section of RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor() or "unknown")
    return (f"{platform.platform()}, CPU {cpu}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


# Linux keeps a process's peak RSS across exec, and a child forked from this script starts with
# the script's: so a command runs under this small launcher, which forks it afresh, waits for it
# and writes its own peak RSS (KB) to the file it is given.
LAUNCHER = """import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 255)
"""


def _launched(cmd: list, peak_file: Path) -> list[str]:
    return [sys.executable, "-c", LAUNCHER, str(peak_file), *map(str, cmd)]


def measure(cmd: list[str], stdout: Path | None = None) -> tuple[float, float]:
    """Run a command; its wall seconds and its own peak RSS in MB."""
    out = open(stdout, "wb") if stdout else subprocess.DEVNULL
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "peak"
        start = time.perf_counter()
        proc = subprocess.run(_launched(cmd, peak_file), stdout=out, stderr=subprocess.PIPE)
        wall = time.perf_counter() - start
        peak = int(peak_file.read_text()) / 1024 if peak_file.exists() else float("nan")
    if stdout:
        out.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr.decode().strip()}")
    return wall, peak


@dataclass
class Proc:
    wall: float  # seconds, interpreter start-up included
    rss: float  # the process's own peak RSS, MB (its launcher's wait4)
    code: int
    stderr: str


def run(cmd: list, stdout: Path) -> Proc:
    """As `measure`, but a non-zero exit is returned, not raised (a failed --check exits 1 and
    still prints its JSON), and stderr goes to a file (a pipe read after the exit could fill)."""
    err_path, peak_file = stdout.with_suffix(".stderr"), stdout.with_suffix(".peak")
    with open(stdout, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        code = subprocess.run(_launched(cmd, peak_file), stdout=out, stderr=err).returncode
        wall = time.perf_counter() - start
    peak = int(peak_file.read_text()) / 1024 if peak_file.exists() else float("nan")
    return Proc(wall, peak, code, err_path.read_text().strip())


def write_section(title: str, text: str) -> None:
    """Replace the section `## title` of RESULTS.md (up to the next `## `), keeping the others."""
    heading = f"## {title}"
    body = f"{heading}\n\n{text.strip()}\n"
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    start = old.find("\n" + heading + "\n") + 1  # a heading of its own line, not one of a deeper section
    if not start:
        new = old.rstrip("\n") + "\n\n" + body
    else:
        end = old.find("\n## ", start + len(heading))
        rest = old[end + 1:] if end >= 0 else ""
        new = old[:start] + body + ("\n" + rest if rest else "")
    RESULTS.write_text(new)
