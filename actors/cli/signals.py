"""`actors-cli signal ID NAME [--data JSON | --data-file F] [--key K] [--id SIGNAL_ID]`:
send a signal to an execution, for a step that waits for it (`tool: wait`); `actors-cli
approve ID [STEP] [--key K] [--comment C]` and `actors-cli reject ID [STEP] [--key K]
--comment C`: answer its waiting approval step (`approval: true`; one iteration of a loop
of approvals: `--key`) with `{approved, comment, by}`, `by` being $USER (else `cli`).
Each goes through `Client.signal` (actors/client/signals.py).

Exit codes: 0 the signal is in the execution's log (for `signal`, also when the same
--id was sent before: one signal); 3 refused because the execution has ended (nothing
written: its state is printed), an approval step answered already by someone else
("already answered": the two answers share the wait's id, the first stands), a bad
name, key, id or data, a blank rejection comment, an unknown or retired execution, no
approval step waiting, pods older than signals; 4
whether the execution exists cannot be told yet (starts still queued); 5 NATS
unavailable."""

from __future__ import annotations

import argparse
import os
from typing import Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK, EXIT_TIMEOUT, UsageError
from actors.cli.inputs import checked_execution_id
from actors.cli.output import print_error, print_json

__all__ = ["add_signal_parsers", "cmd_approve", "cmd_reject", "cmd_signal"]


def add_signal_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> list[argparse.ArgumentParser]:
    """The parsers of `signal`, `approve` and `reject` (main.py adds the connection flags)."""
    sp = sub.add_parser(
        "signal",
        help="send a signal to an execution (a step waiting for it takes it; else it is kept for a later wait)",
        description="Send signal NAME to execution ID: a `tool: wait` step waiting for it (and for its key) takes it, "
        "with the data as its result; one sent before the step waits is kept until it does. Sending twice with the "
        "same --id is one signal. An execution that has ended refuses it (exit 3, nothing written).",
    )
    sp.add_argument("execution_id", help="the execution's id")
    sp.add_argument("name", help="the signal's name: letters, digits, _ and -, at most 64 characters")
    data = sp.add_mutually_exclusive_group()
    data.add_argument("--data", metavar="JSON", help="the signal's data, any JSON value (the waiting step's result)")
    data.add_argument("--data-file", metavar="FILE", help="the signal's data, read from a JSON file")
    sp.add_argument("--key", default="", metavar="K", help="the key a step waits on (`key:` of the wait step)")
    sp.add_argument("--id", dest="signal_id", metavar="SIGNAL_ID", help="the signal's id (default: a new one)")
    sp.add_argument("--json", action="store_true", help='{"execution_id", "signal_id", "accepted", "state"}')
    parsers = [sp]
    for name, approved in (("approve", True), ("reject", False)):
        sp = sub.add_parser(
            name,
            help=f"{name} an execution's waiting approval step (`approval: true`)"
            + ("" if approved else "; the step fails Rejected"),
        )
        sp.add_argument("execution_id", help="the execution's id")
        sp.add_argument("step", nargs="?", help="the approval step (needed when more than one waits)")
        sp.add_argument(
            "--key",
            metavar="ITEM_KEY",
            help="for a loop of approvals: the iteration to answer (its wait's `key`, e.g. the item's id)",
        )
        sp.add_argument(
            "--comment",
            required=not approved,
            metavar="TEXT",
            help="why (kept in the step's result" + (", required)" if not approved else ")"),
        )
        sp.add_argument("--json", action="store_true", help='{"execution_id", "signal_id", "accepted", "state"}')
        parsers.append(sp)
    return parsers


def _data_of(args: argparse.Namespace) -> Any:
    from actors.wire.jsonvalues import loads
    from actors.wire.nesting import json_within, too_deep

    if args.data is None and args.data_file is None:
        return None
    if args.data_file is not None:
        text: str | bytes = _data_file(args.data_file)
        what = f"--data-file {args.data_file}"
    else:
        text, what = args.data, "--data"
    if not json_within(text):
        raise UsageError(f"{what}: {too_deep('it')}")
    try:
        return loads(text)
    except ValueError as e:  # msgspec.DecodeError is one
        raise UsageError(f"{what}: not JSON ({e})") from None


