"""The `.dfg` and kpu-sim JSON frontends and shape inference, on the real upstream files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import load_graph
from kernel_compiler.frontends.dfg import parse_dfg
from kernel_compiler.frontends.kpusim_json import parse_kpusim_json
from kernel_compiler.shape_inference import infer_shapes

DATA = Path(__file__).parent / "data" / "dfg"
CORPUS = sorted(p for p in DATA.iterdir() if p.suffix in (".dfg", ".json"))
# the legacy oneLayerMLP's LINEAR has one of its three operands connected: refused (see below)
LOADABLE = [p for p in CORPUS if p.name != "workloads__oneLayerMLP.dfg"]


def load(name: str):
    return load_graph(str(DATA / name))


def shapes_and_dtypes(graph, names):
    return [(list(graph.tensors[n].shape), graph.tensors[n].dtype) for n in names]


def assert_one_line_error(exc: pytest.ExceptionInfo, prefix: str) -> str:
    message = str(exc.value)
    assert message.startswith(prefix), message
    assert "\n" not in message
    return message


@pytest.mark.parametrize("path", LOADABLE, ids=lambda p: p.name)
def test_every_corpus_file_loads(path):
    graph, warnings = load_graph(str(path))
    assert graph.ops
    assert all(isinstance(w, str) and "\n" not in w for w in warnings)
    produced = {t for op in graph.ops for t in op.outputs}
    for op in graph.ops:  # topological: every input exists before its consumer
        for name in op.inputs:
            assert name in graph.tensors
            assert name not in produced or graph.producer(name) in graph.ops[: graph.ops.index(op)]
    assert graph.outputs


def test_two_input_matmul_skips_the_orphan_constant():
    graph, warnings = load("workloads__dfa__non-batched-2-input-matmul.dfg")
    [op] = graph.ops
    assert (op.op_type, op.inputs, op.outputs) == ("MATMUL", ["A", "B"], ["Cout"])
    assert shapes_and_dtypes(graph, ["A", "B", "Cout"]) == [([4, 16], "f32"), ([16, 4], "f32"), ([4, 4], "f32")]
    assert [t.name for t in graph.inputs] == ["A", "B"]
    assert all(t.role == "constant" for t in graph.inputs)
    assert [t.name for t in graph.outputs] == ["Cout"]
    assert "Cin" not in graph.tensors
    assert any("'const.Cin' has no edges" in w for w in warnings)
    assert op.source.endswith("non-batched-2-input-matmul.dfg:8 node 3 '2-input MATMUL'")


def test_kpusim_reversed_copy_gives_the_same_graph():
    ours, _ = load("workloads__dfa__non-batched-2-input-matmul.dfg")
    theirs, _ = load("kpu-sim__simple__matmul.dfg")
    assert theirs.tensors == ours.tensors
    strip = [(op.name, op.op_type, op.inputs, op.outputs, op.attrs) for op in ours.ops]
    assert [(op.name, op.op_type, op.inputs, op.outputs, op.attrs) for op in theirs.ops] == strip


def test_three_input_matmul_keeps_slot_order():
    graph, _ = load("workloads__dfa__non-batched-3-input-matmul.dfg")
    [op] = graph.ops
    assert op.inputs == ["A", "B", "Cin"]
    assert graph.tensors["Cout"].shape == (4, 4)


def test_mixed_precision_chain():
    graph, warnings = load("workloads__nla__matmul_8x8_chained.dfg")
    assert [op.op_type for op in graph.ops] == ["MATMUL"] * 4
    assert [graph.tensors[op.outputs[0]].dtype for op in graph.ops] == ["f8", "f16", "f32", "f64"]
    assert [op.inputs for op in graph.ops] == [
        ["A1", "B1"], ["A2", "B2", "C1"], ["A3", "B3", "C2"], ["A4", "B4", "C3"],
    ]
    # the chained accumulator keeps its own dtype: C1 is f8 feeding an f16 matmul
    assert graph.tensors["C1"].dtype == "f8"
    assert [t.name for t in graph.outputs] == ["C4"]
    assert not warnings


def test_matmul_linear_derived_shape_wins_with_a_warning():
    graph, warnings = load("workloads__nla__matmul_linear.dfg")
    matmul, sigmoid = graph.ops
    assert sigmoid.op_type == "SIGMOID" and sigmoid.inputs == matmul.outputs
    assert graph.tensors[sigmoid.outputs[0]].shape == (4, 16)
    assert graph.tensors[sigmoid.outputs[0]].role == "output"
    [warning] = [w for w in warnings if "disagrees" in w]
    assert warning.endswith(
        "matmul_linear.dfg:8 node 3 'sigmoid': declared shape [16] of 'out_1' disagrees with the "
        "derived [4, 16]; using the derived shape"
    )


def test_mobilenet_v1():
    graph, warnings = load("dfg__mobilenet_v1.dfg")
    histogram = Counter(op.op_type for op in graph.ops)
    assert histogram["CONV2D"] == 15 and histogram["DEPTHWISE_CONV2D"] == 13
    assert histogram["CLAMP"] == 27
    [arg] = [t for t in graph.inputs if t.role == "input"]
    assert (arg.name, arg.shape) == ("arg0", (1, 224, 224, 3))
    assert [list(t.shape) for t in graph.outputs] == [[1, 1000]]
    assert any("dfg__mobilenet_v1.dfg:5: dynamic dimension '?' read as 1" in w for w in warnings)
    first_conv = graph.ops[0]
    assert first_conv.attrs == {"dilation": [1, 1], "padding": [[0, 1], [0, 1]], "stride": [2, 2]}
    clamp = graph.ops[1]
    assert clamp.attrs == {"min": 0.0, "max": 6.0}


def test_tosa_result_names_are_made_unique():
    graph, _ = load("tosa__twoLayerMLP_tosa.dfg")
    names = [name for op in graph.ops for name in op.outputs]
    assert len(set(names)) == len(names)
    assert "result_0" in graph.tensors and "result_0_1" in graph.tensors
    assert len({op.name for op in graph.ops}) == len(graph.ops)


def test_legacy_tosa_test1():
    graph, _ = load("tosa__test1.dfg")
    assert [op.op_type for op in graph.ops] == ["ADD", "MATMUL"]
    add, matmul = graph.ops
    assert matmul.inputs[0] == add.outputs[0]
    assert graph.name == "tosa__test1"  # no header: the file stem


def test_legacy_slotless_edges_follow_the_declared_operand_types():
    # mobilenet_v2_tosa lists a conv's edges as input, bias, weights; the modern copy of the
    # same network has the slots.
    def structure(name):
        graph, _ = load(name)
        producer = {t: i for i, op in enumerate(graph.ops) for t in op.outputs}
        return [
            (op.op_type, [(producer.get(t, graph.tensors[t].role), graph.tensors[t].shape) for t in op.inputs])
            for op in graph.ops
            if op.op_type != "ADD"  # commutative, and the legacy file order differs for three of them
        ]

    assert structure("dfg__mobilenet_v2_tosa.dfg") == structure("dfg__mobilenet_v2.dfg")


def test_legacy_one_layer_mlp():
    path = DATA / "workloads__oneLayerMLP.dfg"
    graph, warnings = parse_dfg(str(path), path.read_text())
    linear, relu = graph.ops
    assert (linear.op_type, relu.op_type) == ("LINEAR", "RELU")
    assert graph.tensors["inputImage"].shape == (4, 256, 256, 1)  # type without its final '>'
    assert graph.tensors["inputImage"].dtype == "i8"
    assert graph.tensors[linear.outputs[0]].dtype == "f16"  # `tensor<tensor<16xf16>`
    assert any("declares 3 operands, 1 connected" in w for w in warnings)
    # no edge feeds the weights and bias it declares, so shape inference refuses it
    with pytest.raises(CompileError) as exc:
        load("workloads__oneLayerMLP.dfg")
    assert_one_line_error(exc, str(DATA / "workloads__oneLayerMLP.dfg:5 node 1 'linear': LINEAR takes 2 to 3 operands, got 1"))


def test_conv2d_attributes():
    graph, _ = load("tosa__oneLayerMLP_tosa.dfg")
    conv = next(op for op in graph.ops if op.op_type == "CONV2D")
    assert conv.attrs["stride"] == [1, 1]
    assert conv.attrs["padding"] == [[0, 0], [0, 0]]
    assert conv.attrs["dilation"] == [1, 1]
    assert [graph.tensors[t].shape for t in conv.inputs] == [(1, 1, 1, 4), (2, 1, 1, 4), (2,)]


def test_clamp_scalar_attributes():
    graph, _ = load("tosa__twoLayerMLP_tosa.dfg")
    clamp = next(op for op in graph.ops if op.op_type == "CLAMP")
    assert clamp.attrs == {"max": 3.40282347e38, "min": 0.0}


SMALL = """Domain Flow Graph: small
DIRECTED
NODES 4
NODE 0 : |const.A|CONSTANT|0|||0:A|0:tensor<4x8xbf16>
NODE 1 : |const.B|CONSTANT|0|||0:B|0:tensor<8x2xbf16>
NODE 2 : |mm|MATMUL|1|0:tensor<4x8xbf16>,1:tensor<8x2xbf16>||0:C|0:tensor<4x2xbf16>
NODE 3 : |out|FUNCTION_RETURN|2|0:tensor<4x2xbf16>|||
EDGES 3
EDGE 0 -> 2 : 0|true|tensor<4x8xbf16>|16|0|0|1,1,1
EDGE 1 -> 2 : 0|true|tensor<8x2xbf16>|16|0|1|1,1,1
EDGE 2 -> 3 : 0|false|tensor<4x2xbf16>|16|0|0|1,1,1"""


def parse_small(text: str):
    graph, warnings = parse_dfg("small.dfg", text)
    return infer_shapes(graph, warnings), warnings


def test_bf16_is_not_f16():
    graph, warnings = parse_small(SMALL)
    assert {t.dtype for t in graph.tensors.values()} == {"bf16"}
    assert not warnings


def test_node_count_mismatch_is_a_warning():
    _, warnings = parse_small(SMALL.replace("NODES 4", "NODES 7"))
    assert warnings == ["small.dfg:3: NODES says 7, the file has 4; using the 4"]


def test_input_without_type_takes_the_consumers_operand_type():
    text = SMALL.replace("NODE 0 : |const.A|CONSTANT|0|||0:A|0:tensor<4x8xbf16>", "NODE 0 : |x|FUNCTION_ARGUMENT|0||||")
    graph, _ = parse_small(text)
    x = graph.tensors["x"]
    assert (x.shape, x.dtype, x.role) == ((4, 8), "bf16", "input")


def test_shape_error_names_the_op():
    text = SMALL.replace("0:B|0:tensor<8x2xbf16>", "0:B|0:tensor<9x2xbf16>")
    with pytest.raises(CompileError) as exc:
        parse_small(text)
    assert_one_line_error(exc, "small.dfg:6 node 2 'mm': inner dimensions differ")


@pytest.mark.parametrize(
    ("old", "new", "line", "reason"),
    [
        ("NODE 2 : |mm|MATMUL|1|", "NODE 2 : |mm|MATMUL|", 6, "NODE has 6 '|' fields"),
        ("|mm|MATMUL|", "|mm|MATMULX|", 6, "unknown operator 'MATMULX'"),
        ("EDGE 1 -> 2", "EDGE 1 -> 9", 10, "edge names node 9, which does not exist"),
        ("EDGE 1 -> 2 : 0|true|tensor<8x2xbf16>|16|0|1|1,1,1", "EDGE 1 -> 2 : 0|true", 10, "EDGE has 2 '|' fields"),
        ("0:tensor<4x8xbf16>,1", "0:tensor<4x8xbf17>,1", 6, "unknown element type 'bf17'"),
        ("EDGE 1 -> 2 : 0|true|tensor<8x2xbf16>|16|0|1|", "EDGE 1 -> 2 : 0|true|tensor<8x2xbf16>|16|0|0|", 10,
         "operand 0 of node 2 is already fed by the edge on line 9"),
        ("DIRECTED", "DIRECTED\nFROBNICATE", 3, "unexpected line 'FROBNICATE'"),
    ],
)
def test_malformed_input_gives_one_line_with_file_and_line(old, new, line, reason):
    assert old in SMALL
    with pytest.raises(CompileError) as exc:
        parse_small(SMALL.replace(old, new))
    message = assert_one_line_error(exc, f"small.dfg:{line}: ")
    assert reason in message


def test_kpusim_json():
    graph, warnings = load("kpu-sim__simple__matmul.json")
    [op] = graph.ops
    assert (op.op_type, op.inputs, op.outputs) == ("MATMUL", ["A", "B"], ["C"])
    assert shapes_and_dtypes(graph, ["A", "B", "C"]) == [
        ([1024, 512], "f32"), ([512, 1024], "f32"), ([1024, 1024], "f32"),
    ]
    assert [t.role for t in graph.tensors.values()] == ["input", "input", "output"]
    assert len([w for w in warnings if "kpu_config" in w]) == 1


JSON_GRAPH = """{"tensors": {"X": {"shape": [2, 3], "dtype": "float16"}, "Y": {"shape": [2, 3], "dtype": "float16"}},
 "operators": [{"name": "r", "type": "RELU", "inputs": ["X"], "outputs": ["Y"]}]}"""


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ('"float16"}, "Y"', '"float99"}, "Y"', "g.json: tensors.X.dtype: unknown dtype 'float99'"),
        ('"type": "RELU", ', "", "g.json: operators[0].type: missing"),
        ('"inputs": ["X"]', '"inputs": ["Z"]', 'g.json: operators[0].inputs[0]: no tensor "Z"'),
        ('"shape": [2, 3], "dtype": "float16"}, "Y"', '"shape": [2, -3], "dtype": "float16"}, "Y"',
         "g.json: tensors.X.shape: expected a list of non-negative integers"),
        ("]}]}", "]}]", "g.json:2: invalid JSON"),
    ],
)
def test_kpusim_json_errors(old, new, where):
    assert old in JSON_GRAPH
    with pytest.raises(CompileError) as exc:
        parse_kpusim_json("g.json", JSON_GRAPH.replace(old, new))
    assert_one_line_error(exc, where)


def test_kpusim_json_roles_and_aliases():
    graph, warnings = parse_kpusim_json("g.json", JSON_GRAPH)
    assert (graph.name, graph.ops[0].op_type) == ("g", "RELU")
    assert [(t.name, t.role, t.dtype) for t in graph.tensors.values()] == [("X", "input", "f16"), ("Y", "output", "f16")]
    assert not warnings
    gemm = JSON_GRAPH.replace('"RELU"', '"GEMM"').replace('"inputs": ["X"]', '"inputs": ["X", "X"]')
    assert parse_kpusim_json("g.json", gemm)[0].ops[0].op_type == "MATMUL"


def test_unsupported_extension_and_missing_file(tmp_path):
    with pytest.raises(CompileError) as exc:
        load_graph(str(tmp_path / "model.pb"))
    assert str(exc.value) == f"{tmp_path / 'model.pb'}: unsupported input type '.pb' (expected .dfg, .hlo, .hlo.txt, .json, .onnx)"
    with pytest.raises(CompileError) as exc:
        load_graph(str(tmp_path / "missing.dfg"))
    assert str(exc.value) == f"{tmp_path / 'missing.dfg'}: cannot read: No such file or directory"
