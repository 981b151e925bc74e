"""Fusion: map epilogues applied to a kernel's result tile on chip, and the chains the compiler
recognises as one op."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DATA, ROOT, run_cli
from dfx import dumps, loads
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.fuse import fusion_groups
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.report import dram_bytes
from test_vector_kernels import STANDARD, graph_of, random

MLP = ROOT / "examples" / "mlp3.dfg"


def summary(tmp_path, *flags) -> dict:
    obj = tmp_path / f"mlp{'_'.join(flags)}.kpu"
    assert run_cli("compiler", MLP, "-o", obj, *flags).returncode == 0
    proc = run_cli("loader", obj, "--config", STANDARD, "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fused_mlp_moves_fewer_bytes_in_fewer_cycles(tmp_path):
    fused, unfused = summary(tmp_path), summary(tmp_path, "--no-fusion")
    assert len(fused["kernels"]) == 3 and len(unfused["kernels"]) == 9
    assert sum(fused["dram_bytes"].values()) < sum(unfused["dram_bytes"].values())
    # only each layer's activation reaches external memory, not its matmul or bias result
    assert fused["dram_bytes"]["write"] == 256 * (512 + 256 + 128) * 4
    assert unfused["dram_bytes"]["write"] == 3 * fused["dram_bytes"]["write"]
    assert fused["cycles"] < unfused["cycles"]
    assert fused["check"]["passed"] and unfused["check"]["passed"]


def test_dump_shows_the_groups():
    proc = run_cli("compiler", MLP, "--dump")
    kernels = [l for l in proc.stdout.splitlines() if l.startswith("kernel ")]
    assert [l.split(" (")[1].split(",")[0] for l in kernels] == ["MATMUL + bias", "MATMUL + bias_1", "MATMUL + bias_2"]
    assert all("relu" in l or "sigmoid" in l for l in kernels)


def test_tosa_softmax_chain_is_one_kernel():
    proc = run_cli("compiler", DATA / "softmax_tosa.dfg", "--dump")
    assert proc.returncode == 0, proc.stderr
    kernels = [l for l in proc.stdout.splitlines() if l.startswith("kernel ")]
    assert len(kernels) == 1 and "(SOFTMAX, vector)" in kernels[0]


def run(graph, values, fuse=True):
    program = loads(dumps(compile_graph(graph, "test.dfg", load_target(STANDARD), fuse=fuse)))
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, "test", bind_greedy)
    return program, simulate(program, machine, bindings), execute(program, bindings, values)


LAYER = [("MATMUL", ["x", "w"], {}), ("ADD", ["t0", "b"], {}), ("RELU", ["t1"], {})]
SHAPES = {"x": ((256, 512), "f32"), "w": ((512, 384), "f32"), "b": ((384,), "f32")}


def test_epilogue_overlaps_the_next_tiles_array_work():
    values = {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(SHAPES.items())}
    program, fused, out = run(graph_of(LAYER, SHAPES), values)
    assert len(program.kernels) == 1 and program.kernels[0].epilogue == ["op1", "op2"]
    want = np.maximum(values["x"].astype(np.float64) @ values["w"] + values["b"], 0)
    np.testing.assert_allclose(out["t2"], want, rtol=1e-4, atol=1e-4)
    _, matmul_alone, _ = run(graph_of(LAYER[:1], SHAPES), values)
    vector = sum(u.busy_cycles for name, u in fused.units.items() if name.startswith("vec"))
    assert vector > 0
    # the epilogue runs on the vector unit while the array computes the next blocks: the kernel
    # takes less than the matmul alone plus the epilogue's vector work
    assert fused.cycles < matmul_alone.cycles + vector
    _, unfused, _ = run(graph_of(LAYER, SHAPES), values, fuse=False)
    assert fused.cycles < unfused.cycles


@pytest.mark.parametrize("ops", [
    LAYER,
    [("ADD", ["x", "b"], {}), ("TANH", ["t0"], {}), ("MUL", ["t1", "b"], {})],  # a map anchor
    [("SOFTMAX", ["x"], {"axis": -1}), ("MUL", ["t0", "b"], {})],  # a row-op anchor
])
def test_fused_dram_count_equals_simulated_bytes(ops):
    shapes = SHAPES if ops is LAYER else {"x": ((300, 384), "f32"), "b": ((384,), "f32")}
    program, sim, _ = run(graph_of(ops, shapes), {n: random(shape, seed=i) for i, (n, (shape, _)) in enumerate(shapes.items())})
    assert len(program.kernels) == 1
    assert program.kernels[0].hints["estimated_dram_bytes"] == sum(dram_bytes(sim).values())


def test_an_intermediate_needed_elsewhere_is_not_fused():
    g = graph_of([("MATMUL", ["x", "w"], {}), ("ADD", ["t0", "b"], {}), ("RELU", ["t1"], {}),
                  ("ADD", ["t2", "t1"], {})], SHAPES)  # t1 read twice
    assert [[op.name for op in group] for group in fusion_groups(g)] == [["op0", "op1"], ["op2", "op3"]]
    g.tensors["t0"].role = "output"  # a graph output must reach memory
    assert [[op.name for op in group] for group in fusion_groups(g)] == [["op0"], ["op1"], ["op2", "op3"]]
