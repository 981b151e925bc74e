"""A JSON Schema compiled into a Python predicate, so that reading a valid object does not
import jsonschema, one of the costliest imports of a loader run.

The predicate decides as jsonschema's Draft 2020-12 validator does, with integers strict (24.0
and true are not integers), for every document orjson can read. It compiles only the keywords
the object schema uses; any other keyword makes compiling fail, so a schema edit cannot be
ignored silently. It only says yes or no: the reader asks jsonschema to word a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

# Keywords that assert nothing.
_ANNOTATIONS = {"$schema", "$id", "$comment", "$defs", "title", "description"}
_COMPILED = {"type", "const", "enum", "$ref", "oneOf", "properties", "required", "additionalProperties",
             "dependentRequired", "items", "minItems", "maxItems", "pattern", "minLength", "minimum", "maximum"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _equal(value: Any, scalar: str | int | float | bool | None) -> bool:
    """jsonschema's equality against a scalar: true and 1 differ, 1 and 1.0 do not."""
    if isinstance(value, bool) or isinstance(scalar, bool):
        return value is scalar
    return value == scalar


def _scalar(value: Any, where: str) -> Any:
    if isinstance(value, (list, dict)):
        raise ValueError(f"schema {where}: only scalars are compiled")
    return value


def compile_schema(root: dict[str, Any]) -> Check:
    """The predicate of `root`, whose `$ref`s point into its own `$defs`."""
    defs: dict[str, Check] = {}

    def ref(pointer: str) -> Check:
        name = pointer.removeprefix("#/$defs/")
        if name == pointer or name not in root.get("$defs", {}):
            raise ValueError(f"schema $ref {pointer!r}: only '#/$defs/NAME' of the schema is compiled")
        # looked up when called, so that a definition may refer to one compiled after it
        return lambda v: defs[name](v)

    def build(schema: dict[str, Any]) -> Check:
        unknown = sorted(schema.keys() - _COMPILED - _ANNOTATIONS)
        if unknown:
            raise ValueError(f"schema keyword(s) {', '.join(unknown)} not compiled")
        checks: list[Check] = []
        if "type" in schema:
            checks.append(_TYPES[schema["type"]])
        if "const" in schema:
            const = _scalar(schema["const"], "const")
            checks.append(lambda v: _equal(v, const))
        if "enum" in schema:
            choices = [_scalar(c, "enum") for c in schema["enum"]]
            checks.append(lambda v: any(_equal(v, c) for c in choices))
        if "$ref" in schema:
            checks.append(ref(schema["$ref"]))
        if "oneOf" in schema:
            branches = [build(s) for s in schema["oneOf"]]
            checks.append(lambda v: sum(b(v) for b in branches) == 1)
        if schema.keys() & {"properties", "required", "additionalProperties", "dependentRequired"}:
            checks.append(_object(schema, build))
        if schema.keys() & {"items", "minItems", "maxItems"}:
            checks.append(_array(schema, build))
        if schema.keys() & {"pattern", "minLength"}:
            search, shortest = re.compile(schema.get("pattern", "")).search, schema.get("minLength", 0)
            checks.append(lambda v: not isinstance(v, str) or (len(v) >= shortest and search(v) is not None))
        if schema.keys() & {"minimum", "maximum"}:
            low, high = schema.get("minimum", float("-inf")), schema.get("maximum", float("inf"))
            checks.append(lambda v: not _is_number(v) or low <= v <= high)
        if len(checks) == 1:
            return checks[0]
        return lambda v: all(check(v) for check in checks)

    defs.update((name, build(schema)) for name, schema in root.get("$defs", {}).items())
    return build(root)


def _object(schema: dict[str, Any], build: Callable[[dict[str, Any]], Check]) -> Check:
    properties = {key: build(s) for key, s in schema.get("properties", {}).items()}
    required = schema.get("required", [])
    dependent = schema.get("dependentRequired", {}).items()
    extra = schema.get("additionalProperties", True)
    other = None if extra is True else (lambda v: False) if extra is False else build(extra)

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        if any(key not in value for key in required):
            return False
        for key, item in value.items():
            inner = properties.get(key, other)
            if inner is not None and not inner(item):
                return False
        return all(need in value for key, needs in dependent if key in value for need in needs)

    return check


def _array(schema: dict[str, Any], build: Callable[[dict[str, Any]], Check]) -> Check:
    each = build(schema["items"]) if "items" in schema else None
    shortest, longest = schema.get("minItems", 0), schema.get("maxItems", float("inf"))

    def check(value: Any) -> bool:
        if not isinstance(value, list):
            return True
        if not shortest <= len(value) <= longest:
            return False
        return each is None or all(each(item) for item in value)

    return check
