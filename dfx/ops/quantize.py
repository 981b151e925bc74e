"""The quantization family: map ops between floats and the integers of a quantized tensor, each
as onnxruntime's CPU kernels compute it (so an integer result is theirs to the bit).

A quantized tensor q stands for the reals (q - zero_point) * scale; scale and zero_point are
operands that broadcast against it (one per tensor, or one per channel shaped along its axis).
The float arithmetic is f32, one rounding per step as C's float, and rounding to an integer is
to the nearest, halves to even (nearbyint in the default mode):

- DEQUANTIZE(q, scale, zero_point[, addend]) (q - zero_point) * scale (+ addend)
- QUANTIZE(x, scale, zero_point)            saturate(round(x / scale) + zero_point)
- REQUANTIZE(acc, multiplier, zero_point)   saturate(round(acc * multiplier) + zero_point)
- QUANTIZED_ADD(a, b)                       QLinearAdd as onnxruntime's x86 kernel computes it

REQUANTIZE is the epilogue of an integer contraction: `acc` the i32 sums of (x - zx) w, the
multiplier x_scale * w_scale / y_scale, rounded to f32 once per channel, as QLinearConv,
QLinearMatMul and MLAS's requantize do it (the sum converted to f32, multiplied, clamped to the
range the zero point leaves, rounded). QUANTIZE divides (QuantizeLinear, MLAS's quantize
kernel); the two round x * (1 / s) and x / s apart, so each keeps its own. Saturation is to the
range of `dtype`, the result's type. DEQUANTIZE's addend is the sum of two quantized tensors as
onnxruntime runs a QDQ model's Add, in float, (a - za) * sa + (b - zb) * sb, then QUANTIZE by the
result's scale: one op per operand, the second reading the first's result, so the sum is one
kernel's epilogue.

QUANTIZED_ADD is QLinearAdd (com.microsoft) of two tensors of one shape as onnxruntime's AVX2
kernel computes it, which is not the formula above: with the scale ratios ra = sa / sc and
rb = sb / sc and the constant k = zc - (ra za + rb zb), all in f32, it rounds
fma(a, ra, fma(b, rb, k)), each multiply-add fused (one rounding). The two differ in about one
element in 200,000; onnxruntime runs a QDQ model's Add in float (the formula above).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import numpy_dtype
from .base import REQUIRED, Shape, ShapeError, broadcast
from .elementwise import map_op

# one element through the requantize step: a scale, the rounding, a zero point added, the saturation
REQUANTIZE_WORK = {"requantize": 1}


def _saturated(y: np.ndarray, zero_point: np.ndarray, dtype: str) -> np.ndarray:
    """round(y) + zero_point, clamped to `dtype`'s range (y and zero_point in a float dtype)."""
    info = np.iinfo(numpy_dtype(dtype))
    return np.clip(np.rint(y) + zero_point, info.min, info.max)


def _quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, dtype: str) -> np.ndarray:
    return _saturated(x / scale, zero_point, dtype)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray, dtype: str) -> np.ndarray:
    return _saturated(acc * multiplier, zero_point, dtype)


def _dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, addend: np.ndarray | None = None
                ) -> np.ndarray:
    real = (q - zero_point) * scale
    return real if addend is None else real + addend


def _fused_multiply_add(x: np.ndarray, factor: np.float32, addend: np.ndarray) -> np.ndarray:
    """x * factor + addend rounded once to f32, as an FMA instruction: the product of f32 values
    is exact in f64, and so is its sum with an f32 addend of not too different a size."""
    return (x.astype(np.float64) * np.float64(factor) + np.asarray(addend, np.float64)).astype(np.float32)


