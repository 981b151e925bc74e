"""Load, bind, execute and simulate a program on one machine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from dfx import Compute, Home, Program, accumulation_dtype, below_homes, lookup, numpy_dtype, tolerance
from hardware import Machine, SimResult, Simulator, Task

from .binding import BindError, Binding, bind_greedy, reusing
from .buffers import StreamReq, home_layout, kernel_demands, l2_home_layout, level_banks
from .chains import away_from_chain, balanced, chain_head, chain_names, chain_tasks, ring_passes
from .execution import COMPUTES, reference_op, run_kernel
from .relocate import Occupancy, relocate
from .schedule import ring_shortfall, workers_for
from .tasks import DEP_WINDOW, TaskStream


class LoadError(ValueError):
    """The object cannot run on this machine; str(e) is one line."""


@dataclass
class OutputCheck:
    """One output against its reference, each element held to a tolerance of its own (`compare`):
    `worst_error` is the error of the element that used the largest fraction of its tolerance,
    `worst_fraction` that fraction (above 1: the check failed). The errors are always finite, so
    JSON holds numbers: an unbounded one (NaN or inf where the reference differs, an overflow, an
    error where none was allowed) is reported as the largest float64, 1.8e308."""

    max_abs_error: float
    max_rel_error: float
    passed: bool
    worst_error: float
    worst_fraction: float


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


def room_below_homes(machine: Machine, homes: list[Home], kernel: int, l2_homes: list[Home] = ()) -> Machine:
    """The machine as a kernel's binding sees it: L3 up to the homes live while it runs, every
    L2 bank up to the pieces of those in L2."""
    capacity = level_banks(machine, "L3")[1]
    limit = below_homes(homes, kernel, capacity)
    room = machine if limit == capacity else replace(machine, l3=replace(machine.l3, count=1, bytes=limit))
    l2_limit = below_homes(list(l2_homes), kernel, machine.l2.bytes)
    return room if l2_limit == machine.l2.bytes else replace(room, l2=replace(machine.l2, bytes=l2_limit))


def bind_program(program: Program, machine: Machine, where: str, binder: Binder = bind_greedy) -> list[Binding]:
    """Bind each kernel, with as many compute tiles as its memory needs allow, placed away from
    the memory the kernels before it last used and below the homes in L3 live while it runs; a
    kernel of a chain away from the chain's kernels before it, which run at the same time; a
    whole chain's L2 buffers and engines then dealt out by load (`balanced`); a kernel repeating
    an earlier one's demands as that one (`reusing`)."""
    binder = reusing(binder)
    bindings = []
    taken = Occupancy()
    l2_homes = l2_home_layout(program, machine)
    in_l2 = frozenset(h.tensor for h in l2_homes)
    homes = home_layout(program, machine, in_l2)
    kept = frozenset(h.tensor for h in homes)
    spans = program.spans()
    chain_streams: list[list[StreamReq]] = []  # those of the chain's kernels bound so far
    for i, k in enumerate(program.kernels):
        error: BindError | None = None
        room = room_below_homes(machine, homes, i, l2_homes)
        in_chain = spans[i][1] > spans[i][0]
        for workers in range(workers_for(k, machine.compute.tiles), 0, -1):
            # fewer compute tiles each write more partial sums, or go through a ring more often
            short = ring_shortfall(k, workers) or ring_passes(program, k, workers, kept)
            if short is not None:
                error = error or BindError(f"{where}: kernel '{k.name}': {short}")
                continue
            buffers, streams = kernel_demands(k, program, workers, kept, machine.line_bytes, in_l2)
            start = time.perf_counter()
            try:
                binding = binder(k.name, workers, buffers, streams, room, where)
                chained = bindings[spans[i][0]:]  # the chain's kernels before it
                if chained:
                    *chained, binding = away_from_chain(binding, chained, room, where, chain_names(program, i))
                    bindings[spans[i][0]:] = chained
                    _claim(taken, chained, spans[i][0])  # where a level was packed anew
                else:
                    binding = relocate(binding, taken, room)
                    if spans[i][1] > i:
                        binding = chain_head(binding, room)
            except BindError as e:
                error = error or e
                continue
            binding.bind_seconds = time.perf_counter() - start
            binding.homes = [h for h in homes if h.live(i)]
            binding.l2_homes = [h for h in l2_homes if h.live(i)]
            placed = {"L3": kept, "L2": in_l2}
            binding.notes.extend(f"'{t}' stays in external memory: {home} has no room for it beside the kernels "
                                 f"it lives across" for t in k.outputs
                                 if (home := program.graph.tensors[t].home) is not None and t not in placed[home])
            if in_chain:
                chain_streams = [*chain_streams[:i - spans[i][0]], streams]
                if spans[i][1] == i:
                    *chained, binding = balanced([*bindings[spans[i][0]:], binding], chain_streams, room)
                    bindings[spans[i][0]:] = chained
                    _claim(taken, chained, spans[i][0])
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


