"""Reading the server's answer to a JetStream publish: a PubAck, or the error it stands
for. msgspec decodes it straight into a Struct (nats-py parses JSON into a dict, then a
dataclass), once per publish."""

from __future__ import annotations

from typing import Any

import msgspec
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    domain: str | None = None
    duplicate: bool | None = None
    error: dict[str, Any] | None = None


_ack_decoder = msgspec.json.Decoder(_Ack)


def puback_outcome(data: bytes, headers: bytes | None = None) -> PubAck | Exception:
    """The PubAck in a reply (payload `data`, raw header block `headers`), or the
    exception it means: NoStreamResponseError for a 503 (no stream leader: an election),
    the matching APIError subclass for an error the stream answered, msgspec.DecodeError
    for a reply that is not a PubAck."""
    if headers is not None and headers.startswith(b"NATS/1.0 503"):
        return NoStreamResponseError()
    try:
        ack = _ack_decoder.decode(data)
    except msgspec.DecodeError as e:
        return e
    if ack.error is not None:
        try:
            APIError.from_error(ack.error)  # raises the matching subclass
        except APIError as e:
            return e
    return PubAck(stream=ack.stream, seq=ack.seq, domain=ack.domain, duplicate=ack.duplicate)


# A publish with this header set to "0" is stored only if its subject holds no message
# yet; otherwise the stream answers WRONG_LAST_SEQUENCE (and stores nothing).
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
# ... of the last message on this subject filter instead of the publish's own subject
# (nats-server 2.11 on): the engine's answer records, checked over an execution's inputs
EXPECTED_LAST_SUBJECT_FILTER = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071  # JSStreamWrongLastSequenceErr


def subject_taken(error: BaseException) -> bool:
    """Is `error` the stream's refusal of a publish whose subject already held a message
    (`EXPECTED_LAST_SUBJECT_SEQUENCE` "0")?"""
    return isinstance(error, APIError) and error.err_code == WRONG_LAST_SEQUENCE
