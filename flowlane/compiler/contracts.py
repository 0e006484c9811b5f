"""Data contracts (docs/contracts.md): a flow's ``input_schema`` and a step's ``output_schema``.

A contract is JSON Schema 2020-12 limited to :data:`KEYWORDS` (what the SQL Core enforces
itself, ``flowlane/core/engine/16_contracts.sql``) plus :data:`ANNOTATIONS` (for people, not
part of the shape). It is written inline or as ``{$ref: path}`` to a JSON or YAML file of the
project, relative to the YAML file. Every finding is located in the file that holds it.

The same verdicts in Python (:func:`violations`, over ``jsonschema``) and in SQL
(``flowlane.contract_violation``): a parity test proves they agree.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from flowlane import project_root
from flowlane.compiler import codes
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.loader import Document, OutOfRange, load_file, unstorable
from flowlane.compiler.shape import jsonb_text

KEYWORDS = ("type", "properties", "required", "additionalProperties", "items", "enum", "const",
            "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
            "pattern", "minItems", "maxItems")
ANNOTATIONS = ("title", "description", "examples", "$comment")
TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
_SUBSCHEMA = ("items", "additionalProperties")
_NUMBER = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNT = ("minLength", "maxLength", "minItems", "maxItems")
_COUNT_MAX = 2_147_483_647
Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Contract:
    """A contract read from the YAML: its shape form (annotations dropped) and where it was
    written (the document and path of its top, in the YAML or in the referenced file)."""

    schema: dict[str, Any]
    doc: Document
    at: Path_


def read(doc: Document, at: Path_, value: Any) -> tuple[Contract | None, list[Diagnostic]]:
    """The contract written at ``at`` of ``doc`` (inline or a ``$ref``), meta-validated."""
    if isinstance(value, dict) and "$ref" in value:
        return _read_ref(doc, at, value)
    problems = [doc.diagnostic(path, code, message, help, key=key)
                for path, code, message, help, key in _problems(value, at)]
    if problems:
        return None, problems
    return Contract(shape_form(value), doc, at), []


def _read_ref(doc: Document, at: Path_, value: dict[str, Any]
              ) -> tuple[Contract | None, list[Diagnostic]]:
    ref = value["$ref"]
    ref_at = (*at, "$ref")
    if set(value) - {"$ref", *ANNOTATIONS}:
        other = min(set(value) - {"$ref", *ANNOTATIONS})
        return None, [doc.diagnostic((*at, other), codes.UNRESOLVED_SCHEMA_REF, f"`{other}` beside `$ref`",
                                     "a reference stands alone: move the keyword into the referenced file",
                                     key=True)]
    if not isinstance(ref, str) or "://" in ref or ref.startswith(("#", "/")) or not ref:
        return None, [doc.diagnostic(ref_at, codes.UNRESOLVED_SCHEMA_REF,
                                     f"`$ref` must be a relative path of a file in the "
                                     f"project, not {json.dumps(ref)}",
                                     "write the path of a JSON or YAML file relative to this file, "
                                     "e.g. `schemas/order.json`; URLs and in-document references "
                                     "are not supported")]
    root = project_root.find_root()
    here = Path(doc.path) if Path(doc.path).is_absolute() else root / doc.path
    target = (here.parent / ref).resolve()
    if not target.is_relative_to(root.resolve()):
        return None, [doc.diagnostic(ref_at, codes.UNRESOLVED_SCHEMA_REF,
                                     f"`$ref` {ref} leads outside the project",
                                     "keep schema files inside the project (below the "
                                     "directory that holds `flows/`)")]
    if not target.is_file():
        return None, [doc.diagnostic(ref_at, codes.UNRESOLVED_SCHEMA_REF, f"`$ref` {ref}: no such file",
                                     f"create {target.relative_to(root.resolve()).as_posix()} or "
                                     "correct the path (relative to this YAML file)")]
    documents, findings = load_file(target, target.relative_to(root.resolve()).as_posix())
    if findings:
        return None, findings
    if len(documents) != 1:
        return None, [doc.diagnostic(ref_at, codes.UNRESOLVED_SCHEMA_REF,
                                     f"`$ref` {ref} holds {len(documents)} documents",
                                     "a schema file holds one JSON or YAML document")]
    return read(documents[0], (), documents[0].data)


def _problems(value: Any, at: Path_) -> Iterator[tuple[Path_, str, str, str | None, bool]]:
    """(path, code, message, help, at the key) for each problem of a (sub)schema."""
    if isinstance(value, bool):
        return
    if not isinstance(value, dict):
        yield (at, codes.INVALID_SCHEMA, f"a schema must be a mapping (or true/false), not {_kind(value)}",
               None, False)
        return
    for key, item in value.items():
        here = (*at, key)
        if key in ANNOTATIONS:
            continue
        if key not in KEYWORDS:
            yield (here, codes.SCHEMA_KEYWORD_UNSUPPORTED,
                   f"schema keyword `{key}` is outside the supported subset",
                   "use only " + ", ".join(KEYWORDS) + " (and the annotations "
                   + ", ".join(ANNOTATIONS) + "); the SQL Core enforces exactly these", True)
            continue
        problem = _keyword_problem(key, item)
        if problem is not None:
            yield here, codes.INVALID_SCHEMA, problem, _KEYWORD_HELP.get(key), False
        elif key in _SUBSCHEMA:
            yield from _problems(item, here)
        elif key == "properties":
            for name, sub in item.items():
                yield from _unstorable((*here, name), f"property name {_shown(name)}", name, key=True)
                yield from _problems(sub, (*here, name))
        elif isinstance(item, list):
            for index, element in enumerate(item):
                yield from _unstorable((*here, index), f"`{key}`", element)
        else:
            yield from _unstorable(here, f"`{key}`", item)


def _unstorable(at: Path_, what: str, value: Any, key: bool = False
                ) -> Iterator[tuple[Path_, str, str, str | None, bool]]:
    """FL106 when ``value`` holds what no jsonb value can (a NUL character, a number out of
    range): the contract could not be stored."""
    found = unstorable(value)
    if found is not None:
        yield (at, codes.UNSTORABLE_SCHEMA, f"{what} holds {found[0]}: the contract cannot be stored",
               found[1], key)


_KEYWORD_HELP = {
    "type": "use one of " + ", ".join(TYPES) + ", or a list of them",
    "properties": "write `properties:` as a mapping of property name to schema",
    "required": "write `required: [name, ...]`",
    "enum": "write `enum: [value, ...]` with at least one value",
    "items": "write one schema for every item, e.g. `items: {type: string}`",
    "additionalProperties": "write `false` to close the object, or a schema for the other "
                            "properties",
    **{key: f"write a number, e.g. `{key}: 0`" for key in _NUMBER},
    **{key: f"write a whole number, e.g. `{key}: 1`" for key in _COUNT},
    "pattern": "write a regular expression both Python and PostgreSQL read alike (character "
               "classes, anchors, quantifiers)",
}


def _keyword_problem(key: str, value: Any) -> str | None:
    if key == "type":
        names = value if isinstance(value, list) else [value]
        if not names or any(not isinstance(n, str) or n not in TYPES for n in names):
            return f"`type` must name JSON types, got {_shown(value)}"
        return None
    if key == "properties":
        return None if isinstance(value, dict) else "`properties` must be a mapping of schemas"
    if key == "required":
        if not isinstance(value, list) or any(not isinstance(n, str) for n in value):
            return "`required` must be a list of property names"
        return None
    if key == "enum":
        return None if isinstance(value, list) and value else "`enum` must be a non-empty list"
    if key in _NUMBER:
        ok = isinstance(value, int | float) and not isinstance(value, bool | OutOfRange)
        return None if ok else f"`{key}` must be a number, got {_shown(value)}"
    if key in _COUNT:
        number = count(value)
        ok = number is not None and 0 <= number <= _COUNT_MAX
        return None if ok else f"`{key}` must be a whole number from 0, got {_shown(value)}"
    if key == "pattern":
        if not isinstance(value, str):
            return f"`pattern` must be a string, got {_shown(value)}"
        try:
            re.compile(value)
        except re.error as exc:
            return f"`pattern` is not a regular expression: {exc}"
        return None
    if key in _SUBSCHEMA and not isinstance(value, dict | bool):
        return f"`{key}` must be a schema (a mapping or true/false), not {_kind(value)}"
    return None


def count(value: Any) -> int | None:
    """The whole number a count keyword (``minLength``, ``maxItems``...) holds, None when it
    holds none: JSON Schema reads ``2.0`` as the count 2 (so does the SQL Core)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_count(value: Any) -> Any:
    """A count keyword's value as the count it means (2.0 is 2); any other value as it is."""
    number = count(value)
    return value if number is None else number


