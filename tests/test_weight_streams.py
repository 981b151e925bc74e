"""A product of one output row (a classifier after a global pooling) is the stream of its
weights through the DMA engines, each move holding its engine for the DRAM latency besides its
bytes: its tiling takes fewer, larger weight moves where those are faster; and of convolution
tilings that tie, one bound by its array takes the one whose first loads come soonest. Values
against numpy, cycles against the tiling the rules took before."""

from __future__ import annotations

import numpy as np
import pytest

from dfx import dumps, loads
from hardware import load_machine
from kernel_compiler import compile as compile_module
from kernel_compiler import compile_graph, load_target, lower_conv, tiling
from loader import bind_cpsat, bind_program, execute, simulate
from test_vector_kernels import STANDARD, graph_of, random


def run(graph, values):
    """Compiled for standard, bound as the loader binds (CP-SAT, the DMA moves balanced over the
    engines), executed and simulated: (program, every tensor's value, simulation result)."""
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(STANDARD))))
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "test", bind_cpsat)
    return program, execute(program, bindings, values), simulate(program, machine, bindings)


def _uncached() -> None:
    """The searches remember their answers per process: forget them."""
    tiling._best_tiling.cache_clear()
    lower_conv._best_tiling.cache_clear()
    lower_conv._channel_tilings.cache_clear()


@pytest.fixture
def fresh():
    _uncached()
    yield
    _uncached()


@pytest.fixture
def on_the_array(monkeypatch):
    """A product of one row lowered on the array, the vector unit's kernel not offered
    (test_gemv.py weighs the two)."""
    monkeypatch.setattr(compile_module, "gemv_dims", lambda graph, op: None)


def _dma_moves(sim) -> int:
    return sum(u.tasks for name, u in sim.units.items() if name.startswith("dma"))


def test_a_matrix_vector_product_takes_a_panel_of_weights(fresh, on_the_array, monkeypatch):
    """1 x 1280 by 1280 x 1000 (MobileNet v2's classifier): a resident panel of B, its tiles
    smaller than TILE_SHRINK allows, moves the same bytes in fewer, larger moves: faster, with
    the BlockMovers far from the limit."""
    graph = graph_of([("MATMUL", ["a", "b"], {})], {"a": ((1, 1280), "f32"), "b": ((1280, 1000), "f32")})
    values = {"a": random((1, 1280)), "b": random((1280, 1000), seed=1)}
    program, out, sim = run(graph, values)
    kernel = program.kernels[0]
    assert kernel.tiling["Ti"] == 1 and "L3_Bj" in kernel.tiling, kernel.tiling
    np.testing.assert_allclose(out[program.graph.outputs[0].name], values["a"] @ values["b"], rtol=1e-4, atol=1e-4)

    _uncached()
    monkeypatch.setattr(tiling, "_fed", lambda *args: False)  # the area rule alone
    before, _, old = run(graph, values)
    assert "L3_Bj" not in before.kernels[0].tiling
    assert sim.bytes_moved["EXTERNAL->L3"] == old.bytes_moved["EXTERNAL->L3"]
    assert _dma_moves(sim) < _dma_moves(old) / 2
    assert sim.cycles < 0.95 * old.cycles, (sim.cycles, old.cycles)


def test_a_convolution_of_one_position_takes_its_weights_a_tile_at_a_time(fresh, on_the_array, monkeypatch):
    """1 x 1 x 1 x 1024 to 1000 channels (MobileNet v1's classifier): the weights of a tile of
    output channels come in one move, not a move per chunk of input channels."""
    graph = graph_of([("CONV2D", ["x", "w", "b"], {"layout": "NHWC"})],
                     {"x": ((1, 1, 1, 1024), "f32"), "w": ((1000, 1, 1, 1024), "f32"), "b": ((1000,), "f32")})
    values = {"x": random((1, 1, 1, 1024)), "w": random((1000, 1, 1, 1024), seed=1), "b": random((1000,), seed=2)}
    program, out, sim = run(graph, values)
    kernel = program.kernels[0]
    assert kernel.hints["l3_resident"] == f"weights of {kernel.tiling['Tn']} output channels", kernel.hints
    want = values["x"].reshape(1, 1024) @ values["w"].reshape(1000, 1024).T + values["b"]
    np.testing.assert_allclose(out[program.graph.outputs[0].name].reshape(1, 1000), want, rtol=1e-4, atol=1e-4)

    _uncached()
    monkeypatch.setattr(lower_conv, "WEIGHT_STREAM", lower_conv.HOLDINGS[1])  # as before: chunk by chunk
    before, _, old = run(graph, values)
    assert before.kernels[0].hints["l3_resident"] == "none"
    assert sim.bytes_moved["EXTERNAL->L3"] == old.bytes_moved["EXTERNAL->L3"]
    # for each tile of 16 output channels, its 64 KB in two parts (one per channel), not four
    # moves of 16 KB (the tile's result: one move either way); the bias a tile with each tile's
    # weights, where positions outer bring it whole once (`ConvTiling.bias_whole`)
    tiles = -(-1000 // 16)
    assert _dma_moves(old) - _dma_moves(sim) == (4 - 2) * tiles - (tiles - 1)
    assert sim.cycles < 0.95 * old.cycles, (sim.cycles, old.cycles)


def test_of_convolution_tilings_that_tie_the_one_that_starts_sooner_is_taken(fresh, monkeypatch):
    """A 14 x 14 pointwise (128 -> 128 channels): its weights whole in L3 and a chunk at a time
    tie on DRAM bytes and estimated cycles. The array bounds it, so the one whose first band and
    weights come sooner is taken: the array starts earlier, the run is no longer, the values
    are numpy's. Taking the first of the tied (as before `_exposed`), the weights come whole."""
    graph = graph_of([("CONV2D", ["x", "w"], {})], {"x": ((1, 14, 14, 128), "f32"), "w": ((128, 1, 1, 128), "f32")})
    values = {"x": random((1, 14, 14, 128)), "w": random((128, 1, 1, 128), seed=1)}
    program, out, sim = run(graph, values)
    assert program.kernels[0].hints["l3_resident"] == "none"
    want = values["x"].reshape(196, 128).astype(np.float64) @ values["w"].reshape(128, 128).T.astype(np.float64)
    np.testing.assert_allclose(out[program.graph.outputs[0].name].reshape(196, 128), want, rtol=1e-4, atol=1e-4)

    _uncached()
    monkeypatch.setattr(lower_conv, "_exposed", lambda *args: 0)
    before, _, old = run(graph, values)
    assert before.kernels[0].hints["l3_resident"] == "all weights, shared"
    assert sim.bytes_moved == old.bytes_moved
    assert sim.phases[0].compute_start < old.phases[0].compute_start, (sim.phases[0], old.phases[0])
    assert sim.cycles <= old.cycles
