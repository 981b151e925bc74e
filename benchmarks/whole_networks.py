"""Whole networks near the machine's limits: cycles and DRAM bytes against their bounds, with
intermediates through external memory, kept on chip and chained, and ranked by energy and by
energy x cycles.

    .venv/bin/python benchmarks/whole_networks.py --zoo DIR [--trace FILE]

DIR holds `resnet18_96.legacy.onnx` (`python examples/make_zoo.py --full resnet18_96 -o DIR`,
the optional `zoo` extra). Each workload is compiled in-process for configs/standard.json
(`compile_graph`, as `kpu-kernel-compiler` does) once per row of VARIANTS, written, and run by
`kpu-loader OBJ --config configs/standard.json --check --json --no-cache` (CP-SAT binding): its
cycles, the bytes the simulator moved over external memory, its budget (`--json`'s `budget`: the
compulsory bytes, graph inputs, outputs and constants once, and the cycle bound), energy, and
whether every kernel and output passed `--check`. MobileNet v1 as compiled by default also runs
with `--trace-output FILE` (a Perfetto trace, FILE or a temporary one): the cycles in which an
array and a vector unit work at once, in all and within its chains, are counted from that trace.
MobileNet v1 by edp, the row nearest what the issue asks, is also shown by stage (`--json`'s
`stages`: each chain, and each kernel outside them). Replaces the section "Whole networks near the limit" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from dfx import Graph, write  # noqa: E402
from kernel_compiler import compile_graph, load_graph, load_target  # noqa: E402
from loader.report import STAGE_UNITS  # noqa: E402

SECTION = "Whole networks near the limit"
CONFIG = REPO / "configs" / "standard.json"
CORPUS = REPO.parent / "shared" / "corpus" / "dfg"
# what issue 22 asks: (cycles, DRAM bytes), or the DRAM over its compulsory bytes
TARGETS = {"corpus mobilenet_v1": "<= 1,700,000 cycles, <= 25 MB", "corpus mobilenet_v2": "<= 1,500,000 cycles, <= 22 MB",
           "mobilenet_v1 conv1 .. dw3": "<= 4.3 MB", "torchvision resnet18 96x96": "DRAM <= 1.3x compulsory"}
# how intermediates cross from kernel to kernel, and what the tiler ranks by: (compile_graph's
# options, the objective) per row
VARIANTS = {"through external memory": ({"keep": False}, "latency"),
            "kept on chip, chained": ({}, "latency"),
            "kept on chip, chained, --objective energy": ({}, "energy"),
            "kept on chip, chained, --objective edp": ({}, "edp")}
TRACED = ("corpus mobilenet_v1", "kept on chip, chained")
BY_STAGE = ("corpus mobilenet_v1", "kept on chip, chained, --objective edp")
# what `--check` shows of the corpus MobileNets, whichever the tiling
NOTE = ("The corpus MobileNets carry no weights: the loader draws them uniformly from [-1, 1], and with fan-ins "
        "in the hundreds each layer multiplies the difference between any tiling's sums and the reference's "
        "(another order of the same f32 additions) by several times: in MobileNet v2 from 5e-6 at its second "
        "convolution to about 400 on logits of about 3,600. Each kernel's check (its results against the "
        "reference of its ops on the values it received) passes on every row. The logits may then be off by more "
        "than the gap between the two largest, so the softmax may saturate to another class than the "
        "reference's: the output's check against the reference run of the whole graph allows what the logits' "
        "tolerance allows (the softmax's rule is exact at the corners of its operands' errors), and shows "
        "`outputs FAIL, every kernel passes` where the output is beyond that.")


def first_layers(graph: Graph, layers: int) -> Graph:
    """The graph up to its `layers`-th sliding-window contraction and the map ops right after it
    (its activation): that op's result is the output."""
    seen, cut = 0, None
    for i, op in enumerate(graph.ops):
        if op.op_type in ("CONV2D", "DEPTHWISE_CONV2D"):
            seen += 1
            if seen > layers:
                break
        if seen == layers:
            cut = i
    ops = graph.ops[:cut + 1]
    used = {t for op in ops for t in op.inputs + op.outputs}
    tensors = {n: t for n, t in graph.tensors.items() if n in used}
    out = ops[-1].outputs[0]
    tensors[out].role = "output"
    return Graph(f"{graph.name}_first_{layers}", tensors, ops, {n: v for n, v in graph.constants.items() if n in used})