def shape_form(schema: Any) -> Any:
    """The schema without annotations (they are not part of the shape) and with each count as
    the whole number it means (``2.0`` is stored as ``2``); keyword positions only, so a
    property named ``title`` stays."""
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key in _SUBSCHEMA:
            kept[key] = shape_form(value)
        elif key == "properties":
            kept[key] = {name: shape_form(sub) for name, sub in value.items()}
        elif key in _COUNT:
            kept[key] = _as_count(value)
        else:
            kept[key] = value
    return kept


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- validation (the Python verdict; the SQL Core has its own, proven equal) ----

@dataclass(frozen=True)
class Violation:
    """Where an instance breaks its contract: a JSON pointer and the rule in words."""

    path: str
    message: str
    schema_path: str

    def __str__(self) -> str:
        return f"{self.path or '/'}: {self.message}"


def violations(schema: Any, instance: Any) -> list[Violation]:
    """Every rule of ``schema`` that ``instance`` breaks (empty when it is valid)."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    found = [_violation(error) for error in validator.iter_errors(instance)]
    return sorted(found, key=lambda v: (v.path, v.schema_path))


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> jsonschema.Draft202012Validator:
    """One validator per schema (a worker checks every output of a step with the same one)."""
    return jsonschema.Draft202012Validator(json.loads(schema_text))


def first_violation(schema: Any, instance: Any) -> Violation | None:
    found = violations(schema, instance)
    return found[0] if found else None


def pointer(parts: Sequence[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _violation(error: ValidationError) -> Violation:
    keyword = str(error.validator)
    value: Any = error.validator_value
    shown = _jsonb_shown(error.instance)
    named = [str(t) for t in (value if isinstance(value, list) else [value])]
    messages = {
        "type": lambda: f"{shown} is not of type {' or '.join(named)}",
        "enum": lambda: f"{shown} is not one of {_jsonb_shown(value)}",
        "const": lambda: f"{shown} is not {_jsonb_shown(value)}",
        "minimum": lambda: f"{shown} is less than the minimum {_jsonb_shown(value)}",
        "maximum": lambda: f"{shown} is greater than the maximum {_jsonb_shown(value)}",
        "exclusiveMinimum": lambda: f"{shown} is not greater than {_jsonb_shown(value)}",
        "exclusiveMaximum": lambda: f"{shown} is not less than {_jsonb_shown(value)}",
        "minLength": lambda: f"{shown} is shorter than {_as_count(value)} characters",
        "maxLength": lambda: f"{shown} is longer than {_as_count(value)} characters",
        "pattern": lambda: f"{shown} does not match the pattern {_jsonb_shown(value)}",
        "minItems": lambda: f"has fewer than {_as_count(value)} items",
        "maxItems": lambda: f"has more than {_as_count(value)} items",
        "required": lambda: f"required property {_missing(error)} is missing",
        "additionalProperties": lambda: f"property {_extra(error)} is not allowed "
                                        "(additionalProperties is false)",
        "false": lambda: f"{shown} is not allowed here",
    }
    message = messages.get(keyword, lambda: str(error.message))()
    schema_path = pointer([p for p in error.absolute_schema_path])
    return Violation(pointer(error.absolute_path), message, schema_path)


def _missing(error: ValidationError) -> str:
    instance = error.instance if isinstance(error.instance, dict) else {}
    listed: Any = error.validator_value
    names = [n for n in listed if n not in instance]
    return json.dumps(names[0] if names else "", ensure_ascii=False)


def _extra(error: ValidationError) -> str:
    instance = error.instance if isinstance(error.instance, dict) else {}
    known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
    extras = sorted(k for k in instance if k not in known)
    return json.dumps(extras[0] if extras else "", ensure_ascii=False)


def _jsonb_shown(value: Any) -> str:
    """A value as the SQL Core shows it in a message (its jsonb text, shortened)."""
    text = jsonb_text(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- compile-time checks across the graph ----

def types_of(schema: Any) -> frozenset[str] | None:
    """The JSON types a schema allows (None: any)."""
    if schema is False:
        return frozenset()
    if not isinstance(schema, dict) or "type" not in schema:
        return None
    named = schema["type"]
    found = set(named if isinstance(named, list) else [named])
    if "integer" in found:
        found.add("number")  # a condition value 3 may meet an integer; 3.5 is checked below
    return frozenset(found)


def never_contains(schema: Any, pattern: Any, at: str = "") -> str | None:
    """Why no value ``schema`` allows can contain ``pattern`` (jsonb ``@>``), or None when
    some may (or the schema does not say)."""
    allowed = types_of(schema)
    kind = _json_type(pattern)
    if allowed is not None and kind not in allowed:
        return f"{at or 'the value'} is {declared_types(schema)}, never {kind}"
    if not isinstance(schema, dict):
        return None
    if kind == "object":
        return _object_never_contains(schema, pattern, at)
    if kind == "array":
        items = schema.get("items")
        for item in pattern:
            if items is not None and (reason := never_contains(items, item, f"{at}/*")):
                return reason
        return None
    if isinstance(pattern, float) and not pattern.is_integer() \
            and schema.get("type") in ("integer", ["integer"]):
        return f"{at or 'the value'} is an integer, never {pattern}"
    choices = [schema["const"]] if "const" in schema else schema.get("enum")
    if choices is not None and not any(_same(pattern, c) for c in choices):
        return f"{at or 'the value'} is one of {_shown(choices)}, never {_shown(pattern)}"
    return None


def never_present(schema: Any, pointer: str) -> str | None:
    """Why no value ``schema`` allows has a value at the JSON ``pointer``, or None when some
    may (or the schema does not say)."""
    at = ""
    for token in pointer.split("/")[1:]:
        name = token.replace("~1", "/").replace("~0", "~")
        where = f"{at}/{token}"
        allowed = types_of(schema)
        if allowed is not None and not allowed & {"object", "array"}:
            return f"{at or 'the input'} is {declared_types(schema)}, which has no {where}"
        if not isinstance(schema, dict):
            return None
        if allowed is not None and "object" not in allowed:
            if not name.isdigit():
                return f"{at or 'the input'} is an array, which has no member {name!r}"
            schema = schema.get("items", True)
        elif name in schema.get("properties", {}):
            schema = schema["properties"][name]
        elif schema.get("additionalProperties", True) is False:
            return (f"{where} is never present: the schema lists no such property and closes "
                    "additional properties")
        else:
            schema = schema.get("additionalProperties", True)
        at = where
    return None


def _object_never_contains(schema: dict[str, Any], pattern: dict[str, Any], at: str) -> str | None:
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, sub in pattern.items():
        where = f"{at}/{key}"
        if key in properties:
            reason = never_contains(properties[key], sub, where)
        elif extra is False:
            reason = f"{where} is never present: the schema lists no such property and closes " \
                     "additional properties"
        else:
            reason = never_contains(extra, sub, where) if isinstance(extra, dict) else None
        if reason:
            return reason
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def declared_types(schema: Any) -> str:
    """The types a schema names, in words (``string or null``)."""
    if not isinstance(schema, dict):
        return "never allowed"
    named = schema.get("type")
    return " or ".join(named if isinstance(named, list) else [str(named)])


def not_an_array(schema: Any) -> bool:
    """Whether ``schema`` can never be an array (a map over it has nothing to map)."""
    allowed = types_of(schema)
    return allowed is not None and "array" not in allowed


def as_map_output(schema: Mapping[str, Any]) -> dict[str, Any]:
    """What a condition or a later step sees of a map step: the array of its task outputs."""
    return {"type": "array", "items": dict(schema)}


def rejects(schema: Any, instance: Any) -> Violation | None:
    """Hook for inputs written in the YAML (a schedule's, a child flow's): the first
    violation of the target's input_schema, reported at compile time."""
    return first_violation(schema, instance)


