"""`Client.archive`: archive finished executions now, and remove them (what the
retention actor does once each one's retention is over, for those that ended before a
given age: `actors-cli archive`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.client.session import Session
from actors.natsio.batchget import from_sequence
from actors.store.archive import ArchiveStore
from actors.store.records import ended_statuses
from actors.store.retire import Retired, retire
from streams.layout import ENDED_STREAM

WINDOW = 256  # ENDED entries read at once


@dataclass(slots=True)
class ArchiveReport:
    """What `Client.archive` did."""

    archived: int = 0  # executions archived by this call (not those archived before)
    removed: int = 0  # executions removed
    messages: int = 0  # messages removed
    blobs: int = 0  # blobs removed
    kept: list[tuple[str, str]] = field(default_factory=list)  # (execution id, why) left in place


class Archiver(Session):
    """Archive and remove finished executions on demand."""

    async def archive(
        self,
        *,
        ended_before: float,
        to: ArchiveStore | None,
        remove: bool = True,
        limit: int | None = None,
        progress: Callable[[Retired], None] | None = None,
    ) -> ArchiveReport:
        """Archive to `to` (None: archive nothing) and, unless `remove` is False,
        remove every execution that ended before `ended_before` (a Unix time), the
        earliest ended first, at most `limit` of them. A running execution is never
        touched; one archived before is not archived again. `progress` hears of each."""
        report = ArchiveReport()
        info = await self._ride("reading stream ENDED", lambda: self.nc.jsm().stream_info(ENDED_STREAM))
        seq, last = info.state.first_seq, info.state.last_seq
        done_with = 0  # executions taken, whatever became of them
        while seq <= last and (limit is None or done_with < limit):
            got = await self._ride("reading stream ENDED", functools.partial(self._window, seq, last))
            if not got:
                break
            for _, st in ended_statuses(got):
                if (st.ended_at or 0.0) >= ended_before:
                    return report  # the projector appends ends as they come: the rest ended later
                if limit is not None and done_with >= limit:
                    return report
                done_with += 1
                eid = st.execution_id
                done = await self._ride(
                    f"archiving execution {eid}",
                    lambda: retire(self.nc, self.layout, eid, archive=to, remove=remove),  # noqa: B023
                )
                report.archived += done.archived
                if done.kept is None:
                    report.removed += 1
                elif remove:
                    report.kept.append((eid, done.kept))
                report.messages += done.messages
                report.blobs += done.blobs
                if progress is not None:
                    progress(done)
            seq = got[-1][0] + 1
        return report

    async def _window(self, seq: int, last: int) -> list[tuple[int, bytes]]:
        return await from_sequence(self.nc, ENDED_STREAM, seq, WINDOW, up_to=last)


__all__ = ["ArchiveReport", "Archiver"]
