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

Private names of nats-py used here (`tests/test_nats_private.py` pins them): `Parser`'s
`buf` (bytearray: what is left of a message split across reads), `reset` (called by
the client on a reconnect) and `nc` (the client); the client's `_ps` (the parser its
read loop calls, looked up for each chunk), `_subs` (sid -> Subscription: a message for
a sid no longer there is dropped, as `_process_msg` does), `_process_msg`,
`_process_err`, `_process_ping`, `_process_pong`, `_process_info` and `stats`; and its
`_parse_header_lines`, which `_process_headers` calls through the instance (replaced by
`header_lines` on a connection with a Reader).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ProtocolError
from nats.protocol.parser import ERR_RE, INFO_RE, OK_RE, PING_RE, PONG_RE, Parser

from actors.natsio.private import hand_off

log = logging.getLogger("actors")

# subject, reply ("" as b""), payload, header block (None: the message has none); a
# true return declines the message: it goes the usual way (`Client._process_msg`)
RawHandler = Callable[[bytes, bytes, bytes, bytes | None], bool | None]

_CRLF = b"\r\n"
_PLAIN = b"NATS/1.0\r\n"
_PLAIN_SIZE = len(_PLAIN)
_SPACE = re.compile(r"\s")
_names: dict[bytes, str | None] = {}  # header names read so far (a few distinct ones); None: skipped
_NAMES_KEPT = 256


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
            await nc._process_err(err.groups()[0].decode().lower())
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
    `header_lines` for the header blocks nats-py's `_process_headers` still reads."""
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


def has_status(block: bytes) -> bool:
    """Does a header block start with a status (a heartbeat, a 503, "no messages")?
    nats-py's own code reads those (`plain_headers` does not)."""
    return not block.startswith(_PLAIN)


def plain_headers(block: bytes) -> dict[str, str] | None:
    """The headers of a header block without a status ("NATS/1.0\\r\\n" then
    name-value lines), as nats-py's `Client._process_headers` reads them: None when
    there are none."""
    return header_lines(block[_PLAIN_SIZE:]) or None


def header_lines(raw: bytes) -> dict[str, str]:
    """Name-value lines as nats-py's `Client._parse_header_lines` reads them, the names
    decoded and checked once and cached (a few distinct ones come again and again; that
    check is a generator over each name's characters in nats-py). `install_reader` puts
    it in place of nats-py's on the connection, for the messages nats-py's own code reads
    (a status watch, a request's reply)."""
    out: dict[str, str] = {}
    names = _names
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = names[name]
        except KeyError:
            key = _header_name(name)
            if len(names) < _NAMES_KEPT:
                names[name] = key
        if key is not None:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


def _header_name(name: bytes) -> str | None:
    """A header's name as nats-py reads it, or None for one it skips (not ASCII, or with
    a space inside)."""
    try:
        key = name.strip().decode("ascii")
    except UnicodeDecodeError:
        return None
    return None if _SPACE.search(key) else key


async def subscribe_raw(nc: NATS, subject: str, handler: RawHandler) -> Subscription:
    """Subscribe to `subject` with `handler` called with each message's bytes as it is
    read (see the module docstring). It must not block, and what it raises is logged.
    What does not come that way (no `Reader` on `nc`, a message the handler declines, a
    subscription given a message limit) reaches the same handler through a `Msg`, its
    header block rebuilt from the parsed headers."""
    sub = await nc.subscribe(subject, pending_msgs_limit=-1)  # no callback: no task

    def from_msg(msg: Msg) -> None:
        try:
            handler(msg.subject.encode(), msg.reply.encode(), msg.data, header_block(msg.headers))
        except Exception:
            log.exception("handling a message on %s", msg.subject)

    hand_off(sub, from_msg)
    reader = reader_of(nc)
    if reader is not None:
        register_raw(reader, sub._id, handler)
    return sub


def header_block(headers: dict[str, str] | None) -> bytes | None:
    """A header block with `headers` (as nats-py parsed them: a status in "Status" and
    "Description"), for a handler of raw bytes given a `Msg`."""
    if not headers:
        return None
    status = headers.get("Status")
    first = b"NATS/1.0" if status is None else b"NATS/1.0 " + status.encode()
    if status is not None and headers.get("Description"):
        first += b" " + headers["Description"].encode()
    lines = [first] + [
        f"{k}: {v}".encode() for k, v in headers.items() if status is None or k not in ("Status", "Description")
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"
