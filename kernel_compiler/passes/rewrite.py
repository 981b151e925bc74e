"""The rewrite engine: rules of (pattern, fn) applied to a graph until none fires.

A pattern (`Pat`) is a tree rooted at an op: op types, operand patterns, a predicate on the op's
attributes, and names that bind tensors. A name bound twice must bind the same tensor, which is
how a rule says "the SUB of the same x its REDUCE_MAX reads". Operands of a commutative op match
in either order; `Pat.any` tries alternatives in turn.

Every op a pattern matches is replaced, so a match counts only when the chain is closed: each
matched op other than the root has its result read by matched ops alone, and none is a graph
output. The rule's fn then sees the `Match` and returns the one op that computes the root's
result instead, or the name of a tensor that already holds it (the root's readers then read that
tensor: a TRANSPOSE undoing another, a constant the rule computed), or None to decline (a
constant without a known value, two different axes). A rule may look at ops beyond its pattern
(`Match.computing`, `Match.readers`); those are not replaced, but an op whose result a rewrite
leaves unread by any op (and no graph output) goes with it. An expansion (one op in a form the
lowering does not take, computed by several it does) first adds the ops that compute new
intermediates (`Match.op`) and the constants they read (`Match.constant`), under new names and
with the root's source; they go ahead of the returned op, and away again if the rule declines
after all. The engine keeps the graph consistent: the new op must have the root's result shape
by the registry's shape rule, and neither it nor an added op reads a tensor the match removes;
it takes the root's place (so the ops stay in topological order), the root's name and source (so
messages still point at the model file), and tensors only the removed ops used go, unless they
are graph inputs or outputs. A tensor standing for the root's result must have its shape and
dtype, and the root's result must be no graph output (which keeps its name).

Rule sets are lists of rules and combine with `+`; `rewrite` applies one to a fixed point and
returns a new graph, leaving its argument as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from dfx import REGISTRY, Graph, Op, ShapeError, Tensor, is_integer, lookup, numpy_dtype

# binary ops whose operands may swap: a pattern matches their operands in either order
COMMUTATIVE = frozenset({"ADD", "MUL", "MAXIMUM", "MINIMUM", "EQUAL"})
assert COMMUTATIVE <= {name for name, op in REGISTRY.items() if op.family == "map" and op.min_inputs == 2}


class Pat:
    """A pattern. `Pat(name="x")` matches any tensor and binds it; `Pat("EXP", x)` the result of
    an EXP whose operand matches x (no operand patterns: any operands); `where` is a predicate on
    the op's normalized attributes."""

    def __init__(self, ops: str | frozenset[str] | None = None, *src: Pat, name: str | None = None,
                 where: Callable[[dict], bool] | None = None, alts: tuple[Pat, ...] = ()):
        self.ops = frozenset({ops}) if isinstance(ops, str) else ops
        self.src, self.name, self.where, self.alts = src, name, where, alts

    @staticmethod
    def any(*alts: Pat) -> Pat:
        """Any of `alts`, tried in order (a later one when the rule declines an earlier one's match)."""
        return Pat(alts=alts)

    def root_types(self) -> frozenset[str]:
        return frozenset().union(*(alt.root_types() for alt in self.alts)) if self.alts else self.ops


