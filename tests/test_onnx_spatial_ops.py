"""The ONNX ops of models that contract by equation, resample, index and broadcast (issue 20):
Einsum, Resize and Upsample, dilated MaxPool and AveragePool, GatherElements and GatherND of
constant indices, Expand, Tile and Where of runtime tensors. Each model is compiled, written and
read back, bound and executed in-process; every output against onnxruntime's, every kernel and
output passing --check."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import CONFIGS, shrunk_config
from dfx import dumps, loads, numpy_dtype, tolerance
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends.onnx import parse_onnx
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.inputs import program_inputs
from loader.run import check_kernels, check_outputs
from test_frontend_onnx import model, ort_run, rand, refusal

STANDARD = str(CONFIGS / "standard.json")


def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray], config: str = STANDARD):
    """Every output of the KPU's run as onnxruntime's, every kernel and output passing --check;
    the program."""
    graph, warnings = parse_onnx("test.onnx", m.SerializeToString())
    program = loads(dumps(compile_graph(infer_shapes(graph, warnings), "test.onnx", load_target(config))))
    bindings = bind_program(program, load_machine(config), "test.onnx", bind_greedy)
    tensors = program.graph.tensors
    given = {k: v.astype(numpy_dtype(tensors[k].dtype)) for k, v in feeds.items()}
    values = execute(program, bindings, program_inputs(program, given, 0))
    for name, check in {**check_kernels(program, values), **check_outputs(program, values)}.items():
        assert check.passed, f"--check fails {name}: {check}"
    for name, want in ort_run(m, feeds).items():
        atol, rtol = tolerance(tensors[name].dtype)
        assert values[name].shape == want.shape, name
        np.testing.assert_allclose(values[name].astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=name)
    return program


def ops_of(program) -> list[str]:
    """The program's graph ops but its RESHAPEs (views: no kernel moves their bytes)."""
    return [op.op_type for op in program.graph.ops if op.op_type != "RESHAPE"]


# ---- Einsum ----------------------------------------------------------------------------------

# equation -> (operand shapes, the registry ops it becomes but RESHAPEs)
EINSUMS = {
    "bij,bjk->bik": ([(2, 3, 4), (2, 4, 5)], ["MATMUL"]),
    # attention's scores: K's [b, h, k, d] is already B transposed, no TRANSPOSE kernel
    "bhqd,bhkd->bhqk": ([(1, 2, 3, 4), (1, 2, 5, 4)], ["MATMUL"]),
    "ij->ji": ([(3, 4)], ["TRANSPOSE"]),
    "ij->i": ([(3, 4)], ["REDUCE_SUM"]),
    "ij,jk": ([(2, 3), (3, 4)], ["MATMUL"]),  # implicit output: ik
    "i,j->ij": ([(3,), (4,)], ["MUL"]),  # nothing to sum: a broadcast product
    "ij,jk,kl->il": ([(2, 3), (3, 4), (4, 5)], ["MATMUL", "MATMUL"]),
    "bii->bi": ([(2, 3, 3)], ["GATHER"]),  # a diagonal, by element numbers
    # ellipsis dims that broadcast (1 against 5, 2 against 1)
    "...ij,...jk->...ik": ([(2, 1, 3, 4), (1, 5, 4, 2)], None),
    # the operands swapped, so that the product comes out in the output's order: one TRANSPOSE (of
    # bkj to bjk, the first operand), the other read with transpose_b
    "ik,bkj->bji": ([(3, 4), (2, 4, 5)], ["TRANSPOSE", "MATMUL"]),
    "ij,kj->ki": ([(2, 3), (4, 3)], ["MATMUL"]),
}


@pytest.mark.parametrize("equation", EINSUMS)
def test_einsum(equation):
    shapes, ops = EINSUMS[equation]
    feeds = {f"x{i}": rand(*shape, seed=i) for i, shape in enumerate(shapes)}
    program = run(model([helper.make_node("Einsum", list(feeds), ["y"], equation=equation)], feeds, ["y"]), feeds)
    if ops is not None:
        assert ops_of(program) == ops


def test_einsum_sums_a_label_no_other_operand_has_before_the_product():
    feeds = {"a": rand(2, 3, 4), "b": rand(4, 5, seed=1)}
    program = run(model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="xij,jk->ik")], feeds, ["y"]), feeds)
    reduce, matmul = program.graph.ops[0], program.graph.ops[1]
    assert (reduce.op_type, reduce.attrs["axes"], matmul.op_type) == ("REDUCE_SUM", [0], "MATMUL")


