"""The graph passes: each rule fires on its pattern and the graph it gives computes the same
numbers as the chain it replaced (both run op by op with the registry's references), and it does
not fire on near-misses (another axis, an intermediate read outside the chain or kept as an
output, another tensor, a constant of unknown or other value)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dfx import Graph, Op, Tensor, lookup, numpy_dtype
from kernel_compiler.compile import graph_passes
from kernel_compiler.frontends import load_graph
from kernel_compiler.passes import DECOMPOSE, RECOGNISE, Pat, canonicalise, products_by_rows, rewrite
from kernel_compiler.target import load_target

from conftest import DATA

RNG = np.random.default_rng(7)


class Builder:
    """A graph built op by op, each result's shape from the registry's shape rule."""

    def __init__(self) -> None:
        self.graph = Graph("test")

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str, role: str) -> str:
        self.graph.tensors[name] = Tensor(name, tuple(shape), dtype, role)
        return name

    def input(self, name: str, shape: tuple[int, ...], dtype: str = "f32") -> str:
        return self.tensor(name, shape, dtype, "input")

    def const(self, name: str, value: float | None, shape: tuple[int, ...] = (), dtype: str = "f32") -> str:
        """A constant; None: without a value, as a `.dfg` gives them."""
        if value is not None:
            self.graph.constants[name] = np.full(shape, value, numpy_dtype(dtype)).tobytes()
        return self.tensor(name, shape, dtype, "constant")

    def op(self, op_type: str, *inputs: str, dtype: str = "f32", **attrs) -> str:
        n = len(self.graph.ops)
        opdef = lookup(op_type)
        ins = [self.graph.tensors[t] for t in inputs]
        [shape] = opdef.infer_shapes([t.shape for t in ins], [t.dtype for t in ins], opdef.normalize_attrs(attrs))
        out = self.tensor(f"t{n}", shape, dtype, "intermediate")
        self.graph.ops.append(Op(f"{op_type.lower()}{n}", op_type, list(inputs), [out], attrs, f"test:{n}"))
        return out

    def output(self, *names: str) -> Graph:
        for name in names:
            self.graph.tensors[name].role = "output"
        return self.graph


def evaluate(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output, computed op by op with the registry's references."""
    values = dict(feeds)
    for name, raw in graph.constants.items():
        t = graph.tensors[name]
        values[name] = np.frombuffer(raw, numpy_dtype(t.dtype)).reshape(t.shape)
    for op in graph.ops:
        opdef = lookup(op.op_type)
        results = opdef.reference([values[t] for t in op.inputs], opdef.normalize_attrs(op.attrs),
                                  [graph.tensors[t].dtype for t in op.outputs])
        values.update(zip(op.outputs, results))
    return {t.name: values[t.name] for t in graph.outputs}


def feeds_for(graph: Graph) -> dict[str, np.ndarray]:
    """Random inputs, and positive values for the constants the graph gives none."""
    feeds = {t.name: RNG.uniform(-3, 3, t.shape) for t in graph.tensors.values() if t.role == "input"}
    feeds.update((t.name, RNG.uniform(0.5, 1.5, t.shape)) for t in graph.tensors.values()
                 if t.role == "constant" and t.name not in graph.constants)
    return {name: x.astype(numpy_dtype(graph.tensors[name].dtype)) for name, x in feeds.items()}


def recognised(graph: Graph, rules=RECOGNISE) -> tuple[Graph, list[str]]:
    """The graph after `rules`, checked to compute what `graph` computes."""
    warnings: list[str] = []
    after = rewrite(graph, rules, warnings)
    feeds = feeds_for(graph)
    before_values, after_values = evaluate(graph, feeds), evaluate(after, feeds)
    assert before_values.keys() == after_values.keys()
    for name, value in before_values.items():
        np.testing.assert_allclose(after_values[name], value, rtol=2e-5, atol=1e-6)
    return after, warnings


def types(graph: Graph) -> list[str]:
    return [op.op_type for op in graph.ops]


