"""The HLO frontend's op table: each opcode, by one small function, as registry ops.

A handler gets the builder, the instruction and its operands' values and returns the value it
makes; what an op computes is the registry's (dfx/ops/), never restated here.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np

from dfx import dtypes
from dfx.ops import REGISTRY, reduction

from .hlo_build import MAX_MADE_CONSTANT, AnyValue, Builder, Value, made_of
from .hlo_text import INT_TEXT, MAX_INT_DIGITS, Computation, HloType, Instr, Shape, clip, int_value, type_text

# ---- the opcode tables -----------------------------------------------------------------------

UNARY = {"exponential": "EXP", "log": "LOG", "rsqrt": "RSQRT", "sqrt": "SQRT", "tanh": "TANH",
         "logistic": "SIGMOID", "erf": "ERF", "negate": "NEGATE", "abs": "ABS"}
BINARY = {"add": "ADD", "subtract": "SUB", "multiply": "MUL", "divide": "DIV", "maximum": "MAXIMUM",
          "minimum": "MINIMUM", "power": "POW"}
# pred only: 0/1 bytes, where and is a product and or a maximum
PRED_BINARY = {"and": "MUL", "or": "MAXIMUM"}
# the map ops that keep 0/1 operands 0 or 1: the others (add, subtract, ...) may not make a pred
PRED_CLOSED = frozenset({"MUL", "MAXIMUM", "MINIMUM", "SELECT"})
# compare's direction -> the registry's comparison; NE is 1 - EQUAL
COMPARISONS = {"EQ": "EQUAL", "LT": "LESS", "LE": "LESS_EQUAL", "GT": "GREATER", "GE": "GREATER_EQUAL", "NE": "EQUAL"}
# a reduce's to_apply root -> (the REDUCE_* op, the map op that combines an init value in)
REDUCERS = {"add": ("REDUCE_SUM", "ADD"), "multiply": ("REDUCE_PROD", "MUL"), "maximum": ("REDUCE_MAX", "MAXIMUM"),
            "minimum": ("REDUCE_MIN", "MINIMUM"), "or": ("REDUCE_MAX", "MAXIMUM"), "and": ("REDUCE_MIN", "MINIMUM")}
# opcodes whose result has the element type of their operands, which share one (select's and
# clamp's all but the predicate): HLO restates it, and a result declared of another type is not
# what the op makes (no op converts but convert). compare's result is pred.
SAME_ELEMENT = frozenset({*UNARY, *BINARY, *PRED_BINARY, "not", "select", "clamp", "compare", "copy", "broadcast",
                          "reshape", "transpose", "slice", "concatenate", "pad", "reduce"})
# opcodes XLA defines on floating-point operands only (its shape inference refuses an integer one)
FLOAT_ONLY = frozenset({"exponential", "log", "rsqrt", "sqrt", "tanh", "logistic", "erf"})
# opcodes whose value is a whole tensor (never a broadcast left to its readers): its shape must
# be the declared one exactly
WHOLE = frozenset({"reshape", "bitcast", "transpose", "slice", "concatenate", "pad", "reduce", "dot", "convolution"})
# the attribute naming the computation each inlined opcode calls
CALLS = {"fusion": "calls", "call": "to_apply"}
assert all(op in REGISTRY for table in (UNARY, BINARY, PRED_BINARY, COMPARISONS) for op in table.values())
assert all(op in REGISTRY for pair in REDUCERS.values() for op in pair)


_SLICE_DIM = re.compile(r"\[\s*(-?[0-9]+)\s*:\s*(-?[0-9]+)\s*(?::\s*(-?[0-9]+)\s*)?\]")
_PAD_DIM = re.compile(r"(-?[0-9]+)_(-?[0-9]+)(?:_(-?[0-9]+))?")
_DXD = re.compile(r"[0-9]+(?:x[0-9]+)*")
_DIM_LABELS = re.compile(r"([0-9bf]+)_([0-9io]+)->([0-9bf]+)")


# ---- handlers: one per opcode ----------------------------------------------------------------

Handler = Callable[[Builder, Instr, list], AnyValue]


def _constant(b: Builder, ins: Instr, args: list) -> Value:
    dims, dtype = b.result(ins)
    values = _literal_array(b, ins, dims, dtype)
    return Value(b.constant(b.own_name(ins), values, dtype, own=True), dims, dtype)


def _literal_array(b: Builder, ins: Instr, dims: tuple[int, ...], dtype: str) -> np.ndarray:
    flat: list[str] = []

    def walk(node: Any, depth: int) -> None:
        if depth == len(dims):
            if isinstance(node, list):
                raise b.fail(ins, f"{b.where(ins)}: the value has more levels of '{{}}' than the shape "
                                  f"{list(dims)} has dimensions")
            flat.append(node)
            return
        if not isinstance(node, list) or len(node) != dims[depth]:
            got = f"{len(node)} values" if isinstance(node, list) else f"'{clip(node)}'"
            raise b.fail(ins, f"{b.where(ins)}: dimension {depth} of the shape {list(dims)} needs "
                              f"{dims[depth]} values, the constant gives {got}")
        for item in node:
            walk(item, depth + 1)

    walk(ins.literal, 0)
    element = ins.type.element
    if element == "pred":
        bits = {"true": 1, "false": 0, "1": 1, "0": 0}
        bad = next((v for v in flat if v not in bits), None)
        if bad is not None:
            raise b.fail(ins, f"{b.where(ins)}: '{clip(bad)}' is not a pred value (true, false, 1, 0)")
        return np.asarray([bits[v] for v in flat], np.uint8).reshape(dims)
    if dtypes.is_integer(dtype):
        info = np.iinfo(dtypes.numpy_dtype(dtype))
        ints = []
        for v in flat:
            n = int_value(v) if INT_TEXT.fullmatch(v) else None
            if n is None or not info.min <= n <= info.max:
                raise b.fail(ins, f"{b.where(ins)}: '{clip(v)}' is not a {element} value")
            ints.append(n)
        return np.asarray(ints, np.int64).astype(dtypes.numpy_dtype(dtype)).reshape(dims)
    numbers = []
    for v in flat:
        if v in ("true", "false"):
            raise b.fail(ins, f"{b.where(ins)}: '{v}' is not a {element} value")
        numbers.append(float(v))
    with np.errstate(all="ignore"):  # beyond the dtype's range: inf, as XLA rounds
        return np.asarray(numbers, np.float64).astype(dtypes.numpy_dtype(dtype)).reshape(dims)


def _iota(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 0)
    dims, dtype = b.result(ins)
    axis = b.int_attr(ins, "iota_dimension")
    b.axes(ins, "iota_dimension", [axis], len(dims), "result")
    if dims[axis] > MAX_MADE_CONSTANT:
        raise b.fail(ins, f"{b.where(ins)}: {dims[axis]} values are more than the {MAX_MADE_CONSTANT} a "
                          "constant made by the compiler may have")
    # the values along `axis` only, broadcast to the rest by whoever reads them
    shape = tuple(d if k == axis else 1 for k, d in enumerate(dims))[axis:]
    values = np.arange(dims[axis]).reshape(shape)
    with np.errstate(all="ignore"):
        values = values.astype(dtypes.numpy_dtype(dtype))
    return Value(b.constant(b.own_name(ins), values, dtype, own=True), dims, dtype)


def _map(op_type: str, arity: int) -> Handler:
    def handler(b: Builder, ins: Instr, args: list) -> Value:
        b.arity(ins, args, arity)
        if isinstance(ins.type, Shape) and ins.type.element == "pred" and op_type not in PRED_CLOSED:
            # a pred holds 0 or 1 in a byte: arithmetic on it would leave other values there
            raise b.fail(ins, f"{b.where(ins)}: '{ins.opcode}' on pred is not supported (and, or, not are)")
        dims, dtype = b.result(ins)
        return Value(b.op(ins, op_type, _elementwise_args(b, ins, args, dims), {}, dtype), dims, dtype)
    return handler


def _pred_map(op_type: str, arity: int) -> Handler:
    def handler(b: Builder, ins: Instr, args: list) -> Value:
        if not isinstance(ins.type, Shape) or ins.type.element != "pred":
            raise b.fail(ins, f"{b.where(ins)}: '{ins.opcode}' is supported on pred only (bitwise "
                              f"{ins.opcode} on integers is not in the registry)")
        return _map(op_type, arity)(b, ins, args)
    return handler


def _not(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    if not isinstance(ins.type, Shape) or ins.type.element != "pred":
        raise b.fail(ins, f"{b.where(ins)}: 'not' is supported on pred only")
    dims, dtype = b.result(ins)
    [x] = _elementwise_args(b, ins, args, dims)
    return Value(b.op(ins, "SUB", [b.scalar(ins, 1, "u8"), x], {}, dtype), dims, dtype)


def _array_arg(b: Builder, ins: Instr, arg: AnyValue) -> Value:
    if not isinstance(arg, Value):
        raise b.fail(ins, f"{b.where(ins)}: an operand is a tuple, an array is needed")
    return arg


def _elementwise_args(b: Builder, ins: Instr, args: list, dims: tuple[int, ...]) -> list[str]:
    """The tensors of an elementwise op's operands, each of the result's shape (or a scalar)."""
    tensors = []
    for i, arg in enumerate(args):
        value = _array_arg(b, ins, arg)
        if value.shape not in (dims, ()):
            raise b.fail(ins, f"{b.where(ins)}: operand {i} is {value.dtype}{list(value.shape)}, the result "
                              f"{list(dims)}")
        tensors.append(value.tensor)
    return tensors


def _compare(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    direction = b.attr(ins, "direction")
    if direction not in COMPARISONS:
        raise b.fail(ins, f"{b.where(ins)}: direction={clip(direction)} is not one of {', '.join(COMPARISONS)}")
    x, y = _elementwise_args(b, ins, args, dims)
    if direction != "NE":
        return Value(b.op(ins, COMPARISONS[direction], [x, y], {}, dtype), dims, dtype)
    equal = b.op(ins, "EQUAL", [x, y], {}, dtype, step="eq")
    return Value(b.op(ins, "SUB", [b.scalar(ins, 1, dtype), equal], {}, dtype), dims, dtype)


def _clamp(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 3)
    dims, dtype = b.result(ins)
    low, x, high = _elementwise_args(b, ins, args, dims)
    at_least = b.op(ins, "MAXIMUM", [x, low], {}, dtype, step="max")
    return Value(b.op(ins, "MINIMUM", [at_least, high], {}, dtype), dims, dtype)


def _convert(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    _elementwise_args(b, ins, args, dims)
    x = args[0]
    if ins.type.element == "pred":  # x != 0, whatever x is
        zero = b.scalar(ins, 0, x.dtype)
        equal = b.op(ins, "EQUAL", [x.tensor, zero], {}, dtype, step="eq")
        return Value(b.op(ins, "SUB", [b.scalar(ins, 1, dtype), equal], {}, dtype), dims, dtype)
    if x.dtype == dtype:
        return Value(x.tensor, dims, dtype)
    return Value(b.op(ins, "CAST", [x.tensor], {"dtype": dtype}, dtype), dims, dtype)


def _copy(b: Builder, ins: Instr, args: list) -> AnyValue:
    b.arity(ins, args, 1)
    return args[0]


def _broadcast(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    where = b.ints(ins, "dimensions", default=[])
    if len(where) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: dimensions={{{','.join(map(str, where))}}} has {len(where)} entries "
                          f"for the rank-{len(x.shape)} operand")
    b.axes(ins, "dimensions", where, len(dims), "result")
    for k, d in enumerate(where):
        if x.shape[k] not in (1, dims[d]):
            raise b.fail(ins, f"{b.where(ins)}: operand dimension {k} ({x.shape[k]}) does not broadcast to result "
                              f"dimension {d} ({dims[d]})")
    # the operand's tensor, padded to its HLO rank, its dims put in the order they take in the result
    have = b.shape(x.tensor)
    padded = (1,) * (len(x.shape) - len(have)) + have
    order = sorted(range(len(where)), key=lambda k: where[k])
    tensor = x.tensor
    if order != list(range(len(order))):
        tensor = b.transpose(ins, b.reshape(ins, tensor, padded, "rank"), order, "order")
        padded = tuple(padded[k] for k in order)
    placed = [1] * len(dims)
    for position, size in zip(sorted(where), padded):
        placed[position] = size
    # right-aligned, leading 1s say nothing to numpy's broadcasting: a tensor that places its dims
    # so already stays as it is; else it is reshaped to the result's rank
    if _strip(b.shape(tensor)) != _strip(tuple(placed)):
        tensor = b.reshape(ins, tensor, tuple(placed), None)
    return Value(tensor, dims, dtype)


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its leading 1s."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return shape[k:]


def _reshape(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    if math.prod(x.shape) != math.prod(dims):
        raise b.fail(ins, f"{b.where(ins)}: cannot reshape {list(x.shape)} ({math.prod(x.shape)} elements) to "
                          f"{list(dims)} ({math.prod(dims)} elements)")
    if ins.opcode == "bitcast" and x.dtype != dtype:
        raise b.fail(ins, f"{b.where(ins)}: a bitcast from {x.dtype} to {dtype} reinterprets bits, which is not "
                          "supported (only a bitcast that reshapes)")
    return Value(b.reshape(ins, b.full(ins, x), dims, None), dims, dtype)


def _transpose(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    perm = b.ints(ins, "dimensions")
    if sorted(perm) != list(range(len(x.shape))):
        raise b.fail(ins, f"{b.where(ins)}: dimensions={{{','.join(map(str, perm))}}} is not a permutation of the "
                          f"rank-{len(x.shape)} operand's dimensions")
    return Value(b.transpose(ins, b.full(ins, x), perm, None), dims, dtype)


def _dot(b: Builder, ins: Instr, args: list) -> Value:
    """lhs [batch, free, contracted] and rhs [batch, contracted, free] (each transposed where
    they are not in that order), reshaped to [batch..., M, K] and [batch..., K, N]; the MATMUL's
    [batch..., M, N] reshaped to HLO's result [batch..., lhs free..., rhs free...]."""
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    lhs, rhs = (_array_arg(b, ins, a) for a in args)
    batch = b.ints(ins, "lhs_batch_dims", []), b.ints(ins, "rhs_batch_dims", [])
    contracted = b.ints(ins, "lhs_contracting_dims", []), b.ints(ins, "rhs_contracting_dims", [])
    for side, x in enumerate((lhs, rhs)):
        which = ("lhs", "rhs")[side]
        b.axes(ins, f"{which}_batch_dims and {which}_contracting_dims", batch[side] + contracted[side],
               len(x.shape), f"{which} {list(x.shape)}")
    for kind, (l_dims, r_dims) in (("batch", batch), ("contracting", contracted)):
        sizes = [lhs.shape[d] for d in l_dims], [rhs.shape[d] for d in r_dims]
        if sizes[0] != sizes[1]:
            raise b.fail(ins, f"{b.where(ins)}: {kind} dimensions differ: lhs {sizes[0]}, rhs {sizes[1]}")
    free = [[d for d in range(len(x.shape)) if d not in batch[s] + contracted[s]] for s, x in enumerate((lhs, rhs))]
    batch_sizes = [lhs.shape[d] for d in batch[0]]
    m = math.prod(lhs.shape[d] for d in free[0])
    n = math.prod(rhs.shape[d] for d in free[1])
    k = math.prod(lhs.shape[d] for d in contracted[0])
    a = b.transpose(ins, b.full(ins, lhs), batch[0] + free[0] + contracted[0], "lhs")
    a = b.reshape(ins, a, (*batch_sizes, m, k), "lhs")
    w = b.transpose(ins, b.full(ins, rhs), batch[1] + contracted[1] + free[1], "rhs")
    w = b.reshape(ins, w, (*batch_sizes, k, n), "rhs")
    want = (*batch_sizes, *(lhs.shape[d] for d in free[0]), *(rhs.shape[d] for d in free[1]))
    if want != dims:
        raise b.fail(ins, f"{b.where(ins)}: declares {list(dims)}, the dot of {list(lhs.shape)} and "
                          f"{list(rhs.shape)} gives {list(want)}")
    product = (*batch_sizes, m, n)
    c = b.op(ins, "MATMUL", [a, w], {}, dtype, step=None if product == dims else "matmul")
    return Value(b.reshape(ins, c, dims, None), dims, dtype)


