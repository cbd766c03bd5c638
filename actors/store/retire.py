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
import base64
import hashlib
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from nats.js.errors import BadObjectMetaError, NotFoundError

from actors.natsio.batchget import Stored, on_subject
from actors.natsio.purge import delete, purge
from actors.natsio.readall import count
from actors.store.archive import ARCHIVE_VERSION, ArchiveHeader, ArchiveStore, StoredMessage, encode_archive
from actors.store.blobs import BLOB_MISSING, BlobCorrupt, blob_owner, remove_object
from actors.wire.events import TERMINAL_STATES
from actors.wire.messages import status_decoder
from streams.layout import (
    BLOB_BUCKET,
    DLQ_STREAM,
    ENDED_STREAM,
    EXECUTION_ID,
    INDEX_STREAM,
    LOOP_STREAM,
    PAYLOAD_BUCKET,
    STATUS_BUCKET,
    Layout,
    obj_stream,
)
from streams.subjects import (
    dlq_filter,
    index_ends_of,
    index_subject,
    kv_key_subject,
    kv_stream,
    loop_logs_filter,
    object_chunks_subject,
    object_metas_filter,
)

log = logging.getLogger("actors.retention")
LATE_ROUNDS = 3  # reads of a record's subjects while removing it (messages may still arrive)
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
    status_subject = kv_key_subject(STATUS_BUCKET, execution_id)
    status = await _status(nc, execution_id)
    if status is not None:
        state = _state(status)
        if state not in TERMINAL_STATES:
            return Retired(execution_id, kept=f"its status is {state}, not terminal")
    log_stream = layout.exec_stream_of(execution_id)
    log = await on_subject(nc, log_stream, layout.execution(execution_id).log)
    loops = await on_subject(nc, LOOP_STREAM, loop_logs_filter(execution_id, layout.partitions))
    keys = sorted(set(_blob_keys(execution_id, (*log, *loops))))
    archived = False
    if archive is not None and not await archive.has(execution_id):
        records = [
            *log,
            *loops,
            *await on_subject(nc, DLQ_STREAM, dlq_filter(execution_id=execution_id)),
            *await on_subject(nc, INDEX_STREAM, index_subject(execution_id)),
            *await on_subject(nc, ENDED_STREAM, index_ends_of(execution_id)),
        ]
        stored = [_stored(m) for m in records]
        if status is not None:
            stored.append(_stored(status))
        objects = [(bucket, key, data) for key in keys for bucket, data in [await _object(nc, key)] if data is not None]
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
    # message by message, not purged by subject: a purge would make the server forget
    # when messages its consumers handed back are due (actors/natsio/purge.py). From
    # what nothing points to, to the status last but one and the ENDED entry last
    messages = 0
    filters = [
        (LOOP_STREAM, loop_logs_filter(execution_id, layout.partitions)),
        (log_stream, layout.execution(execution_id).log),
        (DLQ_STREAM, dlq_filter(execution_id=execution_id)),
        (INDEX_STREAM, index_subject(execution_id)),
        (ENDED_STREAM, index_ends_of(execution_id)),
    ]
    known = {LOOP_STREAM: loops, log_stream: log}
    for stream, subject in filters:
        for _ in range(LATE_ROUNDS):  # what reached it while it was archived goes too (else: kept for ever)
            found = known.pop(stream, None)
            if found is None:
                found = await on_subject(nc, stream, subject)
            if not found:
                break
            messages += await delete(nc, stream, (m.seq for m in found))
        if stream == INDEX_STREAM:
            # a bucket's stream refuses deletes by sequence (deny_delete); nothing hands its
            # messages back with a delay, so a purge of the key is safe there
            messages += await purge(nc, kv_stream(STATUS_BUCKET), status_subject)
    return Retired(execution_id, archived=archived, messages=messages, blobs=removed)


def _state(status: Any) -> str:
    try:
        return str(status_decoder.decode(status.data or b"").state)
    except Exception:
        # not a status record: nobody can say it ended, so it is kept (and said so)
        return "unreadable"


async def _status(nc: NATS, execution_id: str) -> Stored | None:
    """The execution's status as stored (the bucket's stream allows no direct get: its
    leader is asked), None when it has none or it was deleted."""
    stream, subject = kv_stream(STATUS_BUCKET), kv_key_subject(STATUS_BUCKET, execution_id)
    try:
        m = await nc.jsm().get_last_msg(stream, subject)
    except NotFoundError:
        return None
    headers = {k: str(v) for k, v in (m.headers or {}).items()}
    if headers.get("KV-Operation") in ("DEL", "PURGE"):
        return None
    at = m.time.timestamp() if m.time is not None else 0.0
    return Stored(stream=stream, subject=subject, seq=m.seq or 0, time=at, data=m.data or b"", headers=headers)


def _stored(m: Stored) -> StoredMessage:
    return StoredMessage.of(m.stream, m.subject, m.seq, m.time, m.data, m.headers)


def _blob_keys(execution_id: str, msgs: tuple[Stored, ...]) -> Iterator[str]:
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


async def _object(nc: NATS, key: str) -> tuple[str, bytes | None]:
    """The bucket holding blob `key` and its stored bytes (None when neither has it,
    or when it is damaged: archived without it, said in the log, rather than never)."""
    for bucket in (BLOB_BUCKET, PAYLOAD_BUCKET):
        try:
            data = await _read_stored(nc, bucket, key)
        except BLOB_MISSING:
            continue
        except BlobCorrupt as e:
            log.warning("archiving blob %r of bucket %r: %s; archived without it", key, bucket, e)
            return bucket, None
        if data is not None:
            return bucket, data
    return BLOB_BUCKET, None


async def _read_stored(nc: NATS, bucket: str, key: str) -> bytes | None:
    """Blob `key`'s bytes as they were put (what blobs.read_stored gives), None when it
    was removed while being read. Not by nats-py's ObjectStore.get: its ordered consumer
    waits for ever for chunks removed after it read the object's metadata, which is what
    a second retirement of the same execution at once meets (the first removes the blobs
    it archived). Batched direct gets end with what is there. Chunks short of the digest
    of an object gone since: removed by a retirement that archived them first, so this
    document's put finds that archive there and stores nothing. Raises one of
    BLOB_MISSING, or BlobCorrupt."""
    store = await nc.jetstream().object_store(bucket)
    try:
        info = await store.get_info(key)
    except BadObjectMetaError:
        raise BlobCorrupt(key, "its object metadata is not readable") from None
    if not info.nuid or info.is_link():
        raise BlobCorrupt(key, "its object metadata names no chunks of its own")
    if not info.size:
        return b""
    chunks = await on_subject(nc, obj_stream(bucket), object_chunks_subject(bucket, info.nuid))
    data = b"".join(m.data for m in chunks)
    digest = (info.digest or "").partition("=")[2]
    try:
        whole = hashlib.sha256(data).digest() == base64.urlsafe_b64decode(digest)
    except ValueError:
        whole = False
    if whole:
        return data
    try:
        now = await store.get_info(key)
    except BLOB_MISSING:
        return None
    if now.nuid != info.nuid:
        return None  # removed and put again meanwhile (a finished execution's are not): as removed
    raise BlobCorrupt(key, "its chunks do not match the object's recorded SHA-256")


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
            metas = await on_subject(nc, stream, object_metas_filter(bucket))
        except NotFoundError:
            continue
        owners: dict[str, list[str]] = {}
        for m in metas:
            if m.time >= older_than:
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
    return not await count(nc, layout.exec_stream_of(execution_id), layout.execution(execution_id).log)
