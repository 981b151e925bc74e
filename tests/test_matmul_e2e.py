"""Matmul end to end: compile, bind, simulate, execute tile by tile, compare with numpy."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from conftest import CONFIGS, DATA, run_cli
from dfx import read

NUMPY = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "f8": ml_dtypes.float8_e4m3fn,
         "bf16": ml_dtypes.bfloat16, "i8": np.int8, "i32": np.int32}


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

    obj = tmp_path / "g.kpu"
    assert run_cli("compiler", gemm_file(256, 256, 256), "-o", obj, "--target", CONFIGS / "minimal.json").returncode == 0
    program = read(obj)
    bindings = bind_program(program, load_machine(CONFIGS / "minimal.json"), str(obj))
    # the module, not the `execute` function the package exports under the same name
    monkeypatch.setattr(importlib.import_module("loader.execution"), "PROGRESS_EVERY", 100)
    calls = []
    values = execute(program, bindings, program_inputs(program, {}, 0), calls.append)
    total = sum(k.runs(op) for k in program.kernels for op in k.body)
    assert total > 300 and calls == list(range(100, total + 1, 100))
    np.testing.assert_allclose(values["C"], values["A"].astype(np.float64) @ values["B"], rtol=1e-4, atol=1e-4)
