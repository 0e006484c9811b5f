"""``plan``, ``apply`` and ``verify``: the compiled project against a live database.

Plan classifies every flow, alias, schedule, queue's limits and trigger: NEW_FLOW, NO_CHANGE,
SAFE_OPTION_CHANGE (options of a flow or its steps, concurrency, priority and the failure
handler among them, and a queue's limits), ALIAS_MOVE, NEW_VERSION_REQUIRED (refused),
NEW_SCHEDULE, SCHEDULE_CHANGE, NEW_TRIGGER, TRIGGER_CHANGE, TRIGGER_REMOVED and
ONLY_IN_DATABASE (flows and aliases are never deleted; a schedule, a queue's limits or a
trigger the YAML no longer declares is deleted by the schedules, queues or triggers file,
while the project declares any). Apply runs the reviewed SQL files (flows, then aliases,
schedules, queue limits and triggers) in one transaction.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from flowlane import errors, project_root
from flowlane.compiler import api, caching, check, compiled, contracts, names, shape
from flowlane.compiler.model import (
    Alias,
    Concurrency,
    Debounce,
    Flow,
    Project,
    QueueLimits,
    Schedule,
    Step,
    StepCache,
    Trigger,
)
from flowlane.core import db, definitions
from flowlane.core.queries import query


class ChangeKind(enum.StrEnum):
    """What ``flowlane plan`` says of one definition (printed as its name)."""

    NEW_FLOW = "NEW_FLOW"
    NO_CHANGE = "NO_CHANGE"
    SAFE_OPTION_CHANGE = "SAFE_OPTION_CHANGE"
    ALIAS_MOVE = "ALIAS_MOVE"
    NEW_VERSION_REQUIRED = "NEW_VERSION_REQUIRED"  # refused: a committed flow changed its shape
    ONLY_IN_DATABASE = "ONLY_IN_DATABASE"  # kept: flowlane never deletes
    NEW_SCHEDULE = "NEW_SCHEDULE"
    SCHEDULE_CHANGE = "SCHEDULE_CHANGE"
    NEW_TRIGGER = "NEW_TRIGGER"
    TRIGGER_CHANGE = "TRIGGER_CHANGE"
    TRIGGER_REMOVED = "TRIGGER_REMOVED"


# what `flowlane plan --check` counts as the YAML and the database having drifted apart
DRIFT = frozenset(ChangeKind) - {ChangeKind.NO_CHANGE, ChangeKind.ONLY_IN_DATABASE}
_OPTIONS = ("max_attempts", "base_delay", "timeout", "retention", "deadline", "dedup_key",
            "priority", "on_failure", "on_failure_on_cancel")
_STEP_OPTIONS = ("max_attempts", "base_delay", "timeout", "start_delay")
_STEP_OWN_OPTIONS = ("compensate",)  # not inherited from the flow: unset is none


@dataclass(frozen=True)
class Change:
    """One classified difference between the YAML and the database."""

    kind: ChangeKind
    subject: str
    details: tuple[str, ...] = ()

    def render(self) -> str:
        lines = [f"{self.kind:<21} {self.subject}"]
        lines.extend(f"  {line}" for line in self.details)
        return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    """Every change, flows first (by slug), then aliases, then database-only objects."""

    changes: tuple[Change, ...]
    database: str = ""

    @property
    def refused(self) -> bool:
        return any(c.kind == ChangeKind.NEW_VERSION_REQUIRED for c in self.changes)

    @property
    def drift(self) -> bool:
        return any(c.kind in DRIFT for c in self.changes)

    def render(self, *, verify: bool = False) -> str:
        lines = [c.render() for c in self.changes]
        counts: dict[str, int] = {}
        for change in self.changes:
            counts[change.kind] = counts.get(change.kind, 0) + 1
        summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "nothing"
        lines.append(f"{'verify' if verify else 'plan'}: {summary}")
        if self.refused:
            lines.append("refused: a changed flow shape needs a new concrete slug "
                         "(declare a new version and move its alias)")
        elif verify:
            lines.append("drift: the database differs from the YAML" if self.drift else
                         "ok: the database matches the YAML")
        return "\n".join(lines) + "\n"


    def markdown(self) -> str:
        """The plan as a Markdown table, ready to post as a pull-request comment."""
        lines = ["### flowlane plan", "", "| change | subject | details |", "|---|---|---|"]
        for change in self.changes:
            details = "<br>".join(d.replace("|", "\\|") for d in change.details)
            lines.append(f"| `{change.kind}` | {change.subject} | {details} |")
        if self.refused:
            lines += ["", "**Refused:** a changed flow shape needs a new concrete slug."]
        return "\n".join(lines) + "\n"


@dataclass
class _State:
    """What the database holds, read in one snapshot."""

    flows: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    aliases: dict[str, dict[str, Any]] = field(default_factory=dict)
    schedules: dict[str, dict[str, Any]] = field(default_factory=dict)
    queue_limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    triggers: dict[str, dict[str, Any]] = field(default_factory=dict)
    differences: dict[str, list[str]] = field(default_factory=dict)  # of the flows' shapes


def _read_state(conn: psycopg.Connection[Any], flows: Iterable[Flow]) -> _State:
    with db.wrap_errors("reading the deployed flows"), conn.cursor(
            row_factory=psycopg.rows.dict_row) as cur:
        ready = cur.execute(query("deploy_schema_ready")).fetchone()
        if not ready or not next(iter(ready.values())):
            raise errors.DatabaseError(
                "the database has no flowlane schema with aliases",
                hint="run `flowlane db migrate` first")
        state = _State()
        for row in cur.execute(query("deploy_flows")).fetchall():
            state.flows[row["flow_slug"]] = row
        for row in cur.execute(query("deploy_steps")).fetchall():
            state.steps[(row["flow_slug"], row["step_slug"])] = row
        for row in cur.execute(query("deploy_aliases")).fetchall():
            state.aliases[row["alias"]] = row
        for row in cur.execute(query("deploy_schedules")).fetchall():
            state.schedules[row["schedule_name"]] = row
        for row in cur.execute(query("deploy_queue_limits")).fetchall():
            state.queue_limits[row["queue_name"]] = row
        for row in cur.execute(query("deploy_triggers")).fetchall():
            state.triggers[row["trigger_name"]] = row
        shapes = {f.slug: shape.flow_shape(f) for f in flows if f.slug in state.flows}
        for row in cur.execute(query("deploy_shape_differences"),
                               {"shapes": Jsonb(shapes)}).fetchall():
            state.differences[row["flow_slug"]] = _by_slug(row["differences"],
                                                           row["stored_shape"],
                                                           shapes[row["flow_slug"]])
    return state


def _by_slug(differences: list[str], stored: dict[str, Any] | None,
             given: dict[str, Any]) -> list[str]:
    """The database's words (verify_flow); where steps were added, removed or moved, the
    same comparison with the steps named by slug instead of position by position."""
    if not differences or stored is None or shape.same_steps(stored, given):
        return differences
    return shape.described(stored, given)


def _flow_change(flow: Flow, state: _State, aliases: Iterable[Alias]) -> Change:
    subject = f"flow {flow.slug}"
    row = state.flows.get(flow.slug)
    if row is None:
        return Change(ChangeKind.NEW_FLOW, subject, (f"{len(flow.steps)} step(s) on "
                                                     + ", ".join(flow.queues),))
    differences = state.differences[flow.slug]  # the database's words (verify_flow)
    if differences:
        taken = [*state.flows, *state.aliases]
        version = names.suggest_version(flow, taken)
        suggestion = (f"declare the changed flow as a new version, e.g. `{version}`, and "
                      + names.alias_advice(flow.slug, version, aliases))
        return Change(ChangeKind.NEW_VERSION_REQUIRED, subject, (*differences, suggestion))
    options = _option_differences(flow, row, state)
    return Change(ChangeKind.SAFE_OPTION_CHANGE if options else ChangeKind.NO_CHANGE, subject, options)


def _option_differences(flow: Flow, row: dict[str, Any], state: _State) -> tuple[str, ...]:
    found = []
    for name in _OPTIONS:
        old, new = row[f"opt_{name}"], getattr(flow, name)
        if old != new:
            found.append(f"{name}: {_flow_value(name, old)} in the database, "
                         f"{_flow_value(name, new)} in the YAML")
    found += _concurrency_change("", row, flow.concurrency)
    period = row.get("opt_debounce_period")
    held = None if period is None else Debounce(period, row.get("opt_debounce_key"),
                                                 row.get("opt_debounce_max_wait"))
    if held != flow.debounce:
        found.append(f"debounce: {held or 'none'} in the database, {flow.debounce or 'none'} in the YAML")
    for step in flow.steps:
        step_row = state.steps.get((flow.slug, step.slug), {})
        for name in _STEP_OPTIONS:
            old, new = step_row.get(f"opt_{name}"), getattr(step, name)
            if old != new:
                found.append(f"step {step.slug}: {name}: {_show(old)} in the database, "
                             f"{_show(new)} in the YAML")
        for name in _STEP_OWN_OPTIONS:
            old, new = step_row.get(f"opt_{name}"), getattr(step, name)
            if old != new:
                found.append(f"step {step.slug}: {name}: {_flow_value(name, old)} in the database, "
                             f"{_flow_value(name, new)} in the YAML")
        found += _concurrency_change(f"step {step.slug}: ", step_row, step.concurrency)
        found += _cache_change(step, step_row)
    return tuple(found)


def _cache_change(step: Step, row: dict[str, Any]) -> list[str]:
    """A step's cache as the database holds it against the YAML's; a changed handler changes
    the fingerprint its entries are kept under."""
    ttl, key = row.get("opt_cache_ttl"), row.get("opt_cache_key")
    held = None if ttl is None else StepCache(ttl, None if key is None else tuple(key))
    prefix = f"step {step.slug}: cache"
    if held != step.cache:
        return [f"{prefix}: {held or 'none'} in the database, {step.cache or 'none'} in the YAML"]
    if step.cache is not None and row.get("opt_cache_fingerprint") != caching.fingerprint(step):
        return [f"{prefix}: the step's handler or shape changed (its cached outputs are not reused)"]
    return []


def _concurrency_change(prefix: str, row: dict[str, Any], wanted: Concurrency | None
                        ) -> list[str]:
    limit = row.get("opt_concurrency_limit")
    held = None if limit is None else Concurrency(limit, row.get("opt_concurrency_key"),
                                                  row.get("opt_concurrency_when_full", "queue"))
    if held == wanted:
        return []
    return [f"{prefix}concurrency: {held or 'none'} in the database, {wanted or 'none'} in the YAML"]


def _flow_value(name: str, value: Any) -> str:
    if value is None:  # an option left unset: retention keeps runs for ever, others are off
        return "forever" if name == "retention" else "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _show(value: Any) -> str:
    return "inherited" if value is None else str(value)


def _alias_changes(project: Project, state: _State) -> list[Change]:
    changes = []
    for alias in sorted(project.aliases, key=lambda a: a.slug):
        subject = f"alias {alias.slug}"
        row = state.aliases.get(alias.slug)
        target = f"{alias.active} (draining: {', '.join(alias.draining) or 'none'})"
        if row is None:
            changes.append(Change(ChangeKind.ALIAS_MOVE, subject, (f"new alias -> {target}",
                                                                   *_adoption(project, alias.slug))))
        elif row["flow_slug"] != alias.active or list(row["draining"]) != list(alias.draining):
            was = f"{row['flow_slug']} (draining: {', '.join(row['draining']) or 'none'})"
            changes.append(Change(ChangeKind.ALIAS_MOVE, subject, (f"{was} -> {target}",
                                                                   *_contract_move(project, row["flow_slug"],
                                                                                   alias.active))))
        else:
            changes.append(Change(ChangeKind.NO_CHANGE, subject))
    return changes


def _contract_move(project: Project, was: str, active: str) -> tuple[str, ...]:
    """For a move of the active version: whether the new one accepts every input the old
    one accepted (by the named rules of ``contracts.breaking_changes``)."""
    if was == active:
        return ()
    if not project.has_flow(was):
        return (f"input contract: not compared ({was} is not in the YAML)",)
    return tuple(contracts.compatibility_lines(was, project.flow(was).input_schema, active,
                                               project.flow(active).input_schema))


def _adoption(project: Project, slug: str) -> tuple[str, ...]:
    """What a new alias named like one of its versions changes for callers."""
    if not project.has_flow(slug):
        return ()
    active = project.resolve(slug).slug
    note = (f"takes over the name of flow {slug}: `flowlane start {slug}` and every caller "
            f"of {slug} now start {active}; flow {slug} keeps its runs and drains")
    return (note,)


_SCHEDULE_FIELDS = ("flow_name", "cron", "every_seconds", "timezone", "input", "overlap", "catch_up")


def _schedule_row(schedule: Schedule) -> dict[str, Any]:
    """A schedule as the database holds it (the fields plan compares)."""
    return {"flow_name": schedule.flow, "cron": schedule.cron, "every_seconds": schedule.every,
            "timezone": schedule.timezone, "input": schedule.input, "overlap": schedule.overlap,
            "catch_up": schedule.catch_up}


def _schedule_changes(project: Project, state: _State) -> list[Change]:
    changes = []
    for schedule in project.schedules:
        subject = f"schedule {schedule.name}"
        row, wanted = state.schedules.get(schedule.name), _schedule_row(schedule)
        paused = _paused(row)
        if row is None:
            changes.append(Change(ChangeKind.NEW_SCHEDULE, subject,
                                  (f"starts {schedule.flow} {_timing(wanted)}",)))
            continue
        found = tuple(f"{name}: {_flow_value(name, row[name])} in the database, "
                      f"{_flow_value(name, wanted[name])} "
                      "in the YAML" for name in _SCHEDULE_FIELDS if row[name] != wanted[name])
        kind = ChangeKind.SCHEDULE_CHANGE if found else ChangeKind.NO_CHANGE
        changes.append(Change(kind, subject, found + paused))
    return changes


def _timing(row: dict[str, Any]) -> str:
    if row["cron"] is not None:
        return f"on `{row['cron']}` ({row['timezone']})"
    return f"every {row['every_seconds']} s"


def _paused(row: dict[str, Any] | None) -> tuple[str, ...]:
    """An operator's pause, which apply leaves as it is."""
    if row is None or not row["paused"]:
        return ()
    reason = f": {row['paused_reason']}" if row["paused_reason"] else ""
    return (f"paused by an operator{reason} (`flowlane schedule resume {row['schedule_name']}`)",)


