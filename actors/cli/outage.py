"""A command that waits with no --timeout (`run`, `status --watch`) waits for the end for
ever, but not for NATS: once NATS has been unreachable for the connection's own timeout
(`Client.timeout`: 30 s by default) it gives up (exit 5, the outcome unknown here), as
every command does within its timeout when NATS is away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from actors.errors import Unavailable

T = TypeVar("T")

OUTAGE_CHECK = 0.25  # seconds between two looks at the connection while NATS is away


def limit_of(client: Any) -> float:
    return float(getattr(client, "timeout", 0) or 0)


async def nats_outage(client: Any) -> None:
    """Returns once NATS has been unreachable for `client.timeout` seconds on end (never
    for a client without one)."""
    limit = limit_of(client)
    if limit <= 0:
        await asyncio.Event().wait()
    loop = asyncio.get_running_loop()
    down: float | None = None
    while True:
        await asyncio.sleep(OUTAGE_CHECK)  # nats-py has no awaitable for "still down"
        if client.nc.is_connected:
            down = None
        elif down is None:
            down = loop.time()
        elif loop.time() - down >= limit:
            return


async def unless_nats_gone(waiting: Awaitable[T], client: Any, execution_id: str, doing: str) -> T:
    """`waiting`'s result, or Unavailable (`execution ID: NATS unreachable for 30s while
    DOING: ...`) once NATS has stayed away for the client's timeout."""
    task = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(nats_outage(client))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise Unavailable(
                f"execution {execution_id}: NATS unreachable for {limit_of(client):g}s {doing}: "
                "its outcome is unknown here"
            )
        return task.result()
    finally:
        for t in (task, gone):
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
