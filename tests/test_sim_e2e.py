"""The simulator through the loader: SCALE-Sim's fold counts on an ideal array, a compute-bound
and a bandwidth-bound GEMM on the standard machine, and the Perfetto trace."""

from __future__ import annotations

import json

import pytest

from conftest import CONFIGS, DATA, run_cli

# SCALE-Sim v3 total cycles (no prefetch), 32x32 array; ours count one more cycle: SCALE-Sim's
# last cycle index versus our cycle count.
SCALESIM = {("os", 64): 503, ("os", 256): 20351, ("os", 1024): 1112063,
            ("ws", 64): 631, ("ws", 256): 22399, ("ws", 1024): 1144831}


def compile_gemm(gemm_file, tmp_path, n, *args):
    obj = tmp_path / f"g{n}.kpu"
    proc = run_cli("compiler", gemm_file(n, n, n), "-o", obj, *args)
    assert proc.returncode == 0, proc.stderr
    return obj


def load_json(*args):
    proc = run_cli("loader", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("dataflow, n", sorted(SCALESIM))
def test_ideal_array_matches_scalesim(gemm_file, tmp_path, dataflow, n):
    ideal = CONFIGS / "ideal_32x32.json"
    obj = compile_gemm(gemm_file, tmp_path, n, "--dataflow", dataflow, "--target", ideal)
    s = load_json(obj, "--config", ideal, "--timing-only")
    assert abs(s["cycles"] - SCALESIM[dataflow, n]) <= 0.01 * SCALESIM[dataflow, n]
    assert s["cycles"] == SCALESIM[dataflow, n] + 1


@pytest.mark.parametrize("binder, cycles", [("cp-sat", 352), ("greedy", 384)])
def test_single_tile_cycles_by_hand(gemm_file, tmp_path, binder, cycles):
    # 16x16x16 f32 on standard: every tile is 1024 bytes.
    #   A and B each: DMA 100 latency + ceil(1024 / 50 B/cycle channel) = 121, on two engines
    #   and channels in parallel; BlockMover 1024 / 64 = 16; Streamer 16      -> 153
    #   array: one 16x16 block, k + rows + cols - 2 = 16 + 30 = 46            -> 199
    #   C: Streamer drain 16, BlockMover 16, DMA 121                          -> 352
    # Greedy first fit puts A and B in one L2 bank: their BlockMover writes and their Streamer
    # reads each share one port, 16 + 16 more cycles.
    obj = compile_gemm(gemm_file, tmp_path, 16)
    s = load_json(obj, "--config", CONFIGS / "standard.json", "--binder", binder)
    assert s["cycles"] == cycles
    # the one kernel: loads from cycle 0, array from 153, to the end; 4096 MACs in 199 - 153
    kernel = s["kernels"]["matmul_0"]
    assert (kernel["start_cycle"], kernel["end_cycle"], kernel["macs"]) == (0, cycles, 16 ** 3)
    # the budget: A, B and C once, 3072 bytes, over 100 bytes/cycle is 31 cycles, more than the
    # 4096 MACs' 8 on 512 PEs: the bound is the memory's
    assert s["budget"] == {"compulsory_dram_bytes": 3072, "dram_over_compulsory": 1.0, "cycle_bound": 31,
                           "bound_by": "memory", "cycles_over_bound": cycles / 31}
    if binder == "cp-sat":
        assert kernel["compute_start_cycle"] == 153
        assert kernel["utilization"] == 16 ** 3 / ((352 - 153) * 512)


def test_1024_cubed_is_compute_bound_on_standard(gemm_file, tmp_path):
    obj = compile_gemm(gemm_file, tmp_path, 1024)
    s = load_json(obj, "--config", CONFIGS / "standard.json", "--check")
    assert s["check"]["passed"]
    assert s["utilization"] >= 0.94, s["utilization"]
    assert s["roofline"]["bound"] == "compute"
    budget = s["budget"]  # A, B and C once; 1024^3 MACs over 512 per cycle
    assert (budget["compulsory_dram_bytes"], budget["cycle_bound"], budget["bound_by"]) == (3 * 4 << 20, 1 << 21,
                                                                                            "compute")
    assert budget["cycles_over_bound"] == s["cycles"] / (1 << 21)
    assert budget["dram_over_compulsory"] == (s["dram_bytes"]["read"] + s["dram_bytes"]["write"]) / (3 * 4 << 20)
    # array busy time: 1024^3 MACs over 2 arrays of 256 PEs, plus 30 cycles of fill and drain per
    # 16x16 output block: (1024^3 / 512) + (1024/16)^2 / 2 * 30 = 2,158,592 cycles per array
    assert s["units"]["array0"]["busy_cycles"] == 2_158_592


def test_1024_cubed_is_bandwidth_bound_with_a_tenth_of_the_dram(gemm_file, tmp_path):
    config = json.loads((CONFIGS / "standard.json").read_text())
    config["external_memory"]["bandwidth_gbps"] /= 10  # 2 channels x 5 GB/s = 10 bytes/cycle
    slow = tmp_path / "slow_dram.json"
    slow.write_text(json.dumps(config))
    obj = compile_gemm(gemm_file, tmp_path, 1024)
    s = load_json(obj, "--config", slow, "--timing-only")
    assert s["roofline"]["bound"] == "bandwidth"
    dram = s["dram_bytes"]["read"] + s["dram_bytes"]["write"]
    floor = dram / 10  # cycles the two channels need to move those bytes
    assert floor <= s["cycles"] <= 1.05 * floor, (s["cycles"], floor)
    for unit in ("dram0", "dram1", "dma0", "dma1"):
        assert s["units"][unit]["utilization"] >= 0.95, (unit, s["units"][unit])


def test_trace_is_valid_trace_event_json(gemm_file, tmp_path):
    obj = compile_gemm(gemm_file, tmp_path, 256)
    trace = tmp_path / "trace.json"
    s = load_json(obj, "--config", CONFIGS / "standard.json", "--trace-output", trace)
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(names.values()) >= set(s["units"])
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert e["tid"] in names and e["dur"] >= 0
    on_units = [e for e in slices if names[e["tid"]] in s["units"]]
    assert len(on_units) == sum(u["tasks"] for name, u in s["units"].items() if not name.startswith(("dram", "l2bank")))
    # the kernel's own track: its span, and within it the span from its first compute
    kernel = s["kernels"]["matmul_0"]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if names[e["tid"]] == "matmul_0")
    assert [t for span in spans for t in span] == pytest.approx(
        [kernel["start_cycle"] / 1e3, kernel["end_cycle"] / 1e3, kernel["compute_start_cycle"] / 1e3,
         kernel["end_cycle"] / 1e3])
    by_track: dict[int, list] = {}
    for e in on_units:
        by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-9  # one unit never runs two slices at once
    tiles = [e for e in slices if e["name"].startswith("MATMUL_TILE")]
    assert tiles and {"ti", "tj"} <= set(tiles[0]["args"])


