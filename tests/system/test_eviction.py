"""A flood of long-running executions does not keep an actor each in memory: past
`engine_max_resident` / `counter_max_resident` idle actors are evicted, and the next
input for one rebuilds it by replay, deciding nothing twice."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter as Tally
from typing import Any

import nats
import pytest

from actors.engine.actor import Engine
from actors.loops.counter import Counter
from actors.runtime.hosting import PartitionHost
from actors.runtime.metrics import EVICTED_ACTORS
from streams.layout import Layout
from tests.conftest import System

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.timeout(90),
    pytest.mark.layout(engine_max_resident=8, counter_max_resident=4),
]

EXECUTIONS = 40
PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: flood}
workflow:
  - step: first
    tool: {kind: noop}
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: 0.2}
    loop: {collection: "{{ range(3) | list }}", element: i, concurrency: 1}
    next: last
  - step: last
    tool: {kind: noop}
    next: end
"""


def working(host: PartitionHost[Any, Any]) -> int:
    return sum(1 for a in host.actors.values() if a.busy or not a.mailbox.empty())


async def test_a_flood_of_executions_stays_within_the_resident_bound_and_decides_nothing_twice(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = next(a for a in system.runtime.actors if isinstance(a, Engine))
    counter = next(a for a in system.runtime.actors if isinstance(a, Counter))
    over: list[tuple[str, int, int]] = []  # (host, resident, working) where the bound did not hold
    real_on_msg = PartitionHost._on_msg

    def on_msg(self: PartitionHost[Any, Any], msg: Any) -> None:
        real_on_msg(self, msg)
        # after each input: at most max_resident actors, unless more than that are working
        if len(self.actors) > max(self.max_resident, working(self)):
            over.append((type(self).__name__, len(self.actors), working(self)))

    monkeypatch.setattr(PartitionHost, "_on_msg", on_msg)
    for host in (engine, counter):  # the subscriptions hold the bound method: take them again
        for p in list(host._subs):
            await host.lose(p)
            await host.gain(p)
    evicted_before = EVICTED_ACTORS.value(role="engine"), EVICTED_ACTORS.value(role="counter")

    ids = [await system.start_yaml(PLAYBOOK) for _ in range(EXECUTIONS)]
    statuses = await asyncio.gather(*(system.client.wait(eid, timeout=60) for eid in ids))

    assert [s.state for s in statuses] == ["COMPLETED"] * EXECUTIONS
    assert engine.evicted > 0 and counter.evicted > 0, (engine.evicted, counter.evicted)
    assert (
        EVICTED_ACTORS.value(role="engine") - evicted_before[0],
        EVICTED_ACTORS.value(role="counter") - evicted_before[1],
    ) == (engine.evicted, counter.evicted)
    assert not over, over[:5]
    for eid in ids:
        items = await system.events(eid)
        decided = Tally((i.type, i.step) for i in items if i.type in ("step.enter", "step.exit"))
        assert decided == {(t, s): 1 for t in ("step.enter", "step.exit") for s in ("first", "nap", "last", "end")}, eid
        verdicts = [i for i in items if i.type in ("iterator.completed", "iterator.failed")]
        assert [(v.type, v.data["total"], v.data["succeeded"]) for v in verdicts] == [("iterator.completed", 3, 3)]
        assert len([i for i in items if i.type in ("playbook.completed", "playbook.failed")]) == 1


class _Input:
    """What PartitionHost._on_msg reads of a message: its subject and ack subject (a
    JetStream one: the host counts deliveries by it)."""

    delivered = itertools.count(1)

    def __init__(self, key: str) -> None:
        # an input of its key's log, in its partition (the host folds nothing from another)
        n = next(self.delivered)
        self.subject, self.reply = f"exec.0.{key}.in.start", f"$JS.ACK.EXEC.engine-p0.1.{n}.{n}.0.0"


class _Actor:
    """Takes one input and works on it until `release` is set."""

    def __init__(self) -> None:
        self.mailbox: asyncio.Queue[Any] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.busy = False
        self.release = asyncio.Event()
        self.working = asyncio.Event()
        self.waiting = asyncio.Event()  # back in mailbox.get(), after its work

    async def run(self) -> None:
        while True:
            await self.mailbox.get()
            self.busy = True
            self.working.set()
            await self.release.wait()
            self.busy = False
            self.waiting.set()


class _Host(PartitionHost[str, _Actor]):
    def spawn(self, key: str) -> _Actor:
        return _Actor()


async def test_eviction_takes_least_recently_used_idle_actors_and_never_a_busy_one(nats_server: Any) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        host = _Host(
            nc,
            layout=Layout(partitions=1),
            consumer=str,
            key_of=lambda s: s.split(".")[2],
            partition_of=lambda k: 0,
            max_resident=3,
            role="test",
        )
        for key in ("busy", "idle1", "idle2"):
            host._on_msg(_Input(key))  # type: ignore[arg-type]
        busy = host.actors["busy"]
        await asyncio.wait_for(busy.working.wait(), 5)  # the oldest one is mid-work, the others idle
        idle = [host.actors["idle1"], host.actors["idle2"]]
        for actor in idle:
            actor.release.set()
            await asyncio.wait_for(actor.waiting.wait(), 5)
        host._on_msg(_Input("new"))  # type: ignore[arg-type]  # 4 > 3: evict down to 2, oldest first
        assert list(host.actors) == ["busy", "new"] and host.evicted == 2
        await asyncio.gather(*(a.task for a in idle if a.task), return_exceptions=True)
        assert all(a.task is not None and a.task.cancelled() for a in idle)
        assert busy.task is not None and not busy.task.done(), "a busy actor was evicted"
        await host.stop()
    finally:
        await nc.close()
