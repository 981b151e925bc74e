"""The `.kpu` object file: deterministic JSON with a header, a checksummed body and a schema.

Layout: {"format", "format_version", "dfx_version", "producer", "sha256", "body"}; `sha256`
is over the body serialised with sorted keys, so any edit to the body is caught.

Most of a model's object is its constants' values in base64 (GPT-2's 497 MB of weights make 663
MB of its file). Each is encoded once, then written, hashed and decoded as it is: the document is
serialised around the values (`_around`), never as one copy of the whole body, and the sha256
runs in a thread of its own beside the base64 (`_Sha256`).
"""

from __future__ import annotations

import binascii
import dataclasses
import hashlib
import json
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

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
def _written_fields(cls: type) -> tuple[tuple[str, Any], ...] | None:
    """The fields of a dataclass type (None for another type), each with the value at which it is
    left out besides None (its default where its metadata says `omit_default`), asked once per
    type: a program holds hundreds of thousands of dataclass instances."""
    if not dataclasses.is_dataclass(cls):
        return None
    fields = dataclasses.fields(cls)
    assert all(f.default is not dataclasses.MISSING for f in fields if f.metadata.get("omit_default")), cls
    return tuple((f.name, f.default if f.metadata.get("omit_default") else None) for f in fields)


def _plain(value: Any) -> Any:
    """Dataclasses to dicts, dropping fields left at None (or at a default they are left out at)
    so the file stays small; an infinite float as its NON_FINITE string."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    names = _written_fields(type(value))
    if names is not None:
        return {name: _plain(v) for name, omitted in names
                if (v := getattr(value, name)) is not None and (omitted is None or v != omitted)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def program_body(program: Program) -> dict[str, Any]:
    """The body, each constant's value the mark of its place (`_marks`), where `encode` writes
    its base64."""
    g = program.graph
    return {
        "name": program.name,
        "source": program.source,
        "target": program.target,
        # the default objective is left out, so an object compiled without one is as it always was
        **({"objective": program.objective} if program.objective != "latency" else {}),
        "graph": {
            "tensors": [_plain(t) for t in g.tensors.values()],
            "ops": [_plain(o) for o in g.ops],
        },
        "constants": _marks(sorted(g.constants), quote=b'"'),
        "kernels": [_plain(k) for k in program.kernels],
        # left out when there are none, so an object without chains is as it was before them
        **({"chains": program.chains} if program.chains else {}),
    }


def _marks(names: Iterable[str], quote: bytes = b"") -> dict[str, orjson.Fragment]:
    """A mark in place of each named value, numbered in order: orjson writes a Fragment as it is
    and never writes a NUL byte of its own (it escapes one in a string), so its serialisation of
    a document splits at the marks (`_around`). `quote` around the mark makes it a string's."""
    return {name: orjson.Fragment(b"%s\0%d\0%s" % (quote, i, quote)) for i, name in enumerate(names)}


def _around(document: Any, option: int) -> tuple[list[bytes], list[int]]:
    """orjson's serialisation of a document holding marks (`_marks`): the text before, between
    and after the marked values, and the number of each value in the order they are written."""
    parts = orjson.dumps(document, option=option).split(b"\0")
    return parts[::2], [int(i) for i in parts[1::2]]


class _Sha256:
    """A sha256 taken in a thread of its own: hashlib lets go of the GIL while it hashes, base64
    and orjson do not, so on two cores one piece is hashed while the caller makes the next. A
    piece is handed over once the thread can take it (else the thread would wait for the GIL
    until the caller's next base64 is done); pieces under HANDED bytes are gathered first, as a
    hand-over costs tens of microseconds. The digest is read after the `with` block."""

    HANDED = 1 << 20

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._pieces: queue.SimpleQueue[bytes | bytearray | None] = queue.SimpleQueue()
        self._taken = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._gathered = bytearray()
        self._error: BaseException | None = None  # raised by the hashing, given to the caller at the end

    def _run(self) -> None:
        # every piece is taken, even after an error, so that a caller handing one never waits forever
        while (piece := self._pieces.get()) is not None:
            self._taken.release()
            if self._error is None:
                try:
                    self._hash.update(piece)
                except BaseException as e:  # noqa: BLE001 (MemoryError, say): the caller's to raise
                    self._error = e

    def __enter__(self) -> _Sha256:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hand_gathered()
        self._pieces.put(None)
        self._thread.join()

    def _hand(self, piece: bytes | bytearray) -> None:
        self._pieces.put(piece)
        self._taken.acquire()

    def _hand_gathered(self) -> None:
        if self._gathered:
            self._hand(self._gathered)
            self._gathered = bytearray()

    def update(self, piece: bytes) -> None:
        if len(piece) >= self.HANDED:
            self._hand_gathered()
            self._hand(piece)
            return
        self._gathered += piece
        if len(self._gathered) >= self.HANDED:
            self._hand_gathered()

    def hexdigest(self) -> str:
        if self._error is not None:
            raise self._error
        return self._hash.hexdigest()


