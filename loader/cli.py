"""`kpu-loader`: bind a `.kpu` object to one machine, run it, check it, report the cycles."""

from __future__ import annotations

import sys
import time
from typing import List, Optional

import typer

MAX_SHOWN_OPS = 100_000  # --dry-run keeps each shown op's record in memory
# Every shipped example needs at most 114,000 tile ops (BERT's layer on minimal); 20 M take about
# 7 minutes with values: a larger program is more likely a mistake (tiles far too small) than meant.
MAX_TILE_OPS = 20_000_000

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


class _Progress:
    """A progress bar on stderr, shown only on a terminal and once a run has taken more than a
    second: in a log it would be blank lines."""

    def __init__(self, total: int, console, what: str):
        self.total, self.console, self.what, self.start = total, console, what, time.perf_counter()
        self.bar = None

    def __call__(self, done: int) -> None:
        if self.bar is None:
            if not self.console.is_terminal or time.perf_counter() - self.start < 1.0:
                return
            from rich.progress import Progress

            self.bar = Progress(console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale:,} {unit}"
    return f"{nbytes:,} B"


def _print_machine(view: dict, console) -> None:
    """--show-config: one row per kind of part, with its sizes and rates as the simulator uses them."""
    from rich.table import Table

    from .report import shown

    levels, engines, compute, vector, link = (view[k] for k in ("levels", "engines", "compute", "vector", "host_link"))
    table = Table(title=f"{shown(view['name'])}: {view['clock_ghz']:g} GHz, {view['line_bytes']}-byte lines; "
                        "rates in bytes per cycle, latencies in cycles", title_justify="left")
    for column in ("part", "count", "bytes each", "rate each", "latency"):
        table.add_column(column, justify="left" if column == "part" else "right")
    parts = {
        "DRAM channels": levels["external"],
        "L3 tiles, shared": levels["l3"],
        f"L2 banks, shared, {levels['l2']['ports']} port(s)": levels["l2"],
        "L1 buffers of each compute tile": levels["l1"],
        "DMA engines, DRAM <-> L3": engines["dma"],
        "BlockMovers, L3 <-> L2": engines["block_mover"],
        "Streamers, L2 <-> L1": engines["streamer"],
        "host link, timed apart": {"count": 0} if link is None else {"count": 1, **link},
    }
    for name, part in parts.items():
        rate = part.get("bytes_per_cycle", "")
        table.add_row(name, f"{part['count']:,}", _size(part["bytes"]) if "bytes" in part else "",
                      f"{rate:g}" if isinstance(rate, float) else rate, str(part.get("latency_cycles", "")))
    console.print(table)
    console.print(f"compute: {compute['tiles']:,} tile(s) of a {compute['rows']}x{compute['cols']} array "
                  f"({compute['peak_macs_per_cycle']:,} MACs/cycle in all), "
                  f"dataflows {', '.join(compute['dataflows'])}")
    console.print(f"vector unit of each compute tile: {vector['lanes']} lanes, cycles per element "
                  + ", ".join(f"{k} {v}" for k, v in vector["cycles_per_element"].items()))


