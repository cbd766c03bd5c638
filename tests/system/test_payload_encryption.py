"""Payload encryption end to end (actors/wire/codec.py): pods with a payload key run
playbooks (python steps, a loop, a failure, a big value in the object store, a child
playbook), and every stored byte on the server (streams, the status bucket, the object
store: all JetStream streams) is read raw to find no planted value, an error's type
included. Status and list work for a client without the key; the CLI with the key
prints the result; a log written under an old key is replayed after rotation, one
written in clear is still read; a wrong key is one clear error."""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.config.settings import Settings
from actors.natsio.binding import bind
from actors.pod.roles import Runtime, connect, start_roles
from actors.store.blobs import command_items
from actors.wire.codec import CLEAR, PayloadCodec, PayloadKeys, PayloadUnreadable, parse_key
from actors.wire.messages import CallError, Command, command_decoder, input_decoder
from streams.layout import Layout
from streams.server import NatsServer
from streams.subjects import ExecSubjects
from tests.conftest import make_layout

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
KEY_A = "a1:" + base64.b64encode(b"A" * 32).decode()
KEY_B = "b2:" + base64.b64encode(b"B" * 32).decode()
WRONG_A = "a1:" + base64.b64encode(b"Z" * 32).decode()  # the id of A, another secret

# Planted values: each appears only in a payload, or is built at run time by the step's
# code ("-".join), so the playbook source (kept in clear) never holds it.
PAYLOAD = {"secret": "PLANT-PAYLOAD-7731", "items": ["PLANT-ELEM-1", "PLANT-ELEM-2", "PLANT-ELEM-3"]}
PLANTS = [b"PLANT-PAYLOAD", b"PLANT-ELEM", b"PLANT-RESULT", b"PLANT-LOOP", b"PLANT-ERROR", b"PLANT-BIG", b"PLANT-KID"]

CHILD = """apiVersion: actors/v1
kind: Playbook
metadata: {name: kid, path: lib/kid}
workflow:
  - step: work
    tool: {kind: python, code: "def main(v):\\n    return '-'.join(['PLANT', 'KID', v])"}
    args: {v: "{{ workload.v }}"}
  - step: end
    args: {kid: "{{ work }}"}
"""

PARENT = """apiVersion: actors/v1
kind: Playbook
metadata: {name: secretive}
workflow:
  - step: first
    tool: {kind: python, code: "def main(s):\\n    return '-'.join(['PLANT', 'RESULT', s])"}
    args: {s: "{{ workload.secret }}"}
    next: each
  - step: each
    tool: {kind: python, code: "def main(x):\\n    return '-'.join(['PLANT', 'LOOP', x])"}
    args: {x: "{{ item }}"}
    loop: {collection: "{{ workload.items }}", element: item, mode: async, concurrency: 2}
    next: broken
  - step: broken
    tool: {kind: python, code: "def main(s):\\n    raise ValueError('-'.join(['PLANT', 'ERROR', s]))"}
    args: {s: "{{ workload.secret }}"}
    on_error: [{decision: ignore, result: "{{ error.message }}"}]
    next: big
  - step: big
    tool: {kind: python, code: "def main():\\n    return '-'.join(['PLANT', 'BIG']) * 150000"}
    next: child
  - step: child
    tool: {kind: playbook, path: lib/kid}
    args: {v: "{{ workload.secret }}"}
    next: end
  - step: end
    args: {first: "{{ first }}", each: "{{ each }}", broken: "{{ broken }}", big: "{{ big | length }}",
           child: "{{ child }}"}
"""

FAILING = """apiVersion: actors/v1
kind: Playbook
metadata: {name: failing}
workflow:
  - step: explode
    tool: {kind: python, code: "def main(s):\\n    raise ValueError('-'.join(['PLANT', 'ERROR', s]))"}
    args: {s: "{{ workload.secret }}"}
"""

SLOW = """apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: first
    tool: {kind: python, code: "def main(s):\\n    return '-'.join(['PLANT', 'RESULT', s])"}
    args: {s: "{{ workload.secret }}"}
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: 1.0}
    next: end
  - step: end
    args: {first: "{{ first }}"}
"""


