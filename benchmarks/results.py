"""Shared by the benchmark scripts: the machine line, and replacing one section of RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
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


def measure(cmd: list[str], stdout: Path | None = None) -> tuple[float, float]:
    """Run a command; its wall seconds and its own peak RSS in MB (from wait4)."""
    out = open(stdout, "wb") if stdout else subprocess.DEVNULL
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    if stdout:
        out.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {code}: {stderr.strip()}")
    return wall, usage.ru_maxrss / 1024


@dataclass
class Proc:
    wall: float  # seconds, interpreter start-up included
    rss: float  # the process's own peak RSS, MB (wait4)
    code: int
    stderr: str


def run(cmd: list, stdout: Path) -> Proc:
    """As `measure`, but a non-zero exit is returned, not raised (a failed --check exits 1 and
    still prints its JSON), and stderr goes to a file (a pipe read after the exit could fill)."""
    err_path = stdout.with_suffix(".stderr")
    with open(stdout, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    return Proc(wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), err_path.read_text().strip())


def write_section(title: str, text: str) -> None:
    """Replace the section `## title` of RESULTS.md (up to the next `## `), keeping the others."""
    heading = f"## {title}"
    body = f"{heading}\n\n{text.strip()}\n"
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    start = old.find(heading + "\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + body
    else:
        end = old.find("\n## ", start + len(heading))
        rest = old[end + 1:] if end >= 0 else ""
        new = old[:start] + body + ("\n" + rest if rest else "")
    RESULTS.write_text(new)
