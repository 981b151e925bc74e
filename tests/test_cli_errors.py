"""Bad input: exit code 2, one line naming the file, the place and the reason, no traceback,
and no output file left behind."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import CONFIGS, DATA, assert_one_line_error, run_cli


def test_missing_input_file(tmp_path):
    out = tmp_path / "m.kpu"
    line = assert_one_line_error(run_cli("compiler", tmp_path / "nope.dfg", "-o", out), "nope.dfg", "cannot read")
    assert "No such file" in line
    assert not out.exists()


def test_unsupported_extension(tmp_path):
    src = tmp_path / "model.txt"
    src.write_text("hello")
    assert_one_line_error(run_cli("compiler", src, "-o", tmp_path / "m.kpu"), "model.txt", "unsupported input")


def test_malformed_dfg_line_names_the_line(tmp_path):
    text = (DATA / "dfg" / "workloads__dfa__non-batched-2-input-matmul.dfg").read_text().splitlines()
    text[6] = "NODE 3 : |matmul|MATMUL"  # line 7 loses its fields
    src = tmp_path / "bad.dfg"
    src.write_text("\n".join(text))
    out = tmp_path / "bad.kpu"
    assert_one_line_error(run_cli("compiler", src, "-o", out), "bad.dfg:7:")
    assert not out.exists()


ONE_CONV = (DATA / "dfg" / "tosa__oneLayerMLP.dfg").read_text()  # node 5: a 1x1 conv of [1,1,1,4] by [2,1,1,4]


@pytest.mark.parametrize("edit, reason", [
    (lambda t: t.replace("2x1x1x4xf32", "2x1x1x3xf32"), "input [1, 1, 1, 4] has 4 channels, weights [2, 1, 1, 3]"),
    (lambda t: t.replace("2x1x1x4xf32", "2x3x3x4xf32"), "the window spans 3 elements, more than the 1 of input"),
    (lambda t: t.replace("stride:array<i64: 1, 1>", "stride:array<i64: 0, 1>"),
     "attribute 'stride' must be a list of integers >= 1, got [0, 1]"),
], ids=["channels", "kernel_larger_than_input", "stride_0"])
def test_bad_conv_names_the_node(tmp_path, edit, reason):
    src, out = tmp_path / "conv.dfg", tmp_path / "conv.kpu"
    src.write_text(edit(ONE_CONV))
    proc = run_cli("compiler", src, "-o", out)
    assert_one_line_error(proc, "conv.dfg:10", "node 5", "'tosa.conv2d'", reason)
    assert not out.exists()


def test_dump_prints_graph_even_without_lowering():
    proc = run_cli("compiler", DATA / "dfg" / "workloads__nla__matmul_linear.dfg", "--dump")
    assert proc.returncode == 0, proc.stderr
    assert "SIGMOID" in proc.stdout and "kernel matmul_0" in proc.stdout
    assert "declared shape [16]" in proc.stderr  # the shape-inference warning


# the legacy MLP wires one of its LINEAR's three declared operands, and declares a weight of
# 4x65536x1 that no reading of LINEAR accepts: refused with the reason, not guessed at
BROKEN = {"workloads__oneLayerMLP.dfg": "node 1 'linear': LINEAR takes 2 to 3 operands, got 1"}


def test_every_corpus_file_dumps():
    for path in sorted((DATA / "dfg").iterdir()):
        if path.suffix in (".dfg", ".json"):
            proc = run_cli("compiler", path, "--dump")
            if path.name in BROKEN:
                assert_one_line_error(proc, BROKEN[path.name])
                continue
            assert proc.returncode == 0, (path.name, proc.stderr)
            assert proc.stdout.startswith("graph "), path.name


def test_invalid_config(tmp_path):
    obj = tmp_path / "m.kpu"
    assert run_cli("compiler", DATA / "dfg" / "workloads__dfa__non-batched-2-input-matmul.dfg", "-o", obj).returncode == 0
    config = json.loads((CONFIGS / "minimal.json").read_text())
    config["on_chip_memory"]["l2"]["bank_count"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(config))
    assert_one_line_error(run_cli("loader", obj, "--config", bad), "bad.json", "on_chip_memory.l2.bank_count")
    assert_one_line_error(run_cli("compiler", DATA / "dfg" / "workloads__dfa__non-batched-2-input-matmul.dfg",
                                  "--target", bad, "-o", tmp_path / "x.kpu"), "bad.json")
    assert not (tmp_path / "x.kpu").exists()


def test_config_too_small_for_the_object(gemm_file, tmp_path):
    obj = tmp_path / "big.kpu"
    assert run_cli("compiler", gemm_file(1024, 1024, 1024), "-o", obj).returncode == 0
    out = tmp_path / "out"
    line = assert_one_line_error(run_cli("loader", obj, "--config", CONFIGS / "minimal.json", "--output-dir", out),
                                 "big.kpu", "kernel 'matmul_0' needs", "config 'minimal'")
    assert "KiB" in line
    assert not out.exists()


def test_bad_input_arrays(tmp_path):
    obj = tmp_path / "m.kpu"
    assert run_cli("compiler", DATA / "dfg" / "workloads__dfa__non-batched-2-input-matmul.dfg", "-o", obj).returncode == 0
    np.save(tmp_path / "a.npy", np.zeros((3, 3), np.float32))
    std = CONFIGS / "standard.json"
    assert_one_line_error(run_cli("loader", obj, "--config", std, "--input", f"A={tmp_path / 'a.npy'}"),
                          "a.npy", "shape [3, 3]", "[4, 16]")
    assert_one_line_error(run_cli("loader", obj, "--config", std, "--input", f"Z={tmp_path / 'a.npy'}"),
                          "'Z' is not an input")
    assert_one_line_error(run_cli("loader", obj, "--config", std, "--input", f"A={tmp_path / 'none.npy'}"),
                          "none.npy", "cannot read")
    assert_one_line_error(run_cli("loader", obj, "--config", std, "--input", "A"), "NAME=FILE.npy")


def test_empty_dimension_is_refused(gemm_file, tmp_path):
    out = tmp_path / "e.kpu"
    assert_one_line_error(run_cli("compiler", gemm_file(4, 0, 4), "-o", out), "node 2 'matmul'", "empty dimension")
    assert not out.exists()


def test_the_installed_processes_keep_the_contract(tmp_path):
    """The rest of the suite runs the tools' entry points in-process; here both run as processes
    of their own: a good run exits 0 with its output, bad input exits 2 with one line."""
    from conftest import run_cli_process

    obj = tmp_path / "m.kpu"
    assert run_cli_process("compiler", DATA / "dfg" / "workloads__nla__matmul_linear.dfg", "-o", obj).returncode == 0
    proc = run_cli_process("loader", obj, "--config", "standard", "--check")
    assert proc.returncode == 0 and "check" in proc.stderr, proc.stderr
    assert_one_line_error(run_cli_process("compiler", tmp_path / "nope.dfg", "-o", tmp_path / "x.kpu"), "nope.dfg")
    assert_one_line_error(run_cli_process("loader", tmp_path / "nope.kpu", "--config", "standard"), "nope.kpu")
