"""A flood of long-running executions does not keep an actor each in memory: past
`engine_max_resident` / `counter_max_resident` idle actors are evicted, and the next
input for one rebuilds it by replay, deciding nothing twice."""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from typing import Any

import pytest

from actors.counter import Counter
from actors.engine.actor import Engine
from actors.hosting import PartitionHost
from actors.metrics import EVICTED_ACTORS
from tests.conftest import System

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90),
              pytest.mark.layout(engine_max_resident=8, counter_max_resident=4)]

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

    async def on_msg(self: PartitionHost[Any, Any], msg: Any) -> None:
        await real_on_msg(self, msg)
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
    assert (EVICTED_ACTORS.value(role="engine") - evicted_before[0],
            EVICTED_ACTORS.value(role="counter") - evicted_before[1]) == (engine.evicted, counter.evicted)
    assert not over, over[:5]
    for eid in ids:
        items = await system.events(eid)
        decided = Tally((i.type, i.step) for i in items if i.type in ("step.enter", "step.exit"))
        assert decided == {(t, s): 1 for t in ("step.enter", "step.exit") for s in ("first", "nap", "last", "end")}, eid
        verdicts = [i for i in items if i.type in ("iterator.completed", "iterator.failed")]
        assert [(v.type, v.data["total"], v.data["succeeded"]) for v in verdicts] == [("iterator.completed", 3, 3)]
        assert len([i for i in items if i.type in ("playbook.completed", "playbook.failed")]) == 1
