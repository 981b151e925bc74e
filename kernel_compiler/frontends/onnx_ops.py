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
from typing import TYPE_CHECKING, Callable

import numpy as np

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


def _from_2d(n: Node, y: str, d: int, out: int = 0) -> str:
    """The 2-D result back as 1-D where the input was, written to output `out`."""
    if d == 2:
        return y
    shape = n.shape(y)
    return n.reshape(y, (*shape[:2], shape[3]), out=out)


def conv(n: Node) -> None:
    d = _spatial(n, "Conv")
    x, w = n.x(0), n.x(1)
    kernel = list(n.shape(1)[2:])
    if len(kernel) != d:
        raise n.fail(f"weights {list(n.shape(1))} do not match the {d}-D input {list(n.shape(0))}")
    _kernel_shape_is(n, kernel)
    strides, dilations = _per_dim(n, "strides", d), _per_dim(n, "dilations", d)
    spans = [(k - 1) * dil + 1 for k, dil in zip(kernel, dilations)]
    padding = _padding(n, list(n.shape(0)[2:]), spans, strides)
    if d == 1:
        strides, dilations, padding = [1, *strides], [1, *dilations], [[0, 0], *padding]
    bias = [n.x(2)] if n.has(2) else []
    y = n.emit("CONV2D", [_as_2d(n, x, d), _as_2d(n, w, d), *bias], out=0 if d == 2 else None, layout="NCHW",
               stride=strides, dilation=dilations, padding=padding, groups=n.int_attr("group", 1))
    _from_2d(n, y, d)