@dataclass
class Match:
    """One way a rule's pattern matched: the tensors its names bound and the ops it covers."""

    graph: Graph
    root: Op
    ops: dict[str, Op]  # op name -> op, the root included
    bound: dict[str, str]  # pattern name -> tensor name
    warnings: list[str] = field(repr=False)
    index: _Index = field(repr=False)
    added: list[Op] = field(default_factory=list)  # the ops `op` added, in order, ahead of the root's replacement
    made: list[str] = field(default_factory=list)  # the tensors `op` and `constant` added

    def __getitem__(self, name: str) -> str:
        return self.bound[name]

    def __contains__(self, name: str) -> bool:
        return name in self.bound

    def producer(self, name: str) -> Op:
        """The matched op whose result the name bound."""
        return next(op for op in self.ops.values() if op.outputs == [self.bound[name]])

    def computing(self, tensor: str) -> Op | None:
        """The op computing `tensor`, matched or not; None for a graph input or constant."""
        return self.index.producer.get(tensor)

    def readers(self, tensor: str) -> list[Op]:
        """The ops reading `tensor`, matched or not."""
        return list(self.index.consumers.get(tensor, {}).values())

    def before(self, op: Op) -> bool:
        """`op` comes ahead of the root in the graph's order: a tensor it computes may stand for the root's."""
        return op.name in self.index.passed and self.index.live(op)

    def attrs(self, name: str) -> dict:
        op = self.producer(name)
        return lookup(op.op_type).normalize_attrs(op.attrs)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.tensors[self.bound[name]].shape

    def dtype(self, name: str) -> str:
        return self.graph.tensors[self.bound[name]].dtype

    def value(self, name: str) -> float | None:
        """The value of a bound constant whose elements all hold one number, or None when the
        graph gives it no value (a `.dfg` constant) or several."""
        tensor = self.graph.tensors[self.bound[name]]
        values = self.graph.constant_values(tensor.name) if tensor.role == "constant" else None
        if values is None:
            return None
        values = values.astype(np.float64).ravel()
        return float(values[0]) if values.size and (values == values[0]).all() else None

    def is_near(self, name: str, target: float) -> bool:
        """The bound constant is `target`: rounded to its dtype, or to 1e-6 (a constant written
        with a few digits, 0.7978846 for sqrt(2/pi))."""
        value, dtype = self.value(name), self.graph.tensors[self.bound[name]].dtype
        if value is None:
            return False
        rounded = target if is_integer(dtype) else float(np.asarray(target).astype(numpy_dtype(dtype)))
        return value == rounded or math.isclose(value, target, rel_tol=1e-6)

    def same_float_dtype(self) -> bool:
        """Every matched op's result has one float dtype: no step of the chain converts to
        another type, which the op replacing it would not do."""
        dtypes = {self.graph.tensors[t].dtype for op in self.ops.values() for t in op.outputs}
        return len(dtypes) == 1 and not is_integer(dtypes.pop())

    def replace(self, op_type: str, *inputs: str, **attrs) -> Op:
        """The op that computes the root's result from `inputs` instead of the matched ones."""
        return Op(self.root.name, op_type, list(inputs), list(self.root.outputs), attrs, self.root.source)

    def op(self, step: str, op_type: str, *inputs: str, result_dtype: str | None = None, **attrs) -> str:
        """Add an op computing a new intermediate from `inputs`, its shape by the registry's rule and
        its dtype `result_dtype` or else the first operand's (a layout op's result must have it:
        its kernel moves bytes without converting them); the intermediate's name."""
        opdef = lookup(op_type)
        operands = [self.graph.tensors[t] for t in inputs]
        (shape,) = opdef.infer_shapes([t.shape for t in operands], [t.dtype for t in operands],
                                      opdef.normalize_attrs(attrs))
        name = self._fresh(step)
        self.graph.tensors[name] = Tensor(name, tuple(shape), result_dtype or operands[0].dtype)
        self.made.append(name)
        self.added.append(Op(name, op_type, list(inputs), [name], attrs, self.root.source))
        return name

    def constant(self, step: str, values: np.ndarray, dtype: str) -> str:
        """Add a graph constant holding `values` as `dtype`; its name."""
        name = self._fresh(step)
        self.graph.tensors[name] = Tensor(name, values.shape, dtype, "constant")
        self.graph.set_constant(name, values)
        self.made.append(name)
        return name

    def reshaped_constant(self, step: str, tensor: str, shape: list[int]) -> str:
        """Add a graph constant holding constant `tensor`'s elements in `shape`: its bytes as they
        lie (none where the graph gives it none, as a `.dfg` does); its name."""
        t = self.graph.tensors[tensor]
        name = self._fresh(step)
        self.graph.tensors[name] = Tensor(name, tuple(shape), t.dtype, "constant")
        if tensor in self.graph.constants:
            self.graph.constants[name] = self.graph.constants[tensor]
        self.made.append(name)
        return name

    def discard(self) -> None:
        """Take back what `op` and `constant` added: the rule declined, or its op does not fit."""
        for name in self.made:
            del self.graph.tensors[name]
            self.graph.constants.pop(name, None)
        self.added, self.made = [], []

    def _fresh(self, step: str) -> str:
        """A name no tensor or op of the graph has yet: the root's, then the step."""
        name, n = f"{self.root.name}.{step}", 1
        while name in self.graph.tensors or name in self.index.names:
            name, n = f"{self.root.name}.{step}{n}", n + 1
        return name

    def warn(self, reason: str) -> None:
        message = f"{self.root.source or self.root.name}: {reason}"
        if message not in self.warnings:  # a declined rule is tried again on every sweep
            self.warnings.append(message)