def _window(b: Builder, ins: Instr, kernel: tuple[int, int]) -> dict[str, Any]:
    """CONV2D's stride, dilation and padding from `window={size=.. stride=.. pad=.. rhs_dilate=..}`."""
    text = b.attr(ins, "window", required=False)
    fields: dict[str, str] = {}
    if text is not None:
        if not (text.startswith("{") and text.endswith("}")):
            raise b.fail(ins, f"{b.where(ins)}: window={clip(text)} is not {{size=.. stride=.. pad=..}}")
        for item in text[1:-1].split():
            key, sep, value = item.partition("=")
            if not sep:
                raise b.fail(ins, f"{b.where(ins)}: window: '{clip(item)}' is not key=value")
            fields[key] = value

    def dxd(key: str, default: int) -> list[int]:
        if key not in fields:
            return [default, default]
        if not _DXD.fullmatch(fields[key]) or any(len(v) > MAX_INT_DIGITS for v in fields[key].split("x")):
            raise b.fail(ins, f"{b.where(ins)}: window {key}={clip(fields[key])} is not like 3x3")
        values = [int(v) for v in fields[key].split("x")]
        if len(values) != 2:
            raise b.fail(ins, f"{b.where(ins)}: window {key}={fields[key]} has {len(values)} entries for 2 "
                              "spatial dimensions")
        return values

    size = dxd("size", 0)
    if "size" in fields and tuple(size) != kernel:
        raise b.fail(ins, f"{b.where(ins)}: window size={fields['size']} differs from the kernel's {kernel[0]}x{kernel[1]}")
    if dxd("lhs_dilate", 1) != [1, 1]:
        raise b.fail(ins, f"{b.where(ins)}: lhs_dilate={fields['lhs_dilate']} (a transposed convolution) is not "
                          "supported")
    if "rhs_reversal" in fields and set(fields["rhs_reversal"].split("x")) != {"0"}:
        raise b.fail(ins, f"{b.where(ins)}: rhs_reversal is not supported")
    padding = [[0, 0], [0, 0]]
    if "pad" in fields:
        pads = _pads(fields["pad"])
        if pads is None or len(pads) != 2 or any(p[2] for p in pads):
            raise b.fail(ins, f"{b.where(ins)}: window pad={clip(fields['pad'])} is not like 1_1x1_1")
        if any(v < 0 for p in pads for v in p[:2]):
            raise b.fail(ins, f"{b.where(ins)}: negative window padding {fields['pad']} is not supported")
        padding = [list(p[:2]) for p in pads]
    stride, dilation = dxd("stride", 1), dxd("rhs_dilate", 1)
    if 0 in stride or 0 in dilation:
        raise b.fail(ins, f"{b.where(ins)}: window strides and dilations must be at least 1")
    return {"stride": stride, "dilation": dilation, "padding": padding}


