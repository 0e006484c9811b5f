"""Read flow YAML into plain data plus the source position of every node.

PyYAML (the C parser when available) composes the node graph; we build the
values ourselves instead of using its constructor so that:

- every value and every mapping key keeps its ``line:col``;
- keys are always strings (a step named ``on``, ``yes`` or ``1`` stays a
  string) and plain values resolve conservatively, YAML 1.2 style: only
  ``true``/``false``, ``null``/``~``/empty, decimal integers and finite
  floats are not strings (``yes``, ``off``, ``2024-01-01`` stay strings);
- duplicate keys, non-scalar keys, merge keys, recursive or exploding aliases
  and explicit tags are diagnostics instead of silent surprises;
- nothing a file can hold raises: numbers no value can hold stay text marked
  :class:`OutOfRange` (the schema and the condition check report them), and an escape of
  half a UTF-16 pair is the syntax error libyaml reports, also on pure-Python PyYAML;
- lines are numbered as editors number them (NEL, U+2028 and U+2029 are text).

A document keeps packed positions of its values, not the composed nodes, whose marks
cost several times the data.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from flowlane import project_root
from flowlane.compiler import codes
from flowlane.compiler.diagnostics import Diagnostic

YAML_SUFFIXES = (".yaml", ".yml")
STR_TAG = "tag:yaml.org,2002:str"
SEQ_TAG = "tag:yaml.org,2002:seq"
MAP_TAG = "tag:yaml.org,2002:map"
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_TRUE = frozenset({"true", "True", "TRUE"})
_FALSE = frozenset({"false", "False", "FALSE"})
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")  # leading zeros stay strings
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|(?:0|[1-9][0-9]*)(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?\Z")
_ALIAS_BUDGET = 10_000  # nodes an alias may add beyond twice the document's own size
# Python refuses to convert longer digit strings (int_max_str_digits); no value of a flow needs
# one, and a longer literal could not be written back out as JSON either
MAX_INT_DIGITS = 4300
_INFINITIES = frozenset({f"{sign}{word}" for sign in ("", "+", "-")
                         for word in (".inf", ".Inf", ".INF")} | {".nan", ".NaN", ".NAN"})
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what editors (and YAML 1.2) count as line breaks
# YAML 1.1 parsers (libyaml, PyYAML) also break lines at these; to them they are text
_OTHER_BREAKS = "\x85\u2028\u2029"
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\(?:u[dD][89a-fA-F]|U0000[dD][89a-fA-F])")



_DEFAULT_TAG = {ScalarNode: STR_TAG, SequenceNode: SEQ_TAG, MappingNode: MAP_TAG}


class _Untyped:
    """No implicit typing (we resolve plain scalars ourselves): a node without an explicit
    tag gets its kind's default tag, which is what PyYAML's resolver answers with an empty
    table and no path resolvers, without its per-node work (the parser asks for every node)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # the class-level table PyYAML reads

    def resolve(self, kind: type[Node], value: Any, implicit: Any) -> str:
        return _DEFAULT_TAG[kind]


class PurePythonComposer(_Untyped, yaml.SafeLoader):
    """Composes nodes only."""


