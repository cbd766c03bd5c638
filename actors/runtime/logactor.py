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

The actor owns its loop and its failures (as pykka's actors own `_actor_loop` and
`on_failure`); its host (actors/runtime/hosting.py) only puts inputs in its mailbox, keeps
held inputs alive and lends fold threads. One input's way, one direction:

    host._on_msg -> mailbox -> run -> _until_done -> handle -> rehydrate (if needed)
    -> fold_input (the engine's or the counter's) -> publish (outbox) -> ack

A failure is met in `_until_done` by `on_failure`: transient ones (is_transient, a
render process that died) are waited out, deterministic ones are tried a few times and
then given up on (`give_up`, the engine's or the counter's); either way the actor
rebuilds by replay before trying again (`reset`). The policy is
actors/runtime/supervision.py.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from bisect import bisect_left
from typing import Any, ClassVar, NamedTuple, TypeVar

import msgspec
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from actors.core.effects import Effects
from actors.natsio import ack, dead_letter, log_time, stream_seq
from actors.natsio.binding import codec_of
from actors.natsio.replay import next_message
from actors.playbook.templates import RenderHalted, SliceExhausted
from actors.runtime.gaps import epoch_of, resent
from actors.runtime.hosting import PartitionHost, hand_back
from actors.runtime.outbox import Outbox
from actors.runtime.supervision import (
    FAILURE_PAUSE_FIRST,
    POISON_TRIES,
    Refold,
    Strikes,
    failure_pause,
    is_transient,
    poison_pause,
)
from actors.wire.codec import Decoder, PayloadUnreadable
from actors.wire.messages import ErrorInfo
from streams import ids

log = logging.getLogger("actors")
REPLAY_IDLE_TIMEOUT = 10.0  # seconds without a message before a replay reader decides
# a halted actor's inputs come back after a delay that starts at the consumer's ack_wait
# (30 s by default) and doubles with each delivery up to HALTED_DELAY_MAX: a halted
# execution costs one replay (or less) per interval, not one per ack_wait for ever
# (docs/upgrades.md)
HALTED_DELAY_MAX = 600.0
T = TypeVar("T")


def halted_delay(num_delivered: int, first: float) -> float:
    """Seconds before a halted actor's input is delivered again (its `num_delivered`th
    delivery just came; `first`: the delay after the first)."""
    return float(min(first * 2.0 ** max(0, min(num_delivered, 32) - 1), max(first, HALTED_DELAY_MAX)))


class LogEntry(NamedTuple):
    """One message of a log, as a replay reads it."""

    subject: str
    data: bytes
    seq: int  # stream sequence: the input's identity (decision records name it: `cause`)
    at: float  # log time: the only clock a decision reads
    # the message's NATS headers, kept in the log with it: a loop spec's trace context
    # (docs/tracing.md); never read by a fold
    headers: dict[str, str] | None = None


class LogStalled(TimeoutError):
    """The log stopped delivering part way (its stream lost its leader): folding part
    of it would build a state behind the log. Transient: the host replays again."""


