"""Remove a stream's messages: how the retention actor removes a finished execution's
records (its log, its loops', its index entries, its status, its dead letters).

Two ways, and which to use matters. A purge by subject (`purge`) is one request for any
number of messages, but nats-server (2.10 to 2.15 at least) then forgets when the
messages a consumer of that stream handed back with a delay (a nak with a delay) are
due: they come back only after the consumer's ack wait. So the streams whose consumers
hand messages back (EXEC, LOOP, ENDED, DLQ) lose messages one by one, by sequence
(`delete`), which leaves every consumer's schedule alone; `purge` is for the object
store's streams, which no durable consumer reads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import orjson
from nats.aio.client import Client as NATS
from nats.js.errors import APIError, NotFoundError

PURGE_TIMEOUT = 10.0
AT_ONCE = 64  # deletes in flight at once
NO_MESSAGE = 10037  # JSNoMessageFoundErr: deleted already (a retirement run again)


async def purge(nc: NATS, stream: str, subject: str) -> int:
    """Remove the messages of `stream` on `subject` (a filter); how many went. No
    tombstone is left: the subjects cost the server nothing more."""
    request = {"filter": subject}
    reply = await nc.request(f"$JS.API.STREAM.PURGE.{stream}", orjson.dumps(request), timeout=PURGE_TIMEOUT)
    answer = orjson.loads(reply.data)
    if "error" in answer:
        APIError.from_error(answer["error"])  # raises the error's own type (NotFoundError, ...)
    return int(answer.get("purged", 0))


async def delete(nc: NATS, stream: str, seqs: Iterable[int]) -> int:
    """Remove the messages of `stream` at these sequences (`no_erase`: the bytes are not
    overwritten first, what a purge does too); how many were there."""
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(seq: int) -> int:
        async with gate:
            request = orjson.dumps({"seq": seq, "no_erase": True})
            reply = await nc.request(f"$JS.API.STREAM.MSG.DELETE.{stream}", request, timeout=PURGE_TIMEOUT)
            answer = orjson.loads(reply.data)
            if "error" in answer:
                error = answer["error"]
                if error.get("err_code") == NO_MESSAGE or "no message found" in str(error.get("description")):
                    return 0  # deleted already: by another retirement of it, or a first run cut short
                try:
                    APIError.from_error(answer["error"])
                except NotFoundError:
                    return 0
            return 1

    return sum(await asyncio.gather(*(one(s) for s in seqs)))
