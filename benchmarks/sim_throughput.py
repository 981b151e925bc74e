"""Simulator throughput: tasks per second of the task stream and of the event loop, apart and together.

    .venv/bin/python benchmarks/sim_throughput.py [--baseline REV] [--size N] [--profile]

The workload is the N^3 f32 GEMM (N = 2048 unless --size says otherwise) compiled for
configs/standard.json and bound by CP-SAT, as `kpu-loader --timing-only` runs it. Timed apart,
in CPU seconds, fastest and median:
- generation: the loader's task stream (`loader.program_tasks`), materialised into a list once;
- simulation: `Simulator.run` on that list, so no task generation is in its time;
- end to end: `Simulator.run` on the lazy stream, the two interleaved as `kpu-loader` runs them.
With `--baseline REV` the whole toolchain of commit REV (its tree unpacked with `git archive`,
the work tree untouched) is timed the same way: compiler, task stream and simulator all of that
commit. Each tree runs in a process of its own (`--tree`), the trees taking turns round by
round, and both must give the same tasks, cycles and per-unit figures. Writes the section
"Simulator throughput" of benchmarks/RESULTS.md, unless `--profile`, which prints the cProfile
top functions of generation and of simulation instead.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "standard.json"
ROUNDS = 4  # the trees take turns this many times
REPEATS = 3  # runs of each part per round: ROUNDS * REPEATS in all, whose spread shows the host's noise
PROFILE_LINES = 15
GOAL = 150_000  # end-to-end tasks/s asked of the 2048^3 GEMM


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout


def unpack(rev: str, into: Path) -> Path:
    """The tree of commit `rev`, unpacked under `into`."""
    tree = into / rev
    with tarfile.open(fileobj=io.BytesIO(git("archive", "--format=tar", rev))) as archive:
        archive.extractall(tree, filter="data")
    return tree


def timed(runs: dict, repeats: int) -> dict:
    """Each run's times in CPU seconds of this process (other processes on the host slow the wall
    clock, not this), and its last result. The runs take turns, so a busy spell of the host slows
    them alike."""
    times: dict = {key: [] for key in runs}
    results = {}
    for _ in range(repeats):
        for key, run in runs.items():
            start = time.process_time()
            results[key] = run()
            times[key].append(time.process_time() - start)
    return {key: (times[key], results[key]) for key in runs}


def figures(sim) -> list:
    """What must not change between trees: cycles, every unit's figures, bytes per path."""
    return [sim.cycles, {name: [u.busy_cycles, u.tasks, u.bytes] for name, u in sim.units.items()}, sim.bytes_moved]


def profile(title: str, run) -> None:
    prof = cProfile.Profile()
    prof.runcall(run)
    print(f"--- {title}", file=sys.stderr)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(PROFILE_LINES)


def measure(tree: Path, dfg: Path, repeats: int, show_profile: bool) -> dict:
    """In a process of its own: compile, bind and time the GEMM with the packages of `tree`."""
    sys.path.insert(0, str(tree))
    from dfx import read
    from hardware import Simulator, load_machine
    from loader import bind_cpsat, bind_program, program_tasks
    from loader.tasks import DEP_WINDOW

    obj = dfg.with_name(f"{dfg.stem}_{os.getpid()}.kpu")
    subprocess.run([sys.executable, "-m", "kernel_compiler", str(dfg), "--target", str(CONFIG), "-o", str(obj)],
                   cwd=tree, check=True, capture_output=True)
    machine = load_machine(str(CONFIG))
    program = read(obj)
    bindings = bind_program(program, machine, str(obj), bind_cpsat)

    def generation():
        return list(program_tasks(program, bindings, machine))

    def simulation(stream):  # `stream` makes the tasks to simulate: a list, or the lazy stream
        return lambda: Simulator(machine, dep_window=DEP_WINDOW).run(stream())

    tasks = generation()
    if show_profile:
        profile(f"generation, {tree}", generation)
        profile(f"simulation, {tree}", simulation(lambda: tasks))
        return {}
    done = timed({"generation": generation, "simulation": simulation(lambda: tasks),
                  "end to end": simulation(lambda: program_tasks(program, bindings, machine))}, repeats)
    if figures(done["simulation"][1]) != figures(done["end to end"][1]):
        raise SystemExit("a list and the lazy stream of tasks disagree on cycles or unit figures")
    return {"tasks": len(tasks), "figures": figures(done["end to end"][1]),
            "times": {part: seconds for part, (seconds, _) in done.items()}}


