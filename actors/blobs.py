"""Values too large for one message, stored in the JetStream object store `blobs` and
referenced by key: a loop's collection, its aggregated results, a large execution
result. A message carries either the value or its key, never a truncated value."""

from __future__ import annotations

from typing import Any

import msgspec
from nats.js import JetStreamContext

from actors.wire import encode
from streams.layout import BLOB_BUCKET

# A value whose encoding is larger than this goes to the object store. Well under the
# message limit, so the message around it (ids, counts, headers) always fits.
INLINE_LIMIT = 256 * 1024


async def offload(js: JetStreamContext, key: str, value: Any) -> str | None:
    """Store `value` under `key` when its encoding is over `INLINE_LIMIT` and return the
    key; None when it fits in a message. Encodes once. Idempotent: a replay may store
    the same key and value again."""
    data = encode(value)
    if len(data) <= INLINE_LIMIT:
        return None
    store = await js.object_store(BLOB_BUCKET)
    await store.put(key, data)
    return key


async def get_blob(js: JetStreamContext, key: str) -> Any:
    store = await js.object_store(BLOB_BUCKET)
    res = await store.get(key)
    return msgspec.json.decode(res.data or b"null")
