"""JetStream publishes with their PubAcks: the `Publisher` of a connection (pipelined
publishes, a deadline on every PubAck, re-sends within the streams' duplicate window)
and `publish_all`, the way every actor publishes (subject, payload, Nats-Msg-Id)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Awaitable

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck

from actors.errors import Unavailable
from actors.natsio.denials import Denied
from actors.natsio.fast import send_nowait
from actors.natsio.private import connection_of, connection_publisher
from actors.natsio.puback import puback_outcome
from actors.natsio.replies import ReplyInbox
from actors.natsio.transient import RETRY_BUDGET, RETRY_FIRST, RETRY_MAX, TRANSIENT

MSG_ID = "Nats-Msg-Id"
log = logging.getLogger("actors")

PUBACK_TIMEOUT = 10.0  # seconds a publish may wait for its PubAck (a reconnect can lose one)
# A re-send is harmless only while the stream still remembers the first copy's
# Nats-Msg-Id: within its duplicate window. A publish that got no PubAck may have been
# stored (the leader died after storing it, the ack was lost to a reconnect), so it is
# re-sent only within RESEND_SHARE of the window from that first doubtful try; past
# that `send` raises PublishOutcomeUnknown and the caller rebuilds its state by replay,
# which shows whether the message is there. A refusal (503, buffer full) stored nothing
# and may be re-sent at any time.
RESEND_SHARE = 0.5


class PublishDenied(Denied):
    """The server refused a publish: this NATS user may not publish to its subject (a
    permissions violation, deploy/nats/permissions.conf). Nothing was stored, and
    sending it again changes nothing; another user (the one the docs name) may."""


class PublishOutcomeUnknown(Unavailable):
    """A publish got no PubAck and it is too late to send it again safely: the stream
    may hold it, and may no longer recognise a second copy. The caller must find out by
    reading the stream (a replay), not by publishing again."""


Message = tuple[str, bytes, dict[str, str]]  # subject, payload, headers (with its Nats-Msg-Id)

# noted on the error a publish met when it was sent again after a try that got no PubAck
# (`resent_after_lost_puback`): that try may have stored it, and a check that refuses a
# second copy (`Nats-Expected-Last-Subject-Sequence`) then refuses it for its own copy
AFTER_LOST_PUBACK = "sent again after a try that got no PubAck: that try may have stored it"


def resent_after_lost_puback(error: BaseException) -> bool:
    """Did `send` meet `error` re-sending a publish whose earlier try got no PubAck?"""
    return AFTER_LOST_PUBACK in getattr(error, "__notes__", ())


class Publisher(ReplyInbox):
    """Pipelined JetStream publishes on one connection: each publish returns a future
    for its PubAck at once, so many can be in flight; acks come back on one wildcard
    inbox. What nats-py's `publish_async` does, without its per-message random token,
    semaphore and JSON-to-dataclass parsing, and with a deadline: a PubAck that does not
    come fails its future with TimeoutError after `timeout` instead of never, and one
    that a reconnect lost fails at the next sweep after the reconnect. `send` waits for
    the acks and re-sends what failed transiently."""

    def __init__(self, nc: NATS, *, timeout: float = PUBACK_TIMEOUT, duplicate_window: float = 120.0) -> None:
        super().__init__(nc)
        self.timeout = timeout
        # the streams' duplicate window (Layout.duplicate_window): how long a doubtful
        # publish may be re-sent (RESEND_SHARE); `start_roles` sets it from the layout
        self.duplicate_window = duplicate_window
        self._tokens = itertools.count()
        # token -> (future, deadline, connection it went out on: the client's reconnect
        # count, subject: what a permissions violation names)
        self._waiting: dict[str, tuple[asyncio.Future[PubAck], float, int, str]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._refused = 0  # re-sent publishes not reported yet
        self._refused_logged = -1.0  # loop time of the last report

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
        """Send now; the returned future resolves with the PubAck (or the server's error)."""
        if self._sub is None:
            await self._start()
        token, fut = self._expect(subject)
        pending = send_nowait(self.nc, subject, payload, self._prefix + token, headers)
        if pending is not None:
            await self._sent(pending, token)
        return fut

    def _expect(self, subject: str) -> tuple[str, asyncio.Future[PubAck]]:
        """A token for the next publish's reply subject (its own: `subject`) and the
        future its PubAck resolves."""
        loop = self._loop
        assert loop is not None
        token = str(next(self._tokens))
        fut: asyncio.Future[PubAck] = loop.create_future()  # not asyncio.Future(): no loop lookup
        nc = self.nc  # the connection it goes out on, as `_connection()` says (inlined: one per publish)
        connection = nc.stats["reconnects"] + (not nc.is_connected)
        self._waiting[token] = (fut, loop.time() + self.timeout, connection, subject)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep())
        return token, fut

    async def _sent(self, pending: Awaitable[None], token: str) -> None:
        """Await a publish that took the slow way; if it fails, its PubAck is not waited for."""
        try:
            await pending
        except BaseException:
            self._waiting.pop(token, None)
            raise

    def _connection(self) -> int:
        """Which connection a publish goes out on: the client counts reconnects, and a
        publish made while disconnected is buffered for the next connection."""
        return int(self.nc.stats["reconnects"]) + (not self.nc.is_connected)

    async def send(
        self, messages: list[Message], *, budget: float = RETRY_BUDGET, readers_deduplicate: bool = False
    ) -> list[PubAck]:
        """Publish pipelined and wait for every PubAck, in order. What failed transiently
        (`TRANSIENT`) is sent again, all of it in one round, after a pause that doubles
        from RETRY_FIRST to RETRY_MAX, until `budget` seconds have passed; then the last
        such error is raised. Re-sending keeps each message's Nats-Msg-Id, so a copy the
        stream did store (its PubAck was what got lost) is dropped as a duplicate, but
        only within the duplicate window: a message without a PubAck is re-sent for
        RESEND_SHARE of it, then PublishOutcomeUnknown is raised. `readers_deduplicate`
        lifts that limit where a second stored copy is harmless because every reader
        ignores it (a tool's result: the fold counts a command's result once), and
        failing would cost more (the tool would run again)."""
        # the loop known since the first publish: `get_running_loop` costs a getpid()
        # system call on Python 3.11, and this runs for every publish
        loop = self._loop or asyncio.get_running_loop()
        started = loop.time()
        futs: list[asyncio.Future[PubAck]] = []
        try:
            if self._sub is None:
                await self._start()
            for subject, payload, headers in messages:  # `publish`, inlined: no coroutine per message
                token, fut = self._expect(subject)
                pending = send_nowait(self.nc, subject, payload, self._prefix + token, headers)
                if pending is not None:
                    await self._sent(pending, token)
                futs.append(fut)
            return [await futs[0]] if len(futs) == 1 else list(await asyncio.gather(*futs))
        except TRANSIENT as e:
            refused = e  # every call that is not in an outage has returned above, at no extra cost
        sent: list[PubAck | BaseException] = list(await asyncio.gather(*futs, return_exceptions=True))
        outcomes = sent + [refused] * (len(messages) - len(futs))
        horizon = math.inf if readers_deduplicate else self.duplicate_window * RESEND_SHARE
        return await self._resend(messages, outcomes, started, budget, horizon)

    async def _resend(
        self,
        messages: list[Message],
        outcomes: list[PubAck | BaseException],
        started: float,
        budget: float,
        horizon: float,
    ) -> list[PubAck]:
        """Re-send the messages whose outcome is a transient error until none is left.
        `doubtful[i]`: when the first try of message i that may have been stored
        (no PubAck: TimeoutError) went out; it is not re-sent `horizon` seconds after."""
        acks: list[PubAck | None] = [None] * len(messages)
        doubtful: dict[int, float] = {}
        todo = list(range(len(messages)))
        loop = asyncio.get_running_loop()
        deadline, pause, sent_at = started + budget, RETRY_FIRST, started
        while True:
            failed: list[int] = []
            error: BaseException | None = None
            for i, outcome in zip(todo, outcomes, strict=True):
                if isinstance(outcome, PubAck):
                    acks[i] = outcome
                elif isinstance(outcome, TRANSIENT):
                    failed.append(i)
                    error = outcome
                    if isinstance(outcome, TimeoutError):
                        doubtful.setdefault(i, sent_at)
                else:
                    if i in doubtful:
                        outcome.add_note(AFTER_LOST_PUBACK)
                    raise outcome
            if error is None:
                return [a for a in acks if a is not None]
            now = loop.time()
            if now >= deadline:
                raise error
            pause = min(pause, deadline - now)  # the last try comes at the deadline, not a pause before it
            self._too_late(
                messages, [i for i in failed if i in doubtful and now + pause - doubtful[i] > horizon], error
            )
            self._note_refused(len(failed), error, now)
            await asyncio.sleep(pause)
            pause, todo = min(pause * 2, RETRY_MAX), failed
            # sent while disconnected, a copy waits in the client's buffer and reaches the
            # server after the reconnect, maybe past the window: doubtful ones wait for it
            while (  # noqa: ASYNC110
                not self.nc.is_connected
                and any(i in doubtful for i in todo)
                and loop.time() < min(deadline, *(doubtful[i] + horizon for i in todo if i in doubtful))
            ):
                # nats-py's only "connected again" signal is the reconnected_cb of whoever
                # connected; this wait is rare (an outage) and short
                await asyncio.sleep(RETRY_FIRST)
            sent_at = loop.time()
            self._too_late(messages, [i for i in todo if i in doubtful and sent_at - doubtful[i] > horizon], error)
            outcomes = await self._try([messages[i] for i in todo])

    def _too_late(self, messages: list[Message], late: list[int], error: BaseException) -> None:
        """Raise PublishOutcomeUnknown if any message is past the time it may be re-sent."""
        if late:
            subject, _, headers = messages[late[0]]
            raise PublishOutcomeUnknown(
                f"no PubAck for {len(late)} publish(es) (first: {subject}, id {headers.get(MSG_ID)!r}) and "
                f"the stream's {self.duplicate_window:g}s duplicate window leaves no time to send it again "
                f"safely ({error})"
            ) from error

    def _note_refused(self, n: int, error: BaseException, now: float) -> None:
        """Log refusals at most once a second: in an election every actor and every
        running tool command re-sends at once, and one line each would bury the rest."""
        self._refused += n
        if now - self._refused_logged >= 1.0:
            log.info("%d publishes refused since the last report (last: %r); sending them again", self._refused, error)
            self._refused, self._refused_logged = 0, now

    async def _try(self, messages: list[Message]) -> list[PubAck | BaseException]:
        """One round: send every message, then gather every outcome (each future's
        exception is retrieved, even when another one fails or a send raised)."""
        futs: list[asyncio.Future[PubAck] | BaseException] = []
        for subject, payload, headers in messages:
            try:
                futs.append(await self.publish(subject, payload, headers))
            except Exception as e:  # `send` decides: re-send (TRANSIENT) or raise
                futs.append(e)
        pending = [f for f in futs if isinstance(f, asyncio.Future)]
        done = iter(await asyncio.gather(*pending, return_exceptions=True))
        return [next(done) if isinstance(f, asyncio.Future) else f for f in futs]

    def _on_reply(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A PubAck, read as it arrives: it settles its publish's future."""
        entry = self._waiting.pop(subject[self._prefix_size :].decode(), None)
        if entry is None or entry[0].done():
            return
        outcome = puback_outcome(data, headers)
        if isinstance(outcome, PubAck):
            entry[0].set_result(outcome)
        else:
            entry[0].set_exception(outcome)

    async def _sweep(self) -> None:
        """Fail futures past their deadline, and at once those sent on a connection that
        has since been replaced: the server that would have acked them may be gone, and
        waiting out the deadline would stall their sender for nothing (a re-send costs
        one deduplicated message). Oldest first: deadlines and connections only grow in
        the order of sending, so the scan stops at the first future still good."""
        waiting = self._waiting
        while waiting:
            await asyncio.sleep(min(1.0, self.timeout))
            now = asyncio.get_running_loop().time()
            current = self._connection() if self.nc.is_connected else -1  # disconnected: wait and see
            expired = []
            for token, (_, deadline, connection, _) in waiting.items():
                if deadline <= now:
                    expired.append((token, f"no PubAck within {self.timeout:g}s"))
                elif connection < current:
                    expired.append((token, "PubAck lost to a reconnect"))
                else:
                    break
            for token, why in expired:
                fut = waiting.pop(token)[0]
                if not fut.done():
                    fut.set_exception(TimeoutError(why))

    def denied(self, subject: str, why: str) -> None:
        """The server says this connection's user may not publish to `subject` (`why`:
        what to tell the sender): every publish there still waiting for its PubAck fails now with
        PublishDenied, not after the PubAck's deadline and re-sends until the budget is
        spent (a command would wait out its whole timeout to say "no PubAck"). Told by
        the error callback of a client's connection (actors/natsio/dial.py)."""
        for token, (fut, _, _, to) in list(self._waiting.items()):
            if to == subject:  # as the server said it (permissions are case-sensitive)
                del self._waiting[token]
                if not fut.done():
                    fut.set_exception(PublishDenied(why))


def publisher(nc: NATS) -> Publisher:
    """The connection's `Publisher` (one wildcard subscription per connection), kept on
    the connection: made on first use, gone with it."""
    return connection_publisher(nc, Publisher)


async def publish_all(
    js: JetStreamContext,
    items: list[tuple[str, bytes, str]],
    *,
    headers: list[dict[str, str]] | None = None,
    readers_deduplicate: bool = False,
) -> list[PubAck]:
    """Publish (subject, payload, msg_id) pipelined and wait for every ack; `headers`
    (one dict per item) adds headers. Transient refusals (a leader election, a
    reconnect) are re-sent for a while (`Publisher.send`, which also says what
    `readers_deduplicate` allows); what still fails is raised: the caller must not ack
    its input then."""
    if not items:
        return []
    if headers is None:
        messages = [(subject, payload, {MSG_ID: msg_id}) for subject, payload, msg_id in items]
    else:
        messages = [
            (subject, payload, {MSG_ID: msg_id, **more})
            for (subject, payload, msg_id), more in zip(items, headers, strict=True)
        ]
    return await publisher(connection_of(js)).send(messages, readers_deduplicate=readers_deduplicate)