def _quantized_add(a: np.ndarray, b: np.ndarray, a_quantization: list, b_quantization: list, quantization: list,
                   dtype: str) -> np.ndarray:
    f32 = np.float32
    (sa, za), (sb, zb), (sc, zc) = a_quantization, b_quantization, quantization
    ra, rb = f32(sa) / f32(sc), f32(sb) / f32(sc)
    constant = f32(zc) - (ra * f32(za) + rb * f32(zb))
    y = _fused_multiply_add(a, ra, _fused_multiply_add(b, rb, constant))
    return _saturated(y, np.float32(0), dtype)


def _same_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    if shapes[0] != shapes[1]:
        raise ShapeError(f"QUANTIZED_ADD takes operands of one shape, got {list(shapes[0])} and {list(shapes[1])}")
    return _to_integers(shapes, dtypes, attrs)


def _to_integers(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    if numpy_dtype(attrs["dtype"]).kind not in "iu":
        raise ShapeError(f"dtype must be an integer type (the quantized result's), got {attrs['dtype']}")
    return [broadcast(shapes)]


def _quantized_magnitude(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any], rtol: float
                         ) -> list[np.ndarray]:
    """QUANTIZE's: the operand's, in steps of the scale, plus the zero point's size (so that no
    result's own size, |q| <= |q - zero_point| + |zero_point|, hides it: DEQUANTIZE takes the
    zero point off again). Where the operand carries an error from the ops before it (its
    magnitude is more than its own size) and, off by up to rtol times that, may lie on either
    side of a tie between two steps, either is right: its magnitude then allows a step more
    (rtol times it), which the ops after carry on. An operand held exactly (a kernel's own input,
    a map of it) gets no step: its rounding is the reference's."""
    steps, size = x[0] / x[1], m[0] / np.abs(x[1])
    if rtol > 0:
        size = np.where((m[0] > np.abs(x[0])) & (np.abs(steps - np.floor(steps) - 0.5) <= rtol * size),
                        size + 1 / rtol, size)
    return [size + np.abs(x[2])]


map_op("QUANTIZE", 3, _quantize, "saturate(round(x / scale) + zero_point) into `dtype`, halves to even; operands "
       "x, scale, zero_point (QuantizeLinear)", {"transcendental": 1, **REQUANTIZE_WORK},  # a divide, then requantize
       attrs={"dtype": "i8"}, shapes=_to_integers, rule=_quantized_magnitude)
map_op("REQUANTIZE", 3, _requantize, "saturate(round(acc * multiplier) + zero_point) into `dtype`, halves to even, "
       "acc converted to f32 first; operands acc (an integer contraction's sums), multiplier, zero_point",
       REQUANTIZE_WORK, attrs={"dtype": "i8"}, shapes=_to_integers, magnitude=lambda x, m, attrs: m[0] * np.abs(x[1]))
map_op("QUANTIZED_ADD", 2, _quantized_add, "QLinearAdd of a and b (one shape) as onnxruntime's x86 kernel: "
       "saturate(round(fma(a, sa/sc, fma(b, sb/sc, zc - (sa/sc za + sb/sc zb))))), in f32",
       {"simple": 2, **REQUANTIZE_WORK},  # two multiply-adds, then round and saturate
       attrs={"a_quantization": REQUIRED, "b_quantization": REQUIRED, "quantization": REQUIRED, "dtype": "i8"},
       shapes=_same_shapes, magnitude=lambda x, m, attrs: m[0] + m[1])
def _dequantized_magnitude(x: list[np.ndarray], m: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """DEQUANTIZE's: the integers' magnitude in steps less the zero point's size (a QUANTIZE's is
    its operand's in steps, with the step a tie allows), at least their size from the zero point,
    times the scale; plus the addend's."""
    return np.maximum(np.abs(x[0] - x[2]), m[0] - np.abs(x[2])) * np.abs(x[1]) + (m[3] if len(m) == 4 else 0)


map_op("DEQUANTIZE", (3, 4), _dequantize, "(q - zero_point) * scale (+ addend); operands q, scale, zero_point "
       "(DequantizeLinear), addend", {"simple": 2},  # subtract, multiply (and add: an FMA-style lane)
       magnitude=_dequantized_magnitude)
