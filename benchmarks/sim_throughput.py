"""Simulator throughput: tasks per second of the task stream and of the event loop, apart and together.

    .venv/bin/python benchmarks/sim_throughput.py [--baseline REV] [--size N] [--profile]

The workload is the N^3 f32 GEMM (N = 2048 unless --size says otherwise) compiled for
configs/standard.json and bound by CP-SAT, as `kpu-loader --timing-only` runs it. Timed apart,
REPEATS runs each (fastest and median):
- generation: the loader's task stream (`loader.program_tasks`), materialised into a list once;
- simulation: `Simulator.run` on that list, so no task generation is in its time;
- end to end: `Simulator.run` on the lazy stream, the two interleaved as `kpu-loader` runs them.
With `--baseline REV` the simulator of commit REV (its `hardware/` package, read with
`git archive`, the work tree untouched) is timed the same way on the same tasks, and must give the
same cycles and per-unit figures. Writes the section "Simulator throughput" of
benchmarks/RESULTS.md, unless `--profile`, which prints the cProfile top functions of generation
and of simulation instead.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import os
import pstats
import subprocess
import sys
import tarfile
import tempfile
import time
from statistics import median
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(Path(__file__).resolve().parent)]

from make_gemm import gemm_dfg  # noqa: E402
from results import machine as host, today, write_section  # noqa: E402

from dfx import read  # noqa: E402
from hardware import Simulator, load_machine  # noqa: E402
from loader import bind_cpsat, bind_program, program_tasks  # noqa: E402
from loader.tasks import DEP_WINDOW  # noqa: E402

CONFIG = ROOT / "configs" / "standard.json"
REPEATS = 11  # the spread of the runs shows the host's noise
PROFILE_LINES = 15


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout


def baseline_simulator(rev: str, tmp: Path) -> type:
    """The Simulator class of commit `rev`, imported from its hardware/ package as another package."""
    with tarfile.open(fileobj=io.BytesIO(git("archive", "--format=tar", rev, "hardware"))) as archive:
        archive.extractall(tmp, filter="data")
    name = f"hardware_{rev}"
    (tmp / "hardware").rename(tmp / name)
    sys.path.insert(0, str(tmp))
    return importlib.import_module(f"{name}.simulator").Simulator


def timed(runs: dict) -> dict:
    """Each run's REPEATS times in CPU seconds of this process (other processes on the host slow
    the wall clock, not this), and its last result. The runs take turns, so a busy spell of the
    host slows them alike."""
    times: dict = {key: [] for key in runs}
    results = {}
    for _ in range(REPEATS):
        for key, run in runs.items():
            start = time.process_time()
            results[key] = run()
            times[key].append(time.process_time() - start)
    return {key: (sorted(times[key]), results[key]) for key in runs}


def figures(sim) -> tuple:
    """What must not change between simulators: cycles, every unit's figures, bytes per path."""
    return sim.cycles, {name: (u.busy_cycles, u.tasks, u.bytes) for name, u in sim.units.items()}, sim.bytes_moved


def profile(title: str, run) -> None:
    prof = cProfile.Profile()
    prof.runcall(run)
    print(f"--- {title}", file=sys.stderr)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(PROFILE_LINES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="M = N = K of the GEMM")
    parser.add_argument("--baseline", metavar="REV", help="also time the simulator of this commit")
    parser.add_argument("--profile", action="store_true", help="print cProfile figures; write no results")
    args = parser.parse_args()

    machine = load_machine(str(CONFIG))
    load = os.getloadavg()[0]  # other jobs on the host share its caches: figures vary with them
    with tempfile.TemporaryDirectory(prefix="kpu_bench_") as tmp:
        dfg, obj = Path(tmp) / "gemm.dfg", Path(tmp) / "gemm.kpu"
        dfg.write_text(gemm_dfg(args.size, args.size, args.size))
        subprocess.run([sys.executable, "-m", "kernel_compiler", str(dfg), "--target", str(CONFIG), "-o", str(obj)],
                       cwd=ROOT, check=True, capture_output=True)
        program = read(obj)
        bindings = bind_program(program, machine, str(obj), bind_cpsat)
        simulators = [(f"this tree ({git('describe', '--always', '--dirty').decode().strip()})", Simulator)]
        if args.baseline:
            rev = git("rev-parse", "--short", args.baseline).decode().strip()
            simulators.insert(0, (f"before: commit {rev}", baseline_simulator(rev, Path(tmp))))

        def generation():
            return list(program_tasks(program, bindings))

        def simulation(cls, stream):  # `stream` makes the tasks to simulate: a list, or the lazy stream
            return lambda: cls(machine, dep_window=DEP_WINDOW).run(stream())

        tasks = generation()
        if args.profile:
            profile("generation", generation)
            for label, cls in simulators:
                profile(f"simulation, {label}", simulation(cls, lambda: tasks))
            return

        runs = {"generation": generation}
        for label, cls in simulators:
            runs[label, "simulation"] = simulation(cls, lambda: tasks)
            runs[label, "end to end"] = simulation(cls, lambda: program_tasks(program, bindings))
        done = timed(runs)
        gen_s = done["generation"][0][0]
        rows = [(label, done[label, "simulation"][0], done[label, "end to end"][0]) for label, _ in simulators]
        sims = [done[key][1] for key in runs if key != "generation"]
        if any(figures(sim) != figures(sims[0]) for sim in sims):
            raise SystemExit("the simulators, or a list and the lazy stream, disagree on cycles or unit figures")

    n = len(tasks)
    reproduce = "`.venv/bin/python benchmarks/sim_throughput.py" + \
        (f" --size {args.size}" if args.size != 2048 else "") + \
        (f" --baseline {args.baseline}`" if args.baseline else "`")
    lines = [f"Machine: {host()}, load average {load:.1f} at the start. Date: {today()}.",
             f"Reproduce: {reproduce}.", "",
             f"The {args.size}^3 f32 GEMM compiled for `configs/standard.json`, bound by CP-SAT and simulated "
             f"timing only: {n:,} tasks, {sims[0].cycles:,} cycles. Each part ran {REPEATS} times in "
             "process, the parts taking turns; times are CPU seconds, the fastest and the median "
             "(compiling and binding not included). Generation is the loader's "
             f"task stream (`loader.program_tasks`) materialised into a list: {gen_s:.3f} s "
             f"(fastest), {n / gen_s:,.0f} tasks/s. Simulation is `Simulator.run` on that list; end to end is "
             "`Simulator.run` on the lazy stream, generation and simulation interleaved as `kpu-loader` "
             "runs them. Every simulator listed gave the same cycles and per-unit figures.", "",
             "| simulator | simulation s, fastest / median | simulation tasks/s (fastest) "
             "| end to end s, fastest / median | end to end tasks/s (fastest) |",
             "|---|---:|---:|---:|---:|"]
    for label, sim_s, e2e_s in rows:
        lines.append(f"| {label} | {sim_s[0]:.3f} / {median(sim_s):.3f} | {n / sim_s[0]:,.0f} "
                     f"| {e2e_s[0]:.3f} / {median(e2e_s):.3f} | {n / e2e_s[0]:,.0f} |")
    label, sim_s, e2e_s = rows[-1]
    lines += ["", f"With {label}, simulating takes {sim_s[0] / e2e_s[0]:.0%} of the end-to-end time: the "
              "rest is generating the task stream."]
    write_section("Simulator throughput", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
