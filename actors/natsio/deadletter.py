"""Dead letters: a message an actor cannot handle is parked, with the reason, on
`dlq.<actor>.<execution>`, where `actors-cli events` shows it next to the log."""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from actors.natsio.metadata import stream_seq
from actors.natsio.publishing import publish_all
from actors.wire.messages import DeadLetter, encode
from streams.ids import dead_letter_id
from streams.subjects import dead_letter_subject

log = logging.getLogger("actors")


async def dead_letter(
    js: JetStreamContext,
    *,
    source: str,
    reason: str,
    msg: Msg | None = None,
    subject: str = "",
    data: bytes = b"",
    execution_id: str | None = None,
    msg_id: str | None = None,
) -> None:
    """Park a message an actor cannot handle, with the reason, where users can read it
    (`actors-cli events` shows an execution's dead letters next to its log). The letter
    of a JetStream message is de-duplicated by its stream position: an actor that
    dead-letters it again after a crash adds nothing."""
    if msg is not None:
        subject, data = msg.subject, msg.data
        if msg_id is None and msg.reply.startswith("$JS.ACK."):
            msg_id = dead_letter_id(source, msg.reply.split(".")[2], stream_seq(msg))
    headers = {k: str(v) for k, v in ((msg.headers or {}) if msg is not None else {}).items()}
    letter = DeadLetter(
        source=source,
        reason=reason,
        subject=subject,
        data=data.decode("utf-8", errors="replace")[:64_000],
        execution_id=execution_id,
        headers=headers,
    )
    log.warning("dead letter from %s (%s): %s", source, subject, reason)
    # keyed by execution so `events ID` finds them with a subject filter
    to = dead_letter_subject(source, execution_id)
    if msg_id is None:
        await js.publish(to, encode(letter))
    else:
        await publish_all(js, [(to, encode(letter), msg_id)])
