"""One BERT-base encoder layer and GPT-2's FFN block (examples/make_onnx.py, full size) through the
whole toolchain on `standard` and `datacenter`, fused and with `--no-fusion`.

    .venv/bin/python benchmarks/transformers.py

Each model is built by examples/make_onnx.py's builder into a temporary folder, compiled by
`kpu-kernel-compiler MODEL.onnx --target CONFIG` (and again with `--no-fusion`) and run by
`kpu-loader --json`: timing-only with an empty binding cache (CP-SAT binds every kernel), then
with `--check` (values computed tile by tile and compared with the numpy reference; bindings
from the cache), and the unfused object timing-only. Replaces the section "## Transformers: BERT
layer and GPT-2 FFN" of benchmarks/RESULTS.md (other sections are kept); nothing else is written
outside the temporary folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Proc, machine, run, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECTION = "Transformers: BERT layer and GPT-2 FFN"
BIN = Path(sys.executable).parent  # the CLIs of the venv that runs this script
CONFIGS = ("standard", "datacenter")
MODELS = (("BERT-base layer", "bert_layer", "seq 128, hidden 768, 12 heads, FFN 3072"),
          ("GPT-2 FFN", "gpt2_ffn", "seq 128, 768 -> 3072 -> 768"))

@dataclass
class Result:
    model: str
    config: str
    compile: dict[bool, Proc] = field(default_factory=dict)  # fuse -> the compiler's process
    compiler_own: float = 0.0  # load_graph + compile_graph + dumps in this process, fused
    loader: dict[str, Proc] = field(default_factory=dict)  # cold, check, unfused
    json: dict[str, dict] = field(default_factory=dict)  # the same -> its --json
    failures: list[str] = field(default_factory=list)


def compiler_own_seconds(model: Path, config: str) -> float:
    """Measured in a child process (this script with --own), so this one stays small: a child
    forked from a large parent would count the parent's pages in its peak RSS."""
    out = subprocess.run([sys.executable, __file__, "--own", str(model), config], capture_output=True, text=True,
                         check=True).stdout
    return float(out)


def own(model: str, config: str) -> None:
    from dfx import dumps
    from kernel_compiler.compile import compile_graph
    from kernel_compiler.frontends import load_graph
    from kernel_compiler.target import load_target

    def compile_once() -> float:
        start = time.perf_counter()
        graph, warnings = load_graph(model)
        dumps(compile_graph(graph, model, load_target(config), warnings=warnings))
        return time.perf_counter() - start

    compile_once()  # the modules the frontend and passes import on first use (onnx's among them)
    print(compile_once())


def measure(model: Path, stem: str, config: str, work: Path) -> Result:
    r = Result(stem, config)
    objects = {True: work / f"{stem}.{config}.kpu", False: work / f"{stem}.{config}.unfused.kpu"}
    for fuse, kpu in objects.items():
        extra = [] if fuse else ["--no-fusion"]
        p = r.compile[fuse] = run([BIN / "kpu-kernel-compiler", model, "--target", config, "-o", kpu, *extra],
                                  kpu.with_suffix(".compile"))
        if p.code != 0:
            r.failures.append(f"compile {' '.join(extra)} exited {p.code}: {p.stderr.splitlines()[-1:]}")
            return r
    r.compiler_own = compiler_own_seconds(model, config)
    runs = (("cold", objects[True], ["--timing-only"]), ("check", objects[True], ["--check"]),
            ("unfused", objects[False], ["--timing-only"]))
    for mode, kpu, extra in runs:
        out = work / f"{stem}.{config}.{mode}.json"
        p = r.loader[mode] = run([BIN / "kpu-loader", kpu, "--config", config, "--json", *extra], out)
        try:
            r.json[mode] = json.loads(out.read_text())
        except ValueError:
            r.failures.append(f"kpu-loader {' '.join(extra)} ({mode}) exited {p.code}: "
                              f"{(p.stderr.splitlines() or ['no message'])[-1]}")
    if "cold" in r.json and "check" in r.json and r.json["cold"]["cycles"] != r.json["check"]["cycles"]:
        r.failures.append("the timing-only and --check runs disagree on cycles")
    return r


