"""`actors-cli describe ID [STEP] [--json]`: a step's whole story in one place
(actors/client/steps.py). Without STEP every step of the execution on a line (state,
attempts, duration, error type); with STEP its args as rendered, its result, every
attempt (start, end, worker, error and the whole traceback, the retry that followed,
the on_error decision), the rule that ended it, what it printed."""

from __future__ import annotations

import argparse
import re
from typing import Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_OK
from actors.cli.inputs import checked_execution_id
from actors.cli.output import duration, json_text, print_json, when
from actors.cli.waits import shown, wait_text

__all__ = [
    "add_describe_parser",
    "cmd_describe",
    "failure_traceback",
    "print_failure_traceback",
    "print_traceback",
    "yaml_line",
]

HEAD = 400  # characters of a value (args, result, output) shown; --json gives all of it
INDENT = "    "


def add_describe_parser(sub: argparse._SubParsersAction[Any]) -> argparse.ArgumentParser:
    sp: argparse.ArgumentParser = sub.add_parser(
        "describe",
        help="an execution's steps, or one step's whole story: args, result, attempts, errors with tracebacks",
        description="Without STEP: every step of the execution, one line each (state, attempts, duration, error). "
        "With STEP: its args as rendered, result, every attempt (start, end, worker, error type, message and "
        "traceback, the retry delay that followed, the on_error decision), the failure rule that ended it and "
        "what it printed. Example: actors-cli describe ID fetch",
    )
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("step", nargs="?", help="a step of it (an unknown one is an error, exit 3)")
    sp.add_argument("--json", action="store_true", help="everything, as one JSON object (a list without STEP)")
    return sp


def head(value: Any, limit: int = HEAD) -> str:
    """A value on one line, at most `limit` characters, what is not printable escaped
    (JSON escapes only C0 controls: a C1 CSI or a bidi override would reach the terminal)."""
    return shown(value if isinstance(value, str) else json_text(value), limit)


def print_traceback(traceback: str | None, indent: str = INDENT) -> None:
    """A traceback as it was printed, indented under the line that names its error."""
    if traceback:
        for line in traceback.rstrip("\n").split("\n"):
            print(indent + line)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def yaml_line(traceback: str | None) -> str | None:
    """`flow.yaml:42`: the playbook line a python step's traceback ends in (its last
    frame in the playbook file), None when it names none."""
    found = [f"{f}:{n}" for f, n in _FRAME.findall(traceback or "") if f.endswith((".yaml", ".yml"))]
    return found[-1] if found else None


def error_text(error: dict[str, Any]) -> str:
    """`Type: message  at flow.yaml:42`; what is not printable escaped (a `Rejected`
    message names the sender and the comment of a signal as the log holds them)."""
    at = yaml_line(error.get("traceback"))
    text = f"{shown(error.get('type'))}: {shown(error.get('message'), 100_000, lines=True)}"
    return text + (f"  at {at}" if at else "")


async def failure_traceback(client: Any, execution_id: str, error: dict[str, Any] | None) -> str | None:
    """The traceback of a failed execution's root cause (`error`, its status's: the
    step that failed), from that step's story; None when it has none."""
    from actors.errors import UserError

    step = (error or {}).get("step")
    if not step:
        return None
    try:
        story = await client.step_story(execution_id, str(step))
    except UserError:  # its log is gone (retired without an archive)
        return None
    if story.error is not None and story.error.get("traceback"):
        return str(story.error["traceback"])
    for a in reversed(story.attempts):
        if a.error is not None and a.error.get("traceback"):
            return str(a.error["traceback"])
    return None


async def print_failure_traceback(client: Any, execution_id: str, error: dict[str, Any] | None) -> None:
    """Under a failed execution's one-line error: its root cause's traceback."""
    print_traceback(await failure_traceback(client, execution_id, error), "  ")


async def cmd_describe(args: argparse.Namespace) -> int:
    eid = checked_execution_id(args.execution_id)
    async with connection(args) as client:
        if args.step is None:
            stories = await client.step_stories(eid)
            if args.json:
                print_json([s.to_dict() for s in stories])
            else:
                _table(stories)
            return EXIT_OK
        story = await client.step_story(eid, args.step)
    if args.json:
        print_json(story.to_dict())
    else:
        _story(story)
    return EXIT_OK


def _table(stories: list[Any]) -> None:
    print(f"{'step':24}  {'state':10}  {'attempts':>8}  {'duration':>9}  error")
    for s in stories:
        tries = str(s.attempt_count) if s.loop is None else _loop_counts(s.loop)
        waiting = s.wait is not None and s.wait.get("state") == "WAITING"
        last = wait_text(s.wait, step=False) if waiting else s.error_type or "-"
        print(f"{s.step:24}  {s.state:10}  {tries:>8}  {duration(s.duration):>9}  {last}")