def codec(*keys: str) -> PayloadCodec:
    parsed = [parse_key(k, where="test") for k in keys]
    return PayloadCodec(PayloadKeys(parsed[0], tuple(parsed[1:])))


class Pods:
    """Actors with a payload key on one connection, and a client on it."""

    def __init__(self, server: NatsServer, layout: Layout, tmp: Path) -> None:
        self.server, self.layout, self.tmp = server, layout, tmp
        self.runtime: Runtime | None = None
        self.nc: NATS | None = None

    async def start(self, key: str, old: str | None = None) -> Client:
        self.nc = await connect(self.server.url, name="keyed")
        settings = Settings(payload_key=key, payload_old_keys=old)
        self.runtime = await start_roles(self.nc, layout=self.layout, settings=settings)
        return Client(self.nc, layout=self.layout)  # the connection's codec: the pods' keys

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop()
        if self.nc is not None:
            await self.nc.close()

    async def register(self, client: Client, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return (await client.register(path)).path


@pytest_asyncio.fixture
async def pods(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Pods]:
    p = Pods(nats_server, make_layout(), tmp_path)
    try:
        yield p
    finally:
        await p.stop()


async def keyless_client(server: NatsServer, layout: Layout, *, key: str | None = None) -> Client:
    nc = await connect(server.url, name="keyless")
    return Client(nc, layout=layout, owns_connection=True, codec=None if key is None else codec(key))


async def every_stored_byte(nc: NATS) -> bytes:
    """Every message of every stream on the server, raw: the logs, the status and other
    buckets (KV_*), the object store (OBJ_*)."""
    jsm = nc.jsm()
    chunks = []
    for info in await jsm.streams_info():
        state = info.state
        for seq in range(state.first_seq, state.last_seq + 1):
            try:
                msg = await jsm.get_msg(info.config.name, seq)
            except Exception:
                continue  # deleted (a work queue's acked command)
            chunks.append(msg.data or b"")
    return b"\n".join(chunks)


async def test_no_planted_value_is_stored_in_clear_and_a_keyless_client_still_sees_status(pods: Pods) -> None:
    client = await pods.start(KEY_A)
    await pods.register(client, "kid.yaml", CHILD)
    path = await pods.register(client, "secretive.yaml", PARENT)
    eid = await client.start(path, payload=PAYLOAD)
    assert (await client.wait(eid, timeout=60)).state == "COMPLETED"
    result = await client.result(eid)
    assert result["first"] == "PLANT-RESULT-PLANT-PAYLOAD-7731"
    assert result["each"] == [f"PLANT-LOOP-PLANT-ELEM-{i}" for i in (1, 2, 3)]
    assert "PLANT-ERROR-PLANT-PAYLOAD-7731" in result["broken"]
    assert result["big"] == len("PLANT-BIG") * 150000
    assert result["child"] == {"kid": "PLANT-KID-PLANT-PAYLOAD-7731"}
    big = next(i for i in await client.events(eid) if i.type == "call.done" and i.step == "big")
    assert big.data["result_ref"]  # the big value did go to the object store

    failed = await client.start(await pods.register(client, "failing.yaml", FAILING), payload=PAYLOAD)
    status = await client.wait(failed, timeout=30)
    assert status.state == "FAILED" and status.error is not None
    assert "PLANT-ERROR-PLANT-PAYLOAD-7731" in status.error["message"]  # with the key: readable

    assert pods.nc is not None
    stored = await every_stored_byte(pods.nc)
    assert b"$sealed:a1:" in stored  # encrypted values are there, under key id a1
    assert b"OBJ_blobs" not in stored  # (sanity: we read data, not names)
    for plant in PLANTS:
        assert plant not in stored, plant

    # a client without the key: status and list work, ids, steps and states in clear
    keyless = await keyless_client(pods.server, pods.layout)
    try:
        st = await keyless.status(failed)
        assert st is not None and st.state == "FAILED"
        assert st.error is not None and st.error["step"] == "explode"
        assert st.error["type"] == st.error["message"] == "<encrypted with payload key 'a1'>"
        listed = {s.execution_id: s.state for s in await keyless.list()}
        assert listed[eid] == "COMPLETED" and listed[failed] == "FAILED"
        with pytest.raises(PayloadUnreadable, match="give the key"):
            await keyless.result(eid)
        items = await keyless.events(eid)
        assert any(i.type == "step.exit" and i.step == "big" for i in items)  # the log's shape is readable
    finally:
        await keyless.close()


# the error's type is the name of a class the step's code made from the payload
TYPED = """apiVersion: actors/v1
kind: Playbook
metadata: {name: typed}
workflow:
  - step: named
    tool: {kind: python, code: "def main(s):\\n    raise type('-'.join(['PLANT', 'TYPE', s]), (Exception,), {})('x')"}
    args: {s: "{{ workload.secret }}"}
    on_error: [{when: "{{ workload.secret in error.type }}", decision: ignore, result: "{{ error.type }}"}]
    next: plain
  - step: plain
    tool: {kind: python, code: "def main():\\n    raise KeyError('x')"}
"""


async def test_an_errors_type_is_sealed_and_one_written_in_clear_is_still_read(pods: Pods) -> None:
    pods.nc = await connect(pods.server.url, name="clear")  # before any key was set
    pods.runtime = await start_roles(pods.nc, layout=pods.layout, settings=Settings())
    client = Client(pods.nc, layout=pods.layout)
    before = await client.start(await pods.register(client, "failing.yaml", FAILING), payload=PAYLOAD)
    assert (await client.wait(before, timeout=30)).state == "FAILED"
    await pods.stop()

    client = await pods.start(KEY_A)
    eid = await client.start(await pods.register(client, "typed.yaml", TYPED), payload=PAYLOAD)
    status = await client.wait(eid, timeout=30)
    assert status.state == "FAILED" and status.error is not None and status.error["type"] == "KeyError"
    # the engine read the sealed type: its rule matched, and made the type the step's result
    [named] = [i for i in await client.events(eid) if i.type == "step.failure_decided" and i.step == "named"]
    assert (named.data["decision"], named.data["result"]) == ("ignore", "PLANT-TYPE-PLANT-PAYLOAD-7731")
    old = await client.status(before)  # written in clear: read as it was
    assert old is not None and old.error is not None and old.error["type"] == "ValueError"

    assert pods.nc is not None
    assert b"PLANT-TYPE" not in await every_stored_byte(pods.nc)
    keyless = await keyless_client(pods.server, pods.layout)
    try:
        st = await keyless.status(eid)
        assert st is not None and st.error is not None and st.error["step"] == "plain"
        assert st.error["type"] == "<encrypted with payload key 'a1'>"
    finally:
        await keyless.close()


async def test_a_log_written_under_an_old_key_replays_after_rotation(pods: Pods) -> None:
    client = await pods.start(KEY_A)
    path = await pods.register(client, "slow.yaml", SLOW)
    eid = await client.start(path, payload=PAYLOAD)
    async for item in client.follow(eid, until_terminal=False):
        if item.type == "command.issued" and item.step == "nap":
            break
    await pods.stop()  # mid-way: the nap's result will reach pods with the new key
    client = await pods.start(KEY_B, old=KEY_A)
    assert (await client.wait(eid, timeout=30)).state == "COMPLETED"
    assert await client.result(eid) == {"first": "PLANT-RESULT-PLANT-PAYLOAD-7731"}
    assert pods.nc is not None
    # the end, on its own subject or in the last step's answer record (semantics 5)
    subjects = pods.layout.execution(eid)
    try:
        end = await pods.nc.jsm().get_last_msg("EXEC", subjects.lifecycle("playbook.completed"))
    except NotFoundError:
        end = await pods.nc.jsm().get_last_msg("EXEC", subjects.answer_lifecycle("playbook.completed"))
    assert b"$sealed:b2:" in (end.data or b"")  # written after the rotation: the new key

    # without the old key, the old values cannot be read, and it says which key is missing
    only_b = await keyless_client(pods.server, pods.layout, key=KEY_B)
    try:
        items = await only_b.events(eid)
        start = next(i for i in items if i.type == "execution.start")
        assert start.unreadable is not None and "'a1'" in start.unreadable
    finally:
        await only_b.close()


async def test_a_wrong_key_is_one_clear_error(pods: Pods) -> None:
    client = await pods.start(KEY_A)
    eid = await client.start(await pods.register(client, "slow.yaml", SLOW), payload=PAYLOAD)
    assert (await client.wait(eid, timeout=30)).state == "COMPLETED"
    wrong = await keyless_client(pods.server, pods.layout, key=WRONG_A)
    try:
        with pytest.raises(PayloadUnreadable, match="does not decrypt"):
            await wrong.result(eid)
    finally:
        await wrong.close()


async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    import os

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("ACTORS_PAYLOAD")} | env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_prints_results_with_the_key_and_says_why_not_without(pods: Pods, tmp_path: Path) -> None:
    client = await pods.start(KEY_A)
    eid = await client.start(await pods.register(client, "slow.yaml", SLOW), payload=PAYLOAD)
    assert (await client.wait(eid, timeout=30)).state == "COMPLETED"
    keys = tmp_path / "payload.keys"
    keys.write_text(f"# current first, then old keys\n{KEY_B}\n{KEY_A}\n")
    env = {"NATS_URL": pods.server.url, "ACTORS_PARTITIONS": str(pods.layout.partitions)}

    code, out, err = await cli("result", eid, "--json", "--payload-key-file", str(keys), env=env)
    assert code == 0, err
    assert "PLANT-RESULT-PLANT-PAYLOAD-7731" in out

    code, out, err = await cli("result", eid, env=env)
    assert code == 3
    assert err.count("\n") == 1 and "encrypted (payload key 'a1')" in err and "Traceback" not in err

    code, out, err = await cli("status", eid, env=env)  # status needs no key
    assert code == 0, err
    assert "COMPLETED" in out

    code, out, err = await cli("events", eid, env=env)  # the log's shape without the key, and one line why
    assert code == 0, err
    assert "step.exit" in out and "<encrypted with payload key 'a1'>" in out and "PLANT" not in out
    assert err.count("\n") == 1 and "give the key" in err


