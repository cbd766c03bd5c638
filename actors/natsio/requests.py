"""Core NATS requests on a connection without nats-py's per-request overhead: the
connection's `Requester`.

`Client.request` checks the subject with a regular expression, builds the header block
key by key, kicks its flusher through an `asyncio.Queue` and waits with
`asyncio.wait_for`. A client that starts executions (`Client.start`, `Client.run`)
makes one start request each: 200 started at once spent ~6 ms of a ~180 ms round
before the first request left the process. A requester sends through `fast.send_nowait`,
takes every reply on one wildcard subscription made once (`<inbox>.<token>`), read as
it arrives (actors/natsio/reader.py), and waits on a future with a timer.

As with nats-py: a reply that does not come within `timeout` raises
nats.errors.TimeoutError (a reconnect loses the replies in flight), and a request that
nobody is subscribed to raises NoRespondersError at once (the server's 503 status).
With the fast path off (`ACTORS_NATS_FASTPATH=0`) a request is `Client.request`.

**Answered on the same connection.** A service on this very connection may answer a
subject here (`answer_locally`): the engine of a pod that runs the tools and the starter
too (`serve --role all`, `actors-cli run` and `dev`) answers its own partitions' asks
(`answer.<p>`, `answer.start.<p>`: docs/architecture.md "The next layout", item 2). A
request there is handed to it directly, with the same bytes, the same timeout and the
same answer, and never crosses the server: two network legs, a reply and the server's
routing fewer on every step's way. Keyed by the connection, not the process: a pod's
roles share one (the same user, so the same permissions either way), and two pods in
one process (tests) never answer each other. A local answer that does not come within
`timeout`, or whose service stopped meanwhile (its task cancelled), raises
nats.errors.TimeoutError, as a reply lost with a reconnect does: the asker does what it
does when nothing is known. Not part of the fast path (`ACTORS_NATS_FASTPATH=0` leaves it
on): it uses nothing of nats-py's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client as NATS

from actors.natsio import private
from actors.natsio.fast import send_nowait
from actors.natsio.private import connection_requester
from actors.natsio.replies import ReplyInbox

__all__ = ["Requester", "requester"]

_NO_RESPONDERS = b"NATS/1.0 503"

# a service answering on this connection: the request's payload in, its answer's task out
# (the service owns the task: it counts it, and cancels it when it stops)
LocalAnswer = Callable[[bytes], "asyncio.Future[bytes]"]


class Requester(ReplyInbox):
    """Requests on one connection, their replies on one wildcard subscription."""

    def __init__(self, nc: NATS) -> None:
        super().__init__(nc)
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[bytes]] = {}  # token -> the reply's future
        self._local: dict[str, LocalAnswer] = {}  # subject -> the service on this connection answering it

    def answer_locally(self, subject: str, answer: LocalAnswer) -> None:
        """Requests to `subject` (exactly: no wildcards) made on this connection are
        answered by `answer`, not sent (the module's docstring). The service keeps its
        subscription for everyone else's."""
        self._local[subject] = answer

    def stop_answering_locally(self, subject: str, answer: LocalAnswer) -> None:
        """`answer` no longer answers `subject` here (another service's registration,
        made since, stays: two engines on one connection, one losing a partition the
        other gained)."""
        if self._local.get(subject) == answer:  # ==: a bound method is made anew each time
            del self._local[subject]

    async def request(
        self, subject: str, payload: bytes, *, timeout: float, headers: dict[str, str] | None = None
    ) -> bytes:
        """Send `payload` to `subject` and return the first reply's payload."""
        local = self._local.get(subject)
        if local is not None:
            return await _answered_here(local, payload, timeout)
        if not private.FASTPATH:
            msg = await self.nc.request(subject, payload, timeout=timeout, headers=headers)
            return msg.data
        if self._sub is None:
            await self._start()
        loop = self._loop
        assert loop is not None
        token = str(next(self._tokens))
        reply: asyncio.Future[bytes] = loop.create_future()
        self._waiting[token] = reply
        timer = loop.call_later(timeout, _time_out, reply)
        try:
            pending = send_nowait(self.nc, subject, payload, self._prefix + token, headers)
            if pending is not None:
                await pending
            return await reply
        finally:
            timer.cancel()
            self._waiting.pop(token, None)

    def _on_reply(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        fut = self._waiting.get(subject[self._prefix_size :].decode())
        if fut is None or fut.done():
            return  # late (timed out) or a second reply: only the first one counts
        if headers is not None and headers.startswith(_NO_RESPONDERS):
            fut.set_exception(nats.errors.NoRespondersError())
        else:
            fut.set_result(data)


async def _answered_here(answer: LocalAnswer, payload: bytes, timeout: float) -> bytes:
    """`answer`'s reply to `payload`, waited for as a remote one would be. Waiting on a
    future of its own the task's end or a timer settles, not on the task: the asker
    giving up (or being cancelled) leaves the service's work to go on, as it would on
    another pod. (What `asyncio.wait` does, without its set, its checks and its
    coroutine: this runs for every step of a pod that runs its own tools.)"""
    task = answer(payload)
    loop = task.get_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def settle(_: object = None) -> None:
        if not ended.done():
            ended.set_result(None)

    task.add_done_callback(settle)
    timer = loop.call_later(timeout, settle)
    try:
        await ended
    finally:
        timer.cancel()
        task.remove_done_callback(settle)
    if not task.done() or task.cancelled():
        raise nats.errors.TimeoutError()
    return task.result()


def _time_out(reply: asyncio.Future[bytes]) -> None:
    if not reply.done():
        reply.set_exception(nats.errors.TimeoutError())


def requester(nc: NATS) -> Requester:
    """The connection's `Requester` (one wildcard subscription per connection), kept on
    the connection: made on first use, gone with it."""
    return connection_requester(nc, Requester)
