"""The publish path, without nats-py's per-message overhead: `send` and `ack`.

`Client.publish` validates the subject with a regex, rebuilds the header block key by
key, formats the command with an f-string and awaits two coroutines: about 3 us per
message here, for each command and each ack. `send` builds the same PUB/HPUB bytes
and appends them to the client's outgoing buffer exactly as `Client._send_publish`
does (kicking its flusher the same way; `private.buffer_publish`), in well under 1 us.
Anything unusual (not connected, a reconnect buffering, a payload over the server's
limit, a subject or header with whitespace) goes through `Client.publish`, which
handles it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.natsio.private import ack_connection, buffer_lazily, buffer_publish, can_write_directly, mark_acked

_NO_WS = re.compile(r"[ \t\r\n]")
_NAMES_OK: set[str] = set()  # header names checked already (a few, sent again and again)


def _name_ok(name: str) -> bool:
    """May `name` go in a header line as it is (no whitespace, no colon)? Remembered."""
    if _NO_WS.search(name) or ":" in name:
        return False
    if len(_NAMES_OK) < 256:
        _NAMES_OK.add(name)
    return True


def send_nowait(
    nc: NATS, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
) -> Awaitable[None] | None:
    """`send` without a coroutine of its own: None once the message is in the client's
    buffer (its flusher kicked), else what the caller must await to send it (the way
    of `Client.publish`, or a flush the client's pending limit forces)."""
    if not can_write_directly(nc, len(payload)) or _NO_WS.search(subject) or (reply and _NO_WS.search(reply)):
        return nc.publish(subject, payload, reply=reply, headers=headers)
    if headers:
        lines = [b"NATS/1.0\r\n"]
        for k, v in headers.items():
            if "\r" in v or "\n" in v or (k not in _NAMES_OK and not _name_ok(k)):
                return nc.publish(subject, payload, reply=reply, headers=headers)
            lines.append(b"%s: %s\r\n" % (k.encode(), v.encode()))
        lines.append(b"\r\n")
        hdr = b"".join(lines)
        if reply:
            cmd = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject.encode(),
                reply.encode(),
                len(hdr),
                len(hdr) + len(payload),
                hdr,
                payload,
            )
        else:
            cmd = b"HPUB %s %d %d\r\n%s%s\r\n" % (subject.encode(), len(hdr), len(hdr) + len(payload), hdr, payload)
    elif reply:
        cmd = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(payload), payload)
    else:
        cmd = b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)
    return buffer_publish(nc, cmd, len(payload))


async def send(
    nc: NATS, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
) -> None:
    """`nc.publish(subject, payload, reply=reply, headers=headers)`, cheaper."""
    pending = send_nowait(nc, subject, payload, reply, headers)
    if pending is not None:
        await pending


async def ack(msg: Msg) -> None:
    """`msg.ack()`, buffered lazily: it leaves with the connection's next write, or
    within `private.LAZY_FLUSH` (no write of its own on the hot path). Unusual cases
    (a reply subject with whitespace, not connected) take `send`'s slow way."""
    nc = ack_connection(msg)
    if nc is None:
        await msg.ack()  # raises as it always did
        return
    reply = msg.reply
    if can_write_directly(nc, 0) and not _NO_WS.search(reply):
        buffer_lazily(nc, b"PUB %s 0\r\n\r\n" % reply.encode())
    else:
        await send(nc, reply)
    mark_acked(msg)
