"""Triggers (actors/triggers/, actors/client/triggers.py): every message on a subject
starts one execution, under an id derived from it. A stream trigger misses nothing
while its pods are down, and neither two pods nor a redelivery (within the duplicate
window or past it) starts anything twice; a payload that cannot be made is
dead-lettered naming the trigger; paused, nothing starts and the stream keeps the
messages; a core trigger dedupes on Nats-Msg-Id; the CLI refuses bad input in one line."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from nats.js import api

from actors.client import Client
from actors.natsio import private
from actors.pod import permissions
from actors.pod.roles import start_roles
from actors.runtime.render_process import RenderBounds
from actors.triggers import actor as trigger_actor
from actors.triggers.actor import IN_FLIGHT, RENDER_TRIES, TriggerActor, consumer_config
from actors.ui.server import make_app
from actors.wire.events import ExecState
from actors.wire.messages import DeadLetter
from actors.wire.triggers import consumer_name, core_execution_id, deliver_subject, stream_execution_id
from streams.layout import DLQ_STREAM, EXEC_STREAM, HOOKS_BUCKET, START_STREAM, STARTER_CONSUMER, TRIGGERS_BUCKET
from streams.server import NatsServer
from tests.conftest import System, wait_for
from tests.support.cli import EXIT_INVALID, cli
from tests.support.natsio import stored_starts
from tests.support.secured import Pods, Secured
from tests.support.ui import ok, post

pytestmark = [pytest.mark.timeout(90)]

ECHO = """apiVersion: actors/v1
kind: Playbook
metadata: {name: echo, path: lib/echo}
workflow:
  - step: work
    tool: {kind: noop}
    args: {got: "{{ workload }}"}
