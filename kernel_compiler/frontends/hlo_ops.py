"""The HLO frontend's op table: each opcode, by one small function, as registry ops.

A handler gets the builder, the instruction and its operands' values and returns the value it
makes; what an op computes is the registry's (dfx/ops/), never restated here.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dfx import dtypes
from dfx.ops import REGISTRY, reduction
from dfx.ops.window import inputs_in_windows
from dfx.ops.layout import keeps_order

from ..errors import CompileError
from .dilated import dilated_input
from .hlo_build import MAX_MADE_CONSTANT, AnyValue, Builder, Value, made_of
from .hlo_text import INT_TEXT, MAX_INT_DIGITS, Computation, HloType, Instr, Shape, clip, int_value, type_text

# ---- the opcode tables -----------------------------------------------------------------------

UNARY = {"exponential": "EXP", "log": "LOG", "rsqrt": "RSQRT", "sqrt": "SQRT", "tanh": "TANH",
         "logistic": "SIGMOID", "erf": "ERF", "negate": "NEGATE", "abs": "ABS", "exponential-minus-one": "EXPM1",
         "log-plus-one": "LOG1P", "cbrt": "CBRT", "sign": "SIGN", "floor": "FLOOR", "ceil": "CEIL",
         "round-nearest-even": "ROUND", "sine": "SIN", "cosine": "COS", "tan": "TAN"}
BINARY = {"add": "ADD", "subtract": "SUB", "multiply": "MUL", "divide": "DIV", "maximum": "MAXIMUM",
          "minimum": "MINIMUM", "power": "POW", "atan2": "ATAN2"}
# opcodes that are a registry op with attributes: opcode -> (op, operands, attributes)
WITH_ATTRS = {"remainder": ("MOD", 2, {"fmod": True}),  # C's fmod: the dividend's sign
              "round-nearest-afz": ("ROUND", 1, {"halves": "away_from_zero"})}
# and, or, xor, not -> (the op on pred, 0/1 bytes; the op on integers, bit by bit)
LOGIC = {"and": ("LOGICAL_AND", "BITWISE_AND"), "or": ("LOGICAL_OR", "BITWISE_OR"),
         "xor": ("LOGICAL_XOR", "BITWISE_XOR"), "not": ("LOGICAL_NOT", "BITWISE_NOT")}
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
SAME_ELEMENT = frozenset({*UNARY, *BINARY, *WITH_ATTRS, *LOGIC, "select", "clamp", "compare", "copy", "broadcast",
                          "reshape", "transpose", "slice", "concatenate", "pad", "reduce", "reduce-window",
                          "reverse"})
# opcodes XLA defines on floating-point operands only (its shape inference refuses an integer one)
FLOAT_ONLY = frozenset({"exponential", "log", "rsqrt", "sqrt", "tanh", "logistic", "erf", "exponential-minus-one",
                        "log-plus-one", "cbrt", "floor", "ceil", "round-nearest-even", "round-nearest-afz", "atan2",
                        "sine", "cosine", "tan"})
# opcodes whose value is a whole tensor (never a broadcast left to its readers): its shape must
# be the declared one exactly
WHOLE = frozenset({"reshape", "bitcast", "transpose", "slice", "concatenate", "pad", "reduce", "reduce-window", "dot",
                   "convolution", "gather", "dynamic-slice", "dynamic-update-slice", "reverse"})
# the attribute naming the computation each inlined opcode calls
CALLS = {"fusion": "calls", "call": "to_apply"}
# a window's fields and their defaults (size: none, the operand's)
WINDOW_DEFAULTS = {"size": None, "stride": 1, "pad": [0, 0], "lhs_dilate": 1, "rhs_dilate": 1, "rhs_reversal": 0}
assert all(op in REGISTRY for table in (UNARY, BINARY, COMPARISONS) for op in table.values())
assert all(op in REGISTRY for op, _, _ in WITH_ATTRS.values())
assert all(op in REGISTRY for ops in LOGIC.values() for op in ops)
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


def _map(op_type: str, arity: int, attrs: dict[str, Any] | None = None) -> Handler:
    def handler(b: Builder, ins: Instr, args: list) -> Value:
        b.arity(ins, args, arity)
        if isinstance(ins.type, Shape) and ins.type.element == "pred" and op_type not in PRED_CLOSED:
            # a pred holds 0 or 1 in a byte: arithmetic on it would leave other values there
            raise b.fail(ins, f"{b.where(ins)}: '{ins.opcode}' on pred is not supported (and, or, xor, not are)")
        dims, dtype = b.result(ins)
        return Value(b.op(ins, op_type, _elementwise_args(b, ins, args, dims), attrs or {}, dtype), dims, dtype)
    return handler


def _logic(on_pred: str, on_integers: str, arity: int) -> Handler:
    def handler(b: Builder, ins: Instr, args: list) -> Value:
        b.arity(ins, args, arity)
        dims, dtype = b.result(ins)
        if ins.type.element != "pred" and not dtypes.is_integer(dtype):
            raise b.fail(ins, f"{b.where(ins)}: '{ins.opcode}' takes pred or integer operands, not {ins.type.element}")
        op_type = on_pred if ins.type.element == "pred" else on_integers
        return Value(b.op(ins, op_type, _elementwise_args(b, ins, args, dims), {}, dtype), dims, dtype)
    return handler


def _is_finite(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    [x] = _elementwise_args(b, ins, args, dims)
    if ins.type.element != "pred" or dtypes.is_integer(args[0].dtype):
        raise b.fail(ins, f"{b.where(ins)}: is-finite takes a floating-point operand and gives pred, not "
                          f"{args[0].dtype} to {ins.type.element}")
    return Value(b.op(ins, "IS_FINITE", [x], {}, dtype), dims, dtype)


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
    _comparison_type(b, ins, args[0].dtype)
    if direction != "NE":
        return Value(b.op(ins, COMPARISONS[direction], [x, y], {}, dtype), dims, dtype)
    equal = b.op(ins, "EQUAL", [x, y], {}, dtype, step="eq")
    return Value(b.op(ins, "SUB", [b.scalar(ins, 1, dtype), equal], {}, dtype), dims, dtype)


def _comparison_type(b: Builder, ins: Instr, dtype: str) -> None:
    """compare's `type=`, where XLA prints it, must be the order the operands' type has: FLOAT,
    SIGNED, UNSIGNED (pred, u8), or TOTALORDER, read as that order: on floats the two differ only
    at -0 against +0 and at NaNs, which TOTALORDER orders by their sign."""
    text = b.attr(ins, "type", required=False)
    usual = "FLOAT" if not dtypes.is_integer(dtype) else "UNSIGNED" if dtype.startswith("u") else "SIGNED"
    if text not in (None, usual, "TOTALORDER"):
        raise b.fail(ins, f"{b.where(ins)}: type={clip(text)} is not the order of {dtype} operands ({usual})")


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


def _relaid(b: Builder, ins: Instr, args: list, operand: Shape) -> Value:
    """A bitcast between layouts: the operand's elements in the order they lie in memory,
    regrouped as the result's dims lie (a TRANSPOSE to the operand's order, a RESHAPE, a TRANSPOSE
    from the result's; a step that moves nothing is left out)."""
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    if math.prod(x.shape) != math.prod(dims) or x.dtype != dtype:
        return _reshape(b, ins, args)  # refuses it, as a bitcast that changes the count or the type
    laid = b.transpose(ins, b.full(ins, x), operand.major_to_minor, step="laid")
    order = ins.type.major_to_minor
    regrouped = b.reshape(ins, laid, tuple(dims[d] for d in order), step="regrouped")
    return Value(b.transpose(ins, regrouped, [order.index(d) for d in range(len(dims))], None), dims, dtype)


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


