"""`kpu-dse` against hostile inputs and outputs: a spec, base config, model or results table that
is a FIFO, a device or too large is refused without blocking; key paths too long or too deep are
spec errors; a results table that is not this sweep's own is never written through or cut. (A local
cluster leaves no scratch space behind: test_dse, on its one cluster run.)"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import assert_one_line_error, fifo, gemm_dfg, run_cli

from dse.results import MAX_RESULTS_BYTES, ResultsError, Table, columns, line
from dse.spec import MAX_MODELS_BYTES, MAX_ONNX_BYTES, MAX_TEXT_MODEL_BYTES, SpecError, read_spec

HEADER = columns(["array"])


def run_dse(*args) -> subprocess.CompletedProcess:
    """`kpu-dse ARGS` in this process: its exit code, stdout and stderr."""
    return run_cli("dse", *args)


def write_spec(folder: Path, name: str = "sweep.yaml", **more) -> Path:
    """A spec of one small GEMM on `minimal` and one two-point axis; `more` overrides its keys."""
    (folder / "g16.dfg").write_text(gemm_dfg(16, 16, 16))
    spec = {"base": "minimal", "workloads": ["g16.dfg"],
            "axes": [{"name": "ghz", "key": "timing.clock_ghz", "values": [1, 2]}], "binder": "greedy", **more}
    path = folder / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def spec_error(path: Path) -> str:
    """The one line read_spec refuses `path` with, after its `path: `; it must come at once."""
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        read_spec(str(path))
    assert time.monotonic() - start < 5, "the spec was read only once the FIFO was released"
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message[len(f"{path}: "):]


# ---- (B) every read is of a regular file, bounded before it is read -----------------------------


def test_a_fifo_spec_is_refused_without_blocking(tmp_path):
    with fifo(tmp_path / "spec.yaml") as path:
        assert "a FIFO" in spec_error(path)


def test_a_spec_linked_to_an_endless_device_is_refused(tmp_path):
    (tmp_path / "spec.yaml").symlink_to("/dev/zero")
    assert "a device" in spec_error(tmp_path / "spec.yaml")


def test_a_fifo_base_config_is_refused_without_blocking(tmp_path):
    with fifo(tmp_path / "base.json"):
        message = spec_error(write_spec(tmp_path, base="base.json"))
    assert message.startswith(f"base: {tmp_path / 'base.json'}: ") and "a FIFO" in message, message


def test_a_base_config_linked_to_an_endless_device_is_refused(tmp_path):
    (tmp_path / "base.yaml").symlink_to("/dev/zero")
    message = spec_error(write_spec(tmp_path, base="base.yaml"))
    assert message.startswith(f"base: {tmp_path / 'base.yaml'}: ") and "a device" in message, message


def test_the_base_config_has_the_config_readers_size_limit(tmp_path):
    import hardware.config
    import dse.spec

    assert dse.spec.MAX_CONFIG_BYTES == hardware.config.MAX_CONFIG_BYTES
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (hardware.config.MAX_CONFIG_BYTES + 1))
    assert spec_error(write_spec(tmp_path, base="big.json")).startswith(f"base: {big}: ")


@pytest.mark.parametrize("make", ["fifo", "device", "folder"])
def test_a_model_that_is_no_regular_file_is_refused_without_blocking(tmp_path, make):
    model = tmp_path / "m.dfg"
    if make == "device":
        model.symlink_to("/dev/zero")
        assert spec_error(write_spec(tmp_path, workloads=["m.dfg"])) == \
            f"workloads[0]: {model}: cannot read: a device, not a regular file"
    elif make == "folder":
        model.mkdir()
        assert spec_error(write_spec(tmp_path, workloads=["m.dfg"])) == \
            f"workloads[0]: {model}: cannot read: a folder, not a regular file"
    else:
        with fifo(model):
            assert spec_error(write_spec(tmp_path, workloads=["m.dfg"])) == \
                f"workloads[0]: {model}: cannot read: a FIFO, not a regular file"


@pytest.mark.parametrize("name, limit", [("m.dfg", MAX_TEXT_MODEL_BYTES), ("m.hlo.txt", MAX_TEXT_MODEL_BYTES),
                                         ("m.onnx", MAX_ONNX_BYTES)])
def test_a_model_larger_than_its_kind_may_be_is_refused_before_it_is_read(tmp_path, name, limit):
    model = tmp_path / name
    with open(model, "wb") as f:
        f.truncate(limit + 1)  # sparse: no disk, and reading it would take all the memory the test has
    message = spec_error(write_spec(tmp_path, workloads=[name]))
    assert message.startswith(f"workloads[0]: {model}: ") and "larger than the" in message, message


def test_the_models_of_a_sweep_are_bounded_together(tmp_path, monkeypatch):
    import dse.spec

    assert MAX_MODELS_BYTES >= 2 * MAX_ONNX_BYTES  # two of the largest ONNX models fit
    (tmp_path / "g16.dfg").write_text(gemm_dfg(16, 16, 16))
    size = (tmp_path / "g16.dfg").stat().st_size
    monkeypatch.setattr(dse.spec, "MAX_MODELS_BYTES", 2 * size)
    workloads = [{"name": f"w{i}", "path": "g16.dfg"} for i in range(3)]
    assert len(read_spec(str(write_spec(tmp_path, workloads=workloads[:2]))).workloads) == 2
    message = spec_error(write_spec(tmp_path, workloads=workloads))
    assert message.startswith(f"workloads[2]: {tmp_path / 'g16.dfg'}: ") and "more than the" in message, message


def test_a_fifo_results_table_is_refused_without_blocking(tmp_path):
    with fifo(tmp_path / "results.csv") as path:
        with pytest.raises(ResultsError, match="is not a regular file"):
            Table(path, HEADER).read()


def test_a_results_table_larger_than_a_table_may_be_is_refused(tmp_path):
    path = tmp_path / "results.csv"
    path.write_bytes(line(HEADER).encode())
    os.truncate(path, MAX_RESULTS_BYTES + 1)
    with pytest.raises(ResultsError, match="larger than the 256 MB a results table may be"):
        Table(path, HEADER).read()
    assert path.stat().st_size == MAX_RESULTS_BYTES + 1


# ---- (D) key paths are bounded before they are parsed and walked --------------------------------


@pytest.mark.parametrize("key, reason", [
    ("accelerators[" + "9" * 5000 + "].x", "5,016 characters, more than the 256 a key path may have"),
    (".".join(["timing"] * 10_000), "69,999 characters, more than the 256 a key path may have"),
    ("timing" + "[0]" * 10_000, "30,006 characters, more than the 256 a key path may have"),
    ("timing.dataflows[1234567890]", "an index of 10 digits; a list's index has at most 9"),
    (".".join(["a"] * 33), "33 names and indices deep, more than the 32 a key path may be"),
    ("a" + "[0]" * 40, "41 names and indices deep, more than the 32 a key path may be"),
    ("timing.dataflows[\u0663]", "not a key path like compute.processor_array.rows"),  # an Arabic-Indic 3
])
def test_a_key_path_too_long_or_too_deep_is_a_spec_error(tmp_path, key, reason):
    message = spec_error(write_spec(tmp_path, axes=[{"name": "a", "key": key, "values": [1]}]))
    assert message.startswith("axes[0].key: '") and message.endswith(f"': {reason}"), message
    assert len(message) < 300  # the key is shown clipped


def test_a_key_path_within_the_bounds_is_still_checked_against_the_config(tmp_path):
    message = spec_error(write_spec(tmp_path, axes=[{"name": "a", "key": "timing.dataflows[123456789]",
                                                     "values": ["os"]}]))
    assert message.startswith("axes[0]: timing.dataflows[123456789]: timing.dataflows has "), message


def test_a_key_index_of_thousands_of_digits_is_one_line_from_the_command(tmp_path):
    spec = write_spec(tmp_path, axes=[{"name": "a", "key": "accelerators[" + "9" * 5000 + "].x", "values": [1]}])
    proc = run_dse(spec, "-o", tmp_path / "out", "--serial")
    assert_one_line_error(proc, f"{spec}: axes[0].key: ", "more than the 256 a key path may have")
    assert not (tmp_path / "out").exists()


# ---- (E) a results table that is not this sweep's own is never written through or cut ----------


def test_a_hard_linked_results_table_is_refused_and_its_other_name_untouched(tmp_path):
    victim = tmp_path / "victim.csv"
    victim.write_text("precious\nrows\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(victim, out / "results.csv")
    table = Table(out / "results.csv", HEADER)
    with pytest.raises(ResultsError) as info:
        table.read()
    assert str(info.value).startswith(f"{out / 'results.csv'}: has 2 hard links (other names of the same file); ")
    with pytest.raises(ResultsError, match="has 2 hard links"):
        table.start()  # a link made after the table was read is refused as well
    assert victim.read_text() == "precious\nrows\n"


def test_a_hard_linked_results_table_is_refused_by_the_command(tmp_path):
    victim = tmp_path / "victim.csv"
    victim.write_bytes(line(HEADER).encode())  # even one that looks like this sweep's own table
    (tmp_path / "out").mkdir()
    os.link(victim, tmp_path / "out" / "results.csv")
    proc = run_dse(write_spec(tmp_path), "-o", tmp_path / "out", "--serial")
    assert_one_line_error(proc, f"{tmp_path / 'out' / 'results.csv'}: has 2 hard links")
    assert victim.read_bytes() == line(HEADER).encode()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.csv"]


@pytest.mark.parametrize("data", [
    line(HEADER).encode()[:20],  # a header cut short
    b"my notes, no line end",
    b"\xef\xbb\xbfpoint,array",  # a BOM and part of a header
    b"\n\nforeign",  # blank lines, then text that is no header
])
def test_a_results_table_without_a_whole_header_line_is_refused_not_erased(tmp_path, data):
    path = tmp_path / "results.csv"
    path.write_bytes(data)
    table = Table(path, HEADER)
    with pytest.raises(ResultsError) as info:
        table.read()
    assert str(info.value).startswith(f"{path}: line 1: ") and "no whole header line" in str(info.value)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == data


def test_a_results_table_of_another_header_is_refused_not_erased(tmp_path):
    path = tmp_path / "results.csv"
    data = b"name,score\nada,1\nhalf a ro"
    path.write_bytes(data)
    with pytest.raises(ResultsError, match="line 1: columns name,score are another sweep's"):
        Table(path, HEADER).read()
    assert path.read_bytes() == data


@pytest.mark.parametrize("data", [b"", b"\n\n"])
def test_an_empty_results_table_gets_its_header(tmp_path, data):
    path = tmp_path / "results.csv"
    path.write_bytes(data)
    table = Table(path, HEADER)
    table.read()
    table.start()
    table.close()
    assert path.read_bytes() == line(HEADER).encode()


def test_a_results_cell_past_the_csv_limit_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "results.csv"
    row = dict.fromkeys(HEADER, "")
    row.update(point="0123abcd", array="4", workload="g16", status="failed", reason="x" * 200_000)
    path.write_text(line(HEADER) + line(row.values()))
    with pytest.raises(ResultsError, match=r"line 2: field larger than field limit"):
        Table(path, HEADER).read()
