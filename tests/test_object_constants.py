"""An object's constants, most of a model's file, are encoded, hashed and decoded as they are
(never through one serialisation of the whole body): the file stays exactly the document the
plain serialisation writes, its digest the sha256 of the body serialised with sorted keys, and
both the loader and the compiler's read-back refuse what the reader refused before."""

from __future__ import annotations

import base64
import hashlib
import random

import numpy as np
import orjson
import pytest

from conftest import CONFIGS, run_cli
from dfx import Graph, ObjectFileError, Op, Tensor, dumps, loads
from dfx.objfile import _digest, _from_base64, encode, read_back
from kernel_compiler.compile import compile_graph
from kernel_compiler.target import load_target

# names that JSON escapes, that sort differently by UTF-16 than by code point, or are empty;
# values whose base64 has no padding, one or two '='
AWKWARD = {'q"uote': b"\x00\x01\x02", "back\\slash": b"\xff", "nul\x00line\n": b"ab", "\uffff": b"",
           "\U0001f600": bytes(range(256)), "": b"abcd", "é": b"z" * 1000}


def program(weights: np.ndarray | None = None):
    """y = x @ w on `standard`, w a constant with values."""
    g = Graph("mm")
    g.tensors["x"] = Tensor("x", (4, 8), "f32", "input")
    g.tensors["w"] = Tensor("w", (8, 4), "f32", "constant")
    g.tensors["y"] = Tensor("y", (4, 4), "f32", "output")
    g.ops.append(Op("mm", "MATMUL", ["x", "w"], ["y"], {}, "test"))
    w = np.arange(32, dtype=np.float32).reshape(8, 4) if weights is None else weights
    g.constants["w"] = w.tobytes()
    return compile_graph(g, "mm.dfg", load_target(str(CONFIGS / "standard.json")))


def plain_sha256(body: dict) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def resealed(obj: dict) -> bytes:
    obj["sha256"] = plain_sha256(obj["body"])
    return orjson.dumps(obj)


def test_the_file_is_the_plain_serialisation_of_its_document():
    p = program()
    p.graph.constants.update(AWKWARD)  # dumps checks nothing: any name and value
    data = dumps(p)
    obj = orjson.loads(data)
    assert obj["body"]["constants"] == {k: base64.b64encode(v).decode() for k, v in p.graph.constants.items()}
    assert obj["sha256"] == plain_sha256(obj["body"])
    assert data == orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n"
    assert data == b"".join(encode(p).pieces())


@pytest.mark.parametrize("constants", [
    {k: base64.b64encode(v).decode() for k, v in AWKWARD.items()},
    {"b": {"z": 1, "a": [2.5, None]}, "a": 7, "c": "not base64 \u2603"},  # any JSON an edited file holds
    {},
    [1, "x"],
    None,
], ids=["base64", "other values", "none", "a list", "null"])
def test_the_readers_digest_is_the_sha256_of_the_sorted_body(constants):
    body = {"target": "t", "constants": constants, "name": "n", "graph": {"ops": [], "tensors": []}}
    seen = []
    assert _digest(body, lambda name, value: seen.append((name, value))) == plain_sha256(body)
    assert sorted(seen) == sorted(constants.items() if isinstance(constants, dict) else [])


def test_base64_is_decided_as_b64decode_validate_decides():
    rng = random.Random(0)
    cases = ["", "QQ==", "QUI=", "QUJD", "QQ=", "Q===", "=QQ=", "QQ==QQ==", "QU JD", "QUJD\n", "QUJ\u00e9",
             "QR==", *("".join(rng.choice("QUJD+/=a- \n\u00e9") for _ in range(rng.randrange(9))) for _ in range(3000))]
    for text in cases:
        try:
            expected = base64.b64decode(text, validate=True)
        except ValueError:
            expected = None
        assert _from_base64(text) == expected, text
    assert _from_base64(12) is None and _from_base64(None) is None


def test_round_trip_keeps_the_constants():
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    assert loads(dumps(program(w))).graph.constants == {"w": w.tobytes()}


def test_a_changed_constant_is_a_checksum_mismatch():
    obj = orjson.loads(dumps(program()))
    obj["body"]["constants"]["w"] = base64.b64encode(bytes(128)).decode()
    with pytest.raises(ObjectFileError, match="^m.kpu: sha256 mismatch"):
        loads(orjson.dumps(obj), "m.kpu")


@pytest.mark.parametrize("value, message", [
    ("AAAA" * 42 + "AA=A", "m.kpu: body/constants: a value is not valid base64"),
    ("AAAA" * 42 + "AAA\u00e9", "m.kpu: body/constants: a value is not valid base64"),
    (12, "m.kpu: body/constants/w: 12 is not of type 'string'"),  # the schema speaks first
])
def test_a_resealed_constant_that_is_not_base64_is_refused(value, message):
    obj = orjson.loads(dumps(program()))
    obj["body"]["constants"]["w"] = value
    with pytest.raises(ObjectFileError) as e:
        loads(resealed(obj), "m.kpu")
    assert str(e.value) == message


def short_constant(p):
    p.graph.constants["w"] = p.graph.constants["w"][:-4]


def constant_of_no_tensor(p):
    p.graph.constants["v"] = b""


def float_tile_extent(p):  # JSON writes 4.0, which the schema's integers refuse
    p.kernels[0].tiling["Ti"] = float(p.kernels[0].tiling["Ti"])


def missing_dependency(p):
    p.kernels[0].body[-1].depends_on.append(999)


@pytest.mark.parametrize("edit", [short_constant, constant_of_no_tensor, float_tile_extent, missing_dependency],
                         ids=lambda f: f.__name__)
def test_the_compilers_read_back_refuses_what_the_loader_refuses(edit):
    p = program()
    edit(p)
    with pytest.raises(ObjectFileError) as loader:
        loads(dumps(p), "m.kpu")
    with pytest.raises(ObjectFileError) as compiler:
        read_back(encode(p), p, "m.kpu")
    assert str(compiler.value) == str(loader.value)


def test_emit_dfx_prints_the_file(gemm_file, tmp_path):
    out = tmp_path / "g.kpu"
    result = run_cli("compiler", gemm_file(32, 16, 8), "-o", out, "--emit-dfx")
    assert result.returncode == 0 and result.stdout.encode() == out.read_bytes()


def test_read_hashed_names_the_object_as_the_binding_cache_did(gemm_file, tmp_path):
    from dfx.objfile import read_hashed
    from hardware import load_machine
    from loader.cache import cache_key

    path = tmp_path / "g.kpu"
    assert run_cli("compiler", gemm_file(32, 16, 8), "-o", path).returncode == 0
    program, sha256 = read_hashed(path)
    assert sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert program == loads(path.read_bytes())
    machine = load_machine(str(CONFIGS / "standard.json"))
    assert cache_key(str(path), machine, None, "greedy", sha256) == cache_key(str(path), machine, None, "greedy")
