"""Values too large for one message, stored in the JetStream object store `blobs` and
referenced by key: a loop's collection, its aggregated results, a large execution
result, a step's result, a command, a start payload. A message carries either the
value or its key, never a truncated value.

Keys are derived from what the value belongs to (execution, command) and a digest of
its encoding, so a replay or a redelivery that produces the same value writes the same
blob, and one that produces a different value (a tool run again) never overwrites the
blob an earlier message in the log names. Every read checks the bytes against that
digest (`BlobCorrupt` on a mismatch): a blob changed after it was written (by anyone
who may write the bucket) is refused, never used. Keys written before every key
carried a digest (`<execution>/result`, a loop's `collection` and `results`) are read
unchecked.

Start payloads go to a bucket of their own, `payloads` (`PAYLOAD_BUCKET`): the one the
`cli` NATS user may write (actors/pod/permissions.py). NATS permissions cannot tell one
key of a bucket from another (nats-py names an object's chunks by a random id and its
metadata by the base64 of its whole name, one subject token), so a bucket is the unit
of write permission; results, commands and step output stay in `blobs`.

Past the cap on values (`cap`: `Layout.max_value_bytes`, 64 MB, env
`ACTORS_MAX_VALUE_BYTES` read by `actors.config.settings`) a value is refused with
`ValueTooLarge`, naming the step and field, instead of being stored.
"""

from __future__ import annotations

import hashlib
import io
import re
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import (
    BadObjectMetaError,
    DigestMismatchError,
    NotFoundError,
    ObjectDeletedError,
    ObjectNotFoundError,
)

from actors.errors import UserError
from actors.natsio.binding import codec_of
from actors.natsio.purge import purge
from actors.wire.codec import PayloadUnreadable
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    Command,
    ErrorInfo,
    StartMessage,
    answer_subject,
    command_decoder,
    encode,
)
from actors.wire.nesting import MAX_VALUE_NODES, START_MESSAGE_DEPTH, json_nodes, json_within
from streams.ids import attempt_of, command_msg_id, result_id, start_id
from streams.layout import BLOB_BUCKET, PAYLOAD_BUCKET, START_SUBJECT, cmd_subject, obj_stream
from streams.subjects import object_chunks_subject, object_meta_subject

# A value whose encoding is larger than this goes to the object store. Well under the
# message limit, so the message around it (ids, counts, headers) always fits.
INLINE_LIMIT = 256 * 1024
# room for the envelope around a value when a whole message is measured against the
# server's limit (ids, step names, headers)
HEADROOM = 4096

MAX_VALUE_ENV = "ACTORS_MAX_VALUE_BYTES"

# what a missing blob (expired, removed) is reported as
BLOB_MISSING = (NotFoundError, ObjectDeletedError)
# the error type of a step or execution whose value's blob is not what its key names
VALUE_CORRUPT = "ValueCorrupt"


# the last part of a key written by `blob_key`: 12 bytes of BLAKE2b, in hex
_DIGEST = re.compile(r"[0-9a-f]{24}")


class ValueTooLarge(UserError, ValueError):
    """A value over the cap: the message names what it is (step and field)."""


