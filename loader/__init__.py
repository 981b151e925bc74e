"""The loader: binds a `.kpu` object to one machine, simulates it and executes it."""

from .binding import BindError, Binding, BoundBuffer, bind_greedy, estimate_makespan
from .buffers import Buffer, StreamReq, kernel_demands
from .inputs import InputError, generated, program_inputs
from .run import LoadError, RunResult, bind_program, check_fits, check_outputs, execute, program_tasks, simulate

__all__ = [
    "BindError", "Binding", "BoundBuffer", "bind_greedy", "estimate_makespan",
    "Buffer", "StreamReq", "kernel_demands",
    "InputError", "generated", "program_inputs",
    "LoadError", "RunResult", "bind_program", "check_fits", "check_outputs", "execute", "program_tasks", "simulate",
    "bind_cpsat",
]


def __getattr__(name: str):
    # CP-SAT (OR-Tools, with pandas behind it) costs a third of a second to import: only on use.
    if name == "bind_cpsat":
        from .bind import bind_cpsat

        return bind_cpsat
    raise AttributeError(name)
