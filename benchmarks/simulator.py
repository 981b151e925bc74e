"""Large GEMMs through the whole toolchain: cycles, utilization, wall time and peak memory.

    .venv/bin/python benchmarks/simulator.py

Writes the section "Simulator: large GEMMs" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, measure, today, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# (M=N=K, config, loader flags, what the run shows)
RUNS = [
    (1024, "standard", ["--check"], "values and --check, 2 compute tiles of 16x16"),
    (1024, "slow_dram", [], "standard with a tenth of the DRAM bandwidth"),
    (4096, "datacenter", ["--timing-only"], "--timing-only, 4 compute tiles of 32x32"),
]


def slow_dram_config(work: Path) -> Path:
    config = json.loads((ROOT / "configs" / "standard.json").read_text())
    config["name"] = "standard, DRAM / 10"
    config["external_memory"]["bandwidth_gbps"] /= 10
    path = work / "slow_dram.json"
    path.write_text(json.dumps(config))
    return path


def run(size: int, config: str, flags: list[str], work: Path) -> dict:
    dfg, obj, out = work / f"g{size}.dfg", work / f"g{size}_{config}.kpu", work / "out.json"
    config_path = slow_dram_config(work) if config == "slow_dram" else ROOT / "configs" / f"{config}.json"
    target = ROOT / "configs" / ("standard.json" if config == "slow_dram" else f"{config}.json")
    measure([sys.executable, str(ROOT / "examples" / "make_gemm.py"), str(size), str(size), str(size), "-o", str(dfg)])
    compile_wall, _ = measure([str(BIN / "kpu-kernel-compiler"), str(dfg), "--target", str(target), "-o", str(obj)])
    wall, rss = measure([str(BIN / "kpu-loader"), str(obj), "--config", str(config_path), "--json", *flags], out)
    s = json.loads(out.read_text())
    dma = max(u["utilization"] for name, u in s["units"].items() if name.startswith("dma"))
    return {"cycles": s["cycles"], "utilization": s["utilization"], "bound": s["roofline"]["bound"],
            "dma": dma, "check": s.get("check", {}).get("passed"), "compile": compile_wall,
            "wall": wall, "rss": rss}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kpu_bench_") as tmp:
        for size, config, flags, what in RUNS:
            r = run(size, config, flags, Path(tmp))
            print(f"{size}^3 on {config}: {r}", file=sys.stderr)
            rows.append((size, config, what, r))
    lines = [f"Machine: {machine()}. Date: {today()}.",
             "Reproduce: `.venv/bin/python benchmarks/simulator.py`.", "",
             "Each row compiles `examples/make_gemm.py N N N` for the config's machine class and runs "
             "`kpu-loader --json` on it; wall time is the loader process (startup included), peak "
             "memory its own max RSS.", "",
             "| GEMM | config | run | cycles | array utilization | bound | busiest DMA | check | compile s | loader s | peak MB |",
             "|---|---|---|---:|---:|---|---:|---|---:|---:|---:|"]
    for size, config, what, r in rows:
        check = {True: "pass", False: "FAIL", None: "-"}[r["check"]]
        lines.append(f"| {size}^3 f32 | {config} | {what} | {r['cycles']:,} | {r['utilization']:.1%} | {r['bound']} "
                     f"| {r['dma']:.1%} | {check} | {r['compile']:.2f} | {r['wall']:.2f} | {r['rss']:.0f} |")
    write_section("Simulator: large GEMMs", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