def test_cycles_are_deterministic(gemm_file, tmp_path):
    obj = compile_gemm(gemm_file, tmp_path, 192)
    runs = [load_json(obj, "--config", CONFIGS / "standard.json", "--timing-only") for _ in range(2)]
    assert runs[0]["cycles"] == runs[1]["cycles"]
    assert runs[0]["units"] == runs[1]["units"]


@pytest.mark.parametrize("name", ["workloads__nla__matmul_256x256_chained.dfg", "workloads__nla__AtimesBtimesC_skinny.dfg"])
def test_a_kernel_fills_memory_only_after_earlier_kernels_are_done_with_it(tmp_path, name):
    """Kernels bound one at a time by greedy first fit, without moving them apart, have their
    buffers at the same addresses; the schedule may overlap two kernels only where their buffers
    do not."""
    from dfx import read
    from hardware import load_machine
    from loader import bind_greedy, bind_program, kernel_demands, simulate
    from loader.schedule import expand
    from loader.tasks import TaskStream

    obj = tmp_path / "chain.kpu"
    assert run_cli("compiler", DATA / "dfg" / name, "-o", obj).returncode == 0
    program, machine = read(obj), load_machine(CONFIGS / "standard.json")
    bindings = [bind_greedy(k.name, b.workers, *kernel_demands(k, program, b.workers), machine, str(obj))
                for k, b in zip(program.kernels, bind_program(program, machine, str(obj), bind_greedy))]
    # the op instance of each task, as the loader makes them, kernel after kernel (a large move's
    # parts and what ends with them all its instance's)
    stream, owner = TaskStream(program, machine), {}
    for i, (k, b) in enumerate(zip(program.kernels, bindings)):
        running = stream.start(k, b, i)
        for w, op, env in expand(k, b.workers):
            owner.update((task.id, (i, w, op)) for task in stream.instance(running, w, op, env)[1])
        stream.finish(running)
    result = simulate(program, machine, bindings, record_first=len(owner))
    assert len(result.first_tasks) == len(owner)
    span = {task.id: (start, end) for task, start, end, _ in result.first_tasks}

    def users(kernel, bb):
        """Start and end of every task that fills or reads a buffer, in task order."""
        op_id, worker = bb.buffer.op_id, bb.buffer.worker
        return [span[t] for t, (i, w, op) in sorted(owner.items())
                if i == kernel and w == worker and (op.op_id == op_id or op_id in op.depends_on)]

    checked = 0
    for later in range(1, len(program.kernels)):
        for bb in bindings[later].buffers:
            fills = [s for s, _ in users(later, bb)[:bb.buffer.depth]]
            for earlier in range(later):
                for old in bindings[earlier].buffers:
                    same_place = (old.buffer.level, old.bank) == (bb.buffer.level, bb.bank) and (
                        bb.buffer.level != "L1" or old.buffer.worker == bb.buffer.worker)
                    if same_place and old.address < bb.end and bb.address < old.end:
                        assert min(fills) >= max(end for _, end in users(earlier, old))
                        checked += 1
    assert checked > 0


