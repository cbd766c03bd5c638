"""`actors-cli ui`: the web UI on the NATS of --nats or NATS_URL, until Ctrl-C; and the
UI that `dev` starts beside its actors."""

from __future__ import annotations

import argparse
from typing import Any

from actors.cli.exits import EXIT_OK, UsageError
from actors.cli.inputs import settings_of
from actors.cli.interrupt import stop_on_signal
from actors.config.settings import Settings


def add_ui_parser(sub: Any) -> argparse.ArgumentParser:
    sp: argparse.ArgumentParser = sub.add_parser("ui", help="the web UI: executions live, graphs, logs, actions")
    sp.add_argument("--port", type=int, help="port to serve on (default $ACTORS_UI_PORT, else 8233)")
    sp.add_argument("--host", help="address to bind (default $ACTORS_UI_HOST, else 127.0.0.1: this machine only)")
    sp.add_argument("--read-only", action="store_true", default=None, help="refuse start, cancel and retry")
    # a file, not the token itself: a command line is visible to every user of the machine (`ps`)
    sp.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding a secret every action must carry (default $ACTORS_UI_TOKEN_FILE, else $ACTORS_UI_TOKEN; "
        "unset: none)",
    )
    # taken only to refuse it in one line (otherwise argparse reads `--token T` as `--token-file T`)
    sp.add_argument("--token", help=argparse.SUPPRESS)
    sp.add_argument(
        "--allow-host",
        metavar="NAME",
        action="append",
        help="a host name requests may carry in Host besides localhost (a proxy in front); repeatable "
        "(default $ACTORS_UI_ALLOWED_HOSTS, comma-separated)",
    )
    return sp


def ui_settings(args: argparse.Namespace) -> Settings:
    if getattr(args, "token", None) is not None:
        raise UsageError("--token is refused: a command line shows in `ps`; use --token-file FILE or ACTORS_UI_TOKEN")
    return settings_of(args).with_flags(
        ui_port=getattr(args, "port", None),
        ui_host=getattr(args, "host", None),
        ui_read_only=getattr(args, "read_only", None),
        ui_token_file=getattr(args, "token_file", None),
        ui_allowed_hosts=",".join(args.allow_host) if getattr(args, "allow_host", None) else None,
    )


def ui_token(settings: Settings) -> str | None:
    """The UI's token: the file's content (ACTORS_UI_TOKEN_FILE, --token-file) or
    ACTORS_UI_TOKEN. SettingsInvalid (one line naming the file) when it cannot be read."""
    if settings.ui_token_file:
        from actors.natsio.connopts import _secret_file

        return _secret_file(settings.ui_token_file, "ACTORS_UI_TOKEN_FILE")
    return settings.ui_token


async def start_ui(client: Any, settings: Settings) -> tuple[Any, str]:
    """Serve the UI on `client`; (runner, address). UsageError when the port is taken."""
    from actors.ui.server import serve_ui

    try:
        return await serve_ui(
            client,
            host=settings.ui_host,
            port=settings.ui_port,
            read_only=settings.ui_read_only,
            token=ui_token(settings),
            user_header=settings.ui_user_header,
            extra_hosts=(settings.ui_allowed_hosts or "").split(","),
            max_streams=settings.ui_max_streams,
        )
    except OSError as e:
        where = f"{settings.ui_host}:{settings.ui_port}"
        raise UsageError(f"cannot serve the web UI on {where}: {e.strerror or e}") from None


async def cmd_ui(args: argparse.Namespace) -> int:
    from actors.cli.connection import connection

    settings = ui_settings(args)
    if settings.ui_port < 0 or settings.ui_port > 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {settings.ui_port}")
    stop = stop_on_signal()
    async with connection(args) as client:
        runner, url = await start_ui(client, settings)
        mode = " (read-only)" if settings.ui_read_only else ""
        print(f"Web UI at {url}{mode}. Ctrl-C to stop.", flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
    return EXIT_OK
