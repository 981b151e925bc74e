"""Views do not split kernels, and weights are read in the order they come in: JAX's Dense and
DenseGeneral (a dot, a reshape, then the bias and activation: one kernel), and Flax
convolutions whose HWIO weights are parameters (no TRANSPOSE kernel: the weight moves permute
each tile). The HLO is as JAX printed it (`jax.jit(model.apply).lower(variables, x)`); every
program is compiled, bound and executed in-process, every kernel and output passes the loader's
check, and the outputs match numpy computed here."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from conftest import CONFIGS
from dfx import DataMove, ObjectFileError, dumps, loads
from dfx.objfile import _digest
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends.hlo import parse_hlo
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.inputs import program_inputs
from loader.report import dram_bytes
from loader.run import check_kernels, check_outputs
from test_vector_kernels import graph_of

STANDARD, MINIMAL = str(CONFIGS / "standard.json"), str(CONFIGS / "minimal.json")


def run(graph, feeds: dict[str, np.ndarray], config: str = STANDARD):
    """The program compiled for `config` and read back (the validator sees it), and every
    tensor's value, after every kernel and output passed the check."""
    program = loads(dumps(compile_graph(graph, "t.hlo", load_target(config))))
    machine = load_machine(config)
    values = execute(program, bind_program(program, machine, "test", bind_greedy),
                     program_inputs(program, feeds, seed=0))
    failed = [n for n, c in {**check_kernels(program, values), **check_outputs(program, values)}.items()
              if not c.passed]
    assert not failed, failed
    return program, values


def run_hlo(text: str, feeds: dict[str, np.ndarray]):
    graph, warnings = parse_hlo("t.hlo", text)
    return run(infer_shapes(graph, warnings), feeds)


def computing(program) -> list[tuple[str, ...]]:
    """Each kernel that is no view: its anchor's op type and its epilogue's."""
    types = {op.name: op.op_type for op in program.graph.ops}
    return [(k.op, *(types[e] for e in k.epilogue)) for k in program.kernels
            if not any(isinstance(o, DataMove) and o.move_type == "VIEW" for o in k.body)]


def rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def conv_nhwc(x: np.ndarray, w_hwio: np.ndarray, stride, padding, groups: int = 1) -> np.ndarray:
    """y[n, i, j, o] = the sum over the taps and o's group's input channels of the padded
    x[n, i * stride + tap, ...] * w[tap, channel, o], in f64."""
    x = np.pad(x.astype(np.float64), [(0, 0), *padding, (0, 0)])
    kh, kw, per_group, outputs = w_hwio.shape
    oh, ow = (x.shape[1] - kh) // stride[0] + 1, (x.shape[2] - kw) // stride[1] + 1
    y = np.zeros((x.shape[0], oh, ow, outputs))
    for o in range(outputs):
        c = o // (outputs // groups) * per_group
        for i in range(oh):
            for j in range(ow):
                window = x[:, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw, c:c + per_group]
                y[:, i, j, o] = (window * w_hwio[..., o]).sum(axis=(1, 2, 3))
    return y


# ---- views do not split kernels ----------------------------------------------------------------

