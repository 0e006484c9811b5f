"""Compiler commands: validate, compile, check, graph, types, schema; plan, apply, verify."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowlane import errors, project_root
from flowlane.cli.common import add_dsn_argument, report_error

# only what the parser needs: each command imports the rest (`--help` stays fast)
from flowlane.compiler import diagnostics

if TYPE_CHECKING:
    from flowlane.runtime.registry import HandlerCheck

# `flowlane.compiler.diagram.FORMATS`, without importing the model for `--help`
# (tests/cli/test_fast_cli.py proves the two agree)
GRAPH_FORMATS = ("mermaid", "dot")


def _add_paths(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATHS",
                        help="flow YAML files or directories (default: flows/)")


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=sorted(diagnostics.FORMATTERS), default="text",
                        help="diagnostics output format (default: text)")


def _add_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="DIR",
                        help="directory of the compiled SQL (default: the project's sql/)")


def _add_handler_options(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--handlers", dest="handlers", action="store_const", const="strict", default="check",
        help="every handler module must import here too (where the project's requirements "
        "are installed, e.g. CI); by default a module that cannot be imported is only a note")
    mode.add_argument(
        "--no-handlers", dest="handlers", action="store_const", const="off",
        help="do not import the handlers (an environment without the project's requirements, "
        "e.g. a pre-commit hook)")
    parser.add_argument(
        "--import-path", action="append", default=[], metavar="DIR",
        help="extra directory to import handler modules from (repeatable; "
        "the project root and the current directory are always searched)")


def configure(subparsers: Any) -> None:
    validate = subparsers.add_parser("validate", help="schema and semantic checks of flow YAML")
    _add_paths(validate)
    _add_format(validate)
    _add_handler_options(validate)
    validate.set_defaults(func=cmd_validate)

    compile_ = subparsers.add_parser("compile", help="write SQL for every flow and the aliases")
    _add_paths(compile_)
    _add_out(compile_)
    _add_format(compile_)
    compile_.set_defaults(func=cmd_compile)

    check = subparsers.add_parser(
        "check", help="CI gate: validate, stale/hand-edited SQL, immutable flow shapes")
    _add_paths(check)
    _add_out(check)
    _add_format(check)
    check.add_argument("--base", metavar="REV",
                       help="git revision whose committed SQL fixes the shapes (default: HEAD)")
    _add_handler_options(check)
    check.set_defaults(func=cmd_check)

    graph_ = subparsers.add_parser("graph", help="draw a flow (queues as lanes)")
    graph_.add_argument("flow", metavar="FLOW", help="flow slug or alias")
    _add_paths(graph_)
    graph_.add_argument("--format", choices=GRAPH_FORMATS, default="mermaid")
    graph_.set_defaults(func=cmd_graph)

    types = subparsers.add_parser("types", help="a Python module of Literal types for names")
    _add_paths(types)
    types.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    types.set_defaults(func=cmd_types)

    schema_ = subparsers.add_parser("schema", help="print the JSON Schema of flow YAML")
    schema_.set_defaults(func=cmd_schema)

    init = subparsers.add_parser(
        "init", help="scaffold a project: flows/, a handler, .gitignore, CI workflow",
        description="Write flows/hello.yaml (with the editor modeline), handlers.py, "
        "flowlane.schema.json, .gitignore entries for .flowlane/ and .venv/, a CI workflow "
        ".github/workflows/flowlane.yml and the compiled SQL; existing files are kept.")
    init.add_argument("directory", nargs="?", default=".", metavar="DIR",
                      help="project directory (default: the current one)")
    init.set_defaults(func=cmd_init)

    _configure_database(subparsers)


def _configure_database(subparsers: Any) -> None:
    plan = subparsers.add_parser("plan", help="compare the YAML with a live database")
    _add_paths(plan)
    add_dsn_argument(plan)
    plan.add_argument("--format", choices=("text", "markdown"), default="text",
                      help="markdown: a table to post as a pull-request comment")
    plan.add_argument("--exit-code", action="store_true",
                      help="exit 0 when apply would change nothing, 2 when it would change "
                      "something, 1 on an error or a refused change (NEW_VERSION_REQUIRED)")
    plan.set_defaults(func=cmd_plan)

    apply = subparsers.add_parser(
        "apply", help="apply the compiled SQL (aliases included) in one transaction")
    _add_paths(apply)
    _add_out(apply)
    add_dsn_argument(apply)
    apply.set_defaults(func=cmd_apply)

    verify = subparsers.add_parser("verify", help="read-only drift check of a live database")
    _add_paths(verify)
    add_dsn_argument(verify)
    verify.set_defaults(func=cmd_verify)


def _report(found: list[diagnostics.Diagnostic] | tuple[diagnostics.Diagnostic, ...],
            fmt: str) -> None:
    if fmt != "text" or found:
        sys.stdout.write(diagnostics.render(list(found), fmt))


def cmd_validate(args: argparse.Namespace) -> int:
    from flowlane.compiler import api

    project, found = api.analyze_paths(args.paths)
    checked = ""
    if project is not None and args.handlers != "off":
        handlers = _check_handlers(project, args)
        found = handlers.diagnostics
        project = None if found else project
        checked = (", every handler callable as handler(input, ctx)" if not handlers.unimportable
                   else ", every handler of an importable module callable as handler(input, ctx)")
    _report(found, args.format)
    if project is not None and args.format == "text":
        print(f"ok: {len(project.flows)} flow(s), {len(project.aliases)} alias(es), "
              f"{len(project.workers)} worker(s){checked}")
    return 1 if found else 0


def _check_handlers(project: Any, args: argparse.Namespace) -> HandlerCheck:
    """Import the project's handlers (``--handlers``: every module must import); the
    modules that cannot be imported here are said once each, on stderr."""
    from flowlane.runtime.registry import check_handlers

    paths = [str(Path.cwd()), str(project_root.find_root()), *args.import_path]
    result = check_handlers(project, [os.path.abspath(p) for p in paths],
                            strict=args.handlers == "strict")
    for note in result.notes():
        print(note, file=sys.stderr)
    return result


def _handler_findings(args: argparse.Namespace) -> list[diagnostics.Diagnostic]:
    """FL072 of ``check``: none when the handlers are off or the project does not load
    (``check`` reports that itself)."""
    from flowlane.compiler import api

    if args.handlers == "off":
        return []
    project, found = api.analyze_paths(args.paths)
    if project is None or found:
        return []
    return _check_handlers(project, args).diagnostics


def cmd_compile(args: argparse.Namespace) -> int:
    from flowlane.compiler import api

    args.out = args.out or project_root.sql_dir()
    result = api.compile_paths(args.paths, args.out)
    _report(result.diagnostics, args.format)
    if result.diagnostics:
        print("nothing written: fix the errors above", file=sys.stderr)
        return 1
    if args.format == "text":
        print(result.summary.line(args.out))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from flowlane.compiler import check as checks

    result = checks.check(args.paths, args.out, args.base)
    for note in result.notes:
        print(note, file=sys.stderr)
    handler_findings = _handler_findings(args)
    base = args.base or "HEAD"
    if args.format == "text":
        for line in (*result.alias_moves, *result.option_changes):
            print(line)
    if args.format != "text":
        _report([*result.all_diagnostics(base), *handler_findings], args.format)
    elif not result.ok:
        sys.stdout.write(result.render_text(base))
    if args.format == "text" and handler_findings:
        _report(handler_findings, args.format)
    elif args.format == "text" and result.ok:
        print("ok: compiled SQL is up to date and no committed flow changed its shape")
    return 0 if result.ok and not handler_findings else 1


def _project(paths: list[str]) -> Any:
    from flowlane.compiler import api

    return api.load_project(paths)


def cmd_graph(args: argparse.Namespace) -> int:
    project = _project(args.paths)
    try:
        flow = project.resolve(args.flow)
    except KeyError:
        known = ", ".join(sorted([f.slug for f in project.flows] +
                                 [a.slug for a in project.aliases]))
        raise errors.NotFound(f"no flow or alias `{args.flow}`", hint=f"known: {known}") \
            from None
    title = flow.slug
    if project.has_alias(args.flow):
        alias = project.alias(args.flow)
        draining = f", draining {', '.join(alias.draining)}" if alias.draining else ""
        title = f"{flow.slug} (active version of alias {alias.slug}{draining})"
    from flowlane.compiler import diagram

    sys.stdout.write(diagram.render(flow, args.format, title))
    return 0


def cmd_types(args: argparse.Namespace) -> int:
    from flowlane.compiler import pytypes

    text = pytypes.render(_project(args.paths))
    if args.out:
        target = Path(args.out)
        try:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise errors.FlowlaneError(f"cannot write {target.as_posix()}: "
                                       f"{exc.strerror or exc}") from exc
        print(f"wrote {target.as_posix()}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from flowlane.app import scaffold

    root = Path(args.directory)
    result = scaffold.init(root)
    for name in result.written:
        print(f"created {(root / name).as_posix()}")
    for name in result.kept:
        print(f"kept    {(root / name).as_posix()} (already there)")
    enter = f"cd {root.as_posix()} && " if args.directory != "." else ""
    print(f"next: {enter}flowlane db migrate && flowlane apply && flowlane serve\n"
          "      then, in another terminal: flowlane start hello --input '{\"name\": \"Ada\"}' --wait")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from flowlane.compiler import schema

    sys.stdout.write(schema.schema_text())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from flowlane.app import deploy

    try:
        plan = deploy.plan(_project(args.paths), args.dsn)
    except errors.UsageError as exc:
        if not args.exit_code:
            raise
        # with --exit-code, 2 means "changes": every error exits 1

        report_error(exc)
        return 1
    sys.stdout.write(plan.markdown() if args.format == "markdown" else plan.render())
    _note_uncovered(args)
    if plan.refused:
        return 1
    return 2 if args.exit_code and plan.drift else 0


def cmd_apply(args: argparse.Namespace) -> int:
    from flowlane.app import deploy

    result = deploy.apply(args.paths, args.out, args.dsn)
    sys.stdout.write(result.render())
    _note_uncovered(args)
    return 0


def _note_uncovered(args: argparse.Namespace) -> None:
    """Queues whose live workers a change leaves without some of its pairs (on stderr)."""
    from flowlane.app import fleet

    for note in fleet.uncovered(_project(args.paths), args.dsn):
        print(f"note: {note}", file=sys.stderr)


def cmd_verify(args: argparse.Namespace) -> int:
    from flowlane.app import deploy

    plan = deploy.plan(_project(args.paths), args.dsn)
    sys.stdout.write(plan.render(verify=True))
    return 1 if plan.drift else 0
