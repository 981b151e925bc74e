"""The DFX contract: graph IR, op registry, tiled kernel IR and the `.kpu` object file."""

from .dtypes import DTYPES, accumulator, canonical, dtype_of, is_integer, itemsize, numpy_dtype, tolerance
from .graph import Graph, Op, Tensor
from .kernel import Barrier, BodyOp, Compute, DataMove, Kernel, TileLoop, TileRef
from .command_line import fail, run_command
from .errors import ObjectFileError
from .objfile import DFX_VERSION, FORMAT, FORMAT_VERSION, dumps, loads, read, write
from .output_files import OutputError, OutputFiles
from .ops import REGISTRY, OpDef, ShapeError, accumulation_dtype, convert, lookup
from .program import Program

__all__ = [
    "DTYPES", "accumulator", "canonical", "dtype_of", "is_integer", "itemsize", "numpy_dtype", "tolerance",
    "Graph", "Op", "Tensor",
    "Barrier", "BodyOp", "Compute", "DataMove", "Kernel", "TileLoop", "TileRef",
    "DFX_VERSION", "FORMAT", "FORMAT_VERSION", "ObjectFileError", "dumps", "loads", "read", "write",
    "REGISTRY", "OpDef", "ShapeError", "accumulation_dtype", "convert", "lookup",
    "OutputError", "OutputFiles", "fail", "run_command",
    "Program",
]
