"""The kernel compiler: graph files in, tiled DFX programs out."""

from dfx.lazy import lazy_exports

# name -> the module that defines it, imported on first use: `kpu-kernel-compiler --help` loads
# the CLI module alone, not the passes and lowerings (numpy behind them).
_EXPORTS = {
    "LOWERINGS": "compile", "compile_graph": "compile",
    "CompileError": "errors",
    "GRAPH_EXTENSIONS": "frontends", "graph_extension": "frontends", "load_graph": "frontends",
    "parse_graph": "frontends",
    "Target": "target", "load_target": "target", "target_from_machine": "target",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
