"""Timeout and cancel for tool work that runs on the event loop (sleep, shell, http):
the work is a task, stopped (its cleanup kills what it started) at the limit or the cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from actors.tools.failures import cancelled_failure, timeout_failure

__all__ = ["limited", "wait_quietly"]

T = TypeVar("T")


async def limited(coro: Coroutine[Any, Any, T], limit: float | None, cancel: asyncio.Event | None) -> T:
    """Run `coro` as a task bounded by `limit` seconds and `cancel`.

    On expiry or cancel the task is cancelled (its cleanup kills what it started) and
    awaited, then ToolFailure(Timeout / Cancelled) is raised.
    """
    if cancel is not None and cancel.is_set():
        coro.close()
        raise cancelled_failure()
    if limit is not None and limit <= 0:
        coro.close()
        raise timeout_failure(limit)
    loop = asyncio.get_running_loop()
    task = loop.create_task(coro)
    waiters: set[asyncio.Future[Any]] = {task}
    cancel_task: asyncio.Task[Any] | None = None
    if cancel is not None:
        cancel_task = loop.create_task(cancel.wait())
        waiters.add(cancel_task)
    try:
        try:
            await asyncio.wait(waiters, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cancel_task is not None:
                cancel_task.cancel()
    except asyncio.CancelledError:
        await _stop_task(task)
        raise
    if task.done():
        return task.result()
    await _stop_task(task)
    if cancel is not None and cancel.is_set():
        raise cancelled_failure()
    raise timeout_failure(limit)


async def _stop_task(task: asyncio.Task[Any]) -> None:
    task.cancel()
    try:
        await asyncio.shield(wait_quietly(task))
    except asyncio.CancelledError:
        # we are cancelled ourselves while cleaning up: let the cleanup finish anyway
        pass


async def wait_quietly(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except BaseException:
        pass