# ---- compatibility of two versions' input contracts (an alias move) ----

LIMITS = ("checked rule by rule: newly required fields, narrowed types, smaller enums, closed "
          "additional properties, tightened bounds, newly constrained properties; a changed "
          "`pattern` is reported, not compared, and nothing here proves the new version's steps "
          "do the same work")
_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems")  # a larger value is tighter
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems")  # a smaller value is tighter


def breaking_changes(old: Any, new: Any, at: str = "") -> list[str]:
    """The named rules by which ``new`` may refuse an input ``old`` accepted (None: no
    contract, any input). Empty means compatible by every rule checked (:data:`LIMITS`)."""
    where = at or "/"
    if new is None or new is True or new == {}:
        return []
    if old is None or old is True or old == {}:
        return [f"newly constrained at {where}: the old version accepted any value there"
                if at else "input_schema added: the old version accepted any input"]
    if new is False or old is False:
        return [] if old is False else [f"value forbidden at {where}"]
    found = _type_and_values(old, new, where)
    found += _bounds(old, new, where)
    found += _object_rules(old, new, at, where)
    if "items" in new:
        found += breaking_changes(old.get("items"), new["items"], f"{at}/*")
    return found


def _type_and_values(old: dict[str, Any], new: dict[str, Any], where: str) -> list[str]:
    found = []
    if "type" in new and ("type" not in old or any(
            t not in _named(new) and not (t == "integer" and "number" in _named(new))
            for t in _named(old))):
        found.append(f"type narrowed at {where}: {declared_types(old) if 'type' in old else 'any'} "
                     f"-> {declared_types(new)}")
    old_values = _values(old)
    new_values = _values(new)
    if new_values is not None:
        removed = [v for v in (old_values or []) if not any(_same(v, n) for n in new_values)]
        if old_values is None:
            found.append(f"enum added at {where}: only {_shown(new_values)}")
        elif removed:
            found.append(f"enum shrunk at {where}: {_shown(removed)} no longer accepted")
    if new.get("pattern") is not None and new.get("pattern") != old.get("pattern"):
        found.append(f"pattern changed at {where} (not compared: it may refuse old inputs)")
    return found


