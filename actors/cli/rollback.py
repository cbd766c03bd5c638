"""`actors-cli prepare-rollback`: a step of the roll back from semantics 6 to an engine
of semantics 5 (docs/upgrades.md "From 5 to 6"): a plain copy of the start of every
execution not ended whose log opens with its start stored with its first decision, so
that an engine of 5 halts it rather than misreading it (`Client.prepare_rollback`)."""

from __future__ import annotations

import argparse
import sys

from actors.cli.connection import connection
from actors.cli.exits import EXIT_OK
from actors.cli.output import executions_done, print_json


def add_prepare_rollback_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    sp: argparse.ArgumentParser = sub.add_parser(
        "prepare-rollback",
        help="before rolling the engine pods back to semantics 5: make each running execution of 6 safe for them",
        description="Before rolling the engine pods back to a release of semantics 5 (docs/upgrades.md, "
        "From 5 to 6), once every engine pod runs with ACTORS_FAST_ANSWERS=0: for every execution not ended whose "
        "start was stored with its first decision, write a plain copy of its start record, which an engine of 5 "
        "halts at (SemanticsUnknown) instead of misreading the execution, and which semantics 6 ignores (it "
        "resumes the execution when it is back). Running it again writes nothing new. With permissions on, run it "
        "as the engine user (it writes an engine's input).",
    )
    sp.add_argument("--json", action="store_true", help="the summary as one JSON object")
    return sp


async def cmd_prepare_rollback(args: argparse.Namespace) -> int:
    from actors.client import Denied

    progress = executions_done(quiet=args.json)

    async with connection(args) as client:
        try:
            report = await client.prepare_rollback(progress=progress)
        except Denied as e:  # the cli user may not write an engine's input
            raise Denied(f"{e}; prepare-rollback runs as the engine user (docs/upgrades.md)") from e
    if args.json:
        print_json(
            {
                "running": report.running,
                "copied": report.copied,
                "copied_before": report.copied_before,
                "plain": report.plain,
            }
        )
        return EXIT_OK
    print(
        f"{report.running} executions not ended: {report.copied} start copies written, "
        f"{report.copied_before} written before, {report.plain} started plain (nothing to do)"
    )
    sys.stdout.flush()
    return EXIT_OK
