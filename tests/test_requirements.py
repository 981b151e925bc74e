"""A kernel's requirements are the buffers the loader binds for it, and what the compiler tiles
for a machine class binds and runs on that machine: matmuls plain and fused (bias, residual,
activation), vector maps, reductions (long rows too) and softmax with an epilogue, layout ops."""

from __future__ import annotations

import json

import pytest

from conftest import CONFIGS, ROOT, run_cli
from dfx import Compute, dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.requirements import ON_CHIP, body_buffers, fits
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, simulate
from loader.buffers import kernel_demands
from test_vector_kernels import graph_of

F32 = "f32"


def residual_layer(M: int, N: int, K: int, residuals: int) -> tuple[list, dict]:
    """MATMUL(x, w), `residuals` ADDs of an [M, N] operand, RELU: one kernel fused."""
    ops = [("MATMUL", ["x", "w"], {})]
    shapes = {"x": ((M, K), F32), "w": ((K, N), F32)}
    for i in range(residuals):
        shapes[f"r{i}"] = ((M, N), F32)
        ops.append(("ADD", [f"t{len(ops) - 1}", f"r{i}"], {}))
    ops.append(("RELU", [f"t{len(ops) - 1}"], {}))
    return ops, shapes


# (ops, inputs) of each program; the tensors are named as `graph_of` names them
PROGRAMS = {
    "matmul": ([("MATMUL", ["x", "w"], {})], {"x": ((300, 200), F32), "w": ((200, 100), F32)}),
    "matmul_single_tile": ([("MATMUL", ["x", "w"], {})], {"x": ((16, 16), F32), "w": ((16, 16), F32)}),
    "matmul_f16_batched_cin": ([("MATMUL", ["x", "w", "c"], {})],
                               {"x": ((3, 96, 160), "f16"), "w": ((3, 160, 72), "f16"), "c": ((72,), "f16")}),
    "matmul_bias_residual_relu": ([("MATMUL", ["x", "w"], {}), ("ADD", ["t0", "b"], {}), ("ADD", ["t1", "r"], {}),
                                   ("RELU", ["t2"], {})],
                                  {"x": ((300, 200), F32), "w": ((200, 100), F32), "b": ((100,), F32),
                                   "r": ((300, 100), F32)}),
    "matmul_residual_relu_512": residual_layer(512, 512, 512, 1),
    "matmul_two_residuals_relu_512": residual_layer(512, 512, 512, 2),
    "map_broadcast": ([("ADD", ["a", "b"], {}), ("SIGMOID", ["t0"], {})], {"a": ((37, 129), F32), "b": ((129,), F32)}),
    "reduction": ([("REDUCE_SUM", ["a"], {"axes": [-1]})], {"a": ((300, 700), F32)}),
    "softmax_epilogue": ([("SOFTMAX", ["x"], {"axis": -1}), ("MUL", ["t0", "b"], {}), ("ADD", ["t1", "r"], {})],
                         {"x": ((300, 384), F32), "b": ((384,), F32), "r": ((300, 384), F32)}),
    "layout": ([("TRANSPOSE", ["x"], {"perms": [1, 0]}), ("PAD", ["t0"], {"padding": [[2, 3], [0, 5]]}),
                ("SLICE", ["t1"], {"start": [1, 4], "size": [-1, 40]}), ("RESHAPE", ["t2"], {"new_shape": [-1]}),
                ("CONCAT", ["t3", "y", "t3"], {"axis": 0}), ("GATHER", ["t4"], {"indices": [-1, 0, 77]})],
               {"x": ((41, 67), F32), "y": ((9,), F32)}),
}
# rows too long for a tile of `tiny`: a reduction loop, and a softmax taken apart into a chain
LONG_ROWS = {
    "long_reduction": ([("REDUCE_MAX", ["a"], {"axes": [1]})], {"a": ((5, 3001), F32)}),
    "long_softmax": ([("SOFTMAX", ["a"], {"axis": -1}), ("MUL", ["t0", "b"], {})],
                     {"a": ((4, 3001), F32), "b": ((3001,), F32)}),
}


