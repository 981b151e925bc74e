"""From a read HLO module to the graph: the builder walks the entry computation's instructions in
dependency order and gives each to the op table (`hlo_ops.apply`), with the helpers every op
needs: making registry ops (identical ones once, those on constants folded), layout helpers,
broadcasts left to their readers, inlining called computations, naming the outputs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfx.graph import Graph, Op, Tensor, shape_problem
from dfx.ops import ShapeError, lookup

from ..errors import CompileError
from .hlo_text import (ELEMENT_TYPES, INT_TEXT, Computation, HloType, Instr, Module, Shape, clip, int_list,
                       int_value, one_line, type_text)

FOLD_LIMIT = 1 << 16  # elements of a folded constant (a RESHAPE of a constant folds at any size)
MAX_MADE_CONSTANT = 1 << 24  # elements of a constant the frontend makes (iota, ones to materialise a broadcast)
MAX_CALL_DEPTH = 64  # fusions and calls inlined inside each other
# instructions the inlined fusions and calls may add up to: each calls the next twice, thirty deep,
# is a billion from a few lines; a quarter of a million is more than a large model's module holds
# and still compiles in minutes. Counted before inlining, so a refusal costs nothing
MAX_INLINED = 1 << 18

# ---- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """An HLO array value: the graph tensor holding it, and its HLO shape. The tensor's shape
    broadcasts to `shape` as numpy's does (right-aligned, size-1 dims stretched): equal to it,
    or smaller where a broadcast was left to the ops that read it."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str


AnyValue = Any  # a Value, or a tuple of them (an HLO tuple)


