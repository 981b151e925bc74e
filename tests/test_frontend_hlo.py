"""The XLA HLO text frontend: its syntax, each op against numpy computed here (compiled, bound,
executed tile by tile in-process), its errors, the names of inputs and outputs, and the corpus
(JAX and XLA modules, ACT's attention kernel) compiled and checked on the standard config."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import CONFIGS, assert_one_line_error, run_cli
from dfx import Op, dumps, loads, numpy_dtype
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import FRONTENDS, load_graph
from kernel_compiler.frontends.hlo import parse_hlo
from kernel_compiler.passes import CONTRACTION, RECOGNISE, canonicalise
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, check_outputs, execute, program_inputs
from test_passes import Builder, recognised, types

DATA = Path(__file__).parent / "data" / "hlo"
CORPUS = sorted(DATA.glob("*.hlo"))
STANDARD = str(CONFIGS / "standard.json")
RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _same_draws_in_any_order():
    """Each test draws the same numbers, whichever tests ran before it."""
    global RNG
    RNG = np.random.default_rng(11)


def parse(text: str, file: str = "t.hlo"):
    graph, warnings = parse_hlo(file, text)
    return infer_shapes(graph, warnings), warnings


def compile_hlo(text: str):
    graph, _ = parse(text)
    return loads(dumps(compile_graph(graph, "t.hlo", load_target(STANDARD))))


def run_hlo(text: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Compile, bind, execute; every output, after the loader's own check has passed."""
    program = compile_hlo(text)
    bindings = bind_program(program, load_machine(STANDARD), "test", bind_greedy)
    values = execute(program, bindings, program_inputs(program, feeds, 0))
    for name, check in check_outputs(program, values).items():
        assert check.passed, (name, check)
    return {t.name: values[t.name] for t in program.graph.outputs}


def error(text: str) -> str:
    with pytest.raises(CompileError) as info:
        parse(text)
    message = str(info.value)
    assert "\n" not in message
    return message


