"""What a tool printed, kept bounded: the first `cap` bytes, the last `TAIL`, and the
count of every byte (`Captured`), handed from an executor to the runner in an
`OutputBox`.

A python worker's stdout and stderr (file descriptors 1 and 2, so its subprocesses'
output too) are one unlinked temporary file opened for appending (`capture_file`): the
worker reads it (up to the cap, and the tail) and empties it after each call, and sends
it with its reply; the pool reads it itself when the call timed out or crashed and the
worker was killed. Nothing a tool prints reaches a pod's or the CLI's own stdout.

While a step runs, what it printed so far is also published in parts (`LiveOutput`):
nothing for a step that ends within `LIVE_AFTER`, then a part about every `LIVE_EVERY`
seconds (sooner when `PART_MAX` bytes wait), never more than the cap in all. A shell
step feeds it as its pipes are read; a python step's pool gives it a `source` that
reads the worker's capture file from the parent, no frame of the worker protocol.

Parts are masked one by one, so a part ends only where no credential value (nor a
URL's userinfo) can straddle it: `safe` (the redactor's `safe_cut`) holds back the
last bytes that could be the start of a value until more is printed or the step
ends, and the rest is sent from the final text as stored (masked as a whole, a value
cut by the cap masked too). The parts joined are then exactly the final text.

The number of parts is bounded by time too: after `n` parts the next waits at least
`n / STRETCH` seconds, so a step printing a dot every half second sends about
`sqrt(2 * STRETCH * seconds)` parts: about 1,200 in its first hour, 5,900 in a day.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = [
    "LIVE_AFTER",
    "LIVE_EVERY",
    "PART_MAX",
    "STRETCH",
    "TAIL",
    "Captured",
    "LiveOutput",
    "OutputBox",
    "capture_file",
    "captured_bytes",
    "read_capture",
]

log = logging.getLogger(__name__)

TAIL = 4096  # bytes of the end kept apart, for when the whole text is over the cap
# a step that ends within LIVE_AFTER seconds publishes no part (its `step.output` is all
# there is: a quick step costs nothing more); after that, a part every LIVE_EVERY seconds
# while it prints, or as soon as PART_MAX bytes wait (a part is one message)
LIVE_AFTER = 0.5
LIVE_EVERY = 0.5
PART_MAX = 64 * 1024
STRETCH = 200.0  # after n parts the next one waits n / STRETCH seconds at least


@dataclass(frozen=True, slots=True)
class Captured:
    size: int  # every byte printed
    kept: bytes  # the first min(size, cap) bytes
    tail: bytes  # the last TAIL bytes (the end of `kept` when all of it was kept)


class OutputBox:
    """Where an executor leaves what its tool printed (None: it captured nothing), and
    where it feeds it while the tool runs (`live`, None: not published live)."""

    __slots__ = ("cap", "captured", "live")

    def __init__(self, cap: int, live: LiveOutput | None = None) -> None:
        self.cap = cap  # bytes kept at most (`Layout.step_output_max_bytes`)
        self.captured: Captured | None = None
        self.live = live


# sends part `n` at stored offset `offset`: its bytes as printed (`masked` False) or as
# stored already (True, the rest from the final text); what was stored (masked), None
# when it could not be stored (no later part is sent then: parts have no gaps)
SendPart = Callable[[int, int, bytes, bool], Awaitable[bytes | None]]
# reads up to `n` bytes printed from offset `offset` on (a python worker's capture file)
Source = Callable[[int, int], bytes]
# the largest cut <= n of the text printed and not sent yet at which a part may end
# (`final`: nothing more will be printed); the redactor's `safe_cut`
Safe = Callable[[bytes, int, bool], int]


def _anywhere(buf: bytes, n: int, final: bool) -> int:
    return n


class LiveOutput:
    """What one run of a step prints, published in parts while it runs (see the module
    docstring). `feed` gives it bytes as they are read, or `follow` a `source` it reads
    itself at each tick; `finish` sends the rest once the step ended, if it published
    anything, and says how many parts there are; `close` stops it whatever happened."""

    __slots__ = (
        "_closing",
        "_digest",
        "_task",
        "_timer",
        "_wake",
        "buf",
        "cap",
        "every",
        "failed",
        "part_max",
        "parts",
        "safe",
        "send",
        "sent",
        "shown",
        "source",
    )

    def __init__(
        self,
        cap: int,
        send: SendPart,
        *,
        after: float = LIVE_AFTER,
        every: float = LIVE_EVERY,
        part_max: int = PART_MAX,
        safe: Safe = _anywhere,
    ) -> None:
        self.cap = cap
        self.send = send
        self.safe = safe
        self.every = every
        self.part_max = max(1, part_max)
        self.buf = bytearray()  # read and not sent yet
        self.sent = 0  # bytes as printed that went out in parts
        self.shown = 0  # the same, as stored (masked): where the rest of the final text starts
        self._digest = hashlib.sha256()  # of what the parts stored: is it the final text's start?
        self.parts = 0
        self.failed = False
        self.source: Source | None = None
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        # one timer per run, nothing else until it fires (most steps end before)
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(after, self._due)

    def feed(self, data: bytes) -> None:
        room = self.cap - self.sent - len(self.buf)
        if room > 0 and data:
            self.buf += data[:room]
            if self._wake is not None and len(self.buf) >= self.part_max:
                self._wake.set()

    def follow(self, source: Source | None) -> None:
        """Read what is printed from `source` at each tick (None: stop reading)."""
        self.source = source

    def _pull(self) -> None:
        source = self.source
        want = min(self.cap - self.sent - len(self.buf), 4 * self.part_max)
        if source is None or want <= 0:
            return
        try:
            self.buf += source(self.sent + len(self.buf), want)
        except OSError:
            pass

    def _due(self) -> None:
        self._timer = None
        if not self._closing:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        wake = self._wake
        assert wake is not None
        while not self.failed:
            self._pull()
            while self.buf and not self.failed:
                n = self._next(final=False)
                if n == 0:
                    break
                await self._send(bytes(self.buf[:n]))
                if not self.failed:  # kept for `finish` to try again otherwise
                    del self.buf[:n]
            if self._closing:
                return
            wake.clear()
            with contextlib.suppress(TimeoutError):
                # stretched as parts add up: their number grows as the root of the time
                await asyncio.wait_for(wake.wait(), max(self.every, self.parts / STRETCH))
            if self._closing:
                return

    def _next(self, *, final: bool) -> int:
        """How many bytes of `buf` the next part takes: a line end or a whole UTF-8
        character (`_cut`) where no credential value straddles the cut (`safe`)."""
        buf = bytes(self.buf)
        n = min(len(buf), self.part_max)
        while n > 0:
            c = _cut(buf, n)
            m = self.safe(buf, c, final)
            if m == c:
                return c
            n = m
        # a run that could begin a URL's userinfo longer than a part (never a value:
        # `safe` holds back less than a part): a part as it comes
        return _cut(buf, self.part_max) if len(buf) >= self.part_max else 0

    async def _send(self, data: bytes, *, masked: bool = False, printed: int | None = None) -> None:
        stored = await self.send(self.parts, self.shown, data, masked)
        if stored is None:
            self.failed = True
            return
        self.parts += 1
        self.sent += len(data) if printed is None else printed
        self.shown += len(stored)
        self._digest.update(stored)

    async def finish(self, kept: bytes | None) -> tuple[int, int]:
        """The step ended; `kept`: its whole kept text as stored (masked; None: none was
        captured, what was read is the rest). The number of parts published, and how
        many bytes at the end of `kept` they do not hold (0: the parts are all of it)."""
        self.source = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is None:
            return 0, 0
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        try:
            await task
        except Exception:
            log.warning("live output: its sender failed", exc_info=True)
            self.failed = True
        if not self.parts:
            return 0, 0
        self.failed = False  # a part that could not be stored: try the rest once more
        if kept is None:
            while self.buf and not self.failed:
                n = self._next(final=True) or min(len(self.buf), self.part_max)
                await self._send(bytes(self.buf[:n]))
                if not self.failed:
                    del self.buf[:n]
            return self.parts, 0
        if hashlib.sha256(kept[: self.shown]).digest() != self._digest.digest():
            # the parts are not the final text's start (a value added to the redactor
            # while the step ran): readers show the whole final text after them
            log.warning("live output: its parts differ from the final text")
            return self.parts, len(kept)
        # the rest as the final text has it: masked as a whole (a value cut by the cap too)
        rest = bytearray(kept[self.shown :])
        while rest and not self.failed:
            n = _cut(rest, self.part_max) or min(len(rest), self.part_max)
            await self._send(bytes(rest[:n]), masked=True, printed=0)
            del rest[:n]
        return self.parts, len(kept) - self.shown

    def close(self) -> None:
        """Stop at once (the run was cancelled, or `finish` was never reached)."""
        self.source = None
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()


def _cut(buf: bytes | bytearray, limit: int) -> int:
    """How many bytes of `buf` the next part takes: up to the last line end within
    `limit`, else as many as fit without splitting a UTF-8 character."""
    n = min(len(buf), limit)
    nl = buf.rfind(b"\n", 0, n)
    if nl >= 0:
        return nl + 1
    i = n
    while i > 0 and n - i < 4 and buf[i - 1] & 0xC0 == 0x80:  # continuation bytes at the end
        i -= 1
    if i > 0 and n - i < 4 and buf[i - 1] >= 0xC0:  # a lead byte: is its character whole?
        need = 2 if buf[i - 1] < 0xE0 else 3 if buf[i - 1] < 0xF0 else 4
        if n - (i - 1) < need:
            return i - 1
    return n


def captured_bytes(*parts: bytes, cap: int) -> Captured:
    """`parts` printed one after the other (a shell command's stdout, then its stderr)."""
    data = b"".join(parts)
    return Captured(size=len(data), kept=data[:cap], tail=data[-TAIL:])


def capture_file() -> int:
    """A file descriptor for a worker's stdout and stderr: an unlinked temporary file
    in append mode (both descriptors of the worker share one offset: the end)."""
    fd, path = tempfile.mkstemp(prefix="actors-out-")
    os.unlink(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


def read_capture(fd: int, cap: int) -> Captured:
    """What the file holds now, bounded by `cap` (plus the tail)."""
    size = os.fstat(fd).st_size
    kept = _pread(fd, min(size, cap), 0)
    tail = kept[-TAIL:] if size <= cap else _pread(fd, TAIL, max(size - TAIL, 0))
    return Captured(size=size, kept=kept, tail=tail)


def _pread(fd: int, n: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)
