"""Small NATS helpers shared by every actor: publish with a deterministic message id,
dead-lettering, message metadata. One module per idea:

* `fast`: `send` and `ack`, a publish without nats-py's per-message overhead
* `publishing`: a connection's `Publisher` (PubAcks, re-sends) and `publish_all`
* `puback`: a PubAck reply read into a PubAck or the error it stands for; a publish
  stored only on a subject still empty (`EXPECTED_LAST_SUBJECT_SEQUENCE`, `subject_taken`)
* `transient`: what a passing failure is, and `ride_out` for idempotent requests
* `deadletter`: parking a message an actor cannot handle
* `metadata`: a message's stream sequence, deliveries and log time
* `replay`: is an output already in the streams (`has_message`, `command_sent`, a command's
  answer: `is_answered`), read from
  the stream leader (`last_message`); an execution's start record, wherever its log
  holds it (`start_message`: its own subject, or the start stored with its first
  decision, semantics 6)
* `schedules`: the headers of a durable timer (a scheduled message)
* `batchget`: many stored messages in one request (a batched direct get)
* `kvkeys`: a KV bucket's keys without nats-py's `keys()` race
* `kvput`: a compare-and-set write of a KV key, pipelined (`put_if_last`)
* `dispatch`: subscriptions whose messages go to a handler as they are read
* `requests`: core requests without nats-py's per-request overhead (`requester`)
* `replies`: the one reply subscription a Publisher or a Requester keeps
* `reader`: the one-pass protocol reader and `subscribe_raw` (messages as bytes)
* `headers`: header blocks as bytes (pure)
* `binding`: the payload codec a connection carries (`bind`, `codec_of`)
* `private`: the one door to nats-py's internals: every use of a private name of
  nats-py, and the switch that turns every fast path off (`ACTORS_NATS_FASTPATH=0`)

The names below are what the rest of the tree imports from `actors.natsio`."""

from actors.natsio.deadletter import dead_letter
from actors.natsio.fast import ack, send
from actors.natsio.kvkeys import kv_keys
from actors.natsio.metadata import log_time, num_delivered, stream_seq
from actors.natsio.private import close_connection
from actors.natsio.puback import EXPECTED_LAST_SUBJECT_FILTER, EXPECTED_LAST_SUBJECT_SEQUENCE, subject_taken
from actors.natsio.publishing import (
    MSG_ID,
    PublishDenied,
    Publisher,
    PublishOutcomeUnknown,
    publish_all,
    publisher,
    resent_after_lost_puback,
)
from actors.natsio.replay import (
    command_sent,
    has_message,
    held_start,
    is_answered,
    last_message,
    start_message,
    verdict_sent,
)
from actors.natsio.schedules import SCHEDULE, SCHEDULE_TARGET, schedule_at
from actors.natsio.transient import TRANSIENT_REQUEST, ride_out

__all__ = [
    "EXPECTED_LAST_SUBJECT_FILTER",
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "MSG_ID",
    "SCHEDULE",
    "SCHEDULE_TARGET",
    "TRANSIENT_REQUEST",
    "PublishDenied",
    "PublishOutcomeUnknown",
    "Publisher",
    "ack",
    "close_connection",
    "command_sent",
    "dead_letter",
    "has_message",
    "held_start",
    "is_answered",
    "kv_keys",
    "last_message",
    "log_time",
    "num_delivered",
    "publish_all",
    "publisher",
    "resent_after_lost_puback",
    "ride_out",
    "schedule_at",
    "send",
    "start_message",
    "stream_seq",
    "subject_taken",
    "verdict_sent",
]
