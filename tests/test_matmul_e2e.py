"""Matmul end to end: compile, bind, simulate, execute tile by tile, compare with numpy."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from conftest import CONFIGS, DATA, run_cli
from dfx import read

MATMUL_FILES = sorted(p.name for p in (DATA / "dfg").iterdir()
                      if ("matmul" in p.name or "AtimesBtimesC" in p.name) and "linear" not in p.name)
NUMPY = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "f8": ml_dtypes.float8_e4m3fn,
         "bf16": ml_dtypes.bfloat16, "i8": np.int8, "i32": np.int32}


def numpy_graph(program, inputs):
    """The graph evaluated here with plain numpy (f32 sums, f64 when f64 is involved)."""
    values = dict(inputs)
    g = program.graph
    for op in g.ops:
        assert op.op_type == "MATMUL"
        out = g.tensors[op.outputs[0]]
        wide = np.float64 if "f64" in [g.tensors[n].dtype for n in op.inputs] + [out.dtype] else np.float32
        arrays = [values[n].astype(wide) for n in op.inputs]
        c = arrays[0] @ arrays[1] + (arrays[2] if len(arrays) == 3 else 0)
        values[out.name] = c.astype(NUMPY[out.dtype])
    return values


@pytest.mark.parametrize("name", MATMUL_FILES + ["kpu-sim__simple__matmul.json"])
def test_corpus_matmul_compiles_runs_and_checks(name, tmp_path):
    obj, out = tmp_path / "m.kpu", tmp_path / "out"
    assert run_cli("compiler", DATA / "dfg" / name, "-o", obj).returncode == 0
    inputs = {}
    program = read(obj)
    args = []
    rng = np.random.default_rng(7)
    for t in program.graph.inputs:
        inputs[t.name] = rng.uniform(-1, 1, t.shape).astype(NUMPY[t.dtype])
        np.save(tmp_path / f"{t.name}.npy", inputs[t.name])
        args += ["--input", f"{t.name}={tmp_path / t.name}.npy"]
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check", "--json",
                   "--output-dir", out, *args)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["check"]["passed"]
    expected = numpy_graph(program, inputs)
    for t in program.graph.outputs:
        got = np.load(out / f"{t.name}.npy").astype(np.float64)
        want = expected[t.name].astype(np.float64)
        tol = {"f64": 1e-9, "f32": 1e-4, "f16": 1e-2}.get(t.dtype, 0.25)
        # chains round intermediates to f8/f16: allow one low-precision step of difference
        np.testing.assert_allclose(got, want, rtol=tol if len(program.graph.ops) == 1 else 0.15, atol=tol)


def test_generated_1024_cubed_f32(gemm_file, tmp_path):
    obj = tmp_path / "g.kpu"
    assert run_cli("compiler", gemm_file(1024, 1024, 1024), "-o", obj).returncode == 0
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check", "--json",
                   "--output-dir", tmp_path / "out", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["check"]["passed"]
    assert summary["macs"] == 1024 ** 3
    # independent of the loader: regenerate the same seeded inputs and multiply here
    from loader.inputs import generated

    program = read(obj)
    a, b = (generated(program.graph.tensors[n], 3) for n in ("A", "B"))
    np.testing.assert_allclose(np.load(tmp_path / "out" / "C.npy"), a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", ["i8", "bf16", "f16"])
def test_low_precision_accumulates_wide(gemm_file, tmp_path, dtype):
    obj = tmp_path / "g.kpu"
    assert run_cli("compiler", gemm_file(96, 80, 200, dtype), "-o", obj).returncode == 0
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check", "--json",
                   "--output-dir", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    from loader.inputs import generated

    program = read(obj)
    a, b = (generated(program.graph.tensors[n], 0) for n in ("A", "B"))
    wide = np.int32 if dtype == "i8" else np.float32
    want = (a.astype(wide) @ b.astype(wide)).astype(NUMPY[dtype])
    got = np.load(tmp_path / "out" / "C.npy")
    if dtype == "i8":
        np.testing.assert_array_equal(got, want)  # i32 sums wrap to i8 exactly as numpy does
    else:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)


def test_batched_broadcast_matmul(tmp_path):
    # kalman_filter: [4,256] @ [4,256,16] broadcasts to [4,4,16] (the declared [4,16] is wrong),
    # then a sigmoid on the vector unit
    obj, out = tmp_path / "k.kpu", tmp_path / "out"
    assert run_cli("compiler", DATA / "dfg" / "workloads__ctl__kalman_filter.dfg", "-o", obj).returncode == 0
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    from loader.inputs import generated

    g = read(obj).graph
    z = generated(g.tensors["arg"], 0).astype(np.float64) @ generated(g.tensors["weights"], 0).astype(np.float64)
    np.testing.assert_allclose(np.load(out / "out_1.npy"), 1 / (1 + np.exp(-z)), rtol=1e-5, atol=1e-6)


def test_execution_reports_progress_in_tile_ops(gemm_file, tmp_path, monkeypatch):
    import importlib

    from hardware import load_machine
    from loader import bind_program, execute, program_inputs
    from loader.buffers import op_runs

    obj = tmp_path / "g.kpu"
    assert run_cli("compiler", gemm_file(256, 256, 256), "-o", obj, "--target", CONFIGS / "minimal.json").returncode == 0
    program = read(obj)
    bindings = bind_program(program, load_machine(CONFIGS / "minimal.json"), str(obj))
    # the module, not the `execute` function the package exports under the same name
    monkeypatch.setattr(importlib.import_module("loader.execute"), "PROGRESS_EVERY", 100)
    calls = []
    values = execute(program, bindings, program_inputs(program, {}, 0), calls.append)
    total = sum(op_runs(k, op) for k in program.kernels for op in k.body)
    assert total > 300 and calls == list(range(100, total + 1, 100))
    np.testing.assert_allclose(values["C"], values["A"].astype(np.float64) @ values["B"], rtol=1e-4, atol=1e-4)
