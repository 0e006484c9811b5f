"""A step's cache (docs/flow-control.md, "Step caches"): its model, its fingerprint and the
checks of its time to live and key pointers against the schema of the step's input."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from flowlane.compiler import codes, contracts, durations, shape
from flowlane.compiler.model import Step, StepCache


class _Flow(Protocol):
    """What the checks need of a flow document's checker (checks.flows.FlowChecker)."""

    steps: dict[str, Any]

    def error(self, path: tuple[str | int, ...], code: str, message: str,
              help: str | None = None, *, key: bool = False) -> None: ...


class _Contracts(Protocol):
    """What the checks need of the flow's contracts (checks.flow_contracts.FlowContracts)."""

    input_contract: contracts.Contract | None

    def _seen_as(self, need: str) -> dict[str, Any] | None: ...


def step_cache(spec: Mapping[str, Any]) -> StepCache | None:
    """The ``cache`` of a checked step; a single key pointer is a list of one."""
    value = spec.get("cache")
    if value is None:
        return None
    key = value.get("key")
    return StepCache(durations.to_seconds(value["ttl"]),
                     None if key is None else (key,) if isinstance(key, str) else tuple(key))


def fingerprint(step: Step) -> str:
    """What a cache entry is kept under besides the flow, the step and the key: the step's
    shape and its handler, so that a changed handler never finds the older outputs."""
    identity = {"step": shape.step_shape(step), "handler": step.handler}
    return shape.shape_sha256(identity)[:32]


def check(checker: _Flow, known: _Contracts) -> None:
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


def _check_pointers(checker: _Flow, known: _Contracts, slug: str, spec: dict[str, Any],
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


def _input_schema(known: _Contracts, spec: dict[str, Any]) -> Callable[[str], str | None]:
    """Why a pointer into the step's input is never present, by the schemas known: the run input
    (a root step), ``{need: output}`` (a step with needs); a map task's input is an item."""
    needs = list(spec.get("needs", []))
    mapped = spec.get("type") == "map"
    if not needs:
        schema = known.input_contract.schema if known.input_contract else None
        return _by_schema(_item(schema) if mapped else schema, "by the input_schema, ")
    if mapped:
        return _by_schema(_item(known._seen_as(needs[0])), f"by the output_schema of `{needs[0]}`, ")

    def of_needs(pointer: str) -> str | None:
        first = pointer.split("/")[1].replace("~1", "/").replace("~0", "~")
        if first not in needs:
            return f"the step's input holds the outputs of {', '.join(f'`{n}`' for n in needs)} only"
        rest = pointer[len(pointer.split("/")[1]) + 1:]
        schema = known._seen_as(first)
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
