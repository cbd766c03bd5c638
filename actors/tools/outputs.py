"""A step's printed output as the tool actor stores it: one `StepOutput` event per
attempt (per iteration in a loop), beside the command's answer, before it.

Why an event of its own and not fields of `call.done`/`call.error`: the answer is an
input the engine (or the counter) folds and keeps in memory, and an iteration's answer
is summed into the loop's verdict; output is for people only. On its own subject
(class `out`) it is read by no actor, so it can never change a decision or a replay,
old logs are untouched, and a loop's iterations keep theirs in the loop's stream
(LOOP), not in the execution's. It is published before the answer, so whoever follows
the execution's log sees a step's output before the step ends.

The event keeps the first and the last `EXCERPT` bytes; a longer text is stored whole
in the object store (actors/store/blobs.py) up to `Layout.step_output_max_bytes`.

A step that runs longer than `LIVE_AFTER` also publishes what it prints while it runs:
`StepOutputPart` events on the same subject (`live_output`, actors/tools/capture.py),
masked as the final text is (a part ends where no credential value straddles it, and
the end is sent from the final text: joined, the parts are that text), the rest sent
when it ends, then its `step.output` saying how many parts there are and how many bytes
at the end of the text they miss (`rest`: a part that could not be stored). Ids are
per delivery of the command (`output_part_id`, `output_delivery_id`): a part sent
twice is stored once, and a redelivered command that runs again writes parts and a
`step.output` of its own delivery, which readers show instead of the earlier run's
(actors/client/outputs.py), never a mix of the two.
"""

from __future__ import annotations

import logging
import time

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from actors.natsio import MSG_ID, publisher
from actors.natsio.binding import codec_of
from actors.store.blobs import blob_key, put_blob, sealed
from actors.tools.capture import Captured, LiveOutput
from actors.tools.redact import REDACTOR
from actors.wire.events import StepOutput, StepOutputPart
from actors.wire.messages import Command
from streams.ids import output_delivery_id, output_part_id
from streams.subjects import output_subject

__all__ = ["EXCERPT", "live_output", "publish_output", "step_output"]

log = logging.getLogger(__name__)

EXCERPT = 4096  # bytes of the start, and of the end, kept in the event itself


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def step_output(
    cmd: Command,
    index: int | None,
    captured: Captured,
    output_ref: str | None,
    *,
    delivery: int = 0,
    parts: int = 0,
    rest: int = 0,
) -> StepOutput:
    """The event for what `cmd` (iteration `index`) printed; `output_ref` names the
    whole kept text when it is longer than head and tail together."""
    whole = captured.size <= 2 * EXCERPT and len(captured.kept) == captured.size
    return StepOutput(
        execution_id=cmd.execution_id,
        step=cmd.step,
        command_id=cmd.command_id,
        attempt_number=cmd.attempt_number,
        iteration_index=index,
        at=time.time(),
        size=captured.size,
        head=_text(captured.kept if whole else captured.kept[:EXCERPT]),
        tail="" if whole else _text(captured.tail[-EXCERPT:]),
        output_ref=None if whole else output_ref,
        stored=0 if whole or output_ref is None else len(captured.kept),
        delivery=delivery,
        parts=parts,
        rest=rest if parts else 0,
    )


def live_output(nc: NATS, cmd: Command, index: int | None, delivery: int, cap: int) -> LiveOutput | None:
    """What `cmd` (iteration `index`, its `delivery`) prints, published while it runs;
    None where its answer has no output subject."""
    subject = output_subject(cmd.reply_to, cmd.command_id, index)
    if subject is None:
        return None

    async def send(part: int, offset: int, data: bytes, stored: bool) -> bytes | None:
        # a part ends where no value straddles it (`safe_cut`): masked alone, it is the
        # final text's bytes (`stored`: taken from the final text, masked already)
        masked = data if stored else REDACTOR.data(data)
        event = StepOutputPart(
            execution_id=cmd.execution_id,
            step=cmd.step,
            command_id=cmd.command_id,
            attempt_number=cmd.attempt_number,
            iteration_index=index,
            delivery=delivery,
            part=part,
            offset=offset,
            at=time.time(),
            text=_text(masked),
        )
        msg_id = output_part_id(cmd.execution_id, cmd.command_id, index, delivery, part)
        try:
            await publisher(nc).send(
                [(subject, codec_of(nc).encode(event), {MSG_ID: msg_id})], readers_deduplicate=True
            )
        except Exception:
            log.warning("step %r: could not publish part %d of its output", cmd.step, part, exc_info=True)
            return None
        return masked

    return LiveOutput(cap, send, safe=REDACTOR.safe_cut)


async def publish_output(
    nc: NATS,
    js: JetStreamContext,
    cmd: Command,
    index: int | None,
    captured: Captured | None,
    *,
    live: LiveOutput | None = None,
    delivery: int = 0,
) -> None:
    """Store what `cmd` printed (nothing when it printed nothing), after the rest of
    its `live` parts. A failure is logged, not raised: the step's answer matters more
    than its output."""
    parts = rest = 0
    if live is not None:
        try:
            parts, rest = await live.finish(None if captured is None else captured.kept)
        finally:
            live.close()
    if captured is None or captured.size == 0:
        return
    subject = output_subject(cmd.reply_to, cmd.command_id, index)
    if subject is None:
        return
    try:
        ref: str | None = None
        if captured.size > 2 * EXCERPT:
            where = ["out", cmd.execution_id, cmd.command_id] + ([] if index is None else [str(index)])
            kept = sealed(js, captured.kept)
            ref = blob_key(*where, data=kept)
            await put_blob(js, ref, kept)
        event = step_output(cmd, index, captured, ref, delivery=delivery, parts=parts, rest=rest)
        msg_id = output_delivery_id(cmd.execution_id, cmd.command_id, index, delivery)
        await publisher(nc).send([(subject, codec_of(nc).encode(event), {MSG_ID: msg_id})], readers_deduplicate=True)
    except Exception:
        log.warning("step %r: could not store its output (%d bytes)", cmd.step, captured.size, exc_info=True)