DENSE_GELU = """HloModule jit_apply, entry_computation_layout={(f32[5]{0}, f32[4,5]{1,0}, f32[2,3,4]{2,1,0})->f32[2,3,5]{2,1,0}}

ENTRY main.1 {
  args_0_.1 = f32[2,3,4]{2,1,0} parameter(2)
  variables__params____Dense_0____kernel__.1 = f32[4,5]{1,0} parameter(1)
  dot_general.1 = f32[2,3,5]{2,1,0} dot(args_0_.1, variables__params____Dense_0____kernel__.1), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  variables__params____Dense_0____bias__.1 = f32[5]{0} parameter(0)
  reshape.1 = f32[1,1,5]{2,1,0} reshape(variables__params____Dense_0____bias__.1)
  add.6 = f32[1,1,5]{2,1,0} broadcast(reshape.1), dimensions={0,1,2}
  add.7 = f32[5]{0} reshape(add.6)
  add.8 = f32[2,3,5]{2,1,0} broadcast(add.7), dimensions={2}
  add.9 = f32[2,3,5]{2,1,0} add(dot_general.1, add.8)
  integer_pow.2 = f32[2,3,5]{2,1,0} multiply(add.9, add.9)
  integer_pow.3 = f32[2,3,5]{2,1,0} multiply(integer_pow.2, add.9)
  constant.7 = f32[] constant(0.044715)
  broadcast.7 = f32[2,3,5]{2,1,0} broadcast(constant.7), dimensions={}
  mul.4 = f32[2,3,5]{2,1,0} multiply(integer_pow.3, broadcast.7)
  add.10 = f32[2,3,5]{2,1,0} add(add.9, mul.4)
  constant.6 = f32[] constant(0.797884583)
  broadcast.6 = f32[2,3,5]{2,1,0} broadcast(constant.6), dimensions={}
  mul.5 = f32[2,3,5]{2,1,0} multiply(add.10, broadcast.6)
  tanh.1 = f32[2,3,5]{2,1,0} tanh(mul.5)
  constant.5 = f32[] constant(1)
  broadcast.5 = f32[2,3,5]{2,1,0} broadcast(constant.5), dimensions={}
  add.11 = f32[2,3,5]{2,1,0} add(tanh.1, broadcast.5)
  constant.4 = f32[] constant(0.5)
  broadcast.4 = f32[2,3,5]{2,1,0} broadcast(constant.4), dimensions={}
  mul.6 = f32[2,3,5]{2,1,0} multiply(add.11, broadcast.4)
  ROOT mul.7 = f32[2,3,5]{2,1,0} multiply(add.9, mul.6)
}
"""

# nn.DenseGeneral((2, 3)): an attention projection to [B, S, heads, head size], its bias per head
PROJECTION = """HloModule jit_apply, entry_computation_layout={(f32[2,3]{1,0}, f32[4,2,3]{2,1,0}, f32[2,3,4]{2,1,0})->f32[2,3,2,3]{3,2,1,0}}

ENTRY main.1 {
  args_0_.1 = f32[2,3,4]{2,1,0} parameter(2)
  variables__params____DenseGeneral_0____kernel__.1 = f32[4,2,3]{2,1,0} parameter(1)
  dot_general.1 = f32[2,3,2,3]{3,2,1,0} dot(args_0_.1, variables__params____DenseGeneral_0____kernel__.1), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  variables__params____DenseGeneral_0____bias__.1 = f32[2,3]{1,0} parameter(0)
  reshape.1 = f32[1,1,2,3]{3,2,1,0} reshape(variables__params____DenseGeneral_0____bias__.1)
  add.4 = f32[1,1,2,3]{3,2,1,0} broadcast(reshape.1), dimensions={0,1,2,3}
  add.5 = f32[2,3]{1,0} reshape(add.4)
  add.6 = f32[2,3,2,3]{3,2,1,0} broadcast(add.5), dimensions={2,3}
  ROOT add.7 = f32[2,3,2,3]{3,2,1,0} add(dot_general.1, add.6)
}
"""

# nn.Dense(4)(x) + x
RESIDUAL = """HloModule jit_apply, entry_computation_layout={(f32[4]{0}, f32[4,4]{1,0}, f32[2,3,4]{2,1,0})->f32[2,3,4]{2,1,0}}

ENTRY main.1 {
  args_0_.1 = f32[2,3,4]{2,1,0} parameter(2)
  variables__params____Dense_0____kernel__.1 = f32[4,4]{1,0} parameter(1)
  dot_general.1 = f32[2,3,4]{2,1,0} dot(args_0_.1, variables__params____Dense_0____kernel__.1), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  variables__params____Dense_0____bias__.1 = f32[4]{0} parameter(0)
  reshape.1 = f32[1,1,4]{2,1,0} reshape(variables__params____Dense_0____bias__.1)
  add.5 = f32[1,1,4]{2,1,0} broadcast(reshape.1), dimensions={0,1,2}
  add.6 = f32[4]{0} reshape(add.5)
  add.7 = f32[2,3,4]{2,1,0} broadcast(add.6), dimensions={2}
  add.8 = f32[2,3,4]{2,1,0} add(dot_general.1, add.7)
  ROOT add.9 = f32[2,3,4]{2,1,0} add(add.8, args_0_.1)
}
"""


