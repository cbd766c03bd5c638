"""Messages as a plain nats-py subscriber receives them, for comparing what the actors'
own NATS code puts on the wire with what nats-py would."""

from __future__ import annotations

import asyncio
from typing import Any


async def received(nc: Any, n: int, subject: str = "t.>") -> tuple[asyncio.Event, list[Any]]:
    """(an event set once `n` messages on `subject` came, the messages so far)."""
    got: list[Any] = []
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        got.append(msg)
        if len(got) == n:
            done.set()

    await nc.subscribe(subject, cb=cb)
    return done, got
