"""What a run reports: the summary dict behind `--json`, and the rich views of `--profile`
and `--dry-run` (printed on stderr, so stdout stays clean for `--json`). rich is imported by the
functions that print: the summary needs none of it."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from dfx import Barrier, Graph, Kernel, Op, Program, itemsize, lookup, widest
from hardware import (UNIT_PREFIX, EnergyCounts, HostLink, Machine, PhaseSpan, SimResult, kernel_energy, machine_area,
                      total_energy)
from hardware.units.bandwidth import Bandwidth

from .binding import Binding
from .buffers import engine_kind, move_levels
from .run import LARGEST, RunResult

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def dram_bytes(moved: SimResult | PhaseSpan) -> dict[str, int]:
    """Bytes read from and written to external memory, by the whole run or by one kernel (phase)."""
    read = sum(v for k, v in moved.bytes_moved.items() if k.startswith("EXTERNAL->"))
    write = sum(v for k, v in moved.bytes_moved.items() if k.endswith("->EXTERNAL"))
    return {"read": read, "write": write}


def dram_bytes_per_cycle(machine: Machine) -> float:
    """The rate external memory feeds the chip: its channels' or the DMA engines', the lesser."""
    return min(machine.external.channels * machine.external.channel_bytes_per_cycle,
               machine.engines.dma * machine.engines.dma_bytes_per_cycle)


def array_work(sim: SimResult, program: Program, machine: Machine) -> float:
    """The run's MACs in cycles of one PE: each kernel's MACs over the MACs a PE does per cycle on
    its operands' dtype (`ComputeFabric.macs_per_pe_cycle`). The MACs themselves at one a cycle."""
    rate = machine.compute.macs_per_pe_cycle
    ops = {op.name: op for op in program.graph.ops}
    return sum(sim.phases[i].macs / rate.get(operand_dtype(ops[k.graph_op], program.graph), 1)
               for i, k in enumerate(program.kernels) if i in sim.phases)


def mac_work(sim: SimResult, program: Program, machine: Machine, work: float) -> float:
    """The arrays' `work` (`array_work`), and the products of each contraction the vector unit
    ran (a product of one row there, `OpDef.on_array`) at its dtype's rate likewise: the run's
    MACs whichever unit did them, for the roofline and the budget. The arrays' utilization counts
    their own alone."""
    rate = machine.compute.macs_per_pe_cycle
    graph = program.graph
    ops = {op.name: op for op in graph.ops}
    for i, k in enumerate(program.kernels):
        op = ops[k.graph_op]
        opdef = lookup(op.op_type)
        if i in sim.phases and opdef.tile_mnk is not None and not opdef.on_array(k.dataflow):
            shapes = [graph.tensors[t].shape for t in op.inputs]
            products = opdef.vector_work(shapes, graph.tensors[op.outputs[0]].shape, opdef.normalize_attrs(op.attrs))
            work += products["simple"] / rate.get(operand_dtype(op, graph), 1)
    return work


def roofline(sim: SimResult, machine: Machine, work: float) -> dict[str, Any]:
    """Arithmetic intensity of the run against the machine's ridge point; `work`: its MACs in PE
    cycles (`mac_work`)."""
    dram = sum(dram_bytes(sim).values())
    bw = dram_bytes_per_cycle(machine)
    peak_flops = 2 * machine.compute.peak_macs_per_cycle
    intensity = 2 * work / dram if dram else float("inf")
    ridge = peak_flops / bw
    attainable = min(peak_flops, intensity * bw)
    return {"arithmetic_intensity": intensity, "ridge_point": ridge,
            "bound": "compute" if intensity >= ridge else "bandwidth",
            "attainable_macs_per_cycle": attainable / 2}


