"""`Client.connect(url)`: a client on a connection of its own, reached within the
client's timeout, used either way a user expects:

    async with Client.connect("nats://user:password@host:4222") as client: ...
    client = await Client.connect(url); ...; await client.close()

The connection is made as the CLI makes it (`dial.connect_within`: every node of a
comma-separated cluster URL, credentials and TLS from `ConnectOptions` (default: the
environment's) or the URL, NatsUnavailable past the timeout or at once on refused
credentials or a failed TLS handshake), and the streams are declared if they are missing
(idempotent, as every command does), so a client may come up before any pod."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any, Generic, TypeVar

from nats.aio.client import Client as NATS

from actors.config.settings import Settings
from actors.natsio import close_connection, ride_out
from actors.natsio.connopts import ConnectOptions
from actors.natsio.denials import DenialWatch
from actors.natsio.dial import CLIENT_TIMEOUT, NatsUnavailable, connect_within, redact
from streams.layout import Layout, StreamsMissing, ensure

C = TypeVar("C")


async def look_up_streams(nc: NATS, layout: Layout, url: str, *, budget: float, timeout: float) -> None:
    """The streams looked up, not updated (the engine declares them: actors/pod/permissions.py),
    created only where missing and this user may; asked again through an election, for
    `budget` seconds. NatsUnavailable past it (naming the command's `timeout`), or when
    a stream is missing that this user may not create; Denied when two look-ups in a
    row timed out while the server refused this user the same thing (replies on an
    inbox prefix it may not subscribe to: actors/natsio/denials.py)."""
    try:
        async with asyncio.timeout(budget):
            looking_up = functools.partial(ensure, nc.jetstream(), layout, update=False)
            watch = DenialWatch(nc, "looking up the streams")
            await ride_out(lambda: watch.attempt(looking_up), budget=budget)
    except TimeoutError:
        raise NatsUnavailable(f"NATS at {redact(url)} did not answer within {timeout:g}s") from None
    except StreamsMissing as e:
        raise NatsUnavailable(f"NATS at {redact(url)}: {e}") from None


async def open_client(
    make: Callable[[NATS, Layout, float], C],
    url: str,
    *,
    timeout: float,
    layout: Layout | None,
    name: str,
    options: ConnectOptions | None = None,
) -> C:
    """Connect to `url` within `timeout`, declare the streams, and build the client on it."""
    if not url:
        raise NatsUnavailable("no NATS URL given (for example nats://127.0.0.1:4222)")
    if layout is None:
        layout = Settings.from_env().layout  # the deployment's partitions etc., as the CLI reads them
    loop = asyncio.get_running_loop()
    started = loop.time()
    nc = await connect_within(url, timeout=timeout, name=name, options=options)
    try:
        await look_up_streams(nc, layout, url, budget=max(0.1, timeout - (loop.time() - started)), timeout=timeout)
    except BaseException:
        await close_connection(nc)
        raise
    return make(nc, layout, timeout)


class Connecting(Generic[C]):
    """What `Client.connect` returns: await it for the client, or use it as an async
    context manager that closes the client's connection on exit."""

    def __init__(self, opening: Callable[[], Any]) -> None:
        self._opening = opening
        self._client: Any = None

    def __await__(self) -> Generator[Any, None, C]:
        client: C = yield from self._opening().__await__()
        return client

    async def __aenter__(self) -> C:
        self._client = await self._opening()
        client: C = self._client
        return client

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.close()


__all__ = ["CLIENT_TIMEOUT", "Connecting", "open_client"]
