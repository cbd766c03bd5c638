"""The read path, without nats-py's per-message overhead: `use_fast_reader(nc)`.

nats-py's parser matches each MSG line with a regular expression (MSG first, then
HMSG), deletes each message from the front of its buffer (moving the rest), and awaits
`Client._process_msg`, which awaits `_process_headers` (a generator per header name
checks it for whitespace), builds the message and queues it for the subscription's
task. About 30 Python calls per message, on every PubAck, input and command.

`FastParser` takes the complete MSG and HMSG frames at the front of what was read by
offset, splits each control line once, parses a plain header block (no status line)
itself, and hands a message of a `subscribe_direct` subscription straight to its
handler (`private.handoff_of`). Everything else goes the usual way, in order: a
message of any other subscription or with a status header goes to
`Client._process_msg`; PING, PONG, INFO, +OK, -ERR, a frame cut across reads and
anything malformed go to nats-py's own parser, which also raises its protocol errors.
`tests/test_nats_private.py` checks that both paths deliver the same messages."""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NATS
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser

from actors.natsio.private import handoff_of, process_msg, use_parser

_CRLF = b"\r\n"
_SLOW: Any = object()  # a header block this module leaves to nats-py


def plain_headers(block: bytes) -> dict[str, str] | Any | None:
    """The headers of an HMSG header block as nats-py reads them, or `_SLOW` for a
    block with a status line (a 503, a heartbeat) or a name nats-py would skip."""
    if block[8:10] != _CRLF:  # "NATS/1.0 503 ..." or not NATS/1.0 at all
        return _SLOW
    out: dict[str, str] = {}
    for line in block[10:].split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.strip()
        if not key.isascii() or len(key.split()) != 1:
            return _SLOW  # nats-py drops such a name: let it
        out[key.decode()] = value.strip().decode("utf-8", "replace")
    return out or None


class FastParser(Parser):
    """nats-py's Parser with a fast path for MSG/HMSG frames (module docstring)."""

    async def parse(self, data: bytes = b"") -> None:
        if self.state != AWAITING_CONTROL_LINE:
            await super().parse(data)  # nats-py's parser was left mid-frame (after a malformed line)
            return
        buf = self.buf
        buf += data
        nc: NATS = self.nc
        pos, end = 0, len(buf)
        while pos < end:
            if buf.startswith(b"HMSG ", pos):
                first = pos + 5
            elif buf.startswith(b"MSG ", pos):
                first = pos + 4
            else:  # PING, PONG, INFO, +OK, -ERR: one line for nats-py's parser
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    break  # the rest of the line is still to come
                if not await self._nats_py_line(bytes(buf[pos : eol + 2])):
                    return
                pos = eol + 2
                continue
            eol = buf.find(_CRLF, first, pos + MAX_CONTROL_LINE_SIZE)
            if eol < 0:
                if end - pos >= MAX_CONTROL_LINE_SIZE:
                    return await self._nats_py_rest(pos)  # malformed: nats-py's parser says so
                break
            args = bytes(buf[first:eol]).split()
            with_headers = first == pos + 5
            n = len(args) - with_headers
            try:
                if n not in (3, 4):
                    raise ValueError(n)
                sid = int(args[1])
                total = int(args[-1])
                header_size = int(args[-2]) if with_headers else 0
            except ValueError:
                return await self._nats_py_rest(pos)
            start = eol + 2
            stop = start + total
            if stop + 2 > end:
                break  # the rest of the frame is still to come: kept until the next read
            subject, reply = args[0], args[2] if n == 4 else b""
            pos = stop + 2
            if with_headers:
                block = bytes(buf[start : start + header_size])
                payload = bytes(buf[start + header_size : stop])
            else:
                block, payload = None, bytes(buf[start:stop])
            handoff = handoff_of(nc, sid)
            headers = plain_headers(block) if block is not None and handoff is not None else None
            if handoff is not None and headers is not _SLOW:
                handoff.deliver(nc, sid, subject, reply, payload, headers)
            else:
                await process_msg(nc, sid, subject, reply, payload, block)
                if self.buf is not buf:
                    return  # the connection was reset meanwhile (a reconnect): what was read is gone
        if pos:
            del buf[:pos]

    async def _nats_py_line(self, line: bytes) -> bool:
        """nats-py's parser on one control line; False if it reset the connection's state."""
        kept, alone = self.buf, bytearray(line)
        self.buf = alone
        await super().parse()
        if self.buf is not alone or self.state != AWAITING_CONTROL_LINE:
            return False
        self.buf = kept
        return True

    async def _nats_py_rest(self, pos: int) -> None:
        """nats-py's parser on everything from `pos` (it raises for what is malformed)."""
        del self.buf[:pos]
        await super().parse()


def use_fast_reader(nc: NATS) -> None:
    """Read `nc`'s messages with `FastParser`; call before `connect`."""
    use_parser(nc, FastParser)
