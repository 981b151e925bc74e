"""The .kpu object file: deterministic, checksummed, schema-enforced, size independent of
the problem size."""

from __future__ import annotations

import copy
import hashlib

import orjson
import pytest

from conftest import CONFIGS, DATA, ROOT, assert_one_line_error, run_cli
from dfx import Graph, ObjectFileError, Op, Tensor, dumps, loads, read
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.target import load_target


def compiled(path, target="standard"):
    graph, _ = load_graph(str(path))
    return compile_graph(graph, str(path), load_target(str(CONFIGS / f"{target}.json")))


def resealed(obj: dict) -> bytes:
    """Re-sign an edited body, so the schema and validator (not the checksum) must catch it."""
    obj["sha256"] = hashlib.sha256(orjson.dumps(obj["body"], option=orjson.OPT_SORT_KEYS)).hexdigest()
    return orjson.dumps(obj)


def test_same_input_gives_byte_identical_files(gemm_file, tmp_path):
    src = gemm_file(300, 200, 100)
    a, b = tmp_path / "a.kpu", tmp_path / "b.kpu"
    assert run_cli("compiler", src, "-o", a).returncode == 0
    assert run_cli("compiler", src, "-o", b).returncode == 0
    assert a.read_bytes() == b.read_bytes()


def test_round_trip_keeps_every_field(gemm_file):
    program = compiled(gemm_file(64, 48, 80))
    data = dumps(program)
    assert dumps(loads(data)) == data


def test_size_grows_with_the_graph_not_the_problem(gemm_file):
    small = len(dumps(compiled(gemm_file(64, 64, 64))))
    large = len(dumps(compiled(gemm_file(4096, 4096, 4096))))
    assert large <= 2 * small, (small, large)


def test_header_fields(gemm_file):
    obj = orjson.loads(dumps(compiled(gemm_file(32, 32, 32))))
    assert obj["format"] == "kpu-object"
    assert obj["format_version"] == 1
    assert obj["dfx_version"] == "1.0"
    assert obj["producer"].startswith("kpu-kernel-compiler")
    kernel = obj["body"]["kernels"][0]
    assert kernel["requirements"]["bytes"]["L2"] > 0
    assert kernel["hints"]["estimated_dram_bytes"] >= kernel["hints"]["compulsory_dram_bytes"]


def test_tampered_body_is_rejected(gemm_file):
    data = dumps(compiled(gemm_file(32, 32, 32))).replace(b'"Ti": 32', b'"Ti": 16')
    with pytest.raises(ObjectFileError, match="sha256 mismatch"):
        loads(data, "m.kpu")


@pytest.mark.parametrize("field, value, message", [
    ("format", "elf", "not a kpu object"),
    ("format_version", 99, "unsupported format_version 99"),
    ("dfx_version", "0.1", "unsupported dfx_version '0.1'"),
])
def test_wrong_header_is_rejected(gemm_file, field, value, message):
    obj = orjson.loads(dumps(compiled(gemm_file(32, 32, 32))))
    obj[field] = value
    with pytest.raises(ObjectFileError, match=message):
        loads(orjson.dumps(obj), "m.kpu")


def test_schema_violation_names_the_place(gemm_file):
    obj = orjson.loads(dumps(compiled(gemm_file(32, 32, 32))))
    obj["body"]["kernels"][0]["body"][0]["source"]["level"] = "L9"
    with pytest.raises(ObjectFileError) as e:
        loads(resealed(obj), "m.kpu")
    assert str(e.value).startswith("m.kpu: body/kernels/0/body/0")
    assert "\n" not in str(e.value)


def test_semantic_error_names_the_op(gemm_file):
    obj = orjson.loads(dumps(compiled(gemm_file(32, 32, 32))))
    obj["body"]["kernels"][0]["body"][1]["depends_on"] = [42]
    with pytest.raises(ObjectFileError, match=r"kernel 'matmul_0' op 1: depends on op 42"):
        loads(resealed(obj), "m.kpu")


