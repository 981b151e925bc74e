"""Turn the expanded schedule of bound kernels into the simulator's task stream, lazily.

Dependencies of a task:
- the body's `depends_on`: the latest instance of that op on the same worker;
- buffer reuse: instance n of a move into a buffer of depth d waits until the readers of
  instance n - d are done (depth 2 lets the next tile load while this one computes); the
  array's accumulators are a depth-1 buffer drained by the REGISTER -> L2 store;
- barriers, the only order between kernels: a BARRIER becomes a task (no cycles) on each
  compute tile that waits for the last instance of each op it lists, on every compute tile of
  the kernel it names; the moves that depend on it start after it;
- memory reuse across kernels: each kernel is bound on its own, so its buffers may sit where an
  earlier kernel's still are. The first `depth` fills of a buffer wait for the last use of every
  earlier buffer they overlap (same level, bank and bytes). Kernels overlap only where their
  buffers do not.
A DMA engine moves data through the external memory channel it is wired to (engine i to
channel i mod channels, as the simulator does), so balancing DMA engines balances channels.
"""

from __future__ import annotations

from typing import Iterator

from dfx import Barrier, Compute, DataMove, Kernel, Program, itemsize
from hardware import Task

from .binding import Binding
from .execution import compute_ops
from .buffers import engine_kind, l2_port_op
from .relocate import Occupancy, place_of
from .schedule import accumulating, expand, move_slices, readers, region_elements, table_values, tile_slices

DEP_WINDOW = 1 << 16  # the simulator's read-ahead: deps further back have surely finished