def budget(sim: SimResult, graph: Graph, machine: Machine, work: float) -> dict[str, Any]:
    """What any program of the graph spends at the least, beside what this one spent: the
    compulsory external bytes (every graph input, output and constant moved once) and the cycle
    bound, the larger of the MACs (in PE cycles, `work`) over the machine's peak and those bytes
    over its bandwidth."""
    compulsory = sum(t.size * itemsize(t.dtype) for t in graph.tensors.values()
                     if t.role in ("input", "output", "constant"))
    compute = math.ceil(work / machine.compute.peak_macs_per_cycle)
    memory = math.ceil(compulsory / dram_bytes_per_cycle(machine))
    bound = max(compute, memory, 1)
    return {"compulsory_dram_bytes": compulsory,
            "dram_over_compulsory": sum(dram_bytes(sim).values()) / compulsory if compulsory else None,
            "cycle_bound": bound, "bound_by": "compute" if compute >= memory else "memory",
            "cycles_over_bound": sim.cycles / bound}


def _computing(span: PhaseSpan) -> int:
    """A kernel's compute cycles: from its first array or vector task to its end."""
    return span.end - span.compute_start if span.compute_start is not None else 0


def _utilization(work: int, cycles: int, peak_per_cycle: int) -> float:
    return work / (cycles * peak_per_cycle) if cycles else 0.0


def kernel_span(span: PhaseSpan, peak: int) -> dict[str, Any]:
    """A kernel's first task (its first loads) to its last; utilization is the arrays' over its
    compute: from its first array or vector task to its end."""
    return {"start_cycle": span.start, "compute_start_cycle": span.compute_start, "end_cycle": span.end,
            "macs": span.macs, "utilization": _utilization(span.macs, _computing(span), peak)}


def kernel_bound(macs: int, elements: int, dram: int, machine: Machine) -> dict[str, Any]:
    """Where a kernel sits on the roofline of the units doing its work. With MACs: 2 * MACs per
    DRAM byte (FLOP/B) against the arrays' ridge point, as `roofline` has it; else vector
    elements per DRAM byte against the vector units' (lanes times compute tiles elements per
    cycle, over the same DRAM rate), since comparing elements with the arrays' FLOPs would call
    every vector kernel bandwidth-bound. Neither: the kernel only moves data."""
    if macs:
        work, peak = 2 * macs, 2 * machine.compute.peak_macs_per_cycle
    elif elements:
        work, peak = elements, machine.vector.lanes * machine.compute.tiles
    else:
        return {"arithmetic_intensity": None, "bound": "data movement"}
    intensity = work / dram if dram else float("inf")
    ridge = peak / dram_bytes_per_cycle(machine)
    return {"arithmetic_intensity": intensity, "bound": "compute" if intensity >= ridge else "bandwidth"}


def kernel_cost(span: PhaseSpan, tiles: int, machine: Machine, run_cycles: int,
                macs_per_pe_cycle: int = 1) -> dict[str, Any]:
    """What one kernel cost, run on `tiles` compute tiles whose PEs do `macs_per_pe_cycle` MACs a
    cycle on its operands, beside its span (`kernel_span`):
    - cycles: from its first compute to its end (its compute cycles; a kernel with no compute:
      from its first task). Its first loads run under the kernel before, and then wait for that
      kernel's results, so counted from them the kernels would add up to far more than the run;
      counted so, they nearly divide it (they still overlap a little: `share`s may add to
      slightly more than 1).
    - array_utilization: its MACs over the peak of the arrays of its compute tiles, and
      vector_utilization: its vector elements over the lanes of their vector units, both over
      its compute cycles (from its first compute to its end). `utilization` of `kernel_span` is
      over all the machine's arrays instead. An element counts once whatever its op class
      costs, so a kernel of transcendentals alone stays below 1 / their cycles per element.
    - dram_bytes: read and written by its moves; the kernels' add up to the run's.
    - bound: `kernel_bound`."""
    computing = _computing(span)
    cycles = computing or span.end - span.start
    elements = sum(span.vector_work.values())  # an element counts once whatever its op class
    dram = dram_bytes(span)
    array_peak = tiles * machine.compute.rows * machine.compute.cols * macs_per_pe_cycle
    return {"cycles": cycles, "share": cycles / run_cycles if run_cycles else 0.0,
            "array_utilization": _utilization(span.macs, computing, array_peak),
            "vector_elements": elements,
            "vector_utilization": _utilization(elements, computing, tiles * machine.vector.lanes),
            "dram_bytes": dram,
            **kernel_bound(span.macs / macs_per_pe_cycle, elements, sum(dram.values()), machine)}