def dense_feeds(kernel: tuple[int, ...], bias: tuple[int, ...], name: str = "Dense_0") -> dict[str, np.ndarray]:
    return {"args_0_.1": rand(2, 3, 4, seed=1), f"variables__params____{name}____kernel__.1": rand(*kernel, seed=2),
            f"variables__params____{name}____bias__.1": rand(*bias, seed=3)}


def test_a_dense_bias_and_gelu_read_through_the_reshape_into_the_matmul_kernel():
    feeds = dense_feeds((4, 5), (5,))
    program, values = run_hlo(DENSE_GELU, feeds)
    assert computing(program) == [("MATMUL", "ADD", "GELU")]  # before: MATMUL, then ADD + GELU
    x, w, b = feeds.values()
    np.testing.assert_allclose(values["mul.7"], gelu_tanh(x.astype(np.float64) @ w + b), rtol=1e-5, atol=1e-6)


def test_a_projection_to_heads_takes_its_bias_per_head_as_a_bias_of_the_matmul():
    feeds = dense_feeds((4, 2, 3), (2, 3), "DenseGeneral_0")
    program, values = run_hlo(PROJECTION, feeds)
    assert computing(program) == [("MATMUL", "ADD")]
    x, w, b = feeds.values()
    np.testing.assert_allclose(values["add.7"], np.einsum("bsd,dhk->bshk", x.astype(np.float64), w) + b,
                               rtol=1e-5, atol=1e-6)


def test_a_residual_of_the_dense_input_is_added_after_the_matmul_kernel():
    """x + Dense(x): the bias joins through the reshape; the residual is the matmul's own operand,
    which it holds by chunks of the summed dim, so the add is a kernel of its own (fused, a
    Dense(768) of 128 rows made a kernel its validator refused)."""
    feeds = dense_feeds((4, 4), (4,))
    program, values = run_hlo(RESIDUAL, feeds)
    assert computing(program) == [("MATMUL", "ADD"), ("ADD",)]
    x, w, b = feeds.values()
    np.testing.assert_allclose(values["add.9"], x.astype(np.float64) @ w + b + x, rtol=1e-5, atol=1e-6)


# the result's rows regrouped across its columns: a bias along the new last dim runs along part of
# a group, so it is no bias of the matmul's result and the ADD stays a kernel of its own
REGROUPED_ACROSS = """HloModule regrouped
ENTRY main {
  x = f32[6,3] parameter(0)
  w = f32[3,4] parameter(1)
  b = f32[6] parameter(2)
  d = f32[6,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  r = f32[4,6] reshape(d)
  bb = f32[4,6] broadcast(b), dimensions={1}
  ROOT y = f32[4,6] add(r, bb)
}
"""


def test_a_reshape_that_moves_the_bias_off_its_dim_is_not_read_through():
    feeds = {"x": rand(6, 3, seed=4), "w": rand(3, 4, seed=5), "b": rand(6, seed=6)}
    program, values = run_hlo(REGROUPED_ACROSS, feeds)
    assert computing(program) == [("MATMUL",), ("ADD",)]
    x, w, b = feeds.values()
    np.testing.assert_allclose(values["y"], (x.astype(np.float64) @ w).reshape(4, 6) + b, rtol=1e-5, atol=1e-6)


# ---- one weight matrix for every image position: a product of more rows ------------------------

# a Swin / ConvNeXt MLP as torch exports it: Linear layers on a [1, H, W, C] image, a GELU
# between, the block's input added back
IMAGE_MLP = [("MATMUL", ["x", "w1"], {}), ("ADD", ["t0", "b1"], {}), ("GELU", ["t1"], {}),
             ("MATMUL", ["t2", "w2"], {}), ("ADD", ["t3", "b2"], {}), ("ADD", ["t4", "x"], {})]


def image_mlp_feeds(hw: int, c: int, hidden: int) -> dict[str, np.ndarray]:
    shapes = {"x": (1, hw, hw, c), "w1": (c, hidden), "b1": (hidden,), "w2": (hidden, c), "b2": (c,)}
    return {name: rand(*shape, seed=i) for i, (name, shape) in enumerate(shapes.items())}


def erf_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("hw, c, hidden, config", [(7, 64, 256, STANDARD), (5, 64, 256, MINIMAL),
                                                   (4, 256, 640, STANDARD)])  # weights larger than L3
