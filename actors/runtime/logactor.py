"""The shell every log actor shares: an actor that owns one durable log (an
execution's, or a loop's), folds its inputs with a pure core, and publishes what the
fold decides. The engine's `ExecutionActor` and the counter's `LoopActor` are the two
small things that differ: how an input is decoded and folded, what a replay reads
back, how the actor gives up on an input.

    inputs (a batch from the mailbox) -> fold each, in log order -> publish the
    effects (actors/runtime/outbox.py) -> ack the inputs

The inputs are acked last: if the process dies anywhere before, they are redelivered
and the next actor rebuilds its state by replaying the log (`rehydrate`): fold every
input again (same effects, by determinism) and publish only what the log shows is
missing. A first delivery of the input that opens the log needs no replay: nothing
precedes it.

Failures are handled by the host (actors/runtime/hosting.py `handle_until_done`): transient
ones are waited out, deterministic ones are tried a few times and then given up on
(`give_up`); either way the actor rebuilds by replay before trying again (`reset`).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, ClassVar, NamedTuple, TypeVar

import msgspec
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from actors.core.effects import Effects
from actors.natsio import ack, dead_letter, log_time, stream_seq
from actors.runtime.hosting import PartitionHost, hand_back
from actors.runtime.outbox import Outbox
from actors.wire.codec import PayloadUnreadable, codec_of
from actors.wire.messages import ErrorInfo
from streams import ids

REPLAY_IDLE_TIMEOUT = 10.0  # seconds without a message before a replay reader decides
T = TypeVar("T")


class LogEntry(NamedTuple):
    """One message of a log, as a replay reads it."""

    subject: str
    data: bytes
    seq: int  # stream sequence: the input's identity (decision records name it: `cause`)
    at: float  # log time: the only clock a decision reads


class LogStalled(TimeoutError):
    """The log stopped delivering part way (its stream lost its leader): folding part
    of it would build a state behind the log. Transient: the host replays again."""


class LogActor:
    """Base of the engine's and the counter's actors (see the module docstring)."""

    source: ClassVar[str]  # who dead-letters (the `dlq.<source>` subject) and logs
    stream: ClassVar[str]  # the stream holding the log
    max_batch: ClassVar[int] = 1  # inputs taken from the mailbox at once

    def __init__(self, host: PartitionHost[Any, Any], key: Any, execution_id: str, outbox: Outbox) -> None:
        self.host = host
        self.key = key
        self.execution_id = execution_id
        self.outbox = outbox
        self.last_seq = 0  # the last input folded: anything at or before it is done
        self.replay_through = 0  # a replay reads the log at least through this sequence (`read_log`)
        self.hydrated = False
        self.replayed = False  # set once a failure made this actor rebuild itself from the log
        self.mailbox: asyncio.Queue[Msg] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # an idle actor may be evicted (PartitionHost._evict)
        self.off_loop = False  # fold on a worker thread: a template took more than its inline slice

    # --- what differs ----------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Nothing more will happen: the actor retires once its mailbox is empty."""
        raise NotImplementedError

    def opens_log(self, subject: str) -> bool:
        """Is an input on `subject` the one that opens the log (nothing precedes it)?"""
        raise NotImplementedError

    async def fold_input(self, entry: LogEntry, into: Effects | None = None) -> Effects | None:
        """Fold one input; its effects are returned, or added to `into`."""
        raise NotImplementedError

    async def rehydrate(self) -> None:
        """Rebuild the state from the log and publish what the log lacks."""
        raise NotImplementedError

    async def give_up(self, batch: list[Msg], error: Exception, level: int) -> bool:
        """Handling `batch` failed deterministically, again and again: record it so the
        execution (or the loop) ends instead of waiting. True: the batch is dealt with."""
        raise NotImplementedError

    async def unreadable(self, entry: LogEntry, error: ErrorInfo) -> None:
        """An input holds a value sealed with a payload key this pod lacks (or that does
        not open it): record `error` so the execution (or the loop) fails now. Trying
        again cannot help until the pod is given the key, so no retries are spent on it."""
        raise NotImplementedError

    # --- live ------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            batch = [await self.mailbox.get()]
            while len(batch) < self.max_batch and not self.mailbox.empty():
                batch.append(self.mailbox.get_nowait())
            self.busy = True
            try:
                await self.host.handle_until_done(
                    batch,
                    functools.partial(self.handle, batch),
                    reset=self.reset,
                    actor=self,
                    what=f"{self.source} {self.key} ({batch[0].subject})",
                    give_up=functools.partial(self.give_up, batch),
                )
            except asyncio.CancelledError:
                await hand_back(batch, self.mailbox)  # the partition's next owner replays it
                raise
            finally:
                self.busy = False
            if self.finished and self.mailbox.empty():
                self.host.retire(self.key, self)
                return

    def reset(self) -> None:
        """After a failure: the state may be ahead of the log (folded, not all
        published), rebuild it by replay."""
        self.hydrated = False
        self.replayed = True

    async def handle(self, batch: list[Msg]) -> None:
        if not self.hydrated:
            first = batch[0]
            if not self.replayed and first.metadata.num_delivered == 1 and self.opens_log(first.subject):
                self.hydrated = True  # a first delivery of the log's first input: nothing precedes it
            else:
                self.replay_through = max(stream_seq(m) for m in batch)
                await self.rehydrate()
        effects = Effects()
        for msg in batch:
            seq = stream_seq(msg)
            if seq > self.last_seq:
                await self.fold_input(LogEntry(msg.subject, msg.data, seq, log_time(msg)), into=effects)
        if effects:
            await self.publish(effects)
        for m in batch:
            await ack(m)  # queued on the connection, not a round trip: no task per ack

    async def publish(self, effects: Effects) -> None:
        await self.outbox.send(effects)

    async def decode(self, decoder: msgspec.json.Decoder[T], entry: LogEntry) -> T | None:
        """The input, or None when it cannot be decoded: it is skipped (a replay skips it
        the same way) and, the first time it is met live, dead-lettered with the reason.
        One holding a value this pod cannot decrypt is skipped too, and recorded as the
        failure of the execution (or the loop) naming the key id (`unreadable`)."""
        try:
            return codec_of(self.host.js).decode(decoder, entry.data)  # values decrypted: the fold sees plaintext
        except PayloadUnreadable as e:
            # deterministic for this pod: the host's retries would only delay the same failure
            message = f"input {entry.subject} (stream seq {entry.seq}): {e}"
            await self.unreadable(entry, ErrorInfo(type=type(e).__name__, message=message))
            return None
        except (msgspec.DecodeError, RecursionError) as e:  # RecursionError: a record nested past any sense
            if self.hydrated:
                await dead_letter(
                    self.host.js,
                    source=self.source,
                    reason=f"undecodable input on {entry.subject}: {e}",
                    subject=entry.subject,
                    data=entry.data,
                    execution_id=self.execution_id,
                    msg_id=ids.dead_letter_id(self.source, self.stream, entry.seq),
                )
            return None

    # --- replay ----------------------------------------------------------------------

    async def read_log(self, subject: str, *, after: int = 0, through: int = 0) -> list[LogEntry]:
        """The log's messages on `subject` (a filter), from sequence `after` + 1 on, and
        at least through sequence `through` (the input being handled: the log holds it).
        An empty log (expired, purged) is empty; one that stops part way raises
        `LogStalled`.

        `through` is what makes a replay complete: the ordered consumer that reads the
        log may be placed on a replica still catching up after a restart, which says
        "nothing pending" at the end of what it has (seen in tests/test_ride_out.py: one
        message of nine). Folding that would build a state behind the log, so the read
        goes on until the input being handled has come by."""
        config = (
            None
            if not after
            else ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
        )
        sub = await self.host.js.subscribe(
            subject, stream=self.stream, ordered_consumer=True, pending_msgs_limit=-1, config=config
        )
        entries: list[LogEntry] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=REPLAY_IDLE_TIMEOUT)
                except TimeoutError:
                    if through > (entries[-1].seq if entries else after) and not await self._stored(through):
                        break  # the input being handled is gone since (expired, removed): no use waiting
                    if entries or through or (await sub.consumer_info()).num_pending:
                        raise LogStalled(
                            f"{self.source} {self.key}: the log stalled after {len(entries)} messages"
                        ) from None
                    break
                entry = LogEntry(msg.subject, msg.data, stream_seq(msg), log_time(msg))
                entries.append(entry)
                if msg.metadata.num_pending == 0 and entry.seq >= through:
                    break
        finally:
            await sub.unsubscribe()
        return entries

    async def _stored(self, seq: int) -> bool:
        """Does the stream leader still hold message `seq`? (An input expired by the
        stream's age limit, or removed, since it was delivered is no longer waited for.)"""
        try:
            await self.host.js.get_msg(self.stream, seq)
            return True
        except NotFoundError:
            return False
