"""Random GEMM shapes, targets and dataflows: the tiled execution equals numpy, the DRAM bytes
the simulator moves equal the compiler's exact count, and binding never fails on the target the
program was compiled for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CONFIGS, examples, gemm_dfg
from hardware import load_machine
from kernel_compiler import compile_graph, load_graph, load_target
from loader import bind_greedy, bind_program, execute, generated, simulate


@settings(max_examples=examples(25))
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
    # every product once: on the array, or on the vector unit where the compiler took a product
    # of one row there (a multiply-add each)
    on_vector = sim.phases[0].vector_work.get("simple", 0) if program.kernels[0].dataflow == "vector" else 0
    assert sim.macs + on_vector == M * N * K


def matmul_dfg(a: tuple[int, ...], b: tuple[int, ...], cin: tuple[int, ...] | None) -> str:
    """A one-MATMUL .dfg with any operand shapes (batched, broadcast, with an accumulator)."""
    out = np.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1])
    t = lambda s: "tensor<" + "x".join(map(str, s)) + "xf32>"  # noqa: E731
    shapes = [a, b] + ([cin] if cin else [])
    consts = [f"NODE {i} : |const.{n}|CONSTANT|0|||0:{n}|0:{t(s)}" for i, (n, s) in enumerate(zip("ABX", shapes))]
    m = len(shapes)
    operands = ",".join(f"{i}:{t(s)}" for i, s in enumerate(shapes))
    edges = [f"EDGE {i} -> {m} : 0|true|{t(s)}|32|0|{i}|1,1,1" for i, s in enumerate(shapes)]
    return "\n".join(["Domain Flow Graph: mm", "DIRECTED", f"RUNNING_NODE_ID {m + 1}", f"NODES {m + 2}", *consts,
                      f"NODE {m} : |matmul|MATMUL|1|{operands}||0:C|0:{t(out)}",
                      f"NODE {m + 1} : |C|FUNCTION_RETURN|2|0:{t(out)}|target:memory|0:C|0:{t(out)}",
                      f"EDGES {m + 1}", *edges, f"EDGE {m} -> {m + 1} : 0|false|{t(out)}|32|0|0|1,1,1"])


@settings(max_examples=examples(25))
@given(M=st.integers(1, 70), N=st.integers(1, 70), K=st.integers(1, 70), batch=st.integers(1, 3),
       a_batched=st.booleans(), b_batched=st.booleans(), cin=st.sampled_from([None, "row", "full", "batched"]))
def test_random_batched_matmul_with_accumulator(tmp_path_factory, M, N, K, batch, a_batched, b_batched, cin):
    a = (batch, M, K) if a_batched else (M, K)
    b = (batch, K, N) if b_batched else (1, K, N)
    out_batch = np.broadcast_shapes(a[:-2], b[:-2])
    cin_shape = {None: None, "row": (N,), "full": (M, N), "batched": out_batch + (M, N)}[cin]
    src = tmp_path_factory.mktemp("m") / "m.dfg"
    src.write_text(matmul_dfg(a, b, cin_shape))
    graph, _ = load_graph(str(src))
    program = compile_graph(graph, str(src), load_target(str(CONFIGS / "minimal.json")))
    machine = load_machine(str(CONFIGS / "minimal.json"))
    inputs = {t.name: generated(t, 2) for t in program.graph.inputs}
    c = execute(program, bind_program(program, machine, "m.kpu", bind_greedy), inputs)["C"]
    want = inputs["A"] @ inputs["B"] + (inputs["X"] if cin else 0)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)
