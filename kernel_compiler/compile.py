"""The compiler pipeline: graph -> fusion groups -> one DFX kernel per group, in execution order."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterator

from dfx import Graph, Kernel, Op, Program, itemsize, lookup
from dfx.graph import INT64_MAX

from .chains import form_chains
from .errors import CompileError
from .fuse import fusion_groups
from .lower_conv import lower_conv
from .lower_gemv import gemv_dims, lower_gemv, preferred
from .lower_layout import lower_layout
from .lower_matmul import lower_matmul
from .lower_vector import lower_vector_op
from .lower_window import lower_window
from .passes import canonicalise, global_pools, products_by_rows, split_long_rows
from .residency import keep_on_chip
from .synchronise import synchronise
from .target import Target


def lower_contraction(graph: Graph, ops: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    """On the array: a sliding-window contraction (CONV2D) as an implicit GEMM, else a MATMUL. A
    contraction of one row (`gemv_dims`), its dataflow left to the compiler, on the vector unit
    where the target's objective prefers that kernel (`lower_gemv.preferred`)."""
    lowering = lower_conv if lookup(ops[0].op_type).windows is not None else lower_matmul
    on_array = lowering(graph, ops, name, target, dataflow)
    dims = gemv_dims(graph, ops[0]) if dataflow == "auto" and target.costs is not None else None
    if dims is None:
        return on_array
    on_vector = lower_gemv(graph, ops, name, target, dims)
    return on_array if on_vector is None else preferred([on_array, on_vector], graph, target)


# the anchor's op family (the registry's) -> lowering of a group [anchor, *epilogue]; an op whose
# family has none, or that computes without a tile meaning in the registry (LINEAR), parses and
# checks but does not compile yet. Layout ops compute nothing: their kernels are data moves.
LOWERINGS: dict[str, Callable[[Graph, list[Op], str, Target, str], Kernel]] = {
    "contraction": lower_contraction,
    "map": lower_vector_op,
    "reduction": lower_vector_op,
    "window": lower_window,
    "layout": lower_layout,
}


def lower_group(graph: Graph, group: list[Op], name: str, target: Target, dataflow: str) -> Kernel:
    op = group[0]
    opdef = lookup(op.op_type)
    lowers = opdef is not None and (opdef.tile is not None or opdef.family == "layout")
    lowering = LOWERINGS.get(opdef.family) if lowers else None
    if lowering is None:
        raise CompileError(f"{op.source or op.name}: op '{op.name}' ({op.op_type}) has no lowering yet")
    return lowering(graph, group, name, target, dataflow)


def kernel_name(op: Op, index: int) -> str:
    return f"{op.op_type.lower()}_{index}"


def _counts(d: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, int]]:
    """(dotted key, value) of every integer in a nested dict."""
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _counts(value, f"{prefix}{key}.")
        elif isinstance(value, int):
            yield f"{prefix}{key}", value


def _check_counts(kernel: Kernel, where: str) -> None:
    # the object file holds signed 64-bit integers only; a count beyond that is a problem too
    # large for any machine, not something to truncate
    for section in ("hints", "requirements"):
        for key, value in _counts(getattr(kernel, section)):
            if value > INT64_MAX:
                raise CompileError(f"{where}: kernel '{kernel.name}': {section} '{key}' is {value}, beyond a "
                                   f"signed 64-bit integer; the problem is too large")


def graph_passes(graph: Graph, target: Target, fuse: bool, warnings: list[str]) -> Graph:
    """The graph after the passes, in order; why a chain stays as ops goes to `warnings`."""
    graph = canonicalise(graph, warnings, fuse)  # frontend spellings -> primitives; chains -> one op
    # a sum or a mean over H and W of an image -> the window op over all of it, where one fits
    graph = global_pools(graph, functools.partial(_pool_fits, target), warnings)
    # a batch of products by one B -> one product of the batch's rows, where its kernel costs less
    graph = products_by_rows(graph, functools.partial(_rows_pay, target), warnings)
    # rows too long for a tile of the target -> chains that lower (after RECOGNISE, which would
    # fold them back; before fusion, which fuses them)
    return split_long_rows(graph, target, fuse)


def _pool_fits(target: Target, graph: Graph, pool: Op) -> bool:
    """Whether a tiling of the window op `pool` (its operands in `graph`) fits the target."""
    try:
        lower_window(graph, [pool], pool.name, target, "auto")
    except CompileError:
        return False
    return True


def _rows_pay(target: Target, graph: Graph, batched: Op, rows: Op) -> bool:
    """Whether the MATMUL of the batch's rows, as its own kernel, is the one of the two the
    target's objective prefers (`lower_gemv.preferred`); without the costs to weigh them by, or
    where one of them fits no tiling, the batch stays as it was given. A B larger than L3 is read
    once per element of the batch: the rows pay, unweighed (lowering both for each of Swin-T's 47
    took 1.6 s of its compile)."""
    b = graph.tensors[batched.inputs[1]]
    if b.size * itemsize(b.dtype) > target.l3.bank_bytes * target.compute_tiles:
        return True
    if target.costs is None:
        return False
    try:
        kernels = [lower_matmul(graph, [op], op.name, target, "auto") for op in (batched, rows)]
    except CompileError:
        return False
    return preferred(kernels, graph, target) is kernels[1]


def lower_kernels(graph: Graph, target: Target, dataflow: str, fuse: bool) -> Iterator[Kernel | CompileError]:
    """Each fusion group's kernel, in execution order, or why it does not lower."""
    for i, group in enumerate(fusion_groups(graph, fuse)):
        try:
            yield lower_group(graph, group, kernel_name(group[0], i), target, dataflow)
        except CompileError as e:
            yield e


def compile_graph(graph: Graph, source: str, target: Target, dataflow: str = "auto", fuse: bool = True,
                  warnings: list[str] | None = None, keep: bool = True, chain: bool = True) -> Program:
    """The whole pipeline on a frontend's graph: passes, fusion, lowering, chains, homes in L3, barriers."""
    # an empty program would "run" and report nothing: refuse it here, as the object reader does
    if not graph.ops:
        raise CompileError(f"{source}: graph '{graph.name}': has no ops, there is nothing to compile")
    if not graph.outputs:
        raise CompileError(f"{source}: graph '{graph.name}': has no outputs, nothing it computes would be kept")
    graph = graph_passes(graph, target, fuse, warnings if warnings is not None else [])
    kernels: list[Kernel] = []
    producer: dict[str, str] = {}
    ops = {op.name: op for op in graph.ops}
    for kernel in lower_kernels(graph, target, dataflow, fuse):
        if isinstance(kernel, CompileError):
            raise kernel
        _check_counts(kernel, ops[kernel.graph_op].source or kernel.graph_op)
        kernel.depends_on = sorted({producer[t] for t in kernel.inputs if t in producer})
        for t in kernel.outputs:
            producer[t] = kernel.name
        kernels.append(kernel)
    chains, links, shallower = [], frozenset(), {}
    if fuse and keep and chain:  # window kernels that pay run band by band at once, their links on chip or not
        graph, chains, links, shallower = form_chains(kernels, graph, target,
                                                      functools.partial(lower_group, dataflow=dataflow))
    if keep:  # intermediates that fit stay in L3
        graph = keep_on_chip(kernels, graph, target, chains, shallower)
    synchronise(kernels, links)  # a chain's reads of its links wait for their bands, not for a barrier
    return Program(graph.name, Path(source).name, target.name, graph, kernels, target.objective, chains)
