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

import logging
import uuid

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from actors.catalog import CatalogError, resolve
from actors.natsio import dead_letter, publish_all, stream_seq
from actors.wire import ErrorInfo, StartMessage, StartRecord, encode
from streams.layout import EXEC_STREAM, EXECUTION_ID, IN, STARTER_CONSUMER, Layout, deliver_subject

log = logging.getLogger("actors.starter")
_start_decoder = msgspec.json.Decoder(StartMessage)
_NAMESPACE = uuid.UUID("6f1c2b1e-3d0a-4c55-9a4f-5b7e0e2a9c11")


class Starter:
    def __init__(self, nc: NATS, *, layout: Layout) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.layout = layout
        self._sub: Subscription | None = None

    async def start(self) -> None:
        name = STARTER_CONSUMER
        self._sub = await self.nc.subscribe(deliver_subject(name), queue=name, cb=self._on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            await self.handle(msg)
        except Exception:
            log.exception("starter: failed to handle a start message")
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
        elif not EXECUTION_ID.match(eid):
            await dead_letter(
                self.js,
                source="start",
                reason=f"invalid start message: field execution_id {eid!r} must match {EXECUTION_ID.pattern}",
                msg=msg,
            )
            return
        subject = self.layout.exec_subject(eid, IN, "start")
        if await self._already_started(subject):
            log.info("starter: execution %s already started; duplicate start ignored", eid)
            return
        record = StartRecord(execution_id=eid, playbook_path=start.playbook, playbook_version=start.version,
                             payload=start.payload, parent=start.parent)
        try:
            entry = await resolve(self.js, start.playbook, start.version)
            record.playbook_source, record.playbook_version = entry.source, entry.version
        except CatalogError as e:
            record.error = ErrorInfo(type="PlaybookNotFound", message=str(e))
        await publish_all(self.js, [(subject, encode(record), f"{eid}:start")])  # re-sent through an election

    async def _already_started(self, subject: str) -> bool:
        try:
            await self.nc.jsm().get_last_msg(EXEC_STREAM, subject, direct=True)
            return True
        except NotFoundError:
            return False
