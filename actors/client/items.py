"""`Client.failed_items`: the iterations of an execution's loops that failed for good,
a page at a time, and how many there are.

The counter records each such iteration on a subject of its own beside the loop's log
(`loop.<p>.<id>.<loop>.fail.<index>`, actors/wire/messages.py `FailedItem`); an
iteration that succeeded leaves no record there. So a page costs two requests whatever
the loop's size: the stream's subjects under the execution's `fail.*` (one per failed
iteration, counted by the server: the total, and the order to page in), then the
page's records by one batched direct get of the last message of each subject.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js.errors import NotFoundError

from actors.client.checks import check_execution_id
from actors.client.reading import Reader
from actors.errors import UserError
from actors.natsio.batchget import _batch
from actors.wire.messages import FailedItem
from streams.layout import LOOP_STREAM
from streams.subjects import LoopSubjects, failed_item_of, failed_items_filter

__all__ = ["MAX_PAGE", "FailedItemView", "FailedItems", "FailedItemsPage", "InvalidCursor"]

MAX_PAGE = 1000  # items one page may hold (the server's limit on one batched get)
_decoder = msgspec.json.Decoder(FailedItem)


class InvalidCursor(UserError, ValueError):
    """`after` names no position of the listing (`LOOP:INDEX`, or an index for one loop)."""


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

    @property
    def cursor(self) -> str:
        """Where a page that ends with this item ends (`after=` for the next one)."""
        return f"{self.loop_id}:{self.index}"

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
    """A page of failed iterations, in loop order then index order. `total`: how many
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
        self, execution_id: str, step: str | None = None, *, after: str | int | None = None, limit: int = 50
    ) -> FailedItemsPage:
        """A page of the iterations of `execution_id`'s loops (only `step`'s when named)
        that failed for good, after the cursor `after` (a page's `next_after`; an
        iteration index when one loop has failures), at most `limit` (1 to 1000)."""
        check_execution_id(execution_id)
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidCursor(f"limit must be 1 to {MAX_PAGE}, not {limit}")
        what = f"reading the failed items of execution {execution_id}"
        return await self._ride(what, functools.partial(self._failed_page, execution_id, step, after, limit))

    async def _failed_page(
        self, execution_id: str, step: str | None, after: str | int | None, limit: int
    ) -> FailedItemsPage:
        keys = await self.failed_keys(execution_id, step)
        order = sorted(((_loop_order(loop), loop, i) for loop, indices in keys.items() for i in indices))
        start = _position(order, after, keys)
        page = order[start : start + limit]
        items = await self._failed_records(execution_id, [(loop, i) for _, loop, i in page])
        more = start + limit < len(order)
        return FailedItemsPage(
            execution_id=execution_id,
            step=step,
            total=len(order),
            items=items,
            next_after=items[-1].cursor if more and items else None,
        )

    async def failed_keys(self, execution_id: str, step: str | None = None) -> dict[str, list[int]]:
        """The failed iterations of each loop of the execution (of `step`'s loops when
        named), by loop id: from the stream's subjects alone."""
        filter_ = failed_items_filter(execution_id, self.layout.partitions)
        try:
            info = await self.nc.jsm().stream_info(LOOP_STREAM, subjects_filter=filter_)
        except NotFoundError:
            return {}
        keys: dict[str, list[int]] = {}
        for subject in info.state.subjects or {}:
            at = failed_item_of(subject)
            if at is not None:
                keys.setdefault(at[0], []).append(at[1])
        if step is not None:
            # the step a loop runs is in its records: one of each loop says
            firsts = await self._failed_records(execution_id, [(loop, min(ix)) for loop, ix in keys.items()])
            mine = {f.loop_id for f in firsts if f.step == step}
            keys = {loop: ix for loop, ix in keys.items() if loop in mine}
        return {loop: sorted(ix) for loop, ix in keys.items()}

    async def _failed_records(self, execution_id: str, wanted: list[tuple[str, int]]) -> list[FailedItemView]:
        """The records of these (loop, index), in that order, by one batched get."""
        if not wanted:
            return []
        subjects = [LoopSubjects.of(execution_id, loop, self.layout.partitions).failed(i) for loop, i in wanted]
        got: dict[str, FailedItemView] = {}
        for msg in await _batch(self.nc, LOOP_STREAM, {"multi_last": subjects, "batch": len(subjects)}):
            subject = (msg.headers or {}).get("Nats-Subject", "")
            try:
                f = self.codec.decode(_decoder, msg.data)
            except msgspec.DecodeError:
                continue  # not a record this code reads: left out of the page
            got[subject] = FailedItemView(
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
            )
        return [got[s] for s in subjects if s in got]


def _position(
    order: list[tuple[tuple[int, int], str, int]], after: str | int | None, keys: dict[str, list[int]]
) -> int:
    """Where the page after the cursor `after` starts in `order`."""
    if after is None or after == "":
        return 0
    text = str(after)
    loop, sep, index = text.rpartition(":")
    if not sep:
        if len(keys) > 1:
            raise InvalidCursor(
                f"--after {text}: items of {len(keys)} loops are listed; give LOOP:INDEX (a page's next_after) "
                "or name the step"
            )
        loop = next(iter(keys), "")
    if not index.lstrip("-").isdigit():
        raise InvalidCursor(f"--after {text!r}: an iteration index, or LOOP:INDEX as a page gives it")
    mark = (_loop_order(loop), loop, int(index))
    return sum(1 for key in order if key <= mark)