def _pads(text: str) -> list[tuple[int, int, int]] | None:
    """`lo_hi[_interior]` per dim, joined by `x`; None when the text is not that."""
    pads = []
    for item in text.split("x"):
        m = _PAD_DIM.fullmatch(item)
        if not m or any(g and len(g.lstrip("-")) > MAX_INT_DIGITS for g in m.groups()):
            return None
        pads.append((int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)))
    return pads


def _convolution(b: Builder, ins: Instr, args: list) -> Value:
    """CONV2D NHWC with OHWI weights: each operand transposed there from its dim labels, and
    the result from NHWC to the output's labels."""
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    x, w = (_array_arg(b, ins, a) for a in args)
    text = b.attr(ins, "dim_labels")
    labels = _DIM_LABELS.fullmatch(text)
    spatial = ("0", "1")
    if not labels or any(sorted(l) != sorted(want) for l, want in zip(labels.groups(), ("b01f", "01io", "b01f"))):
        raise b.fail(ins, f"{b.where(ins)}: dim_labels={clip(text)}: only convolutions with two spatial "
                          "dimensions (labels b, 0, 1, f / 0, 1, i, o) map onto CONV2D")
    lhs, rhs, out = labels.groups()
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise b.fail(ins, f"{b.where(ins)}: operands {list(x.shape)} and {list(w.shape)} are not rank 4")
    if b.int_attr(ins, "batch_group_count", 1) != 1:
        raise b.fail(ins, f"{b.where(ins)}: batch_group_count other than 1 is not supported")
    groups = b.int_attr(ins, "feature_group_count", 1)
    if groups < 1:
        raise b.fail(ins, f"{b.where(ins)}: feature_group_count={groups} is not positive")
    kernel = (w.shape[rhs.index(spatial[0])], w.shape[rhs.index(spatial[1])])
    attrs = {**_window(b, ins, kernel), "groups": groups}
    nhwc = b.transpose(ins, b.full(ins, x), [lhs.index(c) for c in "b01f"], "input")
    ohwi = b.transpose(ins, b.full(ins, w), [rhs.index(c) for c in "o01i"], "weights")
    perm = ["b01f".index(c) for c in out]
    step = None if perm == sorted(perm) else "conv"
    y = b.op(ins, "CONV2D", [nhwc, ohwi], attrs, dtype, step=step)
    return Value(b.transpose(ins, y, perm, None), dims, dtype)


