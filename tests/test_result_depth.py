"""A convolution's result tiles two deep (`Compute.depth`, the STOREs after it): the array starts
the next output tile while this one drains to L2, goes through its epilogue and is stored. The
tiler picks two where its estimate of the array's waits for the drains says so; the object
carries the depth, the loader binds and schedules by it, and the values are the same. (A window
op's result tiles are two deep wherever its tiles stay as large: test_chain_planning.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson

from dfx import Compute, DataMove, dumps, loads
from dfx.objfile import _conforms
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.requirements import body_buffers
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from test_vector_kernels import STANDARD, graph_of, random

RELU6 = {"min": 0.0, "max": 6.0}
# MobileNet v1's dw3 and pw4 with their ReLU6s: a depthwise 3x3 of stride 2 over 112 x 112 x 64,
# then a 1x1 convolution to 128 channels, which the planner chains
PAIR = ([("DEPTHWISE_CONV2D", ["x", "wd"], {"padding": [[1, 1], [1, 1]], "stride": [2, 2]}), ("CLAMP", ["t0"], RELU6),
         ("CONV2D", ["t1", "w"], {}), ("CLAMP", ["t2"], RELU6)],
        {"x": ((1, 112, 112, 64), "f32"), "wd": ((3, 3, 64, 1), "f32"), "w": ((128, 1, 1, 64), "f32")})


def _result_ops(kernel):
    """The compute and its epilogue's, and the STOREs into L2 and L3."""
    return [op for op in kernel.body if isinstance(op, Compute)
            or (isinstance(op, DataMove) and op.move_type == "STORE" and op.destination.level != "EXTERNAL")]


def _one_deep(program):
    """The program with every result tile of its convolutions one deep."""
    kernels = []
    for k in program.kernels:
        ids = {op.op_id for op in _result_ops(k)} if k.dataflow != "vector" else set()
        kernels.append(dataclasses.replace(k, body=[dataclasses.replace(op, depth=1) if op.op_id in ids else op
                                                   for op in k.body]))
    return dataclasses.replace(program, kernels=kernels)


def _run(program):
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "test", bind_greedy)
    return bindings, simulate(program, machine, bindings)


def test_a_chained_pointwise_convolution_takes_its_result_tiles_two_deep_and_runs_faster():
    program = loads(dumps(compile_graph(graph_of(*PAIR), "test.dfg", load_target(STANDARD))))
    assert program.chains == [[k.name for k in program.kernels]]
    depthwise, pointwise = program.kernels
    assert [op.depth for op in _result_ops(pointwise)] == [2, 2, 2, 2]  # CONV2D_TILE, drain, CLAMP, into L3
    # the compiler's requirements count both of each result buffer, as the binder places them
    tile = pointwise.tiling["R"] * pointwise.tiling["C"] * pointwise.tiling["Tn"] * 4
    one_deep = _one_deep(program)

    def held(k, level):
        return sum(size for at, size in body_buffers(k.body, program.graph) if at == level)

    assert held(pointwise, "L2") - held(one_deep.kernels[1], "L2") == 2 * tile  # the drain's and the CLAMP's

    bindings, sim = _run(program)
    # and the binder places both: each compute tile's buffers of the drain and of the CLAMP's result
    in_l2 = {op.op_id for op in _result_ops(pointwise)
             if (op.destination if isinstance(op, DataMove) else op.output).level == "L2"}
    placed = [bb.buffer for bb in bindings[1].buffers if bb.buffer.op_id in in_l2]
    assert len(in_l2) == 2 and {b.op_id for b in placed} == in_l2
    assert {(b.depth, b.bytes) for b in placed} == {(2, 2 * tile)}
    _, single = _run(one_deep)
    assert sim.cycles < single.cycles, (sim.cycles, single.cycles)  # 147,868 against 148,880

    values = {name: random(shape, seed=i) for i, (name, (shape, _)) in enumerate(PAIR[1].items())}
    got = execute(program, bindings, values)
    x, wd, w = (values[n].astype(np.float64) for n in ("x", "wd", "w"))
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    dw = sum(padded[:, i:i + 111:2, j:j + 111:2, :] * wd[i, j, :, 0] for i in range(3) for j in range(3))
    want = np.clip(np.einsum("nhwc,oc->nhwo", np.clip(dw, 0, 6), w[:, 0, 0, :]), 0, 6)
    np.testing.assert_allclose(got["t3"], want, rtol=1e-5, atol=1e-4)


