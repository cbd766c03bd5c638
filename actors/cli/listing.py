"""The commands that look across executions and at their ends: `list` (executions
newest first), `result` (what a finished execution came to) and `playbooks` (the
catalog). Each returns its exit code."""

from __future__ import annotations

import argparse
import time
from typing import Any

from actors.cli.connection import connection
from actors.cli.describe import failure_traceback, print_traceback
from actors.cli.exits import EXIT_INVALID, EXIT_OK, EXIT_TIMEOUT, STATE_EXIT, UsageError
from actors.cli.inputs import checked_execution_id, timeout_of
from actors.cli.output import (
    duration,
    error_line,
    json_text,
    print_error,
    print_json,
    run_time,
    when,
    why_missing,
)
from actors.cli.since import parse_since
from actors.cli.waits import waits_cell, waits_json
from actors.wire.events import ExecState


def state_of(raw: str | None) -> str | None:
    if raw is None:
        return None
    states = [s.value for s in ExecState]
    if raw.upper() not in states:
        raise UsageError(f"--state {raw!r}: not one of {', '.join(states)}")
    return raw.upper()


ERROR_WIDTH = 60  # characters of an error a row of `list` shows (`result ID` has it whole)


def list_row(st: Any, now: float) -> dict[str, Any]:
    """An execution as `list --json` prints it: its status, how long it ran (or has been
    running, to `now`) and its error, as the web UI's list has them."""
    return {
        "execution_id": st.execution_id,
        "state": st.state,
        "playbook": st.playbook,
        "version": st.version,
        "started_at": st.started_at,
        "ended_at": st.ended_at,
        "duration": run_time(st.started_at, st.ended_at, now),
        "error": st.error or None,
        "waiting": waits_json(st.waiting),  # a RUNNING execution's waits (`tool: wait`)
    }


def _error_cell(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    text = " ".join(f"{error.get('type') or 'Error'}: {error.get('message') or ''}".split())
    return text if len(text) <= ERROR_WIDTH else text[: ERROR_WIDTH - 1] + "…"


async def cmd_list(args: argparse.Namespace) -> int:
    state = state_of(args.state)
    since = None if args.since is None else parse_since(args.since)
    if args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be at least 1")
    async with connection(args) as client:
        found = await client.list(state=state, playbook=args.playbook, since=since, limit=args.limit)
    now = time.time()
    if args.json:
        for st in found:
            print_json(list_row(st, now))
        return EXIT_OK
    started = when(0.0)  # the width of a time in this zone
    print(f"{'execution':34}  {'state':9}  {'playbook':28}  {'ver':>4}  {'started':{len(started)}}  {'took':>8}  error")
    for st in found:
        version = "-" if st.version is None else str(st.version)
        took = duration(run_time(st.started_at, st.ended_at, now))
        last = _error_cell(st.error) or waits_cell(st.waiting)  # a RUNNING one: what it waits for
        print(
            f"{st.execution_id:34}  {st.state:9}  {(st.playbook or '-'):28}  {version:>4}  "
            f"{when(st.started_at):{len(started)}}  {took:>8}  {last}".rstrip()
        )
    return EXIT_OK


async def cmd_result(args: argparse.Namespace) -> int:
    from actors.client import ExecutionFailed, ExecutionNotFinished, ExecutionNotFound

    eid = checked_execution_id(args.execution_id)
    assert eid is not None
    async with connection(args) as client:
        try:
            value = await client.result(eid)
        except ExecutionNotFound as e:
            if await client.status(eid) is not None:  # retired between two reads: the error says so
                print_error(f"actors-cli: {e}")
                return EXIT_INVALID
            line, code = await why_missing(client, eid, timeout_of(args))
            print_error(line)
            return code
        except ExecutionNotFinished as e:
            print_error(f"actors-cli: {e}")
            return EXIT_TIMEOUT
        except ExecutionFailed as e:
            st = e.status
            tb = await failure_traceback(client, eid, st.error)  # the root cause's, on the YAML's lines
            if args.json:
                error = st.error if tb is None or st.error is None else {**st.error, "traceback": tb}
                print_json({"execution_id": eid, "state": st.state, "result": None, "error": error, "reason": e.reason})
            elif st.error and st.state != ExecState.CANCELLED:  # a cancel's is its reason, below
                print("error: " + error_line(st.error))
                print_traceback(tb, "  ")
            else:
                print(f"{st.state}" + (f": {e.reason}" if e.reason else ""))
            return STATE_EXIT.get(st.state, EXIT_OK)
    if args.json:
        print_json({"execution_id": eid, "state": ExecState.COMPLETED, "result": value, "error": None, "reason": None})
    else:
        print(json_text(value, indent=True))
    return EXIT_OK


async def cmd_playbooks(args: argparse.Namespace) -> int:
    async with connection(args) as client:
        entries = await client.playbooks()
    by_path: dict[str, list[Any]] = {}
    for e in entries:
        by_path.setdefault(e.path, []).append(e)
    if args.json:
        for path, versions in by_path.items():
            print_json(
                {
                    "path": path,
                    "latest": versions[-1].version,
                    "versions": [{"version": v.version, "registered_at": v.registered_at} for v in versions],
                }
            )
        return EXIT_OK
    if not by_path:
        print("no playbooks registered")  # an answer, as `no dead letters` and `no schedules` are
        return EXIT_OK
    print(f"{'playbook':40}  {'version':>7}  registered")
    for path, versions in by_path.items():
        for v in versions:
            print(f"{path:40}  {v.version:>7}  {when(v.registered_at)}")
    return EXIT_OK
