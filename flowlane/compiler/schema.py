"""JSON Schema (draft 2020-12) validation with errors mapped back to YAML positions."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from importlib import resources
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from flowlane.compiler import codes, fastcheck, names
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.loader import Document, OutOfRange

SCHEMA_FILE = "flowlane.v1.schema.json"
_TYPE_NAMES = {
    "string": "a string", "integer": "an integer", "number": "a number",
    "boolean": "a boolean", "object": "a mapping", "array": "a list", "null": "null",
}


def schema_text() -> str:
    """The published JSON Schema, exactly as shipped."""
    return resources.files("flowlane.compiler").joinpath("schemas", SCHEMA_FILE).read_text(encoding="utf-8")


@functools.cache
def published() -> dict[str, Any]:
    """The JSON Schema as editors read it."""
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


@functools.cache
def schema() -> dict[str, Any]:
    """The schema the compiler validates with: the published one without the rules marked
    ``x-flowlane-analyzed`` (stated there for editors; the analyzer reports them under their
    own codes, with the names and lines involved)."""
    stripped: dict[str, Any] = _without_analyzed(published())
    return stripped


ANALYZED = "x-flowlane-analyzed"


def _without_analyzed(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_analyzed(item) for item in node
                if not (isinstance(item, dict) and ANALYZED in item)]
    if isinstance(node, dict):
        kept = {key: _without_analyzed(value) for key, value in node.items()
                if not (isinstance(value, dict) and ANALYZED in value)}
        return {key: value for key, value in kept.items() if value != [] or key != "allOf"}
    return node


@functools.cache
def _validator(kind: str | None = None) -> jsonschema.Draft202012Validator:
    """The root validator, or a faster one for one kind with every ``$ref`` inlined
    (the schema has no recursive references; the published file keeps its ``$defs``)."""
    root = schema()
    if kind is None:
        return jsonschema.Draft202012Validator(root)
    return jsonschema.Draft202012Validator(_inline(root["$defs"][kind], root["$defs"]))


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    inlined = {key: _inline(value, defs) for key, value in node.items() if key != "$ref"}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {**target, **inlined}
    return inlined


@functools.cache
def _fast(kind: str) -> fastcheck.Check:
    return fastcheck.compile_schema(_validator(kind).schema)


def validate_document(doc: Document) -> list[Diagnostic]:
    """Every schema finding of one document, each at the YAML position it concerns."""
    data = doc.data
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind in ("flow", "alias", "worker") and _fast(kind)(data):
        return []
    validator = _validator(kind if kind in ("flow", "alias", "worker") else None)
    findings: list[Diagnostic] = []
    for error in validator.iter_errors(data):
        findings.extend(_diagnose(doc, error))
    return findings


def _diagnose(doc: Document, error: ValidationError) -> list[Diagnostic]:
    path = tuple(error.absolute_path)
    sub: dict[str, Any] = error.schema if isinstance(error.schema, dict) else {}
    if "propertyNames" in error.relative_schema_path:
        return [_name_problem(doc, (*path, str(error.instance)), sub, str(error.instance), True)]
    handler = _HANDLERS.get(str(error.validator))
    if handler is not None:
        return handler(doc, error, path, sub)
    if "x-flowlane-name" in sub and isinstance(error.instance, str):
        return [_name_problem(doc, path, sub, error.instance, False)]
    return [_invalid(doc, error, path, sub)]


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _field(path: tuple[Any, ...]) -> str:
    for part in reversed(path):
        if isinstance(part, str):
            return f"`{part}`"
    return "the document"


def _kind_of(value: Any) -> str:
    if isinstance(value, OutOfRange):
        return f"{_show(value)}, a number out of range"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else "a mapping"


def _required(doc: Document, error: ValidationError, path: tuple[Any, ...],
              sub: dict[str, Any]) -> list[Diagnostic]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    missing = [k for k in _listed(error.validator_value) if k not in instance]
    found = []
    for key in missing:
        code = codes.UNKNOWN_KIND if key == "kind" and not path else codes.MISSING_KEY
        where = f"in {_field(path)}" if path else "in this document"
        help = ("start the document with `kind: flow`, `kind: alias` or `kind: worker`"
                if code == codes.UNKNOWN_KIND else f"add `{key}:`")
        found.append(doc.diagnostic(path, code, f"missing required key `{key}` {where}",
                                    help, key=bool(path)))
    return found


def _additional(doc: Document, error: ValidationError, path: tuple[Any, ...],
                sub: dict[str, Any]) -> list[Diagnostic]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    allowed = sorted(sub.get("properties", {}))
    found = []
    for key in instance:
        if key in allowed:
            continue
        close = difflib.get_close_matches(key, allowed, n=1)
        glued = _key_before_space(key, allowed)
        help = (f"a colon is missing after `{glued}`: write `{glued}: ` and then its value"
                if glued else f"did you mean `{close[0]}`?" if close else
                "allowed keys: " + ", ".join(f"`{k}`" for k in allowed))
        found.append(doc.diagnostic((*path, key), codes.UNKNOWN_KEY,
                                    f"unknown key `{key}` in {_field(path)}", help, key=True))
    return found


def _key_before_space(text: str, keys: list[str]) -> str | None:
    """``handler shop.x:y``: a known key, a space and more, where ``KEY: VALUE`` was meant."""
    word, _, rest = text.partition(" ")
    return word if word in keys and rest.strip() else None


def _step_keys() -> set[str]:
    return set(schema()["$defs"]["step"].get("properties", {}))


def _under_indented(doc: Document, path: tuple[Any, ...]) -> Diagnostic | None:
    """``steps: {b: null, needs: [a]}``: a step option written at the indentation of the
    step names, so YAML reads it as a step of its own."""
    if len(path) != 2 or path[0] != "steps" or path[1] not in _step_keys():
        return None
    steps = doc.data.get("steps") if isinstance(doc.data, dict) else None
    if not isinstance(steps, dict):
        return None
    names = list(steps)
    index = names.index(path[1])
    owner = next((n for n in reversed(names[:index])
                  if n not in _step_keys() or isinstance(steps[n], dict | None)), None)
    if owner is None:
        return None
    return doc.diagnostic(
        path, codes.WRONG_TYPE, f"`{path[1]}` is read as a step name: indent it under `{owner}`",
        f"step options belong inside their step: indent `{path[1]}:` further than "
        f"`{owner}:`", key=True)


def error_paths(data: Any) -> list[tuple[Any, ...]]:
    """Where ``data`` breaks the schema (instance paths), for partial semantic checks."""
    kind = data.get("kind") if isinstance(data, dict) else None
    validator = _validator(kind if kind in ("flow", "alias", "worker") else None)
    return [tuple(error.absolute_path) for error in validator.iter_errors(data)]


@dataclasses.dataclass(frozen=True)
class Repaired:
    """A schema-valid stand-in for a flow document, and the steps it stands in for: their
    placeholders keep only the ``needs`` of the YAML."""

    data: dict[str, Any]
    placeholders: frozenset[str]


def repaired_flow(data: dict[str, Any]) -> Repaired | None:
    """A schema-valid stand-in for a flow document with schema errors, so that the semantic
    checks still run on the rest of it: broken steps keep only their ``needs`` (and get a
    placeholder handler), broken optional parts are dropped. None when that is not safe."""
    flow_keys = set(schema()["$defs"]["flow"].get("properties", {}))
    steps = data.get("steps")
    if not isinstance(data.get("slug"), str) or not isinstance(steps, dict) or not steps:
        return None
    repaired = {key: value for key, value in data.items() if key in flow_keys}
    fixed_steps = dict(steps)
    placeholders = set()
    for path in error_paths(data):
        if len(path) >= 2 and path[0] == "steps" and path[1] in steps:
            if path[1] in _step_keys():
                return None  # an under-indented option: the step list itself is wrong
            fixed_steps[path[1]] = _placeholder_step(steps[path[1]])
            placeholders.add(str(path[1]))
        elif path[:1] in (("defaults",), ("description",), ("format",), ("concurrency",),
                          ("priority",)):
            repaired.pop(path[0], None)
        elif path != ():  # () = unknown top-level keys, dropped above
            return None
    repaired["steps"] = fixed_steps
    return None if error_paths(repaired) else Repaired(repaired, frozenset(placeholders))


def _placeholder_step(spec: Any) -> dict[str, Any]:
    needs = spec.get("needs") if isinstance(spec, dict) else None
    valid = isinstance(needs, list) and all(isinstance(n, str) for n in needs)
    return {"handler": "flowlane.placeholder:step", **({"needs": needs} if valid and needs else {})}


def _type(doc: Document, error: ValidationError, path: tuple[Any, ...],
          sub: dict[str, Any]) -> list[Diagnostic]:
    misplaced = _under_indented(doc, path)
    if misplaced is not None:
        return [misplaced]
    expected = error.validator_value
    wanted = [expected] if isinstance(expected, str) else _listed(expected)
    text = " or ".join(_TYPE_NAMES.get(t, t) for t in wanted)
    return [doc.diagnostic(path, codes.WRONG_TYPE,
                           f"{_field(path)} must be {text}, not {_kind_of(error.instance)}",
                           _empty_step_help(doc, path, error.instance)
                           or _quote_help(doc, path, error.instance, wanted)
                           or _range_help(sub, error.instance) or _example_help(sub)
                           or _mapping_help(path, error.instance, sub, wanted))]


def _mapping_help(path: tuple[Any, ...], value: Any, sub: dict[str, Any],
                  wanted: list[str]) -> str | None:
    """A scalar where a mapping belongs: its keys go on lines of their own, indented under
    it; ``handler shop.x:y`` (a colon missing after a key) reads as one string."""
    if "object" not in wanted or isinstance(value, dict | list):
        return None
    required = [k for k in _listed(sub.get("required")) if isinstance(k, str)]
    keys = [*required, *sorted(set(sub.get("properties", {})) - set(required))]
    where = f"under {_field(path)}" if path else "in the document"
    word = _key_before_space(value, keys) if isinstance(value, str) else None
    if word is not None:
        rest = value.partition(" ")[2].strip()
        return (f"a colon is missing after `{word}`: write `{word}: {rest}` on a line "
                f"of its own, indented {where}")
    listed = ", ".join(f"`{k}`" for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return (f"write `key: value` lines indented {where}" + (f", with keys such as {listed}"
                                                             if keys else ""))


def _quote_help(doc: Document, path: tuple[Any, ...], value: Any,
                wanted: list[str]) -> str | None:
    """``needs: [true]``: YAML read a word as a boolean, null or number; quoting keeps it text."""
    if "string" not in wanted or isinstance(value, str | dict | list):
        return None
    written = doc.written(path)
    if not written:
        return None
    return f"YAML reads `{written}` as {_kind_of(value)}; write `\"{written}\"` for the text"


def _range_help(sub: dict[str, Any], value: Any) -> str | None:
    if not isinstance(value, OutOfRange) or "minimum" not in sub:
        return None
    return f"use a whole number from {sub['minimum']} to {sub.get('maximum', 'any')}"


def _empty_step_help(doc: Document, path: tuple[Any, ...], value: Any) -> str | None:
    """``b:`` with nothing under it, followed by options at its own indentation."""
    if value is not None or len(path) != 2 or path[0] != "steps":
        return None
    names = list(doc.data["steps"])
    following = names[names.index(path[1]) + 1:]
    if following and following[0] in _step_keys():
        return f"its options are not indented under it: indent `{following[0]}:` and the " \
               f"lines after it further than `{path[1]}:`"
    return None


def _any_of(doc: Document, error: ValidationError, path: tuple[Any, ...],
            sub: dict[str, Any]) -> list[Diagnostic]:
    # report the errors of the branch whose type matches the value, if one does
    for index, branch in enumerate(sub.get("anyOf", [])):
        wanted = branch.get("type") if isinstance(branch, dict) else None
        if wanted is None or not _branch_fits(error.instance, wanted):
            continue
        found: list[Diagnostic] = []
        for sub_error in error.context or ():
            if sub_error.relative_schema_path[0] == index:
                # a branch without examples of its own shows the option's
                help = _example_help(sub) or _bound_help(sub_error)
                found.extend(d if d.help else dataclasses.replace(d, help=help)
                             for d in _diagnose(doc, sub_error))
        if found:
            return found
    text = f"{_field(path)} is invalid: {sub.get('description', '')}".rstrip(": ")
    return [doc.diagnostic(path, codes.INVALID_VALUE, text, _example_help(sub)
                           or f"see {_field(path)} in docs/yaml-reference.md")]


def _branch_fits(value: Any, wanted: str) -> bool:
    if isinstance(value, OutOfRange):  # a number the loader kept as text: the number branch
        return wanted in ("integer", "number")
    return bool(_validator().is_type(value, wanted))


def _enum(doc: Document, error: ValidationError, path: tuple[Any, ...],
          sub: dict[str, Any]) -> list[Diagnostic]:
    values = _listed(error.validator_value) if error.validator == "enum" else [
        error.validator_value
    ]
    choices = ", ".join(f"`{json.dumps(v)}`" if not isinstance(v, str) else f"`{v}`"
                        for v in values)
    code = str(sub.get("x-flowlane-code", codes.INVALID_VALUE))
    shown = _show(error.instance)
    if code == codes.UNKNOWN_KIND:
        message = f"unknown document kind {shown}"
    elif code == codes.UNSUPPORTED_FORMAT:
        message = f"unsupported format {shown}"
        choices = "`1` (or omit `format`)"
    else:
        message = f"{_field(path)} is {shown}, expected one of {choices}"
    return [doc.diagnostic(path, code, message, f"use one of {choices}")]


def _show(value: Any) -> str:
    if isinstance(value, OutOfRange) and len(value) > 60:
        return f"`{value[:40]}...` ({len(value)} characters)"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else f"`{value}`"
    return text if len(text) <= 60 else text[:57] + "..."


def _invalid(doc: Document, error: ValidationError, path: tuple[Any, ...],
             sub: dict[str, Any]) -> Diagnostic:
    code = str(sub.get("x-flowlane-code", codes.INVALID_VALUE))
    if code == codes.INVALID_HANDLER:
        message = f"handler {_show(error.instance)} is not `module:callable`"
        return doc.diagnostic(path, code, message,
                              "write the handler as `package.module:function`")
    detail = _detail(error)
    help = sub.get("patternErrorMessage") if error.validator == "pattern" else None
    in_branch = error.parent is not None  # of an anyOf: the option's examples come first
    return doc.diagnostic(path, code, f"{_field(path)} {detail}",
                          help or _example_help(sub) or (None if in_branch else _bound_help(error)))


def _bound_help(error: ValidationError) -> str:
    """What a value out of the schema's bounds should be instead."""
    value = error.validator_value
    what = _field(tuple(error.absolute_path))
    return {
        "minimum": f"give {what} a value of {value} or more",
        "maximum": f"give {what} a value of {value} or less",
        "minItems": f"list at least {value} item{'' if value == 1 else 's'} in {what}",
        "minProperties": f"give {what} at least {value} entr{'y' if value == 1 else 'ies'}, "
                         "indented under it",
        "minLength": f"give {what} at least {value} character(s)",
        "maxLength": f"shorten {what} to {value} characters or fewer",
    }.get(str(error.validator), f"see {what} in docs/yaml-reference.md")


