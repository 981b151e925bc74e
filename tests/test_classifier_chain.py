"""A classifier after its global pool chains with the pointwise convolution before it, by
channels: the pool is a window op (passes.global_pools: a sum or a mean over H and W of a rank-4
tensor is SUMPOOL2D or AVGPOOL2D over the whole image, where that fits), and the classifier, a product of one
row on the vector unit (lower_gemv), reads the pool's result by chunks of its channels, each
step adding a chunk's products to a tile of its results on each compute tile. MobileNet v1's
tail (pw26 -> two REDUCE_SUMs -> MUL -> the classifier) at half its size."""

from __future__ import annotations

import numpy as np

from dfx import dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph, graph_passes
from kernel_compiler.target import load_target
from loader import bind_program, execute, program_inputs, simulate
from loader.binding import bind_greedy
from loader.report import dram_bytes
from test_passes import Builder
from test_vector_kernels import STANDARD, graph_of, random

OPS = [("CONV2D", ["x", "w0"], {}), ("REDUCE_SUM", ["t0"], {"axes": [1]}), ("REDUCE_SUM", ["t1"], {"axes": [2]}),
       ("MUL", ["t2", "scale"], {}), ("CONV2D", ["t3", "w4"], {})]
SHAPES = {"x": ((1, 7, 7, 256), "f32"), "w0": ((512, 1, 1, 256), "f32"), "scale": ((1, 1, 1, 1), "f32"),
          "w4": ((500, 1, 1, 512), "f32")}


def test_sums_over_h_and_w_are_a_global_sum_pool_and_a_mean_an_average_pool():
    target = load_target(STANDARD)
    sums = [("REDUCE_SUM", ["x"], {"axes": [1]}), ("REDUCE_SUM", ["t0"], {"axes": [2]})]
    summed = graph_passes(graph_of(sums, {"x": ((1, 7, 5, 8), "f32")}), target, True, [])
    meaned = graph_passes(graph_of([("REDUCE_MEAN", ["x"], {"axes": [1, 2]})], {"x": ((1, 7, 5, 8), "f32")}),
                          target, True, [])
    assert [(op.op_type, op.attrs) for g in (summed, meaned) for op in g.ops] == [
        ("SUMPOOL2D", {"kernel": [7, 5]}), ("AVGPOOL2D", {"kernel": [7, 5]})]
    # not over H and W, or not keeping them: a reduction still
    for axes, keep in (([1], True), ([2, 3], True), ([1, 2], False)):
        g = graph_passes(graph_of([("REDUCE_SUM", ["x"], {"axes": axes, "keepdims": keep})],
                                  {"x": ((1, 7, 5, 8), "f32")}), target, True, [])
        assert [op.op_type for op in g.ops] == ["REDUCE_SUM"]
    # an image no window op's band holds whole (EfficientNet-B0's first squeeze-and-excitation
    # pool): the mean stays a reduction, a sum over rows then divided, and compiles
    big = graph_of([("REDUCE_MEAN", ["x"], {"axes": [1, 2]})], {"x": ((1, 112, 112, 32), "f32")})
    assert "AVGPOOL2D" not in [op.op_type for op in graph_passes(big, target, True, []).ops]
    assert compile_graph(big, "se.dfg", target).kernels
    # sums whose first one rounds to integers: not the one sum over both
    truncated = graph_of(sums, {"x": ((1, 7, 5, 8), "f32")}, out_dtype="i32")
    assert [op.op_type for op in graph_passes(truncated, target, True, []).ops] == ["REDUCE_SUM"] * 2


def _run(program):
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "tail.kpu", bind_greedy)
    return bindings, simulate(program, machine, bindings)


