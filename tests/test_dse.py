"""`kpu-dse`: the Dask engine's rows equal the serial engine's, a killed sweep resumes with only
the missing points, a point that cannot run is a row, a bad spec is one line, and the frontier
and its plot are right. The command runs in this process (`run_cli`), but as a process of its own
where that is what is tested: killed mid-sweep, on a local Dask cluster, and its exit code and
one-line error as installed."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, ROOT, assert_one_line_error, gemm_dfg, run_cli, run_cli_process

from dse.pareto import frontier
from dse.point import WALL_SECONDS, Job, evaluate
from dse.results import line
from dse.spec import SpecError, read_spec

ARRAY = ["compute.processor_array.rows", "compute.processor_array.cols"]


def run_dse(*args) -> subprocess.CompletedProcess:
    """`kpu-dse ARGS` in this process: its exit code, stdout and stderr."""
    return run_cli("dse", *args)


def write_spec(folder: Path, axes: list, name: str = "sweep.yaml", **more) -> Path:
    """A sweep of one small GEMM on `minimal`, with the greedy binder unless `more` says otherwise."""
    (folder / "g32.dfg").write_text(gemm_dfg(32, 32, 32))
    spec = {"base": "minimal", "workloads": ["g32.dfg"], "axes": axes, "objectives": ["latency", "energy", "area"],
            "binder": "greedy", **more}
    path = folder / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def without_wall_seconds(table: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in WALL_SECONDS} for row in table]


def counts(stderr: str) -> tuple[int, int, int]:
    """(evaluated, failed, skipped) as the last line of a sweep says them."""
    m = re.search(r"evaluated (\d+) rows \((\d+) failed\), skipped (\d+) already", stderr)
    assert m, stderr
    return int(m[1]), int(m[2]), int(m[3])


# 3 arrays x 2 L2 banks x 2 DRAM rates = 12 points; a 64x64 array's tiles do not fit 1 KB L2 banks
TWELVE = [{"name": "array", "keys": ARRAY, "values": [4, 8, 64], "label": "{0}x{1}"},
          {"name": "l2_kb", "key": "on_chip_memory.l2.bank_capacity_kb", "values": [1, 16], "label": "{} KiB L2"},
          {"name": "dram_gbps", "key": "external_memory.bandwidth_gbps", "values": [10, 50], "label": "{} GB/s"}]


def test_a_local_dask_cluster_gives_the_serial_rows_and_leaves_no_scratch_space(tmp_path):
    """One cluster run, as a process of its own with a TMPDIR of its own: the rows the serial
    engine gives, and nothing of the cluster's left in TMPDIR or among the outputs."""
    spec = write_spec(tmp_path, TWELVE, binder="cp-sat")
    serial = run_dse(spec, "-o", tmp_path / "serial", "--serial")
    assert serial.returncode == 0, serial.stderr
    temp = tmp_path / "temp"
    temp.mkdir()
    dask = subprocess.run([sys.executable, "-m", "dse", str(spec), "-o", str(tmp_path / "dask"), "--workers", "2"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(temp)})
    assert dask.returncode == 0, dask.stderr
    assert "on a local Dask cluster of 2 worker process(es)" in dask.stderr
    assert counts(serial.stderr) == counts(dask.stderr) == (12, 2, 0)
    expected = rows(tmp_path / "serial" / "results.csv")
    assert len(expected) == 12
    # row for row, in the spec's order, however the workers finished
    assert without_wall_seconds(rows(tmp_path / "dask" / "results.csv")) == without_wall_seconds(expected)
    assert [(r["array"], r["l2_kb"], r["dram_gbps"]) for r in expected][:3] == [("4", "1", "10"), ("4", "1", "50"),
                                                                                 ("4", "16", "10")]
    assert [r["status"] == "ok" for r in expected] == [r["array"] != "64" or r["l2_kb"] != "1" for r in expected]
    assert (tmp_path / "dask" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the cluster's scratch space is the sweep's own, and gone after it
    assert list(temp.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "dask").iterdir()) == ["pareto.png", "pareto.svg", "results.csv"]