# ---- the engine ------------------------------------------------------------------------------


def _abs_of(m) -> Op:
    return m.replace("ABS", m["x"])


ABS_OF_NEGATE = [(Pat("ABS", Pat("NEGATE", Pat(name="x"))), _abs_of)]  # |-x| -> |x|


def test_rules_apply_to_a_fixed_point_and_keep_the_graph_consistent():
    b = Builder()
    x = b.input("x", (3, 4))
    unused = b.input("unused", (2,))
    y = b.op("ABS", b.op("NEGATE", b.op("NEGATE", x)))
    z = b.op("EXP", y)
    graph = b.output(z)
    before = list(graph.ops)
    after, _ = recognised(graph, ABS_OF_NEGATE)
    assert types(after) == ["ABS", "EXP"]
    assert after.ops[0].inputs == ["x"] and after.ops[0].outputs == [y]
    assert after.ops[0].source == before[2].source and after.ops[0].name == before[2].name
    assert set(after.tensors) == {"x", "unused", y, z}  # the NEGATE results went; inputs stay
    assert graph.ops == before and len(graph.tensors) == 6  # the argument is left as it was
    assert unused in after.tensors


def test_rule_sets_combine_with_plus():
    b = Builder()
    x, w = b.input("x", (2, 3)), b.input("w", (4, 3))
    graph = b.output(b.op("ABS", b.op("NEGATE", b.op("LINEAR", x, w))))
    after, _ = recognised(graph, DECOMPOSE + ABS_OF_NEGATE)
    assert types(after) == ["MATMUL", "ABS"]


def test_a_constant_only_the_chain_used_goes_with_it():
    b = Builder()
    x = b.input("x", (2, 8))
    eps = b.const("eps", 1e-5)
    c = b.op("SUB", x, b.op("REDUCE_MEAN", x, axes=[1]))
    var = b.op("REDUCE_MEAN", b.op("MUL", c, c), axes=[1])
    graph = b.output(b.op("MUL", c, b.op("RSQRT", b.op("ADD", var, eps))))
    after, _ = recognised(graph)
    assert types(after) == ["LAYERNORM"]
    assert set(after.tensors) == {"x", after.ops[0].outputs[0]} and after.constants == {}


# ---- DECOMPOSE -------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_linear_becomes_matmul_with_transposed_weight(bias):
    b = Builder()
    x, w = b.input("x", (6, 5)), b.input("w", (4, 5))
    operands = [x, w] + ([b.input("b", (4,))] if bias else [])
    graph = b.output(b.op("LINEAR", *operands))
    after = canonicalise(graph, [])
    [matmul] = after.ops
    assert (matmul.op_type, matmul.inputs, matmul.attrs) == ("MATMUL", operands, {"transpose_b": True})
    feeds = feeds_for(graph)
    expected = feeds["x"].astype(np.float64) @ feeds["w"].T.astype(np.float64)
    if bias:
        expected = expected + feeds["b"]
    [y] = evaluate(after, feeds).values()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cin", [None, (4,), (1, 1, 4), (2, 3, 4), (), (1,)])
