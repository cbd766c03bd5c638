"""The steps running now in `actors-cli status` (a line each, a loop's done/total, failed
and rate) and `status --watch`, which redraws them in place on a terminal and prints
a line per change otherwise (at most one a second per step), until the execution ends.
What runs comes from actors/client/progress.py; the state only from the status record.

A watch with no --timeout waits for the end for ever, but not for NATS: once NATS has
been unreachable for the connection's own timeout (`Client.timeout`: 30 s by default),
it gives up (exit 5, its outcome unknown here), as every command does."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any, TextIO

from actors.cli.outage import unless_nats_gone
from actors.cli.waits import wait_text
from actors.client.progress import RunningStep, follow_running, running_now

__all__ = ["running_json", "running_lines", "snapshot", "watch_until_end"]


def running_lines(steps: list[RunningStep], now: float | None = None) -> list[str]:
    """`  step   12.3 s  150/2,000 done  3 failed  42 it/s  8 in flight`, a line per step."""
    now = time.time() if now is None else now
    lines = []
    for r in steps:
        line = f"  {r.step:20} {max(0.0, now - r.since):7.1f} s"
        if r.wait is not None:  # a wait step: what it waits for, until when
            line += "  " + wait_text(r.wait, step=False, since=False)
        loop = r.loop
        if loop is not None:
            total = "?" if loop.total is None else f"{loop.total:,}"
            done = "?" if loop.done is None else f"{loop.done:,}"
            line += f"  {done}/{total} done"
            if loop.failed:
                line += f"  {loop.failed:,} failed"
            if loop.rate is not None:
                line += f"  {loop.rate:,.0f} it/s"
            if loop.in_flight is not None:
                line += f"  {loop.in_flight:,} in flight"
            if loop.waiting:
                line += f"  {loop.waiting:,} waiting"
        lines.append(line)
    return lines


def running_json(steps: list[RunningStep]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in steps]


async def snapshot(client: Any, execution_id: str) -> list[RunningStep]:
    """The steps running now, with their loops' counts (`status` without --watch)."""
    return await running_now(client, execution_id)


class _Board:
    """The running steps on `out`: redrawn in place on a terminal, else a line per step
    whose text changed (each step at most once a second, its last state at the end)."""

    def __init__(self, out: TextIO, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.tty = out.isatty() and not as_json
        self.drawn = 0  # lines drawn in place
        self.shown: dict[str, tuple[str, float]] = {}  # step -> (what was printed, when)

    def show(self, steps: list[RunningStep], *, final: bool = False) -> None:
        if self.as_json:
            return  # one JSON object at the end (with `running`): what --json prints
        lines = running_lines(steps)
        if self.tty:
            self.erase()
            if lines and not final:
                self.out.write("\n".join(lines) + "\n")
                self.drawn = len(lines)
            self.out.flush()
            return
        now = time.monotonic()
        for r, line in zip(steps, lines, strict=True):
            text = line.split(" s", 1)[-1]  # what changed, not the clock
            before = self.shown.get(r.step)
            if before is not None and (before[0] == text or now - before[1] < 1.0):
                continue
            self.shown[r.step] = (text, now)
            self.out.write(line + "\n")
        self.out.flush()

    def erase(self) -> None:
        if self.tty and self.drawn:
            self.out.write("\x1b[1A\x1b[2K" * self.drawn)
            self.drawn = 0


async def watch_until_end(client: Any, execution_id: str, timeout: float | None, *, as_json: bool) -> Any:
    """Wait for the execution's terminal status (the status record: `Client.wait`),
    showing the steps that run meanwhile on stdout; TimeoutError past `timeout`."""
    board = _Board(sys.stdout, as_json)
    latest: list[RunningStep] = []

    async def draw() -> None:
        nonlocal latest
        async for steps in follow_running(client, execution_id):
            latest = steps
            board.show(steps)

    async def tick() -> None:  # a terminal's clocks move while nothing else does
        while board.tty:
            await asyncio.sleep(1.0)
            if latest:
                board.show(latest)

    drawing = [asyncio.ensure_future(draw()), asyncio.ensure_future(tick())]
    try:
        waiting = client.wait(execution_id, timeout=timeout)
        if timeout is not None:  # the --timeout given bounds the wait
            return await waiting
        return await unless_nats_gone(waiting, client, execution_id, "while watching it")
    finally:
        for task in drawing:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        board.erase()
        sys.stdout.flush()
