"""Load, bind, execute and simulate a program on one machine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from dfx import Compute, Program, accumulation_dtype, lookup, numpy_dtype, tolerance
from hardware import Machine, SimResult, Simulator, Task

from .binding import BindError, Binding, bind_greedy
from .buffers import kernel_demands
from .execution import COMPUTES, reference_op, run_kernel
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
    checks: dict[str, OutputCheck] | None = None  # graph outputs, end to end; None: not checked
    kernel_checks: dict[str, OutputCheck] = field(default_factory=dict)  # every kernel's results
    wall_seconds: float = 0.0

    @property
    def check_passed(self) -> bool:
        return all(c.passed for c in [*(self.checks or {}).values(), *self.kernel_checks.values()])


Binder = Callable[[str, int, list, list, Machine, str], Binding]


def check_fits(program: Program, machine: Machine, where: str) -> None:
    """What binding cannot tell: the array supports each dataflow and compute."""
    for k in program.kernels:
        if k.dataflow not in ("vector", "moves") and k.dataflow not in machine.compute.dataflows:
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


def compare(got: np.ndarray, want: np.ndarray, atol: float, rtol: float,
            rounding: np.ndarray | None = None) -> OutputCheck:
    """As numpy.testing.assert_allclose(equal_nan=True): NaN agrees with NaN and inf with the
    same inf; any other non-finite value fails. The relative tolerance is of each element's
    magnitude or of the tensor's mean magnitude, whichever is larger: an element that a long sum
    brings near zero carries the rounding of its terms, not of its own small size, and a wrong
    tile is off by the values' size either way. `rounding` (per element, `_sum_rounding`) is
    allowed on top."""
    largest = float(np.finfo(np.float64).max)
    # NaN and inf in the inputs are data, not faults: they must not print numpy warnings
    with np.errstate(all="ignore"):
        want, got = want.astype(np.float64), got.astype(np.float64)
        finite = np.isfinite(got) & np.isfinite(want)
        nonfinite_agree = bool(np.all(finite | (got == want) | (np.isnan(got) & np.isnan(want))))
        allowed = atol + rtol * np.maximum(np.abs(want), np.abs(want[finite]).mean() if finite.any() else 0.0)
        if rounding is not None:
            allowed = allowed + rounding
        got, want, allowed = got[finite], want[finite], allowed[finite]
        err = np.abs(got - want)
        rel = err / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
        passed = nonfinite_agree and bool(np.all(err <= allowed))
        # a non-finite disagreement is an unbounded error, saturated like an overflow
        unbounded = 0.0 if nonfinite_agree else np.inf
        max_abs, max_rel = (min(max(float(e.max(initial=0.0)), unbounded), largest) for e in (err, rel))
    return OutputCheck(max_abs, max_rel, passed)


def check_kernels(program: Program, values: dict[str, np.ndarray]) -> dict[str, OutputCheck]:
    """Every kernel's results, intermediates included, against the registry's reference of its
    graph ops (the anchor, then its epilogue) applied to the values that kernel actually
    received: a fault in any kernel fails here, and is not blamed on the kernels after it. The
    tolerance is the loosest of the group's result dtypes: a fused intermediate stays at the
    accumulators' precision on chip, where the reference rounds it. Per kernel, the worst result."""
    g = program.graph
    ops = {op.name: op for op in g.ops}
    checks = {}
    for kernel in program.kernels:
        group = [ops[name] for name in [kernel.graph_op, *kernel.epilogue]]
        expected = dict(values)
        with np.errstate(all="ignore"):
            for op in group:
                expected.update(zip(op.outputs, reference_op(op, expected, g)))
            rounding = _sum_rounding(group, values, expected, g)
        atol, rtol = (max(x) for x in zip(*(tolerance(g.tensors[t].dtype) for op in group for t in op.outputs)))
        results = [compare(values[name], expected[name], atol, rtol, rounding.get(name))
                   for name in kernel.outputs]
        checks[kernel.name] = OutputCheck(max(c.max_abs_error for c in results),
                                          max(c.max_rel_error for c in results), all(c.passed for c in results))
    return checks


ROUNDING_SPREAD = 8  # standard deviations of a sum's rounding walk: far beyond chance, far below a wrong tile


def _sum_rounding(group: list, values: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                  g) -> dict[str, np.ndarray]:
    """For a kernel whose anchor runs on the array, in float: how far rounding may move each
    element of its results, the tiles adding the products in another order than the reference.
    A sum of n products rounded at every step walks about sqrt(n) steps of at most u times the
    sum of their magnitudes (u the accumulator's unit roundoff), however much they cancel: deep
    layers on generated weights sum products in the hundreds into results near zero. The
    epilogue carries the bound to the kernel's results: it is applied to the anchor's reference
    result moved by the bound either way. Empty for any other kernel (an integer sum is exact)."""
    anchor = group[0]
    dtypes = [g.tensors[n].dtype for n in anchor.inputs + anchor.outputs]
    acc = numpy_dtype(accumulation_dtype(dtypes))
    if lookup(anchor.op_type).tile_mnk is None or acc.kind != "f":
        return {}
    magnitudes = reference_op(anchor, {**values, **{n: np.abs(values[n]) for n in anchor.inputs}}, g)[0]
    products = reference_op(anchor, {**values, **{n: np.ones_like(values[n]) for n in anchor.inputs}}, g)[0]
    bound = ROUNDING_SPREAD * np.sqrt(np.abs(products.astype(np.float64))) * (np.finfo(acc).eps / 2) \
        * np.abs(magnitudes.astype(np.float64))
    bound = np.where(np.isfinite(bound), bound, 0)  # a bound that overflowed bounds nothing
    result = anchor.outputs[0]
    moved = []
    for sign in (1, -1):
        chain = {**values, result: expected[result].astype(np.float64) + sign * bound}
        for op in group[1:]:
            chain.update(zip(op.outputs, reference_op(op, chain, g)))
        moved.append(chain)
    outputs = group[-1].outputs
    return {name: np.maximum(*(np.abs(m[name].astype(np.float64) - expected[name].astype(np.float64))
                               for m in moved)) for name in outputs}


def check_outputs(program: Program, values: dict[str, np.ndarray]) -> dict[str, OutputCheck]:
    """Each graph output against the registry's reference run of the whole graph from the same
    inputs. Both round every intermediate to its dtype, so they differ only by the order of
    tile-wise sums and its effect downstream: the tolerance is the loosest of the dtypes the
    output depends on, times the ops on its longest path."""
    g = program.graph
    expected = {t.name: values[t.name] for t in g.inputs}
    tol: dict[str, tuple[float, float, int]] = {t.name: (*tolerance(t.dtype), 0) for t in g.inputs}
    with np.errstate(all="ignore"):
        for op in g.ops:
            for name, value in zip(op.outputs, reference_op(op, expected, g)):
                expected[name] = value
                ancestry = [tol[n] for n in op.inputs] + [(*tolerance(g.tensors[name].dtype), 0)]
                tol[name] = (max(a for a, _, _ in ancestry), max(r for _, r, _ in ancestry),
                             1 + max(d for _, _, d in ancestry))
    return {t.name: compare(values[t.name], expected[t.name], tol[t.name][0] * tol[t.name][2],
                            tol[t.name][1] * tol[t.name][2]) for t in g.outputs}
