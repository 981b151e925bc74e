"""What a run says, and what --check holds it to.

Each element is checked against a tolerance of its own, from the magnitudes of the values it
is computed from (the registry's rule), never the tensor's mean: a large element elsewhere must
not hide an element a kernel got wrong. The check line says what the worst element was held to;
piped to a log, no message or table row is cut in two, and no escape code is written."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import CONFIGS
from dfx import Graph, Op, Tensor, dumps, loads
from dfx.kernel import IndexTable
from hardware import load_machine
from kernel_compiler.compile import compile_graph
from kernel_compiler.shape_inference import infer_shapes
from kernel_compiler.target import load_target
from loader import bind_greedy, bind_program, execute
from loader.run import OutputCheck, check_kernels, check_outputs, compare

STANDARD = str(CONFIGS / "standard.json")
HUGE = 1e12  # one element of the input: under a tolerance from the tensor's mean, errors of 1e3 passed


def graph(ops: list[tuple[str, str, list[str], dict]], inputs: dict[str, tuple[int, ...]],
          intermediates: tuple[str, ...] = ()) -> Graph:
    """f32 graph of `ops` (op type, result name, operands, attributes), each result an output
    but the `intermediates`."""
    g = Graph("review")
    for name, shape in inputs.items():
        g.tensors[name] = Tensor(name, shape, "f32", "input")
    for i, (op_type, out, args, attrs) in enumerate(ops):
        g.tensors[out] = Tensor(out, (), "f32", "intermediate" if out in intermediates else "output")
        g.ops.append(Op(f"op{i}", op_type, args, [out], attrs, f"review op {i}"))
    return infer_shapes(g, [])


def run(program, inputs: dict[str, np.ndarray]) -> tuple[dict[str, OutputCheck], dict[str, OutputCheck]]:
    """Bind, execute and check in-process: (kernel checks, output checks)."""
    bindings = bind_program(program, load_machine(STANDARD), "review", bind_greedy)
    values = execute(program, bindings, inputs)
    return check_kernels(program, values), check_outputs(program, values)


def passed(checks: tuple[dict[str, OutputCheck], dict[str, OutputCheck]]) -> bool:
    return all(c.passed for group in checks for c in group.values())


def inputs_with_one_huge(shapes: dict[str, tuple[int, ...]], huge: str) -> dict[str, np.ndarray]:
    """Uniform in [-2, 2], but input `huge` holds HUGE at [0, 0]."""
    rng = np.random.default_rng(0)
    values = {name: rng.uniform(-2, 2, shape).astype(np.float32) for name, shape in shapes.items()}
    values[huge][0, 0] = HUGE
    return values


# ---- defect A: a wrong element fails however large the others are ----------------------------


def test_a_pad_whose_move_fills_the_wrong_value_fails_the_check():
    """PAD's pad_value is 1.5; its move's fill re-signed to 1000 (the Program built directly,
    as no validator would pass it) writes 1000 where the reference has 1.5."""
    shapes = {"x0": (20, 30)}
    g = graph([("PAD", "y", ["x0"], {"padding": [[1, 2], [3, 0]], "pad_value": 1.5})], shapes)
    program = loads(dumps(compile_graph(g, "pad.dfg", load_target(STANDARD))))
    x = inputs_with_one_huge(shapes, "x0")
    assert passed(run(program, x))

    kernel = program.kernels[0]
    [fill] = [i for i, op in enumerate(kernel.body) if getattr(op, "fill", None) == 1.5]
    body = list(kernel.body)
    body[fill] = dataclasses.replace(body[fill], fill=1000.0)
    wrong = dataclasses.replace(program, kernels=[dataclasses.replace(kernel, body=body)])
    kernels, outputs = run(wrong, x)
    for check in (kernels[kernel.name], outputs["y"]):
        assert not check.passed
        assert check.worst_error == pytest.approx(998.5)
        assert check.worst_fraction > 1e6  # held to 1e-4 + 1e-4 x 1.5, not to the tensor's mean of 1e9


def test_a_gather_whose_table_names_another_ops_list_fails_the_check():
    """GATHER of rows [0, 3, 2] of x (no run of its bytes, so moved), its index table pointed at
    the TRANSPOSE's perms [0, 2, 1]: rows 1 and 2 others, each element off by about its own
    size, and x[0, 0] huge."""
    shapes = {"x": (4, 8), "z": (2, 3, 4)}
    g = graph([("GATHER", "rows", ["x"], {"indices": [0, 3, 2], "axis": 0}),
               ("TRANSPOSE", "zt", ["z"], {"perms": [0, 2, 1]})], shapes)
    transpose = g.ops[1].name
    program = loads(dumps(compile_graph(g, "gather.dfg", load_target(STANDARD))))
    x = inputs_with_one_huge(shapes, "x")
    assert passed(run(program, x))

    gather = next(k for k in program.kernels if k.op == "GATHER")
    body = []
    for op in gather.body:
        table = getattr(getattr(op, "source", None), "table", None)
        if table is not None:
            source = dataclasses.replace(op.source, table=IndexTable(table.dim, transpose, "perms"))
            op = dataclasses.replace(op, source=source)
        body.append(op)
    assert body != gather.body
    wrong = dataclasses.replace(program, kernels=[dataclasses.replace(k, body=body) if k is gather else k
                                                  for k in program.kernels])
    kernels, outputs = run(wrong, x)
    assert not kernels[gather.name].passed and not outputs["rows"].passed
    assert outputs["zt"].passed


def test_each_element_is_held_to_its_own_magnitude():
    want = np.array([HUGE, 1.0, 0.0], np.float32)
    assert compare(want, want, 0.0, 1e-4).passed
    off = want + np.array([0, 0.01, 0], np.float32)
    check = compare(off, want, 0.0, 1e-4)
    assert not check.passed and check.worst_fraction == pytest.approx(100, rel=1e-3)
    # a magnitude larger than the element's own size (what it is computed from) allows more
    assert compare(off, want, 0.0, 1e-4, magnitude=np.array([HUGE, 1000.0, 1.0])).passed


def test_a_matmul_row_is_held_to_its_own_products():
    """The registry's rule for a contraction, |A| @ |B|: a row of A a million times larger than
    the others loosens its own row of C only."""
    shapes = {"a": (32, 64), "b": (64, 48)}
    program = loads(dumps(compile_graph(graph([("MATMUL", "c", ["a", "b"], {})], shapes), "mm.dfg",
                                        load_target(STANDARD))))
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, shapes[n]).astype(np.float32) for n in ("a", "b"))
    a[0] *= 1e6
    bindings = bind_program(program, load_machine(STANDARD), "review", bind_greedy)
    values = execute(program, bindings, {"a": a, "b": b})
    assert passed((check_kernels(program, values), check_outputs(program, values)))
    want = a.astype(np.float64) @ b.astype(np.float64)  # numpy's, independent of the registry
    assert np.allclose(values["c"], want, rtol=1e-5, atol=1e-5 * np.abs(a[0]).max())
    values["c"] = values["c"].copy()
    values["c"][5, 7] += 0.05  # its 64 products sum to about 16 in magnitude: 30 times its tolerance
    assert not check_outputs(program, values)["c"].passed
    assert not check_kernels(program, values)[program.kernels[0].name].passed


@pytest.mark.parametrize("op_type, x, wrong", [
    ("SOFTMAX", [[1000.0, 0.0, 0.0, 0.0]], lambda y: np.where(y > 0.5, 0.85, y)),  # the row's top element
    ("EXP", [[80.0, 1.0]], lambda y: y * 1.005),  # 0.5% off
    # 0.1 moved from the top element to the next (0.73 and 0.27)
    ("SOFTMAX", [[5000.0, 4999.0, 4990.0, 4980.0]], lambda y: y + [[-0.1, 0.1, 0.0, 0.0]]),
], ids=["softmax_top", "exp_steep", "softmax_large_logits"])
def test_a_kernel_of_exact_inputs_is_held_to_its_own_rounding(op_type, x, wrong):
    """A kernel's inputs are what it read, exact for its check: a steep map or a softmax row's
    largest element is held to its own size, not to its operands' carried through the slope
    (which let 0.85 pass for 1.0 and exp(80) 0.5% off); a softmax's logits to their distance
    from their row's max, where its rounding starts, not to their size (logits near 5,000, each
    held off by up to 0.5, let the top two pass 0.1 off)."""
    x = np.asarray(x, np.float32)
    program = loads(dumps(compile_graph(graph([(op_type, "y", ["x"], {})], {"x": x.shape}), "steep.dfg",
                                        load_target(STANDARD))))
    bindings = bind_program(program, load_machine(STANDARD), "review", bind_greedy)
    values = execute(program, bindings, {"x": x})
    assert passed((check_kernels(program, values), check_outputs(program, values)))
    values["y"] = wrong(values["y"].astype(np.float64)).astype(np.float32)
    assert not check_kernels(program, values)[program.kernels[0].name].passed


def test_a_softmax_may_pick_another_top_class_where_its_logits_may_be_off_by_more_than_their_gap():
    """Logits that cancel from products some 20,000 in size may each be off by about 4 (f32, two
    ops deep): the graph output's softmax, saturated on logit 1 in the reference, may then be
    saturated on logit 2, and the check must allow it (to first order the top element barely
    moves, and a deep network on generated weights failed end to end while every kernel passed).
    Logits that far apart that their tolerance cannot reorder them still hold the softmax."""
    g = graph([("MATMUL", "z", ["a", "b"], {}), ("SOFTMAX", "y", ["z"], {})], {"a": (1, 2), "b": (2, 4)}, ("z",))
    program = loads(dumps(compile_graph(g, "flip.dfg", load_target(STANDARD))))
    a = np.array([[100, 100]], np.float32)
    b = np.array([[100, 100, 100, 100], [-100, -99.9, -99.95, -100.05]], np.float32)
    bindings = bind_program(program, load_machine(STANDARD), "review", bind_greedy)
    values = execute(program, bindings, {"a": a, "b": b})
    assert passed((check_kernels(program, values), check_outputs(program, values)))
    z = (a.astype(np.float64) @ b.astype(np.float64))[0]
    assert np.argmax(values["y"][0]) == 1 and np.allclose(z, [0, 10, 5, -5], atol=1e-3)
    flipped = z + np.array([0, -3, 3, 0])  # within the logits' tolerance: the top class is now 2
    e = np.exp(flipped - flipped.max())
    values["y"] = (e / e.sum())[None].astype(np.float32)
    assert abs(values["y"][0, 1] - 0.269) < 0.001 and check_outputs(program, values)["y"].passed
    values["y"] = np.float32([[0.0, 0.0, 0.0, 1.0]])  # logit 3 is 15 below the top: never the largest
    assert not check_outputs(program, values)["y"].passed


# ---- the CLI contract: piped output ------------------------------------------------------------

LONG = "encoder/layer_0/attention/self_attention/output/dense/bias_add_relu_0"  # 70 characters
ESCAPE = re.compile(r"\x1b\[")


def long_named_object(tmp_path) -> str:
    """Three kernels, the output's name 70 characters long (`shown` cuts none below 80)."""
    g = graph([("MATMUL", "hidden", ["x", "w"], {}), ("TRANSPOSE", "swapped", ["hidden"], {"perms": [1, 0]}),
               ("RELU", LONG, ["swapped"], {})], {"x": (64, 48), "w": (48, 32)}, ("hidden", "swapped"))
    path = tmp_path / "long.kpu"
    path.write_bytes(dumps(compile_graph(g, "long.dfg", load_target(STANDARD), fuse=False)))
    return str(path)