def _reduce(b: Builder, ins: Instr, args: list) -> Value:
    if len(args) != 2:
        raise b.fail(ins, f"{b.where(ins)}: a reduce of {len(args) // 2 or len(args)} operands at once is not "
                          "supported (one operand and its init value)")
    dims, dtype = b.result(ins)
    x, init = (_array_arg(b, ins, a) for a in args)
    comp = b.called(ins, "to_apply")
    kind = _reducer(b, ins, comp)
    if kind in ("or", "and") and ins.type.element != "pred":
        raise b.fail(ins, f"{b.where(ins)}: a reduction by '{kind}' is supported on pred only")
    axes = b.ints(ins, "dimensions")
    b.axes(ins, "dimensions", axes, len(x.shape), f"operand {list(x.shape)}")
    reduce_op, combine = REDUCERS[kind]
    if init.shape != ():
        raise b.fail(ins, f"{b.where(ins)}: the init value is {list(init.shape)}, a scalar is needed")
    start = b.value_of(init.tensor)
    # an init value equal to the reduction's identity needs no op after the REDUCE; of pred, `and`
    # (a MIN over 0 and 1) starts from true, 1, not the u8 highest
    neutral = 1 if kind == "and" else reduction.identity(reduce_op, dtypes.numpy_dtype(dtype))
    identity_init = start is not None and bool(np.all(start.astype(np.float64) == neutral))
    step = None if identity_init else "reduce"
    reduced = b.op(ins, reduce_op, [b.full(ins, x)], {"axes": axes, "keepdims": False}, dtype, step=step)
    if not identity_init:  # an init value that is not the identity takes part once
        reduced = b.op(ins, combine, [reduced, init.tensor], {}, dtype)
    return Value(reduced, dims, dtype)