def test_einsum_refusals():
    """One line each; an equation onnx's shape inference would loop forever on ('.' astray) is
    refused before it runs."""
    def einsum(equation: str, *shapes: tuple[int, ...]) -> onnx.ModelProto:
        feeds = {f"x{i}": rand(*shape) for i, shape in enumerate(shapes)}
        return model([helper.make_node("Einsum", list(feeds), ["y"], equation=equation)], feeds, ["y"])

    assert refusal(einsum("i.j->ij", (2, 3))) == (
        "bad.onnx: node #0 (Einsum): equation 'i.j->ij' is not terms of letters (and at most one '...' each) "
        "joined by ',' and '->'")
    assert refusal(einsum("ij,jk->ik", (2, 3), (4, 5))) == (
        "bad.onnx: node #0 (Einsum): label 'j' stands for dims of 3 and 4")
    assert refusal(einsum("ij->ii", (2, 3))) == (
        "bad.onnx: node #0 (Einsum): equation 'ij->ii': its output names a label twice or one no operand has")


# ---- one tensor as both operands of a product ------------------------------------------------

_T = [1, 0]
# id -> (x's shape, nodes reading it, the registry ops but RESHAPEs); each product's kernel holds
# A's tiles and B's, which differ: B is read through a view of x, a tensor of its own
ONE_TENSOR_TWICE = {
    "x@x": ((112, 112), [helper.make_node("MatMul", ["x", "x"], ["y"])], ["MATMUL"]),
    "x@x.T": ((112, 48), [helper.make_node("Transpose", ["x"], ["xt"], perm=_T),
                          helper.make_node("MatMul", ["x", "xt"], ["y"])], ["MATMUL"]),
    "relu(x)@relu(x), batched": ((2, 96, 96), [helper.make_node("Relu", ["x"], ["r"]),
                                               helper.make_node("MatMul", ["r", "r"], ["y"])], ["RELU", "MATMUL"]),
    "gram by einsum": ((64, 96), [helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,kj->ik")], ["MATMUL"]),
    "gemm x x^T + c": ((40, 24), [helper.make_node("Gemm", ["x", "x", "c"], ["y"], transB=1)], None),
}


@pytest.mark.parametrize("case", ONE_TENSOR_TWICE)
def test_one_tensor_as_both_operands(case):
    shape, nodes, ops = ONE_TENSOR_TWICE[case]
    feeds = {"x": rand(*shape, seed=5)}
    constants = {"c": rand(shape[0], seed=6)} if "c" in nodes[-1].input else None
    program = run(model(nodes, feeds, ["y"], constants), feeds)
    if ops is not None:
        assert ops_of(program) == ops


# ---- Resize and Upsample ---------------------------------------------------------------------

X = rand(1, 2, 4, 5, seed=3)
NO_VALUES = np.float32([])


def resize(opset: int, scales=None, sizes=None, **attrs) -> onnx.ModelProto:
    """A Resize of X by constant scales or sizes, its roi (and, before opset 13, its scales) empty."""
    inputs, inits = ["x", "roi" if opset < 13 else ""], {"roi": NO_VALUES}
    if scales is not None:
        inputs.append("scales")
        inits["scales"] = np.float32(scales)
    else:
        inputs += ["no_scales" if opset < 13 else "", "sizes"]
        inits.update(no_scales=NO_VALUES, sizes=np.int64(sizes))
    used = {k: v for k, v in inits.items() if k in inputs}
    return model([helper.make_node("Resize", inputs, ["y"], **attrs)], {"x": X}, ["y"], used, opset=opset)


RESIZES = {
    "nearest_x2": (resize(19, scales=[1, 1, 2, 2]), ["GATHER", "GATHER"]),  # H, then W
    "nearest_asymmetric_floor": (resize(13, scales=[1, 1, 1.5, 1.5], coordinate_transformation_mode="asymmetric",
                                        nearest_mode="floor"), None),
    "nearest_sizes_ceil": (resize(11, sizes=[1, 2, 7, 9], nearest_mode="ceil"), None),
    "nearest_align_corners_round_prefer_ceil": (resize(13, sizes=[1, 2, 3, 8], nearest_mode="round_prefer_ceil",
                                                       coordinate_transformation_mode="align_corners"), None),
    "nearest_axes": (model([helper.make_node("Resize", ["x", "", "scales"], ["y"], axes=[3, 2])], {"x": X}, ["y"],
                           {"scales": np.float32([2, 3])}, opset=18), None),
    # the interpolation weights, one MATMUL per axis (W as rows of x, then H)
    "linear_half_pixel_x2": (resize(13, scales=[1, 1, 2, 2], mode="linear"), ["MATMUL", "MATMUL"]),
    "linear_pytorch_half_pixel_down": (resize(13, sizes=[1, 2, 3, 3], mode="linear",
                                              coordinate_transformation_mode="pytorch_half_pixel"), None),
    "linear_align_corners": (resize(11, sizes=[1, 2, 7, 9], mode="linear",
                                    coordinate_transformation_mode="align_corners"), None),
    "linear_asymmetric": (resize(19, scales=[1, 1, 3, 1.5], mode="linear",
                                 coordinate_transformation_mode="asymmetric"), None),
    "linear_antialias_down": (model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                                                      antialias=1)], {"x": X}, ["y"], {"sizes": np.int64([1, 2, 3, 2])},
                                    opset=18), None),
    "cubic_exclude_outside": (resize(13, scales=[1, 1, 2, 1.5], mode="cubic", exclude_outside=1,
                                     cubic_coeff_a=-0.5), None),
}


