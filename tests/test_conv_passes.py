"""The CONVOLUTION passes: NCHW and grouped CONV2D and pad-excluding AVGPOOL2D become the forms
the lowering takes. For each rewrite, the ops it writes; that the rewritten graph, run op by op
with the registry's references, computes what the original op's reference computes; that both
agree with loops written here (not the registry's code); and one run end to end, compiled,
simulated and executed."""

from __future__ import annotations

import numpy as np
import pytest

from dfx import Graph, Op, Tensor, dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.passes import CONVOLUTION, canonicalise, rewrite
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.inputs import program_inputs

from test_passes import evaluate
from test_vector_kernels import STANDARD, graph_of, random, run

# ---- loops written here, in f64 ----------------------------------------------------------------


def conv_by_loops(x, w, bias, stride, padding, dilation, groups):
    """NCHW x, OIHW w: y[n, o, i, j] = bias[o] + the sum over the input channels of o's group and
    the taps of x[n, channel, i * stride - pad + tap * dilation] * w[o, channel, tap]."""
    n, _, height, width = x.shape
    outputs, per_group, kh, kw = w.shape
    (top, bottom), (left, right) = padding
    oh = (height + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (width + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, outputs, oh, ow))
    for o in range(outputs):
        group = o // (outputs // groups)
        for i in range(oh):
            for j in range(ow):
                total = np.zeros(n) + (0.0 if bias is None else np.broadcast_to(bias, (outputs,))[o])
                for c in range(per_group):
                    for p in range(kh):
                        for q in range(kw):
                            r, s = i * stride[0] - top + p * dilation[0], j * stride[1] - left + q * dilation[1]
                            if 0 <= r < height and 0 <= s < width:
                                total += x[:, group * per_group + c, r, s] * w[o, c, p, q]
                y[:, o, i, j] = total
    return y


def mean_by_loops(x, kernel, padding, stride=(1, 1)):
    """NHWC x: each window's mean over the input elements inside it, the padding not counted."""
    n, height, width, channels = x.shape
    (top, bottom), (left, right) = padding
    oh = (height + top + bottom - kernel[0]) // stride[0] + 1
    ow = (width + left + right - kernel[1]) // stride[1] + 1
    y = np.zeros((n, oh, ow, channels))
    for i in range(oh):
        for j in range(ow):
            rows = [r for r in range(i * stride[0] - top, i * stride[0] - top + kernel[0]) if 0 <= r < height]
            cols = [s for s in range(j * stride[1] - left, j * stride[1] - left + kernel[1]) if 0 <= s < width]
            y[:, i, j, :] = x[:, rows][:, :, cols].mean(axis=(1, 2))
    return y


# ---- cases -------------------------------------------------------------------------------------

T, S, C = "TRANSPOSE", "SLICE", "CONV2D"
# id -> (layout, x shape, w shape, bias shape or None, attrs, the op types the pass writes)
CONVS = {
    "nchw": ("NCHW", (2, 5, 11, 9), (7, 5, 3, 2), (7,),
             {"stride": [2, 2], "padding": [[1, 2], [0, 1]], "dilation": [2, 1]}, [T, C, T]),  # w read OIHW
    "nchw_groups2": ("NCHW", (2, 6, 10, 7), (4, 3, 3, 3), (4,),
                     {"stride": [2, 1], "padding": [[1, 1], [2, 0]], "dilation": [1, 2], "groups": 2},
                     [T, T, S, S, S, C, S, S, S, C, "CONCAT", T]),
    "nchw_depthwise_m2": ("NCHW", (2, 3, 9, 10), (6, 1, 3, 3), (6,),
                          {"stride": [2, 2], "padding": [[1, 1], [1, 2]], "dilation": [2, 1], "groups": 3},
                          [T, "RESHAPE", T, "RESHAPE", "DEPTHWISE_CONV2D", T]),  # OIHW -> OHWI moves a dim of 1
    "nhwc_groups3_broadcast_bias": ("NHWC", (2, 7, 8, 6), (9, 3, 3, 2), (1,),
                                    {"stride": [1, 2], "padding": [[0, 2], [1, 1]], "groups": 3},
                                    [S, S, C, S, S, C, S, S, C, "CONCAT"]),
    "nhwc_depthwise": ("NHWC", (1, 6, 5, 5), (5, 2, 3, 1), None,
                       {"padding": [[1, 0], [1, 1]], "groups": 5}, [T, "DEPTHWISE_CONV2D"]),
    "nhwc_depthwise_m2": ("NHWC", (2, 7, 6, 3), (6, 3, 3, 1), (6,),
                          {"stride": [2, 2], "padding": [[1, 1], [1, 1]], "groups": 3},
                          [T, "RESHAPE", "DEPTHWISE_CONV2D"]),
}
# id -> (x shape, attrs): every one excludes the padding from the count, and has some
POOLS = {
    "stride2": ((2, 9, 7, 3), {"kernel": [3, 3], "stride": [2, 2], "padding": [[1, 1], [1, 1]]}),
    "uneven": ((1, 10, 7, 5), {"kernel": [4, 3], "stride": [3, 1], "padding": [[2, 1], [0, 2]]}),
    "one_side": ((2, 5, 6, 2), {"kernel": [2, 2], "padding": [[1, 0], [0, 1]]}),
}


