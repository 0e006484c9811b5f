"""``flowlane start|runs|run|cancel|retry``: start runs and look at them."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from flowlane import errors
from flowlane.cli.common import add_dsn_argument, add_format, json_errors, print_waiting
from flowlane.runtime.inputs import read_input, read_jsonl, read_seconds, read_time
from flowlane.runtime.limits import MAX_INPUT_BYTES, MAX_PRIORITY, MIN_PRIORITY, STATUSES

if TYPE_CHECKING:
    from flowlane.runtime.client import RunFilter, RunSummary, Started
    from flowlane.runtime.run_state import RunState


def configure(subparsers: Any) -> None:
    start = subparsers.add_parser(
        "start",
        help="start a run, print its id",
        description="Start a run. With --wait, print the run's output when it ends: "
        "exit 0 completed, 1 failed, cancelled or still running at --timeout.",
    )
    start.add_argument("flow", metavar="FLOW_OR_ALIAS")
    start.add_argument(
        "--input",
        help="run input: JSON text, @FILE to read a JSON file, or - for stdin (default {}); "
        f"at most {MAX_INPUT_BYTES // 1024} KiB",
    )
    start.add_argument(
        "--input-file",
        metavar="FILE",
        help="start one run per line of FILE (JSON Lines; - for stdin), in one transaction: "
        "a bad line starts no run; prints one run id per line",
    )
    start.add_argument("--run-id", help="use this run id (UUID) instead of a generated one")
    start.add_argument(
        "--key",
        help="idempotency key: a second start of this flow or alias with the same key returns "
        "the first run instead of starting another",
    )
    start.add_argument(
        "--priority", type=int, metavar="N",
        help=f"claim this run's tasks before those of lower priorities on the same queue "
        f"({MIN_PRIORITY}..{MAX_PRIORITY}; default: the flow's `priority`, else 0)",
    )
    later = start.add_mutually_exclusive_group()
    later.add_argument(
        "--at", metavar="TIME", help="start at TIME (ISO 8601, e.g. 2026-05-01T12:00+02:00); the "
        "run waits, cancellable, until a worker's maintenance tick begins it"
    )
    later.add_argument("--delay", metavar="DURATION", help="start after DURATION (30s, 10m, 2h, 1d)")
    start.add_argument("--wait", action="store_true", help="wait for the run to end")
    start.add_argument(
        "--timeout", type=float, default=300.0, help="with --wait: seconds (default 300)"
    )
    add_dsn_argument(start)
    add_format(start)
    start.set_defaults(func=cmd_start)

    runs = subparsers.add_parser("runs", help="list recent runs, newest first")
    runs.add_argument(
        "--flow", help="only runs of this flow (an alias: every version it points or pointed at)"
    )
    runs.add_argument("--status", choices=list(STATUSES))
    runs.add_argument("--limit", type=int, default=20)
    runs.add_argument("--before", metavar="RUN_ID", help="the next page: runs older than this one")
    runs.add_argument("--parent", metavar="RUN_ID", help="only the child runs this run started")
    runs.add_argument(
        "--since", metavar="TIME", help="runs started at or after TIME (ISO 8601, e.g. 2026-05-01T12:00)"
    )
    runs.add_argument(
        "--stuck",
        action="store_true",
        help="list started runs that no task can move (exit 1 when there are any)",
    )
    add_dsn_argument(runs)
    add_format(runs)
    runs.set_defaults(func=cmd_runs)

    cancel = subparsers.add_parser(
        "cancel",
        help="cancel a started run",
        description="Cancel a started run: it ends `cancelled`, its queued messages are archived, "
        "results of handlers still running are rejected and no further step starts. "
        "Without RUN_ID, every started or waiting run that the filter options match is "
        "cancelled, oldest first, in batches of one short transaction each (--dry-run counts them).",
    )
    cancel.add_argument("run_id", metavar="RUN_ID", nargs="?",
                        help="the run; without it, every run the filter options match")
    cancel.add_argument("--reason", help="recorded with the run")
    cancel.add_argument("--status", choices=("started", "waiting"), action="append",
                        help="with a filter: only runs in this state (repeatable; default both)")
    _add_filter(cancel)
    add_dsn_argument(cancel)
    add_format(cancel)
    cancel.set_defaults(func=cmd_cancel)

    retry = subparsers.add_parser(
        "retry",
        help="resume a failed run from its failed steps, or rerun a run from a step",
        description="Resume a failed run: its failed steps start over with a fresh attempt "
        "budget; completed steps keep their outputs. Refused for runs that are not failed. "
        "With --from STEP, a failed or completed run reruns STEP and every step that depends "
        "on it; the other steps keep their outputs and the attempt history is kept. "
        "Without RUN_ID, every failed run that the filter options match is retried, oldest "
        "first, in batches of one short transaction each (--dry-run counts them).",
    )
    retry.add_argument("run_id", metavar="RUN_ID", nargs="?",
                       help="the run; without it, every failed run the filter options match")
    retry.add_argument("--from", dest="from_step", metavar="STEP",
                       help="rerun this step and every step that depends on it")
    retry.add_argument("--compensation", action="store_true",
                       help="resume the run's stopped compensation: retry its failed compensations")
    _add_filter(retry)
    add_dsn_argument(retry)
    add_format(retry)
    retry.set_defaults(func=cmd_retry)

    signal = subparsers.add_parser(
        "signal",
        help="complete a run's wait step with a payload",
        description="Send a signal to a wait step of a run: it completes the step with the "
        "payload as its output and starts what depends on it; a signal for a step the run has "
        "not reached yet is kept until the step starts. Refused, changing nothing, for a step "
        "that is not a wait step, a finished run or step, or a step that already has a signal.",
    )
    signal.add_argument("run_id", metavar="RUN_ID")
    signal.add_argument("step", metavar="STEP")
    signal.add_argument(
        "--data",
        default="{}",
        help="the payload: JSON text, @FILE to read a JSON file, or - for stdin (default {}); "
        f"at most {MAX_INPUT_BYTES // 1024} KiB",
    )
    signal.add_argument("--by", metavar="NAME",
                        help="who sends the signal: recorded as the payload's `by` (an object)")
    add_dsn_argument(signal)
    add_format(signal)
    signal.set_defaults(func=cmd_signal)

    run = subparsers.add_parser("run", help="show a run: status, step states, output")
    run.add_argument("run_id", metavar="RUN_ID")
    add_dsn_argument(run)
    add_format(run)
    run.set_defaults(func=cmd_run)


def _start_many(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    if args.input is not None or args.run_id or args.wait or args.key:
        raise errors.UsageError(
            "--input-file cannot be combined with --input, --run-id, --key or --wait",
            hint="start one run with --input, or many with --input-file FILE.jsonl",
        )
    source = "stdin" if args.input_file == "-" else args.input_file
    try:
        stream = sys.stdin.buffer if args.input_file == "-" else open(args.input_file, "rb")  # noqa: SIM115
    except OSError as exc:
        raise errors.UsageError(f"cannot read --input-file {source}: {exc.strerror or exc}") from exc
    numbers: list[int] = []
    with stream, Client(args.dsn) as client:
        try:
            run_ids = client.start_runs(args.flow, read_jsonl(stream, source, numbers),
                                        start_at=_start_at(args), priority=args.priority)
        except (errors.UsageError, errors.InputRefused) as exc:
            raise _at_line(exc, source, numbers) from exc
    for run_id in run_ids:
        if args.format == "json":
            print(json.dumps({"run_id": run_id, "flow": args.flow}))
        else:
            print(run_id)
    print(f"started {len(run_ids)} runs of {args.flow}", file=sys.stderr)
    return 0


def _at_line(exc: errors.FlowlaneError, source: str, numbers: list[int]) -> errors.FlowlaneError:
    """An input refused by the flow's input_schema, named by its line of the file."""
    if not isinstance(exc, errors.InputRefused) or exc.position is None or exc.position >= len(numbers):
        return exc
    return errors.InputRefused(f"{source}:{numbers[exc.position]}: {exc}", hint=exc.hint,
                               detail=exc.detail, sqlstate=exc.sqlstate, position=exc.position,
                               path=exc.path, rule=exc.rule)


