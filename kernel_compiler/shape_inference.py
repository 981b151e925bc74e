"""Shape inference: derive every op's output shapes from its inputs with the op registry.

Frontends record the shapes their source declares; those are often wrong in real `.dfg` files
(matmul_linear's sigmoid declares [16] for a [4, 16] result), so a derived shape wins and the
disagreement becomes a warning. Dtypes stay as declared: mixed-precision chains are intended.
Each op's attributes are checked here too (`OpDef.normalize_attrs`), once for both frontends;
the op keeps them as the frontend gave them, and the users of an op normalize them again.
"""

from __future__ import annotations

from dfx import ops as registry
from dfx.graph import Graph, Op, shape_problem

from .errors import CompileError


def infer_shapes(graph: Graph, warnings: list[str]) -> Graph:
    """Walk the ops in order and set their output shapes; ops the registry lacks keep theirs."""
    for op in graph.ops:
        opdef = registry.lookup(op.op_type)
        if opdef is not None:
            _infer_op(graph, op, opdef, warnings)
    return graph


def _infer_op(graph: Graph, op: Op, opdef: registry.OpDef, warnings: list[str]) -> None:
    if not opdef.min_inputs <= len(op.inputs) <= opdef.max_inputs:
        raise CompileError(f"{op.source}: {op.op_type} takes {_arity(opdef)}, got {len(op.inputs)}")
    inputs = [graph.tensors[name] for name in op.inputs]
    try:
        attrs = opdef.normalize_attrs(op.attrs)
        derived = opdef.infer_shapes([t.shape for t in inputs], [t.dtype for t in inputs], attrs)
    except registry.ShapeError as exc:
        raise CompileError(f"{op.source}: {exc}") from None
    if len(derived) != len(op.outputs):
        raise CompileError(f"{op.source}: {op.op_type} produces {len(derived)} results, the op lists {len(op.outputs)}")
    for name, shape in zip(op.outputs, derived):
        tensor = graph.tensors[name]
        shape = tuple(int(d) for d in shape)
        problem = shape_problem(shape)  # a broadcast or a product can outgrow its operands
        if problem:
            raise CompileError(f"{op.source}: result '{name}': {problem}")
        if tensor.shape != shape:
            warnings.append(f"{op.source}: declared shape {list(tensor.shape)} of '{name}' disagrees with the "
                            f"derived {list(shape)}; using the derived shape")
            tensor.shape = shape


def _arity(opdef: registry.OpDef) -> str:
    if opdef.max_inputs == registry.VARIADIC:
        return f"{opdef.min_inputs} or more operands"
    if opdef.min_inputs == opdef.max_inputs:
        return f"{opdef.min_inputs} operand" + ("" if opdef.min_inputs == 1 else "s")
    return f"{opdef.min_inputs} to {opdef.max_inputs} operands"
