"""The compiler's public functions; the CLI is a thin shell over them."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flowlane import errors, project_root
from flowlane.compiler import analyze, compiled, diagnostics, loader
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.model import Project

PathLike = str | os.PathLike[str]
Paths = PathLike | Iterable[PathLike] | None  # one path, several, or None: the project's flows/
MAX_LISTED = 20


def _paths(paths: Paths) -> list[PathLike]:
    chosen = [paths] if isinstance(paths, str | os.PathLike) else list(paths or ())
    return chosen or [project_root.flows_dir()]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many acyclic objects.

    Loading allocates millions of YAML nodes and values that hold no reference
    cycles; with the collector running, its repeated scans of these young objects
    cost more than the parsing itself. Reference counting still frees everything.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def analyze_paths(paths: Paths = None) -> tuple[Project | None, list[Diagnostic]]:
    """Load, validate and check every document; the project only when there is no finding."""
    with _gc_paused():
        documents, findings = loader.load_paths(_paths(paths))
        project, more = analyze.analyze(documents, complete=not findings)
        # freed before the collector resumes: its first pass then scans only the project
        del documents
    found = diagnostics.sort([*findings, *more])
    return (project if not found else None), found


def validate(paths: Paths = None) -> list[Diagnostic]:
    """Every finding of the YAML under ``paths`` (default ``flows/``), sorted; empty = valid."""
    return analyze_paths(paths)[1]


def validate_text(text: str, path: str = "<string>") -> list[Diagnostic]:
    """Findings for YAML given as text (one file)."""
    documents, findings = loader.load_text(text, path)
    _project, more = analyze.analyze(documents, complete=not findings)
    return diagnostics.sort([*findings, *more])


def project_from_text(text: str, path: str = "<string>") -> Project:
    """A project from YAML text (one file); raises CompileError on any finding."""
    documents, findings = loader.load_text(text, path)
    project, more = analyze.analyze(documents, complete=not findings)
    return _require(project, diagnostics.sort([*findings, *more]))


def load_project(paths: Paths = None) -> Project:
    """The validated project of the YAML under ``paths`` (one path or several; default the
    project's ``flows/``); raises :class:`flowlane.errors.CompileError` on any finding."""
    project, found = analyze_paths(paths)
    return _require(project, found)


def _require(project: Project | None, found: Sequence[Diagnostic]) -> Project:
    if found or project is None:
        raise compile_error(found)
    return project


def compile_error(found: Sequence[Diagnostic]) -> errors.CompileError:
    lines = [d.headline() for d in found[:MAX_LISTED]]
    if len(found) > MAX_LISTED:
        lines.append(f"... and {len(found) - MAX_LISTED} more")
    noun = "error" if len(found) == 1 else "errors"
    message = f"{len(found)} {noun} in the flow YAML:\n" + "\n".join(lines)
    return errors.CompileError(message, hint="run `flowlane validate` for details",
                               diagnostics=tuple(found))


def compile_project(project: Project) -> dict[str, str]:
    """Relative SQL path (``flows/<slug>.sql``, ``aliases.sql``) -> byte-stable text."""
    with _gc_paused():
        return compiled.render_project(project)


@dataclass(frozen=True)
class WriteSummary:
    """What ``compile`` did to the output directory."""

    written: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def line(self, out: PathLike) -> str:
        return (f"compiled {len(self.written) + len(self.unchanged)} file(s) into "
                f"{Path(out).as_posix()}/: {len(self.written)} written, "
                f"{len(self.unchanged)} unchanged, {len(self.removed)} removed")


def orphans(files: Mapping[str, str], out: PathLike) -> list[str]:
    """Compiled flow files in ``out`` that no longer have a flow in the YAML. Only files
    compile wrote (a header in any format) count: other SQL there is the user's."""
    flows_dir = Path(out) / compiled.FLOWS_DIR
    if not flows_dir.is_dir():
        return []
    present = sorted(f"{compiled.FLOWS_DIR}/{p.name}" for p in flows_dir.glob("*.sql")
                     if p.is_file() and _compiled_by_flowlane(p))
    return [p for p in present if p not in files]


def _compiled_by_flowlane(file: Path) -> bool:
    with file.open("rb") as handle:
        return compiled.is_compiled_flow(handle.read(compiled.HEADER_LIMIT))


def write_output(files: Mapping[str, str], out: PathLike) -> WriteSummary:
    """Write changed files only; remove compiled flow files whose flow is gone."""
    try:
        return _write_output(files, Path(out))
    except OSError as exc:
        raise errors.FlowlaneError(
            f"cannot write the compiled SQL to {Path(out).as_posix()}: "
            f"{exc.strerror or exc}", hint="check --out and the directory's permissions"
        ) from exc


def _write_output(files: Mapping[str, str], root: Path) -> WriteSummary:
    written, unchanged = [], []
    for relative, text in sorted(files.items()):
        target = root / relative
        if target.is_file() and target.read_bytes() == text.encode("utf-8"):
            unchanged.append(relative)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, text)
        written.append(relative)
    removed = orphans(files, root)
    for relative in removed:
        (root / relative).unlink()
    return WriteSummary(tuple(written), tuple(unchanged), tuple(removed))


def _atomic_write(target: Path, text: str) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_bytes(text.encode("utf-8"))
    os.replace(temporary, target)


@dataclass(frozen=True)
class CompileResult:
    """The outcome of :func:`compile_paths`."""

    project: Project | None
    diagnostics: tuple[Diagnostic, ...]
    summary: WriteSummary = field(default_factory=WriteSummary)


def compile_paths(paths: Paths = None, out: PathLike | None = None) -> CompileResult:
    """Validate and, when there is no finding, write the SQL (default: the project's sql/);
    files untouched otherwise."""
    out = out or project_root.sql_dir()
    project, found = analyze_paths(paths)
    if project is None:
        return CompileResult(None, tuple(found))
    summary = write_output(compile_project(project), out)
    return CompileResult(project, (), summary)
