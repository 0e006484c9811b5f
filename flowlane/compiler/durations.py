"""Durations in YAML: an integer of seconds, or a whole number and a unit (``90s``,
``5m``, ``2h``, ``1d``). Compiled SQL always holds seconds.

The JSON Schema states the written form (``$defs/duration``) so that editors check it; this
module turns it into seconds and the analyzer checks the result against the option's range,
which the schema states once, on the integer form.
"""

from __future__ import annotations

import re
from typing import Final

UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# at most 10 digits: a wider number cannot be in range for any option, and the bound keeps
# the conversion cheap on hostile input
PATTERN: Final = re.compile(r"([0-9]{1,10})([smhd])")


def to_seconds(value: int | str) -> int:
    """Seconds of an integer or a duration text; ``ValueError`` for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = PATTERN.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"`{value}` is not a duration: write a whole number and a unit "
            "(`30s`, `5m`, `2h`, `1d`) or an integer of seconds"
        )
    return int(match[1]) * UNITS[match[2]]

