"""The subjects a stream holds under a filter, every one of them: `STREAM.INFO` with
`subjects_filter`, page after page.

The server answers at most a page of subjects per request (100,000 on nats-server 2.10
and 2.11) and says how many match in all (`total`); nats-py's `stream_info` asks for the
first page only, so a caller of it sees a listing cut short without a word. Here the
`offset` of the request (ADR: the paged JetStream API) is moved on until every
subject was read.
"""

from __future__ import annotations

import json

from nats.aio.client import Client as NATS

API_TIMEOUT = 10.0  # seconds for one page (100,000 subjects is a few MB to gather)


class ListingFailed(Exception):
    """The server answered a subject listing with an error other than no such stream."""


async def stream_subjects(nc: NATS, stream: str, subjects_filter: str, *, prefix: str = "$JS.API") -> dict[str, int]:
    """Every subject of `stream` matching `subjects_filter`, with its message count; {}
    when the stream does not exist."""
    out: dict[str, int] = {}
    offset = 0
    while True:
        request = {"subjects_filter": subjects_filter, "offset": offset}
        reply = await nc.request(f"{prefix}.STREAM.INFO.{stream}", json.dumps(request).encode(), timeout=API_TIMEOUT)
        body = json.loads(reply.data)
        error = body.get("error")
        if error is not None:
            if error.get("err_code") == 10059:  # stream not found
                return {}
            raise ListingFailed(f"listing the subjects of {stream}: {error.get('description', error)}")
        page = (body.get("state") or {}).get("subjects") or {}
        out.update(page)
        total = int(body.get("total") or 0)
        offset += len(page)
        if not page or offset >= total:
            return out


__all__ = ["ListingFailed", "stream_subjects"]
