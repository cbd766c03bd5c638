"""Which steps of an execution run now, and how far their loops are: for `actors-cli
status` (a snapshot) and `status --watch` (followed until the end).

Which steps run comes from the execution's log (its `step.enter` and `step.exit`
events, a loop's `iterator.started` with its size); a loop's done, failed and in-flight
counts from the counter's progress messages (core NATS `progress.<id>`, a few a second
while the loop moves, never stored: a loop whose iterations all wait says nothing, and
its counts are then unknown). Never the execution's state: that is the status record's
alone (`Client.status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.client.checks import check_execution_id
from actors.client.logview import LogItem
from actors.wire.events import TERMINAL_EVENTS, EventType
from actors.wire.messages import LoopProgress
from streams.layout import LC, progress_subject

__all__ = ["LoopCounts", "Progress", "RunningStep", "StepWait", "follow_running", "running_now"]

SNAPSHOT_WAIT = 1.0  # seconds `running_now` listens for its loops' progress (the counter sends 4 a second)
_progress = msgspec.json.Decoder(LoopProgress)
_VERDICTS = ("iterator.completed", "iterator.failed")


@dataclass(slots=True)
class LoopCounts:
    """A running loop's counts: `total` from its log, the rest from its last progress
    message (None: none heard); `rate`: iterations a second since first heard."""

    loop_id: str
    total: int | None
    done: int | None = None
    failed: int | None = None
    in_flight: int | None = None
    rate: float | None = None
    waiting: int | None = None  # a loop of waits: iterations waiting for their signal (not done)

    def to_dict(self) -> dict[str, Any]:
        return {
            "loop_id": self.loop_id,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "in_flight": self.in_flight,
            "rate": None if self.rate is None else round(self.rate, 1),
            "waiting": self.waiting,
        }


@dataclass(slots=True)
class StepWait:
    """What a running wait step (`tool: wait`) waits for, from its `step.waiting`:
    `signal` None is a timer to a date; `deadline` None waits for ever."""

    signal: str | None
    key: str
    since: float
    deadline: float | None = None
    approval: bool = False
    loop: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "key": self.key,
            "since": self.since,
            "deadline": self.deadline,
            "approval": self.approval,
            "loop": self.loop,
        }


@dataclass(slots=True)
class RunningStep:
    step: str
    since: float  # when it was entered (Unix time)
    loop: LoopCounts | None = None
    wait: StepWait | None = None  # a wait step waiting (None: not waiting)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "since": self.since,
            "loop": None if self.loop is None else self.loop.to_dict(),
            "wait": None if self.wait is None else self.wait.to_dict(),
        }


@dataclass
class Progress:
    """What the log and the progress messages said so far (fed in order)."""

    entered: dict[str, list[float]] = field(default_factory=dict)  # step -> when each visit running began
    loops: dict[str, tuple[str, int]] = field(default_factory=dict)  # step -> (loop id, size) of its running loop
    heard: dict[str, LoopProgress] = field(default_factory=dict)  # loop id -> its last progress
    first: dict[str, tuple[float, int]] = field(default_factory=dict)  # loop id -> (at, done) first heard
    waits: dict[str, StepWait] = field(default_factory=dict)  # step -> what it waits for now
    ended: bool = False

    def item(self, it: LogItem) -> bool:
        """Take one log item; True when what runs changed."""
        if it.cls == LC and it.type in TERMINAL_EVENTS:
            self.ended = True
            return True
        if it.step is None or it.cls not in ("ev", "in"):
            return False
        if it.type == EventType.STEP_ENTER and it.cls == "ev":
            self.entered.setdefault(it.step, []).append(it.at)
        elif it.type == EventType.STEP_EXIT and it.cls == "ev":
            visits = self.entered.get(it.step)
            if visits:
                visits.pop(0)
                if not visits:
                    del self.entered[it.step]
                    self.loops.pop(it.step, None)
            self.waits.pop(it.step, None)
        elif it.type == "step.waiting" and it.cls == "ev":
            d = it.data
            self.waits[it.step] = StepWait(
                signal=d.get("signal"),
                key=str(d.get("key") or ""),
                since=it.at,
                deadline=d.get("deadline"),
                approval=bool(d.get("approval")),
                loop=bool(d.get("loop_id")),
            )
        elif it.type in ("signal.received", "wait.ended") and it.cls == "ev":
            if self.waits.pop(it.step, None) is None:
                return False
        elif it.type == EventType.ITERATOR_STARTED:
            self.loops[it.step] = (str(it.data.get("loop_id")), int(it.data.get("size", 0) or 0))
        elif it.type in _VERDICTS:
            loop = self.loops.get(it.step)
            if loop is not None and loop[0] == str(it.data.get("loop_id")):
                del self.loops[it.step]
        else:
            return False
        return True

    def progress(self, p: LoopProgress) -> None:
        self.heard[p.loop_id] = p
        self.first.setdefault(p.loop_id, (p.at, p.done))

    def running(self) -> list[RunningStep]:
        """The steps running now, first entered first."""
        shown = []
        for step, visits in sorted(self.entered.items(), key=lambda kv: kv[1][0]):
            counts = None
            if step in self.loops:
                loop_id, size = self.loops[step]
                counts = LoopCounts(loop_id, size)
                p = self.heard.get(loop_id)
                if p is not None:
                    counts.total, counts.done, counts.failed, counts.in_flight = p.total, p.done, p.failed, p.in_flight
                    counts.waiting = p.waiting
                    at, done = self.first[loop_id]
                    counts.rate = (p.done - done) / (p.at - at) if p.at > at else None
            shown.append(RunningStep(step, visits[0], counts, self.waits.get(step)))
        return shown


@contextlib.asynccontextmanager
async def _heard(client: Any, execution_id: str, state: Progress, changed: asyncio.Event) -> AsyncIterator[None]:
    async def arrived(msg: Any) -> None:
        try:
            state.progress(_progress.decode(msg.data))
        except msgspec.DecodeError:
            return
        changed.set()

    sub = await client.nc.subscribe(progress_subject(check_execution_id(execution_id)), cb=arrived)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def running_now(client: Any, execution_id: str, *, wait: float = SNAPSHOT_WAIT) -> list[RunningStep]:
    """The steps running now; for a running loop, its counts if its counter says them
    within `wait` seconds (two messages, for a rate)."""
    state, changed = Progress(), asyncio.Event()
    async with _heard(client, execution_id, state, changed):  # listening before the log is read: nothing missed
        for it in await client.events(execution_id):
            state.item(it)
        loops = {loop_id for loop_id, _ in state.loops.values()}
        deadline = time.monotonic() + wait
        while loops and not state.ended:
            counts = [state.heard.get(lid) for lid in loops]
            rated = all(p is not None and state.first[p.loop_id][0] < p.at for p in counts)
            left = deadline - time.monotonic()
            if rated or left <= 0:
                break
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
    return [] if state.ended else state.running()


async def follow_running(client: Any, execution_id: str) -> AsyncIterator[list[RunningStep]]:
    """The steps running, each time that changes (a step entered or left, a loop's
    progress), from now until the execution's log ends."""
    state, changed = Progress(), asyncio.Event()
    async with _heard(client, execution_id, state, changed):
        log: asyncio.Queue[LogItem | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for it in client.follow(execution_id):
                    log.put_nowait(it)
            finally:
                log.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                got = asyncio.ensure_future(log.get())
                heard = asyncio.ensure_future(changed.wait())
                await asyncio.wait({got, heard}, return_when=asyncio.FIRST_COMPLETED)
                heard.cancel()
                moved = changed.is_set()
                changed.clear()
                if not got.done():
                    got.cancel()
                else:
                    item = got.result()
                    if item is None:
                        return
                    moved = state.item(item) or moved
                    while not log.empty():  # a backlog (the log read from its start) is one change
                        item = log.get_nowait()
                        if item is None:
                            yield state.running()
                            return
                        moved = state.item(item) or moved
                if state.ended:
                    yield []
                    return
                if moved:
                    yield state.running()
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
