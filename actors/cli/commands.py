"""What each command that runs and ends does: validate, schema, register, start, status,
events, cancel, run. Each returns its exit code."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import msgspec

from actors.cli import progress
from actors.cli.connection import connection
from actors.cli.describe import print_failure_traceback
from actors.cli.exits import EXIT_FAILED, EXIT_INVALID, EXIT_NATS, EXIT_OK, EXIT_TIMEOUT, STATE_EXIT
from actors.cli.inputs import checked_execution_id, payload_of, settings_of, timeout_of
from actors.cli.items import loop_failures_summary
from actors.cli.live import ProgressBars, follow_steps, progress_bars
from actors.cli.outage import unless_nats_gone
from actors.cli.output import (
    error_line,
    json_text,
    no_execution,
    print_error,
    print_events_table,
    print_json,
    print_status,
    status_row,
    warn_if_existing,
    why_missing,
)
from actors.errors import Unavailable
from actors.wire.events import ExecState


def cmd_validate(args: argparse.Namespace) -> int:
    from actors.playbook.lint import lint, unloaded_python_errors
    from actors.playbook.loader import PlaybookInvalid, load_playbook, read_playbook_text

    ceiling = settings_of(args).max_attempts_ceiling
    bad = 0
    for f in args.files:
        text = ""  # not UTF-8: nothing of its code can be checked
        try:
            text = read_playbook_text(f)  # once: a file that changes between two reads is not two playbooks
            pb = load_playbook(text, file=f, max_attempts=ceiling)
            found = lint(pb, text, file=f)
            bad += bool(found.errors)
            if args.json:
                print_json(
                    {
                        "file": f,
                        "ok": not found.errors,
                        "errors": [msgspec.to_builtins(x) for x in found.errors],
                        "warnings": [msgspec.to_builtins(x) for x in found.warnings],
                    }
                )
                continue
            for x in [*found.errors, *found.warnings]:
                print_error(str(x))
            if not found.errors:
                print(f"{f}: ok ({pb.metadata.catalog_path}, {len(pb.workflow)} steps)")
        except PlaybookInvalid as e:
            bad += 1
            # the code's own errors too: one pass shows every problem of the file
            errors = sorted([*e.errors, *unloaded_python_errors(text, file=f)], key=lambda x: x.line or 0)
            if args.json:
                print_json({"file": f, "ok": False, "errors": [msgspec.to_builtins(x) for x in errors], "warnings": []})
            else:
                for x in errors:
                    print_error(str(x))
        except OSError as e:
            bad += 1
            print_error(f"actors-cli: {f}: {e.strerror}")
    return EXIT_INVALID if bad else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from actors.playbook.schema import playbook_schema

    print(json_text(playbook_schema(), indent=True))
    return EXIT_OK


async def cmd_register(args: argparse.Namespace) -> int:
    async with connection(args) as client:
        for f in args.files:
            entry = await client.register(f)
            if args.json:
                print_json({"file": f, "path": entry.path, "version": entry.version})
            else:
                print(f"{f}: registered {entry.path} v{entry.version}")
    return EXIT_OK


async def cmd_start(args: argparse.Namespace) -> int:
    eid, payload = checked_execution_id(args.execution_id), payload_of(args.payload)
    async with connection(args) as client:
        outcome = await client.start_execution(
            args.path, payload=payload, version=args.version, execution_id=eid, record_wait=timeout_of(args)
        )
    warn_if_existing(outcome)
    if args.json:
        print_json(
            {
                "execution_id": outcome.execution_id,
                "existing": outcome.existing,
                "differs": None if outcome.differs is None else list(outcome.differs),
            }
        )
    else:
        print(outcome.execution_id)
    return EXIT_OK


def not_finished(client: Any, execution_id: str, timeout: float) -> tuple[str, int]:
    """What a command that waited `timeout` seconds for an execution's end says, and its
    exit code: 4, or 5 when the wait ended with NATS unreachable (the execution's fate
    is then unknown here, not late)."""
    if not client.nc.is_connected:
        return (
            f"execution {execution_id}: no end seen within {timeout:g}s, and NATS is unreachable: "
            "its outcome is unknown here",
            EXIT_NATS,
        )
    return f"execution {execution_id}: not finished after {timeout:g}s", EXIT_TIMEOUT


async def cmd_status(args: argparse.Namespace) -> int:
    from actors.wire.events import TERMINAL_STATES

    checked_execution_id(args.execution_id)
    started = time.monotonic()
    async with connection(args) as client:
        st = await client.status(args.execution_id)
        if st is None and not args.watch:
            line, code = await why_missing(client, args.execution_id, timeout_of(args))
            print_error(line)
            return code
        if args.watch and (st is None or st.state not in TERMINAL_STATES):
            if st is not None:
                (print_json(status_row(st)) if args.json else print(f"{st.state}"))
            left = None if args.timeout is None else max(0.0, args.timeout - (time.monotonic() - started))
            try:  # the steps running meanwhile shown as they change (actors/cli/progress.py)
                st = await progress.watch_until_end(client, args.execution_id, left, as_json=args.json)
            except TimeoutError:
                line, code = not_finished(client, args.execution_id, args.timeout)
                print_error(line)
                return code
        assert st is not None
        now = [] if st.state in TERMINAL_STATES else await progress.snapshot(client, args.execution_id)
        running = [r.step for r in now]
        if args.json:
            print_json({**status_row(st), "running_steps": running, "running": progress.running_json(now)})
        else:
            print_status(st, running)
            for line in progress.running_lines(now):  # how long each has run, a loop's counts
                print(line)
        return STATE_EXIT.get(st.state, EXIT_OK)


async def cmd_events(args: argparse.Namespace) -> int:
    checked_execution_id(args.execution_id)
    async with connection(args) as client:
        items = await client.events(args.execution_id)
        if not items:
            line, code = await why_missing(client, args.execution_id, timeout_of(args))
            print_error(line)
            return code
        if args.json:
            for n, it in enumerate(items, 1):
                print_json({"n": n, **it.to_dict()})
        else:
            print_events_table(items)
        unreadable = next((it.unreadable for it in items if it.unreadable), None)
        if unreadable:  # shown as <encrypted ...>: say once why, and how to read them
            print_error(f"actors-cli: some values are shown as <encrypted>: {unreadable}")
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace) -> int:
    from actors.wire.events import TERMINAL_STATES

    eid = checked_execution_id(args.execution_id)
    async with connection(args) as client:
        # a cancel is an input in the execution's log: never write one for an execution
        # that does not exist (it would sit there, and start one if the id came later)
        found = await client.exists(args.execution_id, timeout=timeout_of(args))
        if found is None:
            print_error(
                f"actors-cli: cannot tell yet whether execution {eid} exists: start messages queued before it were "
                f"still waiting after {timeout_of(args):g}s (is an engine running?); nothing cancelled"
            )
            return EXIT_TIMEOUT
        if not found:
            print_error(f"{no_execution(args.execution_id)}: nothing to cancel")
            return EXIT_INVALID
        st = await client.status(args.execution_id)
        if st is not None and st.state in TERMINAL_STATES:
            print(f"execution {args.execution_id} is already {st.state}; nothing to cancel")
            return EXIT_OK
        await client.cancel(args.execution_id, args.reason or "cancelled by user")
        print(f"cancel requested for {args.execution_id}")
    return EXIT_OK


async def cmd_run(args: argparse.Namespace) -> int:
    from actors.playbook.loader import PlaybookInvalid, load_playbook_file

    ceiling = settings_of(args).max_attempts_ceiling
    try:
        pb = load_playbook_file(args.file, max_attempts=ceiling)
        for extra in args.register or []:
            load_playbook_file(extra, max_attempts=ceiling)
    except PlaybookInvalid as e:
        for x in e.errors:
            print_error(str(x))
        return EXIT_INVALID
    except OSError as e:
        print_error(f"actors-cli: {e.filename}: {e.strerror}")
        return EXIT_INVALID
    payload = payload_of(args.payload)
    eid = checked_execution_id(args.execution_id)
    async with connection(args, embedded=True) as client:
        for extra in args.register or []:
            await client.register(extra)
        entry = await client.register(args.file)
        eid = eid or client.new_id()
        bars = None if args.json else ProgressBars()
        bar = None if bars is None else asyncio.create_task(progress_bars(client, eid, bars))
        try:
            outcome = await client.start_execution(entry.path, version=entry.version, payload=payload, execution_id=eid)
        except BaseException:
            await _stop_task(bar)  # or it dies with the connection and logs a traceback
            raise
        warn_if_existing(outcome)
        if not args.json:
            print(f"execution {eid}: {pb.metadata.catalog_path} v{entry.version}")
        try:
            following = follow_steps(client, eid, quiet=args.json, bars=bars)
            if args.timeout is None:  # no bound of the user's, but not for ever once NATS is gone
                following = unless_nats_gone(following, client, eid, "while following it")
            terminal = await asyncio.wait_for(following, args.timeout)
            st = await client.wait(eid, timeout=10)
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels us, then raises KeyboardInterrupt
            if bars is not None:
                bars.settle()
            print_error(interrupted_line(eid, embedded=args_embedded(args)))
            raise
        except (TimeoutError, Unavailable) as e:
            if bars is not None:
                bars.settle()
            if isinstance(e, Unavailable):
                line, code = str(e), EXIT_NATS  # worded as not_finished's lines are
            else:
                line, code = not_finished(client, eid, args.timeout)
            if args.json:
                print_json(
                    {
                        "execution_id": eid,
                        "state": "TIMEOUT",
                        "result": None,
                        "error": {
                            "type": "Timeout" if code == EXIT_TIMEOUT else "NatsUnavailable",
                            "message": line.partition(": ")[2],
                        },
                        "started_at": None,
                        "ended_at": None,
                        "existing": outcome.existing,
                    }
                )
            else:
                print_error(line)
            return code
        finally:
            await _stop_task(bar)
        data = terminal.data
        out = {
            "execution_id": eid,
            "state": st.state,
            "result": await client.result(terminal),
            "error": data.get("error"),
            "started_at": st.started_at,
            "ended_at": st.ended_at,
            "existing": outcome.existing,
        }
        if args.json:
            print_json(out)
        else:
            took = (st.ended_at or 0) - (st.started_at or 0)
            print(f"{st.state} in {took * 1000:.1f} ms")
            if out["error"]:
                print("error: " + error_line(out["error"]))
                await print_failure_traceback(client, eid, out["error"])
            if st.state == ExecState.COMPLETED:  # a failed one's `result` is its steps' partial results
                print("result: " + json_text(out["result"], indent=True))
            for line in await loop_failures_summary(client, eid):  # loops that tolerated failures
                print(line)
        return STATE_EXIT.get(st.state, EXIT_FAILED)


def args_embedded(args: argparse.Namespace) -> bool:
    """Whether `run` works on a server of its own (no --nats, no NATS_URL)."""
    return settings_of(args).nats_url is None


def interrupted_line(eid: str, *, embedded: bool) -> str:
    """What became of an execution whose `run` was interrupted."""
    if embedded:
        return (
            f"actors-cli: interrupted: execution {eid} stopped with this run's own NATS server and actors "
            "(nothing of it is kept); use --nats URL to run executions that outlive the command"
        )
    return (
        f"actors-cli: interrupted: execution {eid} goes on running; follow it with `actors-cli status {eid} "
        f"--watch`, stop it with `actors-cli cancel {eid}`"
    )


async def _stop_task(task: asyncio.Task[Any] | None) -> None:
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
