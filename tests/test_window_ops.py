"""The sliding-window ops end to end in-process: CONV2D on the array (an implicit GEMM fed from
input bands with their halo and zero border), DEPTHWISE_CONV2D, MAXPOOL2D and AVGPOOL2D on the
vector unit, MobileNet's global average pool as the chain TOSA writes; each compiled, written
and read back, bound, simulated and executed tile by tile. Values against numpy written here
(every window cut out of an explicitly padded f64 array, position by position), the compiler's
DRAM count against the simulator's, the array's cycles against SCALE-Sim's, and the external
memory traffic of 3x3 layers against their compulsory bytes (input, weights and output once)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import CONFIGS, run_cli, shrunk_config
from dfx import dumps, loads, numpy_dtype
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.inputs import program_inputs
from loader.report import dram_bytes
from test_vector_kernels import STANDARD, graph_of, random


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """standard's array and engines with 32 KB of L3 and 4 KB L1 buffers (test_tiling_e2e's):
    a 17x13 image splits into bands, its channels into chunks and tiles."""
    return shrunk_config(tmp_path_factory, "standard", "small", (2, 16), (8, 8), (4, 4))


def run(graph, feeds: dict[str, np.ndarray], config: str = STANDARD, dataflow: str = "auto"):
    """Compile for `config` (through the object file, so the validator sees it), bind, simulate,
    execute with the loader's inputs (`feeds` and the graph's constants); the compiler's count of
    external-memory bytes must be what the simulator moved. (program, values, simulation)."""
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(config), dataflow=dataflow)))
    machine = load_machine(config)
    bindings = bind_program(program, machine, "test", bind_greedy)
    sim = simulate(program, machine, bindings)
    values = execute(program, bindings, program_inputs(program, feeds, seed=0))
    moved = sum(dram_bytes(sim).values())
    assert moved > 0
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == moved
    return program, values, sim


def feeds_for(inputs: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, np.ndarray]:
    return {name: random(shape, dtype, seed=i) for i, (name, (shape, dtype)) in enumerate(inputs.items())}


# ---- numpy written here: every window cut from an explicitly padded f64 array --------------------


def padded(x: np.ndarray, padding, fill: float = 0.0) -> np.ndarray:
    (top, bottom), (left, right) = padding
    return np.pad(x.astype(np.float64), [(0, 0), (top, bottom), (left, right), (0, 0)], constant_values=fill)


def each_window(xp: np.ndarray, kernel, stride, dilation=(1, 1)):
    """(output shape [OH, OW], then (i, j, the [N, KH, KW, C] window of output position i, j))
    over the padded NHWC `xp`: the window's taps are rows i * stride + p * dilation, p < KH."""
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    oh, ow = ((xp.shape[1 + a] - spans[a]) // stride[a] + 1 for a in (0, 1))
    positions = []
    for i in range(oh):
        for j in range(ow):
            rows = i * stride[0] + dilation[0] * np.arange(kernel[0])
            cols = j * stride[1] + dilation[1] * np.arange(kernel[1])
            positions.append((i, j, xp[:, rows][:, :, cols]))
    return (oh, ow), positions


def conv_numpy(x, w, bias, stride, padding, dilation) -> np.ndarray:
    """NHWC x, OHWI w: y[n, i, j, o] = bias[o] + sum over p, q, c of window[n, p, q, c] * w[o, p, q, c]."""
    (oh, ow), windows = each_window(padded(x, padding), w.shape[1:3], stride, dilation)
    y = np.zeros((x.shape[0], oh, ow, w.shape[0]))
    for i, j, window in windows:
        y[:, i, j, :] = np.einsum("npqc,opqc->no", window, w.astype(np.float64))
    return y if bias is None else y + bias.astype(np.float64)


def depthwise_numpy(x, w, bias, stride, padding, dilation) -> np.ndarray:
    """NHWC x, HWCM w: y[n, i, j, c * M + m] = bias[c * M + m] + sum over p, q of window[n, p, q, c] * w[p, q, c, m]."""
    (oh, ow), windows = each_window(padded(x, padding), w.shape[:2], stride, dilation)
    channels, multiplier = w.shape[2:]
    y = np.zeros((x.shape[0], oh, ow, channels * multiplier))
    for i, j, window in windows:
        y[:, i, j, :] = np.einsum("npqc,pqcm->ncm", window, w.astype(np.float64)).reshape(x.shape[0], -1)
    return y if bias is None else y + bias.astype(np.float64)


def maxpool_numpy(x, kernel, stride, padding) -> np.ndarray:
    """The largest element of each window; the padding (-inf) is never it."""
    (oh, ow), windows = each_window(padded(x, padding, -np.inf), kernel, stride)
    y = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for i, j, window in windows:
        y[:, i, j, :] = window.max(axis=(1, 2))
    return y


def avgpool_numpy(x, kernel, stride, padding, count_include_pad: bool) -> np.ndarray:
    """Each window's sum over KH * KW, or over the elements inside the input (a mask of ones
    padded with zeros counts them)."""
    (oh, ow), windows = each_window(padded(x, padding), kernel, stride)
    _, inside = each_window(padded(np.ones((1, *x.shape[1:3], 1)), padding), kernel, stride)
    y = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for (i, j, window), (_, _, mask) in zip(windows, inside):
        count = kernel[0] * kernel[1] if count_include_pad else mask.sum()
        y[:, i, j, :] = window.sum(axis=(1, 2)) / count
    return y


def test_the_numpy_here_on_a_hand_worked_case():
    """A 3x3 image 1..9, one channel: the sums and extrema of its windows worked by hand."""
    x = np.arange(1, 10, dtype=np.float64).reshape(1, 3, 3, 1)
    ones = np.ones((1, 2, 2, 1))
    pad = [[1, 0], [0, 1]]  # a row of zeros above, a column to the right
    # windows over rows -1..0 / 0..1 / 1..2 and cols 0..1 / 1..2 / 2..3
    np.testing.assert_array_equal(conv_numpy(x, ones, None, (1, 1), pad, (1, 1))[0, :, :, 0],
                                  [[1 + 2, 2 + 3, 3], [1 + 2 + 4 + 5, 2 + 3 + 5 + 6, 3 + 6],
                                   [4 + 5 + 7 + 8, 5 + 6 + 8 + 9, 6 + 9]])
    np.testing.assert_array_equal(conv_numpy(x, ones, np.float64([10]), (2, 2), [[0, 0], [0, 0]], (1, 1))[0, :, :, 0],
                                  [[10 + 1 + 2 + 4 + 5]])
    # dilation 2: the corners of the image
    np.testing.assert_array_equal(depthwise_numpy(x, np.ones((2, 2, 1, 2)), None, (1, 1), [[0, 0], [0, 0]],
                                                  (2, 2))[0, 0, 0], [1 + 3 + 7 + 9] * 2)
    np.testing.assert_array_equal(maxpool_numpy(-x, (2, 2), (1, 1), pad)[0, :, :, 0],
                                  [[-1, -2, -3], [-1, -2, -3], [-4, -5, -6]])
    np.testing.assert_array_equal(avgpool_numpy(x, (2, 2), (1, 1), pad, True)[0, 0, :, 0], [3 / 4, 5 / 4, 3 / 4])
    np.testing.assert_array_equal(avgpool_numpy(x, (2, 2), (1, 1), pad, False)[0, 0, :, 0], [3 / 2, 5 / 2, 3 / 1])


# ---- CONV2D --------------------------------------------------------------------------------------

# id -> (x shape, w shape (OHWI), with a bias, attrs, epilogue: None, "clamp" or "residual",
# config, the tile loops that must run more than once there)
CONVS = {
    # small: several bands of rows, tiles of output channels and chunks of input channels
    "s1_uneven_pad_bias": ((2, 17, 13, 23), (29, 3, 3, 23), True, {"padding": [[1, 2], [0, 1]]}, None,
                           "small", ("th", "tj", "tk")),
    "s2_dilation2_no_bias": ((2, 17, 13, 23), (29, 3, 3, 23), False,
                             {"stride": [2, 2], "dilation": [2, 2], "padding": [[2, 1], [1, 2]]}, None, "small", ()),
    # bands of columns too, each with its left and right halo
    "wide_s2_columns_bias": ((2, 5, 125, 23), (29, 3, 3, 23), True, {"stride": [1, 2], "padding": [[1, 1], [2, 1]]},
                             None, "small", ("tw",)),
    "mixed_stride_bias_clamp": ((2, 17, 13, 23), (20, 3, 2, 23), True,
                                {"stride": [2, 1], "padding": [[0, 1], [1, 0]]}, "clamp", "small", ()),
    "no_bias_clamp": ((2, 17, 13, 23), (40, 3, 3, 23), False,
                      {"stride": [1, 2], "dilation": [2, 1], "padding": [[2, 2], [1, 1]]}, "clamp", "standard", ()),
    "bias_residual_add": ((2, 13, 17, 23), (23, 3, 3, 23), True,
                          {"dilation": [1, 2], "padding": [[1, 1], [2, 2]]}, "residual", "small", ()),
    "residual_add_no_bias": ((2, 17, 13, 23), (23, 5, 3, 23), False,
                             {"padding": [[3, 1], [1, 1]]}, "residual", "standard", ()),
    # stride = kernel, no padding: bands that neither overlap nor pad
    "k2_s2_bands_of_their_own": ((1, 40, 40, 16), (8, 2, 2, 16), False, {"stride": [2, 2]}, None, "small", ("th",)),
}


@pytest.mark.parametrize("case", CONVS)
def test_conv2d(case, small):
    x_shape, w_shape, with_bias, attrs, epilogue, config, split = CONVS[case]
    inputs = {"x": (x_shape, "f32"), "w": (w_shape, "f32")} | ({"b": ((w_shape[0],), "f32")} if with_bias else {})
    ops = [("CONV2D", list(inputs), attrs)]
    if epilogue == "clamp":
        ops.append(("CLAMP", ["t0"], {"min": -1.5, "max": 6.0}))
    elif epilogue == "residual":
        inputs["r"] = (x_shape[:3] + (w_shape[0],), "f32")  # the padding keeps the image's size
        ops.append(("ADD", ["t0", "r"], {}))
    feeds = feeds_for(inputs)
    program, values, _ = run(graph_of(ops, inputs), feeds, small if config == "small" else STANDARD)

    [kernel] = program.kernels  # the epilogue fused
    assert kernel.op == "CONV2D" and kernel.epilogue == (["op1"] if epilogue else [])
    for loop in split:
        assert kernel.tiling[f"num_tiles_{loop}"] > 1, (loop, kernel.tiling)
    want = conv_numpy(feeds["x"], feeds["w"], feeds.get("b"), attrs.get("stride", [1, 1]),
                      attrs.get("padding", [[0, 0], [0, 0]]), attrs.get("dilation", [1, 1]))
    if epilogue == "clamp":
        want = np.clip(want, -1.5, 6.0)
    elif epilogue == "residual":
        want = want + feeds["r"]
    got = values[f"t{len(ops) - 1}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    if epilogue == "clamp":  # both bounds are reached
        assert (got == -1.5).any() and (got == 6.0).any()


# ---- DEPTHWISE_CONV2D ----------------------------------------------------------------------------

# id -> (x shape, w shape (HWCM), with a bias (or its shape), attrs, with a CLAMP, config, the tile
# loops that must run more than once there)
DEPTHWISE = {
    "m1_bias_clamp": ((2, 17, 13, 23), (3, 3, 23, 1), True, {"padding": [[1, 1], [1, 1]]}, True,
                      "small", ("th", "tc")),
    "m2_s2_dilation2_bias_clamp": ((2, 17, 13, 23), (3, 3, 23, 2), True,
                                   {"stride": [2, 2], "dilation": [2, 2], "padding": [[2, 1], [1, 2]]}, True,
                                   "small", ("th", "tw")),
    "m1_uneven_no_bias": ((2, 13, 17, 23), (3, 2, 23, 1), False,
                          {"stride": [1, 2], "dilation": [2, 1], "padding": [[0, 2], [1, 0]]}, False, "standard", ()),
    "m2_bias_clamp": ((2, 17, 13, 23), (3, 3, 23, 2), True, {"stride": [2, 1], "padding": [[1, 1], [1, 1]]},
                      True, "standard", ()),
    "m1_one_bias_for_all": ((1, 20, 20, 8), (3, 3, 8, 1), (1,), {"padding": [[1, 1], [1, 1]]}, False, "small", ()),
}


@pytest.mark.parametrize("case", DEPTHWISE)
def test_depthwise_conv2d(case, small):
    x_shape, w_shape, with_bias, attrs, clamp, config, split = DEPTHWISE[case]
    inputs = {"x": (x_shape, "f32"), "w": (w_shape, "f32")}
    if with_bias:
        inputs["b"] = (with_bias if isinstance(with_bias, tuple) else (w_shape[2] * w_shape[3],), "f32")
    ops = [("DEPTHWISE_CONV2D", list(inputs), attrs)] + ([("CLAMP", ["t0"], {"min": 0.0, "max": 2.0})] if clamp else [])
    feeds = feeds_for(inputs)
    program, values, _ = run(graph_of(ops, inputs), feeds, small if config == "small" else STANDARD)

    [kernel] = program.kernels
    assert kernel.op == "DEPTHWISE_CONV2D" and kernel.dataflow == "vector"
    assert kernel.epilogue == (["op1"] if clamp else [])
    for loop in split:
        assert kernel.tiling[f"num_tiles_{loop}"] > 1, (loop, kernel.tiling)
    want = depthwise_numpy(feeds["x"], feeds["w"], feeds.get("b"), attrs.get("stride", [1, 1]), attrs["padding"],
                           attrs.get("dilation", [1, 1]))
    if clamp:
        want = np.clip(want, 0.0, 2.0)
    got = values[f"t{len(ops) - 1}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_depthwise_multiplier_keeps_each_channels_results_side_by_side():
    """Channel c's M results are output channels c * M .. c * M + M - 1: weights zero but for
    input channel 5's second, only output channel 11 is non-zero."""
    inputs = {"x": ((1, 6, 7, 8), "f32"), "w": ((3, 3, 8, 2), "f32")}
    feeds = feeds_for(inputs)
    feeds["w"] = np.zeros((3, 3, 8, 2), np.float32)
    feeds["w"][:, :, 5, 1] = 1.0
    _, values, _ = run(graph_of([("DEPTHWISE_CONV2D", ["x", "w"], {"padding": [[1, 1], [1, 1]]})], inputs), feeds)
    got = values["t0"]
    assert np.flatnonzero(np.abs(got).sum(axis=(0, 1, 2))).tolist() == [11]
    # a 3x3 box sum of channel 5 with its zero border
    xp = padded(feeds["x"][..., 5:6], [[1, 1], [1, 1]])
    box = sum(xp[:, p:p + 6, q:q + 7, 0] for p in range(3) for q in range(3))
    np.testing.assert_allclose(got[..., 11], box, rtol=1e-5, atol=1e-5)


# ---- pooling -------------------------------------------------------------------------------------

# id -> (x shape, dtype, attrs, on the small config)
MAXPOOLS = {
    "k3_s2_no_padding": ((2, 17, 13, 23), "f32", {"kernel": [3, 3], "stride": [2, 2]}, True),
    "k2x3_s1_overlapping": ((2, 13, 17, 23), "f32", {"kernel": [2, 3], "stride": [1, 1]}, False),
    "i32_uneven_padding": ((2, 17, 13, 23), "i32", {"kernel": [3, 3], "stride": [2, 2], "padding": [[1, 2], [0, 1]]},
                           True),
    "f32_uneven_padding": ((2, 17, 13, 23), "f32", {"kernel": [3, 3], "stride": [2, 1], "padding": [[1, 2], [0, 1]]},
                           True),
    # stride = kernel, no padding: bands that neither overlap nor pad, several of them
    "k2_s2_bands_of_their_own": ((1, 40, 40, 8), "f32", {"kernel": [2, 2], "stride": [2, 2]}, True),
}
@pytest.mark.parametrize("case", MAXPOOLS)
def test_maxpool2d(case, small):
    shape, dtype, attrs, on_small = MAXPOOLS[case]
    if dtype == "i32":  # spread over the i32 range, the largest negative: the fill must lose to all of them
        x = np.random.default_rng(5).integers(-2**31 + 1, -2**30, shape).astype(np.int32)
    else:
        x = random(shape, dtype, seed=5)
    program, values, _ = run(graph_of([("MAXPOOL2D", ["x"], attrs)], {"x": (shape, dtype)}, out_dtype=dtype), {"x": x},
                             small if on_small else STANDARD)
    assert [k.op for k in program.kernels] == ["MAXPOOL2D"]
    want = maxpool_numpy(x, attrs["kernel"], attrs["stride"], attrs.get("padding", [[0, 0], [0, 0]]))
    assert values["t0"].dtype == numpy_dtype(dtype)
    np.testing.assert_array_equal(values["t0"].astype(np.float64), want)  # a maximum is exact


# id -> (x shape, attrs, on the small config)
AVGPOOLS = {
    "counting_pad_uneven": ((2, 17, 13, 23), {"kernel": [3, 3], "stride": [1, 2], "padding": [[1, 0], [2, 1]],
                                             "count_include_pad": True}, True),
    "over_the_inputs_uneven": ((2, 17, 13, 23), {"kernel": [3, 3], "stride": [2, 2], "padding": [[1, 1], [0, 1]],
                                                "count_include_pad": False}, True),
    "over_the_inputs_k2x4": ((2, 13, 17, 23), {"kernel": [2, 4], "stride": [1, 3], "padding": [[1, 1], [3, 0]]},
                             False),  # count_include_pad defaults to false
    "no_padding_k7": ((2, 7, 7, 23), {"kernel": [7, 7]}, False),  # a global average pool in one window
}


@pytest.mark.parametrize("case", AVGPOOLS)
def test_avgpool2d(case, small):
    shape, attrs, on_small = AVGPOOLS[case]
    x = random(shape, seed=6)
    program, values, _ = run(graph_of([("AVGPOOL2D", ["x"], attrs)], {"x": (shape, "f32")}), {"x": x},
                             small if on_small else STANDARD)
    # a mean over the inputs alone is the windows' sums divided by how many inputs each holds: one kernel
    [kernel] = program.kernels
    padding = attrs.get("padding", [[0, 0], [0, 0]])
    excludes = not attrs.get("count_include_pad", False) and any(map(any, padding))
    assert kernel.op == ("SUMPOOL2D" if excludes else "AVGPOOL2D")
    assert len(kernel.epilogue) == (1 if excludes else 0)
    want = avgpool_numpy(x, attrs["kernel"], attrs.get("stride", [1, 1]), padding,
                         attrs.get("count_include_pad", False))
    np.testing.assert_allclose(values["t0"], want, rtol=1e-5, atol=1e-6)


# ---- MobileNet's global average pool, as TOSA writes it ------------------------------------------


@pytest.mark.parametrize("scalar_shape", [(1,), (1, 1)])
@pytest.mark.parametrize("image", [(7, 7), (9, 11)])
def test_global_average_pool_chain(scalar_shape, image, small):
    """REDUCE_SUM over H (keepdims), REDUCE_SUM over W, RESHAPE to [N, C], MUL by the constant
    1 / (H * W): the mean of each image's channel."""
    n, c = 2, 23
    inputs = {"x": ((n, *image, c), "f32"), "scale": (scalar_shape, "f32")}
    g = graph_of([("REDUCE_SUM", ["x"], {"axes": [1], "keepdims": True}),
                  ("REDUCE_SUM", ["t0"], {"axes": [2], "keepdims": False}),
                  ("RESHAPE", ["t1"], {"new_shape": [n, c]}),
                  ("MUL", ["t2", "scale"], {})], inputs)
    g.tensors["scale"].role = "constant"
    g.constants["scale"] = np.full(scalar_shape, 1 / (image[0] * image[1]), "<f4").tobytes()
    x = random((n, *image, c), seed=7)
    program, values, _ = run(g, {"x": x}, small if image == (9, 11) else STANDARD)
    assert {"REDUCE_SUM", "MUL"} <= {k.op for k in program.kernels}
    want = np.array([[sum(float(x[b, i, j, ch]) for i in range(image[0]) for j in range(image[1]))
                      for ch in range(c)] for b in range(n)]) / (image[0] * image[1])
    assert values["t3"].shape == (n, c)
    np.testing.assert_allclose(values["t3"], want, rtol=1e-5, atol=1e-6)


# ---- the array's cycles against SCALE-Sim --------------------------------------------------------

# SCALE-Sim v3's compute cycles for this layer on a 32x32 systolic array, by dataflow: a
# 14x14x64 NHWC input, 3x3 filters, 64 of them, stride 1, no padding (12x12 outputs, so
# M = 144, N = 64, K = 576)
SCALE_SIM = {"os": 6379, "ws": 8567, "is": 14219}


@pytest.mark.parametrize("dataflow", SCALE_SIM)
def test_conv_cycles_agree_with_scale_sim(dataflow):
    config = str(CONFIGS / "ideal_32x32.json")
    inputs = {"x": ((1, 14, 14, 64), "f32"), "w": ((64, 3, 3, 64), "f32")}
    program, values, sim = run(graph_of([("CONV2D", ["x", "w"], {})], inputs), feeds_for(inputs), config,
                               dataflow=dataflow)
    [kernel] = program.kernels
    assert kernel.dataflow == {"os": "output_stationary", "ws": "weight_stationary",
                               "is": "input_stationary"}[dataflow]
    assert values["t0"].shape == (1, 12, 12, 64)
    assert abs(sim.cycles - SCALE_SIM[dataflow]) <= 0.01 * SCALE_SIM[dataflow], sim.cycles


# ---- external-memory traffic against the compulsory bytes ----------------------------------------

# name -> (input NHWC, filters): 3x3, stride 1, padding 1, f32, no bias
LAYERS = {"conv56": ((1, 56, 56, 64), 64), "conv28": ((1, 28, 28, 128), 128)}


@pytest.fixture(scope="module")
def two_layers_on_standard(tmp_path_factory) -> dict:
    """Both layers in one graph (kpu-sim's JSON, as test_frontend_ops writes it), through the two
    CLIs once: `kpu-kernel-compiler`, then `kpu-loader --json` on standard."""
    tmp = tmp_path_factory.mktemp("dram_bound")
    tensors, operators = {}, []
    for name, ((n, h, w, c), filters) in LAYERS.items():
        tensors[f"{name}_x"] = {"shape": [n, h, w, c], "dtype": "float32"}
        tensors[f"{name}_w"] = {"shape": [filters, 3, 3, c], "dtype": "float32"}
        tensors[f"{name}_y"] = {"shape": [n, h, w, filters], "dtype": "float32"}
        operators.append({"name": name, "type": "CONV2D", "inputs": [f"{name}_x", f"{name}_w"],
                          "outputs": [f"{name}_y"], "attributes": {"padding": [[1, 1], [1, 1]]}})
    src, obj = tmp / "layers.json", tmp / "layers.kpu"
    src.write_text(json.dumps({"tensors": tensors, "operators": operators}))
    compiled = run_cli("compiler", src, "-o", obj)
    assert compiled.returncode == 0, compiled.stderr
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def compulsory_bytes(name: str) -> int:
    """Input, weights and output, each once."""
    (n, h, w, c), filters = LAYERS[name]
    return 4 * (n * h * w * c + filters * 3 * 3 * c + n * h * w * filters)


def layer_dram(report: dict, name: str) -> int:
    (n, h, w, _), filters = LAYERS[name]
    [entry] = [k for k in report["kernels"].values() if k["shape"] == f"{n}x{h}x{w}x{filters}"]
    assert entry["op"] == "CONV2D"
    return entry["dram_bytes"]["read"] + entry["dram_bytes"]["write"]


def test_conv_dram_traffic_is_near_compulsory(two_layers_on_standard):
    """conv56's weights (144 KiB) sit in standard's L3 whole: the input crosses the link about
    once (its bands' halos the excess) and the output once."""
    report = two_layers_on_standard
    assert len(report["kernels"]) == 2
    run_total = report["dram_bytes"]["read"] + report["dram_bytes"]["write"]
    assert run_total == sum(layer_dram(report, name) for name in LAYERS)  # the kernels' add up to the run's
    moved = layer_dram(report, "conv56")
    assert compulsory_bytes("conv56") <= moved <= 1.3 * compulsory_bytes("conv56"), moved / compulsory_bytes("conv56")


# ---- the check catches a wrong kernel, however its sums round --------------------------------------


def test_check_fails_a_wrong_conv_kernel_behind_a_shrinking_epilogue():
    """A deep sum of large products is allowed its rounding (loader.run._sum_rounding), carried
    through the epilogue: behind a MUL by 1e-3 the allowance shrinks with the values, so rows of
    a result made zero still fail the kernel's check."""
    from loader.run import check_kernels

    inputs = {"x": ((1, 14, 14, 512), "f32"), "w": ((32, 3, 3, 512), "f32"), "s": ((1,), "f32")}
    feeds = {"x": random((1, 14, 14, 512), seed=1) * 50, "w": random((32, 3, 3, 512), seed=2),
             "s": np.array([1e-3], np.float32)}
    ops = [("CONV2D", ["x", "w"], {"padding": [[1, 1], [1, 1]]}), ("MUL", ["t0", "s"], {})]
    program, values, _ = run(graph_of(ops, inputs), feeds)
    assert program.kernels[0].epilogue == ["op1"]
    assert all(c.passed for c in check_kernels(program, values).values())
    values["t1"] = values["t1"].copy()
    values["t1"][0, :2] = 0  # two rows of the result lost
    assert not check_kernels(program, values)[program.kernels[0].name].passed


@pytest.mark.parametrize("op_type, attrs, fill, refusal", [
    ("CONV2D", {"padding": [[1, 1], [1, 1]]}, 0.5, "fills the padding of 'x' with 0.5; CONV2D pads with 0"),
    ("MAXPOOL2D", {"kernel": [3, 3], "padding": [[1, 1], [1, 1]]}, 0, "MAXPOOL2D pads with -inf"),
])
def test_validator_refuses_a_band_padded_with_another_value(op_type, attrs, fill, refusal):
    """A band's padding holds the op's own value (a zero border, or one a maximum never picks):
    an object whose moves write anything else there is refused, not run."""
    from dfx import ObjectFileError
    from test_objfile import resealed

    inputs = {"x": ((1, 9, 9, 8), "f32")} | ({"w": ((4, 3, 3, 8), "f32")} if op_type == "CONV2D" else {})
    program = compile_graph(graph_of([(op_type, list(inputs), attrs)], inputs), "test.dfg", load_target(STANDARD))
    obj = json.loads(dumps(program))
    for op in obj["body"]["kernels"][0]["body"]:
        if op["type"] == "DATA_MOVE" and "fill" in op:
            op["fill"] = fill
    with pytest.raises(ObjectFileError, match=refusal):
        loads(resealed(obj))


def test_conv_takes_narrow_channel_tiles_where_only_those_fit(tiny):
    """On 1 KB L1 buffers a 4x4x17 window's weights fit only in tiles of few output channels
    and chunks of few input channels, below the array's columns and MIN_CHUNK: those are taken
    rather than refusing the layer."""
    inputs = {"x": ((1, 7, 14, 17), "f32"), "w": ((16, 4, 4, 17), "f32")}
    feeds = feeds_for(inputs)
    program, values, _ = run(graph_of([("CONV2D", ["x", "w"], {})], inputs), feeds, tiny)
    [kernel] = program.kernels
    assert kernel.tiling["Tn"] < 16 or kernel.tiling["Tc"] < 4, kernel.tiling
    want = conv_numpy(feeds["x"], feeds["w"], None, [1, 1], [[0, 0], [0, 0]], [1, 1])
    np.testing.assert_allclose(values["t0"], want, rtol=1e-5, atol=1e-4)
