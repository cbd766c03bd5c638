"""Small NATS helpers shared by every actor: publish with a deterministic message id,
dead-lettering, message metadata."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

from actors.core.effects import CommandCancel, Timer
from actors.wire import Command, DeadLetter, encode
from streams.layout import CMD_STREAM, IN, SCH, cmd_subject, dlq_subject

MSG_ID = "Nats-Msg-Id"
SCHEDULE = "Nats-Schedule"
SCHEDULE_TARGET = "Nats-Schedule-Target"
log = logging.getLogger("actors")
T = TypeVar("T")


PUBACK_TIMEOUT = 10.0  # seconds a publish may wait for its PubAck (a reconnect can lose one)
# A publish the cluster could not take is sent again (same Nats-Msg-Id) after a pause
# doubling from RETRY_FIRST to RETRY_MAX, for at most RETRY_BUDGET seconds: a stream
# leader election takes 4-9 s, a reconnect about a second. The budget stays well under
# the streams' duplicate window (120 s), which is what makes a re-send after a lost
# PubAck harmless. Past the budget the caller fails and retries by replay.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0
RETRY_BUDGET = 30.0
# A re-send is harmless only while the stream still remembers the first copy's
# Nats-Msg-Id: within its duplicate window. A publish that got no PubAck may have been
# stored (the leader died after storing it, the ack was lost to a reconnect), so it is
# re-sent only within RESEND_SHARE of the window from that first doubtful try; past
# that `send` raises PublishOutcomeUnknown and the caller rebuilds its state by replay,
# which shows whether the message is there. A refusal (503, buffer full) stored nothing
# and may be re-sent at any time.
RESEND_SHARE = 0.5
# What a re-send can cure: 503 no responders (the stream has no leader: an election),
# JetStream's own 503, no PubAck in time (lost to a reconnect or a dying leader), the
# client's buffer full while it reconnects. Anything else (a bad request, a closed
# connection) is raised at once.
TRANSIENT: tuple[type[BaseException], ...] = (
    NoStreamResponseError, ServiceUnavailableError, TimeoutError, OutboundBufferLimitError,
)
# What an idempotent request (a read, a KV get, a stream lookup) may also meet in an
# election or a reconnect: nobody answering its subject yet, or the client between
# two connections. Asked again, it can only get the same answer or a newer one.
TRANSIENT_REQUEST: tuple[type[BaseException], ...] = (
    *TRANSIENT, NoRespondersError, ConnectionReconnectingError, StaleConnectionError,
)


async def ride_out(call: Callable[[], Awaitable[T]], *, budget: float) -> T:
    """`await call()`, called again after a pause doubling from RETRY_FIRST to RETRY_MAX
    while it fails transiently (`TRANSIENT_REQUEST`: an election, a reconnect), for at
    most `budget` seconds; then its last error is raised. Only for idempotent calls
    (reads, or writes that recognise themselves, such as a catalog registration):
    publishes go through `Publisher.send`, which keeps their Nats-Msg-Id."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + budget, RETRY_FIRST
    while True:
        try:
            return await call()
        except TRANSIENT_REQUEST as e:
            left = deadline - loop.time()
            if left <= 0:
                raise
            log.info("NATS request failed (%r); asking again in %.1fs", e, min(pause, left))
        await asyncio.sleep(min(pause, left))  # the last try comes at the deadline
        pause = min(pause * 2, RETRY_MAX)


class PublishOutcomeUnknown(Exception):
    """A publish got no PubAck and it is too late to send it again safely: the stream
    may hold it, and may no longer recognise a second copy. The caller must find out by
    reading the stream (a replay), not by publishing again."""


Message = tuple[str, bytes, dict[str, str]]  # subject, payload, headers (with its Nats-Msg-Id)