def test_a_product_by_one_b_for_a_whole_batch_is_one_of_more_rows(cin):
    """A [2, 3, 5] @ B^T for a B [4, 5] shared by the batch, where that pays: A viewed as [6, 5],
    the result viewed back; a Cin along N (a bias) or of one value read as it is, one of the
    result's shape viewed as rows too."""
    b = Builder()
    operands = [b.input("x", (2, 3, 5)), b.input("w", (4, 5))] + ([b.input("c", cin)] if cin is not None else [])
    graph = b.output(b.op("MATMUL", *operands, transpose_b=True))
    after = products_by_rows(canonicalise(graph, []), lambda *_: True, [])
    viewed_cin = {None: [], (): [], (1,): [], (4,): [], (1, 1, 4): [(4,)], (2, 3, 4): [(6, 4)]}[cin]
    assert types(after) == ["RESHAPE"] * (1 + len(viewed_cin)) + ["MATMUL", "RESHAPE"]
    matmul = after.ops[-2]
    assert [after.tensors[t].shape for t in matmul.inputs[::2]] == \
        [(6, 5), *(viewed_cin or ([cin] if cin is not None else []))]
    feeds = feeds_for(graph)
    expected = feeds["x"].astype(np.float64) @ feeds["w"].T.astype(np.float64) + (feeds["c"] if cin is not None else 0)
    [y] = evaluate(after, feeds).values()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cin, b_shape, added, pays", [
    ((3, 4), (5, 4), None, True),  # a Cin along M: no view of it runs along the rows
    ((2, 1, 4), (5, 4), None, True),  # along the batch but not M
    (None, (2, 5, 4), None, True),  # a B for each element of the batch
    (None, (5, 4), (1, 3, 4), True),  # an epilogue's ADD along M alone (a position embedding)
    (None, (5, 4), (2, 3, 4), True),  # one of the whole result that is no residual: computed apart
    (None, (5, 4), None, False),  # the target's objective prefers the batch
])
def test_a_batch_of_products_stays_one_where_its_rows_do_not_make_one_product(cin, b_shape, added, pays):
    b = Builder()
    operands = [b.input("x", (2, 3, 5)), b.input("w", b_shape)] + ([b.input("c", cin)] if cin else [])
    y = b.op("MATMUL", *operands)
    graph = canonicalise(b.output(b.op("ADD", y, b.input("p", added)) if added else y), [])
    after = products_by_rows(graph, lambda *_: pays, [])
    assert types(after) == ["MATMUL", *(["ADD"] if added else [])]
    assert after.tensors[after.ops[0].inputs[0]].shape == (2, 3, 5)


def test_linear_of_a_vector_stays_linear():
    # MATMUL takes rank >= 2, so the registry's shape rule refuses the rewrite
    b = Builder()
    graph = b.output(b.op("LINEAR", b.input("x", (5,)), b.input("w", (4, 5))))
    assert types(canonicalise(graph, [])) == ["LINEAR"]


# ---- SOFTMAX ---------------------------------------------------------------------------------


def tosa_softmax(shape=(4, 10), max_axis=1, sum_axis=1, sub_of=None):
    """The chain TOSA writes for a softmax: x - max, exp, sum, reciprocal, multiply."""
    b = Builder()
    x = b.input("x", shape)
    shifted = b.op("SUB", sub_of(b) if sub_of else x, b.op("REDUCE_MAX", x, axes=[max_axis], keepdims=True))
    e = b.op("EXP", shifted)
    s = b.op("REDUCE_SUM", e, axes=[sum_axis], keepdims=True)
    y = b.op("MUL", e, b.op("RECIPROCAL", s))
    return b, x, shifted, e, y


def test_tosa_softmax_chain_becomes_softmax():
    b, x, *_, y = tosa_softmax()
    after, _ = recognised(b.output(y))
    [op] = after.ops
    assert (op.op_type, op.inputs, op.outputs, op.attrs) == ("SOFTMAX", [x], [y], {"axis": 1})


def test_mobilenet_softmax_tail_becomes_one_softmax():
    graph, warnings = load_graph(str(DATA / "dfg" / "dfg__mobilenet_v1.dfg"))
    after = graph_passes(graph, load_target("standard"), True, warnings)
    assert types(after)[-2:] == ["RESHAPE", "SOFTMAX"]
    before = types(graph)[:-6]
    pool = before.index("REDUCE_SUM")  # the global pool's sums over H, then W: one window op
    assert types(after)[:-1] == before[:pool] + ["SUMPOOL2D"] + before[pool + 2:]
    softmax = after.ops[-1]
    assert softmax.inputs == graph.ops[-7].outputs and softmax.outputs == graph.ops[-1].outputs
    assert softmax.attrs == {"axis": 1} and "node 123 'tosa.mul'" in softmax.source


