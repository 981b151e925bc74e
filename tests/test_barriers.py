"""Explicit synchronisation: a BARRIER wherever a kernel reads what an earlier kernel wrote, the
only order the loader keeps between kernels."""

from __future__ import annotations

import json

from conftest import CONFIGS, DATA, assert_one_line_error, run_cli
from dfx import Barrier, DataMove, read
from dfx.objfile import _digest

CHAIN = DATA / "dfg" / "workloads__nla__matmul_256x256_chained.dfg"
STANDARD = CONFIGS / "standard.json"


def compiled(tmp_path):
    obj = tmp_path / "chain.kpu"
    assert run_cli("compiler", CHAIN, "-o", obj).returncode == 0
    return obj


def test_each_read_of_an_intermediate_waits_on_a_barrier(tmp_path):
    program = read(compiled(tmp_path))
    first, *rest = program.kernels
    assert not any(isinstance(op, Barrier) for op in first.body)  # it reads graph inputs only
    for earlier, kernel in zip(program.kernels, rest):
        barrier = kernel.body[0]
        assert isinstance(barrier, Barrier) and barrier.kernel == earlier.name
        stores = [op.op_id for op in earlier.body if isinstance(op, DataMove) and op.destination.level == "EXTERNAL"]
        assert barrier.wait_for == stores
        reads = [op for op in kernel.body if isinstance(op, DataMove) and op.source.level == "EXTERNAL"
                 and op.source.tensor in earlier.outputs]
        assert reads and all(barrier.op_id in op.depends_on for op in reads)
    dump = run_cli("compiler", CHAIN, "--dump").stdout
    assert dump.count("BARRIER waits for kernel") == len(rest)


def resigned(obj, edit) -> None:
    doc = json.loads(obj.read_text())
    edit(doc["body"]["kernels"])
    doc["sha256"] = _digest(doc["body"])
    obj.write_text(json.dumps(doc))


def test_a_read_with_its_barrier_removed_is_refused(tmp_path):
    obj = compiled(tmp_path)

    def drop_barrier(kernels):
        kernel = kernels[2]
        kernel["body"] = [op for op in kernel["body"] if op["type"] != "BARRIER"]
        for op in kernel["body"]:
            op["depends_on"] = [d for d in op.get("depends_on", []) if d != 0]

    resigned(obj, drop_barrier)
    proc = run_cli("loader", obj, "--config", STANDARD)
    assert_one_line_error(proc, "kernel 'matmul_2'", "reads intermediate", "no BARRIER", "kernel 'matmul_1'")


def test_a_barrier_that_waits_for_too_little_is_refused(tmp_path):
    obj = compiled(tmp_path)

    def forget_a_store(kernels):
        barrier = kernels[1]["body"][0]
        barrier["wait_for"] = []

    resigned(obj, forget_a_store)
    assert_one_line_error(run_cli("loader", obj, "--config", STANDARD), "kernel 'matmul_1'", "no BARRIER")


def test_a_barrier_on_a_missing_op_is_refused(tmp_path):
    obj = compiled(tmp_path)

    def wait_for_nothing_there(kernels):
        kernels[1]["body"][0]["wait_for"] = [999]

    resigned(obj, wait_for_nothing_there)
    assert_one_line_error(run_cli("loader", obj, "--config", STANDARD), "kernel 'matmul_1' op 0",
                          "waits for ops [999]")


def test_barriers_show_in_the_dry_run_and_the_trace(tmp_path):
    obj, trace = compiled(tmp_path), tmp_path / "trace.json"
    proc = run_cli("loader", obj, "--config", STANDARD, "--dry-run", "--json", "--trace-output", trace)
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)
    assert [(b["kernel"], b["waits_for_kernel"]) for b in view["barriers"]] == [
        ("matmul_1", "matmul_0"), ("matmul_2", "matmul_1"), ("matmul_3", "matmul_2")]
    events = json.loads(trace.read_text())["traceEvents"]
    passed = [e for e in events if e.get("ph") == "X" and e["name"].startswith("BARRIER")]
    assert len(passed) == sum(b["compute_tiles"] for b in view["bindings"][1:])  # one per tile of each
    assert all(e["dur"] == 0 for e in passed)


def test_no_read_of_an_intermediate_starts_before_what_it_reads_is_written(tmp_path):
    """Timed by the simulator, whatever the barriers say: every move that reads a kernel's
    result from external memory starts after every move that wrote a part of what it reads
    ended (a load waits for those writes, not for the whole kernel: `TaskStream._written`), and
    every move reading it from its home in L3 after the last task of the kernel writing it."""
    from hardware import load_machine
    from loader import bind_greedy, bind_program, simulate
    from loader.schedule import move_slices

    program, machine = read(compiled(tmp_path)), load_machine(STANDARD)
    bindings = bind_program(program, machine, "chain", bind_greedy)
    result = simulate(program, machine, bindings, record_first=1 << 20)
    writer = {t: i for i, k in enumerate(program.kernels) for t in k.outputs}
    shapes = {n: t.shape for n, t in program.graph.tensors.items()}

    def region(task, level_from: str, level_to: str, side: int):
        """The part of its tensor a move task reads (side 0) or writes (side 1)."""
        op = next(op for op in program.kernels[task.phase].body if isinstance(op, DataMove)
                  and op.destination.tensor == task.label.split(" ")[0]
                  and (op.source.level, op.destination.level) == (level_from, level_to))
        return move_slices(op, shapes[op.source.tensor], shapes[op.destination.tensor], task.args)[side]

    def overlap(a, b):
        return all(x.start < y.stop and y.start < x.stop for x, y in zip(a, b))

    writes, ends, reads = {}, {}, {}
    for task, start, end, _ in result.first_tasks:
        tensor, path = task.label.split(" ", 1)
        if task.phase == writer.get(tensor):
            ends[tensor] = max(ends.get(tensor, 0), end)
            if path == "L3->EXTERNAL":  # a move in parts ends with its "(2 parts)" task
                writes.setdefault(tensor, []).append((region(task, "L3", "EXTERNAL", 1), end))
        elif path.startswith(("EXTERNAL->", "L3->")):
            reads.setdefault(tensor, []).append((start, path, task))
    intermediates = [k.outputs[0] for k in program.kernels[:-1]]
    kept = [t for t in intermediates if program.graph.tensors[t].home == "L3"]
    assert kept and set(kept) < set(intermediates)  # both kinds are met
    for t in intermediates:
        assert reads[t]
        for start, path, task in reads[t]:
            if t in kept:
                assert start >= ends[t]
            elif path.startswith("EXTERNAL->"):
                read_from = region(task, "EXTERNAL", path.split("->")[1], 0)
                assert start >= max(end for written, end in writes[t] if overlap(written, read_from))
    # and kernels do overlap where they may: a kernel's A (a graph input) loads before the
    # accumulator it reads (the kernel before's result) is written
    assert any(min(start for start, _, _ in reads[k.inputs[0]]) < ends[k.inputs[2]] for k in program.kernels[1:])
