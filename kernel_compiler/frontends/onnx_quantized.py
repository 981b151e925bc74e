"""The ONNX frontend's quantized ops, as onnxruntime's quantization tool writes them: QDQ
(QuantizeLinear, DequantizeLinear around float ops), QOperator (QLinearConv, QLinearMatMul, and
the com.microsoft QGemm, QLinearAdd, QLinearMul, QLinearSigmoid, QLinearConcat,
QLinearGlobalAveragePool, QLinearAveragePool) and dynamic quantization
(DynamicQuantizeLinear, MatMulInteger, ConvInteger).

A QOperator op is mapped as its definition: DEQUANTIZE its operands, the float op, QUANTIZE its
result. The QUANTIZE pass (kernel_compiler/passes/quantize.py) then turns each
DEQUANTIZE -> op -> QUANTIZE into the integer op with a REQUANTIZE epilogue, for QDQ and
QOperator models alike. A scale or zero point given per channel (1-D, along `axis`) is reshaped
to broadcast against its tensor. Parameters known at compile time are checked here: a scale must
be positive and finite, a zero point inside its integer type, an axis inside the tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from dfx import is_integer, narrowest_integer, numpy_dtype

from .onnx_ops import convolve, pool_of

if TYPE_CHECKING:
    from .onnx import Node

MICROSOFT = "com.microsoft"
QUANTIZED_TYPES = ("i8", "u8", "i16")  # what a QUANTIZE may make


# ---- scales and zero points ------------------------------------------------------------------


def _along(n: Node, param: str, rank: int, axis: int) -> str:
    """A per-channel parameter [C] shaped to broadcast along `axis` of a tensor of `rank` dims."""
    size = int(np.prod(n.shape(param)))
    return n.reshape(param, (size, *[1] * (rank - 1 - axis))) if axis < rank - 1 else param


def _parameters(n: Node, tensor: str, scale_input: int, zero_input: int, quantized: str,
                axis: int | None = None) -> tuple[str, str]:
    """The scale and zero point (inputs `scale_input`, `zero_input`: an absent zero point is 0) of
    `tensor`, whose quantized type is `quantized`, shaped to broadcast against it: one per tensor,
    or one per channel along `axis` (the node's attribute, default 1, where None)."""
    scale = n.x(scale_input)
    zero = n.x(zero_input) if n.has(zero_input) else n.constant(np.zeros((), numpy_dtype(quantized)), quantized, "zero")
    shape = n.shape(tensor)
    what = f"'{n.proto.input[scale_input]}'"
    for name in (scale, zero):
        if len(n.shape(name)) > 1:
            raise n.fail(f"its scale and zero point must be scalars or 1-D, got {what} of shape {list(n.shape(name))}")
    _check_values(n, scale_input, zero_input, quantized)
    sizes = {int(np.prod(n.shape(name))) for name in (scale, zero)}
    if sizes == {1}:  # one per tensor
        return tuple(name if n.shape(name) == () else n.reshape(name, ()) for name in (scale, zero))
    rank = len(shape)
    axis = n.int_attr("axis", 1) if axis is None else axis
    if not -rank <= axis < rank:
        raise n.fail(f"axis {axis} is outside the {rank} dims of '{tensor}'")
    axis %= rank
    if not sizes <= {1, shape[axis]}:
        raise n.fail(f"per-channel scale {what} has {max(sizes)} values, but '{tensor}' has {shape[axis]} along "
                     f"axis {axis}")
    return _along(n, scale, rank, axis), _along(n, zero, rank, axis)


def _check_values(n: Node, scale_input: int, zero_input: int, quantized: str) -> None:
    """A scale known here must be positive and finite; a zero point known here must lie in the
    range of `quantized`, and be of that type, as ONNX has it."""
    scale_value = n.value(scale_input)
    if scale_value is not None and not (np.all(np.isfinite(scale_value)) and np.all(scale_value > 0)):
        bad = scale_value.reshape(-1)[~(np.isfinite(scale_value) & (scale_value > 0)).reshape(-1)][0]
        raise n.fail(f"scale '{n.proto.input[scale_input]}' holds {bad:.6g}: a scale must be positive and finite")
    if not n.has(zero_input):
        return
    zero_value, name = n.value(zero_input), n.proto.input[zero_input]
    if zero_value is not None:
        info = np.iinfo(numpy_dtype(quantized))
        outside = zero_value.reshape(-1)[(zero_value.reshape(-1) < info.min) | (zero_value.reshape(-1) > info.max)]
        if outside.size:
            raise n.fail(f"zero point '{name}' holds {outside[0]}, outside {quantized}'s range [{info.min}, {info.max}]")
    if n.input_dtype(zero_input) != quantized:
        raise n.fail(f"zero point '{name}' is {n.input_dtype(zero_input)}, but the tensor it goes with is {quantized}")


def _quantized_type(n: Node, zero_input: int, default: str = "u8") -> str:
    """The quantized type: its zero point's, else the node's result's (QuantizeLinear's
    output_dtype), else `default`."""
    dtype = n.input_dtype(zero_input) if n.has(zero_input) else n.out_dtype(0) or default
    if dtype not in QUANTIZED_TYPES:
        raise n.fail(f"quantizes to {dtype}: the KPU's quantized types are int8, uint8 and int16")
    return dtype


def _dequantized(n: Node, q: int, scale: int, zero: int, axis: int | None = None) -> str:
    """Input `q` dequantized by its scale and zero point inputs, as f32."""
    tensor = n.x(q)
    scale_name, zero_name = _parameters(n, tensor, scale, zero, n.input_dtype(tensor), axis)
    return n.emit("DEQUANTIZE", [tensor, scale_name, zero_name], result_dtype=n.input_dtype(scale_name))


def _quantize_result(n: Node, y: str, scale: int, zero: int, like: int | None = None) -> None:
    """Output 0: float `y` quantized by the scale and zero point inputs (without a zero point, into
    input `like`'s type where given, as the com.microsoft ops do)."""
    dtype = _quantized_type(n, zero, n.input_dtype(like) if like is not None else "u8")
    scale_name, zero_name = _parameters(n, y, scale, zero, dtype)
    n.emit("QUANTIZE", [y, scale_name, zero_name], out=0, result_dtype=dtype, dtype=dtype)


def _product_scale(n: Node, a: int, b: int) -> str:
    """The scale of an int32 bias: input a's scale times input b's (one per channel where b has them)."""
    sa, sb = n.value(a), n.value(b)
    if sa is not None and sb is not None:
        product = (sa.astype(np.float32) * sb.astype(np.float32)).reshape(-1)
        return n.known(product.reshape(()) if product.size == 1 else product, "bias_scale")
    return n.emit("MUL", [n.x(a), n.x(b)])


def _bias(n: Node, i: int, scale: str) -> str:
    """Input i, an int32 bias, dequantized by `scale` (zero point 0)."""
    zero = n.constant(np.zeros((), np.int32), "i32", "bias_zero")
    return n.emit("DEQUANTIZE", [n.x(i), scale, zero], result_dtype="f32")


# ---- QDQ ---------------------------------------------------------------------------------------


def quantize_linear(n: Node) -> None:
    dtype = _quantized_type(n, 2)
    if n.int_attr("block_size", 0):
        _in_blocks(n, "QUANTIZE", dtype, dtype=dtype)
        return
    scale, zero = _parameters(n, n.x(0), 1, 2, dtype)
    n.emit("QUANTIZE", [n.x(0), scale, zero], out=0, dtype=dtype)


def dequantize_linear(n: Node) -> None:
    if not is_integer(n.input_dtype(0)):
        raise n.fail(f"dequantizes a float tensor (held as {n.input_dtype(0)}): the KPU's quantized types are "
                     "integers; float8 and float4 quantization is not supported")
    if n.int_attr("block_size", 0):
        _in_blocks(n, "DEQUANTIZE", n.input_dtype(0))
        return
    scale, zero = _parameters(n, n.x(0), 1, 2, n.input_dtype(0))
    n.emit("DEQUANTIZE", [n.x(0), scale, zero], out=0)


def _in_blocks(n: Node, op_type: str, quantized: str, **attrs) -> None:
    """Blocked quantization: a scale (and zero point) per `block_size` elements along `axis`.
    The tensor as [..., blocks, block_size, ...] and its parameters as [..., blocks, 1, ...]
    broadcast, block by block; the result reshaped back."""
    x, shape, block = n.x(0), list(n.shape(0)), n.int_attr("block_size")
    axis = n.int_attr("axis", 1)
    if not -len(shape) <= axis < len(shape) or block < 0:
        raise n.fail(f"axis {axis} or block_size {block} does not fit the {len(shape)} dims of '{x}'")
    axis %= len(shape)
    _check_values(n, 1, 2, quantized)
    blocks = shape[:axis] + [shape[axis] // block] + shape[axis + 1:]
    if shape[axis] % block or list(n.shape(1)) != blocks or (n.has(2) and list(n.shape(2)) != blocks):
        raise n.fail(f"a scale of shape {list(n.shape(1))} does not give blocks of {block} of '{x}' {shape} along "
                     f"axis {axis} (the blocks must divide it)")
    split = shape[:axis] + [blocks[axis], block] + shape[axis + 1:]
    held = blocks[:axis] + [blocks[axis], 1] + blocks[axis + 1:]
    zero = n.x(2) if n.has(2) else n.constant(np.zeros(blocks, numpy_dtype(quantized)), quantized, "zero")
    y = n.emit(op_type, [n.reshape(x, split), n.reshape(n.x(1), held), n.reshape(zero, held)],
               result_dtype=quantized if op_type == "QUANTIZE" else n.input_dtype(1), **attrs)
    n.reshape(y, shape, out=0)


def dynamic_quantize_linear(n: Node) -> None:
    """x to uint8 with a scale and zero point from its own range, extended to hold 0: as
    onnxruntime computes them, scale = (max - min) / 255 (1 for a range of 0), zero point =
    round(-min / scale) saturated; then x quantized by them."""
    x, f = n.x(0), n.input_dtype(0)

    def whole(kind: str, bound: str) -> str:
        extreme = n.emit(f"REDUCE_{kind}", [x], axes=None, keepdims=True, result_dtype=f)
        return n.emit(bound, [n.reshape(extreme, ()), n.scalar(0.0, x)], result_dtype=f)

    high, low = whole("MAX", "MAXIMUM"), whole("MIN", "MINIMUM")
    spread = n.emit("SUB", [high, low], result_dtype=f)
    step = n.emit("DIV", [spread, n.scalar(255.0, x)], result_dtype=f)
    flat = n.emit("EQUAL", [spread, n.scalar(0.0, x)])
    scale = n.emit("SELECT", [flat, n.scalar(1.0, x), step], out=1 if n.out(1) else None, result_dtype=f)
    zero = n.emit("QUANTIZE", [n.emit("NEGATE", [low], result_dtype=f), scale, n.constant(np.uint8(0), "u8", "zero")],
                  out=2 if n.out(2) else None, result_dtype="u8", dtype="u8")
    n.emit("QUANTIZE", [x, scale, zero], out=0, result_dtype="u8", dtype="u8")


# ---- integer ops --------------------------------------------------------------------------------


def _offset(n: Node, i: int, zero: int, axis: int | None) -> str:
    """Input i minus its zero point (input `zero`, absent: none), as integers: per channel along
    `axis`. Of constants, computed here in the narrowest type that holds it (weights stay 1 byte)."""
    x = n.x(i)
    if not n.has(zero) or (n.value(zero) is not None and not n.value(zero).any()):
        return x
    z = n.x(zero)
    if int(np.prod(n.shape(z))) > 1:
        if axis is None:
            raise n.fail(f"zero point '{n.proto.input[zero]}' must be a scalar, got shape {list(n.shape(z))}")
        z = _along(n, z, n.rank(i), axis)
    x_value, z_value = n.value(x), n.value(z)
    if x_value is not None and z_value is not None:
        offset = x_value.astype(np.int64) - z_value.astype(np.int64)
        return n.known(offset.astype(numpy_dtype(narrowest_integer(offset))), "offset")
    return n.emit("SUB", [x, z], result_dtype="i32")


def matmul_integer(n: Node) -> None:
    """(A - a_zero_point) @ (B - b_zero_point) in int32; a's zero point per row, b's per column."""
    if n.rank(0) < 2 or n.rank(1) < 2:
        raise n.fail("MatMulInteger operands of rank 1 are not supported")
    a, b = _offset(n, 0, 2, n.rank(0) - 2), _offset(n, 1, 3, n.rank(1) - 1)
    n.emit("MATMUL", [a, b], out=0, result_dtype="i32")


def conv_integer(n: Node) -> None:
    """conv(x - x_zero_point, w - w_zero_point) in int32, w's zero point per output channel."""
    convolve(n, _offset(n, 0, 2, None), _offset(n, 1, 3, 0), None, out=0, result_dtype="i32")


# ---- QOperator ------------------------------------------------------------------------------------


def qlinear_conv(n: Node) -> None:
    # x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B
    x, w = _dequantized(n, 0, 1, 2), _dequantized(n, 3, 4, 5, axis=0)
    bias = _bias(n, 8, _product_scale(n, 1, 4)) if n.has(8) else None
    _quantize_result(n, convolve(n, x, w, bias, out=None, result_dtype="f32"), 6, 7)


def qlinear_matmul(n: Node) -> None:
    # a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point
    if n.rank(0) < 2 or n.rank(3) < 2:
        raise n.fail("QLinearMatMul operands of rank 1 are not supported")
    a, b = _dequantized(n, 0, 1, 2, axis=n.rank(0) - 2), _dequantized(n, 3, 4, 5, axis=n.rank(3) - 1)
    _quantize_result(n, n.emit("MATMUL", [a, b], result_dtype="f32"), 6, 7)


def qgemm(n: Node) -> None:
    """com.microsoft QGemm: alpha * (A' @ B' + C), C an int32 bias of scale a_scale * b_scale;
    quantized by y_scale and y_zero_point where given, else the float result."""
    # A, a_scale, a_zero_point, B, b_scale, b_zero_point, C, y_scale, y_zero_point
    if n.rank(0) != 2 or n.rank(3) != 2:
        raise n.fail(f"QGemm takes 2-D A and B, got {list(n.shape(0))} and {list(n.shape(3))}")
    transpose_b = bool(n.int_attr("transB", 0))
    a = _dequantized(n, 0, 1, 2)
    b = _dequantized(n, 3, 4, 5, axis=0 if transpose_b else 1)
    if n.int_attr("transA", 0):
        a = n.transpose(a, [1, 0])
    alpha = n.float_attr("alpha", 1.0)
    bias = [_bias(n, 6, _product_scale(n, 1, 4))] if n.has(6) else []
    attrs = {"transpose_b": True} if transpose_b else {}
    quantized = n.has(7)
    out = None if quantized else 0
    y = n.emit("MATMUL", [a, b, *bias], result_dtype="f32", out=out if alpha == 1 else None, **attrs)
    if alpha != 1:
        y = n.emit("MUL", [y, n.scalar(alpha, y)], result_dtype="f32", out=out)
    if quantized:
        _quantize_result(n, y, 7, 8)


def qlinear_add(n: Node) -> None:
    """Operands of one shape and parameters known here: QUANTIZED_ADD, onnxruntime's kernel;
    else its definition, DEQUANTIZE both, ADD, QUANTIZE."""
    # A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point
    parameters = [n.value(i) for i in (1, 2, 4, 5, 6, 7)]
    if n.shape(0) == n.shape(3) and all(p is not None and p.size == 1 for p in parameters):
        dtype = _quantized_type(n, 7, n.input_dtype(0))
        for scale, zero, quantized in ((1, 2, n.input_dtype(0)), (4, 5, n.input_dtype(3)), (6, 7, dtype)):
            _check_values(n, scale, zero, quantized)
        (sa, za, sb, zb, sc, zc) = (p.reshape(-1)[0].item() for p in parameters)
        n.emit("QUANTIZED_ADD", [n.x(0), n.x(3)], out=0, a_quantization=[sa, za], b_quantization=[sb, zb],
               quantization=[sc, zc], dtype=dtype)
        return
    total = n.emit("ADD", [_dequantized(n, 0, 1, 2), _dequantized(n, 3, 4, 5)], result_dtype="f32")
    _quantize_result(n, total, 6, 7, like=0)


def _per_tensor(n: Node, *inputs: int) -> None:
    """The com.microsoft element-wise ops take one scale and zero point per tensor, as onnxruntime
    requires; a per-channel one has no axis to go along."""
    for i in inputs:
        if n.has(i) and int(np.prod(n.shape(i))) != 1:
            raise n.fail(f"its scales and zero points must be scalars, got '{n.proto.input[i]}' of shape "
                         f"{list(n.shape(i))}")


def qlinear_mul(n: Node) -> None:
    """With parameters known here as onnxruntime's kernel computes it: (A - A_zero_point)
    (B - B_zero_point) in integers, times A_scale B_scale / C_scale in f32, plus C_zero_point,
    rounded (the product of the dequantized operands rounds otherwise in about 1 element of 300);
    else its definition."""
    # A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point
    _per_tensor(n, 1, 2, 4, 5, 6, 7)
    dtype = _quantized_type(n, 7, n.input_dtype(0))
    parameters = [n.value(i) if n.has(i) else np.zeros(1) for i in (1, 2, 4, 5, 6, 7)]
    if any(p is None for p in parameters):
        _quantize_result(n, n.emit("MUL", [_dequantized(n, 0, 1, 2), _dequantized(n, 3, 4, 5)], result_dtype="f32"),
                         6, 7, like=0)
        return
    for scale, zero, quantized in ((1, 2, n.input_dtype(0)), (4, 5, n.input_dtype(3)), (6, 7, dtype)):
        _check_values(n, scale, zero, quantized)
    sa, za, sb, zb, sc, zc = (p.reshape(-1)[0].item() for p in parameters)

    def centred(x: int, zero: int) -> str:
        wide = n.emit("CAST", [n.x(x)], result_dtype="i32", dtype="i32")
        return n.emit("SUB", [wide, n.constant(np.int32(zero), "i32", "zero")], result_dtype="i32") if zero else wide

    product = n.emit("CAST", [n.emit("MUL", [centred(0, za), centred(3, zb)], result_dtype="i32")], result_dtype="f32",
                     dtype="f32")  # exact: |product| <= 2^16
    multiplier = n.constant(np.float32(np.float32(sa) * np.float32(sb)) / np.float32(sc), "f32", "multiplier")
    _rounded_with_zero_point(n, n.emit("MUL", [product, multiplier], result_dtype="f32"), zc, dtype)


def _rounded_with_zero_point(n: Node, steps: str, zero_point: float, dtype: str) -> None:
    """Output 0: f32 `steps` plus the zero point, then rounded into `dtype`, as onnxruntime's
    kernels of the com.microsoft ops do (a tie rounds to even after the zero point is added)."""
    shifted = n.emit("ADD", [steps, n.constant(np.float32(zero_point), "f32", "zero")], result_dtype="f32")
    n.emit("QUANTIZE", [shifted, n.constant(np.float32(1), "f32", "one"),
                        n.constant(np.zeros((), numpy_dtype(dtype)), dtype, "zero")],
           out=0, result_dtype=dtype, dtype=dtype)


def qlinear_sigmoid(n: Node) -> None:
    # X, X_scale, X_zero_point, Y_scale, Y_zero_point
    _per_tensor(n, 1, 2, 3, 4)
    _quantize_result(n, n.emit("SIGMOID", [_dequantized(n, 0, 1, 2)], result_dtype="f32"), 3, 4, like=0)


def qlinear_concat(n: Node) -> None:
    # Y_scale, Y_zero_point, then X, X_scale, X_zero_point of each input
    axis = n.int_attr("axis")
    if axis is None:
        raise n.fail("has no axis")
    if len(n.proto.input) < 5 or (len(n.proto.input) - 2) % 3:
        raise n.fail(f"takes Y_scale, Y_zero_point and a (X, X_scale, X_zero_point) triple per input, got "
                     f"{len(n.proto.input)} inputs")
    triples = range(2, len(n.proto.input), 3)
    _per_tensor(n, 0, 1, *(k for i in triples for k in (i + 1, i + 2)))
    parts = [_dequantized(n, i, i + 1, i + 2) for i in triples]
    _quantize_result(n, n.emit("CONCAT", parts, axis=axis), 0, 1, like=2)


def qlinear_global_average_pool(n: Node) -> None:
    # X, x_scale, x_zero_point, y_scale, y_zero_point
    if n.int_attr("channels_last", 0):
        raise n.fail("channels_last 1 is not supported")
    x = _dequantized(n, 0, 1, 2)
    if n.rank(0) < 3:
        raise n.fail(f"QLinearGlobalAveragePool takes [N, C, spatial...], got {list(n.shape(0))}")
    mean = n.emit("REDUCE_MEAN", [x], axes=list(range(2, n.rank(0))), keepdims=True, result_dtype="f32")
    _quantize_result(n, mean, 3, 4, like=0)


def qlinear_average_pool(n: Node) -> None:
    """With parameters known here as onnxruntime's kernel computes it: the mean of the dequantized
    window in f32, divided by Y_scale, plus Y_zero_point, rounded (a tie rounds to even after the
    zero point is added); else its definition."""
    # X, x_scale, x_zero_point, y_scale, y_zero_point
    if n.int_attr("channels_last", 0):
        raise n.fail("channels_last 1 is not supported")
    if n.ints_attr("dilations") is not None:
        raise n.fail("has dilations, which QLinearAveragePool does not define")
    _per_tensor(n, 1, 2, 3, 4)
    if n.has(4) and n.input_dtype(4) != n.input_dtype(0):
        raise n.fail(f"its y_zero_point is {n.input_dtype(4)}, its x {n.input_dtype(0)}: both of one type")
    mean = pool_of(n, _dequantized(n, 0, 1, 2), "average", out=None, result_dtype="f32")
    dtype = _quantized_type(n, 4, n.input_dtype(0))
    scale, zero = n.value(3), n.value(4) if n.has(4) else np.zeros(1)
    if scale is None or zero is None:
        _quantize_result(n, mean, 3, 4, like=0)
        return
    _check_values(n, 3, 4, dtype)
    steps = n.emit("DIV", [mean, n.constant(scale.astype(np.float32).reshape(()), "f32", "scale")], result_dtype="f32")
    _rounded_with_zero_point(n, steps, zero.reshape(-1)[0].item(), dtype)


# ONNX op type -> its mapping (the default domain)
QUANTIZED_OPS: dict[str, Callable[[Node], None]] = {
    "QuantizeLinear": quantize_linear, "DequantizeLinear": dequantize_linear,
    "DynamicQuantizeLinear": dynamic_quantize_linear, "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer, "QLinearConv": qlinear_conv, "QLinearMatMul": qlinear_matmul,
}

# com.microsoft op type -> its mapping: the contrib ops onnxruntime's quantization tool writes
MICROSOFT_OPS: dict[str, Callable[[Node], None]] = {
    "QGemm": qgemm, "QLinearAdd": qlinear_add, "QLinearGlobalAveragePool": qlinear_global_average_pool,
    "QLinearMul": qlinear_mul, "QLinearSigmoid": qlinear_sigmoid, "QLinearConcat": qlinear_concat,
    "QLinearAveragePool": qlinear_average_pool,
}
