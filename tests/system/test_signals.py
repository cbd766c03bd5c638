"""Sending signals and seeing waits (#29), against one running system for the module:
`Client.signal` writes one `SignalSent` per signal id and refuses what must not be
signalled (an ended, unknown or retired execution, a bad name) writing nothing; a start
still queued takes one; an approval step is answered through the client, the CLI
(`actors-cli approve`/`reject`) and a plain NATS request on `execution.signal`, as any
client of any language would send it; `status`, `describe` and `list` show what a
waiting execution waits for; a second answer to one approval wait (a race, a stale
status) is reported, never taken for a success; what a log holds raw is shown escaped."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from actors.client import Client, ExecutionNotFound, InvalidSignal, SignalRefused
from actors.client.signals import approval_signal_id
from actors.natsio import MSG_ID
from actors.pod import permissions
from actors.pod.roles import connect, start_roles
from actors.store.records import status_record
from actors.ui.server import make_app
from actors.wire.messages import ExecutionStatus, SignalReply, SignalSent
from streams.ids import signal_msg_id
from streams.layout import OWNERS_BUCKET, STATUS_BUCKET, ensure
from streams.server import NatsServer
from streams.subjects import SIGNAL_REQUEST_SUBJECT, status_subject
from tests.conftest import EXAMPLES, System, make_layout
from tests.support.cli import cli
from tests.support.secured import Pods, Secured, pods, secured
from tests.support.ui import ok, post

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]
__all__ = ["pods", "secured"]  # the fixtures, used by name

APPROVAL = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: signals_approval}
workflow:
  - step: approve
    timeout: 120
    tool: {kind: wait, signal: approval, approval: true}
    next: done
  - step: done
    tool: noop
    args: {answer: "{{ approve }}"}
"""

SLEEPER = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: signals_sleeper}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""

HOLD = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: signals_hold}
workflow:
  - step: approve
    timeout: 120
    tool: {kind: wait, signal: approval, approval: true}
    next: hold
  - step: hold
    timeout: 300
    tool: {kind: wait, signal: release}
"""

EACH = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: signals_each}
workflow:
  - step: each
    timeout: 120
    loop: {collection: [a, b], element: item}
    tool: {kind: wait, signal: review, key: "{{ item }}", approval: true}
"""

