"""kpu-sim's system schema: each example maps onto the machine number by number and runs a 256^3
matmul with --check; the host link is timed apart from the run; --show-config prints the machine
of either schema; every malformed or contradictory field is one line naming its key; and the flat
schema gives the cycles it gave before the system schema was read.

The examples__*.json files are unmodified copies of stillwater-sc/kpu-sim `configs/examples/`
(`minimal_kpu.json`, `datacenter_hbm.json`; `edge_ai.json` as of commit c9e8c6c, removed since).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, DATA, ROOT, assert_one_line_error, config_error, run_cli
from hardware import ConfigError, HostLink, load_machine, machine_from_dict

CORPUS = DATA / "kpu-configs"
EXAMPLES = ["examples__minimal_kpu.json", "examples__edge_ai.json", "examples__datacenter_hbm.json"]
MATMUL = ROOT / "examples" / "matmul_256.dfg"
KB, MB = 1024, 1024 * 1024


def example(name: str = "examples__minimal_kpu.json") -> dict:
    return json.loads((CORPUS / name).read_text())


def kpu_of(document: dict) -> dict:
    return next(a for a in document["accelerators"] if a["type"] == "KPU")["kpu_config"]


# --- each example, number by number ------------------------------------------------------------

# What each example says, as the machine must hold it (1 GHz: the files give no clock, so ns are
# cycles and GB/s are bytes per cycle): external channels, MB each, GB/s each, latency ns;
# L3 tiles, KB each; L2 banks, KB each; scratchpads, KB each; compute tiles, rows, cols;
# DMA engines, GB/s each; BlockMovers; Streamers; host link GB/s.
FILE_NUMBERS = {
    "examples__minimal_kpu.json": (2, 1024, 100, 20, 4, 128, 8, 64, 2, 64, 2, 16, 16, 2, 50, 4, 8, 32),
    "examples__edge_ai.json": (1, 512, 68, 50, 2, 256, 4, 128, 1, 128, 1, 8, 8, 1, 34, 2, 4, 8),
    "examples__datacenter_hbm.json": (4, 8192, 819, 10, 8, 512, 16, 256, 4, 256, 4, 32, 32, 4, 200, 8, 16, 128),
}


def numbers_in_file(document: dict) -> tuple:
    """FILE_NUMBERS read from the document; every item of a list must agree, as the loader requires."""
    kpu = kpu_of(document)
    memory, moves, tiles = kpu["memory"], kpu["data_movement"], kpu["compute_fabric"]["tiles"]

    def one(items: list, key: str):
        assert len({item[key] for item in items}) == 1
        return items[0][key]

    banks = memory["banks"]
    return (len(banks), one(banks, "capacity_mb"), one(banks, "bandwidth_gbps"), one(banks, "latency_ns"),
            len(memory["l3_tiles"]), one(memory["l3_tiles"], "capacity_kb"),
            len(memory["l2_banks"]), one(memory["l2_banks"], "capacity_kb"),
            len(memory["scratchpads"]), one(memory["scratchpads"], "capacity_kb"),
            len(tiles), one(tiles, "systolic_rows"), one(tiles, "systolic_cols"),
            len(moves["dma_engines"]), one(moves["dma_engines"], "bandwidth_gbps"),
            len(moves["block_movers"]), len(moves["streamers"]),
            document["interconnect"]["host_to_accelerator"]["pcie_config"]["bandwidth_gbps"])


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_mapped_number_is_the_files(name):
    document = example(name)
    assert numbers_in_file(document) == FILE_NUMBERS[name]
    (channels, channel_mb, channel_gbps, latency_ns, l3, l3_kb, l2, l2_kb, scratchpads, scratchpad_kb,
     tiles, rows, cols, dma, dma_gbps, movers, streamers, link_gbps) = FILE_NUMBERS[name]
    m = load_machine(CORPUS / name)
    assert (m.name, m.clock_ghz) == (document["system"]["name"], 1.0)
    x = m.external
    assert (x.channels, x.channel_bytes, x.channel_bytes_per_cycle, x.latency_cycles) == \
        (channels, channel_mb * MB, channel_gbps, latency_ns)
    assert (m.l3.count, m.l3.bytes) == (l3, l3_kb * KB)
    assert (m.l2.count, m.l2.bytes) == (l2, l2_kb * KB)
    assert (m.l1.count * tiles, m.l1.bytes) == (scratchpads, scratchpad_kb * KB)  # L1: a tile's share
    assert (m.compute.tiles, m.compute.rows, m.compute.cols) == (tiles, rows, cols)
    e = m.engines
    assert (e.dma, e.dma_bytes_per_cycle, e.block_mover, e.streamer) == (dma, dma_gbps, movers, streamers)
    assert m.host_link == HostLink(bytes_per_cycle=link_gbps, latency_cycles=0)
    # what the file does not say comes from the timing defaults, as in the flat schema
    assert (e.block_mover_bytes_per_cycle, e.streamer_bytes_per_cycle, m.l2_bank_ports, m.line_bytes) == (64, 64, 1, 64)
    assert m.vector.lanes == cols


def test_clock_converts_latency_and_every_bandwidth():
    document = example()
    document["system"]["clock_frequency_mhz"] = 1100
    m = machine_from_dict(document, "x.json")
    assert m.clock_ghz == 1.1
    assert m.external.latency_cycles == 22  # 20 ns at 1.1 GHz: 22 cycles, not 23 from float error
    assert m.external.channel_bytes_per_cycle == 100 / 1.1
    assert m.engines.dma_bytes_per_cycle == 50 / 1.1
    assert m.host_link.bytes_per_cycle == 32 / 1.1
    for bank in kpu_of(document)["memory"]["banks"]:
        bank["latency_ns"] = 12.5
    assert machine_from_dict(document, "x.json").external.latency_cycles == 14  # 13.75 rounded up


def test_timing_section_and_host_link_latency():
    document = example()
    document["timing"] = {"streamer_bytes_per_cycle": 128, "l2_bank_ports": 2, "host_link_latency_cycles": 500}
    m = machine_from_dict(document, "x.json")
    assert (m.engines.streamer_bytes_per_cycle, m.l2_bank_ports) == (128, 2)
    assert m.host_link == HostLink(32.0, 500)


def test_newer_kpu_key_yaml_and_name_from_file(tmp_path):
    document = example()
    accelerator = document["accelerators"][0]
    accelerator["kpu"] = accelerator.pop("kpu_config")  # kpu-sim's newer name
    del document["system"]["name"]
    path = tmp_path / "system.yaml"
    path.write_text(yaml.safe_dump(document))
    m = load_machine(path)
    assert m.name == "system"
    assert m.external == load_machine(CORPUS / "examples__minimal_kpu.json").external


def two_kpus() -> dict:
    document = example("examples__datacenter_hbm.json")
    second = copy.deepcopy(document["accelerators"][0])
    second["id"] = "kpu_1"
    for tile in second["kpu_config"]["compute_fabric"]["tiles"]:
        tile.update(systolic_rows=8, systolic_cols=8)
    document["accelerators"].append(second)
    return document


def test_accelerator_picks_one_of_several_kpus():
    document = two_kpus()
    assert machine_from_dict(document, "x.json", "kpu_0").compute.rows == 32
    assert machine_from_dict(document, "x.json", "kpu_1").compute.rows == 8


# --- malformed or contradictory fields ---------------------------------------------------------

K = "accelerators[0].kpu_config"


def kpu0(d: dict) -> dict:
    return d["accelerators"][0]["kpu_config"]


def banks(d: dict) -> list:
    return kpu0(d)["memory"]["banks"]


@pytest.mark.parametrize("change, line", [
    (lambda d: banks(d)[0].update(latency_ns=-5),
     f"{K}.memory.banks[0].latency_ns: must be a non-negative number of nanoseconds up to 1000000, got -5"),
    (lambda d: banks(d)[1].pop("capacity_mb"), f"{K}.memory.banks[1].capacity_mb: missing required key"),
    (lambda d: banks(d)[1].update(capacity_mb=0),
     f"{K}.memory.banks[1].capacity_mb: must be a positive integer up to 1048576, got 0"),
    (lambda d: d["accelerators"][0].update(type="GPU"), "accelerators: no KPU among the accelerators: kpu_0 (GPU)"),
    (lambda d: d.update(accelerators=[]), "accelerators: must be a non-empty list of mappings, got []"),
    (lambda d: kpu0(d)["memory"].update(banks=[]), f"{K}.memory.banks: must be a non-empty list of mappings, got []"),
    (lambda d: banks(d)[1].update(capacity_mb=512),
     f"{K}.memory.banks[1].capacity_mb: bank_1's 512 differs from bank_0's 1024; the model needs all banks alike"),
    (lambda d: banks(d)[1].update(bandwidth_gbps=50), f"{K}.memory.banks[1].bandwidth_gbps: bank_1's 50 differs"),
    (lambda d: banks(d)[1].update(latency_ns=40), f"{K}.memory.banks[1].latency_ns: bank_1's 40 differs"),
    (lambda d: kpu0(d)["memory"]["l3_tiles"][2].update(capacity_kb=256),
     f"{K}.memory.l3_tiles[2].capacity_kb: l3_2's 256 differs from l3_0's 128"),
    (lambda d: kpu0(d)["memory"]["l2_banks"][7].update(capacity_kb=32),
     f"{K}.memory.l2_banks[7].capacity_kb: l2_7's 32 differs from l2_0's 64"),
    (lambda d: kpu0(d)["data_movement"]["dma_engines"][1].update(bandwidth_gbps=25),
     f"{K}.data_movement.dma_engines[1].bandwidth_gbps: dma_1's 25 differs from dma_0's 50"),
    # compute tiles of different array sizes are refused, naming both tiles
    (lambda d: kpu0(d)["compute_fabric"]["tiles"][1].update(systolic_rows=8),
     f"{K}.compute_fabric.tiles[1].systolic_rows: tile_1's 8 differs from tile_0's 16; "
     "the model needs all tiles alike"),
    (lambda d: kpu0(d)["compute_fabric"]["tiles"][0].update(type="vector"),
     f"{K}.compute_fabric.tiles[0].type: must be 'systolic'"),
    (lambda d: kpu0(d)["memory"]["scratchpads"].append({"id": "scratch_2", "capacity_kb": 64}),
     f"{K}.memory.scratchpads: 3 scratchpads cannot be shared equally by 2 compute tiles"),
    (lambda d: kpu0(d)["memory"]["l3_tiles"][3].update(id="l3_0"),
     f"{K}.memory.l3_tiles[3].id: 'l3_0' is also the id of l3_tiles[0]"),
    (lambda d: d["accelerators"][0].update(kpu=copy.deepcopy(kpu0(d))),
     "accelerators[0]: gives both kpu_config and kpu; keep one"),
    (lambda d: d["accelerators"][0].pop("kpu_config"), "accelerators[0]: a KPU needs its kpu_config (or kpu)"),
    (lambda d: kpu0(d).update({"$ref": "datacenter.json"}), f"{K}.$ref: unknown key (expected one of: memory, "),
    (lambda d: d["interconnect"]["host_to_accelerator"].update(cxl_config={"bandwidth_gbps": 64}),
     "interconnect.host_to_accelerator: gives both pcie_config and cxl_config"),
    (lambda d: d["interconnect"]["host_to_accelerator"]["pcie_config"].update(bandwidth_gbps=0),
     "interconnect.host_to_accelerator.pcie_config.bandwidth_gbps: must be a finite number of at least 0.001, got 0"),
    (lambda d: (d.pop("interconnect"), d.update(timing={"host_link_latency_cycles": 5})),
     "timing.host_link_latency_cycles: the file has no host link"),
    (lambda d: d.update(timing={"clock_ghz": 2.0}),
     "timing.clock_ghz: must be left out: this schema gives it as system.clock_frequency_mhz, got 2.0"),
    (lambda d: d.update(timing={"dram_latency_cycles": 5}), "timing.dram_latency_cycles: must be left out"),
    (lambda d: d["system"].update(clock_frequency_mhz=0),
     "system.clock_frequency_mhz: must be a number from 1 to 1000000"),
    (lambda d: (d["system"].update(clock_frequency_mhz=10**6), [b.update(latency_ns=2000) for b in banks(d)]),
     f"{K}.memory.banks[0].latency_ns: gives 2000000 cycles at system.clock_frequency_mhz 1000000, above the bound"),
    (lambda d: (d["system"].update(clock_frequency_mhz=10**6), [b.update(bandwidth_gbps=0.5) for b in banks(d)]),
     f"{K}.memory.banks[0].bandwidth_gbps: gives 0.0005 bytes per cycle at system.clock_frequency_mhz 1000000"),
    (lambda d: d["host"]["cpu"].update(threads=8), "host.cpu.threads: unknown key (expected one of: core_count, "),
    (lambda d: d["host"]["cpu"].update(core_count="many"), "host.cpu.core_count: must be a finite non-negative number"),
    (lambda d: d["system_services"]["memory_manager"].update(enabled=1), "system_services.memory_manager.enabled: "
                                                                          "must be true or false, got 1"),
])
def test_bad_field_is_one_line_naming_its_key(tmp_path, change, line):
    document = example()
    change(document)
    message = config_error(tmp_path, document)
    assert message.startswith(f"{tmp_path / 'bad.json'}: {line}"), message


@pytest.mark.parametrize("accelerator, line", [
    (None, "accelerators: 2 KPUs, choose one with --accelerator ID; the KPUs are kpu_0, kpu_1"),
    ("kpu_9", "accelerators: no accelerator has the id 'kpu_9'; the KPUs are kpu_0, kpu_1"),
    ("gpu_0", "accelerators[1]: 'gpu_0' is a GPU, not a KPU; the KPUs are kpu_0, kpu_1"),
])
def test_choosing_the_kpu(accelerator, line):
    with pytest.raises(ConfigError, match=f"^x.json: {line}$".replace("[", r"\[").replace("]", r"\]")):
        machine_from_dict(two_kpus(), "x.json", accelerator)


def test_accelerator_with_a_flat_config_is_refused():
    with pytest.raises(ConfigError, match=r"^standard\.json: accelerator 'kpu_0' asked for, but this is a "
                                          r"flat-schema config, which describes one KPU$"):
        machine_from_dict(json.loads((CONFIGS / "standard.json").read_text()), "standard.json", "kpu_0")


@pytest.mark.parametrize("change, fragment", [
    (lambda d: banks(d)[0].update(latency_ns=-5), f"{K}.memory.banks[0].latency_ns: must be a non-negative"),
    (lambda d: banks(d)[0].pop("capacity_mb"), f"{K}.memory.banks[0].capacity_mb: missing required key"),
    (lambda d: d.update(accelerators=[{"type": "GPU", "id": "gpu_0"}]), "accelerators: no KPU among the accelerators"),
])
def test_both_loader_paths_exit_2_with_one_line(tmp_path, objects, change, fragment):
    document = example()
    change(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    assert_one_line_error(run_cli("loader", "--config", bad, "--show-config"), f"{bad}: {fragment}")
    assert_one_line_error(run_cli("loader", objects["examples__minimal_kpu.json"], "--config", bad),
                          f"{bad}: {fragment}")


# --- running the examples ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, Path]:
    """examples/matmul_256.dfg compiled for each example."""
    folder = tmp_path_factory.mktemp("objects")
    compiled = {}
    for name in EXAMPLES:
        compiled[name] = folder / f"{name}.kpu"
        proc = run_cli("compiler", MATMUL, "-o", compiled[name], "--target", CORPUS / name)
        assert proc.returncode == 0, proc.stderr
    return compiled


def run_json(*args) -> dict:
    proc = run_cli("loader", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# A and B of 256x256 f32 in (512 KiB), C out (256 KiB), at the link's GB/s at 1 GHz.
HOST_TRANSFER = {
    "examples__minimal_kpu.json": (16384, 8192),  # 32 bytes per cycle
    "examples__edge_ai.json": (65536, 32768),  # 8
    "examples__datacenter_hbm.json": (4096, 2048),  # 128
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_matmul_256_with_check(objects, name):
    s = run_json(objects[name], "--config", CORPUS / name, "--check")
    assert s["check"]["passed"]
    assert s["config"] == example(name)["system"]["name"]
    assert s["macs"] == 256**3
    cycles_in, cycles_out = HOST_TRANSFER[name]
    assert s["host_transfer"] == {"bytes_in": 2 * 256 * 256 * 4, "bytes_out": 256 * 256 * 4,
                                  "cycles_in": cycles_in, "cycles_out": cycles_out}
    assert s["host_transfer_cycles"] == cycles_in + cycles_out


def test_host_transfer_is_never_in_the_kernel_cycles(tmp_path, objects):
    obj = objects["examples__minimal_kpu.json"]
    runs = {}
    for variant, change in {"none": lambda d: d["interconnect"].pop("host_to_accelerator"),
                            "link": lambda d: None,
                            "latency": lambda d: d.update(timing={"host_link_latency_cycles": 100})}.items():
        document = example()
        change(document)
        path = tmp_path / f"{variant}.json"
        path.write_text(json.dumps(document))
        runs[variant] = run_json(obj, "--config", path, "--timing-only", "--binder", "greedy")
    assert runs["none"]["cycles"] == runs["link"]["cycles"] == runs["latency"]["cycles"]
    assert runs["none"]["units"] == runs["link"]["units"]
    assert "host_transfer_cycles" not in runs["none"] and "host_transfer" not in runs["none"]
    assert runs["link"]["host_transfer_cycles"] == 16384 + 8192
    assert runs["latency"]["host_transfer_cycles"] == 16384 + 8192 + 2 * 100  # a latency per crossing


def test_profile_shows_the_host_link_apart(objects):
    name = "examples__edge_ai.json"
    proc = run_cli("loader", objects[name], "--config", CORPUS / name, "--timing-only", "--profile")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "Host link, apart from the cycles above: 98,304 cycles (524,288 bytes in before the run: 65,536; " \
           "262,144 bytes out after it: 32,768)" in text


# --- the flat schema, as before ----------------------------------------------------------------

# Cycles of examples/matmul_256.dfg compiled for each config and run with --timing-only --binder
# greedy, as the loader gave them before it read the system schema (less since, where a config
# has two DMA engines on channels of their own: a move of 64 KiB or more goes in parts over
# them, SPLIT_BYTES; and where the latency tiler, weighing the busiest compute tile's share,
# takes tiles that deal evenly to the compute tiles: datacenter 12,852 -> 7,884, kpu__datacenter
# 18,528 -> 16,456, kpu__embodied_ai 19,603 -> 16,451).
FLAT_CYCLES = {
    CONFIGS / "minimal.json": 282546,
    CONFIGS / "standard.json": 42816,
    CONFIGS / "datacenter.json": 7884,
    CONFIGS / "ideal_32x32.json": 20352,
    CORPUS / "kpu__datacenter.yaml": 16456,
    CORPUS / "kpu__edge_ai.yaml": 42384,
    CORPUS / "kpu__embodied_ai.yaml": 16451,
    CORPUS / "kpu__minimal.json": 282390,
    CORPUS / "kpu__minimal.yaml": 282390,
}


def test_every_flat_config_is_covered():
    assert set(FLAT_CYCLES) == set(CONFIGS.glob("*.json")) | set(CORPUS.glob("kpu__*"))


@pytest.mark.parametrize("config", FLAT_CYCLES, ids=lambda p: p.name)
def test_flat_config_gives_the_same_cycles_as_before(tmp_path, config):
    obj = tmp_path / "m.kpu"
    proc = run_cli("compiler", MATMUL, "-o", obj, "--target", config)
    assert proc.returncode == 0, proc.stderr
    s = run_json(obj, "--config", config, "--timing-only", "--binder", "greedy")
    assert s["cycles"] == FLAT_CYCLES[config]
    assert "host_transfer_cycles" not in s  # the flat schema describes no host link
    assert load_machine(config).host_link is None


# --- --show-config -----------------------------------------------------------------------------


@pytest.mark.parametrize("config", [CONFIGS / "standard.json", CONFIGS / "ideal_32x32.json",
                                    CORPUS / "kpu__edge_ai.yaml", *(CORPUS / n for n in EXAMPLES)],
                         ids=lambda p: p.name)
def test_show_config_json_is_the_machine(config):
    view = run_json("--config", config, "--show-config")
    assert view == json.loads(json.dumps(load_machine(config).view()))


def test_show_config_json_of_an_example():
    view = run_json("--config", CORPUS / "examples__datacenter_hbm.json", "--show-config")
    assert view["clock_ghz"] == 1.0
    assert view["levels"]["external"] == {"count": 4, "bytes": 8192 * MB, "bytes_per_cycle": 819.0,
                                          "latency_cycles": 10}
    assert view["levels"]["l3"] == {"count": 8, "bytes": 512 * KB}
    assert view["levels"]["l2"] == {"count": 16, "bytes": 256 * KB, "ports": 1}
    assert view["levels"]["l1"] == {"count": 1, "bytes": 256 * KB, "per_compute_tile": True}
    assert view["engines"]["dma"] == {"count": 4, "bytes_per_cycle": 200.0}
    assert view["engines"]["streamer"] == {"count": 16, "bytes_per_cycle": 64.0}
    assert (view["compute"]["tiles"], view["compute"]["rows"], view["compute"]["cols"]) == (4, 32, 32)
    assert view["host_link"] == {"bytes_per_cycle": 128.0, "latency_cycles": 0}
    assert run_json("--config", "ideal_32x32", "--show-config")["engines"]["dma"]["bytes_per_cycle"] == "unlimited"


def test_show_config_table_without_an_object():
    proc = run_cli("loader", "--config", CORPUS / "examples__minimal_kpu.json", "--show-config")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in proc.stderr.splitlines() if line.count("│") == 6}
    assert rows["DRAM channels"] == ["2", "1 GiB", "100", "20"]
    assert rows["L1 buffers of each compute tile"] == ["1", "64 KiB", "", ""]
    assert rows["DMA engines, DRAM <-> L3"] == ["2", "", "50", ""]
    assert rows["host link, timed apart"] == ["1", "", "32", "0"]
    assert "2 tile(s) of a 16x16 array" in proc.stderr


def test_show_config_picks_an_accelerator(tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps(two_kpus()))
    assert run_json("--config", path, "--show-config", "--accelerator", "kpu_1")["compute"]["rows"] == 8
    assert_one_line_error(run_cli("loader", "--config", path, "--show-config"),
                          f"{path}: accelerators: 2 KPUs, choose one with --accelerator ID; the KPUs are kpu_0, kpu_1")


def test_object_is_required_except_for_show_config(objects):
    assert_one_line_error(run_cli("loader", "--config", "standard"), "Missing argument 'OBJECT.kpu'.")
    assert_one_line_error(run_cli("loader", objects["examples__edge_ai.json"], "--config", "standard", "--show-config"),
                          "--show-config prints the machine and exits: give it no OBJECT.kpu")


def test_the_compiler_picks_a_kpu_of_a_system_file_too(tmp_path):
    doc = json.loads((DATA / "kpu-configs" / "examples__minimal_kpu.json").read_text())
    kpu = next(a for a in doc["accelerators"] if a["type"] == "KPU")
    doc["accelerators"].append({**kpu, "id": "kpu_b"})
    two = tmp_path / "two.json"
    two.write_text(json.dumps(doc))
    dfg, obj = ROOT / "examples" / "matmul_256.dfg", tmp_path / "m.kpu"
    assert_one_line_error(run_cli("compiler", dfg, "--target", two, "-o", obj), "choose one with --accelerator")
    assert run_cli("compiler", dfg, "--target", two, "--accelerator", "kpu_b", "-o", obj).returncode == 0
