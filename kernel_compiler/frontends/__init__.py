"""Frontends: turn a model file into the graph IR, then infer shapes.

`load_graph` picks the frontend by file extension; the ONNX and HLO frontends join this table.
`parse_graph` does the same on a file's bytes already in memory (as `kpu-dse` ships models to
workers that cannot open the client's files): the name gives the extension and the messages only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dfx import InputFileError, read_input_file
from dfx.graph import Graph
from dfx.input_files import GB, MB

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
# A model file's size is checked before it is read: protobuf refuses an ONNX model of 2 GB or
# more (larger weights live in external data files, which the ONNX frontend bounds itself); a
# text model (.dfg, .hlo, .json) of a real network is a few MB.
MAX_ONNX_BYTES = 2 * GB
MAX_TEXT_MODEL_BYTES = 256 * MB


def load_graph(path: str) -> tuple[Graph, list[str]]:
    """Read `path` with the frontend for its extension and infer shapes; (graph, warning lines)."""
    _frontend(path)  # an unknown extension is refused before the file is read
    return parse_graph(path, read_bytes(path))


def parse_graph(path: str, data: bytes) -> tuple[Graph, list[str]]:
    """Parse `data`, the bytes of a model file named `path`, with the frontend for its extension
    and infer shapes; (graph, warning lines). Nothing is read from `path`: it names the input in
    messages and gives its extension. (An ONNX model whose tensors keep their data in external
    files still looks for them in that path's folder.)"""
    ext, frontend = _frontend(path)
    graph, warnings = frontend(path, data if ext in BINARY else _text(path, data))
    return infer_shapes(graph, warnings), warnings


# the extensions a model file may have, as messages list them
GRAPH_EXTENSIONS: tuple[str, ...] = tuple(FRONTENDS)


def graph_extension(path: str) -> str | None:
    """The extension by which `path` is read as a model, lower case (the longest known ending:
    `.hlo.txt` before `.txt`), or None if no frontend reads it. Nothing is read from `path`."""
    suffixes = Path(path).suffixes
    return next((e.lower() for e in ("".join(suffixes[-2:]), "".join(suffixes[-1:])) if e.lower() in FRONTENDS),
                None)


def _frontend(path: str) -> tuple[str, Frontend]:
    """The extension of `path` (lower case) and its frontend, or CompileError naming the choices."""
    ext = graph_extension(path)
    if ext is None:
        expected = ", ".join(GRAPH_EXTENSIONS)
        raise CompileError(f"{path}: unsupported input type '{Path(path).suffix}' (expected {expected})")
    return ext, FRONTENDS[ext]


def _text(path: str, data: bytes) -> str:
    """`data` as UTF-8 text with its line ends made `\\n`, as reading the file in text mode gives it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CompileError(f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_bytes(path: str) -> bytes:
    """The bytes of a model file, a regular file within its kind's bound, or CompileError
    "<file>: <reason>" (a FIFO or a device is refused, never read)."""
    ext, _ = _frontend(path)
    try:
        return read_input_file(path, f"{ext} model", MAX_ONNX_BYTES if ext in BINARY else MAX_TEXT_MODEL_BYTES)
    except InputFileError as exc:
        raise CompileError(str(exc)) from None
