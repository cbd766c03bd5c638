"""A 3-node JetStream cluster on loopback: streams and buckets at R3, executions with
loops and retries run on it exactly once, also when a node dies mid-run."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.wire.messages import ResultBatch, loop_input_decoder
from streams import server
from streams.layout import (
    CMD_STREAM,
    DLQ_STREAM,
    EXEC_STREAM,
    LOOP_STREAM,
    START_STREAM,
    STATUS_BUCKET,
    Layout,
    ensure,
)
from streams.server import NatsCluster, free_port
from tests.conftest import of_type
from tests.support.cluster import leader_of
from tests.support.playbooks import THREE_STEPS
from tests.support.stuck import stuck_report

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


def looped(name: str, *, iterations: int, seconds: float, concurrency: int) -> str:
    """A loop of sleeps, then a step whose first attempt fails and whose retry returns
    how often it ran (2: it ran twice)."""
    return f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: {name}}}
workflow:
  - step: fan
    tool: {{kind: sleep, seconds: {seconds}}}
    loop: {{collection: "{{{{ range({iterations}) | list }}}}", element: i, concurrency: {concurrency}}}
    next: flaky
  - step: flaky
    retry: {{max_attempts: 3, backoff: fixed, initial_delay: 0.3}}
    tool:
      kind: python
      code: |
        import os
        def main(f):
            first = not os.path.exists(f)
            open(f, "a").write("x")
            if first:
                raise RuntimeError("first attempt fails")
            return len(open(f).read())
    args: {{f: "{{{{ workload.marker }}}}"}}
"""


PLAYBOOK = looped("clustered", iterations=20, seconds=0.02, concurrency=5)


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[NatsCluster]:
    c = await NatsCluster.start(3)
    try:
        yield c
    finally:
        await c.discard()


async def test_a_cluster_starts_when_a_port_it_picked_is_taken_before_the_bind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A free port can be taken between its pick and nats-server's bind (CI saw a route
    port taken by another test's connection): the cluster picks new ports and starts."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        monkeypatch.setattr(server, "free_port", lambda: next(picks, None) or free_port())
        cluster = await NatsCluster.start(3)
        try:
            assert taken not in cluster.client_ports + cluster.route_ports
            nc = await connect(cluster.url)
            try:
                await ensure(nc.jetstream(), Layout(replicas=3))  # JetStream answers at R3
            finally:
                await nc.close()
        finally:
            await cluster.discard()


async def test_free_ports_come_from_below_the_range_outgoing_connections_use() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])  # noqa: ASYNC240 - a tiny proc file
    if low - 1024 < server.MIN_PORT_CHOICE:
        pytest.skip(f"outgoing connections may use ports from {low} on: nothing below to pick from")
    ports = [free_port() for _ in range(20)]
    assert all(p < low for p in ports) and len(set(ports)) == len(ports)


