"""Human-readable rendering of a run (``flowlane run``)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def render_run(state: dict[str, Any]) -> str:
    run = state["run"]
    lines = [
        f"{'run':<10}{run['run_id']}",
        f"{'flow':<10}{run['flow_slug']}",
        f"{'status':<10}{run['status']}",
        f"{'started':<10}{run.get('started_at')}",
    ]
    for key in ("completed_at", "failed_at"):
        if run.get(key):
            lines.append(f"{key.split('_')[0]:<10}{run[key]}")
    if run.get("error_message"):
        lines.append(f"{'error':<10}{run['error_message']}")
    tasks_by_step: dict[str, Counter[str]] = {}
    attempts: dict[str, int] = {}
    for task in state.get("tasks", []):
        tasks_by_step.setdefault(task["step_slug"], Counter())[task["status"]] += 1
        slug = task["step_slug"]
        attempts[slug] = max(attempts.get(slug, 0), task["attempts_count"])
    lines.append("")
    lines.append(f"{'STEP':<28} {'STATUS':<10} {'TASKS':<24} NOTE")
    for step in state.get("steps", []):
        slug = step["step_slug"]
        counts = tasks_by_step.get(slug, Counter())
        tasks = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "-"
        note = step.get("skip_reason") or step.get("error_message") or ""
        if attempts.get(slug, 0) > 1:
            note = f"{note} (max attempt {attempts[slug]})".strip()
        lines.append(f"{slug:<28} {step['status']:<10} {tasks:<24} {note}")
    if run.get("output") is not None:
        lines.append("")
        lines.append("output")
        lines.append(json.dumps(run["output"], indent=2, ensure_ascii=False))
    return "\n".join(lines)
