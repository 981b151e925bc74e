"""Real exports: the models `examples/make_zoo.py` wrote into examples/zoo/ with PyTorch,
torchvision and transformers (random weights; each architecture at a small size), by both of
torch.onnx.export's exporters, each beside its input and onnxruntime's outputs. Every one goes
through the ONNX frontend, compile_graph, the object file, binding and tile-by-tile execution
in-process, as `kpu-loader --check` runs it: every kernel and every output passes the check,
and the outputs match onnxruntime's within 1e-4 of their peak. Neither torch nor the exporters
are needed here: the files are the test data.
"""

from __future__ import annotations

import json

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

ZOO = ROOT / "examples" / "zoo"
MANIFEST = json.loads((ZOO / "manifest.json").read_text())
FLOAT_MODELS = [e for e in MANIFEST if "quantization" not in e]  # the int8 ones: test_zoo_quantized.py
STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
AGREEMENT = 1e-4  # the bound, relative to the output's peak


def _prefixed(arrays, prefix: str) -> dict[str, np.ndarray]:
    return {k.removeprefix(prefix): arrays[k] for k in arrays.files if k.startswith(prefix)}


@pytest.mark.parametrize("entry", FLOAT_MODELS, ids=lambda e: f"{e['model']}-{e['exporter']}")
def test_matches_onnxruntime_and_passes_the_check(entry):
    path = ZOO / entry["file"]
    arrays = np.load(path.with_suffix(".npz"))
    feeds, expected = _prefixed(arrays, "input:"), _prefixed(arrays, "output:")
    graph, warnings = load_graph(str(path))
    program = loads(dumps(compile_graph(graph, str(path), TARGET, warnings=warnings)))
    bindings = bind_program(program, MACHINE, "test", bind_greedy)
    values = execute(program, bindings, program_inputs(program, feeds, seed=0))

    checks = {**check_kernels(program, values), **check_outputs(program, values)}
    failed = {name: c.worst_fraction for name, c in checks.items() if not c.passed}
    assert not failed, failed
    assert sorted(expected) == sorted(t.name for t in program.graph.outputs)
    for name, want in expected.items():
        got = values[name]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        peak = float(np.abs(want).max())
        assert float(np.abs(got.astype(np.float64) - want).max()) <= AGREEMENT * peak, name
