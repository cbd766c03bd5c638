"""Least privilege (issue 12, item 6): one NATS user per role, allowed only the subjects
its role needs (actors/pod/permissions.py, rendered to deploy/nats/). A real nats-server
runs with exactly that account; every role runs on a connection of its own user."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.js.errors import NotFoundError

import streams.layout as streams_layout
from actors.client import Client
from actors.config.settings import Settings, SettingsInvalid
from actors.natsio.connopts import ConnectOptions
from actors.pod import permissions
from actors.pod.roles import ROLES, connect
from actors.tools.undeliverable import MaxDeliveriesWatcher
from actors.wire.events import ExecState, PlaybookCompletedData, PlaybookCompletedEvent
from actors.wire.messages import ExecutionStatus, encode
from streams.layout import EXEC_STREAM, INDEX_STREAM, STATUS_BUCKET, TOOL_KINDS, tool_log_consumer
from tests.conftest import wait_for
from tests.support.secured import Pods, Secured, refused

pytestmark = [pytest.mark.timeout(300)]

HEAD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: %s}
"""


CHILD = (
    HEAD % "child"
    + """
workflow:
  - step: inc
    tool: {kind: python, code: "def main(v): return v + 1"}
    args: {v: "{{ workload.v }}"}
"""
)
# a retry (a python step failing once: a durable retry timer), a value too large for a
# message (an object store blob, written by a tool, read by the engine, and again for the
# result), a loop of child playbooks (started by the counter), a loop of python
# iterations, one child playbook (started by the engine)
RESULT = {"flaky": "second attempt", "squares": [4, 9, 16], "child": {"inc": 30}, "big": "x" * 300_000}
PARENT = (
    HEAD % "parent"
    + """
workflow:
  - step: flaky
    tool:
      kind: python
      code: |
        import os
        def main(marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                raise ValueError("first attempt fails")
            return "second attempt"
    args: {marker: "{{ workload.marker }}"}
    retry:
      - when: "{{ error is not none }}"
        then: {max_attempts: 3, initial_delay: 0.1}
    next: big
  - step: big
    tool: {kind: python, code: "def main(): return 'x' * 300000"}
    next: children
  - step: children
    tool: {kind: playbook, path: child}
    args: {v: "{{ v }}"}
    loop: {collection: [1, 2, 3], element: v, concurrency: 2}
    next: squares
  - step: squares
    tool: {kind: python, code: "def main(v): return v * v"}
    args: {v: "{{ v }}"}
    loop: {collection: "{{ children | map(attribute='inc') | list }}", element: v}
    next: child
  - step: child
    tool: {kind: playbook, path: child}
    args: {v: "{{ squares | sum }}"}
    next: end
  - step: end
    args: {flaky: "{{ flaky }}", squares: "{{ squares }}", child: "{{ child }}", big: "{{ big }}"}
"""
)


@pytest.mark.asyncio
async def test_a_playbook_runs_through_one_user_per_role(secured: Secured, pods: Pods, tmp_path: Path) -> None:
    """Loops, a retry and child playbooks, each role on its own user, driven by the cli
    user: the server refuses nothing any role does."""
    for role in ("engine", "counter", "tools", "projector"):  # the engine first: it declares the streams
        await pods.start(secured, role)
    (tmp_path / "child.yaml").write_text(CHILD)
    (tmp_path / "parent.yaml").write_text(PARENT)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        await client.register(tmp_path / "child.yaml")
        parent = await client.register(tmp_path / "parent.yaml")
        eid = await client.start(parent.path, payload={"marker": str(tmp_path / "marker")})
        status = await client.wait(eid, timeout=60)
        assert status.state == "COMPLETED", status
        assert await client.result(eid) == RESULT
        assert len([e for e in await client.events(eid) if e.type == "retry.scheduled"]) == 1
    # the operator's commands, as the cli user
    commands = [
        ["status", eid, "--json"],
        ["events", eid],
        ["result", eid, "--json"],
        ["logs", eid],
        ["list", "--json"],
        ["playbooks"],
        ["deadletters"],
    ]
    done = await asyncio.gather(*(cli(*c, url=secured.url("cli")) for c in commands))
    for command, (code, _, err) in zip(commands, done, strict=True):
        assert code == 0, (command, err)
    assert json.loads(done[0][1])["state"] == "COMPLETED"
    # a retry from the last step: a new execution the starter links to this one
    code, out, err = await cli("retry", eid, "--from", "child", url=secured.url("cli"))
    assert code == 0, err
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        retried = await client.wait(out.strip(), timeout=60)
        assert retried.state == "COMPLETED", retried
    assert json.loads(done[2][1])["result"] == RESULT
    assert secured.violations() == []


