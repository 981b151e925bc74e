"""Frontend for domain_flow's text serialization (`.dfg`).

The grammar and its quirks are described in shared/reference/upstream-kpu-notes.md, section 2.
In short: NODE lines carry operator, operand types, attributes and the result names/types; EDGE
lines say which result slot of which node feeds which operand slot. Tensor names therefore come
through the edges, and tensors are keyed by (node id, result slot) because TOSA imports give
every result the same name. Which op a node is, and its attributes in the registry's names,
comes from the spelling table in dfg_ops.py.
"""

from __future__ import annotations

import math

import heapq
import itertools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfx.graph import INT64_MAX, Graph, Op, Tensor, shape_problem
from dfx.ops import ShapeError

from ..errors import CompileError
from .dfg_ops import BY_FIELD, BY_TOSA_NAME, OPERATOR_FIELDS, PSEUDO, DfgOp

# Element type tokens -> DFX dtype; matched as whole tokens, so `bf16` can never be read as
# `f16`. TOSA's bool `i1` (comparison results, SELECT's condition) is held in a byte: DFX has
# no 1-bit type.
DTYPE_TOKENS = {"f8": "f8", "f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64",
                "i8": "i8", "i16": "i16", "i32": "i32", "u8": "u8", "i1": "u8"}
# MLIR's BoolAttr
BOOLS = {"true": True, "false": False}
MAX_DIM = 2**31 - 1
MAX_LEGACY_PERMUTED_OPERANDS = 6  # 720 orders; beyond that file order is kept

_INT = re.compile(r"[0-9]+")
_SLOT_PREFIX = re.compile(r"([0-9]+)\s*:(.*)", re.S)
_NODE = re.compile(r"NODE\s+([0-9]+)\s*:(.*)", re.S)
_EDGE = re.compile(r"EDGE\s+([0-9]+)\s*->\s*([0-9]+)\s*:(.*)", re.S)
_COUNT = re.compile(r"(NODES|EDGES|ADJACENCY|RUNNING_NODE_ID)\s+([0-9]{1,18})")
_ARRAY = re.compile(r"array<\s*([A-Za-z][A-Za-z0-9]*)\s*(?::(.*))?>", re.S)
_TYPED_SCALAR = re.compile(r"(.*?)\s*:\s*([A-Za-z][A-Za-z0-9]*)", re.S)
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|nan)", re.I)
_SIGNED_INT = re.compile(r"[-+]?[0-9]+")


@dataclass(frozen=True)
class DfgType:
    """A parsed `tensor<...>`; dtype is None when the text gives only a shape (`tensor<4x256>`)."""

    shape: tuple[int, ...]
    dtype: str | None


@dataclass
class DfgNode:
    id: int
    line: int
    name: str
    op: str  # the registry op, else the operator field (or the TOSA name of an untracked op)
    operand_types: dict[int, DfgType]
    attrs: dict[str, Any]  # as the file spells them
    result_names: dict[int, str]
    result_types: dict[int, DfgType]
    spelling: DfgOp | None  # the row of dfg_ops.SPELLINGS it matched


@dataclass
class DfgEdge:
    line: int
    src: int
    dst: int
    src_slot: int
    dst_slot: int | None  # None: legacy 5-field edge, the slot is worked out from the file order
    type: DfgType | None