async def test_pods_without_the_old_key_fail_the_execution_naming_the_key(pods: Pods) -> None:
    """Rotation done wrong (the old key dropped): the execution is not stuck and the
    pods do not crash; it fails with an error that names the missing key id."""
    client = await pods.start(KEY_A)
    eid = await client.start(await pods.register(client, "slow.yaml", SLOW), payload=PAYLOAD)
    async for item in client.follow(eid, until_terminal=False):
        if item.type == "command.issued" and item.step == "nap":
            break
    await pods.stop()
    client = await pods.start(KEY_B)  # no old key: the log's values cannot be read
    status = await client.wait(eid, timeout=60)
    assert status.state == "FAILED" and status.error is not None
    assert status.error["type"] == "PayloadUnreadable"  # recorded at once, not an EngineError after retries
    assert "'a1'" in status.error["message"] and "not among the keys given" in status.error["message"]


async def test_a_tool_pod_without_the_key_fails_the_step_saying_so(nats_server: NatsServer, tmp_path: Path) -> None:
    status = await run_split(nats_server, tmp_path, FAILING, engine=Settings(payload_key=KEY_A), tools=Settings())
    assert status.state == "FAILED" and status.error is not None
    assert status.error["type"] == "PayloadUnreadable" and status.error["step"] == "explode"
    assert "give the key" in status.error["message"]


