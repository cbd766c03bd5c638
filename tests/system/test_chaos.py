"""Chaos: 200 executions with loops and retries across separate pod processes
(3 engine, 2 counter, 2 tool, 1 projector); one engine pod, then one tool pod, then
one counter pod is killed with SIGKILL mid-run. Every execution must end as it would
have without the kills, with one terminal lifecycle event, exact loop counts and no
step decided twice.

The server's duplicate window is 1 s here, shorter than a takeover takes: whatever a
replay re-sends is caught by the engine's and counter's own state, not by the server.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.client import Client, LogItem
from actors.pod.roles import connect
from streams.layout import EXEC_STREAM, Layout, ensure
from streams.server import NatsCluster, NatsServer
from tests.support.cluster import leader_of
from tests.support.pods import PodProcess
from tests.support.stuck import stuck_report

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

EXECUTIONS = 200
ITEMS = 8
TOLERATED = 2

# Execution i: a loop of 8 python iterations, of which 1 fails (tolerated) or, when
# i % 4 == 3, 4 fail (more than tolerated: the playbook fails); then a step that fails
# its first attempt and returns the loop's results on the retry.
PLAYBOOK = f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: chaos}}
workflow:
  - step: fan
    loop: {{collection: "{{{{ range({ITEMS}) | list }}}}", element: x, mode: async, concurrency: 3,
           tolerated_failures: {TOLERATED}}}
    tool:
      kind: python
      code: |
        def main(x, every):
            if x % every == every - 1:
                raise ValueError(f"item {{x}} is bad")
            return x * 10
    args: {{x: "{{{{ x }}}}", every: "{{{{ workload.every }}}}"}}
    next: flaky
  - step: flaky
    retry: {{max_attempts: 3, backoff: fixed, initial_delay: 0.2}}
    tool:
      kind: python
      code: |
        import os
        def main(f, fan):
            first = not os.path.exists(f)
            open(f, "a").write("x")
            if first:
                raise RuntimeError("first attempt fails")
            return fan
    args: {{f: "{{{{ workload.marker }}}}", fan: "{{{{ fan }}}}"}}
"""


def expected(i: int) -> tuple[str, int]:
    """(state, failed iterations) execution i reaches without any kill."""
    every = 2 if i % 4 == 3 else ITEMS
    failed = sum(1 for x in range(ITEMS) if x % every == every - 1)
    return ("FAILED" if failed > TOLERATED else "COMPLETED"), failed


