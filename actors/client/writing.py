"""The calls of a `Client` that write: register a playbook, start an execution (checked
against one that exists already), cancel one. Each publish carries its deterministic
Nats-Msg-Id (a start's is its execution id, a cancel's its execution's); `exists` reads
a start record, which is what a start or a cancel is checked against."""

from __future__ import annotations

import asyncio
import time
import unicodedata
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from nats.errors import Error as NatsError

from actors.client.checks import check_execution_id, check_size
from actors.client.outcome import ExecutionNotFound
from actors.client.session import Session
from actors.errors import UserError
from actors.natsio import MSG_ID, held_start, start_message
from actors.natsio.batchget import window
from actors.natsio.requests import requester
from actors.playbook.loader import read_playbook_text
from actors.runtime.tracing import caller_headers
from actors.store import catalog
from actors.store.blobs import payload_blob, start_payload
from actors.store.catalog import check_path
from actors.wire.messages import (
    UNREADABLE_START,
    CancelRequest,
    CatalogEntry,
    ParentRef,
    StartMessage,
    StartRecord,
    StartReply,
    encode,
    input_decoder,
)
from actors.wire.nesting import check_value_depth
from streams.ids import cancel_id, start_id
from streams.layout import START_STREAM, START_SUBJECT
from streams.subjects import START_AS_MESSAGE, START_REQUEST_SUBJECT, START_WAIT

START_RECORD_WAIT = 5.0  # seconds start_execution waits for the record of a start already queued
START_REQUEST_WAIT = 2.0  # seconds `start` waits for a starter's answer before it uses the stream
QUEUED_LOOK = 1000  # queued starts `start_queued` reads at most (one batched get)
MAX_REASON = 1000  # characters of a cancel's reason (it goes into the log and every status)
_start_reply_decoder = msgspec.json.Decoder(StartReply)


class StartRefused(UserError, ValueError):
    """A starter could not read the start as it was sent (a bad field, a payload sealed
    with a key the starters lack); it is dead-lettered under its execution id."""


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


