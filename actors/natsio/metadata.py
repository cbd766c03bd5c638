"""Where a JetStream message sits in its stream, read from its ack subject: its stream
sequence (the source of the engine's ids), how often it was delivered, and its log
time (the engine's clock). A replay reads the same values again, so the decisions built
on them come out the same."""

from __future__ import annotations

import datetime

from nats.aio.msg import Msg


def _ack_fields(msg: Msg) -> tuple[str, str, str, str, str, str]:
    """(stream sequence, deliveries, timestamp in ns, stream, consumer, delivery
    sequence) from a JetStream message's ack subject, as nats-py's `Msg.metadata` reads
    them, without building its objects (this runs for every message an actor or a tool
    takes)."""
    tokens = (msg.reply or "").split(".")
    n = len(tokens)
    if tokens[0] == "$JS" and n > 1 and tokens[1] == "ACK":
        if n == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
            return tokens[5], tokens[4], tokens[7], tokens[2], tokens[3], tokens[6]
        if n >= 11:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>[.<token>]
            return tokens[7], tokens[6], tokens[9], tokens[4], tokens[5], tokens[8]
    md = msg.metadata  # raises NotJSMessageError, as it always did
    seqs = md.sequence
    return str(seqs.stream), str(md.num_delivered), "", md.stream or "", md.consumer or "", str(seqs.consumer)


def stream_and_consumer(msg: Msg) -> tuple[str, str]:
    """The stream and the consumer that delivered `msg`."""
    fields = _ack_fields(msg)
    return fields[3], fields[4]


def delivery(msg: Msg) -> tuple[str, str, int, int]:
    """(stream, consumer, delivery sequence, deliveries) of a JetStream message: the
    consumer numbers every delivery it makes, one after another, a redelivery too. A
    number skipped is a delivery that never arrived here."""
    _, deliveries, _, stream, consumer, seq = _ack_fields(msg)
    return stream, consumer, int(seq), int(deliveries)


def stream_seq(msg: Msg) -> int:
    return int(_ack_fields(msg)[0])


def num_delivered(msg: Msg) -> int:
    return int(_ack_fields(msg)[1])


def log_time(msg: Msg) -> float:
    """The message's log timestamp in epoch seconds (microsecond precision, exactly as
    `msg.metadata.timestamp.timestamp()`)."""
    ts = _ack_fields(msg)[2]
    if not ts:
        return float(msg.metadata.timestamp.timestamp())
    return datetime.datetime.fromtimestamp(int(ts) / 1_000_000_000.0, datetime.UTC).timestamp()
