"""A compare-and-set write of a KV key through the connection's Publisher.

nats-py's `KeyValue.update` is a request per write (a reply subscription lookup, a
`wait_for`, its PubAck parsed from JSON into a dataclass). The projector writes a
status per execution this way on the path a waiting client is on; `put_if_last` sends
the same message (the key's subject, `Nats-Expected-Last-Subject-Sequence`) as one
pipelined publish. The stream refuses it, storing nothing, when the key's last
revision is not `last` (0: the key has no message yet): `KeyWrongLastSequenceError`,
as nats-py raises."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from actors.natsio.private import connection_of
from actors.natsio.puback import EXPECTED_LAST_SUBJECT_SEQUENCE, subject_taken
from actors.natsio.publishing import publisher


async def put_if_last(js: JetStreamContext, bucket: str, key: str, value: bytes, *, last: int) -> int:
    """Store `value` under `key` if its last revision is `last`; the new revision.
    Transient failures are sent again (`Publisher.send`): a copy stored whose PubAck
    was lost then comes back refused, as a write another writer got in first would."""
    headers = {EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)}
    try:
        (ack,) = await publisher(connection_of(js)).send([(f"$KV.{bucket}.{key}", value, headers)])
    except Exception as e:
        if subject_taken(e):
            raise KeyWrongLastSequenceError(description=str(e)) from e
        raise
    return ack.seq
