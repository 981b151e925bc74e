"""Run the same GEMMs through SCALE-Sim v3 and through our loader; write both side by side.

    .venv/bin/python benchmarks/vs_scalesim.py [--sizes 64 256 1024] [--skip-scalesim]

For each M=N=K size and each dataflow (os, ws) on one 32x32 array whose memory never stalls it,
this reports both cycle counts, both wall times and both peak RSS, and replaces the section
"## Simulator vs SCALE-Sim v3" of benchmarks/RESULTS.md (other sections are kept).

SCALE-Sim is not a project dependency: it is installed into its own venv,
benchmarks/.scalesim-venv (gitignored). When that install fails (offline), our side still runs
and the section gives SCALE-Sim's known reference cycles, labelled as such.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, measure, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECTION = "Simulator vs SCALE-Sim v3"
CONFIG = REPO / "configs" / "ideal_32x32.json"
# The CLIs sit next to the interpreter of the project's venv that runs this script.
BIN = Path(sys.executable).parent
SCALESIM_VENV = REPO / "benchmarks" / ".scalesim-venv"
SCALESIM_PY = SCALESIM_VENV / "bin" / "python"
# SCALE-Sim 3.0.0 does not run with numpy 2.4.
SCALESIM_PACKAGES = ["scalesim==3.0.0", "numpy<2.4"]
DATAFLOWS = ("os", "ws")

# SCALE-Sim 3.0.0 "Total Cycles" (without prefetch) on a 32x32 array, measured earlier; shown
# only when SCALE-Sim cannot be installed, and then labelled as reference, never as measured.
REFERENCE_CYCLES = {
    ("os", 64): 503, ("os", 256): 20351, ("os", 1024): 1112063,
    ("ws", 64): 631, ("ws", 256): 22399, ("ws", 1024): 1144831,
}

# A 32x32 array with SRAMs far larger than any operand here (64 MB each) so nothing is evicted.
# CALC bandwidth mode lets SCALE-Sim size DRAM bandwidth to the demand, so it never stalls:
# its "Total Cycles" is then the array's compute time, which is what ideal_32x32 models.
SCALESIM_CFG = """\
[general]
run_name = gemm

[architecture_presets]
ArrayHeight = 32
ArrayWidth = 32
IfmapSramSzkB = 65536
FilterSramSzkB = 65536
OfmapSramSzkB = 65536
IfmapOffset = 0
FilterOffset = 10000000
OfmapOffset = 20000000
Bandwidth = 10
Dataflow = {dataflow}
ReadRequestBuffer = 32
WriteRequestBuffer = 32

[layout]
IfmapCustomLayout = False
IfmapSRAMBankBandwidth = 10
IfmapSRAMBankNum = 10
IfmapSRAMBankPort = 2
FilterCustomLayout = False
FilterSRAMBankBandwidth = 10
FilterSRAMBankNum = 10
FilterSRAMBankPort = 2

[sparsity]
SparsitySupport = false

[run_presets]
InterfaceBandwidth = CALC
UseRamulatorTrace = False
"""

# scalesim/scale.py always saves the SRAM/DRAM traces (its -s flag is parsed but unused); at
# 1024^3 that is gigabytes of CSV. So the class is driven directly with save_disk_space=True,
# which still writes COMPUTE_REPORT.csv.
SCALESIM_DRIVER = """\
import sys
from scalesim.scale_sim import scalesim
cfg, topo, layout, out = sys.argv[1:]
s = scalesim(save_disk_space=True, verbose=False, config=cfg, topology=topo, layout=layout,
             input_type_gemm=True)
