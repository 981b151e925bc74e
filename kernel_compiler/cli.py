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
    input: str = typer.Argument(..., help="Graph to compile: .dfg, .json (kpu-sim graph), .onnx, .hlo or .hlo.txt (XLA HLO text)"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Object file (default: <input stem>.kpu)"),
    target: str = typer.Option(DEFAULT_TARGET, "--target", help="Machine config the tiles are chosen for"),
    accelerator: Optional[str] = typer.Option(None, "--accelerator", metavar="ID",
                                              help="The KPU of a system-schema --target with several"),
    dataflow: str = typer.Option("auto", "--dataflow", help="auto | os | ws | is"),
    objective: str = typer.Option("latency", "--objective",
                                  help="What the tiles are chosen for: latency (the array kept fed, then fewest DRAM "
                                       "bytes) | energy | edp (energy x cycles), by the loader's models"),
    emit_dfx: bool = typer.Option(False, "--emit-dfx", help="Also print the object file (JSON) on stdout"),
    dump: bool = typer.Option(False, "--dump", help="Print the graph and kernels; write nothing"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print the chosen tilings"),
    fuse: bool = typer.Option(True, "--fusion/--no-fusion",
                              help="Apply chains of map ops (bias, activation) to a kernel's result tile on chip, "
                                   "and make one op of a chain that spells softmax, layer norm or GELU; "
                                   "--no-fusion: every graph op its own kernel"),
    keep: bool = typer.Option(True, "--keep-on-chip/--no-keep-on-chip",
                              help="Keep an intermediate in L3 from the kernel writing it to the last reading it "
                                   "where the target has room; --no-keep-on-chip: every one crosses external memory"),
) -> None:
    """Compile a graph into a hardware-agnostic, tiled DFX object file."""
    from dfx import ObjectFileError, OutputError, OutputFiles, encode, fail, read_back

    from .compile import compile_graph, graph_passes, lower_kernels
    from .dump import dump_graph, dump_homes, dump_kernel, dump_objective
    from .errors import CompileError
    from .frontends import load_graph
    from .residency import keep_on_chip
    from .synchronise import synchronise
    from .target import OBJECTIVES, load_target

    def warn(warnings: list[str]) -> None:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)

    if dataflow not in ("auto", "os", "ws", "is"):
        fail(f"--dataflow: expected auto, os, ws or is, got '{dataflow}'")
    if objective not in OBJECTIVES:
        fail(f"--objective: expected {', '.join(OBJECTIVES[:-1])} or {OBJECTIVES[-1]}, got '{objective}'")
    if output == "":  # not the default name: the user named no file
        fail("-o: an empty path; name a file")
    with OutputFiles(inputs=[input, target]) as files:
        try:
            out = None if dump else files.claim(output or f"{Path(input).stem}.kpu")
            graph, warnings = load_graph(input)
            warn(warnings)
            tgt = load_target(target, accelerator, objective)
            warnings = []  # the passes'
            if dump:  # the stages compile_graph runs, printed, and every group whether it lowers or not
                graph = graph_passes(graph, tgt, fuse, warnings)
                warn(warnings)
                print(dump_graph(graph))
                print(dump_objective(tgt.objective))
                kernels = list(lower_kernels(graph, tgt, dataflow, fuse))
                lowered = [k for k in kernels if not isinstance(k, CompileError)]
                if keep:
                    print(dump_homes(keep_on_chip(lowered, graph, tgt)))
                synchronise(lowered)
                for k in kernels:
                    print(f"  (no kernel) {k}" if isinstance(k, CompileError) else dump_kernel(k))
                return
            program = compile_graph(graph, input, tgt, dataflow, fuse, warnings, keep)
            warn(warnings)
            encoded = encode(program)
            read_back(encoded, program, out)  # as the loader reads it: an object it would refuse is never written
            files.stage(out, encoded.write)
            files.commit()
        except (CompileError, ObjectFileError, OutputError) as e:
            fail(str(e))
    if verbose:
        print(dump_objective(program.objective), file=sys.stderr)
        for k in program.kernels:
            print(dump_kernel(k), file=sys.stderr)
    if emit_dfx:
        sys.stdout.write(b"".join(encoded.pieces()).decode())
    print(f"wrote {out}: {len(program.kernels)} kernel(s)", file=sys.stderr)


def main() -> None:
    from dfx import run_command

    run_command(app)