# --- the publish path, without nats-py's per-message overhead --------------------------
# `Client.publish` validates the subject with a regex, rebuilds the header block key by
# key, formats the command with an f-string and awaits two coroutines: about 3 us per
# message here, for each command and each ack. `send` builds the same PUB/HPUB bytes
# and appends them to the client's outgoing buffer exactly as `Client._send_publish`
# does (kicking its flusher the same way), in well under 1 us. Anything unusual (not
# connected, a reconnect buffering, a payload over the server's limit, a subject or
# header with whitespace) goes through `Client.publish`, which handles it.

_NO_WS = re.compile(r"[ \t\r\n]")
_FAST_ATTRS = ("_pending", "_pending_data_size", "_flush_queue", "_flush_pending", "_max_pending_size",
               "_max_payload", "_status", "stats")


def _fast_ok(nc: NATS) -> bool:
    return all(hasattr(nc, a) for a in _FAST_ATTRS)


async def send(nc: NATS, subject: str, payload: bytes = b"", reply: str = "",
               headers: dict[str, str] | None = None) -> None:
    """`nc.publish(subject, payload, reply=reply, headers=headers)`, cheaper."""
    if (nc._status != NATS.CONNECTED or len(payload) > nc._max_payload or not _FAST
            or _NO_WS.search(subject) or (reply and _NO_WS.search(reply))):
        await nc.publish(subject, payload, reply=reply, headers=headers)
        return
    if headers:
        lines = [b"NATS/1.0\r\n"]
        for k, v in headers.items():
            if "\r" in v or "\n" in v or _NO_WS.search(k) or ":" in k:
                await nc.publish(subject, payload, reply=reply, headers=headers)
                return
            lines.append(b"%s: %s\r\n" % (k.encode(), v.encode()))
        lines.append(b"\r\n")
        hdr = b"".join(lines)
        if reply:
            cmd = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(hdr),
                                                    len(hdr) + len(payload), hdr, payload)
        else:
            cmd = b"HPUB %s %d %d\r\n%s%s\r\n" % (subject.encode(), len(hdr), len(hdr) + len(payload), hdr, payload)
    elif reply:
        cmd = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(payload), payload)
    else:
        cmd = b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)
    stats = nc.stats
    stats["out_msgs"] += 1
    stats["out_bytes"] += len(payload)
    nc._pending.append(cmd)
    nc._pending_data_size += len(cmd)
    if nc._max_pending_size > 0 and nc._pending_data_size > nc._max_pending_size:
        await nc._flush_pending(force_flush=True)
    elif nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


async def ack(msg: Msg) -> None:
    """`msg.ack()`, through `send`."""
    if msg._ackd or not msg.reply or msg._client is None:
        await msg.ack()  # raises as it always did
        return
    await send(msg._client, msg.reply)
    msg._ackd = True


_FAST = _fast_ok(NATS())


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    domain: str | None = None
    duplicate: bool | None = None
    error: dict[str, Any] | None = None


_ack_decoder = msgspec.json.Decoder(_Ack)


