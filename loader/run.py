"""Load, bind, execute and simulate a program on one machine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from dfx import Compute, Program, tolerance
from hardware import Machine, SimResult, Simulator, Task

from .binding import BindError, Binding, bind_greedy
from .buffers import kernel_demands
from .execute import COMPUTES, reference, run_kernel
from .relocate import Occupancy, relocate
from .schedule import workers_for
from .tasks import DEP_WINDOW, TaskStream


class LoadError(ValueError):
    """The object cannot run on this machine; str(e) is one line."""


@dataclass
class OutputCheck:
    """One output against its reference. The errors are always finite, so JSON holds numbers:
    an unbounded one (NaN or inf where the reference differs, or an overflow) is reported as
    the largest float64, 1.8e308."""

    max_abs_error: float
    max_rel_error: float
    passed: bool


@dataclass
class RunResult:
    bindings: list[Binding]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    sim: SimResult | None = None
    checks: dict[str, OutputCheck] | None = None  # None: not checked
    wall_seconds: float = 0.0

    @property
    def check_passed(self) -> bool:
        return all(c.passed for c in (self.checks or {}).values())


Binder = Callable[[str, int, list, list, Machine, str], Binding]


def check_fits(program: Program, machine: Machine, where: str) -> None:
    """What binding cannot tell: the array supports each dataflow and compute."""
    for k in program.kernels:
        if k.dataflow not in machine.compute.dataflows:
            raise LoadError(f"{where}: kernel '{k.name}' uses {k.dataflow}, which config "
                            f"'{machine.name}' does not support ({', '.join(machine.compute.dataflows)})")
        for op in k.body:
            if isinstance(op, Compute) and op.compute_type not in COMPUTES:
                raise LoadError(f"{where}: kernel '{k.name}' op {op.op_id}: compute '{op.compute_type}' "
                                f"is not supported by this loader")
        need = k.requirements["min_array"]
        if machine.compute.rows < need["rows"] or machine.compute.cols < need["cols"]:
            raise LoadError(f"{where}: kernel '{k.name}' needs an array of at least {need['rows']}x{need['cols']}, "
                            f"config '{machine.name}' has {machine.compute.rows}x{machine.compute.cols}")


def bind_program(program: Program, machine: Machine, where: str, binder: Binder = bind_greedy) -> list[Binding]:
    """Bind each kernel, with as many compute tiles as its memory needs allow, placed away from
    the memory the kernels before it last used."""
    bindings = []
    taken = Occupancy()
    for k in program.kernels:
        error: BindError | None = None
        for workers in range(workers_for(k, machine.compute.tiles), 0, -1):
            buffers, streams = kernel_demands(k, program, workers)
            start = time.perf_counter()
            try:
                binding = relocate(binder(k.name, workers, buffers, streams, machine, where), taken, machine)
            except BindError as e:
                error = error or e
                continue
            binding.bind_seconds = time.perf_counter() - start
            for bb in binding.buffers:
                taken.claim(bb, len(bindings))
            if workers < workers_for(k, machine.compute.tiles):
                binding.notes.append(f"memory holds buffers for {workers} compute tile(s) only")
            bindings.append(binding)
            break
        else:
            if program.target != machine.name:  # the tiles were sized for another machine
                raise BindError(f"{error}; the object was tiled for '{program.target}': compile it with "
                                f"--target naming this config")
            raise error
    return bindings


def program_tasks(program: Program, bindings: list[Binding]) -> Iterator[Task]:
    stream = TaskStream(program)
    for phase, (kernel, binding) in enumerate(zip(program.kernels, bindings)):
        yield from stream.kernel_tasks(kernel, binding, phase)


def simulate(program: Program, machine: Machine, bindings: list[Binding], trace: bool = False,
             record_first: int = 0, progress: Callable[[int], None] | None = None) -> SimResult:
    sim = Simulator(machine, trace=trace, record_first=record_first, dep_window=DEP_WINDOW)
    return sim.run(program_tasks(program, bindings), progress=progress)


def execute(program: Program, bindings: list[Binding], inputs: dict[str, np.ndarray],
            progress: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Every tensor's value after running all kernels: inputs, intermediates and outputs;
    `progress(ops done)` every few thousand tile ops."""
    memory = dict(inputs)
    done = 0
    for kernel, binding in zip(program.kernels, bindings):
        done = run_kernel(kernel, program, memory, binding.workers, progress, done)
    return memory


def check_outputs(program: Program, values: dict[str, np.ndarray]) -> dict[str, OutputCheck]:
    """Each graph output against the op registry's reference applied to the inputs its op
    actually received, so a one-ulp rounding difference in an f8 intermediate is not blamed on
    the f64 op three kernels later. As numpy.testing.assert_allclose(equal_nan=True): NaN
    agrees with NaN and inf with the same inf; any other non-finite value fails."""
    # NaN and inf in the inputs are data, not faults: they must not print numpy warnings
    largest = float(np.finfo(np.float64).max)
    with np.errstate(all="ignore"):
        expected = reference(program, values)
        checks = {}
        for name, ref in expected.items():
            atol, rtol = tolerance(program.graph.tensors[name].dtype)
            want = ref.astype(np.float64)
            got = values[name].astype(np.float64)
            finite = np.isfinite(got) & np.isfinite(want)
            nonfinite_agree = bool(np.all(finite | (got == want) | (np.isnan(got) & np.isnan(want))))
            got, want = got[finite], want[finite]
            err = np.abs(got - want)
            rel = err / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
            passed = nonfinite_agree and bool(np.all(err <= atol + rtol * np.abs(want)))
            # a non-finite disagreement is an unbounded error, saturated like an overflow
            unbounded = 0.0 if nonfinite_agree else np.inf
            max_abs, max_rel = (min(max(float(e.max(initial=0.0)), unbounded), largest) for e in (err, rel))
            checks[name] = OutputCheck(max_abs, max_rel, passed)
    return checks
