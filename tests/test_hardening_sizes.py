"""Huge sizes and degenerate programs: every size is bounded where it enters (frontends, shape
inference, hints, the object reader), empty or role-inconsistent programs are refused with one
line, and a functional run too big for the host is told before it starts."""

from __future__ import annotations

import json

import orjson
import pytest

from conftest import CONFIGS, assert_one_line_error, gemm_dfg, run_cli
from dfx import Graph, ObjectFileError, Op, Tensor, dumps, loads
from dfx.objfile import _digest
from kernel_compiler import compile as compile_module
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends import load_graph
from kernel_compiler.frontends.dfg import parse_dfg
from kernel_compiler.frontends.kpusim_json import parse_kpusim_json
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import budget as budget_module
from loader.budget import LONG_RUN_SECONDS, TILE_OPS_PER_SECOND, Budget, advise, available_memory, estimate

STANDARD = load_target(str(CONFIGS / "standard.json"))


def compiled(tmp_path, M=32, N=48, K=160):
    src = tmp_path / "g.dfg"
    src.write_text(gemm_dfg(M, N, K))
    graph, _ = load_graph(str(src))
    return compile_graph(graph, str(src), STANDARD)


def object_of(tmp_path, **dims) -> dict:
    return orjson.loads(dumps(compiled(tmp_path, **dims)))


def resealed(obj: dict) -> bytes:
    """Re-sign an edited body, so the reader's checks (not the checksum) must catch it."""
    obj["sha256"] = _digest(obj["body"])
    return orjson.dumps(obj)


def one_line(exc: pytest.ExceptionInfo, *fragments: str) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    for f in fragments:
        assert f in message, (f, message)
    return message


def kernel(obj: dict) -> dict:
    return obj["body"]["kernels"][0]


def loop(obj: dict, var: str) -> dict:
    return next(l for l in kernel(obj)["tile_loops"] if l["induction_var"] == var)


# ---- huge sizes in the compiler -----------------------------------------------------------------


def test_dfg_with_dimensions_of_1e8_is_refused_at_its_line(tmp_path):
    src, out = tmp_path / "huge.dfg", tmp_path / "huge.kpu"
    src.write_text(gemm_dfg(10**8, 10**8, 10**8))  # used to die in the checksum: MACs hint 10^24
    assert_one_line_error(run_cli("compiler", src, "-o", out), "huge.dfg:5:", "2^40 elements")
    assert not out.exists()


def test_derived_shape_beyond_the_bound_is_refused(tmp_path):
    # [2^30 x 1] @ [1 x 2^30]: each operand is small, the product has 2^60 elements
    text = gemm_dfg(2**30, 2**30, 1).replace(f"tensor<{2**30}x{2**30}xf32>", "tensor<1x1xf32>")
    with pytest.raises(CompileError) as e:
        infer_shapes(*parse_dfg("big.dfg", text))
    one_line(e, "big.dfg:7 node 2 'matmul'", "result 'C'", "2^40 elements")


@pytest.mark.parametrize("attribute", ["n:99999999999999999999", "n:array<i64: 1, 99999999999999999999>",
                                       "n:" + "9" * 5000], ids=["scalar", "array", "5000-digits"])
def test_dfg_attribute_beyond_64_bits_is_refused(attribute):
    text = gemm_dfg(8, 8, 8).replace("|1|0:tensor<8x8xf32>,1:tensor<8x8xf32>||", f"|1|0:tensor<8x8xf32>,1:tensor<8x8xf32>|{attribute}|")
    with pytest.raises(CompileError) as e:
        parse_dfg("a.dfg", text)
    one_line(e, "a.dfg:7:", "attribute 'n'", "signed 64-bit")


def test_hint_beyond_64_bits_is_a_compile_error(tmp_path, monkeypatch):
    def inflated(*args):
        k = compile_module.lower_matmul(*args)
        k.hints["macs"] = 10**24
        return k

    monkeypatch.setitem(compile_module.LOWERINGS, "contraction", inflated)
    with pytest.raises(CompileError) as e:
        compiled(tmp_path)
    one_line(e, "node 2 'matmul'", "kernel 'matmul_0'", "hints 'macs'", "signed 64-bit")


# ---- the kpu-sim graph JSON frontend --------------------------------------------------------------


def graph_json(shape_a=(4, 8), attributes=None) -> str:
    return json.dumps({
        "tensors": {"A": {"shape": list(shape_a), "dtype": "float32"}, "B": {"shape": [8, 4], "dtype": "float32"},
                    "C": {"shape": [4, 4], "dtype": "float32"}},
        "operators": [{"type": "GEMM", "inputs": ["A", "B"], "outputs": ["C"], "attributes": attributes or {}}]})


