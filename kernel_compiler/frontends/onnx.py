"""Frontend for ONNX models (`.onnx`), read with the `onnx` package (imported here on first use,
so `kpu-kernel-compiler --help` and the other frontends never load it).

Loading: the bytes parse as a ModelProto; tensors whose data lives in external files are read
from regular files in the model's folder, exactly the bytes their elements take (2 GB in all at
most); onnx's shape inference runs (strict, with data propagation: it checks each node against
its op's schema), which gives every value its element type, on the model without its external
weights. Opsets 11 up to the newest the installed package knows are read; a model of opset 7 to
10 is first upgraded to 11 in memory by onnx's version converter, with a warning (a node it cannot
upgrade is refused by name; an Upsample or a Resize of opset 10 keeps its own mapping of positions,
which the converter drops). Op types outside the table of onnx_ops.py, or of another domain, are
refused all in one line, each with its count of nodes and its first node; a node's attribute its
op's schema (at the model's opset) does not define, or of another type, is refused naming the node,
and so is a value PRECHECKS finds wrong.

Values keep their ONNX names: graph inputs, node outputs and graph outputs alike. Initializers
(an initializer also listed as a graph input is a constant with a default: a constant) and the
results of Constant nodes are values known here. Such a value becomes a graph constant, its
bytes in `graph.constants` and so in the object, only when an op reads it as data: int64 tensors
read as shapes, axes, indices, split sizes or bounds are consumed here and never reach the
graph. Constant folding: a node whose inputs are all known values is evaluated here. One that
moves values (Reshape, Transpose, Slice, Gather, ...), computes integers (shape arithmetic, in
ONNX's own int64) or reads a tensor of no elements (a graph input with a dimension of 0 is such
a known value: a reduction over it gives its identity) runs in onnx's reference evaluator, as do
the fold-only op types (FOLD_ONLY in onnx_ops.py: Range, ScatterND), which are refused naming
the node where an input is not known; Shape, Size and EyeLike read only their input's shape.
Any other (float) computation folds as its mapping emits registry ops, each computed by the
registry's reference, as the KPU would. A result's elements are counted before
it is computed: past FOLD_LIMIT a mapped op stays as ops on the KPU, a fold-only one is refused
in one line; a result of no elements is known without computing it. Identity and Dropout
(inference: its mask, where read, all true) vanish: their output names their input (a graph
output gets a copy). Dynamic dimensions (`dim_param`, or no value) read as 1, with a warning.

Dtypes (`ELEMENT_TYPES`): each ONNX element type the DFX contract holds maps onto it, BOOL onto
u8 (as TOSA's i1 in the `.dfg` frontend). INT64, UINT32 and UINT64 data are held in i32, with a
warning: a constant must fit (checked here), an `--input` too (the loader checks every value).
Graph inputs and constants of a narrow type DFX lacks (the other float8s, float4, int4, int2)
are widened exactly, to f32 or i8/u8; no op may produce one.

Each node maps onto registry ops through a `Node` (below), one small function per op type in
onnx_ops.py; the registry's shape rules give every result's shape as it is emitted, so a
mapping sees real shapes, and a ShapeError becomes a one-line CompileError naming the node.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dfx.dtypes import is_integer, numpy_dtype
from dfx.graph import Graph, Op, Tensor, shape_problem
from dfx.input_files import GB, KB, InputFileError, read_input_slice, shown_path, size_words
from dfx.ops import ShapeError, lookup

from ..errors import CompileError

MIN_OPSET = 11  # read natively; from MIN_UPGRADED_OPSET up, a model is upgraded to it first
MIN_UPGRADED_OPSET = 7
# the unsupported op types a refusal names, the most common first
UNMAPPED_SHOWN = 8
DEFAULT_DOMAINS = ("", "ai.onnx")
# a node whose inputs are all known is evaluated by onnx's reference evaluator if it only moves
# values, computes integers or is fold-only; a result of more elements than this stays as ops, or
# is refused if fold-only (a fuzzed model must not make the compiler allocate gigabytes)
MOVES_VALUES = frozenset({"Constant", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                          "Concat", "Split", "Slice", "Gather"})
FOLD_LIMIT = 1 << 24


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis], indices), axis)


# op type -> its evaluation on known values where onnx's reference evaluator gets it wrong: its
# GatherElements picks through np.choose, which fails for indices of a shape other than the data's
NUMPY_FOLDS = {"GatherElements": _gather_elements}
# The data a model's tensors keep in external files, all together: what the model could hold
# inline, as its constants travel base64 in the object.
MAX_EXTERNAL_BYTES = 2 * GB
# The tensors shape inference sees with their data: integers of any size (shapes, axes, and the
# indices it propagates through Gather, Slice or Cast) and the others of up to this many bytes (a
# Resize's scales). The rest, external or inline raw data, join its result, so it never serializes
# the weights (GPT-2 as the legacy exporter writes it, 650 MB inline: serializing them took 5.4 s
# of a profiled compile of 18.8).
INFERENCE_READS = frozenset({"INT32", "INT64"})
INFERENCE_READS_BYTES = 64 * KB
# element types whose raw data packs elements below a byte (bits each)
PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}

# ONNX TensorProto element type (by name) -> DFX dtype
ELEMENT_TYPES = {"FLOAT": "f32", "FLOAT16": "f16", "DOUBLE": "f64", "BFLOAT16": "bf16", "FLOAT8E4M3FN": "f8",
                 "INT8": "i8", "INT16": "i16", "INT32": "i32", "UINT8": "u8", "BOOL": "u8"}
# held in i32: the values must fit (the registry has no 64-bit or unsigned 32-bit integer)
NARROWED = {"INT64": "i32", "UINT32": "i32", "UINT64": "i32"}
# graph inputs and constants only, widened to a DFX type that holds every value exactly
WIDENED = {"UINT16": "i32", "FLOAT8E4M3FNUZ": "f32", "FLOAT8E5M2": "f32", "FLOAT8E5M2FNUZ": "f32",
           "FLOAT8E8M0": "f32", "FLOAT4E2M1": "f32", "INT4": "i8", "UINT4": "u8", "INT2": "i8", "UINT2": "u8"}


def parse_onnx(path: str, data: bytes) -> tuple[Graph, list[str]]:
    """Parse an ONNX model's bytes (the file `path`, which names it in messages) into a graph and
    warning lines."""
    warnings: list[str] = []
    model = _load(path, data, warnings)
    graph = _Builder(path, model, warnings).build()
    return graph, warnings


# ---- loading ----------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """An exception of the onnx package as one short line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _load(path: str, data: bytes, warnings: list[str]) -> Any:
    import onnx
    from onnx import external_data_helper

    fail = lambda reason: CompileError(f"{path}: {reason}")  # noqa: E731
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError and whatever a damaged file makes it raise
        raise fail(f"not an ONNX model: {_reason(exc)}") from None
    if not model.HasField("graph"):
        raise fail("not an ONNX model: it has no graph")
    if not _text_fields_are_text(model):
        raise fail("not an ONNX model: a name or op type is not UTF-8 text")
    model = _check_ops(path, model, warnings)
    # external data is read (bounded) before shape inference, which runs on the model as bytes:
    # only the tensors it may read are in the model it sees (`INFERENCE_READS`), the weights,
    # external or inline raw data, held aside to join its result
    tensors = list(external_data_helper._get_all_tensors(model))
    held = _read_external_data(path, tensors)
    for i in [i for i, data in held.items() if _inference_reads(tensors[i], data)]:
        _attach(tensors[i], held.pop(i))
    for i, tensor in enumerate(tensors):
        if i not in held and tensor.HasField("raw_data"):
            data = tensor.raw_data
            if not _inference_reads(tensor, data):
                held[i] = data
                _detach(tensor)
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise fail(f"shape inference: {_reason(exc)}") from None
    tensors = list(external_data_helper._get_all_tensors(model))  # the same tensors, in the same order
    for i in list(held):
        _attach(tensors[i], held.pop(i))
    return model