def kernel_op(kernel: Kernel, op_types: dict[str, str]) -> str:
    """The kernel's op, then each of its epilogue's, joined by "+" (a matmul with a bias and an
    activation fused: three names)."""
    return "+".join([kernel.op, *(op_types[name] for name in kernel.epilogue)])


def result_shape(kernel: Kernel, graph: Graph) -> str:
    """The shape of the tensor the kernel writes, as 1x112x112x32; several comma-separated."""
    return ", ".join("x".join(map(str, graph.tensors[t].shape)) or "scalar" for t in kernel.outputs)


def operand_dtype(op: Op, graph: Graph) -> str:
    """What a kernel's MACs multiply: the wider of its graph op's first two operands (a u8
    activation times i16 weights is an i16 MAC), its first alone, or its result's."""
    return widest([graph.tensors[t].dtype for t in (op.inputs[:2] or op.outputs[:1])])


def energy_counts(span: PhaseSpan, op: Op, graph: Graph) -> EnergyCounts:
    """What the energy model charges a kernel for; its MACs in the dtype of its graph op's operands."""
    dtype = operand_dtype(op, graph)
    return EnergyCounts(dtype, itemsize(dtype), span.macs, span.array_operand_elements, span.vector_work,
                        {tuple(path.split("->")): n for path, n in span.bytes_moved.items()})


def kernel_entries(result: RunResult, program: Program, machine: Machine) -> dict[str, dict[str, Any]]:
    """Each kernel that ran, in program order: its span, op, result shape, cost and energy. A
    kernel of views alone runs no task, so the simulator has no span of it."""
    sim = result.sim
    ops = {op.name: op for op in program.graph.ops}
    op_types = {name: op.op_type for name, op in ops.items()}
    tiles = {b.kernel: b.workers for b in result.bindings}
    peak = machine.compute.peak_macs_per_cycle
    rate = {k.name: machine.compute.macs_per_pe_cycle.get(operand_dtype(ops[k.graph_op], program.graph), 1)
            for k in program.kernels}
    return {k.name: {**kernel_span(sim.phases[i], peak * rate[k.name]), "op": kernel_op(k, op_types),
                     "shape": result_shape(k, program.graph),
                     **kernel_cost(sim.phases[i], tiles[k.name], machine, sim.cycles, rate[k.name]),
                     "energy": kernel_energy(machine.energy, energy_counts(sim.phases[i], ops[k.graph_op], program.graph),
                                             engine_kind)}
            for i, k in enumerate(program.kernels) if i in sim.phases}


# the kinds of unit a stage's figures count, in the order the profile shows them
STAGE_UNITS = ("array", "vector", "dma", "block_mover", "streamer")


def stage_entries(sim: SimResult, program: Program, machine: Machine) -> list[dict[str, Any]]:
    """The run by stages, in program order: the kernels of a chain together (they run at once,
    so their own cycles overlap all but entirely), every other kernel alone (`Program.spans`, as
    the loader runs them). A stage's cycles go as a kernel's do (`kernel_cost`): from its first
    compute to its last task's end. `busy`: for each kind of unit, the cycles its tasks held the
    units of that kind over those cycles times the machine's units of that kind (a DMA engine
    held for the DRAM latency too; loads that ran under the stage before count, so a short
    stage's share may pass 1); `busiest`: the kind of the largest share (None: no unit worked)."""
    counts = machine.unit_counts()
    stages = []
    for first, last in sorted(set(program.spans())):
        members = [k.name for k in program.kernels[first:last + 1]]
        spans = [sim.phases[i] for i in range(first, last + 1) if i in sim.phases]
        if not spans:
            continue
        computes = [s.compute_start for s in spans if s.compute_start is not None]
        end = max(s.end for s in spans)
        cycles = (end - min(computes) if computes else 0) or end - min(s.start for s in spans)
        busy = {unit: sum(s.busy.get(unit, 0) for s in spans) / (counts[unit] * cycles) if cycles else 0.0
                for unit in STAGE_UNITS}
        dram = [dram_bytes(s) for s in spans]
        stages.append({"kernels": members, "start_cycle": end - cycles, "end_cycle": end, "cycles": cycles,
                       "share": cycles / sim.cycles if sim.cycles else 0.0, "busy": busy,
                       "dram_bytes": {way: sum(d[way] for d in dram) for way in ("read", "write")},
                       "busiest": max(busy, key=busy.get) if any(busy.values()) else None})
    return stages