class LibyamlComposer(_Untyped, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The same on libyaml's C parser (PyYAML built without it falls back to Python)."""


# the composer every load uses: libyaml when PyYAML has it (tests swap in the other)
COMPOSER: type[Any] = LibyamlComposer



class OutOfRange(str):
    """A plain scalar written as a number that no JSON value flowlane stores can hold
    (``1e400``, ``.inf``, an integer of thousands of digits). It stays text so that nothing
    converts it, and the schema and the condition checks report it by what it is."""


def _short(text: str) -> str:
    return f"`{text}`" if len(text) <= 40 else f"`{text[:20]}...` ({len(text)} characters)"


def unstorable(value: Any) -> tuple[str, str] | None:
    """(what, what to do) for the first part of ``value`` (a key, a string, a number) that no
    jsonb value can hold: a number kept as :class:`OutOfRange`, or a NUL character."""
    if isinstance(value, OutOfRange):
        what = f"the number {_short(value)}, which no JSON number flowlane stores can hold"
        todo = f"use a finite number with at most {MAX_INT_DIGITS} digits, or quote it as text"
        return what, todo
    if isinstance(value, str):
        if "\x00" in value:
            return ("a NUL character", "PostgreSQL jsonb cannot store NUL characters; remove them")
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = unstorable(key) or unstorable(item)
            if found:
                return found
    if isinstance(value, list):
        for item in value:
            found = unstorable(item)
            if found:
                return found
    return None


class Position(NamedTuple):
    """A 1-based line and column in a source file (a tuple: cheap, one per YAML node)."""

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


# Where each value of a document was written, kept instead of the composed nodes (whose
# marks cost far more memory than the data): a mapping's places map each key to
# (key position, value position, the value's places); a sequence's list each item's
# (position, places); a scalar has none. Positions are packed ints (see _pack).
Places = dict[str, tuple[int, int, Any]] | list[tuple[int, Any]] | None


@dataclass
class Document:
    """One YAML document: its data, where each value was written, and its source."""

    source: Source
    index: int
    data: Any
    start: int = 0  # the packed position of the document's root value
    places: Places = None

    @property
    def path(self) -> str:
        return self.source.path

    def _locate(self, path: Sequence[str | int]) -> tuple[int, int | None, bool]:
        """(position of the deepest value on ``path``, of its key, whether all of it exists)."""
        at, key_at, places = self.start, None, self.places
        for part in path:
            if isinstance(places, dict) and isinstance(part, str) and part in places:
                key_at, at, places = places[part]
            elif isinstance(places, list) and isinstance(part, int) and 0 <= part < len(places):
                key_at = None
                at, places = places[part]
            else:
                return at, None, False
        return at, key_at, True

    def at(self, path: Sequence[str | int]) -> Position:
        """Position of the value at ``path`` (or its nearest existing ancestor)."""
        return _unpack(self._locate(path)[0])

    def key_at(self, path: Sequence[str | int]) -> Position:
        """Position of the mapping key that holds ``path`` (else of the value)."""
        at, key_at, found = self._locate(path)
        return _unpack(key_at if found and key_at is not None else at)

    def line_col(self, path: Sequence[str | int], *, key: bool = False) -> tuple[int, int]:
        """(line, column) of :meth:`key_at` (``key``) or :meth:`at` ``path``, 1-based."""
        at, key_at, found = self._locate(path)
        packed = key_at if key and found and key_at is not None else at
        return (packed >> 32) + 1, (packed & 0xFFFFFFFF) + 1

    def written(self, path: Sequence[str | int]) -> str | None:
        """The plain word at ``path`` as written (``true``, ``~``, ``12``), else None."""
        at, _key, found = self._locate(path)
        position = _unpack(at)
        line = self.source.line(position.line) if found else None
        word = _PLAIN_WORD.match(line, position.col - 1) if line is not None else None
        return word.group() if word else None

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


_PLAIN_WORD = re.compile(r"[^\s,\[\]{}#\"']+")


def _pack(node: Node) -> int:
    mark = node.start_mark
    return int(mark.line) << 32 | int(mark.column)


def _unpack(packed: int) -> Position:
    return Position((packed >> 32) + 1, (packed & 0xFFFFFFFF) + 1)


def _is_merge_key(node: Node) -> bool:
    return isinstance(node, ScalarNode) and not node.style and node.value == "<<"


def _position(node: Node) -> Position:
    return _mark_position(node.start_mark)


def source_lines(text: str) -> tuple[str, ...]:
    """The lines of ``text`` as editors number them: split at ``\\n``, ``\\r\\n`` and
    ``\\r`` only (``str.splitlines`` also splits at NEL, U+2028 and form feeds)."""
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()
    return tuple(lines)


class _Stand:
    """Stand-ins for NEL, U+2028 and U+2029 while parsing, so that the YAML 1.1 parser keeps
    them inside their line (as editors do) instead of starting a new line at each."""

    def __init__(self, text: str) -> None:
        present = [ch for ch in _OTHER_BREAKS if ch in text]
        free = (chr(code) for code in range(0xF8FF, 0xE000, -1) if chr(code) not in text)
        self.forward = {ord(ch): next(free) for ch in present}
        self.back = {ord(stand): ch for ch, stand in zip(present, self.forward.values(), strict=True)}

    def hide(self, text: str) -> str:
        return text.translate(self.forward) if self.forward else text

    def restore(self, value: str) -> str:
        return value.translate(self.back) if self.back else value


_NO_STAND = _Stand("")


def _builder(source: Source, index: int, stand: _Stand = _NO_STAND,
             *, aliases: bool = True) -> _Builder:
    """A builder for one document; without aliases (no ``*`` in the text) no node is reached
    twice, so there is nothing to track (a third of the time)."""
    return (_AliasBuilder if aliases else _Builder)(source, index, stand)


class _Builder:
    """Turns one composed document into data, collecting findings (a text without aliases).

    The choice of tracking is a class, not a bound method kept on the instance: that would
    be a reference cycle, keeping every document alive until the cyclic collector runs.
    """

    def __init__(self, source: Source, index: int, stand: _Stand = _NO_STAND) -> None:
        self.stand = stand
        self.doc = Document(source, index, None)
        self.findings: list[Diagnostic] = []

    def build(self, root: Node) -> Document:
        self.doc.start = _pack(root)
        self.doc.data, self.doc.places = self._value(root)
        return self.doc

    def _error(self, node: Node, code: str, message: str, help: str | None = None) -> None:
        self.findings.append(self.doc.source.diagnostic(_position(node), code, message, help))

    def _node_value(self, node: Node) -> tuple[Any, Places]:
        """The node's data and where its parts were written."""
        kind = type(node)
        if kind is ScalarNode:
            return self._scalar(cast(ScalarNode, node)), None
        if kind is SequenceNode:
            if node.tag != SEQ_TAG:
                self._check_tag(node, SEQ_TAG)
            items, places = [], []
            for item in node.value:
                value, inner = self._value(item)
                items.append(value)
                places.append((_pack(item), inner))
            return items, places
        assert isinstance(node, MappingNode)
        return self._mapping(node)

    def _check_tag(self, node: Node, expected: str) -> None:
        if node.tag != expected:
            self._error(
                node, codes.UNSUPPORTED_TAG, f"unsupported YAML tag {node.tag!r}",
                "remove the tag; flowlane documents use plain YAML values",
            )

    def _scalar(self, node: ScalarNode) -> Any:
        if node.tag != STR_TAG:
            self._check_tag(node, STR_TAG)
        if node.style:  # quoted or block scalar (the C parser reports plain as '')
            return self._text(node)
        return resolve_plain(self.stand.restore(node.value))

    def _text(self, node: ScalarNode) -> str | None:
        """A quoted scalar's text; None (and a finding) for an escape of half a UTF-16 pair,
        which libyaml refuses while parsing and pure-Python PyYAML lets through."""
        if not _SURROGATE.search(node.value):
            return self.stand.restore(node.value)
        self.findings.append(self.doc.source.diagnostic(
            _escape_position(self.doc.source, node), codes.YAML_SYNTAX,
            "YAML syntax error: while parsing a quoted scalar: found invalid Unicode "
            "character escape code",
            "write the character itself or one `\\U0001F600`-style escape, not a UTF-16 "
            "surrogate pair"))
        return None

    def _mapping(self, node: MappingNode) -> tuple[dict[str, Any], Places]:
        if node.tag != MAP_TAG:
            self._check_tag(node, MAP_TAG)
        result: dict[str, Any] = {}
        places: dict[str, tuple[int, int, Any]] = {}
        first: dict[str, Node] = {}
        restore, inline = self.stand.restore, self._inline_plain
        for key_node, value_node in node.value:
            key = key_node.value
            # most keys are plain words written once, for which _key checks nothing more
            if (type(key_node) is not ScalarNode or key_node.style or key_node.tag != STR_TAG
                    or key == "<<" or (key := restore(key)) in first):
                key = self._key(key_node, first, value_node)
                if key is None:
                    continue
            first[key] = key_node
            if inline and type(value_node) is ScalarNode and not value_node.style \
                    and value_node.tag == STR_TAG:  # most values: what _scalar does
                result[key], inner = resolve_plain(restore(value_node.value)), None
            else:
                result[key], inner = self._value(value_node)
            key_mark, value_mark = key_node.start_mark, value_node.start_mark
            places[key] = (key_mark.line << 32 | key_mark.column,
                           value_mark.line << 32 | value_mark.column, inner)
        return result, places

    def _key(self, node: Node, first: dict[str, Node], value_node: Node) -> str | None:
        if type(node) is not ScalarNode:
            self._error(
                node, codes.KEY_NOT_PLAIN_STRING,
                    "mapping keys must be plain strings, not a mapping or a list",
                "write the key as a plain word such as `fetch`",
            )
            return None
        if _is_merge_key(node):
            self._error(
                node, codes.UNSUPPORTED_ANCHOR, "YAML merge keys (`<<`) are not supported",
                "write the keys out; merges hide duplicates and overrides",
            )
            return None
        if node.tag != STR_TAG:
            self._check_tag(node, STR_TAG)
        key = self._text(node) if node.style else self.stand.restore(node.value)
        if key is None:
            return None
        if key in first:
            self._duplicate(node, first[key], value_node)
            return None
        return key

    def _duplicate(self, node: Node, first: Node, value_node: Node) -> None:
        line = _position(first).line
        if node is not first:
            self._error(node, codes.DUPLICATE_KEY, f"duplicate key `{node.value}` (first defined at line "
                        f"{line})", "remove one of the two")
            return
        # written through an alias of the first key: the composer hands back the same node,
        # so the duplicate's own position is where its value starts
        self.findings.append(self.doc.source.diagnostic(
            _position(value_node), codes.DUPLICATE_KEY,
            f"duplicate key `{node.value}` through an alias of the key at line {line}",
            "remove this entry or the first one"))

    _value = _node_value  # every node once: nothing to track
    _inline_plain = True  # a mapping's plain values may skip _value (nothing to count)


class _AliasBuilder(_Builder):
    """A builder for a text with aliases: refuses recursive and exploding ones."""

    _inline_plain = False  # every node, scalars too, counts against the alias budget

    def __init__(self, source: Source, index: int, stand: _Stand = _NO_STAND) -> None:
        super().__init__(source, index, stand)
        self._seen: set[int] = set()
        self._active: set[int] = set()
        self._built = 0
        self._exploded = False

    def _value(self, node: Node) -> tuple[Any, Places]:
        """The node's data, refusing recursive and exploding aliases."""
        if not self._enter(node):
            return None, None
        try:
            return self._node_value(node)
        finally:
            self._active.discard(id(node))

    def _enter(self, node: Node) -> bool:
        ident = id(node)
        if self._exploded:
            return False
        if ident in self._active:
            self._error(node, codes.UNSUPPORTED_ANCHOR,
                        "recursive YAML alias", "an alias cannot contain itself")
            return False
        self._built += 1
        if ident in self._seen and self._built > 2 * len(self._seen) + _ALIAS_BUDGET:
            self._exploded = True
            self._error(
                node, codes.UNSUPPORTED_ANCHOR, "YAML aliases expand to too many nodes",
                "write the repeated content out or reduce alias nesting",
            )
            return False
        self._seen.add(ident)
        self._active.add(ident)
        return True


def resolve_plain(value: str) -> Any:
    """Resolve a plain (unquoted) scalar conservatively."""
    word = _WORDS.get(value, value)
    if word is not value or value[0] not in _NUMBER_START:  # "" is a word: value[0] exists
        return word
    if _INT.match(value):
        digits = len(value.lstrip("+-"))
        return int(value) if digits <= MAX_INT_DIGITS else OutOfRange(value)
    if _FLOAT.match(value):
        number = float(value)
        return number if math.isfinite(number) else OutOfRange(value)
    if value in _INFINITIES:
        return OutOfRange(value)
    return value


_WORDS: dict[str, Any] = {**dict.fromkeys(_NULLS), **dict.fromkeys(_TRUE, True),
                          **dict.fromkeys(_FALSE, False)}
_NUMBER_START = frozenset("+-.0123456789")  # what a number or an infinity starts with


_DEPTH_SHOWN = 100  # a nesting this deep is reported where it is entered


def _deepest(text: str) -> Position:
    """Where the nesting first gets deeper than any flow document needs (the parser walks
    events without recursion, so this works where composing ran out of stack)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=COMPOSER):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > _DEPTH_SHOWN:
                    return _mark_position(event.start_mark)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        pass
    return Position(1, 1)


def _mark_position(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _escape_position(source: Source, node: ScalarNode) -> Position:
    """Where the first surrogate escape of a quoted scalar is (as libyaml reports it: after
    its ``\\u``), else the scalar's start."""
    start, end = node.start_mark, node.end_mark
    lines = source.lines[start.line:end.line + 1]
    for offset, text in enumerate(lines):
        skip = start.column if offset == 0 else 0
        found = _SURROGATE_ESCAPE.search(text, skip)
        if found:
            return Position(start.line + offset + 1, found.start() + 3)
    return _position(node)


def load_text(text: str, path: str) -> tuple[list[Document], list[Diagnostic]]:
    """Parse every document of ``text`` (display name ``path``)."""
    source = Source(path, source_lines(text))
    stand = _Stand(text)
    documents: list[Document] = []
    findings: list[Diagnostic] = []
    try:
        aliases = "*" in text  # an alias is written `*name`
        for index, root in enumerate(yaml.compose_all(stand.hide(text), Loader=COMPOSER)):
            builder = _builder(source, index, stand, aliases=aliases)
            document = builder.build(root)
            del root  # its nodes go; the document keeps the positions it needs
            if not any(f.code == codes.YAML_SYNTAX for f in builder.findings):
                documents.append(document)  # a syntax error leaves no document to check
            findings.extend(builder.findings)
    except yaml.YAMLError as exc:
        findings.append(_syntax_diagnostic(source, exc, text))
    except RecursionError:
        findings.append(source.diagnostic(_deepest(stand.hide(text)), codes.YAML_SYNTAX,
                                          "YAML nesting is too deep", "flatten the document"))
    if not documents and not findings:
        findings.append(
            source.diagnostic(Position(1, 1), codes.NOT_A_MAPPING, "file contains no YAML document",
                              "add a `kind: flow`, `kind: alias` or `kind: worker` document "
                              "or delete the file")
        )
    return documents, findings


def _syntax_diagnostic(source: Source, exc: yaml.YAMLError, text: str) -> Diagnostic:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else 1
    col = mark.column + 1 if mark is not None else 1
    if isinstance(exc, yaml.reader.ReaderError):  # no mark: a character offset in the text
        before = source_lines(text[: exc.position] + "\n")
        line, col = len(before), len(before[-1]) + 1
    tab = _first_tab_indent(source, line)
    if tab is not None:
        return source.diagnostic(
            tab, codes.TAB_INDENT, "tab character in indentation",
            "YAML indentation must use spaces; replace the tab with spaces",
        )
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    context = getattr(exc, "context", None)
    message = f"{context}: {problem}" if context else str(problem)
    return source.diagnostic(Position(line, col), codes.YAML_SYNTAX, f"YAML syntax error: {message}",
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
        return [], [source.diagnostic(Position(1, 1), codes.UNREADABLE, f"cannot read file: {reason}",
                                      "check the path and its permissions")]
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return [], [source.diagnostic(Position(line, 1), codes.UNREADABLE, "file is not valid UTF-8",
                                      "save the file as UTF-8")]
    return load_text(text, display)


def display_path(file: Path, root: Path | None = None) -> str:
    """A stable, machine-independent name: relative to the project root (``root``, found
    when not given) when inside it (the same from every subdirectory, so compiled headers
    never depend on the cwd)."""
    try:
        return file.resolve().relative_to(root or project_root.find_root()).as_posix()
    except (ValueError, OSError, RuntimeError):  # outside the cwd; a symlink loop (3.11)
        return file.as_posix()


def discover(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[Diagnostic]]:
    """Every YAML file under ``paths`` (recursive, hidden directories skipped), sorted."""
    found, findings = _discover_named(paths)
    return list(found.values()), findings


def _discover_named(paths: Iterable[str | os.PathLike[str]]
                    ) -> tuple[dict[str, Path], list[Diagnostic]]:
    """Display name -> file for every YAML file under ``paths``, sorted by name."""
    try:  # once: looking it up per file costs as much as parsing the file
        root: Path | None = project_root.find_root()
    except (OSError, RuntimeError):  # no current directory: names stay as given
        root = None
    found: dict[str, Path] = {}
    findings: list[Diagnostic] = []
    for raw in paths:
        given = Path(raw)
        try:
            given.stat()
        except FileNotFoundError:
            pass  # reported below
        except OSError as exc:  # a name too long, a symlink loop, no permission
            findings.append(_path_problem(given, f"cannot read ({exc.strerror or exc})"))
            continue
        if given.is_dir():
            files = list(_walk(given))
            if not files:
                findings.append(_path_problem(given, "no *.yaml or *.yml files found"))
            for file in files:
                if file.is_file():
                    found.setdefault(display_path(file, root), file)
                else:  # a FIFO or device would block or never end when read
                    findings.append(_path_problem(file, "not a regular file"))
        elif given.is_file():
            found.setdefault(display_path(given, root), given)
        elif given.exists():
            findings.append(_path_problem(given, "not a regular file"))
        else:
            findings.append(_path_problem(given, "no such file or directory"))
    return {name: found[name] for name in sorted(found)}, findings


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(YAML_SUFFIXES) and not name.startswith("."):
                yield Path(dirpath) / name


def _path_problem(root: Path, reason: str) -> Diagnostic:
    return Diagnostic(display_path(root), 1, 1, codes.UNREADABLE, f"{reason}: {root.as_posix()}",
                      "pass a flows directory or YAML files (default: flows/)")


def load_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Document], list[Diagnostic]]:
    """Discover and parse every file; documents in file order, findings of all files."""
    files, findings = _discover_named(paths)
    documents: list[Document] = []
    for display, file in files.items():
        docs, problems = load_file(file, display)
        documents.extend(docs)
        findings.extend(problems)
    return documents, findings
