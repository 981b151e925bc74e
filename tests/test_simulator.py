"""hardware.simulator: exact cycle counts worked out by hand, resource contention, per-stream
queues on one engine, the SCALE-Sim array model, the trace, determinism, and bounded memory on a
long lazy stream."""

import json
import random
from dataclasses import replace

import pytest

from hardware.machine import (
    DATAFLOWS,
    ComputeFabric,
    Engines,
    ExternalMemory,
    Machine,
    MemoryLevel,
)
from hardware.simulator import Simulator
from hardware.task import Task
from hardware import trace_json
from hardware.units.systolic_array import matmul_cycles

KB = 1024

# 1 GHz; DRAM: 2 channels of 32 B/cycle, 100 cycles latency; DMA 32 B/cycle, so a DMA of b bytes
# takes 100 + b/32. BlockMover and Streamer 64 B/cycle. 4 single-port L2 banks. One 16x16 array.
MACHINE = Machine(
    name="test",
    clock_ghz=1.0,
    external=ExternalMemory(channels=2, channel_bytes=1 << 30, channel_bytes_per_cycle=32,
                            latency_cycles=100),
    l3=MemoryLevel(count=4, bytes=1 << 20),
    l2=MemoryLevel(count=4, bytes=64 * KB),
    l1=MemoryLevel(count=2, bytes=16 * KB),
    l2_bank_ports=1,
    line_bytes=64,
    engines=Engines(dma=2, block_mover=2, streamer=2, dma_bytes_per_cycle=32,
                    block_mover_bytes_per_cycle=64, streamer_bytes_per_cycle=64),
    compute=ComputeFabric(tiles=1, rows=16, cols=16, dataflows=DATAFLOWS),
)


def load(id, engine, nbytes, channel, deps=(), label="load", stream=0):
    return Task(id, "dma", engine, deps, bytes=nbytes, src_level="EXTERNAL", dst_level="L3",
                dram_channel=channel, label=label, stream=stream)


def store(id, engine, nbytes, channel, deps=(), stream=0):
    return Task(id, "dma", engine, deps, bytes=nbytes, src_level="L3", dst_level="EXTERNAL",
                dram_channel=channel, label="store", stream=stream)


def matmul(id, deps, m=16, n=16, k=16, **kw):
    return Task(id, "array", 0, deps, m=m, n=n, k=k, label="matmul", **kw)


def stream(id, engine, nbytes, bank, deps=()):
    return Task(id, "streamer", engine, deps, bytes=nbytes, src_level="L2", dst_level="L1",
                l2_bank=bank, label="stream")


def run(tasks, machine=MACHINE, **kw):
    return Simulator(machine, record_first=len(tasks), **kw).run(iter(tasks))


def starts(result):
    return [(start, end) for _, start, end, _ in result.first_tasks]


# --- (a) one tile ----------------------------------------------------------------------------


def test_single_tile():
    tasks = [
        load(0, 0, 1 * KB, 0, label="A EXT->L3"),  # 100 + 1024/32 = 132: [0, 132]
        load(1, 1, 1 * KB, 1, label="B EXT->L3"),  # other engine and channel: [0, 132]
        matmul(2, (0, 1)),  # one 16x16 block: k + R + C - 2 = 16 + 30 = 46: [132, 178]
        Task(3, "dma", 0, (2,), bytes=1 * KB, src_level="L3", dst_level="EXTERNAL",
             dram_channel=0, label="C L3->EXT"),  # 132: [178, 310]
    ]
    r = run(tasks)
    assert starts(r) == [(0, 132), (0, 132), (132, 178), (178, 310)]
    assert r.cycles == 310
    assert r.macs == 16 * 16 * 16
    assert r.bytes_moved == {"EXTERNAL->L3": 2 * KB, "L3->EXTERNAL": 1 * KB}
    assert (r.units["dma0"].busy_cycles, r.units["dma0"].tasks) == (264, 2)
    assert r.units["dram0"].busy_cycles == 64  # the channel holds only the data: 2 x 1024/32
    assert r.units["array0"].busy_cycles == 46
    # every engine and channel; an L2 bank only once a task used it (none here)
    assert set(r.units) == {"dram0", "dram1", "dma0", "dma1", "bm0", "bm1", "str0", "str1",
                            "array0", "vec0", "barrier0"}


