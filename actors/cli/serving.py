"""The commands that run until stopped: `dev` (an embedded NATS and every actor) and
`serve` (one role, a pod); the signals that stop them: actors/cli/interrupt.py."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from actors.cli.exits import EXIT_FAILED, EXIT_OK, UsageError
from actors.cli.inputs import settings_of
from actors.cli.interrupt import stop_on_signal
from actors.config.settings import Settings


async def cmd_dev(args: argparse.Namespace) -> int:
    from actors.natsio import close_connection
    from actors.natsio.connopts import ConnectOptions
    from actors.natsio.dial import CLIENT_TIMEOUT, connect_within
    from actors.pod.roles import start_roles, tune_gc
    from actors.runtime.children import child_environment
    from streams.server import NatsServer

    # first of all, as `serve` does: a Ctrl-C during start-up stops dev once it has
    # started (and cleanly), where a cancel of start-up could be lost (actors/cli/interrupt.py)
    stop = stop_on_signal()
    settings = settings_of(args).with_flags(ui_port=getattr(args, "ui_port", None))
    config = _server_config(args.server_config) if args.server_config else None
    # a server of our own asks for nothing unless its configuration says so
    options = ConnectOptions.from_settings(settings) if config is not None else ConnectOptions()
    # from a clean environment: this process's holds the pod's secrets (actors/runtime/children.py)
    server = await NatsServer.start(
        port=args.port, store_dir=args.store, config=config, sync=settings.nats_sync, env=child_environment()
    )
    try:
        # within a bound: a configuration that refuses our own credentials must say so, not hang
        nc = await connect_within(server.url, timeout=CLIENT_TIMEOUT, name="actors-dev", options=options)
    except BaseException:
        await server.stop()
        raise
    from actors.pod.roles import ROLES
    from actors.runtime import logtrace, tracing

    # as `serve`: the OTEL_* variables turn traces on (docs/tracing.md), ids on log lines
    traced = tracing.configure(ROLES)
    logtrace.install()
    rt = await start_roles(nc, settings=settings, step_user_fallback=True)
    tune_gc()
    print(f"NATS at {server.url} (store {server.store}); all actors running. Ctrl-C to stop.", flush=True)
    print(f"  export NATS_URL={server.url}", flush=True)
    ui = await _dev_ui(nc, settings)
    try:
        await stop.wait()
    finally:
        if ui is not None:
            await ui.cleanup()
        await rt.stop()
        await close_connection(nc)
        await server.stop()
        if traced:
            await asyncio.to_thread(tracing.shutdown)  # bounded: tracing.SHUTDOWN_WAIT
    return EXIT_OK


# a nats-server configuration is a few KB; this only bounds what a wrong path can make us read
_SERVER_CONFIG_MAX = 1024 * 1024


def _server_config(path: str) -> str:
    """The text of `dev --server-config`: a regular file (not a FIFO or a device), UTF-8."""
    from actors.playbook.userfiles import UnreadableFile, read_regular_file

    try:
        data = read_regular_file(
            path, limit=_SERVER_CONFIG_MAX, what="it", over=f"the {_SERVER_CONFIG_MAX:,} bytes read of a configuration"
        )
        return data.decode()
    except UnreadableFile as e:
        raise UsageError(f"--server-config {e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"--server-config {path}: not UTF-8 text ({e})") from None


async def cmd_serve(args: argparse.Namespace) -> int:
    from actors.pod.roles import ROLES, serve
    from actors.runtime.metrics import log_lifecycle_as_json

    # first of all: a SIGTERM that comes while the pod is still starting must not be
    # lost (as PID 1 in a container, an unhandled SIGTERM is ignored, not fatal)
    stop = stop_on_signal()
    from actors.pod import taskdump

    taskdump.install()  # `kill -USR1 <pid>`: what every task waits on, to stderr
    settings = settings_of(args)
    if settings.nats_url is None:
        raise UsageError("serve needs --nats URL or NATS_URL")
    if settings.http_port < 0 or settings.drain_timeout < 0:
        raise UsageError("--http-port and --drain-timeout must not be negative")
    roles = ROLES if args.role == "all" else () if args.role == "ui" else (args.role,)
    log_lifecycle_as_json(sys.stderr)
    from actors.runtime import logtrace

    logtrace.install()  # with OTEL_* set: trace and span ids on log lines, exemplars
    extra = _ui_pod(settings) if args.role == "ui" else None
    clean = await serve(settings, stop=stop, roles=roles, extra=extra)
    return EXIT_OK if clean else EXIT_FAILED


async def _dev_ui(nc: Any, settings: Settings) -> Any:
    """`dev`'s web UI, unless --ui-port 0; a port in use is said and skipped (NATS and
    the actors are what `dev` is for)."""
    from actors.cli.ui import start_ui
    from actors.client import Client

    if not settings.ui_port:
        return None
    try:
        runner, url = await start_ui(Client(nc, layout=settings.layout, codec=settings.payload_codec), settings)
    except UsageError as e:
        print(f"actors-cli: dev: {e}; running without it", file=sys.stderr, flush=True)
        return None
    print(f"Web UI at {url}", flush=True)
    return runner


def _ui_pod(settings: Settings) -> Any:
    """What `serve --role ui` runs beside its health server: the web UI."""
    from actors.cli.ui import start_ui
    from actors.client import Client

    async def start(nc: Any) -> Any:
        runner, url = await start_ui(Client(nc, layout=settings.layout, codec=settings.payload_codec), settings)
        print(f"Web UI at {url}", file=sys.stderr, flush=True)
        return runner.cleanup

    return start
