"""`actors-cli logs ID [--step S] [--follow] [--json]`: what an execution's steps
printed, per attempt and per loop iteration, and how `run` shows it under each step."""

from __future__ import annotations

import argparse
from typing import Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK, EXIT_TIMEOUT, STATE_EXIT
from actors.cli.inputs import checked_execution_id, timeout_of
from actors.cli.output import print_error, print_json
from actors.wire.events import StepOutput

__all__ = ["cmd_logs", "excerpt_lines", "output_header"]

PREFIX = "    | "


def output_header(o: StepOutput) -> str:
    """`step  attempt 2`, or `step[7]  attempt 1` for iteration 7 of a loop."""
    where = o.step if o.iteration_index is None else f"{o.step}[{o.iteration_index}]"
    return f"{where}  attempt {o.attempt_number}  ({o.size:,} bytes)"


def excerpt_lines(o: StepOutput, execution_id: str) -> list[str]:
    """The event's own excerpt, indented: what `run` prints under a step (no read of
    the object store); where the middle is left out it says how to see it whole."""
    text = (
        o.head
        if not o.tail
        else o.head + f"\n... middle left out: actors-cli logs {execution_id} --step {o.step}\n" + o.tail
    )
    return [PREFIX + line for line in text.rstrip("\n").split("\n")]


def _json(o: StepOutput, text: str) -> dict[str, Any]:
    return {
        "step": o.step,
        "iteration": o.iteration_index,
        "attempt": o.attempt_number,
        "command_id": o.command_id,
        "at": o.at,
        "size": o.size,
        "text": text,
    }


async def _print(client: Any, o: StepOutput, as_json: bool) -> None:
    text = await client.output_text(o)
    if as_json:
        print_json(_json(o, text))
        return
    print(f"== {output_header(o)} ==")
    print(text, end="" if text.endswith("\n") else "\n", flush=True)


async def cmd_logs(args: argparse.Namespace) -> int:
    eid = checked_execution_id(args.execution_id)
    async with connection(args) as client:
        found = await client.exists(eid, timeout=timeout_of(args))
        if found is None:
            print_error(f"actors-cli: cannot tell yet whether execution {eid} exists (start messages still queued)")
            return EXIT_TIMEOUT
        if not found:
            print_error(f"actors-cli: no execution {eid}")
            return EXIT_INVALID
        if not args.follow:
            for o in await client.outputs(eid, step=args.step):
                await _print(client, o, args.json)
            return EXIT_OK
        async for o in client.follow_outputs(eid, step=args.step):
            await _print(client, o, args.json)
        st = await client.status(eid)
        return STATE_EXIT.get(st.state, EXIT_OK) if st is not None else EXIT_OK