def rand(*shape: int, dtype=np.float32, low=-2.0, high=2.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(dtype)


def one(text: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    [value] = run_hlo(text, feeds).values()
    return value


# ---- syntax ----------------------------------------------------------------------------------

FULL_SYNTAX = """HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[2,3]{1,0:T(8,128)}, f32[2,3]{1,0})->(f32[2,3]{1,0}, f32[3,2]{0,1})}, frontend_attributes={a="b,}"}

/* a block
   comment */
%fused_add (param_0: f32[2,3], param_1.1: f32[2,3]) -> f32[2,3] {
  %param_0 = f32[2,3]{1,0} parameter(0)
  %param_1.1 = f32[2,3]{1,0} parameter(1)
  ROOT %add.0 = f32[2,3]{1,0} add(f32[2,3]{1,0} %param_0, f32[2,3]{1,0} %param_1.1), metadata={op_name="jit(f)/add" source_file="x.py" source_line=3}
}

ENTRY %main.9 (Arg_0.1: f32[2,3], Arg_1.2: f32[2,3]) -> (f32[2,3], f32[3,2]) {
  %Arg_0.1 = f32[2,3]{1,0:T(8,128)S(1)} parameter(0), sharding={devices=[2,1]<=[2]}
  %Arg_1.2 = f32[2,3]{1,0} parameter(1), parameter_replication={false}
  %fusion = f32[2,3]{1,0} fusion(%Arg_0.1, %Arg_1.2), kind=kLoop, calls=%fused_add, backend_config={"outer":{"x":[1,2]}, "s":"}"}
  %transpose.3 = f32[3,2]{0,1} transpose(%fusion), dimensions={1,0}, unknown_thing={{1,2},{3}}, origin='q'
  ROOT %tuple.4 = (f32[2,3]{1,0}, f32[3,2]{0,1}) tuple(%fusion, %transpose.3) // trailing comment
}
"""


def test_full_syntax_names_layouts_attributes_fusion_and_tuple_root():
    graph, warnings = parse(FULL_SYNTAX)
    assert graph.name == "jit_f" and warnings == []
    assert [t.name for t in graph.inputs] == ["Arg_0.1", "Arg_1.2"]
    assert [t.name for t in graph.outputs] == ["tuple.4.0", "tuple.4.1"]
    assert [(op.op_type, op.inputs) for op in graph.ops] == [("ADD", ["Arg_0.1", "Arg_1.2"]),
                                                              ("TRANSPOSE", ["tuple.4.0"])]
    assert graph.tensors["tuple.4.1"].shape == (3, 2)
    assert graph.ops[0].source == "t.hlo:8 'add.0'"  # the fused computation's line
    a, b = rand(2, 3), rand(2, 3)
    out = run_hlo(FULL_SYNTAX, {"Arg_0.1": a, "Arg_1.2": b})
    np.testing.assert_allclose(out["tuple.4.0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["tuple.4.1"], (a + b).T, rtol=1e-6)


def test_plain_names_no_layout_header_without_attributes_last_computation_and_instruction():
    # no ENTRY mark: the last computation; no ROOT mark: the last instruction
    graph, _ = parse("HloModule m\nfirst {\n p = f32[4] parameter(0)\n ROOT n = f32[4] negate(p)\n}\n"
                     "second {\n x = f32[4] parameter(0)\n y = f32[4] exponential(x)\n z = f32[4] abs(y)\n}\n")
    assert [op.op_type for op in graph.ops] == ["EXP", "ABS"]
    assert [t.name for t in graph.outputs] == ["z"] and [t.name for t in graph.inputs] == ["x"]


def test_get_tuple_element_root_and_call_inlined():
    text = """HloModule m
sq {
  a = f32[5] parameter(0)
  ROOT m = f32[5] multiply(a, a)
}
ENTRY e {
  x = f32[5] parameter(0)
  c = f32[5] call(x), to_apply=sq
  t = (f32[5], f32[5]) tuple(x, c)
  ROOT g = f32[5] get-tuple-element(t), index=1
}"""
    graph, _ = parse(text)
    assert [t.name for t in graph.outputs] == ["g"]
    assert graph.ops[0].inputs == ["x", "x"]
    x = rand(5)
    np.testing.assert_allclose(one(text, {"x": x}), x * x, rtol=1e-6)


def test_multi_output_fusion_and_a_root_repeating_a_value_or_a_parameter():
    text = """HloModule m
and_r {
  a = pred[] parameter(0)
  b = pred[] parameter(1)
  ROOT c = pred[] and(a, b)
}
fused {
  p = f32[3,4] parameter(0)
  s = f32[] parameter(1)
  sb = f32[3,4] broadcast(s), dimensions={}
  e = f32[3,4] multiply(p, sb)
  n = f32[3,4] negate(p)
  ROOT t = (f32[3,4], f32[3,4]) tuple(e, n)
}
ENTRY e {
  x = f32[3,4] parameter(0)
  s = f32[] parameter(1)
  f = (f32[3,4], f32[3,4]) fusion(x, s), kind=kLoop, calls=fused
  g0 = f32[3,4] get-tuple-element(f), index=0
  g1 = f32[3,4] get-tuple-element(f), index=1
  z = f32[] constant(0)
  zb = f32[3,4] broadcast(z), dimensions={}
  pos = pred[3,4] compare(x, zb), direction=GT
  t = pred[] constant(true)
  all = pred[3] reduce(pos, t), dimensions={1}, to_apply=and_r
  ub = f32[4,3] broadcast(g0), dimensions={1,0}
  ROOT r = (f32[3,4], f32[3,4], f32[3,4], pred[3], f32[4,3], f32[3,4]) tuple(g0, g0, x, all, ub, g1)
}"""
    graph, _ = parse(text)
    assert [t.name for t in graph.outputs] == [f"r.{i}" for i in range(6)]
    assert "REDUCE_MIN" in [op.op_type for op in graph.ops] and "MINIMUM" not in [op.op_type for op in graph.ops]
    x = rand(3, 4)
    out = run_hlo(text, {"x": x, "s": np.float32(2.0)})
    np.testing.assert_array_equal(out["r.0"], x * 2)
    np.testing.assert_array_equal(out["r.1"], x * 2)  # a copy: the same value twice
    np.testing.assert_array_equal(out["r.2"], x)  # the parameter itself, copied to an output
    np.testing.assert_array_equal(out["r.3"], (x > 0).all(axis=1))
    np.testing.assert_array_equal(out["r.4"], (x * 2).T)  # a broadcast that transposes
    np.testing.assert_array_equal(out["r.5"], -x)


@pytest.mark.parametrize("literal, dtype, want", [
    ("-inf", "f32", -np.inf),
    ("inf", "f32", np.inf),
    ("{1,1,1}", "f32", [1, 1, 1]),
    ("{ {1, 2}, {3, 4} }", "f32", [[1, 2], [3, 4]]),
    ("{true, false, true}", "pred", [1, 0, 1]),
    ("{-3, 7}", "s8", [-3, 7]),
    ("1.5e-3", "f16", 1.5e-3),
    ("{1e+10, -2.5}", "f64", [1e10, -2.5]),
])
def test_constants_hold_their_values(literal, dtype, want):
    want = np.asarray(want)
    shape = ",".join(map(str, want.shape))
    text = f"HloModule m\nENTRY e {{\n  ROOT c = {dtype}[{shape}] constant({literal})\n}}"
    graph, _ = parse(text)
    [value] = [name for name, t in graph.tensors.items() if t.role == "constant"]
    t = graph.tensors[value]
    got = np.frombuffer(graph.constants[value], numpy_dtype(t.dtype)).reshape(t.shape)
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(numpy_dtype(t.dtype)).astype(np.float64))
    assert [t.name for t in graph.outputs] == ["c"]  # a copy of the constant under the ROOT's name


def test_nan_constant_and_a_scalar_broadcast_into_a_map():
    text = """HloModule m
ENTRY e {
  x = f32[3] parameter(0)
  n = f32[] constant(nan)
  b = f32[3] broadcast(n), dimensions={}
  ROOT r = f32[3] maximum(x, b)
}"""
    assert np.isnan(one(text, {"x": rand(3)})).all()


def test_operands_written_with_their_shapes_and_comments_between_tokens():
    text = """HloModule m
ENTRY %e (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0) /* index=0 */
  ROOT %s = f32[2]{0} subtract(f32[2]{0} %p, /*index=1*/ f32[2]{0} %p)
}"""
    graph, _ = parse(text)
    assert [(op.op_type, op.inputs) for op in graph.ops] == [("SUB", ["p", "p"])]


def test_unused_parameters_and_dead_instructions_are_dropped():
    text = """HloModule m
ENTRY e {
  a = f32[2] parameter(0)
  b = f32[2] parameter(1)
  dead = f32[2] sort(a), dimensions={0}
  ROOT r = f32[2] exponential(a)
}"""
    graph, warnings = parse(text)
    assert [t.name for t in graph.inputs] == ["a"]
    assert warnings == ["t.hlo:4: parameter 'b' is not used; skipped"]


@pytest.mark.parametrize("name", ["m.hlo", "module.after_optimizations.hlo.txt", "M.HLO.TXT"])
def test_hlo_is_registered_and_read_by_extension(tmp_path, name):
    assert FRONTENDS[".hlo"] is FRONTENDS[".hlo.txt"] is parse_hlo
    path = tmp_path / name  # `.hlo.txt` as XLA's dumps name them
    path.write_text("HloModule m\nENTRY e {\n p = f32[8] parameter(0)\n ROOT t = f32[8] tanh(p)\n}\n")
    graph, _ = load_graph(str(path))
    assert [op.op_type for op in graph.ops] == ["TANH"]


def test_a_plain_txt_file_is_not_read_as_hlo(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("HloModule m\n")
    with pytest.raises(CompileError, match="unsupported input type '.txt'"):
        load_graph(str(path))


# ---- ops against numpy -----------------------------------------------------------------------


def _erf(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


UNARY = [
    ("exponential", np.exp), ("log", np.log), ("rsqrt", lambda x: 1 / np.sqrt(x)), ("sqrt", np.sqrt),
    ("tanh", np.tanh), ("logistic", lambda x: 1 / (1 + np.exp(-x))), ("erf", _erf), ("negate", np.negative),
    ("abs", np.abs),
]


@pytest.mark.parametrize("opcode, fn", UNARY, ids=[u[0] for u in UNARY])
def test_unary(opcode, fn):
    positive = opcode in ("log", "rsqrt", "sqrt")
    x = rand(3, 33, low=0.1 if positive else -2, high=3)
    text = f"HloModule m\nENTRY e {{\n x = f32[3,33] parameter(0)\n ROOT y = f32[3,33] {opcode}(x)\n}}"
    np.testing.assert_allclose(one(text, {"x": x}), fn(x.astype(np.float64)), rtol=2e-6, atol=1e-6)


BINARY = [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply), ("divide", np.divide),
          ("maximum", np.maximum), ("minimum", np.minimum), ("power", np.power)]


@pytest.mark.parametrize("opcode, fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary(opcode, fn):
    x, y = rand(4, 17, low=0.5, high=2), rand(4, 17, low=-2, high=2)
    text = (f"HloModule m\nENTRY e {{\n x = f32[4,17] parameter(0)\n y = f32[4,17] parameter(1)\n"
            f" ROOT z = f32[4,17] {opcode}(x, y)\n}}")
    np.testing.assert_allclose(one(text, {"x": x, "y": y}), fn(x.astype(np.float64), y), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("direction, fn", [("EQ", np.equal), ("NE", np.not_equal), ("LT", np.less),
                                           ("LE", np.less_equal), ("GT", np.greater), ("GE", np.greater_equal)])
def test_compare_then_select(direction, fn):
    x = RNG.integers(-3, 3, (5, 6)).astype(np.float32)
    y = RNG.integers(-3, 3, (5, 6)).astype(np.float32)
    text = f"""HloModule m
ENTRY e {{
  x = f32[5,6] parameter(0)
  y = f32[5,6] parameter(1)
  c = pred[5,6] compare(x, y), direction={direction}, type=TOTALORDER
  ROOT s = f32[5,6] select(c, x, y)
}}"""
    np.testing.assert_array_equal(one(text, {"x": x, "y": y}), np.where(fn(x, y), x, y))


def test_compare_as_output_is_zero_or_one():
    x, y = rand(7), rand(7)
    text = ("HloModule m\nENTRY e {\n x = f32[7] parameter(0)\n y = f32[7] parameter(1)\n"
            " ROOT c = pred[7] compare(x, y), direction=NE\n}")
    got = one(text, {"x": x, "y": np.where(np.arange(7) % 2 == 0, x, y)})
    np.testing.assert_array_equal(got, (np.arange(7) % 2 == 1).astype(np.uint8))


def test_clamp_with_scalar_bounds_and_logical_ops_on_pred():
    x = rand(3, 9, low=-3, high=3)
    text = """HloModule m
ENTRY e {
  x = f32[3,9] parameter(0)
  lo = f32[] constant(-1)
  hi = f32[] constant(1.5)
  c = f32[3,9] clamp(lo, x, hi)
  z = f32[] constant(0)
  zb = f32[3,9] broadcast(z), dimensions={}
  pos = pred[3,9] compare(x, zb), direction=GT
  big = pred[3,9] compare(c, zb), direction=LT
  either = pred[3,9] or(pos, big)
  both = pred[3,9] and(pos, big)
  neither = pred[3,9] not(either)
  ROOT t = (f32[3,9], pred[3,9], pred[3,9], pred[3,9]) tuple(c, either, both, neither)
}"""
    out = run_hlo(text, {"x": x})
    pos, big = x > 0, np.clip(x, -1, 1.5) < 0
    np.testing.assert_array_equal(out["t.0"], np.clip(x, -1, 1.5))
    np.testing.assert_array_equal(out["t.1"], pos | big)
    np.testing.assert_array_equal(out["t.2"], pos & big)
    np.testing.assert_array_equal(out["t.3"], ~(pos | big))


def test_convert_between_float_integer_and_pred():
    x = np.array([[-2.7, -0.5, 0.0, 0.4, 1.5, 300.2]], np.float32)
    text = """HloModule m
ENTRY e {
  x = f32[1,6] parameter(0)
  h = f16[1,6] convert(x)
  i = s32[1,6] convert(x)
  p = pred[1,6] convert(x)
  back = f32[1,6] convert(p)
  ROOT t = (f16[1,6], s32[1,6], f32[1,6]) tuple(h, i, back)
}"""
    out = run_hlo(text, {"x": x})
    np.testing.assert_array_equal(out["t.0"], x.astype(np.float16))
    np.testing.assert_array_equal(out["t.1"], np.trunc(x).astype(np.int32))
    np.testing.assert_array_equal(out["t.2"], (x != 0).astype(np.float32))


def test_broadcasts_left_to_the_readers_and_one_made_whole_as_an_output():
    row, col = rand(8), rand(5)
    text = """HloModule m
ENTRY e {
  row = f32[8] parameter(0)
  col = f32[5] parameter(1)
  r = f32[5,8] broadcast(row), dimensions={1}
  c = f32[5,8] broadcast(col), dimensions={0}
  s = f32[5,8] add(r, c)
  ROOT t = (f32[5,8], f32[5,8]) tuple(s, c)
}"""
    graph, _ = parse(text)
    # row broadcasts as it is; col is reshaped to [5, 1]; no op materialises s's operands
    assert [op.op_type for op in graph.ops] == ["RESHAPE", "ADD", "MUL"]
    out = run_hlo(text, {"row": row, "col": col})
    np.testing.assert_allclose(out["t.0"], row[None, :] + col[:, None], rtol=1e-6)
    np.testing.assert_array_equal(out["t.1"], np.broadcast_to(col[:, None], (5, 8)))


def test_broadcast_into_the_middle_and_a_reshape_of_a_broadcast():
    x = rand(3, 4)
    text = """HloModule m
ENTRY e {
  x = f32[3,4] parameter(0)
  b = f32[3,2,4] broadcast(x), dimensions={0,2}
  ROOT r = f32[6,4] reshape(b)
}"""
    np.testing.assert_array_equal(one(text, {"x": x}), np.broadcast_to(x[:, None, :], (3, 2, 4)).reshape(6, 4))


def test_reshape_bitcast_transpose():
    x = rand(2, 3, 4)
    text = """HloModule m
ENTRY e {
  x = f32[2,3,4] parameter(0)
  r = f32[24] reshape(x)
  b = f32[4,6] bitcast(r)
  t = f32[6,4] transpose(b), dimensions={1,0}
  u = f32[3,2,4] transpose(x), dimensions={1,0,2}
  ROOT o = (f32[6,4], f32[3,2,4]) tuple(t, u)
}"""
    out = run_hlo(text, {"x": x})
    np.testing.assert_array_equal(out["o.0"], x.reshape(4, 6).T)
    np.testing.assert_array_equal(out["o.1"], x.transpose(1, 0, 2))


DOTS = [
    # (lhs shape, rhs shape, attributes, einsum)
    ((16, 24), (24, 8), "lhs_contracting_dims={1}, rhs_contracting_dims={0}", "mk,kn->mn"),
    ((16, 24), (8, 24), "lhs_contracting_dims={1}, rhs_contracting_dims={1}", "mk,nk->mn"),
    ((24, 16), (24, 8), "lhs_contracting_dims={0}, rhs_contracting_dims={0}", "km,kn->mn"),
    ((3, 16, 24), (3, 24, 8), "lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, "
                              "rhs_contracting_dims={1}", "bmk,bkn->bmn"),
    ((16, 3, 24), (8, 24, 3), "lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={2}, "
                              "rhs_contracting_dims={1}", "mbk,nkb->bmn"),
    ((4, 5, 6), (5, 6, 7), "lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}", "mkl,kln->mn"),
    ((24,), (24, 8), "lhs_contracting_dims={0}, rhs_contracting_dims={0}", "k,kn->n"),
    ((2, 3, 24), (24, 4, 5), "lhs_contracting_dims={2}, rhs_contracting_dims={0}", "abk,kcd->abcd"),
]


@pytest.mark.parametrize("lhs, rhs, attrs, spec", DOTS, ids=[d[3] for d in DOTS])
def test_dot(lhs, rhs, attrs, spec):
    a, b = rand(*lhs), rand(*rhs)
    want = np.einsum(spec, a.astype(np.float64), b.astype(np.float64))
    shape = ",".join(map(str, want.shape))
    text = (f"HloModule m\nENTRY e {{\n a = f32[{','.join(map(str, lhs))}] parameter(0)\n"
            f" b = f32[{','.join(map(str, rhs))}] parameter(1)\n"
            f" ROOT d = f32[{shape}] dot(a, b), {attrs}, operand_precision={{default,default}}\n}}")
    np.testing.assert_allclose(one(text, {"a": a, "b": b}), want, rtol=1e-5, atol=1e-5)


def test_dot_with_rhs_contracting_its_last_dim_is_a_transposed_load():
    text = ("HloModule m\nENTRY e {\n a = f32[32,64] parameter(0)\n b = f32[48,64] parameter(1)\n"
            " ROOT d = f32[32,48] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}\n}")
    program = compile_hlo(text)
    [kernel] = program.kernels
    assert kernel.op == "MATMUL"
    [op] = program.graph.ops
    assert op.attrs == {"transpose_b": True} and op.inputs == ["a", "b"]


def _conv_nhwc(x, w_hwio, stride, pad, dilation, groups=1):
    """Direct convolution: x [N, H, W, C], w [KH, KW, C/groups, O] -> [N, OH, OW, O]."""
    x = np.pad(x.astype(np.float64), [(0, 0), pad[0], pad[1], (0, 0)])
    kh, kw, cg, o = w_hwio.shape
    oh = (x.shape[1] - ((kh - 1) * dilation[0] + 1)) // stride[0] + 1
    ow = (x.shape[2] - ((kw - 1) * dilation[1] + 1)) // stride[1] + 1
    out = np.zeros((x.shape[0], oh, ow, o))
    per = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = x[:, i * dilation[0]: i * dilation[0] + (oh - 1) * stride[0] + 1: stride[0],
                          j * dilation[1]: j * dilation[1] + (ow - 1) * stride[1] + 1: stride[1],
                          g * cg:(g + 1) * cg]
                out[..., g * per:(g + 1) * per] += patch @ w_hwio[i, j, :, g * per:(g + 1) * per]
    return out


def test_convolution_nhwc_with_stride_padding_and_dilation():
    x, w = rand(2, 9, 10, 3), rand(3, 3, 3, 8)
    want = _conv_nhwc(x, w, (2, 1), ((1, 2), (0, 1)), (1, 2))
    text = f"""HloModule m
ENTRY e {{
  x = f32[2,9,10,3] parameter(0)
  w = f32[3,3,3,8] parameter(1)
  ROOT y = f32[{','.join(map(str, want.shape))}] convolution(x, w), window={{size=3x3 stride=2x1 pad=1_2x0_1 rhs_dilate=1x2}}, dim_labels=b01f_01io->b01f, feature_group_count=1
}}"""
    graph, _ = parse(text)
    assert [op.op_type for op in graph.ops] == ["TRANSPOSE", "CONV2D"]  # the weights to OHWI
    np.testing.assert_allclose(one(text, {"x": x, "w": w}), want, rtol=1e-5, atol=1e-5)


def test_convolution_nchw_grouped():
    x, w = rand(1, 4, 7, 7), rand(6, 2, 3, 3)  # OIHW, 2 groups of 2 input channels
    w_hwio = w.transpose(2, 3, 1, 0)
    want = _conv_nhwc(x.transpose(0, 2, 3, 1), w_hwio, (1, 1), ((1, 1), (1, 1)), (1, 1), groups=2)
    text = """HloModule m
ENTRY e {
  x = f32[1,4,7,7] parameter(0)
  w = f32[6,2,3,3] parameter(1)
  ROOT y = f32[1,6,7,7] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=bf01_oi01->bf01, feature_group_count=2
}"""
    np.testing.assert_allclose(one(text, {"x": x, "w": w}), want.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)


REDUCES = [("add", "0", np.sum), ("maximum", "-inf", np.max), ("minimum", "inf", np.min),
           ("multiply", "1", np.prod), ("add", "2.5", lambda x, axis: np.sum(x, axis=axis) + 2.5),
           ("maximum", "0.25", lambda x, axis: np.maximum(np.max(x, axis=axis), 0.25))]


@pytest.mark.parametrize("kind, init, fn", REDUCES, ids=[f"{k}-{i}" for k, i, _ in REDUCES])
def test_reduce(kind, init, fn):
    x = rand(4, 6, 5, low=0.5, high=1.5) if kind == "multiply" else rand(4, 6, 5)
    text = f"""HloModule m
r {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] {kind}(a, b)
}}
ENTRY e {{
  x = f32[4,6,5] parameter(0)
  i = f32[] constant({init})
  ROOT y = f32[6] reduce(x, i), dimensions={{0,2}}, to_apply=r
}}"""
    graph, _ = parse(text)
    assert len(graph.ops) == (1 if init in ("0", "1", "-inf", "inf") else 2)
    np.testing.assert_allclose(one(text, {"x": x}), fn(x.astype(np.float64), axis=(0, 2)), rtol=1e-5, atol=1e-5)


def test_slice_with_and_without_strides():
    x = rand(6, 10)
    text = """HloModule m
ENTRY e {
  x = f32[6,10] parameter(0)
  a = f32[2,4] slice(x), slice={[1:3], [2:6]}
  b = f32[2,3] slice(x), slice={[0:6:3], [1:10:3]}
  ROOT t = (f32[2,4], f32[2,3]) tuple(a, b)
}"""
    out = run_hlo(text, {"x": x})
    np.testing.assert_array_equal(out["t.0"], x[1:3, 2:6])
    np.testing.assert_array_equal(out["t.1"], x[0:6:3, 1:10:3])


def test_concatenate_and_pad():
    x, y = rand(3, 4), rand(3, 2)
    text = """HloModule m
ENTRY e {
  x = f32[3,4] parameter(0)
  y = f32[3,2] parameter(1)
  c = f32[3,6] concatenate(x, y), dimensions={1}
  v = f32[] constant(-1.5)
  p = f32[6,7] pad(c, v), padding=1_2x0_1
  q = f32[2,8] pad(x, v), padding=-1_0x2_2
  ROOT t = (f32[6,7], f32[2,8]) tuple(p, q)
}"""
    out = run_hlo(text, {"x": x, "y": y})
    c = np.concatenate([x, y], axis=1)
    np.testing.assert_array_equal(out["t.0"], np.pad(c, [(1, 2), (0, 1)], constant_values=-1.5))
    np.testing.assert_array_equal(out["t.1"], np.pad(x[1:], [(0, 0), (2, 2)], constant_values=-1.5))


def xla_pad(x: np.ndarray, pads: list[tuple[int, int, int]], value: float) -> np.ndarray:
    """XLA's pad in numpy, dim by dim: `interior` values between the elements, then `lo` and `hi`
    more at the ends (negative: that many cut off)."""
    for axis, (lo, hi, interior) in enumerate(pads):
        n = x.shape[axis]
        spread = np.full(x.shape[:axis] + (n + max(n - 1, 0) * interior,) + x.shape[axis + 1:], value, x.dtype)
        every = [slice(None)] * x.ndim
        every[axis] = slice(None, None, interior + 1)
        spread[tuple(every)] = x
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        spread = np.pad(spread, widths, constant_values=value)
        every[axis] = slice(max(-lo, 0), spread.shape[axis] - max(-hi, 0))
        x = spread[tuple(every)]
    return x


# operand shape -> padding, lo_hi_interior per dim
INTERIOR_PADS = {
    (5,): [(1, 2, 1)],
    (3, 4): [(0, -1, 1), (-2, 1, 2)],  # crops into the spread: its last value, and an element
    (4,): [(2, 1, 2)],  # padded with -0.0: its sign bit between the elements too
    (1, 3): [(1, 0, 3), (0, 0, 1)],  # a dim of one element has nothing between
    (2, 3, 4): [(0, 0, 0), (0, 0, 1), (1, 1, 1)],  # as avg_pool's gradient spreads a stride-2 window's
}


@pytest.mark.parametrize("shape", INTERIOR_PADS, ids=str)
def test_interior_padding_spreads_the_elements_by_the_padding_value(shape):
    """XLA's pad with interior padding (the gradient of a strided convolution or pool, an
    associative scan) against numpy: a RESHAPE, PAD and RESHAPE per spread dim, as a transposed
    convolution's input is dilated."""
    pads, x = INTERIOR_PADS[shape], rand(*shape)
    value = -0.0 if shape == (4,) else -0.5
    want = xla_pad(x, pads, value)
    padding = "x".join(f"{lo}_{hi}_{interior}" for lo, hi, interior in pads)
    text = (f"HloModule m\nENTRY e {{\n  x = f32[{','.join(map(str, shape))}] parameter(0)\n  v = f32[] constant({value})\n"
            f"  ROOT p = f32[{','.join(map(str, want.shape))}] pad(x, v), padding={padding}\n}}\n")
    got = one(text, {"x": x})
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_iota_is_a_constant_read_through_broadcasting():
    x = rand(3, 5)
    text = """HloModule m
ENTRY e {
  x = f32[3,5] parameter(0)
  i = s32[3,5] iota(), iota_dimension=1
  f = f32[3,5] convert(i)
  ROOT y = f32[3,5] multiply(x, f)
}"""
    graph, _ = parse(text)
    assert [op.op_type for op in graph.ops] == ["MUL"]  # the iota and its convert folded to [5]
    np.testing.assert_allclose(one(text, {"x": x}), x * np.arange(5), rtol=1e-6)


# ---- pattern recognition on HLO spellings ----------------------------------------------------

SOFTMAX = """HloModule s
max_r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
add_r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[4,37] parameter(0)
  ninf = f32[] constant(-inf)
  mx = f32[4] reduce(x, ninf), dimensions={1}, to_apply=max_r
  mb = f32[4,37] broadcast(mx), dimensions={0}
  d = f32[4,37] subtract(x, mb)
  ex = f32[4,37] exponential(d)
  zero = f32[] constant(0)
  sm = f32[4] reduce(ex, zero), dimensions={1}, to_apply=add_r
  sb = f32[4,37] broadcast(sm), dimensions={0}
  ROOT y = f32[4,37] divide(ex, sb)
}"""


def test_stable_softmax_is_one_kernel():
    program = compile_hlo(SOFTMAX)
    assert [k.op for k in program.kernels] == ["SOFTMAX"]
    x = rand(4, 37, low=-5, high=5)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(one(SOFTMAX, {"x": x}), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_layer_norm_with_epsilon_as_xla_writes_it_is_one_kernel():
    # built as a JAX layer norm prints it (epsilon 1e-5, mean reused through a reshape)
    text = """HloModule ln
add_r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[6,32] parameter(0)
  g = f32[32] parameter(1)
  bias = f32[32] parameter(2)
  zero = f32[] constant(0)
  n = f32[] constant(32)
  nb = f32[6] broadcast(n), dimensions={}
  s1 = f32[6] reduce(x, zero), dimensions={1}, to_apply=add_r
  mean = f32[6] divide(s1, nb)
  mean_k = f32[6,1] reshape(mean)
  mean_r = f32[6] reshape(mean_k)
  mean_b = f32[6,32] broadcast(mean_r), dimensions={0}
  c = f32[6,32] subtract(x, mean_b)
  sq = f32[6,32] multiply(c, c)
  s2 = f32[6] reduce(sq, zero), dimensions={1}, to_apply=add_r
  var = f32[6] divide(s2, nb)
  var_k = f32[6,1] reshape(var)
  eps = f32[] constant(1e-05)
  eps_b = f32[6,1] broadcast(eps), dimensions={}
  ve = f32[6,1] add(var_k, eps_b)
  r = f32[6,1] rsqrt(ve)
  r_r = f32[6] reshape(r)
  r_b = f32[6,32] broadcast(r_r), dimensions={0}
  g_b = f32[6,32] broadcast(g), dimensions={1}
  s = f32[6,32] multiply(r_b, g_b)
  xs = f32[6,32] multiply(x, s)
  b_b = f32[6,32] broadcast(bias), dimensions={1}
  ms = f32[6,32] multiply(s, mean_b)
  sh = f32[6,32] subtract(b_b, ms)
  ROOT y = f32[6,32] add(xs, sh)
}"""
    program = compile_hlo(text)
    assert [k.op for k in program.kernels] == ["LAYERNORM"]
    assert program.graph.ops[0].attrs == {"axis": 1, "epsilon": pytest.approx(1e-5)}
    x, g, bias = rand(6, 32), rand(32), rand(32)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * g + bias
    np.testing.assert_allclose(one(text, {"x": x, "g": g, "bias": bias}), want, rtol=1e-4, atol=1e-4)


def test_dot_plus_broadcast_bias_fuses_into_the_matmul():
    text = """HloModule m
ENTRY e {
  x = f32[64,96] parameter(0)
  w = f32[96,80] parameter(1)
  b = f32[80] parameter(2)
  d = f32[64,80] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[64,80] broadcast(b), dimensions={1}
  ROOT y = f32[64,80] add(d, bb)
}"""
    [kernel] = compile_hlo(text).kernels
    assert kernel.op == "MATMUL" and kernel.epilogue == ["y"]
    x, w, b = rand(64, 96), rand(96, 80), rand(80)
    np.testing.assert_allclose(one(text, {"x": x, "w": w, "b": b}), x.astype(np.float64) @ w + b,
                               rtol=1e-5, atol=1e-4)


# ---- the rules, on graphs built op by op: each computes what it replaces, and near-misses stay --


def test_reduce_reshaped_back_to_its_kept_shape_keeps_its_axes():
    b = Builder()
    x = b.input("x", (4, 6, 5))
    reduced = b.op("REDUCE_MAX", x, axes=[1], keepdims=False)
    graph = b.output(b.op("RESHAPE", reduced, new_shape=[4, 1, 5]), b.op("RESHAPE", b.op(
        "REDUCE_SUM", x, axes=[2], keepdims=False), new_shape=[2, 2, 6]))
    after, _ = recognised(graph, RECOGNISE)
    # the first reshape puts axis 1 back; the second moves elements: it stays
    assert types(after) == ["REDUCE_MAX", "REDUCE_SUM", "RESHAPE"]
    assert after.ops[0].attrs == {"axes": [1], "keepdims": True}


def _cast(b: Builder, x: str, dtype: str) -> str:
    """A CAST (Builder.op's `dtype` is the result's, and CAST needs an attribute of that name)."""
    out = b.tensor(f"t{len(b.graph.ops)}", b.graph.tensors[x].shape, dtype, "intermediate")
    b.graph.ops.append(Op(f"cast{len(b.graph.ops)}", "CAST", [x], [out], {"dtype": dtype}, "test"))
    return out


@pytest.mark.parametrize("narrow, wide, back, fires", [("f16", "f32", "f16", True), ("bf16", "f32", "bf16", True),
                                                        ("f16", "f64", "f16", False), ("f16", "f32", "bf16", False),
                                                        ("f32", "f64", "f32", False)])
def test_a_narrow_reduction_widened_and_rounded_back_is_the_narrow_one(narrow, wide, back, fires):
    b = Builder()
    x = b.input("x", (3, 40), narrow)
    total = b.op("REDUCE_SUM", _cast(b, x, wide), dtype=wide, axes=[1])
    graph = b.output(_cast(b, total, back))
    after, _ = recognised(graph, RECOGNISE)
    assert types(after) == (["REDUCE_SUM"] if fires else ["CAST", "REDUCE_SUM", "CAST"])


def test_transpose_of_b_folds_into_the_matmul_only_when_it_swaps_the_last_two_dims_alone():
    b = Builder()
    a, w = b.input("a", (2, 8, 16)), b.input("w", (2, 12, 16))
    swapped = b.op("TRANSPOSE", w, perms=[0, 2, 1])
    graph = b.output(b.op("MATMUL", a, swapped))
    after, _ = recognised(graph, CONTRACTION)
    assert types(after) == ["MATMUL"] and after.ops[0].inputs == ["a", "w"]
    assert after.ops[0].attrs == {"transpose_b": True}

    b = Builder()  # the batch dims move too: stays
    a, w = b.input("a", (2, 8, 16)), b.input("w", (12, 2, 16))
    graph = b.output(b.op("MATMUL", a, b.op("TRANSPOSE", w, perms=[1, 2, 0])))
    assert types(recognised(graph, CONTRACTION)[0]) == ["TRANSPOSE", "MATMUL"]

    b = Builder()  # the transposed tensor is read by another op too: stays
    a, w = b.input("a", (8, 16)), b.input("w", (12, 16))
    wt = b.op("TRANSPOSE", w, perms=[1, 0])
    graph = b.output(b.op("MATMUL", a, wt), b.op("EXP", wt))
    assert types(recognised(graph, CONTRACTION)[0]) == ["TRANSPOSE", "MATMUL", "EXP"]


def _folded_layernorm(b: Builder, x: str, mean_axes: list[int], var_axes: list[int], eps: str | None) -> str:
    """x * s + (beta - s * mean), s = rsqrt(var (+ eps)) * g, as XLA writes a layer norm."""
    mean = b.op("REDUCE_MEAN", x, axes=mean_axes)
    c = b.op("SUB", x, mean)
    var = b.op("REDUCE_MEAN", b.op("MUL", c, c), axes=var_axes)
    if eps is not None:
        var = b.op("ADD", var, eps)
    s = b.op("MUL", b.op("RSQRT", var), b.input("g", (16,)))
    return b.op("ADD", b.op("MUL", x, s), b.op("SUB", b.input("beta", (16,)), b.op("MUL", s, mean)))


def test_layer_norm_as_xla_writes_it_is_a_layernorm():
    b = Builder()
    graph = b.output(_folded_layernorm(b, b.input("x", (5, 16)), [1], [1], b.const("eps", 1e-3)))
    after, _ = recognised(graph, RECOGNISE)
    assert types(after) == ["LAYERNORM"] and after.ops[0].inputs == ["x", "g", "beta"]
    assert after.ops[0].attrs == {"axis": 1, "epsilon": pytest.approx(1e-3)}

    b = Builder()  # mean and variance over different axes: stays
    graph = b.output(_folded_layernorm(b, b.input("x", (16, 16)), [1], [0], None))
    assert "LAYERNORM" not in types(recognised(graph, RECOGNISE)[0])

    b = Builder()  # an epsilon of unknown value: stays, with a warning
    graph = b.output(_folded_layernorm(b, b.input("x", (5, 16)), [1], [1], b.const("eps", None)))
    after, warnings = recognised(graph, RECOGNISE)
    assert "LAYERNORM" not in types(after) and any("epsilon" in w for w in warnings)


# ---- errors ----------------------------------------------------------------------------------

ERRORS = [
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n ROOT s = f32[2] scatter(p), dimensions={0}\n}",
     "t.hlo:4:", "HLO op 'scatter' is not supported"),
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n z = f32[] constant(0)\n"
     " ROOT q = f32[1] pad(p, z), padding=-2_-1\n}", "t.hlo:5:", "crops more than the operand holds"),
    # a max pool's gradient after XLA's passes: values and positions pooled at once
    ("HloModule m\nr {\n a = f32[] parameter(0)\n b = s32[] parameter(1)\n c = f32[] parameter(2)\n"
     " d = s32[] parameter(3)\n ROOT t = (f32[], s32[]) tuple(a, b)\n}\nENTRY e {\n p = f32[4] parameter(0)\n"
     " i = s32[4] iota(), iota_dimension=0\n z = f32[] constant(0)\n k = s32[] constant(0)\n"
     " ROOT w = (f32[2], s32[2]) reduce-window(p, i, z, k), window={size=2 stride=2}, to_apply=r\n}",
     "t.hlo:14:", "a reduce-window of 2 operands at once is not supported"),
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n ROOT q f32[2] negate(p)\n}", "t.hlo:4:", "expected '='"),
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n ROOT q = f32[2] add(p, nope)\n}", "t.hlo:4:",
     "operand 'nope' is not defined"),
    ("HloModule m\nENTRY e {\n p = s64[2] parameter(0)\n ROOT q = s64[2] negate(p)\n}", "t.hlo:3:",
     "element type 's64' has no DFX dtype"),
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n ROOT q = f32[3] negate(p)\n}", "t.hlo:4:",
     "operand 0 is f32[2], the result [3]"),
    ("HloModule m\nr {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n c = f32[] add(a, b)\n"
     " ROOT d = f32[] multiply(c, b)\n}\nENTRY e {\n p = f32[4] parameter(0)\n z = f32[] constant(0)\n"
     " ROOT s = f32[] reduce(p, z), dimensions={0}, to_apply=r\n}", "t.hlo:11:", "is not one add, multiply"),
    ("HloModule m\nENTRY e {\n p = f32[4] parameter(0)\n ROOT s = f32[2] slice(p), slice={[0:5]}\n}",
     "t.hlo:4:", "does not fit dimension 0"),
    ("HloModule m\nENTRY e {\n p = f32[2,2] parameter(0)\n"
     " ROOT d = f32[2,2] dot(p, p), lhs_contracting_dims={1}, rhs_contracting_dims={1,0}\n}",
     "t.hlo:4:", "contracting dimensions differ"),
    ("HloModule m\nENTRY e {\n p = f32[2,4,4,1] parameter(0)\n w = f32[1,1,1,2] parameter(1)\n"
     " ROOT y = f32[1,4,4,2] convolution(p, w), window={size=1x1}, dim_labels=b01f_01io->b01f, batch_group_count=2\n}",
     "t.hlo:5:", "batch_group_count other than 1"),
    ("HloModule m\nENTRY e {\n c = f32[3] constant({1,2})\n}", "t.hlo:3:", "needs 3 values"),
    ("HloModule m\nENTRY e {\n c = f32[2] constant({...})\n}", "t.hlo:3:", "elided"),
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0), metadata={op_name=\"x\" source_line=2\n",
     "t.hlo:3:", "unterminated '{'"),
    ("HloModule m\nENTRY e {\n p = f32[?] parameter(0)\n}", "t.hlo:3:", "dynamic dimensions"),
    ("Hlo m", "t.hlo:1:", "expected 'HloModule <name>' first"),
    ("HloModule m\nENTRY e {\n t = " + "(" * 5000 + "f32[]" + ")" * 5000 + " tuple()\n}", "t.hlo:3:",
     "tuple shapes nested deeper than 32"),
    ("HloModule m\nENTRY e {\n c = f32[1] constant(" + "{" * 5000 + "1" + "}" * 5000 + ")\n}", "t.hlo:3:",
     "constant nested deeper"),
    ("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n ROOT q = f32[2] negate(p)\n", "t.hlo:2:",
     "is not closed"),
]