def retiled_matmuls(r: Result, work: Path) -> list[str]:
    """The MATMULs (by graph op) whose tiling differs between the fused and the unfused object."""
    if not {"cold", "unfused"} <= set(r.json):
        return []
    objects = {fuse: json.loads((work / f"{r.model}.{r.config}{'' if fuse else '.unfused'}.kpu").read_text())
               ["body"]["kernels"] for fuse in (True, False)}
    unfused = {k["graph_op"]: k for k in objects[False] if k["op"] == "MATMUL"}
    changes = []
    for k in objects[True]:
        other = unfused.get(k["graph_op"])
        if k["op"] != "MATMUL" or other is None:
            continue
        tiles = {key: (other["tiling"].get(key), k["tiling"].get(key)) for key in ("Ti", "Tj", "Tk")}
        tiles = {key: v for key, v in tiles.items() if v[0] != v[1]}
        if tiles:
            reads = (r.json["unfused"]["kernels"][other["name"]]["dram_bytes"]["read"],
                     r.json["cold"]["kernels"][k["name"]]["dram_bytes"]["read"])
            what = ", ".join(f"{key} {a} -> {b}" for key, (a, b) in tiles.items())
            epilogue = " + ".join(k["epilogue"])
            changes.append(f"`{k['graph_op']}` (epilogue {epilogue}): {what}; reads {reads[0]:,} -> {reads[1]:,} bytes")
    return changes


def dram(data: dict) -> int:
    return data["dram_bytes"]["read"] + data["dram_bytes"]["write"]