class LogActor:
    """Base of the engine's and the counter's actors (see the module docstring)."""

    source: ClassVar[str]  # who dead-letters (the `dlq.<source>` subject) and logs
    stream: str  # the stream holding the log (the engine's: its execution's, EXEC or EXEC_<k>)
    max_batch: ClassVar[int] = 1  # inputs taken from the mailbox at once

    def __init__(self, host: PartitionHost[Any, Any], key: Any, execution_id: str, outbox: Outbox) -> None:
        self.host = host
        self.key = key
        self.execution_id = execution_id
        self.outbox = outbox
        self.last_seq = 0  # the last input folded
        # what "at or before last_seq" means: every input at or before `replayed_to` was
        # folded by the last replay (it read the log in order); after it, only those in
        # `folded_live` (increasing: an input is folded live only past `last_seq`). One
        # neither was never folded: delivered after later ones (`overtaken`)
        self.replayed_to = 0
        self.folded_live: array[int] = array("q")
        # the gap epoch (actors/runtime/gaps.py) of the last input folded: an input
        # delivered in a later one may have had an input before it lost on the way
        self.seen_epoch: int | None = None
        self.replay_through = 0  # a replay reads the log at least through this sequence (`read_log`)
        self.hydrated = False
        self.replayed = False  # set once a failure made this actor rebuild itself from the log
        self.mailbox: asyncio.Queue[Msg] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # an idle actor may be evicted (PartitionHost._evict)
        # held while the actor handles anything: by `run` around `_until_done`, and by the
        # engine storing a result with its decision (semantics 5, `store_answer`)
        self.turn = asyncio.Lock()
        self.waiting = False  # `run` waits for `turn`
        self.off_loop = False  # fold on a worker thread: a template took more than its inline slice
        # set when a replay met a decision this code would not make (actors/core/replay.py
        # `Mismatch`): nothing is folded, published or acked any more (the inputs come
        # back after a growing delay, `halted_delay`, for code that decides as the log does)
        self.halted: Any = None
        # halted on a log that records the execution's end: nothing is left to decide, so
        # its inputs (late ones) are acked instead of held for ever
        self.halted_ended = False

    # --- what differs ----------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Nothing more will happen: the actor retires once its mailbox is empty."""
        raise NotImplementedError

    def opens_log(self, subject: str) -> bool:
        """Is an input on `subject` the one that opens the log (nothing precedes it)?"""
        raise NotImplementedError

    async def first_input(self, msg: Msg) -> bool:
        """Is `msg` (a first delivery) the log's first input, so that an actor that
        folded nothing may fold it without a replay? Its subject says so (`opens_log`)
        unless an actor's log may hold inputs before one on that subject (the engine's:
        a cancel sent before a plain start)."""
        return self.opens_log(msg.subject)

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
        """The actor's loop: take what its mailbox holds (up to `max_batch`), handle it
        until done, and retire once finished. Cancellation (the partition lost, a stop,
        an eviction) hands the inputs back: the partition's next owner replays them."""
        while True:
            batch = [await self.mailbox.get()]
            while len(batch) < self.max_batch and not self.mailbox.empty():
                batch.append(self.mailbox.get_nowait())
            self.busy = True
            try:
                with self.host.holding(batch):
                    self.waiting = True
                    try:
                        await self.turn.acquire()
                    finally:
                        self.waiting = False
                    try:
                        self.busy = True
                        await self._until_done(batch)
                    finally:
                        self.turn.release()
            except asyncio.CancelledError:
                await hand_back(batch, self.mailbox)
                raise
            finally:
                self.busy = False
            # a halted actor's state is the fold of a log this code does not reproduce: it
            # may read as finished, but its inputs must come back (for a rollback), not be
            # acked as late ones to a retired actor; an ended log's halt retires as usual
            if self.finished and self.mailbox.empty() and (self.halted is None or self.halted_ended):
                self.host.retire(self.key, self)
                return

    async def _until_done(self, batch: list[Msg]) -> None:
        """Handle `batch` (which acks it last) until that succeeds or `on_failure` deals
        with it. After a failure the state may be ahead of the log (folded, not all
        published), so each try after one rebuilds it by replay (`reset`).

        `SliceExhausted` moves the actor off the event loop and `Refold` (something
        recorded that changes the fold) rebuilds it: both try again at once, counting
        nothing against the input. The inputs are never nak'ed here: a nak redelivers
        at once, so a failing actor would replay in a tight loop, hammering a cluster
        that is electing a leader."""
        strikes = Strikes()
        while True:
            try:
                await self.handle(batch)
            except SliceExhausted:
                log.info("%s: a template must render in isolation; folding off the event loop", self._what(batch))
                self.off_loop = True
                pause: float | None = 0.0
            except Refold:
                pause = 0.0
            except (Exception, RenderHalted) as e:
                pause = await self.on_failure(batch, e, strikes)
                if pause is None:
                    return
            else:
                if strikes.failures:
                    log.info("%s: handled after %d failure(s)", self._what(batch), strikes.failures)
                return
            self.reset()
            if pause:
                await asyncio.sleep(pause)

    async def on_failure(self, batch: list[Msg], error: Exception | RenderHalted, strikes: Strikes) -> float | None:
        """Handling `batch` failed with `error` (`strikes`: this batch's failures so
        far). Returns the seconds to wait before trying again, or None when the batch
        is dealt with (given up on).

        A render process that died (short of memory, the pod stopping) decided nothing,
        and a transient error (actors/runtime/supervision.py `is_transient`) is cured by
        waiting: try again after `failure_pause`, for as long as it takes. Anything
        else is deterministic: tried POISON_TRIES times, then `give_up(batch, error,
        level)` records it (level 1, 2, ...: how many times it was given up on already
        plus one) and says whether the batch is dealt with or whether to try again at
        once (the replay then skips what was given up on)."""
        what = self._what(batch)
        strikes.failures += 1
        if isinstance(error, RenderHalted):
            log.warning("%s: a render was cut short; will replay", what)
            return failure_pause(strikes.failures)
        if is_transient(error):
            if strikes.failures == 1:
                log.error("%s: failed to handle its inputs; will replay", what, exc_info=error)
            else:
                log.warning("%s: failed again (%d in a row): %r", what, strikes.failures, error)
            return failure_pause(strikes.failures)
        strikes.poisoned += 1
        log.warning(
            "%s: deterministic failure %d of %d: %r",
            what,
            strikes.poisoned,
            POISON_TRIES,
            error,
            exc_info=error if strikes.poisoned == 1 else None,
        )
        if strikes.poisoned % POISON_TRIES:
            return poison_pause(strikes.poisoned)  # same input, same outcome: no long wait
        level = strikes.poisoned // POISON_TRIES
        log.error(
            "%s: giving up on its input after %d deterministic failures (level %d): %r",
            what,
            POISON_TRIES,
            level,
            error,
        )
        try:
            if await self.give_up(batch, error, level):
                return None
        except Exception as again:  # NATS away while recording it: the next round tries again
            log.warning("%s: could not record giving up: %r", what, again)
            return FAILURE_PAUSE_FIRST
        return 0.0  # given up on: the replay now skips it, no pause needed

    def _what(self, batch: list[Msg]) -> str:
        """The actor and its input, as its log lines name them."""
        return f"{self.source} {self.key} ({batch[0].subject})"

    def folded(self, seq: int) -> None:
        """Input `seq`, the newest of the log, is in the state now (folded live, or an
        input this actor stored itself with its decision)."""
        self.last_seq = seq
        self.folded_live.append(seq)

    def overtaken(self, seq: int) -> bool:
        """Is input `seq` one the log holds before the last input folded, but that was
        never folded? Its delivery came after later ones: the first was lost on the way
        (a connection or a node that died with it in flight, a consumer leader that
        changed) and the server delivered it again after `ack_wait`, while the inputs
        after it came at once. Skipping it as folded would lose it for good (a loop
        waiting for ever on a result it was sent); folding it now would fold out of log
        order. A replay folds it in its place."""
        if seq <= self.replayed_to or seq > self.last_seq:
            return False
        live = self.folded_live
        at = bisect_left(live, seq)
        return at == len(live) or live[at] != seq

    def log_inputs(self) -> str:
        """The filter of the log's inputs (what its consumer delivers)."""
        raise NotImplementedError

    async def in_order(self, batch: list[Msg], seqs: list[int]) -> bool:
        """May `batch` (its stream sequences `seqs`) be folded live, each input the next
        of the log? First deliveries come in stream order between two gaps of the
        consumer's deliveries (actors/runtime/gaps.py); an input delivered after a gap,
        or after an input delivered again (other inputs lost with it may still be on
        their way back, behind inputs delivered for the first time), is the next only if
        the log says so: one lookup, the first input after the last folded. False: an
        input before it was lost on the way and comes again later; a replay folds them
        all in log order. Nothing is awaited unless a lookup is due."""
        prev, seen = self.last_seq, self.seen_epoch
        for at, (msg, seq) in enumerate(zip(batch, seqs, strict=True)):
            if seq <= prev:
                if seq > self.last_seq and seq not in seqs[:at]:
                    return False  # it came after a later input of this batch
                continue
            epoch = epoch_of(msg)
            if epoch is None or epoch != seen:
                try:
                    following = await next_message(self.host.nc, self.stream, self.log_inputs(), after=prev)
                except NotFoundError:
                    return False  # it was delivered, so it is stored: an answer that cannot be right
                if following.seq != seq:
                    return False
            seen = None if resent(msg) else epoch
            prev = seq
        return True

    def reset(self) -> None:
        """After a failure: the state may be ahead of the log (folded, not all
        published), rebuild it by replay (which halts it again if it must)."""
        self.hydrated = False
        self.replayed = True
        self.halted = None
        self.halted_ended = False

    async def _halted(self, batch: list[Msg]) -> None:
        """The actor is halted: nothing of `batch` is folded. An ended execution's
        inputs are acked (nothing can be decided for them); any other's are handed
        back with a delay that grows with each delivery (`halted_delay`), from the
        consumer's ack_wait on."""
        for m in batch:
            if self.halted_ended:
                await ack(m)
                continue
            try:
                await m.nak(delay=halted_delay(m.metadata.num_delivered, self.host.layout.ack_wait))
            except Exception as e:  # the connection away: redelivered after ack_wait instead
                log.warning("%s %s: could not hand back a halted input: %r", self.source, self.key, e)

    async def handle(self, batch: list[Msg]) -> None:
        if self.halted is not None:
            await self._halted(batch)
            return
        seqs = [stream_seq(m) for m in batch]
        if self.hydrated and any(self.overtaken(seq) for seq in seqs):
            # an input lost on the way and never found out by `in_order`: not expected,
            # but a skip would lose it for good
            log.warning("%s: an input came after later ones were folded; replaying", self._what(batch))
            self.reset()
        if not self.hydrated:
            first = batch[0]
            if not self.replayed and first.metadata.num_delivered == 1 and await self.first_input(first):
                self.hydrated = True  # a first delivery of the log's first input: nothing precedes it
                self.seen_epoch = epoch_of(first)
            elif not await self._replay_through(batch, seqs):
                return
        if not await self.in_order(batch, seqs):
            log.info("%s: an input before this one was lost on the way; replaying", self._what(batch))
            self.reset()
            if not await self._replay_through(batch, seqs):
                return
        effects = Effects()
        for msg, seq in zip(batch, seqs, strict=True):
            if seq > self.last_seq:
                await self.fold_input(LogEntry(msg.subject, msg.data, seq, log_time(msg), msg.headers), into=effects)
                self.folded(seq)
                self.seen_epoch = None if resent(msg) else epoch_of(msg)  # as `in_order` reads it
        if self.halted is not None:
            await self._halted(batch)
            return
        if effects:
            await self.publish(effects)
        for m in batch:
            await ack(m)  # queued on the connection, not a round trip: no task per ack

    async def _replay_through(self, batch: list[Msg], seqs: list[int]) -> bool:
        """Rebuild the state by replaying the log through `batch` at least; False when
        the replay halted the actor (`batch` is handed back then)."""
        self.replay_through = max(seqs)
        await self.rehydrate()
        if self.halted is not None:
            await self._halted(batch)
            return False
        # the replay read a prefix of the log, maybe from a replica behind its leader: the
        # next input is asked for (`in_order`), not taken for the next
        self.replayed_to, self.folded_live, self.seen_epoch = self.last_seq, array("q"), None
        return True

    async def publish(self, effects: Effects) -> None:
        await self.outbox.send(effects)

    async def decode(self, decoder: Decoder[T], entry: LogEntry) -> T | None:
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

    async def read_log(
        self, subject: str, *, after: int = 0, through: int = 0, stream: str | None = None
    ) -> list[LogEntry]:
        """The log's messages on `subject` (a filter), from sequence `after` + 1 on, and
        at least through sequence `through` (the input being handled: the log holds it).
        An empty log (expired, purged) is empty; one that stops part way raises
        `LogStalled`.

        `through` is what makes a replay complete: the ordered consumer that reads the
        log may be placed on a replica still catching up after a restart, which says
        "nothing pending" at the end of what it has (seen in tests/system/test_ride_out.py: one
        message of nine). Folding that would build a state behind the log, so the read
        goes on until the input being handled has come by."""
        config = (
            None
            if not after
            else ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
        )
        stream = stream or self.stream
        sub = await self.host.js.subscribe(
            subject, stream=stream, ordered_consumer=True, pending_msgs_limit=-1, config=config
        )
        entries: list[LogEntry] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=REPLAY_IDLE_TIMEOUT)
                except TimeoutError:
                    if through > (entries[-1].seq if entries else after) and not await self._stored(through, stream):
                        break  # the input being handled is gone since (expired, removed): no use waiting
                    if entries or through or (await sub.consumer_info()).num_pending:
                        raise LogStalled(
                            f"{self.source} {self.key}: the log stalled after {len(entries)} messages"
                        ) from None
                    break
                entry = LogEntry(msg.subject, msg.data, stream_seq(msg), log_time(msg), msg.headers)
                entries.append(entry)
                if msg.metadata.num_pending == 0 and entry.seq >= through:
                    break
        finally:
            await sub.unsubscribe()
        return entries

    async def _stored(self, seq: int, stream: str) -> bool:
        """Does the stream leader still hold message `seq`? (An input expired by the
        stream's age limit, or removed, since it was delivered is no longer waited for.)"""
        try:
            await self.host.js.get_msg(stream, seq)
            return True
        except NotFoundError:
            return False