def _window(b: Builder, ins: Instr, rank: int) -> dict[str, Any]:
    """`window={size=.. stride=.. pad=.. lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}` for a window
    of `rank` dims: each field a list of one entry per dim (`3x3`), its default where not given
    (size: None); pad [before, after] per dim, a negative one cropping."""
    text = b.attr(ins, "window", required=False)
    fields: dict[str, str] = {}
    if text is not None:
        if not (text.startswith("{") and text.endswith("}")):
            raise b.fail(ins, f"{b.where(ins)}: window={clip(text)} is not {{size=.. stride=.. pad=..}}")
        for item in text[1:-1].split():
            key, sep, value = item.partition("=")
            if not sep:
                raise b.fail(ins, f"{b.where(ins)}: window: '{clip(item)}' is not key=value")
            if key not in WINDOW_DEFAULTS:
                raise b.fail(ins, f"{b.where(ins)}: window field '{clip(key)}' is not supported (only "
                                  f"{', '.join(WINDOW_DEFAULTS)})")
            fields[key] = value
    window: dict[str, Any] = {}
    for key, default in WINDOW_DEFAULTS.items():
        if key not in fields:
            window[key] = None if default is None else [list(default) if key == "pad" else default] * rank
            continue
        text = fields[key]
        if key == "pad":
            pads = _pads(text)
            if pads is None or len(pads) != rank or any(p[2] for p in pads):
                raise b.fail(ins, f"{b.where(ins)}: window pad={clip(text)} is not one lo_hi per dimension of "
                                  f"the {rank}-dimensional window")
            window[key] = [list(p[:2]) for p in pads]
            continue
        if not _DXD.fullmatch(text) or any(len(v) > MAX_INT_DIGITS for v in text.split("x")):
            raise b.fail(ins, f"{b.where(ins)}: window {key}={clip(text)} is not like 3x3")
        window[key] = [int(v) for v in text.split("x")]
        if len(window[key]) != rank:
            raise b.fail(ins, f"{b.where(ins)}: window {key}={text} has {len(window[key])} entries for the "
                              f"{rank}-dimensional window")
    if 0 in window["stride"] + window["lhs_dilate"] + window["rhs_dilate"]:
        raise b.fail(ins, f"{b.where(ins)}: window strides and dilations must be at least 1")
    if any(v > 1 for v in window["rhs_reversal"]):
        raise b.fail(ins, f"{b.where(ins)}: window rhs_reversal={fields['rhs_reversal']} is not 0 or 1 per dimension")
    return window


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
    """CONV2D NHWC with OHWI weights: each operand transposed there from its dim labels (one
    spatial dim: a height of 1 put in front), the weights reversed where rhs_reversal says, the
    input spread by lhs_dilate - 1 zeros between its elements (a transposed convolution) and
    cropped where the padding is negative, as the ONNX ConvTranspose does (`dilated_input`); the
    result back from NHWC to the output's labels."""
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    x, w = (_array_arg(b, ins, a) for a in args)
    lhs, rhs, out, spatial = _conv_labels(b, ins)
    if len(x.shape) != len(lhs) or len(w.shape) != len(rhs):
        raise b.fail(ins, f"{b.where(ins)}: operands {list(x.shape)} and {list(w.shape)} are not rank {len(lhs)}")
    if b.int_attr(ins, "batch_group_count", 1) != 1:
        raise b.fail(ins, f"{b.where(ins)}: batch_group_count other than 1 is not supported")
    groups = b.int_attr(ins, "feature_group_count", 1)
    if groups < 1:
        raise b.fail(ins, f"{b.where(ins)}: feature_group_count={groups} is not positive")
    kernel = [w.shape[rhs.index(c)] for c in spatial]
    window = _window(b, ins, len(spatial))
    if window["size"] not in (None, kernel):
        raise b.fail(ins, f"{b.where(ins)}: window size={'x'.join(map(str, window['size']))} differs from the "
                          f"kernel's {'x'.join(map(str, kernel))}")
    front = 2 - len(spatial)  # a 1-D window gets a height of one position, put in front

    def per_dim(key: str, one: Any) -> list:
        return [one] * front + window[key]

    nhwc = b.transpose(ins, b.full(ins, x), [lhs.index(c) for c in f"b{spatial}f"], "input")
    ohwi = b.transpose(ins, b.full(ins, w), [rhs.index(c) for c in f"o{spatial}i"], "weights")
    if front:
        nhwc = b.reshape(ins, nhwc, (b.shape(nhwc)[0], 1, *b.shape(nhwc)[1:]), "input")
        ohwi = b.reshape(ins, ohwi, (b.shape(ohwi)[0], 1, *b.shape(ohwi)[1:]), "weights")
    ohwi = _reversed(b, ins, ohwi, [1 + k for k, r in enumerate(per_dim("rhs_reversal", 0)) if r], w.dtype,
                     "weights")

    def emit(op_type: str, tensor: str, attrs: dict[str, Any]) -> str:
        if op_type == "RESHAPE":  # composes with the reshape to 2-D before it
            return b.reshape(ins, tensor, tuple(attrs["new_shape"]), "input")
        return b.op(ins, op_type, [tensor], attrs, x.dtype, step="input")

    # a negative padding crops the (dilated) input: no more than it holds
    for extent, s, (before, after) in zip(b.shape(nhwc)[1:3], per_dim("lhs_dilate", 1), per_dim("pad", [0, 0])):
        if max(-before, 0) + max(-after, 0) > (extent - 1) * s + 1:
            raise b.fail(ins, f"{b.where(ins)}: window pad {before}_{after} crops more than the "
                              f"{(extent - 1) * s + 1} positions of the input along its dimension")
    nhwc, padding = dilated_input(emit, nhwc, b.shape(nhwc), [1, 2], per_dim("lhs_dilate", 1), per_dim("pad", [0, 0]))
    attrs = {"stride": per_dim("stride", 1), "dilation": per_dim("rhs_dilate", 1), "padding": padding, "groups": groups}
    perm = [f"b{spatial}f".index(c) for c in out]
    moved = perm != sorted(perm)
    y = b.op(ins, "CONV2D", [nhwc, ohwi], attrs, dtype, step="conv" if front or moved else None)
    if front:
        y = b.reshape(ins, y, tuple(d for k, d in enumerate(b.shape(y)) if k != 1), "conv1d" if moved else None)
    return Value(b.transpose(ins, y, perm, None), dims, dtype)


def _conv_labels(b: Builder, ins: Instr) -> tuple[str, str, str, str]:
    """dim_labels' input, weight and output labels, and the spatial labels in order ("01" or "0")."""
    text = b.attr(ins, "dim_labels")
    labels = _DIM_LABELS.fullmatch(text)
    spatial = "".join(sorted(c for c in labels.group(1) if c.isdigit())) if labels else ""
    if (not labels or spatial not in ("0", "01")
            or any(sorted(l) != sorted(want + spatial) for l, want in zip(labels.groups(), ("bf", "io", "bf")))):
        raise b.fail(ins, f"{b.where(ins)}: dim_labels={clip(text)}: only convolutions with one or two spatial "
                          "dimensions (labels b, 0, 1, f / 0, 1, i, o) map onto CONV2D")
    return (*labels.groups(), spatial)


# ---- indexing: dynamic-slice, dynamic-update-slice, gather, reverse --------------------------
# XLA clamps every start index so that the slice it starts fits the operand; the graph does the
# same (MAXIMUM and MINIMUM in i32 where the index is known at run time only), so a runtime
# GATHER never meets an index outside its axis. Index arithmetic on constants folds, and a
# GATHER whose positions the compiler knows takes them as its attribute.


def _dynamic_slice(b: Builder, ins: Instr, args: list) -> Value:
    """A SLICE of the box at the starts the compiler knows, then along each dim whose start is
    computed at run time a GATHER of the `size` positions from it."""
    if not args:
        raise b.fail(ins, f"{b.where(ins)} takes an operand and its start indices")
    dims, dtype = b.result(ins)
    x = _moved(b, ins, args[0], dtype)
    sizes = b.ints(ins, "dynamic_slice_sizes")
    starts = _starts(b, ins, args[1:], x.shape, sizes)
    known = [(s, n) if isinstance(s, int) else (0, d) for s, n, d in zip(starts, sizes, x.shape)]
    runtime = [axis for axis, s in enumerate(starts) if not isinstance(s, int)]
    tensor = b.full(ins, x)
    if any(k != (0, d) for k, d in zip(known, x.shape)):
        tensor = b.op(ins, "SLICE", [tensor], {"start": [s for s, _ in known], "size": [n for _, n in known]}, dtype,
                      step="box" if runtime else None)
    for axis in runtime:
        positions = b.op(ins, "ADD", [starts[axis], _count(b, ins, sizes[axis])], {}, "i32", step=f"at{axis}")
        tensor = _gathered(b, ins, tensor, axis, positions, dtype, None if axis == runtime[-1] else f"along{axis}")
    return Value(tensor, dims, dtype)


def _dynamic_update_slice(b: Builder, ins: Instr, args: list) -> Value:
    """The update spread to the operand's shape along each dim it does not fill (a PAD where the
    compiler knows the start; a GATHER of positions computed at run time where not: the
    update's entry at each position, clamped), then a SELECT of it inside the box, of the
    operand outside (the box a u8 mask per dim, their product)."""
    if len(args) < 2:
        raise b.fail(ins, f"{b.where(ins)} takes an operand, an update and the start indices")
    dims, dtype = b.result(ins)
    x, update = (_moved(b, ins, a, dtype) for a in args[:2])
    if len(update.shape) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: the update {list(update.shape)} is not of the operand's rank "
                          f"{len(x.shape)}")
    starts = _starts(b, ins, args[2:], x.shape, list(update.shape))
    spread = [axis for axis, (n, d) in enumerate(zip(update.shape, x.shape)) if n < d]
    tensor = b.full(ins, update)
    if not spread:
        return Value(tensor, dims, dtype)
    padding = [[s, d - n - s] if isinstance(s, int) else [0, 0] for s, n, d in zip(starts, update.shape, x.shape)]
    if any(p != [0, 0] for p in padding):
        tensor = b.op(ins, "PAD", [tensor], {"padding": padding}, dtype, step="spread")
    mask = None
    for axis in spread:
        d, n, start = x.shape[axis], update.shape[axis], starts[axis]
        if isinstance(start, int):
            positions = np.arange(d)
            inside = b.constant(f"{b.own_name(ins)}.box{axis}", (positions >= start) & (positions < start + n), "u8")
        else:  # the update's entry each position would take: inside the box where clamping leaves it
            offset = b.op(ins, "SUB", [_count(b, ins, d), start], {}, "i32", step=f"entry{axis}")
            entry = _clamped(b, ins, offset, n - 1, f"entry{axis}")
            tensor = _gathered(b, ins, tensor, axis, entry, dtype, f"spread{axis}")
            inside = b.op(ins, "EQUAL", [offset, entry], {}, "u8", step=f"box{axis}")
        inside = b.reshape(ins, inside, tuple(d if dim == axis else 1 for dim in range(len(x.shape))), f"box{axis}")
        mask = inside if mask is None else b.op(ins, "MUL", [mask, inside], {}, "u8", step="box")
    return Value(b.op(ins, "SELECT", [mask, tensor, x.tensor], {}, dtype), dims, dtype)


def _moved(b: Builder, ins: Instr, arg: AnyValue, dtype: str) -> Value:
    """An operand whose elements the result holds: of the result's element type (moves do not convert)."""
    value = _array_arg(b, ins, arg)
    if value.dtype != dtype:
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, but its operand holds {value.dtype}")
    return value