def test_an_l2_bank_is_a_unit_once_used_and_unused_ones_cost_nothing():
    """A machine may have a million L2 banks; a run makes only those its tasks use."""
    many = replace(MACHINE, l2=replace(MACHINE.l2, count=10**6))
    r = run([stream(0, 0, 1 * KB, 999_999), stream(1, 1, 1 * KB, 2)], many)
    assert sorted(n for n in r.units if n.startswith("l2bank")) == ["l2bank2", "l2bank999999"]
    assert r.units["l2bank999999"].tasks == 1
    with pytest.raises(ValueError, match="no L2 bank 1000000; the machine has 1000000"):
        run([stream(0, 0, 1 * KB, 10**6)], many)


# --- (b) double buffering --------------------------------------------------------------------


def two_tiles(buffers):
    """Per tile: A on dma0, B on dma1 (2 KB each: 100 + 64 = 164), then a 16x16x256 matmul
    (256 + 30 = 286). With one buffer, tile 2's loads must wait for tile 1's matmul (WAR)."""
    war = () if buffers == 2 else (2,)
    return [load(0, 0, 2 * KB, 0), load(1, 1, 2 * KB, 1), matmul(2, (0, 1), k=256),
            load(3, 0, 2 * KB, 0, war), load(4, 1, 2 * KB, 1, war), matmul(5, (3, 4), k=256)]


def test_double_buffering_overlaps_loads_with_compute():
    double = run(two_tiles(buffers=2))
    # loads 1 [0, 164]; loads 2 [164, 328] while matmul 1 runs [164, 450]; matmul 2 [450, 736]
    assert starts(double) == [(0, 164), (0, 164), (164, 450), (164, 328), (164, 328), (450, 736)]
    assert double.cycles == 164 + 2 * 286 == 736  # only the first loads are exposed
    single = run(two_tiles(buffers=1))
    # loads 2 wait for matmul 1: [450, 614]; matmul 2 [614, 900]
    assert single.cycles == 2 * (164 + 286) == 900


# --- (c) bandwidth bound ---------------------------------------------------------------------


def test_bandwidth_bound():
    """Eight 32 KB loads from one 16 B/cycle channel (DMA engines do 32, so the channel limits),
    alternating over two DMA engines, each followed by a small matmul."""
    machine = replace(MACHINE, external=replace(MACHINE.external, channel_bytes_per_cycle=16))
    tasks = []
    for i in range(8):
        tasks.append(load(2 * i, i % 2, 32 * KB, 0))
        tasks.append(matmul(2 * i + 1, (2 * i,)))
    r = run(tasks, machine)
    # The channel moves 32768/16 = 2048 cycles per load, back to back: the other engine's latency
    # hides under it. The last load ends at 8 * 2048 + 100, then its matmul takes 46.
    assert r.cycles == 8 * 32 * KB // 16 + 100 + 46 == 16530
    assert r.units["dram0"].busy_cycles == 8 * 2048
    assert r.units["dram0"].busy_cycles / r.cycles > 0.99


# --- (d) DRAM channels -----------------------------------------------------------------------


def test_dma_engines_share_a_channel():
    # 6400 bytes: 200 cycles of data + 100 latency = 300 per DMA.
    same = run([load(0, 0, 6400, 0), load(1, 1, 6400, 0)])
    # channel: task 0 [0, 200], task 1 [200, 400] (tie at 0 -> lower id); latency is not held
    assert starts(same) == [(0, 300), (200, 500)]
    assert same.cycles == 2 * 200 + 100 == 500
    assert same.units["dram0"].busy_cycles == 400
    apart = run([load(0, 0, 6400, 0), load(1, 1, 6400, 1)])
    assert starts(apart) == [(0, 300), (0, 300)]
    assert apart.cycles == 300


def test_channel_goes_to_the_task_ready_first():
    machine = replace(MACHINE, engines=replace(MACHINE.engines, dma=3))
    tasks = [
        matmul(0, (), k=70),  # 70 + 30 = 100: [0, 100]
        load(1, 0, 6400, 0),  # channel [0, 200], ends 300
        load(2, 1, 6400, 0, deps=(0,)),  # ready at 100
        load(3, 2, 6400, 0),  # ready at 0: waited longer, so it gets the channel at 200
    ]
    r = run(tasks, machine)
    assert starts(r) == [(0, 100), (0, 300), (400, 700), (200, 500)]


# --- (e) L2 bank ports -----------------------------------------------------------------------


