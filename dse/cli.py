"""`kpu-dse`: sweep machine configs over workloads, keep every row, show the Pareto frontier."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
OUTPUTS = ("results.csv", "pareto.png", "pareto.svg")


@app.command()
def dse(
    spec_file: str = typer.Argument(..., metavar="SPEC.yaml", show_default=False,
                                    help="Sweep spec (.yaml, .yml or .json)"),
    output: str = typer.Option(..., "-o", "--output", metavar="OUTDIR",
                               help="Folder of results.csv, pareto.png and pareto.svg; a rerun resumes there"),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", metavar="tcp://HOST:8786",
                                            help="Run on this Dask cluster instead of a local one"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, max=4096,
                                          help="Worker processes of the local cluster (default: one per core)"),
    serial: bool = typer.Option(False, "--serial", help="Evaluate the points one by one in this process, no Dask"),
    x: Optional[str] = typer.Option(None, "--x", help="Objective across the plot (default: the spec's first)"),
    y: Optional[str] = typer.Option(None, "--y", help="Objective up the plot (default: the spec's second)"),
) -> None:
    """Compile and simulate every point of a sweep (timing only), and show and plot its Pareto frontier."""
    from dfx import OutputError, OutputFiles, cli_console, fail

    from . import sweep
    from .plot import render
    from .report import frontier_tables, outcomes, panels
    from .results import ResultsError, Table, columns
    from .spec import OBJECTIVES, SpecError, read_spec

    if serial and (scheduler is not None or workers is not None):
        fail(f"--serial runs in this process: give it no {'--scheduler' if scheduler is not None else '--workers'}")
    if scheduler is not None and workers is not None:
        fail("--workers sizes the local cluster: with --scheduler the cluster has the workers it has")
    if output == "":  # Path("") is the current folder
        fail("--output: an empty path; name a folder")
    for option, name in (("--x", x), ("--y", y)):
        if name is not None and name not in OBJECTIVES:
            fail(f"{option}: expected one of {', '.join(OBJECTIVES)}, got '{name}'")
    try:
        spec = read_spec(spec_file)
    except SpecError as e:
        fail(str(e))
    x, y = x or spec.objectives[0], y or spec.objectives[1]
    if x == y:
        fail(f"--x and --y: both are {x}; a frontier plot needs two objectives")

    console = cli_console()
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    jobs = spec.jobs()
    with OutputFiles(inputs=[spec_file, *(w.path for w in spec.workloads)]) as files:
        try:
            paths = {name: files.claim(Path(output) / name) for name in OUTPUTS}
            table = Table(paths["results.csv"], columns(a.name for a in spec.axes))
            table.read()
        except (OutputError, ResultsError) as e:
            fail(str(e))
        pending = [job for _, job in jobs if job.key not in table.rows]
        engine = (sweep.serial() if serial or not pending else sweep.dask(scheduler, workers))
        where = ("in this process" if serial else f"on {scheduler}" if scheduler is not None
                 else f"on a local Dask cluster of {workers or sweep.local_cores()} worker process(es)")
        point_of = {job.key: point for point, job in jobs}
        failed = 0
        try:
            with engine as run, _Progress(console, len(pending)) as bar:
                # said once the cluster is up: one that cannot be used is the only line
                say(f"{len(jobs)} rows ({len(jobs) // len(spec.workloads)} points x {len(spec.workloads)} workloads): "
                    f"{len(jobs) - len(pending)} already in {paths['results.csv']}, {len(pending)} to evaluate"
                    + (f" {where}" if pending else ""))
                table.start()
                if table.cut:
                    say(f"warning: {table.cut}")

                def done(job, row) -> None:
                    nonlocal failed
                    axes = dict(zip((a.name for a in spec.axes), point_of[job.key].values))
                    table.append({"point": job.key, **axes, "workload": job.workload, **row})
                    failed += row["status"] != "ok"
                    bar(failed)

                lost = run(pending, {w.name: w.data for w in spec.workloads}, done)
        except (sweep.EngineError, ResultsError) as e:
            fail(str(e))
        finally:
            table.close()

        results = outcomes(spec, jobs, table.rows)
        try:
            # the rows in the spec's order, however the workers finished
            files.stage(paths["results.csv"], table.ordered([job.key for _, job in jobs]))
            png, svg = render(panels(results, x, y, spec.objectives), x, y, f"{Path(spec_file).name}: {x} and {y}")
            files.stage(paths["pareto.png"], png)
            files.stage(paths["pareto.svg"], svg)
            files.commit()
        except OutputError as e:
            fail(str(e))

    stdout = cli_console(stderr=False)
    for frontier in frontier_tables(spec, results):
        stdout.print(frontier)
    say(f"evaluated {len(pending) - len(lost)} rows ({failed} failed), skipped {len(jobs) - len(pending)} already "
        f"in {paths['results.csv']}; wrote " + ", ".join(str(paths[name]) for name in OUTPUTS))
    if lost:
        for job, reason in lost:
            say(f"lost: row {job.key} ({job.workload}): {reason}")
        say(f"{len(lost)} rows lost with their workers, not recorded: run the same command again to evaluate them")
        raise typer.Exit(1)


class _Progress:
    """A progress bar on stderr: rows done, how many failed, and the time left. Shown on a
    terminal only: a log gets the lines before and after."""

    def __init__(self, console, total: int):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.bar = Progress(TextColumn("rows"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), TextColumn("ETA"),
                            TimeRemainingColumn(), console=console, transient=True, disable=not console.is_terminal)
        self.task = self.bar.add_task("rows", total=total, failed=0)

    def __enter__(self) -> _Progress:
        self.bar.start()
        return self

    def __call__(self, failed: int) -> None:
        self.bar.update(self.task, advance=1, failed=failed)

    def __exit__(self, *exc) -> None:
        self.bar.stop()


def main() -> None:
    from dfx import run_command

    run_command(app)
