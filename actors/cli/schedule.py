"""`actors-cli schedule add|list|pause|resume|delete`: cron schedules that start a
playbook (actors/client/schedules.py). A request that cannot be done as asked (bad
name, cron or time zone, unknown playbook, no such schedule) is one line, exit 3."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK
from actors.cli.inputs import payload_of
from actors.cli.output import print_error, print_json, when

if TYPE_CHECKING:
    from actors.client import Client, ScheduleView


def add_schedule_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: list[argparse.ArgumentParser]
) -> None:
    """The `schedule` command and its subcommands; `common` are the --nats and
    --timeout options every one takes."""
    sp = sub.add_parser(
        "schedule",
        help="start a playbook on a cron schedule",
        description="Cron schedules that start a playbook: each fire starts an execution (its id derived from "
        "the schedule and the fire time). `actors-cli schedule VERB --help` for each verb's options.",
    )
    ss = sp.add_subparsers(dest="schedule_command", required=True, metavar="VERB", help="one of:")
    p = ss.add_parser("add", parents=common, help="create a schedule")
    p.add_argument("name", help="schedule name: letters, digits, _ and - (up to 100)")
    p.add_argument("--playbook", required=True, metavar="PATH", help="catalog path of a registered playbook")
    p.add_argument(
        "--cron",
        required=True,
        help='"*/5 * * * *" (5 fields, minute first), 6 fields (seconds first) or @hourly, @daily, ...',
    )
    p.add_argument("--payload", metavar="JSON", help="JSON object each execution starts with, or @file")
    p.add_argument("--timezone", metavar="TZ", help="IANA time zone the cron is read in (default UTC)")
    p.add_argument("--version", type=int, metavar="N", help="playbook version (default: the latest at each fire)")
    p = ss.add_parser("list", parents=common, help="every schedule, its state and its next fire")
    p.add_argument("--json", action="store_true", help="one JSON object per schedule")
    for verb, what in (
        ("pause", "stop a schedule firing until it is resumed"),
        ("resume", "let a paused schedule fire again"),
        ("delete", "remove a schedule (executions it started are kept)"),
    ):
        ss.add_parser(verb, parents=common, help=what).add_argument("name", help="the schedule's name")


async def cmd_schedule(args: argparse.Namespace) -> int:
    from actors.client import ScheduleError
    from actors.store.catalog import CatalogError

    try:
        payload = payload_of(args.payload) if args.schedule_command == "add" else None
        async with connection(args) as client:
            return await _do(client, args, payload)
    except (ScheduleError, CatalogError) as e:
        print_error(f"actors-cli: {e}")
        return EXIT_INVALID


async def _do(client: Client, args: argparse.Namespace, payload: dict[str, Any] | None) -> int:
    verb = args.schedule_command
    if verb == "add":
        spec = await client.schedule_add(
            args.name,
            playbook=args.playbook,
            cron=args.cron,
            payload=payload,
            timezone=args.timezone,
            version=args.version,
        )
        print(f"schedule {spec.name}: {spec.playbook} on {spec.cron!r} ({spec.timezone or 'UTC'})")
    elif verb == "list":
        _print_list(await client.schedules(), as_json=args.json)
    elif verb == "pause":
        done = await client.schedule_pause(args.name)
        print(f"schedule {args.name} {'paused' if done else 'was already paused'}")
    elif verb == "resume":
        done = await client.schedule_resume(args.name)
        print(f"schedule {args.name} {'resumed' if done else 'was not paused'}")
    else:
        await client.schedule_delete(args.name)
        print(f"schedule {args.name} deleted")
    return EXIT_OK


def _print_list(views: list[ScheduleView], *, as_json: bool) -> None:
    if as_json:
        for v in views:
            s = v.spec
            print_json(
                {
                    "name": s.name,
                    "playbook": s.playbook,
                    "version": s.version,
                    "cron": s.cron,
                    "timezone": s.timezone,
                    "payload": s.payload,
                    "paused": s.paused,
                    "next_fire": v.next_fire,
                    "created": s.created,
                }
            )
        return
    if not views:
        print("no schedules")
        return
    rows = [("NAME", "PLAYBOOK", "CRON", "TIMEZONE", "STATE", "NEXT FIRE", "CREATED")]
    for v in views:
        s = v.spec
        rows.append(
            (
                s.name,
                s.playbook + (f"@{s.version}" if s.version is not None else ""),
                s.cron,
                s.timezone or "UTC",
                "paused" if s.paused else "active",
                when(v.next_fire),
                when(s.created),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
