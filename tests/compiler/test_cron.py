"""Reading cron expressions: each field's values, shorthands, and errors that name the field."""

from __future__ import annotations

import pytest

from flowlane.compiler import cron


def test_fields_steps_ranges_lists_and_names() -> None:
    parsed = cron.parse("*/15 9-17/4 1,15 jan,Jul mon-fri")
    assert parsed == cron.Cron((0, 15, 30, 45), (9, 13, 17), (1, 15), (1, 7), (1, 2, 3, 4, 5))
    assert cron.parse("5/20 0 * * 7").minutes == (5, 25, 45)
    assert cron.parse("0 0 * * 7").weekdays == (0,)  # 7 is Sunday, like 0
    star = cron.parse("0 0 * * *")
    assert star.days is None and star.weekdays is None and star.months == tuple(range(1, 13))


@pytest.mark.parametrize(("shorthand", "same"), [
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"), ("@DAILY", "0 0 * * *"),
])
def test_shorthands(shorthand: str, same: str) -> None:
    assert cron.parse(shorthand) == cron.parse(same)


@pytest.mark.parametrize(("expression", "field", "words"), [
    ("60 * * * *", "minute", "60 is out of range (allowed: 0-59)"),
    ("0 24 * * *", "hour", "24 is out of range (allowed: 0-23)"),
    ("0 0 0 * *", "day of month", "0 is out of range (allowed: 1-31)"),
    ("0 0 * 13 *", "month", "13 is out of range (allowed: 1-12 or JAN-DEC)"),
    ("0 0 * * 8", "day of week", "8 is out of range (allowed: 0-7 or SUN-SAT)"),
    ("0 0 * * funday", "day of week", "'funday' is not a number"),
    ("5-1 * * * *", "minute", "the range 5-1 runs backwards"),
    ("*/0 * * * *", "minute", "the step after / must be a whole number of at least 1"),
    ("0 0 30 2 *", "day of month", "never comes in month 2"),
    ("* * * *", None, "has 5 fields"),
    ("@fortnightly", None, "unknown shorthand"),
])
def test_errors_name_the_field_and_its_range(expression: str, field: str | None, words: str) -> None:
    with pytest.raises(cron.CronError) as caught:
        cron.parse(expression)
    assert caught.value.field == field and words in str(caught.value)


def test_a_day_that_comes_in_some_chosen_month_is_fine() -> None:
    assert cron.parse("0 0 31 1,2 *").days == (31,)
    assert cron.parse("0 0 29 2 *").months == (2,)  # leap years
    assert cron.parse("0 0 31 2 1").weekdays == (1,)  # either day field: Mondays of February
