"""Diagnostics are data: every finding of a run, with a position and a code.

Text output follows the compiler convention ``path:line:col: error[FL001]:
message`` followed by the offending source line with a caret and a ``help:``
line. The same findings render as JSON and as SARIF 2.1.0 for code scanning.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding: where (1-based line and column), which rule, what to do."""

    path: str
    line: int
    col: int
    code: str
    message: str
    help: str | None = None
    source_line: str | None = field(default=None, compare=False)

    def headline(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: error[{self.code}]: {self.message}"

    def to_text(self) -> str:
        lines = [self.headline()]
        if self.source_line is not None:
            gutter = str(self.line)
            pad = " " * len(gutter)
            lines.append(f"{pad} |")
            lines.append(f"{gutter} | {self.source_line}")
            lines.append(f"{pad} | {_caret_prefix(self.source_line, self.col)}^")
        if self.help:
            lines.append(f"help: {self.help}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "severity": "error",
            "message": self.message,
            "help": self.help,
            "source_line": self.source_line,
        }


def _caret_prefix(source_line: str, col: int) -> str:
    # keep tabs so the caret lines up with the source line in a terminal
    prefix = source_line[: max(col - 1, 0)]
    return "".join("\t" if ch == "\t" else " " for ch in prefix)


def sort(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Stable order for output: by file, position, code; duplicates removed."""
    return sorted(set(diagnostics))


def format_text(diagnostics: Sequence[Diagnostic]) -> str:
    if not diagnostics:
        return ""
    body = "\n\n".join(d.to_text() for d in diagnostics)
    files = len({d.path for d in diagnostics})
    noun = "error" if len(diagnostics) == 1 else "errors"
    return f"{body}\n\n{len(diagnostics)} {noun} in {files} file(s)\n"


def format_json(diagnostics: Sequence[Diagnostic]) -> str:
    return json.dumps([d.to_dict() for d in diagnostics], indent=2, ensure_ascii=False) + "\n"


def format_sarif(diagnostics: Sequence[Diagnostic]) -> str:
    from flowlane.compiler import codes

    rule_ids = sorted({d.code for d in diagnostics})
    rules = [
        {"id": code, "shortDescription": {"text": codes.describe(code)}} for code in rule_ids
    ]
    results = [_sarif_result(d) for d in diagnostics]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "flowlane",
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"


def _sarif_result(d: Diagnostic) -> dict[str, Any]:
    text = d.message if not d.help else f"{d.message}\nhelp: {d.help}"
    return {
        "ruleId": d.code,
        "level": "error",
        "message": {"text": text},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": d.path},
                    "region": {"startLine": d.line, "startColumn": d.col},
                }
            }
        ],
    }


FORMATTERS = {"text": format_text, "json": format_json, "sarif": format_sarif}


def render(diagnostics: Sequence[Diagnostic], fmt: str) -> str:
    return FORMATTERS[fmt](diagnostics)