@pytest.mark.parametrize("case", RESIZES)
def test_resize(case):
    m, ops = RESIZES[case]
    program = run(m, {"x": X})
    if ops is not None:
        assert ops_of(program) == ops


def test_upsample_and_opset_10_resize_keep_their_asymmetric_mapping():
    """The version converter's Resize of opset 11 would read them as half_pixel: Upsample
    (opsets 7 to 9) takes the input below each output, Resize of opset 10 the one above where it
    shrinks (as onnxruntime)."""
    # scales where half_pixel with round_prefer_floor would take other inputs
    upsample = lambda mode, scales: model(  # noqa: E731
        [helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)], {"x": X}, ["y"],
        {"s": np.float32(scales)}, opset=9)
    run(upsample("nearest", [1, 1, 2, 1.25]), {"x": X})
    run(upsample("linear", [1, 1, 2, 1.5]), {"x": X})
    attr = model([helper.make_node("Upsample", ["x"], ["y"], mode="linear", scales=[1.0, 1.0, 1.5, 2.0])], {"x": X},
                 ["y"], opset=7)
    run(attr, {"x": X})
    shrink = model([helper.make_node("Resize", ["x", "s"], ["y"])], {"x": X}, ["y"],
                   {"s": np.float32([1, 1, 0.75, 0.6])}, opset=10)
    run(shrink, {"x": X})