def test_compute_must_take_a_tile_of_each_kernel_input(gemm_file):
    obj = orjson.loads(dumps(compiled(gemm_file(32, 32, 32))))
    compute = next(op for op in obj["body"]["kernels"][0]["body"] if op["type"] == "COMPUTE")
    compute["inputs"] = compute["inputs"][:1]  # found by fuzzing: the loader indexed a missing B tile
    with pytest.raises(ObjectFileError, match=r"op 6: computes MATMUL_TILE from \[A\] into C, which is none "
                                              r"of the kernel's graph ops"):
        loads(resealed(obj), "m.kpu")


def test_every_graph_op_has_a_kernel_and_kernels_run_in_dataflow_order():
    chained = compiled(DATA / "dfg" / "workloads__nla__matmul_8x8_chained.dfg")
    obj = orjson.loads(dumps(chained))
    obj["body"]["kernels"] = []  # found by fuzzing: --check then looked for an output never computed
    with pytest.raises(ObjectFileError, match=r"graph op '.*': has no kernel"):
        loads(resealed(obj), "m.kpu")
    obj = orjson.loads(dumps(chained))
    kernels = obj["body"]["kernels"]
    kernels[0], kernels[1] = kernels[1], kernels[0]
    for k in kernels:
        k["depends_on"] = []
    with pytest.raises(ObjectFileError, match=rf"kernel '{kernels[0]['name']}': reads '.*' before any kernel computes it"):
        loads(resealed(obj), "m.kpu")


def test_loader_rejects_a_corrupt_object_with_one_line(gemm_file, tmp_path):
    obj = tmp_path / "m.kpu"
    assert run_cli("compiler", gemm_file(32, 32, 32), "-o", obj).returncode == 0
    obj.write_bytes(obj.read_bytes().replace(b'"Tk": 32', b'"Tk": 31'))
    assert_one_line_error(run_cli("loader", obj, "--config", CONFIGS / "standard.json"),
                          str(obj), "sha256 mismatch")
    obj.write_bytes(b"{not json")
    assert_one_line_error(run_cli("loader", obj, "--config", CONFIGS / "standard.json"),
                          str(obj), "invalid JSON")


def test_read_missing_file():
    with pytest.raises(ObjectFileError, match="nope.kpu: cannot read"):
        read("nope.kpu")


# ---- re-signed schedules that would do less work than the graph, or other work ------------------
#
# The loader executes and times what the body says, op by op, each tile op on the tile last
# written to its (tensor, level): every edit here used to run (several silently, exit 0 with
# fewer MACs or wrong numbers; some with a traceback) and must now be refused with one line.


@pytest.fixture(scope="module")
def mlp3() -> dict:
    """examples/mlp3.dfg for standard: three MATMUL kernels (bias and activation fused), each
    with a reduction loop tk inside its output loops, one of them parallel."""
    obj = orjson.loads(dumps(compiled(ROOT / "examples" / "mlp3.dfg")))
    for k in obj["body"]["kernels"]:
        loops = [l["induction_var"] for l in k["tile_loops"]]
        assert k["op"] == "MATMUL" and loops[-1] == "tk" and len(loops) >= 2, loops
        assert sum(l.get("parallel", False) for l in k["tile_loops"]) == 1
    return obj


@pytest.fixture(scope="module")
def softmax() -> dict:
    """A SOFTMAX over rows of 1024, on the vector unit, with a loop over the rows."""
    g = Graph("softmax")
    g.tensors["x"] = Tensor("x", (64, 1024), "f32", "input")
    g.tensors["y"] = Tensor("y", (64, 1024), "f32", "output")
    g.ops.append(Op("softmax", "SOFTMAX", ["x"], ["y"], {"axis": -1}, "test"))
    obj = orjson.loads(dumps(compile_graph(g, "softmax.dfg", load_target(str(CONFIGS / "standard.json")))))
    kernel = obj["body"]["kernels"][0]
    assert kernel["dataflow"] == "vector" and kernel["tile_loops"], kernel["tile_loops"]
    return obj


def first(obj: dict) -> dict:
    return obj["body"]["kernels"][0]


def the_compute(kernel: dict) -> dict:
    """The kernel's anchor COMPUTE (the MATMUL; the epilogue's come after it)."""
    return next(op for op in kernel["body"] if op["type"] == "COMPUTE")


def move(kernel: dict, tensor: str, src: str, dst: str) -> dict:
    return next(op for op in kernel["body"] if op["type"] == "DATA_MOVE" and op["source"]["tensor"] == tensor
                and (op["source"]["level"], op["destination"]["level"]) == (src, dst))


