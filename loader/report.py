"""What a run reports: the summary dict behind `--json`, and the rich views of `--profile`
and `--dry-run` (printed on stderr, so stdout stays clean for `--json`). rich is imported by the
functions that print: the summary needs none of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dfx import Barrier, Program, itemsize
from hardware import UNIT_PREFIX, HostLink, Machine, PhaseSpan, SimResult
from hardware.units.bandwidth import Bandwidth

from .binding import Binding
from .buffers import engine_kind
from .run import RunResult

if TYPE_CHECKING:
    from rich.console import Console


def dram_bytes(sim: SimResult) -> dict[str, int]:
    read = sum(v for k, v in sim.bytes_moved.items() if k.startswith("EXTERNAL->"))
    write = sum(v for k, v in sim.bytes_moved.items() if k.endswith("->EXTERNAL"))
    return {"read": read, "write": write}


def roofline(sim: SimResult, machine: Machine) -> dict[str, Any]:
    """Arithmetic intensity of the run against the machine's ridge point."""
    dram = sum(dram_bytes(sim).values())
    bw = min(machine.external.channels * machine.external.channel_bytes_per_cycle,
             machine.engines.dma * machine.engines.dma_bytes_per_cycle)
    peak_flops = 2 * machine.compute.peak_macs_per_cycle
    intensity = 2 * sim.macs / dram if dram else float("inf")
    ridge = peak_flops / bw
    attainable = min(peak_flops, intensity * bw)
    return {"arithmetic_intensity": intensity, "ridge_point": ridge,
            "bound": "compute" if intensity >= ridge else "bandwidth",
            "attainable_macs_per_cycle": attainable / 2}


def kernel_span(span: PhaseSpan, peak: int) -> dict[str, Any]:
    """A kernel's first task (its first loads) to its last; utilization is the arrays' over its
    compute: from its first array or vector task to its end."""
    computing = span.end - span.compute_start if span.compute_start is not None else 0
    return {"start_cycle": span.start, "compute_start_cycle": span.compute_start, "end_cycle": span.end,
            "macs": span.macs, "utilization": span.macs / (computing * peak) if computing else 0.0}


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
        out.update({
            "cycles": sim.cycles,
            "seconds": sim.cycles / (machine.clock_ghz * 1e9),
            "macs": sim.macs,
            "peak_macs_per_cycle": peak,
            "utilization": sim.macs / (sim.cycles * peak) if sim.cycles else 0.0,
            "dram_bytes": dram_bytes(sim),
            "bytes_moved": dict(sorted(sim.bytes_moved.items())),
            "roofline": roofline(sim, machine),
            "kernels": {k.name: kernel_span(sim.phases[i], peak) for i, k in enumerate(program.kernels)
                        if i in sim.phases},
            "units": {name: {"busy_cycles": u.busy_cycles, "tasks": u.tasks, "bytes": u.bytes,
                             "utilization": u.busy_cycles / sim.cycles if sim.cycles else 0.0}
                      for name, u in sim.units.items()},
        })
    if machine.host_link is not None:
        out["host_transfer"] = host_transfer(program, machine.host_link)
        out["host_transfer_cycles"] = out["host_transfer"]["cycles_in"] + out["host_transfer"]["cycles_out"]
    out["wall_seconds"] = round(result.wall_seconds, 3)
    out["bindings"] = {b.kernel: {"method": b.method, "compute_tiles": b.workers,
                                  "makespan_estimate": b.makespan_estimate, "notes": b.notes}
                       for b in result.bindings}
    if output_paths:
        out["outputs"] = output_paths
    if result.checks is not None:
        def row(c):
            return {"max_abs_error": c.max_abs_error, "max_rel_error": c.max_rel_error, "passed": c.passed}

        kernels = result.kernel_checks
        # the worst kernel: a failing one first, then the largest relative error
        worst = max(kernels, key=lambda k: (not kernels[k].passed, kernels[k].max_rel_error), default=None)
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
    for kernel, b in s["bindings"].items():
        for note in b["notes"]:
            console.print(f"{kernel}: {note}")
    r = s["roofline"]
    console.print(f"Roofline: {r['arithmetic_intensity']:.1f} FLOP/B vs ridge {r['ridge_point']:.1f} FLOP/B "
                  f"-> [bold]{r['bound']}-bound[/] (attainable {r['attainable_macs_per_cycle']:,.0f} MACs/cycle)")
    kernels = Table(title="kernels", title_justify="left",
                    caption="array utilization: the kernel's MACs over the peak of the arrays, from its first "
                            "compute to its end", caption_justify="left")
    for col in ("kernel", "first load", "first compute", "end", "array utilization"):
        kernels.add_column(col, justify="left" if col == "kernel" else "right")
    for name, k in s["kernels"].items():
        first_compute = "-" if k["compute_start_cycle"] is None else f"{k['compute_start_cycle']:,}"
        kernels.add_row(name, f"{k['start_cycle']:,}", first_compute, f"{k['end_cycle']:,}", f"{k['utilization']:.1%}")
    console.print(kernels)
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