def _starts(b: Builder, ins: Instr, args: list, shape: tuple[int, ...], sizes: list[int]) -> list[int | str]:
    """Each dim's start, clamped to 0..dim - size as XLA does: a number where the compiler knows
    it, else the i32 scalar tensor computing it."""
    if len(args) != len(shape) or len(sizes) != len(shape):
        raise b.fail(ins, f"{b.where(ins)}: {len(args)} start indices and {len(sizes)} sizes for the rank-"
                          f"{len(shape)} operand")
    starts: list[int | str] = []
    for axis, (arg, d, n) in enumerate(zip(args, shape, sizes)):
        start = _array_arg(b, ins, arg)
        if start.shape != () or not dtypes.is_integer(start.dtype):
            raise b.fail(ins, f"{b.where(ins)}: start index {axis} is {start.dtype}{list(start.shape)}, an integer "
                              "scalar is needed")
        if not 0 <= n <= d:
            raise b.fail(ins, f"{b.where(ins)}: a slice of {n} does not fit dimension {axis} of {list(shape)}")
        value = b.value_of(start.tensor)
        if value is not None or n == d:
            starts.append(0 if value is None else min(max(int(value), 0), d - n))
        else:
            starts.append(_clamped(b, ins, _index(b, ins, start.tensor, f"start{axis}"), d - n, f"start{axis}"))
    return starts


def _index(b: Builder, ins: Instr, tensor: str, step: str) -> str:
    """An index tensor in i32, the dtype index arithmetic runs in."""
    if b.graph.tensors[tensor].dtype == "i32":
        return tensor
    return b.op(ins, "CAST", [tensor], {"dtype": "i32"}, "i32", step=step)


def _clamped(b: Builder, ins: Instr, index: str, high: int, step: str) -> str:
    """The i32 `index` clamped to 0..high."""
    low = b.op(ins, "MAXIMUM", [index, b.scalar(ins, 0, "i32")], {}, "i32", step=f"{step}.low")
    return b.op(ins, "MINIMUM", [low, b.scalar(ins, high, "i32")], {}, "i32", step=f"{step}.high")


def _count(b: Builder, ins: Instr, n: int) -> str:
    """0, 1, ..., n - 1 as an i32 constant."""
    return _table(b, ins, "iota", np.arange(n))


def _table(b: Builder, ins: Instr, step: str, values: np.ndarray) -> str:
    """An i32 constant of index arithmetic, no larger than the compiler makes one."""
    if values.size > MAX_MADE_CONSTANT:
        raise b.fail(ins, f"{b.where(ins)}: {values.size} positions are more than the {MAX_MADE_CONSTANT} a constant "
                          "made by the compiler may have")
    return b.constant(f"{b.own_name(ins)}.{step}", values.astype(np.int32), "i32")


def _gathered(b: Builder, ins: Instr, tensor: str, axis: int, positions: str, dtype: str, step: str | None) -> str:
    """GATHER of `tensor` along `axis` at the 1-D i32 `positions`: their values as the attribute
    where the compiler knows them (none at all where they are every position in order), else the
    operand read at run time."""
    known = b.value_of(positions)
    if known is None:
        return b.op(ins, "GATHER", [tensor, positions], {"axis": axis}, dtype, step=step)
    if np.array_equal(known, np.arange(b.shape(tensor)[axis])):
        return tensor
    return b.op(ins, "GATHER", [tensor], {"indices": [int(i) for i in known], "axis": axis}, dtype, step=step)


def _gather(b: Builder, ins: Instr, args: list) -> Value:
    """XLA's gather. With one indexed dim (start_index_map) and no batching dims: a GATHER along
    it (the other dims SLICEd to their slice sizes). Otherwise a GATHER of rows of the operand
    viewed as [rows, the trailing dims its slices take whole], each slice's row numbers computed
    from its indices (and batch position) in i32. Either way the dims are then put where
    offset_dims says, the batch dims of the indices in the others."""
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    x = _moved(b, ins, args[0], dtype)
    indices = _array_arg(b, ins, args[1])
    g = _gather_dims(b, ins, x.shape, indices)
    n = math.prod(g.batch_shape)
    if len(g.start_map) == 1 and not g.batching:
        axis = g.start_map[0]
        size = g.sizes[axis]
        starts = _clamped(b, ins, _start_index(b, ins, indices, g, 0, n), x.shape[axis] - size, "start")
        positions = _window_positions(b, ins, starts, n, np.arange(size))
        tensor = b.full(ins, x)
        if any(s != d for k, (s, d) in enumerate(zip(g.sizes, x.shape)) if k != axis):  # slices from 0
            size = [-1 if k == axis else s for k, s in enumerate(g.sizes)]
            tensor = b.op(ins, "SLICE", [tensor], {"start": [0] * len(size), "size": size}, dtype, step="box")
        tensor = _gathered(b, ins, tensor, axis, positions, dtype, "gather")
        labels = [("o", k) for k in range(axis)] + [("b", j) for j in range(len(g.batch_shape))] + \
                 [("o", k) for k in range(axis, len(x.shape))]
        shape = (*g.sizes[:axis], *g.batch_shape, *g.sizes[axis:])
    else:
        tensor, labels, shape = _gathered_rows(b, ins, x, indices, g, n, dtype)
    return Value(_arranged(b, ins, tensor, shape, labels, g), dims, dtype)


@dataclass(frozen=True)
class _GatherDims:
    """A gather's dimension numbers, checked against its operand and indices."""

    offset: list[int]  # the result's dims that the slice's dims take (the rest: the batch dims)
    collapsed: list[int]  # operand dims of slice size 1 the result drops
    start_map: list[int]  # start_map[j]: the operand dim index j along the index vector starts
    batching: list[int]  # operand dims read at the batch position along index dim index_batching[i]
    index_batching: list[int]
    vector_dim: int  # the dim of the indices holding the index vectors (its rank: vectors of 1)
    sizes: list[int]  # the slice's size along each operand dim
    batch_dims: list[int]  # the dims of the indices other than vector_dim, in order
    batch_shape: tuple[int, ...]


def _gather_dims(b: Builder, ins: Instr, shape: tuple[int, ...], indices: Value) -> _GatherDims:
    rank, index_rank = len(shape), len(indices.shape)
    numbers = {key: b.ints(ins, key, default) for key, default in (
        ("offset_dims", []), ("collapsed_slice_dims", []), ("start_index_map", None), ("operand_batching_dims", []),
        ("start_indices_batching_dims", []), ("slice_sizes", None))}
    vector_dim = b.int_attr(ins, "index_vector_dim", index_rank)
    g = _GatherDims(numbers["offset_dims"], numbers["collapsed_slice_dims"], numbers["start_index_map"],
                    numbers["operand_batching_dims"], numbers["start_indices_batching_dims"], vector_dim,
                    numbers["slice_sizes"], [k for k in range(index_rank) if k != vector_dim],
                    tuple(d for k, d in enumerate(indices.shape) if k != vector_dim))

    def bad(what: str) -> CompileError:
        return b.fail(ins, f"{b.where(ins)}: {what} (operand {list(shape)}, indices {list(indices.shape)})")

    if not dtypes.is_integer(indices.dtype):
        raise bad(f"indices of {indices.dtype}: an integer type is needed")
    if not 0 <= vector_dim <= index_rank:
        raise bad(f"index_vector_dim={vector_dim} is not a dim of the indices nor their rank")
    vector = indices.shape[vector_dim] if vector_dim < index_rank else 1
    if vector != len(g.start_map):
        raise bad(f"index vectors of {vector} entries for start_index_map={_ints_text(g.start_map)}")
    b.axes(ins, "start_index_map, operand_batching_dims", g.start_map + g.batching, rank, f"operand {list(shape)}")
    b.axes(ins, "collapsed_slice_dims, operand_batching_dims", g.collapsed + g.batching, rank, f"operand {list(shape)}")
    b.axes(ins, "start_indices_batching_dims", g.index_batching, index_rank, f"indices {list(indices.shape)}")
    if vector_dim in g.index_batching or len(g.index_batching) != len(g.batching) or any(
            indices.shape[i] != shape[o] for i, o in zip(g.index_batching, g.batching)):
        raise bad(f"start_indices_batching_dims={_ints_text(g.index_batching)} do not pair with "
                  f"operand_batching_dims={_ints_text(g.batching)}")
    if len(g.sizes) != rank or any(not 0 <= s <= d for s, d in zip(g.sizes, shape)) or any(
            g.sizes[k] > 1 for k in g.collapsed + g.batching):
        raise bad(f"slice_sizes={_ints_text(g.sizes)} is not a size per operand dim within it (1 at most for the "
                  "collapsed and batching dims)")
    kept = rank - len(g.collapsed) - len(g.batching)
    if len(g.offset) != kept or g.offset != sorted(set(g.offset)) or any(
            not 0 <= p < kept + len(g.batch_dims) for p in g.offset):
        raise bad(f"offset_dims={_ints_text(g.offset)} is not {kept} ascending dims of the result")
    return g


