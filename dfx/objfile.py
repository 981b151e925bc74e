"""The `.kpu` object file: deterministic JSON with a header, a checksummed body and a schema.

Layout: {"format", "format_version", "dfx_version", "producer", "sha256", "body"}; `sha256`
is over the body serialised with sorted keys, so any edit to the body is caught.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from .errors import ObjectFileError
from .graph import INT64_MAX, Graph, Op, Tensor
from .input_files import GB, InputFileError, read_input_file
from .kernel import Barrier, Compute, DataMove, IndexTable, IndexTensor, Kernel, TileLoop, TileRef
from .output_files import OutputFiles
from .program import Program
from .schema import Check, compile_schema
from .validate import validate_program

FORMAT = "kpu-object"
FORMAT_VERSION = 1
DFX_VERSION = "1.0"
PRODUCER = "kpu-kernel-compiler 0.1.0"


# ---- writing -------------------------------------------------------------------------------


# JSON has no infinities: -inf (a max-pool's padding fill, a CLAMP's open bound) is written as the string
NON_FINITE = {"inf": math.inf, "-inf": -math.inf}


@cache
def _field_names(cls: type) -> tuple[str, ...] | None:
    """The fields of a dataclass type (None for another type), asked once per type: a program
    holds hundreds of thousands of dataclass instances."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


