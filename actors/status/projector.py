"""The status projector: lifecycle events -> KV `status/<execution_id>`.

It reads only lifecycle carriers: the lifecycle subjects (`exec.*.*.lc.>`) and, from
semantics 5, the answer records that carry the last step's decision, the execution's
end (`exec.*.*.in.answer.lc.>`: a lifecycle event whose body holds the decision and the
step's result beside it, as extra keys). It reads the events from the body only, never
the subject. Step, command, call and loop events never reach it as events it applies
(those a carrier holds in its decision are not read), so none of them can decide an
execution's status
(docs/language.md, States). States only move forward (PENDING < RUNNING < terminal; a
halt sits beside RUNNING) and a terminal state never changes: each write is a
compare-and-set on the key's revision. With an execution's first status that names its
playbook it appends the execution's entry to stream INDEX (start order; with
`playbook.initialized`, the two in one round trip), and after it records a terminal
state the final status (`index.end.<state>.<id>`), which `Client.list` reads backwards.
Each index entry is written only on a subject still empty: a redelivery, however late,
neither duplicates nor moves it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from actors.natsio import EXPECTED_LAST_SUBJECT_SEQUENCE, ack, dead_letter, publish_all, send, subject_taken
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.kvput import put_if_last
from actors.runtime.keyed_limiter import KeyedLimiter, stop_grace
from actors.runtime.metrics import observe_lifecycle
from actors.runtime.supervision import POISON_TRIES, is_transient
from actors.store.records import RecordInvalid, status_record
from actors.wire.events import (
    TERMINAL_EVENTS,
    AnyEvent,
    EventType,
    ExecState,
    ExecutionCancelledData,
    ExecutionHaltedData,
    ExecutionWaitingData,
    PlaybookCompletedData,
    PlaybookFailedData,
    PlaybookInitializedData,
    event_decoder,
    extras_decoder,
    in_order,
)
from actors.wire.messages import ExecutionStatus, IndexEntry, WaitInfo, encode
from streams.ids import index_end_id, index_entry_id
from streams.layout import PROJECTOR_CONSUMER, STATUS_BUCKET, deliver_subject, execution_of
from streams.subjects import STATUS_REVISION, index_end_subject, index_subject, status_feed_subject

log = logging.getLogger("actors.status.projector")

RANK = {
    ExecState.PENDING: 0,
    ExecState.RUNNING: 1,
    ExecState.HALTED: 1,  # beside RUNNING: a replay's mismatch stops it, a matching replay resumes it
    ExecState.COMPLETED: 2,
    ExecState.FAILED: 2,
    ExecState.CANCELLED: 2,
}
TRANSITIONS: dict[str, ExecState] = {
    EventType.PLAYBOOK_INITIALIZED: ExecState.RUNNING,
    EventType.WORKFLOW_INITIALIZED: ExecState.RUNNING,
    **TERMINAL_EVENTS,
    EventType.EXECUTION_HALTED: ExecState.HALTED,
    EventType.EXECUTION_RESUMED: ExecState.RUNNING,
    # workflow.completed/failed inform the playbook lifecycle; they do not close it
}
# the lifecycle data that names the playbook and when the execution started
_WITH_PLAYBOOK = (PlaybookInitializedData, PlaybookCompletedData, PlaybookFailedData, ExecutionCancelledData)


def project(current: ExecutionStatus | None, ev: AnyEvent) -> ExecutionStatus | None:
    """Pure: the next status, or None when the event changes nothing (an event of a
    type this projector does not know among them)."""
    if isinstance(ev.data, ExecutionWaitingData):
        return _waiting(current, ev, ev.data)
    target = TRANSITIONS.get(ev.type)
    if target is None:
        return None
    cur = current or ExecutionStatus(execution_id=ev.execution_id, state=ExecState.PENDING)
    if RANK[cur.state] == 2 or RANK[target] < RANK[cur.state]:
        return None  # terminal is final; states never move back
    if current is not None and target == cur.state:
        return _named(current, ev)
    if cur.state == ExecState.HALTED and ev.type != EventType.EXECUTION_RESUMED and RANK[target] < 2:
        # only a resume (or the end) lifts a halt: a late `*.initialized` does not, but
        # what it names is kept (a halt at the start record named no playbook)
        return _named(cur, ev)
    new = msgspec.structs.replace(cur, state=target)
    data = ev.data
    started = None
    if isinstance(data, _WITH_PLAYBOOK):
        if new.playbook is None:
            new.playbook = data.playbook
        started = data.started_at
    if isinstance(data, ExecutionHaltedData):
        new.error = data.error  # why it halted: the first record this code does not reproduce
    elif ev.type == EventType.EXECUTION_RESUMED:
        new.error = None
    if isinstance(data, PlaybookInitializedData) and new.version is None:
        new.version = data.version
    if new.started_at is None:
        new.started_at = float(started) if started is not None else ev.at
    if RANK[target] == 2:
        new.waiting = None  # it waits for nothing any more
        new.ended_at = ev.at
        new.terminal_event = ev.type
        # a failure's error, a cancel's reason (`status` and the lists show why it
        # ended); no other end keeps one (a halt's, lifted by the end, is gone)
        new.error = data.error if isinstance(data, PlaybookFailedData) else None
        if isinstance(data, ExecutionCancelledData):
            new.error = {"type": "Cancelled", "message": data.reason or "cancelled"}
    return new


def log_order(cause: int) -> tuple[int, int]:
    """Where the decision with this cause stands in its execution's log: an input's
    stream sequence, or (an answer record, semantics 5) minus the sequence of the input
    it follows, so just after that input's own decision and before any later input's."""
    return (-cause, 1) if cause < 0 else (cause, 0)


def _waiting(current: ExecutionStatus | None, ev: AnyEvent, data: ExecutionWaitingData) -> ExecutionStatus | None:
    """What a running execution waits for (`execution.waiting`: a RUNNING sub-state, no
    state of its own); None once it has ended, or for a decision older than the one
    whose waits the status shows.

    An older projector reads this event as one of a type it does not know (actors/wire/
    events.py `UnknownEvent`): `project` finds no transition for it, it is acked and
    changes nothing (no dead letter); the status then lacks `waiting` until an upgrade."""
    if current is not None and RANK[current.state] == 2:
        return None
    if (
        current is not None
        and current.waiting_cause is not None
        and log_order(ev.cause) <= log_order(current.waiting_cause)
    ):
        # an older decision's set (a redelivery, another projector replica applying out
        # of order): the newer one stands. Decisions' causes grow with the log.
        return None
    waits = [WaitInfo(**msgspec.structs.asdict(w)) for w in data.waits] or None
    cur = current or ExecutionStatus(execution_id=ev.execution_id, state=ExecState.PENDING)
    # the cause is kept even when the set is the same, so an older one cannot follow it
    new = msgspec.structs.replace(cur, waiting=waits, waiting_cause=ev.cause)
    if new.state == ExecState.PENDING:  # applied before its `*.initialized` (another pod): it runs
        new.state = ExecState.RUNNING
        new.started_at = new.started_at if new.started_at is not None else ev.at
    return new


def _named(current: ExecutionStatus, ev: AnyEvent) -> ExecutionStatus | None:
    """`current`, its state unchanged, with the playbook, version and start time an
    event names when the status lacks them (it was first written from an event that
    names none: a halt, a resume); None when there is nothing to add."""
    data = ev.data
    if not isinstance(data, _WITH_PLAYBOOK) or current.playbook is not None:
        return None
    new = msgspec.structs.replace(current, playbook=data.playbook)
    if isinstance(data, PlaybookInitializedData) and new.version is None:
        new.version = data.version
    if data.started_at is not None:
        new.started_at = float(data.started_at)
    return new


def _stored_status(value: bytes | None, eid: str) -> ExecutionStatus | None:
    """The status stored for `eid`; None (written anew from the event being applied, on
    the same revision) when what is stored is not a status: only the projector writes
    this bucket, so garbage there is damage to repair, not a state to keep."""
    try:
        return status_record(value or b"", key=eid)
    except RecordInvalid as e:
        log.warning("projector: %s; writing it anew from the next lifecycle event", e)
        return None


# Lifecycle events applied at once (actors/runtime/keyed_limiter.py), those of one execution in turn
EVENTS_IN_FLIGHT = 64
KNOWN_STATUSES = 10_000  # statuses (and their KV revisions) remembered, most recent


class Projector:
    """Each event is a read and a compare-and-set write. The status last written for
    an execution is remembered with its revision, so the next event of that execution
    writes without reading; if another projector pod wrote since, the write fails on
    the revision and the status is read again. A remembered status may be behind the
    stored one, never ahead: an event that does not move it forward does not move the
    stored one either (states only move forward)."""

    def __init__(self, nc: NATS, *, in_flight: int = EVENTS_IN_FLIGHT) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._kv: KeyValue | None = None
        self._sub: Subscription | None = None
        self._limiter = KeyedLimiter(limit=in_flight, what="projector")
        self._known: OrderedDict[str, tuple[ExecutionStatus, int]] = OrderedDict()

    async def start(self) -> None:
        self._kv = await self.js.key_value(STATUS_BUCKET)
        self._sub = await subscribe_direct(
            self.nc, deliver_subject(PROJECTOR_CONSUMER), self._on_msg, queue=PROJECTOR_CONSUMER
        )

    async def stop(self) -> None:
        """Stop taking events; those being applied get `STOP_GRACE` (none with NATS gone),
        then are cut short, not acked, and applied again by the pod that gets them."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await self._limiter.drain(grace=stop_grace(self.nc.is_connected))

    def _on_msg(self, msg: Msg) -> None:
        if not msg.reply or self._sub is None:
            return  # a status message, or stopping: unacked, it goes to another projector
        self._limiter.submit(functools.partial(self._handle, msg), key=execution_of(msg.subject))

    async def _handle(self, msg: Msg) -> None:
        try:
            ev = event_decoder.decode(msg.data)
            # the decision's other lifecycle events it carries (semantics 2), if any
            events = in_order(ev, extras_decoder.decode(msg.data))
        except msgspec.DecodeError as e:
            await dead_letter(
                self.js,
                source="projector",
                reason=f"undecodable lifecycle event: {e}",
                msg=msg,
                execution_id=execution_of(msg.subject),
            )
            await ack(msg)  # a plain publish to the reply subject (actors/natsio/fast.py)
            return
        try:
            for one in events:  # each applied once: a state that moved on makes a repeat change nothing
                await self.apply(one)
        except Exception as e:
            if is_transient(e) or msg.metadata.num_delivered < POISON_TRIES:
                log.exception("projector: failed to apply %s for %s", ev.type, ev.execution_id)
                return  # delivered again after ack_wait
            # the same event failing the same way every time: a bug, not an outage
            await dead_letter(
                self.js,
                source="projector",
                reason=f"lifecycle event {ev.type} could not be applied ({POISON_TRIES} deliveries): {e!r}"[:2000],
                msg=msg,
                execution_id=ev.execution_id,
            )
        await ack(msg)  # a plain publish to the reply subject (actors/natsio/fast.py)

    async def apply(self, ev: AnyEvent) -> None:
        assert self._kv is not None
        kv, eid = self._kv, ev.execution_id
        known = self._known.pop(eid, None)
        if ev.type == EventType.PLAYBOOK_INITIALIZED and known is not None and known[0].terminal_event:
            # an execution that ended starting again can only be a new one under its id,
            # its records retired since (actors/store/retire.py): the stored status decides
            known = None
        if known is None and ev.type == EventType.PLAYBOOK_INITIALIZED and await self._first(ev):
            return
        current: ExecutionStatus | None
        revision: int | None
        for _ in range(50):
            if known is not None:
                current, revision = known
            else:
                try:
                    entry = await kv.get(eid)
                    current, revision = _stored_status(entry.value, eid), entry.revision
                except KeyNotFoundError:
                    current, revision = None, None
            new = project(current, ev)
            if new is None:
                if current is not None and current.terminal_event == ev.type:
                    await self._index_end(current)  # again: a crash may have come between status and index
                state = current.state if current else ExecState.PENDING
                observe_lifecycle(execution_id=eid, event_type=ev.type, state=state, changed=False)
                if current is not None and revision is not None:
                    self._remember(eid, current, revision)
                return
            try:
                if new.playbook is not None and (current is None or current.playbook is None):
                    # the index entry first, once the status names its playbook (a re-send is
                    # dropped by its id). Not before: with two projector pods the execution's
                    # `workflow.initialized` may be applied first, by the other pod, and an
                    # entry written then would list the execution under no playbook for ever
                    await self._index(new)
                value = encode(new)
                if revision is None:
                    written = await self._create(eid, value)
                else:
                    written = await put_if_last(self.js, STATUS_BUCKET, eid, value, last=revision)
            except KeyWrongLastSequenceError:
                known = None  # another writer got there first; read and decide again
                continue
            self._remember(eid, new, written)
            await self._announce(new, value, written)
            if new.terminal_event:
                await self._index_end(new)  # after the compare-and-set: only the state that won
            # a status that only gained its playbook (`_named`) did not change state: not counted again
            moved = current is None or new.state != current.state
            observe_lifecycle(execution_id=eid, event_type=ev.type, state=new.state, changed=moved)
            if new.terminal_event:
                log.info("execution %s %s", eid, new.state)
            return
        raise RuntimeError(f"status of {eid}: too many concurrent updates")

    async def _first(self, ev: AnyEvent) -> bool:
        """An execution's first status, with its index entry, in one round trip: both
        are written only on subjects still empty, so neither can be written twice, however
        late a redelivery comes. False when the status exists already (a redelivery,
        another projector): the caller reads it and decides as for any event."""
        new = project(None, ev)
        if new is None:
            return False
        eid = ev.execution_id
        value = encode(new)
        index, status = await asyncio.gather(self._index(new), self._create(eid, value), return_exceptions=True)
        if isinstance(index, BaseException):
            raise index  # not acked: redelivered, and `_first` writes the entry then
        if isinstance(status, KeyWrongLastSequenceError):
            return False  # a status exists: read it
        if isinstance(status, BaseException):
            raise status
        self._remember(eid, new, status)
        await self._announce(new, value, status)
        observe_lifecycle(execution_id=eid, event_type=ev.type, state=new.state, changed=True)
        return True

    async def _announce(self, status: ExecutionStatus, value: bytes, revision: int) -> None:
        """The status just stored, published on `status.<playbook>.<id>` too (core NATS, at
        most once), so a client can watch one playbook's executions; `Actors-Revision` is
        the KV revision it was stored at, to order what arrives. The bucket stays the record."""
        subject = status_feed_subject(status.playbook, status.execution_id)
        try:
            await send(self.nc, subject, value, headers={STATUS_REVISION: str(revision)})
        except Exception as e:  # the connection is closing: a notification, not a record
            log.warning("projector: status of %s not announced: %s", status.execution_id, e)

    async def _create(self, eid: str, value: bytes) -> int:
        """The execution's first status. A key with a message already (another writer's
        status, or a delete marker) is left to nats-py's `create`, which takes over a
        deleted key and raises KeyWrongLastSequenceError for a live one."""
        assert self._kv is not None
        try:
            return await put_if_last(self.js, STATUS_BUCKET, eid, value, last=0)
        except KeyWrongLastSequenceError:
            return await self._kv.create(eid, value)

    async def _index(self, status: ExecutionStatus) -> None:
        entry = IndexEntry(
            execution_id=status.execution_id,
            playbook=status.playbook,
            version=status.version,
            started_at=status.started_at,
        )
        eid = status.execution_id
        await _write_once(self.js, index_subject(eid), encode(entry), index_entry_id(eid))

    async def _index_end(self, status: ExecutionStatus) -> None:
        eid = status.execution_id
        await _write_once(self.js, index_end_subject(status.state, eid), encode(status), index_end_id(eid))

    def _remember(self, eid: str, status: ExecutionStatus, revision: int) -> None:
        self._known[eid] = (status, revision)
        if len(self._known) > KNOWN_STATUSES:
            self._known.popitem(last=False)


async def _write_once(js: JetStreamContext, subject: str, data: bytes, msg_id: str) -> None:
    """Store an index entry unless its subject (one per execution) holds one already:
    a re-send, even past the duplicate window, neither duplicates nor moves it."""
    try:
        await publish_all(js, [(subject, data, msg_id)], headers=[{EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}])
    except Exception as e:
        if not subject_taken(e):
            raise