def test_streamers_share_a_bank_port():
    # 4096 bytes at 64 B/cycle = 64 cycles each
    same = run([stream(0, 0, 4 * KB, 0), stream(1, 1, 4 * KB, 0)])
    assert starts(same) == [(0, 64), (64, 128)]
    assert same.units["l2bank0"].busy_cycles == 128
    assert run([stream(0, 0, 4 * KB, 0), stream(1, 1, 4 * KB, 1)]).cycles == 64
    dual = replace(MACHINE, l2_bank_ports=2)
    assert run([stream(0, 0, 4 * KB, 0), stream(1, 1, 4 * KB, 0)], dual).cycles == 64


# --- (f) streams: one queue per stream on an engine ------------------------------------------

# 6400 bytes: a DMA takes 100 + 6400/32 = 300 cycles. A 16x16x270 matmul takes 270 + 30 = 300.


def test_streams_avoid_head_of_line_blocking():
    """dma0 carries tile 1's C store and tile 2's A prefetch. The store waits for tile 1's matmul;
    on its own stream it no longer blocks the prefetch, which is ready long before."""

    def tiles(store_stream):
        return [
            load(0, 0, 6400, 0, stream=0),  # A1: [0, 300]
            matmul(1, (0,), k=270),  # [300, 600]
            store(2, 0, 6400, 0, deps=(1,), stream=store_stream),  # C1: ready at 600
            load(3, 0, 6400, 0, stream=0),  # A2 (double-buffered): ready when A1 ends, at 300
            matmul(4, (1, 3), k=270),
        ]

    # Two streams: A2 runs [300, 600] while matmul 1 does; C1 [600, 900] beside matmul 2.
    r = run(tiles(store_stream=1))
    assert starts(r) == [(0, 300), (300, 600), (600, 900), (300, 600), (600, 900)]
    assert r.cycles == 900
    # One stream (in-order, as before): C1 holds the head until 600, A2 waits behind it.
    r = run(tiles(store_stream=0))
    assert starts(r) == [(0, 300), (300, 600), (600, 900), (900, 1200), (1200, 1500)]
    assert r.cycles == 1500


def test_stream_keeps_program_order():
    """Task 2 is ready at 0 and dma0 is idle until 100, but task 1 is ahead of it in its stream."""
    tasks = [
        matmul(0, (), k=70),  # 70 + 30 = 100: [0, 100]
        load(1, 0, 6400, 0, deps=(0,), stream=3),  # ready at 100: [100, 400]
        load(2, 0, 6400, 0, stream=3),  # ready at 0, yet [400, 700]
    ]
    assert starts(run(tasks)) == [(0, 100), (100, 400), (400, 700)]
    # The same order on the default stream: the model is unchanged for one stream per engine.
    tasks = [replace(t, stream=0) for t in tasks]
    assert starts(run(tasks)) == [(0, 100), (100, 400), (400, 700)]


def test_engine_takes_the_candidate_ready_first():
    tasks = [
        matmul(0, (), k=70),  # [0, 100]
        load(1, 0, 6400, 0, stream=0),  # [0, 300]
        load(2, 0, 6400, 0, stream=0),  # stream 0's head (so ready) only at 300
        load(3, 0, 6400, 0, deps=(0,), stream=1),  # ready at 100: before task 2, despite its id
    ]
    assert starts(run(tasks)) == [(0, 100), (0, 300), (600, 900), (300, 600)]
    # Ready at the same cycle: the lower task id first, whatever the stream numbers.
    tasks = [load(0, 0, 6400, 0, stream=5), load(1, 0, 6400, 0, stream=2)]
    assert starts(run(tasks)) == [(0, 300), (300, 600)]


def test_engine_takes_an_earlier_kernels_candidate_first():
    """The same three loads, task 3 of a later kernel (priority 1): ready at 100, before task 2,
    it waits until the earlier kernel's task 2 has gone, though that became ready later."""
    tasks = [
        matmul(0, (), k=70),  # [0, 100]
        load(1, 0, 6400, 0, stream=0),  # [0, 300]
        load(2, 0, 6400, 0, stream=0),  # ready at 300
        replace(load(3, 0, 6400, 0, deps=(0,), stream=1), priority=1),  # ready at 100
    ]
    assert starts(run(tasks)) == [(0, 100), (0, 300), (300, 600), (600, 900)]


