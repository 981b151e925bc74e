"""Intermediates kept on chip: which tensors stay in L3 between the kernel that writes them and
the kernels that read them, instead of crossing the external memory link twice.

A kernel writes its result to external memory (L3 -> EXTERNAL) and the next reads it back
(EXTERNAL -> L3). Where the target's L3 holds the whole tensor beside the L3 buffers of every
kernel it lives across (`dfx.pack_homes`, the rule the loader binds by), the tensor's `home`
becomes L3. The kernels stay as they are: their moves between external memory and L3 of that
tensor now name its home, which the loader runs in place (the L3 tile is that region of the
home) or, for a padded band, as a BlockMover copy that writes the padding. So the object still
runs where a machine has less L3: there the loader keeps the tensor in external memory.
"""

from __future__ import annotations

import dataclasses
import math

from dfx import DataMove, Graph, Kernel, Resident, itemsize, pack_homes
from dfx.kernel import IndexTensor

from .target import Target


def _workers(kernel: Kernel, compute_tiles: int) -> int:
    """Compute tiles the kernel runs on (as the loader deals them): one per parallel step at most."""
    for loop in kernel.tile_loops:
        if loop.parallel:
            return max(1, min(compute_tiles, loop.trip_count, loop.per_block or loop.trip_count))
    return 1


def l3_demand(kernel: Kernel, graph: Graph, target: Target) -> int:
    """The bytes of L3 the kernel's buffers take, in whole lines, on all its compute tiles: a
    shared load once, every other buffer once per compute tile."""
    shared, workers, line = kernel.shared_moves(), _workers(kernel, target.compute_tiles), target.line_bytes
    total = 0
    for op in kernel.body:
        if not isinstance(op, DataMove) or op.move_type == "VIEW" or op.destination.level != "L3":
            continue
        tile = math.prod(op.destination.tile_shape) * itemsize(graph.tensors[op.destination.tensor].dtype)
        total += -(-tile * op.depth // line) * line * (1 if op.op_id in shared else workers)
    return total


def _movable(kernels: list[Kernel]) -> set[str]:
    """The tensors every move of which between external memory and L3 could instead name a home
    in L3: none is a view's, nor an index tensor read at run time, nor read through a table."""
    barred: set[str] = set()
    for k in kernels:
        for op in k.body:
            if not isinstance(op, DataMove):
                continue
            if op.move_type == "VIEW" or op.source.table is not None:
                barred.update((op.source.tensor, op.destination.tensor))
            if isinstance(op.source.table, IndexTensor):
                barred.add(op.source.table.tensor)
    return {t for k in kernels for t in k.outputs} - barred


def _without(kernel: Kernel, tensors: dict[str, int]) -> dict:
    """A kernel's hints once `tensors` (name -> bytes) no longer cross external memory."""
    hints = kernel.hints
    # a matmul's streams are named by operand, every other kernel's by tensor
    named = dict(zip(("A", "B", "Cin"), kernel.inputs)) | {"C": kernel.outputs[0]} if kernel.op == "MATMUL" else {}
    per_stream = {t: b for t, b in hints["dram_bytes_per_stream"].items() if named.get(t, t) not in tensors}
    dram = sum(per_stream.values())
    out = {**hints, "estimated_dram_bytes": dram, "dram_bytes_per_stream": per_stream,
           "compulsory_dram_bytes": hints["compulsory_dram_bytes"] - sum(tensors.values())}
    if "arithmetic_intensity" in hints:
        out.pop("arithmetic_intensity")
        if dram:
            out["arithmetic_intensity"] = round(2 * hints["macs"] / dram, 3)
    return out


def keep_on_chip(kernels: list[Kernel], graph: Graph, target: Target) -> Graph:
    """The graph with a home in L3 for each intermediate that fits there across its kernels, in
    the order they are written; each kernel's DRAM hints without them. Kernels in execution order."""
    writer: dict[str, int] = {}
    last_reader: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for t in k.inputs:
            last_reader[t] = i
        for t in k.outputs:
            writer[t] = i
    movable = _movable(kernels)
    wanted = [Resident(t, graph.tensors[t].size * itemsize(graph.tensors[t].dtype), i, last_reader[t])
              for t, i in writer.items()
              if t in movable and graph.tensors[t].role == "intermediate" and last_reader.get(t, -1) > i]
    demands = [l3_demand(k, graph, target) for k in kernels]
    homes = pack_homes(wanted, demands, target.l3.bank_bytes * target.compute_tiles, target.line_bytes)
    if not homes:
        return graph
    held = {h.tensor: h.bytes for h in homes}
    for k in kernels:
        mine = {t: b for t, b in held.items() if t in k.inputs or t in k.outputs}
        if mine:
            k.hints = _without(k, mine)
    tensors = {name: dataclasses.replace(t, home="L3") if name in held else t for name, t in graph.tensors.items()}
    return Graph(graph.name, tensors, graph.ops, graph.constants)