def conv_graph(case: str) -> tuple[Graph, dict[str, np.ndarray]]:
    layout, x_shape, w_shape, b_shape, attrs, _ = CONVS[case]
    inputs = {"x": (x_shape, "f32"), "w": (w_shape, "f32")} | ({"b": (b_shape, "f32")} if b_shape else {})
    graph = graph_of([("CONV2D", list(inputs), {**attrs, "layout": layout})], inputs)
    return graph, {name: random(shape, seed=i) for i, (name, (shape, _)) in enumerate(inputs.items())}


def conv_by_loops_of(case: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    layout, _, _, _, attrs, _ = CONVS[case]
    x, w = (feeds[n].astype(np.float64) for n in ("x", "w"))
    if layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)
    y = conv_by_loops(x, w, feeds.get("b"), attrs.get("stride", [1, 1]), attrs["padding"],
                      attrs.get("dilation", [1, 1]), attrs.get("groups", 1))
    return y if layout == "NCHW" else y.transpose(0, 2, 3, 1)


def pool_graph(case: str, dtype: str = "f32") -> tuple[Graph, dict[str, np.ndarray]]:
    shape, attrs = POOLS[case]
    graph = graph_of([("AVGPOOL2D", ["x"], attrs)], {"x": (shape, dtype)}, out_dtype=dtype)
    return graph, {"x": random(shape, dtype, seed=3)}


def rewritten(graph: Graph) -> Graph:
    """The graph after the passes, checked to be consistent: ops in topological order, shapes as
    the registry derives them, layout ops keeping their operand's dtype, the output's name kept."""
    after = canonicalise(graph, [])
    known = {t.name for t in after.inputs}
    for op in after.ops:
        assert set(op.inputs) <= known, op
        known.update(op.outputs)
        if op.op_type in ("TRANSPOSE", "RESHAPE", "SLICE", "CONCAT"):
            assert {after.tensors[t].dtype for t in op.inputs + op.outputs} == {after.tensors[op.outputs[0]].dtype}
    assert len({op.name for op in after.ops}) == len(after.ops)
    warnings: list[str] = []
    infer_shapes(after, warnings)
    assert warnings == []  # every declared shape is the derived one
    assert [t.name for t in after.outputs] == [t.name for t in graph.outputs]
    return after