def _ints_text(values: list[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _start_index(b: Builder, ins: Instr, indices: Value, g: _GatherDims, j: int, n: int) -> str:
    """Entry j of every index vector, in i32, flat in the order of the batch dims: [n]."""
    tensor = b.full(ins, indices)
    if g.vector_dim < len(indices.shape) and indices.shape[g.vector_dim] > 1:
        start = [j if k == g.vector_dim else 0 for k in range(len(indices.shape))]
        size = [1 if k == g.vector_dim else d for k, d in enumerate(indices.shape)]
        tensor = b.op(ins, "SLICE", [tensor], {"start": start, "size": size}, indices.dtype, step=f"index{j}")
    return _index(b, ins, b.reshape(ins, tensor, (n,), f"index{j}"), f"index{j}")


def _window_positions(b: Builder, ins: Instr, starts: str, n: int, offsets: np.ndarray) -> str:
    """Each of the n `starts` plus each of the `offsets` in turn, flat: [n * m] i32."""
    m = offsets.size
    if m == 1 and not offsets.any():
        return starts
    table = _table(b, ins, "offsets", offsets.reshape(1, m))
    spread = b.op(ins, "ADD", [b.reshape(ins, starts, (n, 1), "starts"), table], {}, "i32", step="positions")
    return b.reshape(ins, spread, (n * m,), "positions")


def _gathered_rows(b: Builder, ins: Instr, x: Value, indices: Value, g: _GatherDims, n: int,
                   dtype: str) -> tuple[str, list[tuple[str, int]], tuple[int, ...]]:
    """The general gather: x viewed as [rows, row] (row: the trailing dims every slice takes
    whole and no index picks in), a GATHER of the rows at each slice's row numbers. The tensor,
    the label of each of its dims and its shape ([batch..., the sliced leading dims..., row...])."""
    shape = x.shape
    lead = len(shape)
    while lead and lead - 1 not in g.start_map + g.batching + g.collapsed and g.sizes[lead - 1] == shape[lead - 1]:
        lead -= 1
    rows = math.prod(shape[:lead])
    if rows >= 2**31 - 1:
        raise b.fail(ins, f"{b.where(ins)}: its {rows:,} rows do not fit in i32, which the row numbers are computed in")
    strides = [math.prod(shape[k + 1:lead]) for k in range(lead)]
    # each slice's first row: its clamped starts and its batch position, times the dims' strides
    first: str | None = None
    for j, axis in enumerate(g.start_map):
        start = _clamped(b, ins, _start_index(b, ins, indices, g, j, n), shape[axis] - g.sizes[axis], f"start{j}")
        term = b.op(ins, "MUL", [start, b.scalar(ins, strides[axis], "i32")], {}, "i32", step=f"row{j}")
        first = term if first is None else b.op(ins, "ADD", [first, term], {}, "i32", step="row")
    for i, axis in enumerate(g.batching):
        along = g.batch_dims.index(g.index_batching[i])
        where = np.indices(g.batch_shape)[along].reshape(-1)
        term = _table(b, ins, f"batch{i}", where * strides[axis])
        first = term if first is None else b.op(ins, "ADD", [first, term], {}, "i32", step="row")
    if first is None:
        first = _table(b, ins, "row", np.zeros(n))
    # and the rows within each slice: its offsets along the leading dims
    window = tuple(g.sizes[:lead])
    grid = np.indices(window).reshape(lead, -1)
    positions = _window_positions(b, ins, first, n, np.asarray(strides, np.int64) @ grid if lead else np.zeros(1))
    flat = b.reshape(ins, b.full(ins, x), (rows, *shape[lead:]), "rows")
    tensor = _gathered(b, ins, flat, 0, positions, dtype, "gather")
    labels = [("b", j) for j in range(len(g.batch_shape))] + [("o", k) for k in range(len(shape))]
    return tensor, labels, (*g.batch_shape, *window, *shape[lead:])


def _arranged(b: Builder, ins: Instr, tensor: str, shape: tuple[int, ...], labels: list[tuple[str, int]],
              g: _GatherDims) -> str:
    """The gathered `tensor` (dims `labels`: ("b", j) batch dim j, ("o", k) operand dim k; shape
    `shape`) as the gather's result: the collapsed and batching dims dropped, the operand's
    dims at offset_dims in order, the batch dims in the others."""
    dropped = {("o", k) for k in g.collapsed + g.batching}
    keep = [label for label in labels if label not in dropped]
    offsets = iter(sorted(label for label in keep if label[0] == "o"))
    batches = iter(label for label in keep if label[0] == "b")
    target = [next(offsets) if p in g.offset else next(batches) for p in range(len(keep))]
    perm = [keep.index(label) for label in target]
    kept_shape = tuple(d for label, d in zip(labels, shape) if label not in dropped)
    moved = perm != sorted(perm)
    tensor = b.reshape(ins, tensor, kept_shape, "slices" if moved else None)
    return b.transpose(ins, tensor, perm, None)


def _reverse(b: Builder, ins: Instr, args: list) -> Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    axes = b.ints(ins, "dimensions")
    b.axes(ins, "dimensions", axes, len(x.shape), f"operand {list(x.shape)}")
    return Value(_reversed(b, ins, b.full(ins, x), axes, dtype, None), dims, dtype)


def _reversed(b: Builder, ins: Instr, tensor: str, axes: list[int], dtype: str, step: str | None) -> str:
    """`tensor` read backwards along each of `axes`: a GATHER of the positions in reverse order
    per dim (the registry has no reverse), the last one named by `step`."""
    shape = b.shape(tensor)
    flipped = [axis for axis in axes if shape[axis] > 1]
    for axis in flipped:
        if shape[axis] > MAX_MADE_CONSTANT:
            raise b.fail(ins, f"{b.where(ins)}: reversing {shape[axis]} positions is more than the "
                              f"{MAX_MADE_CONSTANT} a GATHER's indices may list")
        last = axis == flipped[-1]
        tensor = b.op(ins, "GATHER", [tensor], {"indices": list(range(shape[axis] - 1, -1, -1)), "axis": axis}, dtype,
                      step=step if last else f"reversed{axis}")
    return tensor


def _reduce(b: Builder, ins: Instr, args: list) -> AnyValue:
    if len(args) == 4:
        return _arg_reduce(b, ins, args)
    if len(args) != 2:
        raise b.fail(ins, f"{b.where(ins)}: a reduce of {len(args) // 2 or len(args)} operands at once is not "
                          "supported (one operand and its init value, or argmax's values and positions)")
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
    identity_init = _neutral(b, init, kind, dtype, ins.type.element == "pred")  # needs no op after the REDUCE
    step = None if identity_init else "reduce"
    reduced = b.op(ins, reduce_op, [b.full(ins, x)], {"axes": axes, "keepdims": False}, dtype, step=step)
    if not identity_init:  # an init value that is not the identity takes part once
        reduced = b.op(ins, combine, [reduced, init.tensor], {}, dtype)
    return _rounded(b, ins, Value(reduced, dims, dtype), comp)


# the float element types a reduction's steps may round through
ROUNDED = frozenset({"f64", "f32", "f16", "bf16", "f8e4m3fn"})


def _unrounded(comp: Computation, instr: Instr) -> Instr:
    """`instr` without the round trips through a narrower float around it: XLA's CPU pipeline
    computes a bf16 or f16 reduction in f32, rounding each step's result to the narrow type and
    back (`convert(convert(max(a, b)))`). The reduction is read as its op, its result rounded so
    once (`_rounded`)."""
    while instr.opcode == "convert" and len(instr.operands) == 1:
        narrow = comp.instrs.get(instr.operands[0])
        if narrow is None or narrow.opcode != "convert" or len(narrow.operands) != 1:
            break
        wide = comp.instrs.get(narrow.operands[0])
        if (wide is None or not all(isinstance(t.type, Shape) and t.type.element in ROUNDED
                                    for t in (instr, narrow, wide)) or wide.type.element != instr.type.element):
            break
        instr = wide
    return instr


def _rounded(b: Builder, ins: Instr, value: Value, comp: Computation) -> Value:
    """`value`, a reduction's result, rounded to the narrower float `comp`'s steps round through
    and back (`_unrounded`): of a max or a min what the rounding at every step gives (rounding is
    monotonic), of a sum its value rounded once."""
    narrow = next((comp.instrs[w.operands[0]].type for w in comp.instrs.values() if _unrounded(comp, w) is not w), None)
    if narrow is None:
        return value
    narrow_dtype = b.dtype(ins, narrow)
    tensor = b.op(ins, "CAST", [value.tensor], {"dtype": narrow_dtype}, narrow_dtype, step="narrowed")
    return Value(b.op(ins, "CAST", [tensor], {"dtype": value.dtype}, value.dtype, step="widened"), value.shape,
                 value.dtype)


def _reducer(b: Builder, ins: Instr, comp: Computation) -> str:
    params = sorted((i for i in comp.instrs.values() if i.opcode == "parameter"), key=lambda i: i.index)
    root = _unrounded(comp, comp.root)
    if (root.opcode in REDUCERS and len(params) == 2 and len(root.operands) == 2
            and sorted(root.operands) == sorted(p.name for p in params)):
        return root.opcode
    raise b.fail(ins, f"{b.where(ins)}: to_apply computation '{clip(comp.name)}' is not one add, multiply, "
                      "maximum or minimum of its two parameters")


def _neutral(b: Builder, init: Value, kind: str, dtype: str, pred: bool = False) -> bool:
    """Whether the scalar `init` is the identity of the reduction by `kind` (a REDUCERS key); of
    pred (held in u8, 0 and 1), `and` and `minimum` start from true, 1, not the u8 highest."""
    start = b.value_of(init.tensor)
    if kind == "and" or (pred and kind == "minimum"):
        neutral = 1
    else:
        neutral = reduction.identity(REDUCERS[kind][0], dtypes.numpy_dtype(dtype))
    return start is not None and bool(np.all(start.astype(np.float64) == neutral))


# ---- reduce-window: the pools ----------------------------------------------------------------

# the reduction a window applies -> the pool; a min pool is the max pool of -x (negation is exact)
POOLS = {"maximum": "MAXPOOL2D", "add": "SUMPOOL2D", "minimum": "MAXPOOL2D",
         "or": "MAXPOOL2D"}  # of pred, held in u8 as 0 and 1: XLA's blocks of a jnp.any


def _reduce_window(b: Builder, ins: Instr, args: list) -> Value:
    """reduce-window over at most two dims of its window (the others of size 1, stride 1, no
    padding) on a pool: those two dims are H and W (a 1-D window's H of 1), the first other dim
    is N and the rest are C, so Flax's NHWC windows are the pool's dims as they are; any other
    order is TRANSPOSEd there and back. Window dilation is the pool's."""
    running = _running(b, ins, args)
    if running is not None:
        return running
    dims, dtype, x, init, kind = _window_operands(b, ins, args)
    window, spatial = _pool_window(b, ins, len(x.shape))
    combine = not _neutral(b, init, kind, dtype)
    if combine and kind == "add" and any(window["pad"][k] != [0, 0] for k in spatial):
        raise b.fail(ins, f"{b.where(ins)}: a padded reduce-window by 'add' from an init value other than 0 is not "
                          "supported (its padding holds that value)")
    others = [k for k in range(len(x.shape)) if k not in spatial]
    perm = others[:1] + spatial + others[1:]
    hw = [None] * (2 - len(spatial)) + spatial  # None: an H (or W) of one element
    attrs = {"kernel": [1 if k is None else window["size"][k] for k in hw],
             "stride": [1 if k is None else window["stride"][k] for k in hw],
             "dilation": [1 if k is None else window["rhs_dilate"][k] for k in hw],
             "padding": [[0, 0] if k is None else window["pad"][k] for k in hw]}
    batch, channels = (x.shape[others[0]] if others else 1), math.prod(x.shape[k] for k in others[1:])
    image = (batch, *(1 if k is None else x.shape[k] for k in hw), channels)
    pooled = (batch, *(1 if k is None else dims[k] for k in hw), channels)  # as the result declares
    moved = tuple(dims[k] for k in perm)  # the result in the transposed order
    # each op after the pool that changes something, the last one under the instruction's name
    steps = [step for step, needed in (("pool", True), ("min", kind == "minimum"), ("pooled", pooled != moved),
                                       ("order", perm != sorted(perm)), ("init", combine)) if needed]
    name = {step: None if step == steps[-1] else step for step in steps}
    tensor = b.reshape(ins, b.transpose(ins, b.full(ins, x), perm, "window"), image, "nhwc")
    if kind == "minimum":
        tensor = b.op(ins, "NEGATE", [tensor], {}, dtype, step="negated")
    tensor = b.op(ins, POOLS[kind], [tensor], attrs, dtype, step=name["pool"])
    if b.shape(tensor) != pooled:
        gives = list(x.shape)
        for k, size in zip(hw, b.shape(tensor)[1:3]):
            if k is not None:
                gives[k] = size
        raise b.fail(ins, f"{b.where(ins)}: declares {list(dims)}, the window over {list(x.shape)} gives {gives}")
    if kind == "minimum":
        tensor = b.op(ins, "NEGATE", [tensor], {}, dtype, step=name["min"])
    tensor = b.reshape(ins, tensor, moved, name.get("pooled"))
    tensor = b.transpose(ins, tensor, [perm.index(k) for k in range(len(perm))], name.get("order"))
    if combine:  # the init value takes part once in each window (a max or min's padding never wins)
        tensor = b.op(ins, REDUCERS[kind][1], [tensor, init.tensor], {}, dtype)
    return _rounded(b, ins, Value(tensor, dims, dtype), b.called(ins, "to_apply"))


# the running reductions a reduce-window whose window is all of an axis is (`_running`)
RUNNING = {"add": "CUMSUM", "multiply": "CUMPROD", "maximum": "CUMMAX", "minimum": "CUMMIN"}


def _running(b: Builder, ins: Instr, args: list) -> Value | None:
    """A reduce-window from its reduction's identity whose window is all of one axis, n long,
    stride 1, padded by n - 1 on one side, as jnp.cumsum, cumprod, cummax and cummin write it
    (from the end where padded after): a CUM* of one step per element, where a pool takes n
    (a top-p sampler's cumsum over 32,000 probabilities, a thousand million adds a row as a
    pool). Padded by n, one more result of none first (XLA's passes write a long one in blocks
    so): the axis takes the identity first, a PAD. None for any other reduce-window."""
    if len(args) != 2 or not isinstance(ins.type, Shape) or ins.type.element == "pred":
        return None
    x, init = (_array_arg(b, ins, a) for a in args)
    kind = _reducer(b, ins, b.called(ins, "to_apply"))
    window = _window(b, ins, len(x.shape))
    if kind not in RUNNING or window["size"] is None or init.shape != () or not _neutral(b, init, kind, x.dtype):
        return None
    slid = [k for k, size in enumerate(window["size"]) if size != 1 or window["pad"][k] != [0, 0]]
    if len(slid) != 1 or any(d != 1 for d in window["lhs_dilate"]) or any(s != 1 for s in window["stride"]):
        return None
    [axis] = slid
    n, (before, after) = x.shape[axis], window["pad"][axis]
    extra = before + after - (n - 1)
    dims, dtype = b.result(ins)
    if (n < 2 or window["size"][axis] != n or window["rhs_dilate"][axis] != 1 or min(before, after) != 0
            or extra not in (0, 1) or dtype != x.dtype
            or dims != tuple(d + extra if k == axis else d for k, d in enumerate(x.shape))):
        return None
    tensor = b.full(ins, x)
    if extra:
        padding = [[0, 0]] * len(dims)
        padding[axis] = [0, 1] if before == 0 else [1, 0]
        start = reduction.identity(REDUCERS[kind][0], dtypes.numpy_dtype(dtype))
        tensor = b.op(ins, "PAD", [tensor], {"padding": padding, "pad_value": start}, dtype, step="start")
    tensor = b.op(ins, RUNNING[kind], [tensor], {"axis": axis, "reverse": before == 0}, dtype)
    return _rounded(b, ins, Value(tensor, dims, dtype), b.called(ins, "to_apply"))


def _window_operands(b: Builder, ins: Instr, args: list) -> tuple[tuple[int, ...], str, Value, Value, str]:
    """A reduce-window's result dims and dtype, its operand, its init value and the reduction (a
    REDUCERS key) that has a pool."""
    if len(args) != 2:  # before the result, a tuple of as many (a max pool's gradient pairs values and positions)
        raise b.fail(ins, f"{b.where(ins)}: a reduce-window of {len(args) // 2 or len(args)} operands at once is "
                          "not supported (one operand and its init value)")
    dims, dtype = b.result(ins)
    x, init = (_array_arg(b, ins, a) for a in args)
    kind = _reducer(b, ins, b.called(ins, "to_apply"))
    if kind not in POOLS:
        raise b.fail(ins, f"{b.where(ins)}: a reduce-window by '{kind}' is not supported (add, maximum, minimum "
                          "are; or on pred)")
    if kind == "minimum" and dtypes.is_integer(x.dtype):
        raise b.fail(ins, f"{b.where(ins)}: a reduce-window by 'minimum' of integers is not supported (a max pool "
                          "of -x, which would overflow at the lowest value)")
    if kind == "add" and ins.type.element == "pred":
        raise b.fail(ins, f"{b.where(ins)}: a reduce-window by 'add' on pred is not supported")
    if kind == "or" and ins.type.element != "pred":
        raise b.fail(ins, f"{b.where(ins)}: a reduce-window by 'or' is supported on pred only")
    if init.shape != () or len(dims) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: takes an operand of the result's rank and a scalar init value, got "
                          f"{list(x.shape)} and {list(init.shape)} for {list(dims)}")
    return dims, dtype, x, init, kind


def _pool_window(b: Builder, ins: Instr, rank: int) -> tuple[dict[str, Any], list[int]]:
    """A reduce-window's window and the dims it slides along (at most two): any other has size 1,
    stride 1 and no padding. Its rhs_reversal changes no max, sum or min."""
    window = _window(b, ins, rank)
    if window["size"] is None:
        raise b.fail(ins, f"{b.where(ins)}: the window has no size")
    if any(d != 1 for d in window["lhs_dilate"]):
        raise b.fail(ins, f"{b.where(ins)}: base dilation (lhs_dilate) is not supported")
    if any(v < 0 for pad in window["pad"] for v in pad):
        raise b.fail(ins, f"{b.where(ins)}: negative window padding is not supported")
    spatial = [k for k in range(rank) if (window["size"][k], window["stride"][k], window["pad"][k],
                                          window["rhs_dilate"][k]) != (1, 1, [0, 0], 1)]
    if len(spatial) > 2:
        raise b.fail(ins, f"{b.where(ins)}: a window over {len(spatial)} dimensions does not map onto the 2-D pools")
    return window, spatial


def _scaled(op_type: str) -> Handler:
    """divide and multiply: a sum pool's windows divided by their sizes, or multiplied by their
    reciprocals (XLA's rewrite of the division), are their mean, one AVGPOOL2D (Flax's avg_pool);
    anything else is the map op."""
    plain = _map(op_type, 2)

    def handler(b: Builder, ins: Instr, args: list) -> Value:
        return _mean_pool(b, ins, args) or plain(b, ins, args)
    return handler


def _mean_pool(b: Builder, ins: Instr, args: list) -> Value | None:
    """The AVGPOOL2D `ins` is, or None: a SUMPOOL2D, through views and transposes, scaled by
    constants that are its windows' sizes (count_include_pad) or the input elements in each.
    The AVGPOOL2D is made through the same views, so the sum pool is left for nothing to read."""
    if len(args) != 2 or not all(isinstance(a, Value) for a in args) or dtypes.is_integer(args[0].dtype):
        return None
    dims, dtype = b.result(ins)
    for total, scale in ([args] if ins.opcode == "divide" else [args, args[::-1]]):
        chain, factors = _pool_chain(b, total.tensor), b.value_of(scale.tensor)
        if chain is None or factors is None or total.shape != dims or scale.shape != dims:
            continue
        pool = chain[0]
        attrs = REGISTRY["SUMPOOL2D"].normalize_attrs(pool.attrs)
        for include in (True, False):
            counts = _window_counts(b, chain, attrs, include)
            want = (counts if ins.opcode == "divide" else 1 / counts).astype(factors.dtype)
            if np.array_equal(np.broadcast_to(factors, dims), want):
                mean = {**pool.attrs, "count_include_pad": include}
                tensor = b.op(ins, "AVGPOOL2D", pool.inputs, mean, dtype, step="mean" if chain[1:] else None)
                for i, view in enumerate(chain[1:], 2):
                    tensor = b.op(ins, view.op_type, [tensor], view.attrs, dtype,
                                  step=None if i == len(chain) else f"mean{i}")
                return Value(tensor, dims, dtype)
    return None


def _pool_chain(b: Builder, tensor: str) -> list | None:
    """[the SUMPOOL2D, then the RESHAPEs and TRANSPOSEs after it] that make `tensor`, or None."""
    views = []
    op = b.producer.get(tensor)
    while op is not None and op.op_type in ("RESHAPE", "TRANSPOSE"):
        views.append(op)
        op = b.producer.get(op.inputs[0])
    return None if op is None or op.op_type != "SUMPOOL2D" else [op, *reversed(views)]


def _window_counts(b: Builder, chain: list, attrs: dict[str, Any], include: bool) -> np.ndarray:
    """How many elements each window of the chain's pool sums (its kernel's size, or the input
    elements in it), float64, laid out as the chain's last tensor."""
    _, height, width, _ = b.shape(chain[0].inputs[0])
    counts = inputs_in_windows(attrs, height, width, np.float64)
    if include:
        counts = np.full_like(counts, math.prod(attrs["kernel"]))
    counts = np.broadcast_to(counts, b.shape(chain[0].outputs[0]))
    for view in chain[1:]:
        opdef = REGISTRY[view.op_type]
        [counts] = opdef.reference([counts], opdef.normalize_attrs(view.attrs), ["f64"])
    return counts


# ---- reduce of two operands: argmax and argmin -----------------------------------------------

# compare's directions on Python values, for the comparator's probes
ORDERS = {"EQ": operator.eq, "NE": operator.ne, "LT": operator.lt, "LE": operator.le, "GT": operator.gt,
          "GE": operator.ge}
TRUTH = {"and": lambda p, q: p and q, "or": lambda p, q: p or q, "xor": operator.ne}


def _arg_reduce(b: Builder, ins: Instr, args: list) -> tuple[Value, Value]:
    """reduce((x, positions), (identity, 0)) as jnp.argmax and jnp.argmin write it: the
    comparator keeps the larger (smaller) value, NaN before any, and of equal ones the first
    (or last) position -> (REDUCE_MAX, ARGMAX with select_last_index) or the MIN pair."""
    x, where, x_init, where_init = (_array_arg(b, ins, a) for a in args)
    if not (isinstance(ins.type, tuple) and len(ins.type) == 2 and all(isinstance(t, Shape) for t in ins.type)):
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, a reduce of two operands makes two arrays")
    axes = b.ints(ins, "dimensions")
    b.axes(ins, "dimensions", axes, len(x.shape), f"operand {list(x.shape)}")
    if len(axes) != 1:
        raise b.fail(ins, f"{b.where(ins)}: an argmax or argmin over {len(axes)} dimensions at once is not supported")
    [axis] = axes
    pred, comp = ins.type[0].element == "pred", b.called(ins, "to_apply")
    kind, last = _comparator(b, ins, comp, not dtypes.is_integer(x.dtype), pred)
    positions = b.value_of(where.tensor)
    along = np.arange(x.shape[axis]).reshape([-1 if k == axis else 1 for k in range(len(x.shape))])
    if where.shape != x.shape or positions is None or not np.array_equal(np.broadcast_to(positions, x.shape),
                                                                         np.broadcast_to(along, x.shape)):
        raise b.fail(ins, f"{b.where(ins)}: operand 1 is not the positions along dimension {axis} (an iota)")
    extreme_kind = "maximum" if kind == "MAX" else "minimum"
    if not (x_init.shape == where_init.shape == () and _neutral(b, x_init, extreme_kind, x.dtype, pred)
            and _neutral(b, where_init, "add", where.dtype)):
        raise b.fail(ins, f"{b.where(ins)}: the init values must be the {extreme_kind}'s identity and position 0")
    (dims, dtype), (position_dims, position_dtype) = ((t.dims, b.dtype(ins, t)) for t in ins.type)
    if dtype != x.dtype or position_dtype != where.dtype or not dtypes.is_integer(position_dtype):
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, not the values' {x.dtype} and the "
                          f"positions' {where.dtype}, an integer type")
    data = b.full(ins, x)
    extreme = b.op(ins, f"REDUCE_{kind}", [data], {"axes": [axis], "keepdims": False}, dtype, step=kind.lower())
    position = b.op(ins, f"ARG{kind}", [data], {"axis": axis, "keepdims": False, "select_last_index": last},
                    position_dtype, step=f"arg{kind.lower()}")
    return _rounded(b, ins, Value(extreme, dims, dtype), comp), Value(position, position_dims, position_dtype)


