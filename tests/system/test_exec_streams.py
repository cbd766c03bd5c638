"""Executions' logs spread over several streams (`Layout.exec_streams`, ACTORS_EXEC_STREAMS):
partition p's log in EXEC_<p mod S>. Executions of every partition complete, each log in
its stream and no other; tools, the projector, `list`, `status`, `events` and a replay
after an engine restart work from them; a pod whose count disagrees with the streams
there is refused. With one stream (every other test) nothing changes: stream EXEC."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from actors.config.settings import Settings, SettingsInvalid
from actors.natsio.readall import count
from actors.pod.permissions import users
from actors.pod.roles import connect
from actors.runtime.metrics import consumers_for
from streams.layout import (
    EXEC_STREAM,
    PROJECTOR_CONSUMER,
    SCHEDULE_FIRES_CONSUMER,
    SCHEDULE_STREAM,
    START_STREAM,
    STARTER_CONSUMER,
    ExecStreamsMismatch,
    Layout,
    _add_or_update_stream,
    check_exec_streams,
    consumer_configs,
    engine_consumer,
    ensure,
    stream_configs,
    tool_log_consumer,
)
from streams.server import NatsServer
from tests.conftest import make_layout, of_type, running_system

pytestmark = [pytest.mark.timeout(90)]

SPREAD: dict[str, Any] = {"partitions": 8, "exec_streams": 4}

TWO_STEPS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: spread}
workflow:
  - step: start
    tool: {kind: python, code: "def main(x): return {'v': x + 1}"}
    args: {x: "{{ workload.x }}"}
    next: each
  - step: each
    loop: {collection: "{{ [1, 2] }}", element: n}
    tool: {kind: python, code: "def main(n): return n * 10"}
    args: {n: "{{ n }}"}
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: %s}
    next: end
  - step: end
    args: {v: "{{ start.v }}", each: "{{ each }}"}
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
    # metrics report each stream's consumers; the permissions name every stream and not EXEC
    assert consumers_for(["engine"], partitions=[1, 5], layout=four) == [
        ("EXEC_1", engine_consumer(1)),
        ("EXEC_1", engine_consumer(5)),
        (START_STREAM, STARTER_CONSUMER),
        (SCHEDULE_STREAM, SCHEDULE_FIRES_CONSUMER),
    ]
    assert consumers_for(["projector"], partitions=[], layout=four) == [(f"EXEC_{k}", "projector") for k in range(4)]
    granted = {u.name: u for u in users(four, ("python",))}
    tools = " ".join(granted["tools"].publish)
    assert all(f"$JS.API.CONSUMER.MSG.NEXT.EXEC_{k}.tools-python-log" in tools for k in range(4))
    assert all(f"$JS.API.DIRECT.GET.EXEC_{k}" in tools for k in range(4)) and ".EXEC." not in tools
    assert "$JS.ACK.EXEC_2.engine-p6.>" in granted["engine"].publish
    assert "$JS.ACK.EXEC_3.projector.>" in granted["projector"].publish
    assert granted["projector"].subscribe.count("_deliver.projector") == 1
    assert "$JS.API.STREAM.CREATE.EXEC_3" in granted["engine"].publish
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
            assert [e.step for e in of_type(events, "step.exit")] == ["start", "each", "nap", "end"]
            assert of_type(events, "playbook.completed")[0].data["result"] == {"v": i + 1, "each": [10, 20]}
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
            assert of_type(events, "playbook.completed")[0].data["result"] == {"v": i + 1, "each": [10, 20]}
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


@pytest.mark.asyncio
async def test_a_playbook_runs_through_one_user_per_role_over_four_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The permissions of a deployment of four streams of logs (`server_config`) refuse
    nothing the roles do: a retry timer, a blob, loops of children and of python steps."""
    from actors.client import Client
    from actors.pod import permissions
    from tests.support.secured import Pods, Secured
    from tests.system.test_permissions import CHILD, PARENT, RESULT

    layout = Layout(partitions=16, exec_streams=4, ack_wait=2.0)
    passwords = {u: "p" + secrets.token_hex(8) for u in permissions.USERS}
    for u in permissions.users(layout):
        monkeypatch.setenv(u.password_variable, passwords[u.name])
    server = await NatsServer.start(config=permissions.server_config(layout))
    secured = Secured(server, passwords, layout)
    pods = Pods()
    try:
        for role in ("engine", "counter", "tools", "projector"):  # the engine first: it declares the streams
            await pods.start(secured, role)
        (tmp_path / "child.yaml").write_text(CHILD)
        (tmp_path / "parent.yaml").write_text(PARENT)
        async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=layout) as client:
            await client.register(tmp_path / "child.yaml")
            parent = await client.register(tmp_path / "parent.yaml")
            eid = await client.start(parent.path, payload={"marker": str(tmp_path / "marker")})
            status = await client.wait(eid, timeout=60)
            assert status.state == "COMPLETED", status
            assert await client.result(eid) == RESULT
            assert [e.type for e in await client.events(eid)].count("playbook.completed") == 1
        assert secured.violations() == []
        with pytest.raises(NotFoundError):
            await pods.running[0][0].jsm().stream_info(EXEC_STREAM)
    finally:
        await pods.stop()
        await server.discard()


@pytest.mark.asyncio
async def test_a_pod_of_another_count_exits_saying_so_in_one_line(nats_server: NatsServer) -> None:
    from tests.support.cli import cli, one_line

    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), Layout(partitions=8))
        await nc.jetstream().publish("exec.3.x.in.start", b"{}")
    finally:
        await nc.close()
    env = {"ACTORS_PARTITIONS": "8", "ACTORS_EXEC_STREAMS": "4"}
    ran = await cli("serve", "--role", "engine", url=nats_server.url, env=env, timeout=60)
    assert ran.code == 5, ran.err
    assert "ACTORS_EXEC_STREAMS=4 but stream EXEC holds 1 messages" in one_line(ran.err), ran.err


@pytest.mark.asyncio
async def test_a_pod_of_another_count_that_checked_first_does_not_rewrite_the_streams(
    nats_server: NatsServer,
) -> None:
    """Pods of S=2 and S=4 start together on an empty NATS: B checks (nothing there), A
    declares, B declares. B is refused, and EXEC_0 keeps A's subjects (rewritten, a
    message stored on a partition A put there would be under a subject it no longer lists)."""
    nc = await connect(nats_server.url, name="test")
    try:
        js = nc.jetstream()
        a, b = Layout(partitions=8, exec_streams=2), Layout(partitions=8, exec_streams=4)
        await check_exec_streams(js, b)
        await ensure(js, a)
        with pytest.raises(ExecStreamsMismatch):
            for cfg in stream_configs(b):  # the rest of B's declaration
                await _add_or_update_stream(js, cfg)
        assert (await js.stream_info("EXEC_0")).config.subjects == a.exec_stream_subjects("EXEC_0")
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_pods_of_two_counts_declaring_at_once_are_not_both_accepted(nats_server: NatsServer) -> None:
    ncs = [await connect(nats_server.url, name=f"pod-{i}") for i in range(2)]
    try:
        got = await asyncio.gather(
            ensure(ncs[0].jetstream(), Layout(partitions=8, exec_streams=2)),
            ensure(ncs[1].jetstream(), Layout(partitions=8, exec_streams=4)),
            return_exceptions=True,
        )
        assert any(isinstance(x, ExecStreamsMismatch) for x in got), got
    finally:
        for nc in ncs:
            await nc.close()