def _claim(taken: Occupancy, members: list[Binding], first: int) -> None:
    """Record the buffers of a chain's members, the first of them kernel `first`, as theirs."""
    for tag, member in enumerate(members, first):
        for bb in member.buffers:
            taken.claim(bb, tag)


def program_tasks(program: Program, bindings: list[Binding], machine: Machine) -> Iterator[Task]:
    """The program's tasks, each engine serving an earlier kernel's (chain's) before a later one's
    (`Task.priority`): where kernels overlap, a later one's epilogues took the vector unit from a
    chain it depends on (MobileNet v2's conv2d_3 beside its first chain, the chain's loads
    balanced: 1,498,237 cycles, 1,471,291 in program order)."""
    stream = TaskStream(program, machine)
    for first, last in sorted(set(program.spans())):  # a kernel, or a chain's, run at once
        if first == last:
            tasks = stream.kernel_tasks(program.kernels[first], bindings[first], first)
        else:
            tasks = chain_tasks(stream, program, list(range(first, last + 1)), bindings)
        for task in tasks:
            task.priority = first
            yield task


def simulate(program: Program, machine: Machine, bindings: list[Binding], trace: bool = False,
             record_first: int = 0, progress: Callable[[int], None] | None = None) -> SimResult:
    sim = Simulator(machine, trace=trace, record_first=record_first, dep_window=DEP_WINDOW)
    return sim.run(program_tasks(program, bindings, machine), progress=progress)


