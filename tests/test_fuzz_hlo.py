"""Fuzz the HLO text frontend and the compiler behind it: whatever the text (the corpus truncated,
lines dropped, repeated or swapped, characters and numbers changed), it compiles or raises a
one-line CompileError naming the file, never another exception."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_one_line_error, examples, run_cli
from kernel_compiler import compile_graph, load_target
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends.hlo import parse_hlo
from kernel_compiler.shape_inference import infer_shapes

DATA = Path(__file__).parent / "data" / "hlo"
TEXTS = [p.read_text(encoding="utf-8") for p in sorted(DATA.glob("*.hlo"))]
NOISE = "{}[](),=%:-_.x0123456789 \t\"'/*<>?ROOT"
NUMBERS = ["0", "1", "2", "3", "-1", "8", "30", "64", "4096", "-inf", "nan", "1e9", "2147483648",
           "99999999999999999999999"]
TARGET = load_target(str(Path(__file__).parent.parent / "configs" / "standard.json"))
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


MUTATIONS = [delete_line, duplicate_line, swap_lines, replace_char, insert_char, delete_span, change_number,
             truncate]

mutation = st.tuples(
    st.sampled_from(MUTATIONS),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.one_of(st.sampled_from(NOISE), st.characters()),
)


def compiles_or_fails_cleanly(text: str) -> None:
    try:
        graph, warnings = parse_hlo("fuzz.hlo", text)
        infer_shapes(graph, warnings)
        compile_graph(graph, "fuzz.hlo", TARGET)
    except CompileError as exc:
        message = str(exc)
        assert message.startswith("fuzz.hlo"), message
        assert len(message.splitlines()) == 1, message


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(text=st.sampled_from(TEXTS), mutations=st.lists(mutation, min_size=1, max_size=5))
def test_mutated_hlo_compiles_or_fails_cleanly(text, mutations):
    lines = text.split("\n")
    for mutate, i, j, c in mutations:
        if lines:
            mutate(lines, i, j, c)
    compiles_or_fails_cleanly("\n".join(lines))


@settings(max_examples=examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(text=st.sampled_from(TEXTS), cut=st.integers(0, 10_000))
def test_truncated_hlo_compiles_or_fails_cleanly(text, cut):
    compiles_or_fails_cleanly(text[: cut % (len(text) + 1)])


def test_a_truncated_module_exits_2_without_a_traceback(tmp_path):
    path = tmp_path / "cut.hlo"
    text = (DATA / "act_attention.hlo").read_text()
    path.write_text(text[: text.index("%sum_broadcast")])
    proc = run_cli("compiler", path, "-o", tmp_path / "cut.kpu")
    assert_one_line_error(proc, f"{path}:")
    assert not (tmp_path / "cut.kpu").exists()
