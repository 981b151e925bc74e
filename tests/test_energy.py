"""The energy and area models: a GEMM's energy worked out by hand from its MACs and the bytes it
moves at each level, read from `kpu-loader --json`; the config's `energy` and `area` sections;
the area of a machine by its parts."""

from __future__ import annotations

import json

import orjson
import pytest

from conftest import CONFIGS, DATA, run_cli
from hardware import ConfigError, machine_area, machine_from_dict
from dfx import DTYPES
from hardware.energy import ACCESS_PJ_PER_BYTE, MAC_PJ, VECTOR_PJ_PER_ELEMENT
from test_bind import matmul_dfg
from test_kernel_profile import CHAIN, SHAPES, N, profile

STANDARD = json.loads((CONFIGS / "standard.json").read_text())

# round figures, so the hand-worked sum below reads plainly
ENERGY = {"mac_pj": {"f32": 1.0},
          "access_pj_per_byte": {"external": 100.0, "l3": 10.0, "l2": 1.0, "l1": 0.5, "register": 0.25}}


def test_hand_worked_gemm_energy(tmp_path):
    """A 16x16x16 f32 GEMM on standard's 16x16 array is one tile: A and B each make the three hops
    in (DRAM -> L3 -> L2 -> L1) once, C the three out (registers -> L2 -> L3 -> DRAM); the array
    reads A and B from L1 once and does 16^3 MACs, each reading two operands from registers."""
    src, obj, config = tmp_path / "mm.dfg", tmp_path / "mm.kpu", tmp_path / "kpu.json"
    src.write_text(matmul_dfg(16, 16, 16))
    config.write_text(json.dumps({**STANDARD, "energy": ENERGY}))
    assert run_cli("compiler", src, "-o", obj, "--target", config).returncode == 0
    proc = run_cli("loader", obj, "--config", config, "--timing-only", "--json", "--no-cache")
    assert proc.returncode == 0, proc.stderr
    s = orjson.loads(proc.stdout)

    tile = 16 * 16 * 4  # bytes of one operand or result
    assert s["bytes_moved"] == {"EXTERNAL->L3": 2 * tile, "L3->L2": 2 * tile, "L2->L1": 2 * tile,
                                "REGISTER->L2": tile, "L2->L3": tile, "L3->EXTERNAL": tile}
    macs = 16 ** 3
    assert s["macs"] == macs
    pj = ENERGY["access_pj_per_byte"]
    moves = (2 * tile * (pj["external"] + pj["l3"]) + 2 * tile * (pj["l3"] + pj["l2"])
             + 2 * tile * (pj["l2"] + pj["l1"])
             + tile * (pj["register"] + pj["l2"]) + tile * (pj["l2"] + pj["l3"]) + tile * (pj["l3"] + pj["external"]))
    operands = macs * 2 * 4 * pj["register"] + 2 * tile * pj["l1"]  # registers per MAC, A and B from L1
    expected = macs * 1.0 + operands + moves
    assert s["energy"]["total_pj"] == pytest.approx(expected, rel=1e-12)
    assert s["energy"]["by_level"] == pytest.approx({
        "compute": macs * 1.0,
        "external": 3 * tile * pj["external"],
        "l3": 6 * tile * pj["l3"],
        "l2": 6 * tile * pj["l2"],
        "l1": 2 * tile * pj["l1"] + 2 * tile * pj["l1"],
        "register": macs * 8 * pj["register"] + tile * pj["register"]}, rel=1e-12)
    by_unit = s["energy"]["by_unit"]
    assert by_unit["dma"] == pytest.approx(3 * tile * (pj["external"] + pj["l3"]))
    assert by_unit["array"] == pytest.approx(macs + operands)
    assert sum(by_unit.values()) == pytest.approx(expected)
    # the one kernel's energy is the run's
    (kernel,) = s["kernels"].values()
    assert kernel["energy"]["total_pj"] == pytest.approx(expected)


def test_every_dtype_has_a_mac_figure():
    """hardware/ knows no DFX, so its table repeats the dtypes: a new one must get its figure."""
    assert set(MAC_PJ) == set(DTYPES)