def test_linear_layers_on_an_image_read_their_weights_once_and_keep_their_epilogues(hw, c, hidden, config):
    """Tiled by image row, each row a product of its own, the weights crossed external memory once
    a row (7 times on the 7 x 7 image); as one product of hw * hw rows, once."""
    feeds = image_mlp_feeds(hw, c, hidden)
    graph = graph_of(IMAGE_MLP, {n: (v.shape, "f32") for n, v in feeds.items()})
    program, values = run(graph, feeds, config)
    assert computing(program) == [("MATMUL", "ADD", "GELU"), ("MATMUL", "ADD", "ADD")]
    machine = load_machine(config)
    sim = simulate(program, machine, bind_program(program, machine, "test", bind_greedy))
    # every tensor crosses at most once each way: the inputs, the hidden layer out and back, the result
    once = sum(v.nbytes for v in feeds.values()) + 2 * hw * hw * hidden * 4 + hw * hw * c * 4
    assert sum(dram_bytes(sim).values()) <= once
    x, w1, b1, w2, b2 = (v.astype(np.float64) for v in feeds.values())
    want = erf_gelu(x @ w1 + b1) @ w2 + b2 + x
    np.testing.assert_allclose(values["t5"], want, rtol=1e-4, atol=1e-4)  # sums of up to 640 f32 products


@pytest.mark.parametrize("b_shape, rows", [((2, 16, 8), None), ((16, 8), 6), ((1, 16, 8), 6)])
def test_a_batch_of_products_stays_one_and_a_shared_b_makes_one_of_more_rows(b_shape, rows):
    """B with a batch of its own: each element's product its own. One B for the whole batch (a
    batch dim of 1 too): A viewed as [6, 16] (the batch's rows), the result viewed back as [2, 3, 8]."""
    feeds = {"a": rand(2, 3, 16, seed=1), "b": rand(*b_shape, seed=2)}
    graph = graph_of([("MATMUL", ["a", "b"], {})], {n: (v.shape, "f32") for n, v in feeds.items()})
    program, values = run(graph, feeds)
    [matmul] = [op for op in program.graph.ops if op.op_type == "MATMUL"]
    seen = [program.graph.tensors[t].shape for t in matmul.inputs]
    assert seen == ([(2, 3, 16), b_shape] if rows is None else [(rows, 16), (16, 8)])
    np.testing.assert_allclose(values["t0"], feeds["a"].astype(np.float64) @ feeds["b"], rtol=1e-5, atol=1e-5)


def test_a_batch_of_small_products_stays_a_batch_where_one_product_would_be_one_tile():
    """[2, 64, 64] @ [64, 128]: the two elements on the two compute tiles at once; as one product
    of 128 rows, one tile on one compute tile (6,108 simulated cycles against 10,080)."""
    feeds = {"a": rand(2, 64, 64, seed=1), "b": rand(64, 128, seed=2)}
    program, values = run(graph_of([("MATMUL", ["a", "b"], {})], {n: (v.shape, "f32") for n, v in feeds.items()}),
                          feeds)
    [matmul] = [op for op in program.graph.ops if op.op_type == "MATMUL"]
    assert program.graph.tensors[matmul.inputs[0]].shape == (2, 64, 64)
    np.testing.assert_allclose(values["t0"], feeds["a"].astype(np.float64) @ feeds["b"], rtol=1e-5, atol=1e-5)


def test_a_position_embedding_keeps_the_batch_and_its_add_in_the_matmul_kernel():
    """An operand along the batch's positions but not its elements ([1, 49, 64] beside a [4, 49, 64]
    result) has no view along the rows of one product: the product stays a batch, the ADD its epilogue."""
    feeds = {"x": rand(4, 49, 256, seed=1), "w": rand(256, 64, seed=2), "p": rand(1, 49, 64, seed=3)}
    graph = graph_of([("MATMUL", ["x", "w"], {}), ("ADD", ["t0", "p"], {})],
                     {n: (v.shape, "f32") for n, v in feeds.items()})
    program, values = run(graph, feeds)
    assert computing(program) == [("MATMUL", "ADD")]
    x, w, p = (v.astype(np.float64) for v in feeds.values())
    np.testing.assert_allclose(values["t1"], x @ w + p, rtol=1e-5, atol=1e-5)


