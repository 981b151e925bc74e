"""Ceiling division of non-negative integers, defined once for every unit model."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
