"""MobileNet v1 and v2 through the whole toolchain, and MobileNet v1's layers against SCALE-Sim v3.

    .venv/bin/python benchmarks/networks.py [--live-scalesim]

Part 1 compiles each network for configs/minimal, standard and datacenter and runs the loader on
it (timing only, with an empty and then a filled binding cache, and with --check); it reports
cycles, images/s, array utilization, DRAM bytes, and what compiling and loading cost.

Part 2 takes MobileNet v1's layers as SCALE-Sim's topology writes them
(../shared/reference/scalesim/mobilenet_v1_224.csv), each as a one-layer graph, compiles each
with `--dataflow os` for configs/ideal_32x32.json and for a 16x16 copy of it, and compares our
cycles with SCALE-Sim's per-layer reference results (mobilenet_sa32_os_layers.csv,
mobilenet_sa16_os_layers.csv). SCALE-Sim's whole-network wall time and memory are the
reference figures of that directory's README; `--live-scalesim` also runs SCALE-Sim on one
layer (conv1, 32x32) to show the reference still reproduces.

Replaces the section "## Networks: MobileNet v1 and v2" of benchmarks/RESULTS.md (other
sections are kept). Nothing is written outside a temporary directory and RESULTS.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Proc, machine, run, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECTION = "Networks: MobileNet v1 and v2"
BIN = Path(sys.executable).parent  # the CLIs of the project's venv that runs this script
CONFIGS = REPO / "configs"
SHARED = REPO.parent / "shared"  # read only
CORPUS = SHARED / "corpus" / "dfg"
REFERENCE = SHARED / "reference" / "scalesim"
NETWORKS = (("MobileNet v1", "dfg__mobilenet_v1.dfg"), ("MobileNet v2", "dfg__mobilenet_v2.dfg"))
NETWORK_CONFIGS = ("minimal", "standard", "datacenter")
ARRAYS = (32, 16)  # ideal_32x32 and its 16x16 copy
TOLERANCE_PCT = 1.0  # the target on every conv and pointwise layer
LIVE_LAYER = "conv1"  # the layer --live-scalesim runs, on the 32x32 array

# The SCALE-Sim conv-topology driver: as scalesim/scale.py, but with traces not saved.
SCALESIM_DRIVER = """\
import sys
from scalesim.scale_sim import scalesim
cfg, topo, layout, out = sys.argv[1:]
s = scalesim(save_disk_space=True, verbose=False, config=cfg, topology=topo, layout=layout,
             input_type_gemm=False)
s.run_scale(top_path=out)
"""


# ---- running processes -------------------------------------------------------------------------


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def rel(path: Path) -> str:
    """A path as RESULTS.md may name it: relative to the repository."""
    return os.path.relpath(path, REPO)


# ---- part 1: whole networks --------------------------------------------------------------------


@dataclass
class NetRun:
    network: str
    config: str
    compile: Proc | None = None
    compile_inproc: float | None = None
    inproc_same: bool | None = None
    kernels: int | None = None
    clock_ghz: float = 0.0
    runs: dict[str, Proc] = field(default_factory=dict)  # cold, cached, check
    summary: dict | None = None  # the --json of the cached timing-only run
    check_passed: bool | None = None
    failures: list[str] = field(default_factory=list)


def compile_in_process(dfg: Path, config: Path, cli_object: Path) -> tuple[float, bool]:
    """The compiler's own time (no interpreter start-up, no imports): read the graph, compile,
    serialise; and whether the object is byte for byte the CLI's."""
    from dfx import dumps
    from kernel_compiler.compile import compile_graph
    from kernel_compiler.frontends import load_graph
    from kernel_compiler.target import load_target

    start = time.perf_counter()
    graph, _ = load_graph(str(dfg))
    data = dumps(compile_graph(graph, str(dfg), load_target(str(config)), "auto", True, []))
    seconds = time.perf_counter() - start
    return seconds, data == cli_object.read_bytes()


