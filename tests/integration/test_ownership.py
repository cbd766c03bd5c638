"""Partition ownership across engine pods: every partition owned by exactly one pod,
rebalanced when pods join or leave, taken over when a pod dies."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from actors.client import Client
from actors.pod.roles import Runtime, connect, start_roles
from actors.runtime.hosting import PartitionHost
from streams.layout import Layout, ensure
from streams.server import NatsServer
from tests.conftest import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: owned}
workflow:
  - step: a
    tool: {kind: sleep, seconds: 0.05}
    next: b
  - step: b
    tool: {kind: python, code: "def main(v): return v * 2"}
    args: {v: "{{ workload.v }}"}
"""


class Pod:
    """An engine (or counter) pod as `actors-cli serve` runs one: its own connection
    and member name."""

    def __init__(self, nc: NATS, rt: Runtime) -> None:
        self.nc, self.rt = nc, rt
        (self.leases,) = rt.leases()

    @classmethod
    async def start(cls, url: str, layout: Layout, name: str, role: str = "engine") -> Pod:
        nc = await connect(url, name=name)
        return cls(nc, await start_roles(nc, layout=layout, roles=(role,), pod=name))

    @property
    def held(self) -> set[int]:
        return set(self.leases.held)

    @property
    def host(self) -> PartitionHost[Any, Any]:
        (host,) = [a for a in self.rt.actors if isinstance(a, PartitionHost)]
        return host

    async def stop(self) -> None:
        await self.rt.stop()
        await self.nc.close()

    async def crash(self) -> None:
        """As a kill -9 looks from outside: the connection drops, nothing is handed back."""
        if self.leases._task is not None:
            self.leases._task.cancel()
        for t in [a.task for a in self.host.actors.values() if a.task]:
            t.cancel()
        await self.nc.close()


@contextlib.asynccontextmanager
async def leased(layout: Layout, *, rest: tuple[str, ...]) -> AsyncIterator[tuple[NatsServer, NATS, list[Pod]]]:
    """A server, a connection running the roles `rest` (a leased role among them is
    alone, so it holds every partition), and a list for the test's pods: each one left
    in it is stopped at the end."""
    server = await NatsServer.start()
    nc = await connect(server.url, name="rest")
    await ensure(nc.jetstream(), layout)
    others = await start_roles(nc, layout=layout, roles=rest)
    pods: list[Pod] = []
    try:
        yield server, nc, pods
    finally:
        for p in pods:
            await p.stop()
        await others.stop()
        await nc.close()
        await server.stop()


async def test_partitions_are_owned_once_rebalanced_and_taken_over(tmp_path: Path) -> None:
    layout = Layout(partitions=6, ack_wait=2.0, lease_ttl=2.0)
    async with leased(layout, rest=("tools", "projector", "counter")) as (server, nc, pods):
        pods += [await Pod.start(server.url, layout, f"pod{i}") for i in range(3)]

        async def balanced(live: list[Pod], share: int) -> bool:
            for p in live:
                await p.leases.balance()  # no waiting for the next period
            sets = [p.held for p in live]
            union = set().union(*sets)
            return (
                union == set(range(layout.partitions))
                and sum(map(len, sets)) == layout.partitions
                and all(len(s) == share for s in sets)
            )

        await wait_for(lambda: balanced(pods, 2), timeout=20)

        client = Client(nc, layout=layout)
        pb = tmp_path / "owned.yaml"
        pb.write_text(PLAYBOOK)
        entry = await client.register(pb)
        ids = [await client.start(entry.path, payload={"v": i}) for i in range(30)]

        victim = pods.pop(0)
        await victim.crash()  # its leases age out; the others take its partitions
        await wait_for(lambda: balanced(pods, 3), timeout=20)
        for i, eid in enumerate(ids):
            st = await client.wait(eid, timeout=30)
            assert st.state == "COMPLETED", (eid, st)
            items = await client.events(eid)
            done = [x for x in items if x.type == "playbook.completed"]
            assert len(done) == 1 and done[0].data["result"] == {"b": i * 2}

        pods.append(await Pod.start(server.url, layout, "pod3"))  # a pod joins: shares shrink
        await wait_for(lambda: balanced(pods, 2), timeout=20)
        more = [await client.start(entry.path, payload={"v": 100 + i}) for i in range(6)]
        for eid in more:
            assert (await client.wait(eid, timeout=30)).state == "COMPLETED"


async def test_a_graceful_stop_hands_partitions_over_at_once(tmp_path: Path) -> None:
    server = await NatsServer.start()
    layout = Layout(partitions=4, lease_ttl=30.0)  # a TTL far longer than the test
    nc = await connect(server.url, name="rest")
    await ensure(nc.jetstream(), layout)
    try:
        a = await Pod.start(server.url, layout, "a")
        assert a.held == {0, 1, 2, 3}
        b = await Pod.start(server.url, layout, "b")
        await a.leases.balance()  # a sees b and gives up its extra share
        await b.leases.balance()
        assert len(a.held) == 2 and len(b.held) == 2 and not a.held & b.held
        await a.stop()  # releases its keys: b need not wait 30 s
        await b.leases.balance()
        assert b.held == {0, 1, 2, 3}
        await b.stop()
    finally:
        await nc.close()
        await server.stop()


async def test_pod_names_are_valid_kv_keys() -> None:
    from actors.runtime.ownership import pod_name

    assert all(c.isalnum() or c in "-_" for c in pod_name())


LOOP_PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: leased_loop}
workflow:
  - step: fan
    loop: {collection: "{{ workload.things }}", element: x, mode: async, concurrency: 4}
    tool: {kind: sleep, seconds: 0.05}
"""


async def test_counter_pods_share_loops_and_take_over_a_crashed_one(tmp_path: Path) -> None:
    layout = Layout(partitions=4, ack_wait=2.0, lease_ttl=2.0)
    async with leased(layout, rest=("tools", "projector", "engine")) as (server, nc, pods):
        pods += [await Pod.start(server.url, layout, f"counter{i}", role="counter") for i in range(2)]

        async def split() -> bool:
            for p in pods:
                await p.leases.balance()
            return sorted(len(p.held) for p in pods) == [2, 2] and not pods[0].held & pods[1].held

        await wait_for(split, timeout=20)
        client = Client(nc, layout=layout)
        pb = tmp_path / "loop.yaml"
        pb.write_text(LOOP_PLAYBOOK)
        entry = await client.register(pb)
        ids = [await client.start(entry.path, payload={"things": list(range(40))}) for _ in range(8)]
        victim = pods[0]

        async def mid_loop() -> bool:
            return len(victim.host.actors) > 0

        await wait_for(mid_loop, timeout=20)
        await victim.crash()
        pods.remove(victim)
        for eid in ids:
            st = await client.wait(eid, timeout=40)
            assert st.state == "COMPLETED", (eid, st)
            done = [x for x in await client.events(eid) if x.type == "iterator.completed"]
            assert len(done) == 1
            assert (done[0].data["total"], done[0].data["succeeded"], done[0].data["failed"]) == (40, 40, 0)
        await pods[0].leases.balance()
        assert pods[0].held == {0, 1, 2, 3}
