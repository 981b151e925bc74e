"""What JAX and Flax write, recognised (issue 21): Flax's LayerNorm (its one-pass variance too) as
one LAYERNORM, Flax's RMSNorm as one RMSNORM, `jax.nn.softmax` with its -inf guard as one SOFTMAX,
and an inference BatchNorm after a convolution folded into it: into its weights where the
statistics are constants, into its bias and epilogue where they are ENTRY parameters. Each in the
module JAX lowers (`*.lowered.hlo`) and the one XLA's CPU pipeline leaves (`*.compiled.hlo`, its
fusions inlined), as JAX printed them into tests/data/hlo_recognise/ (debug tables and metadata
trimmed), compiled, bound and executed in-process: the kernels counted, the values against numpy
in float64 (the folded convolution's against JAX's own output). Then the chain LLaMA-style models
write in torch, as torch exports it to ONNX, the rules' edges on small graphs, and the kernels of
JAX's transformer blocks (examples/jax)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from conftest import ROOT
from test_frontend_hlo import compile_hlo, run_hlo
from test_frontend_onnx import kpu_run, model
from test_long_rows import run as run_on
from test_passes import Builder, recognised, types
from test_vector_kernels import graph_of

DATA = Path(__file__).parent / "data" / "hlo_recognise"
JAX = ROOT / "examples" / "jax"
FORMS = ["lowered", "compiled"]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def ops_of(program) -> list[str]:
    """The op of each kernel that computes (a RESHAPE names its operand's bytes)."""
    return [k.op for k in program.kernels if k.op != "RESHAPE"]


def assert_near(got: np.ndarray, want: np.ndarray, of_peak: float = 1e-5) -> None:
    """Within `of_peak` of the largest magnitude of `want` everywhere (the issue's measure)."""
    assert got.shape == want.shape
    assert np.abs(got.astype(np.float64) - want).max() <= of_peak * np.abs(want).max()


def run_file(name: str, feeds: dict[str, np.ndarray]):
    """(the program, its one output) for tests/data/hlo_recognise/<name>.hlo, fed `feeds`."""
    text = (DATA / f"{name}.hlo").read_text()
    [y] = run_hlo(text, feeds).values()
    return compile_hlo(text), y


# ---- Flax LayerNorm and RMSNorm, jax.nn.softmax --------------------------------------------------


def layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


@pytest.mark.parametrize("name", ["layernorm.lowered", "layernorm.compiled", "layernorm_two_pass.compiled"])
def test_flax_layernorm_is_one_layernorm(name):
    x, scale, bias = rng(1).uniform(-2, 2, (4, 16)), rng(2).uniform(0.5, 1.5, 16), rng(3).uniform(-1, 1, 16)
    x[0] += 300  # a mean that dwarfs the spread: Flax's one-pass variance cancels there, LAYERNORM does not
    feeds = {"x.1": x, "v__params____scale__.1": scale, "v__params____bias__.1": bias}
    program, y = run_file(name, {k: v.astype(np.float32) for k, v in feeds.items()})
    assert [k.op for k in program.kernels] == ["LAYERNORM"]
    [op] = program.graph.ops
    assert op.inputs == ["x.1", "v__params____scale__.1", "v__params____bias__.1"]
    assert op.attrs == {"axis": 1, "epsilon": pytest.approx(1e-6)}
    assert_near(y, layer_norm(x.astype(np.float32), 1e-6) * scale.astype(np.float32) + bias.astype(np.float32))


@pytest.mark.parametrize("form", FORMS)
def test_flax_rmsnorm_is_one_rmsnorm(form):
    x, scale = rng(4).uniform(-2, 2, (4, 16)).astype(np.float32), rng(5).uniform(0.5, 1.5, 16).astype(np.float32)
    program, y = run_file(f"rmsnorm.{form}", {"x.1": x, "v__params____scale__.1": scale})
    assert [k.op for k in program.kernels] == ["RMSNORM"]
    [op] = program.graph.ops
    assert op.inputs == ["x.1", "v__params____scale__.1"] and op.attrs == {"axis": 1, "epsilon": pytest.approx(1e-6)}
    x64 = x.astype(np.float64)
    assert_near(y, x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * scale)


@pytest.mark.parametrize("form", FORMS)
def test_jax_softmax_with_its_guard_is_one_softmax(form):
    x = rng(6).uniform(-4, 4, (4, 16)).astype(np.float32)
    x[1, 3] = 1000.0  # exp of it alone overflows
    program, y = run_file(f"softmax.{form}", {"x.1": x})
    assert [k.op for k in program.kernels] == ["SOFTMAX"] and program.graph.ops[0].attrs == {"axis": 1}
    e = np.exp(x - x.max(-1, keepdims=True).astype(np.float64))
    assert_near(y, e / e.sum(-1, keepdims=True))


# ---- BatchNorm after a convolution ---------------------------------------------------------------


def conv_same(x: np.ndarray, w_hwio: np.ndarray) -> np.ndarray:
    """NHWC x HWIO, stride 1, zero padding that keeps the size, in float64."""
    kh, kw = w_hwio.shape[:2]
    padded = np.pad(x.astype(np.float64), [(0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(1, 2))  # N, H, W, C, kh, kw
    return np.einsum("nhwcij,ijco->nhwo", windows, w_hwio.astype(np.float64))


STATS = "v__batch_stats____BatchNorm_0____{}__.1"
PARAMS = "v__params____{}__.1"


@pytest.mark.parametrize("form", FORMS)
def test_batchnorm_of_parameters_is_the_convolutions_bias_and_epilogue(form):
    r = rng(7)
    x, w = r.uniform(-1, 1, (1, 6, 6, 3)), r.uniform(-1, 1, (3, 3, 3, 4))
    b, mean, beta = (r.uniform(-1, 1, 4) for _ in range(3))
    var, scale = r.uniform(0.5, 1.5, 4), r.uniform(0.5, 1.5, 4)
    feeds = {"x.1": x, PARAMS.format("Conv_0____kernel"): w, PARAMS.format("Conv_0____bias"): b,
             STATS.format("mean"): mean, STATS.format("var"): var, PARAMS.format("BatchNorm_0____scale"): scale,
             PARAMS.format("BatchNorm_0____bias"): beta}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    program, y = run_file(f"conv_batchnorm.{form}", feeds)
    [conv] = [k for k in program.kernels if k.op == "CONV2D"]
    by_name = {op.name: op.op_type for op in program.graph.ops}
    assert [by_name[name] for name in conv.epilogue] == ["MUL", "ADD", "MAXIMUM"]  # scale, shift, relu
    # the rest computes the per-channel scale and bias, 4 numbers each
    assert all(program.graph.tensors[k.outputs[0]].shape in ((4,), (1, 1, 1, 4)) for k in program.kernels
               if k is not conv and k.op != "RESHAPE")
    f = {k: v.astype(np.float64) for k, v in feeds.items()}
    normed = (conv_same(f["x.1"], w) + b - mean) / np.sqrt(var + 1e-5) * scale + beta
    assert_near(y, np.maximum(normed, 0))


@pytest.mark.parametrize("form", FORMS)
def test_batchnorm_of_constants_folds_into_the_weights(form):
    jax = np.load(DATA / "conv_batchnorm_constants.npz")  # the input and JAX's output
    program, y = run_file(f"conv_batchnorm_constants.{form}", {"x.1": jax["x"]})
    [conv] = program.kernels
    [folded, relu] = program.graph.ops
    assert (conv.op, conv.epilogue, relu.op_type) == ("CONV2D", [relu.name], "MAXIMUM")
    assert folded.inputs[1] in program.graph.constants  # the weights, scaled
    assert_near(y, jax["y"])


# ---- RMSNorm as torch exports it ----------------------------------------------------------------


@pytest.mark.parametrize("reciprocal", ["Div", "Reciprocal"])
def test_llama_rmsnorm_exported_from_torch_is_one_rmsnorm(reciprocal):
    """x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w: torch.onnx writes rsqrt as
    1 / Sqrt (TorchScript) or Reciprocal(Sqrt) (dynamo)."""
    x, w = rng(8).uniform(-2, 2, (2, 5, 16)).astype(np.float32), rng(9).uniform(0.5, 1.5, 16).astype(np.float32)
    inverse = (helper.make_node("Div", ["one", "root"], ["inv"]) if reciprocal == "Div"
               else helper.make_node("Reciprocal", ["root"], ["inv"]))
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
             helper.make_node("Sqrt", ["ms_eps"], ["root"]), inverse,
             helper.make_node("Mul", ["x", "inv"], ["normed"]), helper.make_node("Mul", ["normed", "w"], ["y"])]
    constants = {"two": np.float32(2), "axes": np.int64([-1]), "eps": np.float32(1e-6), "one": np.float32(1), "w": w}
    values, program, _ = kpu_run(model(nodes, {"x": x}, ["y"], constants, opset=18), {"x": x})
    assert ops_of(program) == ["RMSNORM"]
    x64 = x.astype(np.float64)
    assert_near(values["y"], x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w)


def test_long_rmsnorm_rows_split_into_kernels_that_lower(tiny):
    x, scale = rng(10).uniform(-2, 2, (4, 3001)).astype(np.float32), rng(11).uniform(0.5, 1.5, 3001).astype(np.float32)
    g = graph_of([("RMSNORM", ["x", "scale"], {"epsilon": 1e-3})], {"x": ((4, 3001), "f32"), "scale": ((3001,), "f32")})
    program, values, _ = run_on(g, {"x": x, "scale": scale}, tiny)
    assert "RMSNORM" not in {k.op for k in program.kernels}
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(values["t0"], x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-3) * scale,
                               rtol=1e-4, atol=1e-5)


# ---- the rules' edges --------------------------------------------------------------------------


def flax_layer_norm(b: Builder, x: str, zero: float) -> str:
    """(x - mean) * rsqrt(max(mean(x^2) - mean^2, zero) + eps), Flax's one-pass variance."""
    mean = b.op("REDUCE_MEAN", x, axes=[1])
    var = b.op("SUB", b.op("REDUCE_MEAN", b.op("MUL", x, x), axes=[1]), b.op("MUL", mean, mean))
    clamped = b.op("MAXIMUM", var, b.const("zero", zero))
    return b.op("MUL", b.op("SUB", x, mean), b.op("RSQRT", b.op("ADD", clamped, b.const("eps", 1e-3))))


def test_the_variance_clamp_must_be_at_zero():
    b = Builder()
    after, _ = recognised(b.output(flax_layer_norm(b, b.input("x", (3, 8)), 0.0)))
    assert types(after) == ["LAYERNORM"] and after.ops[0].attrs == {"axis": 1, "epsilon": pytest.approx(1e-3)}
    b = Builder()
    assert "LAYERNORM" not in types(recognised(b.output(flax_layer_norm(b, b.input("x", (3, 8)), 0.5)))[0])


@pytest.mark.parametrize("scaled_first", [True, False])
def test_xla_layernorm_needs_one_inverse_std(scaled_first):
    # x * s1 + (bias - s2 * mean) is a layer norm only where s1 and s2 are one value: here one of
    # them leaves the scale out, so the chain stays (recognised checks the values)
    b = Builder()
    x = b.input("x", (3, 8))
    mean = b.op("REDUCE_MEAN", x, axes=[1])
    centred = b.op("SUB", x, mean)
    inv_std = b.op("RSQRT", b.op("ADD", b.op("REDUCE_MEAN", b.op("MUL", centred, centred), axes=[1]),
                                 b.const("eps", 1e-3)))
    scaled = b.op("MUL", inv_std, b.const("scale", 3.0, (8,)))
    first, second = (scaled, inv_std) if scaled_first else (inv_std, scaled)
    y = b.op("ADD", b.op("MUL", x, first), b.op("SUB", b.const("bias", 0.5, (8,)), b.op("MUL", second, mean)))
    assert "LAYERNORM" not in types(recognised(b.output(y))[0])


def rms_chain(b: Builder, x: str, axes: list[int], keepdims: bool, eps: float | None) -> str:
    mean_square = b.op("REDUCE_MEAN", b.op("MUL", x, x), axes=axes, keepdims=keepdims)
    return b.op("MUL", x, b.op("RSQRT", b.op("ADD", mean_square, b.const("eps", eps))))


def test_rmsnorm_rule_edges():
    b = Builder()
    after, _ = recognised(b.output(rms_chain(b, b.input("x", (3, 8)), [1], True, 1e-3)))
    assert types(after) == ["RMSNORM"]
    b = Builder()  # over a leading axis: no RMSNORM (it normalizes axis..last)
    assert "RMSNORM" not in types(recognised(b.output(rms_chain(b, b.input("x", (8, 3)), [0], True, 1e-3)))[0])
    b = Builder()  # the row's value without its axis broadcasts along the wrong one
    assert "RMSNORM" not in types(recognised(b.output(rms_chain(b, b.input("x", (4, 4)), [1], False, 1e-3)))[0])
    b = Builder()  # an epsilon of unknown value: stays, said once
    after, warnings = recognised(b.output(rms_chain(b, b.input("x", (3, 8)), [1], True, None)))
    assert "RMSNORM" not in types(after)
    assert [w for w in warnings if "RMS norm" in w] == \
        ["test:4: an RMS norm chain is left as ops: its epsilon 'eps' is not a constant of known value"]


def test_xla_spellings():
    b = Builder()  # the same MUL twice with equal constants under two names, as XLA's fusions repeat it
    x = b.input("x", (3, 4))
    twice = b.op("ADD", b.op("MUL", x, b.const("c1", 2.0)), b.op("MUL", x, b.const("c2", 2.0)))
    assert types(recognised(b.output(twice))[0]) == ["MUL", "ADD"]
    b = Builder()
    x = b.input("x", (3, 4))
    twice = b.op("ADD", b.op("MUL", x, b.const("c1", 2.0)), b.op("MUL", x, b.const("c2", 3.0)))
    assert types(recognised(b.output(twice))[0]) == ["MUL", "MUL", "ADD"]
    b = Builder()  # max(y, -inf) and min(y, inf) are y; max(y, 0) is a relu
    x = b.input("x", (3, 4))
    y = b.op("MINIMUM", b.op("MAXIMUM", b.op("EXP", x), b.const("low", -np.inf)), b.const("high", np.inf))
    assert types(recognised(b.output(b.op("MAXIMUM", y, b.const("zero", 0.0))))[0]) == ["EXP", "MAXIMUM"]
    b = Builder()  # 1 / y is RECIPROCAL(y); 2 / y is not
    x = b.input("x", (3, 4))
    after, _ = recognised(b.output(b.op("DIV", b.const("one", 1.0), x), b.op("DIV", b.const("two", 2.0), x)))
    assert types(after) == ["RECIPROCAL", "DIV"]


# ---- JAX's transformer blocks ------------------------------------------------------------------


def test_flax_encoder_block_has_its_row_ops_whole():
    program = compile_hlo((JAX / "encoder_block.lowered.hlo").read_text())
    ops = ops_of(program)
    assert ops.count("LAYERNORM") == 2 and ops.count("SOFTMAX") == 1
    assert not {"REDUCE_MAX", "REDUCE_SUM", "REDUCE_MEAN", "MAXIMUM", "RSQRT"} & set(ops), ops
    assert len(ops) <= 16, ops  # the bound, RESHAPE views aside


def test_xla_repeating_the_causal_mask_keeps_one_softmax():
    # after optimization the masking SELECT is computed again in the fusion of the subtraction,
    # with its constants under new names: one softmax all the same
    ops = ops_of(compile_hlo((JAX / "gpt_block.compiled.hlo").read_text()))
    assert ops.count("SOFTMAX") == 1 and not {"REDUCE_MAX", "REDUCE_SUM", "RECIPROCAL"} & set(ops), ops


def test_softmax_over_the_leading_axis_with_its_rows_dropped_is_one_softmax():
    # jax.nn.softmax(x, axis=0): the row values keep [5, 4], which broadcast against x as [1, 5, 4]
    b = Builder()
    x = b.input("x", (3, 5, 4))
    e = b.op("EXP", b.op("SUB", x, b.op("REDUCE_MAX", x, axes=[0], keepdims=False)))
    after, _ = recognised(b.output(b.op("DIV", e, b.op("REDUCE_SUM", e, axes=[0], keepdims=False))))
    assert types(after) == ["SOFTMAX"] and after.ops[0].attrs["axis"] == 0
    # over the middle axis a dropped [3, 4] would not broadcast against x: nothing to recognise
    b = Builder()
    x = b.input("x", (3, 5, 4))
    e = b.op("EXP", x)
    total = b.op("RESHAPE", b.op("REDUCE_SUM", e, axes=[1], keepdims=False), new_shape=[3, 1, 4])
    assert types(recognised(b.output(b.op("DIV", e, total)))[0]) == ["SOFTMAX"]
