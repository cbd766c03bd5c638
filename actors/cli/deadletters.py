"""`actors-cli deadletters [--since T] [--json]`: every actor's dead letters, newest
first: when, which actor gave up, the execution it is filed under, and why."""

from __future__ import annotations

import argparse

from actors.cli.connection import connection
from actors.cli.exits import EXIT_OK
from actors.cli.output import print_json, when
from actors.cli.since import parse_since
from actors.client import LogItem


def letter_dict(item: LogItem) -> dict[str, object]:
    """One dead letter as `--json` prints it (one object per line)."""
    d = item.data
    return {
        "seq": item.seq,
        "at": item.at,
        "source": d.get("source"),
        "execution_id": d.get("execution_id"),
        "reason": d.get("reason"),
        "subject": d.get("subject"),
        "data": d.get("data"),
    }


async def cmd_deadletters(args: argparse.Namespace) -> int:
    since = parse_since(args.since) if args.since else None
    async with connection(args) as client:
        letters = sorted(await client.dead_letters(since=since), key=lambda i: i.seq, reverse=True)
    for item in letters:
        if args.json:
            print_json(letter_dict(item))
        else:
            d = letter_dict(item)
            reason = " ".join(str(d["reason"]).split())
            print(f"{when(item.at)}  {d['source']}  {d['execution_id'] or '-'}  {reason}")
    if not letters and not args.json:
        print("no dead letters" + (f" since {args.since}" if args.since else ""))
    return EXIT_OK
