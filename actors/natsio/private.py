"""Every use of a private name of nats-py, in one place (and in reader.py, the
protocol reader that stands in for nats-py's parser, which lists its own).

The rest of the tree reads and writes nats-py objects only through their public API
and the functions here. Each private name below is used for speed on the hot path
(a publish or an ack per message) or because nats-py has no public way to do it;
`tests/test_nats_private.py` fails when an installed nats-py changes any of them, and
`pyproject.toml` pins nats-py to the versions that test passed with.

`Client` (nats.aio.client), read and written as `Client._send_publish`,
`_send_command` and `publish` do, to append a PUB/HPUB without `Client.publish`'s
per-message overhead (`fast.send`):
* `_status` (int): exactly CONNECTED. The public `is_connected` is also true while
  draining, when `publish` refuses; anything but CONNECTED goes through `publish`.
* `_max_payload` (int): the server's limit, read without the `max_payload` property
  call; a larger payload goes through `publish`, which raises MaxPayloadError.
* `_pending` (list of bytes) and `_pending_data_size` (int): the outgoing buffer and
  its size, which the flusher writes to the socket and empties.
* `_max_pending_size` (int): past it a publish forces a flush (the client's own limit).
* `_flush_queue` (asyncio.Queue or None before connect), `_flusher_task` (the task that
  writes the buffer) and `_flush_pending` (coroutine method): kicking the flusher when
  no kick is queued yet, as `_send_publish` does: a future put on its queue while it
  runs, else `_flush_pending` (which writes inline when it does not).
* `_pending` and `_pending_data_size` again, emptied before closing a connection that
  is not connected (`close_connection`): `close` would write them to the lost transport.
* `_transport` (nats-py's Transport, or None): `flush` writes the buffer to it before the PING.
  nats-py 2.16's `Client.flush` writes its PING straight to the transport while
  commands sent before it (a SUB, a PUB) may still wait in `_pending` for the flusher,
  so its PONG can come back before the server has seen them: a responder subscribed
  and "flushed" on one connection then drew "no responders" to a request from another
  about 7% of the time (tests/test_nats_private.py). nats.py2 had fixed the same once
  (its PR 24, 2017).

`Msg` (nats.aio.msg), for an ack sent by `fast.send` instead of `Msg.ack`:
* `_ackd` (bool): read, so that a second ack raises as `Msg.ack` does; set after the
  ack (no public setter).
* `_client` (the Client, or None): the connection the message came on.

`JetStreamContext` (nats.js.client):
* `_nc` (the Client): the connection under a context. `publish_all(js, ...)` takes a
  context (its callers hold one) and publishes through the connection's Publisher.

`Subscription` (nats.aio.subscription), for a subscription whose messages are handed
to a function as they are parsed (`dispatch.subscribe_direct`):
* `_pending_queue` (asyncio.Queue): where `Client._process_msg` puts each message for
  the subscription's task or `next_msg`; replaced by a stand-in that calls the handler.
* `_pending_size` (int): the bytes `_process_msg` counts as pending for a message it
  queued (and checks against the subscription's bytes limit); the stand-in takes them
  off again at once, as the subscription's task does after its callback.

Our own attributes on a `Client` (it has no `__slots__`): `_actors_publisher`, the
connection's Publisher (`connection_publisher`): a publisher belongs to its connection
and goes away with it, with no module-level table keyed by `id(nc)`; `_actors_requester`,
its Requester (`connection_requester`, the same way); and `_actors_lazy_flush`, the
timer that writes lazily buffered acks (`buffer_lazily`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

T = TypeVar("T")

CLIENT_ATTRS = (
    "_flusher_task",
    "_pending",
    "_pending_data_size",
    "_flush_queue",
    "_flush_pending",
    "_max_pending_size",
    "_max_payload",
    "_status",
    "_transport",
    "stats",
)
# False when this nats-py lacks what `buffer_publish` touches: every publish then goes
# through `Client.publish` (slower, still correct). The test asserts it is True.
DIRECT_WRITE = all(hasattr(NATS(), a) for a in CLIENT_ATTRS)
_CONNECTED = NATS.CONNECTED
_PUBLISHER_ATTR = "_actors_publisher"
_REQUESTER_ATTR = "_actors_requester"


def can_write_directly(nc: NATS, payload_size: int) -> bool:
    """May a PUB of `payload_size` bytes be appended to `nc`'s buffer now: connected
    (not connecting, reconnecting, draining or closed) and within the server's limit?"""
    return DIRECT_WRITE and nc._status == _CONNECTED and payload_size <= nc._max_payload


def buffer_publish(nc: NATS, command: bytes, payload_size: int) -> Coroutine[Any, Any, Any] | None:
    """Append a complete PUB/HPUB `command` to `nc`'s outgoing buffer and count it, as
    `Client._send_publish` does. Returns the flush the caller must await (a forced one
    past the client's pending limit, or one inline when no flusher runs), or None: the
    flusher is kicked without a coroutine, to spare one per message."""
    if _append(nc, command, payload_size):
        return nc._flush_pending(force_flush=True)
    queue = nc._flush_queue
    if queue is None or not queue.empty() or _kick(nc):
        return None  # a kick is queued already, or was just now
    return nc._flush_pending()  # no flusher (closing, reconnecting): it writes inline


LAZY_FLUSH = 0.002  # seconds a lazily buffered command may wait for the connection's next write
_LAZY_ATTR = "_actors_lazy_flush"  # our own attribute on a Client: its pending lazy-flush timer


