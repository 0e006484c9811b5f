"""Human-readable rendering of a run (``flowlane run``)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowlane.runtime.run_state import RunState

SHOWN_ERROR_CHARS = 120


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _one_line(text: str | None, limit: int = SHOWN_ERROR_CHARS) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def started_by(run: dict[str, Any]) -> str:
    """What started a run: a trigger and the row's key, a webhook and the delivery id, a
    schedule, a parent run, or a call."""
    origin = run.get("origin") or {}
    if "trigger" in origin:
        row = json.dumps(origin.get("row"), ensure_ascii=False, separators=(", ", ": "))
        return f"trigger {origin['trigger']} ({origin.get('op')} of row {row})"
    if "webhook" in origin:
        return f"webhook {origin['webhook']} (delivery {origin.get('delivery')})"
    if run.get("schedule_name"):
        return f"schedule {run['schedule_name']}"
    if run.get("parent_run_id"):
        return f"run {run['parent_run_id']} (a child flow step)"
    return "a call (start_flow, flowlane start)"


def render_run(run_state: RunState) -> str:
    """``flowlane run``: the run's document (its times as the SQL Core wrote them), in lines."""
    state = run_state.to_json()
    run = state["run"]
    lines = [
        f"{'run':<10}{run['run_id']}",
        f"{'flow':<10}{run['flow_slug']}",
        f"{'status':<10}{run['status']}",
        f"{'started':<10}{run.get('started_at')}",
        f"{'by':<10}{started_by(run)}",
    ]
    for key in ("completed_at", "failed_at", "cancelled_at", "retried_at"):
        if run.get(key):
            lines.append(f"{key.split('_')[0]:<10}{run[key]}")
    lines.extend(_time_lines(run))
    if run.get("retry_count"):
        lines.append(f"{'retries':<10}{run['retry_count']}")
    if run.get("cancel_reason"):
        lines.append(f"{'reason':<10}{run['cancel_reason']}")
    if run.get("error_message"):
        lines.append(f"{'error':<10}{run['error_message']}")
    parent = state.get("parent")
    if parent:
        lines.append(f"{'parent':<10}{parent['run_id']} ({parent['flow_slug']}, {parent['status']}; "
                     f"step {parent['step_slug']}[{parent['task_index']}])")
    lines.extend(_failure_lines(state))
    lines.append("")
    lines.extend(_step_table(state))
    lines.extend(_holds(state))
    lines.extend(_waits(state))
    lines.extend(_children(state))
    lines.extend(_compensations(state))
    history = state.get("attempts") or []
    failed = [item for item in history if item["outcome"] != "superseded"]
    if failed:
        lines.append("")
        lines.append("failed attempts")
        lines.extend(_attempt_line(item, run, _typed_error(item)) for item in failed)
        lines.append(f"  (`flowlane run {run['run_id']} --format json` includes the tracebacks)")
    superseded = [item for item in history if item["outcome"] == "superseded"]
    if superseded:
        lines.append("")
        lines.append("superseded by a rerun (completed, then run again)")
        lines.extend(_attempt_line(item, run, f"output {json.dumps(item.get('output'), ensure_ascii=False)}")
                     for item in superseded)
    if run.get("output") is not None:
        lines.append("")
        lines.append("output")
        lines.append(json.dumps(run["output"], indent=2, ensure_ascii=False))
    return "\n".join(lines)


def _time_lines(run: dict[str, Any]) -> list[str]:
    """A delayed start, a deadline, an idempotency key, a schedule: when the run has one."""
    lines = []
    if run.get("status") == "waiting" and run.get("start_at"):
        lines.append(f"{'starts':<10}{run.get('start_at')}")
    if run.get("deadline_at"):
        lines.append(f"{'deadline':<10}{run['deadline_at']}")
    if run.get("idempotency_key"):
        lines.append(f"{'key':<10}{run['idempotency_key']} (under {run.get('called_as')})")
    if run.get("schedule_name"):
        slot = run.get("schedule_slot")
        lines.append(f"{'schedule':<10}{run['schedule_name']} " + (f"slot {slot}" if slot else "(run now)"))
    return lines


def wait_note(wait: dict[str, Any]) -> str:
    """What a wait step waits for, since when and until when, or the signal it got."""
    signal = wait.get("signal")
    if wait["status"] == "started":
        until = f", gives up at {wait['expires_at']}" if wait.get("expires_at") else ""
        return f"waiting for a signal since {wait['waiting_since']}{until}"
    if signal is None:
        return "no signal"
    if signal.get("applied_at") is None:
        return f"signal kept since {signal['received_at']}: it completes the step when it starts"
    return signal_words(signal.get("payload"), signal["applied_at"])


