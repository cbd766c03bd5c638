"""The payload codec a connection carries (the codec itself, actors/wire/codec.py,
knows nothing of NATS). The pod's runtime and the client bind theirs when they
connect; every writer and reader finds it from the connection, or the JetStream
context, it already holds. A connection with no codec bound writes in clear. The codec
is kept for the connection behind the door to nats-py (actors/natsio/private.py), and
goes away with it."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from actors.natsio.private import connection_of, keep_codec, kept_codec
from actors.wire.codec import CLEAR, PayloadCodec


def bind(nc: NATS, codec: PayloadCodec) -> None:
    """Every message written or read through `nc` goes through `codec` from now on."""
    keep_codec(nc, codec)


def codec_of(conn: NATS | JetStreamContext) -> PayloadCodec:
    """The codec bound to a connection, or to a JetStream context's connection; `CLEAR`
    when none is."""
    nc = connection_of(conn) if isinstance(conn, JetStreamContext) else conn
    codec = kept_codec(nc)
    return codec if isinstance(codec, PayloadCodec) else CLEAR