def refused(obj: dict, *fragments: str) -> str:
    with pytest.raises(ObjectFileError) as e:
        loads(resealed(obj), "m.kpu")
    message = str(e.value)
    assert message.startswith("m.kpu: ") and "\n" not in message, message
    for f in fragments:
        assert f in message, (f, message)
    return message


def every_loop_parallel(obj):  # --timing-only ran 43% of the MACs, --check blamed a missing tile
    for k in obj["body"]["kernels"]:
        for l in k["tile_loops"]:
            l["parallel"] = True


def parallel_reduction(obj):  # each compute tile would add up its share of K, the last store wins
    for l in first(obj)["tile_loops"]:
        l["parallel"] = l["induction_var"] == "tk"


def accumulate_never(obj):  # each K step would overwrite the last: C = the last K slice's product
    the_compute(first(obj))["accumulate"] = "false"


def accumulate_late(obj):
    the_compute(first(obj))["accumulate"] = "tk > 1"


def accumulate_always(obj):
    the_compute(first(obj))["accumulate"] = "true"


def reduction_loop_outermost(obj):
    first(obj)["tile_loops"].sort(key=lambda l: l["induction_var"] != "tk")


def load_outside_its_loop(obj):  # tk does not run at the outermost loop: every step would load tile 0
    k = first(obj)
    move(k, "x", "EXTERNAL", "L3")["at"] = k["tile_loops"][0]["induction_var"]


def store_before_its_tile(obj):  # the store would run in every tk step, before the tile it stores
    store = move(first(obj), "h0", "L3", "EXTERNAL")
    store.pop("after")
    store["at"] = "tk"


def compute_without_its_load(obj):
    compute = the_compute(first(obj))
    compute["depends_on"] = compute["depends_on"][1:]


def compute_reads_l2(obj):  # skips the L2 -> L1 hop of A
    k = first(obj)
    compute = the_compute(k)
    compute["inputs"][0]["level"] = "L2"
    compute["depends_on"][0] = move(k, "x", "L3", "L2")["op_id"]


def square_chain() -> dict:
    """h0 = x W0, z1 = h0 W1 for standard: matmul_1's rows and columns are both 2 tiles of 128,
    each operand tile loaded at tk."""
    g = Graph("chain")
    for name, shape, role in [("x", (256, 256), "input"), ("W0", (256, 1024), "input"),
                              ("h0", (256, 1024), "intermediate"), ("W1", (1024, 256), "input"),
                              ("z1", (256, 256), "output")]:
        g.tensors[name] = Tensor(name, shape, "f32", role)
    g.ops += [Op("mm0", "MATMUL", ["x", "W0"], ["h0"], {}, "test"), Op("mm1", "MATMUL", ["h0", "W1"], ["z1"], {}, "test")]
    return orjson.loads(dumps(compile_graph(g, "chain.dfg", load_target(str(CONFIGS / "standard.json")))))


def matmul_1_with_rows_by_tj(obj):
    """matmul_1 of the square chain, which replaces `obj`: tj can step h0's rows as well."""
    obj.clear()
    obj.update(square_chain())
    k = obj["body"]["kernels"][1]
    trips = {l["induction_var"]: l["end"] for l in k["tile_loops"]}
    assert trips["ti"] == trips["tj"] and k["tiling"]["Ti"] == k["tiling"]["Tj"], k["tiling"]
    return k


def load_other_rows(obj):  # the first hop fetches h0's rows by tj, the next hops hold them as ti's
    m = move(matmul_1_with_rows_by_tj(obj), "h0", "EXTERNAL", "L3")
    m["source"]["tile_indices"][0] = m["destination"]["tile_indices"][0] = "tj"


def compute_on_other_rows(obj):  # every h0 tile by tj, the compute too: z1[ti, tj] = h0[tj, :] @ W1[:, tj]
    for op in matmul_1_with_rows_by_tj(obj)["body"]:
        for ref in [op.get("source"), op.get("destination"), *op.get("inputs", [])]:
            if ref is not None and ref["tensor"] == "h0":
                ref["tile_indices"][0] = "tj"


