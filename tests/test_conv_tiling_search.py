"""The convolution tiling search, fast without choosing otherwise: each distinct problem is
searched once per process (the matmul one too), it skips only tilings that cannot fit, and the
counts it rests on are what an independent count and the kernel body give (the input a band
brings, position by position; the buffers the body makes)."""

from __future__ import annotations

import numpy as np
import pytest

from dfx.ops.window import Window
from kernel_compiler import lower_conv, tiling
from kernel_compiler.bands import band_elements
from kernel_compiler.compile import compile_graph
from kernel_compiler.requirements import body_buffers, extents, extents_fit, fits
from kernel_compiler.target import load_target
from test_vector_kernels import STANDARD, graph_of


@pytest.mark.parametrize("kernel, stride, dilation, before, after, dim", [
    (3, 1, 1, 1, 1, 17),  # halo and a zero border on both sides
    (3, 2, 1, 1, 0, 17),
    (7, 2, 1, 3, 3, 30),  # ResNet's stem
    (3, 1, 2, 2, 2, 11),  # dilated
    (2, 2, 1, 0, 0, 9),  # bands that neither overlap nor pad, the last one past the end
    (5, 3, 1, 4, 1, 6),  # more padding than stride: the first two bands start before the tensor
])
def test_band_elements_counts_the_input_inside_each_band(kernel, stride, dilation, before, after, dim):
    window = Window(kernel, stride, dilation, before, after)
    out = window.outputs(dim + before + after)
    for tile in range(1, out + 1):
        extent, step, offset = window.band(tile)
        starts = offset + step * np.arange(-(-out // tile))
        positions = starts[:, None] + np.arange(extent)  # each band's elements, halo and padding included
        assert band_elements(window, out, tile, dim) == np.count_nonzero((positions >= 0) & (positions < dim))


@pytest.mark.parametrize("config", ["standard", "minimal"])
def test_extents_fit_passes_all_buffers_that_fit_and_smaller(config):
    """Buffers that `fits` takes (any of the L3 ones shared), each at least as large as some
    others: `extents_fit` passes those others' extents, so the search never skips a tiling that fits."""
    target = load_target(config)
    could_fit = lambda buffers: extents_fit(extents(buffers, target.line_bytes), target)
    rng = np.random.default_rng(0)
    fitting = 0
    for _ in range(1000):
        least = [(str(level), int(rng.integers(1, target.l1.bank_bytes)))
                 for level in rng.choice(["L1", "L2", "L3"], size=rng.integers(1, 9))]
        grown = [(level, size * int(rng.integers(1, 3)) + int(rng.integers(0, 999))) for level, size in least]
        shared = rng.random(len(grown)) < 0.4
        private = [b for b, s in zip(grown, shared) if not (s and b[0] == "L3")]
        if fits(private, target, [size for (level, size), s in zip(grown, shared) if s and level == "L3"]):
            fitting += 1
            assert could_fit(least), (least, grown, shared)
    assert fitting > 100
    assert not could_fit([("L1", target.l1.bank_bytes + 1)])
    assert not could_fit([("L2", target.l2.bank_bytes)] * (target.l2.banks + 1))


def conv_chain(convs: int, dtype: str = "f32") -> tuple[list, dict]:
    """`convs` 3x3 convolutions of 8 channels in a row, each with its own weights."""
    inputs = {"x": ((1, 12, 12, 8), dtype)} | {f"w{i}": ((8, 3, 3, 8), dtype) for i in range(convs)}
    ops = [("CONV2D", ["x" if i == 0 else f"t{i - 1}", f"w{i}"], {"padding": [[1, 1], [1, 1]]}) for i in range(convs)]
    return ops, inputs


def test_each_distinct_convolution_is_searched_once():
    # unchained: a chain's planner searches each member again under shares of the target
    lower_conv._best_tiling.cache_clear()
    ops, inputs = conv_chain(3)
    first = compile_graph(graph_of(ops, inputs), "test.dfg", load_target(STANDARD), chain=False)
    assert lower_conv._best_tiling.cache_info().misses == 1  # three of one problem
    assert len({str(k.tiling) for k in first.kernels}) == 1
    # another machine: its own search
    compile_graph(graph_of(ops, inputs), "test.dfg", load_target("minimal"), chain=False)
    ops, inputs = conv_chain(1, "f16")  # narrower elements: its own search
    compile_graph(graph_of(ops, inputs, "f16"), "test.dfg", load_target(STANDARD), chain=False)
    assert lower_conv._best_tiling.cache_info().misses == 3


def test_each_distinct_matmul_is_searched_once():
    """A transformer layer's Q, K and V projections are one problem."""
    tiling._best_tiling.cache_clear()
    inputs = {"x": ((64, 96), "f32")} | {f"w{i}": ((96, 96), "f32") for i in range(3)}
    ops = [("MATMUL", ["x", f"w{i}"], {}) for i in range(3)] + [("ADD", ["t0", "t1"], {}), ("ADD", ["t3", "t2"], {})]
    compile_graph(graph_of(ops, inputs), "test.dfg", load_target(STANDARD))
    assert tiling._best_tiling.cache_info().misses == 1


@pytest.mark.parametrize("ops, inputs", [
    conv_chain(1),
    # a bias, and an epilogue operand added per output channel; on `small` the image splits
    # into bands and the channels into chunks
    ([("CONV2D", ["x", "w", "b"], {"stride": [2, 2], "padding": [[1, 1], [1, 1]]}), ("ADD", ["t0", "c"], {})],
     {"x": ((1, 17, 13, 24), "f32"), "w": ((40, 3, 3, 24), "f32"), "b": ((40,), "f32"), "c": ((40,), "f32")}),
    ([("CONV2D", ["x", "w"], {}), ("MUL", ["t0", "s"], {})],
     {"x": ((2, 30, 30, 64), "f32"), "w": ((48, 5, 5, 64), "f32"), "s": ((2, 26, 26, 48), "f32")}),
    # an epilogue with no operand (ReLU6) still holds its result in L2; the result tiles two deep
    ([("CONV2D", ["x", "w"], {}), ("CLAMP", ["t0"], {"min": 0.0, "max": 6.0})],
     {"x": ((1, 56, 56, 64), "f32"), "w": ((128, 1, 1, 64), "f32")}),
])
@pytest.mark.parametrize("config", [STANDARD, "small"])
def test_the_search_counts_the_buffers_the_kernel_body_makes(ops, inputs, config, small, monkeypatch):
    """What a tiling is sized by (its L2 and L1 buffers, its own L3 ones and the shared ones) is
    the kernel's buffers, as the loader binds them."""
    made = []
    real = lower_conv._kernel
    monkeypatch.setattr(lower_conv, "_kernel", lambda graph, ops, name, target, p, t, dataflow: made.append(
        (graph, p, t, kernel := real(graph, ops, name, target, p, t, dataflow))) or kernel)
    compile_graph(graph_of(ops, inputs), "test.dfg", load_target(small if config == "small" else config))
    [(graph, p, t, kernel)] = made
    private, shared = lower_conv.l3_buffers(p, t)
    counted = [*lower_conv.tile_buffers(p, t), *private, *(("L3", size) for size in shared)]
    assert sorted(counted) == sorted(body_buffers(kernel.body, graph))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """test_window_ops' `small`: standard with 32 KB of L3 and 4 KB L1 buffers."""
    from conftest import shrunk_config

    return shrunk_config(tmp_path_factory, "standard", "small", (2, 16), (8, 8), (4, 4))
