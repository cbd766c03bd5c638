"""Wait steps on a running system (#29): a step waits for a signal and ends with its
data; a signal sent before the step waits is kept for it; a timeout is routed by
`on_failure`; a timer to a date rendered from the workload completes; the status says
what an execution waits for while it waits, and not after; and kill -9 of the engine
pod while 100 executions wait loses none of them: all end once signalled.

Signals go through `Client.signal` (what the CLI, the gateway and the UI use too)."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.store.records import status_record
from actors.wire.messages import ExecutionStatus
from streams.layout import ensure
from streams.server import NatsServer
from streams.subjects import status_subject
from tests.conftest import System, make_layout, of_type, wait_for
from tests.support.pods import PodProcess

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(90)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"

ORDER = (
    HEAD % "waits_order"
    + """  - step: prepare
    tool: {kind: sleep, seconds: "{{ workload.nap }}"}
    next: [{then: [confirm]}]
  - step: confirm
    tool: {kind: wait, signal: confirmed, key: "{{ workload.order }}"}
    timeout: 120
    next: [{then: [ship]}]
  - step: ship
    args: {shipped: "{{ confirm.by_hand }}"}
"""
)

TIMERS = (
    HEAD % "waits_timers"
    + """  - step: begin
    next: [{then: [impatient, alarm]}]
  - step: impatient
    tool: {kind: wait, signal: never}
    timeout: 1
    on_failure: [fallback]
  - step: fallback
    args: {why: "{{ failure.error.type }}"}
  - step: alarm
    tool: {kind: wait, until: "{{ workload.at }}"}
"""
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sys_(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """Every role a wait goes through, on one server shared by the module's first tests."""
    server = await NatsServer.start()
    layout = make_layout()
    nc = await connect(server.url, name="test")
    runtime = await start_roles(nc, layout=layout, roles=("engine", "tools", "projector"))
    try:
        yield System(server, nc, Client(nc, layout=layout), runtime, layout, tmp_path_factory.mktemp("waits"))
    finally:
        await runtime.stop(drain_timeout=0.2)
        await nc.close()
        await server.discard()


async def until_waiting(client: Client, eid: str, timeout: float = 20) -> ExecutionStatus:
    """The execution's status once it says it waits: the statuses the projector
    announces, watched (not polled)."""
    seen: asyncio.Queue[ExecutionStatus] = asyncio.Queue()

    async def stored(msg: Any) -> None:
        if msg.data:
            seen.put_nowait(status_record(msg.data, key=eid))

    sub = await client.nc.subscribe(status_subject(eid), cb=stored)
    try:
        now = await client.status(eid)
        if now is not None:
            seen.put_nowait(now)
        async with asyncio.timeout(timeout):
            while True:
                st = await seen.get()
                if st.waiting:
                    return st
                assert st.state in ("PENDING", "RUNNING"), f"{eid} ended {st.state} ({st.error}) without waiting"
    finally:
        await sub.unsubscribe()


async def test_a_wait_ends_with_the_signal_and_one_sent_before_it_waits_is_kept(sys_: System) -> None:
    c = sys_.client
    waits = await sys_.start_yaml(ORDER, payload={"order": "o-1", "nap": 0.01})
    status = await until_waiting(c, waits)
    (w,) = status.waiting or []
    assert (w.step, w.signal, w.key, w.approval, w.loop) == ("confirm", "confirmed", "o-1", False, False)
    assert w.deadline is not None and w.deadline == pytest.approx(w.since + 120)
    # a signal of another key is kept, not taken
    assert (await c.signal(waits, "confirmed", {"by_hand": "no"}, key="o-2", signal_id="other")).accepted
    assert (await c.signal(waits, "confirmed", {"by_hand": "yes"}, key="o-1", by="ann")).accepted
    end = await c.wait(waits, timeout=20)
    assert end.state == "COMPLETED" and not end.waiting
    assert await c.result(waits) == {"ship": {"shipped": "yes"}}
    items = await c.events(waits)
    (kept,) = of_type(items, "signal.kept")
    assert kept.data["signal_id"] == "other"
    (got,) = of_type(items, "signal.received", "confirm")
    assert got.data["by"] == "ann" and "kept" not in got.data

    # sent while the first step still sleeps: kept, and taken when the wait begins
    early = await sys_.start_yaml(ORDER, payload={"order": "o-3", "nap": 1.0}, execution_id="waits-early")
    assert (await c.signal(early, "confirmed", {"by_hand": "early"}, key="o-3")).accepted
    assert (await c.wait(early, timeout=20)).state == "COMPLETED"
    assert await c.result(early) == {"ship": {"shipped": "early"}}
    items = await c.events(early)
    assert [i.type for i in items if i.type.startswith("signal.")] == ["signal.sent", "signal.kept", "signal.received"]
    assert of_type(items, "signal.received")[0].data["kept"] is True
    assert not of_type(items, "step.waiting")  # it never waited