def host_transfer(program: Program, link: HostLink) -> dict[str, int]:
    """The graph's inputs (constants too) crossing the host link before the run and its outputs
    after it, one direction at a time, each paying the link's latency. Apart from `cycles`: the
    simulated run starts with its inputs already in the KPU's external memory."""
    rate = Bandwidth(link.bytes_per_cycle)
    moved = {"in": sum(t.size * itemsize(t.dtype) for t in program.graph.inputs),
             "out": sum(t.size * itemsize(t.dtype) for t in program.graph.outputs)}
    cycles = {way: link.latency_cycles + rate.cycles(n) if n else 0 for way, n in moved.items()}
    return {"bytes_in": moved["in"], "bytes_out": moved["out"],
            "cycles_in": cycles["in"], "cycles_out": cycles["out"]}


def summary(result: RunResult, program: Program, program_path: str, machine: Machine,
            output_paths: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"object": program_path, "config": machine.name}
    sim = result.sim
    if sim is not None:
        peak = machine.compute.peak_macs_per_cycle
        work = array_work(sim, program, machine)
        every_mac = mac_work(sim, program, machine, work)
        out.update({
            "cycles": sim.cycles,
            "seconds": sim.cycles / (machine.clock_ghz * 1e9),
            "macs": sim.macs,
            "peak_macs_per_cycle": peak,
            "utilization": work / (sim.cycles * peak) if sim.cycles else 0.0,
            "dram_bytes": dram_bytes(sim),
            "bytes_moved": dict(sorted(sim.bytes_moved.items())),
            "roofline": roofline(sim, machine, every_mac),
            "budget": budget(sim, program.graph, machine, every_mac),
            "kernels": kernel_entries(result, program, machine),
            "stages": stage_entries(sim, program, machine),
            "units": {name: {"busy_cycles": u.busy_cycles, "tasks": u.tasks, "bytes": u.bytes,
                             "utilization": u.busy_cycles / sim.cycles if sim.cycles else 0.0}
                      for name, u in sim.units.items()},
        })
        out["energy"] = total_energy(k["energy"] for k in out["kernels"].values())
    out["area"] = machine_area(machine)
    if machine.host_link is not None:
        out["host_transfer"] = host_transfer(program, machine.host_link)
        out["host_transfer_cycles"] = out["host_transfer"]["cycles_in"] + out["host_transfer"]["cycles_out"]
    out["wall_seconds"] = round(result.wall_seconds, 3)
    out["bindings"] = {b.kernel: {"method": b.method, "compute_tiles": b.workers,
                                  "makespan_estimate": b.makespan_estimate, "notes": b.notes}
                       for b in result.bindings}
    out["homes"] = homes_view(program, result.bindings)
    if program.chains:
        out["chains"] = program.chains
    if output_paths:
        out["outputs"] = output_paths
    if result.checks is not None:
        def row(c):
            return {"passed": c.passed, "worst_element_error": c.worst_error,
                    "worst_fraction_of_tolerance": c.worst_fraction,
                    "max_abs_error": c.max_abs_error, "max_rel_error": c.max_rel_error}

        kernels = result.kernel_checks
        # the worst kernel: a failing one first, then the one whose worst element came nearest its tolerance
        worst = max(kernels, key=lambda k: (not kernels[k].passed, kernels[k].worst_fraction), default=None)
        out["check"] = {"passed": result.check_passed,
                        "outputs": {n: row(c) for n, c in result.checks.items()},
                        "kernels": {k: row(c) for k, c in kernels.items()},
                        "worst_kernel": worst}
    return out


