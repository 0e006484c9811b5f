"""Read flow YAML into plain data plus the source position of every node.

PyYAML (the C parser when available) composes the node graph; we build the
values ourselves instead of using its constructor so that:

- every value and every mapping key keeps its ``line:col``;
- keys are always strings (a step named ``on``, ``yes`` or ``1`` stays a
  string) and plain values resolve conservatively, YAML 1.2 style: only
  ``true``/``false``, ``null``/``~``/empty, decimal integers and finite
  floats are not strings (``yes``, ``off``, ``2024-01-01`` stay strings);
- duplicate keys, non-scalar keys, merge keys, recursive or exploding aliases
  and explicit tags are diagnostics instead of silent surprises.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from flowlane.compiler.diagnostics import Diagnostic

YAML_SUFFIXES = (".yaml", ".yml")
STR_TAG = "tag:yaml.org,2002:str"
SEQ_TAG = "tag:yaml.org,2002:seq"
MAP_TAG = "tag:yaml.org,2002:map"
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_TRUE = frozenset({"true", "True", "TRUE"})
_FALSE = frozenset({"false", "False", "FALSE"})
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")  # leading zeros stay strings
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?\Z")
_ALIAS_BUDGET = 10_000  # nodes an alias may add beyond twice the document's own size

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _ComposeLoader(_BaseLoader):  # type: ignore[misc]
    """Composes nodes only; no implicit typing (we resolve plain scalars ourselves)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # the class-level table PyYAML reads


Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    """A 1-based line and column in a source file."""

    line: int
    col: int


@dataclass(frozen=True)
class Source:
    """A file's display path and its lines (for excerpts in diagnostics)."""

    path: str
    lines: tuple[str, ...]

    def line(self, number: int) -> str | None:
        if 1 <= number <= len(self.lines):
            return self.lines[number - 1]
        return None

    def diagnostic(
        self, pos: Position, code: str, message: str, help: str | None = None
    ) -> Diagnostic:
        return Diagnostic(
            self.path, pos.line, pos.col, code, message, help, self.line(pos.line)
        )


@dataclass
class Document:
    """One YAML document: its data, where each node came from, and its source."""

    source: Source
    index: int
    data: Any
    values: dict[Path_, Position] = field(default_factory=dict)
    keys: dict[Path_, Position] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.source.path

    def at(self, path: Sequence[str | int]) -> Position:
        """Position of the value at ``path`` (or its nearest known ancestor)."""
        key = tuple(path)
        while key not in self.values and key:
            key = key[:-1]
        return self.values.get(key, Position(1, 1))

    def key_at(self, path: Sequence[str | int]) -> Position:
        """Position of the mapping key that holds ``path`` (else of its value)."""
        return self.keys.get(tuple(path)) or self.at(path)

    def diagnostic(
        self,
        path: Sequence[str | int],
        code: str,
        message: str,
        help: str | None = None,
        *,
        key: bool = False,
    ) -> Diagnostic:
        pos = self.key_at(path) if key else self.at(path)
        return self.source.diagnostic(pos, code, message, help)


def _position(node: Node) -> Position:
    mark = node.start_mark
    return Position(mark.line + 1, mark.column + 1)


class _Builder:
    """Turns one composed document into data, recording positions and findings."""

    def __init__(self, source: Source, index: int) -> None:
        self.doc = Document(source, index, None)
        self.findings: list[Diagnostic] = []
        self._seen: set[int] = set()
        self._active: set[int] = set()
        self._built = 0
        self._exploded = False

    def build(self, root: Node) -> Document:
        self.doc.data = self._value(root, ())
        return self.doc

    def _error(self, node: Node, code: str, message: str, help: str | None = None) -> None:
        self.findings.append(self.doc.source.diagnostic(_position(node), code, message, help))

    def _value(self, node: Node, path: Path_) -> Any:
        self.doc.values.setdefault(path, _position(node))
        if not self._enter(node):
            return None
        try:
            if isinstance(node, ScalarNode):
                return self._scalar(node)
            if isinstance(node, SequenceNode):
                self._check_tag(node, SEQ_TAG)
                return [self._value(item, (*path, i)) for i, item in enumerate(node.value)]
            assert isinstance(node, MappingNode)
            return self._mapping(node, path)
        finally:
            self._active.discard(id(node))

    def _enter(self, node: Node) -> bool:
        ident = id(node)
        if self._exploded:
            return False
        if ident in self._active:
            self._error(node, "FL005", "recursive YAML alias", "an alias cannot contain itself")
            return False
        self._built += 1
        if ident in self._seen and self._built > 2 * len(self._seen) + _ALIAS_BUDGET:
            self._exploded = True
            self._error(
                node, "FL005", "YAML aliases expand to too many nodes",
                "write the repeated content out or reduce alias nesting",
            )
            return False
        self._seen.add(ident)
        self._active.add(ident)
        return True

    def _check_tag(self, node: Node, expected: str) -> None:
        if node.tag != expected:
            self._error(
                node, "FL006", f"unsupported YAML tag {node.tag!r}",
                "remove the tag; flowlane documents use plain YAML values",
            )

    def _scalar(self, node: ScalarNode) -> Any:
        self._check_tag(node, STR_TAG)
        value: str = node.value
        if node.style:  # quoted or block scalar (the C parser reports plain as '')
            return value
        return resolve_plain(value)

    def _mapping(self, node: MappingNode, path: Path_) -> dict[str, Any]:
        self._check_tag(node, MAP_TAG)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, result, path)
            if key is None:
                continue
            self.doc.keys[(*path, key)] = _position(key_node)
            result[key] = self._value(value_node, (*path, key))
        return result

    def _key(self, node: Node, existing: dict[str, Any], path: Path_) -> str | None:
        if not isinstance(node, ScalarNode):
            self._error(
                node, "FL004", "mapping keys must be plain strings, not a mapping or a list",
                "write the key as a plain word such as `fetch`",
            )
            return None
        if not node.style and node.value == "<<":
            self._error(
                node, "FL005", "YAML merge keys (`<<`) are not supported",
                "write the keys out; merges hide duplicates and overrides",
            )
            return None
        self._check_tag(node, STR_TAG)
        key: str = node.value
        if key in existing:
            first = self.doc.keys.get((*path, key))
            where = f" (first defined at line {first.line})" if first else ""
            self._error(node, "FL003", f"duplicate key `{key}`{where}", "remove one of the two")
            return None
        return key


