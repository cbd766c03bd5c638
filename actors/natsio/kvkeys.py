"""The keys of a KV bucket, read from its stream's subjects.

nats-py's `KeyValue.keys()` watches the bucket and stops at the first "nothing pending"
signal, which it computes from consumer info read *after* subscribing: when the server
has already pushed every message and the client has not taken one yet, that info says
0 pending and nothing delivered, and `keys()` answers "no keys" for a bucket that has
them (a catalog listed empty right after a registration was seen in tests). The
stream's own subject counts (`STREAM.INFO` with a subject filter) have no such race.

A deleted or purged key may still have a subject (its delete marker): callers `get`
each key and skip the ones not found. The server answers up to 100,000 subjects in one
info; the buckets read this way (catalog, schedules) stay far below that."""

from __future__ import annotations

from nats.js import JetStreamContext


async def kv_keys(js: JetStreamContext, bucket: str) -> list[str]:
    """Every key with a message in `bucket`, sorted (deleted ones included: see above)."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    return sorted(s[len(prefix) :] for s in (info.state.subjects or {}))
