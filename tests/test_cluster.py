"""A 3-node JetStream cluster on loopback: streams and buckets at R3, executions with
loops and retries run on it exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from actors.client import Client
from actors.runtime import connect, start_roles
from streams.layout import (
    CMD_STREAM,
    DLQ_STREAM,
    EXEC_STREAM,
    LOOP_STREAM,
    START_STREAM,
    STATUS_BUCKET,
    Layout,
)
from streams.server import NatsCluster
from tests.conftest import of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: clustered}
workflow:
  - step: fan
    tool: {kind: sleep, seconds: 0.02}
    loop: {collection: "{{ range(20) | list }}", element: i, concurrency: 5}
    next: flaky
  - step: flaky
    retry: {max_attempts: 3, backoff: fixed, initial_delay: 0.3}
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
    args: {f: "{{ workload.marker }}"}
"""


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[NatsCluster]:
    c = await NatsCluster.start(3)
    try:
        yield c
    finally:
        await c.stop()


async def test_streams_and_buckets_are_r3_and_executions_run_on_the_cluster(cluster: NatsCluster, tmp_path: Path) -> None:
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
            assert st.state == "COMPLETED", eid
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