# a rule's fn: the op computing the root's result, or a tensor holding it already, or None to decline
Rule = tuple[Pat, Callable[[Match], Op | str | None]]


@dataclass
class _Index:
    """Which op computes and which ops read each tensor, kept up to date as rules replace ops."""

    producer: dict[str, Op]  # tensor -> the op computing it
    consumers: dict[str, dict[str, Op]]  # tensor -> op name -> an op reading it
    ops: dict[str, Op] = field(default_factory=dict)  # op name -> the op of that name now in the graph
    names: set[str] = field(default_factory=set)  # every op name the graph has had, which new ones must not take
    passed: set[str] = field(default_factory=set)  # the ops this sweep has placed, ahead of the one it is at

    @staticmethod
    def of(ops: list[Op]) -> _Index:
        index = _Index({}, {})
        for op in ops:
            index.add(op)
        return index

    def add(self, op: Op) -> None:
        self.producer.update((t, op) for t in op.outputs)
        self.ops[op.name] = op
        self.names.add(op.name)
        for t in op.inputs:
            self.consumers.setdefault(t, {})[op.name] = op

    def remove(self, op: Op) -> None:
        del self.ops[op.name]
        for t in op.outputs:
            del self.producer[t]
        for t in dict.fromkeys(op.inputs):
            del self.consumers[t][op.name]
            if not self.consumers[t]:
                del self.consumers[t]

    def live(self, op: Op) -> bool:
        return all(self.producer.get(t) is op for t in op.outputs)


# a partial match: the names bound and the ops matched so far
_State = tuple[dict[str, str], dict[str, Op]]


def _match(pat: Pat, tensor: str, index: _Index, state: _State) -> Iterator[_State]:
    if pat.alts:
        for alt in pat.alts:
            yield from _match(alt, tensor, index, state)
        return
    bound, ops = state
    if pat.name is not None:
        if bound.get(pat.name, tensor) != tensor:
            return
        bound = {**bound, pat.name: tensor}
    if pat.ops is None:
        yield bound, ops
        return
    op = index.producer.get(tensor)
    if op is None or op.op_type not in pat.ops or len(op.outputs) != 1:
        return
    if pat.where is not None and not pat.where(lookup(op.op_type).normalize_attrs(op.attrs)):
        return
    ops = {**ops, op.name: op}
    if not pat.src:
        yield bound, ops
        return
    if len(op.inputs) != len(pat.src):
        return
    orders = [op.inputs]
    if op.op_type in COMMUTATIVE and op.inputs[0] != op.inputs[1]:
        orders.append(op.inputs[::-1])
    for operands in orders:
        yield from _match_all(pat.src, operands, index, (bound, ops))


def _match_all(pats: tuple[Pat, ...], tensors: list[str], index: _Index, state: _State) -> Iterator[_State]:
    if not pats:
        yield state
        return
    for first in _match(pats[0], tensors[0], index, state):
        yield from _match_all(pats[1:], tensors[1:], index, first)


def _closed(graph: Graph, root: Op, ops: dict[str, Op], index: _Index) -> bool:
    """Nothing outside the match reads a matched op's result but the root's."""
    inner = [t for op in ops.values() if op is not root for t in op.outputs]
    return all(graph.tensors[t].role != "output" and all(c in ops for c in index.consumers.get(t, {}))
               for t in inner)


def _fits(graph: Graph, match: Match, new: Op) -> bool:
    """The new op computes the root's result shape, and it and the ops added ahead of it read only
    tensors that stay."""
    removed = {t for op in match.ops.values() for t in op.outputs} - set(match.root.outputs)
    if any(removed & set(op.inputs) for op in [*match.added, new]):
        return False
    opdef = lookup(new.op_type)
    inputs = [graph.tensors[t] for t in new.inputs]
    try:
        attrs = opdef.normalize_attrs(new.attrs)
        shapes = opdef.infer_shapes([t.shape for t in inputs], [t.dtype for t in inputs], attrs)
    except ShapeError:
        return False
    return [tuple(s) for s in shapes] == [graph.tensors[t].shape for t in new.outputs]


