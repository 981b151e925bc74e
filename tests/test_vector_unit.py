"""The vector unit: its config keys (defaults, overrides, one-line errors), its cycle count worked
out by hand, and how the simulator runs it beside the array of the same compute tile."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hardware import (
    VECTOR_CYCLES_PER_ELEMENT,
    ConfigError,
    Simulator,
    Task,
    VectorUnit,
    load_machine,
    machine_from_dict,
    trace_json,
    vector_cycles,
)

CORPUS = Path(__file__).resolve().parent / "data" / "kpu-configs"
DEFAULTS = dict(VECTOR_CYCLES_PER_ELEMENT)


def minimal(**timing) -> dict:
    """kpu-sim's minimal config (one tile, an 8x8 array), with `timing` keys set."""
    document = json.loads((CORPUS / "kpu__minimal.json").read_text())
    document.setdefault("timing", {}).update(timing)
    return document


# 16 lanes, transcendental 4 cycles per element (the default): one tile with a 16x16 array.
MACHINE = machine_from_dict(minimal(vector_lanes=16), "vec.json")
MACHINE = replace(MACHINE, compute=replace(MACHINE.compute, rows=16, cols=16))

# 1000 simple + 1000 transcendental elements: ceil(1000/16) * 1 + ceil(1000/16) * 4 = 63 + 252
WORK = (("simple", 1000), ("transcendental", 1000))
WORK_CYCLES = 315
# a 16x16x270 output-stationary matmul: k + R + C - 2 = 270 + 30 = 300 cycles
ARRAY_CYCLES = 300


def vector(id, deps=(), work=WORK, engine=0, **kw):
    return Task(id, "vector", engine, deps, vector_work=work, label="vector", **kw)


def matmul(id, deps=(), **kw):
    return Task(id, "array", 0, deps, m=16, n=16, k=270, label="matmul", **kw)


def run(tasks, machine=MACHINE, **kw):
    return Simulator(machine, record_first=len(tasks), **kw).run(iter(tasks))


def starts(result):
    return [(start, end) for _, start, end, _ in result.first_tasks]


# --- config -------------------------------------------------------------------------------------


def test_defaults_one_lane_per_array_column():
    assert load_machine(CORPUS / "kpu__minimal.json").vector == VectorUnit(8, DEFAULTS)
    assert load_machine("standard").vector == VectorUnit(16, DEFAULTS)
    assert DEFAULTS == {"simple": 1, "transcendental": 4, "reduction": 1, "requantize": 1}


def test_overrides_keep_the_other_defaults():
    m = machine_from_dict(minimal(vector_lanes=32, vector_cycles_per_element={"transcendental": 8}))
    assert m.vector == VectorUnit(32, {"simple": 1, "transcendental": 8, "reduction": 1, "requantize": 1})
    m = machine_from_dict(minimal(vector_cycles_per_element={"simple": 2, "reduction": 3}))
    assert m.vector == VectorUnit(8, {"simple": 2, "transcendental": 4, "reduction": 3, "requantize": 1})


def test_largest_allowed_values_load():
    m = machine_from_dict(minimal(vector_lanes=1 << 20, vector_cycles_per_element=dict.fromkeys(DEFAULTS, 1024)))
    assert m.vector == VectorUnit(1 << 20, dict.fromkeys(DEFAULTS, 1024))


def test_machine_built_without_a_vector_unit_gets_the_default():
    m = replace(MACHINE, vector=None)
    assert m.vector == VectorUnit(16, DEFAULTS)
    assert hash(m) == hash(replace(m))  # a Machine stays hashable with its dict of rates


PER_ELEMENT = "timing.vector_cycles_per_element"


@pytest.mark.parametrize("key, value, reason", [
    (f"{PER_ELEMENT}.sqrt", 2, "unknown key (expected one of: simple, transcendental, reduction, requantize)"),
    (f"{PER_ELEMENT}.simple", 0, "must be a positive integer up to 1024, got 0"),
    (f"{PER_ELEMENT}.transcendental", 1.5, "must be a positive integer up to 1024, got 1.5"),
    (f"{PER_ELEMENT}.reduction", True, "must be a positive integer up to 1024, got True"),
    (f"{PER_ELEMENT}.simple", "1", "must be a positive integer up to 1024, got '1'"),
    (f"{PER_ELEMENT}.transcendental", 1025, "must be a positive integer up to 1024, got 1025"),
    (PER_ELEMENT, [1, 4, 1], "must be a mapping, got [1, 4, 1]"),
    ("timing.vector_lanes", 0, "must be a positive integer up to 1048576, got 0"),
    ("timing.vector_lanes", 2**20 + 1, "must be a positive integer up to 1048576, got 1048577"),
    ("timing.vector_lanes", 16.0, "must be a positive integer up to 1048576, got 16.0"),
])
def test_bad_value_is_one_line_naming_the_key(tmp_path, key, value, reason):
    document = minimal()
    *parents, last = key.split(".")
    node = document
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as info:
        load_machine(path)
    assert str(info.value) == f"{path}: {key}: {reason}"


# --- the cycle count ----------------------------------------------------------------------------


