"""Messages the server gave up on: the tool consumers have `max_deliver` (a command whose
tool kills its pod every time), and a message delivered that many times without an ack
is never delivered again. (The consumers of engine, counter, projector and starter have
no limit: their actors dead-letter bad input themselves and retry what is transient, so a
limit would only let an outage drop good messages; see streams/layout.py.) The server
says so in an advisory (`$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>`);
this watcher turns each one into a dead letter with the reason, so nothing is dropped
silently, and answers a command nobody will run with a `call.error`
(`DeliveryExhausted`), so its step fails (or retries) instead of waiting forever.

Tool actors dead-letter a command themselves when they see its last delivery; the
watcher covers the case where that delivery went to a pod that died with it. Every
engine and tool pod runs a watcher (their NATS users may answer a command; see
actors/pod/permissions.py), in one queue group: each advisory is handled once.
"""

from __future__ import annotations

import logging

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from actors.natsio import dead_letter, publish_all
from actors.wire.events import embedded_command
from actors.wire.messages import CallError, Command, ErrorInfo, answer_subject, command_decoder, encode
from streams.ids import dead_letter_id, result_id
from streams.layout import CMD_STREAM, execution_of, is_exec_stream

log = logging.getLogger("actors.tools.undeliverable")
ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
QUEUE = "actors-max-deliveries"


async def answer_undeliverable(js: JetStreamContext, cmd: Command, reason: str, *, worker: str) -> None:
    """Answer a command no tool will run with a `call.error` (`DeliveryExhausted`), under
    the message id a tool's answer would have: whoever answers first, one answer is kept."""
    error = ErrorInfo(type="DeliveryExhausted", message=f"step '{cmd.step}': command {reason}")
    answer = CallError(
        execution_id=cmd.execution_id,
        command_id=cmd.command_id,
        step=cmd.step,
        attempt_number=cmd.attempt_number,
        iteration_index=cmd.iteration_index,
        error=error,
        worker=worker,
    )
    # a result: the fold counts one per command, and an advisory never comes again, so
    # this is re-sent for as long as it takes rather than given up past the window
    await publish_all(
        js,
        [(answer_subject(cmd), encode(answer), result_id(cmd.execution_id, cmd.command_id))],
        readers_deduplicate=True,
    )


class MaxDeliveries(msgspec.Struct):
    stream: str
    consumer: str
    stream_seq: int
    deliveries: int = 0


_advisory = msgspec.json.Decoder(MaxDeliveries)


class MaxDeliveriesWatcher:
    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(ADVISORY, queue=QUEUE, cb=self._on_advisory)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_advisory(self, msg: Msg) -> None:
        try:
            adv = _advisory.decode(msg.data)
            await self.handle(adv)
        except Exception:
            # advisories are not stored: log loudly, there is no second chance
            log.exception("max-deliveries advisory %s: not handled", msg.data[:500])

    async def handle(self, adv: MaxDeliveries) -> None:
        try:
            stored = await self.nc.jsm().get_msg(adv.stream, adv.stream_seq)
        except NotFoundError:
            return  # acked or removed meanwhile: nothing was lost
        subject, data = stored.subject or "", stored.data or b""
        source = adv.consumer.split("-")[0]  # engine-p3 -> engine, tools-python -> tools
        reason = (
            f"delivered {adv.deliveries} times to consumer {adv.consumer} without being handled; "
            f"the server will not deliver it again"
        )
        eid = None
        cmd = None
        if adv.stream == CMD_STREAM:
            try:
                cmd = command_decoder.decode(data)
                eid = cmd.execution_id
            except msgspec.DecodeError:
                pass
        elif subject.startswith(("exec.", "loop.")):
            eid = execution_of(subject)
            if is_exec_stream(adv.stream) and source == "tools":  # a decision record holding its command
                try:
                    held = embedded_command(data)
                    cmd = command_decoder.decode(held) if held is not None else None
                except msgspec.DecodeError:
                    pass
        await dead_letter(
            self.js,
            source=source,
            reason=reason,
            subject=subject,
            data=data,
            execution_id=eid,
            msg_id=dead_letter_id(source, adv.stream, adv.stream_seq),
        )
        if cmd is not None:
            await answer_undeliverable(self.js, cmd, reason, worker="max-deliveries")
        log.warning("dead letter: %s seq %d (%s)", adv.stream, adv.stream_seq, reason)
