"""KV writes that recognise themselves when sent again.

A KV `create` or compare-and-set `update` whose reply is lost (a reconnect, a stream
leader election) may have been stored. Sent again, it fails on the revision it expected,
exactly as a write that lost to another writer does. These read the key back then: when
it holds the bytes this call wrote, the write was this call's and its revision is
returned; otherwise the key is another writer's and None says so. So a client may put them
under `ride_out` (actors/natsio/transient.py) as it does its reads. The values written
must say whose they are (a creation time, a random id), so that two writers never write
the same bytes: the client's schedules, hooks and triggers do.
"""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue


async def create_once(kv: KeyValue, key: str, value: bytes) -> int | None:
    """Create `key` holding `value`; its revision. None when the key holds another value."""
    try:
        return await kv.create(key, value)
    except KeyWrongLastSequenceError:
        return await _ours(kv, key, value, after=0)


async def update_once(kv: KeyValue, key: str, value: bytes, *, last: int) -> int | None:
    """Put `value` in `key` if its revision is still `last`; the new revision. None when
    another writer changed or deleted it since."""
    try:
        return await kv.update(key, value, last=last)
    except KeyWrongLastSequenceError:
        return await _ours(kv, key, value, after=last)


async def _ours(kv: KeyValue, key: str, value: bytes, *, after: int) -> int | None:
    """The key's revision when it holds `value` written after revision `after` (this
    call's own write, its reply lost), else None."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:  # deleted since
        return None
    revision = entry.revision or 0
    return revision if entry.value == value and revision > after else None


__all__ = ["create_once", "update_once"]
