"""Review of the compiler pipeline: compile work linear in the graph (long chains, many outputs,
many rewrites, calls that multiply when inlined); HLO instructions whose declared type is not
what their op makes; objects that list a tensor, an op or a kernel twice; moves whose fill or
index table is not their graph op's."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import orjson
import pytest
from onnx import TensorProto, helper

from conftest import CONFIGS
from dfx import Graph, ObjectFileError, Op, Tensor, dumps, loads
from dfx.validate import validate_program
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import hlo_build, parse_graph
from kernel_compiler.frontends.hlo import parse_hlo
from kernel_compiler.passes import canonicalise, split_long_rows
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from test_frontend_hlo import run_hlo

STANDARD = load_target(str(CONFIGS / "standard.json"))


def covered(program) -> list[str]:
    """The graph ops of the program's kernels, in kernel order."""
    return [name for k in program.kernels for name in [k.graph_op, *k.epilogue]]


# ---- compile work linear in the graph ---------------------------------------------------------
# Each of these took minutes or never finished: the validator asked, for every fused intermediate,
# every graph op whether it reads it (comparing ops field by field); naming outputs and adding
# ops renamed or searched the whole graph each time; inlining had no bound. None is timed here:
# each compiles or refuses a graph that quadratic work would not get through.

def relu_chain(n: int) -> bytes:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def negate_chain(n: int) -> str:
    lines = [f"  n{i} = f32[4,8] negate({'p' if i == 0 else f'n{i - 1}'})" for i in range(n)]
    return "HloModule chain\nENTRY e {\n  p = f32[4,8] parameter(0)\n" + "\n".join(lines) + "\n}\n"


