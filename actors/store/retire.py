"""Retire a finished execution: archive its records (when the deployment archives) and
remove them from every stream and bucket. The retention actor (actors/retention/) does
it once an execution's retention is over; `actors-cli archive` does it on demand.

What an execution leaves, and where:

* its log, `exec.<p>.<id>.>` in EXEC, and its loops' logs, `loop.<p>.<id>.>` in LOOP
* its index entry (INDEX `index.start.<id>`) and final status (ENDED `index.end.*.<id>`)
* its status (KV `status`, key `<id>`)
* its blobs (buckets `blobs` and `payloads`): found by the keys its records name
* its dead letters (DLQ), archived with it and left to the stream's own age limit

The order makes a retirement safe to stop at any point and run again. The archive is
written first and never overwritten (a second run keeps what the first archived, whole).
Removal goes from what nothing else points to (blobs, the loops' logs, the log) to the
status last but one and the ENDED entry last, the retention actor's own work item. A
status that is not terminal stops everything: a running execution is never removed,
however old. A message that reaches a finished execution's log while it is archived
(a retry's note, days after its end) is removed with the rest, not archived: what
stays behind would be kept for ever, the streams having no age limit.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import (
    BadObjectMetaError,
    DigestMismatchError,
    KeyNotFoundError,
    NotFoundError,
    ObjectDeletedError,
    ObjectNotFoundError,
)

from actors.natsio.purge import purge
from actors.natsio.readall import count, read_all
from actors.store.archive import ARCHIVE_VERSION, ArchiveHeader, ArchiveStore, StoredMessage, encode_archive
from actors.store.blobs import blob_owner, remove_object
from actors.wire.events import TERMINAL_STATES
from actors.wire.messages import status_decoder
from streams.layout import (
    BLOB_BUCKET,
    DLQ_STREAM,
    ENDED_STREAM,
    EXEC_STREAM,
    EXECUTION_ID,
    INDEX_STREAM,
    LOOP_STREAM,
    PAYLOAD_BUCKET,
    STATUS_BUCKET,
    Layout,
    obj_stream,
)
from streams.subjects import dlq_filter, index_ends_of, index_subject, kv_key_subject, kv_stream, loop_logs_filter

log = logging.getLogger("actors.retention")
_DIGEST = re.compile(r"/[0-9a-f]{24}$")
_COMMAND_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}/command/")  # actors/store/blobs.py command_items


@dataclass(frozen=True, slots=True)
class Retired:
    """What a retirement did: `kept` says why nothing was removed (None: retired)."""

    execution_id: str
    archived: bool = False
    messages: int = 0  # messages removed
    blobs: int = 0  # blobs removed
    kept: str | None = None


async def retire(
    nc: NATS, layout: Layout, execution_id: str, *, archive: ArchiveStore | None, remove: bool = True
) -> Retired:
    """Archive (when `archive` is given) and remove one finished execution's records;
    a running one is kept, untouched. `remove=False`: archive only (`actors-cli archive
    --keep`). Raises what NATS raises (transient: call again) and what the archive
    raises (OSError for a directory that cannot be written)."""
    js = nc.jetstream()
    status_subject = kv_key_subject(STATUS_BUCKET, execution_id)
    status = _live(await read_all(nc, kv_stream(STATUS_BUCKET), status_subject))
    if status is not None:
        state = _state(status)
        if state not in TERMINAL_STATES:
            return Retired(execution_id, kept=f"its status is {state}, not terminal")
    log = await read_all(nc, EXEC_STREAM, layout.execution(execution_id).log)
    loops = await read_all(nc, LOOP_STREAM, loop_logs_filter(execution_id, layout.partitions))
    keys = sorted(set(_blob_keys(execution_id, (*log, *loops))))
    archived = False
    if archive is not None and not await archive.has(execution_id):
        records = [
            *log,
            *loops,
            *await read_all(nc, DLQ_STREAM, dlq_filter(execution_id=execution_id)),
            *await read_all(nc, INDEX_STREAM, index_subject(execution_id)),
            *await read_all(nc, ENDED_STREAM, index_ends_of(execution_id)),
        ]
        stored = [_stored(m) for m in records]
        if status is not None:
            stored.append(_stored(status))
        objects = [(bucket, key, data) for key in keys for bucket, data in [await _object(js, key)] if data is not None]
        header = ArchiveHeader(
            version=ARCHIVE_VERSION,
            execution_id=execution_id,
            archived_at=time.time(),  # for people: nothing decides on it
            status=None if status is None else status.data.decode(errors="replace"),
        )
        document = await asyncio.to_thread(encode_archive, header, stored, objects)
        archived = await archive.put(execution_id, document, status=header.status)
    if not remove:
        return Retired(execution_id, archived=archived, kept="--keep: archived only")
    removed = 0
    for key in keys:
        for bucket in (BLOB_BUCKET, PAYLOAD_BUCKET):
            removed += await remove_object(nc, bucket, key)
    messages = await purge(nc, LOOP_STREAM, loop_logs_filter(execution_id, layout.partitions))
    messages += await purge(nc, EXEC_STREAM, layout.execution(execution_id).log)
    # its dead letters are archived with it (and the DLQ's own age limit, which outlives
    # the finished executions' retention by default, takes those of no execution)
    messages += await purge(nc, DLQ_STREAM, dlq_filter(execution_id=execution_id))
    messages += await purge(nc, INDEX_STREAM, index_subject(execution_id))
    messages += await purge(nc, kv_stream(STATUS_BUCKET), status_subject)
    messages += await purge(nc, ENDED_STREAM, index_ends_of(execution_id))
    return Retired(execution_id, archived=archived, messages=messages, blobs=removed)


def _state(status: Any) -> str:
    try:
        return str(status_decoder.decode(status.data or b"").state)
    except Exception:
        # not a status record: nobody can say it ended, so it is kept (and said so)
        return "unreadable"


def _live(entries: list[Msg]) -> Msg | None:
    """A key's value from its messages: the last, unless it is a delete marker."""
    if not entries:
        return None
    last = entries[-1]
    return None if (last.headers or {}).get("KV-Operation") in ("DEL", "PURGE") else last