@pytest.mark.parametrize("text, where, reason", ERRORS, ids=[e[2] for e in ERRORS])
def test_errors_are_one_line_naming_the_line(text, where, reason):
    message = error(text)
    assert message.startswith(where), message
    assert reason in message, message


def test_a_bad_module_exits_2_with_one_line_through_the_cli(tmp_path):
    path = tmp_path / "bad.hlo"
    path.write_text("HloModule m\nENTRY e {\n p = f32[2] parameter(0)\n ROOT s = f32[2] cholesky(p)\n}\n")
    proc = run_cli("compiler", path, "-o", tmp_path / "bad.kpu")
    assert_one_line_error(proc, f"{path}:4:", "HLO op 'cholesky' is not supported")
    assert not (tmp_path / "bad.kpu").exists()


# ---- names -----------------------------------------------------------------------------------


def test_inputs_and_outputs_keep_hlo_names_through_the_cli(tmp_path):
    path = tmp_path / "names.hlo"
    path.write_text("""HloModule names
ENTRY %main.4 {
  %Arg_0.1 = f32[4,8]{1,0} parameter(0)
  %Arg_1.2 = f32[8]{0} parameter(1)
  %b.3 = f32[4,8]{1,0} broadcast(%Arg_1.2), dimensions={1}
  %add.4 = f32[4,8]{1,0} add(%Arg_0.1, %b.3)
  %neg.5 = f32[4,8]{1,0} negate(%add.4)
  ROOT %tuple.6 = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%add.4, %neg.5)
}
""")
    a = rand(4, 8)
    np.save(tmp_path / "a.npy", a)
    assert run_cli("compiler", path, "-o", tmp_path / "names.kpu").returncode == 0
    proc = run_cli("loader", tmp_path / "names.kpu", "--config", STANDARD, "--input", f"Arg_0.1={tmp_path / 'a.npy'}",
                   "--output-dir", tmp_path / "out", "--json", "--check", "--binder", "greedy")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(report["outputs"]) == ["tuple.6.0", "tuple.6.1"]
    assert report["check"]["passed"]
    added, negated = (np.load(report["outputs"][f"tuple.6.{i}"]) for i in range(2))
    bias = added - a  # the generated Arg_1.2, the same in every row
    np.testing.assert_allclose(bias, np.broadcast_to(bias[0], bias.shape), atol=1e-6)
    np.testing.assert_array_equal(negated, -added)


