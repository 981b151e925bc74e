"""`kpu-loader`: bind a `.kpu` object to one machine, run it, check it, report the cycles."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def _fail(message: str) -> None:
    # one line whatever the message quotes from the input (a key may hold a line break)
    print("error: " + " ".join(message.splitlines()), file=sys.stderr)
    raise typer.Exit(2)


class _Progress:
    """A progress bar on stderr, shown only once a run has taken more than a second."""

    def __init__(self, total: int, console, what: str):
        self.total, self.console, self.what, self.start = total, console, what, time.perf_counter()
        self.bar = None

    def __call__(self, done: int) -> None:
        if self.bar is None:
            if time.perf_counter() - self.start < 1.0:
                return
            from rich.progress import Progress

            self.bar = Progress(console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command()
def load(
    object_file: str = typer.Argument(..., metavar="OBJECT.kpu", help="Object file from kpu-kernel-compiler"),
    config: str = typer.Option(..., "--config", help="Machine config (.json/.yaml) or a shipped name"),
    input: Optional[List[str]] = typer.Option(None, "--input", help="NAME=FILE.npy, repeatable"),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Write each output as NAME.npy here"),
    seed: int = typer.Option(0, "--seed", help="Seed for inputs not given with --input"),
    check: bool = typer.Option(False, "--check", help="Compare outputs with the numpy reference; exit 1 on mismatch"),
    profile: bool = typer.Option(False, "--profile", help="Print cycles, unit utilization, bytes, roofline"),
    trace_output: Optional[str] = typer.Option(None, "--trace-output", help="Write a Perfetto trace JSON"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Bind and schedule only: buffers, engines, first ops"),
    ops: int = typer.Option(20, "--ops", min=0, help="Scheduled ops shown by --dry-run"),
    timing_only: bool = typer.Option(False, "--timing-only", help="Simulate cycles without computing values"),
    binder: str = typer.Option("cp-sat", "--binder", help="cp-sat | greedy"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON summary on stdout"),
) -> None:
    """Bind OBJECT.kpu to a machine, simulate it cycle by cycle, and compute its outputs."""
    import orjson
    from rich.console import Console

    from dfx import ObjectFileError, read
    from hardware import ConfigError, load_machine

    from .binding import BindError, bind_greedy
    from .buffers import op_runs
    from .execute import ExecutionError
    from .inputs import InputError, program_inputs, read_input
    from .report import dry_run_view, print_check, print_dry_run, print_profile, summary
    from .run import LoadError, RunResult, bind_program, check_fits, check_outputs, execute, simulate

    console = Console(stderr=True)
    if binder not in ("cp-sat", "greedy"):
        _fail(f"--binder: expected cp-sat or greedy, got '{binder}'")
    skipping = "--dry-run" if dry_run else "--timing-only" if timing_only else None
    if skipping and (check or output_dir is not None):
        _fail(f"{'--check' if check else '--output-dir'} needs the values that {skipping} skips")
    started = time.perf_counter()
    try:
        program = read(object_file)
        machine = load_machine(config)
        given = dict(read_input(spec, program) for spec in input or [])
        check_fits(program, machine, object_file)
        if binder == "cp-sat":
            from .bind import bind_cpsat as bind_fn
        else:
            bind_fn = bind_greedy
        bindings = bind_program(program, machine, object_file, bind_fn)
    except (ObjectFileError, ConfigError, InputError, LoadError, BindError) as e:
        _fail(str(e))

    result = RunResult(bindings)
    total = sum(op_runs(k, op) for k in program.kernels for op in k.body)
    progress = _Progress(total, console, "simulating")
    try:
        # a dry run times the whole program too: an op's start depends on every op competing for its unit
        result.sim = simulate(program, machine, bindings, trace=trace_output is not None,
                              record_first=ops if dry_run else 0, progress=progress)
    finally:
        progress.close()
    if dry_run:
        _write_outputs(result, program, None, trace_output, machine)
        view = dry_run_view(program, bindings, result.sim, ops)
        if json_out:
            sys.stdout.write(orjson.dumps(view).decode() + "\n")
        else:
            print_dry_run(view, console)
        return
    if not timing_only:
        inputs = program_inputs(program, given, seed)
        progress = _Progress(total, console, "computing values")
        try:
            values = execute(program, bindings, inputs, progress)
        except ExecutionError as e:
            _fail(f"{object_file}: {e}")
        finally:
            progress.close()
        result.outputs = {t.name: values[t.name] for t in program.graph.outputs}
        if check:
            result.checks = check_outputs(program, values)
    result.wall_seconds = time.perf_counter() - started

    output_paths = _write_outputs(result, program, output_dir, trace_output, machine)
    s = summary(result, program, object_file, machine, output_paths)
    if profile:
        print_profile(s, console)
    if check:
        print_check(s, console)
    if json_out:
        sys.stdout.write(orjson.dumps(s).decode() + "\n")
    elif not profile:
        console.print(f"{object_file} on {machine.name}: {s['cycles']:,} cycles, "
                      f"{s['utilization']:.1%} array utilization")
    if check and not result.check_passed:
        raise typer.Exit(1)


def _write_outputs(result, program, output_dir: str | None, trace_output: str | None, machine) -> dict[str, str]:
    """Write the outputs' .npy files and the trace, once the run has succeeded; name -> path."""
    import numpy as np

    from hardware import write_trace

    paths: dict[str, str] = {}
    try:
        if output_dir is not None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            for name, value in result.outputs.items():
                path = Path(output_dir) / f"{name}.npy"
                # plain numpy cannot name bf16/f8 in a .npy: widen them to f32, which is exact
                np.save(path, value.astype(np.float32) if value.dtype.kind == "V" else value)
                paths[name] = str(path)
        if trace_output is not None:
            write_trace(trace_output, result.sim, machine, [k.name for k in program.kernels])
    except OSError as e:
        _fail(f"{e.filename}: cannot write: {e.strerror}")
    return paths


def main() -> None:
    app()
