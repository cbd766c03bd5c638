"""A JetStream message's place, read from its ack subject without nats-py's `Metadata`
objects (actors/natsio/metadata.py, on every message an actor or a tool takes): the same
stream, consumer, sequence, deliveries and log time as `Msg.metadata`, in both forms of
the subject (with and without a domain and account)."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from actors.natsio.metadata import delivery, log_time, num_delivered, stream_and_consumer, stream_seq

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.EXEC.tools-python.1.42.7.1764241234123456789.0",
        "$JS.ACK.hub.ACC.EXEC_2.tools-python.3.42.7.1764241234123456789.5.tok",
    ],
)
def test_the_ack_subject_says_what_metadata_says(reply: str) -> None:
    msg = Msg(_client=None, subject="exec.1.x.in.answer.cmd.python", reply=reply)  # type: ignore[arg-type]
    md = msg.metadata
    assert stream_and_consumer(msg) == (md.stream, md.consumer)
    assert (stream_seq(msg), num_delivered(msg)) == (md.sequence.stream, md.num_delivered)
    assert log_time(msg) == md.timestamp.timestamp()
    assert delivery(msg) == (md.stream, md.consumer, md.sequence.consumer, md.num_delivered)
