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
# the exact Python types the loader builds; any other (a subclass such as OutOfRange) is
# answered "not certain", so jsonschema decides
_STRING, _NUMBERS, _BOOLEAN, _NULL = (str,), (int, float), (bool,), (type(None),)
_OBJECT, _ARRAY = (dict,), (list,)
_ANY = (*_STRING, *_NUMBERS, *_BOOLEAN, *_NULL, *_OBJECT, *_ARRAY)
_JSON_TYPES = {"string": _STRING, "integer": _NUMBERS, "number": _NUMBERS,
               "boolean": _BOOLEAN, "null": _NULL, "object": _OBJECT, "array": _ARRAY}


def _never(value: Any) -> bool:
    return False


def _always(value: Any) -> bool:
    return True


def _equal(value: Any, target: Any) -> bool:
    if isinstance(target, bool) or isinstance(value, bool):
        return isinstance(target, bool) and isinstance(value, bool) and value is target
    if isinstance(target, str | int | float) and not isinstance(value, list | dict):
        return bool(value == target)
    return False  # deep comparisons: leave to jsonschema


def compile_schema(schema: Any) -> Check:
    """A conservative validity check for ``schema`` (True only when certainly valid).

    Each keyword constrains some types only (``pattern`` strings, ``minimum`` numbers); the
    check looks up the value's exact type once and runs only the keywords that apply to it.
    """
    if schema is True:
        return _always
    if not isinstance(schema, dict) or set(schema) - _ANNOTATIONS - _KNOWN:
        return _never
    # `type` is the table's keys: a value of another type finds no entry
    by_type: dict[type, list[Check]] = {kind: [] for kind in _types(schema)}
    if float in by_type and _whole_floats_only(schema):
        by_type[float].append(_whole)
    for key in schema:
        if key in _KEYWORDS:
            applies, build = _KEYWORDS[key]
            keyword = build(schema[key], schema)
            for kind in applies:
                if kind in by_type:
                    by_type[kind].append(keyword)
    table = {kind: _all(checks) for kind, checks in by_type.items()}

    def check(value: Any) -> bool:
        found = table.get(type(value))
        return found is not None and found(value)

    return check


def _all(checks: list[Check]) -> Check:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]

    def every(value: Any) -> bool:
        for check in checks:  # a loop: all() over a generator costs twice as much here
            if not check(value):
                return False
        return True

    return every


def _type_names(schema: dict[str, Any]) -> list[str]:
    kind = schema["type"]
    return [kind] if isinstance(kind, str) else list(kind)


def _types(schema: dict[str, Any]) -> tuple[type, ...]:
    """The exact Python types a value of ``schema``'s ``type`` may have (any without one)."""
    if "type" not in schema:
        return _ANY
    return tuple({t: None for k in _type_names(schema) for t in _JSON_TYPES.get(k, ())})


def _whole_floats_only(schema: dict[str, Any]) -> bool:
    # an integer written as 3.0 is an integer to JSON Schema, 3.5 is not
    names = _type_names(schema) if "type" in schema else []
    return "integer" in names and "number" not in names


def _whole(value: float) -> bool:
    return value.is_integer()


def _enum(values: Any, schema: dict[str, Any]) -> Check:
    return lambda value: any(_equal(value, v) for v in values)


def _const(target: Any, schema: dict[str, Any]) -> Check:
    return lambda value: _equal(value, target)


def _properties(properties: dict[str, Any], schema: dict[str, Any]) -> Check:
    if "additionalProperties" in schema:
        return _always  # checked with additionalProperties, in one pass over the mapping
    return _members(properties, _always)


def _additional(additional: Any, schema: dict[str, Any]) -> Check:
    if schema.get("patternProperties"):
        return _never
    other = compile_schema(additional) if additional is not False else _never
    return _members(schema.get("properties", {}), other)


def _members(properties: dict[str, Any], other: Check) -> Check:
    """Each member checked by its property's schema, or by ``other`` when not listed."""
    compiled = {name: compile_schema(sub) for name, sub in properties.items()}

    def check(value: dict[str, Any]) -> bool:
        for key, member in value.items():
            if not compiled.get(key, other)(member):
                return False
        return True

    return check


def _required(names: list[str], schema: dict[str, Any]) -> Check:
    return lambda value: all(n in value for n in names)


def _property_names(names: Any, schema: dict[str, Any]) -> Check:
    sub = compile_schema(names)
    return lambda value: all(sub(k) for k in value)


def _pattern(pattern: str, schema: dict[str, Any]) -> Check:
    compiled = re.compile(pattern)
    return lambda value: compiled.search(value) is not None


def _min_length(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: len(value) >= limit


def _max_length(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: len(value) <= limit


def _minimum(limit: float, schema: dict[str, Any]) -> Check:
    return lambda value: value >= limit


def _maximum(limit: float, schema: dict[str, Any]) -> Check:
    return lambda value: value <= limit


def _min_items(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: len(value) >= limit


def _min_properties(limit: int, schema: dict[str, Any]) -> Check:
    return lambda value: len(value) >= limit


def _items(items: Any, schema: dict[str, Any]) -> Check:
    sub = compile_schema(items)

    def check(value: list[Any]) -> bool:
        for item in value:
            if not sub(item):
                return False
        return True

    return check


def _any_of(options: list[Any], schema: dict[str, Any]) -> Check:
    subs = [compile_schema(o) for o in options]

    def check(value: Any) -> bool:
        for sub in subs:  # a loop: any() over a generator costs twice as much here
            if sub(value):
                return True
        return False

    return check


def _not(inner: Any, schema: dict[str, Any]) -> Check:
    # "not" needs a certain *invalid* answer, which this checker cannot give: only
    # simple patterns on strings are supported.
    if isinstance(inner, dict) and set(inner) - _ANNOTATIONS == {"pattern"}:
        compiled = re.compile(inner["pattern"])
        return lambda value: not isinstance(value, str) or compiled.search(value) is None
    return _never


Builder = Callable[[Any, dict[str, Any]], Check]
# keyword -> (the types it constrains, what builds its check)
_KEYWORDS: dict[str, tuple[tuple[type, ...], Builder]] = {
    "enum": (_ANY, _enum),
    "const": (_ANY, _const),
    "properties": (_OBJECT, _properties),
    "additionalProperties": (_OBJECT, _additional),
    "required": (_OBJECT, _required),
    "propertyNames": (_OBJECT, _property_names),
    "pattern": (_STRING, _pattern),
    "minLength": (_STRING, _min_length),
    "maxLength": (_STRING, _max_length),
    "minimum": (_NUMBERS, _minimum),
    "maximum": (_NUMBERS, _maximum),
    "minItems": (_ARRAY, _min_items),
    "minProperties": (_OBJECT, _min_properties),
    "items": (_ARRAY, _items),
    "anyOf": (_ANY, _any_of),
    "not": (_ANY, _not),
}
_KNOWN = frozenset({"type", *_KEYWORDS})  # `type` is no check: the types a table answers for