def _reducer(b: Builder, ins: Instr, comp: Computation) -> str:
    params = sorted((i for i in comp.instrs.values() if i.opcode == "parameter"), key=lambda i: i.index)
    root = comp.root
    if (root.opcode in REDUCERS and len(params) == 2 and len(root.operands) == 2
            and sorted(root.operands) == sorted(p.name for p in params)):
        return root.opcode
    raise b.fail(ins, f"{b.where(ins)}: to_apply computation '{clip(comp.name)}' is not one add, multiply, "
                      "maximum or minimum of its two parameters")


def _slice(b: Builder, ins: Instr, args: list) -> Value:
    """SLICE of the box, then a GATHER along each dim with a stride (the registry has no strided
    slice; GATHER takes the indices as an attribute)."""
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    text = b.attr(ins, "slice")
    inner = text[1:-1] if text.startswith("{") and text.endswith("}") else None
    found = list(_SLICE_DIM.finditer(inner)) if inner is not None else []
    if inner is None or re.sub(r"[\s,]", "", _SLICE_DIM.sub("", inner)) or len(found) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: slice={clip(text)} is not one [start:limit] or [start:limit:stride] "
                          f"per dimension of the rank-{len(x.shape)} operand")
    bounds = []
    for axis, m in enumerate(found):
        values = [int_value(g) if g is not None else 1 for g in m.groups()]
        if None in values:
            raise b.fail(ins, f"{b.where(ins)}: slice={clip(text)}: a number is too long")
        start, limit, stride = values
        if not 0 <= start <= limit <= x.shape[axis] or stride < 1:
            raise b.fail(ins, f"{b.where(ins)}: slice [{start}:{limit}:{stride}] does not fit dimension {axis} of "
                              f"{list(x.shape)}")
        bounds.append((start, limit, stride))
    strided = [axis for axis, (_, _, stride) in enumerate(bounds) if stride > 1]
    tensor = b.full(ins, x)
    if any(start > 0 or limit < x.shape[axis] for axis, (start, limit, _) in enumerate(bounds)):
        attrs = {"start": [s for s, _, _ in bounds], "size": [l - s for s, l, _ in bounds]}
        tensor = b.op(ins, "SLICE", [tensor], attrs, dtype, step="box" if strided else None)
    for i, axis in enumerate(strided):
        start, limit, stride = bounds[axis]
        if limit - start > MAX_MADE_CONSTANT:
            raise b.fail(ins, f"{b.where(ins)}: a strided slice of {limit - start} elements is too long")
        indices = list(range(0, limit - start, stride))
        tensor = b.op(ins, "GATHER", [tensor], {"indices": indices, "axis": axis}, dtype,
                      step=None if i == len(strided) - 1 else f"stride{axis}")
    return Value(tensor, dims, dtype)


