"""Exact transfer time, ceil(bytes / bytes_per_cycle), for fractional rates."""

from __future__ import annotations

from fractions import Fraction


class Bandwidth:
    __slots__ = ("bytes_per_cycle", "_num", "_den")

    def __init__(self, bytes_per_cycle: float):
        if not bytes_per_cycle > 0:
            raise ValueError(f"bandwidth must be positive, got {bytes_per_cycle} bytes/cycle")
        self.bytes_per_cycle = bytes_per_cycle
        if bytes_per_cycle == float("inf"):  # an ideal memory: transfers take no time
            self._num, self._den = 1, 0
            return
        # Config rates such as 12.8 B/cycle (bandwidth_gbps / clock_ghz) are not exact in binary:
        # float division would make 1280 bytes take ceil(100.00000000000001) = 101 cycles.
        rate = Fraction(bytes_per_cycle).limit_denominator(1 << 20) or Fraction(bytes_per_cycle)
        self._num = rate.numerator
        self._den = rate.denominator

    def cycles(self, nbytes: int) -> int:
        return -(-nbytes * self._den // self._num)
