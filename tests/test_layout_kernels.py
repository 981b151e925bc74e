"""Layout kernels end to end in-process: compile, bind, simulate, execute tile by tile; values
against numpy, DRAM bytes against the compiler's exact count; the views that move nothing (a
RESHAPE, a SLICE or GATHER of one run of bytes); a
bounded body for a long GATHER; the validator on windows, tables and permutations."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest

from conftest import CONFIGS, run_cli
from dfx import DataMove, ObjectFileError, dumps, loads
from dfx.objfile import _digest
from kernel_compiler.compile import compile_graph
from kernel_compiler.errors import CompileError
from kernel_compiler.target import load_target
from loader.report import dram_bytes
from test_vector_kernels import graph_of, random, run

INDICES = [5, -1, 0, 5, -13, 7, 2]  # repeats and negatives, into a dim of 13

# (ops, inputs, numpy) with sizes that divide by no tile
CASES = {
    "reshape": ([("RESHAPE", ["x"], {"new_shape": [-1, 37]})], {"x": (3, 37, 29)},
                lambda x: x.reshape(-1, 37)),
    "transpose_last_two": ([("TRANSPOSE", ["x"], {"perms": [0, 2, 1]})], {"x": (3, 301, 129)},
                           lambda x: np.swapaxes(x, 1, 2)),
    "transpose_rotate": ([("TRANSPOSE", ["x"], {"perms": [2, 0, 1]})], {"x": (97, 59, 7)},
                         lambda x: np.transpose(x, (2, 0, 1))),
    "transpose_reversed": ([("TRANSPOSE", ["x"], {})], {"x": (5, 1009, 31)}, lambda x: np.transpose(x)),
    "concat": ([("CONCAT", ["x", "y", "z"], {"axis": 1})], {"x": (3, 170, 97), "y": (3, 51, 97), "z": (3, 333, 97)},
               lambda x, y, z: np.concatenate([x, y, z], axis=1)),
    "slice": ([("SLICE", ["x"], {"start": [3, 5, 0], "size": [30, -1, 11]})], {"x": (50, 1009, 17)},
              lambda x: x[3:33, 5:, 0:11]),
    "pad": ([("PAD", ["x"], {"padding": [[300, 17], [0, 250]], "pad_value": -1.5})], {"x": (41, 307)},
            lambda x: np.pad(x, [[300, 17], [0, 250]], constant_values=-1.5)),
    # the object file writes an infinite fill as "-inf" (a max pool's padding, or XLA's reduce-window)
    "pad_minus_inf": ([("PAD", ["x"], {"padding": [[300, 17], [0, 250]], "pad_value": -math.inf})], {"x": (41, 307)},
                      lambda x: np.pad(x, [[300, 17], [0, 250]], constant_values=-np.inf)),
    "gather": ([("GATHER", ["x"], {"indices": INDICES, "axis": 1})], {"x": (43, 13, 301)},
               lambda x: np.take(x, INDICES, axis=1)),
    # one run of the operand's bytes: views (`VIEWS`), no bytes move
    "slice_rows": ([("SLICE", ["x"], {"start": [0, 3, 0, 0], "size": [-1, 53, -1, -1]})], {"x": (1, 56, 9, 7)},
                   lambda x: x[:, 3:]),
    "slice_one_deep": ([("SLICE", ["x"], {"start": [2, 4, 0], "size": [1, 5, -1]})], {"x": (6, 13, 17)},
                       lambda x: x[2:3, 4:9]),
    "gather_stacked": ([("GATHER", ["x"], {"indices": [1], "axis": 0})], {"x": (3, 8, 5, 11)},
                       lambda x: x[1:2]),
    "gather_consecutive": ([("GATHER", ["x"], {"indices": [-3, -2, -1], "axis": 1})], {"x": (1, 13, 7)},
                           lambda x: x[:, 10:]),
}
VIEWS = {"reshape", "slice_rows", "slice_one_deep", "gather_stacked", "gather_consecutive"}


def run_case(case: str, config: str, dtype: str = "f32"):
    ops, shapes, want = CASES[case]
    values = {n: random(s, dtype, seed=i) for i, (n, s) in enumerate(shapes.items())}
    graph = graph_of(ops, {n: (s, dtype) for n, s in shapes.items()}, out_dtype=dtype)
    program, got, sim = run(graph, values, str(CONFIGS / f"{config}.json"))
    return program, got["t0"], want(*values.values()), sim


@pytest.mark.parametrize("config", ["standard", "minimal"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_op_against_numpy_with_edge_tiles(case, config):
    program, got, want, sim = run_case(case, config)
    assert got.shape == want.shape and np.array_equal(got, want)  # moved, never rounded
    kernel = program.kernels[0]
    if case in VIEWS:
        assert [m.move_type for m in kernel.body] == ["VIEW"] and kernel.hints["estimated_dram_bytes"] == 0
    else:
        extents = [kernel.tiling[f"T{j}"] for j in range(len(want.shape))]
        assert kernel.tiling["num_tiles"] > 1 and any(d % e for d, e in zip(want.shape, extents)), kernel.tiling
    assert kernel.hints["estimated_dram_bytes"] == sum(dram_bytes(sim).values())


@pytest.mark.parametrize("case, dtype", [("pad", "i32"), ("concat", "f16"), ("transpose_rotate", "bf16"),
                                         ("gather", "i8")])
def test_layout_ops_keep_every_dtype_exactly(case, dtype):
    _, got, want, _ = run_case(case, "standard", dtype)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("op", [("RESHAPE", {"new_shape": [37, -1]}), ("TRANSPOSE", {"perms": [1, 0, 2]})])
def test_a_view_moves_no_bytes_and_its_reader_waits_for_the_writer(op):
    """RESHAPE of a dense tensor (and a TRANSPOSE that moves only a dim of 1) moves nothing: its
    result names its operand's bytes. A kernel after it reads those bytes once the kernel
    before it has written them."""
    a, b = random((1, 37, 129), seed=1), random((1, 37, 129), seed=2)
    # read by a TRANSPOSE it does not cancel with: LAYOUT would sink it below a map op reading it
    g = graph_of([("ADD", ["a", "b"], {}), (op[0], ["t0"], op[1]), ("TRANSPOSE", ["t1"], {})],
                 {"a": ((1, 37, 129), "f32"), "b": ((1, 37, 129), "f32")})
    program, values, sim = run(g, {"a": a, "b": b})
    add, view, transpose = program.kernels
    assert [m.move_type for m in view.body if isinstance(m, DataMove)] == ["VIEW"]
    assert view.hints["estimated_dram_bytes"] == 0
    assert sim.phases[1].end == sim.phases[1].start  # its barrier alone: no cycles
    assert add.hints["estimated_dram_bytes"] + transpose.hints["estimated_dram_bytes"] == sum(dram_bytes(sim).values())
    assert sim.phases[2].start >= sim.phases[0].end
    s = (a + b).reshape(values["t1"].shape)
    np.testing.assert_array_equal(values["t2"], s.T)


@pytest.mark.parametrize("op, shape", [
    (("SLICE", {"start": [0, 0, 3, 0], "size": [-1, -1, 53, -1]}), (1, 56, 56, 7)),  # columns: rows apart
    (("SLICE", {"start": [1, 4, 0], "size": [2, 5, -1]}), (6, 13, 17)),  # two deep before the cut dim
    (("GATHER", {"indices": [1, 0], "axis": 0}), (3, 8, 5)),  # descending
    (("GATHER", {"indices": [0, 2], "axis": 0}), (3, 8, 5)),  # apart
    (("GATHER", {"indices": [0], "axis": 1}), (3, 8, 5)),  # one deep, but after a dim of 3
])
def test_a_slice_or_gather_that_is_no_run_of_bytes_moves_them(op, shape):
    x = random(shape)
    g = graph_of([(op[0], ["x"], op[1])], {"x": (shape, "f32")})
    program, values, sim = run(g, {"x": x})
    kernel = program.kernels[0]
    assert "VIEW" not in [m.move_type for m in kernel.body]
    assert kernel.hints["estimated_dram_bytes"] == sum(dram_bytes(sim).values()) == 2 * values["t0"].nbytes
    want = np.take(x, op[1]["indices"], axis=op[1]["axis"]) if op[0] == "GATHER" else \
        x[tuple(slice(s, s + (d - s if n == -1 else n)) for s, n, d in zip(op[1]["start"], op[1]["size"], shape))]
    np.testing.assert_array_equal(values["t0"], want)


def test_q_k_and_v_picked_from_a_stacked_projection_are_views_read_by_their_products():
    """A transformer's attention stacks q, k and v along a leading dim of 3 and picks each with a
    GATHER (torch's `qkv[0]`): each pick is one run of the stack's bytes, so a view, and the
    products read q, k and v where the TRANSPOSE wrote them."""
    x, w = random((2, 16, 24), seed=1), random((24, 3 * 2 * 8), seed=2)
    g = graph_of([("MATMUL", ["x", "w"], {}), ("RESHAPE", ["t0"], {"new_shape": [2, 16, 3, 2, 8]}),
                  ("TRANSPOSE", ["t1"], {"perms": [2, 0, 3, 1, 4]}),
                  *[("GATHER", ["t2"], {"indices": [i], "axis": 0}) for i in range(3)],
                  ("RESHAPE", ["t3"], {"new_shape": [4, 16, 8]}), ("RESHAPE", ["t4"], {"new_shape": [4, 16, 8]}),
                  ("RESHAPE", ["t5"], {"new_shape": [4, 16, 8]}),
                  ("TRANSPOSE", ["t7"], {"perms": [0, 2, 1]}), ("MATMUL", ["t6", "t9"], {}),
                  ("MATMUL", ["t10", "t8"], {})],
                 {"x": ((2, 16, 24), "f32"), "w": ((24, 48), "f32")})
    program, values, sim = run(g, {"x": x, "w": w})
    picks = [k for k in program.kernels if k.op == "GATHER"]
    views = [[m for m in k.body if isinstance(m, DataMove)] for k in picks]
    assert len(picks) == 3 and all([m.move_type for m in moves] == ["VIEW"] for moves in views)
    assert [moves[0].source.offset[0] for moves in views] == [0, 1, 2]
    assert sum(k.hints["estimated_dram_bytes"] for k in program.kernels) == sum(dram_bytes(sim).values())
    qkv = np.transpose((x @ w).reshape(2, 16, 3, 2, 8), (2, 0, 3, 1, 4)).reshape(3, 4, 16, 8)
    q, k, v = qkv
    np.testing.assert_allclose(values[program.graph.outputs[0].name], (q @ np.swapaxes(k, 1, 2)) @ v,
                               rtol=1e-4, atol=1e-4)


def test_gather_of_4096_rows_is_a_loop_over_the_indices_attribute():
    indices = [(i * 7919) % 5000 - 2500 for i in range(4096)]
    g = graph_of([("GATHER", ["x"], {"indices": indices, "axis": 0})], {"x": ((5000, 64), "f32")})
    x = random((5000, 64))
    program, values, sim = run(g, {"x": x})
    kernel = program.kernels[0]
    assert len(kernel.body) == 2 and [l.end for l in kernel.tile_loops] == [4096]
    assert kernel.body[0].source.table is not None and kernel.body[0].source.table.attr == "indices"
    assert np.array_equal(values["t0"], np.take(x, indices, axis=0))
    assert kernel.hints["estimated_dram_bytes"] == sum(dram_bytes(sim).values()) == 2 * 4096 * 64 * 4


def test_loader_check_passes_a_chain_of_layout_ops(tmp_path):
    g = graph_of([("TRANSPOSE", ["x"], {"perms": [1, 0]}), ("PAD", ["t0"], {"padding": [[2, 3], [0, 5]]}),
                  ("SLICE", ["t1"], {"start": [1, 4], "size": [-1, 40]}), ("RESHAPE", ["t2"], {"new_shape": [-1]}),
                  ("CONCAT", ["t3", "y", "t3"], {"axis": 0}), ("GATHER", ["t4"], {"indices": [-1, 0, 77]})],
                 {"x": ((41, 67), "f32"), "y": ((9,), "f32")})
    data = dumps(compile_graph(g, "layout.dfg", load_target(str(CONFIGS / "standard.json"))))
    assert dumps(loads(data)) == data  # windows, tables, permutations and fills read back as written
    obj = tmp_path / "layout.kpu"
    obj.write_bytes(data)
    proc = run_cli("loader", obj, "--config", "minimal", "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["check"]["passed"] and len(report["check"]["kernels"]) == 6


def test_a_layout_op_that_would_convert_is_refused():
    g = graph_of([("TRANSPOSE", ["x"], {})], {"x": ((4, 5), "f32")}, out_dtype="f16")
    with pytest.raises(CompileError, match=r"TRANSPOSE of 'x' \(f32\) into 't0' \(f16\): layout kernels move"):
        compile_graph(g, "t.dfg", load_target(str(CONFIGS / "standard.json")))


def resealed_kernel(case: str, edit) -> bytes:
    ops, shapes, _ = CASES[case]
    g = graph_of(ops, {n: (s, "f32") for n, s in shapes.items()})
    obj = orjson.loads(dumps(compile_graph(g, "t.dfg", load_target(str(CONFIGS / "standard.json")))))
    edit(obj["body"]["kernels"][0]["body"])
    obj["sha256"] = _digest(obj["body"])
    return orjson.dumps(obj)


def set_field(op: int, path: tuple, value):
    def edit(body):
        target = body[op]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


@pytest.mark.parametrize("case, edit, message", [
    # the slice window moved so its last tiles start past the operand's end
    ("slice", set_field(0, ("source", "offset"), [3, 800, 0]),
     r"op 0: tiles of \d+ from offset 800 along 'd1' \(\d+ trips\) neither stay inside dimension 1009 of 'x' "
     r"nor hold it whole"),
    # a window around the operand must start at or before it
    ("pad", set_field(0, ("source", "offset"), [1, 0]),
     r"op 0: tiles of \d+ from offset 1 along 'd0' \(\d+ trips\) neither stay inside dimension 41"),
    ("transpose_rotate", set_field(1, ("permutation",), [2, 0, 0]),
     r"op 1: permutation \[2, 0, 0\] does not permute the 3 dims of 'x' into 't0'"),
    ("transpose_rotate", set_field(1, ("permutation",), [1, 2, 0]),
     r"op 1: moves tiles of \[.*\] into tiles of \[.*\] under permutation \[1, 2, 0\]"),
    ("gather", set_field(0, ("source", "table", "attr"), "start"),
     r"op 0: table 'start' of graph op 'op0' is not the index table of GATHER \(which has 'indices'\)"),
    ("reshape", set_field(0, ("destination", "level"), "L3"),
     r"op 0: a VIEW names all of 'x' in external memory, or one run of its bytes, as 't0', which must hold"),
    # rows 3 .. 56 of 56 moved down a column: past the operand's end, and no run of its bytes
    ("slice_rows", set_field(0, ("source", "offset"), [0, 3, 1, 0]),
     r"op 0: a VIEW names all of 'x' in external memory, or one run of its bytes, as 't0'"),
    ("gather_stacked", set_field(0, ("source", "tile_shape"), [1, 8, 5, 10]),
     r"op 0: a VIEW names all of 'x' in external memory, or one run of its bytes, as 't0'"),
    ("pad", set_field(1, ("fill",), 0),
     r"op 1: fills a tile in external memory; a fill writes only on-chip tiles"),
])
def test_validator_refuses_a_resigned_object_in_one_line(case, edit, message):
    with pytest.raises(ObjectFileError, match=message) as e:
        loads(resealed_kernel(case, edit), "t.kpu")
    assert "\n" not in str(e.value) and str(e.value).startswith("t.kpu: kernel ")
