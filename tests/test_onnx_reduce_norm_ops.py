"""The ONNX reductions and normalizations real models use beyond the basic ones: LRN,
GlobalMaxPool, InstanceNormalization, GroupNormalization (opsets 18 and 21), ReduceL1 / L2 /
SumSquare / LogSumExp / Prod, ArgMax / ArgMin, CumSum, Trilu and TopK. Each as a small model compiled,
bound and executed in-process, every kernel and output passing --check, its output against
onnxruntime's (exactly for integers and positions; LRN of an even size, which onnxruntime
refuses, against the spec's formula in float64)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from dfx import tolerance
from kernel_compiler.errors import CompileError
from loader.run import check_kernels, check_outputs
from test_frontend_onnx import kpu_run, model, ort_run, rand

X = rand(2, 3, 4, 5, seed=11)


def run_checked(m: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle=ort_run):
    """(the KPU's value of y, the oracle's, the program); every kernel and output passes --check."""
    values, program, _ = kpu_run(m, feeds)
    for name, check in {**check_kernels(program, values), **check_outputs(program, values)}.items():
        assert check.passed, f"--check fails {name}: {check}"
    return values["y"], oracle(m, feeds)["y"], program


def assert_matches(m: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle=ort_run):
    got, want, program = run_checked(m, feeds, oracle)
    assert got.shape == want.shape
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))
    else:
        atol, rtol = tolerance(program.graph.tensors["y"].dtype)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    return program


def one_node(op_type: str, x: np.ndarray, opset: int = 18, inits: dict | None = None, extra: tuple = (), **attrs):
    """A model y = op_type(x, *extra) with `inits` (names in `extra`) as initializers."""
    node = helper.make_node(op_type, ["x", *extra], ["y"], **attrs)
    return model([node], {"x": x}, ["y"], inits, opset=opset)


def kernel_ops(program) -> list[str]:
    """The ops of the kernels that move or compute (a RESHAPE's names its operand's bytes)."""
    return [k.op for k in program.kernels if k.op != "RESHAPE"]


# ---- normalizations and pools -----------------------------------------------------------------


def lrn_by_loops(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LRN as the ONNX spec words it, channel by channel, in float64: onnxruntime takes odd sizes
    only, and the onnx package's reference walks the batch dim instead of the channels."""
    attrs = {a.name: helper.get_attribute_value(a) for a in m.graph.node[0].attribute}
    size, alpha, beta, bias = attrs["size"], attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    x = feeds["x"].astype(np.float64)
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        window = x[:, max(0, c - (size - 1) // 2):min(x.shape[1], c + -(-(size - 1) // 2) + 1)]
        y[:, c] = x[:, c] / (bias + alpha / size * np.sum(window * window, axis=1)) ** beta
    return {"y": y.astype(np.float32)}


@pytest.mark.parametrize("attrs, oracle", [({"size": 3, "alpha": 0.5, "beta": 0.6, "bias": 2.0}, ort_run),
                                           # the loops agree with onnxruntime where it runs
                                           ({"size": 3, "alpha": 0.5, "beta": 0.6, "bias": 2.0}, lrn_by_loops),
                                           ({"size": 4, "alpha": 0.2}, lrn_by_loops)])
def test_lrn_is_a_channel_window_pool_and_maps(attrs, oracle):
    x = rand(1, 7, 3, 4, seed=1, low=-3, high=3)
    program = assert_matches(one_node("LRN", x, **attrs), {"x": x}, oracle)
    # x^2; the window sum as a pool with the scaling, the power and the division its epilogue
    # (the division reads the pool's result through a view, which sinks below it)
    assert kernel_ops(program) == ["MUL", "AVGPOOL2D"]
    assert [len(k.epilogue) for k in program.kernels if k.op == "AVGPOOL2D"] == [4]


def test_global_max_pool():
    assert_matches(one_node("GlobalMaxPool", X), {"x": X})


def test_instance_normalization_is_one_layernorm_kernel():
    scale, bias = rand(3, seed=2), rand(3, seed=3)
    m = one_node("InstanceNormalization", X, inits={"s": scale, "b": bias}, extra=("s", "b"), epsilon=1e-3)
    program = assert_matches(m, {"x": X})
    assert kernel_ops(program) == ["LAYERNORM"] and program.kernels[0].epilogue  # scale and bias fused


@pytest.mark.parametrize("opset, per", [(18, "group"), (21, "channel")])
def test_group_normalization_by_opset(opset, per):
    x = rand(2, 6, 3, 2, seed=4)
    count = 3 if per == "group" else 6
    feeds = {"x": x, "s": rand(count, seed=5), "b": rand(count, seed=6)}  # scale and bias at run time
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-4)
    assert_matches(model([node], feeds, ["y"], opset=opset), feeds)


# ---- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceProd"])
@pytest.mark.parametrize("opset, axes, keepdims", [(18, [1, -1], 0), (13, [2], 1)])
def test_reductions(op, opset, axes, keepdims):
    """Axes as an input (opset 18) and as an attribute (before); the conformance cases hold more."""
    x = rand(2, 3, 4, seed=7, low=0.5, high=1.5) if op == "ReduceProd" else rand(2, 3, 4, seed=7, low=-3, high=3)
    if opset >= 18:
        m = one_node(op, x, opset, {"axes": np.array(axes, np.int64)}, ("axes",), keepdims=keepdims)
    else:
        m = one_node(op, x, opset, axes=axes, keepdims=keepdims)
    assert_matches(m, {"x": x})


def test_log_sum_exp_is_stable_and_keeps_infinities():
    x = np.float32([[1000, 999, 998], [-np.inf, -np.inf, -np.inf], [np.inf, 1, 2], [-np.inf, 0, np.log(3)]])
    got, want, _ = run_checked(one_node("ReduceLogSumExp", x, 18, {"axes": np.array([1], np.int64)}, ("axes",)),
                               {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got.reshape(-1), [1000 + np.log1p(np.exp(-1) + np.exp(-2)), -np.inf, np.inf,
                                                 np.log(4)], rtol=1e-6)


def test_empty_axes_with_noop_reduce_nothing():
    for op in ("ReduceL1", "ReduceSumSquare", "ReduceLogSumExp"):
        assert_matches(one_node(op, X, 18, noop_with_empty_axes=1), {"x": X})


def test_reduce_prod_folds_on_known_values_and_runs_on_runtime_ones():
    w = rand(3, 4, seed=8)
    nodes = [helper.make_node("ReduceProd", ["w", "axes"], ["p"], keepdims=1),
             helper.make_node("ReduceProd", ["x", "axes"], ["q"], keepdims=1),
             helper.make_node("Add", ["p", "q"], ["y"])]
    x = rand(3, 4, seed=9)
    m = model(nodes, {"x": x}, ["y"], {"w": w, "axes": np.array([1], np.int64)}, opset=18)
    program = assert_matches(m, {"x": x})
    assert [op.op_type for op in program.graph.ops] == ["REDUCE_PROD", "ADD"]  # w's product computed here


# ---- positions, running sums, triangles -------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1}])
def test_arg_max_and_min_with_ties(op, attrs):
    x = np.round(rand(3, 5, 4, seed=10, low=-2, high=2))  # few values: ties in every row
    program = assert_matches(one_node(op, x, 13, **attrs), {"x": x})
    assert program.graph.tensors["y"].dtype == "i32"


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1}, {"exclusive": 1, "reverse": 1}])
def test_cum_sum(attrs):
    assert_matches(one_node("CumSum", X, 14, {"axis": np.array(-2, np.int64)}, ("axis",), **attrs), {"x": X})


