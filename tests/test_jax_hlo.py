"""Real JAX and Flax HLO: the workloads `examples/make_jax_hlo.py` wrote into examples/jax/, each
in the three forms users print (the lowered module, the compiled one, XLA's after-optimizations
dump), beside their inputs and JAX's outputs. Every file goes through the HLO frontend,
compile_graph, the object file, binding and tile-by-tile execution in-process, as `kpu-loader
--check` runs it, fed by the ENTRY's parameter names: every kernel and every output passes the
check, and the outputs, in order, match JAX's within the tolerance the manifest gives each
(1e-4 of its peak for f32, four bf16 roundings for bf16, exact for integers); the convolutions
whose weights are parameters get no TRANSPOSE kernel in any form. Neither jax nor
flax is needed here: the files are the test data.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from conftest import CONFIGS, ROOT
from dfx import dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs
from loader.run import check_kernels, check_outputs

JAX = ROOT / "examples" / "jax"
MANIFEST = json.loads((JAX / "manifest.json").read_text())
STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
DTYPES = {"bfloat16": ml_dtypes.bfloat16}  # the manifest's dtype names numpy does not know
# convolutions whose weights (and BatchNorm statistics) are ENTRY parameters, HWIO as Flax keeps
# them: the weight moves read them in that order, so no kernel transposes them
CONVOLUTIONS_OF_PARAMETERS = {"cnn_bn_pool", "resnet_block", "dw_separable"}


def _dtype(name: str) -> np.dtype:
    return np.dtype(DTYPES.get(name, name))


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: f"{e['workload']}-{e['form']}")
def test_matches_jax_and_passes_the_check(entry):
    path = JAX / entry["file"]
    arrays = np.load(JAX / entry["data"])
    feeds = {name: arrays[f"input:{k}"].astype(_dtype(dtype))
             for k, (name, dtype) in enumerate(zip(entry["parameters"], entry["input_dtypes"]))}
    graph, warnings = load_graph(str(path))
    program = loads(dumps(compile_graph(graph, str(path), TARGET, warnings=warnings)))
    # the frontend drops parameters the program does not read; every one it keeps is fed
    unfed = [t.name for t in program.graph.inputs if t.name not in feeds and t.name not in program.graph.constants]
    assert not unfed, unfed
    bindings = bind_program(program, MACHINE, "test", bind_greedy)
    values = execute(program, bindings, program_inputs(program, feeds, seed=0))

    if entry["workload"] in CONVOLUTIONS_OF_PARAMETERS:
        assert "TRANSPOSE" not in [k.op for k in program.kernels]
    checks = {**check_kernels(program, values), **check_outputs(program, values)}
    failed = {name: c.worst_fraction for name, c in checks.items() if not c.passed}
    assert not failed, failed
    outputs = [t.name for t in program.graph.outputs]
    assert len(outputs) == len(entry["output_dtypes"]), outputs
    for k, (name, dtype, tolerance) in enumerate(zip(outputs, entry["output_dtypes"], entry["tolerance"])):
        got, want = values[name], arrays[f"output:{k}"]
        assert (got.shape, got.dtype) == (want.shape, _dtype(dtype)), (name, got.shape, got.dtype)
        peak = float(np.abs(want).max())
        assert float(np.abs(got.astype(np.float64) - want).max()) <= tolerance * peak, name
