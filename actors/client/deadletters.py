"""`Client.dead_letter_page`: dead letters newest first, a page at a time, for the web
UI's dead-letters page (`dead_letters` reads them all, oldest first, as `actors-cli
deadletters` prints them).

A page is read backwards from the end of stream DLQ by sequence: one batched direct get
of at most `limit` messages (actors/natsio/batchget.py `window`), so the page costs the
same with 10 or 1,000,000 dead letters. The cursor is the lowest sequence read: the next
page is what was stored before it. Letters deleted in between (retention removes an
execution's letters with it) leave a page short; the reader goes on further back, up to
SCAN messages, before it answers with what it has and a cursor to continue from.
"""

from __future__ import annotations

from nats.js.errors import NotFoundError

from actors.client.logview import LogItem, dead_letter_items
from actors.client.session import Session
from actors.natsio.batchget import window
from streams.layout import DLQ_STREAM

MAX_PAGE = 500  # letters a page may ask for
SCAN = 5_000  # sequences looked at, at most, for one page (a stretch deleted by retention)


class DeadLetterReader(Session):
    async def dead_letter_page(self, *, limit: int = 50, before: int | None = None) -> tuple[list[LogItem], int | None]:
        """Up to `limit` dead letters stored before sequence `before` (None: the newest),
        newest first, and the cursor of the next page (None at the stream's start). Each
        item is what `dead_letters` gives (its data: `reason`, `source`, `execution_id`,
        `subject`, `data`); `seq` and `at` are the letter's sequence and log time."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, not {limit}")
        if before is not None and before < 1:
            raise ValueError(f"before must be a sequence (1 or more), not {before}")
        return await self._ride("reading dead letters", lambda: self._page(limit, before))

    async def _page(self, limit: int, before: int | None) -> tuple[list[LogItem], int | None]:
        try:
            state = (await self.nc.jsm().stream_info(DLQ_STREAM)).state
        except NotFoundError:
            return [], None
        if not state.messages:
            return [], None
        first, top = state.first_seq, state.last_seq
        if before is not None:
            top = min(top, before - 1)
        out: list[LogItem] = []
        low = top + 1  # the lowest sequence read so far
        while len(out) < limit and low > first and (top + 1 - low) < SCAN:
            high = low - 1
            low = max(first, high - (limit - len(out)) + 1)
            stored = await window(self.nc, DLQ_STREAM, low, high)
            for s in reversed(stored):
                out.extend(dead_letter_items(s.subject, s.data, s.seq, s.time))
        return out[:limit], (low if low > first else None)
