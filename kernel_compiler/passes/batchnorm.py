"""BATCHNORM: an inference batch normalization after a convolution, folded into the convolution's
weights and bias. The ONNX frontend writes a BatchNormalization whose statistics are constants
as a per-channel MUL and ADD, x * s + t with s = scale / sqrt(var + epsilon) and
t = bias - mean * s; after a CONV2D whose result they alone read (the engine's condition), and
whose weights (and bias) are constants with values, they fold into it, one at a time:

    MUL(CONV2D(x, w, b), s)   CONV2D(x, w * s, b * s)     (no b: 0)
    ADD(CONV2D(x, w, b), t)   CONV2D(x, w, b + t)         (any w: a bias after a conv folds too)
    SUB(CONV2D(x, w, b), t)   CONV2D(x, w, b - t)         (XLA's x - mean)

s and t are graph constants with values that vary along the result's channel axis alone (1 for
NCHW, 3 for NHWC); w's output channels are the axis its `weight_layout` names O (0 in OIHW, OHWI). The new
weights and bias are computed here in float64 and rounded once to the dtypes of the old ones,
so the sums differ from the chain's by rounding only, as in any runtime that folds them. The
chain keeps one float dtype (an intermediate rounded to another type would not fold).

Statistics that are no constants (JAX's `model.apply(variables, x)`: ENTRY parameters) cannot fold
into the weights; the per-channel sums before the scale fold into the bias instead, and the scale
and shift stay as MUL and ADD that fuse as the convolution's epilogue:

    ADD(MUL(CONV2D(x, w, b) ± c ± mean, s), t)   ADD(MUL(CONV2D(x, w, b ± c ± mean), s), t)
    ADD(MUL(CONV2D(x, w, b), s), t - s * mean)   ADD(MUL(CONV2D(x, w, b - mean), s), t)

the new bias computed by small ops on the [C] vectors ahead of the convolution. A rewrite puts
its ops where the chain's last one was, so the ops computing s and t from the statistics
(rsqrt(var + eps) * scale), which the graph may hold between the convolution and its MUL, come
first: nothing but the epilogue is left between the convolution and its last op.
"""

from __future__ import annotations

import math

import numpy as np

from dfx import Op, is_integer
from dfx.ops.window import weight_layout

from .rewrite import Match, Pat, Rule


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


def _conv_channels(m: Match) -> tuple[Op, dict, int, int, int]:
    """The matched convolution, its attributes, its result's rank, channel axis and channels."""
    attrs = m.attrs("conv")
    rank = len(m.shape("conv"))
    axis = 1 if attrs["layout"] == "NCHW" else rank - 1
    return m.producer("conv"), attrs, rank, axis, m.shape("conv")[axis]


def _fold(m: Match) -> Op | None:
    conv, attrs, rank, axis, channels = _conv_channels(m)
    x, w, *bias = conv.inputs
    if not m.same_float_dtype():
        return None
    scale = _per_channel(m, "s", channels, axis, rank) if "s" in m else None
    shift = _per_channel(m, "t", channels, axis, rank) if "t" in m else np.zeros(channels)
    if shift is not None and m.root.op_type == "SUB":
        shift = -shift
    old_bias = _values(m, bias[0]) if bias else np.zeros(1)
    if ("s" in m and scale is None) or shift is None or old_bias is None or old_bias.size not in (1, channels):
        return None
    new_w = w
    if scale is not None:  # the weights scale too: they must be known
        weights, w_dtype = _values(m, w), m.graph.tensors[w].dtype
        outputs = weight_layout(attrs).index("O")  # the weights' output-channel axis
        if weights is None or is_integer(w_dtype) or weights.shape[outputs] != channels:
            return None
        along = [channels if k == outputs else 1 for k in range(weights.ndim)]
        new_w = m.constant("folded_weights", weights * scale.reshape(along), w_dtype)
    b_dtype = m.graph.tensors[bias[0]].dtype if bias else m.dtype("conv")
    folded_b = np.broadcast_to(old_bias.reshape(-1), (channels,)) * (1 if scale is None else scale) + shift
    return m.replace("CONV2D", x, new_w, m.constant("folded_bias", folded_b, b_dtype), **conv.attrs)


def _along_channels(m: Match, tensor: str, axis: int, rank: int, channels: int) -> bool:
    """`tensor` broadcasts along the convolution's result varying along its channel axis alone."""
    shape = m.graph.tensors[tensor].shape
    aligned = (1,) * (rank - len(shape)) + shape
    return len(shape) <= rank and aligned[axis] in (1, channels) \
        and all(d == 1 for k, d in enumerate(aligned) if k != axis)


def _scaled_conv(m: Match) -> Op | None:
    conv, attrs, rank, axis, channels = _conv_channels(m)
    x, w, *bias = conv.inputs
    # the per-channel sums before the scale, inner first, with their signs
    terms = [(m.producer(step).op_type == "ADD", m[term]) for step, term in (("p1", "t1"), ("p2", "t2")) if term in m]
    terms += [(False, m["mean"])] if "mean" in m else []
    vectors = [t for _, t in terms] + [m["s"], m["t"]]
    if not terms or not m.same_float_dtype() \
            or any(m.graph.tensors[t].dtype != m.dtype("conv") for t in vectors + bias) \
            or not all(_along_channels(m, t, axis, rank, channels) for t in vectors):
        return None
    shift = bias[0] if bias else None
    for plus, term in terms:
        if m.graph.tensors[term].shape != (channels,):
            term = m.op("per_channel", "RESHAPE", term, new_shape=[math.prod(m.graph.tensors[term].shape)])
        if shift is None:
            shift = term if plus else m.op("bias", "NEGATE", term)
        else:
            shift = m.op("bias", "ADD" if plus else "SUB", shift, term)
    shifted = m.op("conv", "CONV2D", x, w, shift, result_dtype=m.dtype("conv"), **conv.attrs)
    return m.replace("ADD", m.op("scaled", "MUL", shifted, m["s"]), m["t"])


_conv = Pat("CONV2D", name="conv")
_shifted = Pat(frozenset({"ADD", "SUB"}), _conv, Pat(name="t1"), name="p1")
_before_scale = Pat.any(Pat(frozenset({"ADD", "SUB"}), _shifted, Pat(name="t2"), name="p2"), _shifted, _conv)
_scale = Pat(name="s")

# a sweep meets the MUL first, then the ADD of the CONV2D that took it in; a scale of no known
# value leaves the ADD after it, and the chain's last ADD takes the shifts before it
BATCHNORM: list[Rule] = [
    (Pat("MUL", _conv, _scale), _fold),  # conv * s -> CONV2D(w * s, b * s)
    (Pat("ADD", _conv, Pat(name="t")), _fold),  # conv + t -> CONV2D(w, b + t)
    (Pat("SUB", _conv, Pat(name="t")), _fold),  # conv - t -> CONV2D(w, b - t)
    (Pat("ADD", Pat("MUL", _before_scale, _scale), Pat("SUB", Pat(name="t"), Pat("MUL", _scale, Pat(name="mean")))),
     _scaled_conv),  # conv * s + (t - s * mean) -> CONV2D(b - mean) * s + t
    (Pat("ADD", Pat("MUL", _before_scale, _scale), Pat(name="t")),
     _scaled_conv),  # (conv ± c ± mean) * s + t -> CONV2D(b ± c ± mean) * s + t
]
