"""Random GEMM shapes, targets and dataflows: the tiled execution equals numpy, the DRAM bytes
the simulator moves equal the compiler's exact count, and binding never fails on the target the
program was compiled for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CONFIGS, gemm_dfg
from hardware import load_machine
from kernel_compiler import compile_graph, load_graph, load_target
from loader import bind_greedy, bind_program, execute, generated, simulate


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 300), N=st.integers(1, 300), K=st.integers(1, 300),
       config=st.sampled_from(["minimal", "standard", "datacenter"]),
       dataflow=st.sampled_from(["auto", "os", "ws", "is"]))
def test_random_gemm(tmp_path_factory, M, N, K, config, dataflow):
    src = tmp_path_factory.mktemp("g") / "g.dfg"
    src.write_text(gemm_dfg(M, N, K))
    graph, _ = load_graph(str(src))
    program = compile_graph(graph, str(src), load_target(str(CONFIGS / f"{config}.json")), dataflow)
    machine = load_machine(str(CONFIGS / f"{config}.json"))
    bindings = bind_program(program, machine, "g.kpu", bind_greedy)
    a, b = (generated(program.graph.tensors[n], 1) for n in ("A", "B"))
    c = execute(program, bindings, {"A": a, "B": b})["C"]
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    sim = simulate(program, machine, bindings)
    dram = sim.bytes_moved.get("EXTERNAL->L3", 0) + sim.bytes_moved.get("L3->EXTERNAL", 0)
    assert dram == program.kernels[0].hints["estimated_dram_bytes"]
    assert sim.macs == M * N * K
