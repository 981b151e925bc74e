"""CP-SAT vs greedy binding on every example matmul, on configs/standard.json.

Each workload is compiled for configs/standard.json, bound by both binders, and simulated
(timing only, as `kpu-loader --timing-only`). Reported per workload: the estimated makespan
(engines and L2 bank ports, `loader.estimate_makespan`, summed over kernels), the simulated
cycles, and the bind time per kernel. Writes the section `## Binding: CP-SAT vs greedy` of
benchmarks/RESULTS.md.

Reproduce: .venv/bin/python benchmarks/binding.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from make_gemm import gemm_dfg  # noqa: E402
from results import machine as host, today, write_section  # noqa: E402

from dfx import read  # noqa: E402
from hardware import load_machine  # noqa: E402
from loader import bind_cpsat, bind_greedy, bind_program, simulate  # noqa: E402

CONFIG = ROOT / "configs" / "standard.json"
EXAMPLES = sorted(p for pattern in ("*matmul*.dfg", "*AtimesBtimesC*.dfg")
                  for p in (ROOT / "tests" / "data" / "dfg").glob(pattern))
GENERATED = [(256, 256, 256), (512, 1024, 256), (1024, 1024, 1024)]  # M, K, N
REPEATS = 3  # binds per binder; the fastest time counts (the others measure the host's noise)


@dataclass
class Run:
    estimate: int  # cycles, summed over kernels
    cycles: int  # simulated
    bind_ms: list[float]  # per kernel, fastest of REPEATS
    workers: list[int]


def compile_all(tmp: Path) -> list[tuple[str, Path | str]]:
    """(workload, object file or the compiler's error line) for every example."""
    sources = [(p.stem, p.relative_to(ROOT)) for p in EXAMPLES]  # relative: error lines name them so
    for M, K, N in GENERATED:
        path = tmp / f"matmul_{M}x{K}x{N}.dfg"
        path.write_text(gemm_dfg(M, N, K))
        sources.append((path.stem, path))
    out = []
    for name, src in sources:
        obj = tmp / f"{name}.kpu"
        proc = subprocess.run([sys.executable, "-m", "kernel_compiler", str(src), "-o", str(obj),
                               "--target", str(CONFIG)], capture_output=True, text=True, cwd=ROOT)
        out.append((name, obj if proc.returncode == 0 else proc.stderr.strip().splitlines()[-1]))
    return out


def run(obj: Path, binder) -> Run:
    program = read(obj)
    m = load_machine(CONFIG)
    tries = [bind_program(program, m, str(obj), binder) for _ in range(REPEATS)]
    bindings = tries[0]
    # every repeat must bind the same way; CP-SAT is deterministic
    assert all([(b.buffers, b.engines) for b in t] == [(b.buffers, b.engines) for b in bindings] for t in tries)
    estimate = sum(b.makespan_estimate for b in bindings)
    bind_ms = [1000 * min(t[k].bind_seconds for t in tries) for k in range(len(bindings))]
    return Run(estimate, simulate(program, m, bindings).cycles, bind_ms, [b.workers for b in bindings])


def table(results: list[tuple[str, Run, Run]]) -> str:
    rows = ["| workload | kernels | compute tiles | est. makespan greedy | est. makespan CP-SAT | "
            "sim cycles greedy | sim cycles CP-SAT | cycles change | bind ms/kernel greedy (max) | "
            "bind ms/kernel CP-SAT (mean / max) |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, g, c in results:
        change = 100 * (c.cycles - g.cycles) / g.cycles
        rows.append(f"| {name} | {len(c.bind_ms)} | {','.join(map(str, c.workers))} | {g.estimate:,} | "
                    f"{c.estimate:,} | {g.cycles:,} | {c.cycles:,} | {change:+.2f}% | {max(g.bind_ms):.2f} | "
                    f"{sum(c.bind_ms) / len(c.bind_ms):.1f} / {max(c.bind_ms):.1f} |")
    return "\n".join(rows)


def verdict(results: list[tuple[str, Run, Run]]) -> str:
    worse = [name for name, g, c in results if c.cycles > g.cycles]
    better = [name for name, g, c in results if c.cycles < g.cycles]
    slowest = max(max(c.bind_ms) for _, _, c in results)
    text = (f"CP-SAT takes fewer simulated cycles than greedy on {len(better)} of {len(results)} workloads "
            f"and as many on {len(results) - len(better) - len(worse)}; ")
    text += (f"it takes MORE on {', '.join(worse)}." if worse else "it takes more on none.")
    return text + f" The slowest CP-SAT bind of one kernel took {slowest:.0f} ms."


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results, skipped = [], []
        for name, obj in compile_all(Path(tmp)):
            if isinstance(obj, str):
                skipped.append(f"- {name}: not compiled: `{obj}`")
                continue
            results.append((name, run(obj, bind_greedy), run(obj, bind_cpsat)))
            print(f"{name}: greedy {results[-1][1].cycles:,} cycles, CP-SAT {results[-1][2].cycles:,}", file=sys.stderr)
    text = f"""Machine: {host()}. Date: {today()}.
Reproduce: `.venv/bin/python benchmarks/binding.py`.

Every matmul of `tests/data/dfg/` (`*matmul*`, `*AtimesBtimesC*`) and three generated ones (`matmul_MxKxN`)
are compiled for `configs/standard.json` and bound to it by `--binder greedy` (first fit, round-robin
engines) and `--binder cp-sat` (a work limit of 0.25 deterministic seconds, the same on any machine); with either, the loader then moves each kernel's
banks off the memory the kernels before it used, so kernels can overlap. The estimated makespan is the most-loaded engine
or L2 bank port (`loader.estimate_makespan`, the same count for both binders), summed over the
kernels. Simulated cycles are timing-only runs (`loader.simulate`). Bind time is the wall time of
one kernel's binding inside `bind_program` (CP-SAT: model building and solving; both: that move), the fastest of
{REPEATS} runs; the {REPEATS} runs bound identically.

{verdict(results)}

{table(results)}
"""
    if skipped:
        text += "\nNot benchmarked:\n" + "\n".join(skipped) + "\n"
    write_section("Binding: CP-SAT vs greedy", text)


if __name__ == "__main__":
    main()
