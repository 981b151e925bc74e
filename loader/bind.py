"""Binding with OR-Tools CP-SAT: one model per kernel places every buffer and assigns every stream.

`build_model` states the rules and the objective (estimated makespan, then queueing on engines
and L2 bank ports, then peak memory). `bind_cpsat` solves it: an infeasible model becomes a
one-line BindError naming the level and the bytes short; a work limit reached without any solution
falls back to `bind_greedy`. No wall clock enters the search: the same kernel binds the same way
on a busy machine and an idle one.

The model's size follows the kernel's buffers, streams, banks and engines, never its tile-loop
trip counts: a stream's load is its cycles per tile times its tile count, a constant. Nor does it
follow the machine's bank count past the buffers: by the symmetry below, a pool of n buffers
uses at most its first n banks, and no variable or constraint names another (a config of 10^6
L2 banks binds as fast as one of 32).

Symmetry: the banks of a level and the engines of a kind are interchangeable, so any binding can
be relabelled so that the n-th buffer of a pool (n-th stream of a kind) uses one of the first n
banks (engines). Offering only those candidates keeps the model small on 32-bank machines and
loses no binding but relabellings of another (the round-robin engines the objective's last
tie-break prefers are always among the candidates). Buffers that are exact twins are ordered
too, see `order_twins`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from hardware import Machine

from .binding import (UNIT_NAME, BindError, Binding, BoundBuffer, _kib, bind_greedy, check_capacity, engine_count,
                      estimate_makespan, port_loads, stream_cycles)
from .buffers import Buffer, StreamReq, level_banks

SEED = 1  # fixed, so the same kernel binds the same way run after run
# the search's budget in CP-SAT deterministic time, a count of work done (meant to approximate
# seconds of one core, though it does so loosely): every example kernel proves optimality within
# 0.04 of it; the odd GEMM shapes on datacenter that stop on it take 0.4 to 1.2 s of an idle core
WORK_LIMIT = 0.25
# resolutions of loads and of a pool's peak address in the model: fine enough to rank bindings,
# coarse enough that the lexicographic objective's weights stay far inside int64
LOAD_STEPS = 1 << 10
PEAK_STEPS = 1 << 8


@dataclass(frozen=True)
class Pool:
    """Banks that compete for the same buffers: an L3 or L2 level, or one worker's L1."""

    level: str
    owner: int  # the worker for L1, -1 for the shared levels
    count: int  # banks
    size: int  # bytes per bank
    members: tuple[int, ...]  # indices into the kernel's buffer list, in input order


def pools(buffers: list[Buffer], machine: Machine) -> list[Pool]:
    keys: dict[tuple[str, int], list[int]] = {}
    for i, b in enumerate(buffers):
        keys.setdefault((b.level, b.owner), []).append(i)
    out = []
    for (level, owner), members in keys.items():
        count, size = level_banks(machine, level)
        out.append(Pool(level, owner, count, size, tuple(members)))
    return out


