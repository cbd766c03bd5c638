"""A finished execution archived before the retention actor removes it: one document
per execution, kept in the object store (bucket `archive`) or in a directory, from
which `status`, `result`, `events`, `list` and the UI still read it.

The document is gzip-compressed JSON Lines, so any tool reads it (`zcat ID.jsonl.gz |
jq`): a first line `{"kind": "archive", ...}` naming the execution and its final
status, then one line per stored message (`{"kind": "message", "stream": "EXEC",
"subject", "seq", "time", "data"}`: its log, its loops' logs, its index entries, its
status record, its dead letters) and one per blob it referenced (`{"kind": "object",
"bucket", "key", "data_b64"}`). Messages keep their bytes exactly (`data` when they are
UTF-8, as every record is; `data_b64` otherwise), so a value encrypted with a payload
key stays encrypted, and a reader opens it as it would have from the stream.

Archives are written once: a second retirement of the same execution (a retention
actor that died half-way through removing it) finds the archive there and keeps it, so
what was archived before anything was removed is what stays.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import io
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import msgspec
import orjson
from nats.aio.client import Client as NATS
from nats.js.api import ObjectInfo, ObjectMetaOptions
from nats.js.errors import BadRequestError, NotFoundError, ObjectDeletedError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from actors.natsio.batchget import from_sequence
from actors.natsio.purge import purge
from actors.store.records import RecordInvalid, skipped
from actors.wire.messages import ExecutionStatus, status_decoder
from streams.layout import ARCHIVE_BUCKET, EXECUTION_ID, is_exec_stream, obj_stream
from streams.subjects import object_chunks_subject, object_meta_subject, object_metas_filter

ARCHIVE_VERSION = 1
SUFFIX = ".jsonl.gz"
# a document read back is refused past this once uncompressed: a gzip bomb put in the
# archive must not take a reader's memory (an execution's records are bounded far lower)
MAX_ARCHIVE_BYTES = 1 << 30
MAX_HEADER_BYTES = 1 << 20  # a first line longer than this is not an archive's header
# a line holds one message or one blob (base64: 4/3 of the value cap, 64 MB by default)
MAX_LINE_BYTES = 96 << 20
CHUNK = 128 * 1024  # bytes of an archive object's chunk (nats-py's own default)
WRONG_LAST_SEQUENCE = 10071  # JSStreamWrongLastSequenceErr: an archive is there already


class ArchiveInvalid(RecordInvalid):
    """An archive document that cannot be read: one line naming where it is."""


class ArchiveHeader(msgspec.Struct, tag="archive", tag_field="kind", kw_only=True):
    version: int
    execution_id: str
    archived_at: float
    # the final status record as the status bucket held it (its JSON text), for listings
    status: str | None = None


class StoredMessage(msgspec.Struct, tag="message", tag_field="kind", kw_only=True, omit_defaults=True):
    stream: str
    subject: str
    seq: int
    time: float
    data: str | None = None  # the message's bytes when they are UTF-8
    data_b64: str | None = None  # otherwise
    headers: dict[str, str] | None = None

    @classmethod
    def of(
        cls, stream: str, subject: str, seq: int, time: float, data: bytes, headers: dict[str, str] | None
    ) -> StoredMessage:
        try:
            return cls(stream=stream, subject=subject, seq=seq, time=time, data=data.decode(), headers=headers or None)
        except UnicodeDecodeError:
            b64 = base64.b64encode(data).decode()
            return cls(stream=stream, subject=subject, seq=seq, time=time, data_b64=b64, headers=headers or None)

    @property
    def raw(self) -> bytes:
        if self.data_b64 is not None:
            return base64.b64decode(self.data_b64)
        return (self.data or "").encode()


class StoredObject(msgspec.Struct, tag="object", tag_field="kind", kw_only=True):
    bucket: str
    key: str
    data_b64: str


Line = ArchiveHeader | StoredMessage | StoredObject
_line = msgspec.json.Decoder(Line)
_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class ArchivedExecution:
    """An archive document, read."""

    header: ArchiveHeader
    messages: list[StoredMessage] = field(default_factory=list)
    objects: dict[tuple[str, str], bytes] = field(default_factory=dict)

    @property
    def execution_id(self) -> str:
        return self.header.execution_id

    def status(self) -> ExecutionStatus | None:
        """The final status the status bucket held when it was archived."""
        if self.header.status is None:
            return None
        try:
            return status_decoder.decode(self.header.status)
        except msgspec.DecodeError as e:
            raise ArchiveInvalid(f"archive of {self.execution_id}: its status is not a status record ({e})") from None

    def stream(self, name: str, *, subject_prefix: str = "") -> list[tuple[str, bytes, int, float]]:
        """(subject, data, seq, time) of the archived messages of stream `name`, in order.
        The execution's log is any stream of logs' (EXEC, or EXEC_<k> in a deployment of
        several): an archive holds one execution, whose log is in one of them."""
        same = is_exec_stream if is_exec_stream(name) else name.__eq__
        return [
            (m.subject, m.raw, m.seq, m.time)
            for m in self.messages
            if same(m.stream) and m.subject.startswith(subject_prefix)
        ]

    def object(self, bucket: str, key: str) -> bytes | None:
        return self.objects.get((bucket, key))


def encode_archive(
    header: ArchiveHeader, messages: Iterable[StoredMessage], objects: Iterable[tuple[str, str, bytes]]
) -> bytes:
    """The document, compressed. CPU-bound for a large execution: run it in a thread."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as z:
        z.write(_encoder.encode(header) + b"\n")
        for m in messages:
            z.write(_encoder.encode(m) + b"\n")
        for bucket, key, data in objects:
            line = StoredObject(bucket=bucket, key=key, data_b64=base64.b64encode(data).decode())
            z.write(_encoder.encode(line) + b"\n")
    return buf.getvalue()