async def test_a_tool_pod_without_the_key_fails_a_step_whose_command_is_a_blob_at_once(
    nats_server: NatsServer,
) -> None:
    """A command too large for a message travels as a stub naming a sealed blob. A stub
    the tools pod reads (here one written in clear) whose blob is sealed with a key it
    lacks: the step fails PayloadUnreadable naming the key id at the first delivery,
    not after redeliveries ending in the dead-letter stream."""
    layout = make_layout()
    keyed = await connect(nats_server.url, name="keyed")
    clear = await connect(nats_server.url, name="tools-without-key")
    bind(keyed, codec(KEY_A))
    tools = await start_roles(clear, layout=layout, roles=("tools",), settings=Settings())
    try:
        eid = "blobcmd1"
        reply_to = ExecSubjects.of(eid, layout.partitions).result("c1")
        answers = await keyed.subscribe(reply_to)
        big = Command(
            execution_id=eid,
            command_id="c1",
            step="explode",
            kind="python",
            reply_to=reply_to,
            tool={"kind": "python", "code": "def main(s):\n    return s"},
            args={"s": "PLANT-PAYLOAD-" + "x" * 2000},
            attempt_number=1,
        )
        js = keyed.jetstream()
        [(subject, data, msg_id)] = await command_items(js, [big], limit=1000, cap=layout.max_value_bytes)
        stub = codec(KEY_A).decode(command_decoder, data)
        assert stub.body_ref is not None
        await js.publish(subject, CLEAR.encode(stub), headers={"Nats-Msg-Id": msg_id})
        answer = input_decoder.decode((await answers.next_msg(timeout=20)).data)
        assert isinstance(answer, CallError) and answer.error.type == "PayloadUnreadable"
        assert "'a1'" in answer.error.message and "give the key" in answer.error.message
        assert (await keyed.jsm().stream_info("DLQ")).state.messages == 0
    finally:
        await tools.stop()
        await clear.close()
        await keyed.close()


