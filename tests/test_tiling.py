"""Tile optimizer: upstream's analytical start, and an exact DRAM count for the loop order."""

from __future__ import annotations

import itertools
import math

from kernel_compiler.target import Level, Target
from kernel_compiler.tiling import MatmulProblem, analytical_tiles, choose_tiling, dram_traffic, streams

# upstream kpu-sim's defaults: one 64 KB L2 bank as the cache, a 16x16 array
UPSTREAM = Target("upstream-defaults", 16, 16, 1, Level(1, 64 * 1024), Level(1, 64 * 1024),
                  Level(4, 32 * 1024), ("output_stationary",))


def problem(M, N, K, depth=1, elem=4):
    return MatmulProblem(M, N, K, (), (), (), (), None, False, False, elem, elem, 0, elem, 4, depth)


def choose(p):
    """The tiling chosen for `p` on upstream's defaults, and its exact DRAM bytes as the chooser
    counts them."""
    t = choose_tiling(p, UPSTREAM)
    trips = {"ti": math.ceil(p.M / t.Ti), "tj": math.ceil(p.N / t.Tj), "tk": math.ceil(p.K / t.Tk)}
    return t, dram_traffic(streams(p, t.Ti, t.Tj, t.Tk), t.loop_order, trips, t.parallel)


def brute_force_dram(M, N, K, Ti, Tj, Tk, order, elem=4):
    """Walk every iteration of the loop nest; a stream reloads its tile whenever a loop at or
    outside the innermost loop indexing it advances; C is written once per (ti, tj)."""
    trips = {"ti": math.ceil(M / Ti), "tj": math.ceil(N / Tj), "tk": math.ceil(K / Tk)}
    indexed = {"A": ("ti", "tk"), "B": ("tk", "tj")}
    size = {"A": lambda i: min(Ti, M - i["ti"] * Ti) * min(Tk, K - i["tk"] * Tk),
            "B": lambda i: min(Tk, K - i["tk"] * Tk) * min(Tj, N - i["tj"] * Tj)}
    full = ("ti", "tj", "tk")
    total = 0
    previous = None
    for point in itertools.product(*(range(trips[v]) for v in order)):
        it = dict(zip(order, point))
        it.update({v: 0 for v in full if v not in it})
        for s, vars_ in indexed.items():
            depth = max([order.index(v) for v in vars_ if v in order], default=-1)
            changed = previous is None or any(it[v] != previous[v] for v in order[: depth + 1])
            if changed:
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
    assert dram == brute_force_dram(M, N, K, t.Ti, t.Tj, t.Tk, t.loop_order)
    # The chosen tiling, spelled out: at most one bank of 64 KB holds A, B and C tiles.
    assert (t.Ti * t.Tk + t.Tk * t.Tj + t.Ti * t.Tj) * 4 <= 64 * 1024
    print(f"1024x1024x512 tiles {t.Ti}x{t.Tj}x{t.Tk} order {t.loop_order}: "
          f"{dram} B exact vs {compulsory} B compulsory")


def test_tiling_beats_upstream_analytical_traffic():
    M, N, K = 1024, 1024, 512
    Ti, Tj, Tk = analytical_tiles(M, N, K, 4, 64 * 1024, 16)
    upstream = brute_force_dram(M, N, K, Ti, Tj, Tk, ("ti", "tj", "tk"))
    assert choose(problem(M, N, K))[1] <= upstream


def test_whole_k_panel_is_loaded_once_per_row():
    # K fits in one tile: the tk loop disappears and A[ti] stays put while tj advances.
    t, dram = choose(problem(256, 256, 16))
    assert "tk" not in t.loop_order
    assert dram == brute_force_dram(256, 256, 16, t.Ti, t.Tj, t.Tk, t.loop_order)


def test_double_buffered_tiles_fit_their_banks():
    t = choose_tiling(problem(512, 512, 512, depth=2), UPSTREAM)
    assert (2 * t.Ti * t.Tk + 2 * t.Tk * t.Tj + t.Ti * t.Tj) * 4 <= 64 * 1024