# ---- the corpus ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_corpus_compiles_and_passes_the_check(path, tmp_path):
    obj = tmp_path / f"{path.stem}.kpu"
    compiled = run_cli("compiler", path, "-o", obj)
    assert compiled.returncode == 0, compiled.stderr
    proc = run_cli("loader", obj, "--config", STANDARD, "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["check"]["passed"], report["check"]


def test_corpus_is_copied_into_examples():
    examples = Path(__file__).parent.parent / "examples"
    for path in CORPUS:
        assert (examples / path.name).read_text() == path.read_text()


def test_act_attention_is_three_kernels_with_a_transposed_load():
    program = compile_hlo((DATA / "act_attention.hlo").read_text())
    assert [k.op for k in program.kernels] == ["MATMUL", "SOFTMAX", "MATMUL"]
    scores = program.graph.ops[0]
    assert (scores.inputs, scores.attrs) == (["q", "k"], {"transpose_b": True})
    # the B operand comes through the BlockMover's transpose, from k itself
    moves = [op for op in program.kernels[0].body if getattr(op, "transpose", None)]
    assert moves and all(m.source.tensor == "k" for m in moves)
    bf16 = numpy_dtype("bf16")
    q, k, v = (rand(64, 64, low=-1, high=1).astype(bf16) for _ in range(3))
    out = run_hlo((DATA / "act_attention.hlo").read_text(), {"q": q, "k": k, "v": v})

    def rounded(x):  # to bf16 and back, where the module holds a bf16 tensor
        return x.astype(bf16).astype(np.float64)

    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = rounded(q @ k.T)
    e = np.exp(s - s.max(1, keepdims=True))
    want = rounded(e / e.sum(1, keepdims=True)) @ v
    np.testing.assert_allclose(out["output"].astype(np.float64), want, rtol=2e-2, atol=2e-2)


def test_act_attention_dump_shows_three_kernels():
    proc = run_cli("compiler", DATA / "act_attention.hlo", "--dump")
    assert proc.returncode == 0, proc.stderr
    kernels = re.findall(r"^kernel (\S+) \((\w+)", proc.stdout, flags=re.M)
    assert [op for _, op in kernels] == ["MATMUL", "SOFTMAX", "MATMUL"]
    assert "{'transpose_b': True}" in proc.stdout


def test_xla_layer_norm_f16_is_one_layernorm():
    text = (DATA / "xla_layer_norm_f16.hlo").read_text()
    program = compile_hlo(text)
    assert [k.op for k in program.kernels] == ["LAYERNORM"]
    x = rand(2, 4, 8, dtype=np.float16)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(2, keepdims=True)) / np.sqrt(x64.var(2, keepdims=True)) * 1 + 1  # scale, bias: ones
    np.testing.assert_allclose(one(text, {"Arg_2": x}).astype(np.float64), want, rtol=2e-2, atol=2e-2)


