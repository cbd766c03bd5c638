"""`actors-cli hook add|list|rotate|delete`: webhooks, `POST /hooks/<name>` on the UI
server, that start a playbook or send a signal (actors/client/hooks.py). `add` and
`rotate` print the hook's token, the one time it is ever shown (KV `hooks` keeps only its
digest). A request that cannot be done as asked (bad name, unknown playbook, no such
hook, one already there) is one line, exit 3."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from actors.cli.connection import connection
from actors.cli.exits import EXIT_INVALID, EXIT_OK
from actors.cli.output import print_error, print_json, when

if TYPE_CHECKING:
    from actors.client import Client
    from actors.wire.hooks import HookSpec


def add_hook_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: list[argparse.ArgumentParser]
) -> None:
    """The `hook` command and its verbs; `common` are the --nats and --timeout options."""
    sp = sub.add_parser(
        "hook",
        help="webhooks: POST /hooks/NAME on the UI server starts a playbook or sends a signal",
        description="Webhooks on the UI server (`actors-cli ui`, `serve --role ui`): `POST /hooks/NAME` starts the "
        "hook's playbook with the JSON body as payload; a signal hook's `POST /hooks/NAME/EXECUTION_ID` sends its "
        "signal with the body as data. Each hook has its own token (`Authorization: Bearer TOKEN`), printed once by "
        "`add` and `rotate`. `actors-cli hook VERB --help` for each verb's options.",
    )
    hs = sp.add_subparsers(dest="hook_command", required=True, metavar="VERB", help="one of:")
    p = hs.add_parser("add", parents=common, help="create a hook; prints its token, once")
    p.add_argument("name", help="hook name: letters, digits, _ and - (up to 64); its URL is /hooks/NAME")
    p.add_argument(
        "--playbook",
        metavar="PATH",
        required=True,
        help="start this registered playbook, the body as payload; with --signal: the playbook whose executions "
        "it signals (only those)",
    )
    p.add_argument(
        "--signal",
        metavar="NAME",
        help="send this signal to /hooks/NAME/EXECUTION_ID (an execution of --playbook), the body as data",
    )
    p.add_argument("--version", type=int, metavar="N", help="a start hook's version (default: the latest)")
    p.add_argument("--json", action="store_true", help='{"name", "action", "token", "url_path"}')
    p = hs.add_parser("list", parents=common, help="every hook and what it does (never a token)")
    p.add_argument("--json", action="store_true", help="one JSON object per hook")
    p = hs.add_parser("rotate", parents=common, help="a new token for a hook (the old one stops working); prints it")
    p.add_argument("name", help="the hook's name")
    p.add_argument("--json", action="store_true", help='{"name", "action", "token", "url_path"}')
    hs.add_parser("delete", parents=common, help="remove a hook (executions it started are kept)").add_argument(
        "name", help="the hook's name"
    )


async def cmd_hook(args: argparse.Namespace) -> int:
    from actors.client import HookError
    from actors.store.catalog import CatalogError

    try:
        async with connection(args) as client:
            return await _do(client, args)
    except (HookError, CatalogError) as e:
        print_error(f"actors-cli: {e}")
        return EXIT_INVALID


async def _do(client: Client, args: argparse.Namespace) -> int:
    verb = args.hook_command
    if verb == "add":
        spec, token = await client.hook_add(args.name, playbook=args.playbook, version=args.version, signal=args.signal)
        _print_token(spec, token, as_json=args.json, what="created")
    elif verb == "rotate":
        spec, token = await client.hook_rotate(args.name)
        _print_token(spec, token, as_json=args.json, what="has a new token (the old one is refused from now on)")
    elif verb == "list":
        _print_list(await client.hooks(), await client.unreadable_hooks(), as_json=args.json)
    else:
        await client.hook_delete(args.name)
        print(f"hook {args.name} deleted")
    return EXIT_OK


def _url_path(spec: HookSpec) -> str:
    return f"/hooks/{spec.name}" + ("/EXECUTION_ID" if spec.signal is not None else "")


def _print_token(spec: HookSpec, token: str, *, as_json: bool, what: str) -> None:
    if as_json:
        print_json({"name": spec.name, "action": spec.action, "token": token, "url_path": _url_path(spec)})
        return
    print(f"hook {spec.name} {what}: {spec.action}")
    print(f"token (shown this once; keep it secret): {token}")
    print(
        f'call it: curl -X POST "$UI{_url_path(spec)}" -H "Authorization: Bearer $TOKEN" '
        "-H 'Content-Type: application/json' -d '{}'"
    )


def _print_list(specs: list[HookSpec], unreadable: dict[str, str], *, as_json: bool) -> None:
    if as_json:
        for name, why in unreadable.items():
            print_json({"name": name, "unreadable": why})
        for s in specs:
            print_json(
                {
                    "name": s.name,
                    "action": s.action,
                    "playbook": s.start.playbook if s.start is not None else None,
                    "version": s.start.version if s.start is not None else None,
                    "signal": s.signal.name if s.signal is not None else None,
                    "signal_playbook": s.signal.playbook if s.signal is not None else None,
                    "url_path": _url_path(s),
                    "created_at": s.created_at,
                    "rotated_at": s.rotated_at,
                }
            )
        return
    if not specs and not unreadable:
        print("no hooks")
        return
    rows = [("NAME", "ACTION", "PATH", "CREATED", "TOKEN ROTATED")]
    for s in specs:
        rows.append((s.name, s.action, _url_path(s), when(s.created_at), when(s.rotated_at)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for name, why in unreadable.items():
        print(f"{name}: its entry cannot be read ({why}); `actors-cli hook delete {name}` removes it")
