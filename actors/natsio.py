"""Small NATS helpers shared by every actor: publish with a deterministic message id,
dead-lettering, message metadata."""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck

from actors.wire import DeadLetter, encode
from streams.layout import dlq_subject

MSG_ID = "Nats-Msg-Id"
SCHEDULE = "Nats-Schedule"
SCHEDULE_TARGET = "Nats-Schedule-Target"
log = logging.getLogger("actors")


async def publish_all(
    js: JetStreamContext, items: list[tuple[str, bytes, str]], *, headers: list[dict[str, str]] | None = None
) -> list[PubAck]:
    """Publish (subject, payload, msg_id) concurrently and wait for every ack; `headers`
    (one dict per item) adds headers. Raises the first failure: the caller must not
    ack its input then."""
    if not items:
        return []
    extra = headers or [{}] * len(items)
    futs = [
        await js.publish_async(subject, payload, headers={MSG_ID: msg_id, **more})
        for (subject, payload, msg_id), more in zip(items, extra, strict=True)
    ]
    return list(await asyncio.gather(*futs))


def schedule_at(epoch: float) -> str:
    """The `Nats-Schedule` value for a one-shot timer (millisecond precision, UTC)."""
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="milliseconds")
    return "@at " + stamp.replace("+00:00", "Z")


async def dead_letter(
    js: JetStreamContext,
    *,
    source: str,
    reason: str,
    msg: Msg | None = None,
    subject: str = "",
    data: bytes = b"",
    execution_id: str | None = None,
) -> None:
    """Park a message an actor cannot handle, with the reason, where users can read it
    (`actors-cli events` shows an execution's dead letters next to its log)."""
    if msg is not None:
        subject, data = msg.subject, msg.data
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
    await js.publish(f"{dlq_subject(source)}.{token}", encode(letter))


def stream_seq(msg: Msg) -> int:
    return int(msg.metadata.sequence.stream)


def log_time(msg: Msg) -> float:
    ts: Any = msg.metadata.timestamp  # a datetime parsed from the ack subject
    return float(ts.timestamp())
