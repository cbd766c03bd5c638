"""KV writes that recognise themselves when sent again.

A KV `create` or compare-and-set `update` whose reply is lost (a reconnect, a stream
leader election) may have been stored. Sent again, it fails on the revision it expected,
exactly as a write that lost to another writer does. These read the key back then: when
it holds the bytes this call wrote, the write was this call's and its revision is
returned; otherwise the key is another writer's and None says so. So a client may put them
under `ride_out` (actors/natsio/transient.py) as it does its reads. The values written
that create must say whose they are (a creation time, a random id: the client's
schedules, hooks and triggers do), so that two writers never create the same bytes. An
update may write what another writer writes too (two clients pausing one trigger): both
are then told it is done, which is what each asked for.
"""

from __future__ import annotations

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

# the server's "wrong last sequence" (JSStreamWrongLastSequenceErrF, ...ConstantErr), which
# nats-py turns into KeyWrongLastSequenceError for an update but not for a delete
_WRONG_LAST = (10071, 10164)


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


async def delete_once(kv: KeyValue, key: str, *, last: int) -> bool:
    """Delete `key` if its revision is still `last`; True once it is gone (this call's
    delete, its reply lost, included). False when another writer changed it since: then
    nothing of theirs is deleted (an unconditional delete sent again could remove a key
    someone added anew meanwhile)."""
    try:
        await kv.delete(key, last=last)
    except APIError as e:
        if not isinstance(e, KeyWrongLastSequenceError) and e.err_code not in _WRONG_LAST:
            raise
        try:
            await kv.get(key)
        except KeyNotFoundError:  # gone: deleted (by this call or another), or purged
            return True
        return False
    return True


async def _ours(kv: KeyValue, key: str, value: bytes, *, after: int) -> int | None:
    """The key's revision when it holds `value` written after revision `after` (this
    call's own write, its reply lost), else None."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:  # deleted since
        return None
    revision = entry.revision or 0
    return revision if entry.value == value and revision > after else None


__all__ = ["create_once", "delete_once", "update_once"]