def _named(schema: dict[str, Any]) -> list[str]:
    named = schema.get("type", [])
    return [str(t) for t in (named if isinstance(named, list) else [named])]


def _values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _bounds(old: dict[str, Any], new: dict[str, Any], where: str) -> list[str]:
    found = []
    for key in (*_LOWER, *_UPPER):
        if key not in new:
            continue
        before = old.get(key)
        tighter = before is None or (new[key] > before if key in _LOWER else new[key] < before)
        if tighter:
            found.append(f"bound tightened at {where}: {key} "
                         f"{'none' if before is None else before} -> {new[key]}")
    return found


def _object_rules(old: dict[str, Any], new: dict[str, Any], at: str, where: str) -> list[str]:
    found = [f"field newly required: {at}/{name}" for name in new.get("required", [])
             if name not in old.get("required", [])]
    old_extra = old.get("additionalProperties", True)
    if new.get("additionalProperties") is False and old_extra is not False:
        found.append(f"additional properties closed at {where}")
    old_properties = old.get("properties", {})
    for name, sub in new.get("properties", {}).items():
        before = old_properties.get(name, old_extra if isinstance(old_extra, dict) else None)
        found += breaking_changes(before, sub, f"{at}/{name}")
    extra = new.get("additionalProperties")
    if isinstance(extra, dict):
        found += breaking_changes(old_extra if isinstance(old_extra, dict) else None, extra,
                                  f"{at}/*")
    return found


def compatibility_lines(old_slug: str, old: Any, new_slug: str, new: Any) -> list[str]:
    """What an alias move from ``old_slug`` to ``new_slug`` means for its callers' inputs."""
    breaking = breaking_changes(old, new)
    if not breaking:
        return [f"input contract: {new_slug} accepts every input {old_slug} accepted ({LIMITS})"]
    return [f"input contract: BREAKING, {new_slug} may refuse inputs {old_slug} accepted:",
            *(f"  {rule}" for rule in breaking), f"  ({LIMITS})"]