@pytest.mark.parametrize("text, fragments", [
    ("[" * 100_000 + "]" * 100_000, ["invalid JSON", "nested too deeply"]),
    ('{"tensors": {}, "n": ' + "9" * 5000 + "}", ["invalid JSON", "digits"]),
    (graph_json(shape_a=(2**30, 2**30 - 1)), ["tensors.A.shape", "2^40 elements"]),
    (graph_json(shape_a=[1] * 33), ["tensors.A.shape", "rank 33"]),
    (graph_json(attributes={"n": 2**64}), ["operators[0].attributes.n", "signed 64-bit"]),
    (graph_json(attributes={"n": json.loads("[" * 40 + "]" * 40)}), ["operators[0].attributes.n", "nested deeper"]),
], ids=["deep-json", "5000-digits", "elements", "rank", "int-attribute", "deep-attribute"])
def test_kpusim_json_bounds(text, fragments):
    with pytest.raises(CompileError) as e:
        parse_kpusim_json("g.json", text)
    one_line(e, "g.json:", *fragments)


# ---- empty and output-less graphs -------------------------------------------------------------------


def test_compiler_refuses_an_empty_graph(tmp_path):
    src, out = tmp_path / "empty.dfg", tmp_path / "empty.kpu"
    src.write_text("Domain Flow Graph: empty\nDIRECTED\nNODES 0\nEDGES 0\n")
    assert_one_line_error(run_cli("compiler", src, "-o", out), "empty.dfg", "has no ops")
    assert not out.exists()


def test_compiler_refuses_a_graph_without_outputs():
    graph = Graph("g", {"A": Tensor("A", (4,), "f32", "input"), "B": Tensor("B", (4,), "f32")},
                  [Op("r", "RESHAPE", ["A"], ["B"])])
    with pytest.raises(CompileError) as e:
        compile_graph(graph, "g.json", STANDARD)
    one_line(e, "g.json: graph 'g': has no outputs")


# ---- the object reader: re-signed objects ------------------------------------------------------------


def test_loader_refuses_a_loop_end_of_1e15(tmp_path):
    obj = object_of(tmp_path)
    loop(obj, "tk")["end"] = 10**15  # used to hang the loader
    path = tmp_path / "m.kpu"
    path.write_bytes(resealed(obj))
    assert_one_line_error(run_cli("loader", path, "--config", "standard", "--timing-only"),
                          str(path), "tile_loops", "maximum")


def edit_end(obj):
    loop(obj, "tk")["end"] = 2**40


def add_free_loop(obj):
    kernel(obj)["tile_loops"].append({"induction_var": "spin", "start": 0, "end": 10**6})


def widen_tile(obj):
    for op in kernel(obj)["body"]:
        for ref in ("source", "destination"):
            if op.get(ref, {}).get("tensor") == "A":
                op[ref]["tile_shape"][0] = 10**9


def grow_tensor(obj):
    obj["body"]["graph"]["tensors"][0]["shape"] = [2**21, 2**20]


def deep_attribute(obj):
    obj["body"]["graph"]["ops"][0]["attrs"] = {"x": json.loads("[" * 100 + "]" * 100)}


def huge_hint(obj):
    kernel(obj)["hints"]["macs"] = 2**64 - 1


def unicode_accumulate(obj):
    next(op for op in kernel(obj)["body"] if op["type"] == "COMPUTE")["accumulate"] = "tk > \u00b2"


