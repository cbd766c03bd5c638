"""`actors-cli trigger add|list|pause|resume|delete`: a playbook started for every
message on a NATS subject (actors/client/triggers.py, docs/triggers.md). A request that
cannot be done as asked (bad name, subject, stream or template, unknown playbook, no
such trigger) is one line, exit 3."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK, UsageError
from actors.cli.output import print_error, print_json, when

if TYPE_CHECKING:
    from actors.client import Client, TriggerView


def add_trigger_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: list[argparse.ArgumentParser]
) -> None:
    """The `trigger` command and its subcommands; `common` are the --nats and --timeout
    options every one takes."""
    sp = sub.add_parser(
        "trigger",
        help="start a playbook for every message on a NATS subject",
        description="Triggers: every message on a subject starts an execution of a playbook (its id derived "
        "from the message: trg-NAME-SEQ on a stream). `actors-cli trigger VERB --help` for each verb's options.",
    )
    ss = sp.add_subparsers(dest="trigger_command", required=True, metavar="VERB", help="one of:")
    p = ss.add_parser("add", parents=common, help="create a trigger")
    p.add_argument("name", help="trigger name: letters, digits, _ and - (up to 64)")
    p.add_argument("--subject", required=True, metavar="S", help="the subject (wildcards only with --stream)")
    p.add_argument(
        "--stream",
        metavar="STREAM",
        help="the JetStream stream holding the subject: read durably, none missed while trigger pods are down "
        "(without it: a core subject, at most once)",
    )
    p.add_argument("--playbook", required=True, metavar="PATH", help="catalog path of a registered playbook")
    p.add_argument("--version", type=int, metavar="N", help="playbook version (default: the latest at each start)")
    p.add_argument(
        "--payload",
        metavar="TEMPLATE",
        help="the payload: a JSON object whose strings may be templates over `message` (subject, data, headers, "
        "seq, time), or one template, or @file (default: the message's JSON body)",
    )
    p = ss.add_parser("list", parents=common, help="every trigger, its state and its counts")
    p.add_argument("--json", action="store_true", help="one JSON object per trigger")
    for verb, what in (
        ("pause", "start nothing until resumed (a stream's messages wait)"),
        ("resume", "start again (a stream trigger: from the first message that waited)"),
        ("delete", "remove a trigger and its consumer (executions it started are kept)"),
    ):
        ss.add_parser(verb, parents=common, help=what).add_argument("name", help="the trigger's name")


def template_of(raw: str | None) -> Any:
    """--payload: JSON (an object, or a string holding a template), @file, or a bare
    template (`{{ message.data }}`, not JSON itself)."""
    if raw is None:
        return None
    import msgspec

    from actors.cli.inputs import _payload_file
    from actors.playbook.templates import is_template
    from actors.wire.jsonvalues import loads
    from actors.wire.nesting import json_within, too_deep

    text = _payload_file(raw[1:]) if raw.startswith("@") else raw.encode()
    if not json_within(text):
        raise UsageError(f"--payload: {too_deep('it')}")
    try:
        return loads(text)
    except msgspec.DecodeError as e:
        bare = text.decode("utf-8", errors="replace").strip()
        if is_template(bare):
            return bare
        raise UsageError(f"--payload: not JSON nor a template ({e})") from None


async def cmd_trigger(args: argparse.Namespace) -> int:
    from actors.client import TriggerError
    from actors.store.catalog import CatalogError

    try:
        template = template_of(args.payload) if args.trigger_command == "add" else None
        async with connection(args) as client:
            return await _do(client, args, template)
    except (TriggerError, CatalogError) as e:
        print_error(f"actors-cli: {e}")
        return EXIT_INVALID


async def _do(client: Client, args: argparse.Namespace, template: Any) -> int:
    verb = args.trigger_command
    if verb == "add":
        spec = await client.trigger_add(
            args.name,
            subject=args.subject,
            stream=args.stream,
            playbook=args.playbook,
            version=args.version,
            payload=template,
        )
        where = f"stream {spec.stream}" if spec.stream else "core NATS, at most once"
        print(f"trigger {spec.name}: {spec.playbook} for each message on {spec.subject} ({where})")
    elif verb == "list":
        _print_list(await client.triggers(), as_json=args.json)
    elif verb == "pause":
        done = await client.trigger_pause(args.name)
        print(f"trigger {args.name} {'paused' if done else 'was already paused'}")
    elif verb == "resume":
        done = await client.trigger_resume(args.name)
        print(f"trigger {args.name} {'resumed' if done else 'was not paused'}")
    elif await client.trigger_delete(args.name):
        print(f"trigger {args.name} deleted")
    else:
        print(f"trigger {args.name} deleting: a trigger pod removes its consumer, then the trigger (none has yet)")
    return EXIT_OK


def _print_list(views: list[TriggerView], *, as_json: bool) -> None:
    if as_json:
        for v in views:
            s, st = v.spec, v.stats
            if v.unreadable is not None:
                print_json({"name": s.name, "unreadable": v.unreadable})
                continue
            print_json(
                {
                    "name": s.name,
                    "subject": s.subject,
                    "stream": s.stream,
                    "playbook": s.playbook,
                    "version": s.version,
                    "payload": s.payload,
                    "paused": s.paused,
                    "deleting": s.deleting,
                    "created_at": s.created_at,
                    "started": st.started,
                    "errors": st.errors,
                    "last_start": st.last_start,
                    "last_execution_id": st.last_execution_id,
                    "last_error": st.last_error,
                    "waiting": v.waiting,
                    "problem": v.problem,
                }
            )
        return
    if not views:
        print("no triggers")
        return
    rows = [("NAME", "SUBJECT", "STREAM", "PLAYBOOK", "STATE", "STARTED", "ERRORS", "WAITING", "LAST START")]
    for v in views:
        s, st = v.spec, v.stats
        if v.unreadable is not None:
            rows.append((s.name, "?", "?", "?", "unreadable", "-", "-", "-", "-"))
            continue
        rows.append(
            (
                s.name,
                s.subject,
                s.stream or "(core)",
                s.playbook + (f"@{s.version}" if s.version is not None else ""),
                "deleting" if s.deleting else "paused" if s.paused else "active",
                str(st.started),
                str(st.errors),
                v.problem or ("-" if v.waiting is None else str(v.waiting)),
                when(st.last_start) + (f" {st.last_execution_id}" if st.last_execution_id else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for v in views:
        if v.unreadable is not None:
            print(f"{v.spec.name}: its spec cannot be read ({v.unreadable}); `actors-cli trigger delete` removes it")
    errors = [v for v in views if v.stats.last_error]
    for v in errors:
        print(f"{v.spec.name}: last error {when(v.stats.last_error_at)}: {v.stats.last_error}")
