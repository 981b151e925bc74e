"""Whole networks near the machine's limits: cycles and DRAM bytes against their bounds, with
intermediates through external memory and with each way of keeping them on chip.

    .venv/bin/python benchmarks/whole_networks.py --zoo DIR

DIR holds `resnet18_96.legacy.onnx` (`python examples/make_zoo.py --full resnet18_96 -o DIR`,
the optional `zoo` extra). Each workload is compiled in-process for configs/standard.json
(`compile_graph`, as `kpu-kernel-compiler` does) once per row of VARIANTS, written, and run by
`kpu-loader OBJ --config configs/standard.json --check --json --no-cache` (CP-SAT binding): its
cycles, the bytes the simulator moved over external memory, its budget (`--json`'s `budget`: the
compulsory bytes, graph inputs, outputs and constants once, and the cycle bound), energy, and
whether every kernel and output passed `--check`. Replaces the section "Whole networks" of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from dfx import Graph, write  # noqa: E402
from kernel_compiler import compile_graph, load_graph, load_target  # noqa: E402

SECTION = "Whole networks"
CONFIG = REPO / "configs" / "standard.json"
CORPUS = REPO.parent / "shared" / "corpus" / "dfg"
# what issue 22 asks: (cycles, DRAM bytes), or the DRAM over its compulsory bytes
TARGETS = {"corpus mobilenet_v1": "<= 1,700,000 cycles, <= 25 MB", "corpus mobilenet_v2": "<= 1,500,000 cycles, <= 22 MB",
           "mobilenet_v1 conv1 .. dw3": "<= 4.3 MB", "torchvision resnet18 96x96": "DRAM <= 1.3x compulsory"}
# how intermediates cross from kernel to kernel: compile_graph's options per row
VARIANTS = {"through external memory": {"keep": False}, "kept in L3 where they fit": {"keep": True}}


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


def measure(graph: Graph, options: dict, work: Path) -> dict:
    obj = work / f"{graph.name}.kpu"
    write(compile_graph(graph, f"{graph.name}.dfg", load_target(str(CONFIG)), **options), obj)
    proc = subprocess.run([sys.executable, "-m", "loader", str(obj), "--config", str(CONFIG), "--check", "--json",
                           "--no-cache"], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{graph.name}: {proc.stderr.strip()}")
    s = json.loads(proc.stdout)
    return {"cycles": s["cycles"], "dram": s["dram_bytes"]["read"] + s["dram_bytes"]["write"], "budget": s["budget"],
            "pj": s["energy"]["total_pj"], "kept": len(s["homes"]), "check": "pass" if s["check"]["passed"] else "FAIL"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, required=True, help="the folder make_zoo.py --full resnet18_96 wrote")
    options = parser.parse_args()
    lines = [
        f"Machine: {machine()}. Date: {today()}.",
        "Reproduce: `python examples/make_zoo.py --full resnet18_96 -o DIR` (the `zoo` extra), then "
        "`.venv/bin/python benchmarks/whole_networks.py --zoo DIR`.",
        "",
        "On `configs/standard.json` (2 compute tiles of 16x16, 512 KB L3, 100 bytes/cycle of external memory), "
        "batch 1, f32, CP-SAT binding, `--check` on every kernel and output. Compulsory: the graph's inputs, "
        "outputs and constants once; bound: the larger of MACs over the peak and compulsory bytes over the "
        "bandwidth (`--json`'s `budget`). The corpus MobileNets are `../shared/corpus/dfg/`; conv1 .. dw3 is "
        "MobileNet v1 cut after its sixth convolution's activation; resnet18 is torchvision's, exported to ONNX "
        "(legacy exporter) at 96x96 with 1000 classes.",
        "",
        "| workload | intermediates | kept in L3 | cycles | x bound | DRAM bytes | x compulsory | energy mJ | check | issue 22 asks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, graph in workloads(options.zoo).items():
            for variant, compile_options in VARIANTS.items():
                r = measure(graph, compile_options, Path(tmp))
                b = r["budget"]
                lines.append(f"| {name} | {variant} | {r['kept']} | {r['cycles']:,} | {b['cycles_over_bound']:.2f} | "
                             f"{r['dram']:,} | {b['dram_over_compulsory']:.2f} | {r['pj'] / 1e9:.2f} | {r['check']} | "
                             f"{TARGETS[name]} |")
                print(lines[-1], file=sys.stderr)
    write_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