class TaskStream:
    """Task ids and the kernel-to-kernel dependencies across one program."""

    def __init__(self, program: Program):
        self.program = program
        self.next_id = 0
        # kernel -> (worker, op_id) -> the tasks whose end is that op's last instance ending: its
        # own task, or for an op that ran none (a view, a move of an empty window) what it waited on
        self.finished: dict[str, dict[tuple[int, int], frozenset[int]]] = {}
        self.occupied = Occupancy()  # tagged with the id of each buffer's last use

    def kernel_tasks(self, kernel: Kernel, binding: Binding, phase: int = 0) -> Iterator[Task]:
        """The kernel's tasks, tagged with `phase` (its number in the program)."""
        g = self.program.graph
        workers = binding.workers
        last: dict[tuple[int, int], int] = {}  # (worker, op_id) -> id of its latest instance
        instance: dict[tuple[int, int], int] = {}  # (worker, op_id) -> instances so far
        reader: dict[tuple[int, int, int], int] = {}  # (worker, op_id, instance) -> latest reader id
        depth = {op.op_id: op.depth for op in kernel.body if isinstance(op, DataMove)}
        ends_of = {l.induction_var: l.end - 1 for l in kernel.tile_loops}  # each loop's last step
        computes = compute_ops(kernel, g)
        ends: dict[tuple[int, int], frozenset[int]] = {}
        l2_bank = _l2_banks(kernel, binding)
        previous_users = self._previous_users(binding)  # (worker, op_id) -> ids its buffer waits for
        shared = kernel.shared_moves()  # worker 0's, read by every worker
        for worker, op, env in expand(kernel, workers):
            tid = self.next_id
            self.next_id += 1
            deps = set()
            for d in op.depends_on:
                key = (0 if d in shared else worker, d)
                if key in last:
                    deps.add(last[key])
                    # this op reads the buffer `d` filled: remember it for d's next overwrite
                    reader[worker, d, instance.get(key, 0)] = tid
                else:  # an op that ran no task: what it waited on
                    deps.update(ends.get(key, ()))
            # a new instance of a buffer waits for the readers of the one `depth` back
            fresh = not (isinstance(op, Compute) and accumulating(op, env))
            if fresh:
                n = instance.get((worker, op.op_id), 0) + 1
                instance[worker, op.op_id] = n
                for w in (range(workers) if op.op_id in shared else (worker,)):
                    old = reader.pop((w, op.op_id, n - depth.get(op.op_id, 1)), None)
                    if old is not None:
                        deps.add(old)
                if n <= depth.get(op.op_id, 1):  # a first fill of each slot of the buffer
                    deps.update(previous_users.get((worker, op.op_id), ()))
            if isinstance(op, Barrier):
                deps.update(self._barrier_deps(op, ends, workers))
            window = tuple(sorted(d for d in deps if tid - d < DEP_WINDOW))
            if isinstance(op, DataMove):
                src, dst = op.source, op.destination
                if op.move_type == "VIEW":  # nothing moves: the view is ready when its source is
                    ends[worker, op.op_id] = frozenset(deps)
                    continue
                kind = engine_kind(src.level, dst.level)
                tensor = g.tensors[dst.tensor]
                # the bytes copied; a fill costs no external-memory bytes
                _, part = move_slices(op, g.tensors[src.tensor].shape, tensor.shape, env, table_values(src, g))
                nbytes = region_elements(part) * itemsize(tensor.dtype)
                if not nbytes:  # a window's tile wholly outside its tensor: no task
                    ends[worker, op.op_id] = frozenset(deps)
                    continue
                engine = binding.engines[op.op_id, worker]
                # one queue per op across kernels: a later kernel's move waits behind the earlier kernel's
                task = Task(tid, kind, engine, window, stream=op.op_id,
                            bytes=nbytes, src_level=src.level, dst_level=dst.level,
                            l2_bank=l2_bank.get((op.op_id, worker)),
                            transpose=op.transpose or op.permutation is not None, phase=phase,
                            label=f"{dst.tensor} {src.level}->{dst.level}",
                            args={v: env[v] for v in dst.tile_indices if v in env})
            elif isinstance(op, Compute):
                shapes = [_tile_shape(r, g, env) for r in op.inputs]
                label = f"{op.compute_type} {op.output.tensor}"
                # the loop the compute accumulates over, if any: its tiles add into one result
                over = op.accumulate.partition(">")[0].strip() if ">" in op.accumulate else None
                args = {v: env[v] for v in [*op.output.tile_indices, over] if v in env}
                opdef, attrs = computes[op.op_id]
                if opdef.tile_mnk is not None:  # the registry says the array runs it
                    mm, n, k = opdef.tile_mnk(shapes, attrs)
                    # the accumulators drain on the last step of that loop
                    drain = over is None or env[over] == ends_of[over]
                    task = Task(tid, "array", worker, window, m=mm, n=n, k=k, dataflow=kernel.dataflow,
                                drain=drain, phase=phase, label=label, args=args)
                else:  # the vector unit beside it, for the elements of each op class
                    work = opdef.vector_work(shapes, _tile_shape(op.output, g, env), attrs)
                    task = Task(tid, "vector", worker, window, vector_work=tuple(sorted(work.items())),
                                phase=phase, label=label, args=args)
            else:  # a barrier: passed on this compute tile when what it waits for has finished
                task = Task(tid, "barrier", worker, window, stream=op.op_id, phase=phase,
                            label=f"BARRIER {op.kernel or kernel.name} {op.wait_for}")
            last[worker, op.op_id] = tid
            ends[worker, op.op_id] = frozenset((tid,))
            yield task
        self.finished[kernel.name] = ends
        self._occupy(kernel, binding, last, shared)

    def _barrier_deps(self, barrier: Barrier, ends: dict, workers: int) -> set[int]:
        """The last instance of each op the barrier waits for, on every compute tile of its kernel
        (this one's so far, or an earlier kernel's)."""
        done = self.finished[barrier.kernel] if barrier.kernel is not None else ends
        waited = set(barrier.wait_for)
        return {t for (_, op_id), tasks in done.items() if op_id in waited for t in tasks}

    def _previous_users(self, binding: Binding) -> dict[tuple[int, int], set[int]]:
        """(worker, op_id) of each buffer -> the last uses of earlier buffers under its bytes."""
        return {(bb.buffer.worker, bb.buffer.op_id):
                {user for _, _, user in self.occupied.under(place_of(bb), bb.address, bb.end)}
                for bb in binding.buffers}

    def _occupy(self, kernel: Kernel, binding: Binding, last: dict[tuple[int, int], int], shared: set[int]) -> None:
        """This kernel's buffers hide the earlier ones they overlap: their last use is later. A
        buffer's last use is the latest task of the move that fills it or of an op that reads it
        (a shared buffer's readers: on any worker)."""
        consumers = readers(kernel)
        for bb in binding.buffers:
            w, op_id = bb.buffer.worker, bb.buffer.op_id
            users = range(binding.workers) if op_id in shared else (w,)
            uses = [last[u, o] for u in users for o in (op_id, *consumers[op_id]) if (u, o) in last]
            if uses:
                self.occupied.claim(bb, max(uses))


def _tile_shape(ref, g, env) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in tile_slices(ref, g.tensors[ref.tensor].shape, env))


def _l2_banks(kernel: Kernel, binding: Binding) -> dict[tuple[int, int], int]:
    """(op_id, worker) -> the bank of the L2 buffer whose port a move uses."""
    filled = {(b.buffer.op_id, b.buffer.worker): b.bank for b in binding.buffers if b.buffer.level == "L2"}
    out = {}
    for op in kernel.body:
        port = l2_port_op(op) if isinstance(op, DataMove) else None
        for w in range(binding.workers):
            if (port, w) in filled:
                out[op.op_id, w] = filled[port, w]
    return out
