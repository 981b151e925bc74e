"""int8 against float on the same machines: each model of examples/make_zoo.py's QUANTIZED, full
size, as PyTorch exports it (legacy exporter) and as onnxruntime's quantization tool makes it int8.

    python examples/make_zoo.py --full -o build/zoo-full                 # needs the `zoo` extra
    python examples/make_zoo.py ffn mlp --full --exporter legacy -o build/zoo-full
    python examples/make_zoo.py --quantized --full -o build/zoo-int8
    .venv/bin/python benchmarks/int8.py --float build/zoo-full --int8 build/zoo-int8

Both compiled for configs/standard.json and run by the loader (--json, timing only): cycles,
DRAM bytes and energy per inference, on standard as it is (one MAC per PE per cycle in every
dtype) and with 8-bit PEs packing four MACs a cycle (`timing.array_macs_per_pe_cycle.i8`, `.u8`:
4). The int8 model then runs with --check on its stored input, and its output is compared with
onnxruntime's: the share of elements bit-exact, and the largest difference in steps of the
output's quantization (static schemes) or over its peak (dynamic). A QDQ model's output is also
compared with onnxruntime's output of the same network in QOperator form, of the same scales,
which onnxruntime runs on its integer kernels throughout (it leaves some of a QDQ model's
convolutions in float).

Replaces the section "## int8 against float" of benchmarks/RESULTS.md (other sections are kept).
Nothing is written outside a temporary directory and RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, run, today, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECTION = "int8 against float"
BIN = Path(sys.executable).parent
STANDARD = REPO / "configs" / "standard.json"
PACKED = 4  # 8-bit MACs a PE does per cycle on the second machine
AGREEMENT = ("Against onnxruntime: the QOperator models agree on every element of the output. A QDQ model's "
             "output equals onnxruntime's output of the same network in QOperator form on every element (resnet18, "
             "and MobileNet v2 per channel; per tensor its residual adds run as onnxruntime runs a QDQ model's Add, "
             "in float, where the QOperator form's QLinearAdd fuses its multiply-adds), but not onnxruntime's run "
             "of the QDQ model itself: onnxruntime fuses only some of a QDQ model's DequantizeLinear -> Conv -> "
             "QuantizeLinear groups into QLinearConv (9 of resnet18's 20 convolutions; the ones reading a residual "
             "block's input stay float Convs, with `DedicatedQDQPair` too), and a float convolution's sum rounds a "
             "near-half the other way now and then (1 element of 200,704 in resnet18's first such layer), which "
             "the layers after it carry to 30-50% of the output's elements by 1-3 steps. The small models of "
             "examples/zoo agree bit for bit in every scheme (tests/test_zoo_quantized.py).")


def loader_json(kpu: Path, config: Path, out: Path, *extra) -> dict:
    p = run([BIN / "kpu-loader", kpu, "--config", config, "--json", *extra], out)
    if p.code not in (0, 1):
        raise RuntimeError(f"{kpu.name}: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.read_text())


def compiled(model: Path, work: Path) -> Path:
    kpu = work / f"{model.stem}.kpu"
    p = run([BIN / "kpu-kernel-compiler", model, "-o", kpu], work / f"{model.stem}.compile")
    if p.code != 0:
        raise RuntimeError(f"{model.name}: {p.stderr.strip().splitlines()[-1:]}")
    return kpu


def costs(summary: dict) -> tuple[int, int, float]:
    """cycles, DRAM bytes, energy in uJ"""
    return summary["cycles"], sum(summary["dram_bytes"].values()), summary["energy"]["total_pj"] / 1e6


def output_step(model: Path) -> float | None:
    """The scale of the DequantizeLinear that makes the graph's output (None: none does)."""
    import onnx

    m = onnx.load(str(model))
    producer = next((n for n in m.graph.node if n.output[0] == m.graph.output[0].name), None)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    scale = next(t for t in m.graph.initializer if t.name == producer.input[1])
    return float(onnx.numpy_helper.to_array(scale).max())


def checked(model: Path, kpu: Path, work: Path) -> tuple[str, np.ndarray]:
    """The int8 model run with --check on its stored input: the check, and its output."""
    arrays = np.load(model.with_suffix(".npz"))
    given = []
    for k in (k for k in arrays.files if k.startswith("input:")):
        path = work / f"{model.stem}.{len(given)}.npy"
        np.save(path, arrays[k])
        given += ["--input", f"{k.removeprefix('input:')}={path}"]
    outputs = work / f"{model.stem}.outputs"
    data = loader_json(kpu, STANDARD, work / f"{model.stem}.check.json", "--check", "--output-dir", outputs, *given)
    return ("pass" if data["check"]["passed"] else "FAIL"), np.load(data["outputs"]["output"])


