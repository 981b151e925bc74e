"""Every corpus graph compiles, runs on `standard` and passes --check: each kernel against its
op's reference, each output end to end. Those without a convolution through the two CLIs, their
outputs also against numpy computed here from the same inputs; those with one (MobileNets and
TOSA's MLPs, written as 1x1 convolutions) in-process, as the loader's --check runs them."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from conftest import CONFIGS, DATA, run_cli
from dfx import dumps, loads, numpy_dtype, read
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute, simulate
from loader.inputs import program_inputs
from loader.report import dram_bytes
from loader.run import check_kernels, check_outputs
from test_frontend_ops import REFUSED

STANDARD = str(CONFIGS / "standard.json")

CONVOLUTIONS = ("dfg__mobilenet", "tosa__oneLayerMLP", "tosa__twoLayerMLP")
# refused with its reason (test_cli_errors): a LINEAR with one of three operands wired
BROKEN = ("workloads__oneLayerMLP.dfg",)
CORPUS = sorted(p.name for p in (DATA / "dfg").iterdir() if p.suffix in (".dfg", ".json"))
GRAPHS = [name for name in CORPUS if not name.startswith(CONVOLUTIONS) and name not in BROKEN]
CONVOLUTION_GRAPHS = [name for name in CORPUS if name.startswith(CONVOLUTIONS) and name not in BROKEN]


def numpy_eval(graph, values):
    """The graph computed with numpy alone, for the ops the corpus uses: each op in float64,
    its result rounded to its dtype as the graph declares."""
    unary = {"SIGMOID": lambda x: 1 / (1 + np.exp(-x)), "RELU": lambda x: np.maximum(x, 0)}
    v = {n: a.astype(np.float64) for n, a in values.items()}
    for op in graph.ops:
        x = [v[n] for n in op.inputs]
        if op.op_type == "MATMUL":
            b = np.swapaxes(x[1], -1, -2) if op.attrs.get("transpose_b") else x[1]
            y = x[0] @ b + (x[2] if len(x) == 3 else 0)
        elif op.op_type == "ADD":
            y = x[0] + x[1]
        else:
            y = unary[op.op_type](x[0])
        v[op.outputs[0]] = y.astype(numpy_dtype(graph.tensors[op.outputs[0]].dtype)).astype(np.float64)
    return v


@pytest.mark.parametrize("name", GRAPHS)
def test_corpus_graph_runs_and_checks(name, tmp_path):
    obj, out = tmp_path / "g.kpu", tmp_path / "out"
    compiled = run_cli("compiler", DATA / "dfg" / name, "-o", obj)
    assert compiled.returncode == 0, compiled.stderr
    proc = run_cli("loader", obj, "--config", CONFIGS / "standard.json", "--check", "--json", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["check"]["passed"] and all(k["passed"] for k in report["check"]["kernels"].values())
    program = read(obj)
    from loader.inputs import program_inputs

    want = numpy_eval(program.graph, program_inputs(program, {}, 0))
    # the loosest dtype along the way: a one-ulp difference in an f8 intermediate carries on
    tol = max({"f64": 1e-9, "f32": 1e-4}.get(t.dtype, 0.2) for t in program.graph.tensors.values())
    for t in program.graph.outputs:
        got = np.load(report["outputs"][t.name]).astype(np.float64)
        np.testing.assert_allclose(got, want[t.name], rtol=tol, atol=tol * np.abs(want[t.name]).mean())


def test_every_corpus_graph_but_the_refused_one_is_run():
    assert set(BROKEN) == REFUSED  # the one the frontend refuses (test_frontend_ops)
    assert set(GRAPHS) | set(CONVOLUTION_GRAPHS) == set(CORPUS) - set(BROKEN)
    assert not set(GRAPHS) & set(CONVOLUTION_GRAPHS)
    assert {"dfg__mobilenet_v1.dfg", "dfg__mobilenet_v2.dfg", "dfg__mobilenet_v2_tosa.dfg"} <= set(CONVOLUTION_GRAPHS)


@pytest.mark.parametrize("name", CONVOLUTION_GRAPHS)
def test_corpus_convolution_graph_runs_and_checks(name):
    """As `kpu-kernel-compiler NAME && kpu-loader --config standard.json --check` (loader/cli.py):
    compiled, written and read back, bound, simulated, executed from the seeded inputs and the
    graph's constants, then every kernel and every output checked."""
    graph, _ = load_graph(str(DATA / "dfg" / name))
    program = loads(dumps(compile_graph(graph, name, load_target(STANDARD))))
    machine = load_machine(STANDARD)
    bindings = bind_program(program, machine, name, bind_greedy)
    sim = simulate(program, machine, bindings)
    assert sim.cycles > 0
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())
    values = execute(program, bindings, program_inputs(program, {}, 0))

    kernel_checks = check_kernels(program, values)
    assert list(kernel_checks) == [k.name for k in program.kernels]
    assert [k for k, c in kernel_checks.items() if not c.passed] == []
    output_checks = check_outputs(program, values)
    assert list(output_checks) == [t.name for t in program.graph.outputs] != []
    assert [t for t, c in output_checks.items() if not c.passed] == []
    for t in program.graph.outputs:
        assert np.isfinite(values[t.name]).all(), t.name
    anchors = Counter(k.op for k in program.kernels)
    assert anchors["CONV2D"] >= 1
    # a chained kernel on the vector unit takes whole rows of its output a tile (a few outputs a
    # tile, and its moves set its pace: MobileNet v2's dw10 took 4 x 8); a classifier's product of
    # one row (no "C") has one output position
    chained = {name for chain in program.chains for name in chain}
    assert [k.name for k in program.kernels if k.name in chained and k.dataflow == "vector"
            and k.tiling.get("C", math.inf) < program.graph.tensors[k.outputs[0]].shape[2]] == []
    if name == "dfg__mobilenet_v1.dfg":
        assert (anchors["CONV2D"], anchors["DEPTHWISE_CONV2D"]) == (15, 13)
        # its last 14 x 14 pointwise and the depthwise after it chain: they save 5.8% of what
        # they cost apart, though far less of the network's cycles up to them
        assert ["conv2d_22", "depthwise_conv2d_23"] in program.chains
        # each 14 x 14 pointwise (its whole input in L3, 1 MB of weights) chains with the
        # depthwise after it by channels, the link between them a ring of channels in L3
        for pointwise, depthwise in (("conv2d_14", "depthwise_conv2d_15"), ("conv2d_20", "depthwise_conv2d_21")):
            assert [pointwise, depthwise] in program.chains
            link = program.graph.tensors[next(k for k in program.kernels if k.name == pointwise).outputs[0]]
            assert (link.home, link.ring_dim) == ("L3", 3) and link.ring < link.shape[3]
