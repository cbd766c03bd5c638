"""`actors-cli archive`: archive finished executions now and remove them, as the
retention actor does once their retention is over (docs/operating.md, Retention and
archival)."""

from __future__ import annotations

import argparse
import sys
import time

from actors.cli.connection import connection
from actors.cli.exits import EXIT_OK, UsageError
from actors.cli.inputs import settings_of
from actors.cli.output import executions_done, print_json
from actors.cli.since import parse_since
from actors.config.settings import archive_place_problem


def add_archive_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    sp: argparse.ArgumentParser = sub.add_parser(
        "archive",
        help="archive finished executions and remove them from NATS (what retention does, now)",
        description="Archive every execution that ended before --older-than and remove it from every stream and "
        "bucket, the earliest ended first. A running execution is never touched. Archived executions are still "
        "read by status, result, events, list and the UI.",
    )
    sp.add_argument(
        "--older-than",
        metavar="AGE",
        help="only executions that ended this long ago (90s, 15m, 2h, 7d) or before this ISO time "
        "(default: the deployment's retention, $ACTORS_RETAIN_FINISHED seconds)",
    )
    sp.add_argument(
        "--to",
        metavar="DIR",
        help="an absolute directory (one .jsonl.gz file per execution) or `objects` (the archive bucket); "
        "default $ACTORS_ARCHIVE",
    )
    sp.add_argument("--keep", action="store_true", help="archive only: remove nothing")
    sp.add_argument(
        "--no-archive",
        action="store_true",
        help="remove without archiving (what retention does with ACTORS_ARCHIVE=off)",
    )
    sp.add_argument("--limit", type=int, help="at most this many executions")
    sp.add_argument("--json", action="store_true", help="the summary as one JSON object")
    return sp


async def cmd_archive(args: argparse.Namespace) -> int:
    from actors.client import Denied
    from actors.store.archive import archive_store

    settings = settings_of(args)
    place = args.to if args.to is not None else settings.archive
    if problem := archive_place_problem(place):
        raise UsageError(f"--to {place!r}: {problem}")
    if args.no_archive:
        if args.keep or args.to is not None:
            raise UsageError("--no-archive removes without archiving: not with --keep or --to")
        place = "off"
    elif place == "off":
        # removing what was never archived is said explicitly, never a default
        raise UsageError(
            "nowhere to archive (ACTORS_ARCHIVE is off): --to DIR, --to objects, or --no-archive to remove only"
        )
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be at least 1")
    if args.older_than is not None:
        ended_before = parse_since(args.older_than, flag="--older-than")
    elif settings.finished_retention > 0:
        ended_before = time.time() - settings.finished_retention
    else:
        raise UsageError("finished executions are kept for ever here (ACTORS_RETAIN_FINISHED=0): say --older-than AGE")
    progress = executions_done(quiet=args.json)

    async with connection(args) as client:
        to = archive_store(client.nc, place)
        try:
            report = await client.archive(
                ended_before=ended_before, to=to, remove=not args.keep, limit=args.limit, progress=progress
            )
        except Denied as e:  # the cli user may read an execution, not remove it nor write the archive bucket
            raise Denied(f"{e}; with permissions on, archive runs as the retention user") from e
    where = "nowhere (ACTORS_ARCHIVE is off)" if place == "off" else place
    if args.json:
        print_json(
            {
                "archived": report.archived,
                "to": None if place == "off" else place,
                "removed": report.removed,
                "messages": report.messages,
                "blobs": report.blobs,
                "kept": [{"execution_id": eid, "why": why} for eid, why in report.kept],
            }
        )
        return EXIT_OK
    print(f"archived {report.archived} executions to {where}")
    if not args.keep:
        print(f"removed {report.removed} executions ({report.messages} messages, {report.blobs} blobs)")
    for eid, why in report.kept:
        print(f"kept {eid}: {why}")
    sys.stdout.flush()
    return EXIT_OK
