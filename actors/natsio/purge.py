"""Remove a stream's messages on a subject: how the retention actor removes a finished
execution's records (its log, its loops', its index entries, its status)."""

from __future__ import annotations

import orjson
from nats.aio.client import Client as NATS
from nats.js.errors import APIError

PURGE_TIMEOUT = 10.0


async def purge(nc: NATS, stream: str, subject: str) -> int:
    """Remove the messages of `stream` on `subject` (a filter); how many went. No
    tombstone is left: the subjects cost the server nothing more."""
    request = {"filter": subject}
    reply = await nc.request(f"$JS.API.STREAM.PURGE.{stream}", orjson.dumps(request), timeout=PURGE_TIMEOUT)
    answer = orjson.loads(reply.data)
    if "error" in answer:
        APIError.from_error(answer["error"])  # raises the error's own type (NotFoundError, ...)
    return int(answer.get("purged", 0))