@pytest.mark.parametrize("edit, fragments", [
    (edit_end, ["kernel 'matmul_0' op ", "along 'tk'", "do not cover"]),
    (add_free_loop, ["kernel 'matmul_0' loop 'spin'", "indexes no tile dimension"]),
    (widen_tile, ["kernel 'matmul_0' op 0", "tiles of 1000000000 along '0' (1 trips)"]),
    (grow_tensor, ["tensor 'A'", "2^40 elements"]),
    (deep_attribute, ["body/graph/ops/0/attrs/x", "nested deeper than 64"]),
    (huge_hint, ["body/kernels/0/hints/macs", "signed 64-bit"]),
    (unicode_accumulate, ["kernel 'matmul_0' op", "accumulate"]),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_reader_refuses_sizes_beyond_what_the_shapes_need(tmp_path, edit, fragments):
    obj = object_of(tmp_path)
    edit(obj)
    with pytest.raises(ObjectFileError) as e:
        loads(resealed(obj), "m.kpu")
    one_line(e, "m.kpu: ", *fragments)


HEADER = b'{"format": "kpu-object", "format_version": 1, "dfx_version": "1.0", "sha256": "", "body": '


@pytest.mark.parametrize("data, fragment", [
    (b"[" * 5000 + b"]" * 5000, "invalid JSON"),
    (HEADER + b"9" * 5000 + b"}", "invalid JSON"),
    # deeper than orjson can checksum (255 levels): refused before the checksum is computed
    (HEADER + b"[" * 300 + b"]" * 300 + b"}", "body/0/0/0/0"),
], ids=["deep-json", "5000-digits", "deeper-than-orjson-writes"])
def test_reader_refuses_deep_or_long_json(data, fragment):
    with pytest.raises(ObjectFileError) as e:
        loads(data, "m.kpu")
    one_line(e, "m.kpu: ", fragment)


# ---- the object reader: degenerate programs ----------------------------------------------------------


def empty_program(obj):
    obj["body"]["kernels"], obj["body"]["graph"]["ops"] = [], []


def output_marked_input(obj):
    obj["body"]["graph"]["tensors"][2]["role"] = "input"


def input_marked_intermediate(obj):
    obj["body"]["graph"]["tensors"][0]["role"] = "intermediate"


def no_output(obj):
    obj["body"]["graph"]["tensors"][2]["role"] = "intermediate"


def value_for_the_result(obj):
    obj["body"]["constants"]["C"] = ""


def second_writer(obj):
    ops = obj["body"]["graph"]["ops"]
    ops.append({**ops[0], "name": "again"})


@pytest.mark.parametrize("edit, fragments", [
    (empty_program, ["graph: has no ops"]),
    (output_marked_input, ["tensor 'C': has role 'input' but graph op 'matmul' produces it"]),
    (input_marked_intermediate, ["tensor 'A': has role 'intermediate' but no graph op produces it"]),
    (no_output, ["graph: has no output tensor"]),
    (value_for_the_result, ["constants/C", "role 'output'"]),
    (second_writer, ["graph op 'again': writes 'C', which graph op 'matmul' writes too"]),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_reader_refuses_degenerate_programs(tmp_path, edit, fragments):
    obj = object_of(tmp_path)
    assert [t["role"] for t in obj["body"]["graph"]["tensors"]] == ["constant", "constant", "output"]
    edit(obj)
    with pytest.raises(ObjectFileError) as e:
        loads(resealed(obj), "m.kpu")
    one_line(e, "m.kpu: ", *fragments)


# ---- the functional run's budget ----------------------------------------------------------------------


def test_budget_counts_tensors_tiles_and_tile_ops(tmp_path):
    program = compiled(tmp_path, 16, 48, 80)
    budget = estimate(program)
    tensors = 4 * (16 * 80 + 80 * 48 + 16 * 48)
    assert tensors < budget.host_bytes <= 2 * tensors  # the tiles of a small GEMM are the whole tensors
    assert budget.tile_ops == sum(k.runs(op) for k in program.kernels for op in k.body)
    assert advise(budget, "m.kpu", available=2**30) is None


def test_budget_of_a_1e5_cubed_run(tmp_path, monkeypatch):
    budget = estimate(compiled(tmp_path, 10**5, 10**5, 10**5))
    assert budget.host_bytes >= 3 * 4 * 10**10
    assert budget.seconds > 86400  # days: the run the warning is for
    error = advise(budget, "m.kpu", available=64 * 2**30)
    assert error.fatal and error.message.startswith("m.kpu: ") and "--timing-only" in error.message
    warning = advise(budget, "m.kpu", available=2**50)
    assert not warning.fatal and f"{budget.tile_ops:,} tile ops" in warning.message and "days" in warning.message
    assert "\n" not in error.message + warning.message
    monkeypatch.setattr(budget_module, "available_memory", lambda: None)  # a platform that cannot say
    assert not advise(budget, "m.kpu").fatal


def test_budget_warns_only_past_the_documented_rate():
    limit = LONG_RUN_SECONDS * TILE_OPS_PER_SECOND
    assert advise(Budget(host_bytes=1, tile_ops=limit), "m.kpu", available=2**30) is None
    warning = advise(Budget(host_bytes=1, tile_ops=limit + 1), "m.kpu", available=2**30)
    assert warning is not None and not warning.fatal and "minutes" in warning.message
    assert available_memory() > 0  # this platform (Linux) can say
