"""Hosting keyed actors for the partitions a pod owns: what the engine (an actor per
execution) and the counter (an actor per loop) share.

A host supplies what the actors cannot do for themselves, and only that: the
partitions (a durable push consumer per partition whose lease this pod holds, `gain`,
`lose`), delivery (each input put into its key's actor's mailbox, the actor spawned on
first sight; a late input for an actor that finished acked unread; what an actor is
working on kept alive, `holding`), memory (evicting idle actors) and the fold threads
(`fold_off_loop`). Everything else is the actor's: its loop, its handling, and what a
failure means (actors/runtime/logactor.py `LogActor.run` and `on_failure`, the policy in
actors/runtime/supervision.py). Control goes one way: the host puts an input in a
mailbox and never calls into an actor's handling; an actor asks its host only for
these services.

A fold that meets a template that is not cheap by construction (or whose templates
need more than their inline slice of operations) raises `SliceExhausted`
(actors/playbook/templates.py): the actor is rebuilt and folds from then on on a worker
thread (`fold_off_loop`) whose renders run in a render process with OS limits
(actors/runtime/render_process.py), so a runaway template holds neither the event loop nor the
interpreter lock that every other execution's steps need.

Memory is bounded by `max_resident`, not by how many executions (or loops) are open: a
flood of long-running executions would otherwise keep an actor each in memory for as
long as they run. Past the bound the least recently used idle actors are evicted (their
state is in the log); the next input for one spawns it again, and it rebuilds by replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, Protocol, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from actors.natsio import ack, dead_letter
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.metadata import delivery
from actors.playbook.loader import INLINE_PLAYBOOK_CHARS, cached_playbook, loaded_playbook, parsed_playbook
from actors.playbook.model import Playbook
from actors.playbook.templates import RenderFault
from actors.runtime.gaps import DeliveryGaps, mark
from actors.runtime.metrics import EVICTED_ACTORS
from actors.runtime.render_process import OffLoop, RenderBounds
from actors.runtime.stopping import cancel_and_wait
from streams.layout import Layout, deliver_subject

log = logging.getLogger("actors")
FOLD_THREADS = 4  # folds of actors moved off the event loop, at once, per host (a render process each)


class Hosted(Protocol):
    """What a host needs of an actor: a mailbox to put inputs in, the task running its
    loop (`run`), whether it is working (an idle one may be evicted) and whether it
    folds off the event loop."""

    mailbox: asyncio.Queue[Msg]
    task: asyncio.Task[None] | None
    busy: bool  # handling inputs (between taking them from its mailbox and being done)
    off_loop: bool  # folds on a worker thread (its templates took more than the inline slice)

    async def run(self) -> None: ...


K = TypeVar("K", bound=Hashable)
A = TypeVar("A", bound=Hosted)
T = TypeVar("T")


class PartitionHost(Generic[K, A]):
    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        consumer: Callable[[int], str],
        key_of: Callable[[str], K],
        partition_of: Callable[[K], int],
        retired_cache: int = 10_000,
        max_resident: int = 50_000,
        role: str = "",
        render_bounds: RenderBounds | None = None,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.actors: dict[K, A] = {}  # least recently given an input first
        self.max_resident = max(max_resident, 1)
        self.evicted = 0
        self.role = role or type(self).__name__.lower()  # the metrics' label
        self._evicted_key = EVICTED_ACTORS.key(role=self.role)
        EVICTED_ACTORS.inc_key(self._evicted_key, 0)  # the series exists from the start: no gaps
        self.retired: OrderedDict[K, None] = OrderedDict()
        self.gaps = DeliveryGaps()  # deliveries lost on the way (actors/runtime/gaps.py)
        self._retired_cache = retired_cache
        self._subs: dict[int, Subscription] = {}
        self._acks: set[asyncio.Future[None]] = set()  # acks of late inputs, in flight
        self._consumer = consumer
        self._key_of = key_of
        self._partition_of = partition_of
        self._held: dict[int, tuple[list[Msg], float]] = {}  # inputs being handled -> since (loop time)
        self._holds = itertools.count()
        self._beat: asyncio.Task[None] | None = None
        # folds of actors moved off the event loop, their renders in render processes
        self._off_loop = OffLoop(threads=FOLD_THREADS, name=f"{self.role}-fold", bounds=render_bounds)

    def spawn(self, key: K) -> A:
        raise NotImplementedError

    @property
    def partitions(self) -> list[int]:
        """The partitions this host consumes now."""
        return sorted(self._subs)

    async def start(self) -> None:
        """Nothing to consume yet: a host takes a partition only when its leases win it
        (`gain`, called by actors/ownership.Leases), so two hosts never consume one."""

    async def gain(self, partition: int) -> None:
        """Start taking the inputs of `partition` (this pod now holds its lease)."""
        if partition in self._subs:
            return
        if self._beat is None:
            self._beat = asyncio.create_task(self._keep_alive(), name=f"{type(self).__name__}:keep-alive")
        name = self._consumer(partition)
        # inputs go into their actor's mailbox as they are read: no queue hop, no task switch
        self._subs[partition] = await subscribe_direct(self.nc, deliver_subject(name), self._on_msg, queue=name)

    async def lose(self, partition: int) -> None:
        """Stop taking `partition`'s inputs and hand back what its actors hold: the
        next owner gets them (now, by nak) and rebuilds each actor by replay."""
        sub = self._subs.pop(partition, None)
        if sub is not None:
            await sub.unsubscribe()
        doomed = [(k, a) for k, a in self.actors.items() if self._partition_of(k) == partition]
        for k, _ in doomed:
            del self.actors[k]
        await cancel_and_wait(a.task for _, a in doomed)

    def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            return  # flow-control/heartbeat status messages carry no ack subject
        try:
            stream, consumer, seq, deliveries = delivery(msg)  # every delivery counts, even one not folded
        except Exception:  # published to the deliver subject by hand: no consumer's, no log's
            log.warning("%s: a message on %s that no consumer delivered; ignored", self.role, msg.subject)
            return
        mark(msg, self.gaps.delivered(stream, consumer, seq), again=deliveries > 1)
        key = self._key_of(msg.subject)
        if not self._in_its_partition(msg.subject, key):
            self._misrouted(msg, key)
            return
        actor = self.actors.pop(key, None)
        if actor is None:
            if key in self.retired and not self.wakes_retired(msg.subject):
                self._ack_late(msg)  # a late input for an actor that finished
                return
            self.retired.pop(key, None)
            actor = self.spawn(key)
            actor.task = asyncio.create_task(actor.run(), name=f"{type(actor).__name__}:{key}")
        self.actors[key] = actor  # (re)inserted: most recently used last
        actor.mailbox.put_nowait(msg)
        if len(self.actors) > self.max_resident:
            self._evict()

    def _in_its_partition(self, subject: str, key: K) -> bool:
        """Is an input's subject in its key's partition (`exec.<p>.<id>...`, `loop.<p>...`,
        p = partition_of(id))? Only such an input is in the log a replay reads
        (`exec.<p>.<id>.>`): one folded from another partition would be lost at the next
        replay, leaving the execution stuck and its status wrong."""
        token = subject.split(".", 2)[1] if subject.count(".") >= 2 else ""
        return token.isdigit() and int(token) == self._partition_of(key)

    def _misrouted(self, msg: Msg, key: K) -> None:
        """Dead-letter (then ack) an input published in a partition not its key's: never
        folded (called from the read loop: the work is a task)."""
        want = self._partition_of(key)
        reason = (
            f"input on {msg.subject} is not in its partition: {key!r} is in partition {want} "
            f"of {self.layout.partitions}, so its log (read on replay) does not hold this subject; not folded"
        )
        execution_id = key[0] if isinstance(key, tuple) else str(key)
        done = asyncio.ensure_future(self._dead_letter(msg, reason, execution_id))
        self._acks.add(done)
        done.add_done_callback(self._ack_sent)

    async def _dead_letter(self, msg: Msg, reason: str, execution_id: str) -> None:
        await dead_letter(self.js, source=self.role, reason=reason, msg=msg, execution_id=execution_id)
        await ack(msg)

    def _ack_late(self, msg: Msg) -> None:
        """Ack an input no actor needs (called from the read loop: the ack is a task)."""
        done = asyncio.ensure_future(ack(msg))
        self._acks.add(done)
        done.add_done_callback(self._ack_sent)

    def _ack_sent(self, done: asyncio.Future[None]) -> None:
        self._acks.discard(done)
        if not done.cancelled() and done.exception() is not None:
            log.debug("ack of a late input: %r", done.exception())  # it comes back and is acked then

    def wakes_retired(self, subject: str) -> bool:
        """Whether an input on `subject` is folded even by an actor that finished (it is
        rebuilt by replay for it); every other late input is acked unread."""
        return False

    def _evict(self) -> None:
        """Drop least recently used idle actors (nothing in the mailbox, not handling
        anything) until a tenth of `max_resident` is free again, so that a full host
        does not scan on every spawn. An idle actor waits in `mailbox.get()`; cancelled
        there it holds no input and has published everything it decided. Busy ones are
        skipped: the bound is exceeded only while more than it are busy at once."""
        target = self.max_resident - max(self.max_resident // 10, 1)
        doomed: list[K] = []
        for key, actor in self.actors.items():
            if len(self.actors) - len(doomed) <= target:
                break
            if not actor.busy and actor.mailbox.empty():
                doomed.append(key)
        for key in doomed:
            actor = self.actors.pop(key)
            if actor.task is not None:
                actor.task.cancel()
        self.evicted += len(doomed)
        EVICTED_ACTORS.inc_key(self._evicted_key, len(doomed))

    def forget(self, key: K, actor: A) -> None:
        if self.actors.get(key) is actor:
            del self.actors[key]

    def gap_epoch(self, stream: str, key: K) -> int:
        """The gap epoch now of the consumer that delivers `key`'s inputs from `stream`."""
        return self.gaps.epoch(stream, self._consumer(self._partition_of(key)))

    def retire(self, key: K, actor: A) -> None:
        self.forget(key, actor)
        self.retired[key] = None
        if len(self.retired) > self._retired_cache:
            self.retired.popitem(last=False)

    async def stop(self) -> None:
        """Stop taking inputs; cancel the actors (each hands back what it holds).
        Unacked inputs are redelivered to whichever pod owns the partition next."""
        for sub in self._subs.values():
            await sub.unsubscribe()
        self._subs.clear()
        await cancel_and_wait(a.task for a in self.actors.values())
        self.actors.clear()
        await cancel_and_wait([self._beat])
        self._beat = None
        self._off_loop.close()  # a render still running ends at once

    @contextlib.contextmanager
    def holding(self, held: list[Msg]) -> Iterator[None]:
        """While an actor works on `held` (handling it, replaying, pausing after a
        failure), the host keeps it alive (`_keep_alive`): the server must not deliver
        it again meanwhile."""
        token = next(self._holds)
        self._held[token] = (held, time.monotonic())  # not the loop's time: no getpid() per input (3.11)
        try:
            yield
        finally:
            del self._held[token]

    async def preload_playbook(self, source: str, file: str, max_attempts: int) -> None:
        """A playbook too big to load on the event loop (actors/playbook/loader.py) loaded
        now by a render process, off the loop, so the fold that needs it finds it cached
        and stays on the loop. What goes wrong is left to that fold, which meets it again
        and decides (PlaybookInvalid) or records (RenderFault) it."""
        if len(source) <= INLINE_PLAYBOOK_CHARS or cached_playbook(source, file, max_attempts) is not None:
            return
        try:
            await self._off_loop.off_loop(functools.partial(parsed_playbook, source, file, max_attempts))
        except (Exception, RenderFault) as e:
            log.info("%s: loading a playbook of %d characters ahead of its fold: %r", self.role, len(source), e)

    async def load_playbook(self, source: str, file: str, max_attempts: int) -> Playbook:
        """A playbook a request brought (`catalog.register`, actors/gateway/answers.py),
        loaded on a fold thread, never on the event loop: one over INLINE_PLAYBOOK_CHARS by
        a render process, under its limits; not kept in the folds' cache (`loaded_playbook`).
        PlaybookInvalid with every problem of the file; RenderFault when the process was
        killed or ran out of memory."""
        return await self._off_loop.off_loop(functools.partial(loaded_playbook, source, file, max_attempts))

    async def fold_off_loop(self, actor: Hosted, fold: Callable[[], T]) -> T:
        """Run a fold inline with its slice of template operations, or, for an actor
        moved off the loop, on one of this host's fold threads (actors/runtime/render_process.py)."""
        if not actor.off_loop:
            return self._off_loop.inline(fold)
        return await self._off_loop.off_loop(fold)

    async def _keep_alive(self) -> None:
        """Every `ack_wait / 3`, tell the server that inputs held longer than that are
        still being worked on (a slow replay, publishes waiting out a leader election,
        a pause after a failure), so it does not redeliver them meanwhile (a copy in
        the mailbox behind the original). Most inputs are acked in milliseconds and
        never beaten."""
        period = max(self.layout.ack_wait / 3, 0.1)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for held, since in list(self._held.values()):
                if now - since < period:
                    continue
                try:
                    for m in held:
                        await m.in_progress()
                except Exception as e:  # reconnecting or closed: the next beat tries again
                    log.debug("keep-alive: %r", e)


async def hand_back(held: list[Msg], mailbox: asyncio.Queue[Msg]) -> None:
    """Nak what an actor holds (and everything queued behind it) so the server
    redelivers it now, not after ack_wait."""
    pending = list(held)
    while not mailbox.empty():
        pending.append(mailbox.get_nowait())
    for m in pending:
        try:
            await m.nak()
        except Exception:
            pass