@pytest.mark.asyncio
async def test_the_retention_user_archives_and_removes_and_the_cli_user_reads_the_archive(
    secured: Secured, pods: Pods, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retention pod retires one execution when its retention is over; `actors-cli
    archive`, as the retention user, another at once; the cli user reads both back."""
    for role in ("engine", "counter", "tools", "projector"):
        await pods.start(secured, role)
    (tmp_path / "child.yaml").write_text(CHILD)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        entry = await client.register(tmp_path / "child.yaml")
        first = await client.start(entry.path, payload={"v": 1})
        second = await client.start(entry.path, payload={"v": 2})
        for eid in (first, second):
            assert (await client.wait(eid, timeout=60)).state == "COMPLETED"

        async def both_ended() -> bool:  # the projector writes ENDED after the status
            return len(await client.list(state="COMPLETED")) == 2

        await wait_for(both_ended, timeout=20)
        # as the cli user: the server refuses the archive's write, and the command says so
        # within its try (not after asking again until --timeout: the test's is shorter),
        # naming the user to run it as; nothing archived, nothing removed
        code, out, err = await cli(
            "archive", "--older-than", "0s", "--to", "objects", "--limit", "1", "--timeout", "600",
            url=secured.url("cli"),
        )  # fmt: skip
        assert code == 5 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, out, err)
        assert "refused this user" in err and "as the retention user" in err, err
        assert len(await client.list(state="COMPLETED")) == 2
        code, out, err = await cli(
            "archive", "--older-than", "0s", "--to", "objects", "--limit", "1", "--json",
            url=secured.url("retention"), user="retention",
        )  # fmt: skip
        assert code == 0 and json.loads(out)["removed"] == 1, err
        monkeypatch.setenv("ACTORS_ARCHIVE", "objects")
        await pods.start(secured, "retention", dataclasses.replace(secured.layout, finished_retention=0.5))

        async def retired() -> bool:
            return not await secured_index(secured)

        await wait_for(retired, timeout=30, interval=0.1)
        for eid, v in ((first, 1), (second, 2)):
            assert await client.result(eid) == {"inc": v + 1}
            code, out, err = await cli("status", eid, "--json", url=secured.url("cli"))
            assert code == 0 and json.loads(out)["state"] == "COMPLETED", err
    violations = secured.violations()  # the cli user's archive, and nothing else
    assert violations and all('user:cli" - Publish Violation' in v for v in violations), violations


async def secured_index(secured: Secured) -> int:
    """Entries left in stream INDEX (read as the engine user, who may look streams up)."""
    nc = await connect(secured.url("engine"), name="look", options=secured.options("engine"))
    try:
        return (await nc.jsm().stream_info(INDEX_STREAM)).state.messages
    finally:
        await nc.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("other", ["_INBOX_cli.>", "_INBOX_engine.*", "_INBOX.>", ">"])
async def test_a_user_cannot_read_another_users_replies(secured: Secured, other: str) -> None:
    """A tool user's connection that subscribes to another user's inboxes (or the shared
    `_INBOX.>`), to read the cli's or the engine's replies (EXEC and KV reads, PubAcks):
    the server refuses the subscription, and it names the user."""
    errors: list[Exception] = []
    told = asyncio.Event()

    async def on_error(e: Exception) -> None:
        errors.append(e)
        told.set()

    nc = await nats.connect(
        secured.url("tools"), inbox_prefix=permissions.inbox_prefix("tools"), error_cb=on_error, allow_reconnect=False
    )
    try:
        await nc.subscribe(other)
        await asyncio.wait_for(told.wait(), timeout=10)  # the server's -ERR, handed to error_cb in a task
        assert any("permissions violation" in str(e).lower() for e in errors), errors
        # its own inboxes still work: a JetStream request through them is answered
        await nc.jetstream().account_info()
    finally:
        await nc.close()
    assert any(f'user:tools" - Subscription Violation - Subject "{other}"' in line for line in secured.violations())


SLEEPER = (
    HEAD % "sleeper"
    + """
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""
)