class Publisher:
    """Pipelined JetStream publishes on one connection: each publish returns a future
    for its PubAck at once, so many can be in flight; acks come back on one wildcard
    inbox. What nats-py's `publish_async` does, without its per-message random token,
    semaphore and JSON-to-dataclass parsing, and with a deadline: a PubAck that does not
    come fails its future with TimeoutError after `timeout` instead of never, and one
    that a reconnect lost fails at the next sweep after the reconnect. `send` waits for
    the acks and re-sends what failed transiently."""

    def __init__(self, nc: NATS, *, timeout: float = PUBACK_TIMEOUT, duplicate_window: float = 120.0) -> None:
        self.nc = nc
        self.timeout = timeout
        # the streams' duplicate window (Layout.duplicate_window): how long a doubtful
        # publish may be re-sent (RESEND_SHARE); `start_roles` sets it from the layout
        self.duplicate_window = duplicate_window
        self._prefix = ""
        self._sub: Subscription | None = None
        self._starting: asyncio.Future[None] | None = None
        self._tokens = itertools.count()
        # token -> (future, deadline, connection it went out on: the client's reconnect count)
        self._waiting: dict[str, tuple[asyncio.Future[PubAck], float, int]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refused = 0  # re-sent publishes not reported yet
        self._refused_logged = -1.0  # loop time of the last report

    async def _start(self) -> None:
        if self._starting is None:
            self._loop = asyncio.get_running_loop()
            self._starting = self._loop.create_future()
            try:
                self._prefix = self.nc.new_inbox() + "."
                self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._on_ack, pending_msgs_limit=-1)
            except BaseException as e:
                self._starting.set_exception(e)
                self._starting.exception()  # retrieved: later callers re-raise it
                self._starting = None
                raise
            self._starting.set_result(None)
        else:
            await asyncio.shield(self._starting)

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
        """Send now; the returned future resolves with the PubAck (or the server's error)."""
        if self._sub is None:
            await self._start()
        loop = self._loop
        assert loop is not None
        token = str(next(self._tokens))
        fut: asyncio.Future[PubAck] = loop.create_future()  # not asyncio.Future(): no loop lookup
        nc = self.nc  # the connection it goes out on, as `_connection()` says (inlined: one per publish)
        self._waiting[token] = (fut, loop.time() + self.timeout, nc.stats["reconnects"] + (not nc.is_connected))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep())
        try:
            await send(self.nc, subject, payload, reply=self._prefix + token, headers=headers)
        except BaseException:
            self._waiting.pop(token, None)
            raise
        return fut

    def _connection(self) -> int:
        """Which connection a publish goes out on: the client counts reconnects, and a
        publish made while disconnected is buffered for the next connection."""
        return int(self.nc.stats["reconnects"]) + (not self.nc.is_connected)

    async def send(self, messages: list[Message], *, budget: float = RETRY_BUDGET,
                   readers_deduplicate: bool = False) -> list[PubAck]:
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
        loop = asyncio.get_running_loop()
        started = loop.time()
        futs: list[asyncio.Future[PubAck]] = []
        try:
            for subject, payload, headers in messages:
                futs.append(await self.publish(subject, payload, headers))
            return [await futs[0]] if len(futs) == 1 else list(await asyncio.gather(*futs))
        except TRANSIENT as e:
            refused = e  # every call that is not in an outage has returned above, at no extra cost
        sent: list[PubAck | BaseException] = list(await asyncio.gather(*futs, return_exceptions=True))
        outcomes = sent + [refused] * (len(messages) - len(futs))
        horizon = math.inf if readers_deduplicate else self.duplicate_window * RESEND_SHARE
        return await self._resend(messages, outcomes, started, budget, horizon)

    async def _resend(self, messages: list[Message], outcomes: list[PubAck | BaseException], started: float,
                      budget: float, horizon: float) -> list[PubAck]:
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
                    raise outcome
            if error is None:
                return [a for a in acks if a is not None]
            now = loop.time()
            if now >= deadline:
                raise error
            pause = min(pause, deadline - now)  # the last try comes at the deadline, not a pause before it
            self._too_late(messages, [i for i in failed if i in doubtful and now + pause - doubtful[i] > horizon],
                           error)
            self._note_refused(len(failed), error, now)
            await asyncio.sleep(pause)
            pause, todo = min(pause * 2, RETRY_MAX), failed
            # sent while disconnected, a copy waits in the client's buffer and reaches the
            # server after the reconnect, maybe past the window: doubtful ones wait for it
            while (not self.nc.is_connected and any(i in doubtful for i in todo)  # noqa: ASYNC110
                   and loop.time() < min(deadline, *(doubtful[i] + horizon for i in todo if i in doubtful))):
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
                f"safely ({error})") from error

    def _note_refused(self, n: int, error: BaseException, now: float) -> None:
        """Log refusals at most once a second: in an election every actor and every
        running tool command re-sends at once, and one line each would bury the rest."""
        self._refused += n
        if now - self._refused_logged >= 1.0:
            log.info("%d publishes refused since the last report (last: %r); sending them again",
                     self._refused, error)
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

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._waiting.pop(msg.subject[len(self._prefix):], None)
        if entry is None or entry[0].done():
            return
        fut = entry[0]
        if msg.headers and msg.headers.get("Status") == "503":
            fut.set_exception(NoStreamResponseError())
            return
        try:
            ack = _ack_decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            fut.set_exception(e)
            return
        if ack.error is not None:
            try:
                APIError.from_error(ack.error)  # raises the matching subclass
            except APIError as e:
                fut.set_exception(e)
            return
        fut.set_result(PubAck(stream=ack.stream, seq=ack.seq, domain=ack.domain, duplicate=ack.duplicate))

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
            for token, (_, deadline, connection) in waiting.items():
                if deadline <= now:
                    expired.append((token, f"no PubAck within {self.timeout:g}s"))
                elif connection < current:
                    expired.append((token, "PubAck lost to a reconnect"))
                else:
                    break
            for token, why in expired:
                fut, _, _ = waiting.pop(token)
                if not fut.done():
                    fut.set_exception(TimeoutError(why))


