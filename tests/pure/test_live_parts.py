"""actors/tools/capture.py `LiveOutput`, pure asyncio (no server): what readers of a
step's live output rely on. Joined, the parts a step published are its final text as
stored, masked as a whole; a part that could not be stored is tried again at the end,
and what the parts still miss is counted (`rest`), never silently lost; the wait
between parts stretches as they add up."""

from __future__ import annotations

import asyncio

import pytest

from actors.tools.capture import STRETCH, LiveOutput
from actors.tools.redact import Redactor

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]

SECRET = "sekrit-Vb7-value"


def _redactor() -> Redactor:
    r = Redactor()
    r.add([SECRET])
    return r


class Parts:
    """A `SendPart` that keeps what it stored; `down`: part numbers whose sending fails."""

    def __init__(self, r: Redactor, down: set[int] | None = None) -> None:
        self.r = r
        self.down = down or set()
        self.stored: list[bytes] = []
        self.calls = 0
        self.came = asyncio.Event()

    async def __call__(self, part: int, offset: int, data: bytes, masked: bool) -> bytes | None:
        self.calls += 1
        self.came.set()
        if self.calls in self.down:
            return None
        assert part == len(self.stored) and offset == sum(map(len, self.stored))
        out = data if masked else self.r.data(data)
        self.stored.append(out)
        return out


async def test_a_value_printed_across_ticks_is_in_no_part_and_the_parts_are_the_final_text() -> None:
    r = _redactor()
    parts = Parts(r)
    live = LiveOutput(1000, parts, after=0.0, every=0.01, safe=r.safe_cut)
    printed = [b"start\n", SECRET[:7].encode(), SECRET[7:].encode() + b" end\nhttp://u:", b"pw@host after\n"]
    for chunk in printed:
        parts.came.clear()
        live.feed(chunk)
        if chunk == printed[1]:  # the value's start: held back, ticks come and go
            await asyncio.sleep(0.05)
            assert not parts.came.is_set()
        else:
            await asyncio.wait_for(parts.came.wait(), 5)
    kept = r.data(b"".join(printed))
    assert await live.finish(kept) == (len(parts.stored), 0)
    assert b"".join(parts.stored) == kept == b"start\n*** end\nhttp://***@host after\n"
    for part in parts.stored:
        assert SECRET[:4].encode() not in part and b"u:pw" not in part


async def test_a_part_that_could_not_be_stored_is_tried_again_and_what_is_missed_is_counted() -> None:
    r = _redactor()
    for down, rest in (({2}, 0), ({2, 3}, 10)):
        parts = Parts(r, down)
        live = LiveOutput(1000, parts, after=0.0, every=0.01, safe=r.safe_cut)
        for chunk in (b"one\n", b"two\n"):
            parts.came.clear()
            live.feed(chunk)
            await asyncio.wait_for(parts.came.wait(), 5)
        live.feed(b"three\n")
        kept = b"one\ntwo\nthree\n"
        n, missed = await live.finish(kept)
        # once failed, the rest waits for the end; it goes out then, or is counted
        assert (n, missed) == (len(parts.stored), rest)
        assert b"".join(parts.stored) + kept[len(kept) - missed :] == kept


async def test_the_wait_between_parts_stretches_as_parts_add_up() -> None:
    parts = Parts(Redactor())
    live = LiveOutput(10**6, parts, after=0.0, every=0.0)
    live.parts = int(STRETCH)  # as if 200 parts went out: the next waits a second
    live.feed(b"x\n")
    await asyncio.wait_for(parts.came.wait(), 5)
    live.feed(b"y\n")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(_second(parts)), 0.3)
    live.close()


async def _second(parts: Parts) -> None:
    while len(parts.stored) < 2:
        parts.came.clear()
        await parts.came.wait()


async def test_the_rest_sent_at_the_end_splits_no_utf8_character() -> None:
    parts = Parts(Redactor())
    live = LiveOutput(1000, parts, after=0.0, every=0.01, part_max=5)
    live.feed(b"ab\n")
    await asyncio.wait_for(parts.came.wait(), 5)
    kept = "ab\n" + "é" * 6  # 12 bytes after the first part, in parts of at most 5
    assert await live.finish(kept.encode()) == (len(parts.stored), 0)
    assert [p.decode() for p in parts.stored] == ["ab\n", "éé", "éé", "éé"]
