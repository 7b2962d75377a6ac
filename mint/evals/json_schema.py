"""JSON values as graders compare them: equality, and a small subset of JSON Schema.

`json_equal` compares numbers by value but never booleans as numbers. `check_json_schema`
refuses a schema outside the supported subset when a grader spec is built, and
`validate_json` lists where a value breaks one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

MAX_SCHEMA_DEPTH = 32


def json_equal(left: Any, right: Any) -> bool:
    """Equality of JSON values: numbers by value (1 == 1.0), but booleans are not numbers."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    return type(left) is type(right) and left == right


_SCHEMA_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_SCHEMA_KEYWORDS = {
    "type",
    "properties",
    "required",
    "enum",
    "const",
    "items",
    "additionalProperties",
    "title",
    "description",
}


def check_json_schema(schema: Any, path: str = "json_schema", depth: int = 0) -> None:
    """Refuse a schema that uses more than the supported subset; raises ValueError naming the place.

    Supported: type (a name or a list of names), properties, required, enum, const, items,
    additionalProperties (true, false or a schema); title and description are ignored.
    """
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{path}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if not isinstance(schema, dict):
        raise ValueError(f"{path}: a schema must be an object, got {schema!r}")
    unknown = sorted(set(schema) - _SCHEMA_KEYWORDS)
    if unknown:
        raise ValueError(
            f"{path}: unsupported keyword(s) {', '.join(unknown)}; the supported subset is "
            f"{', '.join(sorted(_SCHEMA_KEYWORDS))}"
        )
    types = schema.get("type", [])
    for name in [types] if isinstance(types, str) else types if isinstance(types, list) else [types]:
        if name not in _SCHEMA_TYPES:
            raise ValueError(f"{path}.type: {name!r} is not one of {', '.join(sorted(_SCHEMA_TYPES))}")
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise ValueError(f"{path}.enum: must be a non-empty list")
    required = schema.get("required", [])
    if not (isinstance(required, list) and all(isinstance(key, str) for key in required)):
        raise ValueError(f"{path}.required: must be a list of property names")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise ValueError(f"{path}.properties: must be an object mapping names to schemas")
    for key, subschema in properties.items():
        check_json_schema(subschema, f"{path}.properties.{key}", depth + 1)
    if "items" in schema:
        check_json_schema(schema["items"], f"{path}.items", depth + 1)
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        check_json_schema(extra, f"{path}.additionalProperties", depth + 1)


def _is_type(value: Any, name: str) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    checks = {
        "string": isinstance(value, str),
        "number": number,
        # JSON Schema counts 1.0 as an integer.
        "integer": number and (isinstance(value, int) or (math.isfinite(value) and value.is_integer())),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "null": value is None,
    }
    return checks[name]


def validate_json(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Where `value` breaks a schema of the supported subset (see `check_json_schema`); empty when valid."""
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is_type(value, name) for name in names):
            return [f"{path}: expected {' or '.join(names)}, got {json.dumps(value)[:60]}"]
    errors: list[str] = []
    if "const" in schema and not json_equal(value, schema["const"]):
        errors.append(f"{path}: must be {json.dumps(schema['const'])}")
    if "enum" in schema and not any(json_equal(value, option) for option in schema["enum"]):
        errors.append(f"{path}: must be one of {json.dumps(schema['enum'])}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{path}.{key}: is required" for key in schema.get("required", []) if key not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                errors += validate_json(item, properties[key], f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}.{key}: is not an allowed property")
            elif isinstance(extra, dict):
                errors += validate_json(item, extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += validate_json(item, schema["items"], f"{path}[{index}]")
    return errors
