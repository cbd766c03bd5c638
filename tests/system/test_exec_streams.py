"""Executions' logs spread over several streams (`Layout.exec_streams`, ACTORS_EXEC_STREAMS):
partition p's log in EXEC_<p mod S>. Executions of every partition complete, each log in
its stream and no other; tools, the projector, `list`, `status`, `events` and a replay
after an engine restart work from them; a pod whose count disagrees with the streams
there is refused. With one stream (every other test) nothing changes: stream EXEC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.config.settings import Settings, SettingsInvalid
from actors.natsio.readall import count
from actors.pod.roles import connect
from streams.layout import (
    EXEC_STREAM,
    PROJECTOR_CONSUMER,
    ExecStreamsMismatch,
    Layout,
    consumer_configs,
    engine_consumer,
    ensure,
    stream_configs,
    tool_log_consumer,
)
from streams.server import NatsServer
from tests.conftest import make_layout, of_type, running_system

pytestmark = [pytest.mark.timeout(90)]

SPREAD = {"partitions": 8, "exec_streams": 4}

TWO_STEPS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: spread}
workflow:
  - step: start
    tool: {kind: python, code: "def main(x): return {'v': x + 1}"}
    args: {x: "{{ workload.x }}"}
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: %s}
    next: end
  - step: end
    args: {v: "{{ start.v }}"}
"""


def ids_over_every_partition(layout: Layout) -> list[str]:
    """One execution id per partition."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < layout.partitions:
        eid = f"spread-{i}"
        found.setdefault(layout.partition_of(eid), eid)
        i += 1
    return [found[p] for p in sorted(found)]


def test_a_layout_names_each_partitions_stream() -> None:
    one = Layout(partitions=8)
    assert {one.exec_stream(p) for p in range(8)} == {EXEC_STREAM}
    assert one.exec_stream_names == (EXEC_STREAM,) and one.exec_stream_subjects(EXEC_STREAM) == ["exec.>"]
    four = Layout(**SPREAD)
    assert [four.exec_stream(p) for p in range(8)] == ["EXEC_0", "EXEC_1", "EXEC_2", "EXEC_3"] * 2
    assert four.exec_stream_subjects("EXEC_1") == ["exec.1.>", "exec.5.>"]
    assert four.exec_stream_holding("exec.6.x.in.start") == "EXEC_2"
    exec_configs = [c for c in stream_configs(four) if (c.name or "").startswith(EXEC_STREAM)]
    assert [c.name for c in exec_configs] == ["EXEC_0", "EXEC_1", "EXEC_2", "EXEC_3"]
    consumers = consumer_configs(four, ("python",))
    assert EXEC_STREAM not in consumers
    for k in range(4):
        names = [c.durable_name for c in consumers[f"EXEC_{k}"]]
        assert names == [engine_consumer(k), engine_consumer(k + 4), PROJECTOR_CONSUMER, tool_log_consumer("python")]
    for bad in (0, 9):
        with pytest.raises(ValueError, match="exec_streams"):
            Layout(partitions=8, exec_streams=bad)
    settings = Settings.from_env({"ACTORS_PARTITIONS": "4", "ACTORS_EXEC_STREAMS": "5"})
    with pytest.raises(SettingsInvalid, match="ACTORS_EXEC_STREAMS=5"):
        settings.layout  # noqa: B018


@pytest.mark.asyncio
async def test_executions_of_every_partition_complete_each_log_in_its_stream_only(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_system(nats_server, tmp_path, layout=make_layout(**SPREAD)) as system:
        layout = system.layout
        path = tmp_path / "spread.yaml"
        path.write_text(TWO_STEPS % "0.01")
        entry = await system.client.register(path)
        eids = ids_over_every_partition(layout)
        for i, eid in enumerate(eids):
            await system.client.start(entry.path, version=entry.version, payload={"x": i}, execution_id=eid)
        statuses = await asyncio.gather(*(system.client.wait(eid, timeout=30) for eid in eids))
        assert [s.state for s in statuses] == ["COMPLETED"] * len(eids)
        for i, eid in enumerate(eids):
            log = layout.execution(eid).log
            held = {name: await count(system.nc, name, log) for name in layout.exec_stream_names}
            own = layout.exec_stream_of(eid)
            assert held[own] > 0 and not any(n for name, n in held.items() if name != own), (eid, held)
            events = await system.events(eid)
            assert [e.step for e in of_type(events, "step.exit")] == ["start", "nap", "end"]
            assert of_type(events, "playbook.completed")[0].data["result"] == {"v": i + 1}
            status = await system.client.status(eid)
            assert status is not None and status.state == "COMPLETED" and status.playbook == "spread"
        listed = {s.execution_id for s in await system.client.list(state="COMPLETED")}
        assert set(eids) <= listed
        # every stream of logs got its partitions' executions, and EXEC does not exist
        for name in layout.exec_stream_names:
            assert (await system.nc.jsm().stream_info(name)).state.messages > 0
        assert EXEC_STREAM not in [s.config.name for s in await system.nc.jsm().streams_info()]


@pytest.mark.asyncio
async def test_an_engine_restart_replays_from_the_executions_stream(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_system(nats_server, tmp_path, layout=make_layout(**SPREAD)) as system:
        eids = ids_over_every_partition(system.layout)[4:8]  # partitions 4..7: EXEC_0 .. EXEC_3
        path = tmp_path / "spread.yaml"
        path.write_text(TWO_STEPS % "1.0")
        entry = await system.client.register(path)
        for i, eid in enumerate(eids):
            await system.client.start(entry.path, version=entry.version, payload={"x": i}, execution_id=eid)
        for eid in eids:
            async for item in system.client.follow(eid, until_terminal=False):
                if item.type == "command.issued" and item.step == "nap":
                    break
        await system.restart_roles(("engine",))  # the naps' results reach a new engine, which replays
        for i, eid in enumerate(eids):
            assert (await system.client.wait(eid, timeout=30)).state == "COMPLETED"
            events = await system.events(eid)
            assert len(of_type(events, "playbook.completed")) == 1
            assert of_type(events, "playbook.completed")[0].data["result"] == {"v": i + 1}
            assert len(of_type(events, "step.enter", "nap")) == 1


@pytest.mark.asyncio
async def test_a_pod_whose_count_disagrees_with_the_streams_there_is_refused(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url, name="test")
    try:
        js = nc.jetstream()
        await ensure(js, Layout(partitions=8))
        with pytest.raises(ExecStreamsMismatch, match=r"stream EXEC exists \(empty\)"):
            await ensure(js, Layout(**SPREAD))
        await js.publish("exec.3.x.in.start", b"{}")
        with pytest.raises(ExecStreamsMismatch, match="ACTORS_EXEC_STREAMS=4 but stream EXEC holds 1 messages"):
            await ensure(js, Layout(**SPREAD))
        with pytest.raises(ExecStreamsMismatch):  # a pod that only looks streams up, finding some missing
            await ensure(js, Layout(**SPREAD), update=False)
        await ensure(js, Layout(partitions=8))  # the deployment's own count still starts
        await js.delete_stream(EXEC_STREAM)
        await ensure(js, Layout(**SPREAD))
        with pytest.raises(ExecStreamsMismatch, match="ACTORS_EXEC_STREAMS=1 but stream EXEC_0 exists"):
            await ensure(js, Layout(partitions=8))
        with pytest.raises(ExecStreamsMismatch, match="ACTORS_EXEC_STREAMS=2 with 8 partitions but stream EXEC_0"):
            await ensure(js, Layout(partitions=8, exec_streams=2))
        await ensure(js, Layout(**SPREAD))
    finally:
        await nc.close()