def agreement(got: np.ndarray, reference: Path, step: float | None) -> str:
    """`got` against onnxruntime's stored output of `reference`: the share bit-exact, and the
    largest difference in output steps (or over the peak, without a step)."""
    want = np.load(reference.with_suffix(".npz"))["output:output"].astype(np.float64)
    error = np.abs(got.astype(np.float64) - want)
    far = f"{error.max() / step:.2g} steps" if step else f"{error.max() / np.abs(want).max():.1e} of the peak"
    return f"{(error == 0).mean():.1%} exact, {far}"


def integer_form(model: Path) -> Path | None:
    """The QOperator model of a QDQ one's scales (None: not a QDQ model, or none written)."""
    if "qdq_" not in model.name:
        return None
    twin = model.with_name(model.name.replace("qdq_per_tensor", "qoperator").replace("qdq_", "qoperator_"))
    return twin if twin.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--float", type=Path, required=True, help="make_zoo.py --full's output directory")
    parser.add_argument("--int8", type=Path, required=True, help="make_zoo.py --quantized --full's output directory")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["KPU_CACHE_DIR"] = str(work / "cache")
        packed = work / "standard_int8x4.json"
        document = json.loads(STANDARD.read_text())
        document["name"] = f"standard, 8-bit PEs at {PACKED} MACs a cycle"
        document["timing"]["array_macs_per_pe_cycle"] = {"i8": PACKED, "u8": PACKED}
        packed.write_text(json.dumps(document))
        float_runs: dict[str, tuple] = {}
        for entry in json.loads((options.int8 / "manifest.json").read_text()):
            name, scheme = entry["model"], entry["quantization"]
            print(f"{name} {scheme} ...", flush=True)
            if name not in float_runs:
                kpu = compiled(options.float / f"{name}.legacy.onnx", work)
                float_runs[name] = costs(loader_json(kpu, STANDARD, work / f"{name}.float.json", "--timing-only"))
            model = options.int8 / entry["file"]
            kpu = compiled(model, work)
            int8 = costs(loader_json(kpu, STANDARD, work / f"{model.stem}.json", "--timing-only"))
            int8_packed = costs(loader_json(kpu, packed, work / f"{model.stem}.x4.json", "--timing-only"))
            check, got = checked(model, kpu, work)
            step, twin = output_step(model), integer_form(model)
            rows.append((name, entry["sizes"], scheme, float_runs[name], int8, int8_packed, check,
                         agreement(got, model, step), agreement(got, twin, step) if twin else "-"))
    lines = ["| model | sizes | int8 scheme | float cycles | int8 cycles (1 / 4 MACs per PE) | float DRAM bytes "
             "| int8 DRAM bytes (ratio) | float energy uJ | int8 energy uJ (ratio) | int8 --check | int8 vs onnxruntime "
             "| vs onnxruntime, QOperator form |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for name, sizes, scheme, (fc, fb, fe), (ic, ib, ie), (pc, _, _), check, vs, vs_integer in rows:
        lines.append(f"| {name} | {sizes} | {scheme} | {fc:,} | {ic:,} / {pc:,} | {fb:,} | {ib:,} ({ib / fb:.2f}x) | "
                     f"{fe:,.1f} | {ie:,.1f} ({ie / fe:.2f}x) | {check} | {vs} | {vs_integer} |")
    command = ("python examples/make_zoo.py --full -o build/zoo-full && python examples/make_zoo.py ffn mlp --full "
               "--exporter legacy -o build/zoo-full && python examples/make_zoo.py --quantized --full -o build/zoo-int8 "
               "&& .venv/bin/python benchmarks/int8.py --float build/zoo-full --int8 build/zoo-int8")
    text = "\n".join([
        f"Measured {today()} on {machine()}, commit {os.popen(f'git -C {REPO} rev-parse --short HEAD').read().strip()}.",
        f"Reproduce: `{command}`.", "",
        "Full-size models (random weights): each as PyTorch's legacy exporter writes it and as onnxruntime's "
        "quantization tool makes it int8 (static: calibrated on 8 random inputs; dynamic: `quantize_dynamic`). "
        "Both compiled for configs/standard.json, CP-SAT binding, timing only; energy per inference from the "
        "loader's model (an i8 MAC 0.3 pJ against 4.6 pJ for f32, external memory 162.5 pJ per byte). The int8 "
        f"cycles are on standard as it is (1 MAC per PE per cycle, kpu-sim's PE) and with i8 and u8 at {PACKED}. "
        "The int8 model's --check run on its stored input, its output against onnxruntime's on that input.", "",
        *lines, "", AGREEMENT])
    write_section(SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
