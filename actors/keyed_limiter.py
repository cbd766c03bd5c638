"""Handling a subscription's messages side by side, those of one key in turn.

A nats-py subscription runs its callback for one message at a time. Actors whose
messages each cost a few round trips (the starter: is it started, which playbook, a
PubAck; the projector: a compare-and-set) and rarely depend on each other would spend
almost all their time waiting. `KeyedLimiter` runs up to `limit` at once; the callback
waits for a free slot, so a flood stays in the stream (the consumer's
max_ack_pending), not in memory. Work on one key (an execution) takes turns, in
arrival order: asyncio.Lock wakes its waiters first come, first served, and each task
reaches the lock in the order it was created.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger("actors")


class KeyedLimiter:
    """Runs up to `limit` pieces of work at once; those of one key in turn."""

    def __init__(self, *, limit: int, what: str) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[None]] = set()
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> its lock, tasks using it
        self._what = what

    async def submit(self, work: Callable[[], Awaitable[None]], *, key: str | None = None) -> None:
        """Start `work` once a slot is free (waiting here is the back-pressure); with a
        `key`, after every earlier work of that key."""
        await self._slots.acquire()
        task = asyncio.create_task(self._run(work, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, work: Callable[[], Awaitable[None]], key: str | None) -> None:
        try:
            if key is None:
                await work()
            else:
                async with self.turn(key):
                    await work()
        except Exception:  # work handles its own failures; this is a bug, not an outage
            log.exception("%s: unexpected failure", self._what)
        finally:
            self._slots.release()

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Exclusive use of `key` among this limiter's work."""
        lock, users = self._turns.get(key) or (asyncio.Lock(), 0)
        self._turns[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[key]
            if users == 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, users - 1)

    async def drain(self) -> None:
        """Wait for the work under way."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