def _loop_counts(loop: dict[str, Any]) -> str:
    return f"{loop.get('done', 0)}/{loop.get('total', 0)}"


def _story(s: Any) -> None:
    rows = [
        ("step", s.step),
        ("state", s.state),
        ("kind", s.kind or "-"),
        ("entered", when(s.entered_at, ms=True)),
        ("exited", when(s.exited_at, ms=True)),
        ("duration", duration(s.duration)),
    ]
    if s.visits > 1:
        rows.append(("visits", str(s.visits)))
    for k, v in rows:
        print(f"{k:10} {v}")
    if s.args is not None:
        print(f"{'args':10} {head(s.args)}")
    if s.state == "COMPLETED" and (s.attempts or s.wait is not None):
        print(f"{'result':10} {head(s.result)}")
    if s.wait is not None:
        _wait(s.wait)
    if s.loop is not None:
        lp = s.loop
        print(
            f"{'loop':10} {lp.get('state', '-')}: {lp.get('done', 0)}/{lp.get('total', 0)} done, "
            f"{lp.get('failed', 0)} failed (tolerated: {lp.get('tolerated_failures', 0)}), mode {lp.get('mode')}"
        )
        for e in lp.get("errors") or []:
            err = e.get("error") or {}
            print(f"{INDENT}item {e.get('index')}: {err.get('type')}: {err.get('message')}")
    for a in s.attempts:
        print(f"attempt {a.number}  {a.state}  command {a.command_id}")
        print(f"{INDENT}{'started':9} {when(a.started_at, ms=True)}")
        print(f"{INDENT}{'ended':9} {when(a.ended_at, ms=True)}  ({duration(_took(a))})")
        print(f"{INDENT}{'worker':9} {a.worker or '-'}")
        if a.error is not None:
            print(f"{INDENT}{'error':9} {error_text(a.error)}")
            print_traceback(a.error.get("traceback"), INDENT * 2)
        if a.decision is not None:
            rule = f" (rule {a.decision['rule']})" if a.decision.get("rule") else ""
            print(f"{INDENT}{'on_error':9} {a.decision.get('decision')}{rule}")
        if a.retry is not None:
            rule = f" by {a.retry['rule']}" if a.retry.get("rule") else ""
            print(f"{INDENT}{'retry':9} in {duration(a.retry.get('delay'))}{rule} (due {when(a.retry.get('due'))})")
        if a.output is not None and a.output.get("size"):
            print(f"{INDENT}{'output':9} {a.output['size']:,} bytes")
            text = str(a.output.get("head") or "")[:HEAD]
            for line in text.rstrip("\n").split("\n"):
                print(f"{INDENT * 2}| {line}")
    if s.retry_exhausted is not None:
        r = s.retry_exhausted
        limit = f"max {r.get('max_attempts')}, {r.get('rule')}"
        print(f"{'retries':10} exhausted after {r.get('attempts')} attempts ({limit})")
    if s.exit is not None:
        route = s.exit.get("failure_route")
        if isinstance(route, dict) and route.get("edge"):
            print(f"{'on_failure':10} {route.get('edge')} -> {route.get('target')} ({route.get('status')})")
        if s.exit.get("reason"):
            print(f"{'reason':10} {s.exit['reason']}")
    if s.error is not None and not any(_same(a.error, s.error) for a in s.attempts):
        # failed without an attempt of its own failing so (a template, a loop, a budget)
        print(f"{'error':10} {error_text(s.error)}")
        print_traceback(s.error.get("traceback"))


def _wait(w: dict[str, Any]) -> None:
    """A wait step's wait: what for, since and until when, and the signal it took."""
    if w.get("state") == "ENDED" and w.get("signal") is not None:
        w = {**w, "deadline": None}  # cancelled: it never timed out, and never will
    text = wait_text(w, step=False)
    if w.get("state") != "WAITING":
        text = "waited" + text.removeprefix("waiting")  # its story, once it ended
    print(f"{'wait':10} {w.get('state')}: {text}")
    got = w.get("received")
    if got:
        # as written to the log, by whoever may publish there: escaped, one line each
        by = f" by {shown(got.get('by'))}" if got.get("by") else ""
        kept = " (kept before the step waited)" if got.get("kept") else ""
        name, sid = shown(got.get("name")), shown(got.get("signal_id"))
        print(f"{'signal':10} {name} {sid}{by} at {when(got.get('at'), ms=True)}{kept}")
    elif w.get("ended_at") is not None:
        print(f"{'ended':10} {when(w.get('ended_at'), ms=True)}")


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and all(a.get(k) == b.get(k) for k in ("type", "message", "traceback"))


def _took(a: Any) -> float | None:
    return None if a.started_at is None or a.ended_at is None else a.ended_at - a.started_at