class Terminals:
    """Counts terminal lifecycle events as they are published (core NATS, no polling)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.advisories: list[str] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def subscribe(self, nc: NATS) -> None:
        async def on(msg: Msg) -> None:
            # on its own subject, or (semantics 5) in the last step's answer record
            if msg.subject.endswith((".lc.playbook.completed", ".lc.playbook.failed")):
                self.seen.add(msg.subject.split(".")[2])
                for n, fut in self._waiters:
                    if len(self.seen) >= n and not fut.done():
                        fut.set_result(None)

        await nc.subscribe("exec.*.*.lc.>", cb=on)
        await nc.subscribe("exec.*.*.in.answer.lc.>", cb=on)

        async def adv(msg: Msg) -> None:
            self.advisories.append(msg.subject + " " + msg.data.decode())

        await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>", cb=adv)

    async def reach(self, n: int, timeout: float) -> None:
        if len(self.seen) >= n:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await asyncio.wait_for(fut, timeout)


def assert_decided_once(eid: str, items: list[LogItem]) -> None:
    for kind in ("step.enter", "step.exit"):
        per_activation = Counter((i.step, i.data.get("activation")) for i in items if i.type == kind)
        assert all(n == 1 for n in per_activation.values()), (eid, kind, per_activation)
    issued = Counter(
        (i.step, i.data.get("activation"), i.data.get("attempt_number")) for i in items if i.type == "command.issued"
    )
    assert all(n == 1 for n in issued.values()), (eid, issued)
    assert len([i for i in items if i.type == "iterator.started"]) == 1, eid


async def run_chaos(
    url: str,
    layout: Layout,
    tmp_path: Path,
    mid_run: Callable[[dict[str, list[PodProcess]], Terminals], Awaitable[None]],
) -> None:
    nc = await connect(url, name="chaos-test")
    await ensure(nc.jetstream(), layout)
    logs = tmp_path / "logs"
    logs.mkdir()
    counts = {"engine": 3, "counter": 2, "tools": 2, "projector": 1}
    pods = {
        role: [await PodProcess.start(role, url=url, layout=layout, logs=logs, name=f"{role}{i}") for i in range(n)]
        for role, n in counts.items()
    }
    try:
        await asyncio.gather(*(p.ready() for group in pods.values() for p in group))
        terminals = Terminals()
        await terminals.subscribe(nc)
        client = Client(nc, layout=layout)
        pb = tmp_path / "chaos.yaml"
        pb.write_text(PLAYBOOK)
        entry = await client.register(pb)
        ids = [
            await client.start(
                entry.path, payload={"every": 2 if i % 4 == 3 else ITEMS, "marker": str(tmp_path / f"m{i}")}
            )
            for i in range(EXECUTIONS)
        ]

        await mid_run(pods, terminals)

        try:
            await terminals.reach(EXECUTIONS, timeout=90)
        except TimeoutError:
            unfinished = [e for e in ids if e not in terminals.seen]
            every_pod = [p for group in pods.values() for p in group]
            report = await stuck_report(client, unfinished, logs=logs, pods=every_pod)
            report += f"\nmax deliveries: {len(terminals.advisories)} {terminals.advisories[:3]}"
            report += f"\ndead letters: {[(d.type, d.data) for d in (await client.dead_letters())[:3]]}"
            raise AssertionError(report) from None
        for i, eid in enumerate(ids):
            state, failed = expected(i)
            status = await client.wait(eid, timeout=10)
            assert status.state == state, (i, eid, status)
            items = await client.events(eid)
            terminal = [x for x in items if x.cls == "lc" and x.type in ("playbook.completed", "playbook.failed")]
            assert len(terminal) == 1, (eid, terminal)
            verdicts = [x for x in items if x.type in ("iterator.completed", "iterator.failed")]
            assert len(verdicts) == 1, (eid, verdicts)
            v = verdicts[0].data
            if state == "COMPLETED":
                assert (v["total"], v["succeeded"], v["failed"]) == (ITEMS, ITEMS - failed, failed), (eid, v)
                results = terminal[0].data["result"]["flaky"]  # `{{ fan }}`, through the retried step
                assert results == [None if x == ITEMS - 1 else x * 10 for x in range(ITEMS)], (eid, results)
            else:
                assert verdicts[0].type == "iterator.failed", (eid, v)
            assert_decided_once(eid, items)
        assert not await client.dead_letters(), "nothing may end in a dead letter"
    finally:
        await asyncio.gather(*(p.stop() for group in pods.values() for p in group))
        await nc.close()


async def kill_pods(
    pods: dict[str, list[PodProcess]], terminals: Terminals, at: tuple[float, float, float] = (0.25, 0.5, 0.75)
) -> None:
    """Mid-run, once these fractions of the executions are done: an engine pod, then a
    tool pod, then a counter pod."""
    for role, fraction in zip(("engine", "tools", "counter"), at, strict=True):
        await terminals.reach(int(EXECUTIONS * fraction), timeout=120)
        await pods[role][0].kill()
        assert len(terminals.seen) < EXECUTIONS, f"the {role} pod was killed after the run had ended"


async def test_pods_killed_mid_run_change_no_outcome(tmp_path: Path) -> None:
    server = await NatsServer.start()
    try:
        layout = Layout(partitions=6, ack_wait=2.0, lease_ttl=2.0, duplicate_window=1.0)
        await run_chaos(server.url, layout, tmp_path, kill_pods)
    finally:
        await server.discard()


async def test_pods_and_a_nats_node_killed_mid_run_change_no_outcome(tmp_path: Path) -> None:
    """The same on a 3-node cluster (streams and buckets R3), and then the node leading
    the execution logs is killed and, after a real outage, restarted."""
    cluster = await NatsCluster.start(3)
    try:
        layout = Layout(partitions=6, replicas=3, ack_wait=2.0, lease_ttl=3.0, duplicate_window=1.0)

        async def mid_run(pods: dict[str, list[PodProcess]], terminals: Terminals) -> None:
            await kill_pods(pods, terminals, at=(0.1, 0.2, 0.3))
            probe = await connect(cluster.url, name="probe")
            try:
                victim = await leader_of(probe, EXEC_STREAM)
            finally:
                await probe.close()
            cluster.kill(victim)
            assert len(terminals.seen) < EXECUTIONS, "the node was killed after the run had ended"
            await asyncio.sleep(3)  # the outage itself: nothing to await
            await cluster.restart(victim)

        await run_chaos(cluster.url, layout, tmp_path, mid_run)
    finally:
        await cluster.discard()
