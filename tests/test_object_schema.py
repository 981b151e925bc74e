"""The object schema compiled into a predicate (dfx/schema.py) decides as jsonschema does: on
compiled objects of every kind of kernel, and on those objects edited at random."""

from __future__ import annotations

import copy
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CONFIGS, DATA, ROOT, examples
from dfx import dumps
from dfx.objfile import _conforms, strict_validator
from dfx.schema import compile_schema
from kernel_compiler.compile import compile_graph
from kernel_compiler.frontends import load_graph
from kernel_compiler.target import load_target
from test_layout_kernels import CASES
from test_vector_kernels import graph_of

def jsonschema_valid(obj) -> bool:
    return not any(strict_validator().iter_errors(obj))


def _objects() -> list[dict]:
    """A matmul chain (barriers), an MLP with fused epilogues, vector kernels, every layout kernel
    (windows, permutations, fills, GATHER's index tables), and a loop within blocks."""
    target = load_target(str(CONFIGS / "standard.json"))
    graphs = [load_graph(str(p))[0] for p in (ROOT / "examples" / "mlp3.dfg", DATA / "softmax_tosa.dfg",
                                              DATA / "dfg" / "workloads__nla__matmul_8x8_chained.dfg")]
    graphs += [graph_of(ops, {n: (s, "f32") for n, s in shapes.items()}) for ops, shapes, _ in CASES.values()]
    objects = [orjson.loads(dumps(compile_graph(g, "test.dfg", target))) for g in graphs]
    # set here, as whether the compiler keeps a panel in L3 (and loops within its blocks) is its choice
    blocked = copy.deepcopy(objects[0])
    outer, *_, inner = blocked["body"]["kernels"][0]["tile_loops"]
    inner.update(within=outer["induction_var"], per_block=1)
    return [*objects, blocked]


def _places(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _places(v, (*path, i))


OBJECTS = _objects()
KEYS = sorted({path[-1] for obj in OBJECTS for path in _places(obj) if path and isinstance(path[-1], str)})
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 40), st.sampled_from([2**40, 2**40 + 1, -(2**40) - 1]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1.0, 24.0, 0.5]),
    st.sampled_from(["", "L1", "L9", "f32", "LOAD", "COMPUTE", "BARRIER", "DATA_MOVE", "MATMUL_TILE",
                     "tk", "Tk", "0" * 64, "0" * 64 + "\n", "vector"]),
    st.text(max_size=4), st.lists(st.integers(-1, 40), max_size=33), st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.sampled_from(KEYS), st.integers(-1, 2), max_size=3),
)


def test_every_kind_of_compiled_object_conforms():
    features = orjson.dumps(OBJECTS).decode()
    for key in ("offset", "table", "permutation", "fill", "epilogue", "within", "BARRIER"):
        assert f'"{key}"' in features, key  # the objects exercise every branch of the schema
    for obj in OBJECTS:
        assert _conforms()(obj) and jsonschema_valid(obj)


@settings(max_examples=examples(400))
@given(data=st.data())
def test_the_predicate_decides_as_jsonschema_on_edited_objects(data):
    obj = copy.deepcopy(data.draw(st.sampled_from(OBJECTS)))
    for _ in range(data.draw(st.integers(1, 2))):
        *parents, last = data.draw(st.sampled_from([p for p in _places(obj) if p]))
        node = obj
        for key in parents:
            node = node[key]
        edit = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if edit == "delete" and isinstance(node, dict):
            del node[last]
        elif edit == "add" and isinstance(node, dict):
            node[data.draw(st.sampled_from([*KEYS, "unknown"]))] = data.draw(VALUES)
        elif edit == "add":
            node.append(copy.deepcopy(node[last]))
        else:
            node[last] = data.draw(VALUES)
    assert _conforms()(obj) == jsonschema_valid(obj)


@pytest.mark.parametrize("bad, message", [
    ({"type": "string", "format": "date"}, "keyword(s) format not compiled"),
    ({"$ref": "other.json#/x"}, "only '#/$defs/NAME' of the schema is compiled"),
    ({"enum": [[1]]}, "only scalars are compiled"),
])
def test_a_keyword_the_predicate_does_not_know_fails_to_compile(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compile_schema({"type": "object", "properties": {"x": bad}})