def _read_external_data(path: str, tensors: list[Any]) -> dict[int, bytes]:
    """The external data of each tensor that has some, by its index in `tensors`: exactly the
    bytes its elements take, from `offset`, read from a regular file inside the model's folder;
    all together at most MAX_EXTERNAL_BYTES."""
    from onnx import TensorProto, external_data_helper

    folder = Path(path).resolve().parent
    read: dict[int, bytes] = {}
    total = 0
    for i, tensor in enumerate(tensors):
        if not external_data_helper.uses_external_data(tensor):
            continue
        where = f"{path}: tensor '{_clip(tensor.name)}'"
        entries = {e.key: e.value for e in tensor.external_data}
        if not all(isinstance(v, str) for v in (*entries, *entries.values())):
            raise CompileError(f"{where}: its external data entries are not UTF-8 text")
        location = entries.get("location", "")
        if "\0" in location:
            raise CompileError(f"{where}: external data file '{shown_path(location)}': a file name cannot hold "
                               "a NUL character")
        where_file = f"{where}: external data file '{shown_path(location)}'"
        try:
            file = (folder / location).resolve()
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
            raise CompileError(f"{where_file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
        if not file.is_relative_to(folder):
            raise CompileError(f"{where_file} is outside the model's folder {folder}")
        offset, length = (_external_number(where, entries, key) for key in ("offset", "length"))
        needed = _data_bytes(tensor, where)
        if length is not None and length != needed:
            raise CompileError(f"{where}: external data length {length} differs from the {needed} bytes its "
                               f"{math.prod(tensor.dims)} {TensorProto.DataType.Name(tensor.data_type)} "
                               "elements take")
        if total + needed > MAX_EXTERNAL_BYTES:
            raise CompileError(f"{where}: its external data ({size_words(needed)}) would take the model's past "
                               f"the {size_words(MAX_EXTERNAL_BYTES)} the ONNX frontend reads")
        read[i] = _read_slice(where_file, folder, file, offset or 0, needed)
        total += needed
    return read


def _external_number(where: str, entries: dict[str, str], key: str) -> int | None:
    """An external data entry's `offset` or `length`: a whole number of bytes, if given."""
    text = entries.get(key)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        raise CompileError(f"{where}: external data {key} {text!r:.40} is not a number of bytes")
    return int(text)


def _data_bytes(tensor: Any, where: str) -> int:
    """The bytes a tensor's elements take in raw data (4-, 2- and 6-bit types packed)."""
    from onnx import TensorProto, helper

    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED) or (
            tensor.data_type not in TensorProto.DataType.values()):
        raise CompileError(f"{where}: a tensor of element type {tensor.data_type} cannot keep its data in an "
                           "external file")
    if min(tensor.dims, default=0) < 0:
        raise CompileError(f"{where}: dims {list(tensor.dims)[:8]} include a negative one")
    bits = PACKED_BITS.get(TensorProto.DataType.Name(tensor.data_type))
    if bits is None:
        bits = 8 * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return -(-math.prod(tensor.dims) * bits // 8)


def _read_slice(where: str, folder: Path, file: Path, offset: int, size: int) -> bytes:
    """`size` bytes from `offset` of `file`, a regular file (a FIFO or a device is never read)."""
    try:
        return read_input_slice(file, "data", offset, size)
    except InputFileError as exc:
        if exc.kind in ("missing", "folder"):  # a location of "" or "." names the folder itself
            raise CompileError(f"{where} not found in {folder}") from None
        raise CompileError(f"{where}: {'cannot read: not a regular file' if exc.kind else exc.reason}") from None


def _attach(tensor: Any, data: bytes) -> None:
    """The tensor holds `data`, its external data read, as its raw data."""
    from onnx import TensorProto

    tensor.raw_data = data
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def _inference_reads(tensor: Any, data: bytes) -> bool:
    """Whether shape inference sees the tensor with its `data` (`INFERENCE_READS`)."""
    from onnx import TensorProto

    # compared as numbers: a type number no name has is simply not one of them
    integers = {TensorProto.DataType.Value(name) for name in INFERENCE_READS}
    return tensor.data_type in integers or len(data) <= INFERENCE_READS_BYTES


def _detach(tensor: Any) -> None:
    """The tensor without its inline raw data (held aside by the caller): it reads as a tensor
    whose external data is not read yet, until `_attach` puts the data back."""
    from onnx import TensorProto

    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "held aside"


def _text_fields_are_text(model: Any) -> bool:
    """protobuf hands a proto2 string field that is not UTF-8 over as bytes: every name, op type,
    domain and dim label must be text."""
    g = model.graph
    infos = [*g.input, *g.output, *g.value_info]
    fields = [g.name, *(o.domain for o in model.opset_import), *(t.name for t in g.initializer),
              *(i.name for i in infos),
              *(d.dim_param for i in infos for d in i.type.tensor_type.shape.dim),
              *(e for t in g.initializer for x in t.external_data for e in (x.key, x.value))]
    for node in g.node:
        fields += [node.name, node.op_type, node.domain, *node.input, *node.output, *(a.name for a in node.attribute)]
    return all(isinstance(f, str) for f in fields)


def _check_ops(path: str, model: Any, warnings: list[str]) -> Any:
    """Refuse an opset outside 7..newest and every op type the frontend does not map (all in one
    line), upgrade a model below opset 11, and check each node's attributes (PRECHECKS: their
    values too, where onnx's shape inference would choke on them): before shape inference, which
    would word an unknown op its own way. Returns the model, upgraded or not."""
    import onnx

    from .onnx_ops import DOMAIN_OPS, OPS, PRECHECKS

    opsets = {o.domain: o.version for o in model.opset_import}
    version = next((opsets[d] for d in DEFAULT_DOMAINS if d in opsets), None)
    newest = onnx.defs.onnx_opset_version()
    if version is None:
        raise CompileError(f"{path}: the model imports no version of the default ONNX opset")
    if not MIN_UPGRADED_OPSET <= version <= newest:
        raise CompileError(f"{path}: opset {version} is not supported (the ONNX frontend reads opsets "
                           f"{MIN_UPGRADED_OPSET} to {newest}, upgrading those below {MIN_OPSET})")
    # every value is made once (ONNX's single assignment): a second writer would silently win
    made = {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer}
    unmapped: dict[str, list[Any]] = {}  # op type (and its domain if another) -> [its first node, count]
    for i, node in enumerate(model.graph.node):
        for name in node.output:
            if name and name in made:
                raise CompileError(f"{_where(path, node, i)}: output '{_clip(name)}' is already defined (an input, "
                                   "an initializer or an earlier node's output); each value is made once")
            made.add(name)
        if (node.domain, node.op_type) in DOMAIN_OPS:
            continue
        if node.domain not in DEFAULT_DOMAINS:
            kind = f"{_clip(node.op_type)} of domain '{_clip(node.domain)}'"
        elif node.op_type not in OPS:
            kind = _clip(node.op_type)
        else:
            continue
        unmapped.setdefault(kind, [f"'{_clip(node.name, 40)}'" if node.name else f"#{i}", 0])[1] += 1
    if unmapped:
        raise CompileError(_unmapped_message(path, unmapped))
    if version < MIN_OPSET:
        model = _upgrade(path, model, version, warnings)
        version = MIN_OPSET
    schemas: dict[str, Any] = {}  # op type -> its schema at the model's opset
    for i, node in enumerate(model.graph.node):
        if node.domain not in DEFAULT_DOMAINS:
            continue  # onnx has no schema of another domain's op: its mapping reads the attributes
        if node.op_type not in schemas:
            try:
                schemas[node.op_type] = onnx.defs.get_schema(node.op_type, version, "")
            except onnx.defs.SchemaError:
                raise CompileError(f"{_where(path, node, i)}: not an op of opset {version}, which the model "
                                   "imports") from None
        _check_attributes(path, node, i, schemas[node.op_type], version)
        problem = PRECHECKS[node.op_type](node) if node.op_type in PRECHECKS else None
        if problem:
            raise CompileError(f"{_where(path, node, i)}: {problem}")
    return model


def _unmapped_message(path: str, unmapped: dict[str, list[Any]]) -> str:
    """One line naming each op type the frontend does not map, most nodes first (ties by name),
    with its count and first node."""
    ranked = sorted(unmapped.items(), key=lambda item: (-item[1][1], item[0]))
    parts = [f"{kind} ({count} nodes, first {first})" if count > 1 else f"{kind} (1 node: {first})"
             for kind, (first, count) in ranked[:UNMAPPED_SHOWN]]
    if len(ranked) > UNMAPPED_SHOWN:
        parts.append(f"and {len(ranked) - UNMAPPED_SHOWN} more")
    types = f"{len(ranked)} op types are" if len(ranked) > 1 else "1 op type is"
    return f"{path}: {types} not supported by the ONNX frontend: {', '.join(parts)}"


def _upgrade(path: str, model: Any, version: int, warnings: list[str]) -> Any:
    """The model upgraded in memory to MIN_OPSET, the lowest opset the frontend reads natively:
    the fewest of the converter's adapters change it. A model it cannot upgrade is refused naming
    the first node that stops it."""
    import onnx
    from onnx import version_converter

    for i, node in enumerate(model.graph.node):  # the converter words this "No Adapter From Version"
        try:
            onnx.defs.get_schema(node.op_type, version, "")
        except onnx.defs.SchemaError:
            raise CompileError(f"{_where(path, node, i)}: not an op of opset {version}, which the model "
                               "imports") from None
    try:
        upgraded = version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        # the converter's messages name no node (and may carry its source file): the node is the
        # last of the shortest prefix of the graph that fails to convert
        lines = [line.strip() for line in str(exc).split(" failed: ")[-1].splitlines() if line.strip()]
        reason = _clip(lines[0] if lines else type(exc).__name__, 200)
        i = _first_unconvertible(model)
        where = path if i is None else _where(path, model.graph.node[i], i)
        raise CompileError(f"{where}: cannot be upgraded from opset {version} to {MIN_OPSET}: {reason}") from None
    _keep_legacy_resizes(path, model, upgraded)
    warnings.append(f"{path}: opset {version} upgraded to opset {MIN_OPSET} in memory (the ONNX frontend reads "
                    f"opsets {MIN_OPSET} and newer natively)")
    return upgraded


def _keep_legacy_resizes(path: str, model: Any, upgraded: Any) -> None:
    """Upsample (opsets 7 to 9) and Resize of opset 10 map an output back onto the input at
    x / scale and take the nearest input below it (onnxruntime: above it where a dim shrinks);
    the converter's Resize of opset 11 is left with that op's defaults (half_pixel,
    round_prefer_floor), so their meaning is written into its attributes."""
    from onnx import external_data_helper, helper, numpy_helper

    legacy = {node.output[0]: (i, node) for i, node in enumerate(model.graph.node)
              if node.op_type in ("Upsample", "Resize") and node.output}
    resizes = [node for node in upgraded.graph.node
               if node.op_type == "Resize" and node.output and node.output[0] in legacy]
    wanted = {node.input[2] for node in resizes if len(node.input) > 2}
    tensors = {t.name: t for t in upgraded.graph.initializer
               if t.name in wanted and not external_data_helper.uses_external_data(t)}
    tensors.update({node.output[0]: node.attribute[0].t for node in upgraded.graph.node
                    if node.op_type == "Constant" and node.output and node.output[0] in wanted
                    and [a.name for a in node.attribute] == ["value"]})
    for node in resizes:
        i, original = legacy[node.output[0]]
        try:  # the scales, where a constant says them (else the mapping refuses them)
            scales = numpy_helper.to_array(tensors[node.input[2]])
        except Exception:
            scales = None
        nearest = "floor"
        if original.op_type == "Resize" and scales is not None and (scales < 1).any():
            modes = [helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"]
            if modes in ([], [b"nearest"]) and (scales > 1).any():
                raise CompileError(f"{_where(path, original, i)}: a nearest Resize of opset 10 that shrinks some "
                                   "dims and grows others is not supported (each rounds its own way)")
            nearest = "ceil"
        node.attribute.extend([helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
                               helper.make_attribute("nearest_mode", nearest)])


def _first_unconvertible(model: Any) -> int | None:
    """The index of the node whose prefix of the graph is the shortest one the converter fails on
    (a binary search: a prefix holding a failing one fails too), or None if none fails."""
    import onnx
    from onnx import version_converter

    def fails(count: int) -> bool:
        prefix = onnx.ModelProto()
        prefix.CopyFrom(model)
        del prefix.graph.node[count:]
        del prefix.graph.output[:]
        prefix.graph.output.extend(onnx.ValueInfoProto(name=o) for o in model.graph.node[count - 1].output if o)
        try:
            version_converter.convert_version(prefix, MIN_OPSET)
        except Exception:
            return True
        return False

    low, high = 1, len(model.graph.node)
    if high == 0 or not fails(high):
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fails(middle) else (middle + 1, high)
    return low - 1


def _check_attributes(path: str, node: Any, index: int, schema: Any, opset: int) -> None:
    """Each attribute of a node is one its op's schema defines at the model's opset, of the type
    it defines, given once; each required one is given. A misspelt attribute (`stride` for
    `strides`) would otherwise read as absent, its default taken."""
    from onnx import AttributeProto

    where = _where(path, node, index)
    given: set[str] = set()
    for attr in node.attribute:
        spec = schema.attributes.get(attr.name)
        if spec is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise CompileError(f"{where}: attribute '{_clip(attr.name)}' is not one of {node.op_type}'s in opset "
                               f"{opset} (those are: {known})")
        if attr.name in given:
            raise CompileError(f"{where}: attribute '{attr.name}' is given twice")
        if attr.type != int(spec.type):
            got = (AttributeProto.AttributeType.Name(attr.type) if attr.type in AttributeProto.AttributeType.values()
                   else str(attr.type))
            raise CompileError(f"{where}: attribute '{attr.name}' must be of type {spec.type.name}, got {got}")
        given.add(attr.name)
    missing = sorted(name for name, spec in schema.attributes.items() if spec.required and name not in given)
    if missing:
        raise CompileError(f"{where}: required attribute '{missing[0]}' is missing")


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())  # one line, whatever the name holds
    if not text.isprintable():  # a NUL or a control character, shown escaped
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(path: str, node: Any, index: int) -> str:
    """`<file>: node '<name>' (<OpType>)`; an unnamed node is called by its position."""
    name = f"'{_clip(node.name)}'" if node.name else f"#{index}"
    return f"{path}: node {name} ({_clip(node.op_type)})"


def dfx_dtype(elem_type: int, where: str, role: str = "result") -> tuple[str, str | None]:
    """(DFX dtype, the ONNX type's name if it is held narrowed or widened) of an ONNX element
    type; `role` "result" refuses the types only a graph input or constant may have."""
    from onnx import TensorProto

    name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    if name in ELEMENT_TYPES:
        return ELEMENT_TYPES[name], None
    if name in NARROWED:
        return NARROWED[name], name
    if name in WIDENED and role == "value":
        return WIDENED[name], name
    raise CompileError(f"{where}: element type {name} has no DFX dtype")


# ---- the builder ------------------------------------------------------------------------------


class _Builder:
    """Walks the nodes in order and emits registry ops into `graph`."""

    def __init__(self, path: str, model: Any, warnings: list[str]):
        self.path, self.model, self.warnings = path, model, warnings
        g = model.graph
        self.graph = Graph(_clip(g.name, 200) or Path(path).stem)
        self.opset = next(o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS)
        self.values: dict[str, np.ndarray] = {}  # known values, in their ONNX numpy dtypes
        self.elem_types: dict[str, int] = {}  # ONNX element type of every value shape inference typed
        self.static: dict[str, tuple[int, ...]] = {}  # the values shape inference found a static shape for
        for info in [*g.input, *g.value_info, *g.output]:
            if info.type.HasField("tensor_type"):
                tensor_type = info.type.tensor_type
                self.elem_types[info.name] = tensor_type.elem_type
                dims = tensor_type.shape.dim
                if tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
                    self.static[info.name] = tuple(d.dim_value for d in dims)
        self.outputs = [o.name for o in g.output]
        self.output_names = set(self.outputs)
        self.constant_of_output: dict[str, str] = {}  # a known value that is a graph output -> its constant
        self.last_reader = {t: i for i, n in enumerate(g.node) for t in n.input}  # value -> the last node reading it
        self.taken: set[str] = {o.name for o in g.output} | {i.name for i in g.input} | {
            t.name for t in g.initializer} | {t for n in g.node for t in [*n.input, *n.output] if t}
        self.fresh_count: dict[str, int] = {}  # a base name -> the last number `fresh` gave it
        self.op_names: set[str] = set()
        self.op_name_count: dict[str, int] = {}  # a repeated op name -> the last number it was given
        self.produced: set[str] = set()
        self.aliases: dict[str, str] = {}  # an output of a node that vanished (Identity, Dropout) -> its input
        self.held: dict[str, str] = {}  # graph tensor -> the ONNX type it holds in another DFX one
        self.dynamic: list[str] = []

    def fail(self, reason: str) -> CompileError:
        return CompileError(f"{self.path}: {reason}")

    def build(self) -> Graph:
        from onnx import TensorProto, numpy_helper

        from .onnx_ops import DOMAIN_OPS, OPS

        g = self.model.graph
        for init in g.initializer:
            if init.data_type not in TensorProto.DataType.values():
                raise self.fail(f"initializer '{_clip(init.name)}': element type {init.data_type} is none ONNX "
                                "defines")
            try:
                self.values[init.name] = numpy_helper.to_array(init)
            except Exception as exc:
                raise self.fail(f"initializer '{_clip(init.name)}': {_reason(exc)}") from None
            self.elem_types[init.name] = init.data_type
        if g.sparse_initializer:
            raise self.fail("sparse initializers are not supported")
        used = {t for n in g.node for t in n.input} | set(self.outputs)
        for info in g.input:
            if info.name in self.values:
                continue  # an initializer with a default: a constant
            if info.name not in used:
                self.warnings.append(f"{self.path}: input '{_clip(info.name)}' is not used by any node; skipped")
                continue
            self.add_input(info)
        for i, proto in enumerate(g.node):
            node = Node(self, proto, i)
            if not self.fold(node):
                (OPS[proto.op_type] if proto.domain in DEFAULT_DOMAINS else DOMAIN_OPS[proto.domain, proto.op_type])(node)
            for k, name in enumerate(proto.output):
                if name and name not in self.produced and name not in self.values and name not in self.aliases and (
                        name in used):
                    raise node.fail(f"output {k} ('{_clip(name)}') is not produced by the ONNX frontend's "
                                    f"mapping of {proto.op_type}")
        self.finish_outputs()
        # the graph's outputs in the model's order (Graph.outputs lists them in the tensors' order)
        tensors = self.graph.tensors
        self.graph.tensors = {**{k: t for k, t in tensors.items() if t.role != "output"},
                              **{k: tensors[k] for k in dict.fromkeys(self.outputs)}}
        self.report()
        return self.graph

    # -- values and tensors

    def add_input(self, info: Any) -> None:
        where = f"{self.path}: input '{_clip(info.name)}'"
        if not info.type.HasField("tensor_type"):
            raise CompileError(f"{where}: only tensor inputs are supported")
        tensor_type = info.type.tensor_type
        dtype, held = dfx_dtype(tensor_type.elem_type, where, role="value")
        if not tensor_type.HasField("shape"):
            raise CompileError(f"{where}: has no shape (its rank is needed)")
        shape = []
        for k, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                shape.append(dim.dim_value)
            else:
                shape.append(1)
                label = f"'{_clip(dim.dim_param, 40)}'" if dim.dim_param else "unknown"
                self.dynamic.append(f"'{_clip(info.name, 40)}' dim {k} ({label})")
        if math.prod(shape) == 0:  # no values to give: known as it is, and what it feeds is evaluated here
            from onnx import helper

            self.values[info.name] = np.zeros(shape, helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
            self.warnings.append(f"{where}: has no elements ({shape}); taken as a known empty tensor")
            return
        self.add_tensor(info.name, tuple(shape), dtype, "input", where)
        if held:
            self.held[info.name] = held

    def add_tensor(self, name: str, shape: tuple[int, ...], dtype: str, role: str, where: str) -> None:
        problem = shape_problem(shape)
        if problem:
            raise CompileError(f"{where}: {problem}")
        self.graph.tensors[name] = Tensor(name, tuple(int(d) for d in shape), dtype, role)

    def fresh(self, base: str) -> str:
        """A name not taken: `base`, else the first free `base.<k>`, counting on from the last one given."""
        name = base
        if name in self.taken:
            k = self.fresh_count.get(base, 0) + 1
            while f"{base}.{k}" in self.taken:
                k += 1
            self.fresh_count[base] = k
            name = f"{base}.{k}"
        self.taken.add(name)
        return name

    def materialize(self, name: str, where: str) -> str:
        """The graph tensor of a value: a known value becomes a graph constant with its bytes (under
        another name if it is a graph output, which keeps the ONNX name for the copy of it)."""
        if name in self.graph.tensors:
            return name
        if name in self.constant_of_output:
            return self.constant_of_output[name]
        if name not in self.values:
            raise CompileError(f"{where}: input '{_clip(name)}' is not computed by any node before it")
        dtype, held = dfx_dtype(self.value_type(name), f"{where}: constant '{_clip(name)}'", role="value")
        tensor = name
        if name in self.output_names:
            tensor = self.constant_of_output[name] = self.fresh(f"{name}.value")
        self.add_constant(tensor, self.values[name], dtype, where)
        if held:
            self.held[name] = held
        return tensor

    def add_constant(self, name: str, value: np.ndarray, dtype: str, where: str) -> None:
        target = numpy_dtype(dtype)
        with np.errstate(all="ignore"):
            converted = np.asarray(value).astype(target)
            if is_integer(dtype):
                exact = bool(np.all(converted.astype(np.int64) == np.asarray(value).astype(np.int64)))
            else:
                exact = True  # float constants of a narrow type widen exactly; DFX's own are as given
        if not exact:
            raise CompileError(f"{where}: constant '{_clip(name)}' holds values that {dtype}, the type it would "
                               "be held in, cannot hold exactly")
        self.add_tensor(name, converted.shape, dtype, "constant", where)
        self.graph.set_constant(name, converted)

    def value_type(self, name: str) -> int:
        """The ONNX element type of a known value."""
        from onnx import helper

        elem_type = self.elem_types.get(name)
        return elem_type if elem_type else helper.np_dtype_to_tensor_dtype(self.values[name].dtype)

    def dtype_of(self, name: str, where: str) -> str:
        """The DFX dtype of a graph tensor, or that a known value will have."""
        if name in self.graph.tensors:
            return self.graph.tensors[name].dtype
        return dfx_dtype(self.value_type(name), f"{where}: constant '{_clip(name)}'", role="value")[0]

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.graph.tensors:
            return self.graph.tensors[name].shape
        return tuple(int(d) for d in self.values[name].shape)

    # -- compile-time evaluation

    def fold(self, node: Node) -> bool:
        """Evaluate a node here, whether it did: a node whose results have no elements; Shape, Size
        and EyeLike, from their input's shape; a node whose inputs are all known (onnx's reference
        evaluator) if it is fold-only, moves values, computes integers or reads an empty tensor.
        A float computation on known values folds as its mapping emits registry ops (`emit`)."""
        from .onnx_ops import FOLD_ONLY

        proto = node.proto
        outputs = [t for t in proto.output if t]
        if outputs and all(t in self.static and math.prod(self.static[t]) == 0 for t in outputs):
            from onnx import helper

            for t in outputs:  # no elements: nothing to compute
                self.values[t] = np.zeros(self.static[t], helper.tensor_dtype_to_np_dtype(self.elem_types[t]))
            return True
        if proto.op_type in ("Shape", "Size") and outputs:
            shape = node.shape(0)
            self.values[outputs[0]] = np.array(
                math.prod(shape) if proto.op_type == "Size"
                else shape[node.int_attr("start", 0):node.int_attr("end", len(shape))], np.int64)
            return True
        if proto.op_type == "EyeLike" and outputs:  # ones on a diagonal of its input's shape, its values unread
            from onnx import helper

            shape = node.shape(0)
            if math.prod(shape) > FOLD_LIMIT:  # 2-D: onnx's shape inference sees to that
                raise node.fail(f"its result would hold {math.prod(shape):,} elements, more than the "
                                f"{FOLD_LIMIT:,} the ONNX frontend folds at compile time")
            elem_type = node.int_attr("dtype") or self.value_type(node.name(0))
            self.values[outputs[0]] = np.eye(*shape, k=node.int_attr("k", 0),
                                             dtype=helper.tensor_dtype_to_np_dtype(elem_type))
            return True
        inputs = [t for t in proto.input if t]
        if not all(t in self.values for t in inputs):
            return False
        fold_only = proto.op_type in FOLD_ONLY
        integral = all(self.elem_types.get(t) is not None and _integral(self.elem_types[t])
                       for t in proto.output if t)
        empty = any(self.values[t].size == 0 for t in inputs)  # nothing for the KPU to read
        if not (fold_only or proto.op_type in MOVES_VALUES or integral or empty):
            return False
        count = self.result_size(proto)
        read = sum(int(self.values[t].size) for t in inputs)
        if (count or 0) > FOLD_LIMIT or read > FOLD_LIMIT:
            if not fold_only:
                return False  # stays as ops, on the KPU
            what = f"its result would hold {count:,} elements" if (count or 0) > FOLD_LIMIT else (
                f"its inputs hold {read:,} elements")
            raise node.fail(f"{what}, more than the {FOLD_LIMIT:,} the ONNX frontend folds at compile time")
        from onnx import ValueInfoProto, helper
        from onnx.reference import ReferenceEvaluator

        try:
            if proto.op_type in NUMPY_FOLDS:
                attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
                results = [NUMPY_FOLDS[proto.op_type](*(self.values[t] for t in inputs), **attrs)]
            else:
                # the node in a model of the model's opset: the evaluator runs a bare node as of the newest
                graph = helper.make_graph([proto], "fold", [ValueInfoProto(name=t) for t in dict.fromkeys(inputs)],
                                          [ValueInfoProto(name=t) for t in outputs])
                model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
                results = ReferenceEvaluator(model).run(outputs, {t: self.values[t] for t in inputs})
        except Exception as exc:
            raise node.fail(f"cannot evaluate on its constant inputs: {_reason(exc)}") from None
        for name, value in zip(outputs, results):
            if name:
                value = np.asarray(value)
                if value.size > FOLD_LIMIT:
                    raise node.fail(f"result '{_clip(name)}' of {value.size} elements is too large to keep")
                self.values[name] = value
        return True

    def result_size(self, proto: Any) -> int | None:
        """The elements of a node's largest result, told before it is evaluated: from static
        shapes, else from the known inputs of the ops that make a large result of small ones;
        None when neither tells."""
        outputs = [t for t in proto.output if t]
        if outputs and all(t in self.static for t in outputs):
            return max(math.prod(self.static[t]) for t in outputs)
        value = lambda i: self.values[proto.input[i]]  # noqa: E731
        try:
            if proto.op_type == "ConstantOfShape":
                return math.prod(int(d) for d in value(0).reshape(-1))
            if proto.op_type == "Expand":
                return math.prod(np.broadcast_shapes(value(0).shape, tuple(int(d) for d in value(1).reshape(-1))))
            if proto.op_type == "Tile":
                return math.prod(d * int(r) for d, r in zip(value(0).shape, value(1).reshape(-1)))
            if proto.op_type == "Range":
                start, limit, delta = (value(i).item() for i in range(3))
                return max(math.ceil((limit - start) / delta), 0)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError, IndexError):
            return None  # malformed: the evaluator words the problem
        return None

    # -- ops

    def emit(self, node: Node, op_type: str, inputs: list[str], attrs: dict[str, Any], out: str | None,
             dtype: str | None) -> str:
        # a DEQUANTIZE of constants stays an op: the QUANTIZE pass computes with the integers (a
        # quarter of the bytes), and folds it where no integer op takes them
        if op_type != "DEQUANTIZE" and all(t in self.values for t in inputs):
            folded = self.fold_op(node, op_type, inputs, attrs, out, dtype)
            if folded is not None:
                return folded
        names = [self.materialize(t, node.where) for t in inputs]
        opdef = lookup(op_type)
        operands = [self.graph.tensors[t] for t in names]
        try:
            (shape,) = opdef.infer_shapes([t.shape for t in operands], [t.dtype for t in operands],
                                          opdef.normalize_attrs(attrs))
        except ShapeError as exc:
            raise node.fail(str(exc)) from None
        if dtype is None:
            dtype = operands[0].dtype if opdef.family == "layout" else "u8" if opdef.predicate else node.dtype
        if out is None:
            name = self.fresh(f"{node.base}.{op_type.lower()}")
            role = "intermediate"
        else:
            name, role = out, "output" if out in self.output_names else "intermediate"
            self.produced.add(out)
        self.add_tensor(name, tuple(shape), dtype, role, node.where)
        op_name = node.op_name()
        self.graph.ops.append(Op(op_name, op_type, names, [name], dict(attrs), node.where))
        return name

    def fold_op(self, node: Node, op_type: str, inputs: list[str], attrs: dict[str, Any], out: str | None,
                dtype: str | None) -> str | None:
        """A registry op on known values computed here by its reference, on the values as the KPU
        would hold them: the name of its known result; None (an op after all) when the result
        holds more than FOLD_LIMIT elements or an integer value does not fit its DFX dtype."""
        opdef = lookup(op_type)
        dtypes = [self.dtype_of(t, node.where) for t in inputs]
        try:
            normalized = opdef.normalize_attrs(attrs)
            (shape,) = opdef.infer_shapes([self.shape(t) for t in inputs], dtypes, normalized)
        except ShapeError as exc:
            raise node.fail(str(exc)) from None
        if math.prod(shape) > FOLD_LIMIT:
            return None
        arrays = []
        for t, d in zip(inputs, dtypes):
            with np.errstate(all="ignore"):
                held = self.values[t].astype(numpy_dtype(d))
            if is_integer(d) and not np.array_equal(held.astype(np.int64), self.values[t].astype(np.int64)):
                return None  # materialized, it is refused naming the constant
            arrays.append(held)
        if dtype is None:
            dtype = dtypes[0] if opdef.family == "layout" else "u8" if opdef.predicate else node.dtype
        (value,) = opdef.reference(arrays, normalized, [dtype])
        name = out if out is not None else self.fresh(f"{node.base}.{op_type.lower()}")
        self.values[name] = np.asarray(value)
        return name

    def finish_outputs(self) -> None:
        """Every graph output computed by an op: a known value is copied in by a RESHAPE."""
        for name in self.outputs:
            where = f"{self.path}: output '{_clip(name)}'"
            if name in self.produced:
                continue
            tensor = self.graph.tensors.get(name)
            if tensor is not None and tensor.role == "input":
                raise CompileError(f"{where}: is the graph input itself; there is nothing to compute")
            if name not in self.values:
                raise CompileError(f"{where}: is not computed by any node")
            source = self.materialize(name, where)
            tensor = self.graph.tensors[source]
            self.add_tensor(name, tensor.shape, tensor.dtype, "output", where)
            self.graph.ops.append(Op(self.fresh(f"{name}.copy"), "RESHAPE", [source], [name],
                                     {"new_shape": list(tensor.shape)}, where))
            self.produced.add(name)

    def report(self) -> None:
        if self.dynamic:
            self.warnings.append(f"{self.path}: dynamic dimensions read as 1: {', '.join(self.dynamic[:8])}"
                                 + (f" and {len(self.dynamic) - 8} more" if len(self.dynamic) > 8 else ""))
        held = [(t, onnx_type) for t, onnx_type in self.held.items() if t in self.graph.tensors]
        narrowed = [f"'{_clip(t, 40)}' ({o})" for t, o in held if o in NARROWED]
        widened = [f"'{_clip(t, 40)}' ({o})" for t, o in held if o in WIDENED]
        for names, what in ((narrowed, "held in i32, as the registry has no 64-bit or unsigned 32-bit integer "
                                       "(values must fit)"),
                            (widened, "widened exactly to a DFX dtype")):
            if names:
                self.warnings.append(f"{self.path}: {what}: {', '.join(names[:8])}"
                                     + (f" and {len(names) - 8} more" if len(names) > 8 else ""))


def _integral(elem_type: int) -> bool:
    from onnx import TensorProto

    return elem_type in (TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                         TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8,
                         TensorProto.BOOL)


# ---- one node, as the op mappings see it ------------------------------------------------------


class Node:
    """One ONNX node being mapped: its inputs, attributes and outputs, and `emit` to add registry
    ops. Inputs are named by position; `x(i)` is a tensor operand, `value(i)` a known value."""

    def __init__(self, builder: _Builder, proto: Any, index: int):
        self.b, self.proto, self.index = builder, proto, index
        self.op_type = proto.op_type
        self.opset = builder.opset
        self.where = _where(builder.path, proto, index)
        self.base = proto.output[0] if proto.output and proto.output[0] else (proto.name or f"{proto.op_type}_{index}")
        self.ops = 0
        self.attrs = {a.name: a for a in proto.attribute}

    def fail(self, reason: str) -> CompileError:
        return CompileError(f"{self.where}: {reason}")

    # -- attributes

    def attr(self, name: str, default: Any = None) -> Any:
        from onnx import helper

        if name not in self.attrs:
            return default
        try:
            value = helper.get_attribute_value(self.attrs[name])
        except Exception as exc:
            raise self.fail(f"attribute '{name}': {_reason(exc)}") from None
        if value is None:
            raise self.fail(f"attribute '{name}' has no value")
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return list(value) if isinstance(value, (list, tuple)) else value

    def int_attr(self, name: str, default: int | None = None) -> int | None:
        value = self.attr(name, default)
        if value is not None and not isinstance(value, int):
            raise self.fail(f"attribute '{name}' must be an integer, got {value!r:.60}")
        return value

    def ints_attr(self, name: str, default: list[int] | None = None) -> list[int] | None:
        value = self.attr(name, default)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, int) for v in value)):
            raise self.fail(f"attribute '{name}' must be a list of integers, got {value!r:.60}")
        return value

    def str_attr(self, name: str, default: str) -> str:
        value = self.attr(name, default)
        if not isinstance(value, str):
            raise self.fail(f"attribute '{name}' must be a string, got {value!r:.60}")
        return value

    def float_attr(self, name: str, default: float) -> float:
        value = self.attr(name, default)
        if not isinstance(value, (int, float)):
            raise self.fail(f"attribute '{name}' must be a number, got {value!r:.60}")
        return float(value)

    # -- inputs and outputs

    def has(self, i: int) -> bool:
        return i < len(self.proto.input) and bool(self.proto.input[i])

    def name(self, i: int) -> str:
        if not self.has(i):
            raise self.fail(f"input {i} is missing")
        return self.b.aliases.get(self.proto.input[i], self.proto.input[i])

    def x(self, i: int) -> str:
        """Input i as an operand of an op (a known value becomes a graph constant)."""
        return self.name(i)

    def shape(self, i_or_name: int | str) -> tuple[int, ...]:
        name = self.name(i_or_name) if isinstance(i_or_name, int) else i_or_name
        if name not in self.b.graph.tensors and name not in self.b.values:
            raise self.fail(f"input '{_clip(name)}' is not computed by any node before it")
        return self.b.shape(name)

    def rank(self, i: int) -> int:
        return len(self.shape(i))

    def value(self, i_or_name: int | str) -> np.ndarray | None:
        """The known value of input i (or of a tensor), else None."""
        if isinstance(i_or_name, int):
            if not self.has(i_or_name):
                return None
            i_or_name = self.proto.input[i_or_name]
        return self.b.values.get(i_or_name)

    def ints(self, i: int, what: str) -> list[int]:
        """Input i as integers known here (a shape, axes, pads): refused when an op computes it."""
        value = self.value(i)
        if value is None:
            raise self.fail(f"its {what} (input {i}, '{_clip(self.name(i))}') must be a constant: the ONNX frontend "
                            "reads it at compile time")
        if value.dtype.kind not in "iub":
            raise self.fail(f"its {what} (input {i}) must hold integers, got {value.dtype}")
        return [int(v) for v in value.reshape(-1)]

    def out(self, k: int = 0) -> str | None:
        """The name of output k, None when the node does not produce it."""
        outputs = self.proto.output
        return outputs[k] if k < len(outputs) and outputs[k] else None

    def used(self, k: int) -> bool:
        """Whether output k is read by a later node or is a graph output."""
        name = self.out(k)
        if name is None:
            return False
        return name in self.b.output_names or self.b.last_reader.get(name, -1) > self.index

    def out_dtype(self, k: int = 0) -> str | None:
        name = self.out(k)
        elem_type = self.b.elem_types.get(name) if name else None
        if not elem_type:
            return None
        dtype, held = dfx_dtype(elem_type, f"{self.where}: output '{_clip(name)}'")
        if held:
            self.b.held[name] = held
        return dtype

    @property
    def dtype(self) -> str:
        """The dtype of the node's first result: what its intermediate computations produce."""
        dtype = self.out_dtype(0)
        if dtype is None:
            first = next((t for t in self.proto.input if t), None)
            if first is None:
                raise self.fail("cannot tell its result's element type")
            return self.input_dtype(first)
        return dtype

    def input_dtype(self, i_or_name: int | str) -> str:
        name = self.name(i_or_name) if isinstance(i_or_name, int) else i_or_name
        return self.b.dtype_of(name, self.where)

    # -- emitting

    def op_name(self) -> str:
        base = _clip(self.proto.name, 120) or f"{self.op_type.lower()}_{self.index}"
        name = base if self.ops == 0 else f"{base}.{self.ops}"
        self.ops += 1
        if name in self.b.op_names:  # nodes of one name: numbered, counting on from the last one taken
            k = self.b.op_name_count.get(name, 0)
            while f"{name}_{k + 1}" in self.b.op_names:
                k += 1
            self.b.op_name_count[name] = k + 1
            name = f"{name}_{k + 1}"
        self.b.op_names.add(name)
        return name

    def emit(self, op_type: str, inputs: list[str], out: int | None = None, result_dtype: str | None = None,
             **attrs: Any) -> str:
        """Add a registry op reading `inputs` (tensor names); it writes output `out` of the node,
        or else a new intermediate; its result's name. The result's dtype is `result_dtype`, else
        the operand's for a layout op, u8 for a predicate, else the node's result's."""
        if out is not None:
            name = self.out(out)
            if name is None:
                raise self.fail(f"output {out} is missing")
            if result_dtype is None and lookup(op_type).family != "layout":
                result_dtype = self.out_dtype(out)
            return self.b.emit(self, op_type, inputs, attrs, name, result_dtype)
        return self.b.emit(self, op_type, inputs, attrs, None, result_dtype)

    def constant(self, values: Any, dtype: str, step: str = "const") -> str:
        """A new graph constant holding `values` as `dtype`."""
        name = self.b.fresh(f"{self.base}.{step}")
        self.b.add_constant(name, np.asarray(values), dtype, self.where)
        return name

    def scalar(self, value: float | int, like: str) -> str:
        """A constant of one element, of the dtype of tensor `like`, that broadcasts anywhere."""
        return self.constant(np.asarray(value), self.input_dtype(like), "scalar")

    def known(self, values: np.ndarray, step: str) -> str:
        """A new value known here (not yet a graph tensor: it becomes one where an op reads it)."""
        name = self.b.fresh(f"{self.base}.{step}")
        self.b.values[name] = values
        return name

    def alias(self, x: str, out: int = 0) -> None:
        """Output `out` is `x` itself: no op (a graph output gets a copy of it)."""
        name = self.out(out)
        if name is None:
            return
        if name in self.b.output_names:
            self.reshape(x, self.shape(x), out=out)
        elif x in self.b.values:
            self.b.values[name] = self.b.values[x]
        else:
            self.b.aliases[name] = x

    def reshape(self, x: str, shape: tuple[int, ...] | list[int], out: int | None = None) -> str:
        """x under `shape` (same elements): a known value is reshaped here."""
        shape = [int(d) for d in shape]
        if out is None and x in self.b.values and x not in self.b.graph.tensors:
            value = self.b.values[x]
            if math.prod(shape) != value.size:
                raise self.fail(f"cannot reshape {list(value.shape)} to {shape}")
            name = self.known(value.reshape(shape), "reshaped")
            if x in self.b.elem_types:
                self.b.elem_types[name] = self.b.elem_types[x]
            return name
        return self.emit("RESHAPE", [x], out=out, new_shape=shape)

    def transpose(self, x: str, perms: list[int], out: int | None = None) -> str:
        """x with its dims permuted: a known value is transposed here."""
        if out is None and x in self.b.values and x not in self.b.graph.tensors:
            value = self.b.values[x]
            if sorted(perms) != list(range(value.ndim)):
                raise self.fail(f"perm {perms} does not permute the {value.ndim} dims of '{_clip(x)}'")
            name = self.known(np.ascontiguousarray(np.transpose(value, perms)), "transposed")
            if x in self.b.elem_types:
                self.b.elem_types[name] = self.b.elem_types[x]
            return name
        return self.emit("TRANSPOSE", [x], out=out, perms=list(perms))