s.run_scale(top_path=out)
"""


def ensure_scalesim() -> str | None:
    """Make the SCALE-Sim venv if needed; return None when ready, else why it is not."""
    check = [str(SCALESIM_PY), "-c", "import importlib.metadata as m, scalesim;"
             "assert m.version('scalesim') == '3.0.0'"]
    if SCALESIM_PY.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return None
    print(f"installing {' '.join(SCALESIM_PACKAGES)} into {SCALESIM_VENV} ...", file=sys.stderr)
    steps = [["python3.11", "-m", "venv", str(SCALESIM_VENV)],
             [str(SCALESIM_PY), "-m", "pip", "install", "--quiet", *SCALESIM_PACKAGES], check]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True)
        except OSError as e:
            return f"`{step[0]}` could not run ({e})"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return f"`{' '.join(step[:3])} ...` failed: {last}"
    return None


def run_scalesim(size: int, dataflow: str, work: Path) -> dict:
    """One GEMM through SCALE-Sim: its "Total Cycles" (without prefetch), wall time, peak RSS."""
    run = work / f"scalesim_{dataflow}_{size}"
    run.mkdir()
    (run / "scale.cfg").write_text(SCALESIM_CFG.format(dataflow=dataflow))
    # GEMM topology (read with input_type_gemm): a header row, then "name, M, N, K," per layer;
    # the trailing comma matters, SCALE-Sim drops the last field of every row.
    (run / "topo.csv").write_text(f"Layer, M, N, K,\ngemm, {size}, {size}, {size},\n")
    # No custom layout is used (IfmapCustomLayout = False) but the file must exist.
    (run / "layout.csv").write_text("Layer name,\n")
    cmd = [str(SCALESIM_PY), "-c", SCALESIM_DRIVER, str(run / "scale.cfg"),
           str(run / "topo.csv"), str(run / "layout.csv"), str(run / "out")]
    wall, rss = measure(cmd, run / "stdout.txt")
    header, row = (run / "out" / "gemm" / "COMPUTE_REPORT.csv").read_text().splitlines()[:2]
    report = dict(zip((h.strip() for h in header.split(",")), (v.strip() for v in row.split(","))))
    return {"cycles": int(report["Total Cycles"]), "wall": wall, "rss": rss}


def run_ours(size: int, dataflow: str, work: Path) -> dict:
    """One GEMM compiled and run by our loader, with the numbers computed and with --timing-only."""
    dfg, kpu = work / f"gemm_{size}.dfg", work / f"gemm_{size}_{dataflow}.kpu"
    if not dfg.exists():
        subprocess.run([sys.executable, str(REPO / "examples" / "make_gemm.py"),
                        *[str(size)] * 3, "-o", str(dfg)], check=True)
    compile_wall, _ = measure([str(BIN / "kpu-kernel-compiler"), str(dfg), "--dataflow", dataflow,
                               "--target", str(CONFIG), "-o", str(kpu)], work / "compile.txt")
    loader = [str(BIN / "kpu-loader"), str(kpu), "--config", str(CONFIG), "--json"]
    result = {"compile_wall": compile_wall}
    for mode, extra in (("full", []), ("timing", ["--timing-only"])):
        out = work / f"ours_{dataflow}_{size}_{mode}.json"
        wall, rss = measure(loader + extra, out)
        result[mode] = {"cycles": json.loads(out.read_text())["cycles"], "wall": wall, "rss": rss}
    if result["full"]["cycles"] != result["timing"]["cycles"]:
        raise RuntimeError(f"{dataflow} {size}: --timing-only changed the cycle count")
    result["cycles"] = result["full"]["cycles"]
    return result


def section(rows: list[tuple[int, str, dict, dict | None]], scalesim_missing: str | None) -> str:
    lines = [
        f"Machine: {machine()}. Date: {today()}.",
        "Reproduce: `.venv/bin/python benchmarks/vs_scalesim.py`.", "",
        "GEMM M=N=K on one 32x32 array whose memory never stalls it: ours is `kpu-kernel-compiler "
        "--dataflow os|ws --target configs/ideal_32x32.json` then `kpu-loader --json` (values "
        "computed tile by tile) and `kpu-loader --json --timing-only`; SCALE-Sim 3.0.0 runs a "
        "32x32 array, 64 MB SRAMs, CALC bandwidth (no stalls), GEMM topology, traces not saved. "
        "SCALE-Sim cycles are its COMPUTE_REPORT `Total Cycles`, which excludes the DRAM prefetch "
        "(`Total Cycles (incl. prefetch)` is the other column). Wall time and peak RSS are "
        "measured the same way for every process: wall clock around the subprocess, interpreter "
        "startup included, and its own `ru_maxrss` from `wait4`. Compile time is not in our wall "
        "time and is shown apart.", "",
    ]
    if scalesim_missing:
        lines += [f"**SCALE-Sim was not available** ({scalesim_missing}). Its column shows the "
                  "known *reference* cycles of SCALE-Sim 3.0.0 (total cycles without prefetch), "
                  "not measured on this run; its wall time and memory are unknown.", "",
                  "| M=N=K | dataflow | our cycles | SCALE-Sim cycles (reference, not measured) "
                  "| diff cycles | diff % | our compile s | our loader s (numbers) "
                  "| our loader s (timing-only) | our peak MB (numbers) "
                  "| our peak MB (timing-only) |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    else:
        lines += ["| M=N=K | dataflow | our cycles | SCALE-Sim cycles | diff cycles | diff % "
                  "| our compile s | our loader s (numbers) | our loader s (timing-only) "
                  "| SCALE-Sim s | speedup (numbers) | speedup (timing-only) "
                  "| our peak MB (numbers) | our peak MB (timing-only) | SCALE-Sim peak MB |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, dataflow, ours, theirs in rows:
        full, timing = ours["full"], ours["timing"]
        ref = theirs["cycles"] if theirs else REFERENCE_CYCLES.get((dataflow, size))
        diff = [f"{ours['cycles'] - ref:+d}", f"{100 * (ours['cycles'] - ref) / ref:+.4f}"] \
            if ref else ["n/a", "n/a"]
        cells = [size, dataflow, ours["cycles"], ref or "n/a", *diff, f"{ours['compile_wall']:.2f}",
                 f"{full['wall']:.2f}", f"{timing['wall']:.2f}"]
        if theirs:
            cells += [f"{theirs['wall']:.2f}", f"{theirs['wall'] / full['wall']:.1f}x",
                      f"{theirs['wall'] / timing['wall']:.1f}x"]
        cells += [f"{full['rss']:.0f}", f"{timing['rss']:.0f}"]
        if theirs:
            cells.append(f"{theirs['rss']:.0f}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024], help="M=N=K values")
    p.add_argument("--skip-scalesim", action="store_true",
                   help="run only our side; the section shows SCALE-Sim's reference cycles")
    args = p.parse_args()

    missing = "skipped with --skip-scalesim" if args.skip_scalesim else ensure_scalesim()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs_scalesim_") as tmp:
        for size in args.sizes:
            for dataflow in DATAFLOWS:
                ours = run_ours(size, dataflow, Path(tmp))
                theirs = None if missing else run_scalesim(size, dataflow, Path(tmp))
                print(f"{size:5d} {dataflow}: ours {ours['cycles']} cycles "
                      f"{ours['full']['wall']:.2f} s / timing-only {ours['timing']['wall']:.2f} s"
                      + (f"; SCALE-Sim {theirs['cycles']} cycles {theirs['wall']:.2f} s"
                         if theirs else ""), file=sys.stderr)
                rows.append((size, dataflow, ours, theirs))
    text = section(rows, missing)
    write_section(SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