def test_the_classifier_reads_its_pool_by_chunks_of_channels_under_the_pointwise():
    graph, target = graph_of(OPS, SHAPES), load_target(STANDARD, objective="edp")
    program = loads(dumps(compile_graph(graph, "tail.dfg", target)))
    pointwise, pool, classifier = program.kernels
    assert (pool.op, pool.epilogue, classifier.dataflow) == ("SUMPOOL2D", ["op3"], "vector")
    assert program.chains == [[k.name for k in program.kernels]]
    # a tile of results on each compute tile, going once through the chunks of the pool's result
    assert [(loop.induction_var, loop.trip_count, loop.parallel) for loop in classifier.tile_loops] == [
        ("tj", 2, True), ("tk", 512 // classifier.tiling["Tk"], False)]
    bindings, chained = _run(program)
    values = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}
    got = execute(program, bindings, values)
    v = {n: a.astype(np.float64) for n, a in values.items()}
    pooled = np.einsum("nhwc,oc->no", v["x"], v["w0"][:, 0, 0, :]) * v["scale"].item()
    want = np.einsum("nc,oc->no", pooled, v["w4"][:, 0, 0, :])
    terms = np.einsum("nc,oc->no", np.abs(np.einsum("nhwc,oc->no", np.abs(v["x"]), np.abs(v["w0"][:, 0, 0, :]))
                                          * v["scale"].item()), np.abs(v["w4"][:, 0, 0, :]))
    assert np.all(np.abs(got["t4"].reshape(want.shape) - want) <= 1e-5 * terms)
    # alone, the classifier's 1 MB of weights would come after the pointwise's work: chained, they
    # stream in under it (30,388 cycles against 49,752), moving the same bytes
    _, alone = _run(loads(dumps(compile_graph(graph, "tail.dfg", target, chain=False))))
    assert chained.cycles < 0.7 * alone.cycles
    assert dram_bytes(chained) == dram_bytes(alone)


def test_a_classifier_after_a_flatten_is_the_one_position_convolution_and_chains_too():
    """MobileNet v2's and torchvision's tail: the pool's result flattened to [1, K] (RESHAPE), the
    flatten scaled by a constant, then MATMUL by [N, K] weights given transposed, with a bias.
    The scale sinks below the view into the pool's epilogue and the MATMUL is the 1x1
    convolution of the pooled image, its weights the same bytes as [N, 1, 1, K]: no kernel
    between the pool and the classifier, which chain with the pointwise."""
    b = Builder()
    x = b.input("x", (1, 7, 7, 256))
    w0, w, bias = (b.tensor(n, s, "f32", "constant") for n, s in (("w0", (512, 1, 1, 256)), ("w", (500, 512)),
                                                                   ("bias", (500,))))
    for i, name in enumerate((w0, w, bias)):
        b.graph.set_constant(name, random(b.graph.tensors[name].shape, seed=i + 1))
    pooled = b.op("REDUCE_SUM", b.op("REDUCE_SUM", b.op("CONV2D", x, w0), axes=[1]), axes=[2])
    flat = b.op("MUL", b.op("RESHAPE", pooled, new_shape=[1, 512]), b.const("scale", 1 / 49, (1, 1)))
    graph = b.output(b.op("MATMUL", flat, w, bias, transpose_b=True))
    target = load_target(STANDARD, objective="edp")
    program = loads(dumps(compile_graph(graph, "tail.dfg", target)))
    assert [(k.op, k.dataflow) for k in program.kernels] == [
        ("CONV2D", "output_stationary"), ("SUMPOOL2D", "vector"), ("CONV2D", "vector"), ("RESHAPE", "moves")]
    assert program.chains == [[k.name for k in program.kernels[:3]]]
    bindings, _ = _run(program)
    values = {"x": random((1, 7, 7, 256))}
    got = execute(program, bindings, program_inputs(program, values, 0))
    v = {n: graph.constant_values(n).astype(np.float64) for n in (w0, w, bias)}
    pooled_want = np.einsum("nhwc,oc->no", values["x"].astype(np.float64), v[w0][:, 0, 0, :]) / 49
    want = pooled_want @ v[w].T + v[bias]
    terms = np.abs(np.einsum("nhwc,oc->no", np.abs(values["x"]), np.abs(v[w0][:, 0, 0, :])) / 49) @ np.abs(v[w]).T
    out = next(t.name for t in program.graph.tensors.values() if t.role == "output")
    assert np.all(np.abs(got[out] - want) <= 1e-5 * (terms + np.abs(v[bias])))