@pytest.mark.parametrize("env", [{"COLUMNS": "40"}, {"NO_COLOR": "1"}, {"TERM": "dumb", "FORCE_COLOR": "1"}],
                         ids=["narrow", "no-color", "dumb"])
def test_piped_check_and_profile_are_whole_lines(tmp_path, env):
    obj = long_named_object(tmp_path)
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "TERM", "FORCE_COLOR")}
    proc = subprocess.run([sys.executable, "-m", "loader", obj, "--config", STANDARD, "--check", "--profile",
                           "--json"], capture_output=True, text=True, timeout=300, env={**base, **env})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    lines = proc.stderr.splitlines()
    assert not ESCAPE.search(proc.stderr)

    checks = [line for line in lines if line.startswith("check ")]
    assert len(checks) == 2, proc.stderr
    assert checks[0].startswith(f"check {LONG}: pass (worst element ")
    assert checks[1].startswith("check worst of 3 kernels, ")
    for line in checks:
        assert re.fullmatch(r"check .+: pass \(worst element \S+, \S+ of its tolerance\)", line), line
    # no line is the tail of a check line
    assert not [line for line in lines if "of its tolerance" in line and not line.startswith("check ")]

    # the profile opens with its summary; each kernel's row whole, on one line
    # (a long object path is shown cut in the middle)
    assert re.fullmatch(r"\S+ on standard: [\d,]+ cycles \(.+\)", lines[0]), proc.stderr
    for name, kernel in report["kernels"].items():
        row = [line for line in lines if line.split()[:1] == [name]]
        assert len(row) == 1 and f"{kernel['cycles']:,}" in row[0] and kernel["op"] in row[0], proc.stderr
    # how each kernel was bound is one line for them all (one per kernel with -v)
    assert not [line for line in lines if re.match(r"(kernel )?\S+: (bound by|cp-sat)", line)], proc.stderr
    [bindings] = [line for line in lines if line.startswith("bindings: ")]
    assert bindings == "bindings: 3 kernel(s) by cp-sat; cp-sat: optimal (3); -v lists each kernel's"


def test_verbose_names_each_kernels_binding(tmp_path):
    obj = long_named_object(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "loader", obj, "--config", STANDARD, "--binder", "greedy", "-v",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    kernels = json.loads(proc.stdout)["bindings"]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kernel ")]
    assert [line.split(":")[0] for line in lines] == [f"kernel {name}" for name in kernels]
    for line, b in zip(lines, kernels.values()):
        assert f"bound by greedy on {b['compute_tiles']} compute tile(s)" in line


def test_no_progress_bar_off_a_terminal():
    """A run past a second drew a progress bar even into a pipe, where its redraws were blank lines."""
    from contextlib import redirect_stderr
    from io import StringIO

    from dfx import cli_console
    from loader.cli import _Progress

    with redirect_stderr(StringIO()) as err:
        progress = _Progress(100, cli_console(), "simulating")
        progress.start -= 10  # as if the run had taken ten seconds
        progress(50)
        progress.close()
    assert err.getvalue() == ""
