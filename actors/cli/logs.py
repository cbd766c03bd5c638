"""`actors-cli logs ID [--step S] [--follow] [--json]`: what an execution's steps
printed, per attempt and per loop iteration, and how `run` shows it under each step.
`--follow` prints what a step prints while it runs (the parts its tool actor publishes
about every half second), each step's output under a header of its own; without it, a
step still running shows its text so far. A `--step` the playbook lacks is an error."""

from __future__ import annotations

import argparse
from typing import Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK, EXIT_TIMEOUT, STATE_EXIT
from actors.cli.inputs import checked_execution_id, timeout_of
from actors.cli.output import no_execution, print_error, print_json
from actors.client.outputs import Printed, RunningOutput
from actors.wire.events import StepOutput, StepOutputPart

__all__ = ["cmd_logs", "excerpt_lines", "output_header"]

PREFIX = "    | "


def output_header(o: StepOutput) -> str:
    """`step  attempt 2`, or `step[7]  attempt 1` for iteration 7 of a loop."""
    if isinstance(o, RunningOutput):
        return f"{_where(o)}  attempt {o.attempt_number}  (running: {o.size:,} bytes so far)"
    return f"{_where(o)}  attempt {o.attempt_number}  ({o.size:,} bytes)"


def _where(o: StepOutput | StepOutputPart) -> str:
    return o.step if o.iteration_index is None else f"{o.step}[{o.iteration_index}]"


def excerpt_lines(o: StepOutput, execution_id: str) -> list[str]:
    """The event's own excerpt, indented: what `run` prints under a step (no read of
    the object store); where the middle is left out it says how to see it whole."""
    text = (
        o.head
        if not o.tail
        else o.head + f"\n... middle left out: actors-cli logs {execution_id} --step {o.step}\n" + o.tail
    )
    return [PREFIX + line for line in text.rstrip("\n").split("\n")]


def _json(o: StepOutput | StepOutputPart, text: str) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "step": o.step,
        "iteration": o.iteration_index,
        "attempt": o.attempt_number,
        "command_id": o.command_id,
        "at": o.at,
    }
    if isinstance(o, StepOutputPart):  # printed while the step ran (`--follow`)
        return {**shown, "part": o.part, "text": text}
    return {**shown, "size": o.size, "running": isinstance(o, RunningOutput), "text": text}


async def _print(client: Any, o: StepOutput, as_json: bool) -> None:
    text = await client.output_text(o)
    if as_json:
        print_json(_json(o, text))
        return
    print(f"== {output_header(o)} ==")
    print(text, end="" if text.endswith("\n") else "\n", flush=True)


class _Follower:
    """Prints what `follow_printed` gives: a header where another step's output (or
    another run of one) starts, the text as it came, a line end where one was left open."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.last: tuple[str, int | None, int] | None = None  # whose text was printed last
        self.open_line = False  # the last text printed did not end its line

    def show(self, p: Printed) -> None:
        o = p.record
        if self.as_json:
            if p.text or p.begins:
                print_json(_json(o, p.text))
            return
        key = (o.command_id, o.iteration_index, o.delivery)
        if p.begins or key != self.last:
            if not p.text:
                return  # the end of an output already shown whole: nothing left to say
            if self.open_line:
                print()
            if isinstance(o, StepOutputPart):
                what = "running" if p.begins else "continued"
                header = f"{_where(o)}  attempt {o.attempt_number}  ({what})"
            else:
                header = output_header(o) + ("" if p.begins else "  (end)")
            if p.again:
                header += "  (run again: its command was delivered again)"
            print(f"== {header} ==")
        self.last = key
        if p.text:
            print(p.text, end="", flush=True)
            self.open_line = not p.text.endswith("\n")
        if isinstance(o, StepOutput) and self.open_line:  # its output ends here
            print(flush=True)
            self.open_line = False


async def cmd_logs(args: argparse.Namespace) -> int:
    eid = checked_execution_id(args.execution_id)
    assert eid is not None  # a required argument
    async with connection(args) as client:
        found = await client.exists(eid, timeout=timeout_of(args))
        if found is None:
            print_error(f"actors-cli: cannot tell yet whether execution {eid} exists (start messages still queued)")
            return EXIT_TIMEOUT
        if not found:
            print_error(no_execution(eid))
            return EXIT_INVALID
        if args.step is not None:
            steps = await client.step_names(eid)
            if steps is not None and args.step not in steps:
                known = ", ".join(sorted(steps))
                print_error(f"actors-cli: execution {eid} has no step {args.step!r} (its steps: {known})")
                return EXIT_INVALID
        if not args.follow:
            for o in await client.outputs(eid, step=args.step):
                await _print(client, o, args.json)
            return EXIT_OK
        follower = _Follower(args.json)
        async for p in client.follow_printed(eid, step=args.step):
            follower.show(p)
        st = await client.status(eid)
        return STATE_EXIT.get(st.state, EXIT_OK) if st is not None else EXIT_OK
