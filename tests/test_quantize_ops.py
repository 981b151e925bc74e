"""The quantization ops of the registry (QUANTIZE, DEQUANTIZE, REQUANTIZE, QUANTIZED_ADD) and the
pad value of CONV2D and DEPTHWISE_CONV2D, against independent references: Python's own round
(halves to even) element by element, onnx's reference evaluator for QuantizeLinear,
DequantizeLinear and QLinearConv, and onnxruntime for QLinearAdd."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from dfx import REGISTRY, ShapeError

RNG = np.random.default_rng(7)


def run(name: str, arrays: list[np.ndarray], out: str, **attrs) -> np.ndarray:
    op = REGISTRY[name]
    attrs = op.normalize_attrs(attrs)
    [shape] = op.infer_shapes([a.shape for a in arrays], [], attrs)
    [y] = op.reference(arrays, attrs, [out])
    assert y.shape == shape
    return y


def _saturate(value: int, dtype) -> int:
    info = np.iinfo(dtype)
    return max(info.min, min(info.max, value))


def _node(op_type: str, inputs: dict[str, np.ndarray], **attrs) -> np.ndarray:
    """onnx's reference evaluator on one node whose first input is fed, the rest initializers."""
    names = list(inputs)
    node = helper.make_node(op_type, names, ["y"], **attrs)
    first = names[0]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        first, helper.np_dtype_to_tensor_dtype(inputs[first].dtype), inputs[first].shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in list(inputs.items())[1:]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, {first: inputs[first]})[0]


@pytest.mark.parametrize("name, dtype", [("i8", np.int8), ("u8", np.uint8)])
def test_quantize_rounds_halves_to_even_and_saturates(name, dtype):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1e6, -1e6, 0.49999997, 3.0], np.float32)
    scale, zero = np.float32(0.5), dtype(3)
    y = run("QUANTIZE", [x, scale, zero], out=name, dtype=name)
    expected = [_saturate(round(float(np.float32(v) / scale)) + int(zero), dtype) for v in x]
    assert y.tolist() == expected
    np.testing.assert_array_equal(y, _node("QuantizeLinear", {"x": x, "s": scale, "z": np.array(zero)}))


def test_quantize_per_channel_matches_quantize_linear():
    x = RNG.normal(0, 3, (2, 4, 3, 3)).astype(np.float32)
    scale = RNG.uniform(0.01, 0.1, 4).astype(np.float32)
    zero = RNG.integers(-20, 20, 4).astype(np.int8)
    y = run("QUANTIZE", [x, scale.reshape(4, 1, 1), zero.reshape(4, 1, 1)], out="i8", dtype="i8")
    np.testing.assert_array_equal(y, _node("QuantizeLinear", {"x": x, "s": scale, "z": zero}, axis=1))


def test_dequantize_matches_dequantize_linear_and_adds_its_addend():
    q = RNG.integers(0, 256, (3, 5)).astype(np.uint8)
    scale, zero = np.float32(0.0372), np.uint8(131)
    y = run("DEQUANTIZE", [q, scale, zero], out="f32")
    np.testing.assert_array_equal(y, _node("DequantizeLinear", {"q": q, "s": scale, "z": np.array(zero)}))
    addend = RNG.normal(0, 1, (1, 5)).astype(np.float32)
    summed = run("DEQUANTIZE", [q, scale, zero, addend], out="f32")
    np.testing.assert_array_equal(summed, (y + addend).astype(np.float32))


def test_requantize_scales_in_f32_rounds_to_even_and_adds_the_zero_point():
    acc = np.array([5, 15, 25, -5, -15, 2**30, -(2**30), 16777217], np.int32)
    multiplier, zero = np.float32(0.1), np.int8(-3)
    y = run("REQUANTIZE", [acc, multiplier, zero], out="i8", dtype="i8")
    # the sum converted to f32 first, multiplied in f32, rounded (halves to even), offset, saturated
    expected = [_saturate(round(float(np.float32(np.float32(v) * multiplier))) + int(zero), np.int8) for v in acc]
    assert y.tolist() == expected


@pytest.mark.parametrize("name", ["QUANTIZE", "REQUANTIZE"])
def test_a_quantized_result_must_be_an_integer_type(name):
    op = REGISTRY[name]
    with pytest.raises(ShapeError, match="integer type"):
        op.infer_shapes([(2,), (), ()], [], op.normalize_attrs({"dtype": "f32"}))


def test_conv2d_pads_with_its_pad_value_as_qlinearconv_pads_with_the_zero_point():
    """An integer CONV2D over x padded with zx, less zx times each output channel's weight sum,
    is QLinearConv's sum of (x - zx) w before its requantize: checked through the requantized
    results of onnx's reference QLinearConv."""
    x = RNG.integers(-128, 128, (1, 3, 6, 6)).astype(np.int8)
    w = RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    zx, sx, sw, sy, zy = np.int8(-17), np.float32(0.02), np.float32(0.004), np.float32(0.05), np.int8(2)
    sums = run("CONV2D", [x, w], out="i32", layout="NCHW", padding=[[1, 1], [1, 1]], pad_value=int(zx))
    sums = sums - int(zx) * w.astype(np.int64).sum(axis=(1, 2, 3)).reshape(4, 1, 1)
    y = run("REQUANTIZE", [sums.astype(np.int32), np.float32(sx * sw / sy), zy], out="i8", dtype="i8")
    want = _node("QLinearConv", {"x": x, "sx": sx, "zx": np.array(zx), "w": w, "sw": sw, "zw": np.int8(0),
                                 "sy": sy, "zy": np.array(zy)}, pads=[1, 1, 1, 1])
    assert np.abs(y.astype(int) - want).max() <= 1  # the evaluator requantizes in float64
    assert (y == want).mean() > 0.95


def test_depthwise_pads_with_its_pad_value():
    x = np.zeros((1, 2, 2, 1), np.int8)
    w = np.ones((3, 3, 1, 1), np.int8)
    y = run("DEPTHWISE_CONV2D", [x, w], out="i32", padding=[[1, 1], [1, 1]], pad_value=5)
    # each 3x3 window over a 2x2 zero image holds 5 padding elements of 5
    np.testing.assert_array_equal(y[0, :, :, 0], np.full((2, 2), 25))


@pytest.mark.parametrize("name, dtype", [("i8", np.int8), ("u8", np.uint8)])
def test_quantized_add_is_onnxruntimes_qlinear_add_bit_for_bit(name, dtype):
    """Its fused multiply-adds of the scale ratios, not the float formula ((a - za) sa + (b - zb) sb
    over sc, which rounds about one element in 200,000 the other way), on 262,144 elements."""
    import onnxruntime

    info = np.iinfo(dtype)
    a, b = (RNG.integers(info.min, info.max + 1, (64, 4096)).astype(dtype) for _ in range(2))
    quantization = {"a": [0.0213, int(info.min) + 100], "b": [0.0457, int(info.min) + 140], "c": [0.0531, int(info.min) + 120]}
    y = run("QUANTIZED_ADD", [a, b], out=name, a_quantization=quantization["a"], b_quantization=quantization["b"],
            quantization=quantization["c"], dtype=name)
    constants = {f"s{k}": np.float32(v[0]) for k, v in quantization.items()}
    constants.update({f"z{k}": dtype(v[1]) for k, v in quantization.items()})
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain="com.microsoft")
    tensor_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, tensor_type, a.shape) for k in "ab"],
                              [helper.make_tensor_value_info("y", tensor_type, a.shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    (want,) = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, want)