def _plain(value: Any) -> Any:
    """Dataclasses to dicts, dropping fields left at None so the file stays small; an infinite
    float as its NON_FINITE string."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    names = _field_names(type(value))
    if names is not None:
        return {name: _plain(v) for name in names if (v := getattr(value, name)) is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def program_body(program: Program) -> dict[str, Any]:
    g = program.graph
    return {
        "name": program.name,
        "source": program.source,
        "target": program.target,
        "graph": {
            "tensors": [_plain(t) for t in g.tensors.values()],
            "ops": [_plain(o) for o in g.ops],
        },
        "constants": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(g.constants.items())},
        "kernels": [_plain(k) for k in program.kernels],
    }


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def dumps(program: Program) -> bytes:
    body = program_body(program)
    obj = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dfx_version": DFX_VERSION,
        "producer": PRODUCER,
        "sha256": _digest(body),
        "body": body,
    }
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n"


def write(program: Program, path: str | Path) -> None:
    """Write atomically: a failure never leaves a partial object behind (OutputError if it fails)."""
    with OutputFiles() as out:
        out.stage(out.claim(path), dumps(program))
        out.commit()


# ---- reading -------------------------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    return json.loads(resources.files("dfx").joinpath("kpu-object.schema.json").read_text())


@cache
def _conforms() -> Check:
    """Whether an object conforms to the schema, decided as strict_validator() would."""
    return compile_schema(schema())


@cache
def strict_validator() -> Any:
    """jsonschema's validator of the schema, which words a refusal; only a refused object's run
    imports jsonschema."""
    import jsonschema

    # JSON Schema counts 24.0 as an integer; a tile extent or loop bound must be a real int
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool))
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)(schema())


def _schema_error(where: str, obj: dict[str, Any]) -> None:
    if _conforms()(obj):
        return
    import jsonschema

    error = jsonschema.exceptions.best_match(strict_validator().iter_errors(obj))
    if error is not None:
        place = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ObjectFileError(f"{where}: {place}: {error.message.splitlines()[0]}")


# A compiled object nests about ten levels, attributes included. Checksumming (orjson, 255
# levels) and schema validation (recursive) must never meet a document nested deeper.
MAX_DEPTH = 64


def _bounds_error(where: str, obj: Any) -> None:
    """Nesting depth and integer range, walked without recursion: orjson reads integers up to
    2^64 - 1 and nesting up to 1024 levels, more than the rest of the reader can take."""
    # each entry: (a dict or list, its parent's entry, its key there, depth); the path is spelled
    # only for a refusal, and only containers are stacked, not each of a large program's values
    stack: list[tuple[Any, Any, Any, int]] = [(obj, None, None, 0)]

    def path(entry: tuple[Any, Any, Any, int], key: Any) -> str:
        keys = [str(key)]
        while entry[1] is not None:
            keys.append(str(entry[2]))
            entry = entry[1]
        return "/".join(reversed(keys))

    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[3] + 1  # the depth of its items
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if depth > MAX_DEPTH:
                raise ObjectFileError(f"{where}: {path(entry, key)[:80]}...: nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, (dict, list)):
                stack.append((item, entry, key, depth))
            elif isinstance(item, int) and item > INT64_MAX:
                raise ObjectFileError(f"{where}: {path(entry, key)}: {item} does not fit in a signed 64-bit integer")


def loads(data: bytes, where: str = "<object>") -> Program:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ObjectFileError(f"{where}: not a kpu object (invalid JSON: {str(e).splitlines()[0]})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ObjectFileError(f"{where}: not a kpu object (format is not '{FORMAT}')")
    if obj.get("format_version") != FORMAT_VERSION:
        raise ObjectFileError(f"{where}: unsupported format_version {obj.get('format_version')!r}, "
                              f"this loader reads {FORMAT_VERSION}")
    if obj.get("dfx_version") != DFX_VERSION:
        raise ObjectFileError(f"{where}: unsupported dfx_version {obj.get('dfx_version')!r}, "
                              f"this loader reads {DFX_VERSION}")
    _bounds_error(where, obj)
    body = obj.get("body")
    if not isinstance(body, dict) or _digest(body) != obj.get("sha256"):
        raise ObjectFileError(f"{where}: sha256 mismatch: the body was modified or corrupted")
    _schema_error(where, obj)
    return _program(body, where)


# An object carries its constants' bytes in base64 (4/3 of them): an ONNX model of up to 2 GB of
# initializers makes an object of under 3 GB, the rest of the file grows with the graph alone.
MAX_OBJECT_BYTES = 4 * GB


def read(path: str | Path) -> Program:
    try:
        data = read_input_file(path, "kpu object file", MAX_OBJECT_BYTES)
    except InputFileError as e:
        raise ObjectFileError(str(e)) from None
    return loads(data, str(path))


def _numbers(value: Any) -> Any:
    """An attribute as written, its infinities (NON_FINITE strings) floats again."""
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


def _table(d: dict[str, Any] | None) -> IndexTable | IndexTensor | None:
    """A tile's index table: an op's attribute, or a tensor read at run time (the schema allows
    exactly one of the two forms)."""
    if d is None:
        return None
    if "tensor" in d:
        return IndexTensor(d["dim"], d["tensor"])
    return IndexTable(d["dim"], d["op"], d["attr"])


def _tile_ref(d: dict[str, Any]) -> TileRef:
    return TileRef(d["tensor"], d["level"], list(d["tile_indices"]), list(d["tile_shape"]),
                   offset=list(d["offset"]) if "offset" in d else None,
                   table=_table(d.get("table")),
                   step=list(d["step"]) if "step" in d else None,
                   padding=[list(p) for p in d["padding"]] if "padding" in d else None)


def _body_op(d: dict[str, Any]) -> DataMove | Compute | Barrier:
    place = {"at": d.get("at"), "after": d.get("after"), "depends_on": list(d.get("depends_on", []))}
    if d["type"] == "DATA_MOVE":
        return DataMove(d["op_id"], d["move_type"], _tile_ref(d["source"]), _tile_ref(d["destination"]),
                        depth=d.get("depth", 1), transpose=d.get("transpose", False),
                        broadcast=d.get("broadcast", False),
                        permutation=list(d["permutation"]) if "permutation" in d else None,
                        fill=NON_FINITE.get(d.get("fill"), d.get("fill")), **place)
    if d["type"] == "COMPUTE":
        return Compute(d["op_id"], d["compute_type"], [_tile_ref(i) for i in d["inputs"]],
                       _tile_ref(d["output"]), accumulate=d.get("accumulate", "false"), **place)
    return Barrier(d["op_id"], list(d["wait_for"]), d.get("kernel"), **place)


def _program(body: dict[str, Any], where: str) -> Program:
    g = Graph(body["name"])
    for t in body["graph"]["tensors"]:
        if t["name"] in g.tensors:  # the graph holds one tensor per name: a second would replace the first
            raise ObjectFileError(f"{where}: tensor '{t['name']}': listed twice in the graph")
        g.tensors[t["name"]] = Tensor(t["name"], tuple(t["shape"]), t["dtype"], t["role"])
    for o in body["graph"]["ops"]:
        g.ops.append(Op(o["name"], o["op_type"], list(o["inputs"]), list(o["outputs"]),
                        {k: _numbers(v) for k, v in o.get("attrs", {}).items()}, o.get("source", "")))
    try:
        g.constants = {k: base64.b64decode(v, validate=True) for k, v in body["constants"].items()}
    except ValueError:
        raise ObjectFileError(f"{where}: body/constants: a value is not valid base64") from None
    kernels = [
        Kernel(
            name=k["name"], op=k["op"], graph_op=k["graph_op"], dataflow=k["dataflow"],
            tiling=dict(k["tiling"]),
            tile_loops=[TileLoop(l["induction_var"], l["start"], l["end"], l.get("step", 1),
                                 l.get("parallel", False), l.get("within"), l.get("per_block"))
                        for l in k["tile_loops"]],
            body=[_body_op(o) for o in k["body"]],
            requirements=dict(k["requirements"]), hints=dict(k["hints"]), epilogue=list(k.get("epilogue", [])),
            inputs=list(k["inputs"]), outputs=list(k["outputs"]), depends_on=list(k["depends_on"]),
        )
        for k in body["kernels"]
    ]
    program = Program(body["name"], body["source"], body["target"], g, kernels)
    validate_program(program, where)
    return program
