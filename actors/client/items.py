"""`Client.failed_items`: the iterations of an execution's loops that failed for good,
a page at a time, and how many there are.

The counter records each such iteration on a subject of its own beside the loop's log
(`loop.<p>.<id>.<loop>.fail.<index>`, actors/wire/messages.py `FailedItem`); an
iteration that succeeded leaves no record there. A page costs requests by the number of
the execution's loops, never by the number of failed items: the loops (one subject each,
`<loop>.in.spec`), then per loop its first record (its step) and how many follow it
(the server's `Nats-Num-Pending`: the total), then the page's records by batched direct
gets from the cursor on. The cursor is `LOOP:SEQ`: the loop and the stream sequence of
the page's last record, so a page far down does not read the ones before it. Items are
in loop order, then in the order they failed.

A redrive (`failed_keys`) reads every index of the loops it redrives once, from the
stream's subjects, page after page (actors/natsio/subjectlist.py): never cut short.
"""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.client.checks import check_execution_id
from actors.client.reading import Reader
from actors.errors import UserError
from actors.natsio.batchget import Stored, next_on_subject
from actors.natsio.subjectlist import stream_subjects
from actors.wire.messages import FailedItem
from streams.layout import LOOP_STREAM
from streams.subjects import failed_item_of, failed_items_filter, loop_key, partition_of

__all__ = ["MAX_PAGE", "FailedItemView", "FailedItems", "FailedItemsPage", "InvalidCursor"]

MAX_PAGE = 1000  # items one page may hold
PROBES = 32  # loops probed at once (one small direct get each)
_decoder = msgspec.json.Decoder(FailedItem)
# a page's cursor: `<loop id>:<stream sequence>` (ASCII digits only: `str.isdigit` takes `²`)
_CURSOR = re.compile(r"([0-9]{1,18}-[0-9]{1,18}):([0-9]{1,19})")


class InvalidCursor(UserError, ValueError):
    """`after` names no position of the listing (a page's `next_after`: `LOOP:SEQ`)."""


@dataclass(frozen=True, slots=True)
class FailedItemView:
    """One failed iteration: its loop and step, index, attempts made, error and element
    (whole when its JSON is short, else `element_head`: the head of that JSON)."""

    step: str
    loop_id: str
    index: int
    attempts: int
    error_type: str
    message: str
    traceback: str | None
    element: Any
    element_head: str | None
    at: float
    seq: int = 0  # where its record is stored in the loop stream (a page's cursor)

    @property
    def cursor(self) -> str:
        """Where a page that ends with this item ends (`after=` for the next one)."""
        return f"{self.loop_id}:{self.seq}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "loop_id": self.loop_id,
            "index": self.index,
            "attempts": self.attempts,
            "error": {"type": self.error_type, "message": self.message, "traceback": self.traceback},
            "at": self.at,
        }
        if self.element_head is not None:
            out["element_head"] = self.element_head
        else:
            out["element"] = self.element
        return out


@dataclass(frozen=True, slots=True)
class FailedItemsPage:
    """A page of failed iterations, in loop order then the order they failed. `total`: how many
    failed in all (of `step`'s loops, when one was named); `next_after`: pass it as
    `after` for the next page, None on the last."""

    execution_id: str
    step: str | None
    total: int
    items: list[FailedItemView]
    next_after: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "step": self.step,
            "total": self.total,
            "items": [i.as_json() for i in self.items],
            "next_after": self.next_after,
        }


def _loop_order(loop_id: str) -> tuple[int, int]:
    """Loops in the order their steps started them (a loop id is `<activation>-<attempt>`)."""
    act, _, attempt = loop_id.partition("-")
    return (int(act), int(attempt)) if act.isdigit() and attempt.isdigit() else (1 << 62, 0)


