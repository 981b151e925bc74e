"""hardware.config: the kpu-sim corpus and our shipped configs load with the right numbers, and
every kind of bad config fails with a one-line ConfigError naming the file and the key."""

import json
from pathlib import Path

import pytest
import yaml

from conftest import config_error
import hardware
from hardware import (
    DATAFLOWS,
    ComputeFabric,
    ConfigError,
    Engines,
    ExternalMemory,
    MemoryLevel,
    load_machine,
    machine_from_dict,
    resolve_config,
)

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "data" / "kpu-configs"
CONFIGS = REPO / "configs"
KB, MB = 1024, 1024 * 1024


# --- the upstream kpu-sim corpus --------------------------------------------------------------


def test_every_corpus_file_loads():
    files = sorted(CORPUS.glob("kpu__*"))
    assert len(files) == 5
    for path in files:
        assert load_machine(path).compute.peak_macs_per_cycle > 0


def test_minimal_json_numbers():
    m = load_machine(CORPUS / "kpu__minimal.json")
    assert m.name == "Minimal KPU"
    assert m.external == ExternalMemory(
        channels=1, channel_bytes=256 * MB, channel_bytes_per_cycle=50.0, latency_cycles=100
    )
    assert m.l3 == MemoryLevel(1, 64 * KB)
    assert m.l2 == MemoryLevel(4, 32 * KB)
    assert m.l1 == MemoryLevel(4 * (8 + 8), 32 * KB)  # buffer_count derived
    assert (m.engines.dma, m.engines.block_mover, m.engines.streamer) == (1, 1, 4)
    assert m.compute == ComputeFabric(tiles=1, rows=8, cols=8, dataflows=DATAFLOWS)


def test_minimal_yaml_equals_minimal_json():
    assert load_machine(CORPUS / "kpu__minimal.yaml") == load_machine(CORPUS / "kpu__minimal.json")


def test_edge_ai_numbers():
    m = load_machine(CORPUS / "kpu__edge_ai.yaml")
    assert m.name == "Edge AI KPU"
    assert (m.external.channels, m.external.channel_bytes) == (2, 512 * MB)
    assert m.external.channel_bytes_per_cycle == 100.0
    assert m.l3 == MemoryLevel(2, 128 * KB)
    assert m.l2 == MemoryLevel(16, 64 * KB)
    assert m.l1 == MemoryLevel(4 * (16 + 16), 64 * KB)
    assert (m.engines.dma, m.engines.block_mover, m.engines.streamer) == (2, 4, 16)
    assert (m.compute.tiles, m.compute.rows, m.compute.cols) == (2, 16, 16)


def test_datacenter_numbers_with_hex_address_map():
    m = load_machine(CORPUS / "kpu__datacenter.yaml")
    assert m.name == "Datacenter KPU"
    assert (m.external.channels, m.external.channel_bytes) == (6, 4096 * MB)
    assert m.external.channel_bytes_per_cycle == 800.0
    assert m.l3 == MemoryLevel(256, 512 * KB)
    assert m.l2 == MemoryLevel(4096, 128 * KB)
    assert m.l1 == MemoryLevel(4 * (32 + 32), 128 * KB)
    assert (m.engines.dma, m.engines.block_mover, m.engines.streamer) == (32, 256, 1024)
    assert m.compute.peak_macs_per_cycle == 256 * 32 * 32


def test_embodied_ai_explicit_l1_count_and_name_from_file():
    m = load_machine(CORPUS / "kpu__embodied_ai.yaml")
    assert m.name == "kpu__embodied_ai"  # the file has no `name`
    assert m.l1 == MemoryLevel(12288, 64 * KB)  # explicit buffer_count wins over 4*(24+24)
    assert m.l2 == MemoryLevel(1024, 64 * KB)
    assert m.l3 == MemoryLevel(64, 256 * KB)
    assert m.external.channel_bytes_per_cycle == 25.0
    assert (m.compute.tiles, m.compute.rows, m.compute.cols) == (64, 24, 24)


def test_timing_defaults_apply_without_timing_section():
    m = load_machine(CORPUS / "kpu__edge_ai.yaml")
    assert m.clock_ghz == 1.0
    assert m.external.latency_cycles == 100
    assert m.engines == Engines(2, 4, 16, 64.0, 64.0, 64.0)
    assert (m.l2_bank_ports, m.line_bytes) == (1, 64)
    assert m.compute.dataflows == DATAFLOWS