_LIMIT_FIELDS = ("concurrency", "rate_limit", "rate_per", "archive")


def _limits_text(row: dict[str, Any]) -> str:
    parts = []
    if row["concurrency"] is not None:
        parts.append(f"concurrency {row['concurrency']}")
    if row["rate_limit"] is not None:
        parts.append(f"rate limit {row['rate_limit']} per {row['rate_per']} s")
    limits = ", ".join(parts) or "no limits"
    return limits if row["archive"] else f"{limits}, archive off"


def _queue_limit_changes(project: Project, state: _State) -> list[Change]:
    """A queue's limits are options: added, changed or (while the project declares any,
    so its queues file removes the others) removed, each a SAFE_OPTION_CHANGE."""
    changes = []
    for limits in project.queue_limits:
        subject = f"queue {limits.name}"
        row, wanted = state.queue_limits.get(limits.name), _limits_row(limits)
        if row is None and wanted == _NOTHING_SET:  # `archive: true` alone: what no document means
            changes.append(Change(ChangeKind.NO_CHANGE, subject))
        elif row is None:
            changes.append(Change(ChangeKind.SAFE_OPTION_CHANGE, subject,
                                  (f"limits: none in the database, {_limits_text(wanted)} in the YAML",)))
        elif any(row[name] != wanted[name] for name in _LIMIT_FIELDS):
            changes.append(Change(ChangeKind.SAFE_OPTION_CHANGE, subject,
                                  ((f"limits: {_limits_text(row)} in the database, "
                                   f"{_limits_text(wanted)} in the YAML"),)))
        else:
            changes.append(Change(ChangeKind.NO_CHANGE, subject))
    if project.queue_limits:
        declared = {q.name for q in project.queue_limits}
        changes += [Change(ChangeKind.SAFE_OPTION_CHANGE, f"queue {name}",
                           ((f"limits: {_limits_text(row)} in the database, removed by apply (no "
                            "`kind: queue` document declares them)"),))
                    for name, row in state.queue_limits.items() if name not in declared]
    return changes