def test_integer_cum_sum_is_exact():
    x = np.int32([[2**24 + 1, 1, -5, 7], [3, 2**30, 2**30, -1]])
    assert_matches(one_node("CumSum", x, 14, {"axis": np.array(1, np.int32)}, ("axis",)), {"x": x})


@pytest.mark.parametrize("shape, axis", [((16, 512), 0), ((5, 3000), 1)])
def test_scanned_axes_stay_whole_in_a_tile(shape, axis):
    """ArgMax and CumSum: several tiles, each holding the axis whole; rows longer than the tiles
    that would share the work among the compute tiles (here 2048 elements) still whole, in tiles
    as large as a bank holds."""
    x = rand(*shape, seed=12)
    cum_sum = one_node("CumSum", x, 14, {"a": np.array(axis, np.int64)}, ("a",))
    for m in (one_node("ArgMax", x, 13, axis=axis), cum_sum):
        program = assert_matches(m, {"x": x})
        [kernel] = program.kernels
        assert kernel.dataflow == "vector" and kernel.tiling[f"T{axis}"] == shape[axis]
        assert kernel.tiling["num_tiles"] > 1


@pytest.mark.parametrize("upper, k", [(1, None), (0, 1), (1, -2), (0, 9)])
def test_trilu(upper, k):
    inits = {} if k is None else {"k": np.array(k, np.int64)}
    assert_matches(one_node("Trilu", X, 14, inits, tuple(inits), upper=upper), {"x": X})