# ---- weights read in the order they come in ---------------------------------------------------

# nn.Conv(6, (3, 2), strides=(2, 1), padding=((1, 1), (0, 1))) then relu
CONV = """HloModule jit_apply, entry_computation_layout={(f32[6]{0}, f32[3,2,3,6]{3,2,1,0}, f32[1,7,5,3]{3,2,1,0})->f32[1,4,5,6]{3,2,1,0}}

relu.1 {
  Arg_0.1 = f32[1,4,5,6]{3,2,1,0} parameter(0)
  constant.1 = f32[] constant(0)
  max.2 = f32[1,4,5,6]{3,2,1,0} broadcast(constant.1), dimensions={}
  ROOT max.3 = f32[1,4,5,6]{3,2,1,0} maximum(Arg_0.1, max.2)
}

ENTRY main.2 {
  args_0_.1 = f32[1,7,5,3]{3,2,1,0} parameter(2)
  variables__params____Conv_0____kernel__.1 = f32[3,2,3,6]{3,2,1,0} parameter(1)
  conv_general_dilated.1 = f32[1,4,5,6]{3,2,1,0} convolution(args_0_.1, variables__params____Conv_0____kernel__.1), window={size=3x2 stride=2x1 pad=1_1x0_1}, dim_labels=b01f_01io->b01f
  variables__params____Conv_0____bias__.1 = f32[6]{0} parameter(0)
  reshape.1 = f32[1,1,1,6]{3,2,1,0} reshape(variables__params____Conv_0____bias__.1)
  add.4 = f32[1,1,1,6]{3,2,1,0} broadcast(reshape.1), dimensions={0,1,2,3}
  add.5 = f32[1,6]{1,0} reshape(add.4)
  add.6 = f32[1,4,5,6]{3,2,1,0} broadcast(add.5), dimensions={0,3}
  add.7 = f32[1,4,5,6]{3,2,1,0} add(conv_general_dilated.1, add.6)
  ROOT jit_relu_.1 = f32[1,4,5,6]{3,2,1,0} call(add.7), to_apply=relu.1
}
"""

CONV_FEEDS = {"args_0_.1": rand(1, 7, 5, 3, seed=7), "variables__params____Conv_0____kernel__.1": rand(3, 2, 3, 6, seed=8),
              "variables__params____Conv_0____bias__.1": rand(6, seed=9)}


def test_a_conv_reads_its_hwio_parameter_weights_through_a_permuting_move():
    program, values = run_hlo(CONV, CONV_FEEDS)
    # before: a TRANSPOSE kernel of the weights, the conv, then ADD + MAXIMUM
    assert computing(program) == [("CONV2D", "ADD", "MAXIMUM")]
    [conv] = [op for op in program.graph.ops if op.op_type == "CONV2D"]
    assert conv.attrs["weight_layout"] == "HWIO" and conv.inputs[1] == "variables__params____Conv_0____kernel__.1"
    [permuting] = [op for op in program.kernels[-1].body if isinstance(op, DataMove) and op.permutation]
    assert (permuting.source.level, permuting.destination.level, permuting.permutation) == ("L3", "L2", [3, 0, 1, 2])
    x, w, b = CONV_FEEDS.values()
    want = np.maximum(conv_nhwc(x, w, (2, 1), [(1, 1), (0, 1)]) + b, 0)
    np.testing.assert_allclose(values["jit_relu_.1"], want, rtol=1e-5, atol=1e-5)


def test_an_object_whose_weight_move_does_not_permute_is_refused():
    graph, warnings = parse_hlo("t.hlo", CONV)
    doc = orjson.loads(dumps(compile_graph(infer_shapes(graph, warnings), "t.hlo", load_target(STANDARD))))
    for op in doc["body"]["kernels"][-1]["body"]:
        op.pop("permutation", None)
    doc["sha256"] = _digest(doc["body"])
    with pytest.raises(ObjectFileError, match=r"reads variables__params____Conv_0____kernel__.1 at L1 as laid out, "
                                              r"but CONV2D '.*' takes it with its dims in the order \[3, 0, 1, 2\]"):
        loads(orjson.dumps(doc))


