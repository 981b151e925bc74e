"""The kernel compiler: graph files in, tiled DFX programs out."""

from .compile import LOWERINGS, compile_graph
from .errors import CompileError
from .frontends import load_graph
from .target import Target, load_target

__all__ = ["LOWERINGS", "compile_graph", "CompileError", "load_graph", "Target", "load_target"]
