"""Hosting keyed actors for the partitions a pod owns: what the engine (an actor per
execution) and the counter (an actor per loop) share.

A host subscribes to one durable push consumer per owned partition and dispatches each
input by key to that key's actor, creating it on first sight. Each actor works through
its mailbox on its own task. An actor that failed is forgotten (its inputs come back and
a new actor rebuilds it by replay); one that finished is retired, so late inputs for it
are acked without a replay.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, Protocol, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from streams.layout import Layout, deliver_subject


class Hosted(Protocol):
    mailbox: asyncio.Queue[Msg]
    task: asyncio.Task[None] | None

    async def run(self) -> None: ...


K = TypeVar("K", bound=Hashable)
A = TypeVar("A", bound=Hosted)


class PartitionHost(Generic[K, A]):
    def __init__(self, nc: NATS, *, layout: Layout, partitions: Iterable[int] | None, consumer: Callable[[int], str],
                 key_of: Callable[[str], K], partition_of: Callable[[K], int], retired_cache: int = 10_000) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.partitions = list(range(layout.partitions) if partitions is None else partitions)
        self.actors: dict[K, A] = {}
        self.retired: OrderedDict[K, None] = OrderedDict()
        self._retired_cache = retired_cache
        self._subs: dict[int, Subscription] = {}
        self._consumer = consumer
        self._key_of = key_of
        self._partition_of = partition_of

    def spawn(self, key: K) -> A:
        raise NotImplementedError

    async def start(self) -> None:
        for p in self.partitions:
            await self.gain(p)

    async def gain(self, partition: int) -> None:
        """Start taking the inputs of `partition` (this pod now owns it)."""
        if partition in self._subs:
            return
        name = self._consumer(partition)
        self._subs[partition] = await self.nc.subscribe(deliver_subject(name), queue=name, cb=self._on_msg,
                                                        pending_msgs_limit=-1)

    async def lose(self, partition: int) -> None:
        """Stop taking `partition`'s inputs and hand back what its actors hold: the
        next owner gets them (now, by nak) and rebuilds each actor by replay."""
        sub = self._subs.pop(partition, None)
        if sub is not None:
            await sub.unsubscribe()
        doomed = [(k, a) for k, a in self.actors.items() if self._partition_of(k) == partition]
        for k, a in doomed:
            del self.actors[k]
            if a.task is not None:
                a.task.cancel()
        await asyncio.gather(*(a.task for _, a in doomed if a.task), return_exceptions=True)

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            return  # flow-control/heartbeat status messages carry no ack subject
        key = self._key_of(msg.subject)
        actor = self.actors.get(key)
        if actor is None:
            if key in self.retired:
                await msg.ack()  # a late input for an actor that finished
                return
            actor = self.actors[key] = self.spawn(key)
            actor.task = asyncio.create_task(actor.run(), name=f"{type(actor).__name__}:{key}")
        actor.mailbox.put_nowait(msg)

    def forget(self, key: K, actor: A) -> None:
        if self.actors.get(key) is actor:
            del self.actors[key]

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
        tasks = [a.task for a in self.actors.values() if a.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.actors.clear()


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