"""


async def register(system: System) -> str:
    path = system.tmp / "echo.yaml"
    path.write_text(ECHO)
    return (await system.client.register(path)).path


async def start_records(system: System, prefix: str) -> Counter[str]:
    """How many starts (a start record, or semantics 6 the start stored with its first
    decision) each execution whose id starts with `prefix` has."""
    return await stored_starts(system.nc, prefix)


async def all_completed(system: System, eids: list[str]) -> bool:
    for eid in eids:
        st = await system.client.status(eid)
        if st is None or st.state != ExecState.COMPLETED:
            return False
    return True


async def stop_triggers(system: System) -> None:
    for a in [a for a in system.runtime.actors if isinstance(a, TriggerActor)]:
        await a.stop()
        system.runtime.actors.remove(a)


def trigger_pods(system: System) -> list[TriggerActor]:
    return [a for a in system.runtime.actors if isinstance(a, TriggerActor)]


async def reading(system: System, name: str, *, yes: bool = True) -> None:
    """Every trigger pod reads `name` (or, `yes` False, none does)."""

    async def done() -> bool:
        return all((name in a.triggers()) == yes for a in trigger_pods(system))

    await wait_for(done, timeout=10)


async def stats(system: System, name: str) -> Any:
    (view,) = [v for v in await system.client.triggers() if v.spec.name == name]
    return view


@pytest.mark.asyncio
@pytest.mark.layout(duplicate_window=1.0)
async def test_stream_trigger_misses_nothing_starts_nothing_twice_pauses_and_dead_letters(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    playbook = await register(system)
    js = system.nc.jetstream()
    await js.add_stream(api.StreamConfig(name="ORDERS", subjects=["orders.>"]))
    spec = await system.client.trigger_add(
        "t1",
        subject="orders.created",
        stream="ORDERS",
        playbook=playbook,
        payload={"id": "{{ message.data.id }}", "seq": "{{ message.seq }}", "subject": "{{ message.subject }}"},
    )
    assert spec.stream == "ORDERS"
    await reading(system, "t1")

    # every trigger pod down while 50 messages (and one the template cannot use) arrive
    await stop_triggers(system)

    # once the server knows nobody listens: before, it may still push a message to the
    # deliver subject, where nobody takes it until the ack wait has passed (seen in CI)
    async def unbound() -> bool:
        return not (await js.consumer_info("ORDERS", consumer_name("t1"))).push_bound

    await wait_for(unbound, timeout=10)
    seqs = []
    for i in range(50):
        ack = await js.publish("orders.created", json.dumps({"id": f"o{i}"}).encode())
        seqs.append(ack.seq)
    bad = await js.publish("orders.created", b'{"no_id": true}')
    await js.publish("orders.other", b'{"id": "not this subject"}')
    info = await js.consumer_info("ORDERS", consumer_name("t1"))
    assert info.num_pending == 51 and info.num_ack_pending == 0  # kept by the stream for the pods
    # a backlog waits in the stream, not in a pod's queue past the ack wait (delivered again)
    assert info.config.max_ack_pending is not None and info.config.max_ack_pending <= 2 * IN_FLIGHT

    # two trigger pods back: each message started exactly one execution, its id from its sequence
    for _ in range(2):
        system.runtime.actors.extend((await start_roles(system.nc, layout=system.layout, roles=("trigger",))).actors)
    expected = [stream_execution_id("t1", s, spec.add_id) for s in seqs]
    await wait_for(lambda: all_completed(system, expected), timeout=30)
    records = await start_records(system, "trg-t1-")
    assert records == Counter(dict.fromkeys(expected, 1))
    assert (await js.consumer_info("ORDERS", consumer_name("t1"))).delivered.consumer_seq == 51  # none twice
    result = await system.client.result(expected[7])
    assert result == {"work": {"got": {"id": "o7", "seq": seqs[7], "subject": "orders.created"}}}

    # the message the template could not use: dead-lettered, naming the trigger; the trigger went on
    sub = await js.subscribe("dlq.trigger.trg-t1", stream=DLQ_STREAM, ordered_consumer=True)
    letter = msgspec.json.decode((await sub.next_msg(timeout=5)).data, type=DeadLetter)
    await sub.unsubscribe()
    assert letter.source == "trigger" and "trigger t1" in letter.reason and "id" in letter.reason
    assert letter.execution_id == stream_execution_id("t1", bad.seq, spec.add_id)
    view = await wait_for(lambda: _counted(system, "t1", started=50, errors=1), timeout=10)
    assert view.waiting == 0 and view.stats.last_execution_id in expected

    # redelivered past the duplicate window: the consumer replayed from the first message
    await asyncio.sleep(1.2)  # the START stream's duplicate window (1 s here) is time: nothing to await
    await js.delete_consumer("ORDERS", consumer_name("t1"))
    await js.add_consumer(
        "ORDERS",
        api.ConsumerConfig(
            durable_name=consumer_name("t1"),
            deliver_subject=deliver_subject("t1"),
            deliver_group=consumer_name("t1"),
            filter_subject="orders.created",
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=system.layout.ack_wait,
            deliver_policy=api.DeliverPolicy.ALL,
            description=consumer_config(spec, system.layout).description,  # this trigger's, not a stranger's
        ),
    )

    async def replayed() -> bool:
        c = await js.consumer_info("ORDERS", consumer_name("t1"))
        return c.delivered.stream_seq >= bad.seq and not c.num_pending and not c.num_ack_pending

    await wait_for(replayed, timeout=20)
    await system.engine_idle()
    assert await start_records(system, "trg-t1-") == Counter(dict.fromkeys(expected, 1))
    for eid in expected[:3]:
        types = [i.type for i in await system.events(eid)]
        assert types.count("execution.start") == 1 and types.count("playbook.initialized") == 1, types

    # paused: nothing starts, the stream keeps the messages; resumed: they start
    assert await system.client.trigger_pause("t1") is True
    assert await system.client.trigger_pause("t1") is False
    await reading(system, "t1", yes=False)
    later = [(await js.publish("orders.created", json.dumps({"id": f"p{i}"}).encode())).seq for i in range(5)]
    info = await js.consumer_info("ORDERS", consumer_name("t1"))
    assert info.num_pending == 5 and info.num_ack_pending == 0
    assert (await stats(system, "t1")).waiting == 5
    assert await system.client.trigger_resume("t1") is True
    resumed = [stream_execution_id("t1", s, spec.add_id) for s in later]
    await wait_for(lambda: all_completed(system, resumed), timeout=20)

    # deleted: a trigger pod removes its consumer, then the spec; the executions stay
    assert await system.client.trigger_delete("t1") is True
    assert [v.spec.name for v in await system.client.triggers()] == []
    await reading(system, "t1", yes=False)
    assert "trigger-t1" not in [c.name for c in await js.consumers_info("ORDERS")]
    assert await system.client.status(expected[0]) is not None

    # added again under the same name on another stream: its first messages start (their ids
    # name this add, not the old trigger's executions of the same sequences)
    await js.add_stream(api.StreamConfig(name="ORDERS2", subjects=["orders2.>"]))
    again = await system.client.trigger_add("t1", subject="orders2.new", stream="ORDERS2", playbook=playbook)
    assert again.add_id != spec.add_id
    await reading(system, "t1")
    firsts = [(await js.publish("orders2.new", json.dumps({"n": i}).encode())).seq for i in range(2)]
    assert firsts[0] in seqs  # the sequence an execution of the first t1 was named by
    for i, s in enumerate(firsts):
        eid = stream_execution_id("t1", s, again.add_id)
        assert (await system.client.wait(eid, timeout=20)).state == ExecState.COMPLETED
        assert await system.client.result(eid) == {"work": {"got": {"n": i}}}

    # a render killed by the pod's bounds (its deadline: load may be why) is handed back with a
    # delay and tried again, RENDER_TRIES deliveries, before its dead letter
    monkeypatch.setattr(trigger_actor, "RENDER_RETRY_DELAY", 0.05)
    await stop_triggers(system)
    slow = TriggerActor(system.nc, layout=system.layout, render_bounds=RenderBounds(seconds=0.2, wall_factor=3.0))
    await slow.start()
    system.runtime.actors.append(slow)
    spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    await system.client.trigger_add("t6", subject="orders2.slow", stream="ORDERS2", playbook=playbook, payload=spin)
    await reading(system, "t6")
    await js.publish("orders2.slow", b"{}")
    view = await wait_for(lambda: _counted(system, "t6", errors=1), timeout=30)
    assert "template_seconds" in (view.stats.last_error or ""), view.stats.last_error
    assert (await js.consumer_info("ORDERS2", consumer_name("t6"))).delivered.consumer_seq == RENDER_TRIES


async def _counted(system: System, name: str, **want: int) -> Any:
    view = await stats(system, name)
    return view if all(getattr(view.stats, k) == v for k, v in want.items()) else None


@pytest.mark.asyncio
async def test_core_trigger_dedupes_on_msg_id_and_the_cli_refuses_bad_input(system: System) -> None:
    playbook = await register(system)
    js = system.nc.jetstream()
    await js.add_stream(api.StreamConfig(name="EVENTS", subjects=["events.*"]))
    env = {"NATS_URL": system.server.url}

    code, out, err, _ = await cli("trigger", "add", "t2", "--subject", "pings.x", "--playbook", playbook, env=env)
    assert code == 0, err
    assert "t2" in out and "at most once" in out
    await reading(system, "t2")
    # the message's body is the payload; the same Nats-Msg-Id twice is one execution
    for _ in range(2):
        await system.nc.publish("pings.x", b'{"n": 1}', headers={"Nats-Msg-Id": "ping-1"})
    await system.nc.publish("pings.x", b'{"n": 2}')
    await system.nc.flush()
    once = core_execution_id("t2", "ping-1", "", (await system.client.triggers())[0].spec.add_id)
    await wait_for(lambda: _counted(system, "t2", started=2, duplicates=1), timeout=15)
    records = await start_records(system, "trg-t2-")
    assert len(records) == 2 and set(records.values()) == {1} and once in records
    await system.client.wait(once, timeout=15)
    assert await system.client.result(once) == {"work": {"got": {"n": 1}}}

    # a body that is not a JSON object, with no template: dead-lettered, counted
    await system.nc.publish("pings.x", b"plain text")
    view = await wait_for(lambda: _counted(system, "t2", errors=1), timeout=15)
    assert "not a JSON object" in (view.stats.last_error or "")

    # a template not cheap by construction renders in a bounded render process; a runaway one is
    # stopped by its limits there, dead-lettered, and the trigger goes on
    runaway = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    await system.client.trigger_add(
        "t5",
        subject="pings.z",
        playbook=playbook,
        payload={
            "n": "{{ message.data.n * 2 }}",
            "s": "{% for i in range(3) %}{{ i }}{% endfor %}",
            "big": '{% if "big" in message.data %}' + runaway + "{% endif %}",
        },
    )
    await reading(system, "t5")
    for i, body in enumerate((b'{"n": 1, "big": true}', b'{"n": 2}')):
        await system.nc.publish("pings.z", body, headers={"Nats-Msg-Id": f"z{i}"})
    (t5,) = [v.spec for v in await system.client.triggers() if v.spec.name == "t5"]
    done = core_execution_id("t5", "z1", "", t5.add_id)
    await system.client.wait(done, timeout=20)
    assert await system.client.result(done) == {"work": {"got": {"n": 4, "s": "012", "big": ""}}}
    view = await wait_for(lambda: _counted(system, "t5", started=1, errors=1), timeout=20)
    assert "template_output" in (view.stats.last_error or "") or "template_ops" in (view.stats.last_error or "")
    await system.client.trigger_delete("t5")

    code, out, err, _ = await cli("trigger", "list", env=env)
    assert code == 0, err
    assert "t2" in out and "pings.x" in out and "(core)" in out and "active" in out
    code, out, err, _ = await cli("trigger", "pause", "t2", env=env)
    assert code == 0 and "paused" in out, err
    code, out, _, _ = await cli("trigger", "list", "--json", env=env)
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["paused"] is True and row["started"] == 2 and row["errors"] == 1
    code, out, err, _ = await cli("trigger", "resume", "t2", env=env)
    assert code == 0 and "resumed" in out, err

    # the UI's page and its API: the list, pause and resume, bad input as a JSON error
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as ui:
        assert (await ui.get("/triggers")).status == 200
        (row,) = (await ok(await ui.get("/api/triggers")))["triggers"]
        assert row["name"] == "t2" and row["subject"] == "pings.x" and row["stream"] is None
        assert row["started"] == 2 and row["errors"] == 1 and row["paused"] is False and row["waiting"] is None
        assert (await ok(await post(ui, "/api/triggers/t2/pause"))) == {"name": "t2", "changed": True}
        assert (await ok(await post(ui, "/api/triggers/t2/pause")))["changed"] is False
        assert (await ok(await ui.get("/api/triggers")))["triggers"][0]["paused"] is True
        assert (await ok(await post(ui, "/api/triggers/t2/resume")))["changed"] is True
        resp = await post(ui, "/api/triggers/nope/delete")
        assert resp.status == 404 and (await resp.json()) == {"error": "no trigger nope"}
        resp = await post(ui, "/api/triggers/a.b/pause")
        assert resp.status == 400 and "invalid trigger name" in (await resp.json())["error"]

    bad: list[tuple[tuple[str, ...], str]] = [
        (("t3", "--subject", "pings.y", "--playbook", "lib/nope"), "lib/nope"),
        (("t3", "--subject", "orders.x", "--stream", "NOPE", "--playbook", playbook), "no stream 'NOPE'"),
        (("t3", "--subject", "orders.x", "--stream", "EVENTS", "--playbook", playbook), "does not hold"),
        (("t3", "--subject", "pings.*", "--playbook", playbook), "wildcards"),
        (("t3", "--subject", "events.a", "--playbook", playbook), "stored by stream EVENTS"),
        (("t3", "--subject", "a..b", "--stream", "EVENTS", "--playbook", playbook), "invalid subject"),
        (
            ("t3", "--subject", "pings.y", "--playbook", playbook, "--payload", '{"a": "{{ message.data | nope }}"}'),
            "invalid payload template",
        ),
        (
            ("t3", "--subject", "pings.y", "--playbook", playbook, "--payload", '{"a": "{{ workload.x }}"}'),
            "reads workload",
        ),
        (("t3", "--subject", "pings.y", "--playbook", playbook, "--payload", "[1, 2]"), "JSON object"),
        (("t.3", "--subject", "pings.y", "--playbook", playbook), "invalid trigger name"),
        (("t2", "--subject", "pings.y", "--playbook", playbook), "already exists"),
        # the system's own streams and subjects: a trigger on them feeds itself or steals inputs
        (("t3", "--subject", "start", "--stream", "START", "--playbook", playbook), "stream START is the system's"),
        (("t3", "--subject", "dlq.>", "--stream", "DLQ", "--playbook", playbook), "stream DLQ is the system's"),
        (("t3", "--subject", "exec.*.*.in.start", "--stream", "EXEC", "--playbook", playbook), "system's"),
        (("t3", "--subject", "$KV.triggers.x", "--stream", "KV_triggers", "--playbook", playbook), "system's"),
        (("t3", "--subject", "dlq.trigger.x", "--playbook", playbook), "overlaps the system's subjects"),
        (("t3", "--subject", "start.request", "--playbook", playbook), "overlaps the system's subjects"),
        (("t3", "--subject", "execution.signal", "--playbook", playbook), "overlaps the system's subjects"),
        (("t3", "--subject", "_INBOX.x", "--playbook", playbook), "NATS's own or a reply inbox"),
        (("t3", "--subject", "*.request", "--stream", "EVENTS", "--playbook", playbook), "overlaps"),
    ]
    refusals = await asyncio.gather(*(cli("trigger", "add", *args, env=env) for args, _ in bad))
    for (args, says), (code, out, err, _) in zip(bad, refusals, strict=True):
        assert code == EXIT_INVALID, (args, out, err)
        assert err.startswith("actors-cli: ") and says in err and len(err.strip().splitlines()) == 1, (args, err)
    code, _, err, _ = await cli("trigger", "pause", "nope", env=env)
    assert code == EXIT_INVALID and err.strip() == "actors-cli: no trigger nope"
    # a wildcard subject of a stream is fine; nothing refused above was left behind
    code, _, err, _ = await cli(
        "trigger", "add", "t4", "--subject", "events.*", "--stream", "EVENTS", "--playbook", playbook, env=env
    )
    assert code == 0, err
    assert sorted(v.spec.name for v in await system.client.triggers()) == ["t2", "t4"]
    await reading(system, "t4")  # its consumer is made by the trigger pods, not by `add`
    assert [c.name for c in await js.consumers_info("EVENTS")] == ["trigger-t4"]
    code, out, err, _ = await cli("trigger", "delete", "t4", env=env)
    assert code == 0 and "deleted" in out, err
    assert [c.name for c in await js.consumers_info("EVENTS")] == []

    # counts added while a pod's write of them is in flight are kept for its next write
    (pod, *_) = trigger_pods(system)
    base = (await stats(system, "t2")).stats.started
    real: Any = pod._kv
    assert real is not None

    class CountedMeanwhile:
        """KV `triggers` whose first write of counts sees one more start counted meanwhile."""

        def __init__(self) -> None:
            self.once = True

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        async def _meanwhile(self) -> None:
            if self.once:
                self.once = False
                pod._counts_of("t2").started += 1

        async def update(self, *args: Any, **kwargs: Any) -> Any:
            await self._meanwhile()
            return await real.update(*args, **kwargs)

        async def create(self, *args: Any, **kwargs: Any) -> Any:
            await self._meanwhile()
            return await real.create(*args, **kwargs)

    pod._counts_of("t2").started += 1
    pod._kv = CountedMeanwhile()  # type: ignore[assignment]
    try:
        await pod._flush()
    finally:
        pod._kv = real
    await pod._flush()
    assert (await stats(system, "t2")).stats.started == base + 2

    # a spec this version cannot read (a newer version's field): listed, with why; deleted; never a traceback
    kv = await js.key_value(TRIGGERS_BUCKET)
    await kv.put("future", b'{"name": "future", "subject": "x.y", "playbook": "p", "from_v9": true}')
    (future,) = [v for v in await system.client.triggers() if v.spec.name == "future"]
    assert future.unreadable is not None and "from_v9" in future.unreadable
    code, out, err, _ = await cli("trigger", "list", env=env)
    assert code == 0 and "future" in out and "unreadable" in out and "cannot be read" in out, (out, err)
    code, _, err, _ = await cli("trigger", "pause", "future", env=env)
    assert code == EXIT_INVALID and "cannot be read" in err and len(err.strip().splitlines()) == 1, err
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as ui:
        (row,) = [r for r in (await ok(await ui.get("/api/triggers")))["triggers"] if r["name"] == "future"]
        assert row["unreadable"] == future.unreadable and "cannot be read" in row["problem"]
    code, out, err, _ = await cli("trigger", "delete", "future", env=env)
    assert code == 0 and "deleted" in out, err
    assert [v.spec.name for v in await system.client.triggers()] == ["t2"]
    # the same for a hook: listed as unreadable, deleted (not "no hook future")
    hooks = await js.key_value(HOOKS_BUCKET)
    await hooks.put("future", b'{"name": "future", "from_v9": true}')
    code, out, err, _ = await cli("hook", "list", env=env)
    assert code == 0 and "future" in out and "cannot be read" in out, (out, err)
    code, out, err, _ = await cli("hook", "delete", "future", env=env)
    assert code == 0 and "deleted" in out, err


@pytest_asyncio.fixture
async def secured_admin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Secured]:
    """`secured` (deploy/nats/permissions.conf as committed) with one more user of the
    account, `admin`, allowed everything: it makes the users' own stream a trigger reads
    (no role of the system may) and publishes to it."""
    passwords = {u: "p" + secrets.token_hex(8) for u in permissions.USERS}
    for u in permissions.users(permissions.deployed_layout()):
        monkeypatch.setenv(u.password_variable, passwords[u.name])
    passwords["admin"] = "a" + secrets.token_hex(8)
    config = permissions.CONF_FILE.read_text()
    marker = "    users: [\n"
    assert marker in config
    config = config.replace(marker, marker + f'      {{user: admin, password: "{passwords["admin"]}"}}\n', 1)
    server = await NatsServer.start(config=config)
    try:
        yield Secured(server, passwords, permissions.deployed_layout())
    finally:
        await server.discard()


async def _refused_request(nc: Any, subject: str) -> None:
    """A JetStream API request the server must drop (a permissions violation): no answer."""
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.request(subject, b"{}", timeout=1.0)


@pytest.mark.asyncio
async def test_a_stream_trigger_runs_under_the_least_privilege_users(secured_admin: Secured, pods: Pods) -> None:
    """deploy/nats/permissions.conf: the cli user adds, pauses, resumes and deletes a
    stream trigger (its spec: it makes and deletes no consumer, so it cannot delete the
    system's `starter` either); a trigger pod on its own user makes the trigger's
    consumer on the users' stream, reads it, starts, acks, counts and deletes it, and
    may make no consumer on the system's streams (EXEC: every execution's log)."""
    secured = secured_admin
    runtimes = [await pods.start(secured, role) for role in ("engine", "tools", "projector", "trigger")]
    (pod,) = [a for a in runtimes[-1].actors if isinstance(a, TriggerActor)]
    admin = await nats.connect(secured.url("admin"))
    try:
        await admin.jetstream().add_stream(api.StreamConfig(name="ORDERS", subjects=["orders.>"]))
        path = secured.server.store / "echo.yaml"
        path.write_text(ECHO)
        async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
            playbook = (await client.register(path)).path
            spec = await client.trigger_add("p1", subject="orders.>", stream="ORDERS", playbook=playbook)

            async def reads() -> bool:
                return "p1" in pod.triggers()

            await wait_for(reads, timeout=10)
            seq = (await admin.jetstream().publish("orders.x", b'{"x": 1}')).seq
            status = await client.wait(stream_execution_id("p1", seq, spec.add_id), timeout=20)
            assert status.state == ExecState.COMPLETED

            async def counted() -> bool:
                (view,) = await client.triggers()
                return view.stats.started == 1 and view.waiting == 0

            await wait_for(counted, timeout=10)
            assert await client.trigger_pause("p1") and await client.trigger_resume("p1")
            assert await client.trigger_delete("p1") is True
            assert await client.triggers() == []
            assert [c.name for c in await admin.jsm().consumers_info("ORDERS")] == []

            # the cli user deletes no consumer: not the starter (the system would stop starting)
            await _refused_request(client.nc, f"$JS.API.CONSUMER.DELETE.{START_STREAM}.{STARTER_CONSUMER}")
            # the trigger user makes none on the system's streams (one on EXEC reads every log)
            trigger_nc = pods.running[-1][0]
            await _refused_request(trigger_nc, f"$JS.API.CONSUMER.DURABLE.CREATE.{EXEC_STREAM}.trigger-x")
            await private.flush(trigger_nc)
        assert (await admin.jsm().consumer_info(START_STREAM, STARTER_CONSUMER)).name == STARTER_CONSUMER
    finally:
        await admin.close()
    violations = secured.violations()
    assert len(violations) == 2, violations
    assert f'user:cli" - Publish Violation - Subject "$JS.API.CONSUMER.DELETE.{START_STREAM}.' in violations[0]
    assert (
        f'user:trigger" - Publish Violation - Subject "$JS.API.CONSUMER.DURABLE.CREATE.{EXEC_STREAM}' in violations[1]
    )
