"""int8 models as onnxruntime's quantization tool writes them (`examples/make_zoo.py --quantized`):
static QDQ per channel and per tensor (resnet18, mobilenet_v2), QOperator (resnet18: QLinearConv,
QGemm, QLinearAdd, QLinearGlobalAveragePool) and dynamic (an MLP and a transformer's FFN with its
layer norm: DynamicQuantizeLinear, MatMulInteger). Each goes through the ONNX frontend,
compile_graph, the object file, binding and execution in-process and passes the check. Against
onnxruntime: a static model's output is within one quantization step of onnxruntime's everywhere
and bit-exact on at least 99% of its elements, a dynamic model's within 1e-4 of its peak.

A static model's int8 tensors are compared too (each made a graph output here, as make_zoo made
it one there): bit-exact on at least 97% of their elements together. Not all: onnxruntime's CPU
session runs some of a QDQ model's DequantizeLinear -> Conv -> QuantizeLinear groups as float
convolutions (in resnet18, 11 of 20 stay float Convs: those reading a residual block's input),
and a float sum lands on the other side of a rounding half now and then (in the per-tensor
MobileNet, one element: 227 * 0.015418509 = 3.5000014, 4 by onnxruntime's QLinearConv kernel and
ours, 3 by its float DequantizeLinear, Conv, QuantizeLinear, which is what its session gives),
and the step carries on through the layers after it. The same network in QOperator form, of the
same scales, runs on onnxruntime's integer kernels throughout: a QDQ model's output equals that
model's onnxruntime output on every element. A static model's contractions all run on integers,
and int8 resnet18 moves and spends at most 0.35x what the float one does on standard.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from conftest import CONFIGS, ROOT
from dfx import dumps, is_integer, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import RunResult, bind_greedy, bind_program, execute
from loader.inputs import program_inputs
from loader.report import summary
from loader.run import check_kernels, check_outputs, simulate

ZOO = ROOT / "examples" / "zoo"
QUANTIZED = [e for e in json.loads((ZOO / "manifest.json").read_text()) if "quantization" in e]
STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
EXACT_SHARE = 0.99  # the issue's: bit-exact on at least this share of a static model's output
EXACT_TENSORS = 0.97  # of its int8 tensors' elements together (see above)
DYNAMIC_AGREEMENT = 1e-4  # a dynamic model's output, relative to its peak
ELEMENT_TYPES = {np.dtype(np.int8): onnx.TensorProto.INT8, np.dtype(np.uint8): onnx.TensorProto.UINT8}


def _prefixed(arrays, prefix: str) -> dict[str, np.ndarray]:
    return {k.removeprefix(prefix): arrays[k] for k in arrays.files if k.startswith(prefix)}


def _run(entry) -> tuple:
    """The model with its stored int8 tensors as outputs too, compiled, bound and executed: the
    program, its values, and onnxruntime's (the stored outputs and int8 tensors)."""
    path = ZOO / entry["file"]
    arrays = np.load(path.with_suffix(".npz"))
    feeds, expected = _prefixed(arrays, "input:"), {**_prefixed(arrays, "output:"), **_prefixed(arrays, "quantized:")}
    model = onnx.load(str(path))
    for name, value in _prefixed(arrays, "quantized:").items():
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, ELEMENT_TYPES[value.dtype], value.shape))
    graph, warnings = parse_onnx(path.name, model.SerializeToString())
    program = loads(dumps(compile_graph(infer_shapes(graph, warnings), path.name, TARGET, warnings=warnings)))
    values = execute(program, bind_program(program, MACHINE, "test", bind_greedy), program_inputs(program, feeds, 0))
    return program, values, expected, model


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear making the graph's float output: one quantization step of it."""
    producer = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    assert producer.op_type == "DequantizeLinear"
    scale = next(t for t in model.graph.initializer if t.name == producer.input[1])
    return float(onnx.numpy_helper.to_array(scale).max())


@pytest.mark.parametrize("entry", QUANTIZED, ids=lambda e: e["file"].removesuffix(".onnx"))
def test_matches_onnxruntime_and_passes_the_check(entry):
    program, values, expected, model = _run(entry)
    checks = {**check_kernels(program, values), **check_outputs(program, values)}
    failed = {name: c.worst_fraction for name, c in checks.items() if not c.passed}
    assert not failed, failed
    if entry["quantization"] == "dynamic":
        want = expected["output"]
        assert float(np.abs(values["output"].astype(np.float64) - want).max()) <= DYNAMIC_AGREEMENT * np.abs(want).max()
        return
    errors = {}
    for name, want in expected.items():
        got = values[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        errors[name] = np.abs(got.astype(np.float64) - want)
    output = errors.pop("output")
    assert output.max() <= _output_step(model) * (1 + 1e-6) and (output == 0).mean() >= EXACT_SHARE
    assert len(errors) > 20  # the int8 tensors are there to compare
    exact, total = sum(int((e == 0).sum()) for e in errors.values()), sum(e.size for e in errors.values())
    assert exact >= EXACT_TENSORS * total, f"{exact} of {total} elements bit-exact"
    if entry["quantization"].startswith("qdq"):  # the QOperator model of the same scales, all integer in onnxruntime
        integer = entry["file"].replace("qdq_per_tensor", "qoperator").replace("qdq_", "qoperator_")
        np.testing.assert_array_equal(values["output"], np.load((ZOO / integer).with_suffix(".npz"))["output:output"])
    # the integers run on the array and the vector units: no contraction computes in float
    contractions = [op for op in program.graph.ops if op.op_type in ("CONV2D", "DEPTHWISE_CONV2D", "MATMUL")]
    assert contractions and all(is_integer(program.graph.tensors[op.inputs[0]].dtype) for op in contractions)


def _profile(path) -> dict:
    graph, warnings = load_graph(str(path))
    program = compile_graph(graph, str(path), TARGET, warnings=warnings)
    result = RunResult(bind_program(program, MACHINE, "test", bind_greedy))
    result.sim = simulate(program, MACHINE, result.bindings)
    return summary(result, program, "test.kpu", MACHINE, {})


def test_int8_resnet18_moves_and_spends_a_third_of_the_float_one():
    int8, float32 = _profile(ZOO / "resnet18.qdq_per_channel.onnx"), _profile(ZOO / "resnet18.legacy.onnx")
    assert sum(int8["dram_bytes"].values()) <= 0.35 * sum(float32["dram_bytes"].values())
    assert int8["energy"]["total_pj"] <= 0.35 * float32["energy"]["total_pj"]
