"""What users (the CLI, tests, benches) do against a running system: register
playbooks, start and cancel executions, read status, read and follow logs.

Execution ids are checked before they go into a subject or a key (`*`, `>` or `.`
would address other executions). Starts are idempotent by id: the first start record
is what runs; `start_execution` says whether an execution with the id already
existed and what differs from the start that runs.

Every call rides out a stream leader election and a reconnect for up to `timeout`
seconds (default `dial.CLIENT_TIMEOUT`, which covers an election): publishes are sent
again with the same Nats-Msg-Id (`natsio.Publisher.send`; a start's id is its
execution id, so it runs once however often it is sent), reads are asked again
(`natsio.ride_out`). Past the timeout a call raises `dial.NatsUnavailable`, one line
that says what failed, or which publish is unconfirmed (sending it again is safe)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.js.api import PubAck
from nats.js.errors import KeyNotFoundError, NotFoundError

from actors import catalog
from actors.blobs import get_blob, payload_blob, start_payload
from actors.catalog import CatalogError, CatalogReader
from actors.dial import CLIENT_TIMEOUT, NatsUnavailable
from actors.events import TERMINAL_EVENTS, TERMINAL_STATES, decision_decoder, event_decoder
from actors.natsio import (
    MSG_ID,
    TRANSIENT_REQUEST,
    PublishOutcomeUnknown,
    log_time,
    publisher,
    ride_out,
    stream_seq,
)
from actors.wire import (
    CallDone,
    CallError,
    CancelRequest,
    CatalogEntry,
    ChunkDone,
    DeadLetter,
    ExecutionStatus,
    IterationResult,
    LoopProgress,
    ParentRef,
    ResultBatch,
    StartMessage,
    StartRecord,
    encode,
    input_decoder,
    loop_input_decoder,
    status_decoder,
)
from streams.ids import cancel_id, start_id
from streams.layout import (
    DLQ_STREAM,
    EV,
    EXEC_STREAM,
    EXECUTION_ID,
    IN,
    LC,
    LOOP_STREAM,
    START_STREAM,
    START_SUBJECT,
    STATUS_BUCKET,
    Layout,
    class_of,
    progress_subject,
)

WATCH_ROUND = 10.0  # seconds a status watch runs before it is checked and renewed
_dead = msgspec.json.Decoder(DeadLetter)
_progress = msgspec.json.Decoder(LoopProgress)
# room a message needs around the value it carries (ids, limits, headers): what a
# value may use is the message limit minus this
MESSAGE_HEADROOM = 16 * 1024
START_RECORD_WAIT = 5.0  # seconds start_execution waits for the record of a start already queued
T = TypeVar("T")
# what a publish raises once its budget is spent: still refused, or still no PubAck
PUBLISH_FAILED: tuple[type[BaseException], ...] = (*TRANSIENT_REQUEST, PublishOutcomeUnknown)


class InvalidExecutionId(ValueError):
    pass


class TooLarge(ValueError):
    """A value bigger than a message may carry; the message names it and its size."""


def check_execution_id(execution_id: str) -> str:
    """The id itself, or InvalidExecutionId: it becomes a subject token and a KV key,
    where `*`, `>` and `.` would address other executions."""
    if not EXECUTION_ID.fullmatch(execution_id):  # fullmatch: `$` alone lets a trailing newline through
        raise InvalidExecutionId(f"execution id {execution_id!r} is not valid: it must match {EXECUTION_ID.pattern}")
    return execution_id


def check_size(what: str, size: int, limit: int) -> None:
    """The one place that decides whether a value fits in a message: raise TooLarge
    naming `what` when `size` (encoded bytes) is over `limit`."""
    if size > limit:
        raise TooLarge(
            f"{what} is {size:,} bytes encoded, over the {limit:,} bytes a NATS message may carry "
            "here (the server's max_payload and the streams' max_msg_size, less an envelope)"
        )


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """What `Client.start_execution` did. `existing`: an execution with this id had
    been started before, so this start changed nothing and the first start's record
    is what runs. `differs`: for an existing one, what the running start has that this
    one did not ask for (`payload`, `playbook`, `version`); None when its record could
    not be read in time."""

    execution_id: str
    existing: bool = False
    differs: tuple[str, ...] | None = ()
    running: StartRecord | None = None


@dataclass(slots=True)
class LogItem:
    """One entry of an execution's history as users see it: an input, an event, or a
    dead letter, its data as plain JSON values (what `actors-cli events --json` prints)."""

    seq: int
    at: float
    cls: str  # in | ev | lc | dlq
    type: str
    step: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "class": self.cls,
            "type": self.type,
            "step": self.step,
            "data": self.data,
        }


def log_items(subject: str, data: bytes, seq: int, at: float) -> list[LogItem]:
    """Expand one stored message into the events it holds (a decision record holds
    several)."""
    cls = class_of(subject)
    try:
        if cls == EV:
            rec = decision_decoder.decode(data)
            return [LogItem(seq, ev.at, EV, str(ev.type), ev.step, msgspec.to_builtins(ev.data)) for ev in rec.events]
        if cls == LC:
            ev = event_decoder.decode(data)
            return [LogItem(seq, ev.at, LC, str(ev.type), ev.step, msgspec.to_builtins(ev.data))]
        inp = input_decoder.decode(data)
        raw = msgspec.to_builtins(inp)
        type_ = raw.pop("type")
        raw.pop("execution_id", None)
        raw.pop("playbook_source", None)  # the whole playbook: too long to show per event
        return [LogItem(seq, at, IN, type_, raw.pop("step", None), raw)]
    except msgspec.DecodeError as e:
        return [LogItem(seq, at, cls, "undecodable", None, {"error": str(e)})]


class Client:
    """`timeout`: seconds each call keeps trying through an election or a reconnect
    before it raises NatsUnavailable."""

    def __init__(self, nc: NATS, *, layout: Layout, timeout: float = CLIENT_TIMEOUT) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.layout = layout
        self.timeout = timeout
        # a publish without a PubAck is re-sent only within the streams' duplicate window
        publisher(nc).duplicate_window = layout.duplicate_window

    async def _ride(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` (idempotent), asked again through an election or a reconnect; past
        the timeout NatsUnavailable says that `what` failed."""
        try:
            return await ride_out(call, budget=self.timeout)
        except TRANSIENT_REQUEST as e:
            raise NatsUnavailable(f"NATS did not answer within {self.timeout:g}s: {what} failed ({_why(e)})") from e

    async def _publish(self, what: str, subject: str, data: bytes, msg_id: str) -> PubAck:
        """A JetStream publish, sent again with the same Nats-Msg-Id until the stream
        acks it or the timeout passes (then NatsUnavailable)."""
        try:
            acks = await publisher(self.nc).send([(subject, data, {MSG_ID: msg_id})], budget=self.timeout)
        except PUBLISH_FAILED as e:
            # a copy may have been stored with its PubAck lost: the same id makes a re-send harmless
            raise NatsUnavailable(
                f"NATS did not confirm {what} within {self.timeout:g}s; it may or may not "
                f"have been stored, and sending it again (same id) is safe ({_why(e)})"
            ) from e
        return acks[0]

    def value_limit(self) -> int:
        """Bytes a value (a playbook source, a payload) may take in one message: the
        smaller of the streams' and the server's message limit, less the envelope."""
        server = self.nc.max_payload or self.layout.max_msg_size
        return min(self.layout.max_msg_size, server) - MESSAGE_HEADROOM

    async def register(self, path: str | Path) -> CatalogEntry:
        p = Path(path)
        source = await asyncio.to_thread(p.read_text)
        check_size(f"{p}: the playbook", len(msgspec.json.encode(source)), self.value_limit())
        # registering the same source again returns the version it got: safe to ask again
        return await self._ride(f"registering {p}", lambda: catalog.register(self.js, source, file=str(p)))

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    async def start(
        self,
        playbook: str,
        *,
        payload: dict[str, Any] | None = None,
        version: int | None = None,
        execution_id: str | None = None,
        parent: ParentRef | None = None,
    ) -> str:
        """Publish a start message; returns the execution id. A start with the id of an
        existing execution changes nothing (see `start_execution` to find out)."""
        eid = check_execution_id(execution_id or uuid.uuid4().hex)
        msg = StartMessage(playbook=playbook, version=version, payload=payload or {}, execution_id=eid, parent=parent)
        # a payload too large for the message goes as a blob; past the cap: ValueTooLarge
        limit = self.value_limit()
        what = f"the start of execution {eid}"
        msg = await self._ride(
            what, lambda: start_payload(self.js, msg, eid, limit=limit, cap=self.layout.max_value_bytes)
        )
        await self._publish(what, START_SUBJECT, encode(msg), start_id(eid))
        return eid

    async def start_execution(
        self,
        playbook: str,
        *,
        payload: dict[str, Any] | None = None,
        version: int | None = None,
        execution_id: str | None = None,
        record_wait: float = START_RECORD_WAIT,
    ) -> StartOutcome:
        """`start`, checked: says whether an execution with this id already exists
        (then nothing is published) and how its start differs from this one, and
        refuses a payload that would not fit in the start record with the playbook.
        A few round trips more than `start`: for people and scripts, not floods."""
        eid = check_execution_id(execution_id or uuid.uuid4().hex)
        payload = payload or {}
        what = f"the start of execution {eid}"
        running = await self._ride(what, lambda: self._start_record(eid))
        if running is None:
            try:
                entry = await self._ride(what, lambda: CatalogReader(self.js).resolve(playbook, version))
            except CatalogError:
                entry = None  # the execution starts and fails with PlaybookNotFound, as with `start`
            size = len(msgspec.json.encode(payload))
            source = len(msgspec.json.encode(entry.source)) if entry is not None else 0
            msg = StartMessage(playbook=playbook, version=version, payload=payload, execution_id=eid)
            if size + source > self.value_limit():
                # the start record carries payload and playbook source: a payload that does
                # not fit beside the source goes as a blob (past the cap: ValueTooLarge)
                cap = self.layout.max_value_bytes
                ref = await self._ride(what, lambda: payload_blob(self.js, payload, eid, cap=cap))
                msg = msgspec.structs.replace(msg, payload={}, payload_ref=ref)
            ack = await self._publish(what, START_SUBJECT, encode(msg), start_id(eid))
            if not ack.duplicate:
                return StartOutcome(eid)
            # a start with this id is still queued (the server dropped ours as its
            # duplicate): its record, once written, is what runs. (A copy of ours whose
            # PubAck an election lost also comes back a duplicate: then the record is ours.)
            running = await self._ride(what, lambda: self._await_start_record(eid, record_wait))
            if running is None:
                return StartOutcome(eid, existing=True, differs=None)
        differs = tuple(
            name
            for name, differ in (
                ("playbook", running.playbook_path != playbook),
                ("version", version is not None and running.playbook_version != version),
                ("payload", running.payload != payload),
            )
            if differ
        )
        return StartOutcome(eid, existing=True, differs=differs, running=running)

    async def _start_record(self, execution_id: str) -> StartRecord | None:
        subject = self.layout.execution(execution_id).start
        try:
            msg = await self.nc.jsm().get_last_msg(EXEC_STREAM, subject, direct=True)
        except NotFoundError:
            return None
        record = input_decoder.decode(msg.data or b"")
        return record if isinstance(record, StartRecord) else None

    async def _await_start_record(self, execution_id: str, timeout: float) -> StartRecord | None:
        subject = self.layout.execution(execution_id).start
        sub = await self.js.subscribe(subject, stream=EXEC_STREAM, ordered_consumer=True)
        try:
            msg = await sub.next_msg(timeout=timeout)
        except TimeoutError:
            return None
        finally:
            await sub.unsubscribe()
        record = input_decoder.decode(msg.data)
        return record if isinstance(record, StartRecord) else None

    async def exists(self, execution_id: str, *, timeout: float = 10.0) -> bool | None:
        """Whether the execution exists: True once its start record is in its log;
        False when it is not and no start message queued before this call is left to
        write it; None when such messages were still queued after `timeout` seconds
        (no engine running, or a long queue): it cannot be told yet."""
        check_execution_id(execution_id)
        return await self._ride(f"looking up execution {execution_id}", lambda: self._exists(execution_id, timeout))

    async def _exists(self, execution_id: str, timeout: float) -> bool | None:
        if await self._start_record(execution_id) is not None:
            return True
        jsm = self.nc.jsm()
        queued = (await jsm.stream_info(START_STREAM)).state
        if not queued.messages:
            return False  # a start message is acked only after its record is written
        # one of the queued messages may be this execution's start: wait for its record,
        # or until every message queued now has been handled (a work queue drops a
        # message when acked: the first sequence then moves past the last one seen now)
        upto = queued.last_seq
        subject = self.layout.execution(execution_id).start
        sub = await self.js.subscribe(subject, stream=EXEC_STREAM, ordered_consumer=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    await sub.next_msg(timeout=max(0.01, min(0.25, deadline - loop.time())))
                    return True
                except TimeoutError:
                    pass
                state = (await jsm.stream_info(START_STREAM)).state
                if not state.messages or state.first_seq > upto:
                    return await self._start_record(execution_id) is not None
                if loop.time() >= deadline:
                    return None
        finally:
            await sub.unsubscribe()

    async def cancel(self, execution_id: str, reason: str = "") -> None:
        subject = self.layout.execution(check_execution_id(execution_id)).cancel
        await self._publish(
            f"the cancel of execution {execution_id}",
            subject,
            encode(CancelRequest(execution_id=execution_id, reason=reason)),
            cancel_id(execution_id),
        )

    async def status(self, execution_id: str) -> ExecutionStatus | None:
        check_execution_id(execution_id)
        return await self._ride(
            f"reading the status of execution {execution_id}", lambda: self._status_once(execution_id)
        )

    async def _status_once(self, execution_id: str) -> ExecutionStatus | None:
        kv = await self.js.key_value(STATUS_BUCKET)
        try:
            entry = await kv.get(check_execution_id(execution_id))
        except KeyNotFoundError:
            return None
        return status_decoder.decode(entry.value or b"")

    async def wait(self, execution_id: str, *, timeout: float | None = None) -> ExecutionStatus:
        """Wait until the projected status is terminal (the status KV is the only
        authority on it). Rides out a NATS node going away: a watch that fails or goes
        quiet is checked against the key and started again."""
        check_execution_id(execution_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError(f"execution {execution_id} not terminal after {timeout}s")
            try:
                return await asyncio.wait_for(self._watch_terminal(execution_id), min(left or WATCH_ROUND, WATCH_ROUND))
            except (TimeoutError, nats.errors.Error):
                try:
                    st = await self._status_once(execution_id)  # the watch's own rounds are the retries
                except (TimeoutError, nats.errors.Error):
                    st = None
                if st is not None and st.state in TERMINAL_STATES:
                    return st

    async def _watch_terminal(self, execution_id: str) -> ExecutionStatus:
        kv = await self.js.key_value(STATUS_BUCKET)
        watcher = await kv.watch(execution_id)
        try:
            while True:
                entry = await watcher.updates(timeout=3600)  # type: ignore[no-untyped-call]
                if entry is None or not entry.value:
                    continue
                st = status_decoder.decode(entry.value)
                if st.state in TERMINAL_STATES:
                    return st
        finally:
            try:
                await watcher.stop()  # type: ignore[no-untyped-call]
            except Exception:
                pass

    async def follow(self, execution_id: str, *, until_terminal: bool = True) -> AsyncIterator[LogItem]:
        """The execution's log from its start, then live."""
        prefix = self.layout.exec_prefix(check_execution_id(execution_id))
        sub = await self.js.subscribe(f"{prefix}.>", stream=EXEC_STREAM, ordered_consumer=True, pending_msgs_limit=-1)
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                for item in log_items(msg.subject, msg.data, stream_seq(msg), log_time(msg)):
                    yield item
                    if until_terminal and item.cls == LC and item.type in TERMINAL_EVENTS:
                        return
        finally:
            await sub.unsubscribe()

    async def events(self, execution_id: str) -> list[LogItem]:
        """The whole log as it is now, in order, then this execution's dead letters."""
        prefix = self.layout.exec_prefix(check_execution_id(execution_id))
        what = f"reading the events of execution {execution_id}"
        items = await self._ride(what, lambda: self._read_all(EXEC_STREAM, f"{prefix}.>", log_items))
        items += await self._ride(what, lambda: self._read_all(DLQ_STREAM, f"dlq.*.{execution_id}", _dead_items))
        return items

    async def result(self, terminal: LogItem) -> Any:
        """An execution's result from its terminal lifecycle event, read from the blob
        store when it was too large to travel in the event."""
        ref = terminal.data.get("result_ref")
        if ref:
            return await self._ride(f"reading result {ref}", lambda: get_blob(self.js, ref))
        return terminal.data.get("result")

    async def iterations(self, execution_id: str) -> list[CallDone | CallError | ChunkDone]:
        """Every iteration result of the execution's loops (the counter's logs, not the
        execution's), in arrival order. A batch of results is given as the `call.done`
        or `call.error` of each of its entries."""
        check_execution_id(execution_id)
        subject = f"loop.{self.layout.partition_of(execution_id)}.{execution_id}.*.{IN}.res.>"

        def expand(subject: str, data: bytes, seq: int, at: float) -> list[Any]:
            inp = loop_input_decoder.decode(data)
            if isinstance(inp, ResultBatch):
                return [_single(inp, r) for r in inp.results]
            return [inp] if isinstance(inp, (CallDone, CallError, ChunkDone)) else []

        return await self._read_all(LOOP_STREAM, subject, expand)

    async def progress(self, execution_id: str) -> AsyncIterator[LoopProgress]:
        """Live progress of the execution's loops (best effort, not stored)."""
        sub = await self.nc.subscribe(progress_subject(check_execution_id(execution_id)))
        try:
            async for msg in sub.messages:
                yield _progress.decode(msg.data)
        finally:
            await sub.unsubscribe()

    async def dead_letters(self, source: str = "*") -> list[LogItem]:
        return await self._read_all(DLQ_STREAM, f"dlq.{source}.>", _dead_items)

    async def _read_all(self, stream: str, subject: str, expand: Any) -> list[Any]:
        try:
            info = await self.nc.jsm().stream_info(stream, subjects_filter=subject)
        except NotFoundError:
            return []
        total = sum((info.state.subjects or {}).values())
        if not total:
            return []
        out: list[Any] = []
        sub = await self.js.subscribe(subject, stream=stream, ordered_consumer=True, pending_msgs_limit=-1)
        try:
            while True:
                msg = await sub.next_msg(timeout=10)
                out.extend(expand(msg.subject, msg.data, stream_seq(msg), log_time(msg)))
                if msg.metadata.num_pending == 0:
                    return out
        finally:
            await sub.unsubscribe()


def _why(e: BaseException) -> str:
    return "last error: " + (" ".join(str(e).split()) or type(e).__name__)


def _dead_items(subject: str, data: bytes, seq: int, at: float) -> list[LogItem]:
    try:
        d = _dead.decode(data)
        return [
            LogItem(
                seq,
                at,
                "dlq",
                f"dead_letter.{d.source}",
                None,
                {"reason": d.reason, "subject": d.subject, "data": d.data},
            )
        ]
    except msgspec.DecodeError as e:
        return [LogItem(seq, at, "dlq", "undecodable", None, {"error": str(e)})]


def _single(batch: ResultBatch, r: IterationResult) -> CallDone | CallError:
    """One entry of a result batch as the message it stands for."""
    common: dict[str, Any] = dict(
        execution_id=batch.execution_id,
        command_id=r.command_id,
        step=batch.step,
        attempt_number=r.attempt_number,
        started_at=r.started_at,
        ended_at=r.ended_at,
        worker=batch.worker,
        iteration_index=r.iteration_index,
    )
    if r.error is not None:
        return CallError(error=r.error, **common)
    return CallDone(result=r.result, **common)