async def test_a_timeout_is_routed_by_on_failure_and_a_timer_to_a_date_completes(sys_: System) -> None:
    c = sys_.client
    at = time.time() + 2
    iso = datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat()
    eid = await sys_.start_yaml(TIMERS, payload={"at": iso})
    status = await until_waiting(c, eid)
    assert {w.step for w in status.waiting or []} == {"impatient", "alarm"}
    end = await c.wait(eid, timeout=30)
    assert end.state == "COMPLETED", end.error
    result = await c.result(eid)
    assert result["fallback"] == {"why": "WaitTimeout"}
    assert result["alarm"]["until"].startswith(iso[:19])
    items = await c.events(eid)
    (timed_out,) = of_type(items, "wait.ended", "impatient")
    (due,) = of_type(items, "wait.ended", "alarm")
    assert timed_out.data["reason"] == "timeout" and due.data["reason"] == "until"
    assert due.at >= at  # not before its date (the log's time of the timer's delivery)
    exit_ = of_type(items, "step.exit", "impatient")[0]
    assert exit_.data["error"]["type"] == "WaitTimeout" and exit_.data["failure_route"]["target"] == "fallback"


WAITER = (
    HEAD % "waits_many"
    + """  - step: hold
    tool: {kind: wait, signal: go}
"""
)
MANY = 100


async def test_kill_9_of_the_engine_while_100_executions_wait_loses_none(tmp_path: Path) -> None:
    server = await NatsServer.start()
    layout = make_layout(lease_ttl=2.0)
    nc = await connect(server.url, name="test")
    await ensure(nc.jetstream(), layout)
    logs = tmp_path / "logs"
    logs.mkdir()
    projector = await start_roles(nc, layout=layout, roles=("projector",))
    engine = await PodProcess.start("engine", url=server.url, layout=layout, logs=logs, name="engine0")
    fresh: PodProcess | None = None
    try:
        await engine.ready()
        client = Client(nc, layout=layout)
        pb = tmp_path / "many.yaml"
        pb.write_text(WAITER)
        entry = await client.register(pb)
        ids = [await client.start(entry.path, execution_id=f"many-{i}") for i in range(MANY)]

        async def all_waiting() -> bool:
            statuses = await asyncio.gather(*(client.status(e) for e in ids))
            return all(s is not None and s.waiting for s in statuses)

        await wait_for(all_waiting, timeout=60, interval=0.2)
        await engine.kill()
        # half signalled while no engine runs (kept in the logs), half once one runs again
        for e in ids[: MANY // 2]:
            assert (await client.signal(e, "go", {"id": e}, signal_id=f"sig-{e}")).accepted
        fresh = await PodProcess.start("engine", url=server.url, layout=layout, logs=logs, name="engine1")
        await fresh.ready()
        for e in ids[MANY // 2 :]:
            assert (await client.signal(e, "go", {"id": e}, signal_id=f"sig-{e}")).accepted
        ends = await asyncio.gather(*(client.wait(e, timeout=60) for e in ids))
        assert [s.state for s in ends] == ["COMPLETED"] * MANY
        assert not any(s.waiting for s in ends)
        for e in ids[:: MANY // 10]:  # a sample: each decided once, with its own signal's data
            assert await client.result(e) == {"hold": {"id": e}}
            items = await client.events(e)
            assert len(of_type(items, "step.waiting")) == 1 and len(of_type(items, "signal.received")) == 1
            assert len([i for i in items if i.type == "playbook.completed"]) == 1
    finally:
        for pod in (engine, fresh):
            if pod is not None:
                await pod.kill()
        await projector.stop(drain_timeout=0.2)
        await nc.close()
        await server.discard()
