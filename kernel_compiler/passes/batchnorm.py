"""BATCHNORM: an inference batch normalization after a convolution, folded into the convolution's
weights and bias. The ONNX frontend writes a BatchNormalization whose statistics are constants
as a per-channel MUL and ADD, x * s + t with s = scale / sqrt(var + epsilon) and
t = bias - mean * s; after a CONV2D whose result they alone read (the engine's condition), and
whose weights (and bias) are constants with values, they fold into it, one at a time:

    MUL(CONV2D(x, w, b), s)   CONV2D(x, w * s, b * s)     (no b: 0)
    ADD(CONV2D(x, w, b), t)   CONV2D(x, w, b + t)         (any w: a bias after a conv folds too)

s and t are graph constants with values that vary along the result's channel axis alone (1 for
NCHW, 3 for NHWC); w's output channels are its axis 0 in either layout (OIHW, OHWI). The new
weights and bias are computed here in float64 and rounded once to the dtypes of the old ones,
so the sums differ from the chain's by rounding only, as in any runtime that folds them. The
chain keeps one float dtype (an intermediate rounded to another type would not fold).
"""

from __future__ import annotations

import numpy as np

from dfx import Op, is_integer

from .rewrite import Match, Pat, Rule

WEIGHT_OUTPUTS = 0  # the output-channel axis of OIHW and OHWI weights


def _values(m: Match, tensor: str) -> np.ndarray | None:
    """A graph constant's values as float64 in its shape, or None (no values, or not a constant)."""
    values = m.graph.constant_values(tensor) if m.graph.tensors[tensor].role == "constant" else None
    return None if values is None else values.astype(np.float64)


def _per_channel(m: Match, name: str, channels: int, axis: int, rank: int) -> np.ndarray | None:
    """The bound constant as one number per channel, or None when it varies along another axis
    (or has no values)."""
    values = _values(m, m[name])
    if values is None or values.ndim > rank:
        return None
    aligned = values.reshape((1,) * (rank - values.ndim) + values.shape)
    if any(d != 1 for k, d in enumerate(aligned.shape) if k != axis) or aligned.shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(aligned.reshape(-1), (channels,))


def _fold(m: Match) -> Op | None:
    conv = m.producer("conv")
    x, w, *bias = conv.inputs
    attrs = m.attrs("conv")
    rank = len(m.shape("conv"))
    axis = 1 if attrs["layout"] == "NCHW" else rank - 1
    channels = m.shape("conv")[axis]
    if not m.same_float_dtype():
        return None
    scale = _per_channel(m, "s", channels, axis, rank) if "s" in m else None
    shift = _per_channel(m, "t", channels, axis, rank) if "t" in m else np.zeros(channels)
    old_bias = _values(m, bias[0]) if bias else np.zeros(1)
    if ("s" in m and scale is None) or shift is None or old_bias is None or old_bias.size not in (1, channels):
        return None
    new_w = w
    if scale is not None:  # the weights scale too: they must be known
        weights, w_dtype = _values(m, w), m.graph.tensors[w].dtype
        if weights is None or is_integer(w_dtype) or weights.shape[WEIGHT_OUTPUTS] != channels:
            return None
        new_w = m.constant("folded_weights", weights * scale.reshape((channels,) + (1,) * (weights.ndim - 1)), w_dtype)
    b_dtype = m.graph.tensors[bias[0]].dtype if bias else m.dtype("conv")
    folded_b = np.broadcast_to(old_bias.reshape(-1), (channels,)) * (1 if scale is None else scale) + shift
    return m.replace("CONV2D", x, new_w, m.constant("folded_bias", folded_b, b_dtype), **conv.attrs)


_conv = Pat("CONV2D", name="conv")

# a sweep meets the MUL first, then the ADD of the CONV2D that took it in
BATCHNORM: list[Rule] = [
    (Pat("MUL", _conv, Pat(name="s")), _fold),  # conv * s -> CONV2D(w * s, b * s)
    (Pat("ADD", _conv, Pat(name="t")), _fold),  # conv + t -> CONV2D(w, b + t)
]