async def cli(*args: str, url: str, user: str = "cli", env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run actors-cli with NATS_URL `url` (the deployment's partitions) as `user`; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={
            **os.environ,
            "NATS_URL": url,
            "ACTORS_PARTITIONS": str(permissions.deployed_layout().partitions),
            "NATS_INBOX_PREFIX": permissions.inbox_prefix(user),
            **(env or {}),
        },
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def running(client: Client, eid: str) -> bool:
    status = await client.status(eid)
    return status is not None and status.state == ExecState.RUNNING


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "user,writes_lifecycle,writes_status",
    [
        ("tools", False, False),
        ("counter", False, False),
        ("cli", False, False),
        ("projector", False, True),
        ("engine", True, False),
    ],
)
async def test_only_the_engine_user_writes_lifecycle_events_and_only_the_projector_status(
    secured: Secured, pods: Pods, tmp_path: Path, user: str, writes_lifecycle: bool, writes_status: bool
) -> None:
    """A tool pod (or any other role but the engine) cannot end an execution by
    publishing its lifecycle event; no role but the projector can write its status."""
    for role in ("engine", "tools", "projector"):
        await pods.start(secured, role)
    (tmp_path / "sleeper.yaml").write_text(SLEEPER)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        entry = await client.register(tmp_path / "sleeper.yaml")
        eid = await client.start(entry.path)
        await wait_for(lambda: running(client, eid), timeout=30)  # the projector wrote RUNNING
        lifecycle = secured.layout.execution(eid).lifecycle("playbook.completed")
        forged = PlaybookCompletedEvent(
            execution_id=eid,
            at=0.0,
            cause=1,
            data=PlaybookCompletedData(
                playbook="sleeper",
                started_at=None,
                ended_at=0.0,
                result="forged",
                evaluated_by_end_step=False,
                total_steps=1,
                failed_steps_count=0,
                handled_failures=[],
                cancelled_steps=[],
            ),
        )
        if not writes_lifecycle:
            await refused(secured, user, lifecycle, encode(forged))
            with pytest.raises(NotFoundError):
                await client.nc.jsm().get_last_msg(EXEC_STREAM, lifecycle, direct=True)
        status = ExecutionStatus(execution_id=eid, state=ExecState.COMPLETED, terminal_event="playbook.completed")
        if not writes_status:
            await refused(secured, user, f"$KV.{STATUS_BUCKET}.{eid}", encode(status))
        assert await running(client, eid)
        await client.cancel(eid)
        assert (await client.wait(eid, timeout=30)).state == ExecState.CANCELLED


