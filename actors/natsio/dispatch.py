"""Core subscriptions whose messages are handed to a plain function in the client's
read loop, as they are parsed.

nats-py gives each subscription with a callback an asyncio.Queue and a task: every
message is queued, the task wakes, takes it and awaits the callback. For a message
whose handling is only bookkeeping (a PubAck resolving a future, an input put into an
actor's mailbox, a command handed to a task) that queue hop and task switch cost more
than the handling, on every message of the hot path. `subscribe_direct` calls the
handler at once instead: on a connection with the actors' reader (actors/natsio/reader.py)
with a `Msg` the reader builds as it reads; otherwise, and for status messages, from
nats-py's `_process_msg` through a stand-in for the subscription's queue. The handler
must not block: it runs inside the read loop, so it is a plain function, and anything it
raises is logged and dropped (raised, it would make the client drop the connection).
With the fast path off (`ACTORS_NATS_FASTPATH=0`) it is an ordinary callback
subscription, its task calling the handler (`private.subscribe_handler`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from actors.natsio.headers import has_status, plain_headers
from actors.natsio.private import reader_of, register_raw, subscribe_handler, subscription_id

log = logging.getLogger("actors")

Handler = Callable[[Msg], None]


async def subscribe_direct(nc: NATS, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
    """Subscribe to `subject` (in queue group `queue`) with `handler` called for each
    message as it arrives, in order. Unsubscribe as usual."""

    def guarded(msg: Msg) -> None:
        try:
            handler(msg)
        except Exception:
            log.exception("handling a message on %s", msg.subject)

    sub = await subscribe_handler(nc, subject, guarded, queue=queue)  # what comes through `_process_msg`
    reader = reader_of(nc)
    if reader is not None:  # the others: built into a Msg by the reader (actors/natsio/reader.py)
        make, sid = nc.msg_class, subscription_id(sub)

        def direct(subject: bytes, reply: bytes, data: bytes, block: bytes | None) -> bool:
            if block is not None and has_status(block):
                return True  # a heartbeat, "no messages": nats-py reads it
            headers = None if block is None else plain_headers(block)
            handler(make(nc, subject.decode(), reply.decode(), data, headers, _sid=sid))
            return False

        register_raw(reader, sid, direct)
    return sub
