"""The loader: binds a `.kpu` object to one machine, simulates it and executes it."""

from dfx.lazy import lazy_exports

# name -> the module that defines it. Each is imported on first use only, so `kpu-loader --help`
# and a run whose bindings are cached never pay for OR-Tools, and --help not for numpy either.
_EXPORTS = {
    "BindError": "binding", "Binding": "binding", "BoundBuffer": "binding", "bind_greedy": "binding",
    "estimate_makespan": "binding",
    "Buffer": "buffers", "StreamReq": "buffers", "kernel_demands": "buffers",
    "InputError": "inputs", "generated": "inputs", "program_inputs": "inputs",
    "LoadError": "run", "RunResult": "run", "bind_program": "run", "check_fits": "run", "check_outputs": "run",
    "execute": "run", "program_tasks": "run", "simulate": "run",
    "bind_cpsat": "bind",
    "bind_cached": "cache", "cache_dir": "cache", "source_digest": "cache",
    "summary": "report",
    "BINDERS": "binders", "binder_named": "binders",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
