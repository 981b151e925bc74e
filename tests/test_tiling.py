"""Tile optimizer: upstream's analytical start, and an exact DRAM count for the loop order."""

from __future__ import annotations

import math

import pytest

from conftest import CONFIGS
from kernel_compiler.target import Level, Target, load_target
from kernel_compiler.tiling import (MatmulProblem, MatmulTiling, Parallel, analytical_tiles, choose_tiling, dram_traffic,
                                   streams, trips_of)

# upstream kpu-sim's defaults: one 64 KB L2 bank as the cache, a 16x16 array
UPSTREAM = Target("upstream-defaults", 16, 16, 1, Level(1, 64 * 1024), Level(1, 64 * 1024),
                  Level(4, 32 * 1024), ("output_stationary",))


def problem(M, N, K, depth=1, elem=4):
    return MatmulProblem(M, N, K, (), (), (), (), None, False, False, elem, elem, 0, elem, 4, depth)


def choose(p, target=UPSTREAM):
    """The tiling chosen for `p` (on upstream's defaults unless given), and its exact DRAM bytes
    as the chooser counts them."""
    t = choose_tiling(p, target)
    return t, dram_traffic(streams(p, t), t.loop_order, trips_of(p, t.Ti, t.Tj, t.Tk, t.per_block), t.within)


def brute_force_dram(M, N, K, t, elem=4):
    """Walk every iteration of the loop nest (a loop within blocks over its block's tiles); an
    operand reloads its L3 tile (a panel of all of K when one operand is resident, but the other's
    K tiles beside a whole resident operand) whenever a loop at or outside the innermost loop
    indexing it advances; C is written once per tile."""
    Ti, Tj, Tk = t.Ti, t.Tj, t.Tk
    trips = {"ti": math.ceil(M / Ti), "tj": math.ceil(N / Tj), "tk": math.ceil(K / Tk)}
    Bi, Bj = Ti * t.per_block, Tj * t.per_block
    trips.update(bi=math.ceil(M / Bi), bj=math.ceil(N / Bj))
    row, col = "bi" if t.resident == "A" else "ti", "bj" if t.resident == "B" else "tj"
    panel = {"A": t.resident is not None and (t.resident == "A" or not t.streamed_tiles),
             "B": t.resident is not None and (t.resident == "B" or not t.streamed_tiles)}
    indexed = {"A": (row,) if panel["A"] else (row, "tk"), "B": (col,) if panel["B"] else ("tk", col)}
    rows = {"bi": lambda i: min(Bi, M - i["bi"] * Bi), "ti": lambda i: min(Ti, M - i["ti"] * Ti)}
    cols = {"bj": lambda i: min(Bj, N - i["bj"] * Bj), "tj": lambda i: min(Tj, N - i["tj"] * Tj)}
    k_of = {name: (lambda i: K) if panel[name] else (lambda i: min(Tk, K - i["tk"] * Tk)) for name in "AB"}
    size = {"A": lambda i: rows[row](i) * k_of["A"](i), "B": lambda i: k_of["B"](i) * cols[col](i)}
    within = t.within

    def points(depth, it):
        if depth == len(t.loop_order):
            yield dict(it)
            return
        var = t.loop_order[depth]
        steps = range(trips[var])
        if var in within:
            first = it[within[var]] * t.per_block
            steps = range(first, min(trips[var], first + t.per_block))
        for v in steps:
            it[var] = v
            yield from points(depth + 1, it)

    total, previous = 0, None
    for it in points(0, {}):
        it = {**{v: 0 for v in ("bi", "bj", "ti", "tj", "tk")}, **it}
        for s, vars_ in indexed.items():
            depth = max([t.loop_order.index(v) for v in vars_ if v in t.loop_order], default=-1)
            if previous is None or any(it[v] != previous[v] for v in t.loop_order[: depth + 1]):
                total += size[s](it) * elem
        previous = it
    return total + M * N * elem


def test_analytical_matches_upstream_numbers():
    assert analytical_tiles(1024, 1024, 512, 4, 64 * 1024, 16) == (80, 80, 48)
    assert analytical_tiles(1024, 1024, 1024, 4, 64 * 1024, 16) == (64, 64, 96)