def test_mobilenet_v2_classifier_becomes_the_pooled_images_convolution_and_softmax():
    """Its LINEAR (a MATMUL by weights given transposed) reads the global pool's result through a
    flatten (RESHAPE) and a MUL by a constant: the MUL sinks below the view, onto the pool, and
    the product of that one position is its 1x1 convolution, the weights the same constant
    viewed as [N, 1, 1, K]; the flatten moves to its result."""
    graph, warnings = load_graph(str(DATA / "dfg" / "dfg__mobilenet_v2.dfg"))
    after = graph_passes(graph, load_target("standard"), True, warnings)
    assert types(graph)[-8:-6] == ["MUL", "LINEAR"]
    assert types(after)[-5:] == ["SUMPOOL2D", "MUL", "CONV2D", "RESHAPE", "SOFTMAX"]
    pool, scale, conv, flat, _ = after.ops[-5:]
    assert scale.inputs[0] == pool.outputs[0] and conv.inputs[0] == scale.outputs[0] and flat.inputs == conv.outputs
    assert [after.tensors[t].shape for t in conv.inputs] == [(1, 1, 1, 1280), (1000, 1, 1, 1280), (1000,)]
    assert after.tensors[conv.inputs[1]].role == "constant" and after.tensors[flat.outputs[0]].shape == (1, 1000)


@pytest.mark.parametrize("shifted", [True, False])
def test_exp_over_sum_of_exp_becomes_softmax(shifted):
    b = Builder()
    x = b.input("x", (3, 5, 2))
    arg = b.op("SUB", x, b.op("REDUCE_MAX", x, axes=[-2])) if shifted else x
    e = b.op("EXP", arg)
    after, _ = recognised(b.output(b.op("DIV", e, b.op("REDUCE_SUM", e, axes=[1]))))
    [op] = after.ops
    assert (op.op_type, op.inputs, op.attrs) == ("SOFTMAX", [x], {"axis": 1})


def test_softmax_of_another_axis_keeps_its_shift():
    # the max runs along axis 0, the sum along axis 1: a softmax of x - max0(x), not of x
    b, x, shifted, _, y = tosa_softmax(shape=(4, 4), max_axis=0, sum_axis=1)
    after, _ = recognised(b.output(y))
    assert types(after) == ["REDUCE_MAX", "SUB", "SOFTMAX"] and after.ops[-1].inputs == [shifted]


def test_softmax_of_another_tensor_keeps_its_shift():
    # x2 - max(x): a softmax of that difference, never of x or x2
    b, x, shifted, _, y = tosa_softmax(sub_of=lambda b: b.input("x2", (4, 10)))
    after, _ = recognised(b.output(y))
    assert types(after) == ["REDUCE_MAX", "SUB", "SOFTMAX"] and after.ops[-1].inputs == [shifted]


def test_softmax_chain_with_an_exp_read_elsewhere_stays():
    b, x, shifted, e, y = tosa_softmax()
    graph = b.output(y, b.op("ADD", e, x))
    after, _ = recognised(graph)
    assert "SOFTMAX" not in types(after)


def test_softmax_chain_with_an_intermediate_output_keeps_it():
    b, x, shifted, e, y = tosa_softmax()
    after, _ = recognised(b.output(y, e))
    assert "SOFTMAX" not in types(after)
    b, x, shifted, e, y = tosa_softmax()
    after, _ = recognised(b.output(y, shifted))  # the softmax of the kept difference
    assert types(after) == ["REDUCE_MAX", "SUB", "SOFTMAX"]


@pytest.mark.parametrize("spelling", ["two axes", "dropped axis", "swapped", "mixed dtypes"])
def test_softmax_near_misses_stay(spelling):
    b = Builder()
    x = b.input("x", (4, 4, 4))
    e = b.op("EXP", x, dtype="f16" if spelling == "mixed dtypes" else "f32")
    if spelling == "two axes":
        s = b.op("REDUCE_SUM", e, axes=[1, 2])
    elif spelling == "dropped axis":  # the sums over the last axis, [4, 4], broadcast along the first
        s = b.op("REDUCE_SUM", e, axes=[2], keepdims=False)
    else:
        s = b.op("REDUCE_SUM", e, axes=[2])
    y = b.op("DIV", s, e) if spelling == "swapped" else b.op("DIV", e, s)
    after, _ = recognised(b.output(y))
    assert "SOFTMAX" not in types(after)


