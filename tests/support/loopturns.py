"""How much work a function did in each turn of the event loop: a test wraps the function
that does a pod's per-row work and asserts no turn did more than a chunk of it (the loop
ran between chunks, serving every other step)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any


class LoopTurns:
    def __init__(self) -> None:
        self.turn = 0
        self.work: dict[int, int] = {}  # turn -> units of work done in it

    def counting(self, fn: Callable[..., Any], units: Callable[..., int] = lambda *a, **k: 1) -> Callable[..., Any]:
        """`fn`, counting `units(*args)` of work in the turn it is called in."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.work[self.turn] = self.work.get(self.turn, 0) + units(*args, **kwargs)
            return fn(*args, **kwargs)

        return counted

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.turn += 1


@contextlib.asynccontextmanager
async def loop_turns() -> AsyncIterator[LoopTurns]:
    """A LoopTurns whose turns are counted (a task yielding at every turn) while inside."""
    turns = LoopTurns()
    ticker = asyncio.ensure_future(turns._tick())
    try:
        yield turns
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