_NOTHING_SET = {"concurrency": None, "rate_limit": None, "rate_per": None, "archive": True}


def _limits_row(limits: QueueLimits) -> dict[str, Any]:
    return {"concurrency": limits.concurrency, "rate_limit": limits.rate_limit,
            "rate_per": limits.rate_per, "archive": limits.archive}


_TRIGGER_FIELDS = ("flow_name", "table_name", "events", "when_pattern", "unless_pattern", "input_map",
                   "key_pointer", "on_refused")


def _trigger_row(trigger: Trigger) -> dict[str, Any]:
    """A trigger as the database holds it (the fields plan compares); the table as
    set_trigger records it, schema-qualified, when the YAML names it so."""
    return {"flow_name": trigger.flow, "table_name": trigger.table, "events": list(trigger.events),
            "when_pattern": trigger.when, "unless_pattern": trigger.unless, "input_map": trigger.input,
            "key_pointer": trigger.key, "on_refused": trigger.on_refused}


def _trigger_changes(project: Project, state: _State) -> list[Change]:
    """Each declared trigger new, changed or unchanged; while the project declares any, the
    triggers file removes the others (TRIGGER_REMOVED)."""
    changes = []
    for trigger in project.triggers:
        subject = f"trigger {trigger.name}"
        row, wanted = state.triggers.get(trigger.name), _trigger_row(trigger)
        if row is None:
            changes.append(Change(ChangeKind.NEW_TRIGGER, subject, (
                f"starts {trigger.flow} on {', '.join(trigger.events)} of {trigger.table}",)))
            continue
        found = tuple(f"{name}: {_flow_value(name, row[name])} in the database, "
                      f"{_flow_value(name, wanted[name])} in the YAML"
                      for name in _TRIGGER_FIELDS if row[name] != wanted[name])
        changes.append(Change(ChangeKind.TRIGGER_CHANGE if found else ChangeKind.NO_CHANGE, subject,
                              found))
    declared = {t.name for t in project.triggers}
    if declared:
        changes += [Change(ChangeKind.TRIGGER_REMOVED, f"trigger {name}", (
            f"dropped from {row['table_name']} by apply: the triggers file lists only the declared ones",))
                    for name, row in state.triggers.items() if name not in declared]
    return changes