UNNAMED_SENDER = "an unnamed sender"


def signal_words(payload: Any, at: datetime | str) -> str:
    """How a signal that completed its wait step is told, by ``flowlane run``, ``flowlane
    signal`` and the console alike: "completed by a signal from ada at 2026-05-01 12:00:03
    UTC", "approved" or "rejected" for a decision (a boolean ``approved``), and the sender
    its payload's ``by`` names, else "an unnamed sender"."""
    body = payload if isinstance(payload, dict) else {}
    approved = body.get("approved")
    what = ("approved" if approved else "rejected") if isinstance(approved, bool) else "completed"
    by = body.get("by")
    sender = by.strip() if isinstance(by, str) and by.strip() else UNNAMED_SENDER
    return f"{what} by a signal from {sender} at {utc_seconds(at)}"


def utc_time(at: datetime | str) -> str:
    """A time in UTC to the second, as the CLI and the console show times."""
    moment = datetime.fromisoformat(at) if isinstance(at, str) else at
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


def utc_seconds(at: datetime | str) -> str:
    return f"{utc_time(at)} UTC"


def _waits(state: dict[str, Any]) -> list[str]:
    waits = state.get("waits") or []
    if not waits:
        return []
    lines = ["", "wait steps"]
    lines += [f"  {w['step_slug']:<22} {wait_note(w)}" for w in waits]
    started = [w["step_slug"] for w in waits if w["status"] == "started"]
    if started:
        lines.append(f"  ({signal_hint(state['run']['run_id'], started)})")
    return lines


def signal_hint(run_id: str, steps: list[str]) -> str:
    """The command that completes one of the wait steps ``steps`` of a run, by their names."""
    others = f" (or {', '.join(steps[1:])} in its place)" if steps[1:] else ""
    return f"`flowlane signal {run_id} {steps[0]} --data JSON`{others} completes " + (
        "it" if len(steps) == 1 else "one")


HOLDS_SHOWN = 10  # lines of "waiting for"; the JSON output has every task