def run_network(network: str, dfg: Path, config_name: str, work: Path) -> NetRun:
    config = CONFIGS / f"{config_name}.json"
    r = NetRun(network, config_name, clock_ghz=json.loads(config.read_text())["timing"]["clock_ghz"])
    stem = f"{dfg.stem}_{config_name}"
    kpu = work / f"{stem}.kpu"
    r.compile = run([BIN / "kpu-kernel-compiler", dfg, "--target", config, "-o", kpu], work / f"{stem}.compile")
    if r.compile.code != 0:
        r.failures.append(f"compile exited {r.compile.code}: {r.compile.stderr.splitlines()[-1:]}")
        return r
    r.compile_inproc, r.inproc_same = compile_in_process(dfg, config, kpu)
    body = json.loads(kpu.read_text())["body"]
    r.kernels = len(body["kernels"])
    batch = {t["name"]: t["shape"][0] for t in body["graph"]["tensors"] if t.get("role") == "input"}
    if set(batch.values()) != {1}:
        r.failures.append(f"inputs are not batch 1: {batch}")
    loader = [BIN / "kpu-loader", kpu, "--config", config, "--json"]
    # The binding cache is empty before "cold" (KPU_CACHE_DIR is a new directory): that run binds
    # every kernel with CP-SAT and fills it; "cached" and "check" read their bindings from it.
    cycles = {}
    for mode, extra in (("cold", ["--timing-only"]), ("cached", ["--timing-only"]), ("check", ["--check"])):
        out = work / f"{stem}.{mode}.json"
        p = r.runs[mode] = run(loader + extra, out)
        try:
            data = json.loads(out.read_text())
        except ValueError:
            data = None
        if data is None or p.code not in ((0, 1) if mode == "check" else (0,)):
            r.failures.append(f"kpu-loader {' '.join(extra)} ({mode}) exited {p.code}: "
                              f"{(p.stderr.splitlines() or ['no message'])[-1]}")
            continue
        expected_cache = "miss" if mode == "cold" else "hit"
        if data.get("binding_cache") != expected_cache:
            r.failures.append(f"{mode} run: binding cache {data.get('binding_cache')}, expected {expected_cache}")
        cycles[mode] = data["cycles"]
        if mode == "cached":
            r.summary = data
        if mode == "check":
            r.check_passed = bool(data["check"]["passed"]) and p.code == 0
    if len(set(cycles.values())) > 1:
        r.failures.append(f"the runs disagree on cycles: {cycles}")
    return r


# ---- part 2: MobileNet v1's layers against SCALE-Sim -------------------------------------------


@dataclass
class Layer:
    name: str
    h: int
    w: int
    fh: int
    fw: int
    channels: int
    filters: int
    stride: int

    @property
    def depthwise(self) -> bool:
        return self.name.endswith("_DP")

    @property
    def kind(self) -> str:
        return "dw" if self.depthwise else ("fc" if self.name == "fc" else ("conv" if self.fh > 1 else "pw"))


def read_topology(path: Path) -> list[Layer]:
    """SCALE-Sim's conv topology: a header row, then one row per layer; every row ends in a comma."""
    rows = [[c.strip() for c in row if c.strip()] for row in csv.reader(path.read_text().splitlines())]
    return [Layer(r[0], *map(int, r[1:8])) for r in rows[1:] if r]


def read_reference(array: int) -> tuple[dict[str, dict], dict]:
    rows = list(csv.DictReader((REFERENCE / f"mobilenet_sa{array}_os_layers.csv").read_text().splitlines()))
    layers = {r["layer"]: r for r in rows if r["layer"] != "TOTAL"}
    [total] = [r for r in rows if r["layer"] == "TOTAL"]
    if sum(int(r["total_cycles"]) for r in layers.values()) != int(total["total_cycles"]):
        raise RuntimeError(f"mobilenet_sa{array}_os_layers.csv: the layers do not sum to its TOTAL row")
    return layers, total


def read_readme() -> dict[int, dict]:
    """The README's whole-network table: array -> total cycles, wall seconds, peak GB."""
    found = {}
    for m in re.finditer(r"\|\s*(\d+)x\1 OS\s*\|\s*([\d,]+)\s*\|\s*([\d,.]+)\s*\|\s*([\d.]+) GB\s*\|",
                         (REFERENCE / "README.md").read_text()):
        found[int(m[1])] = {"cycles": int(m[2].replace(",", "")), "wall": float(m[3].replace(",", "")),
                            "gb": float(m[4])}
    return found


def padding_after(extent: int, kernel: int, stride: int) -> tuple[int, int]:
    """SCALE-Sim's output extent, ceil((in - f + s) / s), and the padding after the input that
    gives it with ours, floor((in + pad - f) / s) + 1 (none before)."""
    want = math.ceil((extent - kernel + stride) / stride)
    pad = 0
    while (extent + pad - kernel) // stride + 1 < want:
        pad += 1
    if (extent + pad - kernel) // stride + 1 != want:
        raise RuntimeError(f"no padding gives {want} outputs from {extent} with a window of {kernel}, stride {stride}")
    return pad, want


