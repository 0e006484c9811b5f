"""``flowlane check``: the CI gate over the compiled SQL in the working tree and at a base."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlane import errors, project_root
from flowlane.compiler import api, codes, compiled, contracts, gitrev, names, shape, sqltext
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.model import Alias, Flow, Project


@dataclass(frozen=True)
class StaleFile:
    """A compiled file that is missing, differs from the YAML, or has no YAML any more."""

    path: str
    reason: str
    diff: str


@dataclass(frozen=True)
class VersionChange:
    """A concrete slug whose shape differs from the one committed at the base."""

    flow_slug: str
    differences: tuple[str, ...]
    suggestion: str
    source: str
    advice: str  # how callers reach the new version (names.alias_advice)
    line: int = 1
    col: int = 1
    source_line: str | None = None

    def message(self, base: str) -> str:
        return (f"NEW_VERSION_REQUIRED: flow `{self.flow_slug}` ({self.source}) changed its "
                f"shape since {base}; a concrete slug is immutable once committed")


@dataclass(frozen=True)
class CheckResult:
    """Everything ``check`` found; ``ok`` when there is nothing."""

    diagnostics: tuple[Diagnostic, ...] = ()
    stale: tuple[StaleFile, ...] = ()
    versions: tuple[VersionChange, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # for each alias whose active version moved since the base: what that means for inputs
    alias_moves: tuple[str, ...] = field(default=())
    # flow control options (concurrency, priority, queue limits) changed since the base
    option_changes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not (self.diagnostics or self.stale or self.versions)

    def all_diagnostics(self, base: str = "HEAD") -> list[Diagnostic]:
        """Every finding as a diagnostic (for JSON and SARIF output)."""
        found = list(self.diagnostics)
        found += [_stale_diagnostic(s) for s in self.stale]
        found += [Diagnostic(v.source, v.line, v.col, codes.NEW_VERSION_REQUIRED, v.message(base),
                             f"declare a new version `{v.suggestion}`; differences: "
                             + "; ".join(v.differences)) for v in self.versions]
        return found

    def render_text(self, base: str = "HEAD") -> str:
        """Every finding in the diagnostics text format, with the diff of a stale file
        and the differences of a changed shape between the excerpt and the help line."""
        blocks = [d.to_text() for d in self.diagnostics]
        blocks += [_stale_diagnostic(s).to_text(s.diff.rstrip("\n").split("\n"))
                   for s in self.stale]
        blocks += [Diagnostic(v.source, v.line, v.col, codes.NEW_VERSION_REQUIRED, v.message(base),
                              f"declare a new version `{v.suggestion}` (copy the flow, change "
                              f"the copy) and {v.advice}; keep `{v.flow_slug}` unchanged",
                              v.source_line).to_text([f"  {line}" for line in
                                                                   v.differences])
                   for v in self.versions]
        if not blocks:
            return ""
        files = len({d.path for d in self.all_diagnostics(base)})
        count = len(blocks)
        return ("\n\n".join(blocks) + f"\n\n{count} {'error' if count == 1 else 'errors'} "
                f"in {files} file(s)\n")


def _stale_diagnostic(stale: StaleFile) -> Diagnostic:
    return Diagnostic(stale.path, _first_changed_line(stale.diff), 1, codes.STALE_SQL, stale.reason,
                      "run `flowlane compile` and commit the SQL")


def _first_changed_line(diff: str) -> int:
    match = re.search(r"^@@ -(\d+)", diff, re.MULTILINE)
    return max(int(match[1]), 1) if match else 1


def check(paths: Iterable[api.PathLike] | None = None, out: api.PathLike | None = None,
          base: str | None = None) -> CheckResult:
    """Validate, compare the SQL in ``out`` with the YAML, and compare shapes with ``base``
    (default ``HEAD``; when ``base`` is given explicitly it must exist)."""
    out = out or project_root.sql_dir()
    project, found = api.analyze_paths(paths)
    if project is None:
        return CheckResult(diagnostics=tuple(found))
    files = api.compile_project(project)
    stale = stale_files(files, Path(out))
    versions, notes = version_changes(project, Path(out), base)
    moves = alias_moves(project, Path(out), base) if not notes else []
    options = option_changes(project, files, Path(out), base) if not notes else []
    return CheckResult(stale=tuple(stale), versions=tuple(versions), notes=tuple(notes),
                       alias_moves=tuple(moves), option_changes=tuple(options))


def stale_files(files: Mapping[str, str], out: Path) -> list[StaleFile]:
    """Compiled files in ``out`` that are missing, differ from ``files``, or are orphans."""
    try:
        return _stale_files(files, out)
    except OSError as exc:
        raise errors.FlowlaneError(f"cannot read the compiled SQL in {out.as_posix()}: "
                                   f"{exc.strerror or exc}") from exc


def _stale_files(files: Mapping[str, str], out: Path) -> list[StaleFile]:
    found = []
    for relative, expected in sorted(files.items()):
        target = out / relative
        shown = (out / relative).as_posix()
        if not target.is_file():
            found.append(StaleFile(shown, "missing", _diff("", expected, shown)))
            continue
        actual = target.read_bytes().decode("utf-8", errors="replace")
        if actual != expected:
            found.append(StaleFile(shown, "stale or hand-edited", _diff(actual, expected, shown)))
    for relative in api.orphans(files, out):
        shown = (out / relative).as_posix()
        text = (out / relative).read_text(encoding="utf-8", errors="replace")
        found.append(StaleFile(shown, "no flow in the YAML", _diff(text, "", shown)))
    return found


def _diff(actual: str, expected: str, shown: str) -> str:
    lines = difflib.unified_diff(
        actual.splitlines(keepends=True), expected.splitlines(keepends=True),
        fromfile=f"a/{shown} (working tree)", tofile=f"b/{shown} (compiled from YAML)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def version_changes(project: Project, out: Path, base: str | None
                    ) -> tuple[list[VersionChange], list[str]]:
    rev = base or "HEAD"
    if gitrev.toplevel(out) is None or not gitrev.revision_exists(rev, out):
        if base is not None:
            raise errors.UsageError(f"git revision `{base}` not found",
                                    hint="pass an existing commit, branch or tag to --base")
        return [], [f"note: no git revision {rev}; skipped the immutability check"]
    taken = [f.slug for f in project.flows] + [a.slug for a in project.aliases]
    changes = []
    paths = {flow.slug: out / compiled.flow_path(flow.slug) for flow in project.flows}
    committed_files = gitrev.show_many(rev, list(paths.values()))
    for flow in project.flows:
        committed = committed_files[paths[flow.slug]]
        change = (None if committed is None else
                  _compare(flow, committed, taken, project.aliases))
        if change is not None:
            changes.append(change)
    return changes, []


def _compare(flow: Flow, committed: str, taken: list[str], aliases: Iterable[Alias]
             ) -> VersionChange | None:
    current = shape.flow_shape(flow)
    old = committed_shape(committed)
    if old is not None and shape.same_json(old, current):
        return None
    if old is None:
        lines = ["the committed file has no readable shape"]
    else:
        lines = shape.described(old, current, "the base", "the YAML")
    line, col = (flow.location.line, flow.location.col) if flow.location else (1, 1)
    suggestion = names.suggest_version(flow, taken)
    return VersionChange(flow.slug, tuple(lines), suggestion, flow.source,
                         names.alias_advice(flow.slug, suggestion, aliases), line, col,
                         _source_line(flow.source, line))


def _source_line(path: str, line: int) -> str | None:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return lines[line - 1] if 0 < line <= len(lines) else None


def committed_shape(text: str) -> dict[str, Any] | None:
    """The shape a committed flow file (any format) ensures, None when it has none."""
    found = compiled.read(text)
    return found.shape if found is not None else None


_SET_ALIAS = re.compile(r"alias => (?P<alias>'(?:[^']|'')*'),\s*flow_slug => (?P<flow>'(?:[^']|'')*')")


def alias_moves(project: Project, out: Path, base: str | None) -> list[str]:
    """Each alias whose active version differs from the one committed at ``base``, with the
    compatibility of the new version's input contract with the old one's."""
    rev = base or "HEAD"
    committed = gitrev.show_many(rev, [out / compiled.ALIASES_FILE])[out / compiled.ALIASES_FILE]
    before = {sqltext.unquote(m["alias"]): sqltext.unquote(m["flow"])
              for m in _SET_ALIAS.finditer(committed or "")}
    moved = [(a, before[a.slug]) for a in sorted(project.aliases, key=lambda a: a.slug)
             if a.slug in before and before[a.slug] != a.active]
    old_files = gitrev.show_many(rev, [out / compiled.flow_path(was) for _, was in moved])
    lines = []
    for alias, was in moved:
        old_shape = committed_shape(old_files.get(out / compiled.flow_path(was)) or "")
        lines.append(f"ALIAS_MOVE alias {alias.slug}: {was} -> {alias.active}")
        if old_shape is None:
            lines.append(f"  input contract: not compared (no committed shape of {was} at {rev})")
            continue
        lines += [f"  {line}" for line in contracts.compatibility_lines(
            was, old_shape.get("input_schema"), alias.active, project.flow(alias.active).input_schema)]
    return lines


# one call of a compiled file, one argument per line (the templates' layout)
_CALL = re.compile(r"^select flowlane\.(?P<function>create_flow|add_step|set_queue_limits|set_trigger)\("
                   r"\n(?P<arguments>.*?)\n\);$", re.MULTILINE | re.DOTALL)
_ARGUMENT = re.compile(r"^  (?P<name>[a-z_]+) => (?P<value>.*?),?$", re.MULTILINE)
FLOW_CONTROL = ("concurrency_limit", "concurrency_key", "concurrency_when_full", "priority",
                "debounce_period", "debounce_key", "debounce_max_wait", "cache_ttl", "cache_key",
                "cache_fingerprint")
_QUEUE_LIMITS = ("concurrency", "rate_limit", "rate_per", "archive")
_TRIGGER = ("flow_name", "table_name", "events", "when_pattern", "unless_pattern", "input_map", "key_pointer",
            "on_refused")
_NOT_SET = "none"
_DEFAULTS = {"concurrency_when_full": "'queue'", "archive": "true"}  # what a call without the argument means


def _calls(text: str) -> dict[str, dict[str, str]]:
    """Subject (``flow F``, ``flow F step S``, ``queue Q``) -> its written arguments."""
    found: dict[str, dict[str, str]] = {}
    for call in _CALL.finditer(text):
        arguments = {m["name"]: m["value"] for m in _ARGUMENT.finditer(call["arguments"])}
        if call["function"] == "create_flow":
            subject = f"flow {sqltext.unquote(arguments['flow_slug'])}"
        elif call["function"] == "add_step":
            subject = (f"flow {sqltext.unquote(arguments['flow_slug'])} "
                       f"step {sqltext.unquote(arguments['step_slug'])}")
        elif call["function"] == "set_trigger":
            subject = f"trigger {sqltext.unquote(arguments['trigger_name'])}"
        else:
            subject = f"queue {sqltext.unquote(arguments['queue_name'])}"
        found[subject] = arguments
    return found


def _shown(value: str | None) -> str:
    if value is None or value == "null":
        return _NOT_SET
    literal = value.removesuffix("::jsonb")  # a trigger's patterns and input map
    return sqltext.unquote(literal) if literal.startswith(("'", "E'")) else value


def _differences(old: dict[str, dict[str, str]], new: dict[str, dict[str, str]],
                 names: tuple[str, ...], rev: str) -> list[str]:
    lines = []
    for subject in sorted(new.keys() & old.keys()):
        for name in names:
            was, now = (old[subject].get(name, _DEFAULTS.get(name)),
                        new[subject].get(name, _DEFAULTS.get(name)))
            if _shown(was) != _shown(now):
                lines.append(f"SAFE_OPTION_CHANGE {subject}: {name}: {_shown(was)} at {rev}, "
                             f"{_shown(now)} in the YAML")
    return lines


def option_changes(project: Project, files: Mapping[str, str], out: Path,
                   base: str | None) -> list[str]:
    """The flow control options (concurrency, priority, a queue's limits) of committed flows
    and queues that differ at ``base``: options, so no new version, but worth a reviewer's
    look (they change how fast work starts)."""
    rev = base or "HEAD"
    paths = [out / compiled.flow_path(f.slug) for f in project.flows]
    queues, triggers = out / compiled.QUEUES_FILE, out / compiled.TRIGGERS_FILE
    committed = gitrev.show_many(rev, [*paths, queues, triggers])
    lines = []
    for flow in sorted(project.flows, key=lambda f: f.slug):
        old_text = committed.get(out / compiled.flow_path(flow.slug))
        if old_text is not None:
            lines += _differences(_calls(old_text), _calls(files[compiled.flow_path(flow.slug)]),
                                  FLOW_CONTROL, rev)
    old_queues = _calls(committed.get(queues) or "")
    new_queues = _calls(files.get(compiled.QUEUES_FILE, ""))
    lines += _differences(old_queues, new_queues, _QUEUE_LIMITS, rev)
    lines += [f"SAFE_OPTION_CHANGE {subject}: limits declared in the YAML, none at {rev}"
              for subject in sorted(new_queues.keys() - old_queues.keys())]
    fate = ("removed by apply" if new_queues else
            "kept in the database by apply: the project has no queues file any more")
    lines += [f"SAFE_OPTION_CHANGE {subject}: limits at {rev}, none in the YAML ({fate})"
              for subject in sorted(old_queues.keys() - new_queues.keys())]
    return lines + trigger_changes(committed.get(triggers) or "", files.get(compiled.TRIGGERS_FILE, ""), rev)


def trigger_changes(old_text: str, new_text: str, rev: str) -> list[str]:
    """Triggers added, changed and removed since ``rev`` (from the two triggers files): each
    changes which rows of an application's table start runs."""
    old, new = _calls(old_text), _calls(new_text)
    lines = [f"NEW_TRIGGER {subject}: declared in the YAML, not at {rev}"
             for subject in sorted(new.keys() - old.keys())]
    lines += [line.replace("SAFE_OPTION_CHANGE", "TRIGGER_CHANGE", 1)
              for line in _differences(old, new, _TRIGGER, rev)]
    fate = ("dropped by apply" if new else
            "kept in the database by apply: the project has no triggers file any more")
    lines += [f"TRIGGER_REMOVED {subject}: at {rev}, not in the YAML ({fate})"
              for subject in sorted(old.keys() - new.keys())]
    return lines