def test_weights_in_chunks_of_input_channels_are_permuted_tile_by_tile():
    """On `minimal` the weights come in chunks of a few input channels (the last one short),
    each permuted on its way to L2."""
    x_shape, w_shape = (1, 6, 6, 50), (3, 3, 50, 40)
    graph = graph_of([("TRANSPOSE", ["w"], {"perms": [3, 0, 1, 2]}),
                      ("CONV2D", ["x", "t0"], {"padding": [[1, 1], [1, 1]]})],
                     {"x": (x_shape, "f32"), "w": (w_shape, "f32")})
    feeds = {"x": rand(*x_shape, seed=10), "w": rand(*w_shape, seed=11)}
    program, values = run(graph, feeds, MINIMAL)
    [kernel] = program.kernels
    assert kernel.tiling["num_tiles_tk"] > 1 and 50 % kernel.tiling["Tc"]
    np.testing.assert_allclose(values["t1"], conv_nhwc(feeds["x"], feeds["w"], (1, 1), [(1, 1), (1, 1)]),
                               rtol=1e-5, atol=1e-4)


def test_onnx_weights_given_as_an_input_are_read_oihw():
    x_shape, w_shape = (1, 3, 6, 5), (4, 3, 3, 3)
    graph = graph_of([("CONV2D", ["x", "w"], {"layout": "NCHW", "padding": [[1, 0], [0, 1]]})],
                     {"x": (x_shape, "f32"), "w": (w_shape, "f32")})
    feeds = {"x": rand(*x_shape, seed=12), "w": rand(*w_shape, seed=13)}
    program, values = run(graph, feeds)
    # the input's and the result's TRANSPOSEs to NHWC and back stay; none of the weights
    assert [(k.op, k.inputs) for k in program.kernels if k.op == "TRANSPOSE"][0][1] == ["x"]
    assert computing(program) == [("TRANSPOSE",), ("CONV2D",), ("TRANSPOSE",)]
    want = conv_nhwc(feeds["x"].transpose(0, 2, 3, 1), feeds["w"].transpose(2, 3, 1, 0), (1, 1), [(1, 0), (0, 1)])
    np.testing.assert_allclose(values["t0"], want.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)


# nn.Conv(4, (3, 3), padding="SAME", feature_group_count=4, use_bias=False): depthwise, HWIO [3, 3, 1, 4]
DEPTHWISE = """HloModule jit_apply, entry_computation_layout={(f32[3,3,1,4]{3,2,1,0}, f32[1,5,5,4]{3,2,1,0})->f32[1,5,5,4]{3,2,1,0}}

ENTRY main.1 {
  args_0_.1 = f32[1,5,5,4]{3,2,1,0} parameter(1)
  variables__params____Conv_0____kernel__.1 = f32[3,3,1,4]{3,2,1,0} parameter(0)
  ROOT conv_general_dilated.1 = f32[1,5,5,4]{3,2,1,0} convolution(args_0_.1, variables__params____Conv_0____kernel__.1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=4
}
"""


def test_depthwise_hwio_parameter_weights_are_hwcm_as_they_lie():
    feeds = {"args_0_.1": rand(1, 5, 5, 4, seed=14), "variables__params____Conv_0____kernel__.1": rand(3, 3, 1, 4, seed=15)}
    program, values = run_hlo(DEPTHWISE, feeds)
    assert computing(program) == [("DEPTHWISE_CONV2D",)]  # the weights' view of them, no TRANSPOSE
    x, w = feeds.values()
    np.testing.assert_allclose(values["conv_general_dilated.1"], conv_nhwc(x, w, (1, 1), [(1, 1), (1, 1)], groups=4),
                               rtol=1e-5, atol=1e-5)