@dataclasses.dataclass
class Encoded:
    """An object file as `encode` makes it: its text around its constants' values (`texts`, one
    more than the values) and the values, base64, in the order they are written."""

    texts: list[bytes]
    values: list[bytes]

    def pieces(self) -> Iterator[bytes]:
        for text, value in zip(self.texts, self.values):
            yield text
            yield value
        yield self.texts[-1]

    def write(self, file: BinaryIO) -> None:
        for piece in self.pieces():
            file.write(piece)

    def skeleton(self) -> bytes:
        """The file with each constant's value an empty string: all `read_back` reads."""
        return b"".join(self.texts)


def _document(sha256: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dfx_version": DFX_VERSION,
        "producer": PRODUCER,
        "sha256": sha256,
        "body": body,
    }


def encode(program: Program) -> Encoded:
    """The object file of `program`: its body is hashed as it is serialised with sorted keys,
    each constant encoded while the text and value before it are hashed."""
    body = program_body(program)
    raw = [program.graph.constants[name] for name in body["constants"]]  # by the marks' numbers
    values: list[bytes] = [b""] * len(raw)
    texts, order = _around(body, orjson.OPT_SORT_KEYS)
    with _Sha256() as sha:
        for text, i in zip(texts, order):
            values[i] = binascii.b2a_base64(raw[i], newline=False)
            sha.update(text)
            sha.update(values[i])
        sha.update(texts[-1])
    texts, order = _around(_document(sha.hexdigest(), body), orjson.OPT_INDENT_2)
    texts[-1] += b"\n"
    return Encoded(texts, [values[i] for i in order])


def _digest(body: dict[str, Any], each: Callable[[str, Any], None] = lambda name, value: None) -> str:
    """sha256 of the body serialised with sorted keys, each constant's value serialised alone (a
    model's body is not copied whole); each(name, value) is called on each constant's value
    while it is hashed."""
    values = body.get("constants")
    names = list(values) if isinstance(values, dict) else []
    texts, order = _around({**body, "constants": _marks(names)} if names else body, orjson.OPT_SORT_KEYS)
    with _Sha256() as sha:
        for text, i in zip(texts, order):
            value = values[names[i]]
            piece = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
            sha.update(text)
            sha.update(piece)
            each(names[i], value)
        sha.update(texts[-1])
    return sha.hexdigest()


def dumps(program: Program) -> bytes:
    return b"".join(encode(program).pieces())


def write(program: Program, path: str | Path) -> None:
    """Write atomically: a failure never leaves a partial object behind (OutputError if it fails)."""
    with OutputFiles() as out:
        out.stage(out.claim(path), encode(program).write)
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


def _parse(data: bytes, where: str) -> dict[str, Any]:
    """An object's document: its JSON, its header checked."""
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
    return obj


def _from_base64(value: Any) -> bytes | None:
    """The bytes a constant's value holds, None unless it is a string of strict base64 (as
    base64.b64decode(validate=True) decides, which would copy the string first)."""
    if not isinstance(value, str):
        return None
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except ValueError:  # binascii.Error, or a character outside ASCII
        return None