def test_jax_softmax_is_recognised_before_its_long_rows_are_split():
    graph, _ = parse((DATA / "xla_jax_softmax_f32.hlo").read_text())
    after = canonicalise(graph, [])
    assert [op.op_type for op in after.ops] == ["SOFTMAX"]
    assert [t.name for t in after.outputs] == ["divide.24"]


def test_matmul_biasadd_is_one_fused_kernel_named_after_the_root():
    program = compile_hlo((DATA / "xla_matmul_biasadd_f32.hlo").read_text())
    [kernel] = program.kernels
    assert kernel.op == "MATMUL" and kernel.epilogue == ["get-tuple-element.13"]
    assert [t.name for t in program.graph.outputs] == ["get-tuple-element.13"]
    assert [t.name for t in program.graph.inputs] == ["arg0.1", "arg0.2", "arg0.3"]


# ---- found by review: outputs made whole, layouts, pred -------------------------------------------


@pytest.mark.parametrize("body, want", [
    ("ROOT broadcast.2 = f32[3,4] broadcast(Arg_0.1), dimensions={0}", lambda a: np.repeat(a[:, None], 4, 1)),
    ("broadcast.2 = f32[3,4] broadcast(Arg_0.1), dimensions={0}\n  ROOT negate.3 = f32[3,4] negate(broadcast.2)",
     lambda a: -np.repeat(a[:, None], 4, 1)),
])
def test_a_root_that_is_a_broadcast_is_made_whole_under_its_name(body, want):
    a = rand(3)
    outputs = run_hlo(f"HloModule m\nENTRY e {{\n  Arg_0.1 = f32[3] parameter(0)\n  {body}\n}}\n", {"Arg_0.1": a})
    [(name, value)] = outputs.items()
    assert name == body.split("ROOT ")[1].split(" ")[0]
    np.testing.assert_array_equal(value, want(a))


