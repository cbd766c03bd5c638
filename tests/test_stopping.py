"""A stop that cancels a task ends it even when the task swallowed the first cancel
(what Python 3.11's asyncio.wait_for can do inside nats-py's requests)."""

from __future__ import annotations

import asyncio

import pytest

from actors.stopping import cancel_and_wait

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_a_task_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # as wait_for does when its result came in the same turn
        await asyncio.sleep(3600)

    async def failing() -> None:
        raise RuntimeError("failed before the stop")

    task, failed = asyncio.create_task(stubborn()), asyncio.create_task(failing())
    await asyncio.sleep(0)
    await cancel_and_wait([task, None, failed])
    assert swallowed.is_set() and task.cancelled() and failed.done()
