"""The per-kernel profile: each kernel's cycles, share, array and vector utilization, DRAM bytes
and bound, in `--json`'s `kernels` and `--profile`'s table; built in-process on small graphs
(a ReLU, a matmul and a transpose, unfused) whose counts can be worked out by hand. And the
stages (`stages`): a chain's kernels together, with the share of each kind of unit they held."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from conftest import run_cli
from dfx import dumps, loads
from hardware import UNIT_PREFIX, load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, simulate
from loader.report import STAGE_UNITS, by_cycles, kernel_table, stage_table, summary
from loader.run import RunResult
from test_chain_planning import BLOCK, SHAPES as BLOCK_SHAPES
from test_vector_kernels import STANDARD, graph_of

N = 256  # a 256^3 f32 matmul: 2 * N^3 FLOP over at least 3 * N^2 * 4 bytes, well above the ridge
# the matmul second, so that costliest first is not program order
CHAIN = [("RELU", ["x"], {}), ("MATMUL", ["t0", "w"], {}), ("TRANSPOSE", ["t1"], {})]
SHAPES = {"x": ((N, N), "f32"), "w": ((N, N), "f32")}
HEADER = "kernel op shape cycles share array vector DRAM bound"


def compiled(ops, shapes, fuse):
    # every intermediate through external memory: the kernels' DRAM bytes are what is measured
    return loads(dumps(compile_graph(graph_of(ops, shapes), "test.dfg", load_target(STANDARD), fuse=fuse,
                                     keep=False)))


def profile(ops, shapes, fuse=False, program=None) -> dict:
    """The --json summary of a timing-only run of the ops (or of `program`), bound greedily."""
    program, machine = program or compiled(ops, shapes, fuse), load_machine(STANDARD)
    result = RunResult(bind_program(program, machine, "test", bind_greedy))
    result.sim = simulate(program, machine, result.bindings)
    return summary(result, program, "test.kpu", machine, {})


@pytest.fixture(scope="module")
def unfused() -> dict:
    return profile(CHAIN, SHAPES)


def test_each_kernel_names_its_op_and_result(unfused):
    kernels = unfused["kernels"]
    assert list(kernels) == ["relu_0", "matmul_1", "transpose_2"]  # program order, as before
    assert [k["op"] for k in kernels.values()] == ["RELU", "MATMUL", "TRANSPOSE"]
    assert {k["shape"] for k in kernels.values()} == {f"{N}x{N}"}


def test_cycles_are_compute_spans_and_shares_of_the_run(unfused):
    kernels = unfused["kernels"].values()
    for k in kernels:
        start = k["compute_start_cycle"] if k["compute_start_cycle"] is not None else k["start_cycle"]
        assert k["cycles"] == k["end_cycle"] - start > 0
        assert k["share"] == k["cycles"] / unfused["cycles"]
    assert max(k["end_cycle"] for k in kernels) == unfused["cycles"]
    # from their first computes the kernels nearly cover the run (the first kernel's first loads
    # are left out); a kernel may start on what the one before has stored before that one ends
    covered, reached = 0, 0
    for start, end in sorted((k["end_cycle"] - k["cycles"], k["end_cycle"]) for k in kernels):
        covered += max(0, end - max(start, reached))
        reached = max(reached, end)
    assert 0.9 < covered / unfused["cycles"] <= 1


def test_kernels_dram_bytes_add_up_to_the_runs(unfused):
    kernels = unfused["kernels"]
    for way in ("read", "write"):
        assert sum(k["dram_bytes"][way] for k in kernels.values()) == unfused["dram_bytes"][way]
    # the ReLU reads its operand once and writes its result once
    assert kernels["relu_0"]["dram_bytes"] == {"read": N * N * 4, "write": N * N * 4}


def test_each_kernel_is_measured_on_the_unit_doing_its_work(unfused):
    relu, matmul, transpose = unfused["kernels"].values()
    assert matmul["macs"] == N ** 3 and matmul["vector_elements"] == 0
    assert 0 < matmul["array_utilization"] <= 1 and matmul["vector_utilization"] == 0
    assert matmul["bound"] == "compute" and matmul["arithmetic_intensity"] > 10
    assert relu["vector_elements"] == N * N and relu["macs"] == 0
    assert 0 < relu["vector_utilization"] <= 1 and relu["array_utilization"] == 0
    # one element per 8 bytes, against the vector units' 2 x 16 elements per 100 bytes a cycle
    assert relu["bound"] == "bandwidth" and relu["arithmetic_intensity"] == 1 / 8
    assert transpose["bound"] == "data movement" and transpose["arithmetic_intensity"] is None
    assert transpose["array_utilization"] == transpose["vector_utilization"] == 0


def test_an_epilogue_adds_its_ops_and_vector_work_to_its_kernel():
    s = profile([("MATMUL", ["x", "w"], {}), ("RELU", ["t0"], {})], SHAPES, fuse=True)
    (kernel,) = s["kernels"].values()
    assert kernel["op"] == "MATMUL+RELU"
    assert kernel["macs"] == N ** 3 and kernel["vector_elements"] == N * N
    assert kernel["array_utilization"] > 0 and kernel["vector_utilization"] > 0
    assert kernel["bound"] == "compute"  # the array's work decides


def test_table_lists_every_kernel_costliest_first_within_120_columns(unfused):
    rows = by_cycles(unfused["kernels"])
    assert [name for name, _ in rows] == ["matmul_1", "transpose_2", "relu_0"]
    assert [k["cycles"] for _, k in rows] == sorted((k["cycles"] for _, k in rows), reverse=True)
    console = Console(width=120, record=True)
    console.print(kernel_table(unfused))
    lines = console.export_text().splitlines()
    assert " ".join(lines[1].split()) == HEADER
    body = [l.split()[0] for l in lines if l.split() and l.split()[0] in unfused["kernels"]]
    assert body == [name for name, _ in rows]
    assert max(len(l.rstrip()) for l in lines) <= 120


def test_cli_profile_prints_the_kernel_table(tmp_path):
    obj = tmp_path / "chain.kpu"
    program = compiled(CHAIN, SHAPES, fuse=False)
    obj.write_bytes(dumps(program))
    proc = run_cli("loader", obj, "--config", STANDARD, "--timing-only", "--profile")
    assert proc.returncode == 0, proc.stderr
    assert "kernels, by cycles" in proc.stderr
    assert HEADER in " ".join(proc.stderr.split())
    # the budget line: the chain's inputs, constants and outputs once, f32
    compulsory = sum(4 * math.prod(t.shape) for t in program.graph.tensors.values()
                     if t.role in ("input", "constant", "output"))
    budget = " ".join(proc.stderr.split()).split("Budget: ")[1]
    assert f"the compulsory {compulsory:,} (graph inputs, outputs, constants once)" in budget


def _each_busy_cycle_is_a_stages(s: dict) -> None:
    """Every cycle a unit worked is some stage's: the stages' shares times the machine's units of
    that kind and their cycles add up to the units' busy cycles, read off `units` by name."""
    counts = load_machine(STANDARD).unit_counts()
    for unit in STAGE_UNITS:
        held = sum(st["busy"][unit] * counts[unit] * st["cycles"] for st in s["stages"])
        worked = sum(u["busy_cycles"] for name, u in s["units"].items()
                     if name.rstrip("0123456789") == UNIT_PREFIX[unit])
        assert held == pytest.approx(worked, rel=1e-9)


