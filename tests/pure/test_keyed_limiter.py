"""actors/runtime/keyed_limiter.py, pure asyncio (no server): what the starter and the projector
rely on. At most `limit` pieces of work run at once; work on one key runs one at a
time, in arrival order; a turn given up while waiting (cancelled) leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from actors.runtime.keyed_limiter import KeyedLimiter

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


async def test_work_on_one_key_runs_in_arrival_order_and_the_limit_holds() -> None:
    limiter = KeyedLimiter(limit=3, what="test")
    running, most, order = 0, 0, []
    started = {i: asyncio.Event() for i in range(12)}
    gates = {i: asyncio.Event() for i in range(12)}

    def work(i: int, key: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            order.append((key, i))
            started[i].set()
            await gates[i].wait()
            running -= 1

        return run

    for i in range(12):
        limiter.submit(work(i, f"k{i % 2}"), key=f"k{i % 2}")
    for i in range(12):
        await started[i].wait()  # once those before it on its key are done
        assert not any(k == f"k{i % 2}" and j > i for k, j in order)
        gates[i].set()
    await limiter.drain()
    assert most <= 2  # two keys: no more than one piece of work each at a time
    assert [j for k, j in order if k == "k0"] == list(range(0, 12, 2))
    assert [j for k, j in order if k == "k1"] == list(range(1, 12, 2))
    assert limiter._turns == {}


async def test_without_keys_the_limit_bounds_the_work_at_once() -> None:
    limiter = KeyedLimiter(limit=4, what="test")
    running, most, started = 0, 0, 0
    release, four = asyncio.Event(), asyncio.Event()

    async def run() -> None:
        nonlocal running, most, started
        running += 1
        started += 1
        most = max(most, running)
        if started == 4:
            four.set()
        await release.wait()
        running -= 1

    for _ in range(10):
        limiter.submit(run)
    await four.wait()
    await asyncio.sleep(0)  # one more turn of the loop: a fifth would have started by now
    assert running == 4 and started == 4
    release.set()
    await limiter.drain()
    assert most == 4 and running == 0


async def test_a_turn_cancelled_while_waiting_leaves_the_key_to_the_next() -> None:
    limiter = KeyedLimiter(limit=10, what="test")
    held = asyncio.Event()
    release = asyncio.Event()
    got: list[str] = []

    async def holder() -> None:
        async with limiter.turn("k"):
            held.set()
            await release.wait()
            got.append("holder")

    async def waiter(name: str) -> None:
        async with limiter.turn("k"):
            got.append(name)

    first = asyncio.create_task(holder())
    await held.wait()
    cancelled = asyncio.create_task(waiter("cancelled"))
    last = asyncio.create_task(waiter("last"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    release.set()
    await asyncio.gather(first, last)
    assert got == ["holder", "last"]
    assert limiter._turns == {}


async def test_a_cancelled_drain_cancels_the_work_it_waited_for() -> None:
    limiter = KeyedLimiter(limit=2, what="test")
    started, never = asyncio.Event(), asyncio.Event()
    cancelled: list[str] = []

    async def run() -> None:
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append("work")
            raise

    limiter.submit(run)
    await started.wait()
    drain = asyncio.create_task(limiter.drain())
    await asyncio.sleep(0)
    drain.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drain
    await asyncio.gather(*limiter._tasks, return_exceptions=True)
    assert cancelled == ["work"]


async def test_a_drain_with_a_grace_cuts_short_what_cannot_finish_and_starts_nothing_more() -> None:
    """An actor stopping while NATS is gone: its work under way can only end by failing
    (a publish waits out its whole budget), so after the grace it is cancelled, unacked,
    and what waits for a slot never starts; work that finishes within it is not touched."""
    limiter = KeyedLimiter(limit=2, what="test")
    hangs, quick_done = asyncio.Event(), asyncio.Event()
    ran: list[str] = []
    cancelled: list[str] = []

    async def stuck(name: str) -> None:
        ran.append(name)
        try:
            await hangs.wait()  # never set: a publish to a server that is gone
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def quick() -> None:
        ran.append("quick")
        quick_done.set()

    limiter.submit(lambda: stuck("a"), key="x")
    limiter.submit(quick, key="y")
    limiter.submit(lambda: stuck("b"), key="z")  # takes quick's slot once it is done
    limiter.submit(lambda: stuck("c"), key="w")  # waits for a slot: never gets one
    await quick_done.wait()
    await limiter.drain(grace=0.05)
    assert ran == ["a", "quick", "b"] and sorted(cancelled) == ["a", "b"]
    assert not [t for t in limiter._tasks if not t.done()]
