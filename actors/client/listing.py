"""The calls of a `Client` that list: executions, newest first (`list`), and the playbook
catalog (`playbooks`).

Executions are listed from stream INDEX, not from the status bucket: the projector
appends one entry per execution when it first records its status, so the newest
executions are the stream's last messages. `list` reads the stream backwards, a window
of entries at a time (each window twice as large as the one before), and reads the
status of only the executions it needs, so `list --limit 50` costs the same with 1,000 or
100,000 executions (bench/list.py). A window of entries is one batched direct
get (actors/natsio/batchget.py); its statuses are read at once.

A terminal `state` (COMPLETED, FAILED, CANCELLED) reads instead stream ENDED, the final
statuses the projector appends on `index.end.<state>.<id>`: the server picks them out
of each window, so `--state FAILED` reads only failed executions, the latest to end first
(then sorted by start). A `playbook` filter, or PENDING/RUNNING, reads further back
until it has `limit` of them or the stream's start; a `since` stops at the first entry
that started (or ended) before it.

A record that cannot be read (an index entry, a final status, a status, a catalog
entry) is left out with a warning naming where it is (actors/store/records.py): one bad
record never fails a listing.
"""

from __future__ import annotations

import asyncio
import builtins
import re

from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from actors.client.session import Session
from actors.natsio.batchget import from_sequence
from actors.natsio.kvkeys import kv_keys
from actors.store.catalog import decode_entry
from actors.store.records import RecordInvalid, ended_statuses, index_entries, skipped, status_or_none
from actors.wire.events import TERMINAL_STATES
from actors.wire.messages import CatalogEntry, ExecutionStatus
from streams.layout import CATALOG_BUCKET, ENDED_STREAM, EXECUTION_ID, INDEX_STREAM, STATUS_BUCKET
from streams.subjects import index_ends

FIRST_WINDOW = 64  # index entries read in the first window (at least twice the limit)
# archived executions a listing looks at, at most, once the live index ran out (a
# filter that few match would otherwise read the whole archive's metadata)
ARCHIVE_SCAN = 10_000
_VERSION_KEY = re.compile(r"^(?P<path>.+)\.v(?P<version>[0-9]+)$")