QUICK = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: signals_quick}
workflow:
  - step: only
    tool: noop
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sys_(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """Every role on one server, shared by the module's tests (each uses its own ids)."""
    server = await NatsServer.start()
    layout = make_layout()
    nc = await connect(server.url, name="test")
    # the roles a signal goes through (retention: this module retires by hand)
    runtime = await start_roles(nc, layout=layout, roles=("engine", "counter", "tools", "projector"))
    try:
        yield System(server, nc, Client(nc, layout=layout), runtime, layout, tmp_path_factory.mktemp("signals"))
    finally:
        await runtime.stop(drain_timeout=0.2)
        await nc.close()
        await server.discard()


async def signals_in_log(s: System, eid: str) -> list[dict[str, Any]]:
    return [i.data for i in await s.client.events(eid) if i.type == "signal.sent"]


async def waiting(s: System, eid: str, timeout: float = 20, signal: str | None = None) -> ExecutionStatus:
    """The execution's status once it says it waits (for `signal`, when given: the
    projector's copy of its `execution.waiting`): the statuses the server republishes,
    watched, not polled."""
    client = s.client
    seen: asyncio.Queue[ExecutionStatus] = asyncio.Queue()

    async def stored(msg: Any) -> None:
        if msg.data:
            seen.put_nowait(client.codec.open_for_display(status_record(msg.data, key=eid)))

    sub = await client.nc.subscribe(status_subject(eid), cb=stored)
    try:
        now = await client.status(eid)
        if now is not None:
            seen.put_nowait(now)
        async with asyncio.timeout(timeout):
            while True:
                st = await seen.get()
                if st.waiting and (signal is None or any(w.signal == signal for w in st.waiting)):
                    return st
                if st.state in ("COMPLETED", "FAILED", "CANCELLED"):
                    raise AssertionError(f"{eid} ended {st.state} ({st.error}) without waiting")
    finally:
        await sub.unsubscribe()


async def test_a_signal_is_written_once_and_what_must_not_be_signalled_is_refused(sys_: System) -> None:
    c = sys_.client
    done, status = await sys_.run_yaml(QUICK)
    assert status.state == "COMPLETED"
    running = await sys_.start_yaml(SLEEPER, execution_id="sig-sleeper")

    # one signal however often it is sent under its id; its fields as given
    first = await c.signal(running, "nudge", {"n": 1}, key="k1", signal_id="s-1", by="tester")
    again = await c.signal(running, "nudge", {"n": 2}, key="k1", signal_id="s-1", by="tester")
    assert first.accepted and again.accepted and first.signal_id == "s-1"
    assert not first.duplicate and again.duplicate  # the second was not written: the first stands
    other = await c.signal(running, "nudge")  # no id given: a new one each time
    assert other.accepted and other.signal_id and other.signal_id != "s-1" and not other.duplicate
    resent = await cli("signal", running, "nudge", "--id", "s-1", url=sys_.server.url)  # as a script retries
    assert resent.code == 0 and "was sent to sig-sleeper before (signal id s-1): the first stands" in resent.out
    sent = await signals_in_log(sys_, running)
    assert [(d["signal_id"], d["name"], d.get("key", ""), d.get("data"), d.get("by", "")) for d in sent] == [
        ("s-1", "nudge", "k1", {"n": 1}, "tester"),
        (other.signal_id, "nudge", "", None, ""),
    ]

    # an ended execution: refused with its status, nothing written
    refused = await c.signal(done, "nudge", {"late": True})
    assert not refused.accepted and refused.status is not None and refused.status.state == "COMPLETED"
    assert await signals_in_log(sys_, done) == []

    with pytest.raises(ExecutionNotFound, match="no execution 'sig-nobody'"):
        await c.signal("sig-nobody", "nudge")
    for bad in ("has space", "a.b", "", "x" * 65):
        with pytest.raises(InvalidSignal, match="signal name"):
            await c.signal(running, bad)
    with pytest.raises(InvalidSignal, match="signal id"):
        await c.signal(running, "nudge", signal_id="two words")
    assert len(await signals_in_log(sys_, running)) == 2

    # retired after its retention: its log is gone, a signal would be the one record left
    await c.archive(ended_before=time.time() + 1, to=c.archives)
    assert await c.archives.has(done)
    with pytest.raises(ExecutionNotFound, match="retired"):
        await c.signal(done, "nudge")
    await c.cancel(running)


async def test_a_start_still_queued_takes_a_signal(tmp_path: Path) -> None:
    """No starter runs: the start waits in stream START, and the signal is written to
    its log for it (the checks count a queued start as an execution). A live engine pod
    older than signals refuses every signal of a client that has not seen all pods know
    them; one that has is trusted for FEATURE_CACHE seconds (one bucket read, not one
    per signal)."""
    server = await NatsServer.start()
    try:
        layout = make_layout()
        async with Client.connect(server.url, layout=layout, timeout=2) as c:
            await ensure(c.js, layout)
            path = tmp_path / "q.yaml"
            path.write_text(QUICK)
            entry = await c.register(path)
            eid = await c.start(entry.path, execution_id="sig-queued")
            assert await c.start_queued(eid) is True
            reply = await c.signal(eid, "early", {"x": 1}, signal_id="e-1")
            assert reply.accepted and reply.status is None
            assert [i.data["signal_id"] for i in await c.events(eid) if i.type == "signal.sent"] == ["e-1"]

            owners = await c.js.key_value(OWNERS_BUCKET)
            await owners.put("members.engine.old-pod", b'{"semantics": 2, "features": []}')
            assert (await c.signal(eid, "early", signal_id="e-2")).accepted  # warm: known a moment ago
            async with Client.connect(server.url, layout=layout, timeout=2) as cold:
                with pytest.raises(SignalRefused, match="these run older code: engine/old-pod"):
                    await cold.signal(eid, "early", signal_id="e-3")
                await owners.delete("members.engine.old-pod")
                assert (await cold.signal(eid, "early", signal_id="e-3")).accepted
    finally:
        await server.discard()


async def test_an_approval_through_the_client_the_cli_and_a_plain_nats_request(sys_: System) -> None:
    c, url = sys_.client, sys_.server.url
    path = sys_.tmp / "approval.yaml"
    path.write_text(APPROVAL)
    entry = await c.register(path)
    example = await c.register(EXAMPLES / "approval.yaml")
    by_cli, by_nats, rejected = await asyncio.gather(
        *(c.start(entry.path, execution_id=f"sig-appr-{n}") for n in range(3))
    )
    payload = {"order": "A-17", "amount": 120}
    by_client = await c.start(example.path, payload=payload, execution_id="sig-appr-example")
    statuses = await asyncio.gather(*(waiting(sys_, e) for e in (by_client, by_cli, by_nats, rejected)))
    w = statuses[1].waiting[0]  # type: ignore[index]
    assert (w.step, w.signal, w.key, w.approval, w.loop) == ("approve", "approval", "", True, False)
    assert w.deadline is not None and w.deadline == pytest.approx(w.since + 120, abs=1)

    # what a user sees of a waiting execution: status, describe, list
    shown, shown_json, described, step, listed = await asyncio.gather(
        cli("status", by_cli, url=url),
        cli("status", by_cli, "--json", url=url),
        cli("describe", by_cli, url=url),
        cli("describe", by_cli, "approve", url=url),
        cli("list", "--state", "RUNNING", url=url),
    )
    assert shown.code == 0, shown.err
    assert "RUNNING" in shown.out and "waiting         for approval: signal approval (step approve) since " in shown.out
    assert ", times out " in shown.out
    as_json = json.loads(shown_json.out)
    assert as_json["waiting"][0]["signal"] == "approval" and as_json["waiting"][0]["approval"] is True
    assert "waiting for approval: signal approval since " in described.out, described.out
    assert "WAITING: waiting for approval: signal approval since" in step.out, step.out
    assert any(
        by_cli in line and "waiting for approval: signal approval (step approve)" in line
        for line in listed.out.splitlines()
    )

    # the client, on the README's example
    reply = await c.approve(by_client, comment="fine", by="ana")
    assert reply.accepted
    assert (await c.wait(by_client, timeout=20)).state == "COMPLETED"
    refund = {"order": "A-17", "amount": 120, "note": "fine", "approved_by": "ana"}
    assert await c.result(by_client) == {"refund": refund}
    story = await c.step_story(by_client, "approve")
    assert story.result == {"approved": True, "comment": "fine", "by": "ana"}
    # answering it again: refused, it has ended, nothing sent
    assert not (await c.approve(by_client)).accepted

    # the CLI: approve, and reject with a comment (the step fails Rejected)
    ok, no = await asyncio.gather(
        cli("approve", by_cli, url=url), cli("reject", rejected, "approve", "--comment", "wrong amount", url=url)
    )
    assert ok.code == 0 and "approval sent" in ok.out, ok.err
    assert no.code == 0, no.err
    assert (await c.wait(by_cli, timeout=20)).state == "COMPLETED"
    failed = await c.wait(rejected, timeout=20)
    assert failed.state == "FAILED" and failed.error is not None
    assert failed.error["type"] == "Rejected" and "wrong amount" in failed.error["message"]
    # user errors: one line and an exit code
    again, unknown, bad, data, no_file, blank = await asyncio.gather(
        cli("approve", by_cli, url=url),
        cli("signal", "sig-nobody", "nudge", url=url),
        cli("signal", by_nats, "bad name", url=url),
        cli("signal", by_nats, "x", "--data", "{nope", url=url),
        cli("signal", by_nats, "x", "--data-file", str(sys_.tmp / "nope.json"), url=url),
        cli("reject", by_nats, "--comment", " \x1b  ", url=url),
    )
    assert again.code == 3 and again.err.count("\n") == 1 and "already COMPLETED" in again.err
    assert unknown.code == 3 and unknown.err.strip() == "actors-cli: no execution 'sig-nobody': nothing to signal"
    assert bad.code == 3 and bad.err.startswith("actors-cli: signal name 'bad name' is not valid")
    assert data.code == 3 and "--data: not JSON" in data.err
    nope = sys_.tmp / "nope.json"
    assert no_file.code == 3 and no_file.err.startswith(f"actors-cli: --data-file {nope}: "), no_file.err
    assert "--payload" not in no_file.err
    assert blank.code == 3 and blank.err.strip() == "actors-cli: reject: --comment must say why (it is blank)"

    # a plain NATS request, as a client of any language sends it
    raw = await nats.connect(url)
    try:
        ask = {
            "execution_id": by_nats,
            "name": "approval",
            "data": {"approved": True, "comment": "via nats", "by": "bot"},
            "signal_id": "nats-1",
            "by": "bot\x07",  # who sent it, cleaned as the client's is
        }
        answer = msgspec.json.decode((await raw.request(SIGNAL_REQUEST_SUBJECT, json.dumps(ask).encode(), 10)).data)
        assert answer["accepted"] is True and answer["signal_id"] == "nats-1" and answer["error"] is None
        assert answer["duplicate"] is False
        assert (await c.wait(by_nats, timeout=20)).state == "COMPLETED"
        # the same request for the ended execution: refused with its status, nothing written
        late = msgspec.json.decode(
            (await raw.request(SIGNAL_REQUEST_SUBJECT, json.dumps({**ask, "signal_id": "nats-2"}).encode(), 10)).data,
            type=SignalReply,
        )
        assert not late.accepted and late.status is not None and late.status.state == "COMPLETED"
        bad_name = msgspec.json.decode(
            (await raw.request(SIGNAL_REQUEST_SUBJECT, json.dumps({**ask, "name": "a b"}).encode(), 10)).data
        )
        assert bad_name["error"]["type"] == "InvalidRequest" and not bad_name["accepted"]
        unknown_id = msgspec.json.decode(
            (
                await raw.request(SIGNAL_REQUEST_SUBJECT, json.dumps({**ask, "execution_id": "sig-none"}).encode(), 10)
            ).data
        )
        assert unknown_id["error"]["type"] == "ExecutionNotFound"
        long_by = msgspec.json.decode(
            (await raw.request(SIGNAL_REQUEST_SUBJECT, json.dumps({**ask, "by": "b" * 201}).encode(), 10)).data
        )
        assert long_by["error"]["type"] == "InvalidRequest" and "sender" in long_by["error"]["message"]
    finally:
        await raw.close()
    assert [(d["signal_id"], d["by"]) for d in await signals_in_log(sys_, by_nats)] == [("nats-1", "bot")]


@pytest.mark.asyncio(loop_scope="function")
async def test_the_cli_user_signals_under_the_least_privilege_account(
    secured: Secured, pods: Pods, tmp_path: Path
) -> None:
    """deploy/nats/permissions.conf as committed: the cli user's client writes a signal
    itself (`exec.*.*.in.signal`) and asks the engines' gateway (`execution.signal`); the
    engine user answers; the server refuses nothing."""
    for role in ("engine", "projector"):  # the engine first: it declares the streams
        await pods.start(secured, role)
    url = secured.url("cli")
    async with Client.connect(url, options=secured.options("cli"), layout=secured.layout) as c:
        path = tmp_path / "approval.yaml"
        path.write_text(APPROVAL)
        entry = await c.register(path)
        direct, asked = await asyncio.gather(*(c.start(entry.path, execution_id=f"sec-{n}") for n in (1, 2)))
        s = System(secured.server, c.nc, c, None, secured.layout, path.parent)  # type: ignore[arg-type]
        await asyncio.gather(waiting(s, direct), waiting(s, asked))
        assert (await c.approve(direct, comment="direct")).accepted
        raw = await nats.connect(url, inbox_prefix=permissions.inbox_prefix("cli"))
        try:
            ask = {"execution_id": asked, "name": "approval", "data": {"approved": True, "comment": "", "by": "x"}}
            answer = await raw.request(SIGNAL_REQUEST_SUBJECT, json.dumps(ask).encode(), 10)
            assert msgspec.json.decode(answer.data)["accepted"] is True
        finally:
            await raw.close()
        for eid in (direct, asked):
            assert (await c.wait(eid, timeout=20)).state == "COMPLETED"
    assert secured.violations() == []


async def test_a_second_answer_to_one_wait_is_reported_and_raw_log_text_is_shown_escaped(sys_: System) -> None:
    """Two answers to one approval wait share its id: the first is taken, the second is
    written nowhere and its sender is told (`duplicate`; the CLI's "already answered",
    exit 3; the UI's `duplicate`), whether they raced or the second read a stale status.
    While a step waits with a timeout, `events` shows its timer armed, not fired. What a
    signal written raw to the log carries (escapes in its sender, id, data) reaches
    `describe` escaped."""
    c, url = sys_.client, sys_.server.url
    path = sys_.tmp / "hold.yaml"
    path.write_text(HOLD)
    entry = await c.register(path)
    raced, stale = await asyncio.gather(*(c.start(entry.path, execution_id=f"sig-hold-{n}") for n in range(2)))
    before = (await asyncio.gather(waiting(sys_, raced), waiting(sys_, stale)))[1]
    kv = await c.bucket(STATUS_BUCKET)
    old = (await kv.get(stale)).value or b""

    # an approval and a rejection at once: both read the wait, one is taken, the other reported
    yes, no = await asyncio.gather(
        c.approve(raced, comment="fine", by="ana"), c.approve(raced, approved=False, comment="no", by="bob")
    )
    assert yes.accepted and no.accepted and yes.signal_id == no.signal_id
    assert sorted([yes.duplicate, no.duplicate]) == [False, True]
    winner = "bob" if yes.duplicate else "ana"
    await waiting(sys_, raced, signal="release") if winner == "ana" else await c.wait(raced, timeout=20)
    assert [d["by"] for d in await signals_in_log(sys_, raced)] == [winner]

    # a stale status: the approval was taken, the status still shows the wait (as a
    # projector that lags would): the second answer carries the old wait's id
    assert not (await c.approve(stale, comment="first", by="ana")).duplicate
    await waiting(sys_, stale, signal="release")
    fresh = (await kv.get(stale)).value or b""
    await kv.put(stale, old)
    try:
        rejected, approved_json = await asyncio.gather(
            cli("reject", stale, "--comment", "too late", url=url), cli("approve", stale, "--json", url=url)
        )
        assert rejected.code == 3 and rejected.err.count("\n") == 1, rejected.err
        assert rejected.err.startswith("actors-cli: already answered: the approval step of execution sig-hold-1")
        assert approved_json.code == 3 and json.loads(approved_json.out)["duplicate"] is True
        async with TestClient(TestServer(make_app(c, read_only=False, token=None))) as ui:
            answer = await ok(await post(ui, f"/api/executions/{stale}/approval", {"approved": True}))
            assert answer["accepted"] is True and answer["duplicate"] is True
            blank = await post(ui, f"/api/executions/{stale}/approval", {"approved": False, "comment": "\x1b\x07 "})
            assert blank.status == 400 and "needs a comment" in (await blank.json())["error"]
            ui_events = (await ok(await ui.get(f"/api/executions/{stale}/events")))["events"]
    finally:
        await kv.put(stale, fresh)
    assert before.waiting is not None
    sid = approval_signal_id(before.waiting[0])
    assert [(d["signal_id"], d["by"]) for d in await signals_in_log(sys_, stale)] == [(sid, "ana")]

    # `hold` waits with a timeout: its timer is armed, due in 300 s; nothing fired
    items = await c.events(stale)
    armed = [i for i in items if i.type == "timer.armed"]
    assert armed and all(i.cls == "sch" for i in armed), [(i.cls, i.type) for i in items]
    assert any(i.data["due"] > time.time() + 200 and i.data["timer_id"].endswith("-wait") for i in armed)
    assert not [i for i in items if i.type == "timer.fired"]
    assert "timer.armed" in [e["type"] for e in ui_events] and "timer.fired" not in [e["type"] for e in ui_events]

    # a signal written straight to the log (as anyone allowed to publish there may):
    # escapes in its sender, id and data; `describe` shows them escaped, one line each
    evil = SignalSent(
        execution_id=stale,
        signal_id="raw\x1b[2J",
        name="release",
        data={"note": "\x9b31mred"},
        sent_at=time.time(),
        by="\x1b]0;owned\x07mallory\u202e",
    )
    await c.js.publish(
        c.layout.execution(stale).signal, c.codec.encode(evil), headers={MSG_ID: signal_msg_id(stale, "raw")}
    )
    assert (await c.wait(stale, timeout=20)).state == "COMPLETED"
    described = await cli("describe", stale, "hold", url=url)
    assert described.code == 0, described.err
    assert not any(ch in described.out for ch in ("\x1b", "\x07", "\x9b", "\u202e")), repr(described.out)
    assert "signal     release raw\\x1b[2J by \\x1b]0;owned\\x07mallory\\u202e at " in described.out, described.out
    assert "\\x9b31mred" in described.out


async def test_a_loop_of_approvals_is_answered_by_key_and_a_cancelled_wait_shows_ended(sys_: System) -> None:
    """A loop of approvals waits once per iteration, each on its key: `approve` without
    `--key` says so (naming the step), with it answers that iteration; once every one
    is answered the loop completes with their answers in collection order. A cancelled
    waiting execution's `describe` shows its wait step CANCELLED, its wait ENDED, one
    attempt."""
    c, url = sys_.client, sys_.server.url
    each, gone = await asyncio.gather(
        sys_.start_yaml(EACH, execution_id="sig-each"), sys_.start_yaml(APPROVAL, execution_id="sig-gone")
    )
    st, _ = await asyncio.gather(waiting(sys_, each), waiting(sys_, gone))
    assert [(w.step, w.loop, w.approval) for w in st.waiting or []] == [("each", True, True)]

    bare, named, wrong = await asyncio.gather(
        cli("approve", each, url=url), cli("approve", each, "each", url=url), cli("approve", each, "nope", url=url)
    )
    told = "actors-cli: step 'each' is a loop of approvals: answer one with --key ITEM_KEY"
    assert bare.code == 3 and bare.err.strip() == told, bare.err
    assert named.code == 3 and named.err.strip() == told, named.err
    assert wrong.code == 3 and "no approval step 'nope' waiting (approval steps waiting: each (a loop" in wrong.err
    by_key = await cli("approve", each, "--key", "b", "--comment", "bee", url=url)
    assert by_key.code == 0 and "approval sent" in by_key.out, by_key.err
    reply = await c.approve(each, key="a", comment="ay", by="ana")
    assert reply.accepted and not reply.duplicate
    assert (await c.wait(each, timeout=20)).state == "COMPLETED"
    answers = (await c.result(each))["each"]
    assert [(r["approved"], r["comment"]) for r in answers] == [(True, "ay"), (True, "bee")]
    assert answers[0]["by"] == "ana"

    await c.cancel(gone, "not needed")
    assert (await c.wait(gone, timeout=20)).state == "CANCELLED"
    table, step = await asyncio.gather(cli("describe", gone, url=url), cli("describe", gone, "approve", url=url))
    row = next(line for line in table.out.splitlines() if line.startswith("approve "))
    assert row.split()[1:3] == ["CANCELLED", "1"], table.out
    assert "waiting" not in row and "times out" not in step.out, step.out
    assert "state      CANCELLED" in step.out and "wait       ENDED: waited for approval" in step.out, step.out