FORGED = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: never_registered}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 'ran'"}
"""


@pytest.mark.asyncio
async def test_the_tools_user_cannot_start_an_execution_through_an_ask(secured: Secured, pods: Pods) -> None:
    """`answer.<p>` is the tools user's: a step's result, asked to be stored with its
    decision. A start record asked there (a playbook source of its own, never
    registered, limits of its own: none of the starter's checks) is refused, nothing
    stored; starters ask on `answer.start.<p>`, which the tools user may not publish.
    (Review r6: the engine took a start record on `answer.<p>` and started it.)"""
    from actors.wire.messages import Limits, StartRecord
    from streams.subjects import answer_request_subject, start_ask_subject

    layout = secured.layout
    for role in ("engine", "tools", "projector"):
        await pods.start(secured, role)
    eid = "forged-by-tools"
    record = StartRecord(
        execution_id=eid,
        playbook_path="never_registered",
        playbook_source=FORGED,
        limits=Limits(max_activations=10**9),
        semantics=6,
    )
    partition = layout.partition_of(eid)
    nc = await nats.connect(secured.url("tools"), inbox_prefix=permissions.inbox_prefix("tools"))
    try:

        async def asked() -> bytes | None:
            try:
                msg = await nc.request(answer_request_subject(partition), encode(record), timeout=5)
            except nats.errors.NoRespondersError:
                return None  # the engine has not taken the partition yet
            return msg.data

        said = await wait_for(asked, timeout=30, interval=0.2)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await nc.request(start_ask_subject(partition), encode(record), timeout=1)
    finally:
        await nc.close()
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=layout) as client:
        started = await client.start_record(eid)
    assert said == b"refused: not a result" and started is None, (said, started)
    violation = f'user:tools" - Publish Violation - Subject "{start_ask_subject(partition)}"'
    assert any(violation in line for line in secured.violations()), secured.violations()


WAITER = (
    HEAD % "waiter"
    + """
workflow:
  - step: hold
    tool: {kind: wait, signal: go}
"""
)


@pytest.mark.asyncio
async def test_the_engine_user_prepares_a_rollback(secured: Secured, pods: Pods, tmp_path: Path) -> None:
    """`actors-cli prepare-rollback` writes an input of the engine's (a plain copy of a
    start stored with its first decision, on `exec.*.*.in.start`), which the cli user
    may not: run as the cli user it says so at once (the server's permissions
    violation), exit 5; run as the engine user, as docs/upgrades.md says, it needs
    nothing more."""
    for role in ("engine", "projector"):
        await pods.start(secured, role)
    (tmp_path / "waiter.yaml").write_text(WAITER)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        eid = await client.start((await client.register(tmp_path / "waiter.yaml")).path)

        async def waiting() -> bool:
            st = await client.status(eid)
            return st is not None and bool(st.waiting)

        await wait_for(waiting, timeout=30)
        # as the cli user: refused by the server, and told so at once (not the PubAck's
        # timeout and re-sends until the command's --timeout: the test's own timeout is
        # shorter), one line, naming the user to run it as
        code, out, err = await cli("prepare-rollback", "--json", "--timeout", "600", url=secured.url("cli"))
        start = secured.layout.execution(eid).start
        assert code == 5 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
        assert f"refused this user the publish to {start} " in err and "as the engine user" in err, err
        code, out, err = await cli("prepare-rollback", "--json", url=secured.url("engine"), user="engine")
        assert code == 0 and json.loads(out) == {"running": 1, "copied": 1, "copied_before": 0, "plain": 0}, err
        await client.cancel(eid)
        assert (await client.wait(eid, timeout=30)).state == ExecState.CANCELLED
    violations = secured.violations()  # the cli user's, and no other
    assert violations and all(f'user:cli" - Publish Violation - Subject "{start}"' in v for v in violations), violations


@pytest.mark.asyncio
async def test_a_command_its_user_may_not_make_says_so_within_its_timeout(secured: Secured, pods: Pods) -> None:
    """The server answers what a user may not do with a permissions violation told to
    the connection, not on the request's reply subject: a command that waited for the
    reply would wait out its whole --timeout and blame NATS. It says what was refused,
    in one line, exit 5, long before a --timeout the test could not wait out: a read as
    the tools user (no right to the status bucket), and any command as the cli user
    left on the default inbox prefix (its replies refused)."""
    await pods.start(secured, "engine")
    code, out, err = await cli("status", "not-there", "--timeout", "600", url=secured.url("tools"), user="tools")
    assert code == 5 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, out, err)
    assert "refused this user the publish to $JS.API.STREAM.MSG.GET.KV_status" in err, err
    code, out, err = await cli("list", "--timeout", "600", url=secured.url("cli"), env={"NATS_INBOX_PREFIX": "_INBOX"})
    assert code == 5 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, out, err)
    assert "subscription to _INBOX." in err and "NATS_INBOX_PREFIX" in err, err
    assert secured.passwords["cli"] not in err and secured.passwords["tools"] not in err


@pytest.mark.asyncio
async def test_a_role_that_may_not_declare_streams_waits_for_the_engine_to(
    secured: Secured, pods: Pods, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool pod started before any engine pod cannot create the streams (its user may
    not): it says what is missing and waits; the engine creates them and the tool pod
    starts."""
    caplog.set_level(logging.WARNING, logger="actors")
    tools = asyncio.create_task(pods.start(secured, "tools"))

    async def waiting() -> bool:
        return any("waiting for an engine pod" in r.getMessage() for r in caplog.records)

    await wait_for(waiting, timeout=30)
    assert not tools.done()
    (warning,) = {r.getMessage() for r in caplog.records if "waiting for an engine pod" in r.getMessage()}
    assert "stream 'EXEC'" in warning and "may not create them" in warning
    await pods.start(secured, "engine")
    await asyncio.wait_for(tools, timeout=30)


