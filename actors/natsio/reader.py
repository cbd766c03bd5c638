"""A faster reader of the server's protocol for a nats-py connection, and messages
handed to a function as raw bytes.

nats-py's `Parser` matches every control line against regular expressions, tried in
turn (a message with headers fails the MSG one first), and deletes each message from
the front of its buffer (a copy of the rest). A pod reads some 30 messages per small
execution (deliveries, PubAcks), and that parser was its largest single cost after the
event loop. `Reader` does what `Parser.parse` does, in one pass over each chunk read:
it finds each line's end, splits MSG and HMSG lines on spaces, slices payloads out of
the chunk, and keeps only a message split across reads. Every other operation (+OK,
-ERR, PING, PONG, INFO) goes through nats-py's own expressions and handlers, as before.

A message goes to `Client._process_msg` as before, unless its subscription registered a
handler here (`register_raw`): one made by `subscribe_raw` gets the subject, reply,
payload and header block as bytes, with no `Msg` built and no header parsed (a PubAck
needs nothing more); one made by `dispatch.subscribe_direct` gets a `Msg` built here.

`Reader` itself lives behind the door to nats-py's internals (actors/natsio/private.py),
and so does the switch that turns it off (`ACTORS_NATS_FASTPATH=0`: `install_reader`
then leaves a connection as nats-py made it, and every handler here gets its messages
through a `Msg`). The header-block helpers are pure (actors/natsio/headers.py).
"""

from __future__ import annotations

import logging

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from actors.natsio.headers import has_status, header_block, header_lines, plain_headers
from actors.natsio.private import (
    RawHandler,
    Reader,
    install_reader,
    reader_of,
    register_raw,
    subscribe_handler,
    subscription_id,
)

__all__ = [
    "RawHandler",
    "Reader",
    "has_status",
    "header_block",
    "header_lines",
    "install_reader",
    "plain_headers",
    "reader_of",
    "register_raw",
    "subscribe_raw",
]

log = logging.getLogger("actors")


async def subscribe_raw(nc: NATS, subject: str, handler: RawHandler) -> Subscription:
    """Subscribe to `subject` with `handler` called with each message's bytes as it is
    read (see the module docstring). It must not block, and what it raises is logged.
    What does not come that way (no `Reader` on `nc`, a message the handler declines, a
    subscription given a message limit) reaches the same handler through a `Msg`, its
    header block rebuilt from the parsed headers."""

    def from_msg(msg: Msg) -> None:
        try:
            handler(msg.subject.encode(), msg.reply.encode(), msg.data, header_block(msg.headers))
        except Exception:
            log.exception("handling a message on %s", msg.subject)

    sub = await subscribe_handler(nc, subject, from_msg)
    reader = reader_of(nc)
    if reader is not None:
        register_raw(reader, subscription_id(sub), handler)
    return sub