def test_unchained_kernels_are_a_stage_each_holding_the_units_their_tasks_held(unfused):
    stages = unfused["stages"]
    assert [st["kernels"] for st in stages] == [[name] for name in unfused["kernels"]]
    for st, k in zip(stages, unfused["kernels"].values()):
        assert (st["start_cycle"], st["end_cycle"], st["cycles"]) == (k["end_cycle"] - k["cycles"], k["end_cycle"],
                                                                       k["cycles"])
        assert st["dram_bytes"] == k["dram_bytes"]
    relu, matmul, transpose = stages
    # the ReLU and the transpose wait on external memory, the matmul on its arrays
    assert (relu["busiest"], matmul["busiest"], transpose["busiest"]) == ("dma", "array", "dma")
    assert relu["busy"]["array"] == transpose["busy"]["array"] == matmul["busy"]["vector"] == 0
    _each_busy_cycle_is_a_stages(unfused)


def test_a_chains_kernels_are_one_stage_whose_units_worked_at_once():
    """MobileNet's block chained by energy, then a reduction of its result on its own: the
    block's three kernels run at once, so their own cycles add up to well over their stage's,
    which covers them all, and its arrays and vector units were both busy within it; the
    reduction is a stage of its own after it."""
    target = load_target(STANDARD, objective="energy")
    ops = BLOCK + [("REDUCE_SUM", ["t2"], {"axes": [1, 2], "keepdims": True})]
    program = loads(dumps(compile_graph(graph_of(ops, BLOCK_SHAPES), "block.dfg", target)))
    (chain,) = program.chains
    assert chain == [k.name for k in program.kernels[:3]]
    s = profile(None, None, program=program)
    block, reduction = s["stages"]
    assert block["kernels"] == chain and reduction["kernels"] == [program.kernels[3].name]
    kernels = [s["kernels"][name] for name in chain]
    assert sum(k["cycles"] for k in kernels) > 1.5 * block["cycles"]
    assert block["start_cycle"] == min(k["end_cycle"] - k["cycles"] for k in kernels)
    assert block["end_cycle"] == max(k["end_cycle"] for k in kernels) <= reduction["end_cycle"] == s["cycles"]
    assert block["busy"]["array"] > 0.2 and block["busy"]["vector"] > 0.2
    assert (block["busiest"], reduction["busiest"]) == ("vector", "vector")  # the depthwise's 9 taps, the sums
    assert {way: block["dram_bytes"][way] + reduction["dram_bytes"][way] for way in ("read", "write")} \
        == s["dram_bytes"]
    _each_busy_cycle_is_a_stages(s)
    console = Console(width=120, record=True)
    console.print(stage_table(s))
    lines = console.export_text().splitlines()
    assert " ".join(lines[1].split()) == "stage cycles share array vector dma bm str DRAM busiest"
    assert any(l.split()[:3] == [chain[0], "..", chain[-1]] for l in lines)
    assert max(len(l.rstrip()) for l in lines) <= 120