def _comparator(b: Builder, ins: Instr, comp: Computation, floating: bool, pred: bool) -> tuple[str, bool]:
    """(MAX or MIN, whether the last of equal extremes wins) of an argmax/argmin comparator,
    recognised by what it does: made of compares of its parameters (values with values, positions
    with positions), logic and selects, what it returns depends only on how the two values and
    the two positions compare, so running it on one pair of each order (with NaN for floats)
    tries every case. Values of pred are false and true, which XLA's passes may pick with `or`
    (a max) or `and` (a min)."""
    values = (False, True) if pred else (2.0, 3.0, math.nan) if floating else (2, 3)
    probes = [(v, i, w, j) for v in values for w in values for i, j in ((5, 7), (7, 5), (5, 5))]
    results = [_run_comparator(b, ins, comp, probe) for probe in probes]
    for kind, last in (("MAX", False), ("MAX", True), ("MIN", False), ("MIN", True)):
        if all(_keeps(kind, last, probe, result) for probe, result in zip(probes, results)):
            return kind, last
    raise b.fail(ins, f"{b.where(ins)}: to_apply computation '{clip(comp.name)}' is not an argmax or argmin "
                      "comparator (the larger or smaller value, NaN first, and of equal ones the first or last "
                      "position); other reductions of several operands are not supported")


