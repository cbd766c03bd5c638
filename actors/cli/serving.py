"""The commands that run until stopped: `dev` (an embedded NATS and every actor) and
`serve` (one role, a pod), and the signals that stop them."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from actors.cli.exits import EXIT_FAILED, EXIT_OK, UsageError
from actors.cli.inputs import settings_of


async def cmd_dev(args: argparse.Namespace) -> int:
    from actors.runtime import connect, start_roles, tune_gc
    from streams.server import NatsServer

    settings = settings_of(args)
    server = await NatsServer.start(port=args.port, store_dir=args.store, sync=settings.nats_sync)
    nc = await connect(server.url, name="actors-dev")
    rt = await start_roles(nc, settings=settings)
    tune_gc()
    print(f"NATS at {server.url} (store {server.store}); all actors running. Ctrl-C to stop.", flush=True)
    print(f"  export NATS_URL={server.url}", flush=True)
    try:
        await _until_signal()
    finally:
        await rt.stop()
        await nc.close()
        await server.stop()
    return EXIT_OK


async def cmd_serve(args: argparse.Namespace) -> int:
    from actors.metrics import log_lifecycle_as_json
    from actors.runtime import ROLES, serve

    # first of all: a SIGTERM that comes while the pod is still starting must not be
    # lost (as PID 1 in a container, an unhandled SIGTERM is ignored, not fatal)
    stop = _stop_on_signal()
    settings = settings_of(args)
    if settings.nats_url is None:
        raise UsageError("serve needs --nats URL or NATS_URL")
    if settings.http_port < 0 or settings.drain_timeout < 0:
        raise UsageError("--http-port and --drain-timeout must not be negative")
    roles = ROLES if args.role == "all" else (args.role,)
    log_lifecycle_as_json(sys.stderr)
    clean = await serve(settings, stop=stop, roles=roles)
    return EXIT_OK if clean else EXIT_FAILED


def _stop_on_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, handlers installed now."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _until_signal() -> None:
    await _stop_on_signal().wait()
