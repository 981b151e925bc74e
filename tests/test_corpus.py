"""Every corpus graph without a convolution compiles, runs on `standard` and passes --check:
each kernel against its op's reference, each output end to end, and here the outputs against
numpy computed from the same inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import CONFIGS, DATA, run_cli
from dfx import numpy_dtype, read

CONVOLUTIONS = ("dfg__mobilenet", "tosa__oneLayerMLP", "tosa__twoLayerMLP")
# refused with its reason (test_cli_errors): a LINEAR with one of three operands wired
BROKEN = ("workloads__oneLayerMLP.dfg",)
GRAPHS = sorted(p.name for p in (DATA / "dfg").iterdir() if p.suffix in (".dfg", ".json")
                and not p.name.startswith(CONVOLUTIONS) and p.name not in BROKEN)


def numpy_eval(graph, values):
    """The graph computed with numpy alone, for the ops the corpus uses: each op in float64,
    its result rounded to its dtype as the graph declares."""
    unary = {"SIGMOID": lambda x: 1 / (1 + np.exp(-x)), "RELU": lambda x: np.maximum(x, 0)}
    v = {n: a.astype(np.float64) for n, a in values.items()}
    for op in graph.ops:
        x = [v[n] for n in op.inputs]
        if op.op_type == "MATMUL":
            b = np.swapaxes(x[1], -1, -2) if op.attrs.get("transpose_b") else x[1]
            y = x[0] @ b + (x[2] if len(x) == 3 else 0)
        elif op.op_type == "ADD":
            y = x[0] + x[1]
        else:
            y = unary[op.op_type](x[0])
        v[op.outputs[0]] = y.astype(numpy_dtype(graph.tensors[op.outputs[0]].dtype)).astype(np.float64)
    return v


@pytest.mark.parametrize("name", GRAPHS)
def test_corpus_graph_runs_and_checks(name, tmp_path):
    obj, out = tmp_path / "g.kpu", tmp_path / "out"
    compiled = run_cli("compiler", DATA / "dfg" / name, "-o", obj)
    assert compiled.returncode == 0, compiled.stderr
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check", "--json", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["check"]["passed"] and all(k["passed"] for k in report["check"]["kernels"].values())
    program = read(obj)
    from loader.inputs import program_inputs

    want = numpy_eval(program.graph, program_inputs(program, {}, 0))
    # the loosest dtype along the way: a one-ulp difference in an f8 intermediate carries on
    tol = max({"f64": 1e-9, "f32": 1e-4}.get(t.dtype, 0.2) for t in program.graph.tensors.values())
    for t in program.graph.outputs:
        got = np.load(report["outputs"][t.name]).astype(np.float64)
        np.testing.assert_allclose(got, want[t.name], rtol=tol, atol=tol * np.abs(want[t.name]).mean())
