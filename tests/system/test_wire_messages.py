"""The protocol's schemas are the truth (issue #31): every message a full run puts on a
public subject (docs/protocol/asyncapi.yaml) validates against its JSON Schema in
docs/protocol/schemas/, in clear and sealed under a payload key.

A core NATS subscription on `>` records every message while the actors run a
successful multi-step playbook, a failing one, a loop, a retry, a child playbook, a
cancel, a halt, a large result, start requests (started, existing, refused), a dead
letter, result requests and register requests; then each message on a public subject
is validated with `jsonschema.Draft202012Validator`, and every message type must have
been seen, so the test cannot pass with nothing checked."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from jsonschema import Draft202012Validator
from nats.aio.msg import Msg

from actors.client import Client
from actors.config.settings import Settings
from actors.core.replay import SEMANTICS
from actors.natsio.binding import codec_of
from actors.pod.roles import connect
from actors.wire.events import ExecState
from actors.wire.messages import (
    CancelReply,
    RegisterReply,
    ResultReply,
    SignalReply,
    StartRecord,
    StartReply,
    encode,
)
from actors.wire.protocol import LIFECYCLE_MESSAGES, MESSAGES, SCHEMA_DIR
from streams import ids
from streams.server import NatsServer
from streams.subjects import (
    CANCEL_REQUEST_SUBJECT,
    REGISTER_REQUEST_SUBJECT,
    RESULT_REQUEST_SUBJECT,
    RESULT_WAIT,
    SIGNAL_REQUEST_SUBJECT,
    START_REQUEST_SUBJECT,
    START_SUBJECT,
)
from tests.conftest import System, running_system, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

KEY = "wire1:" + base64.b64encode(b"W" * 32).decode()
HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
MULTI = (
    HEAD % "wire-multi"
    + """  - step: a
    tool: {kind: python, code: "def main(name): return {'hello': name}"}
    args: {name: "{{ workload.name }}"}
    next: [b]
  - step: b
    tool: {kind: python, code: "def main(x): return [x, 2, 3.5, None]"}
    args: {x: "{{ a.hello }}"}
"""
)
FAILING = (
    HEAD % "wire-failing" + "  - step: boom\n    tool: {kind: python, code: \"def main(): raise ValueError('no')\"}\n"
)
LOOP = (
    HEAD % "wire-loop"
    + """  - step: square
    tool: {kind: python, code: "def main(x): return x * x"}
    args: {x: "{{ n }}"}
    loop: {collection: "{{ [1, 2, 3] }}", element: n}
    next: [sum]
  - step: sum
    args: {total: "{{ square | sum }}"}
"""
)
RETRY = (
    HEAD % "wire-retry"
    + """  - step: flaky
    tool: {kind: python, code: "def main(): raise RuntimeError('again')"}
    retry:
      - when: "{{ error is not none }}"
        then: {max_attempts: 2, initial_delay: 0.05}
"""
)
CHILD = """apiVersion: actors/v1
kind: Playbook
metadata: {name: wire-child, path: wire/child}
workflow:
  - step: work
    tool: {kind: python, code: "def main(n): return n * 10"}
    args: {n: "{{ workload.n }}"}
"""
PARENT = HEAD % "wire-parent" + "  - step: call\n    tool: {kind: playbook, path: wire/child}\n    args: {n: 4}\n"
SLEEPY = (
    HEAD % "wire-sleepy"
    + '  - step: nap\n    tool: {kind: python, code: "import time\\ndef main(): time.sleep(60)"}\n    timeout: 90\n'
)
BIG = HEAD % "wire-big" + "  - step: big\n    tool: {kind: python, code: \"def main(): return 'x' * 300000\"}\n"
WAITING = (
    HEAD % "wire-waiting"
    + "  - step: gate\n    tool: {kind: wait, signal: go, approval: true}\n    timeout: 60\n    next: [later]\n"
    + "  - step: later\n    tool: {kind: wait, signal: more}\n    timeout: 60\n"
)
REGISTERED = HEAD % "wire-registered" + '  - step: one\n    tool: {kind: python, code: "def main(): return 1"}\n'
QUICK = HEAD % "wire-future" + '  - step: one\n    tool: {kind: python, code: "def main(): return 1"}\n'

# never produced by a run of this code: a halted execution resumes only under code that
# decides as its log does (a later release: tests/system/test_halts.py patches the engine)
NOT_PRODUCED = {"ExecutionResumedMessage"}
# requests this test sends malformed on purpose: their schemas must refuse them, as the
# engine does
GARBLED = b"{not json"
EXTRA_FIELD = json.dumps({"execution_id": "wire", "extra": 1}).encode()


@dataclass
class Seen:
    subject: str
    reply: str
    headers: dict[str, str]
    data: bytes


class Recorder:
    """Every message the server routes (a core NATS subscription on `>`)."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []

    async def on(self, msg: Msg) -> None:
        self.seen.append(Seen(msg.subject, msg.reply, dict(msg.headers or {}), msg.data))

    def on_subject(self, prefix: str) -> list[Seen]:
        return [s for s in self.seen if s.subject.startswith(prefix)]


