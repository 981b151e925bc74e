"""The frontends' operator spellings: every `.dfg` and kpu-sim JSON spelling reaches its registry
op with the registry's attribute names, the real corpus maps and infers whole, and bad
operators or attributes give one line naming the node."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from dfx import REGISTRY
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import kpusim_json, load_graph
from kernel_compiler.frontends.dfg import parse_dfg
from kernel_compiler.frontends.dfg_ops import BY_FIELD, BY_TOSA_NAME, OPERATOR_FIELDS, SPELLINGS
from kernel_compiler.frontends.kpusim_json import parse_kpusim_json
from kernel_compiler.shape_inference import infer_shapes

DATA = Path(__file__).parent / "data" / "dfg"

# Ops the frontends parse that the registry does not declare yet: they keep their name, shape
# inference passes them by and the compiler says they have no lowering.
NOT_YET_IN_REGISTRY = {"CONV3D", "TRANSPOSE_CONV2D", "REDUCE_ALL", "ATAN", "BATCHNORM", "SPLIT", "ATTENTION"}


# ---- the tables ------------------------------------------------------------------------------


def test_every_spelling_names_a_registry_op():
    targets = {s.op for s in SPELLINGS} | set(kpusim_json.SPELLINGS.values())
    assert targets - set(REGISTRY) <= NOT_YET_IN_REGISTRY
    assert not NOT_YET_IN_REGISTRY & set(REGISTRY), "an op the registry gained must leave NOT_YET_IN_REGISTRY"


def test_dfg_spellings_are_unique_and_the_operator_field_is_upstreams_enum():
    assert len(BY_FIELD) == sum(1 for s in SPELLINGS if s.operator_field)
    assert len(BY_TOSA_NAME) == sum(1 for s in SPELLINGS if s.tosa)
    # DomainFlowOperator (domain_flow include/dfa/domain_flow_operator.hpp)
    assert OPERATOR_FIELDS == set(
        "FUNCTION FUNCTION_ARGUMENT FUNCTION_RETURN FUNCTION_RESULT ABS ADD CAST CLAMP CONCAT CONSTANT CONV2D "
        "CONV3D DEPTHWISE_CONV2D EXP FC GATHER SUB MUL DIV LINEAR MATMUL NEGATE PAD MAXPOOL2D AVGPOOL2D "
        "RECIPROCAL REDUCE_ALL REDUCE_MAX REDUCE_MIN REDUCE_SUM REDUCE_PROD RELU ATAN SIGMOID RESHAPE "
        "TRANSPOSE TRANSPOSE_CONV2D UNKNOWN".split()
    )


def test_kpusim_spellings_cover_its_operator_types():
    # kpu-sim's OperatorType (include/sw/compiler/graph_loader.hpp), UNKNOWN aside
    kpusim = ("GEMM CONV2D CONV2D_DEPTHWISE CONV3D MATMUL LINEAR ELEMENTWISE_ADD ELEMENTWISE_MUL ELEMENTWISE_SUB "
              "ELEMENTWISE_DIV RELU GELU SIGMOID SOFTMAX LAYERNORM BATCHNORM MAXPOOL AVGPOOL RESHAPE TRANSPOSE "
              "CONCAT SPLIT PAD GATHER CAST CLAMP ABS NEGATE EXP RECIPROCAL REDUCE_SUM REDUCE_MAX REDUCE_MIN "
              "REDUCE_PROD ATTENTION").split()
    assert set(kpusim) <= set(kpusim_json.SPELLINGS)


def test_kpusim_spellings_add_only_aliases_to_the_registry_names():
    assert kpusim_json.SPELLINGS == {**{name: name for name in REGISTRY}, **kpusim_json.ALIASES}
    assert not [s for s, op in kpusim_json.ALIASES.items() if s == op and s in REGISTRY]


# ---- the corpus ------------------------------------------------------------------------------

CONVS = {"CONV2D": 15, "DEPTHWISE_CONV2D": 13}
SOFTMAX = {"REDUCE_MAX": 1, "SUB": 1, "EXP": 1, "RECIPROCAL": 1}  # with one REDUCE_SUM and one MUL
V2 = {"CONV2D": 35, "DEPTHWISE_CONV2D": 17, "CLAMP": 35, "ADD": 10, "REDUCE_SUM": 3, "MUL": 2, "RESHAPE": 1,
      "LINEAR": 1, **SOFTMAX}
MLP = {"RESHAPE": 2, "CONV2D": 1}
SKETCH = {"MATMUL": 1, "SIGMOID": 1}
CHAIN = {"MATMUL": 4}
EXPECTED_OPS = {
    "dfg__mobilenet_v1.dfg": {**CONVS, "CLAMP": 27, "REDUCE_SUM": 3, "MUL": 2, "RESHAPE": 1, **SOFTMAX},
    "dfg__mobilenet_v2.dfg": V2,
    "dfg__mobilenet_v2_tosa.dfg": V2,
    "kpu-sim__simple__matmul.dfg": {"MATMUL": 1},
    "tosa__oneLayerMLP.dfg": MLP,
    "tosa__oneLayerMLP_tosa.dfg": MLP,
    "tosa__test1.dfg": {"ADD": 1, "MATMUL": 1},
    "tosa__twoLayerMLP_tosa.dfg": {"RESHAPE": 4, "CONV2D": 2, "CLAMP": 1},
    "workloads__ctl__kalman_filter.dfg": SKETCH,
    "workloads__dfa__domain_flow.dfg": SKETCH,
    "workloads__dfa__non-batched-2-input-matmul.dfg": {"MATMUL": 1},
    "workloads__dfa__non-batched-3-input-matmul.dfg": {"MATMUL": 1},
    "workloads__dnn__oneLayerMLP.dfg": SKETCH,
    "workloads__dsp__spectral.dfg": SKETCH,
    "workloads__nla__AtimesBtimesC_skinny.dfg": {"MATMUL": 2},
    "workloads__nla__AtimesBtimesC_square.dfg": {"MATMUL": 2},
    "workloads__nla__matmul_16x16_chained.dfg": CHAIN,
    "workloads__nla__matmul_256x256_chained.dfg": CHAIN,
    "workloads__nla__matmul_8x4_expand_contract.dfg": CHAIN,
    "workloads__nla__matmul_8x8_chained.dfg": CHAIN,
    "workloads__nla__matmul_linear.dfg": SKETCH,
}
# its LINEAR connects one of the three operands it declares (test_frontend_dfg checks the refusal)
REFUSED = {"workloads__oneLayerMLP.dfg"}


def test_the_expected_files_are_the_corpus():
    assert set(EXPECTED_OPS) | REFUSED == {p.name for p in DATA.glob("*.dfg")}


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_corpus_ops_map_to_the_registry(name):
    graph, _ = load_graph(str(DATA / name))
    assert Counter(op.op_type for op in graph.ops) == EXPECTED_OPS[name]
    for op in graph.ops:
        if op.op_type in REGISTRY:
            assert REGISTRY[op.op_type].normalize_attrs(op.attrs) is not None


@pytest.mark.parametrize("name", ["dfg__mobilenet_v1.dfg", "dfg__mobilenet_v2.dfg", "dfg__mobilenet_v2_tosa.dfg",
                                  "tosa__twoLayerMLP_tosa.dfg"])
def test_tosa_imports_infer_the_shapes_they_declare(name):
    # with `?` read as 1, every derived shape is the one the TOSA importer wrote
    _, warnings = load_graph(str(DATA / name))
    assert not [w for w in warnings if "disagrees" in w]


def test_mobilenet_v1_head():
    graph, _ = load_graph(str(DATA / "dfg__mobilenet_v1.dfg"))
    shape = {name: list(t.shape) for name, t in graph.tensors.items()}
    pool_h, pool_w, scale, classifier = graph.ops[-11:-7]  # global average pool, then a 1x1 conv
    assert [(op.op_type, op.attrs) for op in (pool_h, pool_w)] == [
        ("REDUCE_SUM", {"axes": [1], "keepdims": True}), ("REDUCE_SUM", {"axes": [2], "keepdims": True})]
    assert [shape[pool_h.outputs[0]], shape[pool_w.outputs[0]], shape[scale.outputs[0]]] == [
        [1, 1, 7, 1024], [1, 1, 1, 1024], [1, 1, 1, 1024]]
    assert (scale.op_type, classifier.op_type) == ("MUL", "CONV2D")
    reshape = graph.ops[-7]
    assert (reshape.op_type, reshape.attrs, shape[reshape.outputs[0]]) == ("RESHAPE", {"new_shape": [-1, 1000]}, [1, 1000])
    softmax = graph.ops[-6:]
    assert [op.op_type for op in softmax] == ["REDUCE_MAX", "SUB", "EXP", "REDUCE_SUM", "RECIPROCAL", "MUL"]
    assert [shape[op.outputs[0]] for op in softmax] == [[1, 1], [1, 1000], [1, 1000], [1, 1], [1, 1], [1, 1000]]
    assert softmax[0].attrs == softmax[3].attrs == {"axes": [1], "keepdims": True}


def test_mobilenet_v2_fully_connected_is_linear():
    graph, _ = load_graph(str(DATA / "dfg__mobilenet_v2.dfg"))
    [fc] = [op for op in graph.ops if op.op_type == "LINEAR"]
    assert [graph.tensors[t].shape for t in (*fc.inputs, *fc.outputs)] == [(1, 1280), (1000, 1280), (1000,), (1, 1000)]


def test_kpusim_json_corpus_drops_the_plain_gemm_attributes():
    graph, _ = load_graph(str(DATA / "kpu-sim__simple__matmul.json"))
    assert [(op.op_type, op.attrs) for op in graph.ops] == [("MATMUL", {})]


# ---- one op per `.dfg` spelling --------------------------------------------------------------

HEADER = 2  # the lines before the first NODE


def one_op(name: str, field: str, operands: list[str], attrs: str, result: str) -> tuple[str, int]:
    """A `.dfg` whose node `name`|`field` is fed by arguments of the `operands` types (without
    `tensor<>`) and returned; the text and the line of that node."""
    n = len(operands)
    types = ",".join(f"{i}:tensor<{t}>" for i, t in enumerate(operands))
    lines = [
        "Domain Flow Graph: t",
        "DIRECTED",
        *(f"NODE {i} : |x{i}|FUNCTION_ARGUMENT|0|||0:x{i}|0:tensor<{t}>" for i, t in enumerate(operands)),
        f"NODE {n} : |{name}|{field}|1|{types}|{attrs}|0:y|0:tensor<{result}>",
        f"NODE {n + 1} : |out|FUNCTION_RETURN|2||||",
        *(f"EDGE {i} -> {n} : 0|true|tensor<{t}>|32|0|{i}|1,1,1" for i, t in enumerate(operands)),
        f"EDGE {n} -> {n + 1} : 0|false|1xi32|32|0|0|1,1,1",
    ]
    return "\n".join(lines), HEADER + n + 1


def load_text(text: str):
    graph, warnings = parse_dfg("t.dfg", text)
    return infer_shapes(graph, warnings), warnings


CLAMP_ATTRS = "max_fp:6.000000e+00 : f32,max_int:6 : i64,min_fp:0.000000e+00 : f32,min_int:0 : i64"
F23, F13 = "2x3xf32", "1x3xf32"
SPELLED = [
    # node name            operator field  operand types       attributes                      result
    #   -> registry op and its attributes
    ("tosa.add",           "ADD",        [F23, F13],          "",                              F23, "ADD", {}),
    ("tosa.sub",           "SUB",        [F23, "2x1xf32"],    "",                              F23, "SUB", {}),
    ("tosa.mul",           "MUL",        [F23, F13],          "shift:0 : i8",                  F23, "MUL", {}),
    ("tosa.int_div",       "UNKNOWN",    ["4xi32", "4xi32"],  "",                              "4xi32", "DIV", {}),
    ("tosa.pow",           "UNKNOWN",    [F23, F23],          "",                              F23, "POW", {}),
    ("tosa.maximum",       "UNKNOWN",    [F23, F13],          "",                              F23, "MAXIMUM", {}),
    ("tosa.minimum",       "UNKNOWN",    [F23, F13],          "",                              F23, "MINIMUM", {}),
    ("tosa.abs",           "ABS",        [F23],               "",                              F23, "ABS", {}),
    ("tosa.negate",        "NEGATE",     [F23],               "",                              F23, "NEGATE", {}),
    ("tosa.reciprocal",    "RECIPROCAL", [F23],               "",                              F23, "RECIPROCAL", {}),
    ("tosa.exp",           "EXP",        [F23],               "",                              F23, "EXP", {}),
    ("tosa.log",           "UNKNOWN",    [F23],               "",                              F23, "LOG", {}),
    ("tosa.rsqrt",         "UNKNOWN",    [F23],               "",                              F23, "RSQRT", {}),
    ("tosa.sigmoid",       "UNKNOWN",    [F23],               "",                              F23, "SIGMOID", {}),
    ("tosa.sigmoid",       "SIGMOID",    [F23],               "",                              F23, "SIGMOID", {}),
    ("tosa.tanh",          "UNKNOWN",    [F23],               "",                              F23, "TANH", {}),
    ("tosa.erf",           "UNKNOWN",    [F23],               "",                              F23, "ERF", {}),
    ("tosa.clamp",         "CLAMP",      [F23],               CLAMP_ATTRS,                     F23, "CLAMP", {"min": 0.0, "max": 6.0}),
    ("tosa.clamp",         "CLAMP",      ["2x3xi8"],          CLAMP_ATTRS,                     "2x3xi8", "CLAMP", {"min": 0, "max": 6}),
    ("tosa.cast",          "CAST",       [F23],               "",                              "2x3xi8", "CAST", {"dtype": "i8"}),
    ("tosa.equal",         "UNKNOWN",    [F23, F13],          "",                              "2x3xi1", "EQUAL", {}),
    ("tosa.greater",       "UNKNOWN",    [F23, F13],          "",                              "2x3xi1", "GREATER", {}),
    ("tosa.greater_equal", "UNKNOWN",    [F23, F13],          "",                              "2x3xi1", "GREATER_EQUAL", {}),
    ("tosa.select",        "UNKNOWN",    ["2x3xi1", F23, F13], "",                             F23, "SELECT", {}),
    ("tosa.reduce_sum",    "REDUCE_SUM", ["2x3x4xf32"],       "axis:1 : i32",                  "2x1x4xf32", "REDUCE_SUM",
     {"axes": [1], "keepdims": True}),
    ("tosa.reduce_max",    "REDUCE_MAX", ["2x3x4xf32"],       "axis:2 : i64",                  "2x3x1xf32", "REDUCE_MAX",
     {"axes": [2], "keepdims": True}),
    ("tosa.reduce_min",    "REDUCE_MIN", ["2x3x4xf32"],       "axis:0 : i32",                  "1x3x4xf32", "REDUCE_MIN",
     {"axes": [0], "keepdims": True}),
    ("tosa.reduce_prod",   "REDUCE_PROD", ["2x3x4xi32"],      "axis:-1 : i32",                 "2x3x1xi32", "REDUCE_PROD",
     {"axes": [-1], "keepdims": True}),
    ("tosa.reshape",       "RESHAPE",    ["4x3xf32"],         "new_shape:array<i64: -1, 6>",   "2x6xf32", "RESHAPE",
     {"new_shape": [-1, 6]}),
    ("tosa.transpose",     "TRANSPOSE",  ["2x3x4xf32"],       "perms:array<i32: 2, 0, 1>",     "4x2x3xf32", "TRANSPOSE",
     {"perms": [2, 0, 1]}),
    ("tosa.concat",        "CONCAT",     [F23, "2x5xf32", F23], "axis:1 : i32",                "2x11xf32", "CONCAT",
     {"axis": 1}),
    ("tosa.slice",         "UNKNOWN",    ["4x6xf32"],         "size:array<i64: 2, -1>,start:array<i64: 1, 2>", "2x4xf32",
     "SLICE", {"start": [1, 2], "size": [2, -1]}),
    ("tosa.pad",           "PAD",        [F23],               "pad_const:1.5 : f32,padding:array<i64: 0, 1, 2, 0>",
     "3x5xf32", "PAD", {"padding": [[0, 1], [2, 0]], "pad_value": 1.5}),
    ("gather",             "GATHER",     ["4x3xf32"],         "axis:0 : i64,indices:array<i64: 3, 0>", F23, "GATHER",
     {"axis": 0, "indices": [3, 0]}),
    ("tosa.matmul",        "MATMUL",     ["1x2x4xf32", "1x4x3xf32"], "",                       "1x2x3xf32", "MATMUL", {}),
    ("tosa.conv2d",        "CONV2D",     ["1x5x5x2xf32", "3x3x3x2xf32", "3xf32"],
     "dilation:array<i64: 1, 1>,pad:array<i64: 0, 1, 1, 0>,stride:array<i64: 2, 2>", "1x2x2x3xf32", "CONV2D",
     {"dilation": [1, 1], "padding": [[0, 1], [1, 0]], "stride": [2, 2]}),
    ("tosa.depthwise_conv2d", "DEPTHWISE_CONV2D", ["1x4x4x2xf32", "3x3x2x1xf32", "2xf32"],
     "dilation:array<i64: 1, 1>,pad:array<i64: 1, 1, 1, 1>,stride:array<i64: 1, 1>", "1x4x4x2xf32",
     "DEPTHWISE_CONV2D", {"dilation": [1, 1], "padding": [[1, 1], [1, 1]], "stride": [1, 1]}),
    ("tosa.max_pool2d",    "MAXPOOL2D",  ["1x4x4x2xf32"],
     "kernel:array<i64: 2, 2>,pad:array<i64: 0, 0, 0, 0>,stride:array<i64: 2, 2>", "1x2x2x2xf32", "MAXPOOL2D",
     {"kernel": [2, 2], "padding": [[0, 0], [0, 0]], "stride": [2, 2]}),
    ("tosa.avg_pool2d",    "AVGPOOL2D",  ["1x4x4x2xf32"],
     "acc_type:f32,kernel:array<i64: 3, 3>,pad:array<i64: 1, 1, 1, 1>,stride:array<i64: 1, 1>", "1x4x4x2xf32",
     "AVGPOOL2D", {"kernel": [3, 3], "padding": [[1, 1], [1, 1]], "stride": [1, 1]}),
    ("tosa.fully_connected", "FC",       ["2x4xf32", "3x4xf32", "3xf32"], "",                  F23, "LINEAR", {}),
    # the operator field alone, as the non-TOSA files spell ops
    ("linear",             "LINEAR",     ["2x4xf32", "3x4xf32"], "",                           F23, "LINEAR", {}),
    ("fc",                 "FC",         ["2x4xf32", "3x4xf32"], "",                           F23, "LINEAR", {}),
    ("relu",               "RELU",       ["2x3xf16"],         "",                              "2x3xf16", "RELU", {}),
    ("sigmoid",            "SIGMOID",    [F23],               "",                              F23, "SIGMOID", {}),
    ("2-input MATMUL",     "MATMUL",     ["2x4xf32", "4x3xf32"], "",                           F23, "MATMUL", {}),
    ("add",                "ADD",        [F23, F23],          "",                              F23, "ADD", {}),
    ("sub",                "SUB",        [F23, F23],          "",                              F23, "SUB", {}),
    ("mul",                "MUL",        [F23, F23],          "",                              F23, "MUL", {}),
    ("div",                "DIV",        [F23, F23],          "",                              F23, "DIV", {}),
    ("abs",                "ABS",        [F23],               "",                              F23, "ABS", {}),
    ("negate",             "NEGATE",     [F23],               "",                              F23, "NEGATE", {}),
    ("reciprocal",         "RECIPROCAL", [F23],               "",                              F23, "RECIPROCAL", {}),
    ("exp",                "EXP",        [F23],               "",                              F23, "EXP", {}),
    ("relu6",              "CLAMP",      [F23],               "min_fp:0.0 : f32,max_fp:6.0 : f32", F23, "CLAMP",
     {"min": 0.0, "max": 6.0}),
    ("to_f16",             "CAST",       [F23],               "",                              "2x3xf16", "CAST", {"dtype": "f16"}),
    ("sum",                "REDUCE_SUM", [F23],               "axes:array<i64: 0, 1>,keepdims:false", "f32", "REDUCE_SUM",
     {"axes": [0, 1], "keepdims": False}),
    ("max",                "REDUCE_MAX", [F23],               "axis:0 : i32",                  F13, "REDUCE_MAX",
     {"axes": [0], "keepdims": True}),
    ("min",                "REDUCE_MIN", [F23],               "axis:0 : i32",                  F13, "REDUCE_MIN",
     {"axes": [0], "keepdims": True}),
    ("prod",               "REDUCE_PROD", [F23],              "axis:0 : i32",                  F13, "REDUCE_PROD",
     {"axes": [0], "keepdims": True}),
    ("reshape",            "RESHAPE",    [F23],               "new_shape:array<i64: 6>",       "6xf32", "RESHAPE",
     {"new_shape": [6]}),
    ("transpose",          "TRANSPOSE",  [F23],               "",                              "3x2xf32", "TRANSPOSE", {}),
    ("concat",             "CONCAT",     [F23, F13],          "axis:0 : i32",                  "3x3xf32", "CONCAT", {"axis": 0}),
    ("pad",                "PAD",        [F23],               "padding:array<i64: 1, 1, 0, 0>", "4x3xf32", "PAD",
     {"padding": [[1, 1], [0, 0]]}),
]


@pytest.mark.parametrize(("name", "field", "operands", "attrs", "result", "op_type", "expected"), SPELLED,
                         ids=[f"{c[0]}|{c[1]}" for c in SPELLED])
def test_spelling(name, field, operands, attrs, result, op_type, expected):
    text, _ = one_op(name, field, operands, attrs, result)
    graph, warnings = load_text(text)
    [op] = graph.ops
    assert (op.op_type, op.attrs) == (op_type, expected)
    assert op.inputs == [f"x{i}" for i in range(len(operands))] and op.outputs == ["y"]
    assert not warnings  # the declared result is the derived one


def test_every_spelling_has_a_case():
    names = {case[0] for case in SPELLED + REFUSED_CASES}
    fields = {case[1] for case in SPELLED + REFUSED_CASES}
    registered = [s for s in SPELLINGS if s.op in REGISTRY]
    assert {s.tosa for s in registered if s.tosa} <= names
    assert {s.operator_field for s in registered if s.operator_field} <= fields


def test_comparisons_hold_their_bool_in_a_byte():
    text, _ = one_op("tosa.greater", "UNKNOWN", [F23, F13], "", "2x3xi1")
    graph, _ = load_text(text)
    assert graph.tensors["y"].dtype == "u8"


def test_legacy_line_with_a_tosa_name():
    # legacy TOSA import (tosa/test1.dfg): no leading `|`, no attribute field, slot-less edges
    text = "\n".join([
        "NODE 0 : arg0|FUNCTION_ARGUMENT|0|||",
        "NODE 1 : tosa.tanh|UNKNOWN|1|tensor<2x3xf32>|result_0|tensor<2x3xf32>",
        "NODE 2 : func.return|UNKNOWN|2|tensor<2x3xf32>||",
        "EDGE 0 -> 1 : 1|true|1xi32|32|0,0,0",
        "EDGE 1 -> 2 : 1|true|1xi32|32|0,0,0",
    ])
    graph, _ = load_text(text)
    [op] = graph.ops
    assert (op.op_type, op.inputs, op.outputs) == ("TANH", ["arg0"], ["result_0"])
    assert graph.tensors["arg0"].shape == (2, 3)
    assert graph.tensors["result_0"].role == "output"  # func.return stays a boundary marker


def test_an_untracked_tosa_op_is_a_computation_without_a_registry_entry():
    # upstream writes TOSA ops it does not track as UNKNOWN; the name still says what they are
    text, _ = one_op("tosa.floor", "UNKNOWN", [F23], "", F23)
    graph, _ = load_text(text)
    [op] = graph.ops
    assert (op.op_type, op.inputs, op.outputs) == ("tosa.floor", ["x0"], ["y"])


# ---- refused ---------------------------------------------------------------------------------

REFUSED_CASES = [
    # node name, operator field, operand types, attributes, result -> the reason
    ("tosa.add", "ADD", [F23], "", F23, "ADD takes 2 operands, got 1"),
    ("tosa.exp", "EXP", [F23, F23], "", F23, "EXP takes 1 operand, got 2"),
    ("tosa.concat", "CONCAT", [], "axis:0 : i32", F23, "CONCAT takes 1 or more operands, got 0"),
    ("tosa.add", "ADD", [F23, "4x3xf32"], "", F23, "shapes [2, 3] and [4, 3] do not broadcast"),
    ("tosa.select", "UNKNOWN", ["2x3xi1", F23, "2x2xf32"], "", F23, "do not broadcast"),
    ("tosa.reduce_sum", "REDUCE_SUM", [F23], "axis:2 : i32", F23, "axis 2 is out of range for rank 2"),
    ("tosa.concat", "CONCAT", [F23, F23], "axis:-3 : i32", F23, "axis -3 is out of range for rank 2"),
    ("tosa.reshape", "RESHAPE", ["4x3xf32"], "new_shape:array<i64: 5, 2>", "5x2xf32",
     "cannot reshape [4, 3] (12 elements) to [5, 2] (10 elements)"),
    ("tosa.reshape", "RESHAPE", ["4x3xf32"], "new_shape:array<i64: -1, 5>", "5x2xf32",
     "cannot reshape [4, 3] (12 elements) to [-1, 5]: no size fits the -1"),
    ("tosa.reshape", "RESHAPE", ["4x3xf32"], "", "12xf32", "attribute 'new_shape' is required by RESHAPE"),
    ("tosa.mul", "MUL", [F23, F23], "shift:3 : i8", F23, "shift 3 makes MUL integer fixed-point arithmetic"),
    ("tosa.exp", "EXP", [F23], "foo:1 : i32", F23, "attribute 'foo' is unknown (EXP takes no attributes)"),
    ("tosa.clamp", "CLAMP", [F23], "min_fp:low", F23, "attribute 'min' must be a number, got 'low'"),
    ("tosa.transpose", "TRANSPOSE", [F23], "perms:array<i32: 0, 0>", F23, "attribute 'perms' must be a permutation"),
    ("tosa.fully_connected", "FC", ["2x4xf32", "3x5xf32"], "", F23, "input features differ"),
    ("tosa.pad", "PAD", [F23], "padding:array<i64: 0, 1, 2>", F23,
     "attribute 'padding' must be a list of [before, after] pairs"),
    # operands that some TOSA versions use for attribute values a .dfg cannot carry
    ("tosa.transpose", "TRANSPOSE", [F23, "2xi32"], "", "3x2xf32",
     "operand 1 carries the perms as a tensor, whose values a .dfg does not hold; TRANSPOSE needs the perms as an attribute"),
    ("tosa.gather", "GATHER", ["1x4x3xf32", "1x2xi32"], "", "1x2x3xf32", "operand 1 carries the indices as a tensor"),
    ("tosa.pad", "PAD", [F23, "2x2xi32"], "", "3x5xf32", "operand 1 carries the padding as a tensor"),
    ("tosa.reshape", "RESHAPE", ["4x3xf32", "2xi32"], "", "2x6xf32", "operand 1 carries the new_shape as a tensor"),
    ("tosa.slice", "UNKNOWN", ["4x6xf32", "2xi32", "2xi32"], "", "2x4xf32", "operand 1 carries the start as a tensor"),
    ("tosa.mul", "MUL", [F23, F23, "1xi8"], "", F23, "operand 2 carries the shift as a tensor"),
]


@pytest.mark.parametrize(("name", "field", "operands", "attrs", "result", "reason"), REFUSED_CASES,
                         ids=[case[-1][:40] for case in REFUSED_CASES])
def test_bad_op_is_one_line_naming_the_node(name, field, operands, attrs, result, reason):
    text, line = one_op(name, field, operands, attrs, result)
    with pytest.raises(CompileError) as exc:
        load_text(text)
    message = str(exc.value)
    assert message.startswith(f"t.dfg:{line} node {len(operands)} '{name}': ") and "\n" not in message, message
    assert reason in message


def test_tosa_name_and_operator_field_must_agree():
    text, line = one_op("tosa.add", "SUB", [F23, F23], "", F23)
    with pytest.raises(CompileError) as exc:
        load_text(text)
    assert str(exc.value) == f"t.dfg:{line}: node 2 'tosa.add' is ADD by its TOSA name but SUB by its operator field"


# ---- kpu-sim JSON ----------------------------------------------------------------------------


def json_graph(op_type: str, inputs: list[list[int]], output: list[int], attrs: dict | None = None) -> str:
    tensors = {f"x{i}": {"shape": s, "dtype": "float32"} for i, s in enumerate(inputs)}
    tensors["y"] = {"shape": output, "dtype": "float32"}
    op = {"name": "op", "type": op_type, "inputs": list(tensors)[:-1], "outputs": ["y"]}
    if attrs is not None:
        op["attributes"] = attrs
    return json.dumps({"tensors": tensors, "operators": [op]})


@pytest.mark.parametrize(
    ("op_type", "inputs", "output", "attrs", "registry_op"),
    [
        ("ELEMENTWISE_ADD", [[2, 3], [1, 3]], [2, 3], None, "ADD"),
        ("ELEMENTWISE_SUB", [[2, 3], [2, 3]], [2, 3], None, "SUB"),
        ("ELEMENTWISE_MUL", [[2, 3], [2, 3]], [2, 3], None, "MUL"),
        ("ELEMENTWISE_DIV", [[2, 3], [2, 3]], [2, 3], None, "DIV"),
        ("GEMM", [[2, 4], [4, 3]], [2, 3], {"transpose_a": False, "alpha": 1.0}, "MATMUL"),
        ("FC", [[2, 4], [3, 4], [3]], [2, 3], None, "LINEAR"),
        ("LINEAR", [[2, 4], [3, 4]], [2, 3], None, "LINEAR"),
        ("GELU", [[2, 3]], [2, 3], {"approximate": "tanh"}, "GELU"),
        ("SOFTMAX", [[2, 3]], [2, 3], {"axis": 0}, "SOFTMAX"),
        ("LAYERNORM", [[2, 3], [3], [3]], [2, 3], {"axis": -1, "epsilon": 1e-6}, "LAYERNORM"),
        ("CLAMP", [[2, 3]], [2, 3], {"min": 0, "max": 6}, "CLAMP"),
        ("REDUCE_SUM", [[2, 3]], [2], {"axes": [1], "keepdims": False}, "REDUCE_SUM"),
        ("REDUCE_MEAN", [[2, 3]], [1, 1], {"axes": None}, "REDUCE_MEAN"),
        ("RESHAPE", [[2, 3]], [3, 2], {"new_shape": [3, -1]}, "RESHAPE"),
        ("TRANSPOSE", [[2, 3]], [3, 2], {"perms": [1, 0]}, "TRANSPOSE"),
        ("CONCAT", [[2, 3], [2, 1]], [2, 4], {"axis": 1}, "CONCAT"),
        ("PAD", [[2, 3]], [2, 5], {"padding": [[0, 0], [1, 1]], "pad_value": -1}, "PAD"),
        ("GATHER", [[2, 3]], [2, 2], {"indices": [2, 0], "axis": 1}, "GATHER"),
        ("TANH", [[2, 3]], [2, 3], None, "TANH"),  # a registry name kpu-sim does not have
        ("CONV2D_DEPTHWISE", [[1, 4, 4, 2], [3, 3, 2, 1]], [1, 2, 2, 2], {"stride": [1, 1]}, "DEPTHWISE_CONV2D"),
        ("MAXPOOL", [[1, 4, 4, 2]], [1, 2, 2, 2], {"kernel": [2, 2], "stride": [2, 2]}, "MAXPOOL2D"),
    ],
)
def test_kpusim_json_spelling(op_type, inputs, output, attrs, registry_op):
    graph, warnings = parse_kpusim_json("g.json", json_graph(op_type, inputs, output, attrs))
    graph = infer_shapes(graph, warnings)
    [op] = graph.ops
    assert op.op_type == registry_op
    assert not warnings  # the declared output is the derived one
    if op_type == "GEMM":
        assert op.attrs == {}


@pytest.mark.parametrize(
    ("op_type", "inputs", "output", "attrs", "reason"),
    [
        ("RELU", [[2, 3]], [2, 3], {"alpha": 0.1}, "attribute 'alpha' is unknown (RELU takes no attributes)"),
        ("ADD", [[2, 3]], [2, 3], None, "ADD takes 2 operands, got 1"),
        ("ADD", [[2, 3], [3, 2]], [2, 3], None, "shapes [2, 3] and [3, 2] do not broadcast"),
        ("REDUCE_MAX", [[2, 3]], [2, 1], {"axes": [2]}, "axis 2 is out of range for rank 2"),
        ("RESHAPE", [[2, 3]], [4], {"new_shape": [4]}, "cannot reshape [2, 3] (6 elements) to [4] (4 elements)"),
        ("CAST", [[2, 3]], [2, 3], {"dtype": "f12"}, "attribute 'dtype' must be"),
    ],
)
def test_kpusim_json_bad_op_is_one_line_naming_the_operator(op_type, inputs, output, attrs, reason):
    graph, warnings = parse_kpusim_json("g.json", json_graph(op_type, inputs, output, attrs))
    with pytest.raises(CompileError) as exc:
        infer_shapes(graph, warnings)
    message = str(exc.value)
    assert message.startswith('g.json: operators[0] "op": ') and "\n" not in message, message
    assert reason in message


@pytest.mark.parametrize("op_type", ["GEMM", "MATMUL"])
def test_kpusim_json_matmul_with_transpose_b(op_type):
    # kpu-sim writes its whole GEMM set on both; transpose_b is the registry MATMUL's own
    attrs = {"transpose_a": False, "transpose_b": True, "alpha": 1.0, "beta": 0.0}
    graph, warnings = parse_kpusim_json("g.json", json_graph(op_type, [[2, 4], [3, 4]], [2, 3], attrs))
    graph = infer_shapes(graph, warnings)
    [op] = graph.ops
    assert (op.op_type, op.attrs) == ("MATMUL", {"transpose_b": True}) and not warnings


@pytest.mark.parametrize(("op_type", "attrs", "place", "reason"), [
    ("GEMM", {"transpose_a": True}, "transpose_a", "true is not supported"),
    ("MATMUL", {"alpha": 2.0}, "alpha", "2.0 is not supported"),
    ("GEMM", {"beta": 1}, "beta", "1 is not supported"),
    ("GEMM", {"alpha": True}, "alpha", "true is not supported"),  # not the number 1
])
def test_kpusim_json_gemm_attributes_matmul_cannot_express(op_type, attrs, place, reason):
    with pytest.raises(CompileError) as exc:
        parse_kpusim_json("g.json", json_graph(op_type, [[2, 4], [4, 3]], [2, 3], attrs))
    message = str(exc.value)
    assert message.startswith(f"g.json: operators[0].attributes.{place}: {reason}") and "\n" not in message, message


def test_kpusim_json_transpose_b_compiles_runs_and_checks(tmp_path):
    from conftest import CONFIGS, run_cli

    src, obj = tmp_path / "g.json", tmp_path / "g.kpu"
    src.write_text(json_graph("GEMM", [[96, 200], [72, 200]], [96, 72], {"transpose_b": True, "alpha": 1.0}))
    compiled = run_cli("compiler", src, "-o", obj)
    assert compiled.returncode == 0, compiled.stderr
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check")
    assert proc.returncode == 0, proc.stderr