class BlobCorrupt(PayloadUnreadable):
    """A blob whose bytes are not those its key names (their digest differs): changed
    after it was written, or damaged. One line naming the key. A `PayloadUnreadable`:
    whoever cannot read a value fails saying so, at once (the CLI exits 3; a tool fails
    the step; the engine fails the step or the execution, actors/engine/readback.py)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"blob {key!r}: {why}; refusing to use it (changed after it was written, or damaged)")
        self.key = key


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def blob_key(*parts: str, data: bytes) -> str:
    """`<parts>/<digest of data>`: the same value for the same owner, the same key."""
    return "/".join((*parts, _digest(data)))


def check_digest(key: str, data: bytes) -> None:
    """Raise `BlobCorrupt` unless `data` (as stored: sealed) has the digest that ends
    `key`. A key without one (written by an earlier version) cannot be checked."""
    named = key.rsplit("/", 1)[-1]
    if not _DIGEST.fullmatch(named):
        return
    found = _digest(data)
    if found != named:
        raise BlobCorrupt(key, f"its content's digest is {found}, not the {named} its key names")


def too_large(what: str, size: int, cap: int) -> str:
    return f"{what} is {size:,} bytes, over the {cap:,}-byte cap on values ({MAX_VALUE_ENV})"


def too_many(what: str) -> str:
    return f"{what} holds more than {MAX_VALUE_NODES:,} values (lists, mappings and their items), the most one may hold"


def _decoded(key: str, data: bytes) -> Any:
    """A blob's value, measured before it is decoded (depth, and how many values: a
    decoded value costs the pod 50-80 bytes each)."""
    if not json_within(data, START_MESSAGE_DEPTH):
        raise BlobCorrupt(key, f"a value nested deeper than {START_MESSAGE_DEPTH} levels")
    if json_nodes(data) > MAX_VALUE_NODES:
        raise BlobCorrupt(key, too_many("the value"))
    return msgspec.json.decode(data or b"null")


def sealed(js: JetStreamContext, data: bytes) -> bytes:
    """`data` as the object store keeps it: encrypted when the connection's codec has a
    key (actors/wire/codec.py). Name a blob by a digest of these bytes (`blob_key`): the
    same value gives the same bytes (the codec is deterministic) and the digest of a
    ciphertext says nothing of the value."""
    return codec_of(js).seal_bytes(data)


async def put_blob(js: JetStreamContext, key: str, data: bytes, *, bucket: str = BLOB_BUCKET) -> None:
    """Store `data` (already `sealed`: its key was computed from these bytes)."""
    store = await js.object_store(bucket)
    await store.put(key, data)


async def offload(js: JetStreamContext, owner: str, value: Any) -> str | None:
    """Store `value` under `<owner>/<digest>` when its encoding is over `INLINE_LIMIT`
    and return the key; None when it fits in a message. Encodes once. Idempotent: a
    replay stores the same key and value again."""
    data = encode(value)
    if len(data) <= INLINE_LIMIT:
        return None
    data = sealed(js, data)
    key = blob_key(owner, data=data)
    await put_blob(js, key, data)
    return key


async def get_blob(js: JetStreamContext, key: str) -> Any:
    """The value stored under `key` (msgspec: integers of any size survive). Raises one
    of `BLOB_MISSING` when it is gone, `BlobCorrupt` when it is not what its key names,
    `PayloadUnreadable` when it is encrypted with a key this connection does not hold."""
    return _decoded(key, await _read(js, key))


def stored_value(js: JetStreamContext, key: str, data: bytes) -> Any:
    """The value of blob `key` from its bytes as they were stored (read back from an
    archive): checked against its key, decrypted, decoded, as `get_blob` does."""
    return _decoded(key, stored_bytes(js, key, data))


def stored_bytes(js: JetStreamContext, key: str, data: bytes) -> bytes:
    """Blob `key`'s bytes as they were stored, checked against its key and decrypted."""
    check_digest(key, data)
    return codec_of(js).open_bytes(data)


def blob_owner(key: str) -> str:
    """The execution a blob key belongs to: `<id>/...`, or `out/<id>/...` for what a step printed."""
    parts = key.split("/", 2)
    return parts[1] if parts[0] == "out" and len(parts) > 1 else parts[0]


async def get_blob_bytes(js: JetStreamContext, key: str) -> bytes:
    """The bytes stored under `key`, as they were put (a step's printed output), decrypted."""
    return await _read(js, key)


async def get_payload(js: JetStreamContext, key: str) -> Any:
    """A start payload stored by `payload_blob`: from bucket `payloads`, or from `blobs`
    where payloads were stored before they had a bucket of their own. Raises as `get_blob`."""
    try:
        data = await _read(js, key, bucket=PAYLOAD_BUCKET)
    except BLOB_MISSING:
        data = await _read(js, key)
    return _decoded(key, data)


async def _read(js: JetStreamContext, key: str, *, bucket: str = BLOB_BUCKET) -> bytes:
    data = await read_stored(js, key, bucket=bucket)
    check_digest(key, data)  # before decrypting: a changed blob is never opened
    return codec_of(js).open_bytes(data)


async def read_stored(js: JetStreamContext, key: str, *, bucket: str = BLOB_BUCKET) -> bytes:
    """Blob `key`'s bytes as they were put (sealed: encrypted when a payload key was set),
    not checked against its key: what an archive keeps. Raises one of `BLOB_MISSING`, or
    `BlobCorrupt` when its chunks or metadata are damaged."""
    # into a buffer: without one, nats.py joins the chunks by `bytes +=`, quadratic in
    # the value's size (a 60 MB value took 19 s end to end; see docs/limits.md, Big values)
    store = await js.object_store(bucket)
    buf = io.BytesIO()
    try:
        await store.get(key, writeinto=buf)
    except DigestMismatchError:  # chunks added or changed behind the object's own SHA-256
        raise BlobCorrupt(key, "its chunks do not match the object's recorded SHA-256") from None
    except BadObjectMetaError:
        raise BlobCorrupt(key, "its object metadata is not readable") from None
    return buf.getvalue()