# conv, BatchNorm (inference), relu, conv, BatchNorm, + x, relu: every weight and statistic a parameter
BASIC_BLOCK = """HloModule jit_apply, entry_computation_layout={(f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, /*index=5*/f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[3,3,4,4]{3,2,1,0}, f32[3,3,4,4]{3,2,1,0}, /*index=10*/f32[1,5,5,4]{3,2,1,0})->f32[1,5,5,4]{3,2,1,0}}

relu.1 {
  Arg_0.1 = f32[1,5,5,4]{3,2,1,0} parameter(0)
  constant.2 = f32[] constant(0)
  max.2 = f32[1,5,5,4]{3,2,1,0} broadcast(constant.2), dimensions={}
  ROOT max.3 = f32[1,5,5,4]{3,2,1,0} maximum(Arg_0.1, max.2)
}

ENTRY main.2 {
  args_0_.1 = f32[1,5,5,4]{3,2,1,0} parameter(10)
  variables__params____Conv_0____kernel__.1 = f32[3,3,4,4]{3,2,1,0} parameter(8)
  conv_general_dilated.2 = f32[1,5,5,4]{3,2,1,0} convolution(args_0_.1, variables__params____Conv_0____kernel__.1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  variables__batch_stats____BatchNorm_0____mean__.1 = f32[4]{0} parameter(0)
  broadcast_in_dim.4 = f32[1,1,1,4]{3,2,1,0} reshape(variables__batch_stats____BatchNorm_0____mean__.1)
  sub.8 = f32[1,1,1,4]{3,2,1,0} broadcast(broadcast_in_dim.4), dimensions={0,1,2,3}
  sub.9 = f32[1,4]{1,0} reshape(sub.8)
  sub.10 = f32[1,5,5,4]{3,2,1,0} broadcast(sub.9), dimensions={0,3}
  sub.11 = f32[1,5,5,4]{3,2,1,0} subtract(conv_general_dilated.2, sub.10)
  variables__batch_stats____BatchNorm_0____var__.1 = f32[4]{0} parameter(1)
  broadcast_in_dim.5 = f32[1,1,1,4]{3,2,1,0} reshape(variables__batch_stats____BatchNorm_0____var__.1)
  constant.3 = f32[] constant(1e-05)
  broadcast.1 = f32[1,1,1,4]{3,2,1,0} broadcast(constant.3), dimensions={}
  add.11 = f32[1,1,1,4]{3,2,1,0} add(broadcast_in_dim.5, broadcast.1)
  rsqrt.2 = f32[1,1,1,4]{3,2,1,0} rsqrt(add.11)
  variables__params____BatchNorm_0____scale__.1 = f32[4]{0} parameter(5)
  reshape.4 = f32[1,1,1,4]{3,2,1,0} reshape(variables__params____BatchNorm_0____scale__.1)
  mul.10 = f32[1,1,1,4]{3,2,1,0} multiply(rsqrt.2, reshape.4)
  mul.11 = f32[1,1,1,4]{3,2,1,0} broadcast(mul.10), dimensions={0,1,2,3}
  mul.12 = f32[1,4]{1,0} reshape(mul.11)
  mul.13 = f32[1,5,5,4]{3,2,1,0} broadcast(mul.12), dimensions={0,3}
  mul.14 = f32[1,5,5,4]{3,2,1,0} multiply(sub.11, mul.13)
  variables__params____BatchNorm_0____bias__.1 = f32[4]{0} parameter(4)
  reshape.5 = f32[1,1,1,4]{3,2,1,0} reshape(variables__params____BatchNorm_0____bias__.1)
  add.12 = f32[1,1,1,4]{3,2,1,0} broadcast(reshape.5), dimensions={0,1,2,3}
  add.13 = f32[1,4]{1,0} reshape(add.12)
  add.14 = f32[1,5,5,4]{3,2,1,0} broadcast(add.13), dimensions={0,3}
  add.15 = f32[1,5,5,4]{3,2,1,0} add(mul.14, add.14)
  jit_relu_.2 = f32[1,5,5,4]{3,2,1,0} call(add.15), to_apply=relu.1
  variables__params____Conv_1____kernel__.1 = f32[3,3,4,4]{3,2,1,0} parameter(9)
  conv_general_dilated.3 = f32[1,5,5,4]{3,2,1,0} convolution(jit_relu_.2, variables__params____Conv_1____kernel__.1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  variables__batch_stats____BatchNorm_1____mean__.1 = f32[4]{0} parameter(2)
  broadcast_in_dim.6 = f32[1,1,1,4]{3,2,1,0} reshape(variables__batch_stats____BatchNorm_1____mean__.1)
  sub.12 = f32[1,1,1,4]{3,2,1,0} broadcast(broadcast_in_dim.6), dimensions={0,1,2,3}
  sub.13 = f32[1,4]{1,0} reshape(sub.12)
  sub.14 = f32[1,5,5,4]{3,2,1,0} broadcast(sub.13), dimensions={0,3}
  sub.15 = f32[1,5,5,4]{3,2,1,0} subtract(conv_general_dilated.3, sub.14)
  variables__batch_stats____BatchNorm_1____var__.1 = f32[4]{0} parameter(3)
  broadcast_in_dim.7 = f32[1,1,1,4]{3,2,1,0} reshape(variables__batch_stats____BatchNorm_1____var__.1)
  add.16 = f32[1,1,1,4]{3,2,1,0} add(broadcast_in_dim.7, broadcast.1)
  rsqrt.3 = f32[1,1,1,4]{3,2,1,0} rsqrt(add.16)
  variables__params____BatchNorm_1____scale__.1 = f32[4]{0} parameter(7)
  reshape.6 = f32[1,1,1,4]{3,2,1,0} reshape(variables__params____BatchNorm_1____scale__.1)
  mul.15 = f32[1,1,1,4]{3,2,1,0} multiply(rsqrt.3, reshape.6)
  mul.16 = f32[1,1,1,4]{3,2,1,0} broadcast(mul.15), dimensions={0,1,2,3}
  mul.17 = f32[1,4]{1,0} reshape(mul.16)
  mul.18 = f32[1,5,5,4]{3,2,1,0} broadcast(mul.17), dimensions={0,3}
  mul.19 = f32[1,5,5,4]{3,2,1,0} multiply(sub.15, mul.18)
  variables__params____BatchNorm_1____bias__.1 = f32[4]{0} parameter(6)
  reshape.7 = f32[1,1,1,4]{3,2,1,0} reshape(variables__params____BatchNorm_1____bias__.1)
  add.17 = f32[1,1,1,4]{3,2,1,0} broadcast(reshape.7), dimensions={0,1,2,3}
  add.18 = f32[1,4]{1,0} reshape(add.17)
  add.19 = f32[1,5,5,4]{3,2,1,0} broadcast(add.18), dimensions={0,3}
  add.20 = f32[1,5,5,4]{3,2,1,0} add(mul.19, add.19)
  add.21 = f32[1,5,5,4]{3,2,1,0} add(add.20, args_0_.1)
  ROOT jit_relu_.3 = f32[1,5,5,4]{3,2,1,0} call(add.21), to_apply=relu.1
}
"""


