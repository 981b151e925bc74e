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
from .hlo import parse_hlo
from .kpusim_json import parse_kpusim_json
from .onnx import parse_onnx

Frontend = Callable[[str, str | bytes], tuple[Graph, list[str]]]

FRONTENDS: dict[str, Frontend] = {
    ".dfg": parse_dfg,
    ".hlo": parse_hlo,
    ".hlo.txt": parse_hlo,  # as XLA's dumps name them
    ".json": parse_kpusim_json,
    ".onnx": parse_onnx,
}
# a frontend gets (path, the file's text), or (path, its bytes) for these extensions
BINARY = frozenset({".onnx"})


def load_graph(path: str) -> tuple[Graph, list[str]]:
    """Read `path` with the frontend for its extension and infer shapes; (graph, warning lines)."""
    suffixes = Path(path).suffixes
    # the longest known ending: `.hlo.txt` before `.txt`
    ext = next((e for e in ("".join(suffixes[-2:]), "".join(suffixes[-1:])) if e.lower() in FRONTENDS),
               Path(path).suffix)
    frontend = FRONTENDS.get(ext.lower())
    if frontend is None:
        expected = ", ".join(FRONTENDS)
        raise CompileError(f"{path}: unsupported input type '{ext}' (expected {expected})")
    graph, warnings = frontend(path, read_bytes(path) if ext.lower() in BINARY else read_source(path))
    return infer_shapes(graph, warnings), warnings


def read_source(path: str) -> str:
    """The text of an input file, or CompileError "<file>: cannot read: <reason>"."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CompileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CompileError(f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_bytes(path: str) -> bytes:
    """The bytes of an input file, or CompileError "<file>: cannot read: <reason>"."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CompileError(f"{path}: cannot read: {exc.strerror or exc}") from None
