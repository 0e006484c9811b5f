"""``flowlane schedules``, ``flowlane schedule pause|resume|trigger NAME`` and ``flowlane
triggers``: what starts runs besides a call."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from flowlane.cli.common import add_dsn_argument, add_format, json_errors
from flowlane.runtime.inputs import read_input


def configure(subparsers: Any) -> None:
    listing = subparsers.add_parser(
        "schedules",
        help="list the schedules: next and last firing, paused or not",
        description="Every schedule (`kind: schedule`, applied with `flowlane apply`): its flow, "
        "its next firing in its time zone and in UTC, its last run and that run's status, and "
        "whether an operator paused it. Schedules fire on the maintenance tick of any worker, "
        "`flowlane serve` or `flowlane ui` process.",
    )
    add_dsn_argument(listing)
    add_format(listing)
    listing.set_defaults(func=cmd_schedules)

    one = subparsers.add_parser(
        "schedule",
        help="pause, resume or trigger a schedule",
        description="`pause NAME [--reason TEXT]`: stop it firing (recorded apart from its "
        "definition: apply keeps the pause; `plan` shows it). `resume NAME`: fire again from "
        "the next slot (slots missed while paused are not caught up). `trigger NAME [--input "
        "JSON]`: start a run now, outside the slots.",
    )
    one.add_argument("action", choices=["pause", "resume", "trigger"])
    one.add_argument("name", metavar="NAME")
    one.add_argument("--reason", help="with pause: why (shown by `schedules` and `plan`)")
    one.add_argument("--input", help="with trigger: the run input instead of the schedule's "
                     "(JSON text, @FILE or -)")
    add_dsn_argument(one)
    add_format(one)
    one.set_defaults(func=cmd_schedule)

    triggers = subparsers.add_parser(
        "triggers",
        help="list the triggers: what they start, how many runs, the latest refusal",
        description="Every trigger (`kind: trigger`, applied with `flowlane apply`): its table "
        "and events, its flow, the runs it started (in all and in the last day), and the inputs "
        "its flow refused with the latest refusal (`on_refused: record`).",
    )
    add_dsn_argument(triggers)
    add_format(triggers)
    triggers.set_defaults(func=cmd_triggers)


@json_errors
def cmd_schedules(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    with Client(args.dsn) as client:
        found = client.schedules()
    if args.format == "json":
        print(json.dumps([s.as_dict() for s in found], indent=2))
        return 0
    if not found:
        print("no schedules (declare `kind: schedule` documents, then `flowlane apply`)")
        return 0
    # to the second when some schedule fires at times a minute cannot say (every 30s)
    seconds = any(s.to_the_second for s in found)
    width, shown = (19, "%Y-%m-%d %H:%M:%S") if seconds else (16, "%Y-%m-%d %H:%M")
    print(f"{'NAME':<24}  {'FLOW':<20}  {'WHEN':<22}  {'NEXT (ZONE)':<36}  "
          f"{'NEXT (UTC)':<{width}}  LAST")
    for s in found:
        next_local = f"{s.next_local[:width]} {s.timezone}"
        last = (f"{s.last_run_id} {s.last_status}" if s.last_run_id else "never")
        paused = f"  PAUSED{': ' + s.paused_reason if s.paused_reason else ''}" if s.paused else ""
        print(f"{s.name:<24}  {s.flow:<20}  {s.timing:<22}  {next_local:<36}  "
              f"{s.next_slot.strftime(shown)}  {last}{paused}")
    return 0


@json_errors
def cmd_schedule(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    with Client(args.dsn) as client:
        if args.action == "trigger":
            payload = None if args.input is None else read_input(args.input)
            run_id = client.trigger_schedule(args.name, payload)
            result: dict[str, Any] = {"schedule": args.name, "run_id": run_id}
            text = run_id
        elif args.action == "pause":
            client.pause_schedule(args.name, reason=args.reason)
            result, text = {"schedule": args.name, "paused": True}, f"schedule {args.name} paused"
        else:
            client.resume_schedule(args.name)
            result, text = {"schedule": args.name, "paused": False}, f"schedule {args.name} resumed"
    print(json.dumps(result) if args.format == "json" else text)
    return 0


@json_errors
def cmd_triggers(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    with Client(args.dsn) as client:
        found = client.triggers()
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(t) for t in found], indent=2, default=str))
        return 0
    if not found:
        print("no triggers (declare `kind: trigger` documents, then `flowlane apply`)")
        return 0
    print(f"{'NAME':<24}  {'ON':<32}  {'FLOW':<20}  {'RUNS':>8}  {'LAST DAY':>8}  {'REFUSED':>7}  LAST ERROR")
    for t in found:
        on = f"{','.join(t.events)} {t.table_name}"
        print(f"{t.trigger_name:<24}  {on:<32}  {t.flow_name:<20}  {t.runs:>8}  "
              f"{t.runs_last_day:>8}  {t.refusals:>7}  {t.last_error or '-'}")
    return 0