class FailedItems(Reader):
    """`failed_items`, and what a redrive reads of them (`failed_keys`)."""

    async def failed_items(
        self,
        execution_id: str,
        step: str | None = None,
        *,
        after: str | None = None,
        limit: int = 50,
        loop_id: str | None = None,
    ) -> FailedItemsPage:
        """A page of the iterations of `execution_id`'s loops (only `step`'s when named,
        only loop `loop_id`'s when named) that failed for good, after the cursor `after`
        (a page's `next_after`), at most `limit` (1 to 1000)."""
        check_execution_id(execution_id)
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidCursor(f"limit must be 1 to {MAX_PAGE}, not {limit}")
        mark = _cursor(after)
        what = f"reading the failed items of execution {execution_id}"
        return await self._ride(
            what, functools.partial(self._failed_page, execution_id, step, loop_id, mark, after, limit)
        )

    async def _failed_page(
        self,
        execution_id: str,
        step: str | None,
        loop_id: str | None,
        mark: tuple[str, int] | None,
        after: str | None,
        limit: int,
    ) -> FailedItemsPage:
        loops = await self._failed_loops(execution_id, [loop_id] if loop_id is not None else None)
        if step is not None:
            loops = [(loop, first, count) for loop, first, count in loops if first.step == step]
        total = sum(count for _, _, count in loops)
        start, seq = 0, 1
        if mark is not None:
            names = [loop for loop, _, _ in loops]
            if mark[0] not in names:
                raise InvalidCursor(f"--after {after}: no loop {mark[0]} with failed items in this listing")
            start, seq = names.index(mark[0]), mark[1] + 1
        items: list[FailedItemView] = []
        more = False
        for n, (loop, _, _) in enumerate(loops[start:], start):
            if len(items) >= limit:
                more = True
                break
            filter_ = failed_items_filter(execution_id, self.layout.partitions, loop)
            got, pending = await next_on_subject(self.nc, LOOP_STREAM, filter_, seq, limit - len(items))
            seen = {i.index for i in items if i.loop_id == loop}
            for stored in got:
                view = self._failed_view(stored)
                if view is not None and view.index not in seen:  # a record written twice shows once
                    seen.add(view.index)
                    items.append(view)
            seq = 1
            if pending:
                more = True
                break
            more = n + 1 < len(loops)
        return FailedItemsPage(
            execution_id=execution_id,
            step=step,
            total=total,
            items=items,
            next_after=items[-1].cursor if more and items else None,
        )

    async def _failed_loops(
        self, execution_id: str, only: list[str] | None = None
    ) -> list[tuple[str, FailedItemView, int]]:
        """The execution's loops (or those named) that have failed items, in the order
        their steps started them: each with its first record (its step) and how many
        records it has. A request per loop, a few at once: none reads a failed item
        more than its first."""
        if only is None:
            prefix = f"loop.{partition_of(execution_id, self.layout.partitions)}.{execution_id}"
            specs = await stream_subjects(self.nc, LOOP_STREAM, f"{prefix}.*.in.spec")
            only = sorted({loop_key(subject)[1] for subject in specs}, key=_loop_order)
        gate = asyncio.Semaphore(PROBES)

        async def probe(loop: str) -> tuple[str, FailedItemView, int] | None:
            async with gate:
                filter_ = failed_items_filter(execution_id, self.layout.partitions, loop)
                got, pending = await next_on_subject(self.nc, LOOP_STREAM, filter_, 1, 1)
            first = self._failed_view(got[0]) if got else None
            return (loop, first, pending + 1) if first is not None else None

        found = await asyncio.gather(*(probe(loop) for loop in only))
        return [f for f in found if f is not None]

    async def failed_keys(self, execution_id: str, loops: list[str]) -> dict[str, list[int]]:
        """The failed iterations of each of these loops of the execution, by loop id:
        every one, from the stream's subjects (read page after page)."""
        keys: dict[str, list[int]] = {}
        for loop in loops:
            filter_ = failed_items_filter(execution_id, self.layout.partitions, loop)
            indices = {at[1] for s in await stream_subjects(self.nc, LOOP_STREAM, filter_) if (at := failed_item_of(s))}
            if indices:
                keys[loop] = sorted(indices)
        return keys

    def _failed_view(self, stored: Stored) -> FailedItemView | None:
        """A failed item's record as listed; None for one this code cannot read."""
        try:
            f = self.codec.decode(_decoder, stored.data)
        except msgspec.DecodeError:
            return None
        return FailedItemView(
            step=f.step,
            loop_id=f.loop_id,
            index=f.index,
            attempts=f.attempts,
            error_type=f.error.type,
            message=f.error.message,
            traceback=f.error.traceback,
            element=f.element,
            element_head=f.element_head,
            at=f.at,
            seq=stored.seq,
        )


def _cursor(after: str | int | None) -> tuple[str, int] | None:
    """(loop id, stream sequence) of a page's `next_after`; None for the first page."""
    if after is None or after == "":
        return None
    text = str(after)
    match = _CURSOR.fullmatch(text)
    if match is None:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise InvalidCursor(f"--after {shown!r}: not a page's next_after (LOOP:SEQ, as a page prints it)")
    return match.group(1), int(match.group(2))
