"""Real models through both CLIs: the onnx package's nine `light` models (opset 9, as the package
ships them), the full-size exports of examples/make_zoo.py (PyTorch, torchvision,
transformers; random weights) and the JAX / Flax modules of examples/jax/ (make_jax_hlo.py: each
workload as JAX lowers it, as it compiles it, and as XLA dumps it after optimization).

    python examples/make_zoo.py --full -o build/zoo-full          # needs the `zoo` extra
    .venv/bin/python benchmarks/real_models.py --zoo build/zoo-full

Each model is compiled for configs/standard.json, then run by the loader three times: timing
only with an empty binding cache (a user's first run: every kernel bound by CP-SAT), timing only
again (bindings from the cache), and with --check (the numbers computed tile by tile and checked
against the reference). A zoo model runs on the input make_zoo.py stored beside it and its
outputs are compared with onnxruntime's; a light model runs on a seeded random input, and
onnxruntime's outputs on it are the reference; a JAX module runs on its stored inputs and is
compared with JAX's outputs.
Each run's wall time and the process's peak memory are measured from outside (wait4).

Replaces the section "## Real models" of benchmarks/RESULTS.md (other sections are kept).
Nothing is written outside a temporary directory and RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import RESULTS, Proc, machine, run, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECTION = "Real models"
BIN = Path(sys.executable).parent
STANDARD = REPO / "configs" / "standard.json"
LIGHT = ("resnet50", "inception_v1", "shufflenet", "squeezenet", "densenet121", "inception_v2", "bvlc_alexnet",
         "vgg19", "zfnet512")
CORPUS_MOBILENET_V2 = REPO.parent / "shared" / "corpus" / "dfg" / "dfg__mobilenet_v2.dfg"
JAX = REPO / "examples" / "jax"
ZOO_FULL = ("resnet18", "mobilenet_v2", "efficientnet_b0", "efficientnet_v2", "swin", "convnext", "gpt2", "llama")
AGREEMENT = 1e-4
# model -> the budgets on 2 cores, seconds: compile, timing only (first run), --check
BUDGETS = {"light resnet50": (5, 20, 120), "gpt2.dynamo": (10, 60, 600), "gpt2.legacy": (10, 60, 600)}


@dataclass
class ModelRun:
    name: str
    source: str
    kernels: int | None = None
    runs: dict[str, Proc] = field(default_factory=dict)
    summary: dict | None = None
    check: str = ""
    vs_framework: float | None = None
    failures: list[str] = field(default_factory=list)


def light_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def stored_io(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The input make_zoo.py stored beside a model, and onnxruntime's outputs on it."""
    arrays = np.load(path.with_suffix(".npz"))
    return ({k.removeprefix("input:"): arrays[k] for k in arrays.files if k.startswith("input:")},
            {k.removeprefix("output:"): arrays[k] for k in arrays.files if k.startswith("output:")})