def test_moving_kernels_apart_lets_them_overlap(tmp_path):
    from dfx import read
    from hardware import load_machine
    from loader import bind_greedy, bind_program, kernel_demands, simulate

    # on datacenter, where each kernel's buffers take a small part of every level (on standard the
    # last kernel's A panel fills most of L3: it cannot sit apart from the kernel before it)
    obj, config = tmp_path / "chain.kpu", CONFIGS / "datacenter.json"
    assert run_cli("compiler", DATA / "dfg" / "workloads__nla__matmul_256x256_chained.dfg", "-o", obj,
                   "--target", config).returncode == 0
    program, machine = read(obj), load_machine(config)
    moved = bind_program(program, machine, str(obj), bind_greedy)
    in_place = [bind_greedy(k.name, b.workers, *kernel_demands(k, program, b.workers), machine, str(obj))
                for k, b in zip(program.kernels, moved)]
    assert simulate(program, machine, moved).cycles < simulate(program, machine, in_place).cycles


def test_profile_gives_each_kernel_its_span(tmp_path):
    # a chain: each matmul reads the one before's result through external memory, so it computes
    # only once that one has stored the rows it reads (L3 has the room for its first loads)
    obj = tmp_path / "chain.kpu"
    assert run_cli("compiler", DATA / "dfg" / "workloads__nla__matmul_256x256_chained.dfg", "-o", obj,
                   "--no-keep-on-chip").returncode == 0
    s = load_json(obj, "--config", CONFIGS / "standard.json", "--timing-only")
    spans = list(s["kernels"].values())
    assert list(s["kernels"]) == ["matmul_0", "matmul_1", "matmul_2", "matmul_3"]
    assert sum(k["macs"] for k in spans) == s["macs"] == 4 * 256 ** 3
    assert max(k["end_cycle"] for k in spans) == s["cycles"]
    for before, k in zip(spans, spans[1:]):
        assert k["start_cycle"] <= k["compute_start_cycle"] < k["end_cycle"]
        assert before["compute_start_cycle"] < k["compute_start_cycle"] and before["end_cycle"] < k["end_cycle"]
        assert k["start_cycle"] < before["end_cycle"]  # its first loads overlap the kernel before