@pytest.mark.asyncio
async def test_the_cli_user_cannot_create_streams_and_says_so(secured: Secured) -> None:
    """Before any engine pod has declared the streams, a command by the cli user fails
    in one line naming what is missing (exit 5), and creates nothing."""
    code, _, err = await cli("status", "nothing-yet", "--timeout", "20", url=secured.url("cli"))
    assert code == 5, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "may not create them" in err and "stream 'EXEC'" in err
    assert secured.passwords["cli"] not in err
    nc = await nats.connect(secured.url("engine"), inbox_prefix=permissions.inbox_prefix("engine"))
    try:
        with pytest.raises(NotFoundError):
            await nc.jsm().stream_info(EXEC_STREAM)
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_the_cli_user_reads_a_log_longer_than_the_flow_control_window(secured: Secured, pods: Pods) -> None:
    """An ordered consumer (how `events`, `logs` and `status` read a log) stalls after
    about 2 MB unless its reader may answer the server's flow control."""
    await pods.start(secured, "engine")
    nc = await nats.connect(secured.url("engine"), inbox_prefix=permissions.inbox_prefix("engine"))
    subject = secured.layout.execution("long").decision
    try:
        js = nc.jetstream()
        for i in range(100):  # 6 MB
            await js.publish(subject, bytes(60_000), headers={"Nats-Msg-Id": f"long-{i}"})
    finally:
        await nc.close()
    reader = await nats.connect(secured.url("cli"), inbox_prefix=permissions.inbox_prefix("cli"))
    try:
        sub = await reader.jetstream().subscribe(subject, stream=EXEC_STREAM, ordered_consumer=True)
        for _ in range(100):
            await sub.next_msg(timeout=10)
    finally:
        await reader.close()
    assert secured.violations() == []