def compulsory_bytes(kpu: Path) -> int:
    """Every constant, input and output of the compiled graph once: what any program of the
    model moves at the least (the int64 shapes the frontend consumed are not among them)."""
    tensors = json.loads(kpu.read_text())["body"]["graph"]["tensors"]
    assert all(t["dtype"] == "f32" for t in tensors), "the example models are f32"
    return sum(4 * math.prod(t["shape"]) for t in tensors if t.get("role") in ("input", "constant", "output"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--own", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.own:
        own(*args.own)
        return
    with tempfile.TemporaryDirectory(prefix="kpu-transformers-") as tmp:
        write_results(Path(tmp))


def write_results(work: Path) -> None:
    os.environ["KPU_CACHE_DIR"] = str(work / "binding-cache")  # empty: the first run of each object binds
    start_load = os.getloadavg()[0]
    subprocess.run([sys.executable, REPO / "examples" / "make_onnx.py", *(stem for _, stem, _ in MODELS),
                    "-o", work], check=True, capture_output=True)
    results, compulsory = [], {}
    for label, stem, _ in MODELS:
        model = work / f"{stem}.onnx"
        for config in CONFIGS:
            r = measure(model, stem, config, work)
            results.append((label, r))
            if r.compile.get(True) and r.compile[True].code == 0:
                compulsory[stem] = compulsory_bytes(work / f"{stem}.{config}.kpu")
            print(f"{stem} {config}: {'; '.join(r.failures) or 'ok'}", file=sys.stderr)
    end_load = os.getloadavg()[0]

    rows, times, failures = [], [], []
    for label, r in results:
        failures += [f"- {label}, {r.config}: {f}" for f in r.failures]
        if not {"cold", "check", "unfused"} <= set(r.json):
            continue
        fused, check, unfused = r.json["cold"], r.json["check"], r.json["unfused"]
        passed = "pass" if check["check"]["passed"] and r.loader["check"].code == 0 else "FAIL"
        rows.append(f"| {label} | {r.config} | {len(fused['kernels'])} | {len(unfused['kernels'])} | "
                    f"{fused['cycles']:,} | {unfused['cycles']:,} | {fused['utilization']:.1%} | "
                    f"{dram(fused):,} | {dram(unfused):,} | {dram(fused) / dram(unfused):.2f} | "
                    f"{compulsory[r.model]:,} | {passed} |")
        times.append(f"| {label} | {r.config} | {r.compile[True].wall:.2f} | {r.compiler_own:.2f} | "
                     f"{r.compile[False].wall:.2f} | {r.loader['cold'].wall:.2f} | {r.loader['cold'].rss:.0f} | "
                     f"{r.loader['check'].wall:.2f} | {r.loader['check'].rss:.0f} | {r.loader['unfused'].wall:.2f} |")

    gpt2 = [(r.config, dram(r.json["cold"]), dram(r.json["unfused"])) for _, r in results
            if r.model == "gpt2_ffn" and {"cold", "unfused"} <= set(r.json)]
    gpt2_text = "; ".join(f"{c}: {f:,} fused against {u:,} unfused ({f / u:.2f})" for c, f, u in gpt2)
    verdict = ", ".join(f"{'met' if 2 * f <= u else 'not met'} on {config}" for config, f, u in gpt2)
    c = compulsory["gpt2_ffn"]
    over = ", ".join(f"{f / c:.2f}x that on {config}" for config, f, _ in gpt2)
    finished = "Both `--timing-only` and `--check` finish on every row." if not failures else \
        "Not every run finished: see the failures below."
    models = "\n".join(f"- {label}: {what}, `{stem}` of `examples/make_onnx.py`." for label, stem, what in MODELS)
    retiled = [f"- {label}, {r.config}: {change}" for label, r in results for change in retiled_matmuls(r, work)]
    text = f"""Machine: {machine()}, 1-minute load average {start_load:.1f} at the start and {end_load:.1f} at the end.
Date: {today()}.
Reproduce: `.venv/bin/python benchmarks/transformers.py`.

{models}

Both are opset 17, f32, with seeded weights as initializers; the GELUs are written as their tanh
(GPT-2) and erf (BERT) chains of primitive ops, which the compiler makes one GELU (and leaves
as their ops with `--no-fusion`), and BERT's layer norms as LayerNormalization. Each is compiled by `kpu-kernel-compiler MODEL.onnx
--target CONFIG` (dataflow auto) and again with `--no-fusion`, and run by `kpu-loader OBJECT
--config CONFIG --json`. Cycles, array utilization (MACs over the run's cycles times the peak of
all arrays) and DRAM bytes (reads and writes over external memory, as the simulator moved them)
are the `--json` of the timing-only run; the `--check` run (every kernel's values and the output
against the numpy reference) gave the same cycles. Compulsory bytes: every weight, bias, input
and output once, which no program of the model moves less than.

| model | config | kernels | kernels `--no-fusion` | cycles | cycles `--no-fusion` | array utilization | DRAM bytes | DRAM bytes `--no-fusion` | fused / unfused | compulsory bytes | check |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
""" + "\n".join(rows) + f"""

Each time is one run, wall clock around the process, interpreter start-up and imports included
(onnx's among them for the compiler); peak MB is the process's own `ru_maxrss` (`wait4`). The
compiler's own time is `load_graph` + `compile_graph` + serialising the object, in a process of
its own, after a first untimed run (so without imports). The binding cache (`KPU_CACHE_DIR`) starts empty: the timing-only run
binds every kernel with CP-SAT and fills it, the `--check` run reads its bindings from it; the
unfused object is new to it, so its run binds too. {finished}

| model | config | compile s | compiler's own s | compile s `--no-fusion` | loader s, timing-only, empty cache | peak MB | loader s, `--check`, cached | peak MB | loader s `--no-fusion`, timing-only |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|
""" + "\n".join(times) + f"""

Fusion on the GPT-2 FFN block, DRAM bytes: {gpt2_text}. The target of at most half: {verdict}.

Against its compulsory {c:,} bytes, the fused block moves {over}. Its first MATMUL holds X
whole in L3 and streams W1 past it once; the second re-reads its [128, 3072] A (too large for
L3) once per column tile of its result; the GELU result makes one round trip. `--no-fusion` runs
every graph op as its own kernel, the GELU chain's too, so each of them sends its [128, 3072]
result out and the next brings it back.

Where a fused MATMUL is tiled otherwise than the same MATMUL unfused (its epilogue's operands
take room on chip), and what that costs in bytes read (the fused kernel's reads include its
epilogue's operands):

""" + ("\n".join(retiled) or "- none") + """

The attention's softmax and both layer norms of the BERT layer are one kernel each (`SOFTMAX`,
`LAYERNORM`), and K's transpose is the scores MATMUL's transposed load (`tests/test_onnx_examples.py`
asserts both).""" + ("\n\nFailures:\n" + "\n".join(failures) if failures else "")
    write_section(SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
