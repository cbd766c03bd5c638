"""Watching for an execution's terminal status: one core subscription to the status the
server republishes each time the status bucket stores it, read as it arrives (no queue,
no task per message: actors/natsio/reader.py) into a future that the first terminal
status sets. What `Client.wait` and `Client.run` await."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from actors.natsio.reader import subscribe_raw
from actors.store.records import status_record
from actors.wire.codec import PayloadCodec
from actors.wire.events import TERMINAL_STATES
from actors.wire.messages import ExecutionStatus
from streams.subjects import status_subject

__all__ = ["StatusWatch"]


class StatusWatch:
    """The first terminal status of one execution seen on its status subject (or handed
    in with `offer`): `terminal`, a future. `close` when done with it."""

    def __init__(self, codec: PayloadCodec, execution_id: str = "") -> None:
        self.codec = codec
        self.execution_id = execution_id
        self.terminal: asyncio.Future[ExecutionStatus] = asyncio.get_running_loop().create_future()
        self._sub: Subscription | None = None

    @classmethod
    async def open(cls, nc: NATS, execution_id: str, codec: PayloadCodec) -> StatusWatch:
        watch = cls(codec, execution_id)
        watch._sub = await subscribe_raw(nc, status_subject(execution_id), watch._on_status)
        return watch

    def _on_status(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if not data or self.terminal.done():
            return  # empty: the key was deleted or purged (its status is gone, not terminal)
        try:
            status = self.codec.open_for_display(status_record(data, key=self.execution_id))
        except Exception as e:  # a status this client cannot read (RecordInvalid): the waiter is told
            self.terminal.set_exception(e)
            return
        self.offer(status)

    def offer(self, status: ExecutionStatus | None) -> None:
        """A status read otherwise (the key, read after subscribing)."""
        if status is not None and status.state in TERMINAL_STATES and not self.terminal.done():
            self.terminal.set_result(status)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:
                pass  # the connection is closing: the subscription goes with it
