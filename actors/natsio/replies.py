"""The one wildcard reply subscription that a connection's Publisher (PubAcks) and
Requester (replies to requests) each keep: `<inbox>.<token>`, made on first use however
many callers ask at once, its messages read as they arrive (actors/natsio/reader.py)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from actors.natsio.reader import subscribe_raw


class ReplyInbox:
    """Replies to `_prefix + token` go to `_on_reply`, once `_start` has subscribed."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._prefix = ""
        self._prefix_size = 0
        self._sub: Subscription | None = None
        self._starting: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _start(self) -> None:
        if self._starting is None:
            self._loop = asyncio.get_running_loop()
            self._starting = self._loop.create_future()
            try:
                self._prefix = self.nc.new_inbox() + "."
                self._prefix_size = len(self._prefix.encode())
                self._sub = await subscribe_raw(self.nc, self._prefix + "*", self._on_reply)
            except BaseException as e:
                self._starting.set_exception(e)
                self._starting.exception()  # retrieved: later callers re-raise it
                self._starting = None
                raise
            self._starting.set_result(None)
        else:
            await asyncio.shield(self._starting)

    def _on_reply(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        raise NotImplementedError


def is_inbox(subject: str) -> bool:
    """Is `subject` an inbox a requester chose for its reply (`_INBOX.<...>`, or with a
    connection's own prefix `_INBOX_<name>.<...>`, as the deployment's permissions give
    each user)? A service that answers requests answers only there: a pod may publish
    where its requesters may not, and a reply subject is whatever a request names."""
    head, _, rest = subject.partition(".")
    return head.startswith("_INBOX") and bool(rest)
