"""The checks of a step's cache: its time to live, and its key pointers against the schema of
the step's input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowlane.compiler import codes, contracts, durations
from flowlane.compiler.checks.flow_contracts import FlowContracts
from flowlane.compiler.checks.flow_document import FlowDocument


def check(checker: FlowDocument, known: FlowContracts) -> None:
    """FL190: a time to live under one second; FL191: a key pointer that the schema of the
    step's input says is never present (every task would share the key null there)."""
    for slug, spec in checker.steps.items():
        value = spec.get("cache") if isinstance(spec, dict) else None
        if not isinstance(value, dict) or "ttl" not in value:
            continue
        if durations.to_seconds(value["ttl"]) < 1:
            checker.error(("steps", slug, "cache", "ttl"), codes.CACHE_TTL_TOO_SHORT,
                          f"cache ttl of step `{slug}` is {value['ttl']}: nothing would be reused",
                          "give a time to live of at least 1 second (`30s`, `1h`, `7d`)")
        key = value.get("key")
        pointers = [key] if isinstance(key, str) else key if isinstance(key, list) else []
        _check_pointers(checker, known, slug, spec, pointers)


def _check_pointers(checker: FlowDocument, known: FlowContracts, slug: str, spec: dict[str, Any],
                    pointers: list[Any]) -> None:
    schema_of = _input_schema(known, spec)
    for index, pointer in enumerate(pointers):
        if not isinstance(pointer, str):
            continue
        reason = schema_of(pointer)
        if reason:
            path: tuple[str | int, ...] = ("steps", slug, "cache", "key")
            where = path if isinstance(spec["cache"]["key"], str) else (*path, index)
            checker.error(where, codes.CACHE_KEY_NEVER_PRESENT,
                          f"cache key `{pointer}` of step `{slug}` never has a value: {reason}",
                          "point at a field of the step's input (every task would share the key null)")


def _input_schema(known: FlowContracts, spec: dict[str, Any]) -> Callable[[str], str | None]:
    """Why a pointer into the step's input is never present, by the schemas known: the run input
    (a root step), ``{need: output}`` (a step with needs); a map task's input is an item."""
    needs = list(spec.get("needs", []))
    mapped = spec.get("type") == "map"
    if not needs:
        schema = known.input_contract.schema if known.input_contract else None
        return _by_schema(_item(schema) if mapped else schema, "by the input_schema, ")
    if mapped:
        return _by_schema(_item(known.seen_as(needs[0])), f"by the output_schema of `{needs[0]}`, ")

    def of_needs(pointer: str) -> str | None:
        first = pointer.split("/")[1].replace("~1", "/").replace("~0", "~")
        if first not in needs:
            return f"the step's input holds the outputs of {', '.join(f'`{n}`' for n in needs)} only"
        rest = pointer[len(pointer.split("/")[1]) + 1:]
        schema = known.seen_as(first)
        return _by_schema(schema, f"by the output_schema of `{first}`, ")(rest) if rest else None
    return of_needs


def _item(schema: dict[str, Any] | None) -> Any:
    if not isinstance(schema, dict):
        return None
    return schema.get("items", True) if "items" in schema or schema.get("type") == "array" else None


def _by_schema(schema: Any, prefix: str) -> Callable[[str], str | None]:
    def reason(pointer: str) -> str | None:
        found = contracts.never_present(schema, pointer) if isinstance(schema, dict) else None
        return None if found is None else prefix + found
    return reason