def decode_archive(data: bytes, *, where: str) -> ArchivedExecution:
    """A document read back (`where`: the object or file it came from, for errors).
    Raises ArchiveInvalid, one line naming `where` and the line, for anything else."""
    lines = _lines(data, where)
    try:
        first = next(lines)
    except StopIteration:
        raise ArchiveInvalid(f"{where}: empty, not an archive") from None
    header = _decode_line(first, where, 1)
    if not isinstance(header, ArchiveHeader):
        raise ArchiveInvalid(f"{where}: line 1 is not an archive header")
    if header.version > ARCHIVE_VERSION:
        raise ArchiveInvalid(f"{where}: archive version {header.version}, newer than this reader's {ARCHIVE_VERSION}")
    if not EXECUTION_ID.fullmatch(header.execution_id):
        raise ArchiveInvalid(f"{where}: execution id {header.execution_id[:140]!r} is not one")
    out = ArchivedExecution(header)
    for n, raw in enumerate(lines, start=2):
        line = _decode_line(raw, where, n)
        if isinstance(line, StoredMessage):
            out.messages.append(line)
        elif isinstance(line, StoredObject):
            try:
                out.objects[(line.bucket, line.key)] = base64.b64decode(line.data_b64, validate=True)
            except ValueError:
                raise ArchiveInvalid(f"{where}: line {n}: object {line.key!r} is not base64") from None
        else:
            raise ArchiveInvalid(f"{where}: line {n}: a second archive header")
    return out


def _lines(data: bytes, where: str) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as z:
            read = 0
            while raw := z.readline(MAX_LINE_BYTES + 1):  # a line is never decompressed past its bound
                read += len(raw)
                if len(raw) > MAX_LINE_BYTES:
                    raise ArchiveInvalid(f"{where}: a line over {MAX_LINE_BYTES} bytes; refusing to read it")
                if read > MAX_ARCHIVE_BYTES:
                    raise ArchiveInvalid(f"{where}: over {MAX_ARCHIVE_BYTES} bytes uncompressed; refusing to read it")
                if raw.strip():
                    yield raw
    except (OSError, EOFError) as e:  # not gzip, or cut short
        raise ArchiveInvalid(f"{where}: not a gzip-compressed archive ({e})") from None


def _decode_line(raw: bytes, where: str, n: int) -> Line:
    try:
        line: Line = _line.decode(raw)
        return line
    except msgspec.DecodeError as e:
        raise ArchiveInvalid(f"{where}: line {n}: {' '.join(str(e).split())[:200]}") from None


# --- where archives are kept -----------------------------------------------------------


class ArchiveStore(Protocol):
    """Where a deployment keeps its archived executions."""

    @property
    def where(self) -> str:
        """For messages: `bucket 'archive'`, `directory /var/archive`."""
        ...

    async def has(self, execution_id: str) -> bool: ...

    async def put(self, execution_id: str, document: bytes, *, status: str | None) -> bool:
        """Store the archive unless one is there already (then store nothing): True when
        this call wrote it. Two retirements of one execution at once (a retention pod
        and `actors-cli archive`, or a redelivery) leave the first archive whole."""
        ...

    async def get(self, execution_id: str) -> ArchivedExecution | None: ...

    def statuses(self) -> AsyncIterator[ExecutionStatus]:
        """Every archived execution's final status, the latest archived first."""
        ...