@dataclass
class _Reader:
    """Reads the lines of one file into nodes and edges; knows nothing about the graph IR."""

    file: str
    warnings: list[str]
    name: str = ""
    nodes: dict[int, DfgNode] = field(default_factory=dict)
    edges: list[DfgEdge] = field(default_factory=list)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # keyword -> (count, line)
    dynamic_lines: list[int] = field(default_factory=list)

    def fail(self, line: int, reason: str) -> CompileError:
        return CompileError(f"{self.file}:{line}: {reason}")

    def read(self, text: str) -> None:
        # splitlines() also breaks at \v, \f, \x1c, \u2028...: no line break survives into a name
        # or a message, so every message stays one line.
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if line:
                self.read_line(number, line)
        self.check_counts()

    def read_line(self, number: int, line: str) -> None:
        keyword = line.split(None, 1)[0]
        if line.startswith("Domain Flow Graph"):
            self.read_header(number, line)
        elif keyword == "DIRECTED":
            pass
        elif keyword == "UNDIRECTED":
            raise self.fail(number, "an UNDIRECTED graph is not a domain flow graph")
        elif keyword == "NODE":
            self.read_node(number, line)
        elif keyword == "EDGE":
            self.read_edge(number, line)
        elif keyword in ("NODES", "EDGES", "ADJACENCY", "RUNNING_NODE_ID"):
            match = _COUNT.fullmatch(line)
            if not match:
                raise self.fail(number, f"expected '{keyword} <count>', got '{_clip(line)}'")
            self.counts[keyword] = (int(match.group(2)), number)
        elif keyword in ("ADJ", "SOURCE:", "SINK:", "SOURCE", "SINK"):
            pass  # derived from the edges; the writer even drops the separators between sinks
        else:
            raise self.fail(number, f"unexpected line '{_clip(line)}'")

    def read_header(self, number: int, line: str) -> None:
        if self.nodes or self.edges or self.counts:
            raise self.fail(number, "the 'Domain Flow Graph:' header must come first")
        if ":" not in line:
            raise self.fail(number, "expected 'Domain Flow Graph: <name>'")
        name = line.split(":", 1)[1].strip()
        # TOSA imports put the source .mlir path there ("F:\...\tosa/mobilenet_v1_tosa.mlir").
        if "/" in name or "\\" in name:
            name = Path(name.replace("\\", "/")).stem
        self.name = name

    def read_node(self, number: int, line: str) -> None:
        match = _NODE.fullmatch(line)
        if not match:
            raise self.fail(number, "expected 'NODE <id> : |name|OP|depth|operands|attributes|results|types'")
        node_id = self.parse_int(number, match.group(1), "node id")
        if node_id in self.nodes:
            raise self.fail(number, f"node {node_id} is defined twice (first on line {self.nodes[node_id].line})")
        body = match.group(2).strip()
        # Modern lines start with an empty "sync" field; legacy lines (tosa/test1.dfg) do not,
        # and they have no attribute field either.
        modern = body.startswith("|")
        fields = body.split("|")[1:] if modern else body.split("|")
        if len(fields) == 7:
            name, op, depth, operands, attributes, results, types = fields
        elif len(fields) == 6 and not modern:
            name, op, depth, operands, results, types = fields
            attributes = ""
        else:
            raise self.fail(
                number,
                f"NODE has {len(fields)} '|' fields, expected 7 (|name|OP|depth|operands|attributes|"
                "results|types) or, without the leading '|', the legacy 6 (no attributes)",
            )
        # The depth (the writer's topological level) is not used: the order comes from the edges.
        # Checking it still catches a line whose fields have shifted.
        self.parse_int(number, depth, "depth")
        name, op = name.strip(), op.strip()
        if op not in OPERATOR_FIELDS:
            raise self.fail(number, f"unknown operator '{_clip(op)}'")
        spelling = BY_TOSA_NAME.get(name)
        if spelling and op not in (spelling.operator_field, "UNKNOWN"):
            raise self.fail(number, f"node {node_id} '{_clip(name)}' is {spelling.op} by its TOSA name "
                                    f"but {op} by its operator field")
        spelling = spelling or BY_FIELD.get(op)
        if spelling:
            op = spelling.op
        elif op == "UNKNOWN" and name.startswith("tosa."):
            op = name  # a TOSA op the importer does not track: a computation the registry lacks
        self.nodes[node_id] = DfgNode(
            id=node_id,
            line=number,
            name=name,
            op=op,
            operand_types=self.parse_typed_list(number, operands, "operand"),
            attrs=self.parse_attributes(number, attributes),
            result_names={slot: text.strip() for slot, text in self.slotted(number, results, "result")},
            result_types=self.parse_typed_list(number, types, "result type"),
            spelling=spelling,
        )

    def read_edge(self, number: int, line: str) -> None:
        match = _EDGE.fullmatch(line)
        if not match:
            raise self.fail(number, "expected 'EDGE <src> -> <dst> : flow|stationary|type|bits|srcSlot|dstSlot|schedule'")
        fields = match.group(3).strip().split("|")
        if len(fields) == 7:
            src_slot = self.parse_int(number, fields[4], "source slot")
            dst_slot: int | None = self.parse_int(number, fields[5], "destination slot")
        elif len(fields) == 5:  # legacy: no slots
            src_slot, dst_slot = 0, None
        else:
            raise self.fail(number, f"EDGE has {len(fields)} '|' fields, expected 7 or the legacy 5")
        type_text = fields[2].strip()
        # The writer's default edge type `1xi32` is a placeholder, not the tensor's type.
        edge_type = self.parse_type(number, type_text) if type_text.startswith("tensor<") else None
        self.edges.append(DfgEdge(
            line=number,
            src=self.parse_int(number, match.group(1), "node id"),
            dst=self.parse_int(number, match.group(2), "node id"),
            src_slot=src_slot,
            dst_slot=dst_slot,
            type=edge_type,
        ))

    def check_counts(self) -> None:
        for keyword, actual in (("NODES", len(self.nodes)), ("EDGES", len(self.edges))):
            if keyword in self.counts and self.counts[keyword][0] != actual:
                declared, number = self.counts[keyword]
                self.warnings.append(
                    f"{self.file}:{number}: {keyword} says {declared}, the file has {actual}; using the {actual}"
                )

    # ---- field parsers -------------------------------------------------------------------

    def parse_int(self, number: int, text: str, what: str) -> int:
        text = text.strip()
        if not _INT.fullmatch(text) or len(text) > 18:
            raise self.fail(number, f"bad {what} '{_clip(text)}'")
        return int(text)

    def slotted(self, number: int, text: str, what: str) -> list[tuple[int, str]]:
        """`0:a,1:b` or the legacy `a,b` as (slot, text) pairs. Types and names hold no commas,
        so a plain split is right even when a type lacks its final `>` (legacy oneLayerMLP)."""
        pairs: list[tuple[int, str]] = []
        for position, item in enumerate(text.split(",") if text.strip() else []):
            match = _SLOT_PREFIX.fullmatch(item.strip())
            if match:
                slot, value = self.parse_int(number, match.group(1), f"{what} slot"), match.group(2)
            else:
                slot, value = position, item
            if any(slot == s for s, _ in pairs):
                raise self.fail(number, f"{what} slot {slot} appears twice")
            pairs.append((slot, value))
        return pairs

    def parse_typed_list(self, number: int, text: str, what: str) -> dict[int, DfgType]:
        types = {}
        for slot, type_text in self.slotted(number, text, what):
            if type_text.strip():
                types[slot] = self.parse_type(number, type_text)
        return types

    def parse_type(self, number: int, text: str) -> DfgType:
        """`tensor<4x16xf32>`, also the malformed `tensor<tensor<4x16xf32>`, a missing final `>`,
        a shape without dtype (`tensor<4x256>`) and dynamic dims (`?`, read as 1)."""
        body = text.strip()
        while body.startswith("tensor<"):
            body = body[len("tensor<"):]
        body = body.rstrip(">").strip()
        parts = body.split("x") if body else []
        dtype = DTYPE_TOKENS[parts.pop()] if parts and parts[-1] in DTYPE_TOKENS else None
        if (not parts and dtype is None) or "" in parts:
            raise self.fail(number, f"bad type '{_clip(text)}'")
        shape = []
        for i, part in enumerate(parts):
            if part == "?":
                shape.append(1)
                self.dynamic_lines.append(number)
            elif _INT.fullmatch(part) and len(part) <= 10 and int(part) <= MAX_DIM:
                shape.append(int(part))
            elif i == len(parts) - 1 and dtype is None and not _INT.fullmatch(part):
                raise self.fail(number, f"unknown element type '{_clip(part)}' in '{_clip(text)}'")
            else:
                raise self.fail(number, f"bad dimension '{_clip(part)}' in '{_clip(text)}'")
        problem = shape_problem(shape)
        if problem:
            raise self.fail(number, f"type '{_clip(text)}': {problem}")
        return DfgType(tuple(shape), dtype)

    def parse_attributes(self, number: int, text: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        for item in _split_top_level(text):
            key, sep, value = item.partition(":")
            key = key.strip()
            if not sep or not key:
                raise self.fail(number, f"bad attribute '{_clip(item)}', expected 'key:value'")
            attrs[key] = self.parse_attribute_value(number, key, value.strip())
        return attrs

    def parse_attribute_value(self, number: int, key: str, value: str) -> Any:
        array = _ARRAY.fullmatch(value)
        if array:
            element_type, elements = array.group(1), array.group(2) or ""
            items = [e.strip() for e in elements.split(",")] if elements.strip() else []
            return [self.parse_number(number, key, e, element_type) for e in items]
        typed = _TYPED_SCALAR.fullmatch(value)
        if typed and _FLOAT.fullmatch(typed.group(1)):  # `6.000000e+00 : f32`, `1 : i32`
            return self.parse_number(number, key, typed.group(1), typed.group(2))
        if _SIGNED_INT.fullmatch(value):
            return self.int64(number, key, value)
        if _FLOAT.fullmatch(value):
            return float(value)
        return BOOLS.get(value, value)  # else text, e.g. `target:memory`

    def parse_number(self, number: int, key: str, text: str, element_type: str) -> int | float:
        integral = element_type[0] in "iu"
        if (_SIGNED_INT if integral else _FLOAT).fullmatch(text) and len(text) <= 40:
            return self.int64(number, key, text) if integral else float(text)
        raise self.fail(number, f"attribute '{_clip(key)}': bad {element_type} value '{_clip(text)}'")

    def int64(self, number: int, key: str, text: str) -> int:
        # attributes go into the object file, which holds signed 64-bit integers at most; the
        # length test comes first so that int() never meets thousands of digits
        if len(text.lstrip("+-")) <= 19 and -INT64_MAX - 1 <= int(text) <= INT64_MAX:
            return int(text)
        raise self.fail(number, f"attribute '{_clip(key)}': {_clip(text)} does not fit in a signed 64-bit integer")


def _split_top_level(text: str) -> list[str]:
    """Split at `,` outside `<...>`: attribute values such as `array<i64: 1, 1>` contain commas."""
    if not text.strip():
        return []
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- from nodes and edges to the graph IR ------------------------------------------------------


@dataclass
class _Builder:
    reader: _Reader
    incoming: dict[int, list[DfgEdge]] = field(default_factory=lambda: defaultdict(list))
    outgoing: dict[int, list[DfgEdge]] = field(default_factory=lambda: defaultdict(list))
    slot_of: dict[int, int] = field(default_factory=dict)  # id(edge) -> operand slot
    names: dict[tuple[int, int], str] = field(default_factory=dict)  # (node, result slot) -> tensor
    results: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))  # node -> tensors by slot

    @property
    def nodes(self) -> dict[int, DfgNode]:
        return self.reader.nodes

    def fail(self, line: int, reason: str) -> CompileError:
        return self.reader.fail(line, reason)

    def warn(self, line: int, message: str) -> None:
        self.reader.warnings.append(f"{self.reader.file}:{line}: {message}")

    def build(self, graph_name: str) -> Graph:
        self.index_edges()
        self.assign_operand_slots()
        graph = Graph(graph_name)
        keys = self.tensor_keys()
        self.name_tensors(keys)
        for key in keys:
            graph.tensors[self.names[key]] = self.make_tensor(key)
        graph.ops = [self.make_op(node, graph) for node in self.ops_in_order()]
        self.name_ops(graph.ops)
        return graph

    def index_edges(self) -> None:
        for edge in self.reader.edges:
            for end in (edge.src, edge.dst):
                if end not in self.nodes:
                    raise self.fail(edge.line, f"edge names node {end}, which does not exist")
            producer = self.nodes[edge.src]
            declared = set(producer.result_names) | set(producer.result_types)
            if producer.op not in PSEUDO and declared and edge.src_slot not in declared:
                raise self.fail(edge.line, f"node {edge.src} has no result slot {edge.src_slot}")
            self.outgoing[edge.src].append(edge)
            self.incoming[edge.dst].append(edge)

    # -- operand slots

    def assign_operand_slots(self) -> None:
        for dst, edges in self.incoming.items():
            legacy = [e for e in edges if e.dst_slot is None]
            if legacy and len(legacy) != len(edges):
                raise self.fail(legacy[0].line, f"edges into node {dst} mix the 5-field and the 7-field form")
            slots = self.legacy_slots(self.nodes[dst], edges) if legacy else [e.dst_slot for e in edges]
            fed: dict[int, DfgEdge] = {}
            for edge, slot in zip(edges, slots):
                if slot in fed:
                    raise self.fail(edge.line, f"operand {slot} of node {dst} is already fed by the edge on line {fed[slot].line}")
                fed[slot] = edge
                self.slot_of[id(edge)] = slot

    def legacy_slots(self, node: DfgNode, edges: list[DfgEdge]) -> list[int]:
        """Operand slots of slot-less edges: their order in the file, as the legacy reader did.
        Legacy TOSA files list a conv's edges as input, bias, weights, though, so when the file
        order contradicts the declared operand types of the producers, the first order (by file
        position) that agrees with them is taken."""
        def fits(order: tuple[int, ...]) -> bool:
            for slot, edge in zip(order, edges):
                produced = self.declared_result_type(edge)
                wanted = node.operand_types.get(slot)
                if produced and wanted and produced.shape != wanted.shape:
                    return False
            return True

        in_file_order = tuple(range(len(edges)))
        if fits(in_file_order) or len(edges) > MAX_LEGACY_PERMUTED_OPERANDS:
            return list(in_file_order)
        return list(next((p for p in itertools.permutations(in_file_order) if fits(p)), in_file_order))

    def declared_result_type(self, edge: DfgEdge) -> DfgType | None:
        producer = self.nodes[edge.src]
        # A FUNCTION node's result types are the function's results; its edges carry its arguments.
        return None if producer.op == "FUNCTION" else producer.result_types.get(edge.src_slot)

    # -- tensors

    def tensor_keys(self) -> list[tuple[int, int]]:
        """(node, result slot) of every tensor, in node id order. Boundary nodes without edges
        (the orphan `Cin` constant, TOSA's unused func.arg) make none."""
        keys = []
        for node in sorted(self.nodes.values(), key=lambda n: n.id):
            used_slots = {e.src_slot for e in self.outgoing[node.id]}
            if node.op in PSEUDO:
                if not used_slots and not self.incoming[node.id] and node.op in ("CONSTANT", "FUNCTION_ARGUMENT"):
                    self.warn(node.line, f"node {node.id} '{node.name}' has no edges; skipped")
                slots = used_slots
            else:
                slots = used_slots | set(node.result_names) | set(node.result_types) or {0}
            keys.extend((node.id, slot) for slot in sorted(slots))
        return keys

    def name_tensors(self, keys: list[tuple[int, int]]) -> None:
        candidates = []
        for node_id, slot in keys:
            node = self.nodes[node_id]
            if node.op == "FUNCTION":  # its edges carry the function's arguments (MLIR's %arg0...)
                candidates.append(f"arg{slot}")
            else:
                fallback = node.name and (node.name if slot == 0 else f"{node.name}_{slot}")
                candidates.append(node.result_names.get(slot) or fallback or f"node{node_id}_{slot}")
        self.names = dict(zip(keys, _unique(candidates)))
        for (node_id, _), name in self.names.items():  # keys run in slot order within a node
            self.results[node_id].append(name)

    def make_tensor(self, key: tuple[int, int]) -> Tensor:
        node_id, slot = key
        node = self.nodes[node_id]
        consumers = [e for e in self.outgoing[node_id] if e.src_slot == slot]
        if node.op == "CONSTANT":
            role = "constant"
        elif node.op in PSEUDO:
            role = "input"
        elif not consumers or any(self.nodes[e.dst].op in PSEUDO for e in consumers):
            role = "output"
        else:
            role = "intermediate"
        shape, dtype = self.resolve_type(node, slot, consumers)
        return Tensor(self.names[key], shape, dtype, role)

    def resolve_type(self, node: DfgNode, slot: int, consumers: list[DfgEdge]) -> tuple[tuple[int, ...], str]:
        """The producer's declared type, else what the consumers declare for that operand, else
        the edge's type; a dtype missing there comes from the others, else f32."""
        declared = None if node.op == "FUNCTION" else node.result_types.get(slot)
        wanted = [(e, t) for e in consumers if (t := self.nodes[e.dst].operand_types.get(self.slot_of[id(e)]))]
        edge_types = [e.type for e in consumers if e.type]
        if declared:
            shape = declared.shape
        elif wanted:
            shape = self.consumer_shape(node, slot, wanted)
        elif edge_types:
            shape = edge_types[0].shape
        else:
            raise self.fail(node.line, f"cannot tell the type of result {slot} of node {node.id} '{node.name}': "
                                       "no result type, operand type or edge type gives it")
        dtypes = [t.dtype for t in [declared, *(t for _, t in wanted), *edge_types] if t and t.dtype]
        return shape, dtypes[0] if dtypes else "f32"

    def consumer_shape(self, node: DfgNode, slot: int, wanted: list[tuple[DfgEdge, DfgType]]) -> tuple[int, ...]:
        shapes = {t.shape for _, t in wanted}
        # Elementwise consumers broadcast a smaller operand, a contraction takes only its own
        # shape: the largest declaration is the one every consumer can accept.
        shape = max((t for _, t in wanted), key=lambda t: math.prod(t.shape)).shape
        if len(shapes) > 1:
            listed = ", ".join(f"node {e.dst} declares {list(t.shape)}" for e, t in wanted)
            self.warn(node.line, f"consumers of result {slot} of node {node.id} '{node.name}' disagree on its "
                                 f"shape ({listed}); using {list(shape)}")
        return shape

    # -- ops

    def ops_in_order(self) -> list[DfgNode]:
        """Op nodes in topological order, ties by node id (file order is not to be trusted)."""
        op_ids = {n for n, node in self.nodes.items() if node.op not in PSEUDO}
        preds = {n: {e.src for e in self.incoming[n] if e.src in op_ids} for n in op_ids}
        ready = [n for n in op_ids if not preds[n]]
        heapq.heapify(ready)
        order = []
        while ready:
            n = heapq.heappop(ready)
            order.append(self.nodes[n])
            for e in self.outgoing[n]:
                if e.dst in op_ids and n in preds[e.dst]:
                    preds[e.dst].discard(n)
                    if not preds[e.dst]:
                        heapq.heappush(ready, e.dst)
        if len(order) < len(op_ids):
            stuck = self.nodes[min(op_ids - {node.id for node in order})]
            raise self.fail(stuck.line, f"node {stuck.id} '{stuck.name}' is on a cycle")
        return order

    def make_op(self, node: DfgNode, graph: Graph) -> Op:
        fed = sorted(self.incoming[node.id], key=lambda e: self.slot_of[id(e)])
        slots = [self.slot_of[id(e)] for e in fed]
        if slots != list(range(len(slots))):
            missing = min(set(range(len(slots) + 1)) - set(slots))
            raise self.fail(node.line, f"operand {missing} of node {node.id} '{node.name}' is not connected "
                                       f"(edges feed operands {slots})")
        if node.operand_types and len(fed) != len(node.operand_types):
            self.warn(node.line, f"node {node.id} '{node.name}' declares {len(node.operand_types)} operands, "
                                 f"{len(fed)} connected")
        outputs = list(self.results[node.id])
        source = f"{self.reader.file}:{node.line} node {node.id} '{node.name}'"
        return Op(
            name=node.name or f"{node.op.lower()}_{node.id}",
            op_type=node.op,
            inputs=[self.names[(e.src, e.src_slot)] for e in fed],
            outputs=outputs,
            attrs=self.registry_attrs(node, len(fed), graph.tensors[outputs[0]].dtype, source),
            source=source,
        )

    @staticmethod
    def registry_attrs(node: DfgNode, operands: int, dtype: str, source: str) -> dict[str, Any]:
        """The node's attributes in the registry's names (shape inference checks them)."""
        if node.spelling is None:
            return node.attrs
        for slot, attr in node.spelling.value_operands.items():
            if slot < operands:
                raise CompileError(f"{source}: operand {slot} carries the {attr} as a tensor, whose values a "
                                   f".dfg does not hold; {node.op} needs the {attr} as an attribute")
        try:
            return node.spelling.attrs(node.attrs, dtype)
        except ShapeError as exc:
            raise CompileError(f"{source}: {exc}") from None

    @staticmethod
    def name_ops(ops: list[Op]) -> None:
        for op, name in zip(ops, _unique([op.name for op in ops])):
            op.name = name


def _unique(candidates: list[str]) -> list[str]:
    """The first use of a name keeps it; repeats become name_1, name_2, ... (skipping taken ones)."""
    taken = set(candidates)
    seen: set[str] = set()
    suffix: dict[str, int] = {}  # name -> the next suffix to try: the ones below it stay taken
    result = []
    for name in candidates:
        if name in seen:
            k = suffix.get(name, 1)
            while f"{name}_{k}" in taken:
                k += 1
            suffix[name] = k + 1
            name = f"{name}_{k}"
            taken.add(name)
        seen.add(name)
        result.append(name)
    return result


def parse_dfg(path: str, text: str) -> tuple[Graph, list[str]]:
    """Parse `.dfg` text (the file `path`, which names it in messages) into a graph and warning lines."""
    warnings: list[str] = []
    reader = _Reader(path, warnings)
    reader.read(text)
    if reader.dynamic_lines:
        first, more = reader.dynamic_lines[0], len(set(reader.dynamic_lines)) - 1
        warnings.append(f"{path}:{first}: dynamic dimension '?' read as 1"
                        + (f" (also on {more} more lines)" if more else ""))
    graph = _Builder(reader).build(reader.name or Path(path).stem)
    return graph, warnings
