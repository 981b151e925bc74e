"""External-memory traffic of the matmul tiling against the I/O lower bound, before and after.

    .venv/bin/python benchmarks/tiling.py [--before REV]

For each f32 GEMM shape on configs/standard.json: the bytes the simulator moved over external
memory (`kpu-loader --timing-only --json`, reads plus writes), the compiler's own count (the
kernel's `estimated_dram_bytes` hint), the lower bound max(compulsory, 2*M*N*K*e / sqrt(S/e))
with S all of L3's bytes and e the element size, their ratio, cycles and array utilization, and
the compile time of the kernel (in-process, imports excluded). "Before" runs the same commands on
the tree of commit REV (default: the commit before the two-level tiling), unpacked with
`git archive` into a temporary folder. 1024^3 also runs with values and `--check`. Replaces the
section "Tiling: external-memory traffic" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SECTION = "Tiling: external-memory traffic"
CONFIG = REPO / "configs" / "standard.json"
SHAPES = [(1024, 1024, 1024), (8192, 256, 256), (256, 8192, 256), (256, 256, 8192), (4096, 4096, 64)]
BEFORE = "2c223a8"
ELEM = 4


def tool(tree: Path, module: str, *args) -> subprocess.CompletedProcess:
    """Run one CLI's main from the source tree `tree` (this checkout or an unpacked commit)."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); sys.argv = ['x'] + sys.argv[1:]; " \
           f"from {module}.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(map(str, args))}: {proc.stderr.strip()}")
    return proc


def lower_bound(M: int, N: int, K: int, l3_bytes: int) -> float:
    compulsory = (M * K + K * N + M * N) * ELEM
    return max(compulsory, 2 * M * N * K * ELEM / math.sqrt(l3_bytes / ELEM))


def measure(tree: Path, work: Path, M: int, N: int, K: int, check: bool = False) -> dict:
    dfg, obj = work / f"gemm_{M}x{N}x{K}.dfg", work / f"gemm_{M}x{N}x{K}.kpu"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_gemm.py"), str(M), str(N), str(K), "-o", str(dfg)],
                   check=True, capture_output=True)
    tool(tree, "kernel_compiler", dfg, "-o", obj, "--target", CONFIG)
    kernel = json.loads(obj.read_text())["body"]["kernels"][0]
    run = json.loads(tool(tree, "loader", obj, "--config", CONFIG, "--json",
                          *(["--check"] if check else ["--timing-only"])).stdout)
    return {"dram": run["dram_bytes"]["read"] + run["dram_bytes"]["write"], "cycles": run["cycles"],
            "utilization": run["utilization"], "estimated": kernel["hints"]["estimated_dram_bytes"],
            "check": run.get("check", {}).get("passed") if check else None, "tiling": kernel["tiling"],
            "resident": kernel["hints"].get("l3_resident", "none")}


def compile_seconds(M: int, N: int, K: int, work: Path) -> float:
    """The fastest of 3 in-process compiles of the kernel (imports done beforehand)."""
    from kernel_compiler import compile_graph, load_graph, load_target

    graph, _ = load_graph(str(work / f"gemm_{M}x{N}x{K}.dfg"))
    target = load_target(str(CONFIG))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        compile_graph(graph, "gemm.dfg", target)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with")
    args = ap.parse_args()
    from hardware import load_machine

    m = load_machine(str(CONFIG))
    l3 = m.l3.count * m.l3.bytes
    with tempfile.TemporaryDirectory() as tmp:
        work, old = Path(tmp) / "work", Path(tmp) / "before"
        work.mkdir()
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        rows, checked = [], None
        for M, N, K in SHAPES:
            before, after = measure(old, work, M, N, K), measure(REPO, work, M, N, K)
            rows.append((M, N, K, before, after, lower_bound(M, N, K, l3), compile_seconds(M, N, K, work)))
            print(f"{M}x{N}x{K}: {before['dram']} -> {after['dram']} B", file=sys.stderr)
        checked = measure(REPO, work, 1024, 1024, 1024, check=True)

    lines = [
        f"Machine: {machine()}. Date: {today()}.",
        f"Reproduce: `.venv/bin/python benchmarks/tiling.py --before {args.before}`.",
        "",
        f"f32 GEMMs M x N x K on `configs/standard.json` (2 compute tiles of 16x16, L3 4 x 128 KB = S, "
        f"external memory 100 bytes/cycle), `--timing-only`. DRAM is the bytes the simulator moved over "
        f"external memory (reads and writes, `--json`); the bound is max(compulsory, 2MNKe/sqrt(S/e)). "
        f"Before: commit {args.before} (one level of tiles: every L3 tile is an L2 tile). After: an operand's "
        f"panel (all of K) may stay in L3 while the other streams past it, and loads into L3 outside the "
        f"parallel loop are shared by the compute tiles. Compile: one kernel, in-process, fastest of 3.",
        "",
        "| M x N x K | DRAM before | DRAM after | compiler's count after | lower bound | ratio before | "
        "ratio after | L3 resident after | cycles before | cycles after | utilization before | "
        "utilization after | compile s |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for M, N, K, b, a, bound, seconds in rows:
        lines.append(
            f"| {M}x{N}x{K} | {b['dram']:,} | {a['dram']:,} | {a['estimated']:,} | {bound:,.0f} | "
            f"{b['dram'] / bound:.2f} | {a['dram'] / bound:.2f} | {a['resident']} | {b['cycles']:,} | "
            f"{a['cycles']:,} | {b['utilization']:.1%} | {a['utilization']:.1%} | {seconds:.3f} |")
    equal = all(a["dram"] == a["estimated"] for *_, a, _, _ in rows)
    lines += [
        "",
        f"The compiler's count equals the simulator's bytes on {'every' if equal else 'not every'} shape. "
        f"1024x1024x1024 with values and `--check`: {checked['cycles']:,} cycles, "
        f"{checked['utilization']:.1%} array utilization, check {'passed' if checked['check'] else 'FAILED'}.",
    ]
    skew = m.compute.rows + m.compute.cols - 2
    lines += [
        "",
        f"Not reached: 1024^3 and 256x256x8192 keep their one-level tiling. Reaching 1.3x on 1024^3 needs "
        f"A and B read at most 6 times between them, so a block of C of at least 342 x 342 (468 KB of f32 "
        f"partial sums) resident while K advances in blocks: with the rest of L3 or L2 the K blocks are a "
        f"few columns deep, and each block of K drains every 16x16 output block of the array "
        f"({skew} cycles, as SCALE-Sim counts it), so utilization falls far below the 95.5% of keeping all "
        f"of K in the array; the array's own ceiling for 1024^3 is K / (K + {skew}) = "
        f"{1024 / (1024 + skew):.2%}; the array waits while each result tile's accumulators drain to L2 "
        f"(they hold one tile) and for the first loads, which lowers it to the figure above, so the 97% "
        f"target is not reachable on this array model either. 256x256x8192 is compute-bound on "
        f"`standard` (its 33.8 MB take a third of the link over its 1.06 M cycles): halving its traffic "
        f"would need partial sums on chip and cost utilization without saving time.",
    ]
    write_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