class Lister(Session):
    """Executions newest first, and the catalog."""

    async def list(
        self,
        *,
        state: str | None = None,
        playbook: str | None = None,
        since: float | None = None,
        limit: int = 50,
    ) -> builtins.list[ExecutionStatus]:
        """Up to `limit` executions, newest first: those in `state` (RUNNING, HALTED, COMPLETED,
        ...) running `playbook` (its catalog path) that started at or after `since`
        (seconds since the epoch). Each is its current status (the projector's);
        executions started before the index existed are not listed."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        return await self._ride("listing executions", lambda: self._list_once(state, playbook, since, limit))

    async def _list_once(
        self, state: str | None, playbook: str | None, since: float | None, limit: int
    ) -> builtins.list[ExecutionStatus]:
        found = await self._list_live(state, playbook, since, limit)
        if len(found) < limit and not found.older:
            # the live index ran out: executions retired since are read from the archive
            found += await self._list_archived(
                state, playbook, since, limit - len(found), {s.execution_id for s in found}
            )
        found.sort(key=lambda s: s.started_at or 0.0, reverse=True)  # the projectors' order is nearly theirs
        return found[:limit]

    async def _list_archived(
        self, state: str | None, playbook: str | None, since: float | None, limit: int, listed: set[str]
    ) -> builtins.list[ExecutionStatus]:
        """Archived executions, the latest archived first (about the latest ended first),
        until `limit` of them or one that ended before `since`."""
        if state is not None and state not in TERMINAL_STATES:
            return []  # only finished executions are archived
        found: builtins.list[ExecutionStatus] = []
        scanned = 0
        async for st in self.archives.statuses():
            scanned += 1
            if scanned > ARCHIVE_SCAN:
                break  # a filter few archived executions match: the latest ARCHIVE_SCAN are looked at
            if since is not None and st.ended_at is not None and st.ended_at < since:
                break
            if st.execution_id in listed or not _wanted(st.playbook, playbook):
                continue
            if (state is None or st.state == state) and (since is None or (st.started_at or 0.0) >= since):
                found.append(self.codec.open_for_display(st))
                if len(found) >= limit:
                    break
        return found

    async def _list_live(self, state: str | None, playbook: str | None, since: float | None, limit: int) -> _Found:
        """`list` over streams INDEX and ENDED (see the module's docstring)."""
        final = state in TERMINAL_STATES
        found = _Found()
        try:
            info = await self.nc.jsm().stream_info(ENDED_STREAM if final else INDEX_STREAM)
        except NotFoundError:
            return found
        first, hi = info.state.first_seq, info.state.last_seq
        window = max(FIRST_WINDOW, 2 * limit)
        while info.state.messages and hi >= first:
            lo = max(first, hi - window + 1)
            if final:  # the final statuses themselves: nothing more to read
                assert state is not None
                # the server picks them out; those past `hi` (fewer than `limit`: counted already) are dropped
                got = await from_sequence(self.nc, ENDED_STREAM, lo, window, subject=index_ends(state), up_to=hi)
                ends = [self.codec.open_for_display(st) for _, st in ended_statuses(got[::-1])]
                ends = [st for st in ends if _wanted(st.playbook, playbook)]
                # ended before `since`: started before it too, and so did those that ended earlier
                older = since is not None and any(st.ended_at is not None and st.ended_at < since for st in ends)
                found += [st for st in ends if since is None or (st.started_at or 0.0) >= since]
            else:
                got = await from_sequence(self.nc, INDEX_STREAM, lo, hi - lo + 1, up_to=hi)
                entries = [e for _, e in index_entries(got[::-1])]
                entries = [e for e in entries if _wanted(e.playbook, playbook)]
                older = since is not None and any(e.started_at is not None and e.started_at < since for e in entries)
                if since is not None:
                    entries = [e for e in entries if e.started_at is None or e.started_at >= since]
                if state is None:
                    entries = entries[: limit - len(found)]  # every one qualifies: read no more statuses than needed
                found += [
                    st
                    for st in await self._statuses([e.execution_id for e in entries])
                    if state is None or st.state == state
                ]
            if len(found) >= limit or older:
                found.older = older
                break
            hi, window = lo - 1, window * 2
        return found

    async def statuses(self, execution_ids: builtins.list[str]) -> builtins.list[ExecutionStatus]:
        """The statuses of these executions as `status` gives each, in their order, read at
        once. One with no status (yet), or an id that is not an execution id (from a
        record tampered with: it never reaches a KV key), is left out, so a list of ids
        read from stream INDEX never fails for one bad entry."""
        ids = [eid for eid in execution_ids if EXECUTION_ID.fullmatch(eid)]
        got = await self._ride(f"reading {len(ids)} statuses", lambda: self._statuses(ids))
        return [self.codec.open_for_display(st) for st in got]

    async def _statuses(self, execution_ids: builtins.list[str]) -> builtins.list[ExecutionStatus]:
        """The statuses of these executions, in their order, read at once; one the
        projector has not created yet (it writes the index entry first) is left out.
        (A batched get measured no faster than these gets: the cost is per message.)"""
        kv = await self.bucket(STATUS_BUCKET)
        got = await asyncio.gather(*(_status(kv, eid) for eid in execution_ids))
        return [st for st in got if st is not None]

    async def playbooks(self) -> builtins.list[CatalogEntry]:
        """Every registered version of every playbook, by path then version (the
        entries carry their source too)."""
        return await self._ride("reading the catalog", self._playbooks_once)

    async def _playbooks_once(self) -> builtins.list[CatalogEntry]:
        kv = await self.bucket(CATALOG_BUCKET)
        keys = [k for k in await kv_keys(self.js, CATALOG_BUCKET) if _VERSION_KEY.match(k)]
        values = await asyncio.gather(*(_value(kv, k) for k in keys))
        entries = [e for k, v in zip(keys, values, strict=True) if v is not None and (e := _entry_or_none(k, v))]
        return sorted(entries, key=lambda e: (e.path, e.version))


class _Found(builtins.list[ExecutionStatus]):
    """Statuses found, and whether the listing reached those before `since`."""

    older = False


def _wanted(runs: str | None, playbook: str | None) -> bool:
    return playbook is None or (runs or "").strip("/") == playbook.strip("/")


async def _value(kv: KeyValue, key: str) -> bytes | None:
    try:
        return (await kv.get(key)).value or b""
    except KeyNotFoundError:  # deleted: its marker keeps the subject
        return None


async def _status(kv: KeyValue, execution_id: str) -> ExecutionStatus | None:
    try:
        entry = await kv.get(execution_id)
    except KeyNotFoundError:
        return None
    return status_or_none(entry.value or b"", key=execution_id)


def _entry_or_none(key: str, data: bytes) -> CatalogEntry | None:
    """The catalog entry stored under `key`, or None (warned) when it is not one."""
    try:
        return decode_entry(data, key=key)
    except RecordInvalid as e:
        skipped(e)
        return None