class ObjectArchive:
    """Archives in the object store bucket `archive`, one object per execution named by
    its id; the object's description holds its final status (what a listing reads,
    without opening the document)."""

    WINDOW = 64  # metadata messages read in a listing's first window (then twice as many each time)

    def __init__(self, nc: NATS, *, bucket: str = ARCHIVE_BUCKET) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.bucket = bucket
        self._bucket: ObjectStore | None = None

    @property
    def where(self) -> str:
        return f"bucket {self.bucket!r}"

    async def _store(self) -> ObjectStore:
        """The bucket, looked up once (nats-py asks for the stream's info at each lookup)."""
        if self._bucket is None:
            self._bucket = await self.js.object_store(self.bucket)
        return self._bucket

    async def has(self, execution_id: str) -> bool:
        try:
            store = await self._store()
            await store.get_info(execution_id)
        except (NotFoundError, ObjectNotFoundError, ObjectDeletedError):
            return False
        return True

    async def put(self, execution_id: str, document: bytes, *, status: str | None) -> bool:
        # nats-py's put replaces an object; this one is put only if none is there: its
        # chunks first, then its metadata with "no message on this subject yet"
        # (Nats-Expected-Last-Subject-Sequence: 0). Lost that race: its chunks go again
        stream = obj_stream(self.bucket)
        nuid = uuid.uuid4().hex
        chunks = object_chunks_subject(self.bucket, nuid)
        digest = hashlib.sha256(document).digest()
        try:
            for at in range(0, len(document), CHUNK):
                await self.js.publish(chunks, document[at : at + CHUNK], stream=stream)
            info = ObjectInfo(
                name=execution_id,
                description=status,
                bucket=self.bucket,
                nuid=nuid,
                size=len(document),
                chunks=-(-len(document) // CHUNK),
                mtime=datetime.now(UTC).isoformat(),
                digest=f"SHA-256={base64.urlsafe_b64encode(digest).decode()}",
                options=ObjectMetaOptions(max_chunk_size=CHUNK),
            )
            meta = object_meta_subject(self.bucket, execution_id)
            headers = {"Nats-Rollup": "sub", "Nats-Expected-Last-Subject-Sequence": "0"}
            await self.js.publish(meta, orjson.dumps(info.as_dict()), headers=headers, stream=stream)
        except BadRequestError as e:
            if await self._meta_names(stream, execution_id, nuid) is False:
                await purge(self.nc, stream, chunks)
            if e.err_code == WRONG_LAST_SEQUENCE:
                return False  # archived by another retirement meanwhile: that one is kept
            raise
        except BaseException:
            # the metadata may be stored all the same (its PubAck lost, or this task
            # cancelled while it waited): then these chunks are the archive, and the
            # next retirement finds it (`has`) and removes the execution; purged, they
            # would leave an archive no one can read. Purged only when known not to be
            if await self._meta_names(stream, execution_id, nuid) is False:
                await purge(self.nc, stream, chunks)
            raise
        return True

    async def _meta_names(self, stream: str, execution_id: str, nuid: str) -> bool | None:
        """Does the object's stored metadata name chunks `nuid`? None: not known (the
        read failed)."""
        try:
            last = await self.nc.jsm().get_last_msg(stream, object_meta_subject(self.bucket, execution_id), direct=True)
        except NotFoundError:
            return False  # no metadata stored
        except Exception:
            return None
        try:
            return bool(orjson.loads(last.data or b"{}").get("nuid") == nuid)
        except (orjson.JSONDecodeError, AttributeError):
            return False  # not an object's metadata: not these chunks'

    async def get(self, execution_id: str) -> ArchivedExecution | None:
        try:
            store = await self._store()
            buf = io.BytesIO()
            await store.get(execution_id, writeinto=buf)
        except (NotFoundError, ObjectNotFoundError, ObjectDeletedError):
            return None
        where = f"archive {execution_id!r} in {self.where}"
        return _the_one(await asyncio.to_thread(decode_archive, buf.getvalue(), where=where), execution_id, where)

    async def statuses(self) -> AsyncIterator[ExecutionStatus]:
        """The final status of every archived execution, the latest archived first: the
        objects' metadata read backwards, a window at a time (documents are not opened)."""
        stream = obj_stream(self.bucket)
        try:
            info = await self.nc.jsm().stream_info(stream)
        except NotFoundError:
            return
        first, hi, window = info.state.first_seq, info.state.last_seq, self.WINDOW
        while info.state.messages and hi >= first:
            lo = max(first, hi - window + 1)
            got = await from_sequence(
                self.nc, stream, lo, hi - lo + 1, subject=object_metas_filter(self.bucket), up_to=hi
            )
            for seq, data in reversed(got):
                status = _described(data, where=f"stream {stream} message {seq}")
                if status is not None:
                    yield status
            hi, window = lo - 1, window * 2


class DirArchive:
    """Archives as files, `<dir>/<2 hex digits>/<execution id>.jsonl.gz` (the digits
    spread a week of executions over 256 directories). Written to a temporary file and
    renamed into place, so a file there is whole."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @property
    def where(self) -> str:
        return f"directory {self.directory}"

    def path(self, execution_id: str) -> Path:
        if not EXECUTION_ID.fullmatch(execution_id):  # never a path of its own choosing: `../x`
            raise ArchiveInvalid(f"execution id {execution_id[:140]!r} is not one; no archive file is named by it")
        shard = hashlib.blake2b(execution_id.encode(), digest_size=1).hexdigest()
        return self.directory / shard / f"{execution_id}{SUFFIX}"

    async def has(self, execution_id: str) -> bool:
        return await asyncio.to_thread(self.path(execution_id).exists)

    async def put(self, execution_id: str, document: bytes, *, status: str | None) -> bool:
        return await asyncio.to_thread(self._write, self.path(execution_id), document)

    @staticmethod
    def _write(path: Path, document: bytes) -> bool:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".archiving-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(document)
                f.flush()
                os.fsync(f.fileno())  # whole on disk before the records it holds are removed
            try:
                os.link(tmp, path)  # never over an archive there: the first one stays whole
            except FileExistsError:
                return False
            directory = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)  # the name too, not only the bytes, survives a crash
            finally:
                os.close(directory)
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

    async def get(self, execution_id: str) -> ArchivedExecution | None:
        path = self.path(execution_id)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None
        where = f"archive {str(path)!r}"
        return _the_one(await asyncio.to_thread(decode_archive, data, where=where), execution_id, where)

    async def statuses(self) -> AsyncIterator[ExecutionStatus]:
        """The final status of every archived execution here, the latest archived first
        (each file's first line; a directory is listed whole, then read file by file)."""
        files = await asyncio.to_thread(self._newest_first)
        for path in files:
            status = await asyncio.to_thread(self._status_of, path)
            if status is not None:
                yield status

    def _newest_first(self) -> list[Path]:
        found = []
        for path in self.directory.glob(f"??/*{SUFFIX}"):
            try:
                found.append((path.stat().st_mtime, path))
            except FileNotFoundError:
                continue
        return [p for _, p in sorted(found, reverse=True)]

    @staticmethod
    def _status_of(path: Path) -> ExecutionStatus | None:
        try:
            with gzip.open(path, "rb") as z:
                header = _decode_line(z.readline(MAX_HEADER_BYTES), str(path), 1)
            if not isinstance(header, ArchiveHeader):
                raise ArchiveInvalid(f"{path}: line 1 is not an archive header")
            return None if header.status is None else status_decoder.decode(header.status)
        except (OSError, EOFError) as e:
            skipped(ArchiveInvalid(f"{path}: not a gzip-compressed archive ({e})"))
        except msgspec.DecodeError as e:
            skipped(ArchiveInvalid(f"{path}: its status is not a status record ({e})"))
        except ArchiveInvalid as e:
            skipped(e)
        return None


def _the_one(found: ArchivedExecution, execution_id: str, where: str) -> ArchivedExecution:
    """`found`, when it is the archive of `execution_id` (and its status too): a document
    put under another execution's name would show that one's history as this one's."""
    if found.execution_id != execution_id:
        raise ArchiveInvalid(f"{where}: holds execution {found.execution_id!r}, not {execution_id!r}")
    status = found.status()
    if status is not None and status.execution_id != execution_id:
        raise ArchiveInvalid(f"{where}: its status is execution {status.execution_id!r}'s")
    return found


def _described(data: bytes, *, where: str) -> ExecutionStatus | None:
    """The status in an archive object's metadata (its description); None, warned, when
    it holds none that can be read, and None for an object deleted."""
    try:
        meta = _object_meta.decode(data)
        if meta.deleted:
            return None
        if meta.description is None:
            raise ArchiveInvalid(f"{where}: archive {meta.name!r} has no status in its description")
        return status_decoder.decode(meta.description)
    except msgspec.DecodeError as e:
        skipped(ArchiveInvalid(f"{where}: not an archived execution's metadata ({e})"))
    except ArchiveInvalid as e:
        skipped(e)
    return None


class _ObjectMeta(msgspec.Struct):
    """What a listing reads of an object store's metadata message (nats-py's ObjectInfo)."""

    name: str = ""
    description: str | None = None
    deleted: bool = False


_object_meta = msgspec.json.Decoder(_ObjectMeta)


def archive_store(nc: NATS, place: str) -> ArchiveStore | None:
    """The archive a deployment's `ACTORS_ARCHIVE` names: None for `off`, the `archive`
    bucket for `objects`, else the directory at that (absolute) path."""
    if place == "off":
        return None
    if place == "objects":
        return ObjectArchive(nc)
    return DirArchive(place)


def archive_reader(nc: NATS, place: str) -> ArchiveStore:
    """Where a client reads archived executions back from: the directory `place` names
    (ACTORS_ARCHIVE set to a path, on a machine that mounts it), else the `archive` bucket."""
    return DirArchive(place) if place.startswith("/") else ObjectArchive(nc)