def print_check(s: dict[str, Any], console: Console) -> None:
    """One line per graph output (end to end), one per failing kernel, and the worst kernel."""
    check = s["check"]

    def line(what: str, c: dict[str, Any]) -> None:
        mark = "[green]pass[/]" if c["passed"] else "[red]FAIL[/]"
        console.print(f"check {what}: {mark} max abs error {c['max_abs_error']:.3g}, "
                      f"max rel error {c['max_rel_error']:.3g}")

    for name, c in check["outputs"].items():
        line(shown(name), c)
    for name, c in check["kernels"].items():
        if not c["passed"]:
            line(f"kernel {name}", c)
    worst = check["worst_kernel"]
    if worst is not None and check["kernels"][worst]["passed"]:
        line(f"worst of {len(check['kernels'])} kernels, {worst}", check["kernels"][worst])


def dry_run_view(program: Program, bindings: list[Binding], sim: SimResult, ops: int) -> dict[str, Any]:
    buffers = []
    for b in bindings:
        for bb in b.buffers:
            buf = bb.buffer
            buffers.append({"kernel": b.kernel, "tensor": buf.tensor, "level": buf.level,
                            "compute_tile": buf.worker, "bank": bb.bank, "address": bb.address,
                            "end": bb.end, "bytes": buf.bytes, "depth": buf.depth, "op_id": buf.op_id})
    engines = []
    for b, k in zip(bindings, program.kernels):
        for (op_id, worker), engine in sorted(b.engines.items()):
            op = k.body_op(op_id)
            engines.append({"kernel": b.kernel, "op_id": op_id, "compute_tile": worker,
                            "stream": f"{op.destination.tensor} {op.source.level}->{op.destination.level}",
                            "engine": f"{UNIT_PREFIX[engine_kind(op.source.level, op.destination.level)]}{engine}"})
    schedule = [{"task": t.id, "unit": unit, "label": t.label, "tile": t.args or {}, "start": start, "end": end}
                for t, start, end, unit in sim.first_tasks[:ops]]
    barriers = [{"kernel": k.name, "op_id": op.op_id, "waits_for_kernel": op.kernel or k.name, "wait_for": op.wait_for}
                for k in program.kernels for op in k.body if isinstance(op, Barrier)]
    return {"cycles": sim.cycles,
            "bindings": [{"kernel": b.kernel, "method": b.method, "compute_tiles": b.workers,
                          "makespan_estimate": b.makespan_estimate, "bind_seconds": round(b.bind_seconds, 4),
                          "notes": b.notes} for b in bindings],
            "buffers": buffers, "engines": engines, "barriers": barriers, "schedule": schedule}


def print_dry_run(view: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    for b in view["bindings"]:
        console.print(f"kernel [bold]{b['kernel']}[/]: bound by {b['method']} on {b['compute_tiles']} compute "
                      f"tile(s), estimated makespan {b['makespan_estimate']:,} cycles")
        for note in b["notes"]:
            console.print(f"  {note}")
    t = Table(title="bound buffers", title_justify="left")
    for col in ("kernel", "tensor", "level", "tile", "bank", "address range", "bytes", "depth"):
        t.add_column(col)
    for b in view["buffers"]:
        t.add_row(b["kernel"], shown(b["tensor"]), b["level"], str(b["compute_tile"]), str(b["bank"]),
                  f"0x{b['address']:06x}-0x{b['end']:06x}", f"{b['bytes']:,}", str(b["depth"]))
    console.print(t)
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
