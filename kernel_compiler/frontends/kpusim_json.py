"""Frontend for kpu-sim's graph JSON (`test_graphs/simple/matmul.json`), the format upstream's
own compiler actually runs from: named tensors with shape and dtype, and operators that list
the tensors they read and write.
"""

from __future__ import annotations

import heapq
import json
import sys
from pathlib import Path
from typing import Any

from dfx import dtypes
from dfx.graph import INT64_MAX, Graph, Op, Tensor, shape_problem
from dfx.ops import REGISTRY

from ..errors import CompileError

# Operator type spellings -> registry op: the registry's own names, so a hand-written graph can
# use any op, then the aliases of kpu-sim's OperatorType vocabulary (include/sw/compiler/
# graph_loader.hpp) that its JSON loader accepts; the rest of that vocabulary is the registry's
# names already. The ops the registry lacks so far keep domain_flow's name: they parse and have no
# lowering yet. Attributes are the registry's, kpu-sim's GEMM set aside (PLAIN_GEMM).
ALIASES: dict[str, str] = {
    "GEMM": "MATMUL", "FC": "LINEAR",
    "ELEMENTWISE_ADD": "ADD", "ELEMENTWISE_SUB": "SUB", "ELEMENTWISE_MUL": "MUL", "ELEMENTWISE_DIV": "DIV",
    "CONV2D_DEPTHWISE": "DEPTHWISE_CONV2D", "MAXPOOL": "MAXPOOL2D", "AVGPOOL": "AVGPOOL2D",
    # not in the registry yet
    "CONV3D": "CONV3D", "BATCHNORM": "BATCHNORM", "SPLIT": "SPLIT", "ATTENTION": "ATTENTION",
}
SPELLINGS: dict[str, str] = {**{name: name for name in REGISTRY}, **ALIASES}
# kpu-sim writes its GEMM attribute set (C = alpha * op(A) @ op(B) + beta * C) on GEMM and on
# MATMUL operators alike (test_graphs/simple/matmul.json). transpose_b is the registry MATMUL's
# own attribute and passes through (false, its default, is dropped); the others mean a plain
# matmul only at these values, which are dropped, and any other value of them MATMUL cannot
# express.
GEMM_SPELLINGS = ("GEMM", "MATMUL")
PLAIN_GEMM = {"transpose_a": False, "alpha": 1.0, "beta": 0.0}
# Attributes are copied into the object file, which orjson writes: integers must fit in a signed
# 64-bit integer and nesting must stay far below orjson's 255 levels (real attributes are flat
# or lists of numbers).
MAX_ATTR_DEPTH = 16


class _Doc:
    """Typed access to the parsed document with errors that name the key path."""

    def __init__(self, file: str):
        self.file = file

    def message(self, where: str, text: str) -> str:
        # Keys are free text: keep the message one line even if a name holds a line break.
        return " ".join(f"{self.file}: {where}: {text}".splitlines())

    def fail(self, where: str, reason: str) -> CompileError:
        return CompileError(self.message(where, reason))

    def get(self, obj: dict, key: str, where: str, kind: type, required: bool = True) -> Any:
        path = f"{where}.{key}" if where else key
        if key not in obj:
            if required:
                raise self.fail(path, "missing")
            return None
        value = obj[key]
        if not isinstance(value, kind):
            raise self.fail(path, f"expected {_KIND_NAMES[kind]}, got {type(value).__name__}")
        return value


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string"}


def parse_kpusim_json(path: str, text: str) -> tuple[Graph, list[str]]:
    """Parse kpu-sim graph JSON text (the file `path`, which names it in messages) into a graph and warnings."""
    try:
        root = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompileError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise CompileError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError:  # Python's limit on the digits of an integer literal
        raise CompileError(f"{path}: invalid JSON: an integer literal has more than "
                           f"{sys.get_int_max_str_digits()} digits") from None
    doc = _Doc(path)
    if not isinstance(root, dict):
        raise doc.fail("(top level)", f"expected an object, got {type(root).__name__}")
    warnings: list[str] = []
    if "kpu_config" in root:
        # Tiling and memory strategy are the compiler's decisions (--target, --dataflow).
        warnings.append(f"{path}: kpu_config: ignored (tiling and dataflow come from --target and --dataflow)")
    name = doc.get(root, "name", "", str, required=False) or Path(path).stem
    graph = Graph(name)
    declared = _read_tensors(doc, doc.get(root, "tensors", "", dict))
    ops = [_read_operator(doc, op, i, declared) for i, op in enumerate(doc.get(root, "operators", "", list))]
    _check_unique_names(doc, ops)
    graph.ops = _in_order(doc, ops)
    _assign_roles(doc, graph, declared, warnings)
    return graph, warnings


