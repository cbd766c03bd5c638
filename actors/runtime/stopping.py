"""Stopping tasks for sure.

On Python 3.11, `asyncio.wait_for` (nats-py's requests wait with it) can swallow a
cancellation that arrives in the same turn of the event loop as the result it waits
for (CPython gh-86296, fixed in 3.12): the cancelled task carries on, and a stop
that cancels once and awaits the task waits for ever. A pod's stop hung that way on
its lease loop (found by tests/integration/test_deadletters.py under load). `cancel_and_wait`
cancels again until every task has ended."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

RECANCEL_EVERY = 0.5  # seconds between cancels of a task that did not end


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any] | None]) -> None:
    """Cancel `tasks` (None skipped) and wait until each has ended; their outcomes are
    retrieved (a failure of a cancelled task is not an error of the stop)."""
    every = [t for t in tasks if t is not None]
    pending = {t for t in every if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_EVERY)
    for t in every:
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" at exit