def conv_transpose(n: Node) -> None:
    """The gradient of a convolution, as one: the input with stride - 1 zeros between its
    elements (a RESHAPE, a PAD and a RESHAPE), padded by span - 1 - pads, convolved at stride 1
    with the weights [C, M/g, kh, kw] as [M, C/g, kh, kw], flipped along kh and kw."""
    d = _spatial(n, "ConvTranspose")
    x, w = n.x(0), n.x(1)
    n_, c, *sizes = n.shape(0)
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
    # the zero-stuffed input: each element followed by stride - 1 zeros (the last ones cut below)
    x = _as_2d(n, x, d)
    strides2 = [1] * (2 - d) + strides
    h, wd = n.shape(x)[2:]
    if any(s > 1 for s in strides2):
        spread = n.reshape(x, (n_, c, h, 1, wd, 1))
        padded = n.emit("PAD", [spread], padding=[[0, 0], [0, 0], [0, 0], [0, strides2[0] - 1], [0, 0],
                                                  [0, strides2[1] - 1]])
        x = n.reshape(padded, (n_, c, h * strides2[0], wd * strides2[1]))
    # conv padding: span - 1 - pads before; after, also output_padding, less the zeros already there
    padding, crop = [], []
    for i, (span, (before, after), op, s) in enumerate(zip(spans, cut, output_padding, strides)):
        lo, hi = span - 1 - before, span - 1 - after + op - (s - 1)
        padding.append([max(lo, 0), max(hi, 0)])
        crop.append((max(-lo, 0), max(-hi, 0)))
    if any(a or b for a, b in crop):
        extent = n.shape(x)[2:][-d:]
        start = [0, 0] + [0] * (2 - d) + [a for a, _ in crop]
        size = [-1, -1] + [-1] * (2 - d) + [e - a - b for e, (a, b) in zip(extent, crop)]
        x = n.emit("SLICE", [x], start=start, size=size)
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
    op = {"max": "MAXPOOL2D", "average": "AVGPOOL2D"}[kind]

    def pool(n: Node) -> None:
        d = _spatial(n, f"{n.op_type}")
        if n.used(1):
            raise n.fail("its Indices output is not supported")
        kernel = n.ints_attr("kernel_shape")
        if kernel is None or len(kernel) != d:
            raise n.fail(f"kernel_shape {kernel} does not give the {d} spatial dims")
        strides = _per_dim(n, "strides", d)
        if any(v != 1 for v in _per_dim(n, "dilations", d)):
            raise n.fail("dilated pooling is not supported (the registry's pools have no dilation)")
        sizes = list(n.shape(0)[2:])
        padding = _padding(n, sizes, kernel, strides)
        count_include_pad = bool(n.int_attr("count_include_pad", 0))
        if n.int_attr("ceil_mode", 0):
            # the last window may run past the end: one more output where it starts inside the
            # input or its padding before, its extra reach padding the pools leave out
            for i, (size, k, s) in enumerate(zip(sizes, kernel, strides)):
                before, after = padding[i]
                floor_out = (size + before + after - k) // s + 1
                out = -(-(size + before + after - k) // s) + 1
                if (out - 1) * s >= size + before:
                    out -= 1
                extra = max(0, (out - 1) * s + k - (size + before + after))
                if extra and kind == "average" and count_include_pad:
                    raise n.fail("ceil_mode with count_include_pad is not supported (the windows past the end "
                                 "would count padding the model does not have)")
                padding[i] = [before, after + extra] if out > floor_out else [before, after]
        if d == 1:
            kernel, strides, padding = [1, *kernel], [1, *strides], [[0, 0], *padding]
        nhwc = n.emit("TRANSPOSE", [_as_2d(n, n.x(0), d)], perms=NCHW_TO_NHWC)
        attrs = {"count_include_pad": count_include_pad} if kind == "average" else {}
        pooled = n.emit(op, [nhwc], kernel=kernel, stride=strides, padding=padding, **attrs)
        y = n.emit("TRANSPOSE", [pooled], out=0 if d == 2 else None, perms=NHWC_TO_NCHW)
        _from_2d(n, y, d)

    return pool


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


def _reduce(kind: str) -> Callable[[Node], None]:
    since = 13 if kind == "SUM" else 18  # the opset from which axes are an input

    def reduce(n: Node) -> None:
        if n.opset >= since:
            axes = n.ints(1, "axes") if n.has(1) else None
        else:
            axes = n.ints_attr("axes")
        if not axes:
            if n.int_attr("noop_with_empty_axes", 0):
                _identity(n)
                return
            axes = None
        n.emit(f"REDUCE_{kind}", [n.x(0)], out=0, axes=axes, keepdims=bool(n.int_attr("keepdims", 1)))

    return reduce


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
    steps = []  # (op, attrs) in turn
    if box_start != [0] * len(shape) or any(s not in (-1, d) for s, d in zip(box_size, shape)):
        steps.append(("SLICE", {"start": box_start, "size": box_size}))
    steps += [("GATHER", {"axis": axis, "indices": indices}) for axis, indices in gathers]
    if not steps:
        _identity(n)
        return
    y = n.x(0)
    for k, (op, attrs) in enumerate(steps):
        y = n.emit(op, [y], out=0 if k == len(steps) - 1 else None, **attrs)


def gather(n: Node) -> None:
    """GATHER takes its indices as an attribute: they must be constants. Indices of rank r
    other than 1 are gathered flat, then RESHAPEd into their place."""
    indices = n.value(1)
    if indices is None:
        raise n.fail("its indices must be a constant (the registry's GATHER takes them as an attribute)")
    shape = n.shape(0)
    axis = _axis(n, n.int_attr("axis", 0), len(shape))
    flat = [int(i) for i in indices.reshape(-1)]
    final = (*shape[:axis], *indices.shape, *shape[axis + 1:])
    if indices.ndim == 1:
        n.emit("GATHER", [n.x(0)], out=0, axis=axis, indices=flat)
        return
    n.reshape(n.emit("GATHER", [n.x(0)], axis=axis, indices=flat), final, out=0)


def constant(n: Node) -> None:
    raise n.fail("could not be evaluated")  # Constant nodes are evaluated by the builder


def fold_only(n: Node) -> None:
    """An op the builder evaluates (FOLD_ONLY) where its inputs are known: here one is not."""
    from .onnx import _clip

    i = next((i for i in range(len(n.proto.input)) if n.has(i) and n.value(i) is None), 0)
    raise n.fail(f"its input {i} ('{_clip(n.name(i))}') must be a constant: the ONNX frontend evaluates "
                 f"{n.op_type} at compile time")


# evaluated at compile time only (Shape and Size from their input's shape alone)
FOLD_ONLY = frozenset({"Shape", "Size", "ConstantOfShape", "Range", "Expand", "Tile", "ReduceProd"})


# ONNX op type -> its mapping
OPS: dict[str, Callable[[Node], None]] = {
    # maps
    "Relu": _unary("RELU"), "Sigmoid": _unary("SIGMOID"), "Tanh": _unary("TANH"), "Erf": _unary("ERF"),
    "Sqrt": _unary("SQRT"), "Exp": _unary("EXP"), "Log": _unary("LOG"), "Neg": _unary("NEGATE"),
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
    "ReduceMin": _reduce("MIN"),
    # layout
    "Identity": _identity, "Transpose": transpose, "Reshape": reshape, "Flatten": flatten, "Squeeze": squeeze,
    "Unsqueeze": unsqueeze, "Concat": concat, "Split": split, "Slice": slice_, "Gather": gather,
    "Constant": constant, "Dropout": dropout,
    # folded
    **{op: fold_only for op in FOLD_ONLY},
}