_publishers: dict[int, Publisher] = {}


def publisher(nc: NATS) -> Publisher:
    """The connection's shared `Publisher` (one wildcard subscription per connection)."""
    p = _publishers.get(id(nc))
    if p is None or p.nc is not nc:
        for key in [k for k, v in _publishers.items() if v.nc.is_closed]:
            del _publishers[key]
        p = _publishers[id(nc)] = Publisher(nc)
    return p


async def publish_all(
    js: JetStreamContext, items: list[tuple[str, bytes, str]], *, headers: list[dict[str, str]] | None = None,
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
        messages = [(subject, payload, {MSG_ID: msg_id, **more})
                    for (subject, payload, msg_id), more in zip(items, headers, strict=True)]
    return await publisher(js._nc).send(messages, readers_deduplicate=readers_deduplicate)


def schedule_at(epoch: float) -> str:
    """The `Nats-Schedule` value for a one-shot timer (millisecond precision, UTC)."""
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="milliseconds")
    return "@at " + stamp.replace("+00:00", "Z")


async def dead_letter(
    js: JetStreamContext,
    *,
    source: str,
    reason: str,
    msg: Msg | None = None,
    subject: str = "",
    data: bytes = b"",
    execution_id: str | None = None,
    msg_id: str | None = None,
) -> None:
    """Park a message an actor cannot handle, with the reason, where users can read it
    (`actors-cli events` shows an execution's dead letters next to its log). The letter
    of a JetStream message is de-duplicated by its stream position: an actor that
    dead-letters it again after a crash adds nothing."""
    if msg is not None:
        subject, data = msg.subject, msg.data
        if msg_id is None and msg.reply.startswith("$JS.ACK."):
            msg_id = dead_letter_id(source, msg.reply.split(".")[2], stream_seq(msg))
    headers = {k: str(v) for k, v in ((msg.headers or {}) if msg is not None else {}).items()}
    letter = DeadLetter(
        source=source,
        reason=reason,
        subject=subject,
        data=data.decode("utf-8", errors="replace")[:64_000],
        execution_id=execution_id,
        headers=headers,
    )
    token = execution_id or "_"
    log.warning("dead letter from %s (%s): %s", source, subject, reason)
    # keyed by execution so `events ID` finds them with a subject filter
    to = f"{dlq_subject(source)}.{token}"
    if msg_id is None:
        await js.publish(to, encode(letter))
    else:
        await publish_all(js, [(to, encode(letter), msg_id)])


def dead_letter_id(source: str, stream: str, seq: int) -> str:
    """The message id of the dead letter for message `seq` of `stream`: whoever gives up
    on it (the actor on its last delivery, the max-deliveries watcher after it), and
    however often, one letter is kept."""
    return f"dlq:{source}:{stream}:{seq}"


