"""Fuzz the `.dfg` frontend and the compiler behind it: whatever the text, it compiles or raises
a one-line CompileError."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from kernel_compiler import compile_graph, load_target
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends.dfg import parse_dfg
from kernel_compiler.shape_inference import infer_shapes

DATA = Path(__file__).parent / "data" / "dfg"
TEXTS = [p.read_text(encoding="utf-8") for p in sorted(DATA.glob("*.dfg"))]
NOISE = "|<>:,x?-0123456789 \tfi"
TARGET = load_target(str(Path(__file__).parent.parent / "configs" / "standard.json"))


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


def truncate(lines: list[str], i: int, j: int, _c: str) -> None:
    n = i % len(lines)
    lines[n] = lines[n][: j % (len(lines[n]) + 1)]
    del lines[n + 1:]


MUTATIONS = [delete_line, duplicate_line, swap_lines, replace_char, insert_char, truncate]

mutation = st.tuples(
    st.sampled_from(MUTATIONS),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.one_of(st.sampled_from(NOISE), st.characters()),
)


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(text=st.sampled_from(TEXTS), mutations=st.lists(mutation, min_size=1, max_size=6))
def test_mutated_dfg_compiles_or_fails_cleanly(text, mutations):
    lines = text.split("\n")
    for mutate, i, j, c in mutations:
        if lines:
            mutate(lines, i, j, c)
    try:
        graph, warnings = parse_dfg("fuzz.dfg", "\n".join(lines))
        infer_shapes(graph, warnings)
        compile_graph(graph, "fuzz.dfg", TARGET)
    except CompileError as exc:
        message = str(exc)
        assert message.startswith("fuzz.dfg:") and "\n" not in message, message
        assert len(message.splitlines()) == 1, message