def _stands_for(graph: Graph, match: Match, tensor: str) -> bool:
    """`tensor` may take the place of the root's result: it stays, has the result's shape and
    dtype, and the result is no graph output (which keeps its name)."""
    removed = {t for op in match.ops.values() for t in op.outputs}
    result, standing = graph.tensors[match.root.outputs[0]], graph.tensors.get(tensor)
    return (standing is not None and tensor not in removed and result.role != "output"
            and (standing.shape, standing.dtype) == (result.shape, result.dtype))


def _apply(graph: Graph, match: Match, new: Op | str, index: _Index) -> None:
    """Replace the matched ops by the added ones and `new` in the index (a tensor: the root's
    readers read it instead); drop the ops and tensors no op uses any more."""
    for op in match.ops.values():
        index.remove(op)
    for op in match.added:
        index.add(op)
    if isinstance(new, Op):
        index.add(new)
    else:
        result = match.root.outputs[0]
        for reader in list(index.consumers.get(result, {}).values()):
            index.remove(reader)
            index.add(replace(reader, inputs=[new if t == result else t for t in reader.inputs]))
    _drop_unread(graph, {t for op in match.ops.values() for t in op.inputs + op.outputs}, index)


def _drop_unread(graph: Graph, tensors: set[str], index: _Index) -> None:
    """Drop the tensors among `tensors` that no op reads, none a graph input or output, with the
    op computing them once none of its results is read, and so on up through its operands."""
    while tensors:
        t = tensors.pop()
        tensor = graph.tensors.get(t)
        if tensor is None or t in index.consumers or tensor.role in ("input", "output"):
            continue
        op = index.producer.get(t)
        if op is not None:
            if any(u in index.consumers or graph.tensors[u].role == "output" for u in op.outputs):
                continue
            index.remove(op)
            tensors.update(op.inputs + op.outputs)
        del graph.tensors[t]
        graph.constants.pop(t, None)


def _rewrite_at(graph: Graph, op: Op, by_type: dict[str, list[Rule]], index: _Index,
                warnings: list[str]) -> tuple[list[Op], Op | None] | None:
    """Apply the first rule that matches at `op` and accepts; the ops added ahead of its place
    and the one computing its result there (None: a tensor that was already there holds it),
    or None."""
    rules = by_type.get(op.op_type, []) if len(op.outputs) == 1 else []
    for pat, fn in rules:
        for bound, ops in _match(pat, op.outputs[0], index, ({}, {})):
            if not _closed(graph, op, ops, index):
                continue
            match = Match(graph, op, ops, bound, warnings, index)
            new = fn(match)
            fits = _fits if isinstance(new, Op) else _stands_for
            if new is not None and fits(graph, match, new):
                _apply(graph, match, new, index)
                return match.added, new if isinstance(new, Op) else None
            match.discard()
    return None


def rewrite(graph: Graph, rules: list[Rule], warnings: list[str]) -> Graph:
    """`graph` with `rules` applied until none fires, as a new graph; a rule's warnings (why a
    chain it recognised stays as it is) are appended to `warnings` once each."""
    graph = replace(graph, tensors=dict(graph.tensors), ops=list(graph.ops), constants=dict(graph.constants))
    by_type: dict[str, list[Rule]] = {}
    for rule in rules:
        for op_type in rule[0].root_types():
            by_type.setdefault(op_type, []).append(rule)
    changed = True
    while changed:  # sweeps in topological order, until one changes nothing
        # during a sweep the index is the graph (rules see it through their Match); graph.ops is
        # rebuilt at the end, without the ops the sweep's rewrites removed
        changed, index, ops = False, _Index.of(graph.ops), []
        for op in graph.ops:
            # as the sweep left it: gone, or reading the tensor that took the place of a result
            op = index.ops.get(op.name)
            # a new op takes its root's place, which keeps the topological order; then it is tried
            # again. The ops added ahead of it are tried on the next sweep.
            while op is not None and (fired := _rewrite_at(graph, op, by_type, index, warnings)) is not None:
                added, op = fired
                ops += added
                index.passed.update(added_op.name for added_op in added)
                changed = True
            if op is not None:
                ops.append(op)
                index.passed.add(op.name)
        graph.ops = [op for op in ops if index.live(op)]
    return graph