def resolve_plain(value: str) -> Any:
    """Resolve a plain (unquoted) scalar conservatively."""
    if value in _NULLS:
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        number = float(value)
        return number if math.isfinite(number) else value
    return value


def load_text(text: str, path: str) -> tuple[list[Document], list[Diagnostic]]:
    """Parse every document of ``text`` (display name ``path``)."""
    source = Source(path, tuple(text.splitlines()))
    documents: list[Document] = []
    findings: list[Diagnostic] = []
    try:
        for index, root in enumerate(yaml.compose_all(text, Loader=_ComposeLoader)):
            builder = _Builder(source, index)
            documents.append(builder.build(root))
            findings.extend(builder.findings)
    except yaml.YAMLError as exc:
        findings.append(_syntax_diagnostic(source, exc))
    except RecursionError:
        findings.append(
            source.diagnostic(Position(1, 1), "FL001", "YAML nesting is too deep",
                              "flatten the document")
        )
    if not documents and not findings:
        findings.append(
            source.diagnostic(Position(1, 1), "FL007", "file contains no YAML document",
                              "add a `kind: flow`, `kind: alias` or `kind: worker` document "
                              "or delete the file")
        )
    return documents, findings


def _syntax_diagnostic(source: Source, exc: yaml.YAMLError) -> Diagnostic:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else 1
    col = mark.column + 1 if mark is not None else 1
    tab = _first_tab_indent(source, line)
    if tab is not None:
        return source.diagnostic(
            tab, "FL002", "tab character in indentation",
            "YAML indentation must use spaces; replace the tab with spaces",
        )
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    context = getattr(exc, "context", None)
    message = f"{context}: {problem}" if context else str(problem)
    return source.diagnostic(Position(line, col), "FL001", f"YAML syntax error: {message}",
                             "fix the YAML syntax at this position")


def _first_tab_indent(source: Source, up_to_line: int) -> Position | None:
    for number, text in enumerate(source.lines[:up_to_line], start=1):
        indent = text[: len(text) - len(text.lstrip(" \t"))]
        if "\t" in indent:
            return Position(number, indent.index("\t") + 1)
    return None


def load_file(file: Path, display: str) -> tuple[list[Document], list[Diagnostic]]:
    """Read and parse one file; unreadable or non-UTF-8 files become diagnostics."""
    source = Source(display, ())
    try:
        raw = file.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return [], [source.diagnostic(Position(1, 1), "FL008", f"cannot read file: {reason}",
                                      "check the path and its permissions")]
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return [], [source.diagnostic(Position(line, 1), "FL008", "file is not valid UTF-8",
                                      "save the file as UTF-8")]
    return load_text(text, display)


def display_path(file: Path) -> str:
    """A stable, machine-independent name: relative to the working directory when inside it."""
    try:
        return file.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return file.as_posix()


def discover(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[Diagnostic]]:
    """Every YAML file under ``paths`` (recursive, hidden directories skipped), sorted."""
    found: dict[str, Path] = {}
    findings: list[Diagnostic] = []
    for raw in paths:
        root = Path(raw)
        if root.is_dir():
            files = list(_walk(root))
            if not files:
                findings.append(_path_problem(root, "no *.yaml or *.yml files found"))
            for file in files:
                found.setdefault(display_path(file), file)
        elif root.is_file():
            found.setdefault(display_path(root), root)
        else:
            findings.append(_path_problem(root, "no such file or directory"))
    return [found[name] for name in sorted(found)], findings


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(YAML_SUFFIXES) and not name.startswith("."):
                yield Path(dirpath) / name


def _path_problem(root: Path, reason: str) -> Diagnostic:
    return Diagnostic(display_path(root), 1, 1, "FL008", f"{reason}: {root.as_posix()}",
                      "pass a flows directory or YAML files (default: flows/)")


def load_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Document], list[Diagnostic]]:
    """Discover and parse every file; documents in file order, findings of all files."""
    files, findings = discover(paths)
    documents: list[Document] = []
    for file in files:
        docs, problems = load_file(file, display_path(file))
        documents.extend(docs)
        findings.extend(problems)
    return documents, findings
