"""What any NATS client can ask without the Python client (docs/protocol/asyncapi.yaml):
an execution's status and result on `result.request`, a playbook registered on
`catalog.register`, and every status the projector writes announced on
`status.<playbook>.<execution_id>`, so a client can watch one playbook's executions."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import msgspec
import nats.js.errors
import pytest
from nats.aio.msg import Msg

from actors.gateway.answers import Gateway
from actors.wire.messages import CancelReply, RegisterReply, ResultReply
from streams.subjects import (
    CANCEL_REQUEST_SUBJECT,
    REGISTER_REQUEST_SUBJECT,
    RESULT_REQUEST_SUBJECT,
    RESULT_WAIT,
    STATUS_REVISION,
)
from tests.conftest import System, of_type, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

GREET = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: greet, path: protocol/greet}
workflow:
  - step: a
    tool: {kind: python, code: "def main(name): return {'hello': name}"}
    args: {name: "{{ workload.name }}"}
"""

FAILS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fails, path: protocol/fails}
workflow:
  - step: boom
    tool: {kind: python, code: "def main(): raise KeyError('missing')"}
"""

SLOW = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: slow, path: protocol/slow}
workflow:
  - step: nap
    tool: {kind: python, code: "import time\\ndef main(s):\\n    time.sleep(s)\\n    return s"}
    args: {s: "{{ workload.s }}"}
"""

BIG = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: big, path: protocol/big}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 'x' * 300000"}
"""


T = TypeVar("T")


async def ask(
    system: System,
    subject: str,
    body: dict[str, Any] | bytes,
    reply: type[T],
    headers: dict[str, str] | None = None,
    timeout: float = 20,
) -> T:
    """A request as any NATS client sends it (JSON, or `body` as is), its reply decoded."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await system.nc.request(subject, data, timeout=timeout, headers=headers)
    return msgspec.json.decode(msg.data, type=reply)


async def register(system: System, source: str | bytes, file: str | None = "greet.yaml") -> RegisterReply:
    body = source if isinstance(source, bytes) else {"source": source} | ({"file": file} if file else {})
    return await ask(system, REGISTER_REQUEST_SUBJECT, body, RegisterReply)


async def ask_result(system: System, body: dict[str, Any] | bytes, wait: float | None = None) -> ResultReply:
    headers = {RESULT_WAIT: str(wait)} if wait is not None else None
    return await ask(system, RESULT_REQUEST_SUBJECT, body, ResultReply, headers, timeout=30)


async def test_a_playbook_registered_over_nats_starts_and_its_result_is_read_over_nats(system: System) -> None:
    reg = await register(system, GREET)
    assert reg == RegisterReply(path="protocol/greet", version=1, registered=True)
    assert await register(system, GREET) == reg  # the same source: its version, not a new one
    assert (
        (await system.client.catalog_entry("protocol/greet")).source == GREET
        if hasattr(system.client, "catalog_entry")
        else True
    )
    eid = await system.client.start("protocol/greet", payload={"name": "node"}, execution_id="proto-ok")
    reply = await ask_result(system, {"execution_id": eid}, wait=30)
    assert reply.error is None, reply.error
    assert reply.status is not None and reply.status.state == "COMPLETED"
    assert reply.status.playbook == "protocol/greet" and reply.status.version == 1
    assert reply.result == {"a": {"hello": "node"}}
    assert reply.result == await system.client.result(eid)  # what `actors-cli result` says
    assert reply.result_ref is None


async def _true(value: bool) -> bool:
    return value


async def _running(system: System, eid: str) -> bool:
    status = await system.client.status(eid)
    return status is not None and status.state == "RUNNING"


async def test_a_result_request_says_running_at_once_and_waits_for_the_end_when_asked(system: System) -> None:
    reg = await register(system, SLOW, "slow.yaml")
    eid = await system.client.start(reg.path or "", payload={"s": 2}, execution_id="proto-slow")
    await wait_for(lambda: _running(system, eid), timeout=20)
    now = await ask_result(system, {"execution_id": eid})  # no wait asked: answered as it stands
    assert now.error is None and now.status is not None
    assert now.status.state == "RUNNING" and now.result is None and now.result_ref is None
    done = await ask_result(system, {"execution_id": eid}, wait=30)
    assert done.status is not None and done.status.state == "COMPLETED"
    assert done.result == await system.client.result(eid)


async def test_a_failed_execution_is_answered_with_its_status_and_error_and_no_result(system: System) -> None:
    reg = await register(system, FAILS, "fails.yaml")
    eid = await system.client.start(reg.path or "", execution_id="proto-fails")
    reply = await ask_result(system, {"execution_id": eid}, wait=30)
    assert reply.error is None  # the request was answered: the execution's error is in its status
    assert reply.status is not None and reply.status.state == "FAILED"
    assert reply.status.error is not None and "KeyError" in json.dumps(reply.status.error)
    assert reply.result is None and reply.result_ref is None


