"""`--plot`: the run's kernels on the machine's rooflines. Drawn in-process from the summary of a
small timing run (a ReLU, a 256^3 matmul and a transpose, unfused: one kernel for each panel and
one that only moves data); the CLI is run for the option's file handling."""

from __future__ import annotations

import io
import math

import pytest
from matplotlib.figure import Figure

from conftest import assert_one_line_error, gemm_dfg, run_cli
from hardware import load_machine
from loader.roofline_plot import figure, write
from test_kernel_profile import CHAIN, SHAPES, profile
from test_vector_kernels import STANDARD

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run() -> dict:
    return profile(CHAIN, SHAPES)


@pytest.fixture(scope="module")
def drawn(run) -> Figure:
    return figure(run, load_machine(STANDARD))


def artists(ax, gid: str) -> list:
    return [a for a in ax.collections + ax.lines if a.get_gid() == gid]


def test_each_kernel_is_a_point_at_its_intensity_and_achieved_rate(run, drawn):
    arrays, vector = drawn.axes[:2]
    matmul, relu = run["kernels"]["matmul_1"], run["kernels"]["relu_0"]
    (on_arrays,) = artists(arrays, "kernels")
    flop, dram = 2 * matmul["macs"], sum(matmul["dram_bytes"].values())
    assert len(on_arrays.get_offsets()) == 1
    assert on_arrays.get_offsets()[0].tolist() == pytest.approx([flop / dram, flop / matmul["cycles"]])
    assert on_arrays.get_array().tolist() == [matmul["share"]]  # its colour
    (on_vector,) = artists(vector, "kernels")
    assert on_vector.get_offsets().tolist() == [[1 / 8, relu["vector_elements"] / relu["cycles"]]]
    assert on_vector.get_array().tolist() == [relu["share"]]
    # the costlier kernel is the larger point
    assert matmul["share"] > relu["share"] and on_arrays.get_sizes()[0] > on_vector.get_sizes()[0]


def test_ceilings_are_the_machines_peaks_and_dram_rate(drawn):
    # standard: 2 compute tiles of 16x16 arrays (512 MACs = 1,024 FLOP a cycle) and of 16 vector
    # lanes; DRAM 2 channels of 50 B/cycle (the 2 DMA engines' 128 would be more)
    for ax, peak in zip(drawn.axes, (1024, 32)):
        (roof,) = artists(ax, "peak")
        assert set(roof.get_ydata()) == {peak} and max(roof.get_xdata()) == ax.get_xlim()[1]
        (slope,) = artists(ax, "dram")
        (x0, x1), (y0, y1) = slope.get_xdata(), slope.get_ydata()
        assert y0 / x0 == pytest.approx(100) and y1 / x1 == pytest.approx(100)
        (ridge,) = artists(ax, "ridge")
        assert (ridge.get_xdata()[0], ridge.get_ydata()[0]) == pytest.approx((peak / 100, peak))
        assert x1 == pytest.approx(peak / 100) and min(roof.get_xdata()) == pytest.approx(peak / 100)
        assert ax.get_xscale() == ax.get_yscale() == "log"
    assert drawn.axes[0].get_xlabel() == "arithmetic intensity (FLOP per DRAM byte)"
    assert drawn.axes[1].get_ylabel() == "achieved elements per cycle"


def test_every_kernel_is_drawn_named_or_noted(run, drawn):
    named = [t.get_text() for ax in drawn.axes[:2] for t in ax.texts]
    assert sorted(named) == ["matmul_1", "relu_0"]
    # the transpose has no work for either axis: the footnote says so rather than dropping it
    assert "moving data only" in drawn.get_supxlabel()
    assert "transpose_2" in drawn.get_supxlabel()


def test_a_program_that_only_moves_data_draws_the_empty_roofline(run):
    s = {**run, "kernels": {"transpose_2": run["kernels"]["transpose_2"]}}
    fig = figure(s, load_machine(STANDARD))
    (arrays,) = fig.axes[:1]
    assert not artists(arrays, "kernels")
    assert set(artists(arrays, "peak")[0].get_ydata()) == {1024}
    assert "transpose_2" in fig.get_supxlabel()
    fig.savefig(io.BytesIO(), format="png")