def test_resize_refusals():
    assert refusal(resize(13, scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize")) == (
        "bad.onnx: node #0 (Resize): coordinate_transformation_mode 'tf_crop_and_resize' is not supported (these "
        "are: half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric)")
    both_ways = model([helper.make_node("Resize", ["x", "s"], ["y"], name="up")], {"x": X}, ["y"],
                      {"s": np.float32([1, 1, 0.5, 2])}, opset=10)
    assert refusal(both_ways) == ("bad.onnx: node 'up' (Resize): a nearest Resize of opset 10 that shrinks some dims "
                                  "and grows others is not supported (each rounds its own way)")
    runtime = model([helper.make_node("Resize", ["x", "", "s"], ["y"])], {"x": X, "s": np.float32([1, 1, 2, 2])},
                    ["y"], opset=13)
    assert refusal(runtime) == ("bad.onnx: node #0 (Resize): its scales (input 2) must be a constant: the ONNX "
                                "frontend reads them at compile time")
    deprecated = model([helper.make_node("Upsample", ["x", "s"], ["y"])], {"x": X}, ["y"],
                       {"s": np.float32([1, 1, 2, 2])}, opset=13)
    assert refusal(deprecated) == ("bad.onnx: node #0 (Upsample): Upsample is deprecated from opset 10 (Resize does "
                                   "its work); the model imports opset 13")


# ---- dilated pools -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """standard with 32 KB of L3 and 4 KB L1 buffers: a 40x40 image splits into bands."""
    return shrunk_config(tmp_path_factory, "standard", "small", (2, 16), (8, 8), (4, 4))


@pytest.mark.parametrize("op_type, attrs", [
    ("MaxPool", {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [2, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [1, 2], "pads": [1, 2, 2, 1]}),
    ("AveragePool", {"kernel_shape": [2, 3], "dilations": [3, 2], "pads": [1, 1, 0, 2], "count_include_pad": 1,
                     "strides": [3, 1]}),
])
def test_dilated_pool(op_type, attrs, small):
    x = rand(1, 8, 40, 40, seed=4)
    program = run(model([helper.make_node(op_type, ["x"], ["y"], **attrs)], {"x": x}, ["y"], opset=19), {"x": x}, small)
    [pool] = [k for k in program.kernels if k.op in ("MAXPOOL2D", "AVGPOOL2D", "SUMPOOL2D")]
    assert pool.tiling["num_tiles_th"] * pool.tiling["num_tiles_tw"] > 1  # bands with their dilated halo


# ---- GatherElements and GatherND ---------------------------------------------------------------

D = rand(3, 4, 5, seed=5)
GATHERS = {
    "elements_axis_1": ("GatherElements", {"axis": 1}, np.int64([[[3, 0, 1, 2, 3], [-1, 2, 0, 0, 1]]] * 3)),
    "elements_axis_last_smaller": ("GatherElements", {"axis": -1}, np.int64([[[4, 0], [1, -5]], [[0, 0], [2, 3]]])),
    "nd_slices": ("GatherND", {}, np.int64([[[2, 1], [0, -1]], [[1, 0], [2, 3]]])),  # rows of 5: one GATHER of rows
    "nd_batch_dims": ("GatherND", {"batch_dims": 1}, np.int64([[[1, 4]], [[0, 0]], [[3, 2]]])),
}


@pytest.mark.parametrize("case", GATHERS)
def test_gather_of_constant_indices(case):
    op_type, attrs, indices = GATHERS[case]
    program = run(model([helper.make_node(op_type, ["d", "i"], ["y"], **attrs)], {"d": D}, ["y"], {"i": indices}),
                  {"d": D})
    [gather] = [op for op in program.graph.ops if op.op_type == "GATHER"]
    if case == "nd_slices":  # whole rows of D seen as [12, 5]: the tuples' row numbers
        assert (program.graph.tensors[gather.inputs[0]].shape, gather.attrs["indices"]) == ((12, 5), [9, 3, 4, 11])


def test_a_constant_index_out_of_range_is_refused():
    outside = model([helper.make_node("GatherND", ["d", "i"], ["y"])], {"d": D}, ["y"], {"i": np.int64([[0, -5]])})
    assert refusal(outside) == "bad.onnx: node #0 (GatherND): index -5 is out of range for a dim of 4"


# ---- Expand, Tile and Where of runtime tensors ------------------------------------------------


def test_expand_tile_and_where_of_runtime_tensors():
    """Expand and Tile broadcast by a MUL with ones of only the dims that grow; Where selects by
    a condition known at run time alone."""
    feeds = {"x": rand(3, 1, seed=6), "c": np.array([[True, False, True, True]]), "z": rand(2, 3, 4, seed=7)}
    nodes = [helper.make_node("Expand", ["x", "shape"], ["expanded"]),
             helper.make_node("Tile", ["z", "repeats"], ["tiled"]),
             helper.make_node("Where", ["c", "expanded", "z"], ["selected"])]
    m = model(nodes, feeds, ["expanded", "tiled", "selected"],
              {"shape": np.int64([2, 1, 4]), "repeats": np.int64([1, 2, 3])})
    program = run(m, feeds)
    muls = [op for op in program.graph.ops if op.op_type == "MUL"]
    assert [program.graph.tensors[op.inputs[1]].shape for op in muls] == [(2, 1, 4), (1, 2, 1, 3, 1)]
    assert "SELECT" in ops_of(program)


def test_expand_and_tile_of_constants_still_fold():
    nodes = [helper.make_node("Expand", ["b", "shape"], ["wide"]), helper.make_node("Tile", ["wide", "r"], ["t"]),
             helper.make_node("Add", ["x", "t"], ["y"])]
    m = model(nodes, {"x": rand(2, 6)}, ["y"],
              {"b": rand(1, 3, seed=8), "shape": np.int64([2, 3]), "r": np.int64([1, 2])})
    program = run(m, {"x": rand(2, 6, seed=9)})
    assert ops_of(program) == ["ADD"]