def test_a_killed_sweep_resumes_with_only_the_missing_points(tmp_path):
    axes = [{"name": "array", "keys": ARRAY, "values": [2, 4, 8, 16]},
            {"name": "l2_kb", "key": "on_chip_memory.l2.bank_capacity_kb", "values": [1, 4, 16]},
            {"name": "dram_gbps", "key": "external_memory.bandwidth_gbps", "values": [5, 10, 25, 50]}]
    spec = write_spec(tmp_path, axes)
    results = tmp_path / "out" / "results.csv"
    proc = subprocess.Popen([sys.executable, "-m", "dse", str(spec), "-o", str(tmp_path / "out"), "--serial"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (results.exists() and results.read_bytes().count(b"\n") >= 4):  # the header and 3 rows
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before it was killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    written = results.read_bytes()
    kept = written[: written.rfind(b"\n") + 1].decode().splitlines(keepends=True)[1:]  # whole rows
    assert 3 <= len(kept) < 48

    rerun = run_dse(spec, "-o", tmp_path / "out", "--serial")
    assert rerun.returncode == 0, rerun.stderr
    assert counts(rerun.stderr) == (48 - len(kept), 0, len(kept))
    final = results.read_text().splitlines(keepends=True)
    assert all(line in final for line in kept)  # the first run's rows, byte for byte
    assert run_dse(spec, "-o", tmp_path / "fresh", "--serial").returncode == 0  # never interrupted
    assert without_wall_seconds(rows(results)) == without_wall_seconds(rows(tmp_path / "fresh" / "results.csv"))

    # nothing missing: a third run evaluates nothing and leaves the table as it was
    again = run_dse(spec, "-o", tmp_path / "out", "--serial")
    assert counts(again.stderr) == (0, 0, 48)
    assert results.read_text().splitlines(keepends=True) == final


def test_a_half_written_last_row_is_cut_off_and_evaluated_again(tmp_path):
    spec = write_spec(tmp_path, [{"name": "array", "keys": ARRAY, "values": [4, 8, 16]}])
    assert run_dse(spec, "-o", tmp_path / "out", "--serial").returncode == 0
    results = tmp_path / "out" / "results.csv"
    whole = results.read_bytes()
    results.write_bytes(whole[: whole.rfind(b"\n", 0, -1) + 1] + b"0123abcd,16,g3")  # killed mid-row
    rerun = run_dse(spec, "-o", tmp_path / "out", "--serial")
    assert rerun.returncode == 0, rerun.stderr
    assert counts(rerun.stderr) == (1, 0, 2)
    before = list(csv.DictReader(io.StringIO(whole.decode())))
    assert without_wall_seconds(rows(results)) == without_wall_seconds(before)


def test_a_point_that_cannot_run_is_a_row_with_its_reason(tmp_path):
    axes = [{"name": "array", "keys": ARRAY, "values": [0, 8, 64]},
            {"name": "l1_kb", "key": "on_chip_memory.l1.buffer_capacity_kb", "values": [1]}]
    spec = write_spec(tmp_path, axes)
    proc = run_dse(spec, "-o", tmp_path / "out", "--serial")
    assert proc.returncode == 0, proc.stderr
    assert counts(proc.stderr) == (3, 2, 0)
    bad_config, ok, too_big = rows(tmp_path / "out" / "results.csv")
    assert bad_config["status"] == "failed" and bad_config["area_mm2"] == "" and bad_config["cycles"] == ""
    assert bad_config["reason"] == "config: minimal: compute.processor_array.rows: must be a positive integer up " \
                                   "to 1048576, got 0"
    assert too_big["status"] == "failed" and float(too_big["area_mm2"]) > float(ok["area_mm2"])
    assert too_big["reason"].startswith("compile: ") and "no tiling of MATMUL 32x32x32 fits" in too_big["reason"]
    assert ok["status"] == "ok" and ok["reason"] == "" and int(ok["macs"]) == 32**3
    assert float(ok["latency_s"]) == int(ok["cycles"]) / 1e9  # minimal's clock: 1 GHz
    assert float(ok["energy_pj"]) > 0 and 0 < float(ok["utilization"]) <= 1


def test_a_worker_reads_no_file_of_the_client():
    config = json.loads((CONFIGS / "minimal.json").read_text())
    job = Job(key="k", workload="g", source="/nowhere/on/this/host/g.dfg", config=config, config_source="minimal",
              accelerator=None, dataflow="auto", fusion=True, binder="greedy")
    row = evaluate(job, gemm_dfg(16, 16, 16).encode())
    assert row["status"] == "ok", row["reason"]


def test_the_example_sweep_is_a_valid_spec():
    spec = read_spec(str(ROOT / "examples" / "sweep.yaml"))
    assert [len(a.values) for a in spec.axes] == [4, 2, 2] and len(spec.workloads) == 2
    point = next(spec.points())
    assert point.config["compute"]["processor_array"] == {"rows": 8, "cols": 8, "topology": "rectangular"}
    assert [a.shown(v) for a, v in zip(spec.axes, point.values)] == ["8x8", "8x64 KiB L2", "2x25 GB/s"]


def test_the_int8_sweep_sets_the_8_bit_rates_of_the_same_machines():
    spec = read_spec(str(ROOT / "examples" / "sweep_int8.yaml"))
    assert [w.name for w in spec.workloads] == ["resnet18_f32", "resnet18_int8"]
    rates = [p.config["timing"]["array_macs_per_pe_cycle"] for p in spec.points()]
    assert [(r["i8"], r["u8"]) for r in rates] == [(1, 1), (4, 4)] * 3


def spec_error(tmp_path: Path, document, name: str = "bad.yaml") -> str:
    (tmp_path / "g32.dfg").write_text(gemm_dfg(32, 32, 32))
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    with pytest.raises(SpecError) as info:
        read_spec(str(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message[len(f"{path}: "):]


def axis(**fields):
    return {"workloads": ["g32.dfg"], "axes": [{"name": "a", **fields}]}


@pytest.mark.parametrize("document, expected", [
    (axis(key="compute.processor_array.rowz", values=[4]),
     "axes[0]: compute.processor_array.rowz: not a key of the config (expected one of: rows, cols, topology)"),
    (axis(key="timing.vector_cycles_per_element.weird", values=[4]),
     "axes[0]: timing.vector_cycles_per_element.weird: not a key of the config (expected one of: simple, "
     "transcendental, reduction, requantize)"),
    (axis(key="compute.tile_count.x", values=[4]),
     "axes[0]: compute.tile_count.x: compute.tile_count is a value (2), not a section"),
    (axis(key="compute.processor_array.rows", values=[]), "axes[0].values: an axis needs at least one value"),
    (axis(key="timing.clock_ghz", range={"start": 1, "stop": 2, "step": 0}), "axes[0].range.step: must be a number"),
    (axis(key="timing.clock_ghz", range={"start": 1, "stop": 10**6, "step": 1}),
     "axes[0].range: gives more than the 1000 values"),
    (axis(keys=ARRAY, values=[[4, 8, 16]]), "axes[0].values[0]: a list sets one value per key: 2 keys, 3 values"),
    (axis(key="timing.clock_ghz", values=[1, 1]), "axes[0].values[1]: 1 is also values[0]"),
    (axis(key="timing.clock_ghz", values=[1], label="{0.real}"), "axes[0].label: '{0.real}': the fields are"),
    ({"workloads": ["g32.dfg"], "objectives": ["latency", "speed"]}, "objectives[1]: unknown objective 'speed'"),
    ({"workloads": ["g32.dfg"], "objectives": ["latency"]}, "objectives: must be a list of at least two"),
    ({"workloads": ["missing.dfg"]}, "missing.dfg: cannot read: No such file or directory"),
    ({"workloads": ["g32.dfg", "g32.dfg"]}, "workloads[1]: the name 'g32' is also"),
    ({"workloads": ["g32.pb"]}, "workloads[0]: "),
    ({"workloads": ["g32.dfg"], "base": "nonesuch"}, "base: nonesuch: not a config file"),
    ({"workloads": ["g32.dfg"], "binder": "fast"}, "binder: expected one of cp-sat, greedy, got 'fast'"),
    ({"workloads": ["g32.dfg"], "sweeps": 3}, "sweeps: unknown key"),
    ("workloads: [g32.dfg]\nworkloads: [g32.dfg]\n",
     "line 2, column 1: invalid YAML: the key 'workloads' is given twice"),
    # numbers past a float: a literal by its length, as the config reader words it
    (axis(key="timing.clock_ghz", values=[10**400]), "axes[0].values[0]: must be a finite number, a string, "
     "true/false or a list of them, got an integer literal of 401 characters (at most 64)"),
    (axis(key="timing.clock_ghz", range={"start": 1, "stop": 10**300, "step": 1}),
     "axes[0].range.stop: must be a finite number, got an integer literal of 301 characters (at most 64)"),
    (axis(key="timing.clock_ghz", range={"start": 1, "stop": 1e100, "factor": 10}),
     "axes[0].values[64]: must be a finite number, a string, true/false or a list of them, got an integer of "
     "65 digits (at most 64)"),
    # a list or mapping where a name belongs
    ({"workloads": ["g32.dfg"], "objectives": [[1], "latency"]}, "objectives[0]: unknown objective [1] (expected"),
    ({"workloads": ["g32.dfg"], "objectives": [{"a": 1}, "latency"]}, "objectives[0]: unknown objective {'a': 1}"),
    ("? [a, b]\n: 1\nworkloads: [g32.dfg]\n", "line 1, column 3: invalid YAML: a key is a name, not a list"),
    # what the YAML parser itself would end in a traceback, or a bomb
    ("workloads: [g32.dfg]\naxes: [{name: a, key: timing.clock_ghz, values: [!!float abc]}]\n",
     "line 2, column 50: invalid YAML: 'abc' is not a valid float"),
    ("workloads: " + "[" * 5000 + "]" * 5000 + "\n", "invalid YAML: nested deeper than 16 levels"),
    ("workloads: &w [g32.dfg]\n", "line 1, column 12: invalid YAML: anchors and aliases are not allowed"),
    # a label's text is bounded before it is built
    (axis(key="timing.clock_ghz", values=[1], label="{:>1500000000}"),
     "axes[0].label: '{:>1500000000}': a field's width and precision are at most 100, not 1500000000"),
    (axis(key="timing.clock_ghz", values=[1.5], label="{:.1000f} GHz"),
     "axes[0].label: '{:.1000f} GHz': a field's width and precision are at most 100, not 1000"),
    (axis(key="timing.clock_ghz", values=["x" * 300]),
     "axes[0].label: shows values[0] in 302 characters, more than the 200 a label may have"),
    (axis(key="timing.clock_ghz", values=[[1, 2]], label="{:>5}"),
     "axes[0].label: cannot show values[0] [1, 2]: unsupported format string passed to list.__format__"),
    (axis(key="timing.clock_ghz", values=[1], label="{\u00b2}"), "axes[0].label: '{\u00b2}': the fields are"),
    # key paths where one holds the other, or both name the same item: one would overwrite the other
    (axis(keys=["timing", "timing.clock_ghz"], values=[1]),
     "axes[0].keys: timing.clock_ghz is within timing, also a key of this axis"),
    ({"workloads": ["g32.dfg"], "axes": [{"name": "a", "key": "timing", "values": [1]},
                                         {"name": "b", "key": "timing.clock_ghz", "values": [1]}]},
     "axes[1].key: timing.clock_ghz is within timing, set by axis 'a'"),
    ({"workloads": ["g32.dfg"], "axes": [{"name": "a", "key": "timing.clock_ghz", "values": [1]},
                                         {"name": "b", "key": "timing", "values": [1]}]},
     "axes[1].key: timing holds timing.clock_ghz, set by axis 'a'"),
    ({"workloads": ["g32.dfg"], "axes": [{"name": "a", "key": "timing.dataflows", "values": [1]},
                                         {"name": "b", "key": "timing.dataflows[0]", "values": [1]}]},
     "axes[1].key: timing.dataflows[0] is within timing.dataflows, set by axis 'a'"),
    ({"workloads": ["g32.dfg"], "axes": [{"name": "a", "key": "timing.dataflows[*]", "values": ["os"]},
                                         {"name": "b", "key": "timing.dataflows[0]", "values": ["ws"]}]},
     "axes[1].key: timing.dataflows[0] names an item of timing.dataflows[*], set by axis 'a'"),
    # a path with a NUL byte: refused, shown escaped, before open() raises ValueError
    ({"workloads": ["g32.dfg"], "base": "x\0.json"}, "base: 'x\\x00.json': a path cannot hold a NUL byte"),
    ({"workloads": [{"path": "x\0.dfg"}]}, "workloads[0].path: "),
    ({"workloads": ["x\0.dfg"]}, "x\\x00.dfg': a path cannot hold a NUL byte"),
])
def test_a_bad_spec_is_one_line_naming_the_place(tmp_path, document, expected):
    assert expected in spec_error(tmp_path, document)


@pytest.mark.parametrize("text, expected", [
    ('{"workloads": ["g32.dfg"], "axes": [{"name": "a", "key": "timing.clock_ghz", "values": [%s]}]}' % ("1" * 5000),
     "axes[0].values[0]: must be a finite number, a string, true/false or a list of them, got an integer literal "
     "of 5000 characters (at most 64)"),
    ('{"workloads": ["g32.dfg"], "objectives": [{"a": 1}, "latency"]}', "objectives[0]: unknown objective {'a': 1}"),
    ('{"workloads": ' + "[" * 5000 + "]" * 5000 + "}", "line 1: nested deeper than 16 levels"),
    # a key twice: json.loads tells no line, so the refusal names the place of the object
    ('{"workloads": ["g32.dfg"], "workloads": ["g32.dfg"]}',
     "a spec is a mapping with the keys base, accelerator, workloads, axes, objectives, dataflow, fusion, binder, "
     "got a mapping with the key 'workloads' twice"),
    ('{"workloads": ["g32.dfg"], "axes": [{"name": "a", "name": "b", "key": "timing.clock_ghz", "values": [1]}]}',
     "axes[0]: must be a mapping with the keys name, key, keys, values, range, label, got a mapping with the key "
     "'name' twice"),
])
def test_a_bad_json_spec_is_one_line_naming_the_place(tmp_path, text, expected):
    assert expected in spec_error(tmp_path, text, "bad.json")


def test_a_range_past_the_largest_float_stops_there(tmp_path):
    (tmp_path / "g32.dfg").write_text(gemm_dfg(32, 32, 32))

    def values(**range_):
        path = tmp_path / "ok.yaml"
        path.write_text(yaml.safe_dump(axis(key="timing.clock_ghz", range=range_)))
        return read_spec(str(path)).axes[0].values

    # the next value, 1e400, is past any float: the range ends before it (the point of 1e200 GHz is
    # the config reader's to refuse, as a failed row)
    assert values(start=1.0, stop=1e308, factor=1e200) == (1.0, 1e200)
    # factor**n past the largest float, start * factor**n not: still in the range, computed exactly
    assert values(start=1e-300, stop=1e150, factor=1e200) == (1e-300, 1e-100, 1e100)
    assert values(start=1.79e308, stop=1.7976931348623157e308, step=1e307) == (1.79e308,)


def test_a_bad_spec_exits_2_with_one_line(tmp_path):
    """As a process of its own: the contract holds for the command as installed."""
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(axis(key="compute.processor_array.rowz", values=[4])))
    (tmp_path / "g32.dfg").write_text(gemm_dfg(32, 32, 32))
    proc = run_cli_process("dse", tmp_path / "bad.yaml", "-o", tmp_path / "out")
    assert_one_line_error(proc, "bad.yaml", "axes[0]", "compute.processor_array.rowz", "not a key of the config")
    assert not (tmp_path / "out").exists()
    proc = run_cli_process("dse", tmp_path / "nope.yaml", "-o", tmp_path / "out", "--serial")
    assert_one_line_error(proc, "nope.yaml", "cannot read")
    assert_one_line_error(run_cli_process("dse", tmp_path / "bad.yaml", "-o", tmp_path / "out", "--serial",
                                          "--workers", "2"), "--serial", "--workers")


def test_a_results_table_of_another_sweep_is_refused(tmp_path):
    spec = write_spec(tmp_path, [{"name": "array", "keys": ARRAY, "values": [4]}])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.csv").write_text("point,other,workload\n")
    assert_one_line_error(run_dse(spec, "-o", tmp_path / "out", "--serial"), "results.csv", "another sweep's")


def test_an_edited_results_table_is_refused_naming_its_row_and_column(tmp_path):
    spec = write_spec(tmp_path, [{"name": "array", "keys": ARRAY, "values": [4, 8]}])
    assert run_dse(spec, "-o", tmp_path / "out", "--serial").returncode == 0
    results = tmp_path / "out" / "results.csv"
    header, *table = csv.reader(io.StringIO(results.read_text()))
    table[1][header.index("energy_pj")] = "abc"
    edited = "".join(map(line, [header, *table]))
    results.write_text(edited)
    plot = (tmp_path / "out" / "pareto.png").read_bytes()
    proc = run_dse(spec, "-o", tmp_path / "out", "--serial")
    assert_one_line_error(proc, f"{results}: line 3: energy_pj: 'abc' is not a finite number", "edited")
    assert results.read_text() == edited and (tmp_path / "out" / "pareto.png").read_bytes() == plot  # untouched


@pytest.mark.parametrize("column, text, reason", [
    ("latency_s", "nan", "latency_s: 'nan' is not a finite number"),
    ("area_mm2", "inf", "area_mm2: 'inf' is not a finite number"),
    ("cycles", "12 cycles", "cycles: '12 cycles' is not a finite number"),
    ("status", "maybe", "status: 'maybe' is not ok or failed"),
])
def test_a_results_row_kpu_dse_cannot_have_written_is_refused(tmp_path, column, text, reason):
    from dse.results import ResultsError, Table, columns

    header = columns(["array"])
    row = dict.fromkeys(header, "")
    row.update(point="0123abcd", array="4", workload="g32", status="ok", cycles="100", latency_s="1e-07")
    row[column] = text
    path = tmp_path / "results.csv"
    path.write_text(line(header) + line(row.values()))
    with pytest.raises(ResultsError) as info:
        Table(path, header).read()
    assert str(info.value).startswith(f"{path}: line 2: {reason}; ")


def test_a_measure_past_a_float_makes_a_failed_row_not_an_unreadable_one(monkeypatch):
    import dse.point

    def stages(job, model, row):
        yield "config"
        row["area_mm2"] = 1.0
        yield "simulate"
        row.update(cycles=10, latency_s=1e-8, energy_pj=float("inf"))

    monkeypatch.setattr(dse.point, "_stages", stages)
    row = evaluate(Job("k", "g", "g.dfg", {}, "minimal", None, "auto", True, "greedy"), b"")
    assert row["status"] == "failed" and row["energy_pj"] is None and row["area_mm2"] == 1.0
    assert row["reason"] == "simulate: energy_pj came out inf, not a measurement"


def test_the_row_key_covers_the_toolchain_code(tmp_path, monkeypatch, request):
    """A change to the compiler, the simulator or the default costs is a new key: the rows the old
    code measured are evaluated again, not reused."""
    import dse.spec

    package = tmp_path / "lib" / "fake_toolchain"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "energy.py").write_text("MAC_PJ = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setattr(dse.spec, "TOOLCHAIN", ("fake_toolchain",))
    request.addfinalizer(dse.spec.toolchain_digest.cache_clear)  # no digest of the fake left behind
    spec = write_spec(tmp_path, [{"name": "array", "keys": ARRAY, "values": [4]}])

    def keys() -> list[str]:
        dse.spec.toolchain_digest.cache_clear()  # read once per process: a new process, here
        return [job.key for _, job in read_spec(str(spec)).jobs()]

    before = keys()
    assert keys() == before  # the same code, the same keys
    (package / "energy.py").write_text("MAC_PJ = 2.0\n")
    changed = keys()
    assert changed != before
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "energy.cpython-311.pyc").write_bytes(b"compiled")  # not the code
    assert keys() == changed
    assert dse.spec.toolchain_digest("cp-sat") != dse.spec.toolchain_digest("greedy")  # OR-Tools' version


def test_dse_uses_only_the_public_names_of_the_other_packages():
    import ast
    import importlib

    for module in sorted((ROOT / "dse").glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            package = node.module.split(".")[0]
            if package not in ("dfx", "kernel_compiler", "hardware", "loader") or node.module == "dfx.lazy":
                continue  # dfx.lazy: the lazy-export helper of every package's __init__
            where = f"{module.name}:{node.lineno}"
            assert node.module == package, f"{where}: imports from {node.module}, not from {package}"
            public = importlib.import_module(package).__all__
            assert not [a.name for a in node.names if a.name not in public], where


def test_the_frontier_of_hand_made_points():
    # (latency, area): lower is better in both
    points = [(1, 9), (2, 4), (3, 4), (4, 1), (2, 5), (1, 9), (5, 5)]
    # (3, 4) is beaten by (2, 4), (2, 5) by (2, 4), (5, 5) by all but (1, 9); the two (1, 9) tie
    assert frontier(points, (False, False)) == [0, 1, 3, 5]
    # utilization is maximised: (2, 0.9) beats (3, 0.5); (1, 0.1) is fastest
    assert frontier([(3, 0.5), (2, 0.9), (1, 0.1), (2, 0.8)], (False, True)) == [1, 2]
    # three objectives: a point worst in two may stay for the third
    assert frontier([(1, 1, 9), (2, 2, 1), (3, 3, 3), (2, 2, 2)], (False, False, False)) == [0, 1]
    assert frontier([], (False, False)) == []


def test_the_plot_is_a_png_and_an_svg_of_sensible_size():
    from dse.plot import Panel, render

    panels = [Panel("mobilenet", [1e-3, 2e-3, 4e-3, 3e-3], [9.0, 4.0, 1.0, 5.0], ["8x8", "16x16", "32x32", "64x64"], 1,
                    [False, False, False, True], "latency, area, energy"),
              Panel("gemm", [], [], [], 4, [], "latency, area, energy")]
    png, svg = render(panels, "latency", "area", "sweep.yaml")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert 800 <= width <= 4000 and 400 <= height <= 3000
    assert 10_000 < len(png) < 2_000_000
    assert b"<svg" in svg[:1000] and b"32x32" in svg and b"no point ran" in svg
    assert render(panels, "latency", "area", "sweep.yaml") == (png, svg)  # the same rows, the same files


def test_the_plot_draws_user_text_as_given_not_as_mathtext():
    from dse.plot import Panel, render

    # a workload's name, labels, a legend entry and a title, each mathtext matplotlib cannot parse;
    # and a character the font lacks: a box, not three lines of warning on stderr
    panels = [Panel("a$\\frac$", [1e-3, 2e-3, 3e-3], [9.0, 4.0, 9.5], ["\u4e2d$50^$", "${25}_", "$_$"], 0,
                    [False, False, True], "$e^$")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        png, svg = render(panels, "latency", "area", "$x^.yaml: latency and area")
    assert not [str(w.message) for w in caught]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    for text in (b"$50^$", b"a$\\frac$", b"$x^.yaml", b"also on the frontier of $e^$"):
        assert text in svg, text


def test_a_graph_parses_from_bytes_as_from_its_file(tmp_path):
    from kernel_compiler import load_graph, load_target, parse_graph, target_from_machine
    from hardware import load_machine

    path = tmp_path / "g.dfg"
    path.write_text(gemm_dfg(32, 32, 32))
    assert parse_graph(str(path), path.read_bytes()) == load_graph(str(path))
    graph, _ = parse_graph("elsewhere/g.dfg", path.read_bytes())  # a name for messages: nothing is read there
    assert graph.ops[0].source == "elsewhere/g.dfg:7 node 2 'matmul'"
    assert target_from_machine(load_machine("standard")) == load_target("standard")


def two_accelerators(tmp_path: Path, second: str) -> Path:
    """The datacenter system config (a KPU and a GPU); with second="kpu", the GPU replaced by a
    KPU of 4 L2 banks where the first has 16."""
    document = json.loads((ROOT / "tests" / "data" / "kpu-configs" / "examples__datacenter_hbm.json").read_text())
    if second == "kpu":
        kpu = json.loads(json.dumps(document["accelerators"][0]))
        kpu["id"] = "kpu_1"
        kpu["kpu_config"]["memory"]["l2_banks"] = kpu["kpu_config"]["memory"]["l2_banks"][:4]
        document["accelerators"][1] = kpu
    path = tmp_path / f"two_{second}.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("second, key, expected", [
    # the GPU has no kpu_config: nothing is made inside it, the spec is refused naming it
    ("gpu", "accelerators[*].kpu_config.memory.l2_banks[0].capacity_kb",
     "axes[0]: accelerators[*].kpu_config.memory.l2_banks[0].capacity_kb: accelerators[1] has no key 'kpu_config'; "
     "a path through [*] must be in every item it reaches"),
    # bank 5 is in the first KPU only
    ("kpu", "accelerators[*].kpu_config.memory.l2_banks[5].capacity_kb",
     "axes[0]: accelerators[*].kpu_config.memory.l2_banks[5].capacity_kb: accelerators[1].kpu_config.memory."
     "l2_banks has 4 items, no [5]"),
    ("kpu", "accelerators[*].kpu_config.memory.l2_banks[*].nonesuch",
     "accelerators[0].kpu_config.memory.l2_banks[0] has no key 'nonesuch'"),
])
def test_a_star_path_must_be_in_every_item_it_reaches(tmp_path, second, key, expected):
    base = two_accelerators(tmp_path, second)
    document = {"base": base.name, "accelerator": "kpu_0", "workloads": ["g32.dfg"],
                "axes": [{"name": "a", "key": key, "values": [64]}]}
    assert expected in spec_error(tmp_path, document)


def test_a_star_path_in_every_item_sets_every_item(tmp_path):
    base = two_accelerators(tmp_path, "kpu")
    (tmp_path / "g32.dfg").write_text(gemm_dfg(32, 32, 32))
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump({"base": base.name, "accelerator": "kpu_0", "workloads": ["g32.dfg"], "axes": [
        {"name": "a", "key": "accelerators[*].kpu_config.memory.l2_banks[*].capacity_kb", "values": [64]}]}))
    point = next(read_spec(str(path)).points())
    assert [b["capacity_kb"] for a in point.config["accelerators"] for b in a["kpu_config"]["memory"]["l2_banks"]] \
        == [64] * 20


def test_a_json_spec_with_a_bom_is_read(tmp_path):
    (tmp_path / "g32.dfg").write_text(gemm_dfg(32, 32, 32))
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(axis(key="timing.clock_ghz", values=[1, 2])).encode())
    assert read_spec(str(path)).axes[0].values == (1, 2)