def shown(name: str) -> str:
    """A name from the user's graph as one line of plain text: control characters escaped,
    rich markup neutralised, very long names cut."""
    from rich.markup import escape

    text = name if name.isprintable() else repr(name)[1:-1]
    return escape(text if len(text) <= 80 else text[:77] + "...")


def _si(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:g}"


def print_profile(s: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    console.print(f"[bold]{shown(s['object'])}[/] on [bold]{shown(s['config'])}[/]: {s['cycles']:,} cycles "
                  f"({s['seconds'] * 1e6:,.2f} µs)")
    console.print(f"MACs {s['macs']:,}: achieved {s['macs'] / max(1, s['cycles']):,.1f} of peak "
                  f"{s['peak_macs_per_cycle']} MACs/cycle = [bold]{s['utilization']:.1%}[/] array utilization "
                  f"(all arrays, over the whole run)")
    if "host_transfer" in s:
        t = s["host_transfer"]
        console.print(f"Host link, apart from the cycles above: {s['host_transfer_cycles']:,} cycles "
                      f"({t['bytes_in']:,} bytes in before the run: {t['cycles_in']:,}; "
                      f"{t['bytes_out']:,} bytes out after it: {t['cycles_out']:,})")
    e = s["energy"]

    def shares(view: str) -> str:
        return ", ".join(f"{part} {pj / e['total_pj']:.0%}" for part, pj in e[view].items() if pj)

    console.print(f"Energy per inference: [bold]{e['total_pj'] / 1e6:,.2f} µJ[/]"
                  + (f" ({e['total_pj'] / s['macs']:,.2f} pJ per MAC)" if s["macs"] else "")
                  + (f"; by level: {shares('by_level')}; by unit: {shares('by_unit')}" if e["total_pj"] else "")
                  + f". Area {s['area']['total_mm2']:,.2f} mm² (45 nm figures unless the config gives its own)")
    r = s["roofline"]
    console.print(f"Roofline: {r['arithmetic_intensity']:.1f} FLOP/B vs ridge {r['ridge_point']:.1f} FLOP/B "
                  f"-> [bold]{r['bound']}-bound[/] (attainable {r['attainable_macs_per_cycle']:,.0f} MACs/cycle)")
    b = s["budget"]
    if b["dram_over_compulsory"] is not None:
        dram = sum(s["dram_bytes"].values())
        console.print(f"Budget: DRAM {dram:,} bytes = [bold]{b['dram_over_compulsory']:.2f}x[/] the compulsory "
                      f"{b['compulsory_dram_bytes']:,} (graph inputs, outputs, constants once); {s['cycles']:,} cycles "
                      f"= [bold]{b['cycles_over_bound']:.2f}x[/] the bound {b['cycle_bound']:,} ("
                      + ("MACs over peak" if b["bound_by"] == "compute" else "compulsory bytes over bandwidth") + ")")
    console.print(kernel_table(s))
    if "chains" in s:
        console.print(stage_table(s))
    units = Table(title="units", title_justify="left",
                  caption="busy: the share of the whole run's cycles the unit was working", caption_justify="left")
    for col in ("unit", "busy cycles", "busy", "tasks", "bytes"):
        units.add_column(col, justify="left" if col == "unit" else "right")
    for name, u in s["units"].items():
        units.add_row(name, f"{u['busy_cycles']:,}", f"{u['utilization']:.1%}", f"{u['tasks']:,}", _si(u["bytes"]) + "B")
    console.print(units)
    moved = Table(title="bytes moved per level", title_justify="left")
    moved.add_column("path")
    moved.add_column("bytes", justify="right")
    for path, n in s["bytes_moved"].items():
        moved.add_row(path, f"{n:,}")
    console.print(moved)


def print_bindings(bindings: dict[str, dict[str, Any]], console: Console, each: bool) -> None:
    """How the kernels were bound: one line for them all (the binders, and how many kernels each
    note holds for), or with `each` (-v) one line per kernel; `--json` has every kernel's."""
    if each:
        for kernel, b in bindings.items():
            console.print(f"kernel {shown(kernel)}: bound by {b['method']} on {b['compute_tiles']} compute tile(s)"
                          + "".join(f"; {shown(note)}" for note in b["notes"]))
        return
    methods = Counter(b["method"] for b in bindings.values())
    notes = Counter(note for b in bindings.values() for note in b["notes"])
    console.print(f"bindings: {len(bindings)} kernel(s) by " + ", ".join(
        method if len(methods) == 1 else f"{method} ({n})" for method, n in methods.items())
        + "".join(f"; {shown(note)} ({n})" for note, n in notes.items())
        + ("; -v lists each kernel's" if notes else ""))


def by_cycles(kernels: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The kernels, costliest first; kernels of equal cycles in program order (a stable sort)."""
    return sorted(kernels.items(), key=lambda item: item[1]["cycles"], reverse=True)


def _figures_table(title: str, names: tuple[str, ...], figures: tuple[str, ...], last: str, caption: str) -> Table:
    """A profile table: its name columns fold onto more lines on a narrower console, never its
    figures, and nothing is cut; no borders but the header's, one space between columns."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, padding=0)
    for col in names:
        table.add_column(col, overflow="fold")
    for col in figures:
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column(last, no_wrap=True)
    return table


def kernel_table(s: dict[str, Any]) -> Table:
    """One row per kernel, costliest first, every kernel (a network's last layers matter too).
    Short headers, no borders but the header's and one space between columns keep a network's
    rows (kernel names like depthwise_conv2d_12, fused ops, 4-d shapes) within 120 columns of a
    terminal (off one, the table is as wide as it needs: dfx.cli_console); the
    caption says what the figures mean."""
    table = _figures_table(
        "kernels, by cycles", ("kernel", "op", "shape"), ("cycles", "share", "array", "vector", "DRAM"), "bound",
        "cycles: first compute to last task's end (a kernel's first loads run under the one before); kernels "
        "overlap a little, and a chain's all but entirely (stages, below), so shares can add up to more than 100%. "
        "array, vector: utilization of the units of the kernel's compute tiles over those cycles (-: no such "
        "work). DRAM: bytes read and written. bound: its intensity (FLOP/B, or vector elements/B) against that "
        "unit's ridge point.")
    for name, k in by_cycles(s["kernels"]):
        table.add_row(shown(name), shown(k["op"]), k["shape"], f"{k['cycles']:,}", f"{k['share']:.1%}",
                      f"{k['array_utilization']:.1%}" if k["macs"] else "-",
                      f"{k['vector_utilization']:.1%}" if k["vector_elements"] else "-",
                      _si(sum(k["dram_bytes"].values())) + "B", k["bound"])
    return table


def stage_table(s: dict[str, Any]) -> Table:
    """One row per stage (`stage_entries`), costliest first: where a chained run's cycles went,
    and which kind of unit held each stage up."""
    table = _figures_table(
        "stages, by cycles", ("stage",), ("cycles", "share", "array", "vector", "dma", "bm", "str", "DRAM"), "busiest",
        "stage: a chain's kernels, which run at once, or a kernel alone; cycles as a kernel's (a stage may start on "
        "what the one before has stored, so shares can add up to more than 100%). array .. str: the cycles its tasks "
        "held the machine's units of that kind, over its cycles (a DMA engine held for the DRAM latency too; loads "
        "run under the stage before count too, so a short stage's may pass 100%). busiest: that kind.")
    for st in sorted(s["stages"], key=lambda st: st["cycles"], reverse=True):
        names = st["kernels"]
        label = shown(names[0]) if len(names) == 1 else f"{shown(names[0])} .. {shown(names[-1])} ({len(names)})"
        table.add_row(label, f"{st['cycles']:,}", f"{st['share']:.1%}",
                      *(f"{st['busy'][unit]:.0%}" for unit in STAGE_UNITS),
                      _si(sum(st["dram_bytes"].values())) + "B", UNIT_PREFIX.get(st["busiest"], "-"))
    return table


def print_check(s: dict[str, Any], console: Console) -> None:
    """One line per graph output (end to end), one per failing kernel, and the worst kernel, each
    saying what its worst element was held to: its error, and what fraction of its tolerance
    that is (`loader.run.compare`)."""
    check = s["check"]

    def line(what: str, c: dict[str, Any]) -> None:
        error, fraction = c["worst_element_error"], c["worst_fraction_of_tolerance"]
        if c["passed"]:
            verdict = f"[green]pass[/] (worst element {error:.2g}, {fraction:.2g} of its tolerance)"
        elif error == LARGEST:
            verdict = "[red]FAIL[/] (NaN or inf where the reference differs, or an error beyond float64)"
        elif fraction == LARGEST:  # an integer result: no error is allowed
            verdict = f"[red]FAIL[/] (worst element {error:.3g}, where it must be exact)"
        else:
            verdict = f"[red]FAIL[/] (worst element {error:.3g}, {fraction:.3g} times its tolerance)"
        console.print(f"check {what}: {verdict}")

    for name, c in check["outputs"].items():
        line(shown(name), c)
    for name, c in check["kernels"].items():
        if not c["passed"]:
            line(f"kernel {name}", c)
    worst = check["worst_kernel"]
    if worst is not None and check["kernels"][worst]["passed"]:
        n = len(check["kernels"])
        line(f"worst of {n} kernels, {worst}" if n > 1 else f"kernel {worst}", check["kernels"][worst])


def dry_run_view(program: Program, bindings: list[Binding], sim: SimResult, ops: int) -> dict[str, Any]:
    buffers = []
    for b in bindings:
        for bb in b.buffers:
            buf = bb.buffer
            buffers.append({"kernel": b.kernel, "tensor": buf.tensor, "level": buf.level,
                            "compute_tile": buf.worker, "bank": bb.bank, "address": bb.address,
                            "end": bb.end, "bytes": buf.bytes, "depth": buf.depth, "slot": buf.slot,
                            "op_id": buf.op_id})
    engines = []
    for b, k in zip(bindings, program.kernels):
        kept = frozenset(h.tensor for h in b.homes)
        for (op_id, worker), engine in sorted(b.engines.items()):
            op = k.body_op(op_id)
            src, dst = move_levels(op, kept)
            engines.append({"kernel": b.kernel, "op_id": op_id, "compute_tile": worker,
                            "stream": f"{op.destination.tensor} {src}->{dst}",
                            "engine": f"{UNIT_PREFIX[engine_kind(src, dst)]}{engine}"})
    schedule = [{"task": t.id, "unit": unit, "label": t.label, "tile": t.args or {}, "start": start, "end": end}
                for t, start, end, unit in sim.first_tasks[:ops]]
    barriers = [{"kernel": k.name, "op_id": op.op_id, "waits_for_kernel": op.kernel or k.name, "wait_for": op.wait_for}
                for k in program.kernels for op in k.body if isinstance(op, Barrier)]
    return {"cycles": sim.cycles,
            "bindings": [{"kernel": b.kernel, "method": b.method, "compute_tiles": b.workers,
                          "makespan_estimate": b.makespan_estimate, "bind_seconds": round(b.bind_seconds, 4),
                          "notes": b.notes} for b in bindings],
            "homes": homes_view(program, bindings), "chains": program.chains,
            "buffers": buffers, "engines": engines, "barriers": barriers, "schedule": schedule}


def homes_view(program: Program, bindings: list[Binding]) -> dict[str, dict[str, Any]]:
    """Each intermediate kept on chip between kernels: its level, its region (of L3, or of every
    L2 bank), the kernels that write it and last read it, and where it is a ring, the slices it
    holds (`ring`) and of what (`ring_holds`: rows or channels)."""
    homes = {h.tensor: (level, h) for b in bindings for level, hs in (("L3", b.homes), ("L2", b.l2_homes)) for h in hs}
    out = {}
    for t, (level, h) in homes.items():
        tensor = program.graph.tensors[t]
        out[t] = {"level": level, "address": h.address, "end": h.address + h.bytes, "bytes": h.bytes,
                  "written_by": next(k.name for k in program.kernels if t in k.outputs),
                  "last_read_by": [k.name for k in program.kernels if t in k.inputs][-1],
                  **({"ring": tensor.ring, "ring_holds": tensor.ring_holds} if tensor.ring is not None else {})}
    return out


def print_dry_run(view: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    for b in view["bindings"]:
        console.print(f"kernel [bold]{b['kernel']}[/]: bound by {b['method']} on {b['compute_tiles']} compute "
                      f"tile(s), estimated makespan {b['makespan_estimate']:,} cycles")
        for note in b["notes"]:
            console.print(f"  {note}")
    t = Table(title="bound buffers", title_justify="left")
    for col in ("kernel", "tensor", "level", "tile", "bank", "address range", "bytes", "depth or slot"):
        t.add_column(col)
    for b in view["buffers"]:
        t.add_row(b["kernel"], shown(b["tensor"]), b["level"], str(b["compute_tile"]), str(b["bank"]),
                  f"0x{b['address']:06x}-0x{b['end']:06x}", f"{b['bytes']:,}",
                  str(b["depth"]) if b["slot"] is None else f"slot {b['slot']}")
    console.print(t)
    if view["homes"]:
        t = Table(title="kept on chip between kernels (in L2: the range in every bank)", title_justify="left")
        for col in ("tensor", "level", "address range", "bytes", "holds", "written by", "last read by"):
            t.add_column(col)
        for name, h in view["homes"].items():
            t.add_row(shown(name), h["level"], f"0x{h['address']:06x}-0x{h['end']:06x}", f"{h['bytes']:,}",
                      f"ring of {h['ring']} {h['ring_holds']}" if "ring" in h else "all", h["written_by"],
                      h["last_read_by"])
        console.print(t)
    for chain in view["chains"]:
        console.print(f"chain {', '.join(chain)}: run at once, band by band (their buffers disjoint)")
    t = Table(title="engine assignment", title_justify="left")
    for col in ("kernel", "op", "tile", "stream", "engine"):
        t.add_column(col)
    for e in view["engines"]:
        t.add_row(e["kernel"], str(e["op_id"]), str(e["compute_tile"]), shown(e["stream"]), e["engine"])
    console.print(t)
    if view["barriers"]:
        t = Table(title="barriers (each a task on every compute tile, in the schedule and the trace)",
                  title_justify="left")
        for col in ("kernel", "op", "waits for kernel", "its ops"):
            t.add_column(col)
        for b in view["barriers"]:
            t.add_row(b["kernel"], str(b["op_id"]), b["waits_for_kernel"], ", ".join(map(str, b["wait_for"])))
        console.print(t)
    t = Table(title=f"first {len(view['schedule'])} scheduled ops, in program order "
                    f"(the whole program takes {view['cycles']:,} cycles)", title_justify="left")
    for col in ("task", "unit", "op", "tile", "start", "end"):
        t.add_column(col, justify="right" if col in ("task", "start", "end") else "left")
    for s in view["schedule"]:
        t.add_row(str(s["task"]), s["unit"], shown(s["label"]), ",".join(f"{k}={v}" for k, v in s["tile"].items()),
                  f"{s['start']:,}", f"{s['end']:,}")
    console.print(t)
