"""`actors-cli retry ID [--from STEP] [--payload JSON]`: start a new execution that
retries a terminal one from a step (actors/client/retrying.py); prints the new id.
`--failed-items [--step NAME]`: a redrive, only its loops' failed items run again."""

from __future__ import annotations

import argparse

from actors.cli.connection import connection
from actors.cli.exits import EXIT_OK, UsageError
from actors.cli.inputs import checked_execution_id, payload_of
from actors.cli.output import print_error, print_json


def add_retry_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "retry",
        help="start a new execution that keeps a terminal execution's completed steps and runs again from a step; "
        "prints its id",
    )
    sp.add_argument("execution_id", help="a terminal execution (COMPLETED, FAILED or CANCELLED)")
    sp.add_argument("--from", dest="from_step", metavar="STEP", help="the step to run again (default: the failed step)")
    sp.add_argument("--payload", help="JSON object (or @file) merged over the old execution's payload")
    sp.add_argument(
        "--failed-items",
        action="store_true",
        help="run again only the failed items of its loops, keeping the other items' results (a redrive)",
    )
    sp.add_argument("--step", metavar="NAME", help="with --failed-items: only this loop step's failed items")
    sp.add_argument(
        "--json",
        action="store_true",
        help='{"execution_id", "retry_of", "from_step", "kept_steps", "existing", "redriven"}',
    )
    return sp


async def cmd_retry(args: argparse.Namespace) -> int:
    checked_execution_id(args.execution_id)
    if args.failed_items and (args.from_step is not None or args.payload is not None):
        raise UsageError("--failed-items runs the failed items again as they were: it takes no --from or --payload")
    if args.step is not None and not args.failed_items:
        raise UsageError("--step names the loop whose failed items to redrive: use it with --failed-items")
    payload = payload_of(args.payload) if args.payload is not None else None
    async with connection(args) as client:
        if args.failed_items:
            outcome = await client.redrive(args.execution_id, step=args.step)
        else:
            outcome = await client.retry(args.execution_id, from_step=args.from_step, payload=payload)
    if outcome.existing:
        print_error(
            f"actors-cli: warning: this retry of {outcome.retry_of} was started before as {outcome.execution_id}"
        )
    if args.json:
        print_json(
            {
                "execution_id": outcome.execution_id,
                "retry_of": outcome.retry_of,
                "from_step": outcome.from_step,
                "kept_steps": list(outcome.kept_steps),
                "existing": outcome.existing,
                "redriven": outcome.redriven,
            }
        )
    else:
        print(outcome.execution_id)
    return EXIT_OK