RETRIED = """apiVersion: actors/v1
kind: Playbook
metadata: {name: retried}
workflow:
  - step: flaky
    tool: {kind: python, code: "def main(s):\\n    raise OSError('-'.join(['PLANT', 'ERROR', s]))"}
    args: {s: "{{ workload.secret }}"}
    retry:
      - when: "{{ error is not none }}"
        then: {max_attempts: 3, backoff: exponential, initial_delay: 0.05, jitter: full}
    on_error: [{decision: ignore, result: {seen: "{{ error.message }}"}}]
    next: end
  - step: end
    args: {flaky: "{{ flaky }}", secret: "{{ workload.secret }}"}
"""


async def test_a_replay_under_the_key_reproduces_every_stored_decision_byte_for_byte(pods: Pods) -> None:
    """What a replaying engine would publish (the fold of the decrypted inputs, encrypted
    again) is byte-identical to what the log holds: the same bytes under the same
    Nats-Msg-Id, whoever publishes them again."""
    from actors.core.decide import fold
    from actors.core.state import Execution
    from actors.natsio import log_time, stream_seq
    from actors.runtime.outbox import carrier_message, decision_messages, holdable
    from actors.store.blobs import HEADROOM
    from actors.wire.events import (
        DecisionRecord,
        FailureDecidedEvent,
        answer_decoder,
        decision_decoder,
        extras_decoder,
    )
    from actors.wire.messages import input_decoder
    from streams.layout import EXEC_STREAM, class_of
    from streams.subjects import is_answer_record

    client = await pods.start(KEY_A)
    eid = await client.start(await pods.register(client, "retried.yaml", RETRIED), payload=PAYLOAD)
    assert (await client.wait(eid, timeout=30)).state == "COMPLETED"
    assert pods.nc is not None
    keys = codec(KEY_A)
    sub = await pods.nc.jetstream().subscribe(
        f"{pods.layout.exec_prefix(eid)}.>", stream=EXEC_STREAM, ordered_consumer=True
    )
    log = []
    while True:
        msg = await sub.next_msg(timeout=5)
        log.append((msg.subject, msg.data, stream_seq(msg), log_time(msg)))
        if msg.metadata.num_pending == 0:
            break
    await sub.unsubscribe()
    leaks = [d for _, d, _, _ in log if any(p in d for p in PLANTS)]
    assert not leaks, leaks
    recorded = {}
    for s, d, _, _ in log:
        cls = class_of(s)
        if is_answer_record(s):
            rec = keys.decode(answer_decoder, d).record
        else:
            rec = keys.decode(decision_decoder, d) if cls == "ev" else keys.decode(extras_decoder, d).decision
        for ev in rec.events if rec is not None and (cls in ("ev", "lc") or is_answer_record(s)) else []:
            if isinstance(ev, FailureDecidedEvent):
                recorded[(ev.data.activation, ev.data.attempt_number)] = ev.data
    state = Execution(execution_id=eid, recorded=recorded)
    subjects = pods.layout.execution(eid)
    replayed: list[tuple[str, bytes]] = []  # decision records, lifecycle messages, answer records: in log order
    for s, d, seq, at in log:
        if class_of(s) != "in":
            continue
        if is_answer_record(s):  # a result, or the start (semantics 6), stored with its decision
            held = keys.decode(answer_decoder, d).record
            assert held.answer is not None and held.at is not None
            fx = fold(
                state, keys.decode(input_decoder, bytes(held.answer)), seq=held.cause, at=held.at, subjects=subjects
            )
            record = DecisionRecord(
                cause=held.cause, events=fx.events, command=holdable(keys, fx), answer=held.answer, at=held.at
            )
            if fx.lifecycle:
                type_, body = carrier_message(keys, fx.lifecycle, record)
                kind = fx.commands[0].kind if fx.commands else None
                replayed.append((subjects.answer_lifecycle(type_, kind), body))
            else:
                replayed.append(
                    (subjects.answer_record(fx.commands[0].kind if fx.commands else None), keys.encode(record))
                )
            continue
        fx = fold(state, keys.decode(input_decoder, d), seq=seq, at=at, subjects=subjects)
        carry, limit = state.semantics >= 2, pods.layout.max_msg_size - HEADROOM
        items, _ = decision_messages(keys, fx, subjects, eid, carry=carry, limit=limit)
        replayed += [(subject, data) for subject, data, _ in items]
    assert replayed == [(s, d) for s, d, _, _ in log if class_of(s) in ("ev", "lc") or is_answer_record(s)]
    assert is_answer_record(log[0][0])  # the start, stored with its first decision (semantics 6)