def compiled(graph, config: str):
    """The program as the loader reads it, compiled for `config`."""
    return loads(dumps(compile_graph(graph, "test.dfg", load_target(config))))


def assert_requirements_are_the_bound_buffers(program, config: str) -> None:
    target = load_target(config)
    for k in program.kernels:
        buffers, _ = kernel_demands(k, program, 1)
        for level in ON_CHIP:
            # a double-buffered L2 load's slots are buffers of their own, which the binder may part
            # over banks: together, the move's buffer the compiler counts
            by_move: dict[tuple[int, int], int] = {}
            for b in buffers:
                if b.level == level:
                    by_move[b.op_id, b.worker] = by_move.get((b.op_id, b.worker), 0) + b.bytes
            sizes = list(by_move.values())
            assert k.requirements["bytes"][level] == sum(sizes), (k.name, level)
            assert k.requirements["largest_buffer"][level] == max(sizes, default=0), (k.name, level)
        # and the tiles were chosen so that those buffers fit the machine class tiled for, one
        # copy of a shared move's serving every compute tile
        shared = k.shared_moves()
        private = body_buffers([op for op in k.body if op.op_id not in shared], program.graph)
        once = [b for _, b in body_buffers([op for op in k.body if op.op_id in shared], program.graph)]
        assert fits(private, target, once), k.name


@pytest.mark.parametrize("config", ["minimal", "standard", "datacenter"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_requirements_are_the_buffers_the_loader_binds(name, config):
    path = str(CONFIGS / f"{config}.json")
    assert_requirements_are_the_bound_buffers(compiled(graph_of(*PROGRAMS[name]), path), path)


@pytest.mark.parametrize("name", sorted(LONG_ROWS))
def test_requirements_of_long_rows_are_the_buffers_the_loader_binds(tiny, name):
    program = compiled(graph_of(*LONG_ROWS[name]), tiny)
    # the rows do not fit a tile: a reduction loop, or the softmax taken apart into kernels
    loops = [op for k in program.kernels for op in k.body if isinstance(op, Compute) and op.accumulate != "false"]
    assert loops or len(program.kernels) > 1
    assert_requirements_are_the_bound_buffers(program, tiny)


def test_requirements_of_an_example_mlp_are_the_buffers_the_loader_binds():
    graph, _ = load_graph(str(ROOT / "examples" / "mlp3.dfg"))
    path = str(CONFIGS / "standard.json")
    assert_requirements_are_the_bound_buffers(compiled(graph, path), path)


@pytest.mark.parametrize("config", ["minimal", "standard", "datacenter"])
@pytest.mark.parametrize("residuals", [1, 2])
def test_matmul_with_residual_epilogue_runs_on_the_config_it_was_tiled_for(config, residuals):
    """The reviewer's case: tiled for a config, bound and simulated on that same config."""
    path = str(CONFIGS / f"{config}.json")
    program = compiled(graph_of(*residual_layer(512, 512, 512, residuals)), path)
    assert len(program.kernels) == 1 and len(program.kernels[0].epilogue) == residuals + 1
    machine = load_machine(path)
    sim = simulate(program, machine, bind_program(program, machine, "test", bind_greedy))
    assert sim.cycles > 0


def test_matmul_with_two_residuals_checks_on_the_config_it_was_tiled_for(tmp_path):
    ops, shapes = residual_layer(512, 512, 512, 2)
    obj = tmp_path / "residual.kpu"
    obj.write_bytes(dumps(compile_graph(graph_of(ops, shapes), "residual.dfg",
                                        load_target(str(CONFIGS / "standard.json")))))
    proc = run_cli("loader", obj, "--config", "standard", "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["check"]["passed"] and report["cycles"] > 0