@pytest.mark.parametrize("work, lanes, cycles", [
    (WORK, 16, 63 + 252),
    ((("simple", 32),), 16, 2),  # whole passes only
    ((("simple", 33),), 16, 3),  # a partly empty last pass costs a whole one
    ((("transcendental", 1),), 16, 4),  # any element takes at least one pass
    ((("reduction", 1000), ("simple", 1000)), 1000, 2),  # each pair has passes of its own
    ((("simple", 1), ("simple", 1)), 16, 2),
    ((), 16, 0),  # no work, no time: like a move of 0 bytes
    ((("simple", 0),), 16, 0),
])
def test_vector_cycles(work, lanes, cycles):
    assert vector_cycles(work, lanes, DEFAULTS) == cycles


def test_vector_cycles_uses_the_given_rates():
    assert vector_cycles(WORK, 16, {"simple": 2, "transcendental": 10}) == 63 * 2 + 63 * 10


@pytest.mark.parametrize("work, message", [
    ((("sqrt", 10),), r"unknown vector op class 'sqrt' \(expected one of simple, transcendental, reduction, requantize\)"),
    ((("simple", -1),), r"negative element count -1 for vector op class 'simple'"),
])
def test_bad_work_is_rejected(work, message):
    with pytest.raises(ValueError, match=message):
        vector_cycles(work, 16, DEFAULTS)
    with pytest.raises(ValueError, match=rf"^task 0: {message}"):
        run([vector(0, work=work)])


# --- the simulator ------------------------------------------------------------------------------


def test_one_vector_task():
    r = run([vector(0)])
    assert starts(r) == [(0, WORK_CYCLES)]
    assert r.cycles == WORK_CYCLES
    assert (r.units["vec0"].busy_cycles, r.units["vec0"].tasks, r.units["vec0"].bytes) == (WORK_CYCLES, 1, 0)
    assert r.macs == 0  # MACs count the array's work only
    assert r.units["array0"].tasks == 0


def test_one_vector_unit_per_compute_tile_beside_the_array():
    two = replace(MACHINE, compute=replace(MACHINE.compute, tiles=2))
    r = run([vector(0, engine=1)], two)
    names = list(r.units)
    assert names.index("array1") < names.index("vec0") < names.index("vec1") < names.index("barrier0")
    assert (r.units["vec0"].tasks, r.units["vec1"].tasks) == (0, 1)
    with pytest.raises(ValueError, match="no vector engine 2; the machine has 2"):
        run([vector(0, engine=2)], two)


def test_vector_and_array_of_one_tile_run_at_once():
    r = run([matmul(0), vector(1)])
    assert starts(r) == [(0, ARRAY_CYCLES), (0, WORK_CYCLES)]
    assert r.cycles == max(ARRAY_CYCLES, WORK_CYCLES)
    assert (r.units["array0"].busy_cycles, r.units["vec0"].busy_cycles) == (ARRAY_CYCLES, WORK_CYCLES)
    assert r.macs == 16 * 16 * 270


def test_vector_task_after_the_array_task_it_depends_on():
    r = run([matmul(0), vector(1, deps=(0,))])  # e.g. an activation on the array's output tile
    assert starts(r) == [(0, ARRAY_CYCLES), (ARRAY_CYCLES, ARRAY_CYCLES + WORK_CYCLES)]
    assert r.cycles == 615


def test_vector_tasks_of_one_tile_take_turns():
    r = run([vector(0), vector(1)])
    assert starts(r) == [(0, WORK_CYCLES), (WORK_CYCLES, 2 * WORK_CYCLES)]


def test_phase_compute_starts_at_its_first_compute_of_either_kind():
    load = Task(0, "dma", 0, bytes=1024, src_level="EXTERNAL", dst_level="L3", dram_channel=0, phase=0)
    # minimal's DRAM: 50 B/cycle, 100 cycles latency: 100 + ceil(1024/50) = 121
    tasks = [load, vector(1, deps=(0,), phase=0),  # phase 0 computes only on the vector unit
             matmul(2, phase=1), vector(3, deps=(2,), phase=1)]
    r = run(tasks)
    # task 3 waits for the vector unit, busy with task 1 until 436
    assert starts(r) == [(0, 121), (121, 436), (0, 300), (436, 751)]
    zero, one = r.phases[0], r.phases[1]
    assert (zero.start, zero.compute_start, zero.end, zero.macs) == (0, 121, 436, 0)
    assert (one.start, one.compute_start, one.end, one.macs) == (0, 0, 751, 16 * 16 * 270)
    vector_first = run([vector(0, phase=0), matmul(1, deps=(0,), phase=0)])
    assert vector_first.phases[0].compute_start == 0


def test_trace_has_a_vec0_track():
    r = run([matmul(0), vector(1, deps=(0,))], trace=True)
    doc = json.loads(trace_json(r, MACHINE))
    tracks = {e["args"]["name"]: e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert list(tracks) == list(r.units)
    [vec] = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == tracks["vec0"]]
    assert vec["name"] == "vector"
    assert (vec["ts"], vec["dur"]) == pytest.approx((ARRAY_CYCLES / 1e3, WORK_CYCLES / 1e3))  # 1 GHz
    assert vec["args"] == {"task": 1, "stream": 0, "vector_work": [["simple", 1000], ["transcendental", 1000]],
                           "cycles": WORK_CYCLES}