def test_a_range_through_zero_has_zero(tmp_path):
    (tmp_path / "g32.dfg").write_text(gemm_dfg(32, 32, 32))
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(axis(key="timing.clock_ghz", range={"start": -0.3, "stop": 0.3, "step": 0.1})))
    assert read_spec(str(path)).axes[0].values == (-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3)


@pytest.mark.parametrize("bom, end", [(b"\xef\xbb\xbf", b""), (b"", b"\n"), (b"", b"\r\n\n")])
def test_a_results_table_with_a_bom_or_blank_last_lines_is_read(tmp_path, bom, end):
    """A BOM, as a spreadsheet writes it, and blank lines at the end are no part of the table."""
    from dse.results import Table, columns

    header = columns(["array"])
    row = dict.fromkeys(header, "")
    row.update(point="0123abcd", array="4", workload="g32", status="ok", cycles="100")
    path = tmp_path / "results.csv"
    path.write_bytes(bom + (line(header) + line(row.values())).encode() + end)
    table = Table(path, header)
    table.read()
    assert list(table.rows) == ["0123abcd"]
    table.start()  # the blank lines are cut off before rows are appended
    table.append({**row, "point": "4567ef01"})
    table.close()
    again = Table(path, header)
    again.read()
    assert list(again.rows) == ["0123abcd", "4567ef01"]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_linked_results_table_is_refused_and_its_target_untouched(tmp_path, dangling):
    spec = write_spec(tmp_path, [{"name": "array", "keys": ARRAY, "values": [4]}])
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    target = elsewhere / "precious.csv"
    if not dangling:
        target.write_text("precious\n")
    (out / "results.csv").symlink_to(target)
    proc = run_dse(spec, "-o", out, "--serial")
    assert_one_line_error(proc, f"{out / 'results.csv'}: is a symbolic link")
    assert [p.name for p in elsewhere.iterdir()] == ([] if dangling else ["precious.csv"])
    assert dangling or target.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"] and (out / "results.csv").is_symlink()