# ---- LAYERNORM -------------------------------------------------------------------------------


def layernorm_chain(b: Builder, x: str, axes: list[int], eps: str | None = None, mean="mean", square="mul",
                    normalize="rsqrt", var_axes: list[int] | None = None) -> tuple[str, str]:
    """The chain of a layer norm as exporters write it; (result, centred)."""
    n = math.prod(b.graph.tensors[x].shape[a] for a in axes)

    def mean_of(t: str, over: list[int]) -> str:
        if mean == "sum*1/n":
            return b.op("MUL", b.op("REDUCE_SUM", t, axes=over), b.const(f"inv_n{len(b.graph.ops)}", 1 / n))
        if mean == "sum/n":
            return b.op("DIV", b.op("REDUCE_SUM", t, axes=over), b.const(f"n{len(b.graph.ops)}", n))
        return b.op("REDUCE_MEAN", t, axes=over)

    c = b.op("SUB", x, mean_of(x, axes))
    sq = b.op("POW", c, b.const("two", 2.0)) if square == "pow" else b.op("MUL", c, c)
    var = mean_of(sq, var_axes or axes)
    if eps is not None:
        var = b.op("ADD", eps, var)
    if normalize == "rsqrt":
        return b.op("MUL", b.op("RSQRT", var), c), c
    return b.op("DIV", c, b.op("SQRT", var)), c


@pytest.mark.parametrize("mean", ["mean", "sum*1/n", "sum/n"])
@pytest.mark.parametrize("square,normalize", [("mul", "rsqrt"), ("pow", "div")])
def test_layernorm_chain_becomes_layernorm(mean, square, normalize):
    b = Builder()
    x = b.input("x", (2, 3, 8))
    y, _ = layernorm_chain(b, x, [2], b.const("eps", 1e-3), mean, square, normalize)
    after, _ = recognised(b.output(y))
    [op] = after.ops
    assert (op.op_type, op.inputs, op.outputs) == ("LAYERNORM", [x], [y])
    assert op.attrs["axis"] == 2 and op.attrs["epsilon"] == pytest.approx(1e-3)


def test_layernorm_takes_its_scale_and_bias():
    b = Builder()
    x, scale, bias = b.input("x", (2, 3, 8)), b.input("scale", (3, 8)), b.input("bias", (8,))
    y, _ = layernorm_chain(b, x, [1, 2], b.const("eps", 1e-5, (1, 1, 1)))
    after, _ = recognised(b.output(b.op("ADD", bias, b.op("MUL", y, scale))))
    [op] = after.ops
    assert (op.op_type, op.inputs) == ("LAYERNORM", [x, scale, bias])
    assert op.attrs == {"axis": 1, "epsilon": pytest.approx(1e-5)}


def test_layernorm_without_epsilon_and_bias_without_scale():
    b = Builder()
    x, bias = b.input("x", (4, 8)), b.input("bias", (8,))
    y, _ = layernorm_chain(b, x, [1])
    after, _ = recognised(b.output(b.op("ADD", y, bias)))
    assert types(after) == ["LAYERNORM", "ADD"] and after.ops[0].attrs == {"axis": 1, "epsilon": 0.0}


def test_layernorm_with_an_epsilon_of_unknown_value_stays_with_a_warning():
    b = Builder()
    x = b.input("x", (4, 8))
    y, _ = layernorm_chain(b, x, [1], b.const("eps", None))
    after, warnings = recognised(b.output(y))
    assert "LAYERNORM" not in types(after)
    assert warnings == ["test:6: a layer norm chain is left as ops: its epsilon 'eps' is not a constant of known value"]


