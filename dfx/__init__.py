"""The DFX contract: graph IR, op registry, tiled kernel IR and the `.kpu` object file."""

from .lazy import lazy_exports

# name -> the module that defines it, imported on first use: the command lines parse their
# arguments (and print --help) before anything loads numpy behind the registry and dtypes.
_EXPORTS = {
    **dict.fromkeys(["DTYPES", "accumulator", "canonical", "dtype_of", "is_integer", "itemsize", "narrowest_integer",
                     "numpy_dtype", "tolerance", "widest"], "dtypes"),
    **dict.fromkeys(["Graph", "Op", "Tensor", "slices_along"], "graph"),
    **dict.fromkeys(["Home", "Resident", "first_fit", "freed", "home_bytes", "in_lines", "below_homes", "l2_piece", "pack_homes"], "homes"),
    **dict.fromkeys(["Barrier", "BodyOp", "Compute", "DataMove", "Kernel", "TileLoop", "TileRef", "tile_refs"], "kernel"),
    **dict.fromkeys(["cli_console", "fail", "run_command"], "command_line"),
    "ObjectFileError": "errors",
    **dict.fromkeys(["InputFileError", "read_input_file", "read_input_slice", "shown_path", "size_words"],
                    "input_files"),
    **dict.fromkeys(["DFX_VERSION", "FORMAT", "FORMAT_VERSION", "dumps", "encode", "loads", "read", "read_back",
                    "read_hashed", "write"], "objfile"),
    **dict.fromkeys(["OutputError", "OutputFiles"], "output_files"),
    **dict.fromkeys(["REGISTRY", "OpDef", "ShapeError", "accumulation_dtype", "convert", "lookup"], "ops"),
    **dict.fromkeys(["Program", "chain_spans"], "program"),
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
