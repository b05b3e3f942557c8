"""JSON schemas of different shapes for the structured-output tests (each compiles
with llguidance; string lengths and array sizes bounded so a random-weight
model completes them within the tests' max_tokens)."""

from __future__ import annotations

from typing import Any

S = {"type": "string", "maxLength": 6}
INT = {"type": "integer", "minimum": 0, "maximum": 999}

SCHEMAS: dict[str, dict[str, Any]] = {
    "string": S,
    "integer": INT,
    "negative_range": {"type": "integer", "minimum": -50, "maximum": -1},
    "number": {"type": "number", "minimum": 0, "maximum": 10},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "enum_str": {"enum": ["red", "green", "blue"]},
    "enum_mixed": {"enum": [1, "two", None, True]},
    "const": {"const": "fixed"},
    "pattern": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    "min_length": {"type": "string", "minLength": 3, "maxLength": 5},
    "flat_object": {"type": "object", "properties": {"name": S, "age": INT}, "required": ["name", "age"],
                    "additionalProperties": False},
    "optional_props": {"type": "object", "properties": {"a": INT, "b": S}, "required": ["a"],
                       "additionalProperties": False},
    "empty_object": {"type": "object", "properties": {}, "additionalProperties": False},
    "nested_object": {"type": "object", "properties": {"user": {
        "type": "object", "properties": {"id": INT, "email": S}, "required": ["id", "email"],
        "additionalProperties": False}}, "required": ["user"], "additionalProperties": False},
    "deep_nesting": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": INT}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    "array_bounded": {"type": "array", "items": INT, "minItems": 1, "maxItems": 3},
    "array_exact": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
    "array_of_objects": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"k": S}, "required": ["k"], "additionalProperties": False}},
    "array_of_enums": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 4},
    "tuple": {"type": "array", "prefixItems": [INT, S], "items": False, "minItems": 2},
    "nested_arrays": {"type": "array", "maxItems": 2, "items": {"type": "array", "items": INT, "maxItems": 2}},
    "anyof_scalars": {"anyOf": [INT, {"type": "boolean"}]},
    "anyof_objects": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": INT}, "required": ["kind", "x"],
         "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": S}, "required": ["kind", "y"],
         "additionalProperties": False}]},
    "oneof_disjoint": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]},
    "nullable": {"type": ["string", "null"], "maxLength": 4},
    "defs_ref": {"$defs": {"pt": {"type": "object", "properties": {"x": INT, "y": INT}, "required": ["x", "y"],
                                  "additionalProperties": False}},
                 "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
                 "required": ["a", "b"], "additionalProperties": False},
    "defs_array": {"$defs": {"tag": {"enum": ["p", "q"]}}, "type": "array",
                   "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
    "allof": {"allOf": [{"type": "object", "properties": {"a": INT}, "required": ["a"]},
                        {"type": "object", "properties": {"a": INT}, "additionalProperties": False}]},
    "object_with_enum_and_bool": {"type": "object", "properties": {
        "status": {"enum": ["ok", "fail"]}, "done": {"type": "boolean"}, "score": {"type": "number", "minimum": 0,
                                                                                "maximum": 1}},
        "required": ["status", "done", "score"], "additionalProperties": False},
    "dict_of_ints": {"type": "object", "additionalProperties": INT, "maxProperties": 2},
    "string_format_date": {"type": "string", "format": "date"},
}
# a quick subset for the default suite: scalars, an object, an array, a union, $defs
FAST = ["enum_str", "pattern", "flat_object", "array_bounded", "anyof_objects", "defs_ref"]