def layer_graph(layer: Layer) -> tuple[dict, tuple[int, int]]:
    """The layer as a one-op graph (the compiler's JSON graph format), and its output H, W."""
    pad_h, oh = padding_after(layer.h, layer.fh, layer.stride)
    pad_w, ow = padding_after(layer.w, layer.fw, layer.stride)
    x = [1, layer.h, layer.w, layer.channels]
    attrs = {"stride": [layer.stride] * 2, "padding": [[0, pad_h], [0, pad_w]]}
    if layer.depthwise:  # NHWC x, HWCM weights with channel multiplier 1
        op_type, w, y = "DEPTHWISE_CONV2D", [layer.fh, layer.fw, layer.channels, 1], [1, oh, ow, layer.channels]
    else:  # NHWC x, OHWI weights, no bias
        op_type, w, y = "CONV2D", [layer.filters, layer.fh, layer.fw, layer.channels], [1, oh, ow, layer.filters]
    tensors = {name: {"shape": shape, "dtype": "float32"} for name, shape in (("x", x), ("w", w), ("y", y))}
    op = {"name": layer.name, "type": op_type, "inputs": ["x", "w"], "outputs": ["y"], "attributes": attrs}
    return {"name": layer.name, "tensors": tensors, "operators": [op]}, (oh, ow)


@dataclass
class LayerRun:
    layer: Layer
    array: int
    ref: dict
    padding: tuple[int, int] = (0, 0)
    gemm: dict | None = None  # our implicit GEMM (conv layers)
    cycles: int | None = None
    compile: Proc | None = None
    load: Proc | None = None
    failure: str | None = None

    @property
    def theirs(self) -> int:
        return int(self.ref["total_cycles"])

    @property
    def diff_pct(self) -> float:
        return 100 * (self.cycles - self.theirs) / self.theirs


def ideal_config(array: int, work: Path) -> Path:
    base = CONFIGS / "ideal_32x32.json"
    if array == 32:
        return base
    cfg = json.loads(base.read_text())
    cfg["name"] = f"ideal_{array}x{array}"
    cfg["compute"]["processor_array"]["rows"] = cfg["compute"]["processor_array"]["cols"] = array
    path = work / f"ideal_{array}x{array}.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def run_layer(layer: Layer, array: int, ref: dict, config: Path, work: Path) -> LayerRun:
    r = LayerRun(layer, array, ref)
    graph, (oh, ow) = layer_graph(layer)
    r.padding = (graph["operators"][0]["attributes"]["padding"][0][1],
                 graph["operators"][0]["attributes"]["padding"][1][1])
    if f"{oh}x{ow}" != ref["ofmap_hw_scalesim"]:
        raise RuntimeError(f"{layer.name}: our output {oh}x{ow}, SCALE-Sim's {ref['ofmap_hw_scalesim']}")
    stem = f"{layer.name}_{array}"
    src, kpu = work / f"{stem}.json", work / f"{stem}.kpu"
    src.write_text(json.dumps(graph))
    r.compile = run([BIN / "kpu-kernel-compiler", src, "--dataflow", "os", "--target", config, "-o", kpu],
                    work / f"{stem}.compile")
    if r.compile.code != 0:
        r.failure = f"compile exited {r.compile.code}: {(r.compile.stderr.splitlines() or [''])[-1]}"
        return r
    kernels = json.loads(kpu.read_text())["body"]["kernels"]
    if len(kernels) != 1:
        raise RuntimeError(f"{layer.name}: {len(kernels)} kernels, expected one")
    [kernel] = kernels
    m, n, k = int(ref["M"]), int(ref["N"]), int(ref["K"])
    if layer.depthwise:
        # SCALE-Sim runs one GEMM per channel: M output pixels, N 1 filter, K the 3x3 taps
        if (kernel["op"], oh * ow, 1, layer.fh * layer.fw, layer.channels) != \
                ("DEPTHWISE_CONV2D", m, n, k, int(ref["scalesim_layers"])):
            raise RuntimeError(f"{layer.name}: ours {kernel['op']} {oh}x{ow}x{layer.channels}, SCALE-Sim M={m} "
                               f"N={n} K={k} over {ref['scalesim_layers']} channels")
    else:
        r.gemm = kernel["hints"]["implicit_gemm"]
        if r.gemm != {"M": m, "N": n, "K": k}:
            raise RuntimeError(f"{layer.name} {array}x{array}: our implicit GEMM {r.gemm}, "
                               f"SCALE-Sim's M={m} N={n} K={k}")
        if kernel["dataflow"] != "output_stationary":
            raise RuntimeError(f"{layer.name}: dataflow {kernel['dataflow']}, expected output_stationary")
    out = work / f"{stem}.json.out"
    r.load = run([BIN / "kpu-loader", kpu, "--config", config, "--json", "--timing-only"], out)
    if r.load.code != 0:
        r.failure = f"kpu-loader exited {r.load.code}: {(r.load.stderr.splitlines() or [''])[-1]}"
        return r
    r.cycles = json.loads(out.read_text())["cycles"]
    return r