# (operand layout, result shape and layout) -> the result from the operand's values, by the bytes:
# the elements in the order the operand lays them out, regrouped as the result lays its dims out
BITCASTS = {
    "transpose": ("{1,0}", "f32[3,2]{0,1}", lambda a: a.T),
    "from column-major": ("{0,1}", "f32[2,3]{1,0}", lambda a: a.T.reshape(2, 3)),
    "both ways": ("{0,1}", "f32[3,2]{0,1}", lambda a: a.T.reshape(2, 3).T),
    "row-major": ("{1,0}", "f32[3,2]{1,0}", lambda a: a.reshape(3, 2)),
    "column by column, flat": ("{0,1}", "f32[6]{0}", lambda a: a.T.reshape(6)),
}


@pytest.mark.parametrize("case", BITCASTS)
def test_a_bitcast_views_the_bytes_as_laid_out(case):
    """XLA's bitcast views the same bytes as another shape and layout (its CPU pipeline hands a
    transposed result back so): between layouts other than row-major it moves the elements as a
    transpose would, and the frontend reads it as the TRANSPOSEs and RESHAPE that do so."""
    operand, result, want = BITCASTS[case]
    text = f"HloModule m\nENTRY e {{\n  a = f32[2,3]{operand} parameter(0)\n  ROOT b = {result} bitcast(a)\n}}\n"
    a = rand(2, 3)
    np.testing.assert_array_equal(one(text, {"a": a}), want(a))


