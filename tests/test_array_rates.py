"""The MACs a PE does per cycle by operand dtype (`timing.array_macs_per_pe_cycle`): one in every
dtype unless the config says otherwise; a PE packing four 8-bit products streams K four elements a
cycle, which the simulator's array times and the report's utilization counts."""

from __future__ import annotations

import json
import math

import pytest

from conftest import CONFIGS, ROOT
from hardware import ConfigError, Simulator, Task, machine_from_dict
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.target import load_target
from loader import RunResult, bind_greedy, bind_program
from loader.report import summary
from loader.run import simulate

STANDARD = CONFIGS / "standard.json"


def standard(**rates) -> dict:
    document = json.loads(STANDARD.read_text())
    if rates:
        document["timing"]["array_macs_per_pe_cycle"] = rates
    return document


def array_cycles(machine, **task) -> int:
    result = Simulator(machine).run([Task(0, "array", 0, (), **task)])
    return result.cycles


def test_one_mac_per_pe_cycle_in_every_dtype_by_default():
    machine = machine_from_dict(standard(), "standard.json")
    assert set(machine.compute.macs_per_pe_cycle.values()) == {1}
    # output stationary, one 16x16 block: k cycles of operands and the 16 + 16 - 2 skew
    assert array_cycles(machine, m=16, n=16, k=256, dtype="i8") == 256 + 30
    assert array_cycles(machine, m=16, n=16, k=256, dtype="f32") == 256 + 30


def test_four_8_bit_macs_a_cycle_stream_k_four_times_as_fast():
    machine = machine_from_dict(standard(i8=4, u8=4), "int8.json")
    assert array_cycles(machine, m=16, n=16, k=256, dtype="i8") == 64 + 30
    assert array_cycles(machine, m=16, n=16, k=258, dtype="u8") == 65 + 30  # ceil(258 / 4)
    assert array_cycles(machine, m=16, n=16, k=256, dtype="f32") == 256 + 30  # floats as before
    # weight stationary: folds of 16 rows x 4 elements of K, each loading 16 rows then m with the skew
    assert array_cycles(machine, m=40, n=16, k=256, dtype="i8", dataflow="weight_stationary") == 4 * (16 + 40 + 30)


@pytest.mark.parametrize("value", [0, 65, 2.5, "4"])
def test_a_bad_rate_is_one_line_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"timing\.array_macs_per_pe_cycle\.i8.*a positive integer up to 64"):
        machine_from_dict(standard(i8=value), "bad.json")


def test_the_report_counts_int8_work_at_the_machine_rate(tmp_path):
    """int8 resnet18 (QDQ) on standard with 8-bit PEs at 4 MACs a cycle: fewer cycles than at 1,
    the same MACs, and its arrays' utilization against the peak at that rate stays a share."""
    path = ROOT / "examples" / "zoo" / "resnet18.qdq_per_channel.onnx"
    graph, warnings = load_graph(str(path))
    program = compile_graph(graph, str(path), load_target(str(STANDARD)), warnings=warnings)
    runs = {}
    for rate in (1, 4):
        machine = machine_from_dict(standard(i8=rate, u8=rate), f"int8x{rate}.json")
        result = RunResult(bind_program(program, machine, "test", bind_greedy))
        result.sim = simulate(program, machine, result.bindings)
        runs[rate] = summary(result, program, "test.kpu", machine, {})
    assert runs[4]["macs"] == runs[1]["macs"] and runs[4]["cycles"] < runs[1]["cycles"]
    ops = {op.name: op for op in program.graph.ops}
    peak = 2 * 16 * 16  # standard's arrays
    for rate, run in runs.items():
        # each kernel's MACs at its operands' rate: every contraction of this model multiplies 8-bit integers
        eight_bit = {k.name for k in program.kernels if all(
            program.graph.tensors[t].dtype in ("i8", "u8") for t in ops[k.graph_op].inputs[:2])}
        work = sum(k["macs"] / (rate if name in eight_bit else 1) for name, k in run["kernels"].items())
        assert work < run["macs"] or rate == 1
        assert run["utilization"] == pytest.approx(work / (run["cycles"] * peak))
        assert run["budget"]["cycle_bound"] >= math.ceil(work / peak)
        assert all(k["utilization"] <= 1 and k["array_utilization"] <= 1 for k in run["kernels"].values())
