"""The YAML key reference (docs/yaml-reference.md), generated from the published JSON Schema
and the compiler's own tables so that neither can drift from it:
``python -m flowlane.compiler.reference --write`` regenerates it;
tests/compiler/test_reference.py fails while the file is stale.

Every kind of the schema gets a section, and so does every mapping with keys of its own
inside one (a mapping that several keys share, such as ``concurrency``, gets one section
naming every place it appears)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlane.compiler import cron, schema
from flowlane.compiler.checks.flows import HANDLER_OPTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "yaml-reference.md"
COMMAND = "python -m flowlane.compiler.reference --write"
HEADER = f"""# YAML reference

Every key of a flowlane document, its type, its default and what it means. Generated from
the JSON Schema that `flowlane schema` prints (the file editors check flows against) and the
compiler's own tables (cron fields, the options a step without a handler refuses) by
`{COMMAND}`; edit those, not this file.

A file holds one or more documents separated by `---`; each document has a `kind`. Unknown
keys and duplicate keys are errors. Plain values are read YAML 1.2 style: only `true`,
`false`, `null`/`~`/empty, decimal integers and finite decimal numbers are not text
(`yes`, `off`, `2024-01-01` and `0x10` stay text).
"""
REF = "#/$defs/"
WORDS = {"string": "text", "integer": "integer", "number": "number", "object": "mapping",
         "boolean": "boolean", "array": "list"}


@dataclass
class Section:
    """A mapping of the schema with keys of its own, and where documents hold it."""

    kind: str
    node: dict[str, Any]
    definition: str | None  # the ``$defs`` name the mapping comes from, if any
    paths: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        if not self.paths[0]:
            return f"`kind: {self.kind}`"
        return f"{' and '.join(f'`{path}`' for path in self.paths)} (in `kind: {self.kind}`)"


def _defs() -> dict[str, Any]:
    defs: dict[str, Any] = schema.published()["$defs"]
    return defs


def _ref_name(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref.removeprefix(REF) if isinstance(ref, str) else None


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` merged in (the node's own keys win)."""
    name = _ref_name(node)
    if name is None:
        return node
    target = _resolve(_defs()[name])
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def kinds() -> list[tuple[str, str]]:
    """``(kind, the $defs name of its document)`` for every kind, in the schema's order."""
    published = schema.published()
    by_kind = {rule["if"]["properties"]["kind"]["const"]: str(_ref_name(rule["then"]))
               for rule in published["allOf"]}
    return [(kind, by_kind[kind]) for kind in published["$defs"]["kind"]["enum"]]


def _placeholder(key: str) -> str:
    return f"<{key.removesuffix('s')}>"


def _nested(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, raw node)`` of every mapping with keys of its own directly inside ``node``."""
    for key, raw in node.get("properties", {}).items():
        value = _resolve(raw)
        inner = f"{path}.{key}" if path else key
        if "properties" in value:
            yield inner, raw
        extra = value.get("additionalProperties")
        if isinstance(extra, dict) and "properties" in _resolve(extra):
            yield f"{inner}.{_placeholder(key)}", extra


def sections() -> list[Section]:
    """Every kind's section followed by those of the mappings inside it, in schema order."""
    found: list[Section] = []
    for kind, definition in kinds():
        own: dict[str, Section] = {}
        _collect(kind, "", {"$ref": REF + definition}, own)
        found.extend(own.values())
    return found


def _collect(kind: str, path: str, raw: dict[str, Any], own: dict[str, Section]) -> None:
    definition = _ref_name(raw)
    node = _resolve({"$ref": raw["$ref"]} if definition else raw)  # a shared one as defined
    key = definition or path
    if key in own:
        own[key].paths.append(path)
        return
    own[key] = Section(kind, node, definition, [path])
    for inner, inner_raw in _nested(node, path):
        _collect(kind, inner, inner_raw, own)


def _range(node: dict[str, Any]) -> str:
    if "minimum" in node and "maximum" in node:
        return f" {node['minimum']}..{node['maximum']}"
    return f" >= {node['minimum']}" if "minimum" in node else ""


def _count(node: dict[str, Any], keyword: str, unit: str) -> str:
    """``, 1..128 characters`` for ``minLength``/``maxLength`` and the like."""
    low, high = node.get(f"min{keyword}"), node.get(f"max{keyword}")
    if low is not None and high is not None:
        return f", {low}..{high} {unit}s"
    if low is not None:
        return f", at least {low} {unit}{'s' if low != 1 else ''}"
    return f", at most {high} {unit}s" if high is not None else ""


def _named(raw: dict[str, Any], node: dict[str, Any]) -> str | None:
    """The name a value of a shared text definition goes by (described under "Values")."""
    if node.get("x-flowlane-name"):
        name = str(node["x-flowlane-name"])
        return name if name == "slug" else f"{name} name"
    definition = _ref_name(raw)
    if definition and node.get("type") == "string" and "pattern" in node:
        return definition.replace("_", " ").replace("json", "JSON")
    return None