def test_an_integer_division_by_zero_gives_what_xla_gives():
    """XLA's spec leaves x / 0 and x % 0 of integers to the backend; its CPU one gives -1 and x,
    and so jax.lax.div, jax.lax.rem and `a // b` (which divides, then steps by the remainder's
    sign): JAX's outputs on these inputs, recorded from jax 0.10 on CPU."""
    text = """HloModule m
ENTRY e {
  a = s32[6] parameter(0)
  b = s32[6] parameter(1)
  div = s32[6] divide(a, b)
  rem = s32[6] remainder(a, b)
  sa = s32[6] sign(a)
  sb = s32[6] sign(b)
  signs = pred[6] compare(sa, sb), direction=NE
  zero = s32[] constant(0)
  zeros = s32[6] broadcast(zero), dimensions={}
  inexact = pred[6] compare(rem, zeros), direction=NE
  step = pred[6] and(signs, inexact)
  one = s32[] constant(1)
  ones = s32[6] broadcast(one), dimensions={}
  below = s32[6] subtract(div, ones)
  floor = s32[6] select(step, below, div)
  ROOT t = (s32[6], s32[6], s32[6]) tuple(div, rem, floor)
}
"""
    out = run_hlo(text, {"a": np.int32([7, -7, 5, 0, 9, -3]), "b": np.int32([0, 0, 2, 0, -4, 0])})
    assert [v.tolist() for v in out.values()] == [[-1, -1, 2, -1, -2, -1], [7, -7, 1, 0, 1, -3], [-2, -2, 2, -1, -3, -2]]


def test_a_reduction_rounding_each_step_to_bf16_rounds_its_result():
    """XLA's CPU pipeline writes a bf16 max as an f32 max rounded to bf16 and back at every step;
    of f32 operands that rounds the result too (jax.lax.reduce with that computation gives
    [1.0, 300.0] here: 1.001 and 300.3 are no bf16 values)."""
    text = """HloModule m
r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  m = f32[] maximum(a, b)
  n = bf16[] convert(m)
  ROOT w = f32[] convert(n)
}
ENTRY e {
  x = f32[2,4] parameter(0)
  z = f32[] constant(-inf)
  ROOT y = f32[2] reduce(x, z), dimensions={1}, to_apply=r
}
"""
    x = np.float32([[1.001, 0.5, -3, 0.25], [2.0009, 1.5, 300.3, 7]])
    assert one(text, {"x": x}).tolist() == [1.0, 300.0]


def test_arithmetic_on_pred_is_refused():
    text = "HloModule m\nENTRY e {\n  a = pred[3] parameter(0)\n  ROOT n = pred[3] add(a, a)\n}\n"
    assert "'add' on pred is not supported" in error(text)
