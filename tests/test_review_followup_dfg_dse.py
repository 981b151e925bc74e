"""Review follow-up: the `.dfg` frontend is linear in the nodes, and names repeats as before;
`kpu-dse -o ''` is refused; a results table whose whole last row lost its line end keeps it, and
a half-written last row is cut off with a warning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, gemm_dfg
from dse.results import Table, columns, line
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends.dfg import parse_dfg
from kernel_compiler.target import load_target

T = "tensor<8x8xf32>"


def relu_chain(names: list[str], results: list[str]) -> str:
    """A .dfg of a constant `x` through one RELU per name, each with its result name."""
    n = len(names)
    nodes = [f"NODE 0 : |const.x|CONSTANT|0|||0:x|0:{T}"]
    nodes += [f"NODE {i} : |{names[i - 1]}|RELU|{i}|0:{T}||0:{results[i - 1]}|0:{T}" for i in range(1, n + 1)]
    nodes.append(f"NODE {n + 1} : |output|FUNCTION_RETURN|{n + 1}|0:{T}|target:memory|0:out|0:{T}")
    edges = [f"EDGE {i} -> {i + 1} : 0|false|{T}|32|0|0|1,1,1" for i in range(n + 1)]
    adjacency = [f"ADJ {i} : {i + 1}" for i in range(n + 1)]
    return "\n".join([f"Domain Flow Graph: chain\nDIRECTED\nRUNNING_NODE_ID {n + 1}\nNODES {n + 2}", *nodes,
                      f"EDGES {len(edges)}", *edges, f"ADJACENCY {n + 1}", *adjacency]) + "\n"


# ---- the .dfg frontend ---------------------------------------------------------------------------


def test_a_10000_node_chain_parses_and_compiles():
    n = 10_000
    graph, warnings = parse_dfg("chain.dfg", relu_chain(["relu"] * n, [f"h{i}" for i in range(1, n + 1)]))
    assert not warnings
    assert [op.name for op in graph.ops] == ["relu", *(f"relu_{k}" for k in range(1, n))]
    assert [op.outputs for op in graph.ops] == [[f"h{i}"] for i in range(1, n + 1)]
    assert graph.ops[-1].inputs == [f"h{n - 1}"]
    program = compile_graph(graph, "chain.dfg", load_target(str(CONFIGS / "standard.json")))
    assert program.kernels
    assert program.kernels[-1].outputs == [f"h{n}"]


def test_repeated_names_get_the_suffixes_they_always_had():
    # a repeat takes the first free suffix, skipping names the file uses and suffixes given before
    text = relu_chain(["relu", "relu", "relu_1", "relu", "relu", "relu_3"], ["h", "h", "h_2", "h", "h", "h_4"])
    graph, _ = parse_dfg("names.dfg", text)
    assert [op.name for op in graph.ops] == ["relu", "relu_2", "relu_1", "relu_4", "relu_5", "relu_3"]
    assert [op.outputs[0] for op in graph.ops] == ["h", "h_1", "h_2", "h_3", "h_5", "h_4"]
    assert list(graph.tensors) == ["x", "h", "h_1", "h_2", "h_3", "h_5", "h_4"]


# ---- kpu-dse -------------------------------------------------------------------------------------


def run_dse(monkeypatch, capsys, *args) -> tuple[int, str]:
    """`kpu-dse ARGS` in this process: its exit code and stderr."""
    from dse.cli import main

    monkeypatch.setattr(sys, "argv", ["kpu-dse", *map(str, args)])
    with pytest.raises(SystemExit) as info:
        main()
    return info.value.code, capsys.readouterr().err


def write_spec(folder: Path) -> Path:
    (folder / "g16.dfg").write_text(gemm_dfg(16, 16, 16))
    spec = {"base": "minimal", "workloads": ["g16.dfg"], "binder": "greedy",
            "axes": [{"name": "ghz", "key": "timing.clock_ghz", "values": [1, 2]}]}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_an_empty_output_folder_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, err = run_dse(monkeypatch, capsys, spec, "-o", "", "--serial")
    assert code == 2
    assert err.splitlines() == ["error: --output: an empty path; name a folder"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g16.dfg", "sweep.yaml"]


HEADER = columns(["ghz"])


def row(point: str, **cells) -> dict[str, str]:
    return {**dict.fromkeys(HEADER, ""), "point": point, "ghz": "1", "workload": "g16", "status": "ok",
            "cycles": "100", **cells}


def test_a_whole_last_row_without_its_line_end_is_kept(tmp_path):
    path = tmp_path / "results.csv"
    path.write_bytes((line(HEADER) + line(row("0123abcd").values())).encode()[:-1])
    table = Table(path, HEADER)
    table.read()
    assert list(table.rows) == ["0123abcd"] and table.cut is None
    table.start()
    table.append(row("4567ef01"))
    table.close()
    assert path.read_text() == line(HEADER) + line(row("0123abcd").values()) + line(row("4567ef01").values())
    assert table.ordered(["4567ef01", "0123abcd"]).decode().splitlines()[1:] == [
        line(row(k).values()).rstrip("\n") for k in ("4567ef01", "0123abcd")]


@pytest.mark.parametrize("last", [
    "0123abcd,1,g1",  # too few cells
    ",".join(row("0123abcd", status="o").values()),  # every cell, the status cut short
    ",".join(row("0123abcd", cycles="1e").values()),  # a measure cut short
])
def test_a_half_written_last_row_is_cut_off_naming_its_line(tmp_path, last):
    path = tmp_path / "results.csv"
    whole = line(HEADER) + line(row("4567ef01").values())
    path.write_text(whole + last)
    table = Table(path, HEADER)
    table.read()
    assert list(table.rows) == ["4567ef01"]
    assert table.cut is not None and "\n" not in table.cut
    assert table.cut.startswith(f"{path}: line 3: ") and "cut off" in table.cut
    table.start()
    table.close()
    assert path.read_text() == whole


def test_the_command_keeps_a_whole_row_and_warns_of_a_cut_one(tmp_path, monkeypatch, capsys):
    spec, out = write_spec(tmp_path), tmp_path / "out"
    assert run_dse(monkeypatch, capsys, spec, "-o", out, "--serial")[0] == 0
    results = out / "results.csv"
    whole = results.read_bytes()

    results.write_bytes(whole[:-1])  # the line end of the last row lost: nothing is evaluated again
    code, err = run_dse(monkeypatch, capsys, spec, "-o", out, "--serial")
    assert code == 0 and "warning" not in err
    assert "evaluated 0 rows (0 failed), skipped 2 already" in err
    assert results.read_bytes() == whole

    # killed mid-row, its last two cells unwritten: that row is cut, said once, and evaluated again
    results.write_bytes(whole[: whole.rfind(b",", 0, whole.rfind(b","))])
    code, err = run_dse(monkeypatch, capsys, spec, "-o", out, "--serial")
    assert code == 0
    [warning] = [l for l in err.splitlines() if l.startswith("warning:")]
    assert warning.startswith(f"warning: {results}: line 3: ") and "cut off" in warning
    assert "evaluated 1 rows (0 failed), skipped 1 already" in err
    assert len(results.read_text().splitlines()) == 3
