"""The op registry: each operator declared once, with its attributes, shape rule, numpy
reference, tile meaning and tile cost.

Frontends map their operators onto these names (translating attribute spellings to the
canonical ones of base.ATTRIBUTES); the lowering picks a kernel by name; the loader executes
`tile` and `--check` runs `reference`. No other module defines what an op computes. One module
per family: contraction (the array), elementwise (map), reduction, window (sliding windows, CONV2D
among them), layout, quantize (between floats and quantized integers).
"""

from . import contraction, elementwise, layout, quantize, reduction, window
from .base import (
    REGISTRY, REQUIRED, VARIADIC, OpDef, Shape, ShapeError, accumulation_dtype, convert, lookup, register,
)

__all__ = [
    "REGISTRY", "REQUIRED", "VARIADIC", "OpDef", "Shape", "ShapeError", "accumulation_dtype", "convert", "lookup", "register",
    "contraction", "elementwise", "layout", "quantize", "reduction", "window",
]