async def test_a_schedule_keeps_its_payload_encrypted_and_its_fires_run(pods: Pods) -> None:
    """The schedule's payload is a start payload too: sealed in KV `schedules` and in the
    definition the server fires (stream SCHEDULES); the starter opens each fire."""
    client = await pods.start(KEY_A)
    path = await pods.register(client, "slow.yaml", SLOW)
    assert pods.nc is not None
    ended: asyncio.Queue[str] = asyncio.Queue()

    async def on_end(msg: Any) -> None:  # a fire's execution completing (its id: hush-<fire time>)
        eid = msg.subject.split(".")[2]
        if eid.startswith("hush-"):
            ended.put_nowait(eid)

    sub = await pods.nc.subscribe("exec.*.*.lc.playbook.completed", cb=on_end)
    sub_answer = await pods.nc.subscribe("exec.*.*.in.answer.lc.playbook.completed", cb=on_end)  # semantics 5
    await client.schedule_add("hush", playbook=path, cron="* * * * * *", payload=PAYLOAD)
    listed = {v.spec.name: v.spec for v in await client.schedules()}
    assert listed["hush"].payload == PAYLOAD  # read back with the key
    first = await asyncio.wait_for(ended.get(), 30)
    await sub.unsubscribe()
    await sub_answer.unsubscribe()
    assert (await client.wait(first, timeout=30)).state == "COMPLETED"
    assert await client.result(first) == {"first": "PLANT-RESULT-PLANT-PAYLOAD-7731"}
    await client.schedule_delete("hush")
    assert pods.nc is not None
    stored = await every_stored_byte(pods.nc)
    for plant in PLANTS:
        assert plant not in stored, plant


# A step's result that is ordinary text shaped like a sealed token (an http response can
# carry one), in each of the three places a token can sit, and at the end as it is.
LOOKALIKE = """apiVersion: actors/v1
kind: Playbook
metadata: {name: lookalike}
workflow:
  - step: fetch
    tool: {kind: python, code: "def main():\\n    return '$sealed:x:hello'"}
    next: shaped
  - step: shaped
    tool: {kind: python, code: "def main():\\n    return {'$sealed': '$$sealed:x:hello'}"}
    next: listed
  - step: listed
    tool: {kind: python, code: "def main():\\n    return [{'$sealed': '$sealed:x:hello'}]"}
    next: last
  - step: last
    tool: {kind: python, code: "def main(a, b, c):\\n    return {'a': a, 'b': b, 'c': c}"}
    args: {a: "{{ fetch }}", b: "{{ shaped }}", c: "{{ listed }}"}
"""


