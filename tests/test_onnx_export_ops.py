"""ONNX ops real exports need beyond the issues' lists: Pad in its four modes (torchvision's Swin
pads its windows; reflection padding in image-to-image models) and Sin, Cos and Tan (a legacy
exported Llama computes its rotary angles with them, from a constant the frontend folds),
ScatterND of constants (Swin's attention mask) and EyeLike (XLNet's), folded. Each
model is compiled, written and read back, bound and executed in-process; every output against
onnxruntime's, every kernel and output passing --check."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.shape_inference import infer_shapes
from test_frontend_onnx import model, rand, refusal
from test_onnx_spatial_ops import ops_of, run

X = rand(1, 3, 5, 4, seed=11)
I32 = np.arange(20, dtype=np.int32).reshape(4, 5)

# id -> (input, mode, pads, constant_value, axes, the registry ops it becomes)
PADS = {
    "constant": (X, "constant", [0, 0, 1, 2, 0, 0, 3, 1], 1.5, None, ["PAD"]),
    "constant_default_zero": (X, "constant", [0, 0, 1, 1, 0, 0, 1, 1], None, None, ["PAD"]),
    # negative pads crop first: a SLICE, then the PAD
    "constant_crop": (X, "constant", [0, 0, -1, 2, 0, 0, 1, -2], -0.5, None, ["SLICE", "PAD"]),
    "constant_crop_only": (X, "constant", [0, 0, -2, 0, 0, 0, 0, -1], None, None, ["SLICE"]),
    "constant_axes": (X, "constant", [2, 1, 0, 3], 2.0, [-1, 2], ["PAD"]),
    "constant_int": (I32, "constant", [1, 0, 0, 2], 7, None, ["PAD"]),
    "edge": (X, "edge", [0, 0, 2, 1, 0, 0, 3, 2], None, None, ["GATHER", "GATHER"]),
    "reflect": (X, "reflect", [0, 0, 2, 3, 0, 0, 1, 3], None, None, ["GATHER", "GATHER"]),
    "reflect_to_the_far_end": (X, "reflect", [0, 0, 0, 3, 0, 0, 4, 0], None, None, ["GATHER", "GATHER"]),
    # more than the axis holds: wrapped again, as onnxruntime does
    "wrap": (I32, "wrap", [2, 1, 3, 6], None, None, ["GATHER", "GATHER"]),
    "edge_crop": (I32, "edge", [-1, 2, 1, -3], None, None, ["GATHER", "GATHER"]),
    # the kept part wraps and mirrors, not the whole axis
    "wrap_crop": (I32, "wrap", [0, -1, 0, 2], None, None, ["GATHER"]),
    "reflect_crop": (I32, "reflect", [0, 1, 0, -3], None, None, ["GATHER"]),
}


@pytest.mark.parametrize("case", PADS)
def test_pad(case):
    x, mode, pads, value, axes, ops = PADS[case]
    inputs = ["x", "pads", "value" if value is not None else "", *(["axes"] if axes else [])]
    constants = {"pads": np.int64(pads), **({"axes": np.int64(axes)} if axes else {})}
    if value is not None:
        constants["value"] = np.array(value, x.dtype)
    opset = 19 if mode == "wrap" else 18  # wrap is opset 19's
    m = model([helper.make_node("Pad", inputs, ["y"], mode=mode)], {"x": x}, ["y"], constants, opset=opset)
    program = run(m, {"x": x})
    assert ops_of(program) == ops


def test_pad_refusals():
    def pad(pads, mode="constant", value=None):
        inputs = {"x": X, **({"value": value} if value is not None else {})}
        node = helper.make_node("Pad", ["x", "pads", *(["value"] if value is not None else [])], ["y"], mode=mode)
        return model([node], inputs, ["y"], {"pads": np.int64(pads)}, opset=18)

    assert refusal(pad([0, 0, 0, 0, 0, 0, 0, 0], value=np.float32(1))) == (
        "bad.onnx: node #0 (Pad): its constant_value (input 2, 'value') must be a constant: the ONNX frontend "
        "reads it at compile time")
    assert refusal(pad([0, 0, -3, 0, 0, 0, -3, 0])) == (
        "bad.onnx: node #0 (Pad): pads [0, 0, -3, 0, 0, 0, -3, 0] crop more than the input's shape [1, 3, 5, 4] "
        "holds")
    assert refusal(pad([0, 0, 0, 4, 0, 0, 0, 0], mode="reflect")) == (
        "bad.onnx: node #0 (Pad): mode 'reflect' pads axis 3 by 4, more than the 3 elements its mirror holds")
    assert refusal(pad([0, 0, 0, 2, 0, 0, 0, -2], mode="reflect")) == (  # of the 2 kept
        "bad.onnx: node #0 (Pad): mode 'reflect' pads axis 3 by 2, more than the 1 elements its mirror holds")
    assert refusal(pad([0, 0, 1, 0, 0, 0, 0, 0], mode="symmetric")) == (
        "bad.onnx: node #0 (Pad): mode 'symmetric' is not supported (constant, edge, reflect, wrap)")


@pytest.mark.parametrize("op_type", ["Sin", "Cos", "Tan"])
def test_a_trigonometric_map_runs_on_the_vector_unit(op_type):
    x = rand(4, 33, seed=12, low=-7.0, high=7.0)
    if op_type == "Tan":  # away from the poles, where a rounding of x moves tan(x) without bound
        x = rand(4, 33, seed=12, low=-1.4, high=1.4)
    program = run(model([helper.make_node(op_type, ["x"], ["y"])], {"x": x}, ["y"]), {"x": x})
    assert ops_of(program) == [op_type.upper()]


def test_rotary_angles_of_a_constant_fold():
    """A legacy Llama export: Cos and Sin of a Constant node's angles, then x * cos + x * sin.
    The angles' cosines and sines are constants of the program; only the arithmetic on x runs."""
    angles = np.outer(np.arange(16), 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)
    angles = np.concatenate([angles, angles], axis=-1)[None]
    nodes = [helper.make_node("Constant", [], ["angles"], value=helper.make_tensor(
                 "angles", 1, list(angles.shape), angles.reshape(-1).tolist())),
             helper.make_node("Cos", ["angles"], ["cos"]), helper.make_node("Sin", ["angles"], ["sin"]),
             helper.make_node("Mul", ["x", "cos"], ["a"]), helper.make_node("Mul", ["x", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    x = rand(1, 16, 8, seed=13)
    program = run(model(nodes, {"x": x}, ["y"]), {"x": x})
    assert sorted(ops_of(program)) == ["ADD", "MUL", "MUL"]


def test_a_scatter_of_constants_folds_and_of_a_runtime_tensor_is_refused():
    """Swin's attention mask: a ScatterND of constants, evaluated here; only the ADD runs."""
    data, updates = np.zeros((4, 5), np.float32), rand(2, 5, seed=14)
    constants = {"data": data, "indices": np.int64([[3], [1]]), "updates": updates}
    nodes = [helper.make_node("ScatterND", ["data", "indices", "updates"], ["mask"]),
             helper.make_node("Add", ["x", "mask"], ["y"])]
    x = rand(4, 5, seed=15)
    program = run(model(nodes, {"x": x}, ["y"], constants), {"x": x})
    assert ops_of(program) == ["ADD"]
    del constants["data"]
    at_run_time = model(nodes[:1], {"data": data}, ["mask"], constants)
    assert refusal(at_run_time) == ("bad.onnx: node #0 (ScatterND): its input 0 ('data') must be a constant: the "
                                    "ONNX frontend evaluates ScatterND at compile time")


@pytest.mark.parametrize("attrs", [{}, {"k": 2}, {"k": -1, "dtype": 1}])
def test_an_eye_like_a_runtime_tensor_folds_from_its_shape(attrs):
    """XLNet's legacy export: EyeLike reads only its input's shape, so it is known at compile time
    even of a runtime input; the identity is a constant of the program."""
    nodes = [helper.make_node("EyeLike", ["x"], ["eye"], **attrs), helper.make_node("Add", ["x", "eye"], ["y"])]
    x = rand(5, 7, seed=16)
    program = run(model(nodes, {"x": x}, ["y"]), {"x": x})
    assert ops_of(program) == ["ADD"]
    huge = model([helper.make_node("EyeLike", ["x"], ["y"])], {"x": x}, ["y"], dims={"x": [4097, 4097]})
    assert refusal(huge) == ("bad.onnx: node #0 (EyeLike): its result would hold 16,785,409 elements, more than "
                             "the 16,777,216 the ONNX frontend folds at compile time")


def test_a_bf16_pad_keeps_its_fractional_constant():
    """numpy calls bf16 kind 'V', not a float: the constant 1.5 must not reach PAD as 1."""
    value = helper.make_tensor("value", onnx.TensorProto.BFLOAT16, [], [1.5])
    graph = helper.make_graph([helper.make_node("Pad", ["x", "pads", "value"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.BFLOAT16, [2, 3])],
                              [onnx.ValueInfoProto(name="y")],
                              [numpy_helper.from_array(np.int64([1, 1, 1, 1]), "pads"), value])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    parsed, warnings = parse_onnx("t.onnx", m.SerializeToString())
    [pad] = [op for op in infer_shapes(parsed, warnings).ops if op.op_type == "PAD"]
    assert pad.attrs["pad_value"] == 1.5 and np.dtype(ml_dtypes.bfloat16).kind == "V"