def _broadcastable(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    if len(small) > len(shape):
        return False
    return all(s in (1, d) for s, d in zip(small[::-1], shape[::-1]))


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


class Builder:
    """From the parsed module to the graph: the entry computation's instructions in dependency
    order, each made by the op table `ops` (its `apply`; `CALLS` names the opcodes that call a
    computation, and by which attribute)."""

    def __init__(self, file: str, module: Module, warnings: list[str], ops: Any):
        self.file, self.module, self.warnings, self.ops = file, module, warnings, ops
        self.graph = Graph(module.name)
        self.producer: dict[str, Op] = {}
        self.readers: dict[str, list[Op]] = {}  # tensor -> the ops reading it
        self.op_names: set[str] = set()
        self.cse: dict[tuple, str] = {}  # (op, inputs, attrs, dtype) -> the tensor already made so
        self.ones: dict[tuple, str] = {}  # (shape, dtype) -> a constant of ones
        self.reserved = set(module.entry.instrs)  # names helpers never take: the entry's own
        self.prefix = ""  # "<caller>." inside an inlined computation
        self.calls: list[str] = []  # the computations being inlined, outermost first
        self.sizes: dict[str, int] = {}  # computation -> the instructions inlining it makes
        self.orders: dict[str, list[Instr]] = {}  # computation -> its order, for one inlined many times
        self.inlined = 0  # instructions the calls inlined so far make
        self.input_lines: dict[str, int] = {}

    def fail(self, ins: Instr, reason: str) -> CompileError:
        return CompileError(one_line(f"{self.file}:{ins.line}: {reason}"))

    def where(self, ins: Instr) -> str:
        return f"{ins.opcode} '{clip(ins.name)}'"

    # -- the graph

    def build(self) -> Graph:
        entry = self.module.entry
        params = sorted((i for i in entry.instrs.values() if i.opcode == "parameter"), key=lambda i: i.index)
        args: dict[int, AnyValue] = {}
        for ins in params:
            if ins.index in args:
                raise self.fail(ins, f"parameter({ins.index}) is given twice in the ENTRY computation")
            if not isinstance(ins.type, Shape):
                raise self.fail(ins, f"parameter '{clip(ins.name)}': tuple-shaped parameters are not supported")
            dtype = self.dtype(ins, ins.type)
            self.graph.tensors[ins.name] = Tensor(ins.name, ins.type.dims, dtype, "input")
            self.input_lines[ins.name] = ins.line
            args[ins.index] = Value(ins.name, ins.type.dims, dtype)
        root = entry.root
        if root.opcode == "parameter":
            raise self.fail(root, f"the ROOT '{clip(root.name)}' is a parameter: the module computes nothing")
        value = self.computation(entry, args)
        self.finish(root, list(_flatten(root.name, value)))
        return self.graph

    def computation(self, comp: Computation, args: dict[int, AnyValue]) -> AnyValue:
        values: dict[str, AnyValue] = {}
        if comp.name not in self.orders:
            self.orders[comp.name] = self.order(comp)
        for ins in self.orders[comp.name]:
            if ins.opcode == "parameter":
                if ins.index not in args:
                    raise self.fail(ins, f"parameter({ins.index}) of computation '{clip(comp.name)}' has no "
                                         f"argument ({len(args)} given)")
                value = args[ins.index]
            else:
                value = self.ops.apply(self, ins, [values[o] for o in ins.operands],
                                       [comp.instrs[o].type for o in ins.operands])
            self.check(ins, value)
            values[ins.name] = value
        return values[comp.root.name]

    def order(self, comp: Computation) -> list[Instr]:
        """The instructions the root needs, each after its operands, ties in text order."""
        needed, stack = {comp.root.name}, [comp.root]
        while stack:
            ins = stack.pop()
            for o in ins.operands:
                if o not in comp.instrs:
                    raise self.fail(ins, f"'{clip(ins.name)}': operand '{clip(o)}' is not defined in "
                                         f"computation '{clip(comp.name)}'")
                if o not in needed:
                    needed.add(o)
                    stack.append(comp.instrs[o])
        waiting = {n: {o for o in comp.instrs[n].operands} for n in needed}
        readers: dict[str, list[str]] = {}
        for n, ops in waiting.items():
            for o in ops:
                readers.setdefault(o, []).append(n)
        ready = sorted((comp.instrs[n].position, n) for n, ops in waiting.items() if not ops)
        order: list[Instr] = []
        heapq.heapify(ready)
        while ready:
            _, n = heapq.heappop(ready)
            order.append(comp.instrs[n])
            for r in readers.get(n, []):
                waiting[r].discard(n)
                if not waiting[r]:
                    heapq.heappush(ready, (comp.instrs[r].position, r))
        if len(order) < len(needed):
            stuck = min((comp.instrs[n] for n in needed if waiting[n]), key=lambda i: i.position)
            raise self.fail(stuck, f"'{clip(stuck.name)}' is on a cycle of operands")
        return order

    def check(self, ins: Instr, value: AnyValue) -> None:
        """The value an instruction made has the type it declares."""
        def same(t: HloType, v: AnyValue) -> bool:
            if isinstance(t, tuple):
                return isinstance(v, tuple) and len(t) == len(v) and all(same(a, b) for a, b in zip(t, v))
            return (isinstance(v, Value) and v.shape == t.dims and t.element in ELEMENT_TYPES
                    and v.dtype == ELEMENT_TYPES[t.element]
                    and _broadcastable(self.graph.tensors[v.tensor].shape, v.shape))
        if not same(ins.type, value):
            raise self.fail(ins, f"'{clip(ins.name)}' declares {type_text(ins.type)} but {ins.opcode} gives "
                                 f"{clip(_value_text(value), 120)}")

    def finish(self, root: Instr, outputs: list[tuple[str, Value]]) -> None:
        """Name the outputs, drop what they do not need, set the roles."""
        graph, made = self.graph, set()
        # where each tensor was made: a renamed one keeps its place (the order of the object's tensors)
        place = {name: i for i, name in enumerate(graph.tensors)}
        tensors = [self.full(root, value) for _, value in outputs]
        holding: dict[str, list[int]] = {}  # tensor -> the outputs whose entry of `tensors` it is
        for i, tensor in enumerate(tensors):
            holding.setdefault(tensor, []).append(i)
        for i, (name, value) in enumerate(outputs):
            tensor = tensors[i]
            computed = tensor in self.producer and graph.tensors[tensor].role == "intermediate" and tensor not in made
            if name in graph.tensors and name != tensor or name == tensor and not computed:
                # a folded constant, or the smaller tensor a broadcast output was made whole from,
                # holds the output's name: it moves aside
                movable = graph.tensors[name].role == "constant" or (name != tensor
                                                                     and graph.tensors[name].role == "intermediate")
                if not movable:
                    raise self.fail(root, f"output '{clip(name)}' would take the name of another instruction")
                moved = self.fresh(f"{name}.value", own=False)
                self.rename(name, moved, tensors, holding, place)
                tensor = tensors[i]
            if computed:
                self.rename(tensor, name, tensors, holding, place)
            else:  # an input, a constant or another output: a copy under the output's name
                self.op(root, "RESHAPE", [tensor], {"new_shape": list(value.shape)}, value.dtype, name=name,
                        reuse=False)
            made.add(name)
        live = set(made)
        kept = []
        for op in reversed(graph.ops):
            if any(t in live for t in op.outputs):
                kept.append(op)
                live.update(op.inputs)
        graph.ops = kept[::-1]
        for name, t in list(graph.tensors.items()):
            if name not in live:
                if t.role == "input":
                    self.warnings.append(f"{self.file}:{self.input_lines[name]}: parameter '{name}' is not used; "
                                         "skipped")
                del graph.tensors[name]
                graph.constants.pop(name, None)
            elif name in made:
                t.role = "output"
        # inputs in parameter order, constants, the rest, outputs in the ROOT's order; else as made
        rank = {"input": 0, "constant": 1, "intermediate": 2, "output": 3}
        order = {name: i for i, (name, _) in enumerate(outputs)}
        graph.tensors = dict(sorted(graph.tensors.items(), key=lambda kv: (rank[kv[1].role], order.get(kv[0], 0),
                                                                           place.get(kv[0], len(place)))))

    def rename(self, old: str, new: str, tensors: list[str], holding: dict[str, list[int]],
               place: dict[str, int]) -> None:
        """Tensor `old` (and the op computing it) called `new` from here on, in `tensors` too
        (`holding` says where) and in `place`. Only its readers and its producer are touched, so
        naming many outputs costs no pass over the graph for each."""
        if old == new:
            return
        graph = self.graph
        t = graph.tensors.pop(old)
        t.name = new
        graph.tensors[new] = t
        if old in graph.constants:
            graph.constants[new] = graph.constants.pop(old)
        if old in place:
            place[new] = place.pop(old)
        readers = self.readers.pop(old, [])
        for op in readers:
            op.inputs = [new if n == old else n for n in op.inputs]
        self.readers.setdefault(new, []).extend(readers)
        op = self.producer.pop(old, None)
        if op is not None:
            op.outputs = [new if n == old else n for n in op.outputs]
            if op.name == old:
                op.name = new
                self.op_names.discard(old)
                self.op_names.add(new)
            self.producer[new] = op
        for i in holding.pop(old, []):
            tensors[i] = new
            holding.setdefault(new, []).append(i)

    # -- making ops and tensors

    def fresh(self, base: str, own: bool) -> str:
        """A tensor (and op) name not taken: `base` itself for an instruction's own result."""
        def taken(n: str) -> bool:
            return n in self.graph.tensors or n in self.op_names or (not own and n in self.reserved)
        name, k = base, 1
        while taken(name):
            name, k = f"{base}_{k}", k + 1
        return name

    def own_name(self, ins: Instr) -> str:
        return self.prefix + ins.name

    def op(self, ins: Instr, op_type: str, inputs: list[str], attrs: dict[str, Any], dtype: str,
           step: str | None = None, name: str | None = None, reuse: bool = True) -> str:
        """Add `op_type` on `inputs` for `ins`; its result tensor. `step` names a helper
        ("<name>.<step>"), else the result is the instruction's own. An op made before on the same
        inputs is reused, and one on constants folded, unless `reuse` is off."""
        opdef = lookup(op_type)
        operands = [self.graph.tensors[t] for t in inputs]
        try:
            norm = opdef.normalize_attrs(attrs)
            (shape,) = opdef.infer_shapes([t.shape for t in operands], [t.dtype for t in operands], norm)
        except ShapeError as exc:
            raise self.fail(ins, f"{self.where(ins)}: {exc}") from None
        shape = tuple(int(d) for d in shape)
        problem = shape_problem(shape)
        if problem:
            raise self.fail(ins, f"{self.where(ins)}: {problem}")
        key = (op_type, tuple(inputs), _freeze(norm), dtype)
        if reuse and key in self.cse:
            return self.cse[key]
        own = step is None
        base = name or (self.own_name(ins) if own else f"{self.own_name(ins)}.{step}")
        if reuse and all(t in self.graph.constants for t in inputs):
            folded = self.fold(opdef, operands, norm, shape, dtype)
            if folded is not None:
                result = self.constant(base, folded, dtype, own=own)
                self.cse[key] = result
                return result
        result = self.fresh(base, own=own or name is not None)
        self.graph.tensors[result] = Tensor(result, shape, dtype)
        op = Op(result, op_type, list(inputs), [result], attrs, f"{self.file}:{ins.line} '{ins.name}'")
        self.graph.ops.append(op)
        self.producer[result] = op
        for t in dict.fromkeys(inputs):
            self.readers.setdefault(t, []).append(op)
        self.op_names.add(result)
        if reuse:
            self.cse[key] = result
        return result

    def fold(self, opdef, operands: list[Tensor], attrs: dict, shape: tuple[int, ...], dtype: str) -> np.ndarray | None:
        """The op's result computed now by the registry's reference, or None (too large to fold)."""
        if opdef.name == "RESHAPE":
            return self.array(operands[0]).reshape(shape)
        if math.prod(shape) > FOLD_LIMIT or any(t.size > FOLD_LIMIT for t in operands):
            return None
        with np.errstate(all="ignore"):
            return opdef.reference([self.array(t) for t in operands], attrs, [dtype])[0]

    def array(self, tensor: Tensor) -> np.ndarray:
        return self.graph.constant_values(tensor.name)

    def constant(self, base: str, values: np.ndarray, dtype: str, own: bool = False) -> str:
        name = self.fresh(base, own=own)
        values = np.asarray(values)
        self.graph.tensors[name] = Tensor(name, tuple(values.shape), dtype, "constant")
        self.graph.set_constant(name, values)
        return name

    def scalar(self, ins: Instr, value: float, dtype: str) -> str:
        key = ((), dtype, _freeze(float(value)))
        if key not in self.ones:
            self.ones[key] = self.constant(f"{self.own_name(ins)}.{clip(str(value), 12)}", np.asarray(value), dtype)
        return self.ones[key]

    def value_of(self, tensor: str) -> np.ndarray | None:
        """A constant's values, or None for a tensor without known values."""
        if tensor not in self.graph.constants:
            return None
        return self.array(self.graph.tensors[tensor])

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.graph.tensors[tensor].shape

    # -- layout helpers

    def full(self, ins: Instr, value: AnyValue) -> str:
        """The tensor of `value` at its HLO shape: a broadcast left to the readers is made here,
        as a MUL with ones over the broadcast dims (exact for every value, -0 and NaN included)."""
        if not isinstance(value, Value):
            raise self.fail(ins, f"{self.where(ins)}: an operand is a tuple, an array is needed")
        have = self.shape(value.tensor)
        if have == value.shape:
            return value.tensor
        if math.prod(have) == math.prod(value.shape):
            return self.reshape(ins, value.tensor, value.shape, "full")
        padded = (1,) * (len(value.shape) - len(have)) + have
        ones_shape = tuple(d if p == 1 else 1 for p, d in zip(padded, value.shape))
        if math.prod(ones_shape) > MAX_MADE_CONSTANT:
            raise self.fail(ins, f"{self.where(ins)}: making the broadcast to {list(value.shape)} whole needs a "
                                 f"constant of {math.prod(ones_shape)} elements, more than {MAX_MADE_CONSTANT}")
        key = (ones_shape, value.dtype, "ones")
        if key not in self.ones:
            self.ones[key] = self.constant(f"{self.own_name(ins)}.ones", np.ones(ones_shape), value.dtype)
        return self.op(ins, "MUL", [value.tensor, self.ones[key]], {}, value.dtype, step="full")

    def reshape(self, ins: Instr, tensor: str, shape: tuple[int, ...], step: str | None) -> str:
        if self.shape(tensor) == tuple(shape):
            return tensor
        producer = self.producer.get(tensor)
        if producer is not None and producer.op_type == "RESHAPE":  # a reshape of a reshape: of its operand
            tensor = producer.inputs[0]
            if self.shape(tensor) == tuple(shape):
                return tensor
        dtype = self.graph.tensors[tensor].dtype
        return self.op(ins, "RESHAPE", [tensor], {"new_shape": list(shape)}, dtype, step)

    def transpose(self, ins: Instr, tensor: str, perm: list[int], step: str | None) -> str:
        if perm == sorted(perm):
            return tensor
        producer = self.producer.get(tensor)
        if producer is not None and producer.op_type == "TRANSPOSE":  # two permutations in one
            inner = lookup("TRANSPOSE").normalize_attrs(producer.attrs)["perms"]
            inner = list(reversed(range(len(perm)))) if inner is None else inner
            tensor, perm = producer.inputs[0], [inner[p] for p in perm]
            if perm == sorted(perm):
                return tensor
        dtype = self.graph.tensors[tensor].dtype
        return self.op(ins, "TRANSPOSE", [tensor], {"perms": list(perm)}, dtype, step)

    # -- reading an instruction

    def dtype(self, ins: Instr, t: HloType) -> str:
        if not isinstance(t, Shape):
            raise self.fail(ins, f"{self.where(ins)}: a tuple shape where an array is needed")
        if t.element not in ELEMENT_TYPES:
            raise self.fail(ins, f"{self.where(ins)}: element type '{t.element}' has no DFX dtype "
                                 f"(supported: {', '.join(ELEMENT_TYPES)})")
        return ELEMENT_TYPES[t.element]

    def result(self, ins: Instr) -> tuple[tuple[int, ...], str]:
        """The instruction's declared array shape and DFX dtype."""
        dtype = self.dtype(ins, ins.type)
        return ins.type.dims, dtype

    def arity(self, ins: Instr, args: list, *counts: int) -> None:
        if len(args) not in counts:
            wanted = " or ".join(map(str, counts))
            raise self.fail(ins, f"{self.where(ins)} takes {wanted} operand{'s' if counts != (1,) else ''}, "
                                 f"got {len(args)}")

    def attr(self, ins: Instr, key: str, required: bool = True) -> str | None:
        if key not in ins.attrs:
            if required:
                raise self.fail(ins, f"{self.where(ins)}: attribute '{key}' is missing")
            return None
        return ins.attrs[key][0]

    def ints(self, ins: Instr, key: str, default: list[int] | None = None) -> list[int]:
        text = self.attr(ins, key, required=default is None)
        if text is None:
            return list(default or [])
        values = int_list(text)
        if values is None:
            raise self.fail(ins, f"{self.where(ins)}: {key}={clip(text)} is not a list of integers like {{1,0}}")
        return values

    def int_attr(self, ins: Instr, key: str, default: int | None = None) -> int:
        text = self.attr(ins, key, required=default is None)
        if text is None:
            return default  # type: ignore[return-value]
        value = int_value(text) if INT_TEXT.fullmatch(text) else None
        if value is None:
            raise self.fail(ins, f"{self.where(ins)}: {key}={clip(text)} is not an integer")
        return value

    def axes(self, ins: Instr, key: str, dims: list[int], rank: int, what: str) -> None:
        """Each of `dims` a different dimension of a rank-`rank` operand."""
        if len(set(dims)) != len(dims) or any(not 0 <= d < rank for d in dims):
            raise self.fail(ins, f"{self.where(ins)}: {key}={{{','.join(map(str, dims))}}} is not a set of "
                                 f"dimensions of the rank-{rank} {what}")

    def called(self, ins: Instr, key: str) -> Computation:
        return self.computation_named(ins, key, self.attr(ins, key))

    def called_list(self, ins: Instr, key: str) -> list[Computation]:
        """The computations an attribute like `branch_computations={%a, %b}` names, in order."""
        text = self.attr(ins, key)
        if not (text.startswith("{") and text.endswith("}")) or not text[1:-1].strip():
            raise self.fail(ins, f"{self.where(ins)}: {key}={clip(text)} is not a list of computations like {{a, b}}")
        return [self.computation_named(ins, key, name.strip()) for name in text[1:-1].split(",")]

    def computation_named(self, ins: Instr, key: str, text: str) -> Computation:
        name = text[1:] if text.startswith("%") else text
        comp = self.module.computations.get(name)
        if comp is None:
            raise self.fail(ins, f"{self.where(ins)}: {key}={clip(text)}: no computation of that name")
        return comp

    def inline(self, ins: Instr, comp: Computation, args: list[AnyValue], label: str | None = None) -> AnyValue:
        """`comp` on `args`, its tensors named `<caller>.[<label>.]<name>`. A `label`led inlining
        (a loop's trip, a conditional's branch) counts toward MAX_INLINED at any depth: the sizes
        counted before inlining know only fusions and calls."""
        if comp.name in self.calls or len(self.calls) >= MAX_CALL_DEPTH:
            raise self.fail(ins, f"{self.where(ins)}: computation '{clip(comp.name)}' calls itself")
        params = [i for i in comp.instrs.values() if i.opcode == "parameter"]
        if len(params) != len(args):
            raise self.fail(ins, f"{self.where(ins)}: computation '{clip(comp.name)}' has {len(params)} "
                                 f"parameters, {len(args)} operands are given")
        # an outermost call (its size counts the calls inside it), a loop's trip or a branch
        if not self.calls or label is not None:
            size = self.inlined_size(comp)
            self.inlined += size
            if self.inlined > MAX_INLINED:
                before = "" if size == self.inlined else f", {self.inlined} with the calls inlined before it"
                raise self.fail(ins, f"{self.where(ins)}: inlining computation '{clip(comp.name)}' makes {size} "
                                     f"instructions{before}, more than the {MAX_INLINED} a module may inline")
        saved = self.prefix
        self.calls.append(comp.name)
        self.prefix = f"{self.prefix}{ins.name}.{'' if label is None else label + '.'}"
        try:
            return self.computation(comp, dict(enumerate(args)))
        finally:
            self.prefix = saved
            self.calls.pop()

    def callee(self, ins: Instr) -> Computation | None:
        """The computation a fusion or call inlines (None: another opcode, or a name `called` refuses)."""
        key = self.ops.CALLS.get(ins.opcode)
        if key not in ins.attrs:
            return None
        text = ins.attrs[key][0]
        return self.module.computations.get(text[1:] if text.startswith("%") else text)

    def inlined_size(self, comp: Computation) -> int:
        """The instructions inlining `comp` makes: its own, each call among them counted as the
        computation it calls. Each computation is counted once and remembered, the calls walked
        depth first on a stack of their own (a chain of calls may be longer than Python recurses);
        a call back into a computation on the path counts nothing, as inlining refuses it."""
        stack: list[tuple[Computation, list | None]] = [(comp, None)]
        path: set[str] = set()
        while stack:
            c, callees = stack.pop()
            if c.name in self.sizes or (callees is None and c.name in path):
                continue
            if callees is None:  # first met: count its callees first, then come back to it
                callees = [self.callee(i) for i in c.instrs.values()]
                path.add(c.name)
                stack.append((c, callees))
                stack.extend((d, None) for d in callees if d is not None and d.name not in self.sizes)
                continue
            self.sizes[c.name] = sum(1 if d is None else self.sizes.get(d.name, 0) for d in callees)
            path.discard(c.name)
        return self.sizes.get(comp.name, 0)


def made_of(ins: Instr, operands: list[HloType]) -> str:
    """What an instruction computes from, for messages: `add of f32[4], f32[4]`."""
    return f"{ins.opcode} of {', '.join(map(type_text, operands))}"


def _flatten(name: str, value: AnyValue):
    if isinstance(value, tuple):
        for i, element in enumerate(value):
            yield from _flatten(f"{name}.{i}", element)
    else:
        yield name, value


def _value_text(value: AnyValue) -> str:
    if isinstance(value, tuple):
        return f"({', '.join(_value_text(v) for v in value)})"
    return f"{value.dtype}{list(value.shape)}"


