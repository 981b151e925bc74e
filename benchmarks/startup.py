"""Start-up and the binding cache: how long the CLIs take to print --help, and a small GEMM's
loader run with an empty binding cache and with its bindings cached, against SCALE-Sim.

    .venv/bin/python benchmarks/startup.py [--repeats 9] [--skip-scalesim]

Each command runs `--repeats` times, the cases taking turns so that a busy spell of the machine
falls on all of them alike; the section gives the median (and the range) of the wall time of the
whole process, interpreter start-up included. The GEMM is 64^3 f32 (examples/make_gemm.py 64 64
64), compiled with `--dataflow os` for configs/ideal_32x32.json, which SCALE-Sim runs as in
benchmarks/vs_scalesim.py (its venv, config and driver are reused). This replaces the section
"## Start-up and the binding cache" of benchmarks/RESULTS.md (other sections are kept).

Python's bytecode cache is on, as after an install (pip compiles a package's modules when it
installs it; an editable install compiles them on first import), whatever PYTHONDONTWRITEBYTECODE
says; it is kept in the run's temporary directory and filled by an untimed first run of each
command. One more case runs the cached loader with our own modules compiled at every start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, measure, today, write_section  # noqa: E402
from vs_scalesim import BIN, CONFIG, REPO, ensure_scalesim, run_scalesim  # noqa: E402

SECTION = "Start-up and the binding cache"
SIZE = 64
OURS = {"dfx", "hardware", "loader", "kernel_compiler"}
DATAFLOW = "os"
IMPORT_RUNS = 5


def set_environment(changes: dict[str, str | None]) -> None:
    """Set os.environ, which the commands inherit; None removes a variable."""
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def environment(**changes: str | None) -> Iterator[None]:
    """`changes` for the commands run inside, undone after them."""
    saved = {name: os.environ.get(name) for name in changes}
    set_environment(changes)
    try:
        yield
    finally:
        set_environment(saved)


def loader_run(kpu: Path, cache: Path, out: Path) -> tuple[float, dict]:
    """One `kpu-loader --json` run with the binding cache in `cache`: its wall time and summary."""
    os.environ["KPU_CACHE_DIR"] = str(cache)
    wall, _ = measure([str(BIN / "kpu-loader"), str(kpu), "--config", str(CONFIG), "--json"], out)
    return wall, json.loads(out.read_text())


def import_costs(kpu: Path, cache: Path) -> dict[str, float]:
    """Seconds of imports in a cached run as `python -X importtime` counts them (itself slowing
    them a little), each the median of IMPORT_RUNS runs. Each module's own time goes to the
    outermost third-party package on its import chain (pydantic, which typer imports, is typer's),
    else to its own package of ours, else to the standard library."""
    os.environ["KPU_CACHE_DIR"] = str(cache)
    runs: list[dict[str, float]] = []
    for _ in range(IMPORT_RUNS):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "loader", str(kpu), "--config", str(CONFIG),
                               "--json"], capture_output=True, text=True, check=True)
        if json.loads(proc.stdout)["binding_cache"] != "hit":
            raise RuntimeError("the run timed for its imports did not find its bindings cached")
        rows = [line[len("import time:"):].split("|") for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "self [us]" not in line]
        costs: dict[str, float] = {}
        chain: list[str] = []
        # printed children first, parents after them: read backwards, each parent comes before its imports
        for own, _, indented in reversed(rows):
            name = indented.strip()
            depth = (len(indented) - len(indented.lstrip()) - 1) // 2
            chain[depth:] = [name.split(".")[0]]
            third_party = [top for top in chain if top not in OURS and top not in sys.stdlib_module_names]
            owner = third_party[0] if third_party else chain[-1] if chain[-1] in OURS else "standard library"
            costs[owner] = costs.get(owner, 0.0) + int(own) / 1e6
        runs.append(costs)
    return {owner: statistics.median(run.get(owner, 0.0) for run in runs) for owner in set().union(*runs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=9, help="runs of each command (the median is shown)")
    p.add_argument("--skip-scalesim", action="store_true", help="leave SCALE-Sim's run out")
    args = p.parse_args()

    missing = "skipped with --skip-scalesim" if args.skip_scalesim else ensure_scalesim()
    load = [os.getloadavg()[0]]
    walls: dict[str, list[float]] = {}
    cycles: dict[str, set[int]] = {"first": set(), "cached": set(), "compiling": set(), "scalesim": set()}
    with tempfile.TemporaryDirectory(prefix="startup_") as tmp:
        work = Path(tmp)
        bytecode = work / "bytecode"
        set_environment({"PYTHONDONTWRITEBYTECODE": None, "PYTHONPYCACHEPREFIX": str(bytecode)})
        dfg, kpu = work / "gemm.dfg", work / "gemm.kpu"
        subprocess.run([sys.executable, str(REPO / "examples" / "make_gemm.py"), *[str(SIZE)] * 3,
                        "-o", str(dfg)], check=True)
        measure([str(BIN / "kpu-kernel-compiler"), str(dfg), "--dataflow", DATAFLOW,
                 "--target", str(CONFIG), "-o", str(kpu)])
        warm = work / "warm-cache"
        # untimed first runs: the binding cache's entry, and every command's bytecode
        loader_run(kpu, warm, work / "prime.json")
        for tool in ("kpu-kernel-compiler", "kpu-loader"):
            measure([str(BIN / tool), "--help"])
        if not missing:
            (work / "scalesim-prime").mkdir()
            run_scalesim(SIZE, DATAFLOW, work / "scalesim-prime")
        # the same bytecode but ours, and never written: our modules compile at every start
        without_ours = work / "bytecode-without-ours"
        shutil.copytree(bytecode, without_ours)
        for package in OURS:
            shutil.rmtree(without_ours / REPO.relative_to(REPO.anchor) / package)
        compiling = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(without_ours)}
        for rep in range(args.repeats):
            for tool in ("kpu-kernel-compiler", "kpu-loader"):
                walls.setdefault(f"{tool} --help", []).append(measure([str(BIN / tool), "--help"])[0])
            for case, cache, env in (("first", work / f"empty-cache-{rep}", {}), ("cached", warm, {}),
                                     ("compiling", warm, compiling)):
                with environment(**env):
                    wall, summary = loader_run(kpu, cache, work / f"{case}.json")
                want = "miss" if case == "first" else "hit"
                if summary["binding_cache"] != want:
                    raise RuntimeError(f"{case} run: binding cache {summary['binding_cache']}, expected {want}")
                walls.setdefault(case, []).append(wall)
                cycles[case].add(summary["cycles"])
            if not missing:
                run = work / f"scalesim-{rep}"
                run.mkdir()
                theirs = run_scalesim(SIZE, DATAFLOW, run)
                walls.setdefault("scalesim", []).append(theirs["wall"])
                cycles["scalesim"].add(theirs["cycles"])
            load.append(os.getloadavg()[0])
            print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in walls.items()),
                  file=sys.stderr)
        costs = import_costs(kpu, warm)
    if len(cycles["first"] | cycles["cached"] | cycles["compiling"]) != 1:
        raise RuntimeError(f"the cached run changed the cycles: {cycles}")
    text = section(walls, cycles, args.repeats, missing, load, costs)
    write_section(SECTION, text)
    print(text)


def section(walls: dict[str, list[float]], cycles: dict[str, set[int]], repeats: int, missing: str | None,
            load: list[float], costs: dict[str, float]) -> str:
    def cell(case: str) -> str:
        w = walls[case]
        return f"{statistics.median(w):.3f} | {min(w):.3f} - {max(w):.3f}"

    (ours,) = cycles["first"]
    config = CONFIG.relative_to(REPO)
    lines = [
        f"Machine: {machine()}. Date: {today()}.",
        "Reproduce: `.venv/bin/python benchmarks/startup.py`.", "",
        f"Wall time of the whole process (interpreter start-up included), median and range of {repeats} runs, "
        "the cases taking turns. The loader runs `kpu-loader OBJECT --config "
        f"{config} --json` (values computed tile by tile) on a {SIZE}^3 f32 GEMM compiled with "
        f"`--dataflow {DATAFLOW} --target {config}`: first with an empty binding cache (`KPU_CACHE_DIR` a new "
        "directory: CP-SAT binds, the entry is written), then with its bindings cached (no OR-Tools import, no "
        f"CP-SAT call). Both give {ours:,} cycles. Python's bytecode cache is on, as after an install (pip "
        "compiles a package's modules as it installs them, an editable install on their first import), filled by "
        "an untimed first run of each command; the row \"our modules compiled at start\" is the cached run with "
        "the bytecode of `dfx`, `hardware`, `loader` and `kernel_compiler` never written (an editable install "
        "under `PYTHONDONTWRITEBYTECODE=1`). The machine's 1-minute load average during the runs: "
        f"{min(load):.1f} to {max(load):.1f} on {os.cpu_count()} cores.", "",
        "| command | median s | range s |",
        "|---|---:|---|",
        f"| `kpu-kernel-compiler --help` | {cell('kpu-kernel-compiler --help')} |",
        f"| `kpu-loader --help` | {cell('kpu-loader --help')} |",
        f"| loader, {SIZE}^3 GEMM, empty binding cache | {cell('first')} |",
        f"| loader, {SIZE}^3 GEMM, bindings cached | {cell('cached')} |",
        f"| loader, {SIZE}^3 GEMM, bindings cached, our modules compiled at start | {cell('compiling')} |",
    ]
    top = sorted(costs.items(), key=lambda kv: -kv[1])[:10]
    imports = (f"Where a cached run's imports go (`python -X importtime`, the median of {IMPORT_RUNS} runs; each "
               f"third-party package with what it imports in turn; {sum(costs.values()):.3f} s in all): "
               + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in top) + ".")
    if missing:
        lines += ["", f"**SCALE-Sim was not available** ({missing}): its run of the same GEMM is not shown.",
                  "", imports]
        return "\n".join(lines) + "\n"
    (theirs,) = cycles["scalesim"]
    lines.append(f"| SCALE-Sim 3.0.0, {SIZE}^3 GEMM ({DATAFLOW}, {theirs:,} cycles) | {cell('scalesim')} |")
    first, cached, compiling, scalesim = (statistics.median(walls[k])
                                          for k in ("first", "cached", "compiling", "scalesim"))
    verdict = "no slower than" if cached <= scalesim else "slower than"
    lines += ["", f"The cached run is {verdict} SCALE-Sim's: {cached:.3f} s against {scalesim:.3f} s "
                  f"({cached / scalesim:.2f}x its wall time); the cache saves {first - cached:.3f} s of the first "
                  f"run. Compiling our modules at every start costs {compiling - cached:.3f} s more "
                  f"({compiling / scalesim:.2f}x SCALE-Sim's wall time).",
              "", imports]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