def _concatenate(b: Builder, ins: Instr, args: list) -> Value:
    if not args:
        raise b.fail(ins, f"{b.where(ins)} takes at least one operand")
    dims, dtype = b.result(ins)
    axes = b.ints(ins, "dimensions")
    if len(axes) != 1:
        raise b.fail(ins, f"{b.where(ins)}: dimensions= must name one dimension")
    tensors = [b.full(ins, _array_arg(b, ins, a)) for a in args]
    b.axes(ins, "dimensions", axes, len(dims), "result")
    if len(tensors) == 1:
        return Value(tensors[0], dims, dtype)
    return Value(b.op(ins, "CONCAT", tensors, {"axis": axes[0]}, dtype), dims, dtype)


def _pad(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    x, fill = (_array_arg(b, ins, a) for a in args)
    text = b.attr(ins, "padding")
    pads = _pads(text)
    if pads is None or len(pads) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: padding={clip(text)} is not one lo_hi[_interior] per dimension "
                          f"of the rank-{len(x.shape)} operand")
    if any(interior for _, _, interior in pads):
        raise b.fail(ins, f"{b.where(ins)}: interior padding ({text}) is not supported: the registry's PAD "
                          "pads around each dimension only")
    values = b.value_of(fill.tensor)
    if values is None or fill.shape != ():
        raise b.fail(ins, f"{b.where(ins)}: the padding value must be a scalar constant")
    value = int(values) if dtypes.is_integer(fill.dtype) else float(values)
    if isinstance(value, float) and math.isnan(value):
        raise b.fail(ins, f"{b.where(ins)}: padding with nan is not supported (the object file has no NaN)")
    tensor = b.full(ins, x)
    if any(lo < 0 or hi < 0 for lo, hi, _ in pads):  # negative padding crops
        start = [max(-lo, 0) for lo, _, _ in pads]
        size = [d - s - max(-hi, 0) for d, s, (_, hi, _) in zip(x.shape, start, pads)]
        if any(s < 0 for s in size):
            raise b.fail(ins, f"{b.where(ins)}: padding={text} crops more than the operand holds")
        tensor = b.op(ins, "SLICE", [tensor], {"start": start, "size": size}, dtype, step="crop")
    padding = [[max(lo, 0), max(hi, 0)] for lo, hi, _ in pads]
    if any(lo or hi for lo, hi in padding):
        tensor = b.op(ins, "PAD", [tensor], {"padding": padding, "pad_value": value}, dtype)
    return Value(tensor, dims, dtype)


