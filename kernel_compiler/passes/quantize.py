"""QUANTIZE: a quantized model's float islands turned into integer ops, as onnxruntime runs them.

The ONNX frontend writes QDQ and QOperator models alike as DEQUANTIZE -> float op -> QUANTIZE
(onnx_quantized.py). These rules give each pattern its integer form, so the array multiplies
int8 operands into int32 sums and quantized tensors stay 1 byte everywhere:

    QUANTIZE(CONV2D|MATMUL(DQ(x, sx, zx), DQ(w, sw, zw), DQ(b, sx*sw, 0)), sy, zy)
        REQUANTIZE(CONV2D|MATMUL(x, w - zw, b - zx * sum(w - zw)){pad_value zx}, sx * sw / sy, zy)
    CONV2D|MATMUL(SUB(x, zx), w)          CONV2D|MATMUL(x, w, -zx * sum(w)){pad_value zx}
                                          (zx computed at run time: MATMUL(x, w) - zx * sum(w))
    op(DQ(q, s, z))                       DQ(op(q), s, z) for an op that moves values or takes a max
    QUANTIZE(DQ(q, s, z), s, z)           q
    ADD(DQ(b, s, z), t)                   DQ(b, s, z, t)
    DQ(a constant)                        its f32 value, where no integer op took the integers

w, b, the scales and the zero points are constants (w's and s's per output channel or one for
all; x's and y's one for all). The sums are the same integers: (x - zx)(w - zw) over a window
whose padding holds zx (the real 0) is x (w - zw) over it, less zx times the window's sum of
w - zw, a constant per output channel folded into the bias here. The multiplier is onnxruntime's
(x_scale * w_scale / y_scale in f32) and REQUANTIZE rounds as it does, so the results are its
integers. A bias whose scale is not x_scale * w_scale, a B that is no constant, a scale per
channel of the activations: the pattern stays float, computed as written (DEQUANTIZE, the float
op, QUANTIZE), never wrong, only slower.

An op DQ sinks below (a TRANSPOSE, RESHAPE, SLICE, MAXPOOL2D: one per-tensor scale > 0 keeps
every value's place and order; of constants, computed here) then meets the QUANTIZE after it, and a pair with equal parameters is
the identity: a quantized max pool or flatten runs on the integers. ADD of two dequantized
tensors is a QDQ model's float Add as onnxruntime runs it, one DEQUANTIZE reading the other's
result: one kernel, 1 byte in and out. The last rule folds the DEQUANTIZE of weights no integer op took (a bias of
another scale, a float op between Q and DQ) into float constants, as the model's own float
computation of them.
"""

from __future__ import annotations

import numpy as np

from dfx import Op, is_integer, lookup, narrowest_integer, numpy_dtype
from dfx.ops.window import weight_layout

from .rewrite import Match, Pat, Rule

# values a DEQUANTIZE of one scale and zero point commutes with: each result element is one operand
# element (moved), or the largest of several (a positive scale keeps their order)
MOVES = frozenset({"TRANSPOSE", "RESHAPE", "MAXPOOL2D", "SLICE"})


def _constant(m: Match, tensor: str) -> np.ndarray | None:
    """A graph constant's values, or None."""
    t = m.graph.tensors[tensor]
    return m.graph.constant_values(tensor) if t.role == "constant" else None


def _scalar(m: Match, tensor: str) -> float | None:
    """A constant holding one value, that value; else None."""
    values = _constant(m, tensor)
    return None if values is None or values.size != 1 else values.reshape(-1)[0].item()


def _dequantized(m: Match, tensor: str) -> tuple[str, str, str] | None:
    """(q, scale, zero point) of a DEQUANTIZE (no addend) computing `tensor`, else None."""
    op = m.computing(tensor)
    if op is None or op.op_type != "DEQUANTIZE" or len(op.inputs) != 3:
        return None
    return op.inputs[0], op.inputs[1], op.inputs[2]


def _per_channel(values: np.ndarray, channels: int, axis: int = 0, rank: int = 1) -> np.ndarray | None:
    """One value per output channel from a constant holding one for all, or one for each along
    `axis` of a tensor of `rank` dims (as it broadcasts against it); None otherwise."""
    if values.size == 1:
        return np.broadcast_to(values.reshape(-1), (channels,))
    aligned = (1,) * (rank - values.ndim) + values.shape
    if len(aligned) != rank or aligned[axis] != channels or values.size != channels:
        return None
    return values.reshape(-1)


