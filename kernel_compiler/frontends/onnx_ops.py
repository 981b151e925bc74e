"""The ONNX frontend's op table: each ONNX op type, by one small function, as registry ops.

A function gets the node (onnx.Node: its inputs, attributes and `emit`) and emits the registry
ops that compute its outputs; what an op computes is the registry's (dfx/ops/), never restated
here. Attributes read at their ONNX defaults, by the node's opset where they moved (axes as an
attribute before opset 13 or 18, as an input after). Spatial ops take 1-D (a height of 1 put in
front) and 2-D images; ONNX's NCHW convolution is CONV2D's `layout: NCHW` (the CONVOLUTION pass
makes it NHWC), while the pools, NHWC-only in the registry, get a TRANSPOSE on either side.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .dilated import dilated_input

if TYPE_CHECKING:
    from .onnx import Node

NCHW_TO_NHWC = [0, 2, 3, 1]
NHWC_TO_NCHW = [0, 3, 1, 2]
F8_MAX = 448.0  # float8 e4m3fn's largest finite value: where a saturating Cast stops


# ---- maps ------------------------------------------------------------------------------------


def _unary(op: str, **attrs) -> Callable[[Node], None]:
    return lambda n: n.emit(op, [n.x(0)], out=0, **attrs)


def _binary(op: str) -> Callable[[Node], None]:
    return lambda n: n.emit(op, [n.x(0), n.x(1)], out=0)


def _identity(n: Node) -> None:
    n.alias(n.x(0))


def dropout(n: Node) -> None:
    """Inference: the output is the input, the mask (where read) all true."""
    if n.has(2) and any(n.ints(2, "training_mode")):
        raise n.fail("training_mode true is not supported (inference only)")
    _identity(n)
    if n.used(1):
        from onnx import TensorProto, helper

        from .onnx import FOLD_LIMIT

        shape, mask = n.shape(0), n.out(1)
        if math.prod(shape) > FOLD_LIMIT:
            raise n.fail(f"its mask of {math.prod(shape):,} elements is more than the {FOLD_LIMIT:,} the ONNX "
                         "frontend keeps")
        n.b.values[mask] = np.ones(shape, helper.tensor_dtype_to_np_dtype(n.b.elem_types.get(mask, TensorProto.BOOL)))


def leaky_relu(n: Node) -> None:
    n.emit("LEAKY_RELU", [n.x(0)], out=0, alpha=n.float_attr("alpha", 0.01))


def gelu(n: Node) -> None:
    # the registry refuses an `approximate` other than its own ("none", "tanh"), naming the node
    n.emit("GELU", [n.x(0)], out=0, approximate=n.str_attr("approximate", "none"))


def _chain(n: Node, op: str, operands: list[str], out: int | None = None) -> str:
    """operands[0] op operands[1] op ..., in operand order; the last op makes result `out`."""
    y = operands[0]
    for i, x in enumerate(operands[1:], start=2):
        y = n.emit(op, [y, x], out=out if i == len(operands) else None)
    return y


def _variadic(op: str) -> Callable[[Node], None]:
    """Min, Max, Sum: a chain of binary ops, in operand order."""

    def variadic(n: Node) -> None:
        operands = [n.x(i) for i in range(len(n.proto.input))]
        if len(operands) == 1:
            _identity(n)
            return
        _chain(n, op, operands, out=0)

    return variadic


def mean(n: Node) -> None:
    """The chain of ADDs (as Sum), times 1/n."""
    operands = [n.x(i) for i in range(len(n.proto.input))]
    if len(operands) == 1:
        _identity(n)
        return
    total = _chain(n, "ADD", operands)
    n.emit("MUL", [total, n.scalar(1 / len(operands), total)], out=0)


def hard_sigmoid(n: Node) -> None:
    n.emit("HARD_SIGMOID", [n.x(0)], out=0, alpha=n.float_attr("alpha", 0.2), beta=n.float_attr("beta", 0.5))


def elu(n: Node) -> None:
    n.emit("ELU", [n.x(0)], out=0, alpha=n.float_attr("alpha", 1.0))


def selu(n: Node) -> None:
    n.emit("SELU", [n.x(0)], out=0, alpha=n.float_attr("alpha", 1.67326319217681884765625),
           gamma=n.float_attr("gamma", 1.05070102214813232421875))


def is_inf(n: Node) -> None:
    n.emit("IS_INF", [n.x(0)], out=0, detect_positive=bool(n.int_attr("detect_positive", 1)),
           detect_negative=bool(n.int_attr("detect_negative", 1)))


def mod(n: Node) -> None:
    n.emit("MOD", [n.x(0), n.x(1)], out=0, fmod=bool(n.int_attr("fmod", 0)))


def clip(n: Node) -> None:
    """min(max(x, min), max): CLAMP where the bounds are constants, else MAXIMUM and MINIMUM."""
    bounds = [(i, name) for i, name in ((1, "min"), (2, "max")) if n.has(i)]
    if not bounds:
        _identity(n)
        return
    values = {name: n.value(i) for i, name in bounds}
    if all(v is not None for v in values.values()):
        for name, v in values.items():
            if v.size != 1:
                raise n.fail(f"its {name} must be a scalar, got shape {list(v.shape)}")
        n.emit("CLAMP", [n.x(0)], out=0, **{name: v.reshape(-1)[0].item() for name, v in values.items()})
        return
    y = n.x(0)
    for k, (i, name) in enumerate(bounds):
        y = n.emit("MAXIMUM" if name == "min" else "MINIMUM", [y, n.x(i)], out=0 if k == len(bounds) - 1 else None)


def where(n: Node) -> None:
    n.emit("SELECT", [n.x(0), n.x(1), n.x(2)], out=0)


def cast(n: Node) -> None:
    from onnx import TensorProto

    to = n.int_attr("to")
    dtype = n.out_dtype(0)
    if to is None or dtype is None:
        raise n.fail("has no target type 'to'")
    x = n.x(0)
    if to == TensorProto.BOOL:  # nonzero (NaN too) is true: 1 - (x == 0)
        is_zero = n.emit("EQUAL", [x, n.scalar(0, x)])
        n.emit("SUB", [n.constant(np.uint8(1), "u8", "one"), is_zero], out=0, result_dtype="u8")
        return
    if dtype == "f8" and n.input_dtype(0) != "f8" and n.int_attr("saturate", 1):
        # saturate: beyond float8's range is its largest value (the registry's CAST gives NaN there)
        x = n.emit("CLAMP", [x], result_dtype=n.input_dtype(0), min=-F8_MAX, max=F8_MAX)
    n.emit("CAST", [x], out=0, dtype=dtype)


# ---- contractions ----------------------------------------------------------------------------


def matmul(n: Node) -> None:
    """numpy.matmul: a 1-D operand is a row (A) or a column (B), removed from the result again."""
    a, b = n.x(0), n.x(1)
    ra, rb = n.rank(0), n.rank(1)
    if ra == 0 or rb == 0:
        raise n.fail("MatMul operands must have rank 1 or more")
    if ra > 1 and rb > 1:
        n.emit("MATMUL", [a, b], out=0)
        return
    if ra == 1:
        a = n.reshape(a, (1, n.shape(0)[0]))
    if rb == 1:
        b = n.reshape(b, (n.shape(1)[0], 1))
    y = n.emit("MATMUL", [a, b])
    shape = list(n.shape(y))
    if rb == 1:
        del shape[-1]
    if ra == 1:
        del shape[-2 if rb > 1 else -1]
    n.reshape(y, shape, out=0)


def gemm(n: Node) -> None:
    """alpha * A' @ B' + beta * C: MATMUL (B' as transpose_b), C as its accumulator when alpha is
    1, else a MUL by alpha and an ADD of C."""
    alpha, beta = n.float_attr("alpha", 1.0), n.float_attr("beta", 1.0)
    a, b = n.x(0), n.x(1)
    if n.rank(0) != 2 or n.rank(1) != 2:
        raise n.fail(f"Gemm takes 2-D A and B, got {list(n.shape(0))} and {list(n.shape(1))}")
    if n.int_attr("transA", 0):
        a = n.transpose(a, [1, 0])
    transpose_b = bool(n.int_attr("transB", 0))
    c = None
    if n.has(2) and beta != 0:
        c = n.x(2)
        if beta != 1:
            known = n.value(2)
            c = (n.constant(known.astype(np.float64) * beta, n.input_dtype(2), "beta_c") if known is not None
                 else n.emit("MUL", [c, n.scalar(beta, c)]))
    attrs = {"transpose_b": True} if transpose_b else {}
    if alpha == 1:
        n.emit("MATMUL", [a, b, *([c] if c else [])], out=0, **attrs)
        return
    y = n.emit("MATMUL", [a, b], **attrs)
    y = n.emit("MUL", [y, n.scalar(alpha, y)], out=None if c else 0)
    if c:
        n.emit("ADD", [y, c], out=0)


# ---- windows ---------------------------------------------------------------------------------


def _spatial(n: Node, kind: str) -> int:
    """The number of spatial dims of input 0: 1 or 2 (3-D and beyond are refused)."""
    rank = n.rank(0)
    if rank not in (3, 4):
        raise n.fail(f"{kind} over {rank - 2} spatial dims is not supported (1-D and 2-D are: input rank 3 or 4)")
    return rank - 2


def _padding(n: Node, sizes: list[int], spans: list[int], strides: list[int]) -> list[list[int]]:
    """[[before, after]] per spatial dim from `pads` ([begins..., ends...]) or `auto_pad`."""
    d = len(sizes)
    auto_pad = n.str_attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        padding = []
        for size, span, stride in zip(sizes, spans, strides):
            total = max(0, (-(-size // stride) - 1) * stride + span - size)
            small, large = total // 2, total - total // 2
            padding.append([small, large] if auto_pad == "SAME_UPPER" else [large, small])
        return padding
    if auto_pad == "VALID":
        return [[0, 0] for _ in range(d)]
    if auto_pad != "NOTSET":
        raise n.fail(f"auto_pad {auto_pad!r:.40} is not NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    pads = n.ints_attr("pads", [0] * 2 * d)
    if len(pads) != 2 * d or min(pads) < 0:
        raise n.fail(f"pads {pads} is not {2 * d} non-negative numbers")
    return [[pads[i], pads[i + d]] for i in range(d)]


def _per_dim(n: Node, name: str, d: int, default: int = 1) -> list[int]:
    values = n.ints_attr(name, [default] * d)
    if len(values) != d or min(values, default=1) < 1:
        raise n.fail(f"{name} {values} is not {d} numbers >= 1")
    return values


def _kernel_shape_is(n: Node, kernel: list[int]) -> None:
    """`kernel_shape`, where given, restates the weights' spatial dims: it must agree with them."""
    given = n.ints_attr("kernel_shape")
    if given is not None and given != kernel:
        raise n.fail(f"kernel_shape {given} differs from the weights' spatial dims {kernel}")


def _as_2d(n: Node, x: str, d: int) -> str:
    """A 1-D image [N, C, L] as [N, C, 1, L]."""
    return x if d == 2 else n.reshape(x, (*n.shape(x)[:2], 1, n.shape(x)[2]))


def _from_2d(n: Node, y: str, d: int, out: int | None = 0) -> str:
    """The 2-D result back as 1-D where the input was, written to output `out` (None: an intermediate)."""
    if d == 2:
        return y
    shape = n.shape(y)
    return n.reshape(y, (*shape[:2], shape[3]), out=out)


def conv(n: Node) -> None:
    convolve(n, n.x(0), n.x(1), n.x(2) if n.has(2) else None, out=0)


def convolve(n: Node, x: str, w: str, bias: str | None, out: int | None, result_dtype: str | None = None) -> str:
    """Conv's mapping on operands `x`, `w` and `bias` (the node's attributes), its result written
    to output `out` (None: an intermediate of `result_dtype`): a quantized convolution's too."""
    d = _spatial(n, n.op_type)
    kernel = list(n.shape(w)[2:])
    if len(kernel) != d:
        raise n.fail(f"weights {list(n.shape(w))} do not match the {d}-D input {list(n.shape(x))}")
    _kernel_shape_is(n, kernel)
    strides, dilations = _per_dim(n, "strides", d), _per_dim(n, "dilations", d)
    spans = [(k - 1) * dil + 1 for k, dil in zip(kernel, dilations)]
    padding = _padding(n, list(n.shape(x)[2:]), spans, strides)
    if d == 1:
        strides, dilations, padding = [1, *strides], [1, *dilations], [[0, 0], *padding]
    y = n.emit("CONV2D", [_as_2d(n, x, d), _as_2d(n, w, d), *([bias] if bias else [])],
               out=out if d == 2 else None, result_dtype=result_dtype, layout="NCHW",
               stride=strides, dilation=dilations, padding=padding, groups=n.int_attr("group", 1))
    return _from_2d(n, y, d, out=out)


def conv_transpose(n: Node) -> None:
    """The gradient of a convolution, as one: the input with stride - 1 zeros between its
    elements (a RESHAPE, a PAD and a RESHAPE), padded by span - 1 - pads, convolved at stride 1
    with the weights [C, M/g, kh, kw] as [M, C/g, kh, kw], flipped along kh and kw."""
    d = _spatial(n, "ConvTranspose")
    x, w = n.x(0), n.x(1)
    _, c, *sizes = n.shape(0)
    wshape = n.shape(1)
    group = n.int_attr("group", 1)
    kernel = list(wshape[2:])
    if len(wshape) != d + 2 or wshape[0] != c or group < 1 or c % group:
        raise n.fail(f"weights {list(wshape)} do not fit the input {list(n.shape(0))} in {group} group(s)")
    _kernel_shape_is(n, kernel)
    strides, dilations = _per_dim(n, "strides", d), _per_dim(n, "dilations", d)
    output_padding = n.ints_attr("output_padding", [0] * d)
    if len(output_padding) != d:
        raise n.fail(f"output_padding {output_padding} is not {d} numbers")
    spans = [(k - 1) * dil + 1 for k, dil in zip(kernel, dilations)]
    full = [s * (size - 1) + op + span for s, size, op, span in zip(strides, sizes, output_padding, spans)]
    auto_pad = n.str_attr("auto_pad", "NOTSET")
    output_shape = n.ints_attr("output_shape")
    if "pads" in n.attrs or (auto_pad in ("NOTSET", "VALID") and output_shape is None):
        pads = n.ints_attr("pads", [0] * 2 * d) if auto_pad != "VALID" else [0] * 2 * d
        if len(pads) != 2 * d:
            raise n.fail(f"pads {pads} is not {2 * d} numbers")
        cut = [[pads[i], pads[i + d]] for i in range(d)]
    else:  # pads from the output's shape: SAME_UPPER puts the odd one at the end, else at the start
        if output_shape is None:
            output_shape = [size * s for size, s in zip(sizes, strides)]
        output_shape = output_shape[-d:]
        if len(output_shape) != d:
            raise n.fail(f"output_shape {output_shape} does not give the {d} spatial dims")
        totals = [f - o for f, o in zip(full, output_shape)]
        if auto_pad == "NOTSET":  # as onnx's reference: cut (or extend) at the end
            cut = [[0, t] for t in totals]
        else:
            cut = [[t // 2, t - t // 2] if auto_pad == "SAME_UPPER" else [t - t // 2, t // 2] for t in totals]
    if any(f - before - after < 1 for f, (before, after) in zip(full, cut)):
        raise n.fail(f"pads {cut} leave no output of the {full} positions")
    # the input spread by stride - 1 zeros, padded by span - 1 - pads (after: also output_padding)
    padding = [[span - 1 - before, span - 1 - after + op]
               for span, (before, after), op in zip(spans, cut, output_padding)]
    x = _as_2d(n, x, d)
    x, padding = dilated_input(lambda op, t, attrs: n.emit(op, [t], **attrs), x, n.shape(x), list(range(4 - d, 4)),
                               strides, padding)
    weights = _flipped_weights(n, w, group, d)
    if d == 1:
        dilations, padding = [1, *dilations], [[0, 0], *padding]
    bias = [n.x(2)] if n.has(2) else []
    y = n.emit("CONV2D", [x, weights, *bias], out=0 if d == 2 else None, layout="NCHW", stride=[1, 1],
               dilation=dilations, padding=padding, groups=group)
    _from_2d(n, y, d)


def _flipped_weights(n: Node, w: str, group: int, d: int) -> str:
    """ConvTranspose's weights [C, M/g, k...] as CONV2D's [M, C/g, kh, kw], flipped: computed here
    when they are constants, else by RESHAPE, TRANSPOSE and GATHERs."""
    c, per_out, *kernel = n.shape(w)
    kernel = [1] * (2 - d) + kernel
    grouped = (group, c // group, per_out, *kernel)
    conv_shape = (group * per_out, c // group, *kernel)
    value = n.value(w)
    if value is not None:
        flipped = value.reshape(grouped).transpose(0, 2, 1, 3, 4).reshape(conv_shape)[:, :, ::-1, ::-1]
        return n.known(np.ascontiguousarray(flipped), "flipped")
    swapped = n.emit("TRANSPOSE", [n.reshape(w, grouped)], perms=[0, 2, 1, 3, 4])
    y = n.reshape(swapped, conv_shape)
    for axis in (2, 3):
        if conv_shape[axis] > 1:
            y = n.emit("GATHER", [y], axis=axis, indices=list(range(conv_shape[axis] - 1, -1, -1)))
    return y


def _pool(kind: str) -> Callable[[Node], None]:
    def pool(n: Node) -> None:
        if n.used(1):
            raise n.fail("its Indices output is not supported")
        pool_of(n, n.x(0), kind, out=0)

    return pool


def pool_of(n: Node, x: str, kind: str, out: int | None, result_dtype: str | None = None) -> str:
    """MaxPool's (`kind` "max") or AveragePool's ("average") mapping on operand `x` (the node's
    attributes), its result written to output `out` (None: an intermediate of `result_dtype`):
    a quantized average pool's too."""
    d = _spatial(n, f"{n.op_type}")
    kernel = n.ints_attr("kernel_shape")
    if kernel is None or len(kernel) != d:
        raise n.fail(f"kernel_shape {kernel} does not give the {d} spatial dims")
    strides, dilations = _per_dim(n, "strides", d), _per_dim(n, "dilations", d)
    spans = [(k - 1) * dil + 1 for k, dil in zip(kernel, dilations)]
    sizes = list(n.shape(x)[2:])
    padding = _padding(n, sizes, spans, strides)
    count_include_pad = bool(n.int_attr("count_include_pad", 0))
    if n.int_attr("ceil_mode", 0):
        # the last window may run past the end: one more output where it starts inside the
        # input or its padding before, its extra reach padding the pools leave out
        for i, (size, span, s) in enumerate(zip(sizes, spans, strides)):
            before, after = padding[i]
            floor_out = (size + before + after - span) // s + 1
            out_size = -(-(size + before + after - span) // s) + 1
            if (out_size - 1) * s >= size + before:
                out_size -= 1
            extra = max(0, (out_size - 1) * s + span - (size + before + after))
            if extra and kind == "average" and count_include_pad:
                raise n.fail("ceil_mode with count_include_pad is not supported (the windows past the end "
                             "would count padding the model does not have)")
            padding[i] = [before, after + extra] if out_size > floor_out else [before, after]
    if d == 1:
        kernel, strides, dilations, padding = [1, *kernel], [1, *strides], [1, *dilations], [[0, 0], *padding]
    nhwc = n.emit("TRANSPOSE", [_as_2d(n, x, d)], perms=NCHW_TO_NHWC)
    attrs = {"count_include_pad": count_include_pad} if kind == "average" else {}
    pooled = n.emit({"max": "MAXPOOL2D", "average": "AVGPOOL2D"}[kind], [nhwc], result_dtype=result_dtype,
                    kernel=kernel, stride=strides, dilation=dilations, padding=padding, **attrs)
    y = n.emit("TRANSPOSE", [pooled], out=out if d == 2 else None, perms=NHWC_TO_NCHW)
    return _from_2d(n, y, d, out)


def global_average_pool(n: Node) -> None:
    if n.rank(0) < 3:
        raise n.fail(f"GlobalAveragePool takes [N, C, spatial...], got {list(n.shape(0))}")
    n.emit("REDUCE_MEAN", [n.x(0)], out=0, axes=list(range(2, n.rank(0))), keepdims=True)


# ---- normalizations --------------------------------------------------------------------------


def batch_normalization(n: Node) -> None:
    """Inference: (x - mean) / sqrt(var + epsilon) * scale + bias over the channel axis 1. With
    all four constants, one per-channel scale and shift computed here (MUL and ADD, which the
    BATCHNORM pass folds into a Conv before them); else the formula as map ops."""
    if n.int_attr("training_mode", 0):
        raise n.fail("training_mode 1 is not supported (inference only)")
    if any(n.used(k) for k in range(1, 5)):
        raise n.fail("its running or saved mean and variance outputs are not supported (inference only)")
    if n.rank(0) < 2:
        raise n.fail(f"BatchNormalization takes [N, C, ...], got {list(n.shape(0))}")
    x = n.x(0)
    channels = n.shape(0)[1]
    per_channel = (channels, *[1] * (n.rank(0) - 2))
    for i, what in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")):
        if math.prod(n.shape(i)) != channels:
            raise n.fail(f"its {what} {list(n.shape(i))} does not hold one number per channel ({channels})")
    epsilon = n.float_attr("epsilon", 1e-5)
    values = [n.value(i) for i in range(1, 5)]
    if all(v is not None for v in values):
        scale, bias, mean, var = (v.astype(np.float64).reshape(per_channel) for v in values)
        factor = scale / np.sqrt(var + epsilon)
        y = n.emit("MUL", [x, n.constant(factor, n.dtype, "scale")])
        n.emit("ADD", [y, n.constant(bias - mean * factor, n.dtype, "shift")], out=0)
        return
    scale, bias, mean, var = (n.reshape(n.x(i), per_channel) for i in range(1, 5))
    std = n.emit("SQRT", [n.emit("ADD", [var, n.scalar(epsilon, var)])])
    factor = n.emit("DIV", [scale, std])
    y = n.emit("MUL", [n.emit("SUB", [x, mean]), factor])
    n.emit("ADD", [y, bias], out=0)


def layer_normalization(n: Node) -> None:
    """LAYERNORM for Y; Mean and InvStdDev, where asked for, as REDUCE_MEAN and map ops."""
    axis = n.int_attr("axis", -1)
    epsilon = n.float_attr("epsilon", 1e-5)
    rank = n.rank(0)
    if not -rank <= axis < rank:
        raise n.fail(f"axis {axis} is out of range for rank {rank}")
    x = n.x(0)
    n.emit("LAYERNORM", [x, *[n.x(i) for i in (1, 2) if n.has(i)]], out=0, axis=axis, epsilon=epsilon)
    if not (n.out(1) or n.out(2)):
        return
    axes = list(range(axis % rank, rank))
    dtype = n.out_dtype(1) or n.out_dtype(2)
    mean = n.emit("REDUCE_MEAN", [x], out=1 if n.out(1) else None, result_dtype=dtype, axes=axes, keepdims=True)
    if n.out(2):
        centred = n.emit("SUB", [x, mean], result_dtype=dtype)
        square = n.emit("MUL", [centred, centred], result_dtype=dtype)
        var = n.emit("REDUCE_MEAN", [square], result_dtype=dtype, axes=axes, keepdims=True)
        n.emit("RSQRT", [n.emit("ADD", [var, n.scalar(epsilon, var)], result_dtype=dtype)], out=2)


def _softmax(op: str) -> Callable[[Node], None]:
    """From opset 13 along one axis; before, over the dims from `axis` on as one (a 2-D RESHAPE)."""

    def softmax(n: Node) -> None:
        if n.opset >= 13:
            n.emit(op, [n.x(0)], out=0, axis=n.int_attr("axis", -1))
            return
        shape = n.shape(0)
        axis = _axis(n, n.int_attr("axis", 1), len(shape))
        rows = n.reshape(n.x(0), (math.prod(shape[:axis]), math.prod(shape[axis:])))
        n.reshape(n.emit(op, [rows], axis=1), shape, out=0)

    return softmax


# ---- reductions ------------------------------------------------------------------------------


def _reduction_axes(n: Node) -> list[int] | None:
    """The axes a Reduce* node reduces: None for every axis, [] for none (empty axes with
    noop_with_empty_axes). An attribute before the opset where they became an input (13 for
    ReduceSum, 18 for the others)."""
    since = 13 if n.op_type == "ReduceSum" else 18
    axes = (n.ints(1, "axes") if n.has(1) else None) if n.opset >= since else n.ints_attr("axes")
    if not axes:
        return [] if n.int_attr("noop_with_empty_axes", 0) else None
    return axes


def _keepdims(n: Node) -> bool:
    return bool(n.int_attr("keepdims", 1))


def _reduce_over(n: Node, op: str, x: str, axes: list[int] | None, keepdims: bool, out: int | None = None) -> str:
    """`op` (a REDUCE_*) of x over `axes`; x itself where they are none (`[]`)."""
    if axes == []:
        if out is not None:
            n.alias(x, out)
        return x
    return n.emit(op, [x], out=out, axes=axes, keepdims=keepdims)


def _reduce(kind: str) -> Callable[[Node], None]:
    return lambda n: _reduce_over(n, f"REDUCE_{kind}", n.x(0), _reduction_axes(n), _keepdims(n), out=0)


def reduce_l1(n: Node) -> None:
    _reduce_over(n, "REDUCE_SUM", n.emit("ABS", [n.x(0)]), _reduction_axes(n), _keepdims(n), out=0)


def _sum_of_squares(n: Node, out: int | None = None) -> str:
    x = n.x(0)
    return _reduce_over(n, "REDUCE_SUM", n.emit("MUL", [x, x]), _reduction_axes(n), _keepdims(n), out=out)


def reduce_l2(n: Node) -> None:
    n.emit("SQRT", [_sum_of_squares(n)], out=0)


def reduce_log_sum_exp(n: Node) -> None:
    """log(sum(exp(x - m))) + m, m the row's max so no exp overflows; m is 0 where the max is
    infinite (a row of -inf gives -inf, one holding +inf gives +inf). Over no axes, x itself."""
    x, axes = n.x(0), _reduction_axes(n)
    if axes == []:
        _identity(n)
        return
    top = n.emit("REDUCE_MAX", [x], axes=axes, keepdims=True)
    shift = n.emit("SELECT", [n.emit("IS_INF", [top]), n.scalar(0, top), top])
    total = n.emit("REDUCE_SUM", [n.emit("EXP", [n.emit("SUB", [x, shift])])], axes=axes, keepdims=True)
    y = n.emit("ADD", [n.emit("LOG", [total]), shift], out=0 if _keepdims(n) else None)
    if not _keepdims(n):
        rank = n.rank(0)
        reduced = set(range(rank)) if axes is None else {a % rank for a in axes}  # checked by REDUCE_MAX
        n.reshape(y, [d for i, d in enumerate(n.shape(0)) if i not in reduced], out=0)


def _arg(kind: str) -> Callable[[Node], None]:
    """ArgMax, ArgMin: the registry's ARGMAX, ARGMIN (an int64 result, held in i32)."""
    return lambda n: n.emit(f"ARG{kind}", [n.x(0)], out=0, axis=n.int_attr("axis", 0), keepdims=_keepdims(n),
                            select_last_index=bool(n.int_attr("select_last_index", 0)))


def global_max_pool(n: Node) -> None:
    if n.rank(0) < 3:
        raise n.fail(f"GlobalMaxPool takes [N, C, spatial...], got {list(n.shape(0))}")
    n.emit("REDUCE_MAX", [n.x(0)], out=0, axes=list(range(2, n.rank(0))), keepdims=True)


def cum_sum(n: Node) -> None:
    axis = n.ints(1, "axis")
    if len(axis) != 1:
        raise n.fail(f"its axis must be one integer, got {len(axis)}")
    n.emit("CUMSUM", [n.x(0)], out=0, axis=axis[0], exclusive=bool(n.int_attr("exclusive", 0)),
           reverse=bool(n.int_attr("reverse", 0)))


def top_k(n: Node) -> None:
    """The k largest (smallest) along `axis`, largest first, and their positions (an int64
    result, held in i32): SLICEs of the row SORTed and ARGSORTed in that order. Of equal values
    the first position first, as ONNX has it; `sorted` 0 leaves the order open, so sorted serves."""
    shape = n.shape(0)
    axis = _axis(n, n.int_attr("axis", -1), len(shape))
    k = n.ints(1, "K")
    if len(k) != 1 or not 0 <= k[0] <= shape[axis]:
        raise n.fail(f"K {k} is not one number of 0 .. {shape[axis]} (axis {axis} of {list(shape)})")
    largest = n.int_attr("largest", 1)
    if largest not in (0, 1):
        raise n.fail(f"largest {largest} is not 0 or 1")
    order = {"axis": axis, "descending": bool(largest)}
    box = {"start": [0] * len(shape), "size": [k[0] if a == axis else -1 for a in range(len(shape))]}
    for out, op in ((0, "SORT"), (1, "ARGSORT")):
        if n.out(out) is not None:
            n.emit("SLICE", [n.emit(op, [n.x(0)], result_dtype=n.out_dtype(out), **order)], out=out, **box)


def trilu(n: Node) -> None:
    """The upper (or lower) triangle of the last two dims from diagonal k on, the rest 0: a SELECT
    with the triangle as a constant mask (shapes are static)."""
    if n.rank(0) < 2:
        raise n.fail(f"Trilu takes a tensor of rank 2 or more, got {list(n.shape(0))}")
    k = n.ints(1, "k") if n.has(1) else [0]
    if len(k) != 1:
        raise n.fail(f"its k must be one integer, got {len(k)}")
    rows, cols = n.shape(0)[-2:]
    diagonal = min(max(k[0], -rows), cols)  # past the matrix's corners every k gives the same mask
    triangle = (np.triu if n.int_attr("upper", 1) else np.tril)(np.ones((rows, cols), np.uint8), diagonal)
    x = n.x(0)
    n.emit("SELECT", [n.constant(triangle, "u8", "triangle"), x, n.scalar(0, x)], out=0)


def lrn(n: Node) -> None:
    """x / (bias + alpha / size * the sum of x^2 over `size` channels around each)^beta. The
    window sum divided by size is an AVGPOOL2D counting its zero padding, over x^2 viewed as
    [N, C, 1, positions] (NHWC with the channels as H); the scaling and the power are its
    epilogue, before the view back."""
    shape = n.shape(0)
    if len(shape) < 2:
        raise n.fail(f"LRN takes [N, C, ...], got {list(shape)}")
    size = n.int_attr("size")
    if size is None or size < 1:
        raise n.fail(f"its size must be an integer >= 1, got {size}")
    x = n.x(0)
    rows = n.reshape(n.emit("MUL", [x, x]), (shape[0], shape[1], 1, math.prod(shape[2:])))
    mean = n.emit("AVGPOOL2D", [rows], kernel=[size, 1], padding=[[(size - 1) // 2, size // 2], [0, 0]],
                  count_include_pad=True)
    scaled = n.emit("ADD", [n.emit("MUL", [mean, n.scalar(n.float_attr("alpha", 1e-4), mean)]),
                            n.scalar(n.float_attr("bias", 1.0), mean)])
    divisor = n.emit("POW", [scaled, n.scalar(n.float_attr("beta", 0.75), scaled)])
    n.emit("DIV", [x, n.reshape(divisor, shape)], out=0)


def _scale_and_bias(n: Node, y: str, count: int, shape: tuple[int, ...], out: int | None = 0) -> str:
    """y * scale + bias (inputs 1 and 2, `count` numbers each) viewed as `shape`, as MUL and ADD."""
    for i, what, op in ((1, "scale", "MUL"), (2, "bias", "ADD")):
        if math.prod(n.shape(i)) != count:
            raise n.fail(f"its {what} {list(n.shape(i))} does not hold {count} numbers")
        y = n.emit(op, [y, n.reshape(n.x(i), shape)], out=out if i == 2 else None)
    return y


def instance_normalization(n: Node) -> None:
    """Each channel of each sample normalized over its positions: a LAYERNORM over the dims after
    the channels, then the per-channel scale and bias (its epilogue)."""
    shape = n.shape(0)
    if len(shape) < 3:
        raise n.fail(f"InstanceNormalization takes [N, C, D1, ...], got {list(shape)}")
    normed = n.emit("LAYERNORM", [n.x(0)], axis=2, epsilon=n.float_attr("epsilon", 1e-5))
    _scale_and_bias(n, normed, shape[1], (shape[1], *[1] * (len(shape) - 2)))


def group_normalization(n: Node) -> None:
    """x [N, C, ...] in num_groups groups of C/G channels each normalized over its channels and
    positions: a LAYERNORM over x viewed as [N, G, C/G, positions], then the scale and bias on
    that view (per group before opset 21, [G]; per channel from it, [C]), viewed back.
    stash_type is not read: LAYERNORM computes in f32 (in f64 for f64) as the registry says."""
    shape = n.shape(0)
    groups = n.int_attr("num_groups")
    if len(shape) < 2:
        raise n.fail(f"GroupNormalization takes [N, C, ...], got {list(shape)}")
    channels = shape[1]
    if groups is None or groups < 1 or channels % groups:
        raise n.fail(f"num_groups {groups} does not divide the {channels} channels")
    rows = n.reshape(n.x(0), (shape[0], groups, channels // groups, math.prod(shape[2:])))
    normed = n.emit("LAYERNORM", [rows], axis=2, epsilon=n.float_attr("epsilon", 1e-5))
    per_channel = n.opset >= 21
    y = _scale_and_bias(n, normed, channels if per_channel else groups,
                        (groups, channels // groups if per_channel else 1, 1), out=None)
    n.reshape(y, shape, out=0)


# ---- layout ----------------------------------------------------------------------------------


def _axis(n: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise n.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def transpose(n: Node) -> None:
    perm = n.ints_attr("perm")
    n.transpose(n.x(0), perm if perm is not None else list(reversed(range(n.rank(0)))), out=0)


def reshape(n: Node) -> None:
    """0 copies the input's dim (unless allowzero), -1 takes what is left."""
    shape = n.ints(1, "shape")
    given = n.shape(0)
    allowzero = n.int_attr("allowzero", 0)
    new = []
    for i, dim in enumerate(shape):
        if dim == 0 and not allowzero:
            if i >= len(given):
                raise n.fail(f"shape {shape}: dim {i} copies the input's, which has rank {len(given)}")
            dim = given[i]
        new.append(dim)
    if new.count(-1) == 1:
        known = math.prod(d for d in new if d != -1)
        if known == 0 or math.prod(given) % known:
            raise n.fail(f"cannot reshape {list(given)} to {shape}")
        new[new.index(-1)] = math.prod(given) // known
    if any(d < 0 for d in new) or math.prod(new) != math.prod(given):
        raise n.fail(f"cannot reshape {list(given)} to {shape}")
    n.reshape(n.x(0), new, out=0)


def flatten(n: Node) -> None:
    shape = n.shape(0)
    axis = n.int_attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise n.fail(f"axis {axis} is out of range for rank {len(shape)}")
    axis += len(shape) if axis < 0 else 0
    n.reshape(n.x(0), (math.prod(shape[:axis]), math.prod(shape[axis:])), out=0)


def _axes_operand(n: Node) -> list[int] | None:
    """Squeeze's and Unsqueeze's axes: an attribute before opset 13, an input from it."""
    if n.opset >= 13:
        return n.ints(1, "axes") if n.has(1) else None
    return n.ints_attr("axes")


def squeeze(n: Node) -> None:
    shape = n.shape(0)
    axes = _axes_operand(n)
    if axes is None:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        drop = {_axis(n, a, len(shape)) for a in axes}
        if any(shape[a] != 1 for a in drop):
            raise n.fail(f"axes {axes} of {list(shape)} are not all of size 1")
    n.reshape(n.x(0), [d for i, d in enumerate(shape) if i not in drop], out=0)


def unsqueeze(n: Node) -> None:
    shape = list(n.shape(0))
    axes = _axes_operand(n)
    if axes is None:
        raise n.fail("has no axes")
    rank = len(shape) + len(axes)
    inserted = sorted(_axis(n, a, rank) for a in axes)
    if len(set(inserted)) < len(inserted):
        raise n.fail(f"axes {axes} name an axis twice")
    for a in inserted:
        shape.insert(a, 1)
    n.reshape(n.x(0), shape, out=0)


def concat(n: Node) -> None:
    axis = n.int_attr("axis")
    if axis is None:
        raise n.fail("has no axis")
    n.emit("CONCAT", [n.x(i) for i in range(len(n.proto.input))], out=0, axis=axis)


def split(n: Node) -> None:
    """One SLICE per output along `axis`; sizes from `split` (an input from opset 13), else equal
    parts, the last smaller with num_outputs (opset 18)."""
    shape = n.shape(0)
    axis = _axis(n, n.int_attr("axis", 0), len(shape))
    count = len(n.proto.output)
    sizes = (n.ints(1, "split") if n.has(1) else None) if n.opset >= 13 else n.ints_attr("split")
    if sizes is None:
        parts = n.int_attr("num_outputs", count) if n.opset >= 18 else count
        if parts != count or parts < 1:
            raise n.fail(f"num_outputs {parts} differs from its {count} outputs")
        size = -(-shape[axis] // parts) if n.opset >= 18 else shape[axis] // parts
        if n.opset < 18 and shape[axis] % parts:
            raise n.fail(f"dim {axis} of {list(shape)} does not split into {parts} equal parts")
        sizes = [size] * (parts - 1) + [shape[axis] - size * (parts - 1)]
    if len(sizes) != count or sum(sizes) != shape[axis] or min(sizes) < 0:
        raise n.fail(f"split {sizes} does not cut dim {axis} of {list(shape)} into its {count} outputs")
    start = 0
    for k, size in enumerate(sizes):
        if n.out(k):
            n.emit("SLICE", [n.x(0)], out=k, start=[start if a == axis else 0 for a in range(len(shape))],
                   size=[size if a == axis else -1 for a in range(len(shape))])
        start += size


def _in_turn(n: Node, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Registry ops (op, attrs) one after another from input 0, the last writing output 0 (none:
    the output is the input)."""
    if not steps:
        _identity(n)
        return
    y = n.x(0)
    for k, (op, attrs) in enumerate(steps):
        y = n.emit(op, [y], out=0 if k == len(steps) - 1 else None, **attrs)


def slice_(n: Node) -> None:
    """Steps of 1 as one SLICE; any other step (negative ones too) as a GATHER of the indices it
    visits along its axis."""
    shape = n.shape(0)
    starts, ends = n.ints(1, "starts"), n.ints(2, "ends")
    axes = n.ints(3, "axes") if n.has(3) else list(range(len(starts)))
    steps = n.ints(4, "steps") if n.has(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise n.fail(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    box_start, box_size = [0] * len(shape), [-1] * len(shape)
    gathers: list[tuple[int, list[int]]] = []
    seen = set()
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(n, axis, len(shape))
        if axis in seen:
            raise n.fail(f"axes {axes} name an axis twice")
        seen.add(axis)
        dim = shape[axis]
        if step == 0:
            raise n.fail("a step of 0")
        start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        if step == 1:
            box_start[axis], box_size[axis] = start, max(end - start, 0)
        else:
            gathers.append((axis, list(range(start, end, step))))
    steps = []
    if box_start != [0] * len(shape) or any(s not in (-1, d) for s, d in zip(box_size, shape)):
        steps.append(("SLICE", {"start": box_start, "size": box_size}))
    steps += [("GATHER", {"axis": axis, "indices": indices}) for axis, indices in gathers]
    _in_turn(n, steps)


def _padded_index(i: int, dim: int, mode: str) -> int:
    """The element of an axis of `dim` that position i of it (negative: in the padding before it,
    past dim - 1: after it) reads under Pad's `mode` (reflect: at most dim - 1 past either end)."""
    if mode == "edge":
        return min(max(i, 0), dim - 1)
    if mode == "wrap":
        return i % dim
    return -i if i < 0 else 2 * (dim - 1) - i if i >= dim else i  # mirrored, the end not repeated


def pad(n: Node) -> None:
    """Negative pads crop, then positive ones pad what is kept (onnxruntime's order). Mode
    constant: a SLICE of the crop, then a PAD of `constant_value` (0 where absent); edge, reflect
    and wrap: on each axis padded or cropped a GATHER of the elements its positions read (wrapping
    more than the kept axis holds wraps again)."""
    shape = n.shape(0)
    rank = len(shape)
    pads = n.ints(1, "pads")
    axes = [_axis(n, a, rank) for a in n.ints(3, "axes")] if n.has(3) else list(range(rank))
    if len(set(axes)) != len(axes):
        raise n.fail(f"axes {axes} name an axis twice")
    if len(pads) != 2 * len(axes):
        raise n.fail(f"pads {pads} must hold 2 x {len(axes)} values, the starts then the ends of each axis")
    before, after = [0] * rank, [0] * rank
    for k, axis in enumerate(axes):
        before[axis], after[axis] = pads[k], pads[k + len(axes)]
    kept = [d - max(-b, 0) - max(-e, 0) for d, b, e in zip(shape, before, after)]  # each axis after the crop
    if any(size < 0 for size in kept):
        raise n.fail(f"pads {pads} crop more than the input's shape {list(shape)} holds")
    grow = [[max(b, 0), max(e, 0)] for b, e in zip(before, after)]
    mode = n.str_attr("mode", "constant")
    if mode in ("edge", "reflect", "wrap"):
        for a, (d, g) in enumerate(zip(kept, grow)):  # onnxruntime's rule: a mirror reaches the far end at most
            if mode == "reflect" and max(g) > d - 1:
                raise n.fail(f"mode 'reflect' pads axis {a} by {max(g)}, more than the {d - 1} elements its mirror "
                             "holds")
        steps = [("GATHER", {"axis": a, "indices": [max(-before[a], 0) + _padded_index(i, kept[a], mode)
                                                     for i in range(-grow[a][0], kept[a] + grow[a][1])]})
                 for a in range(rank) if before[a] or after[a]]
    elif mode == "constant":
        value = n.value(2) if n.has(2) else np.zeros(1, np.int64)
        if value is None:
            from .onnx import _clip

            raise n.fail(f"its constant_value (input 2, '{_clip(n.name(2))}') must be a constant: the ONNX "
                         "frontend reads it at compile time")
        if value.size != 1:
            raise n.fail(f"its constant_value must be one value, got {value.size}")
        fill = value.reshape(-1)[0]
        whole = np.issubdtype(fill.dtype, np.integer) or fill.dtype == np.bool_  # else a float (bf16, f8 too)
        steps = []
        if any(b < 0 or e < 0 for b, e in zip(before, after)):
            steps.append(("SLICE", {"start": [max(-b, 0) for b in before], "size": kept}))
        if any(b > 0 or e > 0 for b, e in zip(before, after)):
            steps.append(("PAD", {"padding": grow, "pad_value": int(fill) if whole else float(fill)}))
    else:
        raise n.fail(f"mode '{mode}' is not supported (constant, edge, reflect, wrap)")
    _in_turn(n, steps)


def gather(n: Node) -> None:
    """A GATHER along `axis` of constant indices (its attribute), else of the index operand read
    at run time (int64 ids held in i32). Indices of rank r other than 1 are gathered flat, then
    RESHAPEd into their place (a view of a tensor: no bytes move)."""
    shape = n.shape(0)
    axis = _axis(n, n.int_attr("axis", 0), len(shape))
    indices = n.value(1)
    if indices is not None:
        operands, attrs, index_shape = [n.x(0)], {"indices": [int(i) for i in indices.reshape(-1)]}, indices.shape
    else:
        index_shape = n.shape(1)
        ids = n.x(1) if len(index_shape) == 1 else n.reshape(n.x(1), [math.prod(index_shape)])
        operands, attrs = [n.x(0), ids], {}
    if len(index_shape) == 1:
        n.emit("GATHER", operands, out=0, axis=axis, **attrs)
        return
    final = (*shape[:axis], *index_shape, *shape[axis + 1:])
    n.reshape(n.emit("GATHER", operands, axis=axis, **attrs), final, out=0)


# Runtime indices of GatherElements and GatherND: flat positions computed on the KPU by i32 map
# ops (each index wrapped from the end of its dim, times its dim's stride, plus broadcast iotas
# of the positions it sits at, constants of one dim each), then a GATHER of the data RESHAPEd
# flat. An index outside its dim makes the position one past the data's end, so the run stops
# with an error there instead of reading another element.


def gather_elements_at_run_time(n: Node, axis: int) -> None:
    """GatherElements of data (input 0) by the index tensor input 1, known only at run time,
    along `axis` (normalized): out[p] = data[p with its `axis` coordinate replaced by idx[p]]."""
    data, idx = n.shape(0), n.shape(1)
    if len(idx) != len(data) or any(i > d for k, (i, d) in enumerate(zip(idx, data)) if k != axis):
        raise n.fail(f"indices {list(idx)} do not fit data {list(data)} outside axis {axis}")
    _fits_i32(n, data)
    strides = _row_major_strides(data)
    flat = _scaled(n, _wrapped(n, n.x(1), data[axis]), strides[axis])
    for k, size in enumerate(idx):
        if k != axis and size > 1:
            flat = _plus_iota(n, flat, len(idx), k, size, strides[k])
    rows = _checked(n, flat, _in_range(n, n.x(1), data[axis]), math.prod(data))
    _gather_rows(n, n.reshape(n.x(0), [math.prod(data)]), rows, idx)


def gather_nd_at_run_time(n: Node, batch_dims: int) -> None:
    """GatherND of data (input 0) by the index tuples in the last dim of input 1, known only at
    run time: the data as rows of the dims after the batch dims and the q indexed ones, each
    tuple (with its batch position) one row's number."""
    data, idx = n.shape(0), n.shape(1)
    b, q = batch_dims, idx[-1] if idx else 0
    if not 0 <= b < len(idx) or not 1 <= q <= len(data) - b or tuple(idx[:b]) != tuple(data[:b]):
        raise n.fail(f"indices {list(idx)} with batch_dims {b} do not index data {list(data)}")
    _fits_i32(n, data[:b + q])
    picked = data[b:b + q]
    strides = _row_major_strides(picked)
    flat = ok = None
    for j in range(q):
        part = n.x(1) if q == 1 else n.emit("SLICE", [n.x(1)], start=[0] * (len(idx) - 1) + [j],
                                            size=[-1] * (len(idx) - 1) + [1])
        term = _scaled(n, _wrapped(n, part, picked[j]), strides[j])
        flat = term if flat is None else n.emit("ADD", [flat, term], result_dtype="i32")
        fits = _in_range(n, part, picked[j])
        ok = fits if ok is None else n.emit("LOGICAL_AND", [ok, fits])
    for k in range(b):  # the batch position: a row of each batch holds all the picked dims
        if idx[k] > 1:
            flat = _plus_iota(n, flat, len(idx), k, idx[k], math.prod(data[k + 1:b + q]))
    rows = math.prod(data[:b + q])
    flat = _checked(n, flat, ok, rows)
    _gather_rows(n, n.reshape(n.x(0), [rows, *data[b + q:]]), flat, (*idx[:-1], *data[b + q:]))


def _fits_i32(n: Node, shape: tuple[int, ...]) -> None:
    """Refused where the flat positions in `shape`, and one past them, leave i32 (the index ops' dtype)."""
    if math.prod(shape) >= 2**31 - 1:
        raise n.fail(f"its {math.prod(shape):,} flat positions do not fit in i32, which runtime indices are "
                     "computed in")


def _wrapped(n: Node, idx: str, size: int) -> str:
    """Indices into a dim of `size`, negative ones counted from its end (mod, the divisor's sign)."""
    return n.emit("MOD", [idx, n.scalar(size, idx)], result_dtype="i32", fmod=False)


def _in_range(n: Node, idx: str, size: int) -> str:
    """1 where an index lies within -size..size-1, as ONNX allows, else 0."""
    low = n.emit("GREATER_EQUAL", [idx, n.scalar(-size, idx)])
    return n.emit("LOGICAL_AND", [low, n.emit("LESS", [idx, n.scalar(size, idx)])])


def _scaled(n: Node, x: str, stride: int) -> str:
    return x if stride == 1 else n.emit("MUL", [x, n.scalar(stride, x)], result_dtype="i32")


def _plus_iota(n: Node, flat: str, rank: int, k: int, size: int, stride: int) -> str:
    """`flat` plus each position's coordinate along dim k times `stride` (a constant of that dim alone)."""
    return n.emit("ADD", [flat, n.constant(_along(size, k, rank) * stride, "i32", "iota")], result_dtype="i32")


def _checked(n: Node, flat: str, ok: str, count: int) -> str:
    """The flat positions, each whose index left its dim made `count`: out of range for the GATHER."""
    return n.emit("SELECT", [ok, flat, n.scalar(count, flat)], result_dtype="i32")


def _gather_rows(n: Node, rows: str, flat: str, final: tuple[int, ...]) -> None:
    """Output 0: the rows (dim 0 of `rows`) at the positions `flat`, shaped `final`."""
    picked = n.emit("GATHER", [rows, n.reshape(flat, [math.prod(n.shape(flat))])], axis=0)
    n.reshape(picked, final, out=0)


# ---- Einsum, Resize, GatherElements and GatherND, Expand and Tile -----------------------------
# Each decomposed here into registry ops; what they need of their constant inputs (element
# numbers to gather, interpolation weights) is computed at compile time.


def broadcast_to(n: Node, x: str, target: tuple[int, ...], out: int | None = None) -> str:
    """x broadcast to `target` (numpy's rule) as a MUL by ones shaped as the dims x gains alone:
    only those ones cross memory beside x and the result, where ones of the result's shape would
    double its bytes (a MUL by 1, not an ADD of 0, which would turn -0 into +0)."""
    shape = tuple(n.shape(x))
    aligned = (1,) * (len(target) - len(shape)) + shape
    ones = [t if a == 1 else 1 for a, t in zip(aligned, target)]
    if math.prod(ones) != 1:
        return n.emit("MUL", [x, _ones(n, x, ones)], out=out)
    if shape != tuple(target):  # nothing grows: the same elements under more dims
        return n.reshape(x, target, out=out)
    if out is not None:
        n.alias(x, out)
    return x


def _ones(n: Node, x: str, shape: list[int]) -> str:
    """Ones of x's type: a known value beside a known x (so that their MUL folds), else a graph
    constant."""
    value = n.value(x)
    if value is None:
        return n.constant(np.ones(shape), n.input_dtype(x), "ones")
    ones = n.known(np.ones(shape, value.dtype), "ones")
    if x in n.b.elem_types:
        n.b.elem_types[ones] = n.b.elem_types[x]
    return ones


def expand(n: Node) -> None:
    shape = n.ints(1, "shape")
    try:
        target = tuple(np.broadcast_shapes(n.shape(0), tuple(shape)))
    except ValueError:
        raise n.fail(f"shape {shape} does not broadcast with the input's {list(n.shape(0))}") from None
    broadcast_to(n, n.x(0), target, out=0)


def tile(n: Node) -> None:
    """Each dim d repeated r times: a dim of 1 put before d, broadcast to r, and [r, d] merged
    (the RESHAPEs are views: the broadcast alone moves bytes)."""
    shape, repeats = n.shape(0), n.ints(1, "repeats")
    if len(repeats) != len(shape) or min(repeats, default=0) < 0:
        raise n.fail(f"repeats {repeats} is not {len(shape)} numbers >= 0 for the input {list(shape)}")
    if all(r == 1 for r in repeats):
        _identity(n)
        return
    spread = [k for d, r in zip(shape, repeats) for k in ((1, d) if r != 1 else (d,))]
    grown = [k for d, r in zip(shape, repeats) for k in ((r, d) if r != 1 else (d,))]
    y = broadcast_to(n, n.reshape(n.x(0), spread), tuple(grown))
    n.reshape(y, [d * r for d, r in zip(shape, repeats)], out=0)


def _within(n: Node, indices: np.ndarray, size: int) -> np.ndarray:
    """Indices into a dim of `size`, negative ones counted from its end; one outside is refused."""
    outside = (indices < -size) | (indices >= size)
    if outside.any():
        raise n.fail(f"index {int(indices[outside][0])} is out of range for a dim of {size}")
    return indices % max(size, 1)


def _row_major_strides(shape: tuple[int, ...] | list[int]) -> list[int]:
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


def _along(size: int, k: int, rank: int) -> np.ndarray:
    """0..size-1 along dim k of `rank` dims (1 elsewhere), to broadcast against the others."""
    return np.arange(size).reshape([size if j == k else 1 for j in range(rank)])


def _computed_here(n: Node, count: int, what: str) -> None:
    """Refuse a table of more entries than the frontend computes at compile time (FOLD_LIMIT)."""
    from .onnx import FOLD_LIMIT

    if count > FOLD_LIMIT:
        raise n.fail(f"{what} would hold {count:,} entries, more than the {FOLD_LIMIT:,} the ONNX frontend "
                     "computes at compile time")


def _merged(picks: np.ndarray, rows: int) -> int:
    """The most consecutive rows m for which `picks` (row numbers among `rows`) take whole rows of
    the table with m of them in each: runs of m consecutive numbers from multiples of m."""
    common = math.gcd(rows, picks.size)
    small = [m for m in range(1, math.isqrt(common) + 1) if common % m == 0]
    for m in sorted({*small, *(common // m for m in small)}, reverse=True):
        runs = picks.reshape(-1, m)
        if not (runs[:, 0] % m).any() and (runs == runs[:, :1] + np.arange(m)).all():
            return m
    return 1


def gather_rows(n: Node, x: str, picks: np.ndarray, width: int, final: tuple[int, ...],
                out: int | None = None) -> str:
    """The rows of x seen as [size / width, width] that `picks` numbers, shaped `final`: the rows
    merged as far as runs of consecutive picks allow, a GATHER of them (indices known here), and
    RESHAPEs (views)."""
    rows, flat = math.prod(n.shape(x)) // width, picks.reshape(-1)
    merged = _merged(flat, rows)
    table = n.reshape(x, (rows // merged, width * merged))
    if not np.array_equal(flat[::merged] // merged, np.arange(rows // merged)):
        table = n.emit("GATHER", [table], axis=0, indices=[int(r) for r in flat[::merged] // merged])
    return n.reshape(table, final, out=out)


def gather_elements(n: Node) -> None:
    """out[p] = x[p with its `axis` coordinate replaced by indices[p]]: constant indices give the
    elements' numbers here, then `gather_rows` (of one element each)."""
    shape = n.shape(0)
    axis = _axis(n, n.int_attr("axis", 0), len(shape))
    if n.value(1) is None:
        gather_elements_at_run_time(n, axis)
        return
    indices = n.value(1).astype(np.int64)
    if indices.ndim != len(shape) or any(i > d for k, (i, d) in enumerate(zip(indices.shape, shape)) if k != axis):
        raise n.fail(f"indices {list(indices.shape)} do not fit the input {list(shape)} outside axis {axis}")
    _computed_here(n, indices.size, "its gather")
    strides = _row_major_strides(shape)
    picks = _within(n, indices, shape[axis]) * strides[axis]
    for k, size in enumerate(indices.shape):
        if k != axis:
            picks = picks + _along(size, k, indices.ndim) * strides[k]
    gather_rows(n, n.x(0), picks, 1, picks.shape, out=0)


def gather_nd(n: Node) -> None:
    """The slices of x that the tuples in the indices' last dim name, after the `batch_dims` dims
    both share: constant indices give the numbers of the slices, rows of x, here, then
    `gather_rows`."""
    shape, b = n.shape(0), n.int_attr("batch_dims", 0)
    if n.value(1) is None:
        gather_nd_at_run_time(n, b)
        return
    indices = n.value(1).astype(np.int64)
    q = indices.shape[-1] if indices.ndim else 0
    if not 0 <= b < indices.ndim or not 1 <= q <= len(shape) - b or indices.shape[:b] != tuple(shape[:b]):
        raise n.fail(f"indices {list(indices.shape)} with batch_dims {b} do not index the input {list(shape)}")
    _computed_here(n, indices.size // q, "its gather")
    strides = _row_major_strides(shape[:b + q])  # of the rows, each a slice of the dims after
    rows = sum(_within(n, indices[..., j], shape[b + j]) * strides[b + j] for j in range(q))
    for k in range(b):  # each tuple within its own batch position
        rows = rows + _along(shape[k], k, indices.ndim - 1) * strides[k]
    gather_rows(n, n.x(0), rows, math.prod(shape[b + q:]), (*indices.shape[:-1], *shape[b + q:]), out=0)


def einsum(n: Node) -> None:
    """numpy.einsum by its equation. Each operand first alone: a label twice in it is its
    diagonal (`gather_rows`), a dim of 1 that another operand broadcasts is dropped, and a label
    no other operand nor the output has is summed (REDUCE_SUM). Then the operands combine left to
    right, each pair a MATMUL [batch, left, contracted] @ [batch, contracted, right] over the
    labels they share and nothing later needs (a broadcast MUL where there are none), TRANSPOSEd
    and RESHAPEd into place; last, a TRANSPOSE into the output's order."""
    shapes = [n.shape(i) for i in range(len(n.proto.input))]
    terms, output = _einsum_terms(n, shapes)
    sizes: dict[str, int] = {}  # label -> its dim, the broadcast one where another is 1
    for term, shape in zip(terms, shapes):
        for label, d in zip(term, shape):
            known = sizes.setdefault(label, d)
            if known != d and min(known, d) != 1:
                raise n.fail(f"label '{label}' stands for dims of {known} and {d}")
            sizes[label] = max(known, d)
    alone = [_einsum_operand(n, n.x(i), term, sizes) for i, term in enumerate(terms)]
    operands = []
    for i, (x, term) in enumerate(alone):
        needed = set(output).union(*(t for j, (_, t) in enumerate(alone) if j != i))
        summed = [k for k, label in enumerate(term) if label not in needed]
        if summed:
            x, term = n.emit("REDUCE_SUM", [x], axes=summed, keepdims=False), [t for t in term if t in needed]
        operands.append((x, term))
    y, labels = operands[0]
    for i, operand in enumerate(operands[1:], start=2):
        later = set(output).union(*(t for _, t in operands[i:]))
        y, labels = _einsum_pair(n, (y, labels), operand, later, output if i == len(operands) else None, sizes)
    perm = [labels.index(label) for label in output]
    if perm != sorted(perm):
        n.transpose(y, perm, out=0)
    else:
        n.alias(y)


def einsum_equation(node: Any) -> str | None:
    """What is wrong with the spelling of an Einsum node's equation (letters around at most one
    '...' per term, terms joined by ',', '->' and the output's term), or None. Read before onnx's
    shape inference, which loops forever on some (a '.' or a '-' astray)."""
    import re

    from onnx import helper

    given = [helper.get_attribute_value(a) for a in node.attribute if a.name == "equation"]
    equation = given[0].decode("utf-8", "replace") if given and isinstance(given[0], bytes) else ""
    term = r"[A-Za-z]*(\.\.\.)?[A-Za-z]*"
    if re.fullmatch(rf"{term}(,{term})*(->{term})?", equation.replace(" ", "")):
        return None
    return f"equation {equation!r:.80} is not terms of letters (and at most one '...' each) joined by ',' and '->'"


def _einsum_terms(n: Node, shapes: list[tuple[int, ...]]) -> tuple[list[list[str]], list[str]]:
    """Each operand's labels and the output's, an ellipsis spelt out as labels '.k' (k counted
    back from its last dim, so that broadcast dims line up from the right); the implicit output
    is the ellipsis, then the letters written once, in alphabetical order."""
    from collections import Counter

    equation = n.str_attr("equation", "").replace(" ", "")
    inputs, arrow, result = equation.partition("->")
    written = inputs.split(",")
    if len(written) != len(shapes):
        raise n.fail(f"equation {equation!r:.80} has {len(written)} operand terms for {len(shapes)} inputs")

    def labels(term: str, rank: int) -> list[str]:
        head, dots, tail = term.partition("...")  # letters around at most one '...' (einsum_equation)
        spread = rank - len(head + tail)
        if spread < 0 or (spread and not dots):
            raise n.fail(f"equation {equation!r:.80}: term {term!r:.40} does not label the {rank} dims of its "
                         "operand")
        return [*head, *(f".{k}" for k in range(spread - 1, -1, -1)), *tail]

    terms = [labels(term, len(shape)) for term, shape in zip(written, shapes)]
    ellipsis = max(sum(label.startswith(".") for label in t) for t in terms)
    if arrow:
        output = labels(result, len(result.replace("...", "")) + (ellipsis if "..." in result else 0))
        if len(set(output)) < len(output) or not set(output) <= {label for t in terms for label in t}:
            raise n.fail(f"equation {equation!r:.80}: its output names a label twice or one no operand has")
        return terms, output
    counts = Counter(label for t in terms for label in t if not label.startswith("."))
    return terms, [f".{k}" for k in range(ellipsis - 1, -1, -1)] + sorted(l for l, c in counts.items() if c == 1)


def _einsum_operand(n: Node, x: str, term: list[str], sizes: dict[str, int]) -> tuple[str, list[str]]:
    """Operand x, labelled `term`, with its diagonals taken and its dims of 1 that another
    operand broadcasts dropped; (tensor, its labels)."""
    shape = n.shape(x)
    unique = list(dict.fromkeys(term))
    if len(unique) < len(term):  # a label twice: the diagonal, by the elements' numbers
        if any(d != shape[term.index(label)] for label, d in zip(term, shape)):
            raise n.fail(f"a label written twice in one term stands for dims of different sizes in {list(shape)}")
        dims = [shape[term.index(label)] for label in unique]
        _computed_here(n, math.prod(dims), "its diagonal")
        strides = _row_major_strides(shape)
        picks = sum(_along(d, u, len(unique)) * sum(s for s, t in zip(strides, term) if t == label)
                    for u, (label, d) in enumerate(zip(unique, dims)))
        x, term = gather_rows(n, x, picks, 1, tuple(dims)), unique
        shape = n.shape(x)
    kept = [k for k, label in enumerate(term) if not (shape[k] == 1 and sizes[label] > 1)]
    if len(kept) < len(term):
        x, term = n.reshape(x, [shape[k] for k in kept]), [term[k] for k in kept]
    return x, term


def _einsum_pair(n: Node, a: tuple[str, list[str]], b: tuple[str, list[str]], later: set[str],
                 output: list[str] | None, sizes: dict[str, int]) -> tuple[str, list[str]]:
    """The product of two labelled operands, summed over the labels they share that nothing
    later needs; (tensor, its labels: the shared ones kept, then the first operand's own, then
    the second's). The operands in the order that needs the fewer TRANSPOSEs, counting the one
    into `output`'s order after the last pair."""
    if _transposes(b[1], a[1], later, output) < _transposes(a[1], b[1], later, output):
        a, b = b, a
    (x, xl), (w, wl) = a, b
    batch = [label for label in xl if label in wl and label in later]
    contracted = [label for label in xl if label in wl and label not in later]
    left, right = [label for label in xl if label not in wl], [label for label in wl if label not in xl]

    def dims(labels: list[str]) -> list[int]:
        return [sizes[label] for label in labels]

    if not contracted:  # nothing to sum: each element a product, broadcast over the other's labels
        x = _arranged(n, x, xl, batch + left, dims(batch + left) + [1] * len(right))
        w = _arranged(n, w, wl, batch + right, dims(batch) + [1] * len(left) + dims(right))
        return n.emit("MUL", [x, w]), batch + left + right
    lead = [math.prod(dims(batch))] if batch else []
    k, m, cols = math.prod(dims(contracted)), math.prod(dims(left)), math.prod(dims(right))
    x = _arranged(n, x, xl, batch + left + contracted, lead + [m, k])
    if wl == batch + right + contracted:  # B held as [batch, right, contracted]: the MATMUL's transpose_b
        y = n.emit("MATMUL", [x, _arranged(n, w, wl, wl, lead + [cols, k])], transpose_b=True)
    else:
        y = n.emit("MATMUL", [x, _arranged(n, w, wl, batch + contracted + right, lead + [k, cols])])
    shape = dims(batch + left + right)
    return (y if list(n.shape(y)) == shape else n.reshape(y, shape)), batch + left + right


def _transposes(xl: list[str], wl: list[str], later: set[str], output: list[str] | None) -> int:
    """The TRANSPOSEs `_einsum_pair` takes with operands labelled xl and wl, in that order."""
    batch = [label for label in xl if label in wl and label in later]
    contracted = [label for label in xl if label in wl and label not in later]
    left, right = [label for label in xl if label not in wl], [label for label in wl if label not in xl]
    takes = (batch + right + contracted,) if contracted else ()
    result = batch + left + right
    return ((xl != batch + left + contracted) + (wl not in (batch + contracted + right, *takes))
            + (output is not None and result != output))


def _arranged(n: Node, x: str, labels: list[str], order: list[str], shape: list[int]) -> str:
    """x with its dims in the labels' `order` (a TRANSPOSE where that differs), then as `shape`."""
    if order != labels:
        x = n.transpose(x, [labels.index(label) for label in order])
    return x if list(n.shape(x)) == shape else n.reshape(x, shape)


RESIZE_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
# nearest_mode -> whether the output at source position f + r (f an integer, 0 < r <= 1; r = 1
# where it lands on an input) takes input f + 1 rather than f
NEAREST = {"round_prefer_floor": lambda r: r > 0.5, "round_prefer_ceil": lambda r: r >= 0.5,
           "floor": lambda r: r >= 1, "ceil": lambda r: r > 0}


def resize(n: Node) -> None:
    """Each resized axis in turn, as onnx's reference resizes it: the output positions mapped
    back onto the input (coordinate_transformation_mode); nearest a GATHER of the inputs they
    take, linear and cubic a MATMUL with the axis's interpolation weights [out, in] computed here
    (on the array; each row sums its few taps and zeros, as exact as gathers and products)."""
    from dfx.dtypes import is_integer

    mode, transform = n.str_attr("mode", "nearest"), n.str_attr("coordinate_transformation_mode", "half_pixel")
    nearest, antialias = n.str_attr("nearest_mode", "round_prefer_floor"), bool(n.int_attr("antialias", 0))
    if mode not in ("nearest", "linear", "cubic"):
        raise n.fail(f"mode {mode!r:.40} is not nearest, linear or cubic")
    if transform not in RESIZE_TRANSFORMS:
        raise n.fail(f"coordinate_transformation_mode {transform!r:.40} is not supported (these are: "
                     f"{', '.join(RESIZE_TRANSFORMS)})")
    if mode == "nearest" and nearest not in NEAREST:
        raise n.fail(f"nearest_mode {nearest!r:.40} is not one of {', '.join(NEAREST)}")
    if mode == "nearest" and antialias:
        raise n.fail("antialias applies to the linear and cubic modes, not to nearest")
    if mode != "nearest" and is_integer(n.input_dtype(0)):
        raise n.fail(f"{mode} Resize of {n.input_dtype(0)} data is not supported (its weights are fractions)")
    shape = n.shape(0)
    steps = []  # (axis, the input positions it gathers or its weights), each axis that changes
    for axis, (d, size, scale) in enumerate(zip(shape, *_resize_plan(n, shape))):
        if size == d and math.isclose(scale, 1.0):
            continue  # kept as it is, as the reference keeps it
        _computed_here(n, size if mode == "nearest" else size * d, f"its table for dim {axis}")
        source = _source_positions(transform, size, d, scale)
        base = np.floor(source) - (source == np.floor(source))  # f of f + r, 0 < r <= 1
        if mode == "nearest":
            picks = np.clip(base + NEAREST[nearest](source - base), 0, d - 1).astype(np.int64)
            if not np.array_equal(picks, np.arange(d)):
                steps.append((axis, picks))
        else:
            steps.append((axis, _resize_weights(n, mode, base, source - base, d, scale, antialias)))
    if not steps:
        _identity(n)
        return
    y = n.x(0)
    for k, (axis, table) in enumerate(steps):
        out = 0 if k == len(steps) - 1 else None
        y = (n.emit("GATHER", [y], out=out, axis=axis, indices=[int(i) for i in table]) if table.ndim == 1
             else _interpolate(n, y, axis, table, out))


def upsample(n: Node) -> None:
    """A model of opsets 7 to 9 has its Upsamples upgraded to Resizes before they are mapped; a
    newer one may not use the op."""
    raise n.fail(f"Upsample is deprecated from opset 10 (Resize does its work); the model imports opset {n.opset}")


def _resize_plan(n: Node, shape: tuple[int, ...]) -> tuple[list[int], list[float]]:
    """Each dim's size after the resize and its scale, from the constant scales or sizes (of the
    dims `axes` names, from opset 18), as onnx's reference reads them."""
    rank = len(shape)
    axes = [_axis(n, a, rank) for a in n.ints_attr("axes", list(range(rank)))]
    if len(set(axes)) < len(axes):
        raise n.fail(f"axes {n.ints_attr('axes')} name a dim twice")
    given = {}
    for i, what in ((2, "scales"), (3, "sizes")):
        value = n.value(i)
        if n.has(i) and value is None:
            raise n.fail(f"its {what} (input {i}) must be a constant: the ONNX frontend reads them at compile time")
        if value is not None and value.size:
            given[what] = value.reshape(-1)
    if len(given) != 1:
        raise n.fail("gives both scales and sizes" if given else "gives neither scales nor sizes")
    [(what, values)] = given.items()
    if len(values) != len(axes):
        raise n.fail(f"its {what} has {len(values)} entries for {len(axes)} dims")
    sizes, scales = list(shape), [1.0] * rank
    if what == "scales":
        for a, s in zip(axes, values):
            if not 0 < s < math.inf:
                raise n.fail(f"scale {s} is not a positive number")
            scales[a], sizes[a] = float(s), int(float(s) * shape[a])
        return sizes, scales
    if min(values) < 1:
        raise n.fail(f"sizes {[int(v) for v in values]} are not all >= 1")
    ratios = [int(v) / shape[a] for a, v in zip(axes, values)]
    policy = n.str_attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise n.fail(f"keep_aspect_ratio_policy {policy!r:.40} is not stretch, not_larger or not_smaller")
    for a, v, ratio in zip(axes, values, ratios):
        if policy == "stretch":
            scales[a], sizes[a] = ratio, int(v)
        else:  # one scale for all the axes, the sizes rounded from it
            scales[a] = min(ratios) if policy == "not_larger" else max(ratios)
            sizes[a] = int(scales[a] * shape[a] + 0.5)
    return sizes, scales


def _source_positions(transform: str, size: int, d: int, scale: float) -> np.ndarray:
    """Where each of `size` outputs along a dim of `d` inputs sits on the input (float64)."""
    y = np.arange(size, dtype=np.float64)
    width = scale * d  # the reference's output length, before rounding
    if transform == "align_corners":
        return np.zeros(size) if width == 1 else y * (d - 1) / (width - 1)
    if transform == "asymmetric":
        return y / scale
    if transform == "pytorch_half_pixel" and width == 1:
        return np.full(size, -0.5)
    offset = d / 2 * (1 - size / width) if transform == "half_pixel_symmetric" else 0.0
    return offset + (y + 0.5) / scale - 0.5


def _resize_weights(n: Node, mode: str, base: np.ndarray, r: np.ndarray, d: int, scale: float,
                    antialias: bool) -> np.ndarray:
    """One axis's interpolation weights [outputs, d]: the output at base + r weighs input base + i
    by the mode's kernel at i - r (its taps stretched by 1 / scale where antialias shrinks, and
    normalised); a tap past the input's edge weighs the edge's input (exclude_outside: none, the
    others normalised)."""
    a = n.float_attr("cubic_coeff_a", -0.75)

    def cubic(t: np.ndarray) -> np.ndarray:
        t = np.abs(t)
        near, far = ((a + 2) * t - (a + 3)) * t * t + 1, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
        return np.where(t <= 1, near, np.where(t < 2, far, 0.0))

    support, kernel = (1, lambda t: np.clip(1 - np.abs(t), 0, 1)) if mode == "linear" else (2, cubic)
    stretch = min(scale, 1.0) if antialias else 1.0
    first = math.floor(-support / stretch) + 1
    _computed_here(n, len(r) * (2 - 2 * first), "its interpolation taps")
    taps = np.arange(first, 2 - first)
    weights = kernel(stretch * (taps - r[:, None]))
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    inputs = base.astype(np.int64)[:, None] + taps
    if n.int_attr("exclude_outside", 0):
        weights = np.where((inputs < 0) | (inputs >= d), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    matrix = np.zeros((len(r), d))
    np.add.at(matrix, (np.arange(len(r))[:, None], np.clip(inputs, 0, d - 1)), weights)
    return matrix


def _interpolate(n: Node, x: str, axis: int, weights: np.ndarray, out: int | None) -> str:
    """x contracted along `axis` with `weights` [outputs, inputs]: the last axis as rows of x
    times the weights transposed, another as the weights times x's [before, inputs, after]."""
    shape = n.shape(x)
    before, after = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    dtype = n.input_dtype(x)
    if after == 1:
        rows = n.reshape(x, (before, shape[axis]))
        y = n.emit("MATMUL", [rows, n.constant(np.ascontiguousarray(weights.T), dtype, "weights")])
    else:
        columns = n.reshape(x, (before, shape[axis], after) if before > 1 else (shape[axis], after))
        y = n.emit("MATMUL", [n.constant(weights, dtype, "weights"), columns])
    return n.reshape(y, (*shape[:axis], weights.shape[0], *shape[axis + 1:]), out=out)


def constant(n: Node) -> None:
    raise n.fail("could not be evaluated")  # Constant nodes are evaluated by the builder


def constant_of_shape(n: Node) -> None:
    """A known value; past the fold limit (the onnx package's light VGG-19 makes its 102 M-element
    weights so) computed on the KPU, as the product of the value over the leading dims and ones over
    the others: two constants about the square root of its size, neither held by the compiler."""
    from onnx import numpy_helper

    from .onnx import FOLD_LIMIT

    shape = n.ints(0, "shape")
    fill = n.attr("value")
    value = numpy_helper.to_array(fill).reshape(-1)[:1] if fill is not None else np.zeros(1, np.float32)
    if math.prod(shape) <= FOLD_LIMIT:
        n.alias(n.known(np.full(shape, value[0], value.dtype), "filled"))
        return
    rank = len(shape)
    lead = min(range(rank + 1), key=lambda k: max(math.prod(shape[:k]), math.prod(shape[k:])))
    if max(math.prod(shape[:lead]), math.prod(shape[lead:])) > FOLD_LIMIT:
        raise n.fail(f"its result would hold {math.prod(shape):,} elements, more than the {FOLD_LIMIT:,} the ONNX "
                     f"frontend folds at compile time, and its dims {shape} split into no two parts of at most that")
    values = np.full(shape[:lead] + [1] * (rank - lead), value[0], value.dtype)
    n.emit("MUL", [n.constant(values, n.dtype, "value"), n.constant(np.ones([1] * lead + shape[lead:]), n.dtype, "ones")],
           out=0)


def fold_only(n: Node) -> None:
    """An op the builder evaluates (FOLD_ONLY) where its inputs are known: here one is not."""
    from .onnx import _clip

    i = next((i for i in range(len(n.proto.input)) if n.has(i) and n.value(i) is None), 0)
    raise n.fail(f"its input {i} ('{_clip(n.name(i))}') must be a constant: the ONNX frontend evaluates "
                 f"{n.op_type} at compile time")


# op type -> what is wrong with a node's attributes, checked before onnx's shape inference reads them
PRECHECKS: dict[str, Callable[[Any], str | None]] = {"Einsum": einsum_equation}


# evaluated at compile time only (Shape, Size and EyeLike from their input's shape alone: XLNet's
# legacy export masks with an EyeLike; ScatterND of constants: Swin's shifted windows' mask)
FOLD_ONLY = frozenset({"Shape", "Size", "EyeLike", "Range", "ScatterND"})


# ONNX op type -> its mapping
OPS: dict[str, Callable[[Node], None]] = {
    # maps
    "Relu": _unary("RELU"), "Sigmoid": _unary("SIGMOID"), "Tanh": _unary("TANH"), "Erf": _unary("ERF"),
    "Sqrt": _unary("SQRT"), "Exp": _unary("EXP"), "Log": _unary("LOG"), "Neg": _unary("NEGATE"),
    "Sin": _unary("SIN"), "Cos": _unary("COS"), "Tan": _unary("TAN"),
    "Abs": _unary("ABS"), "Reciprocal": _unary("RECIPROCAL"), "LeakyRelu": leaky_relu, "Gelu": gelu,
    "Add": _binary("ADD"), "Sub": _binary("SUB"), "Mul": _binary("MUL"), "Div": _binary("DIV"),
    "Pow": _binary("POW"), "Min": _variadic("MINIMUM"), "Max": _variadic("MAXIMUM"), "Clip": clip,
    "Equal": _binary("EQUAL"), "Less": _binary("LESS"), "Greater": _binary("GREATER"),
    "LessOrEqual": _binary("LESS_EQUAL"), "GreaterOrEqual": _binary("GREATER_EQUAL"), "Where": where,
    "Cast": cast,
    "HardSigmoid": hard_sigmoid, "HardSwish": _unary("HARD_SWISH"), "Softplus": _unary("SOFTPLUS"), "Elu": elu,
    "Selu": selu, "Mish": _unary("MISH"), "PRelu": _binary("PRELU"), "Floor": _unary("FLOOR"),
    "Ceil": _unary("CEIL"), "Round": _unary("ROUND"), "Sign": _unary("SIGN"), "Mod": mod,
    "IsNaN": _unary("IS_NAN"), "IsInf": is_inf, "And": _binary("LOGICAL_AND"), "Or": _binary("LOGICAL_OR"),
    "Xor": _binary("LOGICAL_XOR"), "Not": _unary("LOGICAL_NOT"), "Sum": _variadic("ADD"), "Mean": mean,
    # contractions and windows
    "MatMul": matmul, "Gemm": gemm, "Conv": conv, "ConvTranspose": conv_transpose,
    "MaxPool": _pool("max"), "AveragePool": _pool("average"), "GlobalAveragePool": global_average_pool,
    # rows and reductions
    "Softmax": _softmax("SOFTMAX"), "LogSoftmax": _softmax("LOG_SOFTMAX"),
    "LayerNormalization": layer_normalization, "BatchNormalization": batch_normalization,
    "ReduceSum": _reduce("SUM"), "ReduceMean": _reduce("MEAN"), "ReduceMax": _reduce("MAX"),
    "ReduceMin": _reduce("MIN"), "ReduceProd": _reduce("PROD"), "ReduceL1": reduce_l1, "ReduceL2": reduce_l2,
    "ReduceSumSquare": lambda n: _sum_of_squares(n, out=0), "ReduceLogSumExp": reduce_log_sum_exp,
    "ArgMax": _arg("MAX"), "ArgMin": _arg("MIN"), "CumSum": cum_sum, "Trilu": trilu, "LRN": lrn,
    "GlobalMaxPool": global_max_pool, "InstanceNormalization": instance_normalization, "TopK": top_k,
    "GroupNormalization": group_normalization,
    # layout
    "Identity": _identity, "Transpose": transpose, "Reshape": reshape, "Flatten": flatten, "Squeeze": squeeze,
    "Unsqueeze": unsqueeze, "Concat": concat, "Split": split, "Slice": slice_, "Pad": pad, "Gather": gather,
    "Constant": constant, "Dropout": dropout,
    "GatherElements": gather_elements, "GatherND": gather_nd, "Expand": expand, "Tile": tile, "Einsum": einsum,
    "Resize": resize, "Upsample": upsample,
    # folded
    "ConstantOfShape": constant_of_shape, **{op: fold_only for op in FOLD_ONLY},
}

# the quantized ops have a module of their own, which builds on `convolve` above
from .onnx_quantized import MICROSOFT, MICROSOFT_OPS, QUANTIZED_OPS  # noqa: E402

OPS.update(QUANTIZED_OPS)
# (domain, op type) of another domain than ONNX's -> its mapping
DOMAIN_OPS: dict[tuple[str, str], Callable[[Node], None]] = {(MICROSOFT, op): fn for op, fn in MICROSOFT_OPS.items()}