@json_errors
def cmd_start(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client, RunTimeout

    if args.input_file is not None:
        return _start_many(args)
    payload = {} if args.input is None else read_input(args.input)
    if args.wait and args.timeout <= 0:
        raise errors.UsageError(f"--timeout must be more than 0, not {args.timeout:g}")
    start_at = _start_at(args)
    with Client(args.dsn) as client:
        started = client.start(args.flow, payload, run_id=args.run_id, key=args.key,
                               start_at=start_at, priority=args.priority)
        run_id, flow_slug = started.run_id, started.flow_slug
        if not args.wait:
            _report_start(args, started)
            return 0
        print(f"{_start_words(started)} run {run_id} ({flow_slug}); waiting", file=sys.stderr)
        try:
            state = client.wait(run_id, timeout=args.timeout)
        except RunTimeout:
            _explain_wait(args.dsn, run_id)
            raise
    return _report_end(state, args.format)


def _start_at(args: argparse.Namespace) -> datetime | timedelta | None:
    """--at TIME or --delay DURATION (a delay counts on the database's clock)."""
    if args.delay is not None:
        seconds = read_seconds(args.delay)
        if seconds is None:
            raise errors.UsageError(f"--delay {args.delay!r} is not a duration",
                                    hint="write 30s, 10m, 2h, 1d or a number of seconds")
        return timedelta(seconds=seconds)
    if args.at is not None:
        return read_time("--at", args.at)
    return None


def _start_words(started: Started) -> str:
    if started.existed:
        return "joined the debounced" if started.debounced else "found the existing"
    return "scheduled" if started.status == "waiting" else "started"


def _report_start(args: argparse.Namespace, started: Started) -> None:
    if args.format == "json":
        print(json.dumps({"flow": args.flow, **started.as_dict()}))
        return
    print(started.run_id)
    if started.debounced:
        print(f"run {started.run_id} is debounced: it begins with the last input of its key's starts "
              f"at {started.start_at.isoformat() if started.start_at else 'once they pause'} unless another "
              f"arrives{' (this start joined it)' if started.existed else ''}", file=sys.stderr)
    elif started.existed:
        print(f"run {started.run_id} already existed for key {args.key or '(the flow dedup key)'}: "
              "not started again", file=sys.stderr)
    elif started.status == "waiting" and started.start_at is not None:
        print(f"run {started.run_id} waits until {started.start_at.isoformat()} "
              f"(`flowlane cancel {started.run_id}` cancels it)", file=sys.stderr)
    elif started.status == "waiting":
        print(f"run {started.run_id} waits for a slot of its flow's concurrency limit "
              f"(`flowlane run {started.run_id}` says which)", file=sys.stderr)


def _explain_wait(dsn: str | None, run_id: str | None = None) -> None:
    from flowlane.app import fleet

    print_waiting(fleet.waiting(dsn, run_id))


def _report_end(state: RunState, fmt: str) -> int:
    """The output of a run that ended; exit 0 only when it completed."""
    run = state.run
    if fmt == "json":
        print(json.dumps({"run_id": run.run_id, "flow_slug": run.flow_slug, "status": run.status,
                          "output": run.output, "error_message": run.error_message,
                          "cancel_reason": run.cancel_reason}))
    elif run.status == "completed":
        print(json.dumps(run.output, indent=2, ensure_ascii=False))
    if run.status == "completed":
        return 0
    why = run.error_message or run.cancel_reason or ""
    print(f"error: run {run.run_id} {run.status}" + (f": {why}" if why else ""), file=sys.stderr)
    print(f"hint: `flowlane run {run.run_id}` shows each step and its attempts", file=sys.stderr)
    return 1


def _since(text: str | None) -> datetime | None:
    return None if text is None else read_time("--since", text)


@json_errors
def cmd_runs(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    if args.stuck:
        return _stuck_runs(args)
    with Client(args.dsn) as client:
        runs = client.list_runs(
            limit=args.limit,
            flow=args.flow,
            status=args.status,
            before=args.before,
            since=_since(args.since),
            parent=args.parent,
        )
    if args.format == "json":
        print(json.dumps([r.as_dict() for r in runs], indent=2))
    elif not runs:
        print("no runs")
    else:
        _print_runs(runs)
    if runs and len(runs) == args.limit:
        print(f"next page: flowlane runs --before {runs[-1].run_id}", file=sys.stderr)
    if any(r.status == "started" for r in runs):
        _explain_wait(args.dsn)
    return 0



def _print_runs(runs: list[RunSummary]) -> None:
    """The table; a WAITING FOR column when some run (or a task of it) is held back."""
    waits = any(r.waiting_for for r in runs)
    print(_runs_header(waits))
    for r in runs:
        delayed = r.status == "waiting" and r.start_at is not None and not r.held
        when = f"{'until ' if delayed else ''}{(r.start_at if delayed else r.started_at):%Y-%m-%d %H:%M:%S}"
        line = f"{r.run_id:<36}  {r.flow_slug:<28}  {r.status:<9}  {when}"
        print(f"{line:<106}  {r.waiting_for}" if waits and r.waiting_for else line)


def _runs_header(waits: bool) -> str:
    header = f"{'RUN ID':<36}  {'FLOW':<28}  {'STATUS':<9}  STARTED"
    return f"{header:<106}  WAITING FOR" if waits else header


def _add_filter(parser: argparse.ArgumentParser) -> None:
    found = parser.add_argument_group("filter (instead of RUN_ID: many runs at once)")
    found.add_argument("--flow", metavar="FLOW_OR_ALIAS", help="runs of this flow (an alias: every version)")
    found.add_argument("--step", metavar="STEP", help="runs whose step STEP failed")
    found.add_argument("--error-type", metavar="TYPE", help="runs with a failed attempt of this error type "
                       "in their last round (e.g. CardDeclined)")
    found.add_argument("--error", metavar="TEXT", help="runs whose error contains TEXT (any case)")
    found.add_argument("--since", metavar="TIME", help="runs started at or after TIME (ISO 8601)")
    found.add_argument("--until", metavar="TIME", help="runs started before TIME (default: now)")
    found.add_argument("--dry-run", action="store_true", help="count the runs and show a few; change nothing")
    found.add_argument("--batch", type=int, default=100, metavar="N",
                       help="runs per transaction (default 100, at most 1000)")


def _run_filter(args: argparse.Namespace) -> RunFilter | None:
    """The filter of a bulk retry or cancel, or None for one run (RUN_ID)."""
    from flowlane.runtime.client import RunFilter

    where = RunFilter(flow=args.flow, step=args.step, error_type=args.error_type, error=args.error,
                      since=_since(args.since),
                      until=None if args.until is None else read_time("--until", args.until))
    bulk_only = args.dry_run or (getattr(args, "status", None) is not None)
    if args.run_id is not None:
        if not where.is_empty() or bulk_only:
            raise errors.UsageError("give RUN_ID or filter options, not both")
        return None
    if where.is_empty():
        raise errors.UsageError("name a run (RUN_ID) or the runs to take (filter options)",
                                hint="e.g. --flow orders --step charge --error-type CardDeclined --dry-run")
    return where


def _bulk(args: argparse.Namespace, action: str, where: RunFilter, **options: Any) -> int:
    from flowlane.runtime.client import Client

    with Client(args.dsn) as client:
        done = client.repair(action, where, dry_run=args.dry_run, batch_size=args.batch, **options)
    if args.format == "json":
        print(json.dumps(done.as_dict()))
        return 0
    past = {"retry": "retried", "cancel": "cancelled"}[action]
    if done.dry_run:
        print(f"would {action} {done.matched} run{'s' if done.matched != 1 else ''} "
              f"(in batches of {args.batch}); nothing changed")
    else:
        print(f"{past} {done.changed} of {done.matched} matching runs in {done.batches} "
              f"batch{'es' if done.batches != 1 else ''}")
        if done.changed < done.matched:
            print(f"{done.matched - done.changed} changed meanwhile and were left as they are")
    for r in done.sample:
        print(f"  {r.run_id}  {r.flow_slug:<24} {r.status:<9} {r.started_at:%Y-%m-%d %H:%M:%S}  "
              f"{_one_line(r.error_message)}")
    if len(done.sample) < done.matched:
        print(f"  ... and {done.matched - len(done.sample)} more")
    return 0


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())[:100]


@json_errors
def cmd_cancel(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    where = _run_filter(args)
    if where is not None:
        return _bulk(args, "cancel", where, reason=args.reason, statuses=args.status)
    with Client(args.dsn) as client:
        run = client.cancel(args.run_id, reason=args.reason)
    if args.format == "json":
        print(json.dumps({"run_id": run.run_id, "status": run.status,
                          "cancel_reason": run.cancel_reason}))
    else:
        print(f"run {run.run_id} cancelled ({run.cancel_reason})")
    return 0


@json_errors
def cmd_retry(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    where = _run_filter(args)
    if where is not None:
        if args.from_step is not None or args.compensation:
            raise errors.UsageError("--from and --compensation take one run (RUN_ID), not a filter")
        return _bulk(args, "retry", where)
    with Client(args.dsn) as client:
        run = client.retry(args.run_id, from_step=args.from_step, compensation=args.compensation)
    if args.format == "json":
        print(json.dumps({"run_id": run.run_id, "status": run.status,
                          "retry_count": run.retry_count, "compensation": run.compensation}))
    elif args.compensation:
        print(f"run {run.run_id}: compensation {run.compensation} again")
    else:
        print(f"run {run.run_id} {run.status} again (retry {run.retry_count})")
    return 0


@json_errors
def cmd_signal(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client
    from flowlane.runtime.report import signal_words

    payload = read_input(args.data, "--data", "the signal payload")
    with Client(args.dsn) as client:
        signal = client.signal(args.run_id, args.step, payload, by=args.by)
    if args.format == "json":
        print(json.dumps({"run_id": signal.run_id, "step": signal.step_slug,
                          "applied": signal.applied, "by": signal.by}))
    elif signal.applied_at is not None:
        print(f"step {signal.step_slug} of run {signal.run_id} "
              f"{signal_words(signal.payload, signal.applied_at)}")
    else:
        print(f"signal kept: step {signal.step_slug} of run {signal.run_id} completes "
              "with it when the run reaches it")
    return 0


def _stuck_runs(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    with Client(args.dsn) as client:
        stuck = client.stuck_runs()
    if args.format == "json":
        print(json.dumps([r.as_dict() for r in stuck], indent=2))
        return 1 if stuck else 0
    if not stuck:
        print("no stuck runs")
        _explain_wait(args.dsn)
        return 0
    print(f"{'RUN ID':<36}  {'FLOW':<28}  {'STARTED':<19}  WHY")
    for r in stuck:
        print(f"{r.run_id:<36}  {r.flow_slug:<28}  {r.started_at:%Y-%m-%d %H:%M:%S}  {r.reason}")
    print(f"{len(stuck)} stuck run(s): `flowlane run {stuck[0].run_id}` shows its tasks (and so "
          "for each)", file=sys.stderr)
    return 1


@json_errors
def cmd_run(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client
    from flowlane.runtime.report import render_run

    with Client(args.dsn) as client:
        state = client.get_run(args.run_id)
    if args.format == "json":
        print(json.dumps(state.to_json(), indent=2, default=str))
    else:
        print(render_run(state))
    if state.run.status == "started":
        _explain_wait(args.dsn, state.run.run_id)
    return 0
