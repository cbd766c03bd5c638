"""The starter: turns start messages (stream START) into an execution's first input.

It validates the message, resolves the playbook in the catalog and writes a
StartRecord (with the playbook source copied in) to `exec.<p>.<id>.in.start`; from
semantics 6 it first asks the engine pod owning the execution's partition to store the
record with the first decision, as the log's first input (`Starter._write`). A
message it cannot use (not JSON, a bad field, nested too deep to decode: measured on
its text first, actors/wire/nesting.py) goes to `dlq.start.<execution_id>` with the reason
(`dlq.start._` when it names no usable id); a message with a usable execution id but an unknown
playbook still starts that execution, which fails at once with the reason in its
`playbook.failed` event, so whoever watches that id sees why. One execution per
execution_id: the record's Nats-Msg-Id is derived from the id, and beyond the server's
duplicate window the existing start record is looked up.

A start sent as a request on `start.request` (core NATS, a queue group of the
starters) is answered on its reply subject with a `StartReply`: the execution id once
its start record is written, or why it was refused. There the caller is told, so a
start that would only fail (unknown playbook or version, a catalog path that is not
one, a catalog record that cannot be read, a payload past the cap) is refused instead:
nothing is written but its dead letter, and the same id may be sent again once the
playbook is registered. A request with the header `START_AS_MESSAGE` is
handled as the same start published to START would be (`Client.start` sends its starts
that way: one hop less than through the stream, the same outcome).

It also reads schedules' fires (stream SCHEDULES, actors/engine/fires.py): each is a
start whose execution id is derived from the schedule and the fire time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from actors.core.replay import SEMANTICS
from actors.engine.actor import START_ANSWERS, STORED
from actors.engine.fires import fire_start
from actors.natsio import (
    EXPECTED_LAST_SUBJECT_FILTER,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    MSG_ID,
    ack,
    dead_letter,
    num_delivered,
    publish_all,
    resent_after_lost_puback,
    send,
    start_message,
    stream_seq,
    subject_taken,
)
from actors.natsio.binding import codec_of
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.replies import is_inbox
from actors.natsio.requests import requester
from actors.runtime.keyed_limiter import KeyedLimiter, stop_grace
from actors.runtime.ownership import semantics_in_use
from actors.runtime.stopping import cancel_and_wait
from actors.runtime.supervision import POISON_TRIES, is_transient
from actors.runtime.tracing import from_headers
from actors.store.blobs import HEADROOM, ValueTooLarge, payload_blob
from actors.store.catalog import CatalogError, CatalogReader, CatalogRecordInvalid
from actors.wire.codec import CLEAR, PayloadCodec, PayloadUnreadable
from actors.wire.messages import (
    INVALID_START,
    ErrorInfo,
    Limits,
    RequestError,
    RetriedBy,
    RetryOf,
    StartMessage,
    StartRecord,
    StartReply,
    encode,
)
from actors.wire.nesting import MAX_DEPTH, START_MESSAGE_DEPTH, TooDeep, json_within, too_deep, value_within
from streams.ids import retried_id, start_record_id
from streams.layout import (
    EXECUTION_ID,
    OWNERS_BUCKET,
    SCHEDULE_FIRES_CONSUMER,
    STARTER_CONSUMER,
    Layout,
    deliver_subject,
)
from streams.subjects import START_AS_MESSAGE, START_REQUEST_SUBJECT, START_WAIT, start_ask_subject

log = logging.getLogger("actors.starter")
ASK_TIMEOUT = 2.0  # seconds an ask may take (a tool's too: actors/tools/running.py); then looked up
# what an ask to store a start with its first decision came to (`Starter._ask`), and a
# start found stored by another
_STORED, _REFUSED, _NOT_SERVED, _UNKNOWN, _FOUND = "stored", "refused", "not served", "unknown", "found"
_start_decoder = msgspec.json.Decoder(StartMessage)
_NAMESPACE = uuid.UUID("6f1c2b1e-3d0a-4c55-9a4f-5b7e0e2a9c11")


class _Named(msgspec.Struct):
    """Only the execution id of a start message, read even when the rest is bad."""

    execution_id: Any = None


_named_decoder = msgspec.json.Decoder(_Named)


def named_execution_id(data: bytes) -> str | None:
    """The execution id a start message names, when it is a usable one, however bad the
    rest of the message: its dead letter goes under that id, where `events ID` finds it.
    None for a message nested too deep to decode (the decoder recurses even over the
    fields it skips)."""
    if not json_within(data, START_MESSAGE_DEPTH):
        return None
    try:
        eid = _named_decoder.decode(data).execution_id
    except msgspec.DecodeError:
        return None
    return eid if isinstance(eid, str) and EXECUTION_ID.fullmatch(eid) else None


_TOO_DEEP = (
    f"invalid start message: it nests deeper than {START_MESSAGE_DEPTH} levels of lists and mappings, "
    f"too deep to read (a payload may nest {MAX_DEPTH})"
)


def parse_start(data: bytes, codec: PayloadCodec = CLEAR) -> StartMessage | ErrorInfo:
    """The start message (its payload decrypted), or why it cannot be used
    (`InvalidStart`, `PayloadUnreadable`: one line). Its nesting is measured before it
    is decoded (actors/wire/nesting.py): a decoder meeting a payload 3,000 levels deep raises
    RecursionError, where the start must be refused and dead-lettered like any other.
    (A payload deeper than `MAX_DEPTH` but readable is the record's error: `_record`.)"""
    if not json_within(data, START_MESSAGE_DEPTH):
        return ErrorInfo(type=INVALID_START, message=_TOO_DEEP)
    try:
        start = codec.decode(_start_decoder, data)
    except PayloadUnreadable as e:
        return ErrorInfo(type="PayloadUnreadable", message=f"start message: {e}")
    except msgspec.ValidationError as e:
        return ErrorInfo(type=INVALID_START, message=f"invalid start message: {e}")
    except msgspec.DecodeError as e:
        return ErrorInfo(type=INVALID_START, message=f"start message is not JSON: {e}")
    eid = start.execution_id
    if eid is not None and not EXECUTION_ID.fullmatch(eid):
        return ErrorInfo(
            type=INVALID_START,
            message=f"invalid start message: field execution_id {eid!r} must match {EXECUTION_ID.pattern}",
        )
    return start


def _trace_context(msg: Msg) -> tuple[str | None, str | None]:
    """The start message's W3C trace context (its headers), as the start record keeps
    it: the parent of the execution's span (docs/tracing.md). A malformed `traceparent`
    is not kept, nor a `tracestate` W3C would not have (`tracing.valid_tracestate`: at
    most 32 members, 512 bytes): it would ride every record and command of the run."""
    parent = from_headers(msg.headers)
    return (parent.traceparent, parent.tracestate) if parent is not None else (None, None)


def _given_up(msg: Msg, received: float) -> bool:
    """Has the caller stopped waiting for this request (`START_WAIT`) while it sat in
    the backlog? `Client.start` has then sent the start to stream START."""
    try:
        wait = float((msg.headers or {}).get(START_WAIT, "inf"))
    except ValueError:
        return False
    return time.monotonic() - received > wait


# Start messages handled at once (actors/runtime/keyed_limiter.py): each costs a few round trips and
# starts of different executions do not depend on each other. Starts of one execution
# id take turns: the second must see the first's record, not race it past the
# duplicate window.
STARTS_IN_FLIGHT = 64


class Starter:
    def __init__(self, nc: NATS, *, layout: Layout, limits: Limits, in_flight: int = STARTS_IN_FLIGHT) -> None:
        self.nc = nc
        self.limits = limits  # the pod's (`Settings.limits`), fixed in every record it writes
        self.js = nc.jetstream()
        self.layout = layout
        self.catalog = CatalogReader(self.js)
        self._sub: Subscription | None = None
        self._requests: Subscription | None = None
        self._fires: Subscription | None = None
        self._limiter = KeyedLimiter(limit=in_flight, what="starter")
        # the semantics new executions start under: the lowest the live engine pods run
        # (a rolling upgrade starts none an older engine would halt), refreshed as leases are
        self.semantics = SEMANTICS
        self._gate: asyncio.Task[None] | None = None

    async def _refresh_semantics(self) -> None:
        while True:
            await asyncio.sleep(self.layout.lease_ttl / 4)  # as often as leases are renewed
            try:
                found = await semantics_in_use(self.nc, await self.js.key_value(OWNERS_BUCKET))
            except Exception as e:  # NATS unreachable: keep the last answer
                log.warning("starter: engine pods' semantics not read: %s", e)
            else:
                if found != self.semantics:
                    log.info("starter: new executions start under semantics %d (engine pods run %d)", found, found)
                self.semantics = found

    async def start(self) -> None:
        try:
            self.semantics = await semantics_in_use(self.nc, await self.js.key_value(OWNERS_BUCKET))
        except Exception as e:  # not known yet: the oldest, which every engine pod runs, until the next look
            log.warning("starter: engine pods' semantics not read: %s", e)
            self.semantics = 1
        self._gate = asyncio.create_task(self._refresh_semantics(), name="starter:semantics")
        name = STARTER_CONSUMER
        # handed over as read (actors/natsio/dispatch.py); the limiter bounds the work at once
        self._sub = await subscribe_direct(self.nc, deliver_subject(name), self._on_msg, queue=name)
        self._requests = await subscribe_direct(self.nc, START_REQUEST_SUBJECT, self._on_request, queue=name)
        fires = SCHEDULE_FIRES_CONSUMER
        self._fires = await subscribe_direct(self.nc, deliver_subject(fires), self._on_fire, queue=fires)

    async def stop(self) -> None:
        """Stop taking start messages, requests and fires, and finish those being handled
        (each takes a few round trips; one that cannot finish within `STOP_GRACE`, or at
        all with NATS gone, is cut short, not acked, and comes back)."""
        for sub in (self._requests, self._sub, self._fires):
            if sub is not None:
                await sub.unsubscribe()
        self._requests = self._sub = self._fires = None
        await self._limiter.drain(grace=stop_grace(self.nc.is_connected))
        await cancel_and_wait([self._gate])

    def _on_request(self, msg: Msg) -> None:
        if not msg.reply or self._requests is None:
            return  # no one to answer (a plain publish is not stored either: it is not a start)
        if not is_inbox(msg.reply):
            # the pod may publish where a requester may not (lifecycle subjects, leases): an
            # answer goes only to an inbox, never where a request points it
            log.warning("starter: a start request named reply subject %.80r, not an inbox: ignored", msg.reply)
            return
        self._limiter.submit(functools.partial(self._answer, msg, time.monotonic()))

    async def _answer(self, msg: Msg, received: float) -> None:
        if _given_up(msg, received):
            log.info("starter: a start request waited past its caller's wait; left to stream START")
            return
        try:
            reply = await self.handle_request(msg)
        except Exception as e:
            log.exception("starter: failed to handle a start request")
            # nothing written for it is lost: the same request (same id) may be sent again
            reply = StartReply(
                execution_id=named_execution_id(msg.data),
                started=False,
                error=RequestError(type=type(e).__name__, message=str(e), retryable=is_transient(e)),
            )
        try:
            # the fast path (`Msg.respond` would also echo the request's headers back)
            await send(self.nc, msg.reply, encode(reply))
        except Exception:
            log.exception("starter: could not answer a start request")  # the caller's request times out

    def _on_msg(self, msg: Msg) -> None:
        if not msg.reply or self._sub is None:
            return  # a status message, or stopping: unacked, it comes back to a starter
        self._limiter.submit(functools.partial(self._handle_one, msg, self.handle, "start"))

    def _on_fire(self, msg: Msg) -> None:
        if not msg.reply or self._fires is None:
            return
        self._limiter.submit(functools.partial(self._handle_one, msg, self.handle_fire, "schedule"))

    async def _handle_one(self, msg: Msg, handle: Callable[[Msg], Awaitable[None]], source: str) -> None:
        try:
            await handle(msg)
        except Exception as e:
            if is_transient(e) or num_delivered(msg) < POISON_TRIES:
                log.exception("starter: failed to handle a start message")
                return  # not acked: it comes back after ack_wait
            # the same message failed the same way every time: it will not start, say why
            try:
                await dead_letter(
                    self.js,
                    source=source,
                    reason=f"{source} message could not be handled: {type(e).__name__}: {e}",
                    msg=msg,
                    execution_id=named_execution_id(msg.data),
                )
            except Exception:
                log.exception("starter: could not dead-letter a start message")
                return
        await ack(msg)  # a plain publish to the reply subject (actors/natsio/fast.py)

    async def handle(self, msg: Msg) -> None:
        start = parse_start(msg.data, codec_of(self.nc))
        if isinstance(start, ErrorInfo):
            await self._refuse(msg, start)
            return
        # deterministic: the same start message (by its stream position) gets the same id
        eid = start.execution_id or uuid.uuid5(_NAMESPACE, f"{stream_seq(msg)}:{msg.metadata.timestamp}").hex
        async with self._limiter.turn(eid):
            if not await self._write(await self._record(eid, start, _trace_context(msg))):
                log.info("starter: execution %s already started; duplicate start ignored", eid)

    async def handle_fire(self, msg: Msg) -> None:
        """A schedule's fire: the start it carries, under the id derived from the
        schedule and the fire time (a second delivery finds that execution started)."""
        try:
            eid, start = fire_start(msg, codec_of(self.nc))
        except (msgspec.DecodeError, PayloadUnreadable, TooDeep) as e:  # ValidationError included
            await dead_letter(self.js, source="schedule", reason=f"invalid schedule fire: {e}", msg=msg)
            return
        async with self._limiter.turn(eid):
            await self._write(await self._record(eid, start))

    async def handle_request(self, msg: Msg) -> StartReply:
        """A start sent as a request: started, or refused with the reason (and dead-lettered).
        As a message (`START_AS_MESSAGE`): a start that cannot run is started, failing."""
        start = parse_start(msg.data, codec_of(self.nc))
        if isinstance(start, ErrorInfo):
            return await self._refuse(msg, start)
        # a request is not stored anywhere: an id of its own cannot be derived from a
        # stream position, so a caller that may send it again must name one
        eid = start.execution_id or uuid.uuid4().hex
        as_message = bool(msg.headers and msg.headers.get(START_AS_MESSAGE))
        async with self._limiter.turn(eid):
            record = await self._record(eid, start, _trace_context(msg))
            if record.error is not None and not as_message:
                if await start_message(self.nc, self.layout.exec_stream_of(eid), self.layout.execution(eid)):
                    await self._link_retry(eid, start.retry_of)
                    return StartReply(execution_id=eid, started=True, existing=True)
                return await self._refuse(msg, record.error, eid)
            if not await self._write(record):
                return StartReply(execution_id=eid, started=True, existing=True)
        return StartReply(execution_id=eid, started=True)

    async def _refuse(self, msg: Msg, error: ErrorInfo, eid: str | None = None) -> StartReply:
        """Dead-letter a start that will not run, under the execution id it names."""
        eid = eid or named_execution_id(msg.data)
        await dead_letter(self.js, source="start", reason=error.message, msg=msg, execution_id=eid)
        return StartReply(execution_id=eid, started=False, error=RequestError.of(error))

    async def _record(
        self, eid: str, start: StartMessage, traced: tuple[str | None, str | None] = (None, None)
    ) -> StartRecord:
        """The start record for the message (whether the execution was started before
        is for `_write` to find out), with the trace context `traced` (`_trace_context`),
        set before its size is checked: what is measured is what is written."""
        record = StartRecord(
            execution_id=eid,
            playbook_path=start.playbook,
            playbook_version=start.version,
            payload=start.payload,
            payload_ref=start.payload_ref,
            parent=start.parent,
            limits=self.limits,
            retry_of=start.retry_of,
            semantics=self.semantics,  # the engine semantics it runs under, for its whole life (docs/upgrades.md)
            traceparent=traced[0],
            tracestate=traced[1],
        )
        if not value_within(record.payload):
            # refused on request; from the stream the execution starts failed saying so
            # (a child's parent hears of it), its payload left out: nothing walks it
            record.error = ErrorInfo(type=INVALID_START, message=f"invalid start message: {too_deep('field payload')}")
            record.payload = {}
            return record
        try:
            entry = await self.catalog.resolve(start.playbook, start.version)
            record.playbook_source, record.playbook_version = entry.source, entry.version
            record.playbook_file = entry.file
        except CatalogError as e:
            # an unknown playbook, a path that is not one, a catalog record that cannot be
            # read: the start is refused (a request) or fails saying so, never retried
            if isinstance(e, CatalogRecordInvalid):
                log.warning("starter: execution %s cannot start: %s", eid, e)
            record.error = ErrorInfo(type=e.error_type, message=str(e))
        await self._payload_fits(record)
        return record

    async def _write(self, record: StartRecord) -> bool:
        """Write the start record unless the execution has one: True when this wrote it.

        From semantics 6 (a record with no `error`) the engine pod owning the
        execution's partition is asked first to store it with the first decision, as
        the log's first input (`_ask`; the engine's `ExecutionActor.store_start`): one
        stored message where there were two, one after the other, on every execution's
        way. Refused, or no engine pod serving asks there (`ACTORS_FAST_ANSWERS=0`, a
        stream of three replicas, a cancel sent before the start...), it is written as
        before (`_write_plain`); an ask whose outcome is not known (a timeout, the
        connection lost) is looked up first (`start_message`), so it never makes a
        second start. Either way the retry link is written (in case the first handling
        stopped before it)."""
        eid = record.execution_id
        data = codec_of(self.nc).encode(record)
        asked = None
        if record.semantics >= START_ANSWERS and record.error is None:
            asked = await self._ask(eid, data)
            if asked == _UNKNOWN:  # maybe stored: looked up before a plain start is written
                found = await start_message(self.nc, self.layout.exec_stream_of(eid), self.layout.execution(eid))
                if found is not None:
                    asked = _STORED if found[1] == data else _FOUND
            if asked in (_STORED, _FOUND):  # stored now (by this ask), or found: another start's
                await self._link_retry(eid, record.retry_of)
                return asked == _STORED
        # checked over the inputs whether or not asks are served now: a start answer may
        # be there from when they were (ACTORS_FAST_ANSWERS=0 since, a partition between
        # owners), and its subject is not `in.start`
        wrote = await self._write_plain(
            eid, data, over_inputs=record.semantics >= START_ANSWERS, asked_unknown=asked == _UNKNOWN
        )
        await self._link_retry(eid, record.retry_of)
        return wrote

    async def _write_plain(self, eid: str, data: bytes, *, over_inputs: bool, asked_unknown: bool = False) -> bool:
        """Store the start record on its own subject unless the execution has one: True
        when this stored it.

        One execution per id, in one round trip: the record is stored only while its
        subject is empty (the server checks, `EXPECTED_LAST_SUBJECT_SEQUENCE`), where a
        lookup of the subject first (`has_message`) cost a request more per start.
        The server makes that check before the duplicate window's: a second copy is
        refused whatever its message id, even our own re-sent after a lost PubAck.

        `over_inputs` (a record of semantics 6 on): the start of such an execution may
        be stored with its first decision, on another subject (`in.answer...`), now or
        when asks were served (they may not be now: ACTORS_FAST_ANSWERS=0, a partition
        between owners): the record is then stored only while the execution has no
        input at all (the check over `exec.<p>.<id>.in.>`; a nats-server before 2.11
        ignores the filter and checks `in.start`, where no start answer is). A refusal is
        looked up (`start_message`): a start there, stored either way, is the one that
        runs; none (a cancel or a signal sent before the start came first) and it is
        stored on its own subject's check as before. So a start stored with its first
        decision is never followed by a plain one, however late (the same message id
        would cover only the duplicate window).

        A start found is this call's when this call may have stored it and its bytes are
        these: a copy whose PubAck was lost, the re-send refused by the check (which the
        server makes before the duplicate window's: `resent_after_lost_puback`), or the
        start answer of an ask with no answer (`asked_unknown`) stored after it was
        looked up. Else it is an existing execution's, even with the same bytes (the
        same start sent again)."""
        subjects = self.layout.execution(eid)
        headers = {EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
        if over_inputs:
            headers[EXPECTED_LAST_SUBJECT_FILTER] = subjects.inputs
        mine = asked_unknown  # may this call have stored the start that is there?
        try:
            # re-sent through an election
            (ack,) = await publish_all(self.js, [(subjects.start, data, start_record_id(eid))], headers=[headers])
            if not ack.duplicate:
                return True
        except Exception as e:
            if not subject_taken(e):
                raise
            mine = mine or resent_after_lost_puback(e)
        # refused (or a duplicate of the start record's id, which a start answer shares)
        found = await start_message(self.nc, self.layout.exec_stream_of(eid), subjects)
        if found is not None:
            return mine and found[1] == data
        if not over_inputs:
            return False  # (retired since the refusal)
        return await self._write_plain(eid, data, over_inputs=False, asked_unknown=asked_unknown)

    async def _ask(self, eid: str, data: bytes) -> str:
        """Ask the engine pod owning `eid`'s partition to store its start record
        (`data`) with its first decision (semantics 6, on `answer.start.<p>`, which only
        the engine user may publish): `_STORED` once it says so; `_REFUSED` when it refused (it
        serves asks there: nothing stored); `_NOT_SERVED` when no engine pod serves
        asks there (no responders); `_UNKNOWN` when no answer came (a timeout, the
        connection lost: it may be stored)."""
        subject = start_ask_subject(self.layout.partition_of(eid))
        try:
            reply = await requester(self.nc).request(
                subject, data, timeout=ASK_TIMEOUT, headers={MSG_ID: start_record_id(eid)}
            )
        except NoRespondersError:
            return _NOT_SERVED
        except Exception as e:  # a timeout, the connection away: maybe stored
            log.info("starter: asking to store the start of %s with its first decision: %r", eid, e)
            return _UNKNOWN
        if reply == STORED.encode():
            return _STORED
        log.debug("starter: the start of %s stored plain: %s", eid, reply[:200].decode(errors="replace"))
        return _REFUSED

    async def _link_retry(self, eid: str, retry: RetryOf | None) -> None:
        """A retry's start also goes into the retried execution's log (`RetriedBy`,
        folded into an `execution.retried` event there), so both logs name each other."""
        if retry is None or not EXECUTION_ID.fullmatch(retry.execution_id):
            return
        link = RetriedBy(execution_id=retry.execution_id, retry_execution_id=eid, from_step=retry.from_step)
        subject = self.layout.execution(retry.execution_id).retried
        await publish_all(self.js, [(subject, codec_of(self.nc).encode(link), retried_id(retry.execution_id, eid))])

    async def _payload_fits(self, record: StartRecord) -> None:
        """A payload that fits in its start message may not fit beside the playbook
        source: it then goes to a blob the engine reads back (same key as the client
        would use). Past the cap the execution starts failed, saying why."""
        limit = self.layout.max_msg_size - HEADROOM
        if record.payload_ref is not None or len(codec_of(self.nc).encode(record)) <= limit:
            return
        try:
            record.payload_ref = await payload_blob(
                self.js, record.payload, record.execution_id, cap=self.layout.max_value_bytes
            )
        except ValueTooLarge as e:
            record.error = ErrorInfo(type="ValueTooLarge", message=str(e))
        record.payload = {}
