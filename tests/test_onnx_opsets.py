"""Models of opsets 7 to 10: upgraded in memory to opset 11 with one warning, compiled and run
against onnxruntime on the original model; a model the converter cannot upgrade is refused naming
the node that stops it. Op types the frontend does not map are refused all at once, in one line."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import assert_one_line_error, run_cli
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.passes import canonicalise
from kernel_compiler.shape_inference import infer_shapes
from test_frontend_onnx import assert_matches_onnxruntime, model, rand, refusal


def upgraded(opset: int, name: str = "test.onnx") -> str:
    return (f"{name}: opset {opset} upgraded to opset 11 in memory (the ONNX frontend reads opsets 11 and newer "
            "natively)")


@pytest.mark.parametrize("opset", [7, 9, 10])
def test_conv_relu_gemm_of_an_older_opset_is_upgraded_and_matches_onnxruntime(opset):
    consts = {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2), "fc": rand(5, 64, seed=3), "fb": rand(5, seed=4)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1, alpha=0.5)]
    feeds = {"x": rand(1, 3, 8, 8)}
    program, warnings = assert_matches_onnxruntime(model(nodes, feeds, ["y"], consts, opset=opset), feeds)
    assert warnings == [upgraded(opset)]
    assert program.graph.ops[0].source == "test.onnx: node 'conv' (Conv)"


def test_opset_7_batchnormalization_with_its_spatial_attribute():
    """`spatial` left BatchNormalization at opset 9: the converter drops it (1, the only value
    opset 9 keeps the meaning of); the statistics still fold into the Conv before it."""
    consts = {"w": rand(3, 2, 3, 3, seed=1), "scale": rand(3, seed=2, low=0.5), "shift": rand(3, seed=3),
              "mean": rand(3, seed=4), "var": rand(3, seed=5, low=0.1, high=1.0)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"], epsilon=1e-3,
                              spatial=1)]
    feeds = {"x": rand(1, 2, 6, 6)}
    m = model(nodes, feeds, ["y"], consts, opset=7)
    _, warnings = assert_matches_onnxruntime(m, feeds)
    assert warnings == [upgraded(7)]
    graph, warnings = parse_onnx("test.onnx", m.SerializeToString())
    ops = [op.op_type for op in canonicalise(infer_shapes(graph, warnings), warnings).ops]
    assert "MUL" not in ops and "ADD" not in ops and ops.count("CONV2D") == 1, ops


# ops whose attributes became inputs between opsets 9 and 11 (Slice's bounds at 10, Clip's at 11),
# and opset 9's Softmax, which flattens to 2-D around `axis`
@pytest.mark.parametrize("nodes, shape", [
    ([helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, -1], axes=[0, 1])], (4, 5)),
    ([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=1.0)], (4, 5)),
    ([helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]), helper.make_node("Reshape", ["u", "s"], ["y"])], (4, 5)),
    ([helper.make_node("Softmax", ["x"], ["y"], axis=1)], (2, 3, 4)),
    # folded here, by the reference evaluator as of opset 11 (whose Unsqueeze takes `axes` as an attribute)
    ([helper.make_node("Unsqueeze", ["c"], ["u"], axes=[0]), helper.make_node("Add", ["x", "u"], ["y"])], (4, 5)),
], ids=["slice", "clip", "unsqueeze-reshape", "softmax", "folded-unsqueeze"])
def test_attributes_that_became_inputs_are_upgraded(nodes, shape):
    feeds = {"x": rand(*shape)}
    m = model(nodes, feeds, ["y"], {"s": np.array([5, 2, 2], np.int64), "c": rand(5, seed=1)}, opset=9)
    _, warnings = assert_matches_onnxruntime(m, feeds)
    assert warnings == [upgraded(9)]


def test_an_opset_below_7_and_an_op_newer_than_the_models_opset_are_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(2, 3)}, ["y"], opset=6)
    assert refusal(m) == (f"bad.onnx: opset 6 is not supported (the ONNX frontend reads opsets 7 to "
                          f"{onnx.defs.onnx_opset_version()}, upgrading those below 11)")
    gelu = model([helper.make_node("Gelu", ["x"], ["y"])], {"x": rand(2, 3)}, ["y"], opset=9)  # Gelu is of opset 20
    assert refusal(gelu) == "bad.onnx: node #0 (Gelu): not an op of opset 9, which the model imports"


@pytest.mark.parametrize("before", [0, 3])
def test_a_model_the_converter_cannot_upgrade_is_refused_naming_the_node(before):
    """Opset 9 keeps only BatchNormalization's `spatial` 1: with 0 the converter stops there."""
    stats = {k: rand(3, seed=i, low=0.5) for i, k in enumerate(["scale", "shift", "mean", "var"])}
    relus = [helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"]) for i in range(before)]
    nodes = [*relus, helper.make_node("BatchNormalization", [f"r{before}", *stats], ["n"], spatial=0, name="bn"),
             helper.make_node("Relu", ["n"], ["y"])]
    m = model(nodes, {"r0": rand(1, 3, 2, 2)}, ["y"], stats, opset=7)
    assert refusal(m) == ("bad.onnx: node 'bn' (BatchNormalization): cannot be upgraded from opset 7 to 11: "
                          "Attribute spatial must have value 1")


def test_every_unsupported_op_type_is_named_at_once_with_its_count():
    """Most nodes first, ties by name; each with its first node."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Unique", ["r"], ["u1"], name="first unique"),
             helper.make_node("StringNormalizer", ["x"], ["s"]),
             helper.make_node("Unique", ["x"], ["u2"]),
             helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", name="ms")]
    m = model(nodes, {"x": rand(2, 3)}, ["u1", "s", "u2", "g"], opset=9)  # refused before any upgrade
    assert refusal(m) == ("bad.onnx: 3 op types are not supported by the ONNX frontend: Unique (2 nodes, first "
                          "'first unique'), Gelu of domain 'com.microsoft' (1 node: 'ms'), StringNormalizer "
                          "(1 node: #2)")


def test_a_long_list_of_unsupported_op_types_names_eight():
    nodes = [helper.make_node(f"Made{k}Up", ["x"], [f"y{k}"]) for k in range(10)]
    message = refusal(model(nodes, {"x": rand(2, 3)}, [f"y{k}" for k in range(10)]))
    assert message.startswith("bad.onnx: 10 op types are not supported by the ONNX frontend: Made0Up (1 node: #0), ")
    assert message.endswith(", Made7Up (1 node: #7), and 2 more")


def test_cli_upgrades_with_one_warning_and_refuses_unsupported_op_types_in_one_line(tmp_path):
    feeds = {"x": rand(2, 3)}
    good, bad = tmp_path / "old.onnx", tmp_path / "bad.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], feeds, ["y"], opset=8), good)
    proc = run_cli("compiler", good, "-o", tmp_path / "old.kpu")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "warning" in line] == [f"warning: {upgraded(8, str(good))}"]
    nodes = [helper.make_node("Unique", ["x"], ["a"]), helper.make_node("StringNormalizer", ["x"], ["b"])]
    onnx.save(model(nodes, feeds, ["a", "b"]), bad)
    proc = run_cli("compiler", bad, "-o", tmp_path / "bad.kpu")
    assert_one_line_error(proc, f"{bad}: 2 op types are not supported by the ONNX frontend: StringNormalizer (1 node: "
                                "#1), Unique (1 node: #0)")
    assert not (tmp_path / "bad.kpu").exists()