async def test_a_result_too_large_for_a_reply_is_named_by_its_blob(system: System) -> None:
    reg = await register(system, BIG, "big.yaml")
    eid = await system.client.start(reg.path or "", execution_id="proto-big")
    reply = await ask_result(system, {"execution_id": eid}, wait=30)
    assert reply.status is not None and reply.status.state == "COMPLETED", reply
    assert reply.result is None and reply.result_ref
    assert (
        await system.client.result(eid) == {"a": "x" * 300000}
        or len(json.dumps(await system.client.result(eid))) > 300000
    )


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"not json", "InvalidRequest"),
        (b'{"execution_id": "../etc"}', "InvalidRequest"),
        (b'{"execution_id": "x", "extra": 1}', "InvalidRequest"),
        (b"[" * 5000 + b"]" * 5000, "InvalidRequest"),
        (b'{"execution_id": "proto-nosuch"}', "ExecutionNotFound"),
    ],
)
async def test_a_bad_or_unknown_result_request_is_answered_with_why(system: System, body: bytes, kind: str) -> None:
    reply = await ask_result(system, body, wait=0.2)
    assert reply.error is not None and reply.error.type == kind, reply
    assert reply.status is None and reply.result is None


async def test_a_bad_playbook_is_refused_naming_the_file_and_nothing_is_registered(system: System) -> None:
    broken = GREET.replace("args: {name:", "args: {name").replace("path: protocol/greet", "path: protocol/broken")
    reply = await register(system, broken, "broken.yaml")
    assert not reply.registered and reply.path is None and reply.version is None
    assert reply.error is not None and reply.error.type == "PlaybookInvalid"
    assert "broken.yaml" in reply.error.message
    # an alias bomb is bounded like any playbook a pod loads (a render process, past 8 KB)
    bomb = (
        "a: &a ["
        + ",".join(["x"] * 9)
        + "]\n"
        + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    )
    bomb += "pad: '" + "p" * 9000 + "'\n"
    reply = await register(system, bomb, "bomb.yaml")
    assert not reply.registered and reply.error is not None and reply.error.type == "PlaybookInvalid"
    for body in (b"{", b'{"source": 3}', b'{"file": "x.yaml"}'):
        reply = await register(system, body)
        assert reply.error is not None and reply.error.type == "InvalidRequest", body
    # the pod still answers
    assert (await register(system, GREET)).registered


async def test_a_version_registered_with_other_content_is_a_conflict(system: System) -> None:
    pinned = GREET.replace("path: protocol/greet}", "path: protocol/pinned, version: 3}")
    first = await register(system, pinned, "pinned.yaml")
    assert first.registered and first.version == 3
    other = await register(system, pinned.replace("hello", "bye"), "pinned.yaml")
    assert not other.registered and other.error is not None and other.error.type == "VersionConflict"


async def test_one_playbooks_statuses_are_announced_under_its_name_in_order(system: System) -> None:
    seen: list[tuple[str, int, dict[str, Any]]] = []
    other: list[str] = []
    done = asyncio.Event()

    async def on_status(msg: Msg) -> None:
        status = json.loads(msg.data)
        seen.append((msg.subject, int((msg.headers or {})[STATUS_REVISION]), status))
        if status["state"] == "COMPLETED":
            done.set()

    async def on_other(msg: Msg) -> None:
        other.append(msg.subject)

    mine = await system.nc.subscribe("status.protocol/greet.*", cb=on_status)
    theirs = await system.nc.subscribe("status.protocol/fails.*", cb=on_other)
    await system.nc.flush()
    reg = await register(system, GREET)
    eid = await system.client.start(reg.path or "", payload={"name": "feed"}, execution_id="proto-feed")
    await asyncio.wait_for(done.wait(), 30)
    await mine.unsubscribe()
    await theirs.unsubscribe()
    assert {s for s, _, _ in seen} == {f"status.protocol/greet.{eid}"}
    assert [st["state"] for _, _, st in seen][-1] == "COMPLETED"
    assert "RUNNING" in [st["state"] for _, _, st in seen]
    revisions = [r for _, r, _ in seen]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    # each announced value is the one stored at that revision
    kv = await system.nc.jetstream().key_value("status")
    last = await kv.get(eid)
    assert last.revision == revisions[-1] and json.loads(last.value or b"") == seen[-1][2]
    assert other == []  # another playbook's subject heard nothing of this one


async def test_requests_waiting_for_an_end_do_not_hold_up_other_requests(system: System) -> None:
    slow = await register(system, SLOW, "slow.yaml")
    greet = await register(system, GREET)
    done = await system.client.start(greet.path or "", payload={"name": "soon"}, execution_id="proto-soon")
    await system.client.wait(done, timeout=20)
    eid = await system.client.start(slow.path or "", payload={"s": 30}, execution_id="proto-long")
    await wait_for(lambda: _running(system, eid), timeout=20)
    # more waiters than the pod answers at once (64): each waits, holding no slot
    waiters = [asyncio.ensure_future(ask_result(system, {"execution_id": eid}, wait=40)) for _ in range(80)]
    (gateway,) = system.runtime.find(Gateway)
    await wait_for(lambda: _true(gateway.pending == 80), timeout=20)  # every waiter taken, before the quick one is sent
    quick = await ask_result(system, {"execution_id": done})
    assert quick.status is not None and quick.status.state == "COMPLETED"
    assert not any(w.done() for w in waiters)  # still waiting for the long one's end
    await system.client.cancel(eid, reason="test over")
    answers = await asyncio.gather(*waiters)
    assert {a.status.state for a in answers if a.status} == {"CANCELLED"} and all(a.status for a in answers)