def load_unit(cycles: list[int]) -> int:
    """Cycles per model load unit: the cycle counts' common divisor (exact), or coarser when
    the total would need more than LOAD_STEPS units (loads are then rounded up)."""
    total = sum(cycles)
    unit = math.gcd(*cycles) if cycles else 1
    return max(1, unit, -(-total // LOAD_STEPS))


@dataclass
class Placement:
    """One pool's decision variables."""

    bank: dict[tuple[int, int], cp_model.IntVar]  # (buffer, bank) -> the buffer lives in that bank
    line: dict[int, cp_model.IntVar]  # buffer -> its address, in lines of machine.line_bytes


def place_pool(model: cp_model.CpModel, pool: Pool, buffers: list[Buffer], line_bytes: int,
               port_load: dict[int, int] | None = None) -> Placement:
    """Bank choice and aligned address for each buffer of one pool, with no two live buffers
    sharing a byte of a bank and every buffer inside its bank. Without `port_load` (L2 buffer ->
    load on its bank's port) a buffer may stay unplaced, to measure how much of a pool fits."""
    required = port_load is not None
    p = Placement({}, {})
    boxes: dict[int, tuple[list, list]] = {k: ([], []) for k in range(min(pool.count, len(pool.members)))}
    for rank, i in enumerate(pool.members):
        b = buffers[i]
        lines = -(-b.bytes // line_bytes)
        # capacity: the highest aligned start that still ends inside the bank
        p.line[i] = model.NewIntVar(0, (pool.size - b.bytes) // line_bytes, f"line_{i}")
        choice = []
        for k in range(min(pool.count, rank + 1)):  # interchangeable banks: see the module doc
            lit = p.bank[i, k] = model.NewBoolVar(f"buf{i}_bank{k}")
            choice.append(lit)
            # interval x address no-overlap: a box (lifetime x lines) in bank k, present iff chosen
            boxes[k][0].append(model.NewOptionalFixedSizeIntervalVar(
                b.live_start, b.live_end - b.live_start, lit, f"life_{i}_{k}"))
            boxes[k][1].append(model.NewOptionalFixedSizeIntervalVar(p.line[i], lines, lit, f"span_{i}_{k}"))
        if required:
            model.AddExactlyOne(choice)
        else:
            model.AddAtMostOne(choice)
    for lives, spans in boxes.values():
        if len(lives) > 1:
            model.AddNoOverlap2D(lives, spans)
    if required:
        order_twins(model, pool, buffers, line_bytes, p, port_load)
    return p


def order_twins(model: cp_model.CpModel, pool: Pool, buffers: list[Buffer], line_bytes: int, p: Placement,
                port_load: dict[int, int]) -> None:
    """Buffers alike in size, lifetime and port load (the same tile on each worker, typically)
    can swap places without changing anything, so only placements that order such twins by
    (bank, address) in input order are offered. With the bank restriction of the module doc this
    still loses no solution: sorting twins never gives the earlier one a later bank."""
    last: dict[tuple, int] = {}
    stride = pool.size // line_bytes + 1  # more lines than any address in a bank
    for i in pool.members:
        b = buffers[i]
        twin = (b.bytes, b.live_start, b.live_end, port_load.get(i, 0))
        if twin in last:
            j = last[twin]
            model.Add(_position(p, j, stride) < _position(p, i, stride))
        last[twin] = i


def _position(p: Placement, i: int, stride: int) -> cp_model.LinearExprT:
    """A buffer's (bank, address) as one number."""
    return sum(k * stride * lit for (j, k), lit in p.bank.items() if j == i) + p.line[i]


@dataclass
class Solution:
    """The decision variables of the kernel model, to read back."""

    placements: list[tuple[Pool, Placement]]
    engine: dict[tuple[int, int], cp_model.IntVar]  # (stream, engine of its kind) -> assigned


def queued(model: cp_model.CpModel, assign: dict[tuple[int, int], cp_model.IntVar], ports: int,
           name: str) -> cp_model.LinearExprT:
    """How many items wait for a port, given `assign[item, slot]` literals and slots of `ports`
    ports each: the items beyond the ports their slots offer. Zero when every item can have a
    port to itself."""
    by_slot: dict[int, list] = {}
    for (_, slot), lit in assign.items():
        by_slot.setdefault(slot, []).append(lit)
    served = []
    for slot, lits in by_slot.items():
        busy = model.NewIntVar(0, min(ports, len(lits)), f"{name}_busy_{slot}")
        model.Add(busy <= sum(lits))
        served.append(busy)
    return len({item for item, _ in assign}) - sum(served)


def lexicographic(terms: list[tuple[cp_model.LinearExprT, int]]) -> cp_model.LinearExprT:
    """One objective from (term, its upper bound), most important first: each term's weight
    exceeds the largest possible weighted sum of all the terms after it."""
    weight, total = 1, 0
    for expr, bound in reversed(terms):
        total += weight * expr
        weight *= bound + 1
    return total


def build_model(buffers: list[Buffer], streams: list[StreamReq],
                machine: Machine) -> tuple[cp_model.CpModel, Solution]:
    """The kernel's binding problem; each group's comment names the rule it enforces."""
    model = cp_model.CpModel()
    line_bytes = machine.line_bytes
    cycles = stream_cycles(streams, machine)
    unit = load_unit(cycles)
    load = [-(-c // unit) for c in cycles]

    port_load = port_loads(buffers, streams, load)  # L2 buffer -> load of the streams using its bank's port

    # --- Memory: each buffer gets one bank of its pool and a line-aligned address; buffers live
    # at the same time never overlap within a bank; every bank's capacity holds.
    placements = [(pool, place_pool(model, pool, buffers, line_bytes, port_load))
                  for pool in pools(buffers, machine)]
    bank_of = {key: lit for _, p in placements for key, lit in p.bank.items()}

    # --- Makespan: at least the load of every engine and of every L2 bank port.
    makespan = model.NewIntVar(0, sum(load), "makespan")

    # --- Engines: each stream runs on one engine of its kind; an engine's load is the sum of
    # its streams' cycles.
    engine: dict[tuple[int, int], cp_model.IntVar] = {}
    by_kind: dict[str, list[int]] = {}
    for s_index, s in enumerate(streams):
        by_kind.setdefault(s.kind, []).append(s_index)
    round_robin = []  # streams on the engine issue-order round-robin would give them
    for kind, members in by_kind.items():
        count = engine_count(kind, machine)
        on_engine: dict[int, list] = {e: [] for e in range(count)}
        for rank, s_index in enumerate(members):
            for e in range(min(count, rank + 1)):  # interchangeable engines: see the module doc
                lit = engine[s_index, e] = model.NewBoolVar(f"stream{s_index}_{kind}{e}")
                on_engine[e].append(load[s_index] * lit)
            model.AddExactlyOne(engine[s_index, e] for e in range(min(count, rank + 1)))
            round_robin.append(engine[s_index, rank % count])
        for terms in on_engine.values():
            if terms:
                model.Add(makespan >= sum(terms))

    # --- L2 bank ports: a bank serves machine.l2_bank_ports streams at once; its port load is
    # the cycles of the streams that fill or drain its buffers, shared over its ports.
    for k in sorted({k for i, k in bank_of if i in port_load}):  # the banks a buffer may use, not all
        terms = [port_load[i] * bank_of[i, k] for i in port_load if (i, k) in bank_of]
        model.Add(makespan * machine.l2_bank_ports >= sum(terms))

    # --- Queueing: streams sharing an engine, or L2 buffers sharing a bank's ports (a matmul's
    # A and B tiles, say), serialise even where that engine or bank is not the most loaded one,
    # so count the streams (buffers) that find their engine (bank's ports) taken while another
    # engine (bank) of theirs idles. Where there are enough engines and banks, none do.
    waiting = sum(queued(model, {key: lit for key, lit in engine.items() if streams[key[0]].kind == kind}, 1,
                         kind) for kind in by_kind)
    waiting += queued(model, {key: lit for key, lit in bank_of.items() if key[0] in port_load},
                      machine.l2_bank_ports, "l2bank")

    # --- Peak memory: the highest address end used in each pool, counted in PEAK_STEPS steps
    # of a bank (coarse enough to keep the objective's weights small).
    peaks = []
    for pool, p in placements:
        step = -(-pool.size // (line_bytes * PEAK_STEPS))  # lines per step
        peak = model.NewIntVar(0, PEAK_STEPS, f"peak_{pool.level}_{pool.owner}")
        for i in pool.members:
            model.Add(peak * step >= p.line[i] + -(-buffers[i].bytes // line_bytes))
        peaks.append(peak)

    # --- Objective: makespan, then queueing, then peak memory, and among bindings equal
    # in all three the issue-order round-robin engines (streams issued together stay apart and
    # later ones queue behind the earliest), weighted lexicographically.
    model.Minimize(lexicographic([
        (makespan, sum(load)),
        (waiting, len(streams) + len(port_load)),
        (sum(peaks), PEAK_STEPS * len(peaks)),
        (len(round_robin) - sum(round_robin), len(round_robin)),
    ]))
    return model, Solution(placements, engine)


def solver(work_limit: float) -> cp_model.CpSolver:
    """A deterministic solver: one search thread (no racing workers, no interleaving) with a fixed
    seed takes the same path through the same model, and the only limit is on work done, never on
    seconds, so a search cut short stops at the same point too, however loaded the host. There
    is deliberately no wall-clock limit, not even as a safety net: where it fired, the binding
    would depend on the load again."""
    s = cp_model.CpSolver()
    s.parameters.random_seed = SEED
    s.parameters.num_workers = 1
    s.parameters.max_deterministic_time = work_limit
    return s


def _shortfall(kernel: str, buffers: list[Buffer], machine: Machine, where: str, work_limit: float) -> BindError:
    """The one-line error for a kernel whose pools cannot be packed although each buffer fits
    a bank: the first pool that cannot hold all its buffers, and how many bytes stay out."""
    for pool in pools(buffers, machine):
        model = cp_model.CpModel()
        p = place_pool(model, pool, buffers, machine.line_bytes)
        model.Maximize(sum(buffers[i].bytes * lit for (i, _), lit in p.bank.items()))
        s = solver(work_limit)
        if s.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        need = sum(buffers[i].bytes for i in pool.members)
        short = need - int(s.BestObjectiveBound())
        if short > 0:
            unit = UNIT_NAME[pool.level][1]
            whose = f" of compute tile {pool.owner}" if pool.owner >= 0 else ""
            return BindError(f"{where}: kernel '{kernel}' needs {_kib(need)} of {pool.level}{whose} packed into "
                             f"{_kib(pool.size)} {unit}, config '{machine.name}' has {pool.count} "
                             f"({_kib(short)} short)")
    return BindError(f"{where}: kernel '{kernel}': no binding exists on config '{machine.name}'")


def check_live_capacity(kernel: str, buffers: list[Buffer], machine: Machine, where: str) -> None:
    """The obvious shortfalls, with check_capacity's message, on each set of buffers live at
    once: buffers whose lifetimes do not overlap may reuse the same bytes."""
    for t in sorted({b.live_start for b in buffers}):
        check_capacity(kernel, [b for b in buffers if b.live_start <= t < b.live_end], machine, where)


def bind_cpsat(kernel: str, workers: int, buffers: list[Buffer], streams: list[StreamReq], machine: Machine,
               where: str, work_limit: float = WORK_LIMIT) -> Binding:
    """Place buffers and assign engines to minimise the estimated makespan (see build_model),
    searching for at most `work_limit` units of CP-SAT deterministic time (see WORK_LIMIT)."""
    check_live_capacity(kernel, buffers, machine, where)
    model, sol = build_model(buffers, streams, machine)
    s = solver(work_limit)
    status = s.Solve(model)
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"kernel '{kernel}': invalid binding model: {model.Validate()}")
    if status == cp_model.INFEASIBLE:
        raise _shortfall(kernel, buffers, machine, where, work_limit)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        binding = bind_greedy(kernel, workers, buffers, streams, machine, where)
        binding.notes.append(f"cp-sat found no binding within its work limit ({work_limit:g} deterministic s, "
                             f"{s.StatusName(status)}); greedy first fit used")
        return binding
    bound = []
    for pool, p in sol.placements:
        for i in pool.members:
            bank = next(k for (j, k), lit in p.bank.items() if j == i and s.Value(lit))
            bound.append((i, BoundBuffer(buffers[i], bank, s.Value(p.line[i]) * machine.line_bytes)))
    engines = {(streams[s_index].op_id, streams[s_index].worker): e
               for (s_index, e), lit in sol.engine.items() if s.Value(lit)}
    binding = Binding(kernel, workers, [bb for _, bb in sorted(bound, key=lambda t: t[0])], engines, "cp-sat")
    binding.makespan_estimate = estimate_makespan(binding, streams, machine)
    proof = "optimal" if status == cp_model.OPTIMAL else "best found within the work limit"
    binding.notes.append(f"cp-sat: {proof}")
    return binding
