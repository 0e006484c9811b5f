"""The YAML key reference (docs/yaml-reference.md), generated from the published JSON Schema
so that the two cannot drift: ``python -m flowlane.compiler.reference --write`` regenerates
it; tests/compiler/test_reference.py fails while the file is stale."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flowlane.compiler import schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "yaml-reference.md"
HEADER = """# YAML reference

Every key of a flowlane document, its type, its default and what it means. Generated from
the JSON Schema that `flowlane schema` prints (the file editors check flows against) by
`python -m flowlane.compiler.reference --write`; edit the schema, not this file.

A file holds one or more documents separated by `---`; each document has a `kind`. Unknown
keys and duplicate keys are errors. Plain values are read YAML 1.2 style: only `true`,
`false`, `null`/`~`/empty, decimal integers and finite decimal numbers are not text
(`yes`, `off`, `2024-01-01` and `0x10` stay text).
"""
SECTIONS = [
    ("`kind: flow`", ("flow",), "One concrete, immutable flow version."),
    ("`defaults` (in a flow)", ("flow", "defaults"), None),
    ("`steps.<step>` (in a flow)", ("flow", "steps", "<step>"), None),
    ("`concurrency` (in a flow or a step)", ("concurrency",), None),
    ("`kind: alias`", ("alias",), None),
    ("`kind: worker`", ("worker",), None),
    ("`kind: queue`", ("queue_limits",), None),
    ("`rate_limit` (in a queue)", ("queue_limits", "rate_limit"), None),
]


def _defs() -> dict[str, Any]:
    defs: dict[str, Any] = schema.published()["$defs"]
    return defs


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` merged in (the node's own keys win)."""
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    target = _resolve(_defs()[ref.removeprefix("#/$defs/")])
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _object(path: tuple[str, ...]) -> dict[str, Any]:
    node = _resolve(_defs()[path[0]])
    for part in path[1:]:
        node = _resolve(node["properties"][part] if part != "<step>"
                        else node["additionalProperties"])
    return node


def _type(node: dict[str, Any]) -> str:
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " | ".join(f"`{value}`" for value in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type(_resolve(branch)) for branch in node["anyOf"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(_resolve(node.get('items', {})))}"
    if kind == "object" and "additionalProperties" in node:
        extra = node["additionalProperties"]
        if isinstance(extra, dict):
            target = _resolve(extra)
            shown = "a step (below)" if target.get("type") == "object" else _type(target)
            return f"mapping to {shown}"
    if node.get("x-flowlane-name"):
        return f"{node['x-flowlane-name']} name" if node["x-flowlane-name"] != "slug" else "slug"
    words = {"string": "text", "integer": "integer", "object": "mapping", "boolean": "boolean"}
    text = words.get(str(kind), str(kind))
    if "minimum" in node:
        text += f" {node['minimum']}..{node['maximum']}" if "maximum" in node else \
            f" >= {node['minimum']}"
    return text


def _default(key: str, node: dict[str, Any], required: list[str]) -> str:
    if key in required:
        return "required"
    if "default" in node:
        return f"`{json.dumps(node['default'])}`"
    return ""


def _meaning(raw: dict[str, Any], value: dict[str, Any]) -> str:
    """The key's description; for a choice among named modes also what each mode does."""
    own = str(value.get("description", ""))
    if "$ref" in raw and "enum" in value:
        shared = _defs()[raw["$ref"].removeprefix("#/$defs/")].get("description")
        if shared and shared != own:
            return f"{own} {shared}"
    return own


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(title: str, path: tuple[str, ...], fallback: str | None) -> str:
    node = _object(path)
    lines = [f"## {title}", "", _cell(node.get("description") or fallback or ""), "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    required = node.get("required", [])
    for key, raw in node.get("properties", {}).items():
        value = _resolve(raw)
        lines.append(f"| `{key}` | {_cell(_type(value))} | {_default(key, value, required)} "
                     f"| {_cell(_meaning(raw, value))} |")
    return "\n".join(lines) + "\n"


def render() -> str:
    """The reference as Markdown."""
    return "\n".join([HEADER, *(_section(*section) for section in SECTIONS)])


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