def _read_tensors(doc: _Doc, tensors: dict) -> dict[str, Tensor]:
    result = {}
    for name, spec in tensors.items():
        where = f"tensors.{name}"
        if not isinstance(spec, dict):
            raise doc.fail(where, f"expected an object, got {type(spec).__name__}")
        shape = doc.get(spec, "shape", where, list)
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape):
            raise doc.fail(f"{where}.shape", f"expected a list of non-negative integers, got {_clip(shape)}")
        problem = shape_problem(shape)
        if problem:
            raise doc.fail(f"{where}.shape", problem)
        dtype_name = doc.get(spec, "dtype", where, str)
        try:
            dtype = dtypes.canonical(dtype_name)
        except KeyError:
            raise doc.fail(f"{where}.dtype", f"unknown dtype '{dtype_name}'") from None
        layout = doc.get(spec, "layout", where, str, required=False)
        if layout not in (None, "row_major"):
            raise doc.fail(f"{where}.layout", f"'{layout}' is not supported (only row_major)")
        result[name] = Tensor(name, tuple(shape), dtype)
    return result


def _read_operator(doc: _Doc, spec: Any, index: int, tensors: dict[str, Tensor]) -> Op:
    where = f"operators[{index}]"
    if not isinstance(spec, dict):
        raise doc.fail(where, f"expected an object, got {type(spec).__name__}")
    type_name = doc.get(spec, "type", where, str)
    op_type = SPELLINGS.get(type_name)
    if op_type is None:
        raise doc.fail(f"{where}.type", f"unknown operator type '{type_name}'")
    name = doc.get(spec, "name", where, str, required=False) or f"{op_type.lower()}_{index}"
    attrs = doc.get(spec, "attributes", where, dict, required=False) or {}
    _check_attribute(doc, attrs, f"{where}.attributes", 0)
    if type_name in GEMM_SPELLINGS:
        for key, plain in PLAIN_GEMM.items():
            if key in attrs and not _plain(attrs[key], plain):
                raise doc.fail(f"{where}.attributes.{key}",
                               f"{json.dumps(attrs[key])} is not supported (MATMUL is C = A @ B, or A @ B^T "
                               f"with transpose_b)")
        # transpose_b false is MATMUL's default: dropped too, so a plain matmul has no attributes
        attrs = {key: value for key, value in attrs.items()
                 if key not in PLAIN_GEMM and not (key == "transpose_b" and value is False)}
    lists = {}
    for key in ("inputs", "outputs"):
        names = doc.get(spec, key, where, list)
        for i, tensor in enumerate(names):
            if not isinstance(tensor, str) or tensor not in tensors:
                raise doc.fail(f"{where}.{key}[{i}]", f"no tensor {json.dumps(tensor)} in 'tensors'")
        lists[key] = names
    return Op(name, op_type, lists["inputs"], lists["outputs"], dict(attrs), source=f"{doc.file}: {where} {json.dumps(name)}")


def _plain(value: Any, plain: bool | float) -> bool:
    """Whether a GEMM attribute has its plain value: the same boolean, or the same number (not a
    boolean passing for 0 or 1)."""
    if isinstance(plain, bool) or isinstance(value, bool):
        return value is plain
    return isinstance(value, (int, float)) and value == plain


def _check_attribute(doc: _Doc, value: Any, where: str, depth: int) -> None:
    if depth > MAX_ATTR_DEPTH:
        raise doc.fail(where, f"nested deeper than {MAX_ATTR_DEPTH} levels")
    if isinstance(value, int) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise doc.fail(where, "integer does not fit in a signed 64-bit integer")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _check_attribute(doc, item, f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]", depth + 1)


def _check_unique_names(doc: _Doc, ops: list[Op]) -> None:
    first: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.name in first:
            raise doc.fail(f"operators[{i}].name", f"{json.dumps(op.name)} is already used by operators[{first[op.name]}]")
        first[op.name] = i


def _in_order(doc: _Doc, ops: list[Op]) -> list[Op]:
    """Topological order, ties by position in the file."""
    producer: dict[str, int] = {}
    for i, op in enumerate(ops):
        for tensor in op.outputs:
            if tensor in producer:
                raise doc.fail(f"operators[{i}].outputs", f"tensor {json.dumps(tensor)} is already written by operators[{producer[tensor]}]")
            producer[tensor] = i
    waiting = [{producer[t] for t in op.inputs if t in producer} for op in ops]
    ready = [i for i, deps in enumerate(waiting) if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j, deps in enumerate(waiting):
            if i in deps:
                deps.discard(i)
                if not deps:
                    heapq.heappush(ready, j)
    if len(order) < len(ops):
        stuck = min(set(range(len(ops))) - set(order))
        raise doc.fail(f"operators[{stuck}]", "is on a cycle")
    return [ops[i] for i in order]


def _assign_roles(doc: _Doc, graph: Graph, tensors: dict[str, Tensor], warnings: list[str]) -> None:
    produced = {t for op in graph.ops for t in op.outputs}
    consumed = {t for op in graph.ops for t in op.inputs}
    for name, tensor in tensors.items():
        if name not in produced and name not in consumed:
            warnings.append(doc.message(f"tensors.{name}", "not used by any operator; skipped"))
            continue
        if name not in produced:
            tensor.role = "input"
        elif name not in consumed:
            tensor.role = "output"
        graph.tensors[name] = tensor


def _clip(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