def _program_of(obj: dict[str, Any], where: str, written: dict[str, bytes] | None = None) -> Program:
    """The program of a parsed document, every check made (ObjectFileError). `written`: the
    constants' bytes its writer encoded into it (`read_back`), taken instead of its values, whose
    digest the writer took a moment ago."""
    _bounds_error(where, obj)
    body = obj.get("body")
    decoded: dict[str, bytes | None] = {}  # None: not base64, refused once the schema has had its say

    def decode(name: str, value: Any) -> None:  # while the value is hashed
        decoded[name] = _from_base64(value)

    if not isinstance(body, dict) or written is None and _digest(body, decode) != obj.get("sha256"):
        raise ObjectFileError(f"{where}: sha256 mismatch: the body was modified or corrupted")
    _schema_error(where, obj)
    # as the body lists them
    constants = {name: (decoded if written is None else written)[name] for name in body["constants"]}
    if None in constants.values():
        raise ObjectFileError(f"{where}: body/constants: a value is not valid base64")
    return _program(body, constants, where)


def loads(data: bytes, where: str = "<object>") -> Program:
    return _program_of(_parse(data, where), where)


def read_back(encoded: Encoded, program: Program, where: str) -> Program:
    """What the loader makes of `encoded`, the object file of `program`, refusing it where the
    loader would (ObjectFileError): for its writer, so that an object the loader would refuse is
    never written. Every check is made but those that writing it made true: its digest, taken
    over these very values a moment ago, and their base64, encoded from the program's constants,
    which are taken as they are."""
    return _program_of(_parse(encoded.skeleton(), where), where, program.graph.constants)


# An object carries its constants' bytes in base64 (4/3 of them): an ONNX model of up to 2 GB of
# initializers makes an object of under 3 GB, the rest of the file grows with the graph alone.
MAX_OBJECT_BYTES = 4 * GB


def read(path: str | Path) -> Program:
    return _read(path, hash_file=False)[0]


def read_hashed(path: str | Path) -> tuple[Program, str]:
    """read(path), and the sha256 of the file's bytes as read (what names the object in the
    binding cache), taken beside their parsing."""
    return _read(path, hash_file=True)


def _read(path: str | Path, hash_file: bool) -> tuple[Program, str]:
    """The program of the file at `path`, and the sha256 of its bytes (of none unless `hash_file`)."""
    try:
        data = read_input_file(path, "kpu object file", MAX_OBJECT_BYTES)
    except InputFileError as e:
        raise ObjectFileError(str(e)) from None
    with _Sha256() as sha:
        if hash_file:
            sha.update(data)  # hashed beside the parsing
        obj = _parse(data, str(path))
    del data  # let go once parsed: a model's object is as large as its weights
    return _program_of(obj, str(path)), sha.hexdigest()


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
                        fill=NON_FINITE.get(d.get("fill"), d.get("fill")), when=d.get("when"), **place)
    if d["type"] == "COMPUTE":
        return Compute(d["op_id"], d["compute_type"], [_tile_ref(i) for i in d["inputs"]],
                       _tile_ref(d["output"]), accumulate=d.get("accumulate", "false"), depth=d.get("depth", 1),
                       **place)
    return Barrier(d["op_id"], list(d["wait_for"]), d.get("kernel"), **place)


def _program(body: dict[str, Any], constants: dict[str, bytes], where: str) -> Program:
    g = Graph(body["name"])
    for t in body["graph"]["tensors"]:
        if t["name"] in g.tensors:  # the graph holds one tensor per name: a second would replace the first
            raise ObjectFileError(f"{where}: tensor '{t['name']}': listed twice in the graph")
        g.tensors[t["name"]] = Tensor(t["name"], tuple(t["shape"]), t["dtype"], t["role"], t.get("home"),
                                      t.get("ring"), t.get("ring_dim", 1))
    for o in body["graph"]["ops"]:
        g.ops.append(Op(o["name"], o["op_type"], list(o["inputs"]), list(o["outputs"]),
                        {k: _numbers(v) for k, v in o.get("attrs", {}).items()}, o.get("source", "")))
    g.constants = constants
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
    program = Program(body["name"], body["source"], body["target"], g, kernels, body.get("objective", "latency"),
                      [list(chain) for chain in body.get("chains", [])])
    validate_program(program, where)
    return program
