"""Many stored messages in one request: JetStream's batched direct get (ADR-31), which
nats-py does not wrap. One request to `$JS.API.DIRECT.GET.<stream>` and the server
answers with one message per stored message, then an end-of-batch status (204). The
stream must allow direct gets (ours do: streams/layout.py `allow_direct`).

`from_sequence`: up to `count` messages from a sequence on, at most MAX_BATCH a
request: no consumer to create and delete, as an ordered consumer would need.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from streams.subjects import direct_get_subject

MAX_BATCH = 1000  # the server's limit on `batch`
END_OF_BATCH = "204"
NOT_FOUND = "404"
STATUS = "Status"
SEQUENCE = "Nats-Sequence"
REPLY_TIMEOUT = 5.0  # seconds between two messages of a batch before it is given up


class BatchGetFailed(Exception):
    """The server answered a batched get with an error status."""


async def from_sequence(
    nc: NATS, stream: str, seq: int, count: int, *, subject: str | None = None, up_to: int | None = None
) -> list[tuple[int, bytes]]:
    """(sequence, data) of up to `count` messages stored at `seq` or after, in order:
    only those on `subject` (wildcards allowed) when given, none after `up_to`."""
    out: list[tuple[int, bytes]] = []
    while count > 0:
        request: dict[str, object] = {"seq": seq, "batch": min(count, MAX_BATCH)}
        if subject is not None:
            request["next_by_subj"] = subject
        got = [(int(m.headers[SEQUENCE]), m.data) for m in await _batch(nc, stream, request) if m.headers]
        if up_to is not None:
            got = [(s, d) for s, d in got if s <= up_to]
        out.extend(got)
        if len(got) < min(count, MAX_BATCH):
            return out  # the stream (or `up_to`) ran out first
        seq, count = got[-1][0] + 1, count - len(got)
    return out


async def _batch(nc: NATS, stream: str, request: dict[str, object]) -> list[Msg]:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(direct_get_subject(stream), json.dumps(request).encode(), reply=inbox)
        out: list[Msg] = []
        while True:
            msg = await sub.next_msg(timeout=REPLY_TIMEOUT)
            status = (msg.headers or {}).get(STATUS)
            if status == END_OF_BATCH or status == NOT_FOUND:
                return out
            if status is not None:
                desc = (msg.headers or {}).get("Description", "")
                raise BatchGetFailed(f"direct get from {stream}: {status} {desc}".strip())
            out.append(msg)
    finally:
        await sub.unsubscribe()


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored message as a batched direct get gives it: where it is and what it holds."""

    stream: str
    subject: str
    seq: int
    time: float  # its log timestamp, seconds since the epoch
    data: bytes
    headers: dict[str, str]


# headers a direct get adds to the message's own (ADR-31)
_ADDED = {"Nats-Stream", "Nats-Subject", SEQUENCE, "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence"}


async def on_subject(nc: NATS, stream: str, subject: str) -> list[Stored]:
    """Every message of `stream` on `subject` (a filter), in order, by batched direct
    gets from the stream's start: no consumer made (a retirement reads six streams,
    sixteen at once; ordered consumers for each ran into the server's consumer limit)."""
    return [m async for page in pages(nc, stream, subject) for m in page]


async def pages(
    nc: NATS, stream: str, subject: str, *, first: int = 1, batch: int = MAX_BATCH
) -> AsyncIterator[list[Stored]]:
    """The messages of `stream` on `subject` (a filter) from sequence `first` on, in
    order, `batch` at a time: a reader that stops at what it looks for reads no
    further, and holds one page at a time."""
    seq = first
    while True:
        got = [
            stored_of(stream, m)
            for m in await _batch(nc, stream, {"seq": seq, "batch": batch, "next_by_subj": subject})
        ]
        if got:
            yield got
        if len(got) < batch:
            return
        seq = got[-1].seq + 1


async def window(nc: NATS, stream: str, first: int, last: int) -> list[Stored]:
    """The messages of `stream` stored from sequence `first` to `last` (both included),
    in order: one page of a stream read newest first, with each message's subject and
    time (a page of dead letters, actors/client/deadletters.py). A message deleted in
    between is simply not there."""
    out: list[Stored] = []
    seq = first
    while seq <= last:
        got = await _batch(nc, stream, {"seq": seq, "batch": min(MAX_BATCH, last - seq + 1)})
        page = [stored_of(stream, m) for m in got]
        out.extend(s for s in page if s.seq <= last)
        if len(got) < min(MAX_BATCH, last - seq + 1) or not page:
            return out
        seq = page[-1].seq + 1
    return out


def stored_of(stream: str, m: Msg) -> Stored:
    """A message a direct get answered with, as a `Stored` (its log time from the
    `Nats-Time-Stamp` the server adds)."""
    h = m.headers or {}
    return Stored(
        stream=stream,
        subject=h.get("Nats-Subject", ""),
        seq=int(h.get(SEQUENCE, "0")),
        time=stamp_time(h),
        data=m.data,
        headers={k: v for k, v in h.items() if k not in _ADDED},
    )


def stamp_time(headers: dict[str, str] | None) -> float:
    """The log time a direct get's headers name (`Nats-Time-Stamp`), in epoch seconds;
    0.0 when absent."""
    return _timestamp((headers or {}).get("Nats-Time-Stamp", ""))


def _timestamp(text: str) -> float:
    """`2026-11-26T16:01:02.123456789Z` (RFC 3339, nanoseconds) in seconds since the epoch."""
    if not text:
        return 0.0
    whole, _, rest = text.rstrip("Z").partition(".")
    fraction = float(f"0.{rest[:9]}") if rest else 0.0
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + fraction


async def next_on_subject(nc: NATS, stream: str, subject: str, seq: int, count: int) -> tuple[list[Stored], int]:
    """Up to `count` messages of `stream` on `subject` (a filter) stored at `seq` or
    after, in order, and how many more match after the last one read (the server's
    `Nats-Num-Pending`; 0 when none was read): a page of a subject's messages whose
    cursor is a stream sequence, read without listing the subjects."""
    out: list[Stored] = []
    pending = 0
    while count > 0:
        got = await _batch(nc, stream, {"seq": seq, "batch": min(count, MAX_BATCH), "next_by_subj": subject})
        if not got:
            return out, 0
        out.extend(stored_of(stream, m) for m in got)
        pending = int((got[-1].headers or {}).get("Nats-Num-Pending", "0") or 0)
        if len(got) < min(count, MAX_BATCH) or pending == 0:
            return out, pending
        seq, count = out[-1].seq + 1, count - len(got)
    return out, pending