def test_a_resnet_basic_block_with_parameter_weights_has_no_transpose_kernel():
    params = {f"variables__params____Conv_{i}____kernel__.1": rand(3, 3, 4, 4, seed=20 + i) for i in (0, 1)}
    stats = {f"variables__{kind}____BatchNorm_{i}____{name}__.1": rand(4, seed=30 + 4 * i + j) + (1.5 if name == "var" else 0)
             for i in (0, 1) for j, (kind, name) in enumerate([("batch_stats", "mean"), ("batch_stats", "var"),
                                                              ("params", "scale"), ("params", "bias")])}
    feeds = {"args_0_.1": rand(1, 5, 5, 4, seed=16), **params, **stats}
    program, values = run_hlo(BASIC_BLOCK, feeds)
    assert "TRANSPOSE" not in [k.op for k in program.kernels]  # before: one per convolution's weights
    assert [k.op for k in program.kernels].count("CONV2D") == 2

    def conv_bn(x, i):
        y = conv_nhwc(x, feeds[f"variables__params____Conv_{i}____kernel__.1"], (1, 1), [(1, 1), (1, 1)])
        s = {name: feeds[f"variables__{kind}____BatchNorm_{i}____{name}__.1"].astype(np.float64)
             for kind, name in [("batch_stats", "mean"), ("batch_stats", "var"), ("params", "scale"), ("params", "bias")]}
        return (y - s["mean"]) / np.sqrt(s["var"] + 1e-5) * s["scale"] + s["bias"]

    x = feeds["args_0_.1"]
    want = np.maximum(conv_bn(np.maximum(conv_bn(x, 0), 0), 1) + x, 0)
    np.testing.assert_allclose(values["jit_relu_.3"], want, rtol=1e-5, atol=1e-5)
