"""A `dev`-like runtime (every role in this process, as `actors-cli dev` starts them)
beside `serve` pods on one nats-server, while the pods come and go: no partition is
ever consumed by two engines (or two counters) at once, the `owners` bucket and the
server's subscriptions agree on who consumes what, every execution ends once, and a
cancel after the handovers acts on the execution's current state.

Before every engine took its partitions through leases, `dev` consumed all of them
beside the pods' leased ones: the server split one execution's inputs between two
engines, and executions stayed RUNNING with a log ending at `call.done`."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError

from actors.client import Client
from actors.pod.roles import ROLES as ALL_ROLES
from actors.pod.roles import Runtime, connect, start_roles
from actors.wire.events import TERMINAL_EVENTS
from streams.layout import OWNERS_BUCKET, Layout, deliver_subject
from streams.server import NatsServer
from tests.conftest import wait_for
from tests.support.pods import PodProcess, free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

LAYOUT = Layout(partitions=6, ack_wait=2.0, lease_ttl=2.0, duplicate_window=1.0)
ROLES = ("engine", "counter")
WAVE = 8  # executions started at each stage; three stages

STEPS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: mixed}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 0.3}
    next: double
  - step: double
    tool: {kind: python, code: "def main(v): return v * 2"}
    args: {v: "{{ workload.v }}"}
"""

# cancelled once the pods are gone: the engine that takes the cancel holds the
# execution's current state, whoever worked it before
HELD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: mixed_held}
workflow:
  - step: wait
    tool: {kind: sleep, seconds: 60}
    next: never
  - step: never
    tool: {kind: python, code: "def main(): return 1"}
"""

ITEMS = 120
LOOP = f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: mixed_loop}}
workflow:
  - step: fan
    loop: {{collection: "{{{{ range({ITEMS}) | list }}}}", element: x, mode: async, concurrency: 4}}
    tool:
      kind: python
      code: |
        import time
        def main(x):
            time.sleep(0.02)
            return x * 3
    args: {{x: "{{{{ x }}}}"}}
"""