def hold_lines(holds: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(what, why) for each thing a run waits for (``run_waits`` rows): the run itself (with
    its place in line), its steps (a signal, a child run) and its tasks, those of one step
    that wait for the same thing counted on one line."""
    found: dict[tuple[str, str], int | None] = {}
    for hold in holds:
        if _delayed_start(hold):
            continue  # the run's `starts` line says when
        if hold["step_slug"] is None:
            found[("run", _run_reason(hold))] = None
        elif hold["task_index"] is None:
            found[(hold["step_slug"], hold["waiting_for"])] = None
        else:
            key = (hold["step_slug"], hold["waiting_for"])
            found[key] = (found.get(key) or 0) + 1
    return [(what if n is None else f"{what}: {plural(n, 'task')}", why)
            for (what, why), n in found.items()]


def _delayed_start(hold: dict[str, Any]) -> bool:
    """A run waiting for its start time (a debounced run says more: until its key's starts pause)."""
    return (hold["step_slug"] is None and not hold.get("place")
            and not str(hold["waiting_for"]).startswith("debounce "))


def first_waits(holds: list[dict[str, Any]]) -> dict[str, str]:
    """Per run id, the first thing it waits for (``run_waits`` rows, in their order): the
    WAITING FOR of a runs list. A delayed start is left out (the list shows its start), and a
    held run's place in line (`flowlane run` says it)."""
    first: dict[str, str] = {}
    for hold in holds:
        if _delayed_start(hold):
            continue
        first.setdefault(str(hold["run_id"]), hold["waiting_for"])
    return first


def _run_reason(hold: dict[str, Any]) -> str:
    place = f" ({_ordinal(hold['place'])} in line)" if hold.get("place") else ""
    return str(hold["waiting_for"]) + place


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _holds(state: dict[str, Any]) -> list[str]:
    shown = hold_lines(state.get("holds") or [])
    if not shown:
        return []
    lines = ["", "waiting for"]
    lines += [f"  {what:<24} {why}" for what, why in shown[:HOLDS_SHOWN]]
    if len(shown) > HOLDS_SHOWN:
        lines.append(f"  ... and {len(shown) - HOLDS_SHOWN} more (`--format json` lists them)")
    return lines


def _failure_lines(state: dict[str, Any]) -> list[str]:
    """The run of the flow's failure handler, or the failed run this run handles."""
    lines = []
    for key, label in (("failure_handler", "handler"), ("failure_of", "handles")):
        other = state.get(key)
        if other:
            lines.append(f"{label:<10}{other['run_id']} ({other['flow_slug']}, {other['status']})")
    if state["run"].get("compensation"):
        lines.append(f"{'undo':<10}compensation {state['run']['compensation']}")
    undone = state.get("compensation_of")
    if undone:
        lines.append(f"{'undoes':<10}step {undone['step_slug']} of run {undone['run_id']} "
                     f"({undone['flow_slug']}, {undone['status']})")
    return lines


def _compensations(state: dict[str, Any]) -> list[str]:
    """A failed run's compensations, in the order they start."""
    found = state.get("compensations") or []
    if not found:
        return []
    lines = ["", "compensations (last step first)"]
    lines += [f"  {c['step_slug']:<24} {c['status']:<10} {c['run_id'] or '-'}  {c['flow_slug'] or ''}"
              for c in found]
    if state["run"].get("compensation") == "stopped":
        lines.append(f"  (stopped: `flowlane retry {state['run']['run_id']} --compensation` resumes it)")
    return lines


def _children(state: dict[str, Any]) -> list[str]:
    children = state.get("children") or []
    if not children:
        return []
    lines = ["", "child runs"]
    lines += [f"  {c['step_slug'] + '[' + str(c['task_index']) + ']':<24} {c['run_id']}  "
              f"{c['flow_slug']:<24} {c['status']}" for c in children]
    lines.append(f"  (`flowlane runs --parent {state['run']['run_id']}` lists them)")
    return lines


def _round(item: dict[str, Any], run: dict[str, Any]) -> str:
    """Which round of the run an attempt belongs to: the first one, or retry N (as the
    console says it); nothing to say for a run never retried."""
    round_ = item.get("retry_round") or 0
    if round_:
        return f", retry {round_}"
    return ", first run" if run.get("retry_count") else ""


def _attempt_line(item: dict[str, Any], run: dict[str, Any], what: str) -> str:
    where = f"{item['step_slug']}[{item['task_index']}]"
    return f"  {where:<24} attempt {item['attempt']}{_round(item, run)}  {_one_line(what)}"


def _typed_error(item: dict[str, Any]) -> str:
    """``Type: message`` once, whether or not the message already starts with its type."""
    kind = item.get("error_type") or item["outcome"]
    message = item.get("error_message") or ""
    return message if message.startswith(f"{kind}:") else f"{kind}: {message}"


def _step_table(state: dict[str, Any]) -> list[str]:
    tasks_by_step: dict[str, Counter[str]] = {}
    attempts: dict[str, int] = {}
    errors: dict[str, str] = {}
    for task in state.get("tasks", []):
        slug = task["step_slug"]
        tasks_by_step.setdefault(slug, Counter())[task["status"]] += 1
        attempts[slug] = attempts.get(slug, 0) + task["attempts_count"]
        if task.get("error_message"):
            errors[slug] = task["error_message"]
    retries = state["run"].get("retry_count") or 0
    for item in state.get("attempts") or []:  # attempts of tasks an earlier round replaced
        if (item.get("retry_round") or 0) < retries:
            attempts[item["step_slug"]] = attempts.get(item["step_slug"], 0) + 1
    ended = state["run"]["status"] != "started"
    rows = [f"{'STEP':<24} {'STATUS':<10} {'TASKS':<26} {'EXECUTIONS':<11} LAST ERROR / NOTE"]
    for step in state.get("steps", []):
        slug = step["step_slug"]
        counts = tasks_by_step.get(slug, Counter())
        tasks = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "-"
        tried = str(attempts[slug]) if attempts.get(slug) else "-"
        error = step.get("error_message") or errors.get(slug)
        note = _one_line(error) if error else _cache_note(state, slug)
        if ended and step["status"] in ("created", "cancelled") and not counts:
            note = f"not started: the run {state['run']['status']} first"
        if step.get("skip_reason"):
            note = f"skipped: {step['skip_reason']}" + (f" ({note})" if note else "")
        rows.append(f"{slug:<24} {step['status']:<10} {tasks:<26} {tried:<11} {note}".rstrip())
    return rows


def _cache_note(state: dict[str, Any], slug: str) -> str:
    """A step whose tasks completed from its cache (without a worker) says so."""
    tasks = [t for t in state.get("tasks", []) if t["step_slug"] == slug]
    cached = sum(1 for t in tasks if t.get("cached"))
    if not cached:
        return ""
    return "cached: completed from the cache" if cached == len(tasks) else \
        f"cached: {cached} of {len(tasks)} tasks completed from the cache"
