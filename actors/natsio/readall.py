"""Every message a stream holds on a subject (a filter), in order: what `events`,
`iterations` and the retention actor's archive read."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

NEXT_TIMEOUT = 10.0  # seconds one message may take; TimeoutError past it (transient: read again)


async def count(nc: NATS, stream: str, subject: str) -> int:
    """Messages stored under `subject` now (the stream leader's count)."""
    try:
        info = await nc.jsm().stream_info(stream, subjects_filter=subject)
    except NotFoundError:
        return 0
    return sum((info.state.subjects or {}).values())


async def read_all(nc: NATS, stream: str, subject: str) -> list[Msg]:
    """The messages of `stream` on `subject` as they are now, oldest first (an ordered
    consumer: no state left on the server). Raises TimeoutError when one does not come
    within NEXT_TIMEOUT, a transient failure the caller rides out."""
    total = await count(nc, stream, subject)
    if not total:
        return []
    out: list[Msg] = []
    sub = await nc.jetstream().subscribe(subject, stream=stream, ordered_consumer=True, pending_msgs_limit=-1)
    try:
        while True:
            msg = await sub.next_msg(timeout=NEXT_TIMEOUT)
            out.append(msg)
            # `total` is the stream leader's count; the consumer may sit on a replica
            # still catching up, which says "nothing pending" before it has them all
            if msg.metadata.num_pending == 0:
                if len(out) < total:
                    # or messages went (expired, deleted) since the count: count again
                    # rather than wait out the timeout for one that will never come
                    total = await count(nc, stream, subject)
                if len(out) >= total:
                    return out
    finally:
        await sub.unsubscribe()