# --- the shipped configs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, ext, l3, l2, l1, engines, compute",
    [
        (
            "minimal",
            ExternalMemory(1, 256 * MB, 50.0, 100),
            MemoryLevel(1, 64 * KB),
            MemoryLevel(4, 32 * KB),
            MemoryLevel(4, 16 * KB),
            Engines(1, 2, 4, 64.0, 64.0, 64.0),
            ComputeFabric(1, 8, 8, DATAFLOWS),
        ),
        (
            "standard",
            ExternalMemory(2, 1024 * MB, 50.0, 100),
            MemoryLevel(4, 128 * KB),
            MemoryLevel(8, 64 * KB),
            MemoryLevel(4, 32 * KB),
            Engines(2, 4, 8, 64.0, 64.0, 64.0),
            ComputeFabric(2, 16, 16, DATAFLOWS),
        ),
        (
            "datacenter",
            ExternalMemory(4, 8192 * MB, 205.0, 100),
            MemoryLevel(8, 512 * KB),
            MemoryLevel(32, 128 * KB),
            MemoryLevel(4, 128 * KB),
            Engines(4, 8, 16, 256.0, 256.0, 256.0),
            ComputeFabric(4, 32, 32, DATAFLOWS),
        ),
    ],
)
def test_shipped_config(name, ext, l3, l2, l1, engines, compute):
    path = CONFIGS / f"{name}.json"
    m = load_machine(path)
    assert (m.name, m.clock_ghz) == (name, 1.0)
    assert (m.external, m.l3, m.l2, m.l1) == (ext, l3, l2, l1)
    assert (m.engines, m.compute) == (engines, compute)
    assert json.loads(path.read_text())["description"]


@pytest.mark.parametrize("name", ["minimal", "standard", "datacenter", "ideal_32x32"])
def test_shipped_config_by_name_is_the_file_in_configs(name):
    # the name resolves inside the package (hardware/configs links to configs/), so it works
    # from an installed package as from the checkout
    path = Path(resolve_config(name))
    assert path.is_relative_to(Path(hardware.__file__).parent)
    assert path.read_bytes() == (CONFIGS / f"{name}.json").read_bytes()
    assert load_machine(path).name == name


def test_unknown_config_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match=r"^standrad: not a config file \(.json, .yaml, .yml\) nor a shipped "
                                          r"config \(datacenter, ideal_32x32, minimal, standard\)$"):
        resolve_config("standrad")


def test_ideal_config_never_stalls_and_resizes():
    document = json.loads((CONFIGS / "ideal_32x32.json").read_text())
    assert document["description"]
    m = machine_from_dict(document, "ideal_32x32.json")
    assert (m.compute.tiles, m.compute.rows, m.compute.cols) == (1, 32, 32)
    assert m.external.latency_cycles == 0
    rates = [m.external.channel_bytes_per_cycle, m.engines.dma_bytes_per_cycle,
             m.engines.block_mover_bytes_per_cycle, m.engines.streamer_bytes_per_cycle]
    assert min(rates) >= 1e9
    assert min(m.engines.dma, m.engines.block_mover, m.engines.streamer) >= 2
    assert m.l3.total_bytes >= 64 * MB and m.l2.bytes >= 16 * MB and m.l1.bytes >= 16 * MB

    document["compute"]["processor_array"].update(rows=8, cols=128)
    resized = machine_from_dict(document, "ideal.json")
    assert (resized.compute.rows, resized.compute.cols) == (8, 128)
    assert resized.l1 == m.l1  # explicit buffer_count does not follow the array


# --- timing section ---------------------------------------------------------------------------


def _minimal() -> dict:
    return json.loads((CORPUS / "kpu__minimal.json").read_text())


def test_timing_overrides_and_clock_scales_external_rate():
    d = _minimal()
    d["timing"] = {"clock_ghz": 2.0, "dram_latency_cycles": 0, "streamer_bytes_per_cycle": 128,
                   "dataflows": ["weight_stationary"]}
    m = machine_from_dict(d, "x.json")
    assert m.clock_ghz == 2.0
    assert m.external.channel_bytes_per_cycle == 25.0  # 50 GB/s at 2 GHz
    assert m.external.latency_cycles == 0
    assert m.engines.streamer_bytes_per_cycle == 128.0
    assert m.engines.dma_bytes_per_cycle == 64.0  # untouched keys keep defaults
    assert m.compute.dataflows == ("weight_stationary",)


# --- errors -----------------------------------------------------------------------------------