def test_engine_waits_for_the_port_of_the_task_it_chose():
    """dma0 chooses task 1 (ready at 0, lower id than task 2) and stays committed to it while
    channel 0 is busy, though task 2's channel 1 is free: the engine does not switch."""
    tasks = [
        load(0, 1, 6400, 0),  # dma1 holds channel 0 for [0, 200]; ends 300
        load(1, 0, 6400, 0, stream=0),  # channel 0 free at 200: [200, 500]
        load(2, 0, 6400, 1, stream=1),  # [500, 800]
    ]
    assert starts(run(tasks)) == [(0, 300), (200, 500), (500, 800)]


# --- (g) determinism -------------------------------------------------------------------------


def random_program(n, seed, streams=1):
    rng = random.Random(seed)
    for i in range(n):
        deps = tuple(sorted({rng.randrange(max(0, i - 50), i) for _ in range(rng.randrange(3))}
                            if i else ()))
        kind = rng.choice(["dma", "block_mover", "streamer", "array"])
        stream = rng.randrange(streams) if streams > 1 else 0  # one stream: the same draws as before
        if kind == "array":
            yield Task(i, "array", 0, deps, m=rng.choice([16, 32]), n=16, k=rng.randrange(1, 99),
                       dataflow=rng.choice(DATAFLOWS), drain=rng.random() < 0.5, args={"i": i},
                       stream=stream)
        else:
            yield Task(i, kind, rng.randrange(2), deps, bytes=rng.randrange(0, 9000),
                       src_level="L3", dst_level="L2",
                       dram_channel=rng.randrange(2) if kind == "dma" else None,
                       l2_bank=None if kind == "dma" else rng.randrange(4), stream=stream)


def test_deterministic():
    a = Simulator(MACHINE, trace=True, record_first=100).run(random_program(3000, seed=7))
    b = Simulator(MACHINE, trace=True, record_first=100).run(random_program(3000, seed=7))
    assert a == b
    assert a.cycles > 0 and len(a.first_tasks) == 100


def test_deterministic_with_streams():
    def sim():
        return Simulator(MACHINE, trace=True, record_first=3000).run(
            random_program(3000, seed=7, streams=3))

    a, b = sim(), sim()
    assert a == b
    assert len(a.first_tasks) == 3000
    one = Simulator(MACHINE).run(random_program(3000, seed=7))
    assert a.cycles < one.cycles  # fewer stalls behind an unready head
    # The rules hold: deps end before a task starts, a stream runs in program order, and an
    # engine runs one task at a time.
    end = {}
    stream_end = {}
    spans = {}
    for task, start, stop, engine in sorted(a.first_tasks, key=lambda f: f[0].id):
        assert all(end[d] <= start for d in task.deps)
        assert stream_end.get((engine, task.stream), 0) <= start
        end[task.id] = stream_end[engine, task.stream] = stop
        spans.setdefault(engine, []).append((start, stop))
    for s in spans.values():
        s.sort()
        assert all(e0 <= s1 for (_, e0), (s1, _) in zip(s, s[1:]))


# --- (h) the systolic array against SCALE-Sim v3 ---------------------------------------------

# SCALE-Sim v3 total cycles for one M=N=K GEMM on a 32x32 array; it counts one cycle less.
SCALE_SIM = [("output_stationary", 64, 503), ("output_stationary", 256, 20351),
             ("output_stationary", 1024, 1112063), ("weight_stationary", 64, 631),
             ("weight_stationary", 256, 22399), ("weight_stationary", 1024, 1144831)]


@pytest.mark.parametrize("dataflow,size,scalesim", SCALE_SIM)
def test_array_matches_scalesim(dataflow, size, scalesim):
    machine = replace(MACHINE, compute=replace(MACHINE.compute, rows=32, cols=32))
    r = run([Task(0, "array", 0, m=size, n=size, k=size, dataflow=dataflow)], machine)
    assert abs(r.cycles - scalesim) / scalesim < 0.01
    assert r.cycles == scalesim + 1


