"""The one door to nats-py's internals: every use of a private name of nats-py is here,
and nowhere else in actors/ or streams/ (`tests/integration/test_nats_private.py` scans the tree).

The rest of the tree reads and writes nats-py objects only through their public API
and the functions here. Each private name below is used for speed on the hot path
(a publish or an ack per message, the protocol reader) or because nats-py has no
public way to do it; `tests/integration/test_nats_private.py` fails when an installed nats-py
changes any of them, and `pyproject.toml` pins nats-py to the versions that test passed
with.

**The switch.** `ACTORS_NATS_FASTPATH=0` (`FASTPATH`, read once when this module is
imported; a `Settings` field, so a value that is not a boolean stops a pod at start-up)
turns every fast path off: publishes go through `Client.publish`, acks through
`Msg.ack`, requests through `Client.request` (`actors/natsio/requests.py`),
subscriptions through `Client.subscribe` with a callback, flushes through
`Client.flush`, and connections keep nats-py's own parser. Only two things still touch
a private name then, because nats-py offers no public way at all: `connection_of`
(a JetStream context's connection) and `close_connection` (dropping what a lost
connection buffered). Behaviour is the same either way; the fast path is only faster.

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
  about 7% of the time (tests/integration/test_nats_private.py). nats.py2 had fixed the same once
  (its PR 24, 2017). With the fast path off, `flush` is two `Client.flush` calls: by
  the time the first PONG is read, the flusher (kicked before it) has written what was
  buffered, so the second PING follows it.
* the protocol reader (`Reader`, below): the client's `_ps` (the parser its read loop
  calls, looked up for each chunk), `_subs` (sid -> Subscription: a message for a sid
  no longer there is dropped, as `_process_msg` does), `_process_msg`, `_process_err`,
  `_process_ping`, `_process_pong`, `_process_info` and `stats`; its
  `_parse_header_lines`, which `_process_headers` calls through the instance (replaced
  by `headers.header_lines` on a connection with a Reader); and `Parser`'s `buf`
  (bytearray: what is left of a message split across reads), `reset` (called by the
  client on a reconnect) and `nc` (the client).

`Msg` (nats.aio.msg), for an ack sent by `fast.send` instead of `Msg.ack`:
* `_ackd` (bool): read, so that a second ack raises as `Msg.ack` does; set after the
  ack (no public setter).
* `_client` (the Client, or None): the connection the message came on.
* no `__slots__`: an attribute of ours rides on a delivered message (`tag_message`),
  what a partition host knows of the delivery (actors/runtime/gaps.py), so that it
  travels with the message through an actor's mailbox.

`JetStreamContext` (nats.js.client):
* `_nc` (the Client): the connection under a context. `publish_all(js, ...)` takes a
  context (its callers hold one) and publishes through the connection's Publisher;
  `binding.codec_of(js)` finds the codec bound to it.

`Subscription` (nats.aio.subscription), for a subscription whose messages are handed
to a function as they are parsed (`subscribe_handler`):
* `_id` (int): its sid, which the protocol reader's messages carry.
* `_max_msgs` (int): a subscription that unsubscribes after N messages is left to
  nats-py, which counts them.
* `_pending_queue` (asyncio.Queue): where `Client._process_msg` puts each message for
  the subscription's task or `next_msg`; replaced by a stand-in that calls the handler.
* `_pending_size` (int): the bytes `_process_msg` counts as pending for a message it
  queued (and checks against the subscription's bytes limit); the stand-in takes them
  off again at once, as the subscription's task does after its callback.

What the project keeps per connection (its Publisher, its Requester, the payload codec
bound to it, the timer that writes lazily buffered acks) is held here in a weak
mapping keyed by the Client: nothing is set on nats-py's objects, and it goes away
with the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ProtocolError
from nats.js import JetStreamContext
from nats.protocol.parser import ERR_RE, INFO_RE, OK_RE, PING_RE, PONG_RE, Parser

from actors.config.settings import Settings, SettingsInvalid
from actors.natsio.headers import header_lines

log = logging.getLogger("actors")

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
_SWITCH = "ACTORS_NATS_FASTPATH"


def _fastpath_setting() -> bool:
    """`ACTORS_NATS_FASTPATH` as `Settings` reads it (only that variable: another
    setting's bad value is refused where settings are read, not at this import). A value
    that is not a boolean keeps the fast path here; `Settings.from_env` refuses it at
    start-up in one line."""
    raw = os.environ.get(_SWITCH)
    try:
        return Settings.from_env({} if raw is None else {_SWITCH: raw}).nats_fastpath
    except SettingsInvalid:
        return True


# Every fast path on (the default), or nats-py's public API alone (see the docstring).
# Read at call time, so a test may set it for the connections it makes.
FASTPATH = _fastpath_setting()


class _Kept:
    """What the project keeps for one connection."""

    __slots__ = ("codec", "denials", "error_text", "lazy_flush", "publisher", "requester")

    def __init__(self) -> None:
        self.publisher: Any = None
        self.requester: Any = None
        self.denials: Any = None
        self.error_text = ""  # the server's last -ERR as it said it (nats-py lower-cases it)
        self.codec: Any = None
        self.lazy_flush: asyncio.TimerHandle | None = None  # the pending lazy-flush timer


_kept: weakref.WeakKeyDictionary[NATS, _Kept] = weakref.WeakKeyDictionary()


def _state(nc: NATS) -> _Kept:
    kept = _kept.get(nc)
    if kept is None:
        kept = _kept[nc] = _Kept()
    return kept


def can_write_directly(nc: NATS, payload_size: int) -> bool:
    """May a PUB of `payload_size` bytes be appended to `nc`'s buffer now: connected
    (not connecting, reconnecting, draining or closed) and within the server's limit?"""
    return FASTPATH and DIRECT_WRITE and nc._status == _CONNECTED and payload_size <= nc._max_payload


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


def buffer_lazily(nc: NATS, command: bytes) -> None:
    """Append a complete command (an ack) to `nc`'s outgoing buffer without kicking the
    flusher: it goes out with the next write the connection makes anyway, or after
    LAZY_FLUSH seconds when none comes. An ack is never on anyone's critical path, and
    on loopback every separate write wakes the server (and may pre-empt this process)."""
    if _append(nc, command, 0):
        _kick(nc)
        return
    kept = _state(nc)
    if kept.lazy_flush is None:
        kept.lazy_flush = asyncio.get_running_loop().call_later(LAZY_FLUSH, _lazy_flush, nc)


def _lazy_flush(nc: NATS) -> None:
    _state(nc).lazy_flush = None
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
    no connection): it raises what it always raised. Always None with the fast path off."""
    if not FASTPATH or msg._ackd or not msg.reply:
        return None
    return msg._client


def mark_acked(msg: Msg) -> None:
    """Record that `msg` was acked, as `Msg.ack` does after sending."""
    msg._ackd = True


def tag_message(msg: Msg, name: str, value: object) -> None:
    """Set an attribute of ours (`name`, prefixed `_actors_`) on `msg`."""
    setattr(msg, name, value)


def message_tag(msg: Msg, name: str) -> object | None:
    """The attribute `tag_message` set on `msg`, or None."""
    return getattr(msg, name, None)


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


async def subscribe_handler(nc: NATS, subject: str, handler: Callable[[Msg], None], *, queue: str = "") -> Subscription:
    """Subscribe to `subject` (in queue group `queue`) with `handler` called for each
    message in order. Fast path: in the client's read loop, as each message is parsed
    (no queue, no task: see `hand_off`). Off: `Client.subscribe` with a callback, its
    task calling `handler`. Either way `handler` must not block, and it should catch
    what it raises (nats-py's `error_cb` gets it otherwise)."""
    if not FASTPATH:

        async def callback(msg: Msg) -> None:
            handler(msg)

        # no limits: the fast path has none either (a handler only hands a message on)
        return await nc.subscribe(subject, queue=queue, cb=callback, pending_msgs_limit=-1, pending_bytes_limit=0)
    sub = await nc.subscribe(subject, queue=queue, pending_msgs_limit=-1)  # no callback: no task
    hand_off(sub, handler)
    return sub


def subscription_id(sub: Subscription) -> int:
    """`sub`'s sid (nats-py has no public name for it)."""
    sid: int = sub._id
    return sid


def connection_of(js: JetStreamContext) -> NATS:
    """The connection a JetStream context publishes on."""
    nc: NATS = js._nc
    return nc


def connection_publisher(nc: NATS, make: Callable[[NATS], T]) -> T:
    """The publisher kept for `nc` for its lifetime, made by `make(nc)` on first use:
    one per connection, gone with it."""
    kept = _state(nc)
    if kept.publisher is None:
        kept.publisher = make(nc)
    publisher: T = kept.publisher
    return publisher


def connection_requester(nc: NATS, make: Callable[[NATS], T]) -> T:
    """The requester kept for `nc` for its lifetime (as `connection_publisher`)."""
    kept = _state(nc)
    if kept.requester is None:
        kept.requester = make(nc)
    requester: T = kept.requester
    return requester


def connection_denials(nc: NATS, make: Callable[[], T]) -> T:
    """What the server refused `nc`'s user, kept for its lifetime (as `connection_publisher`)."""
    kept = _state(nc)
    if kept.denials is None:
        kept.denials = make()
    denials: T = kept.denials
    return denials


def inbox_prefix(nc: NATS) -> str:
    """The prefix of `nc`'s reply subjects (nats-py's `inbox_prefix`, `_INBOX` by default)."""
    return bytes(nc._inbox_prefix).decode()


def server_error_text(nc: NATS) -> str:
    """The server's last -ERR on `nc` as it said it, before nats-py lower-cased it ("":
    none yet, or the fast reader is off)."""
    return _state(nc).error_text


def keep_codec(nc: NATS, codec: object) -> None:
    """Keep `codec` for `nc` for its lifetime (actors/natsio/binding.py)."""
    _state(nc).codec = codec


def kept_codec(nc: NATS) -> object | None:
    """The codec kept for `nc`, or None."""
    kept = _kept.get(nc)
    return None if kept is None else kept.codec


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
    if not FASTPATH:
        await nc.flush(timeout)  # type: ignore[arg-type]  # its PONG comes after the flusher wrote the buffer
        await nc.flush(timeout)  # type: ignore[arg-type]  # so this PING follows what was sent before the call
        return
    if nc._status == _CONNECTED and nc._pending_data_size > 0 and nc._transport is not None:
        nc._transport.writelines(nc._pending[:])  # what the flusher would write next
        nc._pending = []
        nc._pending_data_size = 0
    await nc.flush(timeout)  # type: ignore[arg-type]  # typed int, used as a float


# --- the protocol reader -------------------------------------------------------------
# (what it is for: actors/natsio/reader.py)

# subject, reply ("" as b""), payload, header block (None: the message has none); a
# true return declines the message: it goes the usual way (`Client._process_msg`)
RawHandler = Callable[[bytes, bytes, bytes, bytes | None], bool | None]

_CRLF = b"\r\n"


class Reader(Parser):
    """`Parser` with a one-pass `parse` (see the module docstring)."""

    def __init__(self, nc: NATS) -> None:
        super().__init__(nc)
        self.raw: dict[int, RawHandler] = {}  # sid -> handler of a `subscribe_raw` subscription
        self._wanted = 0  # bytes `buf` must hold before a split message is complete

    def reset(self) -> None:
        super().reset()
        self._wanted = 0

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        if buf:  # the rest of a message split across reads
            buf.extend(data)
            if len(buf) < self._wanted:
                return
            data = bytes(buf)
            buf.clear()
        self._wanted = 0
        nc = self.nc
        subs = nc._subs
        raw = self.raw
        stats = nc.stats
        end = len(data)
        pos = 0
        while pos < end:
            eol = data.find(_CRLF, pos)
            if eol < 0:
                break  # the rest of the line is still to come
            if data.startswith(b"MSG ", pos):
                args = data[pos + 4 : eol].split()
                if len(args) == 3:
                    subject, sid_b, size_b = args
                    reply = b""
                elif len(args) == 4:
                    subject, sid_b, reply, size_b = args
                else:
                    raise ProtocolError("nats: malformed MSG")
                header_b = b"0"
            elif data.startswith(b"HMSG ", pos):
                args = data[pos + 5 : eol].split()
                if len(args) == 4:
                    subject, sid_b, header_b, size_b = args
                    reply = b""
                elif len(args) == 5:
                    subject, sid_b, reply, header_b, size_b = args
                else:
                    raise ProtocolError("nats: malformed MSG")
            else:
                await self._control(data[pos : eol + 2])
                if self.buf is not buf:
                    return  # the client reset its parser meanwhile (a reconnect)
                pos = eol + 2
                continue
            if not (sid_b.isdigit() and size_b.isdigit() and header_b.isdigit()):
                raise ProtocolError("nats: malformed MSG")  # as nats-py's \\d+ refuses it
            sid, size, header_size = int(sid_b), int(size_b), int(header_b)
            start = eol + 2
            stop = start + size
            if stop + 2 > end:  # the payload is still to come: wait for all of it
                self._wanted = stop + 2 - pos
                break
            if header_size:
                headers: bytes | None = data[start : start + header_size]
                payload = data[start + header_size : stop]
            else:
                headers, payload = None, data[start:stop]
            pos = stop + 2
            handler = raw.get(sid)
            if handler is not None:
                sub = subs.get(sid)
                if sub is None:
                    del raw[sid]  # unsubscribed: counted and dropped, as `_process_msg` does
                    stats["in_msgs"] += 1
                    stats["in_bytes"] += size - header_size
                    continue
                if not sub._max_msgs:  # one that unsubscribes after N messages: nats-py counts them
                    try:
                        declined = handler(subject, reply, payload, headers)
                    except Exception:
                        # raised here, it would make the client drop the connection
                        log.exception("handling a message on %s", subject.decode(errors="replace"))
                        declined = False
                    if not declined:
                        stats["in_msgs"] += 1
                        stats["in_bytes"] += size - header_size
                        continue
            await nc._process_msg(sid, subject, reply, payload, headers)
            if self.buf is not buf:
                return  # the client reset its parser meanwhile (a reconnect)
        if pos < end:
            buf.extend(memoryview(data)[pos:])

    async def _control(self, line: bytes) -> None:
        """Any other operation, as `Parser.parse` handles it."""
        nc = self.nc
        if OK_RE.match(line):
            return
        if (err := ERR_RE.match(line)) is not None:
            text = err.groups()[0].decode()
            # the subject a violation names keeps its case (actors/natsio/denials.py); quoted
            # as nats-py's error is not
            _state(nc).error_text = text.strip("'")
            await nc._process_err(text.lower())
        elif PING_RE.match(line):
            await nc._process_ping()
        elif PONG_RE.match(line):
            await nc._process_pong()
        elif (info := INFO_RE.match(line)) is not None:
            await nc._process_info(json.loads(info.groups()[0].decode()))
        else:
            raise ProtocolError("nats: unknown protocol")


def install_reader(nc: NATS) -> NATS:
    """Give `nc` a `Reader` (before it connects: the parser holds what was read), and
    `header_lines` for the header blocks nats-py's `_process_headers` still reads. With
    the fast path off (`FASTPATH`), `nc` is left as nats-py made it."""
    if not FASTPATH:
        return nc
    nc._ps = Reader(nc)
    nc._parse_header_lines = header_lines  # type: ignore[method-assign]
    return nc


def register_raw(reader: Reader, sid: int, handler: RawHandler) -> None:
    """Hand `sid`'s messages to `handler`. The handlers of subscriptions that have ended
    since (an entry otherwise goes only when a message for it comes; sids are never
    reused) are forgotten once they outnumber the live ones: a client watching 200
    executions at once opened and closed a subscription each, and a scan of every entry
    on each subscribe was quadratic in them."""
    subs, raw = reader.nc._subs, reader.raw
    raw[sid] = handler
    if len(raw) > 2 * len(subs) + 64:
        for gone in [s for s in raw if s not in subs]:
            del raw[gone]


def reader_of(nc: NATS) -> Reader | None:
    """`nc`'s Reader, or None for a connection made without one (`nats.connect`)."""
    reader = nc._ps
    return reader if isinstance(reader, Reader) else None
