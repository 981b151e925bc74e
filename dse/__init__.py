"""Design-space exploration: sweep machine configs over workloads on Dask, keep every row, find
the Pareto frontier."""

from dfx.lazy import lazy_exports

# name -> the module that defines it, imported on first use: `kpu-dse --help` loads the CLI
# module alone, not Dask, matplotlib or the toolchain behind a point.
_EXPORTS = {
    "Job": "point", "MEASURES": "point", "evaluate": "point",
    "frontier": "pareto",
    "Table": "results",
    "OBJECTIVES": "spec", "Spec": "spec", "SpecError": "spec", "read_spec": "spec",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
