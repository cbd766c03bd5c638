"""Dead letters: a message an actor cannot handle is parked, with the reason, on
`dlq.<actor>.<execution>`, where `actors-cli events` shows it next to the log."""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from actors.natsio.metadata import stream_seq
from actors.natsio.publishing import publish_all
from actors.wire import DeadLetter, encode
from streams.layout import dlq_subject

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
    token = execution_id or "_"
    log.warning("dead letter from %s (%s): %s", source, subject, reason)
    # keyed by execution so `events ID` finds them with a subject filter
    to = f"{dlq_subject(source)}.{token}"
    if msg_id is None:
        await js.publish(to, encode(letter))
    else:
        await publish_all(js, [(to, encode(letter), msg_id)])


def dead_letter_id(source: str, stream: str, seq: int) -> str:
    """The message id of the dead letter for message `seq` of `stream`: whoever gives up
    on it (the actor on its last delivery, the max-deliveries watcher after it), and
    however often, one letter is kept."""
    return f"dlq:{source}:{stream}:{seq}"