def member_prefix(pid: int) -> str:
    """How the `owners` member names of the process `pid` begin (ownership.pod_name)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{socket.gethostname()}-{pid}-")


class Consumers:
    """Who consumes each partition, as the server sees it: its monitoring endpoint
    lists every connection's subscriptions, and an engine (or counter) consumes a
    partition by subscribing to that partition's deliver subject. Sampled as fast as
    the server answers, all through the test; any subject with two connections on it
    at once is recorded."""

    def __init__(self, monitor: str) -> None:
        self.url = f"{monitor}/connz?subs=detail&limit=1000"
        self.subjects = {deliver_subject(f"{role}-p{p}"): (role, p) for role in ROLES for p in range(LAYOUT.partitions)}
        self.samples = 0
        self.doubles: list[tuple[str, list[str]]] = []

    async def snapshot(self, http: aiohttp.ClientSession) -> dict[tuple[str, int], list[str]]:
        """(role, partition) -> the names of the connections consuming it."""
        async with http.get(self.url) as r:
            connz = await r.json()
        found: dict[tuple[str, int], list[str]] = {}
        for conn in connz["connections"]:
            for sub in conn.get("subscriptions_list_detail") or []:
                if sub["subject"] in self.subjects:
                    found.setdefault(self.subjects[sub["subject"]], []).append(conn.get("name", ""))
        return found

    async def watch(self, http: aiohttp.ClientSession) -> None:
        while True:
            for (role, p), names in (await self.snapshot(http)).items():
                if len(names) > 1:
                    self.doubles.append((f"{role}-p{p}", names))
            self.samples += 1
            await asyncio.sleep(0.01)  # a sampling interval: there is no event for "nothing changed"


async def leases_in_kv(nc: NATS, role: str) -> dict[int, str]:
    """partition -> the member named in its lease key in the `owners` bucket."""
    kv = await nc.jetstream().key_value(OWNERS_BUCKET)
    held: dict[int, str] = {}
    for p in range(LAYOUT.partitions):
        try:
            entry = await kv.get(f"{role}.p{p}")
        except KeyNotFoundError:
            continue
        if entry.value:
            held[p] = entry.value.decode()
    return held


async def settled(
    nc: NATS, consumers: Consumers, http: aiohttp.ClientSession, expected: Mapping[str, Mapping[str, str]]
) -> bool:
    """Every partition of each role is leased in `owners` to one of `expected[role]`
    (member name prefix -> the name of its connection), each holds its fair share, and
    the only connection consuming the partition is the one of the member its lease
    names."""
    consuming = await consumers.snapshot(http)
    for role, members in expected.items():
        kv = await leases_in_kv(nc, role)
        if set(kv) != set(range(LAYOUT.partitions)):
            return False
        owner_of = {p: next((prefix for prefix in members if name.startswith(prefix)), None) for p, name in kv.items()}
        if None in owner_of.values():
            return False  # a lease still names a member that should be gone
        # 6 partitions: 1, 2 or 3 members each hold the same share
        if [list(owner_of.values()).count(m) for m in members] != [LAYOUT.partitions // len(members)] * len(members):
            return False
        for p, prefix in owner_of.items():
            assert prefix is not None
            if consuming.get((role, p)) != [members[prefix]]:
                return False
    return True


async def test_dev_beside_serve_pods_never_shares_a_partition_and_every_execution_ends_once(tmp_path: Path) -> None:
    monitor_port = free_port()
    server = await NatsServer.start(extra_args=["-m", str(monitor_port)])
    nc = await connect(server.url, name="dev")
    dev: Runtime | None = None
    pods: list[PodProcess] = []
    watching: asyncio.Task[None] | None = None
    try:
        # the `dev` runtime, alone on the server: every lease is won before start_roles returns
        dev = await start_roles(nc, layout=LAYOUT)
        every = set(range(LAYOUT.partitions))
        assert {lease.role: set(lease.held) for lease in dev.leases()} == {"engine": every, "counter": every}
        dev_member = dev.leases()[0].pod
        for role in ROLES:
            assert await leases_in_kv(nc, role) == dict.fromkeys(every, dev_member)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            consumers = Consumers(f"http://127.0.0.1:{monitor_port}")
            watching = asyncio.create_task(consumers.watch(http))
            client = Client(nc, layout=LAYOUT)
            steps, loop, held = tmp_path / "steps.yaml", tmp_path / "loop.yaml", tmp_path / "held.yaml"
            steps.write_text(STEPS)
            loop.write_text(LOOP)
            held.write_text(HELD)
            steps_pb, loop_pb, held_pb = [await client.register(f) for f in (steps, loop, held)]
            held_id = await client.start(held_pb.path)
            ids: dict[str, int] = {}

            async def wave(first: int) -> None:
                for v in range(first, first + WAVE):
                    ids[await client.start(steps_pb.path, payload={"v": v})] = v

            # two pods join while the first wave runs: an engine-only one and one with every role
            await wave(0)
            engine_pod = await PodProcess.start("engine", url=server.url, layout=LAYOUT, logs=tmp_path, name="engine")
            all_pod = await PodProcess.start("all", url=server.url, layout=LAYOUT, logs=tmp_path, name="all")
            pods += [engine_pod, all_pod]
            await asyncio.gather(engine_pod.ready(), all_pod.ready())
            dev_conn = {member_prefix(os.getpid()): "dev"}
            engine_conn = {member_prefix(engine_pod.proc.pid): "actors-engine"}
            all_conn = {member_prefix(all_pod.proc.pid): "actors-" + "+".join(ALL_ROLES)}
            await wait_for(
                lambda: settled(
                    nc,
                    consumers,
                    http,
                    {"engine": {**dev_conn, **engine_conn, **all_conn}, "counter": {**dev_conn, **all_conn}},
                ),
                timeout=20,
            )

            # the second wave and the loop, then the engine pod stops (hands back its leases)
            await wave(WAVE)
            loop_id = await client.start(loop_pb.path)
            assert await engine_pod.stop() == 0
            await wait_for(
                lambda: settled(
                    nc, consumers, http, {"engine": {**dev_conn, **all_conn}, "counter": {**dev_conn, **all_conn}}
                ),
                timeout=20,
            )

            # the third wave, then the other pod dies mid-run: its leases age out, dev takes them
            await wave(2 * WAVE)
            await all_pod.kill()
            await wait_for(lambda: settled(nc, consumers, http, {"engine": dev_conn, "counter": dev_conn}), timeout=20)

            for eid, v in ids.items():
                assert (await client.wait(eid, timeout=30)).state == "COMPLETED", eid
                items = await client.events(eid)
                terminal = [i for i in items if i.cls == "lc" and i.type in TERMINAL_EVENTS]
                assert [t.type for t in terminal] == ["playbook.completed"], (eid, [i.type for i in items])
                assert terminal[0].data["result"] == {"double": v * 2}, eid
            assert (await client.wait(loop_id, timeout=30)).state == "COMPLETED"
            items = await client.events(loop_id)
            terminal = [i for i in items if i.cls == "lc" and i.type in TERMINAL_EVENTS]
            assert [t.type for t in terminal] == ["playbook.completed"]
            (verdict,) = [i for i in items if i.type in ("iterator.completed", "iterator.failed")]
            assert verdict.type == "iterator.completed"
            assert (verdict.data["total"], verdict.data["succeeded"], verdict.data["failed"]) == (ITEMS, ITEMS, 0)
            assert verdict.data["results"] == [x * 3 for x in range(ITEMS)]
            await client.cancel(held_id, reason="done waiting")
            assert (await client.wait(held_id, timeout=30)).state == "CANCELLED"
            items = await client.events(held_id)
            assert [i.type for i in items if i.cls == "lc" and i.type in TERMINAL_EVENTS] == ["execution.cancelled"]
            assert not [i for i in items if i.step == "never"], "a cancelled execution went on"
            assert not await client.dead_letters(), "nothing may end in a dead letter"

            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            assert consumers.samples > 100, consumers.samples
            assert not consumers.doubles, f"partitions consumed by two connections at once: {consumers.doubles[:5]}"
    finally:
        if watching is not None:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        await asyncio.gather(*(p.kill() for p in pods))
        if dev is not None:
            await dev.stop()
        await nc.close()
        await server.stop()