NAPPER = (
    HEAD % "napper"
    + """
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""
)
NAPPERS = (
    HEAD % "nappers"
    + """
workflow:
  - step: each
    tool: {kind: playbook, path: napper}
    loop: {collection: [1, 2], element: v}
"""
)


@pytest.mark.asyncio
async def test_cancelling_reaches_a_loop_its_children_and_their_commands(
    secured: Secured, pods: Pods, tmp_path: Path
) -> None:
    """The cli user cancels; the engine cancels the loop, the counter the children it
    started, their engines the running commands: every hop on its own user, nothing
    refused."""
    for role in ("engine", "counter", "tools", "projector"):
        await pods.start(secured, role)
    (tmp_path / "napper.yaml").write_text(NAPPER)
    (tmp_path / "nappers.yaml").write_text(NAPPERS)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        await client.register(tmp_path / "napper.yaml")
        eid = await client.start((await client.register(tmp_path / "nappers.yaml")).path)

        async def two_children_running() -> list[str] | None:
            children = [s.execution_id for s in await client.list(playbook="napper", state="RUNNING")]
            return children if len(children) == 2 else None

        children = await wait_for(two_children_running, timeout=60)
        await client.cancel(eid)
        assert (await client.wait(eid, timeout=60)).state == ExecState.CANCELLED
        for child in children:
            assert (await client.wait(child, timeout=60)).state == ExecState.CANCELLED
    assert secured.violations() == []


TICK = (
    HEAD % "tick"
    + """
workflow:
  - step: work
    tool: {kind: noop}
"""
)


@pytest.mark.asyncio
async def test_the_cli_user_manages_schedules_and_the_engine_user_starts_their_fires(
    secured: Secured, pods: Pods, tmp_path: Path
) -> None:
    """Schedules: the cli user adds, pauses, resumes and deletes one (KV `schedules`,
    its definition in SCHEDULES); the engine's starter starts its fires."""
    for role in ("engine", "tools", "projector"):
        await pods.start(secured, role)
    (tmp_path / "tick.yaml").write_text(TICK)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        path = (await client.register(tmp_path / "tick.yaml")).path
        await client.schedule_add("tick", playbook=path, cron="* * * * * *")

        async def a_fire_completed() -> bool:
            return any(s.state == ExecState.COMPLETED for s in await client.list(playbook=path))

        await wait_for(a_fire_completed, timeout=60)
        # "run now" (the UI's): a fire the cli user sends by hand, started by the engine's starter
        eid = await client.schedule_run_now("tick", request_id="by-hand")
        assert (await client.wait(eid, timeout=30)).state == ExecState.COMPLETED
        await client.dead_letter_page(limit=5)  # the UI's dead-letters page, read as the cli user
        assert await client.schedule_pause("tick")
        assert await client.schedule_resume("tick")
        await client.schedule_delete("tick")
        assert await client.schedules() == []
    assert secured.violations() == []


@pytest.mark.asyncio
async def test_a_tool_pod_answers_a_command_the_server_gave_up_on(secured: Secured, pods: Pods, tmp_path: Path) -> None:
    """The max-deliveries advisory, heard by a tool pod (its user): the command's step
    fails with DeliveryExhausted and a dead letter says why, nothing refused."""
    layout = dataclasses.replace(secured.layout, max_deliver=2, ack_wait=1.0)
    engine = await pods.start(secured, "engine", layout)
    for watcher in engine.find(MaxDeliveriesWatcher):  # only the tool user's hears it
        await watcher.stop()
    await pods.start(secured, "projector", layout)
    tools = await nats.connect(secured.url("tools"), inbox_prefix=permissions.inbox_prefix("tools"))
    watcher = MaxDeliveriesWatcher(tools)
    await watcher.start()
    try:
        (tmp_path / "doomed.yaml").write_text(HEAD % "doomed" + DOOMED)
        async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=layout) as client:
            eid = await client.start((await client.register(tmp_path / "doomed.yaml")).path)
            # a tool "pod" that takes the command and dies before answering, each time (the
            # command is held by its decision record in the log: semantics 2)
            dying = await tools.jetstream().pull_subscribe_bind(tool_log_consumer("python"), stream=EXEC_STREAM)
            for _ in range(2):
                await dying.fetch(1, timeout=10)
            third = asyncio.create_task(dying.fetch(1, timeout=4))  # the server gives up instead
            assert (await client.wait(eid, timeout=30)).state == ExecState.FAILED
            items = await client.events(eid)
            (error,) = [i for i in items if i.type == "call.error"]
            assert error.data["error"]["type"] == "DeliveryExhausted"
            assert [i.type for i in items if i.cls == "dlq"] == ["dead_letter.tools"]
            with pytest.raises(TimeoutError):
                await third
    finally:
        await watcher.stop()
        await tools.close()
    assert secured.violations() == []


DOOMED = """
workflow:
  - step: crashy
    tool: {kind: python, code: "def main(): return 1"}
"""


def test_the_deploy_files_are_rendered_from_the_description() -> None:
    """deploy/nats/ is what actors/pod/permissions.py renders (run `python -m actors.pod.permissions`
    after changing it), for the partitions the manifests deploy."""
    layout = permissions.deployed_layout()
    assert permissions.CONF_FILE.read_text() == permissions.server_config(layout)
    assert permissions.VALUES_FILE.read_text() == permissions.helm_values(layout)
    values = yaml.safe_load(permissions.VALUES_FILE.read_text())
    users = values["config"]["merge"]["accounts"][permissions.ACCOUNT]["users"]
    assert [u["user"] for u in users] == list(permissions.USERS)
    env = values["container"]["env"]
    for u, described in zip(users, permissions.users(layout), strict=True):
        # the chart's raw value: the server reads the password from its environment,
        # which the chart fills from the Secret
        assert u["password"] == f"<< ${described.password_variable} >>"
        ref = env[described.password_variable]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": permissions.SECRET, "key": described.name}
        assert u["permissions"]["publish"]["allow"] == list(dict.fromkeys(described.publish))


