"""One flow document under check: its steps, and the one way its checks report a finding."""

from __future__ import annotations

from typing import Any

from flowlane.compiler.checks.shared import Analysis, Entry, Suggester


class FlowDocument:
    """A flow document's parts its checks read, and ``error`` that counts and reports a finding."""

    def __init__(self, entry: Entry, state: Analysis,
                 placeholders: frozenset[str] = frozenset()) -> None:
        self.entry = entry
        self.placeholders = placeholders
        self.doc = entry.doc
        self.slug = entry.slug
        self.steps: dict[str, dict[str, Any]] = entry.data["steps"]
        self.step_names = Suggester(list(self.steps))
        self.state = state
        self.errors = 0

    def error(self, path: tuple[str | int, ...], code: str, message: str,
              help: str | None = None, *, key: bool = False) -> None:
        self.errors += 1
        if not self._about_placeholder(path):
            self.state.findings.append(self.doc.diagnostic(path, code, message, help, key=key))

    def _about_placeholder(self, path: tuple[str | int, ...]) -> bool:
        """A finding about a step with schema errors of its own, other than its ``needs``
        (the only part its placeholder keeps), follows from that error: the schema finding
        is the root cause, reported alone (how the step is routed, its type, its options
        depend on the broken part)."""
        if len(path) < 2 or path[1] not in self.placeholders:
            return False
        return path[0] == "queues" or (path[0] == "steps" and path[2:3] != ("needs",))

    def waits(self) -> set[str]:
        """The steps without a queue: wait steps and child-flow steps."""
        return {slug for slug, spec in self.steps.items()
                if spec.get("type") == "wait" or "flow" in spec}
