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
    operand reloads its L3 tile (a panel of all of K when one operand is resident) whenever a
    loop at or outside the innermost loop indexing it advances; C is written once per tile."""
    Ti, Tj, Tk = t.Ti, t.Tj, t.Tk
    trips = {"ti": math.ceil(M / Ti), "tj": math.ceil(N / Tj), "tk": math.ceil(K / Tk)}
    Bi, Bj = Ti * t.per_block, Tj * t.per_block
    trips.update(bi=math.ceil(M / Bi), bj=math.ceil(N / Bj))
    panel = {"A": {"A": "bi", "B": "tj"}, "B": {"A": "ti", "B": "bj"}}.get(t.resident)
    indexed = {"A": (panel["A"],), "B": (panel["B"],)} if panel else {"A": ("ti", "tk"), "B": ("tk", "tj")}
    rows = {"bi": lambda i: min(Bi, M - i["bi"] * Bi), "ti": lambda i: min(Ti, M - i["ti"] * Ti)}
    cols = {"bj": lambda i: min(Bj, N - i["bj"] * Bj), "tj": lambda i: min(Tj, N - i["tj"] * Tj)}
    if panel:
        size = {"A": lambda i: rows[panel["A"]](i) * K, "B": lambda i: K * cols[panel["B"]](i)}
    else:
        size = {"A": lambda i: rows["ti"](i) * min(Tk, K - i["tk"] * Tk),
                "B": lambda i: min(Tk, K - i["tk"] * Tk) * cols["tj"](i)}
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
