"""Diagnostics are data: every finding of a run, with a position and a code.

Text output follows the compiler convention ``path:line:col: error[FL001]:
message`` followed by the offending source line with a caret and a ``help:``
line. The same findings render as JSON and as SARIF 2.1.0 for code scanning.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from flowlane import project_root

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"  # the base id code scanning resolves against the checked-out repository


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
        return _visible(f"{self.path}:{self.line}:{self.col}: error[{self.code}]: {self.message}")

    def to_text(self, detail: Sequence[str] = ()) -> str:
        """Headline, source excerpt with a caret, ``detail`` lines (a diff, differences),
        then the ``help:`` line."""
        lines = [self.headline()]
        if self.source_line is not None:
            gutter = str(self.line)
            pad = " " * len(gutter)
            lines.append(f"{pad} |")
            lines.append(f"{gutter} | {self.source_line}")
            lines.append(f"{pad} | {_caret_prefix(self.source_line, self.col)}^")
        lines.extend(detail)
        if self.help:
            lines.append(f"help: {self.help}")
        return "\n".join(_visible(line) for line in lines)

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


_CONTROL_PICTURES = {code: chr(0x2400 + code) for code in range(0x20) if code != 0x09}
_CONTROL_PICTURES[0x7F] = "\u2421"
_CONTROL_PICTURES.update({code: "\ufffd" for code in range(0x80, 0xA0)})


def _visible(line: str) -> str:
    """Control characters as symbols (one each, so the caret still lines up): YAML text
    (a source line, a value quoted in a message, a file name) must not send escape
    sequences to the terminal or CI log showing it."""
    return line.translate(_CONTROL_PICTURES)


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
    """SARIF 2.1.0: locations relative to the repository root (``%SRCROOT%``), so code
    scanning annotates the right files when the project is a subdirectory of the repository."""
    from flowlane.compiler import codes

    root = project_root.repository_root()
    rule_ids = sorted({d.code for d in diagnostics})
    rules = [
        {"id": code, "shortDescription": {"text": codes.describe(code)}} for code in rule_ids
    ]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "flowlane", "rules": rules}},
                "originalUriBaseIds": {SRCROOT: {"uri": root.as_uri() + "/"}},
                "results": [_sarif_result(d, root) for d in diagnostics],
            }
        ],
    }
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"


def _sarif_result(d: Diagnostic, root: Path) -> dict[str, Any]:
    text = d.message if not d.help else f"{d.message}\nhelp: {d.help}"
    return {
        "ruleId": d.code,
        "level": "error",
        "message": {"text": text},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": artifact_location(d.path, root),
                    "region": {"startLine": d.line, "startColumn": d.col},
                }
            }
        ],
    }


def artifact_location(path: str, repository: Path) -> dict[str, str]:
    """A diagnostic's file as a SARIF artifact location: a percent-encoded URI relative to
    ``repository`` (``%SRCROOT%``), or an absolute ``file:`` URI for a file outside it."""
    file = _absolute(path)
    try:
        relative = file.relative_to(repository)
    except ValueError:
        return {"uri": file.as_uri()}
    return {"uri": quote(relative.as_posix(), safe="/"), "uriBaseId": SRCROOT}


def _absolute(path: str) -> Path:
    """Diagnostics name files relative to the project root, or as given when outside it."""
    given = Path(path)
    if given.is_absolute():
        return Path(os.path.normpath(given))
    in_project = project_root.find_root() / given
    if in_project.exists() or not given.exists():
        return Path(os.path.normpath(in_project))
    return Path(os.path.normpath(Path.cwd() / given))


FORMATTERS = {"text": format_text, "json": format_json, "sarif": format_sarif}


def render(diagnostics: Sequence[Diagnostic], fmt: str) -> str:
    return FORMATTERS[fmt](diagnostics)