def onnxruntime_io(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A seeded standard-normal input for each of the model's inputs, and onnxruntime's outputs on it."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    inputs = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()}
    return inputs, dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def jax_io(entry: dict) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """A JAX module's stored inputs by its ENTRY parameters' names, and JAX's outputs in order."""
    arrays = np.load(JAX / entry["data"])
    return ({name: arrays[f"input:{k}"] for k, name in enumerate(entry["parameters"])},
            [arrays[f"output:{k}"] for k in range(len(entry["output_dtypes"]))])


def run_model(name: str, source: str, model: Path, work: Path, inputs: dict[str, np.ndarray],
              expected: dict[str, np.ndarray] | list[np.ndarray]) -> ModelRun:
    """`expected`: the framework's outputs by name, or in the program's output order."""
    r = ModelRun(name, source)
    stem = name.replace(" ", "_")
    kpu = work / f"{stem}.kpu"
    r.runs["compile"] = run([BIN / "kpu-kernel-compiler", model, "-o", kpu], work / f"{stem}.compile")
    if r.runs["compile"].code != 0:
        r.failures.append(f"compile: {r.runs['compile'].stderr.splitlines()[-1:]}")
        return r
    body = json.loads(kpu.read_text())["body"]
    r.kernels = len(body["kernels"])
    given = []
    kept = {t["name"] for t in body["graph"]["tensors"] if t["role"] == "input"}
    for input_name, value in inputs.items():
        if input_name not in kept:  # a parameter the frontend dropped as unused
            continue
        path = work / f"{stem}.{len(given)}.npy"
        np.save(path, value)
        given += ["--input", f"{input_name}={path}"]
    outputs = work / f"{stem}.outputs"
    loader = [BIN / "kpu-loader", kpu, "--config", STANDARD, "--json", *given]
    for mode, extra in (("cold", ["--timing-only"]), ("cached", ["--timing-only"]),
                        ("check", ["--check", "--output-dir", outputs])):
        out = work / f"{stem}.{mode}.json"
        p = r.runs[mode] = run(loader + extra, out)
        if p.code not in (0, 1):
            r.failures.append(f"{mode}: {(p.stderr.splitlines() or ['no message'])[-1]}")
            continue
        data = json.loads(out.read_text())
        if mode == "cold":
            r.summary = data
        if mode == "check":
            r.check = "pass" if data["check"]["passed"] else "FAIL"
            if expected:  # the files the loader wrote, by output name or in order
                pairs = (zip(data["outputs"].values(), expected) if isinstance(expected, list)
                         else ((data["outputs"][k], v) for k, v in expected.items()))
                r.vs_framework = max(float(np.abs(np.load(f).astype(np.float64) - v).max())
                                     / max(float(np.abs(v).max()), 1e-30) for f, v in pairs)
    return r


def fmt(n, spec: str = ",") -> str:
    return "-" if n is None else format(n, spec)


def table(runs: list[ModelRun]) -> list[str]:
    lines = ["| model | source | kernels | cycles | DRAM bytes | compile s | loader s (first / cached / --check) "
             "| peak MB (compile / check) | check | vs framework | budget (compile / first / check s) |",
             "|---|---|---:|---:|---:|---:|---|---|---|---:|---|"]
    for r in runs:
        s = r.summary or {}
        dram = sum(s["dram_bytes"].values()) if s else None
        walls = " / ".join(f"{r.runs[m].wall:.1f}" if m in r.runs else "-" for m in ("cold", "cached", "check"))
        rss = " / ".join(f"{r.runs[m].rss:,.0f}" if m in r.runs else "-" for m in ("compile", "check"))
        budget = BUDGETS.get(r.name)
        met = ""
        if budget:
            got = [r.runs[m].wall if m in r.runs else float("inf") for m in ("compile", "cold", "check")]
            met = " / ".join(f"{b} {'met' if g < b else 'MISSED'}" for b, g in zip(budget, got))
        lines.append(f"| {r.name} | {r.source} | {fmt(r.kernels)} | {fmt(s.get('cycles'))} | {fmt(dram)} | "
                     f"{r.runs['compile'].wall:.1f} | {walls} | {rss} | {r.check or '-'} | "
                     f"{fmt(r.vs_framework, '.1e')} | {met or '-'} |")
    failures = [f"- {r.name}: {f}" for r in runs for f in r.failures]
    return lines + (["", "Failures:", *failures] if failures else [])


def _section() -> list[str]:
    """The lines of RESULTS.md's section, empty where it has none."""
    text = RESULTS.read_text() if RESULTS.exists() else ""
    start = text.find(f"\n## {SECTION}\n")
    if start < 0:
        return []
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)].splitlines()


def kept_rows() -> dict[str, str]:
    """The table rows of RESULTS.md's section by model name, in their order."""
    rows = [line for line in _section() if line.startswith("| ") and not line.startswith("| model |")]
    return {row.split("|")[1].strip(): row for row in rows}


