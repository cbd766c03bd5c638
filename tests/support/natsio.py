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


async def execution_log(nc: Any, layout: Any, execution_id: str) -> list[tuple[str, bytes, int, float]]:
    """An execution's log as stored in EXEC: (subject, data, stream seq, log time) in
    stream order, read with an ordered consumer."""
    from actors.natsio import log_time, stream_seq
    from streams.layout import EXEC_STREAM

    sub = await nc.jetstream().subscribe(layout.execution(execution_id).log, stream=EXEC_STREAM, ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            out.append((msg.subject, msg.data, stream_seq(msg), log_time(msg)))
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()
