"""Line-level mutations of a text model, shared by the frontends' fuzz tests: each
`(lines, i, j, c)` edits `lines` in place, `i` and `j` picking where (taken modulo the sizes),
`c` a character to write (or, for a number, which replacement)."""

from __future__ import annotations

import re

from hypothesis import strategies as st

NUMBERS = ["0", "1", "2", "3", "-1", "8", "30", "64", "4096", "-inf", "nan", "1e9", "2147483648",
           "99999999999999999999999"]
_NUMBER = re.compile(r"-?[0-9]+")


def delete_line(lines: list[str], i: int, _j: int, _c: str) -> None:
    del lines[i % len(lines)]


def duplicate_line(lines: list[str], i: int, _j: int, _c: str) -> None:
    lines.insert(i % len(lines), lines[i % len(lines)])


def swap_lines(lines: list[str], i: int, j: int, _c: str) -> None:
    a, b = i % len(lines), j % len(lines)
    lines[a], lines[b] = lines[b], lines[a]


def replace_char(lines: list[str], i: int, j: int, c: str) -> None:
    line = lines[i % len(lines)]
    if line:
        k = j % len(line)
        lines[i % len(lines)] = line[:k] + c + line[k + 1:]


def insert_char(lines: list[str], i: int, j: int, c: str) -> None:
    line = lines[i % len(lines)]
    k = j % (len(line) + 1)
    lines[i % len(lines)] = line[:k] + c + line[k:]


def delete_span(lines: list[str], i: int, j: int, c: str) -> None:
    line = lines[i % len(lines)]
    k = j % (len(line) + 1)
    lines[i % len(lines)] = line[:k] + line[k + 1 + ord(c[0]) % 12:]


def change_number(lines: list[str], i: int, j: int, c: str) -> None:
    n = i % len(lines)
    found = list(_NUMBER.finditer(lines[n]))
    if found:
        m = found[j % len(found)]
        lines[n] = lines[n][:m.start()] + NUMBERS[ord(c[0]) % len(NUMBERS)] + lines[n][m.end():]


def truncate(lines: list[str], i: int, j: int, _c: str) -> None:
    n = i % len(lines)
    lines[n] = lines[n][: j % (len(lines[n]) + 1)]
    del lines[n + 1:]


# the mutations of every text frontend's fuzz test; `change_number` and `delete_span` reach
# deeper into a line than a single character does
MUTATIONS = [delete_line, duplicate_line, swap_lines, replace_char, insert_char, delete_span, change_number,
             truncate]


def mutation(noise: str) -> st.SearchStrategy:
    """One mutation with its arguments, writing characters of `noise` (the format's syntax) or any."""
    return st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 10_000), st.integers(0, 10_000),
                     st.one_of(st.sampled_from(noise), st.characters()))


def mutated(text: str, mutations: list) -> str:
    lines = text.split("\n")
    for mutate, i, j, c in mutations:
        if lines:
            mutate(lines, i, j, c)
    return "\n".join(lines)
