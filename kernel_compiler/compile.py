"""The compiler pipeline: graph -> one DFX kernel per op, in execution order."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dfx import Graph, Kernel, Op, Program

from .errors import CompileError
from .lower_matmul import lower_matmul
from .target import Target

# op registry name -> lowering; an op missing here parses and checks but does not compile yet
LOWERINGS: dict[str, Callable[[Graph, Op, str, Target, str], Kernel]] = {
    "MATMUL": lower_matmul,
}


def lower_op(graph: Graph, op: Op, name: str, target: Target, dataflow: str) -> Kernel:
    lowering = LOWERINGS.get(op.op_type)
    if lowering is None:
        raise CompileError(f"{op.source or op.name}: op '{op.name}' ({op.op_type}) has no lowering yet")
    return lowering(graph, op, name, target, dataflow)


def kernel_name(op: Op, index: int) -> str:
    return f"{op.op_type.lower()}_{index}"


def compile_graph(graph: Graph, source: str, target: Target, dataflow: str = "auto") -> Program:
    kernels: list[Kernel] = []
    producer: dict[str, str] = {}
    for i, op in enumerate(graph.ops):
        kernel = lower_op(graph, op, kernel_name(op, i), target, dataflow)
        kernel.depends_on = sorted({producer[t] for t in op.inputs if t in producer})
        for t in op.outputs:
            producer[t] = kernel.name
        kernels.append(kernel)
    return Program(graph.name, Path(source).name, target.name, graph, kernels)