def test_a_vector_kernel_costs_its_elements():
    """An unfused ReLU (one simple vector op per element) and a transpose (moves only)."""
    s = profile(CHAIN, SHAPES)
    relu, transpose = s["kernels"]["relu_0"]["energy"], s["kernels"]["transpose_2"]["energy"]
    elements = s["kernels"]["relu_0"]["vector_elements"]
    assert elements == N * N
    assert relu["by_unit"]["vector"] == relu["by_level"]["compute"] == elements * VECTOR_PJ_PER_ELEMENT["simple"]
    assert relu["by_unit"]["array"] == 0.0
    assert transpose["by_level"]["compute"] == 0.0 and transpose["total_pj"] > 0
    assert s["energy"]["total_pj"] == pytest.approx(sum(k["energy"]["total_pj"] for k in s["kernels"].values()))


def test_area_by_part():
    """standard: 2 tiles of 16x16 PEs and 16 lanes, 512 KB L3, 512 KB L2, 2 x 128 KB L1, and
    2 + 4 + 8 engines; with one figure per part the area is a sum anyone can check."""
    area = {"pe_um2": 1000.0, "vector_lane_um2": 500.0,
            "sram_mm2_per_kb": {"l3": 0.01, "l2": 0.02, "l1": 0.04},
            "engine_mm2": {"dma": 1.0, "block_mover": 0.5, "streamer": 0.25}}
    a = machine_area(machine_from_dict({**STANDARD, "area": area}))
    assert a["by_part"] == pytest.approx({"array": 512 * 1000 / 1e6, "vector": 32 * 500 / 1e6,
                                          "l3": 512 * 0.01, "l2": 512 * 0.02, "l1": 256 * 0.04,
                                          "dma": 2.0, "block_mover": 2.0, "streamer": 2.0})
    assert a["total_mm2"] == pytest.approx(sum(a["by_part"].values()))


@pytest.mark.parametrize("section, message", [
    ({"energy": {"mac_pj": {"f32": -1}}}, "energy.mac_pj.f32: must be a finite non-negative number"),
    ({"energy": {"mac_pj": {"f99": 1}}}, "energy.mac_pj.f99"),
    ({"energy": {"access_pj_per_byte": {"external": True}}}, "energy.access_pj_per_byte.external"),
    ({"area": {"pe_um2": 1e12}}, "area.pe_um2: must be a finite non-negative number up to"),
    ({"area": {"engine_mm2": {"dma": "big"}}}, "area.engine_mm2.dma"),
])
def test_bad_sections_name_the_key(section, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        machine_from_dict({**STANDARD, **section}, "kpu.json")


def test_system_schema_takes_the_sections_too():
    document = json.loads((DATA / "kpu-configs" / "examples__minimal_kpu.json").read_text())
    m = machine_from_dict({**document, "energy": {"access_pj_per_byte": {"external": 7.0}},
                           "area": {"engine_mm2": {"dma": 3.0}}}, "kpu.json")
    assert m.energy.access_pj_per_byte == {**ACCESS_PJ_PER_BYTE, "external": 7.0}
    assert machine_area(m)["by_part"]["dma"] == 3.0 * m.engines.dma


def test_profile_prints_energy_by_level_and_by_unit():
    from rich.console import Console

    from loader.report import print_profile

    s = {**profile(CHAIN, SHAPES), "object": "chain.kpu"}
    console = Console(record=True, width=400)
    print_profile(s, console)
    line = next(t for t in console.export_text().splitlines() if t.startswith("Energy per inference"))
    e = s["energy"]
    assert f"{e['total_pj'] / 1e6:,.2f} µJ ({e['total_pj'] / s['macs']:,.2f} pJ per MAC)" in line
    assert f"external {e['by_level']['external'] / e['total_pj']:.0%}" in line
    assert f"by unit: array {e['by_unit']['array'] / e['total_pj']:.0%}" in line
    assert f"Area {s['area']['total_mm2']:,.2f} mm²" in line
