"""The commands that look across executions and at their ends: `list` (executions
newest first), `result` (what a finished execution came to) and `playbooks` (the
catalog). Each returns its exit code."""

from __future__ import annotations

import argparse
import time
from typing import Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK, EXIT_TIMEOUT, STATE_EXIT, UsageError
from actors.cli.inputs import checked_execution_id
from actors.cli.output import error_line, json_text, print_error, print_json
from actors.cli.since import parse_since
from actors.wire.events import ExecState


def state_of(raw: str | None) -> str | None:
    if raw is None:
        return None
    states = [s.value for s in ExecState]
    if raw.upper() not in states:
        raise UsageError(f"--state {raw!r}: not one of {', '.join(states)}")
    return raw.upper()


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def list_row(st: Any) -> dict[str, Any]:
    return {
        "execution_id": st.execution_id,
        "state": st.state,
        "playbook": st.playbook,
        "version": st.version,
        "started_at": st.started_at,
        "ended_at": st.ended_at,
    }


async def cmd_list(args: argparse.Namespace) -> int:
    state = state_of(args.state)
    since = None if args.since is None else parse_since(args.since)
    if args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be at least 1")
    async with connection(args) as client:
        found = await client.list(state=state, playbook=args.playbook, since=since, limit=args.limit)
    if args.json:
        for st in found:
            print_json(list_row(st))
        return EXIT_OK
    print(f"{'execution':34}  {'state':9}  {'playbook':28}  {'ver':>4}  {'started':19}  ended")
    for st in found:
        version = "-" if st.version is None else str(st.version)
        print(
            f"{st.execution_id:34}  {st.state:9}  {(st.playbook or '-'):28}  {version:>4}  "
            f"{_when(st.started_at):19}  {_when(st.ended_at)}"
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
            print_error(f"actors-cli: {e}")
            return EXIT_INVALID
        except ExecutionNotFinished as e:
            print_error(f"actors-cli: {e}")
            return EXIT_TIMEOUT
        except ExecutionFailed as e:
            st = e.status
            if args.json:
                print_json(
                    {"execution_id": eid, "state": st.state, "result": None, "error": st.error, "reason": e.reason}
                )
            elif st.error:
                print("error: " + error_line(st.error))
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
        print_error("no playbooks registered")
        return EXIT_OK
    print(f"{'playbook':40}  {'version':>7}  registered")
    for path, versions in by_path.items():
        for v in versions:
            print(f"{path:40}  {v.version:>7}  {_when(v.registered_at)}")
    return EXIT_OK