def run_scalesim_live(layer: Layer, work: Path) -> dict:
    """SCALE-Sim 3.0.0 on one layer with the reference run's own config (sa32_os.cfg)."""
    from vs_scalesim import SCALESIM_PY, ensure_scalesim

    missing = ensure_scalesim()
    if missing:
        return {"missing": missing}
    live = work / "scalesim_live"
    live.mkdir()
    shutil.copy(REFERENCE / "sa32_os.cfg", live / "scale.cfg")
    header = (REFERENCE / "mobilenet_v1_224.csv").read_text().splitlines()[0]
    (live / "topo.csv").write_text(f"{header}\n{layer.name}, {layer.h}, {layer.w}, {layer.fh}, {layer.fw}, "
                                   f"{layer.channels}, {layer.filters}, {layer.stride},\n")
    (live / "layout.csv").write_text("Layer name,\n")  # no custom layout, but the file must exist
    p = run([SCALESIM_PY, "-c", SCALESIM_DRIVER, live / "scale.cfg", live / "topo.csv", live / "layout.csv",
             live / "out"], live / "stdout.txt")
    if p.code != 0:
        return {"missing": f"SCALE-Sim exited {p.code}: {(p.stderr.splitlines() or [''])[-1]}"}
    [report] = (live / "out").glob("*/COMPUTE_REPORT.csv")
    header_row, row = report.read_text().splitlines()[:2]
    values = dict(zip((h.strip() for h in header_row.split(",")), (v.strip() for v in row.split(","))))
    return {"cycles": int(values["Total Cycles"]), "wall": p.wall, "rss": p.rss}


# ---- the section -------------------------------------------------------------------------------


def fmt(n: float | int | None, spec: str = ",") -> str:
    return "-" if n is None else format(n, spec)