def run_tree(tree: Path, dfg: Path, repeats: int, show_profile: bool) -> dict:
    cmd = [sys.executable, __file__, "--tree", str(tree), "--dfg", str(dfg), "--repeats", str(repeats)]
    out = subprocess.run(cmd + (["--profile"] if show_profile else []), check=True, stdout=subprocess.PIPE).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="M = N = K of the GEMM")
    parser.add_argument("--baseline", metavar="REV", help="also time the whole toolchain of this commit")
    parser.add_argument("--profile", action="store_true", help="print cProfile figures; write no results")
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # a worker: time the packages of this tree
    parser.add_argument("--dfg", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=REPEATS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tree is not None:
        print(json.dumps(measure(args.tree, args.dfg, args.repeats, args.profile)))
        return

    sys.path[:0] = [str(ROOT / "examples"), str(Path(__file__).resolve().parent)]
    from make_gemm import gemm_dfg
    from results import machine as host, today, write_section

    load = os.getloadavg()[0]  # other jobs on the host share its caches: figures vary with them
    with tempfile.TemporaryDirectory(prefix="kpu_bench_") as tmp:
        dfg = Path(tmp) / "gemm.dfg"
        dfg.write_text(gemm_dfg(args.size, args.size, args.size))
        trees = [(f"this tree ({git('describe', '--always', '--dirty').decode().strip()})", ROOT)]
        if args.baseline:
            rev = git("rev-parse", "--short", args.baseline).decode().strip()
            trees.insert(0, (f"before: commit {rev}", unpack(rev, Path(tmp))))
        if args.profile:
            for _, tree in trees:
                run_tree(tree, dfg, 1, True)
            return
        runs = {label: [] for label, _ in trees}
        for _ in range(ROUNDS):
            for label, tree in trees:
                runs[label].append(run_tree(tree, dfg, REPEATS, False))
    results = [run for label in runs for run in runs[label]]
    if any((r["tasks"], r["figures"]) != (results[0]["tasks"], results[0]["figures"]) for r in results):
        raise SystemExit("the trees disagree on tasks, cycles or unit figures")
    times = {label: {part: sorted(t for r in rs for t in r["times"][part]) for part in rs[0]["times"]}
             for label, rs in runs.items()}

    n, cycles = results[0]["tasks"], results[0]["figures"][0]
    reproduce = "`.venv/bin/python benchmarks/sim_throughput.py" + \
        (f" --size {args.size}" if args.size != 2048 else "") + \
        (f" --baseline {args.baseline}`" if args.baseline else "`")
    lines = [f"Machine: {host()}, load average {load:.1f} at the start. Date: {today()}.",
             f"Reproduce: {reproduce}.", "",
             f"The {args.size}^3 f32 GEMM compiled for `configs/standard.json`, bound by CP-SAT and simulated "
             f"timing only: {n:,} tasks, {cycles:,} cycles. Times are CPU seconds, the fastest and the median of "
             f"{ROUNDS * REPEATS} runs of each part (compiling and binding not included): each tree runs in a "
             f"process of its own, {ROUNDS} rounds of {REPEATS} runs, the trees and the parts taking turns. "
             "Generation is the loader's task stream (`loader.program_tasks`) materialised into a list; "
             "simulation is `Simulator.run` on that list; end to end is `Simulator.run` on the lazy stream, "
             "generation and simulation interleaved as `kpu-loader` runs them. "
             + ("A baseline commit is timed whole: its compiler, task stream and simulator. " if args.baseline else "")
             + "Every tree gave the same tasks, cycles and per-unit figures.", "",
             "| tree | generation s, fastest / median | generation tasks/s | simulation s, fastest / median "
             "| simulation tasks/s | end to end s, fastest / median | end to end tasks/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, parts in times.items():
        cells = [f"{s[0]:.3f} / {median(s):.3f} | {n / s[0]:,.0f}"
                 for s in (parts["generation"], parts["simulation"], parts["end to end"])]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    label, parts = list(times.items())[-1]
    e2e, sim = parts["end to end"][0], parts["simulation"][0]
    first_e2e = list(times.values())[0]["end to end"][0]
    lines += ["", f"With {label}, simulating takes {sim / e2e:.0%} of the end-to-end time: the rest is generating "
              f"the task stream. End to end it runs {n / e2e:,.0f} tasks/s (fastest)"
              + (f", {first_e2e / e2e:.1f} times the baseline's" if args.baseline else "")
              + (f"; the goal is {GOAL:,}: {'met' if n / e2e >= GOAL else 'not met'}." if args.size == 2048 else ".")]
    write_section("Simulator throughput", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
