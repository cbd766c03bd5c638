"""The executions page's rows: one page of executions, newest first, filtered, and the
cursor of the next page.

Read like `Client.list` (actors/client/listing.py): stream INDEX backwards (ENDED for a
terminal state), a window at a time, statuses read only for the entries a page shows.
A page ends at a stream sequence; `before` (that sequence) starts the next one there,
so "more" never reads what the page before it read, and a page costs the same at 100
or 10,000 executions in the bucket. `q` keeps ids that contain it (case-insensitive).
A record that cannot be read is left out, with a warning naming where it is
(actors/store/records.py): one bad record never fails the page.
"""

from __future__ import annotations

from typing import Any

import msgspec
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.client.listing import ARCHIVE_SCAN
from actors.natsio.batchget import from_sequence
from actors.store.records import ended_statuses, index_entries
from actors.wire.events import TERMINAL_STATES
from actors.wire.messages import ExecutionStatus
from streams.layout import ENDED_STREAM, INDEX_STREAM
from streams.subjects import index_ends

ARCHIVED = "archived:"  # a cursor into the archive: `archived:<entries the pages before read>`
FIRST_WINDOW = 64  # index entries read in the first request (at least twice the limit), doubled while too few match
MAX_LIMIT = 500  # rows one page may ask for
ERROR_SUMMARY = 300  # characters of an error's message a row carries


def row_of(st: ExecutionStatus) -> dict[str, Any]:
    """An execution as the list shows it: its status value as KV `status` holds it (the
    wire's field names, every field written out), its error's message cut short."""
    return {
        "execution_id": st.execution_id,
        "state": str(st.state),
        "playbook": st.playbook,
        "version": st.version,
        "started_at": st.started_at,
        "ended_at": st.ended_at,
        "terminal_event": st.terminal_event,
        "error": error_cut(st.error),
        # a RUNNING execution's waits (`tool: wait`): step, signal, key, since, deadline, approval
        "waiting": None if st.waiting is None else [msgspec.to_builtins(w) for w in st.waiting],
        "waiting_cause": st.waiting_cause,  # which decision said so (the projector's order of waits)
    }


def error_cut(error: dict[str, Any] | None) -> dict[str, Any] | None:
    """The status's error with its message cut to ERROR_SUMMARY characters: a page of
    rows stays small however long an exception's message was (the execution's page has
    it whole)."""
    if not error:
        return None
    message = str(error.get("message") or "")
    if len(message) > ERROR_SUMMARY:
        error = {**error, "message": message[:ERROR_SUMMARY] + "…"}
    return error


def matches(row: dict[str, Any], *, state: str | None, playbook: str | None, q: str | None) -> bool:
    """Whether a row passes the page's filters (the live feed uses it too)."""
    if state and row["state"] != state:
        return False
    if playbook and (row["playbook"] or "").strip("/") != playbook.strip("/"):
        return False
    return not q or q.lower() in row["execution_id"].lower()


async def page(
    client: Client,
    *,
    state: str | None = None,
    playbook: str | None = None,
    q: str | None = None,
    limit: int = 50,
    before: int | str | None = None,
) -> tuple[list[dict[str, Any]], int | str | None]:
    """Up to `limit` rows, newest first, stored before sequence `before` (None: the
    newest; `archived:<n>`: the archive's after its first n); and the cursor of the next
    page (None: no more). Once the live index runs out, pages go on into the archive."""
    if isinstance(before, str):
        return await _archived(
            client, state=state, playbook=playbook, q=q, limit=limit, skip=int(before[len(ARCHIVED) :])
        )
    rows, cursor = await _live(client, state=state, playbook=playbook, q=q, limit=limit, before=before)
    if cursor is not None or len(rows) >= limit:
        return rows, cursor
    more, further = await _archived(client, state=state, playbook=playbook, q=q, limit=limit - len(rows), skip=0)
    shown = {r["execution_id"] for r in rows}  # one retired while the page was read: shown once
    return rows + [r for r in more if r["execution_id"] not in shown], further


async def _archived(
    client: Client, *, state: str | None, playbook: str | None, q: str | None, limit: int, skip: int
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of archived executions (finished ones only), the latest archived first,
    after the first `skip` the archive lists."""
    rows: list[dict[str, Any]] = []
    if state is not None and state not in TERMINAL_STATES:
        return rows, None
    seen = 0
    async for st in client.archives.statuses():
        seen += 1
        if seen <= skip:
            continue
        if seen > skip + ARCHIVE_SCAN:
            return rows, f"{ARCHIVED}{seen - 1}"  # looked at enough for one page: "more" goes on
        row = row_of(client.codec.open_for_display(st))
        if matches(row, state=state, playbook=playbook, q=q):
            rows.append(row)
            if len(rows) == limit:
                return rows, f"{ARCHIVED}{seen}"
    return rows, None


async def _live(
    client: Client,
    *,
    state: str | None,
    playbook: str | None,
    q: str | None,
    limit: int,
    before: int | None,
) -> tuple[list[dict[str, Any]], int | None]:
    final = state in TERMINAL_STATES
    stream = ENDED_STREAM if final else INDEX_STREAM
    try:
        info = await client.nc.jsm().stream_info(stream)
    except NotFoundError:
        return [], None
    first = info.state.first_seq
    hi = info.state.last_seq if before is None else min(before - 1, info.state.last_seq)
    rows: list[dict[str, Any]] = []
    window = max(FIRST_WINDOW, 2 * limit)
    while info.state.messages and hi >= first:
        lo = max(first, hi - window + 1)
        next_hi = lo - 1
        subject = index_ends(state) if final and state else None
        got = list(reversed(await from_sequence(client.nc, stream, lo, hi - lo + 1, subject=subject, up_to=hi)))
        if final:
            shown = client.codec.open_for_display  # error messages may be encrypted (payload keys)
            candidates = [(seq, row_of(shown(st))) for seq, st in ended_statuses(got)]
        else:
            entries = index_entries(got)
            wanted = [
                (seq, e)
                for seq, e in entries
                if matches(
                    {"execution_id": e.execution_id, "playbook": e.playbook, "state": ""},
                    state=None,
                    playbook=playbook,
                    q=q,
                )
            ]
            if state is None and len(wanted) > limit - len(rows):
                # every one qualifies: read no more statuses than shown, and go on after the last read
                wanted = wanted[: limit - len(rows)]
                next_hi = wanted[-1][0] - 1
            statuses = {st.execution_id: st for st in await client.statuses([e.execution_id for _, e in wanted])}
            candidates = [(seq, row_of(statuses[e.execution_id])) for seq, e in wanted if e.execution_id in statuses]
        for seq, row in candidates:
            if matches(row, state=state, playbook=playbook, q=q):
                rows.append(row)
                if len(rows) == limit:
                    return rows, (seq if seq > first else None)
        hi, window = next_hi, window * 2
    return rows, None