def _kept_trigger(row: dict[str, Any]) -> str:
    return (f"kept, still starting runs on {row['table_name']}: the project declares no trigger, so "
            "it has no triggers file; `select flowlane.keep_only_triggers('{}')` removes it")


def _only_in_database(project: Project, state: _State) -> list[Change]:
    flows = {f.slug for f in project.flows}
    aliases = {a.slug for a in project.aliases}
    found = [Change(ChangeKind.ONLY_IN_DATABASE, f"flow {slug}", ("kept: flowlane never deletes",))
             for slug in state.flows if slug not in flows]
    found += [Change(ChangeKind.ONLY_IN_DATABASE, f"alias {slug}", ("kept: flowlane never deletes",))
              for slug in state.aliases if slug not in aliases]
    declared = {s.name for s in project.schedules}
    fate = ("deleted by apply: the schedules file lists only the declared ones" if declared else
            "kept, still firing: the project declares no schedule, so it has no schedules file; "
            "`flowlane schedule pause NAME` stops it")
    found += [Change(ChangeKind.ONLY_IN_DATABASE, f"schedule {name}", (fate, *_paused(row)))
              for name, row in state.schedules.items() if name not in declared]
    if not project.triggers:  # else the triggers file removes them (_trigger_changes)
        found += [Change(ChangeKind.ONLY_IN_DATABASE, f"trigger {name}", (_kept_trigger(row),))
                  for name, row in state.triggers.items()]
    if not project.queue_limits:  # else the queues file removes them (_queue_limit_changes)
        found += [Change(ChangeKind.ONLY_IN_DATABASE, f"queue {name}",
                         ((f"limits kept ({_limits_text(row)}): the project declares no "
                          "`kind: queue` document, so it has no queues file"),))
                  for name, row in state.queue_limits.items()]
    return found


