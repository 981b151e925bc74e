"""The quantization family: map ops between floats and the integers of a quantized tensor, each
as onnxruntime's CPU kernels compute it (so an integer result is theirs to the bit).

A quantized tensor q stands for the reals (q - zero_point) * scale; scale and zero_point are
operands that broadcast against it (one per tensor, or one per channel shaped along its axis).
The float arithmetic is f32, one rounding per step as C's float, and rounding to an integer is
to the nearest, halves to even (nearbyint in the default mode):

- DEQUANTIZE(q, scale, zero_point[, addend]) (q - zero_point) * scale (+ addend)
- QUANTIZE(x, scale, zero_point)            saturate(round(x / scale) + zero_point)
- REQUANTIZE(acc, multiplier, zero_point)   saturate(round(acc * multiplier) + zero_point)

REQUANTIZE is the epilogue of an integer contraction: `acc` the i32 sums of (x - zx) w, the
multiplier x_scale * w_scale / y_scale, rounded to f32 once per channel, as QLinearConv,
QLinearMatMul and MLAS's requantize do it (the sum converted to f32, multiplied, clamped to the
range the zero point leaves, rounded). QUANTIZE divides (QuantizeLinear, MLAS's quantize
kernel); the two round x * (1 / s) and x / s apart, so each keeps its own. Saturation is to the
range of `dtype`, the result's type. DEQUANTIZE's addend is the sum of two quantized tensors as
QLinearAdd computes it, (a - za) * sa + (b - zb) * sb, then QUANTIZE by the result's scale: one
op per operand, the second reading the first's result, so the sum is one kernel's epilogue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import numpy_dtype
from .base import Shape, ShapeError, broadcast
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


def _to_integers(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    if numpy_dtype(attrs["dtype"]).kind not in "iu":
        raise ShapeError(f"dtype must be an integer type (the quantized result's), got {attrs['dtype']}")
    return [broadcast(shapes)]


map_op("QUANTIZE", 3, _quantize, "saturate(round(x / scale) + zero_point) into `dtype`, halves to even; operands "
       "x, scale, zero_point (QuantizeLinear)", {"transcendental": 1, **REQUANTIZE_WORK},  # a divide, then requantize
       attrs={"dtype": "i8"}, shapes=_to_integers,
       magnitude=lambda x, m, attrs: m[0] / np.abs(x[1]))  # the operand's, in steps of the scale
map_op("REQUANTIZE", 3, _requantize, "saturate(round(acc * multiplier) + zero_point) into `dtype`, halves to even, "
       "acc converted to f32 first; operands acc (an integer contraction's sums), multiplier, zero_point",
       REQUANTIZE_WORK, attrs={"dtype": "i8"}, shapes=_to_integers, magnitude=lambda x, m, attrs: m[0] * np.abs(x[1]))
map_op("DEQUANTIZE", (3, 4), _dequantize, "(q - zero_point) * scale (+ addend); operands q, scale, zero_point "
       "(DequantizeLinear), addend", {"simple": 2},  # subtract, multiply (and add: an FMA-style lane)
       magnitude=lambda x, m, attrs: np.abs(x[0] - x[2]) * np.abs(x[1]) + (m[3] if len(m) == 4 else 0))