def previous_measurement() -> str:
    """The section's sentence saying when and where its rows were measured."""
    return next((line for line in _section() if line.startswith("Measured ")), "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, help="make_zoo.py --full's output directory")
    parser.add_argument("--only", nargs="*", help="model names to run (default: all)")
    parser.add_argument("--keep", action="store_true",
                        help="with --only: keep the other models' rows as RESULTS.md has them, and say which rows "
                             "this run measured")
    options = parser.parse_args()
    if options.keep and not options.only:
        parser.error("--keep goes with --only")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["KPU_CACHE_DIR"] = str(work / "cache")  # the first run of each model binds afresh
        jobs = [(f"light {m}", "onnx light, opset 9", light_dir() / f"light_{m}.onnx") for m in LIGHT]
        # the same network as torchvision's mobilenet_v2, as the corpus writes it (NHWC), to compare with
        jobs.append(("corpus mobilenet_v2", "domain_flow .dfg, NHWC", CORPUS_MOBILENET_V2))
        jax_entries = {e["file"]: e for e in json.loads((JAX / "manifest.json").read_text())}
        jobs += [(f"jax {e['workload']}.{e['form']}", f"{e['sizes']}; jax {e['versions']['jax']}", JAX / e["file"])
                 for e in jax_entries.values()]
        if options.zoo:
            manifest = json.loads((options.zoo / "manifest.json").read_text())
            jobs += [(f"{e['model']}.{e['exporter']}", f"{e['sizes']}; torch {e['versions']['torch']}",
                      options.zoo / e["file"]) for e in manifest if e["model"] in ZOO_FULL]
        for name, source, path in jobs:
            if options.only and not any(o in name for o in options.only):
                continue
            if path.name in jax_entries:
                inputs, expected = jax_io(jax_entries[path.name])
            elif path.suffix != ".onnx":
                inputs, expected = {}, {}
            elif path.with_suffix(".npz").exists():
                inputs, expected = stored_io(path)
            else:
                inputs, expected = onnxruntime_io(path)
            print(f"{name} ...", flush=True)
            runs.append(run_model(name, source, path, work, inputs, expected))
    command = "python examples/make_zoo.py --full -o build/zoo-full && " \
              ".venv/bin/python benchmarks/real_models.py --zoo build/zoo-full"
    commit = os.popen(f'git -C {REPO} rev-parse --short HEAD').read().strip()
    measured = f"Measured {today()} on {machine()}, commit {commit}."
    rows = table(runs)
    if options.keep:
        kept, before = kept_rows(), previous_measurement()
        names = [name for name, _, _ in jobs]
        fresh = {r.name: line for r, line in zip(runs, rows[2:])}
        order = names + [name for name in kept if name not in names]
        rows = rows[:2] + [fresh.get(name) or kept[name] for name in order if name in fresh or name in kept] \
            + rows[2 + len(runs):]
        measured = (f"{before} The rows of {', '.join(r.name for r in runs)}: measured {today()} on {machine()}, "
                    f"commit {commit} "
                    f"(`benchmarks/real_models.py --only {' '.join(map(shlex.quote, options.only))} --keep`).")
    text = "\n".join([
        measured,
        f"Reproduce: `{command}`.", "",
        "Each model compiled for configs/standard.json; the loader run three times: timing only with an empty "
        "binding cache (first), again from the cache, and with --check. Wall seconds include interpreter start-up; "
        "peak memory is the process's own (wait4). Light models run on a seeded standard-normal input, zoo models "
        "on the input make_zoo.py stored; both compared with onnxruntime's outputs on that input, JAX modules with "
        "JAX's outputs on their stored inputs (largest error over the output's peak). A JAX workload's three rows "
        "are its forms: `lowered` (`jit(f).lower(...).compiler_ir('hlo').as_hlo_text()`), `compiled` "
        "(`.compile().as_text()`), `dumped` (XLA_FLAGS=--xla_dump_to, after optimizations).", "",
        *rows])
    write_section(SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