def _set(d: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = d
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return d


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("on_chip_memory.l2.bank_count", 0, "must be a positive integer up to 1048576, got 0"),
        ("on_chip_memory.l3.tile_capacity_kb", -64, "must be a positive integer up to 1048576, got -64"),
        ("external_memory.bandwidth_gbps", "fast", 'must be a finite number of at least 0.001, or "unlimited", got \'fast\''),
        ("external_memory.bandwidth_gbps", float("nan"), "must be a finite number of at least 0.001"),
        # a subnormal rate would make one transfer take more cycles than a float can hold
        ("timing.dma_bytes_per_cycle", 2.225073858507203e-309, "must be a finite number of at least 0.001"),
        ("timing.clock_ghz", 1e6, "must be a number from 0.001 to 1000"),
        ("timing.clock_ghz", 0, "must be a number from 0.001 to 1000"),
        ("data_movement.dma_engine_count", True, "must be a positive integer up to 1048576, got True"),
        ("data_movement.streamer_count", 4.0, "must be a positive integer up to 1048576, got 4.0"),
        ("timing.dram_latency_cycles", -1, "must be a non-negative integer"),
        ("timing.line_bytes", 48, "must be a positive power of two"),
        ("timing.dataflows", ["row_stationary"], "must be a non-empty list of distinct dataflows"),
        ("timing.dataflows", [], "must be a non-empty list"),
        ("compute.processor_array.topology", "hexagonal", "must be 'rectangular'"),
        ("compute.systolic_mode", False, "must be true"),
        ("compute.processor_array", [8, 8], "must be a mapping, got [8, 8]"),
        ("address_map.l3_tile_base", "0xZZ", "must be a non-negative integer or a hex string"),
    ],
)
def test_bad_value(tmp_path, key, value, reason):
    message = config_error(tmp_path, _set(_minimal(), key, value))
    assert f": {key}: {reason}" in message


def test_channel_rate_below_floor_names_bandwidth(tmp_path):
    d = _set(_set(_minimal(), "external_memory.bandwidth_gbps", 0.5), "timing.clock_ghz", 1000)
    message = config_error(tmp_path, d)
    assert ": external_memory.bandwidth_gbps: gives 0.0005 bytes per cycle at timing.clock_ghz 1000" in message


@pytest.mark.parametrize(
    "key", ["cache", "compute.processor_array.depth", "timing.clock_mhz", "host_memory.numa"]
)
def test_unknown_key(tmp_path, key):
    message = config_error(tmp_path, _set(_minimal(), key, 1))
    assert f": {key}: unknown key (expected one of: " in message


def test_missing_required_key_and_section(tmp_path):
    d = _minimal()
    del d["on_chip_memory"]["l2"]["bank_count"]
    assert config_error(tmp_path, d).endswith(": on_chip_memory.l2.bank_count: missing required key")
    d = _minimal()
    del d["data_movement"]
    assert config_error(tmp_path, d).endswith(": data_movement: missing required section")


def test_address_map_is_open_and_accepts_hex_strings():
    d = _set(_minimal(), "address_map", {"l3_tile_base": "0x2000", "my_window": 4096})
    assert machine_from_dict(d).l3 == MemoryLevel(1, 64 * KB)


def test_address_map_keys_are_names(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text(yaml.safe_dump(_minimal()) + "address_map:\n  " + "9" * 70 + ": 4096\n")
    with pytest.raises(ConfigError, match=r"k\.yaml: address_map: a key is a name, got an integer literal of 70"):
        load_machine(path)


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  "compute": {,\n}\n')
    expected = r"broken\.json: line 3, column 15: invalid JSON: "
    with pytest.raises(ConfigError, match=expected) as info:
        load_machine(path)
    assert "\n" not in str(info.value)


def test_bad_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\ncompute:\n  tile_count: [1, 2\nexternal_memory: {}\n")
    expected = r"broken\.yaml: line 4, column 16: invalid YAML: "
    with pytest.raises(ConfigError, match=expected) as info:
        load_machine(path)
    assert "\n" not in str(info.value)


def test_yaml_errors_name_the_key(tmp_path):
    path = tmp_path / "bad.yml"
    text = (CORPUS / "kpu__minimal.yaml").read_text().replace("bank_count: 4", "bank_count: 0")
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_machine(path)
    reason = "must be a positive integer up to 1048576, got 0"
    assert str(info.value) == f"{path}: on_chip_memory.l2.bank_count: {reason}"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as info:
        load_machine(path)
    assert str(info.value) == f"{path}: cannot read: No such file or directory"


def test_unsupported_extension(tmp_path):
    with pytest.raises(ConfigError, match=r"kpu\.toml: unsupported extension '\.toml'"):
        load_machine(tmp_path / "kpu.toml")


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"^list\.json: must be a mapping, got \[\]$"):
        machine_from_dict([], "list.json")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ValueError, match=r"^<config>: compute\.tile_count: must be a positive"):
        machine_from_dict(_set(_minimal(), "compute.tile_count", 0))
