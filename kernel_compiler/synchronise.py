"""Synchronisation made explicit, as PTX makes it: a BARRIER wherever a kernel reads a tensor an
earlier kernel wrote to external memory.

Each such kernel gets, at the head of its body, one barrier per producing kernel, waiting for the
producer's ops that write those tensors (its stores to external memory, or the view that names
them), and every move of the kernel that reads one of those tensors from external memory (as its
source or as the index tensor it reads its source through) depends on it. Nothing else orders
kernels: the loader turns a barrier into a dependency on the last instance of each op it lists on
every compute tile, and the validator refuses a read that no barrier orders. But a link of a
chain (`Program.chains`): its reads get no barrier, the loader orders them after the writes of
their rows.
"""

from __future__ import annotations

import dataclasses

from dfx import Barrier, DataMove, Kernel


def writes(kernel: Kernel) -> dict[str, list[int]]:
    """Tensor -> ids of the kernel's ops that put it in external memory."""
    out: dict[str, list[int]] = {}
    for op in kernel.body:
        if isinstance(op, DataMove) and op.destination.level == "EXTERNAL":
            out.setdefault(op.destination.tensor, []).append(op.op_id)
    return out


def _renumbered(op, shift: int):
    return dataclasses.replace(op, op_id=op.op_id + shift, depends_on=[d + shift for d in op.depends_on])


def synchronise(kernels: list[Kernel], links: frozenset[str] = frozenset()) -> None:
    """Insert the barriers, in place; kernels in execution order. `links`: the link tensors of the
    chains, whose reads need none."""
    written: dict[str, tuple[str, list[int]]] = {}  # tensor -> (kernel, its ops writing it)
    for kernel in kernels:
        producers: dict[str, set[int]] = {}
        for op in kernel.body:
            for tensor in op.external_reads() if isinstance(op, DataMove) else []:
                if tensor in written and tensor not in links:
                    name, ops = written[tensor]
                    producers.setdefault(name, set()).update(ops)
        barriers = [Barrier(i, sorted(ops), name) for i, (name, ops) in enumerate(sorted(producers.items()))]
        if barriers:
            barrier_of = {b.kernel: b.op_id for b in barriers}
            body = [_renumbered(op, len(barriers)) for op in kernel.body]
            for op in body:
                for tensor in op.external_reads() if isinstance(op, DataMove) else []:
                    barrier = barrier_of.get(written[tensor][0]) if tensor in written and tensor not in links else None
                    if barrier is not None and barrier not in op.depends_on:
                        op.depends_on.append(barrier)
            kernel.body = barriers + body
        for tensor, ops in writes(kernel).items():
            written[tensor] = (kernel.name, ops)