def _keeps(kind: str, last: bool, probe: tuple, result: Any) -> bool:
    """Whether a comparator's `result` on (value, position, value, position) is the argmax's
    (`kind` MAX) or argmin's pair: NaN first (of two NaNs either position), then the extreme, of
    equal values the first position (the last with `last`)."""
    if not (isinstance(result, tuple) and len(result) == 2 and type(result[0]) is type(probe[0])
            and isinstance(result[1], int) and not isinstance(result[1], bool)):
        return False
    a, i, c, j = probe
    value, position = result
    if math.isnan(a) or math.isnan(c):
        return math.isnan(value) and (position in (i, j) if math.isnan(a) and math.isnan(c)
                                      else position == (i if math.isnan(a) else j))
    if a == c:
        return value == a and position == (max if last else min)(i, j)
    return (value, position) == ((a, i) if (a > c) == (kind == "MAX") else (c, j))


def _run_comparator(b: Builder, ins: Instr, comp: Computation, probe: tuple) -> Any:
    """What `comp` returns given `probe` (value, position, value, position); an instruction it is
    not made of is refused."""
    values: dict[str, Any] = {}
    round_trips = {name for w in comp.instrs.values() if _unrounded(comp, w) is not w for name in (w.name, w.operands[0])}
    for i in b.order(comp):
        got = [values[o] for o in i.operands]
        params = [comp.instrs[o] for o in i.operands if comp.instrs[o].opcode == "parameter"]
        # two values or two positions (a value's parameter number is even, a position's odd)
        alike = len(params) == 2 == len(got) and params[0].index % 2 == params[1].index % 2
        direction = b.attr(i, "direction", required=False)
        if i.opcode == "parameter" and 0 <= i.index < len(probe):
            values[i.name] = probe[i.index]
        elif (i.opcode == "compare" and alike and direction in ORDERS
              and b.attr(i, "type", required=False) != "TOTALORDER"):
            values[i.name] = ORDERS[direction](*got)
        elif i.opcode in TRUTH and len(got) == 2 and all(isinstance(g, bool) for g in got):
            values[i.name] = TRUTH[i.opcode](*got)
        elif i.opcode == "not" and len(got) == 1 and isinstance(got[0], bool):
            values[i.name] = not got[0]
        elif i.opcode == "select" and len(got) == 3 and isinstance(got[0], bool):
            values[i.name] = got[1] if got[0] else got[2]
        elif i.opcode == "tuple":
            values[i.name] = tuple(got)
        elif i.name in round_trips:  # the chosen value rounded to a narrower float and back: itself
            values[i.name] = got[0]
        else:
            raise b.fail(ins, f"{b.where(ins)}: instruction '{clip(i.name)}' ({clip(i.opcode)}) of to_apply "
                              f"computation '{clip(comp.name)}' is not one an argmax or argmin comparator is made "
                              "of (compares of its parameters, and, or, xor, not, select, tuple)")
    return values[comp.root.name]


# ---- sort and top-k -------------------------------------------------------------------------------