# --- results: tool actor (or a child execution) -> the execution or loop log ----------


async def result_message(js: JetStreamContext, msg: CallDone | CallError, *, limit: int, cap: int) -> bytes:
    """`msg` encoded to fit in `limit` bytes: a result too large travels as a blob
    (`result_ref`); one over the cap becomes a `ValueTooLarge` error of the step."""
    codec = codec_of(js)
    data = codec.encode(msg)
    if len(data) <= limit or not isinstance(msg, CallDone):
        return data
    value = encode(msg.result)
    if len(value) > cap or json_nodes(value) > MAX_VALUE_NODES:
        why = too_large("result", len(value), cap) if len(value) > cap else too_many("result")
        error = ErrorInfo(type="ValueTooLarge", message=f"step '{msg.step}': {why}")
        return codec.encode(msg.failed(error))
    value = sealed(js, value)
    key = blob_key(msg.execution_id, "result", msg.command_id, data=value)
    await put_blob(js, key, value)
    stub = msgspec.structs.replace(msg, result=None, result_ref=key)
    return codec.encode(stub)


async def resolve_result(js: JetStreamContext, msg: CallDone) -> CallDone | CallError:
    """A result that travelled as a blob, read back; a blob that is gone makes the
    attempt fail with `ValueMissing` (a clear error, not an input retried for ever)."""
    if msg.result_ref is None:
        return msg
    try:
        msg.result = await get_blob(js, msg.result_ref)
    except BLOB_MISSING:
        missing = f"step '{msg.step}': result blob {msg.result_ref} not found (expired or removed)"
        return msg.failed(ErrorInfo(type="ValueMissing", message=missing))
    except BlobCorrupt as e:
        return msg.failed(ErrorInfo(type=VALUE_CORRUPT, message=f"step '{msg.step}': result {e}"))
    msg.result_ref = None
    return msg


async def chunk_message(js: JetStreamContext, done: ChunkDone, *, limit: int, cap: int) -> bytes:
    """A chunk's answer encoded to fit in `limit` bytes: each iteration whose result is
    over its share of the message goes as a blob (over the cap: `ValueTooLarge`)."""
    codec = codec_of(js)
    data = codec.encode(done)
    if len(data) <= limit:
        return data
    share = limit // max(len(done.outcomes), 1)
    for o in done.outcomes:
        value = encode(o.result)
        if len(value) <= share:
            continue
        o.result = None
        if len(value) > cap:
            o.error = ErrorInfo(
                type="ValueTooLarge",
                message=(f"step '{done.step}' iteration {o.iteration_index}: {too_large('result', len(value), cap)}"),
            )
            continue
        value = sealed(js, value)
        o.result_ref = blob_key(done.execution_id, "result", done.command_id, str(o.iteration_index), data=value)
        await put_blob(js, o.result_ref, value)
    return codec.encode(done)


async def resolve_chunk(js: JetStreamContext, done: ChunkDone) -> ChunkDone:
    """Each iteration result of a chunk that travelled as a blob, read back; one that is
    gone fails that iteration with `ValueMissing`."""
    for o in done.outcomes:
        if o.result_ref is None:
            continue
        try:
            o.result = await get_blob(js, o.result_ref)
        except BLOB_MISSING:
            o.error = ErrorInfo(
                type="ValueMissing",
                message=(f"step '{done.step}' iteration {o.iteration_index}: result blob {o.result_ref} not found"),
            )
        except BlobCorrupt as e:
            o.error = ErrorInfo(
                type=VALUE_CORRUPT, message=f"step '{done.step}' iteration {o.iteration_index}: result {e}"
            )
        o.result_ref = None
    return done


# --- commands: engine or counter -> tool actors ---------------------------------------


