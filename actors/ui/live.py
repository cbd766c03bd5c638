"""What makes the pages live: the status bucket's changes, fanned out to every open
executions page (`StatusHub`), and one execution's log, progress and status, turned into
"something changed" for its page (`ExecutionWatch`).

Both read with ordered consumers that deliver only what is stored from now on
(`DeliverPolicy.NEW`), so only changes come: the bucket's 10,000 current values are
never sent (the list's first page is read from the index), and an execution's log is
never read again (its watch takes headers only: it needs to know that, not what). Being
JetStream consumers delivering to an inbox, they need no more NATS permissions than
`actors-cli` has (the `cli` user of actors/pod/permissions.py), and ride out a reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from actors.client import check_execution_id
from actors.store.records import status_or_none
from actors.wire.messages import ExecutionStatus, LoopProgress
from streams.layout import STATUS_BUCKET, Layout
from streams.subjects import kv_key_subject, kv_stream, progress_subject

QUEUE = 1000  # changes an open page may fall behind by before it misses some
_progress = msgspec.json.Decoder(LoopProgress)


class StatusHub:
    """One subscription to the status bucket's changes, shared by every listener."""

    def __init__(self, nc: NATS, shown: Callable[[ExecutionStatus], ExecutionStatus] = lambda st: st) -> None:
        self.nc = nc
        self.shown = shown  # the status as users see it (a payload key opens its error message)
        self.listeners: set[asyncio.Queue[Any]] = set()
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await _changes(self.nc, kv_stream(STATUS_BUCKET), kv_key_subject(STATUS_BUCKET, "*"), self._changed)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for q in self.listeners:
            _offer(q, None)  # every open stream ends

    async def _changed(self, msg: Msg) -> None:
        if not msg.data:  # a delete or purge marker
            return
        # a status that is not one is left out (warned, naming its key), as listings do
        read = status_or_none(msg.data, key=msg.subject.rsplit(".", 1)[-1])
        if read is None:
            return
        st = self.shown(read)
        for q in self.listeners:
            _offer(q, st)

    def listen(self) -> asyncio.Queue[Any]:
        q: asyncio.Queue[Any] = asyncio.Queue(QUEUE)
        self.listeners.add(q)
        return q

    def forget(self, q: asyncio.Queue[Any]) -> None:
        self.listeners.discard(q)


async def _changes(nc: NATS, stream: str, subject: str, cb: Any, *, headers_only: bool = False) -> Any:
    """An ordered consumer of what `stream` stores on `subject` from now on."""
    return await nc.jetstream().subscribe(
        subject,
        stream=stream,
        cb=cb,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
        headers_only=headers_only or None,
        pending_msgs_limit=-1,
    )


def _offer(q: asyncio.Queue[Any], item: Any) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # a page too slow to read misses changes, never stalls others
        q.put_nowait(item)


class ExecutionWatch:
    """Sets `changed` whenever the execution's log grows, its status changes or one of
    its loops reports progress; keeps the latest progress of each loop and its rate."""

    def __init__(self, nc: NATS, layout: Layout, execution_id: str) -> None:
        self.nc = nc
        self.execution_id = check_execution_id(execution_id)
        self.watched = [
            (layout.exec_stream_of(execution_id), layout.execution(execution_id).log),
            (kv_stream(STATUS_BUCKET), kv_key_subject(STATUS_BUCKET, execution_id)),
        ]
        self.changed = asyncio.Event()
        self.loops: dict[str, LoopProgress] = {}
        self._first: dict[str, tuple[float, int]] = {}  # per loop: when it was first seen, and its count then
        self._subs: list[Any] = []

    async def __aenter__(self) -> ExecutionWatch:
        for stream, subject in self.watched:
            self._subs.append(await _changes(self.nc, stream, subject, self._stored, headers_only=True))
        self._subs.append(await self.nc.subscribe(progress_subject(self.execution_id), cb=self._progress))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _stored(self, msg: Msg) -> None:
        self.changed.set()

    async def _progress(self, msg: Msg) -> None:
        try:
            p = _progress.decode(msg.data)
        except msgspec.DecodeError:
            return
        self.loops[p.loop_id] = p
        self._first.setdefault(p.loop_id, (time.monotonic(), p.done))
        self.changed.set()

    def rates(self) -> dict[str, float]:
        """Iterations per second of each running loop since this page first heard of it, by step."""
        out: dict[str, float] = {}
        for loop_id, p in self.loops.items():
            since, done = self._first[loop_id]
            elapsed = time.monotonic() - since
            if elapsed > 0.5 and p.done > done:
                out[p.step] = (p.done - done) / elapsed
        return out
