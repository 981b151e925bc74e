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
from text_mutations import mutated, mutation

DATA = Path(__file__).parent / "data" / "dfg"
TEXTS = [p.read_text(encoding="utf-8") for p in sorted(DATA.glob("*.dfg"))]
NOISE = "|<>:,x?-0123456789 \tfi"
TARGET = load_target(str(Path(__file__).parent.parent / "configs" / "standard.json"))


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(text=st.sampled_from(TEXTS), mutations=st.lists(mutation(NOISE), min_size=1, max_size=6))
def test_mutated_dfg_compiles_or_fails_cleanly(text, mutations):
    try:
        graph, warnings = parse_dfg("fuzz.dfg", mutated(text, mutations))
        infer_shapes(graph, warnings)
        compile_graph(graph, "fuzz.dfg", TARGET)
    except CompileError as exc:
        message = str(exc)
        assert message.startswith("fuzz.dfg:") and "\n" not in message, message
        assert len(message.splitlines()) == 1, message