def _stored(m: Msg) -> StoredMessage:
    md = m.metadata
    headers = dict(m.headers or {})
    return StoredMessage.of(md.stream, m.subject, md.sequence.stream, md.timestamp.timestamp(), m.data, headers)


def _blob_keys(execution_id: str, msgs: tuple[Msg, ...]) -> Iterator[str]:
    """Keys of blobs the messages name: string values `<id>/.../<digest>` (a result, a
    payload, a loop's collection) or `out/<id>/.../<digest>` (what a step printed)."""
    owned = (f"{execution_id}/", f"out/{execution_id}/")
    for m in msgs:
        if b"/" not in m.data:
            continue
        try:
            value = orjson.loads(m.data)
        except orjson.JSONDecodeError:
            continue
        yield from (s for s in _strings(value) if s.startswith(owned) and _DIGEST.search(s))


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


async def _object(js: Any, key: str) -> tuple[str, bytes | None]:
    """The bucket holding blob `key` and its stored bytes (None when neither has it,
    or when it is damaged: archived without it, said in the log, rather than never)."""
    for bucket in (BLOB_BUCKET, PAYLOAD_BUCKET):
        try:
            store = await js.object_store(bucket)
            buf = io.BytesIO()
            await store.get(key, writeinto=buf)
            return bucket, buf.getvalue()
        except (NotFoundError, ObjectNotFoundError, ObjectDeletedError, KeyNotFoundError):
            continue
        except (DigestMismatchError, BadObjectMetaError) as e:
            log.warning("archiving blob %r of bucket %r: damaged (%s); archived without it", key, bucket, e)
            return bucket, None
    return BLOB_BUCKET, None


async def sweep_orphan_blobs(nc: NATS, layout: Layout, *, older_than: float) -> int:
    """Remove the commands' args blobs, stored before `older_than` (a Unix time), of
    executions that have neither a status nor a log (retired): the one kind of blob no
    record of its execution names (a command sent as a message of its own, answered and
    gone). How many went. Reads the buckets' metadata whole (one message per blob): the
    retention actor does it now and then (`SWEEP_EVERY`), not per execution."""
    removed = 0
    for bucket in (BLOB_BUCKET, PAYLOAD_BUCKET):
        stream = obj_stream(bucket)
        try:
            metas = await read_all(nc, stream, f"$O.{bucket}.M.>")
        except NotFoundError:
            continue
        owners: dict[str, list[str]] = {}
        for m in metas:
            if m.metadata.timestamp.timestamp() >= older_than:
                continue
            try:
                meta = orjson.loads(m.data)
            except orjson.JSONDecodeError:
                continue
            name = meta.get("name") if isinstance(meta, dict) else None
            # only a command's args: every other blob is named by a record and goes with
            # it, and a start's payload may belong to a start still queued in START
            if isinstance(name, str) and not meta.get("deleted") and _COMMAND_KEY.match(name):
                owners.setdefault(blob_owner(name), []).append(name)
        for owner, names in owners.items():
            if EXECUTION_ID.fullmatch(owner) and await _gone(nc, layout, owner):
                for name in names:
                    removed += await remove_object(nc, bucket, name)
    return removed


async def _gone(nc: NATS, layout: Layout, execution_id: str) -> bool:
    """Neither a status nor a log: retired, or never started."""
    if await count(nc, kv_stream(STATUS_BUCKET), kv_key_subject(STATUS_BUCKET, execution_id)):
        return False
    return not await count(nc, EXEC_STREAM, layout.execution(execution_id).log)
