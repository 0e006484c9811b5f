"""A fast yes/no check compiled from the JSON Schema, for the common all-valid case.

``jsonschema`` gives precise errors but walks the schema generically, which
dominates compile time. :func:`compile_schema` turns a (``$ref``-free) schema
into nested closures that answer only "certainly valid?". It is conservative:
a keyword it does not know makes it answer False, and False merely means
"ask jsonschema", which remains the single source of truth for findings. A
property test checks that it never says yes where jsonschema says no.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
_ANNOTATIONS = frozenset({"description", "examples", "title", "$schema", "$id", "default",
                          "x-flowlane-code", "x-flowlane-name", "x-flowlane-examples",
                          "patternErrorMessage", "errorMessage"})


def _never(value: Any) -> bool:
    return False


def _always(value: Any) -> bool:
    return True


def _is_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "boolean":
        return isinstance(value, bool)
    return kind == "null" and value is None


def _equal(value: Any, target: Any) -> bool:
    if isinstance(target, bool) or isinstance(value, bool):
        return isinstance(target, bool) and isinstance(value, bool) and value is target
    if isinstance(target, str | int | float) and not isinstance(value, list | dict):
        return bool(value == target)
    return False  # deep comparisons: leave to jsonschema


def compile_schema(schema: Any) -> Check:
    """A conservative validity check for ``schema`` (True only when certainly valid)."""
    if schema is True:
        return _always
    if not isinstance(schema, dict) or set(schema) - _ANNOTATIONS - set(_KEYWORDS):
        return _never
    checks = [_KEYWORDS[key](schema[key], schema) for key in schema if key in _KEYWORDS]

    def check(value: Any) -> bool:
        return all(c(value) for c in checks)

    return check


def _type(kind: Any, schema: dict[str, Any]) -> Check:
    kinds = [kind] if isinstance(kind, str) else list(kind)
    return lambda value: any(_is_type(value, k) for k in kinds)


def _enum(values: Any, schema: dict[str, Any]) -> Check:
    return lambda value: any(_equal(value, v) for v in values)


def _const(target: Any, schema: dict[str, Any]) -> Check:
    return lambda value: _equal(value, target)


def _properties(properties: dict[str, Any], schema: dict[str, Any]) -> Check:
    compiled = {name: compile_schema(sub) for name, sub in properties.items()}

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        return all(compiled[k](v) for k, v in value.items() if k in compiled)

    return check


def _additional(additional: Any, schema: dict[str, Any]) -> Check:
    if schema.get("patternProperties"):
        return _never
    known = set(schema.get("properties", {}))
    sub = compile_schema(additional) if additional is not False else _never

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        return all(sub(v) for k, v in value.items() if k not in known)

    return check


def _required(names: list[str], schema: dict[str, Any]) -> Check:
    return lambda value: not isinstance(value, dict) or all(n in value for n in names)


def _property_names(names: Any, schema: dict[str, Any]) -> Check:
    sub = compile_schema(names)
    return lambda value: not isinstance(value, dict) or all(sub(k) for k in value)


def _pattern(pattern: str, schema: dict[str, Any]) -> Check:
    compiled = re.compile(pattern)
    return lambda value: not isinstance(value, str) or compiled.search(value) is not None


def _min_length(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: not isinstance(value, str) or len(value) >= limit


def _max_length(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: not isinstance(value, str) or len(value) <= limit


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _minimum(limit: float, schema: dict[str, Any]) -> Check:
    return lambda value: not _is_number(value) or value >= limit


def _maximum(limit: float, schema: dict[str, Any]) -> Check:
    return lambda value: not _is_number(value) or value <= limit


def _min_items(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: not isinstance(value, list) or len(value) >= limit


def _min_properties(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: not isinstance(value, dict) or len(value) >= limit


def _items(items: Any, schema: dict[str, Any]) -> Check:
    sub = compile_schema(items)
    return lambda value: not isinstance(value, list) or all(sub(v) for v in value)


def _any_of(options: list[Any], schema: dict[str, Any]) -> Check:
    subs = [compile_schema(o) for o in options]
    return lambda value: any(s(value) for s in subs)


def _not(inner: Any, schema: dict[str, Any]) -> Check:
    # "not" needs a certain *invalid* answer, which this checker cannot give: only
    # simple patterns on strings are supported.
    if isinstance(inner, dict) and set(inner) - _ANNOTATIONS == {"pattern"}:
        compiled = re.compile(inner["pattern"])
        return lambda value: not isinstance(value, str) or compiled.search(value) is None
    return _never


_KEYWORDS: dict[str, Callable[[Any, dict[str, Any]], Check]] = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "properties": _properties,
    "additionalProperties": _additional,
    "required": _required,
    "propertyNames": _property_names,
    "pattern": _pattern,
    "minLength": _min_length,
    "maxLength": _max_length,
    "minimum": _minimum,
    "maximum": _maximum,
    "minItems": _min_items,
    "minProperties": _min_properties,
    "items": _items,
    "anyOf": _any_of,
    "not": _not,
}
