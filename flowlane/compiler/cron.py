"""Cron expressions of ``kind: schedule``: five fields (minute hour day-of-month month
day-of-week) or a shorthand (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``).

A field is ``*`` or a comma-separated list of ``N``, ``A-B``, each optionally ``/STEP``
(``*/15``, ``1-5``, ``0-30/10``, ``5/20`` = 5 to the field's end every 20); months and weekdays
also by their English three-letter names (``JAN``, ``MON``); weekday 7 is Sunday like 0.
As in cron, a day matches when both day fields are restricted and either one matches.

This module only reads an expression into the sets of values each field allows (a field
left ``*`` as None for the two day fields); the SQL Core computes the slots from those sets
(``flowlane._schedule_slot``), so the firing rule exists once.
"""

from __future__ import annotations

from dataclasses import dataclass

SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# the days each month can have (February: 29) to refuse a day that never comes
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True)
class Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names for low, low + 1, ...

    @property
    def allowed(self) -> str:
        names = f" or {self.names[0]}-{self.names[-1]}" if self.names else ""
        return f"{self.low}-{self.high}{names}"


FIELDS = (
    Field("minute", 0, 59),
    Field("hour", 0, 23),
    Field("day of month", 1, 31),
    Field("month", 1, 12, MONTHS),
    Field("day of week", 0, 7, WEEKDAYS),
)


class CronError(ValueError):
    """A cron expression that cannot be read; ``field`` names the part at fault (or None)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Cron:
    """The values each field allows, sorted; ``days``/``weekdays`` None for ``*``."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...] | None
    months: tuple[int, ...]
    weekdays: tuple[int, ...] | None


def parse(expression: str) -> Cron:
    """The fields of a cron expression; raises :class:`CronError` naming the bad field and
    its allowed range."""
    text = SHORTHANDS.get(expression.strip().lower(), expression)
    if text.strip().startswith("@"):
        raise CronError(f"unknown shorthand {expression.strip()!r}: use one of "
                        + ", ".join(sorted(SHORTHANDS)))
    parts = text.split()
    if len(parts) != len(FIELDS):
        raise CronError(f"a cron expression has 5 fields (minute hour day-of-month month "
                        f"day-of-week), {expression!r} has {len(parts)}")
    values = [_field(part, spec) for part, spec in zip(parts, FIELDS, strict=True)]
    minutes, hours, days, months, weekdays = values
    if weekdays is not None:
        weekdays = tuple(sorted({d % 7 for d in weekdays}))
    cron = Cron(_all(minutes, FIELDS[0]), _all(hours, FIELDS[1]), days, _all(months, FIELDS[3]),
                weekdays)
    _check_days_come(cron)
    return cron


def _all(values: tuple[int, ...] | None, spec: Field) -> tuple[int, ...]:
    return values if values is not None else tuple(range(spec.low, spec.high + 1))


def _check_days_come(cron: Cron) -> None:
    if cron.days is None or cron.weekdays is not None:
        return
    if all(day > _MONTH_DAYS[month - 1] for day in cron.days for month in cron.months):
        raise CronError(f"day of month {','.join(map(str, cron.days))} never comes in month "
                        f"{','.join(map(str, cron.months))}: the schedule would never fire",
                        "day of month")


def _field(text: str, spec: Field) -> tuple[int, ...] | None:
    """The values of one field, or None for a plain ``*``."""
    if text == "*":
        return None
    found: set[int] = set()
    for item in text.split(","):
        found.update(_item(item, spec))
    return tuple(sorted(found))


def _item(item: str, spec: Field) -> range:
    span, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) < 1:
            raise _bad(spec, item, "the step after / must be a whole number of at least 1")
        step = int(step_text)
    if span == "*":
        low, high = spec.low, spec.high
    elif "-" in span:
        first, _, last = span.partition("-")
        low, high = _value(first, spec, item), _value(last, spec, item)
        if low > high:
            raise _bad(spec, item, f"the range {span} runs backwards")
    else:
        low = _value(span, spec, item)
        high = spec.high if slash else low
    return range(low, high + 1, step)


def _value(text: str, spec: Field, item: str) -> int:
    upper = text.upper()
    if upper in spec.names:
        return spec.low + spec.names.index(upper)
    if not text.isdigit():
        raise _bad(spec, item, f"{text!r} is not a number")
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise _bad(spec, item, f"{value} is out of range")
    return value


def _bad(spec: Field, item: str, why: str) -> CronError:
    return CronError(f"{spec.name} field {item!r}: {why} (allowed: {spec.allowed})", spec.name)