def _select(b: Builder, ins: Instr, args: list) -> Value:
    return _map("SELECT", 3)(b, ins, args)


def _tuple(b: Builder, ins: Instr, args: list) -> tuple:
    return tuple(args)


def _get_tuple_element(b: Builder, ins: Instr, args: list) -> AnyValue:
    b.arity(ins, args, 1)
    index = b.int_attr(ins, "index")
    if not isinstance(args[0], tuple) or not 0 <= index < len(args[0]):
        size = len(args[0]) if isinstance(args[0], tuple) else "no"
        raise b.fail(ins, f"{b.where(ins)}: index={index} of an operand with {size} tuple elements")
    return args[0][index]


def _call(key: str) -> Handler:
    def handler(b: Builder, ins: Instr, args: list) -> AnyValue:
        return b.inline(ins, b.called(ins, key), args)
    return handler


HANDLERS: dict[str, Handler] = {
    "constant": _constant,
    "iota": _iota,
    **{opcode: _map(op, 1) for opcode, op in UNARY.items()},
    **{opcode: _map(op, 2) for opcode, op in BINARY.items()},
    **{opcode: _pred_map(op, 2) for opcode, op in PRED_BINARY.items()},
    "not": _not,
    "compare": _compare,
    "select": _select,
    "clamp": _clamp,
    "convert": _convert,
    "copy": _copy,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "bitcast": _reshape,
    "transpose": _transpose,
    "dot": _dot,
    "convolution": _convolution,
    "reduce": _reduce,
    "slice": _slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    **{opcode: _call(key) for opcode, key in CALLS.items()},
}