@pytest.mark.parametrize("key", [None, KEY_A], ids=["clear", "keyed"])
async def test_a_result_that_looks_sealed_completes_and_reads_back_exactly(pods: Pods, key: str | None) -> None:
    """Text starting `$sealed:` is a user's value, never taken for a token: with no key
    it is written escaped (one more `$`) and read back as it was; with a key it is
    sealed like any value."""
    if key is None:
        pods.nc = await connect(pods.server.url, name="clear")
        pods.runtime = await start_roles(pods.nc, layout=pods.layout, settings=Settings())
        client = Client(pods.nc, layout=pods.layout)
    else:
        client = await pods.start(key)
    eid = await client.start(await pods.register(client, "lookalike.yaml", LOOKALIKE))
    status = await client.wait(eid, timeout=60)
    assert status.state == "COMPLETED", status.error
    # each step's result travelled alone (where a token sits) and came to `last` as it was
    assert await client.result(eid) == {
        "last": {"a": "$sealed:x:hello", "b": {"$sealed": "$$sealed:x:hello"}, "c": [{"$sealed": "$sealed:x:hello"}]}
    }


async def run_split(
    nats_server: NatsServer, tmp_path: Path, playbook: str, *, engine: Settings, tools: Settings
) -> Any:
    """Run `playbook` with the tools pod on settings `tools` and the engine, counter
    and projector on `engine` (each its own connection); its final status."""
    layout = make_layout()
    engine_nc = await connect(nats_server.url, name="engine-pod")
    tools_nc = await connect(nats_server.url, name="tools-pod")
    tools_rt = await start_roles(tools_nc, layout=layout, roles=("tools",), settings=tools)
    engine_rt = await start_roles(engine_nc, layout=layout, roles=("engine", "counter", "projector"), settings=engine)
    try:
        client = Client(engine_nc, layout=layout)
        path = tmp_path / "playbook.yaml"
        path.write_text(playbook)
        eid = await client.start((await client.register(path)).path, payload=PAYLOAD)
        return await client.wait(eid, timeout=30)
    finally:
        await engine_rt.stop()
        await tools_rt.stop()
        await engine_nc.close()
        await tools_nc.close()


async def run_with_results_under_another_key(nats_server: NatsServer, tmp_path: Path, playbook: str) -> Any:
    """Run `playbook` where the tools pod writes results with key b2 (reading commands
    with a1, kept as an old key) and the engine and counter hold only a1; its status."""
    return await run_split(
        nats_server,
        tmp_path,
        playbook,
        engine=Settings(payload_key=KEY_A),
        tools=Settings(payload_key=KEY_B, payload_old_keys=KEY_A),
    )


async def test_an_input_the_engine_cannot_decrypt_fails_the_execution_at_once_naming_the_key(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The engine meets a step's result sealed with a key it lacks (a tools pod given
    another key): the execution fails with PayloadUnreadable naming that key id, from
    the first delivery (an EngineFault recorded at once), not after the host's retries
    as an EngineError."""
    status = await run_with_results_under_another_key(nats_server, tmp_path, SLOW)
    assert status.state == "FAILED" and status.error is not None
    assert status.error["type"] == "PayloadUnreadable", status.error
    assert "'b2'" in status.error["message"] and "not among the keys given" in status.error["message"]


LOOPED = """apiVersion: actors/v1
kind: Playbook
metadata: {name: looped}
workflow:
  - step: each
    tool: {kind: python, code: "def main(x):\\n    return x"}
    args: {x: "{{ item }}"}
    loop: {collection: "{{ workload.items }}", element: item}
"""


async def test_a_loop_input_the_counter_cannot_decrypt_fails_the_loop_at_once_naming_the_key(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The counter meets iteration results sealed with a key it lacks: the loop fails
    with PayloadUnreadable naming that key id from the first delivery (not an
    EngineError after the host's retries), and so does the execution."""
    status = await run_with_results_under_another_key(nats_server, tmp_path, LOOPED)
    assert status.state == "FAILED" and status.error is not None
    # the loop's verdict carries the counter's error as its first failed "iteration"
    assert status.error["type"] == "LoopFailed", status.error
    assert "PayloadUnreadable: input loop." in status.error["message"], status.error
    assert "'b2'" in status.error["message"], status.error
