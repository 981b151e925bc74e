"""Fuzz the HLO text frontend and the compiler behind it: whatever the text (the corpus truncated,
lines dropped, repeated or swapped, characters and numbers changed), it compiles or raises a
one-line CompileError naming the file, never another exception."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_one_line_error, examples, run_cli
from kernel_compiler import compile_graph, load_target
from kernel_compiler.errors import CompileError
from kernel_compiler.frontends.hlo import parse_hlo
from kernel_compiler.shape_inference import infer_shapes
from text_mutations import mutated, mutation

DATA = Path(__file__).parent / "data" / "hlo"
TEXTS = [p.read_text(encoding="utf-8") for p in sorted(DATA.glob("*.hlo"))]
NOISE = "{}[](),=%:-_.x0123456789 \t\"'/*<>?ROOT"
TARGET = load_target(str(Path(__file__).parent.parent / "configs" / "standard.json"))


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
@given(text=st.sampled_from(TEXTS), mutations=st.lists(mutation(NOISE), min_size=1, max_size=5))
def test_mutated_hlo_compiles_or_fails_cleanly(text, mutations):
    compiles_or_fails_cleanly(mutated(text, mutations))


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
