"""Schedule documents: flows started by the clock."""

from __future__ import annotations

import functools
import zoneinfo
from typing import Any

from flowlane.compiler import codes, contracts, cron, durations
from flowlane.compiler.checks.shared import Analysis, Entry, closest, named_once, start_target
from flowlane.compiler.model import Flow, Schedule


def build_schedules(entries: list[Entry], state: Analysis) -> list[Schedule]:
    return named_once(entries, state, _build_schedule, codes.DUPLICATE_SCHEDULE,
                      "schedule name `{name}` is already used",
                      "give each schedule a distinct `name`")


def _build_schedule(entry: Entry, state: Analysis) -> Schedule | None:
    data = entry.data
    before = len(state.findings)
    target = _schedule_target(entry, state)
    if ("cron" in data) == ("every" in data):
        both = "cron" in data
        state.findings.append(entry.doc.diagnostic(
            ("every",) if both else ("name",), codes.INVALID_VALUE if both else codes.MISSING_KEY,
            f"schedule `{entry.slug}` " + ("has both `cron` and `every`" if both else
                                           "has neither `cron` nor `every`"),
            "give one: `cron: \"0 2 * * *\"` or `every: 10m`", key=both))
    fields = _cron_fields(entry, state) if "cron" in data else None
    zone = str(data.get("timezone", "UTC"))
    if zone not in _time_zones():
        close = closest(zone, sorted(_time_zones()))
        state.findings.append(entry.doc.diagnostic(
            ("timezone",), codes.UNKNOWN_TIME_ZONE, f"unknown time zone `{zone}`",
            f"did you mean `{close}`?" if close else "use an IANA name such as `Europe/Berlin` or `UTC`"))
    every = durations.to_seconds(data["every"]) if "every" in data else None
    if every is not None and every < 1:
        state.findings.append(entry.doc.diagnostic(
            ("every",), codes.DURATION_OUT_OF_RANGE,
                f"schedule `{entry.slug}`: `every` must be at least 1 second",
            "write an interval such as `30s`, `10m` or `1h`"))
    run_input = data.get("input", {})
    if target is not None:
        _check_schedule_input(entry, target, run_input, state)
    if len(state.findings) > before:
        return None
    return Schedule(
        name=str(data["name"]), flow=str(data["flow"]), cron=data.get("cron"), cron_fields=fields,
        every=every, timezone=zone, input=run_input, overlap=data.get("overlap", "skip"),
        catch_up=data.get("catch_up", "latest"), description=data.get("description"),
        location=entry.loc(("name",)),
    )


def _schedule_target(entry: Entry, state: Analysis) -> Flow | None:
    """The flow a schedule starts today (an alias: its active version)."""
    return start_target(entry, state, codes.SCHEDULE_UNKNOWN_FLOW, "schedule")


def _cron_fields(entry: Entry, state: Analysis) -> tuple[tuple[int, ...] | None, ...] | None:
    try:
        parsed = cron.parse(str(entry.data["cron"]))
    except cron.CronError as exc:
        state.findings.append(entry.doc.diagnostic(
            ("cron",), codes.INVALID_CRON, f"schedule `{entry.slug}`: {exc}",
            "five fields: minute hour day-of-month month day-of-week, e.g. `0 2 * * *`; "
            "or @hourly, @daily, @weekly, @monthly, @yearly"))
        return None
    return (parsed.minutes, parsed.hours, parsed.days, parsed.months, parsed.weekdays)


def _check_schedule_input(entry: Entry, flow: Flow, run_input: Any, state: Analysis) -> None:
    """The input checks a start makes that the YAML already decides: a root map's list and
    the flow's input contract."""
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None and not isinstance(run_input, list):
        state.findings.append(entry.doc.diagnostic(
            ("input",) if "input" in entry.data else ("flow",), codes.SCHEDULE_INPUT_REFUSED,
            f"schedule `{entry.slug}`: flow `{flow.slug}` maps its run input in step "
            f"`{root_map.slug}`, so the input must be a list",
            "give `input:` a list, e.g. `input: [1, 2, 3]`"))
    violation = None if flow.input_schema is None else contracts.rejects(flow.input_schema,
                                                                         run_input)
    if violation is not None:
        state.findings.append(entry.doc.diagnostic(
            ("input",) if "input" in entry.data else ("flow",), codes.INPUT_REFUSED_BY_CONTRACT,
            f"schedule `{entry.slug}`: flow `{flow.slug}` would refuse this input: {violation}",
            "change `input:` to match the flow's `input_schema`"))


@functools.cache
def _time_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) | {"UTC"}