def test_a_kernel_moving_no_dram_byte_sits_on_the_right_edge(run):
    s = {**run, "kernels": {**run["kernels"], "relu_0": {**run["kernels"]["relu_0"],
                                                          "arithmetic_intensity": math.inf}}}
    vector = figure(s, load_machine(STANDARD)).axes[1]
    assert not artists(vector, "kernels")
    (points,) = artists(vector, "no-dram")
    assert points.get_offsets()[0][0] == vector.get_xlim()[1]
    assert "infinite intensity" in [t.get_text() for t in vector.get_legend().get_texts()][-1]


def test_an_unbounded_dram_rate_leaves_the_roof_alone(run):
    ideal = load_machine("ideal_32x32")  # DRAM at an infinite rate: no slope, no ridge point
    arrays = figure(run, ideal).axes[0]
    assert not artists(arrays, "dram") and not artists(arrays, "ridge")
    (roof,) = artists(arrays, "peak")
    assert set(roof.get_ydata()) == {2 * ideal.compute.peak_macs_per_cycle}
    assert tuple(roof.get_xdata()) == arrays.get_xlim()


def test_names_from_the_graph_are_printed_as_they_are(run):
    """Between two `$` matplotlib would read math text, and fail the drawing on a bad formula."""
    kernels = dict(run["kernels"])
    kernels["cost $5 \\frac$"] = kernels.pop("matmul_1")
    kernels["line\nbreak"] = kernels.pop("transpose_2")
    fig = figure({**run, "kernels": kernels, "object": "/models/$\\frac$.kpu"}, load_machine(STANDARD))
    out = io.BytesIO()
    fig.savefig(out, format="png")
    assert "cost $5 \\frac$" in [t.get_text() for t in fig.axes[0].texts]
    assert "line\\nbreak" in fig.get_supxlabel()
    assert fig.get_suptitle().startswith("$\\frac$.kpu on standard")  # the file's name


@pytest.mark.parametrize("fmt, magic", [("png", PNG), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_each_format_is_written(run, fmt, magic):
    out = io.BytesIO()
    write(run, load_machine(STANDARD), out, fmt)
    assert out.getvalue().startswith(magic) and len(out.getvalue()) > 20_000


# --- the CLI option -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemm")
    (folder / "g.dfg").write_text(gemm_dfg(64, 64, 64))
    assert run_cli("compiler", folder / "g.dfg", "-o", folder / "g.kpu").returncode == 0
    return folder / "g.kpu"


@pytest.mark.parametrize("mode", ["--timing-only", "--dry-run"])
def test_plot_option_writes_the_figure(tmp_path, gemm, mode):
    plot = tmp_path / "plots" / "roofline.png"  # its missing folder is made
    proc = run_cli("loader", gemm, "--config", "standard", "--binder", "greedy", mode, "--json", "--plot", plot)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("{")  # stdout stays the JSON
    assert plot.read_bytes().startswith(PNG) and plot.stat().st_size > 20_000
    assert sorted(p.name for p in plot.parent.iterdir()) == ["roofline.png"]


@pytest.mark.parametrize("name, fragments", [
    ("roofline.jpg", ["roofline.jpg", ".png, .svg or .pdf", "'.jpg'"]),
    ("roofline", ["roofline", "no suffix"]),
    ("taken.png", ["taken.png", "a folder is in the way"]),
])
def test_bad_plot_path_is_refused_before_any_work(tmp_path, name, fragments):
    (tmp_path / "taken.png").mkdir()
    # the object does not exist: refusing the plot's path first shows it is checked before any work
    proc = run_cli("loader", tmp_path / "missing.kpu", "--config", "standard", "--plot", tmp_path / name)
    assert_one_line_error(proc, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.png"]