def _sort(b: Builder, ins: Instr, args: list) -> AnyValue:
    """sort along one dimension by a comparator of operand 0's elements, as jnp.sort and
    jnp.argsort write it: operand 0 SORTed, and each other operand that is the positions along
    that dimension (an iota, or one reversed, as a descending argsort sorts the reversed operand)
    ARGSORTed, as the carried values those positions pick; any other operand taken in the keys'
    order (`_taken_along`). The comparator is recognised by what it does (`_sort_order`)."""
    if not args:
        raise b.fail(ins, f"{b.where(ins)}: a sort takes at least one operand")
    operands = [_array_arg(b, ins, a) for a in args]
    keys = operands[0]
    axes = b.ints(ins, "dimensions")
    b.axes(ins, "dimensions", axes, len(keys.shape), f"operand {list(keys.shape)}")
    if len(axes) != 1:
        raise b.fail(ins, f"{b.where(ins)}: dimensions={{{','.join(map(str, axes))}}}: a sort is along one dimension")
    [axis] = axes
    types = list(ins.type) if isinstance(ins.type, tuple) else [ins.type]
    if len(types) != len(operands) or any(not isinstance(t, Shape) or t.dims != o.shape
                                          for t, o in zip(types, operands)):
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, not one array per operand, shaped as it")
    order = {"axis": axis, **_sort_order(b, ins, b.called(ins, "to_apply"), [o.dtype for o in operands])}
    data = b.full(ins, keys)
    results = [Value(b.op(ins, "SORT", [data], order, keys.dtype, step="sort"), keys.shape, keys.dtype)]
    along = np.arange(keys.shape[axis]).reshape([-1 if k == axis else 1 for k in range(len(keys.shape))])
    for k, carried in enumerate(operands[1:], 1):
        known = b.value_of(carried.tensor)
        line = None
        if known is not None and dtypes.is_integer(carried.dtype):
            known = np.broadcast_to(known, keys.shape).astype(np.int64)
            first = np.take(known, [0], axis=axis)
            step = np.take(known, [1], axis=axis) - first if keys.shape[axis] > 1 else np.zeros_like(first)
            if np.all(step == step.flat[0]) and np.all(first == first.flat[0]) \
                    and np.array_equal(known, first + step * along):
                line = int(first.flat[0]), int(step.flat[0])
        if line is None:
            results.append(Value(_taken_along(b, ins, carried, k, axis, order, data), keys.shape, carried.dtype))
            continue
        _holds_positions(b, ins, carried.dtype, keys.shape[axis])
        positions = b.op(ins, "ARGSORT", [data], order, carried.dtype, step="argsort")
        start, step = line  # the carried value at each position p: start + step p
        if step != 1:
            positions = b.op(ins, "MUL", [positions, b.scalar(ins, step, carried.dtype)], {}, carried.dtype,
                             step="step")
        if start:
            positions = b.op(ins, "ADD", [positions, b.scalar(ins, start, carried.dtype)], {}, carried.dtype,
                             step="start")
        results.append(Value(positions, keys.shape, carried.dtype))
    return results[0] if not isinstance(ins.type, tuple) else tuple(results)


def _taken_along(b: Builder, ins: Instr, carried: Value, k: int, axis: int, order: dict[str, Any], keys: str) -> str:
    """Operand `k` of a sort in the order that sorts `keys` along `axis` (jax.lax.sort_key_val's
    values): a GATHER of its elements, viewed flat, at the flat positions of the ARGSORTed keys
    (each position along the axis times its stride, plus what the element's other coordinates
    add), computed in i32."""
    shape = carried.shape
    size = math.prod(shape)
    if size >= 2**31 - 1:
        raise b.fail(ins, f"{b.where(ins)}: its {size:,} elements do not fit in i32, which the positions are "
                          "computed in")
    strides = [math.prod(shape[j + 1:]) for j in range(len(shape))]
    flat = b.op(ins, "ARGSORT", [keys], order, "i32", step="order")
    if strides[axis] != 1:
        flat = b.op(ins, "MUL", [flat, b.scalar(ins, strides[axis], "i32")], {}, "i32", step="stride")
    others = sum((np.arange(d).reshape([-1 if j == i else 1 for j in range(len(shape))]) * strides[i]
                  for i, d in enumerate(shape) if i != axis), np.zeros((), np.int64))
    if np.any(others):
        rows = b.constant(f"{b.own_name(ins)}.rows", np.broadcast_to(others, shape).astype(np.int32), "i32")
        flat = b.op(ins, "ADD", [flat, rows], {}, "i32", step="flat")
    elements = b.reshape(ins, b.full(ins, carried), (size,), f"values{k}")
    taken = b.op(ins, "GATHER", [elements, b.reshape(ins, flat, (size,), "positions")], {"axis": 0}, carried.dtype,
                 step=f"taken{k}")
    return b.reshape(ins, taken, shape, f"sorted{k}")


def _top_k(b: Builder, ins: Instr, args: list, order: dict[str, Any], k: int | None = None) -> tuple:
    """The k first along the last dimension in SORT's `order` (the largest, or the smallest) and
    their positions: SLICEs of the operand SORTed and ARGSORTed."""
    b.arity(ins, args, 1)
    x = _array_arg(b, ins, args[0])
    if not (isinstance(ins.type, tuple) and len(ins.type) == 2 and all(isinstance(t, Shape) for t in ins.type)
            and ins.type[0].dims == ins.type[1].dims and len(x.shape) >= 1
            and ins.type[0].dims[:-1] == x.shape[:-1] and 1 <= ins.type[0].dims[-1] <= x.shape[-1]
            and ins.type[0].dims[-1] == (k if k is not None else ins.type[0].dims[-1])):
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, not the top {k if k is not None else 'k'} "
                          f"(at least 1) of {list(x.shape)} and their positions")
    (dims, dtype), (_, position_dtype) = ((t.dims, b.dtype(ins, t)) for t in ins.type)
    _holds_positions(b, ins, position_dtype, x.shape[-1])
    if dtype != x.dtype:
        raise b.fail(ins, f"{b.where(ins)}: declares {type_text(ins.type)}, not the operand's {x.dtype} and the "
                          "positions")
    data = b.full(ins, x)
    order = {"axis": len(x.shape) - 1, **order}
    box = {"start": [0] * len(dims), "size": list(dims)}
    return tuple(Value(b.op(ins, "SLICE", [b.op(ins, op, [data], order, t, step=op.lower())], box, t), dims, t)
                 for op, t in (("SORT", dtype), ("ARGSORT", position_dtype)))


def _holds_positions(b: Builder, ins: Instr, dtype: str, n: int) -> None:
    """Positions along a dimension of n are of an integer type that holds n - 1."""
    if not dtypes.is_integer(dtype) or np.iinfo(dtypes.numpy_dtype(dtype)).max < n - 1:
        raise b.fail(ins, f"{b.where(ins)}: positions of {dtype} cannot number the {n} elements of the dimension")


def _topk(b: Builder, ins: Instr, args: list) -> tuple:
    """topk(x), k=K, largest=true|false: in IEEE's total order, as XLA's TopK compares."""
    largest = b.attr(ins, "largest", required=False)
    if largest not in (None, "true", "false"):
        raise b.fail(ins, f"{b.where(ins)}: largest={clip(largest)} is not true or false")
    return _top_k(b, ins, args, {"descending": largest != "false", "total_order": True}, b.int_attr(ins, "k"))


def _sort_order(b: Builder, ins: Instr, comp: Computation, operand_dtypes: list[str]) -> dict[str, Any]:
    """SORT's `descending` and `total_order` that a sort's comparator means, recognised by what
    it does: run on every pair of operand 0's values (NaN of each sign, -0.0 and 0.0 among
    floats), each with the other operands' pairs in either order and equal, it must say "before"
    exactly where SORT puts the first strictly before the second: ascending or descending, NaN
    and -0.0 as jnp.sort makes them canonical, or in IEEE's total order (XLA's TopK). A
    comparator that breaks ties on another operand, or reads a parameter of none, is refused."""
    params = [i for i in comp.instrs.values() if i.opcode == "parameter"]
    if len(params) != 2 * len(operand_dtypes):
        raise b.fail(ins, f"{b.where(ins)}: to_apply computation '{clip(comp.name)}' has {len(params)} parameters, "
                          f"a comparator of {len(operand_dtypes)} operands has {2 * len(operand_dtypes)}")
    kind = dtypes.numpy_dtype(operand_dtypes[0])
    if dtypes.is_integer(operand_dtypes[0]):
        info = np.iinfo(kind)
        values = [np.asarray(v, kind) for v in (info.min, -7, -1, 0, 2, 5, info.max) if info.min <= v <= info.max]
    else:
        wanted = (-math.inf, -2.5, -0.0, 0.0, 1.0, 3.5, math.inf)
        with np.errstate(all="ignore"):  # only what the type holds (f8e4m3fn has no infinity)
            values = [np.asarray(w, kind) for w in wanted if float(np.asarray(w, kind)) == w]
            values += [np.asarray(math.nan, kind), np.negative(np.asarray(math.nan, kind))]  # a NaN of each sign
    pairs = [[np.asarray(v, dtypes.numpy_dtype(t)) for v in pair] for t in operand_dtypes[1:]
             for pair in ((0, 1), (1, 0), (0, 0))]
    carried = [[v for pair in others for v in pair] for others in itertools.product(
        *(pairs[3 * k:3 * k + 3] for k in range(len(operand_dtypes) - 1)))]
    said = [{bool(_run_scalars(b, ins, comp, [p, q, *others])) for others in carried} for p in values for q in values]
    argsort = REGISTRY["ARGSORT"]
    for descending, total in itertools.product((False, True), (False, True)):
        order = argsort.normalize_attrs({"axis": 0, "descending": descending, "total_order": total})
        # p strictly before q: q then p sorted comes out p first
        before = [argsort.reference([np.stack([q, p])], order, ["i32"])[0][0] == 1 for p in values for q in values]
        if all(results == {bool(want)} for want, results in zip(before, said)):
            return {"descending": descending, "total_order": total}
    raise b.fail(ins, f"{b.where(ins)}: to_apply computation '{clip(comp.name)}' is not an ascending or descending "
                      "comparator of operand 0 alone (NaN last, or first; canonical or in IEEE's total order)")


SCALAR_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
                  "GE": np.greater_equal}


