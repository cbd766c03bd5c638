"""The connection a client command works through: a `Client` on the NATS of --nats or
NATS_URL, reached within --timeout; or, for `run` without a URL, a private server with
every actor in this process."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from actors.cli.exits import UsageError
from actors.cli.inputs import settings_of, timeout_of


@contextlib.asynccontextmanager
async def connection(args: argparse.Namespace, *, embedded: bool = False) -> AsyncIterator[Any]:
    """Yield (client, layout). With no URL and embedded=True: a private server and all
    actors in-process, stopped on exit."""
    from actors.cli.output import print_error
    from actors.client import Client
    from actors.client.connecting import look_up_streams
    from actors.natsio import close_connection
    from actors.natsio.connopts import ConnectOptions
    from actors.natsio.dial import OutageNotices, connect_within
    from actors.pod.roles import connect, start_roles, tune_gc
    from actors.runtime.children import child_environment
    from actors.store.archive import archive_reader
    from streams.server import NatsServer

    settings = settings_of(args)
    layout = settings.layout
    url = settings.nats_url
    server = None
    runtime = None
    if url is None:
        if not embedded:
            raise UsageError("no NATS server: pass --nats URL or set NATS_URL (or use `actors-cli dev`)")
        # from a clean environment: this process's holds the pod's secrets (actors/runtime/children.py)
        server = await NatsServer.start(sync=settings.nats_sync, env=child_environment())
        url = server.url
    budget = timeout_of(args)
    started = time.monotonic()
    # a server of our own is local and up; anyone else's is given the command's --timeout
    # (the credentials and TLS of the settings are for someone else's server, not ours)
    notices = OutageNotices(url, lambda line: print_error(f"actors-cli: {line}"))
    nc = (
        await connect(url, name="actors-cli", options=ConnectOptions())
        if server is not None
        else await connect_within(url, timeout=budget, options=ConnectOptions.from_settings(settings), notices=notices)
    )
    try:
        if server is not None:
            runtime = await start_roles(nc, settings=settings, step_user_fallback=True)
            tune_gc()
        else:
            # idempotent: works before any pod has started
            left = max(0.1, budget - (time.monotonic() - started))
            await look_up_streams(nc, layout, url, budget=left, timeout=budget)
        yield Client(
            nc,
            layout=layout,
            timeout=budget,
            codec=settings.payload_codec,
            limits=settings.limits,
            archive=archive_reader(nc, settings.archive),
        )
    finally:
        if runtime is not None:
            # our server dies with us, and with it whatever still runs: draining tool commands
            # (5 s by default) would only delay the exit after a timeout or a Ctrl-C
            await runtime.stop(drain_timeout=0)
        await close_connection(nc)
        if server is not None:
            await server.stop()
