"""The ONNX backend node conformance cases of the installed `onnx` package, through the ONNX
frontend, compile_graph and the loader in-process (bind, execute), against each case's expected
outputs.

Eligible: the cases `onnx.backend.test.loader.load_node_model_tests()` yields whose every node is
of an op type issues 11, 20 and 23 list (ISSUE_OPS and QUANTIZED_OPS, which the frontend maps)
and whose every output has a float element type DFX holds (FLOAT, FLOAT16, DOUBLE, BFLOAT16,
FLOAT8E4M3FN), or an integer one in a case of a quantized op, expanded function cases included. The KPU compiles for static shapes and the frontend reads shapes, axes,
indices and split sizes at compile time, so a case's int64 inputs (and CumSum's axis, int32 in
its cases, and a resize's float roi, scales and sizes) become initializers holding its values;
its other inputs are fed as given. Outputs compare with numpy.allclose at the tolerance of their
dtype (dfx.tolerance), NaN equal to NaN.

Every eligible case passes, except those in SKIP, each with its reason and the refusal it gets
(checked: a skipped case that stops failing so fails its test). `test_pass_count` holds the
share: at the time of writing 598 of 621 eligible cases pass (96%).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import CONFIGS
from dfx import dumps, loads, numpy_dtype, tolerance
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends.onnx import ELEMENT_TYPES, parse_onnx
from kernel_compiler.frontends.onnx_ops import FOLD_ONLY, OPS
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs

STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
FLOAT_TYPES = {getattr(onnx.TensorProto, name) for name, dtype in ELEMENT_TYPES.items() if dtype[0] == "f"}
# the op types issues 11 and 20 list: the frontend maps exactly these (test_the_frontend_maps_the_issues_ops)
ISSUE_OPS = frozenset("""
    MatMul Gemm Conv ConvTranspose Relu LeakyRelu Sigmoid Tanh Gelu Erf Softmax LogSoftmax Add Sub Mul Div Pow
    Sqrt Exp Log Neg Abs Reciprocal Clip Min Max Where Equal Less Greater LessOrEqual GreaterOrEqual Transpose
    Reshape Flatten Squeeze Unsqueeze Concat Split Slice Gather ReduceSum ReduceMean ReduceMax ReduceMin
    LayerNormalization BatchNormalization MaxPool AveragePool GlobalAveragePool Identity Cast Constant
    HardSigmoid HardSwish Softplus Elu Selu Mish PRelu Floor Ceil Round Sign Mod IsNaN IsInf And Or Xor Not
    Sum Mean ConstantOfShape
    LRN GlobalMaxPool InstanceNormalization GroupNormalization ReduceL1 ReduceL2 ReduceSumSquare ReduceLogSumExp
    ReduceProd ArgMax ArgMin CumSum Trilu
    Einsum Resize Upsample GatherElements GatherND Expand Tile""".split())
# and what real exports needed beyond those: a legacy-exported Llama's rotary angles (Sin, Cos), the
# window padding of torchvision's Swin (Pad), a mixture of experts' router (TopK)
EXPORTS_OPS = frozenset("Sin Cos Tan Pad TopK".split())
# issue 23's: a case of one of these may also have integer outputs (the quantized tensors)
QUANTIZED_OPS = frozenset("""
    QuantizeLinear DequantizeLinear DynamicQuantizeLinear MatMulInteger ConvInteger QLinearConv QLinearMatMul""".split())
INTEGER_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32}

_3D = "3-D {}: the registry's CONV2D and pools are 2-D (1-D and 2-D images map)"
_TRAINING = "BatchNormalization in training mode (batch statistics, running mean and variance): inference only"
_CROP = ("Resize's tf_crop_and_resize (a region of interest, a constant outside it): not mapped",
         "coordinate_transformation_mode 'tf_crop_and_resize' is not supported")
_FLOAT8 = "float8 and float4 quantization (QuantizeLinear's float rounding to 8 bits): the KPU quantizes to integers"
# case -> (why it does not pass, the refusal it gets)
SKIP: dict[str, tuple[str, str]] = {
    "test_averagepool_3d_default": (_3D.format("AveragePool"), "over 3 spatial dims is not supported"),
    "test_averagepool_3d_dilations_small": (_3D.format("AveragePool"), "over 3 spatial dims is not supported"),
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True":
        (_3D.format("AveragePool"), "over 3 spatial dims is not supported"),
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False":
        (_3D.format("AveragePool"), "over 3 spatial dims is not supported"),
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True":
        (_3D.format("AveragePool"), "over 3 spatial dims is not supported"),
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False":
        (_3D.format("AveragePool"), "over 3 spatial dims is not supported"),
    "test_maxpool_3d_default": (_3D.format("MaxPool"), "over 3 spatial dims is not supported"),
    "test_maxpool_3d_dilations": (_3D.format("MaxPool"), "over 3 spatial dims is not supported"),
    "test_maxpool_3d_dilations_use_ref_impl": (_3D.format("MaxPool"), "over 3 spatial dims is not supported"),
    "test_maxpool_3d_dilations_use_ref_impl_large": (_3D.format("MaxPool"), "over 3 spatial dims is not supported"),
    "test_convtranspose_3d": (_3D.format("ConvTranspose"), "over 3 spatial dims is not supported"),
    "test_batchnorm_example_training_mode": (_TRAINING, "training_mode 1 is not supported"),
    "test_batchnorm_epsilon_training_mode": (_TRAINING, "training_mode 1 is not supported"),
    "test_resize_tf_crop_and_resize": _CROP,
    "test_resize_tf_crop_and_resize_axes_2_3": _CROP,
    "test_resize_tf_crop_and_resize_axes_3_2": _CROP,
    "test_resize_tf_crop_and_resize_extrapolation_value": _CROP,
    "test_dequantizelinear_e4m3fn": (_FLOAT8, "dequantizes a float tensor"),
    "test_dequantizelinear_e4m3fn_float16": (_FLOAT8, "dequantizes a float tensor"),
    "test_dequantizelinear_e4m3fn_zero_point": (_FLOAT8, "dequantizes a float tensor"),
    "test_dequantizelinear_e5m2": (_FLOAT8, "dequantizes a float tensor"),  # e5m2 is held widened, as f32
    "test_dequantizelinear_float4e2m1": (_FLOAT8, "dequantizes a float tensor"),
    "test_quantizelinear_e4m3fn": (_FLOAT8, "quantizes to f8"),
}


def _eligible(case) -> bool:
    graph = case.model.graph
    op_types = {n.op_type for n in graph.node}
    # integer outputs too where the op moves integers exactly (the quantized ops', Pad's int32 cases)
    # or gives positions (TopK's indices)
    types = FLOAT_TYPES | (INTEGER_TYPES if op_types & (QUANTIZED_OPS | {"Pad"}) else set()) \
        | ({onnx.TensorProto.INT64} if "TopK" in op_types else set())
    return op_types <= ISSUE_OPS | EXPORTS_OPS | QUANTIZED_OPS and all(
        o.type.HasField("tensor_type") and o.type.tensor_type.elem_type in types for o in graph.output)


with warnings.catch_warnings():  # building the cases' expected values overflows on purpose here and there
    warnings.simplefilter("ignore")
    from onnx.backend.test.loader import load_node_model_tests

    CASES = {case.name: case for case in load_node_model_tests() if _eligible(case)}


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def specialised(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's model with its int64 inputs, CumSum's axis, the parameters of a resize and a
    pad's constant as initializers holding the case's values, and the other inputs' values by name."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, values = list(model.graph.input), case.data_sets[0][0]
    axes = {node.input[1] for node in model.graph.node if node.op_type == "CumSum"}
    # the roi, scales and sizes of a resize: float inputs read at compile time too
    resizing = {name for node in model.graph.node if node.op_type in ("Resize", "Upsample") for name in node.input[1:]}
    resizing |= {node.input[2] for node in model.graph.node if node.op_type == "Pad" and len(node.input) > 2}
    fed = {}
    for info, value in zip(inputs, values):
        if info.type.tensor_type.elem_type == onnx.TensorProto.INT64 or info.name in axes | resizing:
            model.graph.initializer.append(numpy_helper.from_array(_array(value), info.name))
        else:
            fed[info.name] = _array(value)
    del model.graph.input[:]
    model.graph.input.extend(info for info in inputs if info.name in fed)
    return model, fed


def run_case(case) -> None:
    """Compile, write and read back (the validator sees it), bind, execute; each output against
    the case's expected one. CompileError where the frontend refuses, AssertionError on a
    difference."""
    name = f"{case.name}.onnx"
    model, fed = specialised(case)
    graph, warnings = parse_onnx(name, model.SerializeToString())
    program = loads(dumps(compile_graph(infer_shapes(graph, warnings), name, TARGET)))
    bindings = bind_program(program, MACHINE, name, bind_greedy)
    tensors = program.graph.tensors
    given = {k: v.astype(numpy_dtype(tensors[k].dtype)) for k, v in fed.items() if k in tensors}
    values = execute(program, bindings, program_inputs(program, given, 0))
    for info, expected in zip(model.graph.output, case.data_sets[0][1]):
        got, want = values[info.name].astype(np.float64), _array(expected).astype(np.float64)
        assert got.shape == want.shape, f"{info.name}: shape {got.shape}, expected {want.shape}"
        atol, rtol = tolerance(tensors[info.name].dtype)
        assert np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True), (
            f"{info.name}: max abs error {np.nanmax(np.abs(got - want)):.3g}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case(name):
    if name in SKIP:
        reason, refusal = SKIP[name]
        with pytest.raises(CompileError, match=refusal):
            run_case(CASES[name])
        pytest.skip(reason)
    run_case(CASES[name])


def test_the_frontend_maps_the_issues_ops():
    # and the ops it only folds, and Dropout, which vanishes (their cases read runtime inputs)
    assert set(OPS) - FOLD_ONLY - {"Dropout"} == ISSUE_OPS | EXPORTS_OPS | QUANTIZED_OPS


def test_pass_count():
    """At least 90% of the eligible cases pass: all but SKIP (each case's own test holds that)."""
    assert set(SKIP) <= set(CASES)
    passed = len(CASES) - len(SKIP)
    print(f"ONNX node conformance: {passed} of {len(CASES)} eligible cases pass, {len(SKIP)} skipped")
    assert len(CASES) > 350  # the installed onnx yields its cases (a change of version could take many away)
    assert passed / len(CASES) >= 0.9, f"{passed} of {len(CASES)} eligible cases pass"