def test_each_deployment_connects_as_its_own_user() -> None:
    """Every role's pods connect as the role's own user (the UI as the operator's), its
    password a file mounted from a Secret of their own, and KEDA looks in the account."""
    k8s = permissions.ROOT / "deploy" / "k8s"
    roles = set()
    for path in sorted(k8s.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc["kind"] != "Deployment":
                continue
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            role = container["args"][container["args"].index("--role") + 1]
            user = "cli" if role == "ui" else role
            assert user in permissions.USERS
            env = {e["name"]: e for e in container["env"]}
            assert "NATS_URL" not in env  # the ConfigMap's, with no credentials in it
            assert env["NATS_USER"]["value"] == user
            assert env["NATS_INBOX_PREFIX"]["value"] == permissions.inbox_prefix(user)  # else its replies are refused
            password = env["NATS_PASSWORD_FILE"]["value"]
            (mount,) = [m for m in container["volumeMounts"] if password.startswith(m["mountPath"] + "/")]
            (volume,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
            assert volume["secret"]["secretName"] == f"actors-nats-{role}"
            assert {i["path"] for i in volume["secret"]["items"]} == {password.rsplit("/", 1)[1]}
            roles.add(role)
    assert roles == {*ROLES, "ui"}
    scaled = yaml.safe_load((k8s / "tools-scaledobject.yaml").read_text())
    assert {t["metadata"]["account"] for t in scaled["spec"]["triggers"]} == {permissions.ACCOUNT}


def test_a_connection_takes_its_inbox_prefix_from_the_settings() -> None:
    """NATS_INBOX_PREFIX (or --nats-inbox-prefix) reaches nats-py's connect, which makes
    every reply subject under it; nats-py's `_INBOX` when unset; a prefix that is not one
    subject token (it would not match the server's `<prefix>.>`) is refused, naming it."""
    assert ConnectOptions.from_settings(Settings.from_env({})).nats_kwargs()["inbox_prefix"] == "_INBOX"
    env = {"NATS_INBOX_PREFIX": permissions.inbox_prefix("tools")}
    assert ConnectOptions.from_settings(Settings.from_env(env)).nats_kwargs()["inbox_prefix"] == "_INBOX_tools"
    flagged = Settings.from_env(env).with_flags(nats_inbox_prefix="_INBOX_cli")
    assert ConnectOptions.from_settings(flagged).inbox_prefix == "_INBOX_cli"
    for bad in ("_INBOX.cli", "_INBOX_*", ">", "a b"):
        with pytest.raises(SettingsInvalid, match="NATS_INBOX_PREFIX"):
            ConnectOptions.from_settings(Settings.from_env({"NATS_INBOX_PREFIX": bad}))


TWO_STEPS = """
workflow:
  - step: first
    tool: {kind: python, code: "def main(): return 1"}
    next: second
  - step: second
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ first }}"}
"""


@pytest.mark.asyncio
async def test_tool_pods_and_clients_start_before_the_engines_are_upgraded(
    secured: Secured, pods: Pods, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling upgrade from semantics 1: the streams as its engine pods declared them
    (no tool consumer on EXEC, which only an engine pod may create). A tool pod and a
    client of today start beside them, and once the first engine pod of today has
    created the consumers, the tool pod already running takes the commands held there."""
    real = streams_layout.consumer_configs

    def as_semantics_1(layout: Any, kinds: Any) -> Any:
        found = real(layout, kinds)
        found[EXEC_STREAM] = [c for c in found[EXEC_STREAM] if c.durable_name not in held_by_log]
        return found

    held_by_log = {tool_log_consumer(kind) for kind in TOOL_KINDS}
    older = await nats.connect(secured.url("engine"), inbox_prefix=permissions.inbox_prefix("engine"))
    monkeypatch.setattr(streams_layout, "consumer_configs", as_semantics_1)
    await streams_layout.ensure(older.jetstream(), secured.layout)
    monkeypatch.setattr(streams_layout, "consumer_configs", real)
    await older.close()
    await pods.start(secured, "tools")  # it does not wait for consumers it cannot create
    (tmp_path / "two.yaml").write_text(HEAD % "two" + TWO_STEPS)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        path = (await client.register(tmp_path / "two.yaml")).path
        await pods.start(secured, "engine")  # the first of today: it creates them
        await pods.start(secured, "projector")
        eid = await client.start(path)
        assert (await client.wait(eid, timeout=40)).state == ExecState.COMPLETED
        assert await client.result(eid) == {"second": 2}
    assert secured.violations() == []
