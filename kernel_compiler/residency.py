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

from dfx import DataMove, Graph, Kernel, Resident, chain_spans, freed, home_bytes, in_lines, itemsize, pack_homes
from dfx.kernel import IndexTensor

from .target import Target


def workers(kernel: Kernel, compute_tiles: int) -> int:
    """Compute tiles the kernel runs on (as the loader deals them): one per parallel step at most."""
    for loop in kernel.tile_loops:
        if loop.parallel:
            return max(1, min(compute_tiles, loop.trip_count, loop.per_block or loop.trip_count))
    return 1


def l3_demand(kernel: Kernel, graph: Graph, target: Target, homes: frozenset[str] = frozenset()) -> int:
    """The bytes of L3 the kernel's buffers take, in whole lines, on all its compute tiles: a
    shared load once, every other buffer once per compute tile; a plain tile of a tensor kept in
    L3 (`homes`) is that region of its home, no buffer, as the loader binds it. (The loader binds
    a plain tile that a SLICE or a PAD fills from a kept tensor so too; counted here, it errs on
    the side of room.)"""
    shared, tiles, line = kernel.shared_moves(), workers(kernel, target.compute_tiles), target.line_bytes
    total = 0
    for op in kernel.body:
        if not isinstance(op, DataMove) or op.move_type == "VIEW" or op.destination.level != "L3":
            continue
        if op.destination.tensor in homes and op.destination.padding is None:
            continue
        tile = math.prod(op.destination.tile_shape) * itemsize(graph.tensors[op.destination.tensor].dtype)
        total += in_lines(tile * op.depth, line) * (1 if op.op_id in shared else tiles)
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
    per_stream = {t: b for t, b in hints["dram_bytes_per_stream"].items() if t not in tensors}
    dram = sum(per_stream.values())
    out = {**hints, "estimated_dram_bytes": dram, "dram_bytes_per_stream": per_stream,
           "compulsory_dram_bytes": hints["compulsory_dram_bytes"] - sum(tensors.values())}
    if "arithmetic_intensity" in hints:
        out.pop("arithmetic_intensity")
        if dram:
            out["arithmetic_intensity"] = round(2 * hints["macs"] / dram, 3)
    return out


def keep_on_chip(kernels: list[Kernel], graph: Graph, target: Target, chains: list[list[str]] | None = None,
                 shallower: dict[str, tuple[int | None, int]] | None = None) -> Graph:
    """The graph with a home in L3 for each intermediate that fits there across its kernels, in
    the order they are written; each kernel's DRAM hints without them. Kernels in execution order.
    A tensor with a home already (a chain's link, `chains.form_chains`) is packed in its turn
    and kept as it is: no other home is taken that would leave it out. The kernels of a chain
    run at once: a home live during one is live during all, and each needs room for all their
    buffers. A link may take the shallower ring (and the dim it goes by) `shallower` offers it
    (`Plan.shallow`) where that keeps more bytes of other tensors in L3, link by link in chain
    order. A tensor kept in L2 (`chains.boundary_homes`) takes none, and its tiles in L3 hold
    nothing; its kernels' DRAM hints leave it out too."""
    span = chain_spans(kernels, chains or [])
    writer: dict[str, int] = {}
    last_reader: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for t in k.inputs:
            last_reader[t] = i
        for t in k.outputs:
            writer[t] = i
    movable = _movable(kernels)
    fixed = [t for t in writer if graph.tensors[t].home == "L3"]
    in_l2 = frozenset(t for t in writer if graph.tensors[t].home == "L2")  # their L3 tiles hold nothing
    wanted = [t for t in writer if t in movable and t not in fixed and t not in in_l2
              and graph.tensors[t].role == "intermediate" and last_reader.get(t, -1) > writer[t]]
    own = [l3_demand(k, graph, target, in_l2) for k in kernels]
    demands = [sum(own[first:last + 1]) for first, last in span]
    # what each home frees: its plain tiles in the kernels writing and reading it
    frees = {t: freed({j: own[j] - l3_demand(k, graph, target, in_l2 | {t}) for j, k in enumerate(kernels)
                       if t in k.inputs or t in k.outputs}, span) for t in fixed + wanted}

    # as the loader packs them: every tensor with a home, in the order of the kernels writing them
    rank = {t: i for i, t in enumerate(graph.tensors)}

    def packed(tensors: list[str], rings: dict) -> list:
        ordered = sorted(tensors, key=lambda t: (writer[t], rank[t]))
        residents = [Resident(t, home_bytes(rings[t]), span[writer[t]][0], span[last_reader[t]][1],
                              frees[t]) for t in ordered]
        return pack_homes(residents, demands, target.l3.bank_bytes * target.compute_tiles, target.line_bytes)

    def held(rings: dict) -> list[str]:
        """One pass, each tensor placed where the ones before it leave room; only where that leaves
        out a link, tensor by tensor, taking none that would."""
        homes = [h.tensor for h in packed(fixed + wanted, rings)]
        if set(fixed) <= set(homes):
            return homes
        kept = list(fixed)
        for t in wanted:
            if len(packed(kept + [t], rings)) == len(kept) + 1:
                kept.append(t)
        return kept

    def saved(homes: list[str]) -> int:
        return sum(graph.tensors[t].size * itemsize(graph.tensors[t].dtype) for t in homes if t not in fixed)

    tensors = dict(graph.tensors)
    homes = held(tensors)
    for link, (ring, dim) in (shallower or {}).items():
        trial = {**tensors, link: dataclasses.replace(tensors[link], ring=ring, ring_dim=dim)}
        if saved(more := held(trial)) > saved(homes):
            tensors, homes = trial, more
    if not homes and not in_l2:
        return graph
    kept = {t: graph.tensors[t].size * itemsize(graph.tensors[t].dtype) for t in [*homes, *in_l2]}
    for k in kernels:
        mine = {t: b for t, b in kept.items() if t in k.inputs or t in k.outputs}
        if mine:
            k.hints = _without(k, mine)
    tensors = {name: dataclasses.replace(t, home="L3") if name in homes else t for name, t in tensors.items()}
    return Graph(graph.name, tensors, graph.ops, graph.constants)
