"""Data shaping for the console's pages: rows from :mod:`flowlane.app.console` to template context."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from flowlane.compiler.model import Flow, Step
from flowlane.runtime.report import utc_time


def flow_model(flow: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> Flow:
    """The compiled model of a flow as the database holds it (handlers are not stored there)."""
    return Flow(
        slug=flow["flow_slug"],
        queue_mode=flow["queue_mode"],
        max_attempts=flow["opt_max_attempts"],
        base_delay=flow["opt_base_delay"],
        timeout=flow["opt_timeout"],
        steps=tuple(
            Step(
                slug=s["step_slug"], index=s["step_index"], handler=None, queue=s["queue_name"],
                needs=tuple(s["needs"]), type=s["step_type"],
                condition_if=s["required_input_pattern"], condition_unless=s["forbidden_input_pattern"],
                when_unmet=s["when_unmet"], when_exhausted=s["when_exhausted"],
                max_attempts=s["opt_max_attempts"], base_delay=s["opt_base_delay"],
                timeout=s["opt_timeout"], start_delay=s["opt_start_delay"], flow=s["child_flow"],
            )
            for s in steps
        ),
    )


def alias_roles(aliases: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per concrete slug, how aliases use it: ``"name (active)"`` / ``"name (draining)"``."""
    roles: dict[str, list[str]] = {}
    for alias in aliases:
        roles.setdefault(alias["active"], []).append(f"{alias['alias']} (active)")
        for slug in alias["draining"]:
            roles.setdefault(slug, []).append(f"{alias['alias']} (draining)")
    return roles


def duration(start: datetime | None, end: datetime | None, now: datetime | None = None) -> str:
    """From ``start`` to ``end``; a running one counts up to now."""
    if start is None:
        return ""
    return seconds_text(((end or now or datetime.now(UTC)) - start).total_seconds())


def seconds_text(seconds: float) -> str:
    """``1.25 s``, ``3 min 4 s``, ``2 h 5 min``."""
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def timestamp(value: datetime | None) -> str:
    return utc_time(value) if value else ""


def age(seconds: float | None) -> str:
    """A heartbeat's or message's age: whole seconds up to two minutes."""
    if seconds is None:
        return ""
    return f"{seconds:.0f} s" if seconds < 120 else seconds_text(seconds)


def size(count: int | None) -> str:
    if count is None:
        return ""
    if count < 1024:
        return f"{count} B"
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / (1024 * 1024):.1f} MiB"


def parse_time(text: str | None) -> datetime | None:
    """An ISO date/time from a filter field; naive values are UTC. None when empty."""
    if not text:
        return None
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def worker_state(worker: Mapping[str, Any]) -> str:
    """stopped, stale, deprecated or live (``live``: the database's flowlane.worker_is_live)."""
    if worker["stopped_at"] is not None:
        return "stopped"
    if not worker["live"]:
        return "stale"
    if worker["deprecated_at"] is not None:
        return "deprecated"
    return "live"


def sparkline(counts: Sequence[int], width: int = 150, height: int = 28) -> dict[str, Any]:
    """Bars of a small throughput chart (drawn by the template): oldest minute first."""
    peak = max(counts, default=0) or 1
    bar = width / max(len(counts), 1)
    return {
        "width": width, "height": height, "total": sum(counts), "peak": max(counts, default=0),
        "bars": [
            {"x": round(i * bar, 1), "w": round(bar - 1, 1), "h": round(height * c / peak, 1),
             "y": round(height - height * c / peak, 1), "count": c, "minutes_ago": len(counts) - 1 - i}
            for i, c in enumerate(counts)
        ],
    }