def execute(program: Program, bindings: list[Binding], inputs: dict[str, np.ndarray],
            progress: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Every tensor's value after running all kernels: inputs, intermediates and outputs;
    `progress(ops done)` every few thousand tile ops."""
    memory = dict(inputs)
    done = 0
    for kernel, binding in zip(program.kernels, bindings):
        done = run_kernel(kernel, program, memory, binding.workers, progress, done)
    return memory


LARGEST = float(np.finfo(np.float64).max)


def compare(got: np.ndarray, want: np.ndarray, atol: float, rtol: float, magnitude: np.ndarray | None = None,
            rounding: np.ndarray | None = None) -> OutputCheck:
    """As numpy.testing.assert_allclose(equal_nan=True), with a tolerance per element: NaN agrees
    with NaN and inf with the same inf, any other non-finite value fails, and a finite element
    may be off by atol + rtol x its `magnitude` (`magnitudes`: of the values it is computed from,
    at least its own size; without one, its own size), plus `rounding` (per element,
    `_sum_rounding`). Never the magnitude of values elsewhere in the tensor: one large element
    must not hide an error anywhere else."""
    # NaN and inf in the inputs are data, not faults: they must not print numpy warnings
    with np.errstate(all="ignore"):
        want, got = want.astype(np.float64), got.astype(np.float64)
        finite = np.isfinite(got) & np.isfinite(want)
        nonfinite_agree = bool(np.all(finite | (got == want) | (np.isnan(got) & np.isnan(want))))
        allowed = atol + rtol * (np.abs(want) if magnitude is None else magnitude)
        if rounding is not None:
            allowed = allowed + rounding
        got, want, allowed = got[finite], want[finite], allowed[finite]
        err = np.abs(got - want)
        rel = err / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
        fraction = np.where(err == 0, 0.0, err / allowed)  # an error where none was allowed: inf
        passed = nonfinite_agree and bool(np.all(err <= allowed))
        worst = int(np.argmax(fraction)) if fraction.size else None
        # a non-finite disagreement is an unbounded error, saturated like an overflow
        unbounded = 0.0 if nonfinite_agree else np.inf
        max_abs, max_rel, worst_error, worst_fraction = (
            min(max(float(e), unbounded), LARGEST)
            for e in (err.max(initial=0.0), rel.max(initial=0.0), 0.0 if worst is None else err[worst],
                      0.0 if worst is None else fraction[worst]))
    return OutputCheck(max_abs, max_rel, passed, worst_error, worst_fraction)


def magnitudes(op, values: dict[str, np.ndarray], known: dict[str, np.ndarray],
               results: list[np.ndarray], rtol: float, exact: frozenset[str] = frozenset()) -> list[np.ndarray]:
    """The magnitude of each element of graph op `op`'s `results`, float64 in their shapes: the
    registry's rule (OpDef.magnitude) on its operands' `values` and their magnitudes in `known`,
    for a check of relative tolerance `rtol`, and at least the element's own size. An element
    whose rule gives no finite magnitude (an operand is NaN or inf, or a slope is) is held to
    its own size. An operand in `exact` (what a
    kernel read, which the check takes as given) carries no error into a map op: a map's result
    is rounded once, relative to itself, however steep the map (exp(80) is held to a few ulps of
    itself, not 80 of them); into a softmax only the size it has less its row's max, which the
    kernel takes first (`OpDef.shifted`); sums, windows and other rows round with their operands'
    sizes and keep them."""
    opdef = lookup(op.op_type)
    with np.errstate(all="ignore"):
        own = [np.abs(r.astype(np.float64)) for r in results]
        if opdef.magnitude is None:
            return own
        attrs = opdef.normalize_attrs(op.attrs)
        operands = [values[n].astype(np.float64) for n in op.inputs]

        def carried(i: int, name: str) -> np.ndarray:
            if name in exact and opdef.family == "map":
                return np.zeros_like(known[name])
            if name in exact and i == 0 and opdef.shifted is not None:
                return np.abs(opdef.shifted(operands[0], attrs))
            return known[name]

        rule = opdef.magnitude(operands, [carried(i, n) for i, n in enumerate(op.inputs)], attrs, rtol)
        return [np.where(np.isfinite(m), np.maximum(m, size), size) for m, size in zip(rule, own)]


def _worst(checks: list[OutputCheck]) -> OutputCheck:
    """Several results' checks as one: the largest errors, passed if all passed, the worst
    element of the check whose worst element used the most of its tolerance."""
    worst = max(checks, key=lambda c: c.worst_fraction)
    return OutputCheck(max(c.max_abs_error for c in checks), max(c.max_rel_error for c in checks),
                       all(c.passed for c in checks), worst.worst_error, worst.worst_fraction)


def check_kernels(program: Program, values: dict[str, np.ndarray]) -> dict[str, OutputCheck]:
    """Every kernel's results, intermediates included, against the registry's reference of its
    graph ops (the anchor, then its epilogue) applied to the values that kernel actually
    received: a fault in any kernel fails here, and is not blamed on the kernels after it. Each
    element's magnitude follows from those values through the group's ops (`magnitudes`). The
    tolerance is the loosest of the group's result dtypes: a fused intermediate stays at the
    accumulators' precision on chip, where the reference rounds it. Per kernel, the worst result."""
    g = program.graph
    ops = {op.name: op for op in g.ops}
    checks = {}
    for kernel in program.kernels:
        group = [ops[name] for name in [kernel.graph_op, *kernel.epilogue]]
        expected = dict(values)
        known: dict[str, np.ndarray] = {}
        made = {n for op in group for n in op.outputs}
        exact = frozenset(n for op in group for n in op.inputs if n not in made)
        atol, rtol = (max(x) for x in zip(*(tolerance(g.tensors[t].dtype) for op in group for t in op.outputs)))
        with np.errstate(all="ignore"):
            for op in group:
                results = reference_op(op, expected, g)
                known.update((n, np.abs(values[n].astype(np.float64))) for n in op.inputs if n not in known)
                known.update(zip(op.outputs, magnitudes(op, expected, known, results, rtol, exact)))
                expected.update(zip(op.outputs, results))
            rounding = _sum_rounding(group, values, expected, known, g)
        checks[kernel.name] = _worst([compare(values[name], expected[name], atol, rtol, known[name],
                                              rounding.get(name)) for name in kernel.outputs])
    return checks


ROUNDING_SPREAD = 8  # standard deviations of a sum's rounding walk: far beyond chance, far below a wrong tile


def _sum_rounding(group: list, values: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                  known: dict[str, np.ndarray], g) -> dict[str, np.ndarray]:
    """For a kernel anchored on a contraction, in float: how far rounding may move each
    element of its results, the tiles adding the products in another order than the reference.
    A sum of n products rounded at every step walks about sqrt(n) steps of at most u times the
    sum of their magnitudes (u the accumulator's unit roundoff), however much they cancel: deep
    layers on generated weights sum products in the hundreds into results near zero (the sum of
    their magnitudes is the anchor's result's in `known`, the registry's rule for a contraction).
    The epilogue carries the bound to the kernel's results: it is applied to the anchor's
    reference result moved by the bound either way. Empty for any other kernel (an integer sum
    is exact)."""
    anchor = group[0]
    dtypes = [g.tensors[n].dtype for n in anchor.inputs + anchor.outputs]
    acc = numpy_dtype(accumulation_dtype(dtypes))
    if lookup(anchor.op_type).tile_mnk is None or acc.kind != "f":
        return {}
    result = anchor.outputs[0]
    products = reference_op(anchor, {**values, **{n: np.ones_like(values[n]) for n in anchor.inputs}}, g)[0]
    bound = ROUNDING_SPREAD * np.sqrt(np.abs(products.astype(np.float64))) * (np.finfo(acc).eps / 2) * known[result]
    bound = np.where(np.isfinite(bound), bound, 0)  # a bound that overflowed bounds nothing
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
    output depends on, times the ops on its longest path, and each element's magnitude follows
    from the inputs' through every op (`magnitudes`)."""
    g = program.graph
    expected = {t.name: values[t.name] for t in g.inputs}
    known = {t.name: np.abs(values[t.name].astype(np.float64)) for t in g.inputs}
    tol: dict[str, tuple[float, float, int]] = {t.name: (*tolerance(t.dtype), 0) for t in g.inputs}
    with np.errstate(all="ignore"):
        for op in g.ops:
            results = reference_op(op, expected, g)
            for name, value in zip(op.outputs, results):
                expected[name] = value
                ancestry = [tol[n] for n in op.inputs] + [(*tolerance(g.tensors[name].dtype), 0)]
                tol[name] = (max(a for a, _, _ in ancestry), max(r for _, r, _ in ancestry),
                             1 + max(d for _, _, d in ancestry))
            # the loosest of the results' tolerances: at least what each operand was held to
            rtol = max(tol[n][1] * tol[n][2] for n in op.outputs)
            known.update(zip(op.outputs, magnitudes(op, expected, known, results, rtol)))
    return {t.name: compare(values[t.name], expected[t.name], tol[t.name][0] * tol[t.name][2],
                            tol[t.name][1] * tol[t.name][2], known[t.name]) for t in g.outputs}