def _ack_fields(msg: Msg) -> tuple[str, str, str]:
    """(stream sequence, deliveries, timestamp in ns) from a JetStream message's ack
    subject, as nats-py's `Msg.metadata` reads them, without building its objects
    (this runs for every message an actor takes)."""
    tokens = (msg.reply or "").split(".")
    n = len(tokens)
    if tokens[0] == "$JS" and n > 1 and tokens[1] == "ACK":
        if n == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
            return tokens[5], tokens[4], tokens[7]
        if n >= 11:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>[.<token>]
            return tokens[7], tokens[6], tokens[9]
    md = msg.metadata  # raises NotJSMessageError, as it always did
    return str(md.sequence.stream), str(md.num_delivered), ""


def stream_seq(msg: Msg) -> int:
    return int(_ack_fields(msg)[0])


def num_delivered(msg: Msg) -> int:
    return int(_ack_fields(msg)[1])


def log_time(msg: Msg) -> float:
    """The message's log timestamp in epoch seconds (microsecond precision, exactly as
    `msg.metadata.timestamp.timestamp()`)."""
    ts = _ack_fields(msg)[2]
    if not ts:
        return float(msg.metadata.timestamp.timestamp())
    return datetime.datetime.fromtimestamp(int(ts) / 1_000_000_000.0, datetime.UTC).timestamp()


# --- what the engine and the counter both do with their logs ---------------------------


async def has_message(nc: NATS, stream: str, subject: str) -> bool:
    """Does `stream` hold a message on `subject` (a direct get of the last one)?"""
    try:
        await nc.jsm().get_last_msg(stream, subject, direct=True)
        return True
    except NotFoundError:
        return False


async def command_sent(nc: NATS, cmd: Command, answered: Collection[str], *, reply_stream: str) -> bool:
    """Was this command published before a crash? A tool acks a command (removing it
    from the work queue) only after publishing its result, so a command that was
    published is either still in CMD or answered in the log (`reply_stream`). Checked in
    that order, so a result that lands between the two looks is still found."""
    if cmd.command_id in answered:
        return True
    return (await has_message(nc, CMD_STREAM, cmd_subject(cmd.kind, cmd.execution_id, cmd.command_id))
            or await has_message(nc, reply_stream, cmd.reply_to))


async def arm_timers(js: JetStreamContext, timers: list[Timer], *, prefix: str, id_prefix: str) -> None:
    """Store each timer in the log as a scheduled message (`<prefix>.sch.<id>`): the
    server delivers it to `<prefix>.in.timer.<id>` when due, whatever happened to the
    process that armed it. Re-arming is idempotent (one schedule per subject); a timer
    already due (a replay after an outage) is delivered at once."""
    if not timers:
        return
    now = time.time()
    later = [t for t in timers if t.due > now + 0.05]
    due = [t for t in timers if t.due <= now + 0.05]
    await publish_all(
        js,
        [(f"{prefix}.{SCH}.{t.timer_id}", encode(t.fire), f"{id_prefix}:sch:{t.timer_id}") for t in later],
        headers=[{SCHEDULE: schedule_at(t.due), SCHEDULE_TARGET: f"{prefix}.{IN}.timer.{t.timer_id}"} for t in later],
    )
    await publish_all(
        js, [(f"{prefix}.{IN}.timer.{t.timer_id}", encode(t.fire), f"{id_prefix}:timer:{t.timer_id}") for t in due]
    )


async def stop_commands(nc: NATS, execution_id: str, cancels: list[CommandCancel]) -> None:
    """Tell the tool actors to stop each command: the one running it stops it, and one
    that takes it from the queue later answers `Cancelled` without running it (tool
    actors remember recent cancels).

    Commands are never purged from the work queue: a filtered purge of CMD while some of
    its messages are pending on a consumer whose client has died leaves other messages
    in the stream that the consumer never delivers again (nats-server; found by
    tests/test_chaos.py, the same class as nats-server issue #7680). A cancelled command
    that does run anyway (a tool pod that started after the cancel) has its result
    ignored: it answers a command that is no longer in flight."""
    for c in cancels:
        await nc.publish(f"cancel.{execution_id}.{c.command_id}", b"")