def buffer_lazily(nc: NATS, command: bytes) -> None:
    """Append a complete command (an ack) to `nc`'s outgoing buffer without kicking the
    flusher: it goes out with the next write the connection makes anyway, or after
    LAZY_FLUSH seconds when none comes. An ack is never on anyone's critical path, and
    on loopback every separate write wakes the server (and may pre-empt this process)."""
    if _append(nc, command, 0):
        _kick(nc)
    elif getattr(nc, _LAZY_ATTR, None) is None:
        setattr(nc, _LAZY_ATTR, asyncio.get_running_loop().call_later(LAZY_FLUSH, _lazy_flush, nc))


def _lazy_flush(nc: NATS) -> None:
    setattr(nc, _LAZY_ATTR, None)
    if nc._pending_data_size > 0:
        _kick(nc)


def _append(nc: NATS, command: bytes, payload_size: int) -> bool:
    """Append `command` to `nc`'s outgoing buffer and count it; True when the buffer is
    past the client's own pending limit (a flush is due now)."""
    stats = nc.stats
    stats["out_msgs"] += 1
    stats["out_bytes"] += payload_size
    nc._pending.append(command)
    nc._pending_data_size += len(command)
    return nc._max_pending_size > 0 and nc._pending_data_size > nc._max_pending_size


def _kick(nc: NATS) -> bool:
    """Have the running flusher write what is buffered: a future on its queue, as
    `_flush_pending` puts there, unless a kick is queued already. False when no flusher
    runs (closing, reconnecting): the next connection's first flush writes it then."""
    queue, flusher = nc._flush_queue, nc._flusher_task
    if flusher is None or flusher.done():
        return False
    if queue is not None and queue.empty():
        queue.put_nowait(asyncio.get_running_loop().create_future())
    return True


def ack_connection(msg: Msg) -> NATS | None:
    """The connection on which `msg` may be acked by a plain publish to its reply
    subject, or None when `msg.ack()` must handle it (already acked, no reply subject,
    no connection): it raises what it always raised."""
    if msg._ackd or not msg.reply:
        return None
    return msg._client


def mark_acked(msg: Msg) -> None:
    """Record that `msg` was acked, as `Msg.ack` does after sending."""
    msg._ackd = True


class _Handoff:
    """Stands in for a subscription's queue: `put_nowait` (what `Client._process_msg`
    calls for each message) hands the message to `handler` at once. It is never
    waited on: every other queue method answers "empty"."""

    __slots__ = ("handler", "sub")

    def __init__(self, sub: Subscription, handler: Callable[[Msg], None]) -> None:
        self.sub = sub
        self.handler = handler

    def put_nowait(self, msg: Msg) -> None:
        self.sub._pending_size -= len(msg.data)
        self.handler(msg)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        pass


def hand_off(sub: Subscription, handler: Callable[[Msg], None]) -> None:
    """From now on `sub`'s messages go straight to `handler` (see `_Handoff`); any
    already queued go first."""
    queued: asyncio.Queue[Msg] = sub._pending_queue
    sub._pending_queue = _Handoff(sub, handler)  # type: ignore[assignment]
    while not queued.empty():
        msg = queued.get_nowait()
        sub._pending_size -= len(msg.data)
        handler(msg)


def connection_of(js: JetStreamContext) -> NATS:
    """The connection a JetStream context publishes on."""
    nc: NATS = js._nc
    return nc


def connection_publisher(nc: NATS, make: Callable[[NATS], T]) -> T:
    """The publisher kept on `nc` for its lifetime, made by `make(nc)` on first use:
    one per connection, gone with it."""
    return _kept(nc, _PUBLISHER_ATTR, make)


def connection_requester(nc: NATS, make: Callable[[NATS], T]) -> T:
    """The requester kept on `nc` for its lifetime (as `connection_publisher`)."""
    return _kept(nc, _REQUESTER_ATTR, make)


def _kept(nc: NATS, attr: str, make: Callable[[NATS], T]) -> T:
    kept: T | None = getattr(nc, attr, None)
    if kept is None:
        kept = make(nc)
        setattr(nc, attr, kept)
    return kept


async def close_connection(nc: NATS) -> None:
    """`nc.close()`, also for a connection that lost its server. There nats-py's close
    writes what it buffered while reconnecting to the transport it lost: uvloop raises
    on a closed transport, and the close stops half-way (its subscriptions, transport
    and callbacks not cleaned up), which took `serve` down with a traceback on SIGTERM
    during a NATS outage. Closing means that buffer is never sent: it is dropped first.
    Connected (or draining), everything buffered is written before the close, as
    nats-py does."""
    if nc.is_closed:
        return
    if not nc.is_connected:  # reconnecting, or not connected yet
        nc._pending = []
        nc._pending_data_size = 0
    await nc.close()


async def flush(nc: NATS, timeout: float = 10.0) -> None:
    """Return once the server has processed everything sent on `nc` before this call
    (`Client.flush`, in order: see `_transport` above)."""
    if nc._status == _CONNECTED and nc._pending_data_size > 0 and nc._transport is not None:
        nc._transport.writelines(nc._pending[:])  # what the flusher would write next
        nc._pending = []
        nc._pending_data_size = 0
    await nc.flush(timeout)  # type: ignore[arg-type]  # typed int, used as a float