def network_tables(nets: list[NetRun]) -> list[str]:
    lines = ["| network | config | kernels | simulated cycles | images/s | array utilization | DRAM bytes/image "
             "| check |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in nets:
        s = r.summary
        check = "-" if r.check_passed is None else ("pass" if r.check_passed else "**FAIL**")
        if s is None:
            lines.append(f"| {r.network} | {r.config} | {fmt(r.kernels)} | failed | - | - | - | {check} |")
            continue
        images = r.clock_ghz * 1e9 / s["cycles"]
        dram = s["dram_bytes"]["read"] + s["dram_bytes"]["write"]
        lines.append(f"| {r.network} | {r.config} ({r.clock_ghz:g} GHz) | {r.kernels} | {s['cycles']:,} "
                     f"| {images:,.0f} | {100 * s['utilization']:.1f}% | {dram:,} | {check} |")
    lines += ["", "| network | config | compile s | compiler's own s | compile peak MB | loader s, timing-only, "
              "empty cache | peak MB | loader s, timing-only, cached | peak MB | loader s, --check, cached "
              "| peak MB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in nets:
        cells = [r.network, r.config, fmt(r.compile and r.compile.wall, ".2f"), fmt(r.compile_inproc, ".2f"),
                 fmt(r.compile and r.compile.rss, ".0f")]
        for mode in ("cold", "cached", "check"):
            p = r.runs.get(mode)
            cells += [fmt(p and p.wall, ".2f"), fmt(p and p.rss, ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def layer_table(runs: list[LayerRun]) -> list[str]:
    lines = ["| layer | kind | input HxWxC | filter, stride | padding after (H, W) | M | N | K "
             "| 32x32 ours | 32x32 SCALE-Sim | 32x32 diff | 16x16 ours | 16x16 SCALE-Sim | 16x16 diff |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_layer: dict[str, dict[int, LayerRun]] = {}
    for r in runs:
        by_layer.setdefault(r.layer.name, {})[r.array] = r
    for name, arrays in by_layer.items():
        first = next(iter(arrays.values()))
        lay, ref = first.layer, first.ref
        cells = [name, lay.kind, f"{lay.h}x{lay.w}x{lay.channels}",
                 f"{lay.fh}x{lay.fw}" + (f"x{lay.filters}" if not lay.depthwise else "") + f", {lay.stride}",
                 f"{first.padding[0]}, {first.padding[1]}", ref["M"], ref["N"], ref["K"]]
        for array in ARRAYS:
            r = arrays.get(array)
            if r is None or r.cycles is None:
                cells += ["failed", fmt(r and r.theirs), "-"]
                continue
            diff = f"{r.theirs / r.cycles:.1f}x faster" if lay.depthwise else f"{r.diff_pct:+.4f}%"
            cells += [f"{r.cycles:,}", f"{r.theirs:,}", diff]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def section(nets: list[NetRun], layers: list[LayerRun], readme: dict[int, dict], totals: dict[int, dict],
            live: dict | None, argv: list[str], load: tuple[float, float], revision: str) -> str:
    reproduce = " ".join([".venv/bin/python benchmarks/networks.py", *argv])
    lines = [
        f"Machine: {machine()}, 1-minute load average {load[0]:.1f} at the start and {load[1]:.1f} at the end. "
        f"Date: {today()}. Tree: {revision}.",
        f"Reproduce: `{reproduce}`.", "",
        "### Whole networks", "",
        f"`{rel(CORPUS / NETWORKS[0][1])}` and `{rel(CORPUS / NETWORKS[1][1])}` (TOSA, batch 1, f32), read in "
        "place, compiled by `kpu-kernel-compiler NET.dfg --target configs/CONFIG.json` (dataflow auto, fusion on) "
        "and run by `kpu-loader NET.kpu --config configs/CONFIG.json --json`. Cycles, utilization and DRAM bytes "
        "are the loader's `--json` summary of the timing-only run (the other two runs gave the same cycles); "
        "images/s is the config's `clock_ghz` over the cycles of one image; array utilization is the MACs "
        "over cycles x the peak MACs per cycle of all compute tiles; DRAM bytes are what the simulator "
        "moved over external memory, reads and writes. Check: `--check`, every kernel's values and the "
        "output against the numpy reference.", "",
        "Every time is one run (not repeated), wall clock around the subprocess, interpreter start-up "
        "included; peak MB is that process's own `ru_maxrss` (`wait4`). The compiler's own time is "
        "`load_graph` + `compile_graph` + serialising the object, in the benchmark's process, once (imports "
        "excluded). The binding cache (`KPU_CACHE_DIR`) is a new, empty directory: the first timing-only "
        "run binds every kernel with CP-SAT and fills it, the second timing-only run and the `--check` run "
        "read their bindings from it.", "",
        *network_tables(nets), "",
    ]
    for r in nets:
        if r.inproc_same is False:
            lines.append(f"- {r.network} on {r.config}: the in-process compile gave an object that differs "
                         "from the CLI's.")
    lines += [
        "### MobileNet v1's layers against SCALE-Sim v3", "",
        f"Each row of `{rel(REFERENCE / 'mobilenet_v1_224.csv')}` (SCALE-Sim's topology, "
        f"{len({r.layer.name for r in layers})} layers, fc written as a 1x1 convolution of a 1x1 image) is "
        "one graph of one op, compiled with `kpu-kernel-compiler --dataflow os --target` "
        "`configs/ideal_32x32.json` or a copy of it with a 16x16 array (named `ideal_16x16`, nothing else "
        "changed), and run by `kpu-loader --json --timing-only` on the same config (each object is new to "
        "the binding cache, so each run binds its kernel with CP-SAT). conv1, pw1-pw13 and fc are CONV2D "
        "(NHWC input, OHWI weights [filters, fh, fw, channels], no bias); dw*_DP are DEPTHWISE_CONV2D "
        "([1, H, W, C], weights [3, 3, C, 1]). SCALE-Sim does not pad (its output extent is "
        "ceil((in - f + s) / s)); each layer here is padded after its input only as much as makes our "
        "output extent, floor((in + pad - f) / s) + 1, equal to SCALE-Sim's (the table gives it per "
        "layer). The script asserts our output size equals SCALE-Sim's ofmap, and each conv kernel's "
        "`implicit_gemm` hint equals the reference's M, N, K (depthwise: our output pixels = M, K = 9, "
        "one SCALE-Sim layer per channel).", "",
        f"SCALE-Sim's cycles are `total_cycles` of `{rel(REFERENCE / 'mobilenet_sa32_os_layers.csv')}` and "
        f"`{rel(REFERENCE / 'mobilenet_sa16_os_layers.csv')}` (SCALE-Sim 3.0.0, output stationary, "
        "`InterfaceBandwidth: CALC`, so no memory stalls; depthwise rows sum their channels): reference "
        "results, not run here. Ours are the loader's whole-run cycles (the ideal configs' memory "
        "takes no time). Depthwise layers run on our vector unit (as many lanes as the array has "
        "columns), SCALE-Sim maps each channel as a GEMM with N = 1 onto the array: there the column is "
        "SCALE-Sim's cycles over ours.", "",
        *layer_table(layers), "",
    ]
    conv = [r for r in layers if not r.layer.depthwise]
    measured = [r for r in conv if r.cycles is not None]
    for array in ARRAYS:
        mine = [r for r in layers if r.array == array]
        done = [r for r in mine if r.cycles is not None]
        conv_a = [r for r in measured if r.array == array]
        dw_a = [r for r in done if r.layer.depthwise]
        worst = max(conv_a, key=lambda r: abs(r.diff_pct)) if conv_a else None
        t = totals[array]
        parts = [f"**{array}x{array}**:"]
        if worst:
            parts.append(f"conv, pw and fc layers: max |difference| {abs(worst.diff_pct):.4f}% ({worst.layer.name}), "
                         f"{'within' if abs(worst.diff_pct) <= TOLERANCE_PCT else '**not within**'} the "
                         f"{TOLERANCE_PCT:g}% target on all {len(conv_a)}"
                         + (f" of {len([r for r in conv if r.array == array])}" if len(conv_a) < len(
                             [r for r in conv if r.array == array]) else "") + ";")
        if conv_a and len(conv_a) == len([r for r in conv if r.array == array]):
            ours_c, theirs_c = sum(r.cycles for r in conv_a), sum(r.theirs for r in conv_a)
            parts.append(f"their sum: {ours_c:,} cycles against SCALE-Sim's {theirs_c:,} "
                         f"({100 * (ours_c - theirs_c) / theirs_c:+.4f}%);")
        if dw_a:
            ours_dw, theirs_dw = sum(r.cycles for r in dw_a), sum(r.theirs for r in dw_a)
            speed = [r.theirs / r.cycles for r in dw_a]
            parts.append(f"depthwise layers: {ours_dw:,} cycles against SCALE-Sim's {theirs_dw:,}, "
                         f"{theirs_dw / ours_dw:.1f}x faster over the {len(dw_a)} layers "
                         f"({min(speed):.1f}x to {max(speed):.1f}x per layer);")
        if len(done) == len(mine):
            ours_all = sum(r.cycles for r in done)
            parts.append(f"whole network (sum of the {len(done)} layers): {ours_all:,} cycles against "
                         f"SCALE-Sim's {t['cycles']:,}, {t['cycles'] / ours_all:.2f} times ours;")
        wall = sum(r.compile.wall for r in mine if r.compile) + sum(r.load.wall for r in mine if r.load)
        rss = max([r.compile.rss for r in mine if r.compile] + [r.load.rss for r in mine if r.load])
        ref = readme[array]
        compile_s = sum(r.compile.wall for r in mine if r.compile)
        load_s = sum(r.load.wall for r in mine if r.load)
        parts.append(f"our wall time over all layers {wall:.1f} s (compile {compile_s:.1f} s "
                     f"+ loader {load_s:.1f} s, one process each, run one after "
                     f"another), the largest peak RSS of those processes {rss:.0f} MB; SCALE-Sim: {ref['wall']:,.0f} s "
                     f"and {ref['gb']:g} GB for one run over all layers, the README's reference figures measured "
                     f"on a 2-core machine, not a live run.")
        lines.append("- " + " ".join(parts))
    if live is not None:
        lines.append("")
        if "missing" in live:
            lines.append(f"Live SCALE-Sim run (`--live-scalesim`): not run ({live['missing']}).")
        else:
            ref32 = next(r for r in layers if r.layer.name == LIVE_LAYER and r.array == 32)
            lines.append(f"Live SCALE-Sim run (`--live-scalesim`): SCALE-Sim 3.0.0 (its venv, "
                         f"`benchmarks/.scalesim-venv`) on {LIVE_LAYER} alone with the reference's `sa32_os.cfg`, "
                         f"traces not saved: {live['cycles']:,} total cycles, the reference's "
                         f"{ref32.theirs:,} "
                         f"{'reproduced' if live['cycles'] == ref32.theirs else '**not reproduced**'}; "
                         f"{live['wall']:.2f} s wall, {live['rss']:.0f} MB peak RSS (ours for that layer: compile "
                         f"{ref32.compile.wall:.2f} s + loader {ref32.load.wall:.2f} s, {ref32.cycles:,} cycles).")
    failures = [f"{r.network} on {r.config}: {f}" for r in nets for f in r.failures] + \
               [f"{r.layer.name} {r.array}x{r.array}: {r.failure}" for r in layers if r.failure]
    if failures:
        lines += ["", "Failed:", *[f"- {f}" for f in failures]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--live-scalesim", action="store_true",
                   help=f"also run SCALE-Sim on {LIVE_LAYER} (32x32), a few seconds, to show its reference reproduces")
    args = p.parse_args()
    argv = ["--live-scalesim"] if args.live_scalesim else []

    # the tree the figures come from: changed only where more than this file (which the other
    # benchmarks rewrite as they run) differs from the commit
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/RESULTS.md")
    revision = (git("describe", "--always") or "unknown") + ("-dirty" if changed else "")
    load_start = os.getloadavg()[0]
    topology = read_topology(REFERENCE / "mobilenet_v1_224.csv")
    refs = {a: read_reference(a) for a in ARRAYS}
    readme = read_readme()
    for a in ARRAYS:
        if readme[a]["cycles"] != int(refs[a][1]["total_cycles"]):
            raise RuntimeError(f"README's {a}x{a} total differs from the layers CSV's TOTAL row")
    totals = {a: readme[a] for a in ARRAYS}

    nets: list[NetRun] = []
    layers: list[LayerRun] = []
    live = None
    with tempfile.TemporaryDirectory(prefix="networks_") as tmp:
        work = Path(tmp)
        os.environ["KPU_CACHE_DIR"] = str(work / "binding-cache")  # empty: the first run of each object binds
        for network, file in NETWORKS:
            for config in NETWORK_CONFIGS:
                r = run_network(network, CORPUS / file, config, work)
                nets.append(r)
                s = r.summary
                print(f"{network} {config}: {s and s['cycles']} cycles, check "
                      f"{r.check_passed}, compile {r.compile.wall:.2f} s, loader "
                      + ", ".join(f"{m} {q.wall:.2f} s" for m, q in r.runs.items())
                      + (f"; FAILED: {r.failures}" if r.failures else ""), file=sys.stderr)
        for array in ARRAYS:
            config = ideal_config(array, work)
            for layer in topology:
                r = run_layer(layer, array, refs[array][0][layer.name], config, work)
                layers.append(r)
                print(f"{array}x{array} {layer.name}: ours {r.cycles}, SCALE-Sim {r.theirs}"
                      + (f" ({r.diff_pct:+.4f}%)" if r.cycles and not layer.depthwise else "")
                      + (f"; FAILED: {r.failure}" if r.failure else ""), file=sys.stderr)
        if args.live_scalesim:
            live = run_scalesim_live(next(lay for lay in topology if lay.name == LIVE_LAYER), work)
            print(f"live SCALE-Sim {LIVE_LAYER}: {live}", file=sys.stderr)
    text = section(nets, layers, readme, totals, live, argv, (load_start, os.getloadavg()[0]), revision)
    write_section(SECTION, text)
    print(text)
    bad = [r for r in layers if r.cycles is not None and not r.layer.depthwise and abs(r.diff_pct) > TOLERANCE_PCT]
    if bad or any(r.failures or r.check_passed is False for r in nets) or any(r.failure for r in layers):
        sys.exit(1)


if __name__ == "__main__":
    main()