def no_store_of_the_result(obj):
    k = obj["body"]["kernels"][-1]
    k["body"].remove(move(k, "out", "L3", "EXTERNAL"))


def store_into_an_intermediate(obj):
    move(obj["body"]["kernels"][-1], "out", "L3", "EXTERNAL")["destination"]["tensor"] = "y2"


def skip_a_level(obj):
    m = move(first(obj), "x", "L3", "L2")
    m["source"]["level"], m["depends_on"] = "EXTERNAL", []


def b_transposed(obj):  # MATMUL without transpose_b would multiply by B's tiles swapped
    move(first(obj), "W0", "L3", "L2")["transpose"] = True


def window_in_a_matmul(obj):  # the tile one column to the right, all the way into the array
    for m in (move(first(obj), "x", "L2", "L1"), move(first(obj), "x", "L3", "L2"),
              move(first(obj), "x", "EXTERNAL", "L3")):
        for end in ("source", "destination"):
            m[end]["offset"] = [0, 1]
    next(o for o in first(obj)["body"] if o["type"] == "COMPUTE")["inputs"][0]["offset"] = [0, 1]


def moves_dataflow(obj):
    first(obj)["dataflow"] = "moves"


def unknown_epilogue_op(obj):  # used to be a traceback: the validator looked the op up and got None
    next(o for o in obj["body"]["graph"]["ops"] if o["op_type"] == "RELU")["op_type"] = "FOO"


def shape_disagrees(obj):
    next(t for t in obj["body"]["graph"]["tensors"] if t["name"] == "h0")["shape"] = [256, 500]


def one_operand_matmul(obj):  # the registry's reference would index a missing operand
    obj["body"]["graph"]["ops"][0]["inputs"] = obj["body"]["graph"]["ops"][0]["inputs"][:1]


