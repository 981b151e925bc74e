"""The LAYOUT pass: an NCHW network runs in NHWC with no TRANSPOSE between its ops. A torchvision-
style block (Conv + BatchNormalization + Clip, a depthwise Conv, a residual Add, pools, the
classifier head) end to end against onnxruntime: one TRANSPOSE kernel for the NCHW input and one
for the NCHW feature output, every activation and residual fused into its convolution. Then each
rule on a small graph, the rewritten graph computing what the original does (both run op by op
with the registry's references): inverse pairs vanish, map ops, reductions, row ops and layout
ops pass a TRANSPOSE down, constants are permuted or folded at compile time, and what must stay
stays (a graph output's name and layout, one TRANSPOSE of an input read by several ops)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from dfx import Graph
from kernel_compiler.passes import LAYOUT, VIEWS, canonicalise, rewrite

from test_frontend_onnx import assert_matches_onnxruntime, model, rand
from test_onnx_examples import kernel_op_types
from test_passes import Builder, evaluate, feeds_for

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


# ---- a torchvision-style network, end to end ------------------------------------------------------


def _conv_bn(nodes: list, consts: dict, x: str, cin: int, cout: int, k: int, name: str, group: int = 1,
             act: str | None = None) -> str:
    """Conv (no bias) + BatchNormalization (+ Relu, or Clip(0, 6) for ReLU6), as torchvision exports them."""
    seed = len(consts)
    consts[f"{name}.w"] = rand(cout, cin // group, k, k, seed=seed, low=-0.5, high=0.5)
    for i, part in enumerate(("scale", "bias", "mean", "var")):
        consts[f"{name}.{part}"] = rand(cout, seed=seed + 1 + i, low=0.5 if part in ("scale", "var") else -0.2,
                                        high=1.5 if part in ("scale", "var") else 0.2)
    nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.conv"], pads=[k // 2] * 4, group=group))
    nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv"] + [f"{name}.{p}" for p in
                                  ("scale", "bias", "mean", "var")], [f"{name}.bn"]))
    if act == "relu6":
        nodes.append(helper.make_node("Clip", [f"{name}.bn", "zero", "six"], [name]))
    elif act == "relu":
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [name]))
    else:
        nodes[-1].output[0] = name
    return name


def torchvision_style(x: np.ndarray):
    """[1, 3, H, W] -> conv 3x3 + BN + ReLU6, max pool, an inverted residual (expand 1x1, depthwise
    3x3, project 1x1, Add, Relu), global average pool, Flatten, Gemm to 5 logits; the Relu's
    feature map is a second (NCHW) output."""
    nodes, consts = [], {"zero": np.array(0, np.float32), "six": np.array(6, np.float32)}
    y = _conv_bn(nodes, consts, "image", 3, 8, 3, "stem", act="relu6")
    nodes.append(helper.make_node("MaxPool", [y], ["pool"], kernel_shape=[2, 2], strides=[2, 2]))
    h = _conv_bn(nodes, consts, "pool", 8, 16, 1, "expand", act="relu6")
    h = _conv_bn(nodes, consts, h, 16, 16, 3, "depthwise", group=16, act="relu6")
    h = _conv_bn(nodes, consts, h, 16, 8, 1, "project")
    consts["fc.w"], consts["fc.b"] = rand(5, 8, seed=90), rand(5, seed=91)
    nodes += [helper.make_node("Add", ["pool", h], ["residual"]),
              helper.make_node("Relu", ["residual"], ["features"]),
              helper.make_node("GlobalAveragePool", ["features"], ["mean"]),
              helper.make_node("Flatten", ["mean"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1)]
    return model(nodes, {"image": x}, ["logits", "features"], consts)


def test_torchvision_style_network_runs_nhwc_with_a_transpose_per_nchw_input_and_output():
    x = rand(1, 3, 10, 10, seed=7)
    program, _ = assert_matches_onnxruntime(torchvision_style(x), {"image": x})
    kernels = kernel_op_types(program)
    assert kernels == [
        ("TRANSPOSE", []),  # the image, NCHW -> NHWC
        ("CONV2D", ["CLAMP"]),  # the BatchNormalization in its weights and bias, the ReLU6 fused
        ("MAXPOOL2D", []),
        ("CONV2D", ["CLAMP"]),
        ("DEPTHWISE_CONV2D", ["CLAMP"]),  # its 3x3 weights HWCM in the object file
        ("CONV2D", ["ADD", "RELU"]),  # the residual and its Relu
        ("TRANSPOSE", []),  # the feature output, back to NCHW under its ONNX name
        ("AVGPOOL2D", []),  # the global pool over H and W of NHWC, a window op
        ("CONV2D", []),  # Gemm after the Flatten: the 1x1 convolution of the pooled image
        ("RESHAPE", []),  # the Flatten, [1, 1, 1, N] -> [1, N] after it: a view
    ], kernels
    back = program.kernels[6]
    assert back.outputs == ["features"] and program.graph.tensors["features"].shape == (1, 8, 5, 5)
    (depthwise,) = (op for op in program.graph.ops if op.op_type == "DEPTHWISE_CONV2D")
    assert program.graph.tensors[depthwise.inputs[1]].shape == (3, 3, 16, 1)
    assert depthwise.inputs[1] in program.graph.constants


# ---- the rules, graph by graph ---------------------------------------------------------------------


def laid_out(graph: Graph, every_pass: bool = False) -> Graph:
    """The graph after the LAYOUT and VIEWS stages (or `every_pass`), checked to compute what
    `graph` computes and to keep its outputs' names and shapes."""
    after = canonicalise(graph, []) if every_pass else rewrite(rewrite(graph, LAYOUT, []), VIEWS, [])
    assert [(t.name, t.shape) for t in after.outputs] == [(t.name, t.shape) for t in graph.outputs]
    feeds = feeds_for(graph)
    want, got = evaluate(graph, feeds), evaluate(after, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    return after


def types(graph: Graph) -> list[str]:
    return [op.op_type for op in graph.ops]


def per_channel(b: Builder, name: str, shape: tuple[int, ...]) -> str:
    """A constant whose values differ along its dims (so a wrong permutation shows)."""
    b.tensor(name, shape, "f32", "constant")
    b.graph.set_constant(name, np.arange(1, np.prod(shape) + 1, dtype=np.float32).reshape(shape) / 4)
    return name


def test_a_transpose_and_its_inverse_vanish_and_their_readers_read_the_original():
    b = Builder()
    x = b.input("x", (1, 4, 5, 6))
    nhwc = b.op("TRANSPOSE", x, perms=TO_NHWC)
    graph = b.output(b.op("EXP", b.op("TRANSPOSE", nhwc, perms=TO_NCHW)))
    after = laid_out(graph)
    assert types(after) == ["EXP"] and after.ops[0].inputs == ["x"]
    assert set(after.tensors) == {"x", after.ops[0].outputs[0]}  # the TRANSPOSEs' results went


def test_a_graph_output_keeps_its_name_and_layout():
    b = Builder()
    x = b.input("x", (1, 4, 5, 6))
    graph = b.output(b.op("TRANSPOSE", b.op("TRANSPOSE", x, perms=TO_NHWC), perms=TO_NCHW))
    after = laid_out(graph)
    assert types(after) == ["RESHAPE"] and after.ops[0].inputs == ["x"]  # a view, under the output's name


def test_map_ops_pass_a_transpose_down_and_constants_are_permuted_as_they_broadcast():
    b = Builder()
    a = b.input("a", (1, 5, 6, 4))  # NHWC
    nchw = b.op("TRANSPOSE", a, perms=TO_NCHW)
    scaled = b.op("MUL", nchw, per_channel(b, "scale", (4, 1, 1)))  # a per-channel [C, 1, 1] of NCHW
    shifted = b.op("SUB", b.const("one", 1.0), b.op("RELU", scaled))  # a scalar, in either order
    summed = b.op("ADD", shifted, nchw)  # both through the same TRANSPOSE
    graph = b.output(b.op("TRANSPOSE", summed, perms=TO_NHWC))
    after = laid_out(graph)
    assert types(after) == ["MUL", "RELU", "SUB", "ADD"]  # the ADD writes the output, its pair of TRANSPOSEs gone
    mul = after.ops[0]
    assert mul.inputs[0] == "a" and after.tensors[mul.inputs[1]].shape == (1, 1, 1, 4)  # [C] along NHWC's last dim
    np.testing.assert_array_equal(after.constant_values(mul.inputs[1]).ravel(), np.arange(1, 5) / 4)


def test_an_operand_whose_dims_of_1_alone_move_is_reshaped_not_transposed():
    # a squeeze-and-excitation gate [1, C, 1, 1] scaling a feature map [1, C, H, W]
    b = Builder()
    a, gate = b.input("a", (1, 5, 6, 4)), b.input("gate", (1, 4, 1, 1))
    graph = b.output(b.op("MUL", b.op("TRANSPOSE", a, perms=TO_NCHW), b.op("SIGMOID", gate)))
    after = laid_out(graph)
    assert types(after) == ["SIGMOID", "RESHAPE", "MUL", "TRANSPOSE"]
    assert after.tensors[after.ops[1].outputs[0]].shape == (1, 1, 1, 4)


@pytest.mark.parametrize("op, attrs, rest", [
    ("REDUCE_MEAN", {"axes": [2, 3], "keepdims": True}, ["RESHAPE"]),  # [1, C, 1, 1]: dims of 1 move
    ("REDUCE_SUM", {"axes": [1], "keepdims": False}, []),  # [1, H, W] is NHWC's order already
    ("REDUCE_MAX", {"axes": [3], "keepdims": False}, ["TRANSPOSE"]),  # [1, C, H] of NHWC's [1, H, C]
    ("SOFTMAX", {"axis": 1}, ["TRANSPOSE"]),
    ("CONCAT", {"axis": 1}, ["TRANSPOSE"]),
    ("SLICE", {"start": [0, 1, 2, 0], "size": [-1, 2, 3, -1]}, ["TRANSPOSE"]),
    ("PAD", {"padding": [[0, 0], [1, 0], [0, 2], [1, 1]], "pad_value": -1.5}, ["TRANSPOSE"]),
])
def test_reductions_row_ops_and_layout_ops_pass_a_transpose_down(op, attrs, rest):
    b = Builder()
    a = b.input("a", (1, 5, 6, 4))
    nchw = b.op("TRANSPOSE", a, perms=TO_NCHW)
    operands = [nchw, b.op("TRANSPOSE", b.input("c", (1, 5, 6, 3)), perms=TO_NCHW)] if op == "CONCAT" else [nchw]
    graph = b.output(b.op(op, *operands, **attrs))
    after = laid_out(graph)
    assert types(after) == [op, *rest]
    assert after.ops[0].inputs[0] == "a"


def test_layernorm_passes_a_transpose_down_only_where_its_rows_stay_last():
    b = Builder()
    a = b.input("a", (2, 3, 4, 5))
    kept = b.op("LAYERNORM", b.op("TRANSPOSE", a, perms=[1, 0, 2, 3]), per_channel(b, "s", (4, 5)), axis=2)
    moved = b.op("LAYERNORM", b.op("TRANSPOSE", a, perms=[0, 1, 3, 2]), axis=2)
    after = laid_out(b.output(kept, moved))
    assert types(after) == ["LAYERNORM", "TRANSPOSE", "TRANSPOSE", "LAYERNORM"]


def test_weights_are_laid_out_at_compile_time():
    b = Builder()
    x = b.input("x", (1, 3, 7, 7))
    w, dw = per_channel(b, "w", (6, 3, 3, 3)), per_channel(b, "dw", (6, 1, 3, 3))
    y = b.op("CONV2D", x, w, layout="NCHW", padding=[[1, 1], [1, 1]])
    graph = b.output(b.op("CONV2D", y, dw, layout="NCHW", groups=6))
    after = laid_out(graph, every_pass=True)
    assert types(after) == ["TRANSPOSE", "CONV2D", "DEPTHWISE_CONV2D", "TRANSPOSE"]
    conv, depthwise = after.ops[1:3]
    np.testing.assert_array_equal(after.constant_values(conv.inputs[1]), graph.constant_values("w").transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(after.constant_values(depthwise.inputs[1]),
                                  graph.constant_values("dw").reshape(6, 1, 3, 3).transpose(2, 3, 0, 1))
    assert not {"w", "dw"} & set(after.tensors)  # the OIHW weights no op reads any more


def test_a_constant_read_elsewhere_too_is_not_folded_twice():
    # a tied embedding: the table gathered from and, transposed, multiplied by; folded, the
    # object file would carry its values twice
    b = Builder()
    table = per_channel(b, "table", (6, 4))
    x = b.input("x", (3, 4))
    graph = b.output(b.op("MATMUL", x, b.op("TRANSPOSE", table)), b.op("GATHER", table, indices=[1, 5]))
    assert types(laid_out(graph)) == ["TRANSPOSE", "MATMUL", "GATHER"]


def test_a_layout_op_that_grows_its_constant_is_not_folded():
    # a GATHER of 8 rows of a table of 2 (or a PAD) would put more bytes in the object than it reads
    b = Builder()
    table = per_channel(b, "table", (2, 4))
    x = b.input("x", (8, 4))
    graph = b.output(b.op("ADD", x, b.op("GATHER", table, indices=[0, 1] * 4)))
    assert types(laid_out(graph)) == ["GATHER", "ADD"]


def test_batchnorm_folds_into_a_convolution_across_the_transpose_after_it():
    # as HLO writes a convolution: NHWC between TRANSPOSEs, then a per-channel scale and shift of NCHW
    b = Builder()
    x = b.input("x", (1, 3, 6, 6))
    conv = b.op("CONV2D", b.op("TRANSPOSE", x, perms=TO_NHWC), per_channel(b, "w", (4, 3, 3, 3)))
    nchw = b.op("TRANSPOSE", conv, perms=TO_NCHW)
    graph = b.output(b.op("ADD", b.op("MUL", nchw, per_channel(b, "s", (4, 1, 1))), per_channel(b, "t", (4, 1, 1))))
    after = laid_out(graph, every_pass=True)
    assert types(after) == ["TRANSPOSE", "CONV2D", "TRANSPOSE"]


def test_an_input_read_by_several_ops_is_transposed_once():
    # the ONNX frontend writes each NCHW pool between TRANSPOSEs; two pools of the image share one
    b = Builder()
    x = b.input("x", (1, 3, 8, 8))
    pooled = [b.op("TRANSPOSE", b.op(pool, b.op("TRANSPOSE", x, perms=TO_NHWC), kernel=[2, 2]), perms=TO_NCHW)
              for pool in ("MAXPOOL2D", "AVGPOOL2D")]
    halves = [b.op("SLICE", b.op("TRANSPOSE", x, perms=TO_NHWC), start=[0, 0, 0, c], size=[-1, -1, -1, 1])
              for c in (0, 1)]  # read by two SLICEs, it stays whole above them
    graph = b.output(b.op("ADD", *pooled), *halves)
    after = laid_out(graph)
    assert types(after) == ["TRANSPOSE", "MAXPOOL2D", "AVGPOOL2D", "SLICE", "SLICE", "ADD", "TRANSPOSE"]
    assert {t for op in after.ops[1:5] for t in op.inputs} == {after.ops[0].outputs[0]}


def test_transposes_of_a_1x1_image_cancel_before_they_become_views():
    # each moves dims of 1 alone, a view; made one only once nothing more sinks, so the CLAMP
    # still meets its convolution
    b = Builder()
    x = b.input("x", (1, 8, 1, 1))
    y = b.op("CLAMP", b.op("CONV2D", x, per_channel(b, "w1", (16, 8, 1, 1)), layout="NCHW"), min=0.0, max=6.0)
    graph = b.output(b.op("CONV2D", y, per_channel(b, "w2", (4, 16, 1, 1)), layout="NCHW"))
    after = laid_out(graph, every_pass=True)
    assert types(after) == ["RESHAPE", "CONV2D", "CLAMP", "CONV2D", "RESHAPE"]
    assert after.ops[2].inputs == after.ops[1].outputs


@pytest.mark.parametrize("order", ["x_first", "sigmoid_first"])
def test_silu_is_one_op_fused_into_its_convolution(order):
    """EfficientNet's activation as PyTorch exports nn.SiLU, Sigmoid then Mul (the conv's result
    read twice): one SILU, the convolution's epilogue."""
    nodes, consts = [], {}
    y = _conv_bn(nodes, consts, "image", 3, 8, 3, "stem")
    nodes.append(helper.make_node("Sigmoid", [y], ["gate"]))
    nodes.append(helper.make_node("Mul", [y, "gate"] if order == "x_first" else ["gate", y], ["act"]))
    m = model(nodes, {"image": rand(1, 3, 8, 8)}, ["act"], consts)
    program, _ = assert_matches_onnxruntime(m, {"image": rand(1, 3, 8, 8, seed=5)})
    assert ("CONV2D", ["SILU"]) in kernel_op_types(program)
    assert not {"SIGMOID", "MUL"} & {op.op_type for op in program.graph.ops}