def apply(b: Builder, ins: Instr, args: list, operands: list[HloType]) -> AnyValue:
    """The value `ins` makes from its operands' values (`args`; `operands` their declared types)."""
    handler = HANDLERS.get(ins.opcode)
    if handler is None:
        raise b.fail(ins, f"'{clip(ins.name)}': HLO op '{clip(ins.opcode)}' is not supported")
    if ins.opcode == "bitcast" and not all(t.row_major for t in [ins.type, *operands] if isinstance(t, Shape)):
        raise b.fail(ins, f"{b.where(ins)}: a bitcast between layouts other than row-major moves elements as a "
                          "transpose would; only a row-major bitcast (a reshape) is supported")
    _check_element(b, ins, operands)
    value = handler(b, ins, args)
    if ins.opcode in WHOLE and isinstance(value, Value) and b.shape(value.tensor) != value.shape:
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, but {made_of(ins, operands)} "
                          f"gives {Shape(ins.type.element, b.shape(value.tensor))}")
    return value


def _check_element(b: Builder, ins: Instr, operands: list[HloType]) -> None:
    """An op of SAME_ELEMENT declares the element type its operands give it."""
    if ins.opcode not in SAME_ELEMENT or not isinstance(ins.type, Shape):
        return  # the handler refuses a tuple where an array is needed
    shapes = [t for t in operands if isinstance(t, Shape)]
    predicate = shapes[:1] if ins.opcode == "select" else []
    data = shapes[1:] if ins.opcode == "select" else shapes
    made = made_of(ins, operands)
    if any(t.element != "pred" for t in predicate):
        raise b.fail(ins, f"{b.where(ins)}: {made}: the predicate (operand 0) must be pred")
    elements = list(dict.fromkeys(t.element for t in data))
    if len(elements) > 1:
        raise b.fail(ins, f"{b.where(ins)}: {made}: operands of element types {', '.join(elements)}; "
                          f"{ins.opcode} takes one")
    if ins.opcode in FLOAT_ONLY and elements and not elements[0].startswith(("f", "bf", "c")):
        raise b.fail(ins, f"{b.where(ins)}: {made}: {ins.opcode} takes a floating-point operand")
    want = "pred" if ins.opcode == "compare" else elements[0] if elements else ins.type.element
    if ins.type.element != want:
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, but {made} gives "
                          f"{Shape(want, ins.type.dims)}")
