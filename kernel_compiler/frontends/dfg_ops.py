"""The `.dfg` format's operators: every way it spells an op, and how its attributes read in the
registry's names.

A node names its op twice. The operator field is upstream's DomainFlowOperator enum (its reader
throws on anything else). A TOSA import also writes the TOSA op as the node name (`tosa.clamp`),
and that name is the only record of the ops the importer does not track: those it writes with
the operator field UNKNOWN (`|tosa.tanh|UNKNOWN|`). Attributes are MLIR's, printed by the
importer, so they carry TOSA's names (`min_fp`, `axis`); each row says how they become the
registry's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dfx.dtypes import is_integer
from dfx.ops import ShapeError

# (the node's attributes, the dtype of its first result) -> the attributes in the registry's
# names; ShapeError with the reason when they cannot be
Translate = Callable[[dict[str, Any], str], dict[str, Any]]


def _as_is(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    return dict(attrs)


# TOSA's clamp always gives both pairs; the element type says which one applies
_CLAMP_BOUNDS = {"fp": {"min_fp": "min", "max_fp": "max"}, "int": {"min_int": "min", "max_int": "max"}}


def _clamp(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    used, unused = ("int", "fp") if is_integer(dtype) else ("fp", "int")
    return {_CLAMP_BOUNDS[used].get(k, k): v for k, v in attrs.items() if k not in _CLAMP_BOUNDS[unused]}


def _reduce(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    # a TOSA reduction takes one axis and keeps it, as size 1
    attrs = dict(attrs)
    if "axis" in attrs:
        attrs.update(axes=[attrs.pop("axis")], keepdims=True)
    return attrs


def _mul(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    attrs = dict(attrs)
    shift = attrs.pop("shift", 0)
    if shift != 0:  # a non-zero shift rescales an integer product: fixed-point arithmetic
        raise ShapeError(f"shift {shift!r} makes MUL integer fixed-point arithmetic ((a * b) >> shift), "
                         "which the registry's MUL does not do; only shift 0 is accepted")
    return attrs


def _pad(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    # TOSA's padding is flat, the start and end of each dim in turn; its fill is `pad_const`
    attrs = {"pad_value" if k == "pad_const" else k: v for k, v in attrs.items()}
    flat = attrs.get("padding")
    if isinstance(flat, list) and len(flat) % 2 == 0:
        attrs["padding"] = [flat[i:i + 2] for i in range(0, len(flat), 2)]
    return attrs


def _window(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    # TOSA's pad is flat, [top, bottom, left, right]; its pools' accumulator type is the
    # registry's rule (f32 for float)
    attrs = {k: v for k, v in attrs.items() if k != "acc_type"}
    flat = attrs.pop("pad", None)
    if isinstance(flat, list) and len(flat) == 4:
        attrs["padding"] = [flat[:2], flat[2:]]
    elif flat is not None:
        raise ShapeError(f"pad {flat!r} is not [top, bottom, left, right]")
    return attrs


def _cast(attrs: dict[str, Any], dtype: str) -> dict[str, Any]:
    return {"dtype": dtype, **attrs}  # TOSA's cast says its target type only in its result type


@dataclass(frozen=True)
class DfgOp:
    op: str  # the registry op; a name the registry lacks (CONV2D) parses and has no lowering yet
    operator_field: str | None  # the DomainFlowOperator token; None: upstream writes these UNKNOWN
    tosa: str | None  # the TOSA op name an import writes as the node name
    attrs: Translate = _as_is
    # operand slot -> the attribute some TOSA versions pass there as a constant tensor; a .dfg
    # holds no constant values, so such a node cannot be read
    value_operands: dict[int, str] = field(default_factory=dict)


SPELLINGS = [
    #     registry op        operator field      TOSA node name              attributes
    DfgOp("ADD",             "ADD",              "tosa.add"),
    DfgOp("SUB",             "SUB",              "tosa.sub"),
    DfgOp("MUL",             "MUL",              "tosa.mul",                 _mul, {2: "shift"}),
    DfgOp("DIV",             "DIV",              "tosa.int_div"),
    DfgOp("POW",             None,               "tosa.pow"),
    DfgOp("MAXIMUM",         None,               "tosa.maximum"),
    DfgOp("MINIMUM",         None,               "tosa.minimum"),
    DfgOp("ABS",             "ABS",              "tosa.abs"),
    DfgOp("NEGATE",          "NEGATE",           "tosa.negate"),
    DfgOp("RECIPROCAL",      "RECIPROCAL",       "tosa.reciprocal"),
    DfgOp("EXP",             "EXP",              "tosa.exp"),
    DfgOp("LOG",             None,               "tosa.log"),
    DfgOp("RSQRT",           None,               "tosa.rsqrt"),
    DfgOp("RELU",            "RELU",             None),
    DfgOp("SIGMOID",         "SIGMOID",          "tosa.sigmoid"),
    DfgOp("TANH",            None,               "tosa.tanh"),
    DfgOp("ERF",             None,               "tosa.erf"),
    DfgOp("CLAMP",           "CLAMP",            "tosa.clamp",               _clamp),
    DfgOp("CAST",            "CAST",             "tosa.cast",                _cast),
    DfgOp("EQUAL",           None,               "tosa.equal"),
    DfgOp("GREATER",         None,               "tosa.greater"),
    DfgOp("GREATER_EQUAL",   None,               "tosa.greater_equal"),
    DfgOp("SELECT",          None,               "tosa.select"),
    DfgOp("REDUCE_SUM",      "REDUCE_SUM",       "tosa.reduce_sum",          _reduce),
    DfgOp("REDUCE_MAX",      "REDUCE_MAX",       "tosa.reduce_max",          _reduce),
    DfgOp("REDUCE_MIN",      "REDUCE_MIN",       "tosa.reduce_min",          _reduce),
    DfgOp("REDUCE_PROD",     "REDUCE_PROD",      "tosa.reduce_prod",         _reduce),
    DfgOp("RESHAPE",         "RESHAPE",          "tosa.reshape",             _as_is, {1: "new_shape"}),
    DfgOp("TRANSPOSE",       "TRANSPOSE",        "tosa.transpose",           _as_is, {1: "perms"}),
    DfgOp("CONCAT",          "CONCAT",           "tosa.concat"),
    DfgOp("SLICE",           None,               "tosa.slice",               _as_is, {1: "start", 2: "size"}),
    DfgOp("PAD",             "PAD",              "tosa.pad",                 _pad, {1: "padding", 2: "pad_value"}),
    DfgOp("GATHER",          "GATHER",           "tosa.gather",              _as_is, {1: "indices"}),
    DfgOp("MATMUL",          "MATMUL",           "tosa.matmul"),
    DfgOp("LINEAR",          "FC",               "tosa.fully_connected"),  # weights [out, in], bias [out]
    DfgOp("LINEAR",          "LINEAR",           None),
    DfgOp("CONV2D",          "CONV2D",           "tosa.conv2d",              _window),
    DfgOp("DEPTHWISE_CONV2D", "DEPTHWISE_CONV2D", "tosa.depthwise_conv2d",   _window),
    DfgOp("MAXPOOL2D",       "MAXPOOL2D",        "tosa.max_pool2d",          _window),
    DfgOp("AVGPOOL2D",       "AVGPOOL2D",        "tosa.avg_pool2d",          _window),
    # not in the registry yet
    DfgOp("CONV3D",          "CONV3D",           "tosa.conv3d"),
    DfgOp("TRANSPOSE_CONV2D", "TRANSPOSE_CONV2D", "tosa.transpose_conv2d"),
    DfgOp("REDUCE_ALL",      "REDUCE_ALL",       "tosa.reduce_all"),
    DfgOp("ATAN",            "ATAN",             None),
]
BY_FIELD = {s.operator_field: s for s in SPELLINGS if s.operator_field}
BY_TOSA_NAME = {s.tosa: s for s in SPELLINGS if s.tosa}

# Nodes that are not computations: graph boundary markers, and UNKNOWN when its name is not a
# TOSA op (legacy imports wrote `func.return` and the result nodes so).
PSEUDO = frozenset({"CONSTANT", "FUNCTION", "FUNCTION_ARGUMENT", "FUNCTION_RETURN", "FUNCTION_RESULT", "UNKNOWN"})
# DomainFlowOperator (domain_flow include/dfa/domain_flow_operator.hpp)
OPERATOR_FIELDS = PSEUDO | frozenset(BY_FIELD)