async def command_items(
    js: JetStreamContext, commands: list[Command], *, limit: int, cap: int, sender: str = "engine"
) -> list[tuple[str, bytes, str]]:
    """Publish items for `commands`: a command too large for a message goes as a stub
    naming a blob with the whole command (`body_ref`, read back by the tool actor); one
    over the cap is not sent: its step gets a `ValueTooLarge` result instead, as if a
    tool actor had answered, so the log records why."""
    items = []
    codec = codec_of(js)
    for c in commands:
        eid = c.execution_id
        data = codec.encode(c)
        if len(data) > limit:
            if len(data) > cap:
                error = ErrorInfo(
                    type="ValueTooLarge",
                    message=(
                        f"step '{c.step}' field args: "
                        f"{too_large('the command (args, element, sink scope)', len(data), cap)}"
                    ),
                )
                answer = CallError(
                    execution_id=eid,
                    command_id=c.command_id,
                    step=c.step,
                    error=error,
                    attempt_number=c.attempt_number,
                    worker=sender,
                    iteration_index=c.iteration_index,
                )
                items.append((answer_subject(c), codec.encode(answer), result_id(eid, c.command_id)))
                continue
            data = sealed(js, encode(c))  # the whole command, its values in clear inside the encrypted blob
            key = blob_key(eid, "command", c.command_id, data=data)
            await put_blob(js, key, data)
            data = codec.encode(
                Command(
                    execution_id=eid,
                    command_id=c.command_id,
                    step=c.step,
                    kind=c.kind,
                    reply_to=c.reply_to,
                    answer_on=c.answer_on,
                    attempt_number=c.attempt_number,
                    timeout=c.timeout,
                    iteration_index=c.iteration_index,
                    body_ref=key,
                )
            )
        items.append((cmd_subject(c.kind, eid, c.command_id), data, command_msg_id(eid, c.command_id)))
    return items


async def resolve_command(js: JetStreamContext, cmd: Command) -> Command:
    """The whole command a stub names. Raises one of `BLOB_MISSING` when it is gone."""
    if cmd.body_ref is None:
        return cmd
    return command_decoder.decode(await _read(js, cmd.body_ref))  # decrypted whole: no sealed value inside


# --- start payloads: client, starter, a parent's engine -> an execution ---------------


async def start_payload(
    js: JetStreamContext, msg: StartMessage, execution_id: str, *, limit: int, cap: int
) -> StartMessage:
    """`msg` with its payload moved to a blob (`payload_ref`) when the message would be
    over `limit`. Raises `ValueTooLarge` past the cap."""
    if msg.payload_ref is not None or len(codec_of(js).encode(msg)) <= limit:
        return msg
    ref = await payload_blob(js, msg.payload, execution_id, cap=cap)
    return msgspec.structs.replace(msg, payload={}, payload_ref=ref)


async def payload_blob(js: JetStreamContext, payload: dict[str, Any], execution_id: str, *, cap: int) -> str:
    """Store a start payload (bucket `payloads`: see the module's docstring); its key.
    Raises `ValueTooLarge` past the cap."""
    data = encode(payload)
    if len(data) > cap:
        raise ValueTooLarge(f"start of {execution_id}: {too_large('the payload', len(data), cap)}")
    data = sealed(js, data)
    key = blob_key(execution_id, "payload", data=data)
    await put_blob(js, key, data, bucket=PAYLOAD_BUCKET)
    return key


async def start_item(js: JetStreamContext, s: StartMessage, *, limit: int, cap: int) -> tuple[str, bytes, str]:
    """The publish item for a child's start (engine or counter): its payload as a blob
    when too large; past the cap no child is started and the parent's command is
    answered with `ValueTooLarge` instead, so its step fails saying why."""
    eid = s.execution_id or ""
    try:
        return START_SUBJECT, codec_of(js).encode(await start_payload(js, s, eid, limit=limit, cap=cap)), start_id(eid)
    except ValueTooLarge as e:
        parent = s.parent
        if parent is None or not parent.reply_to or not parent.command_id or not parent.step:
            raise  # not a child: whoever starts it hears of it
        attempt = attempt_of(parent.command_id)
        error = ErrorInfo(type="ValueTooLarge", message=f"step '{parent.step}' field args: {e}")
        answer = CallError(
            execution_id=parent.execution_id,
            command_id=parent.command_id,
            step=parent.step,
            error=error,
            attempt_number=attempt,
            worker="engine",
        )
        return parent.reply_to, codec_of(js).encode(answer), result_id(parent.execution_id, parent.command_id)


async def remove_object(nc: NATS, bucket: str, key: str) -> int:
    """Remove object `key` of `bucket` whole, its chunks and its metadata, leaving no
    delete marker (nats-py's `delete` keeps one per object, for ever): 1 when it was
    there, 0 when it was not. A finished execution's blobs go this way (actors/store/retire.py)."""
    store = await nc.jetstream().object_store(bucket)
    try:
        info = await store.get_info(key, show_deleted=True)
    except (NotFoundError, ObjectNotFoundError):
        return 0
    stream = obj_stream(bucket)
    await purge(nc, stream, object_chunks_subject(bucket, info.nuid))
    await purge(nc, stream, object_meta_subject(bucket, key))
    return 1