async def test_streams_and_buckets_are_r3_and_executions_run_on_the_cluster(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    layout = Layout(partitions=4, replicas=3, ack_wait=3.0)
    nc = await connect(cluster.url, name="cluster-test")
    runtime = await start_roles(nc, layout=layout)
    try:
        jsm = nc.jsm()
        for stream in (EXEC_STREAM, CMD_STREAM, LOOP_STREAM, START_STREAM, DLQ_STREAM, f"KV_{STATUS_BUCKET}"):
            info = await jsm.stream_info(stream)
            assert info.config.num_replicas == 3, stream
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, stream  # a leader and two peers
        client = Client(nc, layout=layout)
        pb = tmp_path / "clustered.yaml"
        pb.write_text(PLAYBOOK)
        entry = await client.register(pb)
        ids = [await client.start(entry.path, payload={"marker": str(tmp_path / f"m{i}")}) for i in range(10)]
        for eid in ids:
            st = await client.wait(eid, timeout=60)
            assert st.state == "COMPLETED", (eid, st.error)
            items = await client.events(eid)
            terminal = [i for i in items if i.cls == "lc" and i.type in ("playbook.completed", "playbook.failed")]
            assert len(terminal) == 1
            verdict = [i for i in items if i.type == "iterator.completed"]
            assert len(verdict) == 1 and (verdict[0].data["succeeded"], verdict[0].data["failed"]) == (20, 0)
            assert terminal[0].data["result"] == {"flaky": 2}  # retried exactly once
            assert len(of_type(items, "retry.scheduled", "flaky")) == 1
    finally:
        await runtime.stop()
        await nc.close()


# --- losing a node mid-run ------------------------------------------------------------

LOOPED = looped("nodeloss", iterations=200, seconds=0.1, concurrency=20)
EXECUTIONS = 6
OUTAGE = 3.0  # seconds the node stays dead; the survivors elect new leaders in 4-9 s, so on both sides of the restart


async def results_seen(nc: NATS, n: int) -> asyncio.Event:
    """Set once `n` iteration results (of any loop) have reached the loop logs (a batch
    counts as its entries)."""
    reached, count = asyncio.Event(), 0

    async def seen(msg: Msg) -> None:
        nonlocal count
        inp = loop_input_decoder.decode(msg.data)
        count += len(inp.results) if isinstance(inp, ResultBatch) else 1
        if count >= n:
            reached.set()

    await nc.subscribe("loop.*.*.*.in.res.>", cb=seen)
    return reached


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["cmd-leader", "client-node"])
async def test_losing_a_node_mid_loop_loses_and_duplicates_nothing(
    cluster: NatsCluster, tmp_path: Path, victim: str
) -> None:
    """Kill one node while loops release commands, bring it back after a few seconds:
    every execution still ends as it would have, once, with exact loop counts.
    `cmd-leader`: the CMD stream's leader dies (the counter's command publishes meet a
    leader election), the client is on another node. `client-node`: the node the
    client is connected to dies (it reconnects elsewhere; PubAcks in flight are lost)."""
    layout = Layout(partitions=4, replicas=3, ack_wait=3.0)
    probe = await connect(cluster.url, name="probe")
    await ensure(probe.jetstream(), layout)
    cmd_leader = await leader_of(probe, CMD_STREAM)
    await probe.close()
    # cmd-leader: the client sits on a node that survives; client-node: anywhere
    url = cluster.urls[(cmd_leader + 1) % cluster.n] if victim == "cmd-leader" else cluster.url
    nc = await connect(url, name="nodeloss-test")
    runtime = await start_roles(nc, layout=layout)
    try:
        client = Client(nc, layout=layout)
        pb = tmp_path / "nodeloss.yaml"
        pb.write_text(LOOPED)
        entry = await client.register(pb)
        midway = await results_seen(nc, EXECUTIONS * 40)  # a fifth of every loop, on average
        ids = [await client.start(entry.path, payload={"marker": str(tmp_path / f"m{i}")}) for i in range(EXECUTIONS)]
        await asyncio.wait_for(midway.wait(), 60)
        assert nc.connected_url is not None
        dead = cmd_leader if victim == "cmd-leader" else cluster.client_ports.index(nc.connected_url.port)
        cluster.kill(dead)
        await asyncio.sleep(OUTAGE)  # the deliberate outage
        await cluster.restart(dead)
        try:
            statuses = await asyncio.gather(*(client.wait(eid, timeout=60) for eid in ids))
        except TimeoutError:
            ended = {eid for eid in ids if getattr(await client.status(eid), "state", None) in ("COMPLETED", "FAILED")}
            report = await stuck_report(client, [e for e in ids if e not in ended], in_process=True, runtime=runtime)
            raise AssertionError(report) from None
        assert [s.state for s in statuses] == ["COMPLETED"] * EXECUTIONS
        for eid in ids:
            items = await client.events(eid)
            terminal = [i for i in items if i.cls == "lc" and i.type in ("playbook.completed", "playbook.failed")]
            assert len(terminal) == 1, eid
            verdict = [i for i in items if i.type in ("iterator.completed", "iterator.failed")]
            assert len(verdict) == 1 and verdict[0].type == "iterator.completed", eid
            counts = verdict[0].data["total"], verdict[0].data["succeeded"], verdict[0].data["failed"]
            assert counts == (200, 200, 0), eid
            assert verdict[0].data["results"] == [{"slept": 0.1}] * 200, eid  # in collection order
            assert terminal[0].data["result"] == {"flaky": 2}  # its command ran twice: one failure, one retry
            assert len(of_type(items, "retry.scheduled", "flaky")) == 1
            assert not [i for i in items if i.cls == "dlq"], eid
    finally:
        await runtime.stop()
        await nc.close()


async def test_streams_are_declared_once_a_forming_cluster_can_place_them() -> None:
    """An engine pod that starts before every node has joined (two of three up: a
    quorum, but no three peers for an R3 stream) declares the streams once the third
    joins, instead of failing its start with "no suitable peers for placement"."""
    cluster = NatsCluster(3)
    try:
        await asyncio.gather(cluster.restart(0), cluster.restart(1))
        nc = await connect(cluster.urls[0], name="early-pod")
        try:
            declared = asyncio.create_task(ensure(nc.jetstream(), Layout(partitions=2, replicas=3)))
            await asyncio.sleep(0.5)  # a moment of being refused, then the third node
            assert not declared.done()
            await cluster.restart(2)
            await asyncio.wait_for(declared, 40)
            info = await nc.jsm().stream_info(EXEC_STREAM)
            assert info.config.num_replicas == 3
        finally:
            await nc.close()
    finally:
        await cluster.discard()


# --- semantics 5 on a cluster ---------------------------------------------------------


async def test_on_replicated_streams_results_are_stored_plain(cluster: NatsCluster, tmp_path: Path) -> None:
    """On a stream of three replicas nats-server checks
    `Nats-Expected-Last-Subject-Sequence` against committed messages only, and its
    guard for messages still being proposed looks up the exact subject, not the
    filter `exec.<p>.<id>.in.>`: an input in flight would not be seen. The engine does
    not serve asks there (no `answer.<p>` subscription): every result is stored plain,
    as under semantics 4, and the chain completes."""
    from actors.engine.actor import Engine
    from streams.subjects import is_answer_record
    from tests.support.natsio import execution_log

    layout = Layout(partitions=4, replicas=3, ack_wait=3.0)
    nc = await connect(cluster.url, name="cluster-fast-answers")
    runtime = await start_roles(nc, layout=layout)
    try:
        engine = next(a for a in runtime.actors if isinstance(a, Engine))
        client = Client(nc, layout=layout)
        pb = tmp_path / "chain.yaml"
        pb.write_text(THREE_STEPS)
        entry = await client.register(pb)
        eid = await client.start(entry.path)
        status = await client.wait(eid, timeout=60)
        assert status.state == "COMPLETED", status.error
        assert await client.result(eid) == {"c": 3}
        assert engine._asks == {}  # no partition's asks served
        log = await execution_log(nc, layout, eid)
        subjects = [s for s, _, _, _ in log]
        assert not [s for s in subjects if is_answer_record(s)], subjects
        assert len([s for s in subjects if ".in.result" in s]) == 3, subjects
    finally:
        await runtime.stop()
        await nc.close()
