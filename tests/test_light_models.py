"""The onnx package's nine `light` models (opset 9, as the package ships them; their weights are
ConstantOfShape results of one value each): each compiles as it is, and ResNet-50, Inception v1,
ShuffleNet and SqueezeNet at 224x224 run through binding and tile-by-tile execution with every
kernel and output passing the check, and their outputs match onnxruntime's on a random input
within 1e-4 of the output's peak.

These take minutes, not seconds: they carry the `models` mark, which `make test` leaves out and
`make test-models` runs (CI runs both).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import CONFIGS
from dfx import Program, dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs
from loader.run import check_kernels, check_outputs

pytestmark = pytest.mark.models

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ("resnet50", "inception_v1", "shufflenet", "squeezenet", "densenet121", "inception_v2", "bvlc_alexnet",
          "vgg19", "zfnet512")
RUN = ("resnet50", "inception_v1", "shufflenet", "squeezenet")
STANDARD = str(CONFIGS / "standard.json")
AGREEMENT = 1e-4


@cache
def compiled(name: str) -> tuple[Program, list[str]]:
    path = LIGHT / f"light_{name}.onnx"
    graph, warnings = load_graph(str(path))
    return loads(dumps(compile_graph(graph, str(path), load_target(STANDARD), warnings=warnings))), warnings


@pytest.mark.parametrize("name", MODELS)
def test_compiles_as_shipped(name):
    program, warnings = compiled(name)
    assert any("opset 9 upgraded to opset 11" in w for w in warnings), warnings
    assert program.kernels and {op.op_type for op in program.graph.ops} - {"RESHAPE"}


@pytest.mark.parametrize("name", RUN)
def test_matches_onnxruntime_on_a_random_input(name):
    import onnxruntime

    program, _ = compiled(name)
    session = onnxruntime.InferenceSession(str(LIGHT / f"light_{name}.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()}
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    machine = load_machine(STANDARD)
    values = execute(program, bind_program(program, machine, "test", bind_greedy),
                     program_inputs(program, feeds, seed=0))
    checks = {**check_kernels(program, values), **check_outputs(program, values)}
    assert not {k: c.worst_fraction for k, c in checks.items() if not c.passed}
    for output, want in expected.items():
        got = values[output].astype(np.float64)
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) <= AGREEMENT * float(np.abs(want).max()), output