def test_dram_estimate_is_exact_and_at_least_compulsory():
    M, N, K = 1024, 1024, 512
    t, dram = choose(problem(M, N, K))
    compulsory = (M * K + K * N + M * N) * 4
    assert dram >= compulsory
    assert dram == brute_force_dram(M, N, K, t)
    # The chosen tiling, spelled out: at most one bank of 64 KB holds A, B and C tiles.
    assert (t.Ti * t.Tk + t.Tk * t.Tj + t.Ti * t.Tj) * 4 <= 64 * 1024
    print(f"1024x1024x512 tiles {t.Ti}x{t.Tj}x{t.Tk} order {t.loop_order}: "
          f"{dram} B exact vs {compulsory} B compulsory")


def test_tiling_beats_upstream_analytical_traffic():
    M, N, K = 1024, 1024, 512
    Ti, Tj, Tk = analytical_tiles(M, N, K, 4, 64 * 1024, 16)
    upstream = brute_force_dram(M, N, K, MatmulTiling(Ti, Tj, Tk, Tk, ("ti", "tj", "tk"), Parallel(None, 1)))
    assert choose(problem(M, N, K))[1] <= upstream


def test_whole_k_panel_is_loaded_once_per_row():
    # K fits in one tile: the tk loop disappears and A[ti] stays put while tj advances.
    t, dram = choose(problem(256, 256, 16))
    assert "tk" not in t.loop_order
    assert dram == brute_force_dram(256, 256, 16, t)


def test_double_buffered_tiles_fit_their_banks():
    t = choose_tiling(problem(512, 512, 512, depth=2), UPSTREAM)
    assert (2 * t.Ti * t.Tk + 2 * t.Tk * t.Tj + t.Ti * t.Tj) * 4 <= 64 * 1024


@pytest.mark.parametrize("M, N, K, resident", [(8192, 256, 256, "B"), (256, 8192, 256, "A"), (4096, 4096, 64, "A"),
                                               (1000, 2000, 100, None), (1024, 1024, 1024, None), (300, 7000, 200, "A")])
def test_resident_panel_count_is_exact(M, N, K, resident):
    """On standard (4 x 128 KB of L3 shared by 2 compute tiles): one operand's panel stays in L3
    while the other streams past it where that moves fewer bytes; the count is exact."""
    t, dram = choose(problem(M, N, K, depth=2), load_target(str(CONFIGS / "standard.json")))
    assert t.resident == resident, t
    assert dram == brute_force_dram(M, N, K, t)
    if resident is not None:
        # the resident operand once, the streamed one once per panel, the result once
        streamed = (N * K if resident == "A" else M * K) * math.ceil((M if resident == "A" else N) /
                                                                       ((t.Ti if resident == "A" else t.Tj) * t.per_block))
        assert dram == ((M * K if resident == "A" else K * N) + streamed + M * N) * 4


def test_a_whole_operand_stays_beside_the_others_k_tiles():
    """GPT-2's FFN on standard: X (128 x 768, 393 KB) fits L3 whole, but beside it no panel of all
    of K of W1 does for two compute tiles. X stays (one tile of rows, loaded once and shared)
    while W1 streams past it in its K tiles: every operand crosses once, where the tiling without
    it reads X once per column tile of the result (24 times)."""
    standard = load_target(str(CONFIGS / "standard.json"))
    bias = ((4, False, True),)  # the fused bias row
    M, N, K = 128, 3072, 768
    p = MatmulProblem(M, N, K, (), (), (), (), None, False, False, 4, 4, 0, 4, 4, 2, bias)
    t, dram = choose(p, standard)
    assert (t.resident, t.streamed_tiles, t.Ti) == ("A", True, M), t
    assert dram == (M * K + K * N + M * N) * 4  # 11,403,264 (the bias row's stream aside); was 20,447,232
    t, dram = choose(problem(M, N, K, depth=2), standard)
    assert dram == brute_force_dram(M, N, K, t) == (M * K + K * N + M * N) * 4


def test_an_operand_too_large_for_l3_keeps_the_tiles_without_a_panel():
    """GPT-2's second matmul: its A (128 x 3072, 1.5 MB) fits no L3 whole, and with K innermost and
    one 64 KB L2 bank for the accumulators (a result tile of at most 128 x 128), A is read once
    per column tile of the result and B once: 4K (M N / Tj + M N / Ti) bytes, least at 128 x 128."""
    standard = load_target(str(CONFIGS / "standard.json"))
    M, N, K = 128, 768, 3072
    t, dram = choose(problem(M, N, K, depth=2), standard)
    assert (t.resident, t.Ti, t.Tj) == (None, 128, 128), t
    assert dram == brute_force_dram(M, N, K, t) == (M * K * N // 128 + K * N + M * N) * 4
