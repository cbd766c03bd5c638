"""Core NATS requests on a connection without nats-py's per-request overhead: the
connection's `Requester`.

`Client.request` checks the subject with a regular expression, builds the header block
key by key, kicks its flusher through an `asyncio.Queue` and waits with
`asyncio.wait_for`. A client that starts executions (`Client.start`, `Client.run`)
makes one start request each: 200 started at once spent ~6 ms of a ~180 ms round
before the first request left the process. A requester sends through `fast.send_nowait`,
takes every reply on one wildcard subscription made once (`<inbox>.<token>`), read as
it arrives (actors/natsio/reader.py), and waits on a future with a timer.

As with nats-py: a reply that does not come within `timeout` raises
nats.errors.TimeoutError (a reconnect loses the replies in flight), and a request that
nobody is subscribed to raises NoRespondersError at once (the server's 503 status).
With the fast path off (`ACTORS_NATS_FASTPATH=0`) a request is `Client.request`.
"""

from __future__ import annotations

import asyncio
import itertools

import nats.errors
from nats.aio.client import Client as NATS

from actors.natsio import private
from actors.natsio.fast import send_nowait
from actors.natsio.private import connection_requester
from actors.natsio.replies import ReplyInbox

__all__ = ["Requester", "requester"]

_NO_RESPONDERS = b"NATS/1.0 503"


class Requester(ReplyInbox):
    """Requests on one connection, their replies on one wildcard subscription."""

    def __init__(self, nc: NATS) -> None:
        super().__init__(nc)
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[bytes]] = {}  # token -> the reply's future

    async def request(
        self, subject: str, payload: bytes, *, timeout: float, headers: dict[str, str] | None = None
    ) -> bytes:
        """Send `payload` to `subject` and return the first reply's payload."""
        if not private.FASTPATH:
            msg = await self.nc.request(subject, payload, timeout=timeout, headers=headers)
            return msg.data
        if self._sub is None:
            await self._start()
        loop = self._loop
        assert loop is not None
        token = str(next(self._tokens))
        reply: asyncio.Future[bytes] = loop.create_future()
        self._waiting[token] = reply
        timer = loop.call_later(timeout, _time_out, reply)
        try:
            pending = send_nowait(self.nc, subject, payload, self._prefix + token, headers)
            if pending is not None:
                await pending
            return await reply
        finally:
            timer.cancel()
            self._waiting.pop(token, None)

    def _on_reply(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        fut = self._waiting.get(subject[self._prefix_size :].decode())
        if fut is None or fut.done():
            return  # late (timed out) or a second reply: only the first one counts
        if headers is not None and headers.startswith(_NO_RESPONDERS):
            fut.set_exception(nats.errors.NoRespondersError())
        else:
            fut.set_result(data)


def _time_out(reply: asyncio.Future[bytes]) -> None:
    if not reply.done():
        reply.set_exception(nats.errors.TimeoutError())


def requester(nc: NATS) -> Requester:
    """The connection's `Requester` (one wildcard subscription per connection), kept on
    the connection: made on first use, gone with it."""
    return connection_requester(nc, Requester)