def top_k_both(x: np.ndarray, k: int, **attrs):
    """TopK's values and indices, ours (having passed --check) and onnxruntime's; the program."""
    node = helper.make_node("TopK", ["x", "k"], ["y", "i"], **attrs)
    m = model([node], {"x": x}, ["y", "i"], {"k": np.array([k], np.int64)}, opset=11)
    values, program, _ = kpu_run(m, {"x": x})
    for name, check in {**check_kernels(program, values), **check_outputs(program, values)}.items():
        assert check.passed, f"--check fails {name}: {check}"
    want = ort_run(m, {"x": x})
    return (values["y"], values["i"]), (want["y"], want["i"]), program


@pytest.mark.parametrize("shape, k, attrs", [
    ((3, 50), 5, {}),  # the 5 largest of each row
    ((40, 6), 3, {"axis": 0, "largest": 0}),  # the 3 smallest of each column
    ((2, 4, 33), 33, {"axis": -1}),  # the whole row in order
])
def test_top_k_with_ties_takes_the_first_of_equal_values(shape, k, attrs):
    """Values drawn from few levels, so rows hold equal ones: of equal values the one first along
    the axis comes first (ONNX's rule), as in onnxruntime."""
    x = np.round(rand(*shape, seed=14) * 4).astype(np.float32) / 4
    (values, indices), (want_values, want_indices), program = top_k_both(x, k, **attrs)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices.astype(np.int64), want_indices)
    assert {"SORT", "ARGSORT"} <= set(kernel_ops(program))


def test_top_k_of_integers():
    x = np.int32([[7, -3, 2**30, 7, -2**31, 0, 5]])
    (values, indices), (want_values, want_indices), _ = top_k_both(x, 4)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices.astype(np.int64), want_indices)


# ---- refusals ---------------------------------------------------------------------------------


def refusal(m: onnx.ModelProto) -> str:
    with pytest.raises(CompileError) as exc:
        kpu_run(m, {})
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_refusals_name_the_node_and_reason():
    node = helper.make_node("Trilu", ["x", "k"], ["y"])
    m = model([node], {"x": X, "k": np.array(1, np.int64)}, ["y"], opset=14)
    assert "(Trilu): its k (input 1, 'k') must be a constant" in refusal(m)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    m = model([node], {"x": X}, ["y"], {"s": rand(3), "b": rand(3)}, opset=21)
    assert "(GroupNormalization): num_groups 2 does not divide the 3 channels" in refusal(m)
    m = one_node("ArgMax", rand(2, 0, 3), 13, axis=1)
    assert "(ArgMax)" in refusal(m) and "empty" in refusal(m)
    node = helper.make_node("TopK", ["x", "k"], ["y", "i"], largest=2)
    m = model([node], {"x": X}, ["y", "i"], {"k": np.array([2], np.int64)}, opset=11)
    assert "(TopK): largest 2 is not 0 or 1" in refusal(m)
