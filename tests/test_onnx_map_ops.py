"""The ONNX map ops models use beyond the basic arithmetic (activations, rounding, Mod, IsNaN and
IsInf, the logical ops, variadic Sum/Mean/Max/Min): each as a one-node model compiled, bound and
executed in-process, its outputs against onnxruntime's on inputs at the edges (negatives, zeros,
halves, NaN and inf, integer Mod of mixed signs), and every kernel and output passing --check."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

from conftest import CONFIGS
from dfx import dumps, loads, numpy_dtype, tolerance
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs
from loader.run import check_kernels, check_outputs

STANDARD = str(CONFIGS / "standard.json")
TARGET, MACHINE = load_target(STANDARD), load_machine(STANDARD)
IR_VERSION = 10  # onnxruntime 1.3x refuses the newest

# a row of the values the edges are made of, then a spread of others
EDGES = np.float32([-4.5, -3.0, -2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 3.0, 4.5])
X = np.concatenate([EDGES, np.random.default_rng(7).uniform(-6, 6, 12).astype(np.float32)]).reshape(4, 6)
SPECIAL = np.float32([[np.nan, np.inf, -np.inf, 0.0, -1.0, 2.5]])
P, Q = np.array([[False, False, True, True]]), np.array([[False, True, False, True]])
A_INT = np.int32([[7, -7, 7, -7, 0, 9, -9, 6]])
B_INT = np.int32([[3, 3, -3, -3, 5, 4, -4, -3]])


def one_node(op_type: str, inputs: dict[str, np.ndarray], opset: int = 17, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op_type, list(inputs), ["y"], **attrs)
    infos = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
             for name, a in inputs.items()]
    graph = helper.make_graph([node], op_type.lower(), infos, [onnx.ValueInfoProto(name="y")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR_VERSION
    return m


def run_both(m: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """(the KPU's value of y, onnxruntime's, the program); every kernel and output passes --check."""
    graph, warnings = parse_onnx("test.onnx", m.SerializeToString())
    program = loads(dumps(compile_graph(infer_shapes(graph, warnings), "test.onnx", TARGET)))
    bindings = bind_program(program, MACHINE, "test.onnx", bind_greedy)
    tensors = program.graph.tensors
    given = {k: v.astype(numpy_dtype(tensors[k].dtype)) for k, v in feeds.items()}
    values = execute(program, bindings, program_inputs(program, given, 0))
    for name, check in {**check_kernels(program, values), **check_outputs(program, values)}.items():
        assert check.passed, f"--check fails {name}: {check}"
    session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    [want] = session.run(None, feeds)
    return values["y"], want, program


# id -> (op type, inputs, opset, attrs)
CASES = {
    "HardSigmoid": ("HardSigmoid", {"x": X}, 17, {}),
    "HardSigmoid_attrs": ("HardSigmoid", {"x": X}, 17, {"alpha": 0.3, "beta": 0.4}),
    "HardSwish": ("HardSwish", {"x": X}, 17, {}),
    "Softplus": ("Softplus", {"x": X}, 17, {}),
    "Elu": ("Elu", {"x": X}, 17, {}),
    "Elu_alpha": ("Elu", {"x": X}, 17, {"alpha": 0.5}),
    "Selu": ("Selu", {"x": X}, 17, {}),
    "Selu_attrs": ("Selu", {"x": X}, 17, {"alpha": 2.0, "gamma": 1.5}),
    "Mish": ("Mish", {"x": X}, 18, {}),
    "Floor": ("Floor", {"x": X}, 17, {}),
    "Ceil": ("Ceil", {"x": X}, 17, {}),
    "Round": ("Round", {"x": X}, 17, {}),
    "Sign": ("Sign", {"x": X}, 17, {}),
    "PRelu": ("PRelu", {"x": X, "slope": np.float32([0.1, -0.2, 0.3, 1.0, 0.0, 2.0])}, 17, {}),
    "PRelu_column": ("PRelu", {"x": X, "slope": np.float32([[0.1], [0.2], [0.3], [0.4]])}, 17, {}),
    "Mod_int": ("Mod", {"a": A_INT, "b": B_INT}, 17, {}),
    "Mod_int_fmod": ("Mod", {"a": A_INT, "b": B_INT}, 17, {"fmod": 1}),
    "Mod_float_fmod": ("Mod", {"a": X, "b": np.float32([1.5, -2.0, 0.75, -1.0, 3.0, -0.5])}, 17, {"fmod": 1}),
    # floor mod of floats: from opset 28 (onnxruntime refuses it before); zeros and inf at the edges
    "Mod_float": ("Mod", {"a": np.float32([[5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 1.0, -1.0]]),
                          "b": np.float32([[2, 2, -2, -2, -3, 3, np.inf, np.inf]])}, 28, {}),
    "IsNaN": ("IsNaN", {"x": SPECIAL}, 17, {}),
    "IsInf": ("IsInf", {"x": SPECIAL}, 17, {}),
    "IsInf_positive": ("IsInf", {"x": SPECIAL}, 17, {"detect_negative": 0}),
    "IsInf_negative": ("IsInf", {"x": SPECIAL}, 17, {"detect_positive": 0}),
    "And": ("And", {"p": P, "q": Q}, 17, {}),
    "Or": ("Or", {"p": P, "q": Q}, 17, {}),
    "Xor": ("Xor", {"p": P, "q": Q}, 17, {}),
    "Not": ("Not", {"p": P}, 17, {}),
    "Sum": ("Sum", {"a": X, "b": X[:1], "c": X[:, :1]}, 17, {}),
    "Sum_one": ("Sum", {"a": X}, 17, {}),
    "Mean": ("Mean", {"a": X, "b": X[:1], "c": X[:, :1]}, 17, {}),
    "Max": ("Max", {"a": X, "b": X[:1], "c": X[:, :1]}, 17, {}),
    "Min": ("Min", {"a": X, "b": X[:1], "c": X[:, :1]}, 17, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_onnxruntime(case):
    op_type, inputs, opset, attrs = CASES[case]
    got, want, program = run_both(one_node(op_type, inputs, opset, **attrs), inputs)
    assert got.shape == want.shape
    if want.dtype == bool or want.dtype.kind in "iu":  # truth values (u8) and integers: exactly
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))
        return
    atol, rtol = tolerance(program.graph.tensors["y"].dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    if op_type in ("Floor", "Ceil", "Round", "Sign"):  # exact, halves to even for Round
        np.testing.assert_array_equal(got, want)


def test_an_activation_fuses_after_a_matmul():
    """MatMul + Add + HardSwish: one kernel, the activation an epilogue, still as onnxruntime."""
    w = np.random.default_rng(3).uniform(-1, 1, (6, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["z"]),
             helper.make_node("HardSwish", ["z"], ["y"])]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 6])],
                              [onnx.ValueInfoProto(name="y")],
                              [onnx.numpy_helper.from_array(w, "w"),
                               onnx.numpy_helper.from_array(np.float32([-3, -1, 0, 1, 3]), "bias")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = IR_VERSION
    got, want, program = run_both(m, {"x": X})
    assert [(k.graph_op, len(k.epilogue)) for k in program.kernels] == [("matmul_0", 2)]
    atol, rtol = tolerance("f32")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