def workloads(zoo: Path) -> dict[str, Graph]:
    v1, _ = load_graph(str(CORPUS / "dfg__mobilenet_v1.dfg"))
    v2, _ = load_graph(str(CORPUS / "dfg__mobilenet_v2.dfg"))
    six, _ = load_graph(str(CORPUS / "dfg__mobilenet_v1.dfg"))
    r18, _ = load_graph(str(zoo / "resnet18_96.legacy.onnx"))
    return {"corpus mobilenet_v1": v1, "corpus mobilenet_v2": v2, "mobilenet_v1 conv1 .. dw3": first_layers(six, 6),
            "torchvision resnet18 96x96": r18}


def measure(graph: Graph, options: dict, objective: str, work: Path, trace: Path | None = None) -> dict:
    obj = work / f"{graph.name}.kpu"
    target = load_target(str(CONFIG), objective=objective)
    program = compile_graph(graph, f"{graph.name}.dfg", target, **options)
    write(program, obj)
    command = [sys.executable, "-m", "loader", str(obj), "--config", str(CONFIG), "--check", "--json", "--no-cache"]
    proc = subprocess.run(command + (["--trace-output", str(trace)] if trace else []), capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{graph.name}: {proc.stderr.strip()}")
    s = json.loads(proc.stdout)
    return {"cycles": s["cycles"], "dram": s["dram_bytes"]["read"] + s["dram_bytes"]["write"], "budget": s["budget"],
            "pj": s["energy"]["total_pj"], "kept": len(s["homes"]), "chains": len(program.chains),
            "check": verdict(s["check"]), "chained": [k for c in program.chains for k in c], "stages": s["stages"]}


def verdict(check: dict) -> str:
    """`--check`'s: pass, or which part failed (the outputs alone, every kernel passing: see NOTE)."""
    if check["passed"]:
        return "pass"
    return "outputs FAIL, every kernel passes" if all(k["passed"] for k in check["kernels"].values()) else "FAIL"


def overlap(trace: Path, chained: list[str]) -> tuple[int, int, int]:
    """From a Perfetto trace: (cycles in which an array and a vector unit work at once, those of
    them within the spans of the kernels in `chained`, the run's cycles), at 1 GHz."""
    doc = json.loads(trace.read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X"]

    def cycles(e: dict) -> tuple[int, int]:
        return round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)

    end = max(cycles(e)[1] for e in slices)
    busy = {unit: np.zeros(end + 1, bool) for unit in ("array", "vec")}
    spans = np.zeros(end + 1, bool)
    for e in slices:
        a, b = cycles(e)
        track = tracks.get(e["tid"], "")
        unit = next((u for u in busy if track.startswith(u) and track[len(u):].isdigit()), None)
        if unit is not None:
            busy[unit][a:b] = True
        elif track in chained and e["name"] == track:
            spans[a:b] = True
    both = busy["array"] & busy["vec"]
    return int(both.sum()), int((both & spans).sum()), end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, required=True, help="the folder make_zoo.py --full resnet18_96 wrote")
    parser.add_argument("--trace", type=Path, help="where to keep MobileNet v1's Perfetto trace")
    options = parser.parse_args()
    lines = [
        f"Machine: {machine()}. Date: {today()}.",
        "Reproduce: `python examples/make_zoo.py --full resnet18_96 -o DIR` (the `zoo` extra), then "
        "`.venv/bin/python benchmarks/whole_networks.py --zoo DIR --trace mobilenet_v1.trace.json`.",
        "",
        "On `configs/standard.json` (2 compute tiles of 16x16, 512 KB L3, 100 bytes/cycle of external memory), "
        "batch 1, f32, CP-SAT binding, `--check` on every kernel and output. Compulsory: the graph's inputs, "
        "outputs and constants once; bound: the larger of MACs over the peak and compulsory bytes over the "
        "bandwidth (`--json`'s `budget`). The corpus MobileNets are `../shared/corpus/dfg/`; conv1 .. dw3 is "
        "MobileNet v1 cut after its sixth convolution's activation; resnet18 is torchvision's, exported to ONNX "
        "(legacy exporter) at 96x96 with 1000 classes. Rows: intermediates through external memory "
        "(`--no-keep-on-chip`, which forms no chains either); kept on chip (in L3, or between chains in L2) and chained as the compiler chooses "
        "(the default; a chain goes by rows, or by channels with its links in L3 or through external memory); "
        "the same ranked by energy (`--objective energy`) and by energy x cycles (`--objective edp`).",
        "",
        "Before this work (issue 22's table, the same machine and models): MobileNet v1 2,385,007 cycles and "
        "63.5 MB, MobileNet v2 2,072,134 cycles and 70.3 MB, conv1 .. dw3 20.3 MB.",
        "",
        NOTE,
        "",
        "| workload | variant | kept on chip | chains | cycles | x bound | DRAM bytes | x compulsory | energy mJ | check "
        "| issue 22 asks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    traced = staged = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, graph in workloads(options.zoo).items():
            for variant, (compile_options, objective) in VARIANTS.items():
                trace = (options.trace or Path(tmp) / "trace.json") if (name, variant) == TRACED else None
                r = measure(graph, compile_options, objective, Path(tmp), trace)
                if trace is not None:
                    traced = (r, overlap(trace, r["chained"]))
                if (name, variant) == BY_STAGE:
                    staged = r
                b = r["budget"]
                lines.append(f"| {name} | {variant} | {r['kept']} | {r['chains']} | {r['cycles']:,} | "
                             f"{b['cycles_over_bound']:.2f} | {r['dram']:,} | {b['dram_over_compulsory']:.2f} | "
                             f"{r['pj'] / 1e9:.2f} | {r['check']} | {TARGETS[name]} |")
                print(lines[-1], file=sys.stderr)
    r, (both, in_chains, end) = traced
    lines += ["", f"The Perfetto trace of MobileNet v1 as compiled by default ({r['chains']} chains, "
                  f"{len(r['chained'])} kernels): an array and a vector unit work at once for {both:,} of its "
                  f"{end:,} cycles, {in_chains:,} of them inside chains (the depthwise layers on the vector units "
                  f"under the pointwise ones on the arrays)."]
    lines += ["", f"MobileNet v1 by edp ({staged['cycles']:,} cycles), by stage in program order: a chain's kernels "
                  "run at once and make one stage. Cycles from its first compute to its end (a stage may start on what "
                  "the one before stored); each kind of unit's share: the cycles its tasks held the machine's units of "
                  "that kind over those cycles (2 arrays, 2 vector units, 2 DMA engines, each held for the DRAM "
                  "latency too, 4 BlockMovers, 8 Streamers; loads run under the stage before count, so a short "
                  "stage's share may pass 100%).", "",
              "| stage | kernels | cycles | array | vector | DMA | BlockMover | Streamer | busiest | DRAM bytes |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for st in staged["stages"]:
        names = st["kernels"]
        label = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
        lines.append(f"| {label} | {len(names)} | {st['cycles']:,} | "
                     + " | ".join(f"{st['busy'][u]:.0%}" for u in STAGE_UNITS)
                     + f" | {st['busiest'] or '-'} | {sum(st['dram_bytes'].values()):,} |")
    write_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