@pytest.mark.parametrize("miss", ["variance axes", "leading axis", "centred read elsewhere", "mean of another"])
def test_layernorm_near_misses_stay(miss):
    b = Builder()
    x = b.input("x", (4, 6, 8))
    axes, var_axes = ([0], None) if miss == "leading axis" else ([2], [1, 2] if miss == "variance axes" else None)
    if miss == "mean of another":
        other = b.input("other", (4, 6, 8))
        c = b.op("SUB", x, b.op("REDUCE_MEAN", other, axes=[2]))
        var = b.op("ADD", b.op("REDUCE_MEAN", b.op("MUL", c, c), axes=[2]), b.const("eps", 1e-5))
        outputs = [b.op("MUL", c, b.op("RSQRT", var))]
    else:
        y, c = layernorm_chain(b, x, axes, b.const("eps", 1e-5), var_axes=var_axes)
        outputs = [y, b.op("EXP", c)] if miss == "centred read elsewhere" else [y]
    after, _ = recognised(b.output(*outputs))
    assert "LAYERNORM" not in types(after)


def test_sum_times_another_constant_is_no_mean():
    b = Builder()
    x = b.input("x", (4, 8))
    graph = b.output(b.op("MUL", b.op("REDUCE_SUM", x, axes=[1]), b.const("k", 0.5)))
    after, _ = recognised(graph)
    assert types(after) == ["REDUCE_SUM", "MUL"]


# ---- GELU ------------------------------------------------------------------------------------


def gelu_tanh(b: Builder, x: str, cube="pow", grouping="(x*half)*p", c=0.044715, known=True) -> str:
    value = (lambda v: v) if known else (lambda v: None)
    if cube == "pow":
        x3 = b.op("POW", x, b.const("three", value(3.0)))
    else:
        x3 = b.op("MUL", x, b.op("MUL", x, x))
    shifted = b.op("ADD", b.op("MUL", x3, b.const("c", value(c))), x)
    inner = b.op("MUL", b.const("k", value(math.sqrt(2 / math.pi))), shifted)
    p = b.op("ADD", b.const("one", value(1.0)), b.op("TANH", inner))
    half = b.const("half", value(0.5))
    if grouping == "(x*half)*p":
        return b.op("MUL", p, b.op("MUL", half, x))
    return b.op("MUL", x, b.op("MUL", p, half))


@pytest.mark.parametrize("cube,grouping", [("pow", "(x*half)*p"), ("mul", "x*(p*half)")])
def test_gelu_tanh_chain_becomes_gelu(cube, grouping):
    b = Builder()
    x = b.input("x", (3, 7))
    after, _ = recognised(b.output(gelu_tanh(b, x, cube, grouping)))
    [op] = after.ops
    assert (op.op_type, op.inputs, op.attrs) == ("GELU", [x], {"approximate": "tanh"})
    assert after.constants == {}


def test_gelu_chain_with_constants_of_unknown_value_stays_with_a_warning():
    b = Builder()
    after, warnings = recognised(b.output(gelu_tanh(b, b.input("x", (3, 7)), known=False)))
    assert "GELU" not in types(after)
    assert len(warnings) == 1 and "tanh form of GELU is left as ops" in warnings[0]


def test_gelu_chain_with_another_constant_stays():
    b = Builder()
    after, warnings = recognised(b.output(gelu_tanh(b, b.input("x", (3, 7)), c=0.05)))
    assert "GELU" not in types(after) and warnings == []


def test_gelu_erf_chain_becomes_gelu():
    b = Builder()
    x = b.input("x", (3, 7))
    p = b.op("ADD", b.op("ERF", b.op("DIV", x, b.const("sqrt2", math.sqrt(2)))), b.const("one", 1.0))
    after, _ = recognised(b.output(b.op("MUL", b.op("MUL", x, b.const("half", 0.5)), p)))
    [op] = after.ops
    assert (op.op_type, op.inputs, op.attrs) == ("GELU", [x], {"approximate": "none"})