# MobileNet v2's first expansion: a 1x1 convolution of 16 input channels over 112 x 112, whose
# ReLU6 takes the vector unit (2 elements per result, 16 lanes) twice as long as the array takes
# for the result (16 MACs each, 256 PEs)
EXPANSION = ([("CONV2D", ["x", "w"], {}), ("CLAMP", ["t0"], RELU6)],
             {"x": ((1, 112, 112, 16), "f32"), "w": ((96, 1, 1, 16), "f32")})


def test_a_convolution_whose_epilogue_outlasts_the_array_takes_its_results_two_deep():
    """One deep, the drain of each result tile waits for the epilogue to have read the one before,
    and the array for the drain: the array waits out the epilogue's excess over its own work. By
    latency and by energy x cycles the tiler takes the second buffer (by energy alone, the tile
    of least pJ: 96 output channels, which leave no room for it)."""
    for objective in ("latency", "edp"):
        program = compile_graph(graph_of(*EXPANSION), "test.dfg", load_target(STANDARD, objective=objective))
        (conv,) = program.kernels
        assert [op.depth for op in _result_ops(conv)] == [2, 2, 2, 2], objective
        _, two = _run(program)
        _, one = _run(_one_deep(program))
        assert two.cycles < 0.9 * one.cycles, (objective, two.cycles, one.cycles)


def test_ranked_by_energy_a_depthwise_takes_its_result_tiles_two_deep():
    """A depthwise's result tiles are two deep wherever its tiles stay as large, under energy too
    (in L3 one deep)."""
    program = compile_graph(graph_of(*PAIR), "test.dfg", load_target(STANDARD, objective="energy"))
    depthwise, _ = program.kernels
    assert [op.depth for op in _result_ops(depthwise)] == [1, 2, 2, 1]  # in registers, CLAMP, into L2, L3


def test_the_estimate_counts_the_steps_a_result_tile_goes_through():
    """One deep, the tiler's cycles for a convolution whose epilogue outlasts the array are the
    pace of its result tiles' steps, as the simulator runs them: the drain and the epilogue one
    after the other (112,896 cycles, the array's work being 37,632)."""
    program = compile_graph(graph_of(*EXPANSION), "test.dfg", load_target(STANDARD, objective="energy"))
    (conv,) = program.kernels
    assert {op.depth for op in _result_ops(conv)} == {1}
    _, sim = _run(program)
    estimate = conv.hints["estimated_compute_cycles"]
    assert 0.9 * sim.cycles < estimate <= sim.cycles, (estimate, sim.cycles)


def test_a_result_depth_out_of_range_is_refused():
    obj = orjson.loads(dumps(compile_graph(graph_of(*PAIR), "test.dfg", load_target(STANDARD))))
    compute = next(op for k in obj["body"]["kernels"] for op in k["body"] if op["type"] == "COMPUTE")
    assert _conforms()(obj)
    for depth in (0, 9, 2.0):
        compute["depth"] = depth
        assert not _conforms()(obj), depth


def test_a_result_one_deep_is_left_out_of_the_object():
    """So an object whose results are all one deep reads as objects did before depths: only the
    deeper ones are written."""
    # a 1x1 convolution whose array work outlasts its drains many times over: one deep
    alone = ([("CONV2D", ["x", "w"], {})], {"x": ((1, 7, 7, 512), "f32"), "w": ((512, 1, 1, 512), "f32")})
    for graph, kernel, written in ((PAIR, 1, {2}), (alone, 0, set())):
        obj = orjson.loads(dumps(compile_graph(graph_of(*graph), "test.dfg", load_target(STANDARD))))
        computes = [op for op in obj["body"]["kernels"][kernel]["body"] if op["type"] == "COMPUTE"]
        assert computes and {op["depth"] for op in computes if "depth" in op} == written
        assert {op.depth for op in loads(orjson.dumps(obj)).kernels[kernel].body
                if isinstance(op, Compute)} == (written or {1})
