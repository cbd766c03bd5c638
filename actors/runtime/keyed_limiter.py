"""Handling a subscription's messages side by side, those of one key in turn.

Actors whose messages each cost a few round trips (the starter: is it started, which
playbook, a PubAck; the projector: a compare-and-set) and rarely depend on each other
would spend almost all their time waiting if they took one message at a time.
`KeyedLimiter` runs up to `limit` at once. It is fed from the read loop
(actors/natsio/dispatch.py): `submit` never waits; work beyond the limit waits in
arrival order for a slot, and what waits is bounded by the consumer's max_ack_pending
(the server sends no more unacked messages than that), so a flood stays in the stream,
not in memory. Work on one key (an execution) takes turns, in arrival order:
asyncio.Lock wakes its waiters first come, first served, and each task reaches the lock
in the order it was created.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

log = logging.getLogger("actors")

Work = Callable[[], Awaitable[None]]
# seconds an actor's stop lets its work under way finish while NATS answers (a few round
# trips each); with NATS gone nothing of it can finish but by failing: cut short at once
STOP_GRACE = 3.0


def stop_grace(connected: bool) -> float:
    """The `grace` of a stop's `drain`, by whether the actor's connection is up."""
    return STOP_GRACE if connected else 0.0


class KeyedLimiter:
    """Runs up to `limit` pieces of work at once; those of one key in turn."""

    def __init__(self, *, limit: int, what: str) -> None:
        self._free = limit  # slots not taken
        self._waiting: deque[tuple[Work, str | None]] = deque()  # for a slot, in arrival order
        self._tasks: set[asyncio.Task[None]] = set()
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> its lock, tasks using it
        self._what = what
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it runs on (set on first use)

    def submit(self, work: Work, *, key: str | None = None) -> None:
        """Start `work` now if a slot is free, else once one is, after the work that
        came before; with a `key`, after every earlier work of that key."""
        if self._free and not self._waiting:
            self._free -= 1
            self._start(work, key)
        else:
            self._waiting.append((work, key))

    def _start(self, work: Work, key: str | None) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            # looked up once: `get_running_loop` costs a getpid() system call on Python 3.11
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(self._run(work, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, work: Work, key: str | None) -> None:
        try:
            if key is None:
                await work()
            else:
                async with self.turn(key):
                    await work()
        except Exception:  # work handles its own failures; this is a bug, not an outage
            log.exception("%s: unexpected failure", self._what)
        finally:
            if self._waiting:
                self._start(*self._waiting.popleft())  # the slot passes to the next in line
            else:
                self._free += 1

    def turn(self, key: str) -> _Turn:
        """Exclusive use of `key` among this limiter's work (`async with limiter.turn(key)`)."""
        return _Turn(self._turns, key)

    async def drain(self, *, grace: float | None = None) -> None:
        """Wait for the work under way and the work waiting for a slot (a task that
        ends starts the next in line first, so while any waits, some task runs).
        `grace`: seconds to wait at most; then what still runs is cancelled and what
        waits is dropped. For actors whose work may be cut short: a message not acked
        comes back (to another pod), and its work is written to be done twice. Without
        it a stop with NATS gone waits for each piece of work to fail on its own, a
        publish's whole budget (30 s)."""
        loop = asyncio.get_running_loop()
        deadline = None if grace is None else loop.time() + grace
        while running := [t for t in self._tasks if not t.done()]:
            # not `while self._tasks`: a done task leaves the set in a callback of its
            # own, and on Python 3.12 gathering done tasks returns without letting it
            # run, so that loop never ended
            left = None if deadline is None else deadline - loop.time()
            try:
                if left is not None and left <= 0:
                    self._waiting.clear()  # nothing more starts...
                    for t in running:  # ...and what runs is cut short
                        t.cancel()
                    await asyncio.wait(running)
                    continue
                await asyncio.wait(running, timeout=left)
            except asyncio.CancelledError:  # the stop was cancelled: so is the work (as gather did)
                for t in running:
                    t.cancel()
                raise


class _Turn:
    """`KeyedLimiter.turn`: a class, not an async generator, because every message of
    the starter and the projector takes one (a generator-based context manager costs a
    generator, its hooks and two extra frames a use). The lock of a key lives while
    some work holds or waits for it."""

    __slots__ = ("key", "lock", "turns")

    def __init__(self, turns: dict[str, tuple[asyncio.Lock, int]], key: str) -> None:
        self.turns = turns
        self.key = key
        lock, users = turns.get(key) or (asyncio.Lock(), 0)
        turns[key] = (lock, users + 1)
        self.lock = lock

    async def __aenter__(self) -> None:
        try:
            await self.lock.acquire()
        except BaseException:  # cancelled while waiting: no longer a user of the key
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.lock.release()
        self._leave()

    def _leave(self) -> None:
        lock, users = self.turns[self.key]
        if users == 1:
            del self.turns[self.key]
        else:
            self.turns[self.key] = (lock, users - 1)
