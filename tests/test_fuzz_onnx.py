"""Fuzz the ONNX frontend and the compiler behind it: truncated and mutated bytes of small models,
and models whose nodes, attributes and shapes are edited, compile or raise a one-line
CompileError naming the file, never another exception."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from conftest import CONFIGS, examples
from kernel_compiler import compile_graph, load_target
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.frontends.onnx_ops import OPS
from kernel_compiler.shape_inference import infer_shapes

TARGET = load_target(str(CONFIGS / "standard.json"))
F32 = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
                              [onnx.ValueInfoProto(name=o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _seeds() -> list[onnx.ModelProto]:
    rng = np.random.default_rng(0)
    f = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    mlp = _model([helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1, alpha=0.5),
                  helper.make_node("Relu", ["h"], ["r"]),
                  helper.make_node("Softmax", ["r"], ["y"], axis=-1)],
                 [("x", [2, 8])], ["y"], {"w": f(4, 8), "b": f(4)})
    cnn = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], group=1),
                  helper.make_node("BatchNormalization", ["c", "s", "t", "m", "v"], ["n"]),
                  helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2, 2], strides=[1, 1]),
                  helper.make_node("GlobalAveragePool", ["p"], ["y"])],
                 [("x", [1, 2, 6, 6])], ["y"], {"w": f(4, 2, 3, 3), "s": f(4), "t": f(4), "m": f(4), "v": f(4) + 2})
    layout = _model([helper.make_node("Reshape", ["x", "shape"], ["r"]),
                     helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
                     helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
                     helper.make_node("Unsqueeze", ["s", "ax"], ["u"]),
                     helper.make_node("Concat", ["u", "u"], ["c"], axis=0),
                     helper.make_node("ReduceMean", ["c", "ax"], ["y"], keepdims=0),
                     helper.make_node("LayerNormalization", ["t", "g"], ["z"], axis=-1)],
                    [("x", [2, 3, 4])], ["y", "z"],
                    {"shape": i64(3, 2, 4), "starts": i64(0, 1), "ends": i64(2, 4), "axes": i64(1, 2),
                     "ax": i64(0), "g": f(4)}, opset=18)
    return [mlp, cnn, layout]


SEEDS = _seeds()
OP_TYPES = sorted(OPS) + ["Softplus", "Shape", ""]


def compile_or_refuse(data: bytes) -> None:
    try:
        graph, warnings = parse_onnx("fuzz.onnx", data)
        compile_graph(infer_shapes(graph, warnings), "fuzz.onnx", TARGET)
    except CompileError as exc:
        message = str(exc)
        assert message.startswith("fuzz.onnx:") and "\n" not in message, message


# ---- byte mutations ----------------------------------------------------------------------------

byte_edit = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                      st.integers(0, 1 << 16), st.integers(0, 255))


def edit_bytes(data: bytearray, kind: str, at: int, value: int) -> None:
    if not data:
        return
    at %= len(data)
    if kind == "flip":
        data[at] ^= 1 << (value % 8)
    elif kind == "set":
        data[at] = value
    elif kind == "insert":
        data.insert(at, value)
    elif kind == "delete":
        del data[at:at + 1 + value % 4]
    else:
        del data[at:]


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(SEEDS))), edits=st.lists(byte_edit, min_size=1, max_size=6))
def test_mutated_onnx_bytes_compile_or_fail_cleanly(seed, edits):
    data = bytearray(SEEDS[seed].SerializeToString())
    for edit in edits:
        edit_bytes(data, *edit)
    compile_or_refuse(bytes(data))


# ---- model mutations: valid protobuf, edited nodes, attributes and shapes ------------------------

model_edit = st.tuples(st.sampled_from(["op_type", "attr_int", "attr_ints", "drop_input", "swap_inputs",
                                        "input_dim", "opset", "init_dims"]),
                       st.integers(0, 1000), st.integers(-3, 40), st.sampled_from(OP_TYPES))


def edit_model(m: onnx.ModelProto, kind: str, at: int, value: int, op_type: str) -> None:
    g = m.graph
    node = g.node[at % len(g.node)] if g.node else None
    if kind == "op_type" and node is not None:
        node.op_type = op_type
    elif kind in ("attr_int", "attr_ints") and node is not None and node.attribute:
        attr = node.attribute[at % len(node.attribute)]
        if attr.type == onnx.AttributeProto.INT:
            attr.i = value
        elif attr.type == onnx.AttributeProto.INTS and attr.ints:
            attr.ints[at % len(attr.ints)] = value
        elif attr.type == onnx.AttributeProto.FLOAT:
            attr.f = value / 7
    elif kind == "drop_input" and node is not None and node.input:
        del node.input[at % len(node.input)]
    elif kind == "swap_inputs" and node is not None and len(node.input) > 1:
        node.input[0], node.input[-1] = node.input[-1], node.input[0]
    elif kind == "input_dim" and g.input:
        dims = g.input[at % len(g.input)].type.tensor_type.shape.dim
        if dims:
            dims[at % len(dims)].dim_value = max(value, 0)
    elif kind == "opset":
        m.opset_import[0].version = 9 + value % 22
    elif kind == "init_dims" and g.initializer:
        init = g.initializer[at % len(g.initializer)]
        values = numpy_helper.to_array(init).reshape(-1)
        if values.size:
            values = values.copy()
            values[at % values.size] = value
            init.CopyFrom(numpy_helper.from_array(values.reshape(numpy_helper.to_array(init).shape), init.name))


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(SEEDS))), edits=st.lists(model_edit, min_size=1, max_size=4))
def test_edited_onnx_models_compile_or_fail_cleanly(seed, edits):
    m = onnx.ModelProto()
    m.CopyFrom(SEEDS[seed])
    for edit in edits:
        edit_model(m, *edit)
    compile_or_refuse(m.SerializeToString())


def test_the_seed_models_compile():
    for m in SEEDS:
        graph, warnings = parse_onnx("fuzz.onnx", m.SerializeToString())
        assert compile_graph(infer_shapes(graph, warnings), "fuzz.onnx", TARGET).kernels
