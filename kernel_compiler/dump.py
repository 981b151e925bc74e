"""Plain-text views of a graph and of a DFX kernel, for `--dump` and `-v`."""

from __future__ import annotations

from dfx import Compute, DataMove, Graph, Kernel, TileRef, itemsize


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def dump_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name}: {len(graph.ops)} op(s), {len(graph.tensors)} tensor(s)"]
    for t in graph.tensors.values():
        if t.role != "intermediate":
            lines.append(f"  {t.role:<9} {t.name}: {_shape(t.shape)} {t.dtype}")
    for op in graph.ops:
        ins = ", ".join(f"{n}:{_shape(graph.tensors[n].shape)}" for n in op.inputs)
        outs = ", ".join(f"{n}:{_shape(graph.tensors[n].shape)}{graph.tensors[n].dtype}" for n in op.outputs)
        attrs = f" {op.attrs}" if op.attrs else ""
        lines.append(f"  {op.name} = {op.op_type}({ins}) -> {outs}{attrs}")
    return "\n".join(lines)


def dump_objective(objective: str) -> str:
    """What the tiles were chosen for (`--objective`)."""
    return f"objective {objective}"


def dump_homes(graph: Graph) -> str:
    """The intermediates kept in L3 between kernels (`--keep-on-chip`)."""
    kept = [f"{t.name} ({t.size * itemsize(t.dtype):,} B)" for t in graph.tensors.values() if t.home == "L3"]
    return f"kept in L3: {', '.join(kept) if kept else 'none'}"


def _ref(r: TileRef) -> str:
    # a band of a sliding window: its extent, where its tiles start, and the padding it holds
    overlapping = r.step is not None and r.step != r.tile_shape
    window = f"{{{_shape(r.tile_shape)} by {_shape(r.step or r.tile_shape)} from {r.offset or 0}" \
             f"{f' padded {r.padding}' if r.padding else ''}}}" if overlapping or r.padding else ""
    return f"{r.tensor}@{r.level}[{','.join(r.tile_indices)}]{window}"


def dump_kernel(k: Kernel) -> str:
    loops = " ".join(f"{l.induction_var}<{l.end}{f'(by {l.per_block} within {l.within})' if l.within else ''}"
                     f"{'(par)' if l.parallel else ''}" for l in k.tile_loops)
    tiles = " ".join(f"{key}={value}" for key, value in k.tiling.items())
    intensity = f", AI {k.hints['arithmetic_intensity']} FLOP/B" if "arithmetic_intensity" in k.hints else ""
    fused = f" + {', '.join(k.epilogue)}" if k.epilogue else ""
    lines = [f"kernel {k.name} ({k.op}{fused}, {k.dataflow}) tiles {tiles} loops: {loops or '(none)'}",
             f"  dram {k.hints['estimated_dram_bytes']} B (compulsory {k.hints['compulsory_dram_bytes']} B)"
             f"{intensity}, needs {k.requirements['bytes']}"]
    if "l3_resident" in k.hints:
        lines.append(f"  L3 resident: {k.hints['l3_resident']}")
    for op in k.body:
        place = f"after {op.after}" if op.after else f"at {op.at or '-'}"
        if isinstance(op, DataMove):
            what = f"{op.move_type} {_ref(op.source)} -> {_ref(op.destination)} depth {op.depth}" \
                   f"{f' when {op.when}' if op.when else ''}"
        elif isinstance(op, Compute):
            what = f"{op.compute_type} {', '.join(_ref(i) for i in op.inputs)} -> {_ref(op.output)} " \
                   f"accumulate={op.accumulate}{f' depth {op.depth}' if op.depth > 1 else ''}"
        else:
            what = f"BARRIER waits for {f'kernel {op.kernel} ' if op.kernel else ''}ops {op.wait_for}"
        lines.append(f"  {op.op_id:>3} {place:<9} {what}")
    return "\n".join(lines)
