"""`kpu-kernel-compiler`: a graph file in, a tiled `.kpu` object out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

DEFAULT_TARGET = "standard"

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def compile(
    input: str = typer.Argument(..., help="Graph to compile: .dfg, .json (kpu-sim graph)"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Object file (default: <input stem>.kpu)"),
    target: str = typer.Option(DEFAULT_TARGET, "--target", help="Machine config the tiles are chosen for"),
    accelerator: Optional[str] = typer.Option(None, "--accelerator", metavar="ID",
                                              help="The KPU of a system-schema --target with several"),
    dataflow: str = typer.Option("auto", "--dataflow", help="auto | os | ws | is"),
    emit_dfx: bool = typer.Option(False, "--emit-dfx", help="Also print the object file (JSON) on stdout"),
    dump: bool = typer.Option(False, "--dump", help="Print the graph and kernels; write nothing"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print the chosen tilings"),
    fuse: bool = typer.Option(True, "--fusion/--no-fusion",
                              help="Apply chains of map ops (bias, activation) to a kernel's result tile on chip"),
) -> None:
    """Compile a graph into a hardware-agnostic, tiled DFX object file."""
    from dfx import ObjectFileError, OutputError, OutputFiles, dumps, fail

    from .compile import compile_graph, kernel_name, lower_group
    from .fuse import fusion_groups
    from .synchronise import synchronise
    from .dump import dump_graph, dump_kernel
    from .errors import CompileError
    from .frontends import load_graph
    from .passes import canonicalise, split_long_rows
    from .target import load_target

    if dataflow not in ("auto", "os", "ws", "is"):
        fail(f"--dataflow: expected auto, os, ws or is, got '{dataflow}'")
    with OutputFiles(inputs=[input, target]) as files:
        try:
            out = None if dump else files.claim(output or f"{Path(input).stem}.kpu")
            graph, warnings = load_graph(input)
            graph = canonicalise(graph, warnings)
            for w in warnings:
                print(f"warning: {w}", file=sys.stderr)
            tgt = load_target(target, accelerator)
            if dump:
                graph = split_long_rows(graph, tgt, fuse)  # as compile_graph does
                print(dump_graph(graph))
                kernels: list = []  # the groups that lower, with their barriers, in order
                for i, group in enumerate(fusion_groups(graph, fuse)):
                    try:
                        kernels.append(lower_group(graph, group, kernel_name(group[0], i), tgt, dataflow))
                    except CompileError as e:
                        kernels.append(f"  (no kernel) {e}")
                synchronise([k for k in kernels if not isinstance(k, str)])
                for k in kernels:
                    print(k if isinstance(k, str) else dump_kernel(k))
                return
            program = compile_graph(graph, input, tgt, dataflow, fuse)
            data = dumps(program)
            files.stage(out, data)
            files.commit()
        except (CompileError, ObjectFileError, OutputError) as e:
            fail(str(e))
    if verbose:
        for k in program.kernels:
            print(dump_kernel(k), file=sys.stderr)
    if emit_dfx:
        sys.stdout.write(data.decode())
    print(f"wrote {out}: {len(program.kernels)} kernel(s)", file=sys.stderr)


def main() -> None:
    from dfx import run_command

    run_command(app)
