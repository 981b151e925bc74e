"""Frontends: turn a model file into the graph IR, then infer shapes.

`load_graph` picks the frontend by file extension; the ONNX and HLO frontends join this table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dfx.graph import Graph

from ..errors import CompileError
from ..shape_inference import infer_shapes
from .dfg import parse_dfg
from .kpusim_json import parse_kpusim_json

Frontend = Callable[[str, str], tuple[Graph, list[str]]]

FRONTENDS: dict[str, Frontend] = {
    ".dfg": parse_dfg,
    ".json": parse_kpusim_json,
}


def load_graph(path: str) -> tuple[Graph, list[str]]:
    """Read `path` with the frontend for its extension and infer shapes; (graph, warning lines)."""
    ext = Path(path).suffix
    frontend = FRONTENDS.get(ext.lower())
    if frontend is None:
        expected = ", ".join(FRONTENDS)
        raise CompileError(f"{path}: unsupported input type '{ext}' (expected {expected})")
    graph, warnings = frontend(path, read_source(path))
    return infer_shapes(graph, warnings), warnings


def read_source(path: str) -> str:
    """The text of an input file, or CompileError "<file>: cannot read: <reason>"."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CompileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CompileError(f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
