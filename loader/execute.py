"""Functional execution: every tile op of the schedule computed in numpy.

Each (tensor, level) holds the tile last moved there, so a schedule that loads the wrong
tile, or forgets one, computes wrong numbers and `--check` catches it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dfx import REGISTRY, Compute, DataMove, Kernel, OpDef, Program, accumulation_dtype, convert, lookup, numpy_dtype

from .schedule import accumulating, expand, tile_slices


PROGRESS_EVERY = 4096  # tile ops between progress callbacks


class ExecutionError(ValueError):
    """A tile op that cannot execute; str(e) is one line naming the kernel and op."""


def run_kernel(kernel: Kernel, program: Program, memory: dict[str, np.ndarray], workers: int,
               progress: Callable[[int], None] | None = None, done: int = 0) -> int:
    """Execute `kernel`, reading its inputs from and writing its outputs to `memory`
    (external memory: tensor name -> whole array). Tile ops are counted on from `done`, with
    `progress(count)` every PROGRESS_EVERY of them; returns the count."""
    g = program.graph
    for name in kernel.outputs:
        t = g.tensors[name]
        memory[name] = np.zeros(t.shape, numpy_dtype(t.dtype))
    acc = numpy_dtype(accumulation_dtype([g.tensors[n].dtype for n in kernel.inputs + kernel.outputs]))
    computes = compute_ops(kernel, g)
    # (worker, tensor, level) -> the tile held there
    tiles: dict[tuple[int, str, str], np.ndarray] = {}
    for worker, op, env in expand(kernel, workers):
        done += 1
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done)
        try:
            _run_op(op, env, worker, tiles, memory, g, acc, computes)
        except KeyError as e:  # a well-formed object whose ops do not fit together
            key = e.args[0]  # (worker, tensor, level) of a tile, or a tensor in external memory
            what = f"{key[1]} at {key[2]}" if isinstance(key, tuple) else f"{key} at EXTERNAL"
            raise ExecutionError(f"kernel '{kernel.name}' op {op.op_id}: reads {what}, "
                                 f"which no earlier op filled") from None
        except ValueError as e:
            raise ExecutionError(f"kernel '{kernel.name}' op {op.op_id}: {str(e).splitlines()[0]}") from None
    return done


def _run_op(op, env: dict, worker: int, tiles: dict, memory: dict[str, np.ndarray], g, acc: np.dtype,
            computes: dict) -> None:
    if isinstance(op, DataMove):
        src, dst = op.source, op.destination
        if src.level == "EXTERNAL":
            tile = memory[src.tensor][tile_slices(src, g.tensors[src.tensor].shape, env)]
        else:
            tile = tiles[worker, src.tensor, src.level]
        if dst.level == "EXTERNAL":
            out = memory[dst.tensor]
            out[tile_slices(dst, out.shape, env)] = convert(tile, g.tensors[dst.tensor].dtype)
        elif op.transpose:
            tiles[worker, dst.tensor, dst.level] = np.swapaxes(tile, -1, -2)
        else:
            tiles[worker, dst.tensor, dst.level] = tile
    elif isinstance(op, Compute):
        _compute(op, env, worker, tiles, acc, computes[op.op_id])


# the tile computes this loader executes and times: those of registry ops that say what a tile
# does and what it costs, on the array or on the vector unit
COMPUTES = {op.compute_type: op for op in REGISTRY.values()
            if op.tile is not None and (op.tile_mnk is not None or op.vector_work is not None)}


def compute_ops(kernel: Kernel, g) -> dict[int, tuple[OpDef, dict]]:
    """Each COMPUTE of the kernel -> the registry op it runs and the attributes of the graph op
    whose result it makes (a fused kernel runs several graph ops), defaults filled."""
    producer = {t: op for op in g.ops for t in op.outputs}
    out = {}
    for op in kernel.body:
        if isinstance(op, Compute):
            source = producer[op.output.tensor]
            out[op.op_id] = (COMPUTES[op.compute_type], COMPUTES[op.compute_type].normalize_attrs(source.attrs))
    return out


def _compute(op: Compute, env: dict, worker: int, tiles: dict, acc: np.dtype, compute: tuple[OpDef, dict]) -> None:
    key = (worker, op.output.tensor, op.output.level)
    partial = tiles[key] if accumulating(op, env) else None
    opdef, attrs = compute
    tiles[key] = opdef.tile([tiles[worker, r.tensor, r.level] for r in op.inputs], partial, acc, attrs)


def reference_op(op, values: dict[str, np.ndarray], g) -> list[np.ndarray]:
    """The registry's numpy reference of graph op `op` on the values its inputs have in `values`."""
    opdef = lookup(op.op_type)
    return opdef.reference([values[n] for n in op.inputs], opdef.normalize_attrs(op.attrs),
                           [g.tensors[n].dtype for n in op.outputs])
