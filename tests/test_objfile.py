"""The .kpu object file: deterministic, checksummed, schema-enforced, size independent of
the problem size."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from conftest import CONFIGS, DATA, assert_one_line_error, run_cli
from dfx import ObjectFileError, dumps, loads, read
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