# ---- the rewrites ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CONVS)
def test_conv2d_becomes_nhwc_ungrouped_or_depthwise(case):
    graph, feeds = conv_graph(case)
    after = rewritten(graph)
    assert [op.op_type for op in after.ops] == CONVS[case][-1]
    for op in after.ops:  # what the lowering takes
        if op.op_type == "CONV2D":
            assert op.attrs["layout"] == "NHWC" and op.attrs["groups"] == 1
    (want,) = evaluate(graph, feeds).values()  # the original op's registry reference
    (got,) = evaluate(after, feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    by_loops = conv_by_loops_of(case, feeds)
    np.testing.assert_allclose(want, by_loops, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, by_loops, rtol=1e-5, atol=1e-5)


def test_depthwise_weights_keep_the_grouped_channel_order():
    # CONV2D's output channel o is group o // M's; DEPTHWISE_CONV2D's channel c * M + k is input
    # channel c's k-th: with weights all zero but one output channel, only that channel is non-zero
    graph, feeds = conv_graph("nhwc_depthwise_m2")
    feeds["w"] = np.zeros_like(feeds["w"])
    feeds["w"][4] = 1.0  # group 2's first output
    (got,) = evaluate(rewritten(graph), {**feeds, "b": np.zeros(6, np.float32)}).values()
    assert np.flatnonzero(np.abs(got).sum(axis=(0, 1, 2))).tolist() == [4]
    np.testing.assert_allclose(got[..., 4], conv_by_loops_of("nhwc_depthwise_m2", {**feeds, "b": None})[..., 4],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_avgpool_over_the_inputs_becomes_window_sums_divided_by_their_counts(case, dtype):
    graph, feeds = pool_graph(case, dtype)
    after = rewritten(graph)
    assert [op.op_type for op in after.ops] == ["SUMPOOL2D", "DIV"]
    pool, div = after.ops
    assert "count_include_pad" not in pool.attrs and pool.attrs["padding"] == POOLS[case][1]["padding"]
    assert div.inputs[0] == pool.outputs[0]
    counts = np.frombuffer(after.constants[div.inputs[1]], {"f32": np.float32, "f64": np.float64}[dtype])
    _, oh, ow, _ = after.tensors["t0"].shape
    assert after.tensors[div.inputs[1]].shape == (1, oh, ow, 1) and after.tensors[div.inputs[1]].dtype == dtype
    assert counts.min() >= 1 and counts.max() <= np.prod(POOLS[case][1]["kernel"])
    (want,) = evaluate(graph, feeds).values()
    (got,) = evaluate(after, feeds).values()
    np.testing.assert_array_equal(got, want)  # a sum divided by its count, as the mean over the inputs is defined
    by_loops = mean_by_loops(feeds["x"].astype(np.float64), **POOLS[case][1])
    np.testing.assert_allclose(got, by_loops, rtol=1e-5 if dtype == "f32" else 1e-12)


def test_pooling_the_lowering_takes_stays():
    graph = graph_of([("AVGPOOL2D", ["x"], {"kernel": [3, 3], "padding": [[1, 1], [1, 1]], "count_include_pad": True}),
                      ("AVGPOOL2D", ["t0"], {"kernel": [2, 2]}),  # no padding: nothing to exclude
                      ("MAXPOOL2D", ["t1"], {"kernel": [2, 2], "padding": [[1, 1], [1, 1]]}),
                      ("CONV2D", ["t2", "w"], {"padding": [[1, 1], [1, 1]]})],
                     {"x": ((1, 8, 8, 4), "f32"), "w": ((3, 3, 3, 4), "f32")})
    assert [(op.op_type, op.attrs) for op in rewrite(graph, CONVOLUTION, []).ops] == \
        [(op.op_type, op.attrs) for op in graph.ops]


def test_results_keep_their_names_and_new_ones_are_fresh():
    graph, feeds = conv_graph("nchw")
    graph.tensors["t0"].role = "intermediate"
    graph.tensors["t1"] = Tensor("t1", graph.tensors["t0"].shape, "f32", "output")
    graph.ops.append(Op("relu", "RELU", ["t0"], ["t1"], {}, "test relu"))
    graph.tensors["op0.x_nhwc"] = Tensor("op0.x_nhwc", (3,), "f32", "input")  # the name the pass would take
    feeds["op0.x_nhwc"] = random((3,))
    after = rewritten(graph)
    assert after.ops[0].outputs == ["op0.x_nhwc1"]
    # the RELU sank below the TRANSPOSE back to NCHW (LAYOUT); the graph output keeps its name
    conv, relu, back = after.ops[-3:]
    assert relu.op_type == "RELU" and relu.inputs == conv.outputs and back.outputs == ["t1"]
    (want,) = evaluate(graph, feeds).values()
    (got,) = evaluate(after, feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- a gate on the input channels goes into the weights -----------------------------------------

# x [1, H, W, 16] scaled by a gate [1, 1, 1, 16] (squeeze-and-excitation's), then a convolution
# with OHWI weights: conv(x * s, w) -> conv(x, w * s) where the image outnumbers the weights
GATED = {
    "1x1": ((1, 12, 12, 16), (8, 1, 1, 16), {}, None),
    "3x3 padded": ((1, 12, 12, 16), (8, 3, 3, 16), {"padding": [[1, 1], [1, 1]]}, None),
    "HWIO weights": ((1, 12, 12, 16), (3, 3, 16, 8), {"padding": [[1, 1], [1, 1]], "weight_layout": "HWIO"}, None),
    "strided, dilated, gate [C]": ((1, 13, 13, 16), (8, 3, 3, 16), {"stride": [2, 2], "dilation": [2, 2]}, (16,)),
}


def gated_graph(x_shape, w_shape, attrs, gate_shape=None, groups=1, dtype="f32", ops_before=()):
    channels = x_shape[-1]
    gate_shape = (1, 1, 1, channels) if gate_shape is None else gate_shape
    inputs = {"x": (x_shape, dtype), "s": (gate_shape, dtype), "w": (w_shape, dtype), "b": ((w_shape[0],), dtype)}
    if attrs.get("weight_layout") == "HWIO":
        inputs["b"] = ((w_shape[-1],), dtype)
    image = f"t{len(ops_before) - 1}" if ops_before else "x"
    ops = [*ops_before, ("MUL", [image, "s"], {}), ("CONV2D", [f"t{len(ops_before)}", "w", "b"], {**attrs, "groups": groups})]
    return graph_of(ops, inputs, dtype)


def conv_nhwc_by_loops(x, w_ohwi, bias, attrs):
    """As conv_by_loops, for NHWC x and OHWI w."""
    y = conv_by_loops(x.transpose(0, 3, 1, 2), w_ohwi.transpose(0, 3, 1, 2), bias, attrs.get("stride", (1, 1)),
                      attrs.get("padding", [[0, 0], [0, 0]]), attrs.get("dilation", (1, 1)), 1)
    return y.transpose(0, 2, 3, 1)


@pytest.mark.parametrize("case", GATED)
def test_a_gate_on_the_input_channels_scales_the_weights_instead(case):
    x_shape, w_shape, attrs, gate_shape = GATED[case]
    graph = gated_graph(x_shape, w_shape, attrs, gate_shape)
    after = canonicalise(graph, [])
    # the MUL now scales the weights: its result has their shape, and the convolution reads x
    mul = next(op for op in after.ops if op.op_type == "MUL")
    conv = next(op for op in after.ops if op.op_type == "CONV2D")
    assert after.tensors[mul.outputs[0]].shape == w_shape and conv.inputs[:2] == ["x", mul.outputs[0]]
    feeds = {n: random(t.shape, seed=i) for i, (n, t) in enumerate(graph.tensors.items()) if t.role == "input"}
    w = feeds["w"].transpose(3, 0, 1, 2) if attrs.get("weight_layout") == "HWIO" else feeds["w"]
    want = conv_nhwc_by_loops(feeds["x"].astype(np.float64) * feeds["s"], w.astype(np.float64), feeds["b"], attrs)
    (got,) = evaluate(after, feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    values = run_with_constants(graph, feeds)
    np.testing.assert_allclose(values["t1"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape, w_shape, gate_shape, groups, dtype", [
    ((1, 2, 2, 16), (8, 1, 1, 16), None, 1, "f32"),  # an image of fewer elements than the weights
    ((1, 12, 12, 16), (8, 1, 1, 16), (1, 12, 1, 16), 1, "f32"),  # a gate along the rows too
    ((1, 12, 12, 16), (8, 1, 1, 8), None, 2, "f32"),  # grouped: a weight's input channels are its group's
    ((1, 12, 12, 16), (8, 1, 1, 16), None, 1, "i32"),  # integers: no other order of the products
    ((1, 12, 12, 16), (8, 3, 3, 16), None, 1, "f32"),  # a padding of 0.5, which the gate would scale
    ((1, 1, 1, 16), (8, 1, 1, 16), (1, 12, 12, 1), 1, "f32"),  # neither operand the image: both broadcast
    ((1, 12, 12, 16), (8, 1, 1, 16), (), 1, "f32"),  # one value for all: no channels to scale
])
def test_a_gate_stays_on_the_image_where_the_weights_would_not_take_it(x_shape, w_shape, gate_shape, groups, dtype):
    padded = {"padding": [[1, 1], [1, 1]], "pad_value": 0.5} if w_shape[1] == 3 else {}
    graph = gated_graph(x_shape, w_shape, padded, gate_shape, groups, dtype)
    after = canonicalise(graph, [])
    mul = next(op for op in after.ops if op.op_type == "MUL")
    assert after.tensors[mul.outputs[0]].shape == graph.tensors["t0"].shape


def test_a_gate_stays_where_it_is_free_in_the_epilogue_of_the_image_s_producer():
    """RELU(x) read by the MUL alone: fusion gives the MUL to the RELU's kernel (or to a chain's
    depthwise), where it costs no pass over the image; a MUL of the weights would be a kernel more."""
    graph = gated_graph((1, 12, 12, 16), (8, 1, 1, 16), {}, ops_before=[("RELU", ["x"], {})])
    after = canonicalise(graph, [])
    mul = next(op for op in after.ops if op.op_type == "MUL")
    assert after.tensors[mul.outputs[0]].shape == (1, 12, 12, 16)


# ---- end to end --------------------------------------------------------------------------------


def run_with_constants(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """As test_vector_kernels.run, its inputs as the loader makes them (`program_inputs`): `feeds`
    and the constants the compiler made, with the values the object file carries."""
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(STANDARD))))
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "test", bind_greedy)
    simulate(program, machine, bindings)
    return execute(program, bindings, program_inputs(program, feeds, seed=0))


@pytest.mark.parametrize("case", ["nchw", "nchw_groups2", "nhwc_depthwise_m2"])
def test_conv2d_rewrites_compile_and_run(case):
    graph, feeds = conv_graph(case)
    _, values, _ = run(graph, feeds)
    np.testing.assert_allclose(values["t0"], conv_by_loops_of(case, feeds), rtol=1e-5, atol=1e-5)


def test_avgpool_rewrite_compiles_and_runs():
    graph, feeds = pool_graph("stride2")
    values = run_with_constants(graph, feeds)
    np.testing.assert_allclose(values["t0"], mean_by_loops(feeds["x"].astype(np.float64), **POOLS["stride2"][1]),
                               rtol=1e-5)