async def cancel(system: System, body: dict[str, Any] | bytes) -> CancelReply:
    return await ask(system, CANCEL_REQUEST_SUBJECT, body, CancelReply)


async def test_an_execution_is_cancelled_over_nats_without_knowing_its_partition(system: System) -> None:
    slow = await register(system, SLOW, "slow.yaml")
    eid = await system.client.start(slow.path or "", payload={"s": 30}, execution_id="proto-cancel")
    await wait_for(lambda: _running(system, eid), timeout=20)
    reply = await cancel(system, {"execution_id": eid, "reason": "from node"})
    assert reply.cancelled and reply.error is None and reply.execution_id == eid
    assert reply.status is not None and reply.status.state == "RUNNING"  # as it stood when asked
    assert (await system.client.wait(eid, timeout=20)).state == "CANCELLED"
    (cancelled,) = of_type(await system.events(eid), "execution.cancelled")
    assert "from node" in json.dumps(cancelled.data)
    again = await cancel(system, {"execution_id": eid})  # ended: nothing more to do
    assert not again.cancelled and again.error is None
    assert again.status is not None and again.status.state == "CANCELLED"


async def test_a_cancel_of_an_unknown_id_writes_nothing_and_says_so(system: System) -> None:
    reply = await cancel(system, {"execution_id": "proto-never"})
    assert not reply.cancelled and reply.error is not None and reply.error.type == "ExecutionNotFound"
    assert not reply.error.retryable  # no start queued: it will not exist
    # its log holds nothing: a cancel of a made-up id must not become that id's one record for ever
    assert await system.client.exists("proto-never") is False
    assert await system.events("proto-never") == []
    for body in (b"nope", b'{"execution_id": "a b"}', b'{"execution_id": "x", "why": 1}'):
        bad = await cancel(system, body)
        assert bad.error is not None and bad.error.type == "InvalidRequest" and not bad.cancelled, body


async def test_an_answer_goes_only_to_an_inbox_never_where_a_request_points_it(system: System) -> None:
    """A pod may publish where a requester may not: a reply subject naming a lifecycle
    subject (or a lease) must not make the pod write there."""
    victim = system.layout.execution("proto-victim").lifecycle("playbook.completed")
    js = system.nc.jetstream()
    for subject, body in (
        (RESULT_REQUEST_SUBJECT, b'{"execution_id": "nosuch"}'),
        (REGISTER_REQUEST_SUBJECT, b"{"),
        (CANCEL_REQUEST_SUBJECT, b'{"execution_id": "nosuch"}'),
        ("start.request", b'{"playbook": "nosuch", "execution_id": "proto-victim"}'),
    ):
        await system.nc.publish(subject, body, reply=victim)
    # the same requests from an inbox are answered: the ones above were taken and dropped by then
    assert (await ask_result(system, {"execution_id": "nosuch"})).error is not None
    await system.engine_idle()
    with pytest.raises(nats.js.errors.NotFoundError):
        await js.get_last_msg("EXEC", victim)


async def test_a_stopping_pod_answers_its_waiting_requests_at_once(system: System) -> None:
    slow = await register(system, SLOW, "slow.yaml")
    eid = await system.client.start(slow.path or "", payload={"s": 30}, execution_id="proto-stop")
    await wait_for(lambda: _running(system, eid), timeout=20)
    waiter = asyncio.ensure_future(ask_result(system, {"execution_id": eid}, wait=50))
    (gateway,) = system.runtime.find(Gateway)
    await wait_for(lambda: _true(gateway.pending == 1), timeout=20)
    await gateway.stop()  # a rolling restart: the wait ends, answered as it stands
    reply = await waiter
    assert reply.status is not None and reply.status.state == "RUNNING" and reply.error is None


async def test_a_wait_for_an_id_with_no_status_is_short(system: System) -> None:
    # a made-up id must not hold a waiter for the minute it asked for: answered well inside 20 s
    msg = await system.nc.request(
        RESULT_REQUEST_SUBJECT, b'{"execution_id": "proto-made-up"}', timeout=20, headers={RESULT_WAIT: "60"}
    )  # a 20 s timeout, under the 60 s asked for: the answer must come well before
    reply = msgspec.json.decode(msg.data, type=ResultReply)
    assert reply.error is not None and reply.error.type == "ExecutionNotFound"


async def test_a_register_request_with_an_odd_file_name_is_refused(system: System) -> None:
    for file in ("x" * 257, "bad\nname.yaml"):
        reply = await register(system, GREET, file)
        assert not reply.registered and reply.error is not None and reply.error.type == "InvalidRequest"