def _data_file(path: str) -> bytes:
    """The file's bytes, under a payload file's rules (a regular file of at most the value
    cap, ACTORS_MAX_VALUE_BYTES), its errors naming --data-file."""
    from actors.config.settings import Settings
    from actors.playbook.userfiles import UnreadableFile, read_regular_file

    cap = Settings.from_env(os.environ).max_value_bytes
    try:
        return read_regular_file(
            path, limit=cap, what="the data", over=f"the {cap:,}-byte cap on values (ACTORS_MAX_VALUE_BYTES)"
        )
    except UnreadableFile as e:
        raise UsageError(f"--data-file {path}: {e.strerror}") from None


def _by() -> str:
    return (os.environ.get("USER") or os.environ.get("LOGNAME") or "cli")[:200]


def _answer(reply: Any, as_json: bool, what: str, *, approval: bool = False) -> int:
    """Print the reply; its exit code. A duplicate is another's answer for an approval
    (its id is the wait's: someone answered first, and the step took theirs: exit 3),
    and for `signal` the same --id sent again (one signal, as documented: exit 0)."""
    state = None if reply.status is None else str(reply.status.state)
    if as_json:
        print_json(
            {
                "execution_id": reply.execution_id,
                "signal_id": reply.signal_id,
                "accepted": reply.accepted,
                "duplicate": reply.duplicate,
                "state": state,
            }
        )
    if not reply.accepted:
        if not as_json:
            print_error(f"actors-cli: execution {reply.execution_id} is already {state}: {what} refused, nothing sent")
        return EXIT_INVALID
    if reply.duplicate and approval:
        if not as_json:
            print_error(
                f"actors-cli: already answered: the approval step of execution {reply.execution_id} had an answer "
                f"(signal id {reply.signal_id}) before this {what}, which was not sent"
            )
        return EXIT_INVALID
    if not as_json:
        if reply.duplicate:
            print(f"{what} was sent to {reply.execution_id} before (signal id {reply.signal_id}): the first stands")
        else:
            print(f"{what} sent to {reply.execution_id} (signal id {reply.signal_id})")
    return EXIT_OK


async def cmd_signal(args: argparse.Namespace) -> int:
    from actors.client import ExecutionNotKnownYet
    from actors.client.signals import Signals

    eid = checked_execution_id(args.execution_id)
    assert eid is not None
    data = _data_of(args)
    Signals.check_signal(args.name, args.key, args.signal_id)  # a typo is told before NATS is reached
    async with connection(args) as client:
        try:
            reply = await client.signal(eid, args.name, data, key=args.key, signal_id=args.signal_id, by=_by())
        except ExecutionNotKnownYet as e:
            print_error(f"actors-cli: {e}")
            return EXIT_TIMEOUT
    return _answer(reply, args.json, f"signal {args.name!r}")


async def _approval(args: argparse.Namespace, approved: bool) -> int:
    from actors.client import ExecutionNotKnownYet
    from actors.client.signals import MAX_COMMENT, Signals, clean_text

    eid = checked_execution_id(args.execution_id)
    assert eid is not None
    if not approved and not clean_text(args.comment or "", limit=MAX_COMMENT, what="--comment"):
        raise UsageError("reject: --comment must say why (it is blank)")  # told before NATS is reached
    if args.key is not None:
        Signals.check_signal("approval", args.key)  # a bad key is told before NATS is reached
    async with connection(args) as client:
        try:
            reply = await client.approve(
                eid, args.step, approved=approved, comment=args.comment or "", by=_by(), key=args.key
            )
        except ExecutionNotKnownYet as e:
            print_error(f"actors-cli: {e}")
            return EXIT_TIMEOUT
    return _answer(reply, args.json, "approval" if approved else "rejection", approval=True)


async def cmd_approve(args: argparse.Namespace) -> int:
    return await _approval(args, True)


async def cmd_reject(args: argparse.Namespace) -> int:
    return await _approval(args, False)