def _run_scalars(b: Builder, ins: Instr, comp: Computation, params: list[np.ndarray]) -> np.ndarray:
    """What `comp`, a computation of scalars, returns given its parameters' values: made of
    parameters, constants, compares (TOTALORDER too), selects, logic, bitcast-converts, converts
    and negates, as XLA writes a sort's comparator before its passes and after."""
    values: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for i in b.order(comp):
            got = [values[o] for o in i.operands]
            numpy_type = (dtypes.numpy_dtype(b.dtype(ins, i.type)) if isinstance(i.type, Shape) and i.type.dims == ()
                          else None)
            if i.opcode == "parameter" and 0 <= i.index < len(params):
                values[i.name] = params[i.index]
            elif i.opcode == "constant" and numpy_type is not None:
                values[i.name] = _literal_array(b, i, (), b.dtype(ins, i.type)).astype(numpy_type).reshape(())
            elif i.opcode == "compare" and len(got) == 2 and b.attr(i, "direction") in SCALAR_COMPARE:
                total = b.attr(i, "type", required=False) == "TOTALORDER"
                values[i.name] = SCALAR_COMPARE[b.attr(i, "direction")](*(reduction.total_order(g) if total else g
                                                                             for g in got))
            elif i.opcode == "select" and len(got) == 3:
                values[i.name] = got[1] if got[0] else got[2]
            elif i.opcode in ("and", "or", "xor") and len(got) == 2:
                values[i.name] = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[i.opcode](*got)
            elif i.opcode == "not" and len(got) == 1:
                values[i.name] = np.logical_not(got[0]) if got[0].dtype == np.bool_ else np.invert(got[0])
            elif i.opcode in ("bitcast-convert", "bitcast") and len(got) == 1 and numpy_type is not None \
                    and numpy_type.itemsize == got[0].dtype.itemsize:  # a scalar bitcast reinterprets its bits
                values[i.name] = got[0].reshape(1).view(numpy_type).reshape(())
            elif i.opcode == "convert" and len(got) == 1 and numpy_type is not None:
                values[i.name] = got[0].astype(numpy_type)
            elif i.opcode == "negate" and len(got) == 1:
                values[i.name] = np.negative(got[0])
            else:
                raise b.fail(ins, f"{b.where(ins)}: instruction '{clip(i.name)}' ({clip(i.opcode)}) of "
                                  f"computation '{clip(comp.name)}' is not one a sort's comparator is made of "
                                  "(compares, selects, logic, bitcast-converts, converts, negates of its parameters "
                                  "and constants)")
    return values[comp.root.name]


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
    values = b.value_of(fill.tensor)
    if values is None or fill.shape != ():
        raise b.fail(ins, f"{b.where(ins)}: the padding value must be a scalar constant")
    value = int(values) if dtypes.is_integer(fill.dtype) else float(values)
    if isinstance(value, float) and math.isnan(value):
        raise b.fail(ins, f"{b.where(ins)}: padding with nan is not supported (the object file has no NaN)")
    # interior padding spreads the elements apart (a gradient of a strided convolution or pool,
    # an associative scan), as a transposed convolution's input is dilated; negative padding crops
    spread = [interior + 1 if d > 1 else 1 for d, (_, _, interior) in zip(x.shape, pads)]
    if any(max(-lo, 0) + max(-hi, 0) > max((d - 1) * s + 1, 0) for d, s, (lo, hi, _) in zip(x.shape, spread, pads)):
        raise b.fail(ins, f"{b.where(ins)}: padding={text} crops more than the operand holds")

    def emit(op_type: str, tensor: str, attrs: dict[str, Any]) -> str:
        if op_type == "RESHAPE":
            return b.reshape(ins, tensor, tuple(attrs["new_shape"]), "spread")
        return b.op(ins, op_type, [tensor], attrs, dtype, step="crop" if op_type == "SLICE" else "spread")

    tensor, padding = dilated_input(emit, b.full(ins, x), x.shape, list(range(len(x.shape))), spread,
                                    [[lo, hi] for lo, hi, _ in pads], value)
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


# ---- control flow and XLA's wrappers ---------------------------------------------------------
# A loop or a conditional whose path is known at compile time is unrolled or inlined: the graph
# has no control flow. XLA's wrappers that change no value are their operand.

# trips a while loop is unrolled to (a Flax scan has one per layer); its bodies count toward
# MAX_INLINED too. Refusing a longer loop costs this many trips of inlining first
MAX_TRIP_COUNT = 1 << 10
# custom-call targets that are the identity on their operand (with_sharding_constraint's
# placement hint); any other target is refused by name
IDENTITY_TARGETS = frozenset({"Sharding"})


def _while(b: Builder, ins: Instr, args: list) -> AnyValue:
    """Unrolled: the condition is inlined on the loop's state and must fold to a constant (an
    induction variable that starts, steps and stops at constants); while it is true the body is
    inlined on the state, its tensors named `<while>.<trip>.<name>`."""
    b.arity(ins, args, 1)
    condition, body = b.called(ins, "condition"), b.called(ins, "body")
    state, trip = args[0], 0
    while True:
        go = _known(b, ins, b.inline(ins, condition, [state], label=f"{trip}.condition"),
                    f"its condition '{clip(condition.name)}'")
        if go is None:
            raise b.fail(ins, f"{b.where(ins)}: its condition '{clip(condition.name)}' is known only at run time: "
                              "only a loop whose trip count is known at compile time is unrolled")
        if not go:
            return state
        if trip == MAX_TRIP_COUNT:
            raise b.fail(ins, f"{b.where(ins)}: more than {MAX_TRIP_COUNT} trips, the most a loop is unrolled to")
        state, trip = b.inline(ins, body, [state], label=str(trip)), trip + 1


def _conditional(b: Builder, ins: Instr, args: list) -> AnyValue:
    """The branch a constant predicate (true: `true_computation`) or branch index (out of range:
    the last branch, as XLA's) selects, inlined on its operand."""
    if not args:
        raise b.fail(ins, f"{b.where(ins)} takes a predicate or branch index and the branches' operands")
    if "branch_computations" in ins.attrs:
        branches = b.called_list(ins, "branch_computations")
    else:
        branches = [b.called(ins, "true_computation"), b.called(ins, "false_computation")]
    b.arity(ins, args, len(branches) + 1)
    selector = _known(b, ins, args[0], "its predicate or branch index")
    if selector is None:
        raise b.fail(ins, f"{b.where(ins)}: the branch is chosen at run time: only a conditional on a constant "
                          "predicate or branch index is inlined")
    if "branch_computations" in ins.attrs:
        taken = selector if 0 <= selector < len(branches) else len(branches) - 1
    else:
        taken = 0 if selector else 1
    return b.inline(ins, branches[taken], [args[1 + taken]], label=f"branch{taken}")


def _known(b: Builder, ins: Instr, value: AnyValue, what: str) -> int | None:
    """The value of `what`, a pred or integer scalar, when known at compile time (pred: 0 or 1);
    None when not."""
    if not isinstance(value, Value) or value.shape != () or not dtypes.is_integer(value.dtype):
        raise b.fail(ins, f"{b.where(ins)}: {what} is not a pred or integer scalar")
    values = b.value_of(value.tensor)
    return None if values is None else int(values.reshape(()))


def _custom_call(b: Builder, ins: Instr, args: list) -> AnyValue:
    target = b.attr(ins, "custom_call_target").strip("\"'")
    if target == "TopK":  # XLA's CPU passes make a topk one, its comparator the order
        comps = b.called_list(ins, "called_computations")
        if len(comps) != 1:
            raise b.fail(ins, f"{b.where(ins)}: a TopK custom-call calls one comparator, got {len(comps)}")
        b.arity(ins, args, 1)
        # its comparator compares the values, and the positions where the top-k's positions are used
        compared = sum(i.opcode == "parameter" for i in comps[0].instrs.values()) // 2
        operands = [_array_arg(b, ins, args[0]).dtype, "i32"][:max(compared, 1)]
        return _top_k(b, ins, args, _sort_order(b, ins, comps[0], operands))
    if target not in IDENTITY_TARGETS:
        raise b.fail(ins, f"{b.where(ins)}: custom_call_target \"{clip(target)}\" is not supported (supported: "
                          f"{', '.join(sorted(IDENTITY_TARGETS | {'TopK'}))})")
    return _copy(b, ins, args)


def _lies_row_major(t: Shape) -> bool:
    """The elements of `t` lie in memory in row-major order (dims of 1 aside): a bitcast between
    two such shapes is a reshape."""
    return not t.tiled and keeps_order(t.dims, t.major_to_minor)


HANDLERS: dict[str, Handler] = {
    "constant": _constant,
    "iota": _iota,
    **{opcode: _map(op, 1) for opcode, op in UNARY.items()},
    **{opcode: _map(op, 2) for opcode, op in BINARY.items()},
    **{opcode: _scaled(BINARY[opcode]) for opcode in ("divide", "multiply")},  # the mean of a sum pool first
    **{opcode: _map(op, arity, attrs) for opcode, (op, arity, attrs) in WITH_ATTRS.items()},
    **{opcode: _logic(*ops, 1 if opcode == "not" else 2) for opcode, ops in LOGIC.items()},
    "is-finite": _is_finite,
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
    "reduce-window": _reduce_window,
    "slice": _slice,
    "sort": _sort,
    "topk": _topk,
    "concatenate": _concatenate,
    "pad": _pad,
    "reverse": _reverse,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "gather": _gather,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    **{opcode: _call(key) for opcode, key in CALLS.items()},
    "while": _while,
    "conditional": _conditional,
    "custom-call": _custom_call,
    "opt-barrier": _copy,  # keeps XLA from moving work across it: the same values
}


def apply(b: Builder, ins: Instr, args: list, operands: list[HloType]) -> AnyValue:
    """The value `ins` makes from its operands' values (`args`; `operands` their declared types)."""
    handler = HANDLERS.get(ins.opcode)
    if handler is None:
        raise b.fail(ins, f"'{clip(ins.name)}': HLO op '{clip(ins.opcode)}' is not supported")
    shapes = [t for t in [ins.type, *operands] if isinstance(t, Shape)]
    if ins.opcode == "bitcast" and any(t.tiled for t in shapes):
        raise b.fail(ins, f"{b.where(ins)}: a bitcast of a tiled layout places elements in tiles, which is not "
                          "supported (only dims minor to major)")
    if ins.opcode == "bitcast" and len(operands) == 1 and not all(_lies_row_major(t) for t in shapes):
        handler = functools.partial(_relaid, operand=operands[0])
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
