"""The starter: turns start messages (stream START) into an execution's first input.

It validates the message, resolves the playbook in the catalog and writes a
StartRecord (with the playbook source copied in) to `exec.<p>.<id>.in.start`. A
message it cannot use goes to `dlq.start` with the reason; a message with a usable
execution id but an unknown playbook still starts that execution, which fails at
once with the reason in its `playbook.failed` event, so whoever watches that id sees
why. One execution per execution_id: the record's Nats-Msg-Id is derived from the id,
and beyond the server's duplicate window the existing start record is looked up.
"""

from __future__ import annotations

import functools
import logging
import uuid

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from actors.blobs import HEADROOM, ValueTooLarge, payload_blob
from actors.catalog import CatalogError, CatalogReader
from actors.hosting import POISON_TRIES, is_transient
from actors.keyed_limiter import KeyedLimiter
from actors.natsio import dead_letter, num_delivered, publish_all, stream_seq
from actors.settings import limits_from_env
from actors.wire import ErrorInfo, Limits, RetriedBy, StartMessage, StartRecord, encode
from streams.ids import retried_id, start_record_id
from streams.layout import EXEC_STREAM, EXECUTION_ID, STARTER_CONSUMER, Layout, deliver_subject

log = logging.getLogger("actors.starter")
_start_decoder = msgspec.json.Decoder(StartMessage)
_NAMESPACE = uuid.UUID("6f1c2b1e-3d0a-4c55-9a4f-5b7e0e2a9c11")


# Start messages handled at once (actors/keyed_limiter.py): each costs a few round trips and
# starts of different executions do not depend on each other. Starts of one execution
# id take turns: the second must see the first's record, not race it past the
# duplicate window.
STARTS_IN_FLIGHT = 64


class Starter:
    def __init__(
        self, nc: NATS, *, layout: Layout, in_flight: int = STARTS_IN_FLIGHT, limits: Limits | None = None
    ) -> None:
        self.nc = nc
        self.limits = limits if limits is not None else limits_from_env()  # fixed in every record it writes
        self.js = nc.jetstream()
        self.layout = layout
        self.catalog = CatalogReader(self.js)
        self._sub: Subscription | None = None
        self._limiter = KeyedLimiter(limit=in_flight, what="starter")

    async def start(self) -> None:
        name = STARTER_CONSUMER
        self._sub = await self.nc.subscribe(deliver_subject(name), queue=name, cb=self._on_msg)

    async def stop(self) -> None:
        """Stop taking start messages and finish those being handled (each takes a few
        round trips; one that cannot finish is not acked and comes back)."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await self._limiter.drain()

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply or self._sub is None:
            return  # a status message, or stopping: unacked, it comes back to a starter
        await self._limiter.submit(functools.partial(self._handle_one, msg))

    async def _handle_one(self, msg: Msg) -> None:
        try:
            await self.handle(msg)
        except Exception as e:
            if is_transient(e) or num_delivered(msg) < POISON_TRIES:
                log.exception("starter: failed to handle a start message")
                return  # not acked: it comes back after ack_wait
            # the same message failed the same way every time: it will not start, say why
            try:
                await dead_letter(
                    self.js,
                    source="start",
                    reason=f"start message could not be handled: {type(e).__name__}: {e}",
                    msg=msg,
                )
            except Exception:
                log.exception("starter: could not dead-letter a start message")
                return
        await msg.ack()

    async def handle(self, msg: Msg) -> None:
        try:
            start = _start_decoder.decode(msg.data)
        except msgspec.ValidationError as e:
            await dead_letter(self.js, source="start", reason=f"invalid start message: {e}", msg=msg)
            return
        except msgspec.DecodeError as e:
            await dead_letter(self.js, source="start", reason=f"start message is not JSON: {e}", msg=msg)
            return
        eid = start.execution_id
        if eid is None:
            # deterministic: the same start message (by its stream position) gets the same id
            eid = uuid.uuid5(_NAMESPACE, f"{stream_seq(msg)}:{msg.metadata.timestamp}").hex
        elif not EXECUTION_ID.fullmatch(eid):
            await dead_letter(
                self.js,
                source="start",
                reason=f"invalid start message: field execution_id {eid!r} must match {EXECUTION_ID.pattern}",
                msg=msg,
            )
            return
        async with self._limiter.turn(eid):
            await self._start(eid, start)

    async def _start(self, eid: str, start: StartMessage) -> None:
        subject = self.layout.execution(eid).start
        if await self._already_started(subject):
            log.info("starter: execution %s already started; duplicate start ignored", eid)
            await self._link_retry(eid, start)  # in case the first handling stopped before linking
            return
        record = StartRecord(
            execution_id=eid,
            playbook_path=start.playbook,
            playbook_version=start.version,
            payload=start.payload,
            payload_ref=start.payload_ref,
            parent=start.parent,
            limits=self.limits,
            retry_of=start.retry_of,
        )
        try:
            entry = await self.catalog.resolve(start.playbook, start.version)
            record.playbook_source, record.playbook_version = entry.source, entry.version
        except CatalogError as e:
            record.error = ErrorInfo(type="PlaybookNotFound", message=str(e))
        await self._payload_fits(record)
        await publish_all(self.js, [(subject, encode(record), start_record_id(eid))])  # re-sent through an election
        await self._link_retry(eid, start)

    async def _link_retry(self, eid: str, start: StartMessage) -> None:
        """A retry's start also goes into the retried execution's log (`RetriedBy`,
        folded into an `execution.retried` event there), so both logs name each other."""
        retry = start.retry_of
        if retry is None or not EXECUTION_ID.fullmatch(retry.execution_id):
            return
        link = RetriedBy(execution_id=retry.execution_id, retry_execution_id=eid, from_step=retry.from_step)
        subject = self.layout.execution(retry.execution_id).retried
        await publish_all(self.js, [(subject, encode(link), retried_id(retry.execution_id, eid))])

    async def _payload_fits(self, record: StartRecord) -> None:
        """A payload that fits in its start message may not fit beside the playbook
        source: it then goes to a blob the engine reads back (same key as the client
        would use). Past the cap the execution starts failed, saying why."""
        limit = self.layout.max_msg_size - HEADROOM
        if record.payload_ref is not None or len(encode(record)) <= limit:
            return
        try:
            record.payload_ref = await payload_blob(
                self.js, record.payload, record.execution_id, cap=self.layout.max_value_bytes
            )
        except ValueTooLarge as e:
            record.error = ErrorInfo(type="ValueTooLarge", message=str(e))
        record.payload = {}

    async def _already_started(self, subject: str) -> bool:
        try:
            await self.nc.jsm().get_last_msg(EXEC_STREAM, subject, direct=True)
            return True
        except NotFoundError:
            return False