def _type(raw: dict[str, Any], path: str = "") -> str:
    """The type of a key at ``path`` (a mapping with keys of its own is named by its path)."""
    node = _resolve(raw)
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " | ".join(f"`{value}`" for value in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type(branch) for branch in node["anyOf"])
    named = _named(raw, node)
    if named:
        return named
    kind = node.get("type")
    if kind is None:
        return "any JSON value"
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}{_count(node, 'Items', 'item')}"
    if kind == "object":
        return _mapping(node, path)
    text = WORDS.get(str(kind), str(kind))
    if kind == "string":
        return text + _count(node, "Length", "character")
    return text + _range(node)


def _mapping(node: dict[str, Any], path: str) -> str:
    if "properties" in node:
        return f"mapping: `{path}` below"
    extra = node.get("additionalProperties")
    if not isinstance(extra, dict):
        return "mapping"
    inner = f"{path}.{_placeholder(path.rpartition('.')[2])}"
    shown = f"`{inner}` below" if "properties" in _resolve(extra) else _type(extra, inner)
    names = node.get("propertyNames")
    keys = f" of {_type(names)} keys" if isinstance(names, dict) else ""
    return f"mapping{keys} to {shown}{_count(node, 'Properties', 'key')}"


def _default(key: str, node: dict[str, Any], required: list[str]) -> str:
    if key in required:
        return "required"
    if "default" in node:
        return f"`{json.dumps(node['default'])}`"
    return ""


def _meaning(raw: dict[str, Any], value: dict[str, Any]) -> str:
    """The key's description; for a choice among named modes also what each mode does."""
    own = str(value.get("description", ""))
    definition = _ref_name(raw)
    if definition and "enum" in value:
        shared = _defs()[definition].get("description")
        if shared and shared != own:
            return f"{own} {shared}"
    return own


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: Sequence[tuple[str, ...]], heading: tuple[str, ...]) -> list[str]:
    return [f"| {' | '.join(heading)} |", f"|{'---|' * len(heading)}",
            *(f"| {' | '.join(_cell(cell) for cell in row)} |" for row in rows)]


def _rows(node: dict[str, Any], path: str) -> list[tuple[str, ...]]:
    required = node.get("required", [])
    return [(f"`{key}`", _type(raw, f"{path}.{key}" if path else key),
             _default(key, _resolve(raw), required),
             _meaning(raw, _resolve(raw)))
            for key, raw in node.get("properties", {}).items()]


def _step_note() -> str:
    kept_out = "; ".join(f"a {kind} step takes no {', '.join(f'`{option}`' for option in options)}"
                         for kind, options in HANDLER_OPTIONS.items())
    return f"Options that concern a handler: {kept_out} (it runs no handler)."


def _cron_note() -> str:
    fields = ", ".join(f"{item.name} {item.allowed}" for item in cron.FIELDS)
    shorthands = ", ".join(f"`{name}` (`{expression}`)" for name, expression in cron.SHORTHANDS.items())
    return (f"`cron` has five fields, in order: {fields}. A field is `*` or a comma-separated list "
            "of `N` and `A-B`, each optionally `/STEP` (`*/15`, `0-30/10`, `5/20` = 5 to the field's "
            "end every 20); months and weekdays also by their three-letter names (`JAN`, `MON`); "
            "weekday 7 is Sunday like 0; when both day fields are restricted, a day matches when "
            f"either does. Shorthands: {shorthands}.")


NOTES = {"step": _step_note, "schedule": _cron_note}


def _section(section: Section) -> str:
    node = section.node
    lines = [f"## {section.title}", "", _cell(str(node.get("description", ""))), "",
             *_table(_rows(node, section.paths[0]), ("key", "type", "default", "meaning"))]
    note = NOTES.get(section.definition or "")
    if note:
        lines += ["", note()]
    return "\n".join(lines) + "\n"


def _values() -> str:
    """The shared text definitions rows name as a type, with what they accept."""
    named = {name: _named({"$ref": REF + name}, _resolve({"$ref": REF + name}))
             for name in _defs()}
    rows = [(str(shown), str(_defs()[name]["description"]))
            for name, shown in named.items() if shown]
    return "\n".join(["## Values", "", "What the named types in the tables above accept.", "",
                      *_table(rows, ("type", "what it is"))]) + "\n"


def _kinds() -> str:
    listed = ", ".join(f"`{kind}`" for kind, _ in kinds())
    return f"`kind` is one of {listed}; each has a section below.\n"


def render() -> str:
    """The reference as Markdown."""
    return "\n".join([HEADER, _kinds(), *(_section(section) for section in sections()), _values()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {DOC.name}")
    args = parser.parse_args(argv)
    if args.write:
        DOC.write_text(render(), encoding="utf-8")
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