def test_a_chain_of_10000_onnx_nodes_compiles_and_validates():
    graph, _ = parse_graph("chain.onnx", relu_chain(10_000))
    program = compile_graph(graph, "chain.onnx", STANDARD)
    validate_program(program, "chain.kpu")
    assert covered(program) == [op.name for op in program.graph.ops] and len(program.graph.ops) == 10_000
    # fused nine to a kernel: the anchor and the most epilogue ops a kernel takes
    assert len(program.kernels) == -(-10_000 // 9)


def test_a_chain_of_10000_hlo_instructions_compiles_and_validates():
    graph, _ = parse_hlo("chain.hlo", negate_chain(10_000))
    program = compile_graph(infer_shapes(graph, []), "chain.hlo", STANDARD)
    validate_program(program, "chain.kpu")
    assert [op.op_type for op in program.graph.ops] == ["NEGATE"] * 10_000
    assert covered(program) == [op.name for op in program.graph.ops]
    assert [t.name for t in program.graph.outputs] == ["n9999"]


def test_a_long_chain_writes_and_reads_back():
    program = compile_graph(parse_graph("chain.onnx", relu_chain(3_000))[0], "chain.onnx", STANDARD)
    data = dumps(program)
    again = loads(data, "chain.kpu")
    assert dumps(again) == data and len(again.kernels) == len(program.kernels)


def test_a_tuple_of_5000_outputs_is_named_without_a_pass_per_output():
    n = 5_000
    text = negate_chain(n).replace("\n}\n", f"\n  ROOT t = ({', '.join(['f32[4,8]'] * n)}) "
                                          f"tuple({', '.join(f'n{i}' for i in range(n))})\n}}\n")
    graph, _ = parse_hlo("wide.hlo", text)
    assert [t.name for t in graph.outputs] == [f"t.{i}" for i in range(n)]
    # each output is computed from the one before it, under its new name
    assert [(op.inputs, op.outputs) for op in graph.ops] == [([f"t.{i - 1}" if i else "p"], [f"t.{i}"])
                                                              for i in range(n)]


def test_2000_nchw_convolutions_are_rewritten_with_fresh_names():
    g = Graph("convs")
    g.tensors["x"] = Tensor("x", (1, 2, 4, 4), "f32", "input")
    g.tensors["w"] = Tensor("w", (2, 2, 1, 1), "f32", "input")
    for i in range(2_000):
        g.tensors[f"y{i}"] = Tensor(f"y{i}", (1, 2, 4, 4), "f32", "output" if i == 1_999 else "intermediate")
        g.ops.append(Op(f"conv{i}", "CONV2D", [f"y{i - 1}" if i else "x", "w"], [f"y{i}"], {"layout": "NCHW"}))
    out = canonicalise(g, [])
    names = [op.name for op in out.ops]
    assert len(set(names)) == len(names)
    convs = [op for op in out.ops if op.op_type == "CONV2D"]
    assert len(convs) == 2_000 and all(op.attrs.get("layout", "NHWC") == "NHWC" for op in convs)


def test_500_long_softmax_rows_are_split_with_fresh_names(tiny):
    g = Graph("softmaxes")
    g.tensors["x0"] = Tensor("x0", (2, 512), "f32", "input")
    for i in range(500):
        g.tensors[f"x{i + 1}"] = Tensor(f"x{i + 1}", (2, 512), "f32", "output" if i == 499 else "intermediate")
        g.ops.append(Op(f"softmax{i}", "SOFTMAX", [f"x{i}"], [f"x{i + 1}"], {"axis": -1}))
    out = split_long_rows(g, load_target(tiny))
    names = [op.name for op in out.ops]
    assert "SOFTMAX" not in {op.op_type for op in out.ops} and len(set(names)) == len(names)
    # each chain's last op computes the softmax's result under its name
    assert [op.name for op in out.ops if op.outputs[0].startswith("x")] == [f"softmax{i}" for i in range(500)]


def doubling_calls(depth: int, leaf: str = "negate(a)") -> str:
    """Computations c0..c{depth-1}, each calling the one before it twice in a row; ENTRY calls the last."""
    comps = [f"c0 {{\n  a = f32[4] parameter(0)\n  ROOT r = f32[4] {leaf}\n}}"]
    comps += [f"c{i} {{\n  a = f32[4] parameter(0)\n  x = f32[4] call(a), to_apply=c{i - 1}\n"
              f"  ROOT r = f32[4] call(x), to_apply=c{i - 1}\n}}" for i in range(1, depth)]
    return ("HloModule doubling\n" + "\n".join(comps) +
            f"\nENTRY e {{\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] call(p), to_apply=c{depth - 1}\n}}\n")


def test_calls_that_multiply_are_refused_before_inlining_them():
    text = doubling_calls(30)  # 4.8 KB, a billion and a half instructions inlined
    size = 2  # c0: its parameter and its root; each next one a parameter and twice the one before
    for _ in range(29):
        size = 1 + 2 * size
    line = text.splitlines().index("  ROOT r = f32[4] call(p), to_apply=c29") + 1
    with pytest.raises(CompileError) as e:
        parse_hlo("doubling.hlo", text)
    assert str(e.value) == (f"doubling.hlo:{line}: call 'r': inlining computation 'c29' makes {size} instructions, "
                            f"more than the {hlo_build.MAX_INLINED} a module may inline")


def test_the_inlining_bound_counts_every_call_of_the_module(monkeypatch):
    monkeypatch.setattr(hlo_build, "MAX_INLINED", 10)
    text = ("HloModule m\nc {\n  a = f32[4] parameter(0)\n  b = f32[4] negate(a)\n  d = f32[4] abs(b)\n"
            "  ROOT r = f32[4] negate(d)\n}\nENTRY e {\n  p = f32[4] parameter(0)\n  x = f32[4] call(p), to_apply=c\n"
            "  y = f32[4] call(x), to_apply=c\n  ROOT z = f32[4] call(y), to_apply=c\n}\n")
    with pytest.raises(CompileError) as e:
        parse_hlo("m.hlo", text)
    assert str(e.value) == ("m.hlo:12: call 'z': inlining computation 'c' makes 4 instructions, 12 with the calls "
                            "inlined before it, more than the 10 a module may inline")


def test_calls_within_the_bound_are_inlined_and_computed():
    x = np.linspace(-2, 2, 4, dtype=np.float32)
    [got] = run_hlo(doubling_calls(3, leaf="add(a, a)"), {"p": x}).values()
    np.testing.assert_array_equal(got, x * 2.0 ** 4)  # c0 doubles, c1 twice, c2 four times


# ---- HLO: the declared result type is what the op makes ---------------------------------------

def module(*lines: str, computations: str = "") -> str:
    return "HloModule m\n" + computations + "ENTRY e {\n" + "\n".join(f"  {line}" for line in lines) + "\n}\n"


REDUCER = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"


@pytest.mark.parametrize("text, message", [
    (module("p = f32[4,8] parameter(0)", "ROOT r = s8[4,8] negate(p)"),
     "t.hlo:4: negate 'r': declares s8[4,8], but negate of f32[4,8] gives f32[4,8]"),
    (module("p = f32[4] parameter(0)", "q = f32[4] parameter(1)", "ROOT r = f16[4] add(p, q)"),
     "t.hlo:5: add 'r': declares f16[4], but add of f32[4], f32[4] gives f32[4]"),
    (module("p = f32[4] parameter(0)", "q = s32[4] parameter(1)", "ROOT r = f32[4] multiply(p, q)"),
     "t.hlo:5: multiply 'r': multiply of f32[4], s32[4]: operands of element types f32, s32; multiply takes one"),
    (module("p = f32[4] parameter(0)", "ROOT r = f32[4] compare(p, p), direction=LT"),
     "t.hlo:4: compare 'r': declares f32[4], but compare of f32[4], f32[4] gives pred[4]"),
    (module("c = f32[4] parameter(0)", "p = f32[4] parameter(1)", "ROOT r = f32[4] select(c, p, p)"),
     "t.hlo:5: select 'r': select of f32[4], f32[4], f32[4]: the predicate (operand 0) must be pred"),
    (module("p = pred[4] parameter(0)", "ROOT r = u8[4] and(p, p)"),
     "t.hlo:4: and 'r': declares u8[4], but and of pred[4], pred[4] gives pred[4]"),
    (module("p = f32[4] parameter(0)", "ROOT r = bf16[2,2] reshape(p)"),
     "t.hlo:4: reshape 'r': declares bf16[2,2], but reshape of f32[4] gives f32[2,2]"),
    (module("p = f32[4] parameter(0)", "z = f16[] constant(0)", "ROOT r = f32[6] pad(p, z), padding=1_1"),
     "t.hlo:5: pad 'r': pad of f32[4], f16[]: operands of element types f32, f16; pad takes one"),
    (module("p = s32[3] parameter(0)", "ROOT r = f32[3,2] broadcast(p), dimensions={0}"),
     "t.hlo:4: broadcast 'r': declares f32[3,2], but broadcast of s32[3] gives s32[3,2]"),
    # a shape with a 1 where the declared one has more: the tensor is whole, not a broadcast
    (module("p = f32[3,1] parameter(0)", "ROOT r = f32[2,3] transpose(p), dimensions={1,0}"),
     "t.hlo:4: transpose 'r': declares f32[2,3], but transpose of f32[3,1] gives f32[1,3]"),
    (module("p = f32[4,8] parameter(0)", "ROOT r = f32[4,8] slice(p), slice={[0:1], [0:8]}"),
     "t.hlo:4: slice 'r': declares f32[4,8], but slice of f32[4,8] gives f32[1,8]"),
    (module("p = f32[4,8] parameter(0)", "z = f32[] constant(0)",
            "ROOT r = f16[4] reduce(p, z), dimensions={1}, to_apply=add", computations=REDUCER),
     "t.hlo:10: reduce 'r': declares f16[4], but reduce of f32[4,8], f32[] gives f32[4]"),
    (module("p = f32[1,8] parameter(0)", "z = f32[] constant(0)",
            "ROOT r = f32[4] reduce(p, z), dimensions={1}, to_apply=add", computations=REDUCER),
     "t.hlo:10: reduce 'r': declares f32[4], but reduce of f32[1,8], f32[] gives f32[1]"),
])
def test_an_instruction_declaring_another_type_than_its_op_makes_is_refused(text, message):
    with pytest.raises(CompileError) as e:
        parse_hlo("t.hlo", text)
    assert str(e.value) == message


@pytest.mark.parametrize("text, dtype", [
    (module("p = f32[4,8] parameter(0)", "ROOT r = s8[4,8] convert(p)"), "i8"),
    (module("p = f32[4] parameter(0)", "ROOT r = pred[4] compare(p, p), direction=NE"), "u8"),
    (module("p = pred[4] parameter(0)", "q = f16[4] parameter(1)", "ROOT r = f16[4] select(p, q, q)"), "f16"),
    (module("p = f32[4] parameter(0)", "l = f32[] constant(-1)", "h = f32[] constant(1)",
            "ROOT r = f32[4] clamp(l, p, h)"), "f32"),
])
def test_an_instruction_declaring_what_its_op_makes_is_taken(text, dtype):
    graph, _ = parse_hlo("t.hlo", text)
    assert [(t.name, t.dtype) for t in graph.outputs] == [("r", dtype)]


@pytest.mark.parametrize("opcode", ["exponential", "log", "sqrt", "tanh"])
def test_a_floating_point_op_of_integers_is_refused(opcode):
    """XLA's shape inference refuses an integer operand of exponential and its kin."""
    with pytest.raises(CompileError) as e:
        parse_hlo("t.hlo", module("p = s32[4] parameter(0)", f"ROOT r = s32[4] {opcode}(p)"))
    assert str(e.value).endswith(f"{opcode} takes a floating-point operand"), str(e.value)



# ---- objects: one of each name ----------------------------------------------------------------

def resealed(obj: dict) -> bytes:
    """Re-sign an edited body, so the validator (not the checksum) must catch it."""
    obj["sha256"] = hashlib.sha256(orjson.dumps(obj["body"], option=orjson.OPT_SORT_KEYS)).hexdigest()
    return orjson.dumps(obj)


def refused(obj: dict) -> str:
    with pytest.raises(ObjectFileError) as e:
        loads(resealed(obj), "m.kpu")
    assert "\n" not in str(e.value)
    return str(e.value)


def compiled(g: Graph) -> dict:
    return orjson.loads(dumps(compile_graph(g, "t.dfg", STANDARD)))


def graph(*ops: tuple[str, str, list[str], dict], inputs: dict[str, tuple[int, ...]]) -> Graph:
    """Ops (name, type, operands, attrs), each result named after its op, shapes by the registry."""
    g = Graph("g")
    for name, shape in inputs.items():
        g.tensors[name] = Tensor(name, shape, "f32", "input")
    for name, op_type, operands, attrs in ops:
        g.tensors[name] = Tensor(name, (), "f32", "output")
        g.ops.append(Op(name, op_type, operands, [name], attrs, f"t.dfg {name}"))
    infer_shapes(g, [])
    read = {t for op in g.ops for t in op.inputs}
    for op in g.ops:
        if op.outputs[0] in read:
            g.tensors[op.outputs[0]].role = "intermediate"
    return g


@pytest.fixture(scope="module")
def two_kernels() -> dict:
    return compiled(graph(("e", "EXP", ["x"], {}), ("s", "SIGMOID", ["e"], {}), inputs={"x": (4, 8)}))


def test_a_tensor_listed_twice_is_refused(two_kernels):
    obj = copy.deepcopy(two_kernels)
    tensors = obj["body"]["graph"]["tensors"]
    # even the same entry again: a reader keeps one tensor per name, the second replacing the first
    tensors.append(copy.deepcopy(next(t for t in tensors if t["name"] == "x")))
    assert refused(obj) == "m.kpu: tensor 'x': listed twice in the graph"


def test_an_op_listed_twice_is_refused():
    obj = compiled(graph(("e", "EXP", ["x"], {}), inputs={"x": (4, 8)}))
    ops = obj["body"]["graph"]["ops"]
    ops.append(copy.deepcopy(ops[0]))
    assert refused(obj) == "m.kpu: graph op 'e': listed twice in the graph"


def test_a_kernel_listed_twice_is_refused(two_kernels):
    obj = copy.deepcopy(two_kernels)
    kernels = obj["body"]["kernels"]
    kernels.append(copy.deepcopy(kernels[0]))
    assert refused(obj) == f"m.kpu: kernel '{kernels[0]['name']}': duplicate kernel name"


# ---- objects: a fill and a table are their graph op's -----------------------------------------

def loading(kernel: dict) -> dict:
    """The kernel's move from external memory into L3."""
    [move] = [op for op in kernel["body"] if op["type"] == "DATA_MOVE" and op["source"]["level"] == "EXTERNAL"]
    return move


@pytest.fixture(scope="module")
def pad() -> dict:
    return compiled(graph(("p", "PAD", ["x"], {"padding": [[1, 2], [3, 0]], "pad_value": 1.5}), inputs={"x": (4, 8)}))


def test_the_pad_as_compiled_reads_back(pad):
    [kernel] = loads(resealed(copy.deepcopy(pad)), "m.kpu").kernels
    assert [op.fill for op in kernel.body] == [1.5, None]


@pytest.mark.parametrize("fill, reason", [
    (1000, "fills the padding of 'p' with 1000; PAD 'p' pads with 1.5"),
    (0, "fills the padding of 'p' with 0; PAD 'p' pads with 1.5"),
    (None, "leaves the padding of 'p' unfilled; PAD 'p' pads with 1.5"),
])
def test_a_pad_move_must_fill_with_the_pad_value(pad, fill, reason):
    obj = copy.deepcopy(pad)
    kernel = obj["body"]["kernels"][0]
    move = loading(kernel)
    move.pop("fill")
    if fill is not None:
        move["fill"] = fill
    assert refused(obj) == f"m.kpu: kernel '{kernel['name']}' op {move['op_id']}: {reason}"


def test_a_move_no_op_pads_takes_no_fill():
    obj = compiled(graph(("s", "SLICE", ["x"], {"start": [1, 2], "size": [2, 3]}), inputs={"x": (4, 8)}))
    kernel = obj["body"]["kernels"][0]
    move = loading(kernel)
    move["fill"] = 7
    assert refused(obj) == (f"m.kpu: kernel '{kernel['name']}' op {move['op_id']}: fills its tile of 's' with 7, "
                            f"but no graph op of the kernel pads it")


@pytest.fixture(scope="module")
def gather_and_transpose() -> dict:
    """A TRANSPOSE whose perms [1, 0] would be valid rows of x, and a GATHER of two rows of x."""
    return compiled(graph(("t", "TRANSPOSE", ["x"], {"perms": [1, 0]}),
                          ("g", "GATHER", ["x"], {"indices": [4, 3], "axis": 0}), inputs={"x": (6, 5)}))


@pytest.mark.parametrize("table, reason", [
    # another kernel's op, with a list that fits: the loader would gather rows 1 and 0
    ({"op": "t", "attr": "perms"}, "table 'perms' of graph op 't' is not of the kernel's own graph op"),
    ({"attr": "axis"}, "table 'axis' of graph op 'g' is not the index table of GATHER (which has 'indices')"),
])
def test_a_table_must_be_its_own_ops_index_table(gather_and_transpose, table, reason):
    obj = copy.deepcopy(gather_and_transpose)
    kernel = next(k for k in obj["body"]["kernels"] if k["op"] == "GATHER")
    move = loading(kernel)
    move["source"]["table"].update(table)
    assert refused(obj) == f"m.kpu: kernel '{kernel['name']}' op {move['op_id']}: {reason}"
