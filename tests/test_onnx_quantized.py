"""The ONNX frontend's quantized ops one node at a time, each against onnxruntime on the same
node: the integers bit for bit (the float ones within f32 rounding), through compile_graph, the
object file and execution in-process; what the QUANTIZE pass makes of them (integer
contractions with a REQUANTIZE epilogue, 1-byte weights); and bad quantization parameters,
refused with exit 2 and one line naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

from conftest import CONFIGS, run_cli
from dfx import dumps, is_integer, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs
from loader.run import check_kernels, check_outputs

STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
RNG = np.random.default_rng(23)


def model(op_type: str, feeds: dict[str, np.ndarray], constants: dict[str, np.ndarray], inputs: list[str],
          out: tuple[type, ...] = (np.int8,), domain: str = "", **attrs) -> onnx.ModelProto:
    """One node reading `inputs` (names of `feeds` or `constants`; "" for an absent one), its
    outputs of the numpy types `out`."""
    node = helper.make_node(op_type, inputs, [f"y{k}" for k in range(len(out))], name="node", domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                      for k, v in feeds.items()],
        [helper.make_tensor_value_info(f"y{k}", helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
         for k, t in enumerate(out)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    opsets = [helper.make_opsetid("", 21), *([helper.make_opsetid(domain, 1)] if domain else [])]
    return helper.make_model(graph, opset_imports=opsets)


def compiled(m: onnx.ModelProto):
    graph, warnings = parse_onnx("node.onnx", m.SerializeToString())
    return loads(dumps(compile_graph(infer_shapes(graph, warnings), "node.onnx", TARGET)))


def run_both(m: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """(ours, onnxruntime's) outputs, ours having passed the kernel check; and the program."""
    want = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    program = compiled(m)
    values = execute(program, bind_program(program, MACHINE, "test", bind_greedy), program_inputs(program, feeds, 0))
    failed = [name for name, check in check_kernels(program, values).items() if not check.passed]
    assert not failed, failed
    return [values[o.name] for o in m.graph.output], want, program


def int8(*shape: int, unsigned: bool = False) -> np.ndarray:
    return (RNG.integers(0, 256, shape).astype(np.uint8) if unsigned
            else RNG.integers(-128, 128, shape).astype(np.int8))


def assert_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("unsigned", [False, True])
def test_qlinear_matmul_per_row_and_column(unsigned):
    a, b = int8(6, 40, unsigned=unsigned), int8(40, 24, unsigned=unsigned)
    zero = (lambda v: np.uint8(v)) if unsigned else (lambda v: np.int8(v - 128))
    constants = {"b": b, "sa": np.float32(0.031), "za": zero(131), "sb": RNG.uniform(0.01, 0.02, 24).astype(np.float32),
                 "zb": np.full(24, zero(128)), "sy": np.float32(0.9), "zy": zero(120)}
    m = model("QLinearMatMul", {"a": a}, constants, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
              out=(np.uint8 if unsigned else np.int8,))
    got, want, program = run_both(m, {"a": a})
    assert_equal(got, want)
    assert "REQUANTIZE" in {op.op_type for op in program.graph.ops}  # the integer form, not the float one


def test_qgemm_with_a_bias_and_a_float_result():
    a, b = int8(5, 32, unsigned=True), int8(16, 32)
    constants = {"b": b, "sa": np.float32(0.02), "za": np.uint8(100), "sb": np.float32(0.01), "zb": np.int8(0),
                 "c": RNG.integers(-500, 500, 16).astype(np.int32), "sy": np.float32(0.05), "zy": np.uint8(128)}
    quantized = model("QGemm", {"a": a}, constants, ["a", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"],
                      out=(np.uint8,), domain="com.microsoft", transB=1)
    got, want, _ = run_both(quantized, {"a": a})
    assert_equal(got, want)
    float_result = model("QGemm", {"a": a}, constants, ["a", "sa", "za", "b", "sb", "zb", "c"],
                         out=(np.float32,), domain="com.microsoft", transB=1)
    got, want, _ = run_both(float_result, {"a": a})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_qlinear_add_broadcasts():
    a, b = int8(1, 8, 5, 5), int8(1, 8, 1, 1)
    constants = {"b": b, "sa": np.float32(0.04), "za": np.int8(-3), "sb": np.float32(0.1), "zb": np.int8(7),
                 "sc": np.float32(0.07), "zc": np.int8(-1)}
    m = model("QLinearAdd", {"a": a}, constants, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], domain="com.microsoft")
    got, want, _ = run_both(m, {"a": a})
    assert_equal(got, want)


def pool_model(op_type: str, x: np.ndarray, zx, zy, **attrs) -> onnx.ModelProto:
    """A com.microsoft QLinear pool of x (scale 0.05, zero point zx) into scale 0.03, zero point zy
    (its type the result's)."""
    constants = {"sx": np.float32(0.05), "zx": zx, "sy": np.float32(0.03), "zy": zy}
    return model(op_type, {"x": x}, constants, ["x", "sx", "zx", "sy", "zy"], out=(type(zy),), domain="com.microsoft",
                 **attrs)


def test_qlinear_global_average_pool():
    x = int8(1, 12, 6, 6, unsigned=True)
    m = pool_model("QLinearGlobalAveragePool", x, np.uint8(90), np.uint8(60))
    got, want, _ = run_both(m, {"x": x})
    assert np.abs(got[0].astype(int) - want[0]).max() <= 1  # onnxruntime sums in integers, rounds once


@pytest.mark.parametrize("unsigned, attrs", [
    (True, {"kernel_shape": [2, 2], "strides": [2, 2]}),  # DenseNet's transitions
    (False, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    (True, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (False, {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}),
])
def test_qlinear_average_pool(unsigned, attrs):
    """com.microsoft QLinearAveragePool as onnxruntime runs it: the mean of the dequantized
    window, quantized (DenseNet-121's QOperator model after quant_pre_process has three)."""
    kind = np.uint8 if unsigned else np.int8
    x = int8(1, 6, 9, 9, unsigned=unsigned) if len(attrs["kernel_shape"]) == 2 else int8(2, 6, 11, unsigned=unsigned)
    m = pool_model("QLinearAveragePool", x, kind(90 if unsigned else -9), kind(60 if unsigned else 4), **attrs)
    got, want, _ = run_both(m, {"x": x})
    assert_equal(got, want)


def test_qlinear_average_pool_refuses_what_onnxruntime_does():
    x = int8(1, 2, 4, 4, unsigned=True)
    m = pool_model("QLinearAveragePool", x, np.uint8(90), np.int8(4), kernel_shape=[2, 2])
    with pytest.raises(CompileError, match="its y_zero_point is i8, its x u8: both of one type"):
        compiled(m)
    m = pool_model("QLinearAveragePool", x, np.uint8(90), np.uint8(4), kernel_shape=[2, 2], dilations=[2, 2])
    with pytest.raises(CompileError, match="has dilations, which QLinearAveragePool does not define"):
        compiled(m)


def test_qlinear_mul_and_sigmoid_as_efficientnets_squeeze_excitation():
    """x * sigmoid(x), as a QOperator EfficientNet or MobileNetV3 writes its SiLU and its
    squeeze-excitation scale (onnxruntime's quantization tool after quant_pre_process)."""
    x = int8(1, 8, 4, 4, unsigned=True)
    constants = {"sx": np.float32(0.05), "zx": np.uint8(128), "ss": np.float32(1 / 255), "zs": np.uint8(0),
                 "sy": np.float32(0.03), "zy": np.uint8(100)}
    sigmoid = helper.make_node("QLinearSigmoid", ["x", "sx", "zx", "ss", "zs"], ["s"], domain="com.microsoft")
    mul = helper.make_node("QLinearMul", ["x", "sx", "zx", "s", "ss", "zs", "sy", "zy"], ["y0"], domain="com.microsoft")
    graph = helper.make_graph(
        [sigmoid, mul], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y0", onnx.TensorProto.UINT8, None)],
        [numpy_helper.from_array(v, k) for k, v in constants.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    got, want, _ = run_both(m, {"x": x})
    assert_equal(got, want)


@pytest.mark.parametrize("unsigned", [False, True])
def test_qlinear_mul_of_every_pair_of_values(unsigned):
    """All 65,536 pairs of 8-bit values (operands of one shape): onnxruntime multiplies the
    integers less their zero points and requantizes by sa sb / sc, which the product of the two
    dequantized operands misses by a step in about 1 element of 300. (Broadcast against one
    value, onnxruntime's kernel scales that one first, and rounds otherwise again.)"""
    kind = np.uint8 if unsigned else np.int8
    a, b = (grid.astype(np.uint8).astype(kind) for grid in np.meshgrid(np.arange(256), np.arange(256)))
    constants = {"b": b, "sa": np.float32(0.05), "za": kind(3), "sb": np.float32(0.03), "zb": kind(250 if unsigned else -6),
                 "sc": np.float32(0.07), "zc": kind(129 if unsigned else 1)}
    m = model("QLinearMul", {"a": a}, constants, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], out=(kind,),
              domain="com.microsoft")
    got, want, _ = run_both(m, {"a": a})
    assert_equal(got, want)


def test_a_contrib_op_without_a_zero_point_keeps_its_operands_type():
    """QLinearSigmoid of int8 with no Y_zero_point gives int8, read by the next one: the type of
    a result no shape inference declares is the operand's, not uint8."""
    x = int8(2, 64)
    constants = {"sx": np.float32(0.05), "sy": np.float32(1 / 128)}
    first = helper.make_node("QLinearSigmoid", ["x", "sx", "", "sy", ""], ["s"], domain="com.microsoft")
    second = helper.make_node("QLinearSigmoid", ["s", "sy", "", "sx", ""], ["y0"], domain="com.microsoft")
    graph = helper.make_graph(
        [first, second], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.INT8, x.shape)],
        [helper.make_tensor_value_info("y0", onnx.TensorProto.INT8, None)],
        [numpy_helper.from_array(v, k) for k, v in constants.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    got, want, program = run_both(m, {"x": x})
    assert_equal(got, want)
    assert program.graph.tensors["s"].dtype == "i8"


def test_contrib_ops_refuse_scales_per_channel():
    x = int8(1, 3, 2, 2)
    constants = {"sx": np.float32([0.1, 0.2, 0.3]), "zx": np.int8([0, 0, 0]), "sy": np.float32(0.01), "zy": np.int8(0)}
    m = model("QLinearSigmoid", {"x": x}, constants, ["x", "sx", "zx", "sy", "zy"], domain="com.microsoft")
    with pytest.raises(CompileError, match="its scales and zero points must be scalars, got 'sx' of shape \\[3\\]"):
        compiled(m)


def test_qlinear_concat_requantizes_each_input():
    """SqueezeNet's fire modules: their two expansions QLinearConcat'ed, and read by the next
    quantized op. The concatenation's type is declared nowhere (shape inference does not know the
    contrib ops): it is its zero point's, not its first input's (a scale, f32)."""
    a, b = int8(1, 3, 4, 4), int8(1, 5, 4, 4)
    constants = {"sy": np.float32(0.06), "zy": np.int8(2), "sa": np.float32(0.05), "za": np.int8(-4),
                 "sb": np.float32(0.08), "zb": np.int8(9), "ss": np.float32(1 / 256), "zs": np.int8(-128)}
    concat = helper.make_node("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb", "zb"], ["c"],
                              domain="com.microsoft", axis=1)
    sigmoid = helper.make_node("QLinearSigmoid", ["c", "sy", "zy", "ss", "zs"], ["y0"], domain="com.microsoft")
    graph = helper.make_graph(
        [concat, sigmoid], "g", [helper.make_tensor_value_info(k, onnx.TensorProto.INT8, v.shape)
                                 for k, v in {"a": a, "b": b}.items()],
        [helper.make_tensor_value_info("y0", onnx.TensorProto.INT8, None)],
        [numpy_helper.from_array(v, k) for k, v in constants.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    got, want, _ = run_both(m, {"a": a, "b": b})
    assert_equal(got, want)


def test_matmul_integer_with_zero_points_known_at_run_time():
    a, b = int8(7, 30, unsigned=True), int8(30, 9)
    m = model("MatMulInteger", {"a": a, "za": np.array(141, np.uint8)}, {"b": b}, ["a", "b", "za"], out=(np.int32,))
    got, want, program = run_both(m, {"a": a, "za": np.array(141, np.uint8)})
    assert_equal(got, want)
    # the zero point comes off the sums (an epilogue), so the array reads the uint8 as they are
    (matmul,) = [op for op in program.graph.ops if op.op_type == "MATMUL"]
    assert [program.graph.tensors[t].dtype for t in matmul.inputs] == ["u8", "i8"]


def test_conv_integer_pads_with_the_zero_point():
    x, w = int8(1, 3, 7, 7, unsigned=True), int8(4, 3, 3, 3, unsigned=True)
    constants = {"w": w, "zx": np.uint8(77), "zw": np.uint8(128)}  # onnxruntime takes one w zero point alone
    m = model("ConvInteger", {"x": x}, constants, ["x", "w", "zx", "zw"], out=(np.int32,), pads=[1, 1, 1, 1])
    got, want, program = run_both(m, {"x": x})
    assert_equal(got, want)
    (conv,) = [op for op in program.graph.ops if op.op_type == "CONV2D"]
    assert program.graph.tensors[conv.inputs[0]].dtype == "u8" and conv.attrs["pad_value"] == 77


@pytest.mark.parametrize("values", [np.zeros((4, 6), np.float32), np.linspace(-3, 1, 24, dtype=np.float32).reshape(4, 6),
                                    np.linspace(0.5, 7, 24, dtype=np.float32).reshape(4, 6)])
def test_dynamic_quantize_linear_takes_its_range_with_zero(values):
    m = model("DynamicQuantizeLinear", {"x": values}, {}, ["x"], out=(np.uint8, np.float32, np.uint8))
    got, want, _ = run_both(m, {"x": values})
    assert_equal(got, want)


def test_qlinear_conv_runs_on_integers_with_one_byte_weights():
    x, w = int8(1, 8, 6, 6), int8(16, 8, 3, 3)
    constants = {"w": w, "sx": np.float32(0.02), "zx": np.int8(-20), "sw": RNG.uniform(0.002, 0.004, 16).astype(np.float32),
                 "zw": np.zeros(16, np.int8), "sy": np.float32(0.05), "zy": np.int8(3),
                 "b": RNG.integers(-2000, 2000, 16).astype(np.int32)}
    m = model("QLinearConv", {"x": x}, constants, ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"], pads=[1, 1, 1, 1])
    got, want, program = run_both(m, {"x": x})
    assert_equal(got, want)
    g = program.graph
    (conv,) = [op for op in g.ops if op.op_type == "CONV2D"]
    assert [g.tensors[t].dtype for t in conv.inputs] == ["i8", "i8", "i32"] and g.tensors[conv.outputs[0]].dtype == "i32"
    assert not any(op.op_type == "DEQUANTIZE" for op in g.ops)
    assert all(is_integer(t.dtype) or t.role != "intermediate" for t in g.tensors.values())


BAD = {
    "zero scale": ({"s": np.float32(0), "z": np.int8(0)}, {}, "scale 's' holds 0: a scale must be positive"),
    "negative scale": ({"s": np.array([0.1, -0.2, 0.1, 0.1], np.float32), "z": np.zeros(4, np.int8)}, {},
                       "scale 's' holds -0.2: a scale must be positive"),
    "axis": ({"s": np.full(4, 0.1, np.float32), "z": np.zeros(4, np.int8)}, {"axis": 7},
             "axis 7 is outside the 4 dims of 'x'"),
    "channels": ({"s": np.full(4, 0.1, np.float32), "z": np.zeros(4, np.int8)}, {"axis": 2},
                 "per-channel scale 's' has 4 values, but 'x' has 3 along axis 2"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_quantization_parameters_name_the_node(case):
    constants, attrs, reason = BAD[case]
    m = model("QuantizeLinear", {"x": np.zeros((1, 4, 3, 3), np.float32)}, constants, ["x", "s", "z"], **attrs)
    with pytest.raises(CompileError, match=f"node 'node' \\(QuantizeLinear\\): {reason}"):
        compiled(m)


def test_a_zero_point_outside_its_type_is_exit_2_in_one_line(tmp_path):
    q = np.zeros((2, 3), np.uint8)
    m = model("DequantizeLinear", {"q": q}, {"s": np.float32(0.1), "z": np.int8(-5)}, ["q", "s", "z"], out=(np.float32,))
    path = tmp_path / "bad.onnx"
    onnx.save(m, path)
    result = run_cli("compiler", str(path), "-o", str(tmp_path / "bad.kpu"))
    assert result.returncode == 2 and not (tmp_path / "bad.kpu").exists()
    assert result.stderr.strip().splitlines() == [
        f"error: {path}: node 'node' (DequantizeLinear): zero point 'z' holds -5, outside u8's range [0, 255]"]


def qdq_model(contraction: onnx.NodeProto, x: np.ndarray, constants: dict[str, np.ndarray], **weight_attrs
              ) -> onnx.ModelProto:
    """x quantized and dequantized (sx, zx), the weights w dequantized (sw, zw; `weight_attrs`),
    `contraction` of the two ("xd", "wd" -> "c"), its result quantized (sy, zy) as output y0: the
    QDQ form the quantization tool writes."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], **weight_attrs),
             contraction,
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["y0"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y0", onnx.TensorProto.INT8, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_weights_quantized_along_their_input_channels_stay_float():
    """A QDQ convolution whose weight scales run along the input channels (axis 1, as many as the
    outputs here) has no requantize of its sums: the pass leaves it as written, in float."""
    x, w = RNG.normal(0, 1, (1, 8, 5, 5)).astype(np.float32), int8(8, 8, 3, 3)
    constants = {"sx": np.float32(0.02), "zx": np.int8(3), "w": w, "sw": RNG.uniform(0.001, 0.01, 8).astype(np.float32),
                 "zw": np.zeros(8, np.int8), "sy": np.float32(0.2), "zy": np.int8(-2)}
    m = qdq_model(helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]), x, constants, axis=1)
    (got,), (want,), program = run_both(m, {"x": x})
    assert np.abs(got.astype(int) - want).max() <= 1
    assert "REQUANTIZE" not in {op.op_type for op in program.graph.ops}


@pytest.mark.parametrize("with_bias", [True, False])
def test_qgemm_alpha_scales_the_bias_too(with_bias):
    a, b = int8(5, 32, unsigned=True), int8(32, 16)
    constants = {"b": b, "sa": np.float32(0.02), "za": np.uint8(100), "sb": np.float32(0.01), "zb": np.int8(0),
                 "c": RNG.integers(-500, 500, 16).astype(np.int32)}
    inputs = ["a", "sa", "za", "b", "sb", "zb", *(["c"] if with_bias else [])]
    m = model("QGemm", {"a": a}, constants, inputs, out=(np.float32,), domain="com.microsoft", alpha=0.5)
    got, want, _ = run_both(m, {"a": a})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_16_bit_sums_that_could_pass_int32_stay_float():
    """i16 activations over K = 1024: their integer sums could leave int32, so the pass leaves the
    QDQ MatMul as written, in float, within a step of onnxruntime."""
    x = RNG.normal(0, 1, (4, 1024)).astype(np.float32)
    constants = {"sx": np.float32(1e-4), "zx": np.int16(0), "w": int8(1024, 8), "sw": np.float32(0.01),
                 "zw": np.int8(0), "sy": np.float32(0.05), "zy": np.int8(0)}
    m = qdq_model(helper.make_node("MatMul", ["xd", "wd"], ["c"]), x, constants)
    (got,), (want,), program = run_both(m, {"x": x})
    assert np.abs(got.astype(int) - want).max() <= 1
    assert "REQUANTIZE" not in {op.op_type for op in program.graph.ops}


def test_blocked_parameters_are_checked_too():
    x = np.zeros((3, 4), np.float32)
    m = model("QuantizeLinear", {"x": x}, {"s": np.array([[0.1, -0.1]] * 3, np.float32), "z": np.zeros((3, 2), np.uint8)},
              ["x", "s", "z"], out=(np.uint8,), axis=1, block_size=2)
    with pytest.raises(CompileError, match="scale 's' holds -0.1: a scale must be positive"):
        compiled(m)


def test_a_zero_point_of_another_type_than_its_tensor_is_refused():
    q = np.zeros((2, 3), np.int8)
    m = model("DequantizeLinear", {"q": q}, {"s": np.float32(0.1), "z": np.uint8(5)}, ["q", "s", "z"], out=(np.float32,))
    with pytest.raises(CompileError, match="zero point 'z' is u8, but the tensor it goes with is i8"):
        compiled(m)


def _requantized_twice():
    """x -> * 2 -> QuantizeLinear (scale 0.1) -> q1, then DequantizeLinear, * 0.5, QuantizeLinear
    (scale 0.01) -> q2 (q2 = 5 q1): both outputs. 2 x[0] / 0.1 lies within 1e-6 of the tie 10.5
    (its operand computed, so it may lie on either side of it), 2 x[1] / 0.1 is 5.3. The program,
    the values a run gives, the reference outputs."""
    x = np.float32([0.525, 0.265, 0.1, -0.35]).reshape(1, 4)
    constants = {"two": np.float32(2), "s1": np.float32(0.1), "z1": np.int8(0), "half": np.float32(0.5),
                 "s2": np.float32(0.01), "z2": np.int8(0)}
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"]),
             helper.make_node("QuantizeLinear", ["x2", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("Mul", ["d1", "half"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "s2", "z2"], ["q2"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info(q, onnx.TensorProto.INT8, None) for q in ("q1", "q2")],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    program = compiled(m)
    values = execute(program, bind_program(program, MACHINE, "test", bind_greedy), program_inputs(program, {"x": x}, 0))
    want = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return program, values, want


def test_the_output_check_allows_a_step_at_a_tie_and_what_it_moves_downstream():
    """A computed value a quantize rounds that lies within its tolerance of a tie may round to
    either step (two computations of one float differ in its last bits), and the outputs computed
    from it are held to what that step moves them by: 5 steps of q2 for q1's one. Anywhere else a
    step is an error. (DenseNet-121 in QDQ form with its quantized tensors made outputs failed the
    check on 73 of them, by one or two steps.)"""
    program, values, want = _requantized_twice()
    assert_equal([values["q1"], values["q2"]], want)
    assert abs(np.float32(0.525) * 2 / np.float32(0.1) - 10.5) < 1e-6 and want[1][0, 0] == 5 * want[0][0, 0]
    other = want[0][0, 0] + (1 if want[0][0, 0] == 10 else -1)  # the step on the tie's other side

    def check(q1, q2):
        return check_outputs(program, {**values, "q1": np.int8(q1).reshape(1, 4), "q2": np.int8(q2).reshape(1, 4)})

    assert all(c.passed for c in check(want[0], want[1]).values())
    tie = check([other, *want[0][0, 1:]], [5 * other, *want[1][0, 1:]])  # the other step, carried through
    assert tie["q1"].passed and tie["q2"].passed
    off = check([want[0][0, 0], want[0][0, 1] - 1, *want[0][0, 2:]], want[1])  # 5.3 rounds to 5 alone
    assert not off["q1"].passed
    downstream = check(want[0], [want[1][0, 0], want[1][0, 1] - 5, *want[1][0, 2:]])  # from no tie
    assert not downstream["q2"].passed


def test_a_kernel_quantizing_what_it_reads_gets_no_step_at_a_tie():
    """The kernel check: a QUANTIZE of a value the kernel holds exactly (its own input, times 2)
    rounds as the reference does, so the other step at the tie fails it."""
    program, values, want = _requantized_twice()
    other = want[0][0, 0] + (1 if want[0][0, 0] == 10 else -1)
    [kernel] = [k for k in program.kernels if "q1" in k.outputs]
    wrong = values["q1"].copy()
    wrong[0, 0] = other
    assert check_kernels(program, values)[kernel.name].passed
    assert not check_kernels(program, {**values, "q1": wrong})[kernel.name].passed