@pytest.mark.parametrize("edit, fragments", [
    (every_loop_parallel, ["kernel 'matmul_0' loop", "is parallel as well as loop"]),
    (parallel_reduction, ["kernel 'matmul_0' op", "accumulates over loop 'tk', which is parallel"]),
    (accumulate_never, ["kernel 'matmul_0' op", "sits in loop 'tk', which neither indexes its result tile"]),
    (accumulate_late, ["accumulate 'tk > 1' must start afresh on the loop's first step only ('tk > 0')"]),
    (accumulate_always, ["accumulate 'true' adds every tile to a partial result that no op made"]),
    (reduction_loop_outermost, ["kernel 'matmul_0' op", "which does not run where the op is placed (at 'tk')"]),
    (load_outside_its_loop, ["indexes its tile of 'x' by loop 'tk', which does not run where the op is placed"]),
    (store_before_its_tile, ["is placed at 'tk' but depends on op", "placed after 'tk', which runs only after it"]),
    (compute_without_its_load, ["reads x at L1 without depending on op"]),
    (compute_reads_l2, ["runs on the array, which takes its operands from L1"]),
    (load_other_rows, ["kernel 'matmul_1' op", "reads tiles ['ti', 'tk'] of [128, 32] of h0 at L3",
                       "writes tiles ['tj', 'tk']"]),
    (compute_on_other_rows, ["kernel 'matmul_1' op", "steps 'h0' by loop 'tj' along the dim that runs along "
                                                     "dim 0 of its result 'z1', which loop 'ti' steps"]),
    (no_store_of_the_result, ["kernel 'matmul_2': writes no tile of its result 'out' to external memory"]),
    (store_into_an_intermediate, ["writes 'y2' to external memory, which is none of the kernel's results"]),
    (skip_a_level, ["moves EXTERNAL -> L2, which no engine does"]),
    (b_transposed, ["reads W0 at L1 transposed, but MATMUL", "takes it as laid out"]),
    (window_in_a_matmul, ["reads 'x' through a window along dim 1; only a sliding-window op's input is read so"]),
    (moves_dataflow, ["is a COMPUTE in a kernel of dataflow 'moves'"]),
    (unknown_epilogue_op, ["graph op", "unknown op 'FOO'"]),
    (shape_disagrees, ["makes [[256, 512]], the graph declares [[256, 500]]"]),
    (one_operand_matmul, ["graph op", "MATMUL takes 2 to 3 operands, got 1"]),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_validator_refuses_a_schedule_that_does_other_work(mlp3, edit, fragments):
    obj = copy.deepcopy(mlp3)
    edit(obj)
    refused(obj, *fragments)


def test_validator_refuses_accumulating_a_softmax(softmax):
    obj = copy.deepcopy(softmax)
    loop = first(obj)["tile_loops"][0]["induction_var"]
    the_compute(first(obj))["accumulate"] = f"{loop} > 0"  # ran, each row tile replacing the last
    refused(obj, f"accumulates over loop '{loop}', but SOFTMAX cannot add to a partial result",
            "only CONV2D, MATMUL, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_SUM can")


def test_validator_refuses_a_dataflow_its_computes_do_not_have(softmax):
    obj = copy.deepcopy(softmax)
    first(obj)["dataflow"] = "output_stationary"
    refused(obj, "has dataflow 'output_stationary', but its computes make it vector")


def test_a_matmul_kernel_of_dataflow_vector_runs_on_the_vector_unit(mlp3):
    """The dataflow says where a contraction runs: marked "vector", mlp3's first MATMUL (with
    its bias and activation) runs on the vector unit, a multiply-add per product, and computes
    what it did on the array."""
    from hardware import load_machine
    from loader import bind_greedy, bind_program, check_outputs, execute, program_inputs, simulate

    machine = load_machine(str(CONFIGS / "standard.json"))
    runs = []
    for dataflow in (None, "vector"):
        obj = copy.deepcopy(mlp3)
        if dataflow:
            first(obj)["dataflow"] = dataflow
        program = loads(resealed(obj), "m.kpu")
        bindings = bind_program(program, machine, "m.kpu", bind_greedy)
        values = execute(program, bindings, program_inputs(program, {}, 0))
        assert all(c.passed for c in check_outputs(program, values).values())
        runs.append((program, simulate(program, machine, bindings)))
    (program, on_array), (_, on_vector) = runs
    matmul = next(op for op in program.graph.ops if op.op_type == "MATMUL")
    (m, k), n = program.graph.tensors[matmul.inputs[0]].shape, program.graph.tensors[matmul.outputs[0]].shape[-1]
    assert on_array.macs - on_vector.macs == m * n * k
    products = on_vector.phases[0].vector_work["simple"] - on_array.phases[0].vector_work.get("simple", 0)
    assert products == m * n * k, products


def test_loader_refuses_every_loop_parallel(mlp3, tmp_path):
    obj = copy.deepcopy(mlp3)
    every_loop_parallel(obj)  # --timing-only used to exit 0 with 43% of the MACs
    path = tmp_path / "m.kpu"
    path.write_bytes(resealed(obj))
    assert_one_line_error(run_cli("loader", path, "--config", CONFIGS / "standard.json", "--timing-only"),
                          str(path), "is parallel as well as loop")


def test_loader_turns_a_simulator_fault_into_one_line(mlp3, tmp_path, monkeypatch):
    """The last line of defence, in the CLI only: a ValueError from simulating an object the
    validator passed is exit 2 naming the object; called directly, simulate() still raises."""
    from typer.testing import CliRunner

    from hardware import load_machine
    from loader import bind_greedy, bind_program, simulate
    from loader import run as run_module
    from loader.cli import app

    program = loads(resealed(copy.deepcopy(mlp3)), "m.kpu")
    machine = load_machine(str(CONFIGS / "standard.json"))
    bindings = bind_program(program, machine, "m.kpu", bind_greedy)
    program.kernels[0].dataflow = "row_stationary"  # past the validator: the simulator refuses it
    with pytest.raises(ValueError, match="dataflow 'row_stationary' is not supported"):
        simulate(program, machine, bindings)

    path = tmp_path / "m.kpu"
    path.write_bytes(resealed(copy.deepcopy(mlp3)))

    def faulty(*args, **kwargs):
        raise ValueError("task 7: a fault no check foresaw\nand its second line")

    monkeypatch.setattr(run_module, "simulate", faulty)
    for flags in ([], ["--timing-only"], ["--dry-run"]):
        result = CliRunner().invoke(app, [str(path), "--config", "standard", "--binder", "greedy", *flags])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (flags, result.exception)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        assert lines == [f"error: {path}: cannot be simulated on 'standard': task 7: a fault no check foresaw"], lines