@pytest_asyncio.fixture(params=["clear", "sealed"])
async def wire(nats_server: NatsServer, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[System]:
    """All actors, with no payload key (values in clear) or with one (values sealed)."""
    settings = Settings(payload_key=KEY) if request.param == "sealed" else None
    async with running_system(nats_server, tmp_path, settings=settings) as system:
        yield system


def kind_of(seen: Seen, replies: dict[str, str]) -> str | None:
    """The public message a recorded message is (its schema's name); None for one on
    a subject the protocol does not publish to clients."""
    subject, parts = seen.subject, seen.subject.split(".")
    if subject in replies:
        return replies[subject]
    if subject in (START_SUBJECT, START_REQUEST_SUBJECT):
        return "StartMessage"
    if subject == RESULT_REQUEST_SUBJECT:
        return "ResultRequest"
    if subject == REGISTER_REQUEST_SUBJECT:
        return "RegisterRequest"
    if subject == CANCEL_REQUEST_SUBJECT:
        return "CancelAsk"
    if subject == SIGNAL_REQUEST_SUBJECT:
        return "SignalAsk"
    if parts[0] == "exec" and parts[3:] == ["in", "signal"]:
        return "SignalSent"
    if parts[0] == "exec" and len(parts) >= 6 and parts[3] == "lc":
        return LIFECYCLE_MESSAGES[".".join(parts[4:6])].__name__
    if parts[0] == "exec" and parts[3:] == ["in", "cancel"]:
        return "CancelRequest"
    deleted = "KV-Operation" in seen.headers  # a key deleted or purged (retention): no value
    if (parts[0] == "status" and len(parts) in (2, 3)) or subject.startswith("$KV.status."):
        return None if deleted else "ExecutionStatus"
    if subject.startswith("$KV.catalog.") and not subject.endswith(".latest"):
        return None if deleted else "CatalogEntry"
    if parts[0] == "dlq":
        return "DeadLetter"
    return None


def validators() -> dict[str, Draft202012Validator]:
    out = {}
    for m in MESSAGES:
        schema = json.loads((SCHEMA_DIR / f"{m.name}.json").read_text())
        Draft202012Validator.check_schema(schema)
        out[m.name] = Draft202012Validator(schema)
    return out


async def register(system: System, name: str, text: str) -> str:
    path = system.tmp / name
    path.write_text(text)
    return (await system.client.register(path)).path


async def request(system: System, subject: str, body: dict[str, Any] | bytes, **headers: str) -> Any:
    """The reply, its values opened with the deployment's key (sealed when it has one)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await system.nc.request(subject, data, timeout=30, headers=headers or None)
    replies: dict[str, type[Any]] = {
        START_REQUEST_SUBJECT: StartReply,
        RESULT_REQUEST_SUBJECT: ResultReply,
        CANCEL_REQUEST_SUBJECT: CancelReply,
        SIGNAL_REQUEST_SUBJECT: SignalReply,
    }
    return codec_of(system.nc).decode(msgspec.json.Decoder(replies.get(subject, RegisterReply)), msg.data)


async def test_every_message_on_a_public_subject_validates_against_its_schema(wire: System) -> None:
    system = wire
    recorder = Recorder()
    watcher = await connect(system.server.url, name="recorder")
    try:
        await watcher.subscribe(">", cb=recorder.on)
        await watcher.flush()
        await run_everything(system, recorder)
        await watcher.flush()
    finally:
        await watcher.close()

    replies: dict[str, str] = {}
    for s in recorder.seen:
        if s.reply:
            answer = {START_REQUEST_SUBJECT: "StartReply", RESULT_REQUEST_SUBJECT: "ResultReply"}
            answer[REGISTER_REQUEST_SUBJECT] = "RegisterReply"
            answer[CANCEL_REQUEST_SUBJECT] = "CancelReply"
            answer[SIGNAL_REQUEST_SUBJECT] = "SignalReply"
            if s.subject in answer:
                replies[s.reply] = answer[s.subject]
    checks = validators()
    failures: list[str] = []
    seen_kinds: set[str] = set()
    for s in recorder.seen:
        kind = kind_of(s, replies)
        if kind is None:
            continue
        if s.data in (GARBLED, EXTRA_FIELD):
            refused = not s.data.startswith(b"{n") and not checks[kind].is_valid(json.loads(s.data))
            assert refused or s.data == GARBLED, f"{s.subject}: a request the server refuses fits its schema"
            continue
        seen_kinds.add(kind)
        try:
            instance = json.loads(s.data)
        except ValueError as e:
            failures.append(f"{s.subject} ({kind}): not JSON: {e}")
            continue
        for error in checks[kind].iter_errors(instance):
            where = "/".join(map(str, error.absolute_path)) or "(top)"
            failures.append(f"{s.subject} ({kind}) at {where}: {error.message[:300]}")
        if kind.endswith("Reply") and isinstance(instance.get("error"), dict):
            seen_kinds.add("RequestError")  # a part of replies, not a message of its own: checked there too
            for error in checks["RequestError"].iter_errors(instance["error"]):
                failures.append(f"{s.subject} ({kind}) at error: {error.message[:300]}")
        data = instance.get("data") if isinstance(instance, dict) else None
        if isinstance(data, dict) and isinstance(data.get("error"), dict) and "type" in data["error"]:
            seen_kinds.add("ErrorInfo")  # an event's error: a part of events, checked there too
            for error in checks["ErrorInfo"].iter_errors(data["error"]):
                failures.append(f"{s.subject} ({kind}) at data/error: {error.message[:300]}")
        if kind in {m.__name__ for m in LIFECYCLE_MESSAGES.values()}:
            # a carrier's other lifecycle events count as seen: under semantics 2 some are
            # never a message of their own (workflow.initialized rides on playbook.initialized)
            for ev in [*instance.get("before", []), *instance.get("after", [])]:
                seen_kinds.add(LIFECYCLE_MESSAGES[ev["type"]].__name__)
            assert "Nats-Msg-Id" in s.headers, f"{s.subject}: no Nats-Msg-Id"
    assert not failures, "messages that do not match their schema:\n" + "\n".join(failures[:40])
    missing = {m.name for m in MESSAGES} - NOT_PRODUCED - seen_kinds
    assert not missing, f"message types never seen in the run: {sorted(missing)}"


async def run_everything(system: System, recorder: Recorder) -> None:
    client = system.client
    multi = await register(system, "multi.yaml", MULTI)
    paths = {
        name: await register(system, f"{name}.yaml", text)
        for name, text in (("failing", FAILING), ("loop", LOOP), ("retry", RETRY), ("big", BIG))
    }
    await register(system, "child.yaml", CHILD)
    parent = await register(system, "parent.yaml", PARENT)
    sleepy = await register(system, "sleepy.yaml", SLEEPY)

    # through the client (start requests with Actors-Start-As-Message)
    ok = await client.start(multi, payload={"name": "wire"})
    others = [await client.start(p) for p in paths.values()]
    child_parent = await client.start(parent)

    # published to `start` as any JetStream client would
    await system.js_publish(
        START_SUBJECT, json.dumps({"playbook": multi, "execution_id": "wire-pub"}).encode(), msg_id="wire-pub"
    )

    # start requests by hand: started, existing, refused (unknown playbook; not JSON)
    body = {"playbook": multi, "payload": {"name": "req"}, "execution_id": "wire-req"}
    first = await request(system, START_REQUEST_SUBJECT, body)
    assert first == StartReply(execution_id="wire-req", started=True)
    again = await request(system, START_REQUEST_SUBJECT, body)
    assert again.started and again.existing
    refused = await request(system, START_REQUEST_SUBJECT, {"playbook": "wire/none", "execution_id": "wire-refused"})
    assert not refused.started and refused.error.type == "PlaybookNotFound"
    garbled = await request(system, START_REQUEST_SUBJECT, GARBLED)
    assert garbled.execution_id is None and not garbled.started

    # a cancel, once its step runs
    nap = await client.start(sleepy)
    await wait_for(lambda: running(client, nap), timeout=60)
    await client.cancel(nap, reason="wire test")
    # and one through the cancel request, which any client can send without the partition count
    nap2 = await client.start(sleepy)
    await wait_for(lambda: running(client, nap2), timeout=60)
    asked = await request(system, CANCEL_REQUEST_SUBJECT, {"execution_id": nap2, "reason": "wire request"})
    assert asked.cancelled and asked.error is None
    nobody = await request(system, CANCEL_REQUEST_SUBJECT, {"execution_id": "wire-nobody"})
    assert not nobody.cancelled and nobody.error.type == "ExecutionNotFound"

    # a step waiting for an approval (execution.waiting), answered through the client; the
    # next one through the signal request any client can send; and one refused (unknown id)
    waiting = await client.start(await register(system, "waiting.yaml", WAITING))
    await wait_for(lambda: waits_for(client, waiting, "go"), timeout=60)
    assert (await client.approve(waiting, comment="wire")).accepted
    await wait_for(lambda: waits_for(client, waiting, "more"), timeout=60)
    sent = await request(system, SIGNAL_REQUEST_SUBJECT, {"execution_id": waiting, "name": "more", "data": [1, "x"]})
    assert sent.accepted and sent.error is None
    nobody = await request(system, SIGNAL_REQUEST_SUBJECT, {"execution_id": "wire-nobody", "name": "go"})
    assert not nobody.accepted and nobody.error.type == "ExecutionNotFound"

    # a halt: a start record of semantics this code does not know
    record = StartRecord(
        execution_id="wire-halt", playbook_path="future", playbook_source=QUICK, semantics=SEMANTICS + 1
    )
    await system.js_publish(
        system.layout.execution("wire-halt").start, encode(record), msg_id=ids.start_record_id("wire-halt")
    )

    ended = [ok, *others, child_parent, "wire-pub", "wire-req", nap, nap2, waiting]
    for eid in ended:
        await client.wait(eid, timeout=90)
    await wait_for(lambda: state_is(client, "wire-halt", ExecState.HALTED), timeout=60)

    # result requests: completed, large (by reference), failed, waited for, unknown, invalid
    done = await request(system, RESULT_REQUEST_SUBJECT, {"execution_id": ok})
    assert (
        done.status is not None
        and done.status.state == ExecState.COMPLETED
        and done.result == {"b": ["wire", 2, 3.5, None]}
    )
    big = await request(system, RESULT_REQUEST_SUBJECT, {"execution_id": others[3]})
    assert big.result_ref and big.result is None
    failed = await request(system, RESULT_REQUEST_SUBJECT, {"execution_id": others[0]})
    assert failed.status.state == ExecState.FAILED and failed.result is None
    waited = await request(system, RESULT_REQUEST_SUBJECT, {"execution_id": "wire-req"}, **{RESULT_WAIT: "5"})
    assert waited.status.state == ExecState.COMPLETED
    unknown = await request(system, RESULT_REQUEST_SUBJECT, {"execution_id": "wire-nobody"})
    assert unknown.status is None and unknown.error.type == "ExecutionNotFound"
    invalid = await request(system, RESULT_REQUEST_SUBJECT, EXTRA_FIELD)
    assert invalid.error.type == "InvalidRequest"

    # register requests: registered, and refused; then the registered one runs
    reg = await request(system, REGISTER_REQUEST_SUBJECT, {"source": REGISTERED, "file": "registered.yaml"})
    assert reg.registered and reg.path and reg.version == 1
    bad = await request(system, REGISTER_REQUEST_SUBJECT, {"source": "kind: nothing"})
    assert not bad.registered and bad.error.type == "PlaybookInvalid"
    late = await request(system, START_REQUEST_SUBJECT, {"playbook": reg.path, "execution_id": "wire-registered"})
    assert late.started
    await client.wait("wire-registered", timeout=60)

    # what is published after the statuses the waits read: the refused start's dead
    # letter, and the last statuses on their feed (core NATS: recorded once routed)
    ended += ["wire-registered", "wire-halt"]
    await wait_for(lambda: recorded(recorder, "dlq.start.wire-refused"), timeout=30)
    for eid in ended:
        await wait_for(lambda eid=eid: final_status_fed(recorder, eid), timeout=30)


async def running(client: Client, eid: str) -> bool:
    return await state_is(client, eid, ExecState.RUNNING) and bool(await client.running_steps(eid))


async def state_is(client: Client, eid: str, state: ExecState) -> bool:
    status = await client.status(eid)
    return status is not None and status.state == state


async def recorded(recorder: Recorder, subject: str) -> bool:
    return bool(recorder.on_subject(subject))


async def final_status_fed(recorder: Recorder, eid: str) -> bool:
    """The execution's status announced on `status.<playbook>.<id>` in a final state."""
    for s in recorder.on_subject("status."):
        parts = s.subject.split(".")
        if len(parts) == 3 and parts[2] == eid and s.data:
            if json.loads(s.data)["state"] in ("COMPLETED", "FAILED", "CANCELLED", "HALTED"):
                return True
    return False


async def waits_for(client: Client, eid: str, signal: str) -> bool:
    status = await client.status(eid)
    return status is not None and any(w.signal == signal for w in status.waiting or [])