def plan_with(project: Project, conn: psycopg.Connection[Any]) -> Plan:
    state = _read_state(conn, project.flows)
    changes = [_flow_change(f, state, project.aliases)
               for f in sorted(project.flows, key=lambda f: f.slug)]
    changes += _alias_changes(project, state)
    changes += _schedule_changes(project, state)
    changes += _queue_limit_changes(project, state)
    changes += _trigger_changes(project, state)
    changes += _only_in_database(project, state)
    return Plan(tuple(changes))


def plan(project: Project, dsn: str | None = None) -> Plan:
    """Compare the YAML with a live database (read-only)."""
    target = db.resolve(dsn)
    with db.connect(target) as conn:
        conn.read_only = True
        result = plan_with(project, conn)
        conn.rollback()
    return Plan(result.changes, db.redact(target.dsn))


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` ran."""

    plan: Plan
    files: tuple[str, ...]

    def render(self) -> str:
        return (self.plan.render() + f"applied {len(self.files)} file(s) in one transaction: "
                + ", ".join(self.files) + "\n")


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.FlowlaneError(f"cannot read {file.as_posix()}: {exc.strerror or exc}",
                                   hint="run `flowlane compile`") from exc


def _ordered_files(out: Path, project: Project) -> list[Path]:
    flows = [out / compiled.flow_path(f.slug) for f in sorted(project.flows, key=lambda f: f.slug)]
    schedules = [out / compiled.SCHEDULES_FILE] if project.schedules else []
    queues = [out / compiled.QUEUES_FILE] if project.queue_limits else []
    triggers = [out / compiled.TRIGGERS_FILE] if project.triggers else []
    return [*flows, out / compiled.ALIASES_FILE, *schedules, *queues, *triggers]


def refuse_stale(project: Project, out: str | os.PathLike[str]) -> None:
    """Raise unless the compiled SQL in ``out`` is exactly what the YAML compiles to."""
    stale = check.stale_files(api.compile_project(project), Path(out))
    if stale:
        listed = ", ".join(f"{s.path} ({s.reason})" for s in stale)
        raise errors.StaleOutputError(f"compiled SQL is stale against the YAML: {listed}",
                                      hint="run `flowlane compile`, review and commit the SQL")


def apply(paths: Sequence[str | os.PathLike[str]] | None,
          out: str | os.PathLike[str] | None = None, dsn: str | None = None) -> ApplyResult:
    """Apply the compiled SQL files (default: the project's sql/) in one transaction;
    refuses stale files and shape changes."""
    out = out or project_root.sql_dir()
    project = api.load_project(paths)
    refuse_stale(project, out)
    files = _ordered_files(Path(out), project)
    target = db.resolve(dsn)
    with db.connect(target) as conn:
        result = _apply_files(conn, project, files)
    return result


def _apply_files(conn: psycopg.Connection[Any], project: Project,
                 files: Iterable[Path]) -> ApplyResult:
    with conn.transaction():
        definitions.lock(conn, "apply")
        current = plan_with(project, conn)
        if current.refused:
            raise errors.DeployRefused(
                "apply refused: " + "; ".join(c.subject for c in current.changes
                                              if c.kind == ChangeKind.NEW_VERSION_REQUIRED)
                + " changed shape in the database", hint="run `flowlane plan` for details")
        applied = []
        for file in files:
            definitions.run_compiled(conn, _read(file), f"apply {file.as_posix()}")
            applied.append(file.as_posix())
    return ApplyResult(current, tuple(applied))

