"""What a passing NATS failure is (an election, a reconnect), how long to keep trying
through one, and `ride_out`, which does that for an idempotent request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

log = logging.getLogger("actors")
T = TypeVar("T")

# A publish the cluster could not take is sent again (same Nats-Msg-Id) after a pause
# doubling from RETRY_FIRST to RETRY_MAX, for at most RETRY_BUDGET seconds: a stream
# leader election takes 4-9 s, a reconnect about a second. The budget stays well under
# the streams' duplicate window (120 s), which is what makes a re-send after a lost
# PubAck harmless. Past the budget the caller fails and retries by replay.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0
RETRY_BUDGET = 30.0
# What a re-send can cure: 503 no responders (the stream has no leader: an election),
# JetStream's own 503, no PubAck in time (lost to a reconnect or a dying leader), the
# client's buffer full while it reconnects. Anything else (a bad request, a closed
# connection) is raised at once.
TRANSIENT: tuple[type[BaseException], ...] = (
    NoStreamResponseError,
    ServiceUnavailableError,
    TimeoutError,
    OutboundBufferLimitError,
)
# What an idempotent request (a read, a KV get, a stream lookup) may also meet in an
# election or a reconnect: nobody answering its subject yet, or the client between
# two connections. Asked again, it can only get the same answer or a newer one.
TRANSIENT_REQUEST: tuple[type[BaseException], ...] = (
    *TRANSIENT,
    NoRespondersError,
    ConnectionReconnectingError,
    StaleConnectionError,
)


async def ride_out(call: Callable[[], Awaitable[T]], *, budget: float) -> T:
    """`await call()`, called again after a pause doubling from RETRY_FIRST to RETRY_MAX
    while it fails transiently (`TRANSIENT_REQUEST`: an election, a reconnect), for at
    most `budget` seconds; then its last error is raised. Only for idempotent calls
    (reads, or writes that recognise themselves, such as a catalog registration):
    publishes go through `Publisher.send`, which keeps their Nats-Msg-Id. A try is
    never cut short: a write of several requests (an archive: chunks, then the object's
    metadata) cancelled half-way could leave what a later call trips on."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + budget, RETRY_FIRST
    while True:
        try:
            return await call()
        except TRANSIENT_REQUEST as e:
            left = deadline - loop.time()
            if left <= 0:
                raise
            log.info("NATS request failed (%r); asking again in %.1fs", e, min(pause, left))
        await asyncio.sleep(min(pause, left))  # the last try comes at the deadline
        pause = min(pause * 2, RETRY_MAX)