class Writer(Session):
    """Register, start, cancel; and whether an execution exists."""

    async def register(self, path: str | Path) -> CatalogEntry:
        """Register the playbook file in the catalog; returns its entry (`path`, the
        catalog path to start, and `version`). The same source again gets the version
        it had; a new source gets the next one. A bad playbook raises PlaybookInvalid; a
        path that is not a regular file (a FIFO, a device), or one over the most a
        playbook may be, UnreadableFile (an OSError)."""
        p = Path(path)
        source = await asyncio.to_thread(read_playbook_text, p)
        check_size(f"{p}: the playbook", len(msgspec.json.encode(source)), self.value_limit())
        ceiling = self.limits.max_attempts  # retries bounded as the starters will bound them

        def register() -> Awaitable[CatalogEntry]:
            return catalog.register(self.js, source, file=str(p), max_attempts=ceiling)

        # registering the same source again returns the version it got: safe to ask again
        return await self._ride(f"registering {p}", register)

    @staticmethod
    def new_id() -> str:
        """A fresh execution id (32 hex digits)."""
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
        """Send a start message; returns the execution id once a starter has written
        its start record, or, when none answers within `START_REQUEST_WAIT`, once
        stream START has stored it for one to take. Either way it runs as a start on
        the stream does (an unknown playbook: an execution that fails saying why). A
        start with the id of an existing execution changes nothing (see
        `start_execution` to find out). StartRefused: the starters could not read it;
        CatalogPathInvalid: `playbook` is not a catalog path (nothing is sent)."""
        eid = check_execution_id(execution_id or uuid.uuid4().hex)
        check_path(playbook)
        check_value_depth("the payload", payload)  # before encoding it recurses (TooDeep, a ValueError)
        msg = StartMessage(playbook=playbook, version=version, payload=payload or {}, execution_id=eid, parent=parent)
        # a payload too large for the message goes as a blob; past the cap: ValueTooLarge
        limit = self.value_limit()
        what = f"the start of execution {eid}"
        data = self.codec.encode(msg)
        if len(data) > limit:
            msg = await self._ride(
                what, lambda: start_payload(self.js, msg, eid, limit=limit, cap=self.layout.max_value_bytes)
            )
            data = self.codec.encode(msg)
        began = time.monotonic()
        traced = caller_headers()  # the caller's trace context: its span parents the execution's
        if await self._started_by_request(eid, data, traced):
            return eid
        # no starter answered in time: the stream keeps the start until one takes it
        budget = self.timeout - (time.monotonic() - began)
        await self._publish(what, START_SUBJECT, data, start_id(eid), budget=budget, headers=traced)
        return eid

    async def _started_by_request(self, eid: str, data: bytes, traced: dict[str, str] | None = None) -> bool:
        """The start sent to the starters as a request (`start.request`, handled as the
        same start on the stream would be): True once a starter says its start record
        is written, which is all a start through the stream would have achieved, with
        one store and one delivery less. False when none answered in time (none
        running, a partition, a slow starter); then the caller publishes the start to
        the stream, where it waits for a starter. Sending both is harmless: a start
        record is written once per execution id."""
        wait = min(START_REQUEST_WAIT, self.timeout / 4)
        headers = {START_AS_MESSAGE: "1", START_WAIT: f"{wait:g}", **(traced or {})}
        try:
            answer = await requester(self.nc).request(START_REQUEST_SUBJECT, data, timeout=wait, headers=headers)
            reply = _start_reply_decoder.decode(answer)
        except (TimeoutError, NatsError, OSError, msgspec.DecodeError):
            return False
        if reply.started:
            return True
        if reply.error is not None and reply.error.type in UNREADABLE_START:
            # dead-lettered, as it would have been from the stream: say so now
            raise StartRefused(f"the start of execution {eid} was refused: {reply.error.message}")
        return False  # the starter's own failure: the stream's starter tries again (and dead-letters)

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
        A few round trips more than `start`: for people and scripts, not floods.
        PlaybookNotRegistered (an unknown playbook or version), CatalogPathInvalid, or
        CatalogRecordInvalid (a catalog record of the playbook that cannot be read,
        naming its key): nothing is sent."""
        eid = check_execution_id(execution_id or uuid.uuid4().hex)
        check_path(playbook)
        check_value_depth("the payload", payload)  # TooDeep (a ValueError): nothing is sent
        payload = payload or {}
        what = f"the start of execution {eid}"
        running = await self._ride(what, lambda: self._start_record(eid))
        if running is None and await self._ride(what, lambda: self.archives.has(eid)):
            # an execution of this id ran and was retired: an id names one execution for
            # ever (a second would be read as the first, and not archived over it)
            return StartOutcome(eid, existing=True, differs=None)
        if running is None:
            # an unknown playbook or version is refused here, nothing sent, as a start
            # request without START_AS_MESSAGE is refused by the starters: a person or a
            # script learns of a typo now, not from an execution that fails at once
            # (PlaybookNotRegistered: a UserError whose error_type is PlaybookNotFound)
            entry = await self._catalog_entry(playbook, version, what=what)
            size = len(msgspec.json.encode(payload))
            source = len(msgspec.json.encode(entry.source))
            msg = StartMessage(playbook=playbook, version=version, payload=payload, execution_id=eid)
            if size + source > self.value_limit():
                # the start record carries payload and playbook source: a payload that does
                # not fit beside the source goes as a blob (past the cap: ValueTooLarge)
                cap = self.layout.max_value_bytes
                ref = await self._ride(what, lambda: payload_blob(self.js, payload, eid, cap=cap))
                msg = msgspec.structs.replace(msg, payload={}, payload_ref=ref)
            traced = caller_headers()
            ack = await self._publish(what, START_SUBJECT, self.codec.encode(msg), start_id(eid), headers=traced)
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

    async def start_record(self, execution_id: str) -> StartRecord | None:
        """The execution's start record (the playbook source and version it runs, its
        payload, limits, parent), values it cannot decrypt shown as `<encrypted>`; None
        when its log holds none (not started, or its start message still queued)."""
        check_execution_id(execution_id)
        return await self._ride(
            f"reading the start record of execution {execution_id}", lambda: self._start_record(execution_id)
        )

    async def _start_record(self, execution_id: str) -> StartRecord | None:
        # on its own subject, or (semantics 6) the log's first input, the start stored
        # with its first decision: the first input is looked at first (`start_message`)
        found = await start_message(
            self.nc, self.layout.exec_stream_of(execution_id), self.layout.execution(execution_id)
        )
        return None if found is None else self._opened_start(found[1])

    def _opened_start(self, data: bytes) -> StartRecord | None:
        record = self.codec.open_for_display(input_decoder.decode(data))
        return record if isinstance(record, StartRecord) else None

    async def _await_start_record(self, execution_id: str, timeout: float) -> StartRecord | None:
        """The start record once the execution's log holds it, waiting up to `timeout`
        seconds for it (its inputs read as they come: the start record, or the start
        stored with its first decision)."""
        subjects = self.layout.execution(execution_id)
        sub = await self.js.subscribe(
            subjects.inputs, stream=self.layout.exec_stream_of(execution_id), ordered_consumer=True
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=max(0.001, deadline - loop.time()))
                except TimeoutError:
                    return None
                held = held_start(msg.subject, msg.data)
                if held is not None:
                    return self._opened_start(held)
        finally:
            await sub.unsubscribe()

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
        # its inputs as they come, for one that holds its start (a start record, or the
        # start stored with its first decision: semantics 6)
        subjects = self.layout.execution(execution_id)
        sub = await self.js.subscribe(
            subjects.inputs, stream=self.layout.exec_stream_of(execution_id), ordered_consumer=True
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=max(0.01, min(0.25, deadline - loop.time())))
                    if held_start(msg.subject, msg.data) is not None:
                        return True
                    continue
                except TimeoutError:
                    pass
                state = (await jsm.stream_info(START_STREAM)).state
                if not state.messages or state.first_seq > upto:
                    return await self._start_record(execution_id) is not None
                if loop.time() >= deadline:
                    return None
        finally:
            await sub.unsubscribe()

    async def start_queued(self, execution_id: str) -> bool | None:
        """Whether a start of `execution_id` waits in stream START now (not taken by a
        starter yet); None when more than QUEUED_LOOK starts wait (not looked at)."""
        check_execution_id(execution_id)

        async def look() -> bool | None:
            state = (await self.nc.jsm().stream_info(START_STREAM)).state
            if not state.messages:
                return False
            if state.messages > QUEUED_LOOK:
                return None
            queued = await window(self.nc, START_STREAM, state.first_seq, state.last_seq)
            return any(m.headers.get(MSG_ID) == start_id(execution_id) for m in queued)

        return await self._ride(f"looking up the queued start of {execution_id}", look)

    async def cancel(self, execution_id: str, reason: str = "") -> None:
        """Ask the execution to stop: its running commands are stopped and it ends
        CANCELLED (a terminal execution is left as it is). The cancel is written to the
        execution's log whatever is there: one that lands before the start record (a
        start still queued in stream START) cancels the execution as it starts, before
        its first step. `actors-cli cancel` checks that the id exists first. `reason`
        is kept on one line, without control characters, and at most MAX_REASON
        characters (a longer one is refused): it is printed in every status."""
        reason = cancel_reason(reason)
        subject = self.layout.execution(check_execution_id(execution_id)).cancel
        if await self._ride(f"reading the archive of {execution_id}", lambda: self.archives.has(execution_id)):
            # retired: finished long ago, and a cancel would be the one record left of it, for ever
            raise ExecutionNotFound(f"execution {execution_id} was retired after its retention: nothing to cancel")
        await self._publish(
            f"the cancel of execution {execution_id}",
            subject,
            encode(CancelRequest(execution_id=execution_id, reason=reason)),
            cancel_id(execution_id),
        )


class CancelReasonTooLong(UserError, ValueError):
    pass


def cancel_reason(reason: str) -> str:
    """`reason` as a cancel keeps it: control and format characters (a terminal's
    escapes, line ends) made spaces, runs of spaces one, no space at either end; one
    longer than MAX_REASON characters is refused (CancelReasonTooLong)."""
    plain = "".join(" " if unicodedata.category(c) in ("Cc", "Cf") else c for c in reason)
    plain = " ".join(plain.split())
    if len(plain) > MAX_REASON:
        raise CancelReasonTooLong(f"a cancel's reason is at most {MAX_REASON:,} characters ({len(plain):,} given)")
    return plain