@app.command()
def load(
    # optional only for --show-config, which reads no object; load() refuses any other run without it
    object_file: Optional[str] = typer.Argument(None, metavar="OBJECT.kpu", show_default=False,
                                                help="Object file from kpu-kernel-compiler (none with --show-config)"),
    config: str = typer.Option(..., "--config", help="Machine config (.json/.yaml) or a shipped name"),
    accelerator: Optional[str] = typer.Option(None, "--accelerator", metavar="ID",
                                              help="The KPU to use of a system-schema config with several"),
    show_config: bool = typer.Option(False, "--show-config",
                                     help="Print the machine as read from --config (with --json: as JSON) and exit"),
    input: Optional[List[str]] = typer.Option(None, "--input", help="NAME=FILE.npy, repeatable"),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Write each output as NAME.npy here"),
    seed: int = typer.Option(0, "--seed", min=0, max=2**63 - 1, help="Seed for inputs not given with --input"),
    check: bool = typer.Option(False, "--check", help="Compare outputs with the numpy reference; exit 1 on mismatch"),
    profile: bool = typer.Option(False, "--profile", help="Print cycles, unit utilization, bytes, roofline"),
    trace_output: Optional[str] = typer.Option(None, "--trace-output", help="Write a Perfetto trace JSON"),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="FILE",
                                       help="Draw the kernels on the machine's rooflines (.png, .svg or .pdf)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Bind and schedule only: buffers, engines, first ops"),
    ops: int = typer.Option(20, "--ops", min=0, max=MAX_SHOWN_OPS, help="Scheduled ops shown by --dry-run"),
    timing_only: bool = typer.Option(False, "--timing-only", help="Simulate cycles without computing values"),
    binder: str = typer.Option("cp-sat", "--binder", help="cp-sat | greedy"),
    max_tile_ops: int = typer.Option(MAX_TILE_OPS, "--max-tile-ops", metavar="N", min=1, max=2**63 - 1,
                                     help="Refuse a program of more tile ops than this, in every mode"),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the binding cache "
                                  "($KPU_CACHE_DIR, else $XDG_CACHE_HOME/kpu or ~/.cache/kpu)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON summary on stdout"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print how each kernel was bound"),
) -> None:
    """Bind OBJECT.kpu to a machine, simulate it cycle by cycle, and compute its outputs."""
    import orjson

    from dfx import ObjectFileError, OutputError, OutputFiles, cli_console, fail, read_hashed
    from hardware import ConfigError, load_machine, trace_json

    from . import roofline_plot
    from .binders import BINDERS, binder_named
    from .binding import BindError
    from .budget import BudgetError, advise, check_tile_ops, estimate
    from .cache import bind_cached
    from .execution import ExecutionError
    from .inputs import InputError, program_inputs, read_inputs
    from .outputs import claim_outputs, stage_array
    from .report import dry_run_view, print_bindings, print_check, print_dry_run, print_profile, shown, summary
    from .run import LoadError, RunResult, bind_program, check_fits, check_kernels, check_outputs, execute, simulate

    console = cli_console()
    if show_config:
        if object_file is not None:
            fail("--show-config prints the machine and exits: give it no OBJECT.kpu")
        try:
            machine = load_machine(config, accelerator)
        except ConfigError as e:
            fail(str(e))
        if json_out:
            sys.stdout.write(orjson.dumps(machine.view()).decode() + "\n")
        else:
            _print_machine(machine.view(), console)
        return
    if object_file is None:
        fail("Missing argument 'OBJECT.kpu'.")  # as typer says it when the argument is required
    if binder not in BINDERS:
        fail(f"--binder: expected {' or '.join(BINDERS)}, got '{binder}'")
    for option, path in (("--output-dir", output_dir), ("--trace-output", trace_output), ("--plot", plot)):
        if path == "":  # Path("") is the current folder
            fail(f"{option}: an empty path; name a {'folder' if option == '--output-dir' else 'file'}")
    skipping = "--dry-run" if dry_run else "--timing-only" if timing_only else None
    if skipping and (check or output_dir is not None):
        fail(f"{'--check' if check else '--output-dir'} needs the values that {skipping} skips")
    started = time.perf_counter()
    with OutputFiles(inputs=[object_file, config, *(spec.partition("=")[2] for spec in input or [])]) as files:
        try:
            # every output path is checked before any work, and written only once the run succeeded
            trace_path = files.claim(trace_output) if trace_output is not None else None
            plot_path = files.claim(plot) if plot is not None else None
            plot_as = roofline_plot.plot_format(plot_path) if plot_path is not None else None
            program, object_sha256 = read_hashed(object_file)
            check_tile_ops(program, max_tile_ops, object_file)
            output_paths = claim_outputs(files, output_dir, [t.name for t in program.graph.outputs]) \
                if output_dir is not None else {}
            machine = load_machine(config, accelerator)
            given = read_inputs(input or [], program)
            check_fits(program, machine, object_file)
            bindings, cache_use = bind_cached(program, machine, object_file, accelerator, binder,
                                              lambda: bind_program(program, machine, object_file, binder_named(binder)),
                                              use_cache=not no_cache, object_sha256=object_sha256)
        except (ObjectFileError, ConfigError, InputError, LoadError, BindError, OutputError, BudgetError) as e:
            fail(str(e))
        if cache_use.warning is not None:
            print(f"warning: {cache_use.warning}", file=sys.stderr)

        budget = estimate(program, bindings)
        if not (dry_run or timing_only):
            advice = advise(budget, object_file)
            if advice is not None and advice.fatal:
                fail(advice.message)
            if advice is not None:
                print(f"warning: {advice.message}", file=sys.stderr)
        result = RunResult(bindings)
        total = budget.tile_ops
        progress = _Progress(total, console, "simulating")
        try:
            # a dry run times the whole program too: an op's start depends on every op competing for its unit
            result.sim = simulate(program, machine, bindings, trace=trace_path is not None,
                                  record_first=ops if dry_run else 0, progress=progress)
        except ValueError as e:
            # the last line of defence, here only (tests calling simulate() still see the fault):
            # the validator and check_fits should have refused an object the simulator cannot run
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            fail(f"{object_file}: cannot be simulated on '{machine.name}': {reason}")
        finally:
            progress.close()
        if not (dry_run or timing_only):
            inputs = program_inputs(program, given, seed)
            progress = _Progress(total, console, "computing values")
            try:
                values = execute(program, bindings, inputs, progress)
            except ExecutionError as e:
                fail(f"{object_file}: {e}")
            finally:
                progress.close()
            result.outputs = {t.name: values[t.name] for t in program.graph.outputs}
            if check:
                result.checks = check_outputs(program, values)
                result.kernel_checks = check_kernels(program, values)
        result.wall_seconds = time.perf_counter() - started
        # a dry run's simulation is whole too, so it can be plotted
        s = summary(result, program, object_file, machine, {n: str(p) for n, p in output_paths.items()})

        try:
            for name, path in output_paths.items():
                stage_array(files, path, result.outputs[name])
            if trace_path is not None:
                files.stage(trace_path, trace_json(result.sim, machine, [k.name for k in program.kernels]))
            if plot_path is not None:
                files.stage(plot_path, lambda f: roofline_plot.write(s, machine, f, plot_as))
            files.commit()
        except OutputError as e:
            fail(str(e))

    if dry_run:
        view = dry_run_view(program, bindings, result.sim, ops)
        view["binding_cache"] = cache_use.state
        if json_out:
            sys.stdout.write(orjson.dumps(view).decode() + "\n")
        else:
            print_dry_run(view, console)
            console.print(cache_use.line(), markup=False, highlight=False, soft_wrap=True)
        return
    s["binding_cache"] = cache_use.state
    if profile:
        print_profile(s, console)
    if profile or verbose:
        print_bindings(s["bindings"], console, each=verbose)
        console.print(cache_use.line(), markup=False, highlight=False, soft_wrap=True)
    if check:
        print_check(s, console)
    if json_out:
        sys.stdout.write(orjson.dumps(s).decode() + "\n")
    elif not profile:
        console.print(f"{shown(object_file)} on {shown(machine.name)}: {s['cycles']:,} cycles, "
                      f"{s['utilization']:.1%} array utilization")
    if check and not result.check_passed:
        raise typer.Exit(1)



def main() -> None:
    from dfx import run_command

    run_command(app)