def _detail(error: ValidationError) -> str:
    value = error.validator_value
    detail = {
        "minimum": f"must be at least {value}",
        "maximum": f"must be at most {value}",
        "minItems": f"must have at least {value} item(s)",
        "minProperties": f"must have at least {value} entr{'y' if value == 1 else 'ies'}",
        "minLength": f"must be at least {value} character(s) long",
        "maxLength": f"must be at most {value} characters long",
        "pattern": "has an invalid format",
    }.get(str(error.validator))
    return f"{detail}, got {_show(error.instance)}" if detail else str(error.message)


def _example_help(sub: dict[str, Any]) -> str | None:
    # objects live under x-flowlane-examples: editors would offer them as "[object Object]"
    examples = sub.get("examples") or sub.get("x-flowlane-examples")
    if examples:
        return f"for example: {json.dumps(examples[0], ensure_ascii=False)}"
    return None


def _name_problem(doc: Document, path: tuple[Any, ...], sub: dict[str, Any], value: str,
                  key: bool) -> Diagnostic:
    if sub.get("x-flowlane-name") == "queue":
        problem = names.queue_problem(value)
        code = codes.QUEUE_NOT_CANONICAL
    else:
        problem = names.slug_problem(value, _what(path))
        code = codes.INVALID_SLUG
    if problem is None:  # the schema and names.py disagree: report the schema's words
        return doc.diagnostic(path, code, f"invalid name `{value}`",
                              "see the naming rules in docs/yaml-reference.md", key=key)
    return doc.diagnostic(path, code, problem.message, problem.help, key=key)


def _what(path: tuple[Any, ...]) -> str:
    if len(path) >= 2 and path[-2] == "steps":
        return "step slug"
    if path and path[0] == "slug":
        return "slug"
    return "name"


def _not(doc: Document, error: ValidationError, path: tuple[Any, ...],
         sub: dict[str, Any]) -> list[Diagnostic]:
    if "x-flowlane-name" in sub:  # a name that is not a string has a type error already
        if not isinstance(error.instance, str):
            return []
        key = "propertyNames" in error.relative_schema_path
        return [_name_problem(doc, path, sub, error.instance, key)]
    return [_invalid(doc, error, path, sub)]


_HANDLERS = {
    "required": _required,
    "additionalProperties": _additional,
    "type": _type,
    "anyOf": _any_of,
    "enum": _enum,
    "const": _enum,
    "not": _not,
}