def _output_channels(op: Op, attrs: dict, weights: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """The axis of a constant operand's output channels (O of a convolution's weights, N of a
    MATMUL's 2-D B) and the axes a sum over each channel's weights runs along; None for a B of
    another rank."""
    if op.op_type == "CONV2D":
        out_axis = weight_layout(attrs).index("O")
    elif weights.ndim == 2:
        out_axis = 0 if attrs["transpose_b"] else 1
    else:
        return None
    return out_axis, tuple(k for k in range(weights.ndim) if k != out_axis)


def _zero_point_folded(op: Op, bias: np.ndarray, weight_sums: np.ndarray, zero_x: int) -> tuple[np.ndarray, dict]:
    """The sums of (x - zx) w as those of x w: the bias less zx times each output channel's weight
    sum, and a convolution's padding holding zx (the real 0 it stands for)."""
    return bias - zero_x * weight_sums, ({"pad_value": zero_x} if op.op_type == "CONV2D" else {})


def _fits_int32(x_dtype: str, weights: np.ndarray, reduced: tuple[int, ...], bias: np.ndarray) -> bool:
    """Every sum of x times the weights over a window, plus the bias, stays inside int32 whatever
    values of its dtype x holds (an i16 x over a long K may not: the integer form would wrap)."""
    info = np.iinfo(numpy_dtype(x_dtype))
    largest = max(-int(info.min), int(info.max))
    worst = largest * np.abs(weights.astype(np.int64)).sum(axis=reduced) + np.abs(bias.astype(np.int64))
    return bool(worst.max(initial=0) < 2**31) and narrowest_integer(weights) is not None


def _integer_contraction(m: Match) -> Op | None:
    op, attrs = m.producer("y"), m.attrs("y")
    x_parts, w_parts = _dequantized(m, op.inputs[0]), _dequantized(m, op.inputs[1])
    if x_parts is None or w_parts is None:
        return None
    (x, sx, zx), (w, sw, zw) = x_parts, w_parts
    scale_x, zero_x, scale_y = (_scalar(m, t) for t in (sx, zx, m["sy"]))
    w_q, w_scale, w_zero = (_constant(m, t) for t in (w, sw, zw))
    if any(v is None for v in (scale_x, zero_x, scale_y, _scalar(m, m["zy"]), w_q, w_scale, w_zero)) \
            or not is_integer(m.graph.tensors[x].dtype):
        return None
    axes = _output_channels(op, attrs, w_q)
    if axes is None:
        return None
    out_axis, reduced = axes
    channels = w_q.shape[out_axis]
    # per channel along the output channels alone: a scale along another axis is no requantize's
    w_scale, w_zero = (_per_channel(v, channels, out_axis, w_q.ndim) for v in (w_scale, w_zero))
    if w_scale is None or w_zero is None:
        return None
    weights = w_q.astype(np.int64) - w_zero.astype(np.int64).reshape([-1 if k == out_axis else 1
                                                                      for k in range(w_q.ndim)])
    # onnxruntime's requantize scale, in f32 as it computes it
    product = np.float32(scale_x) * w_scale.astype(np.float32)
    bias = np.zeros(channels, np.int64)
    if len(op.inputs) == 3:  # an int32 bias of scale x_scale * w_scale (onnxruntime takes its integers)
        b_parts = _dequantized(m, op.inputs[2])
        b_q, b_scale, b_zero = (None, None, None) if b_parts is None else (_constant(m, t) for t in b_parts)
        if b_q is None or b_scale is None or b_zero is None or np.any(b_zero != 0) \
                or _per_channel(b_q, channels) is None or _per_channel(b_scale, channels) is None \
                or not np.allclose(_per_channel(b_scale, channels), product, rtol=1e-6, atol=0):
            return None
        bias = _per_channel(b_q, channels).astype(np.int64)
    bias, extra = _zero_point_folded(op, bias, weights.sum(axis=reduced), int(zero_x))
    if not _fits_int32(m.graph.tensors[x].dtype, weights, reduced, bias):
        return None
    rank = len(m.shape("y"))
    result_axis = (1 if attrs["layout"] == "NCHW" else rank - 1) if op.op_type == "CONV2D" else rank - 1
    multiplier = (product / np.float32(scale_y)).astype(np.float32)
    multiplier = multiplier.reshape([channels] + [1] * (rank - 1 - result_axis)) if channels > 1 else \
        multiplier.reshape(())
    sums = m.op("integer", op.op_type, x, m.constant("integer_weights", weights, narrowest_integer(weights)),
                m.constant("integer_bias", bias, "i32"), result_dtype="i32", **{**op.attrs, **extra})
    return m.replace("REQUANTIZE", sums, m.constant("multiplier", multiplier, "f32"), m["zy"], dtype=m.dtype("zy"))


def _offset_folded(m: Match) -> Op | None:
    """CONV2D|MATMUL(SUB(x, zx), w) with constant w: the integer sums of the x as it is, less zx
    times each output channel's weight sum. A constant zx folds into the bias (and a convolution's
    padding); one computed at run time (DynamicQuantizeLinear's) into a MATMUL's epilogue."""
    op, attrs = m.root, m.attrs("root")
    x, w = m["x"], m["w"]
    zero_x, weights = _scalar(m, m["zx"]), _constant(m, w)
    if weights is None or not all(is_integer(m.dtype(t)) for t in ("x", "w", "zx")) \
            or m.dtype("root") != "i32" or m.shape("zx") not in ((), (1,)) or attrs.get("pad_value", 0) != 0:
        return None
    axes = _output_channels(op, attrs, weights)
    bias = _constant(m, m["b"]) if "b" in m else np.zeros(1, np.int64)
    if axes is None or bias is None:
        return None
    weight_sums = weights.astype(np.int64).sum(axis=axes[1])
    if zero_x is None:  # known at run time: x w - zx sum(w), the product an epilogue operand of the sums
        if op.op_type != "MATMUL":
            return None
        correction = m.op("offset", "MUL", m["zx"], m.constant("weight_sums", weight_sums, "i32"), result_dtype="i32")
        sums = m.op("integer", "MATMUL", x, w, *([m["b"]] if "b" in m else []), result_dtype="i32", **op.attrs)
        return m.replace("SUB", sums, correction)
    bias, extra = _zero_point_folded(op, bias.astype(np.int64).reshape(-1), weight_sums, int(zero_x))
    if not _fits_int32(m.dtype("x"), weights, axes[1], bias):
        return None
    return m.replace(op.op_type, x, w, m.constant("offset_bias", bias, "i32"), **{**op.attrs, **extra})


def _sunk(m: Match) -> Op | None:
    """op(DQ(q, s, z)) -> DQ(op(q), s, z), for one scale > 0 and one zero point."""
    q, s, z = m["q"], m["s"], m["z"]
    scale = _scalar(m, s)
    if scale is None or scale <= 0 or _scalar(m, z) is None:
        return None
    values = _constant(m, q)
    if values is not None:  # weights behind a layout op: moved here, so the integer rules see a constant
        opdef = lookup(m.root.op_type)
        (moved_values,) = opdef.reference([values], opdef.normalize_attrs(m.root.attrs), [m.dtype("q")])
        moved = m.constant("integers", moved_values, m.dtype("q"))
    else:
        moved = m.op("integers", m.root.op_type, q, **m.root.attrs)
    return m.replace("DEQUANTIZE", moved, s, z)


def _identity(m: Match) -> str | None:
    """QUANTIZE(DQ(q, s, z), s', z') with s' = s, z' = z and q's dtype: q itself."""
    same = all(_scalar(m, m[a]) is not None and _scalar(m, m[a]) == _scalar(m, m[b]) for a, b in (("s", "s2"), ("z", "z2")))
    return m["q"] if same and m.dtype("q") == m.dtype("root") else None


def _with_addend(m: Match) -> Op | None:
    """ADD(DQ(b, s, z), t) -> DQ(b, s, z, t). A t that is itself a DQ is made again right ahead
    of it, so fusion meets the two in a row (one kernel reading both operands' integers); the
    DQ made earlier goes once nothing else reads it."""
    if m.dtype("t") != m.dtype("root"):
        return None
    t = m["t"]
    parts = _dequantized(m, t)
    if parts is not None:
        t = m.op("addend", "DEQUANTIZE", *parts, result_dtype=m.dtype("t"))
    return m.replace("DEQUANTIZE", m["q"], m["s"], m["z"], t)


def _folded(m: Match) -> str | None:
    """DEQUANTIZE of constants: its value, computed here by the registry's reference."""
    values = [_constant(m, t) for t in m.root.inputs]
    if any(v is None for v in values):
        return None
    arrays = [v.astype(numpy_dtype(m.graph.tensors[t].dtype)) for v, t in zip(values, m.root.inputs)]
    (value,) = lookup("DEQUANTIZE").reference(arrays, {}, [m.dtype("root")])
    return m.constant("dequantized", value, m.dtype("root"))


_q = Pat(name="q")
_s = Pat(name="s")
_z = Pat(name="z")

QUANTIZE: list[Rule] = [
    # QUANTIZE(conv|matmul(DQ(x), DQ(w), DQ(b))) -> REQUANTIZE(integer conv|matmul(x, w - zw, b'))
    (Pat("QUANTIZE", Pat(frozenset({"CONV2D", "MATMUL"}), name="y"), Pat(name="sy"), Pat(name="zy")),
     _integer_contraction),
    # conv|matmul(SUB(x, zx), w) -> conv|matmul(x, w, -zx sum(w)){pad_value zx}
    (Pat(frozenset({"CONV2D", "MATMUL"}), Pat("SUB", Pat(name="x"), Pat(name="zx")), Pat(name="w"), name="root"),
     _offset_folded),
    (Pat(frozenset({"CONV2D", "MATMUL"}), Pat("SUB", Pat(name="x"), Pat(name="zx")), Pat(name="w"), Pat(name="b"),
         name="root"), _offset_folded),  # (with a bias)
    # op(DQ(q)) -> DQ(op(q)) for an op moving values or taking their max
    (Pat(MOVES, Pat("DEQUANTIZE", _q, _s, _z)), _sunk),
    # QUANTIZE(DQ(q, s, z), s, z) -> q
    (Pat("QUANTIZE", Pat("DEQUANTIZE", _q, _s, _z), Pat(name="s2"), Pat(name="z2"), name="root"), _identity),
    # ADD(DQ(b), t) -> DQ(b, t): the float Add of a QDQ model, one kernel
    (Pat("ADD", Pat("DEQUANTIZE", _q, _s, _z), Pat(name="t"), name="root"), _with_addend),
]

# after QUANTIZE: DQ(a constant) -> its float value
FOLD_DEQUANTIZED: list[Rule] = [(Pat("DEQUANTIZE", name="root"), _folded)]
