"""Records one role stores and every other reads: statuses (KV `status`, written by the
projector), the execution index (streams INDEX and ENDED, the projector too) and the
catalog (KV `catalog`: actors/store/catalog.py, `CatalogRecordInvalid`).

One malformed record (a writer's bug, a hand edit, tampering) must not break everybody's
commands. A listing skips it with a warning naming where it is (bucket and key, or
stream and sequence); the one record a command was asked about raises `RecordInvalid`,
one line naming its key (the CLI exits 3, the web UI answers 502, the starter refuses
or fails the start). Decode these records here, not with the bare decoders of
actors/wire/messages.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import msgspec

from actors.errors import UserError
from actors.wire.messages import ExecutionStatus, IndexEntry, index_decoder, status_decoder
from streams.layout import ENDED_STREAM, EXECUTION_ID, INDEX_STREAM, STATUS_BUCKET

log = logging.getLogger("actors.store.records")
T = TypeVar("T")


class RecordInvalid(UserError, ValueError):
    """A stored record that cannot be read. The message is one line naming where it is."""


def _why(e: Exception) -> str:
    return " ".join(str(e).split())[:200]


def _checked_id(execution_id: str, where: str) -> None:
    # an index entry's id becomes a KV key and a subject token: `*`, `>` or `.` would
    # address other executions (or make nats-py refuse the key with a traceback)
    if not EXECUTION_ID.fullmatch(execution_id):
        raise RecordInvalid(f"{where}: execution id {execution_id[:140]!r} is not one ({EXECUTION_ID.pattern})")


def status_record(data: bytes, *, key: str) -> ExecutionStatus:
    """The status stored under `key` in KV `status`; RecordInvalid when it is not one."""
    where = f"KV {STATUS_BUCKET!r} key {key!r}"
    try:
        return status_decoder.decode(data)
    except msgspec.DecodeError as e:  # ValidationError included: an unknown state, a field of the wrong type
        raise RecordInvalid(f"{where}: not a status record ({_why(e)})") from None


def index_entry(data: bytes, *, seq: int) -> IndexEntry:
    """An entry of stream INDEX; RecordInvalid when it is not one."""
    where = f"stream {INDEX_STREAM} message {seq}"
    try:
        entry = index_decoder.decode(data)
    except msgspec.DecodeError as e:
        raise RecordInvalid(f"{where}: not an index entry ({_why(e)})") from None
    _checked_id(entry.execution_id, where)
    return entry


def ended_status(data: bytes, *, seq: int) -> ExecutionStatus:
    """A final status in stream ENDED; RecordInvalid when it is not one."""
    where = f"stream {ENDED_STREAM} message {seq}"
    try:
        status = status_decoder.decode(data)
    except msgspec.DecodeError as e:
        raise RecordInvalid(f"{where}: not a status record ({_why(e)})") from None
    _checked_id(status.execution_id, where)
    return status


def skipped(e: RecordInvalid) -> None:
    """Say that a listing left a malformed record out (logger `actors.store.records`, which the
    CLI prints on stderr)."""
    log.warning("skipped a malformed record: %s", e)


def status_or_none(data: bytes, *, key: str) -> ExecutionStatus | None:
    """`status_record`, or None (warned) for a malformed one: for listings."""
    try:
        return status_record(data, key=key)
    except RecordInvalid as e:
        skipped(e)
        return None


def index_entries(got: list[tuple[int, bytes]]) -> list[tuple[int, IndexEntry]]:
    """(sequence, entry) of the INDEX messages `got`, each malformed one left out (warned)."""
    return _readable(got, index_entry)


def ended_statuses(got: list[tuple[int, bytes]]) -> list[tuple[int, ExecutionStatus]]:
    """(sequence, status) of the ENDED messages `got`, each malformed one left out (warned)."""
    return _readable(got, ended_status)


def _readable(got: list[tuple[int, bytes]], read: Callable[..., T]) -> list[tuple[int, T]]:
    out = []
    for seq, data in got:
        try:
            out.append((seq, read(data, seq=seq)))
        except RecordInvalid as e:
            skipped(e)
    return out