def test_array_fold_counts():
    # output-stationary, 64^3 on 32x32: 4 blocks; split K in two chunks, the skew (62 per block)
    # is paid once, on the draining chunk: 4*32 + (4*32 + 4*62) = 504 = the whole GEMM.
    assert matmul_cycles(64, 64, 32, 32, 32, "output_stationary", drain=False) == 128
    assert matmul_cycles(64, 64, 32, 32, 32, "output_stationary") == 128 + 248
    # input-stationary: ceil(k/R) * ceil(m/C) = 2 * 1 folds of R + n + R + C - 2 = 32+64+62
    assert matmul_cycles(32, 64, 64, 32, 32, "input_stationary") == 2 * 158
    # weight-stationary: ceil(k/R) * ceil(n/C) = 1 * 3 folds of 32 + m + 62
    assert matmul_cycles(10, 65, 32, 32, 32, "weight_stationary") == 3 * (32 + 10 + 62)


# --- (i) the trace ---------------------------------------------------------------------------


@pytest.mark.parametrize("streams", [1, 3])
def test_trace(streams):
    result = Simulator(MACHINE, trace=True).run(random_program(500, seed=1, streams=streams))
    doc = json.loads(trace_json(result, MACHINE))
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= e.keys()
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 500 and all("dur" in e for e in slices)
    named = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(named.values()) == sorted(result.units)
    assert {e["tid"] for e in slices} <= named.keys()
    by_track = {}
    for e in slices:
        by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        assert e["dur"] == pytest.approx(e["args"]["cycles"] / 1e3)  # 1 GHz: 1 cycle = 1 ns
    for spans in by_track.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start + 1e-9


# --- (j) long lazy streams -------------------------------------------------------------------


def test_long_stream_memory_bounded_and_fast():
    window = 1024
    sim = Simulator(MACHINE, dep_window=window)
    held = []

    def tasks(n):  # a pipelined load -> stream -> matmul chain over 4 tiles' worth of engines
        for i in range(0, n, 4):
            if i % 4096 == 0:
                held.append(sim.tasks_held)
            yield load(i, (i // 4) % 2, 256, (i // 4) % 2, deps=(i - 4,) if i else ())
            yield stream(i + 1, (i // 4) % 2, 256, (i // 4) % 4, deps=(i,))
            yield matmul(i + 2, (i + 1,), k=4)
            yield Task(i + 3, "block_mover", 0, (i + 2,), bytes=128, l2_bank=0)

    progress = []
    result = sim.run(tasks(200_000), progress=progress.append)
    engines = {n: u for n, u in result.units.items() if not n.startswith(("dram", "l2bank"))}
    assert sum(u.tasks for u in engines.values()) == 200_000
    assert progress[-1] == 200_000 and len(progress) > 10
    assert max(held) <= 2 * window


# --- bad streams -----------------------------------------------------------------------------


@pytest.mark.parametrize("task,message", [
    (Task(1, "dma", 5), "no dma engine 5"),
    (Task(1, "gpu", 0), "unknown unit 'gpu'"),
    (Task(1, "streamer", 0, (1,), l2_bank=0), "dep 1"),
    (Task(1, "streamer", 0, l2_bank=9), "no L2 bank 9"),
    (Task(1, "dma", 0, dram_channel=0, l2_bank=0), "at most one shared resource"),
    (Task(0, "array", 0), "ids must increase"),
])
def test_bad_tasks_are_rejected(task, message):
    with pytest.raises(ValueError, match=message):
        run([Task(0, "array", 0, m=1, n=1, k=1), task])


def test_unsupported_dataflow_is_rejected():
    machine = replace(MACHINE, compute=replace(MACHINE.compute, dataflows=("output_stationary",)))
    with pytest.raises(ValueError, match="weight_stationary"):
        run([Task(0, "array", 0, m=1, n=1, k=1, dataflow="weight_stationary")], machine)


# --- (k) barriers ----------------------------------------------------------------------------


def test_barrier_waits_for_its_deps_and_takes_no_time():
    tasks = [load(0, 0, 1024, 0), load(1, 1, 4096, 1),  # 100 + 32 and 100 + 128 cycles
             Task(2, "barrier", 0, (0, 1), label="BARRIER"),
             matmul(3, (2,))]
    r = run(tasks, trace=True)
    assert starts(r)[2] == (228, 228)  # passed when the later load ends
    assert starts(r)[3][0] == 228
    assert r.units["barrier0"].busy_cycles == 0 and r.units["barrier0"].tasks == 1
    assert r.bytes_moved == {"EXTERNAL->L3": 5 * KB}
    assert r.phases[0].compute_start == 228  # a barrier is no compute
    barrier = next(e for e in r.trace_events if e.get("name") == "BARRIER")
    assert barrier["dur"] == 0 and "bytes" not in barrier["args"]
