"""Start messages as an API: a start sent as a request on `start.request` is answered
with the execution id or why it was refused, and a refused start that names an
execution id is dead-lettered under that id (also when published to the stream).
`Client.start` sends its starts as such requests, handled as the stream would handle
them, and falls back to the stream when no starter answers."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.client import Client, StartRefused
from actors.pod.roles import connect, start_roles
from actors.wire.codec import PayloadCodec, PayloadKeys, parse_key
from actors.wire.messages import StartReply
from streams.layout import START_STREAM, START_SUBJECT, ensure
from streams.server import NatsServer
from streams.subjects import START_AS_MESSAGE, START_REQUEST_SUBJECT, START_WAIT
from tests.conftest import System, make_layout, of_type, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

OK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: requested}
workflow:
  - step: a
    tool: {kind: python, code: "def main(name): return 'hi ' + name"}
    args: {name: "{{ workload.name }}"}
"""


async def request(system: System, body: dict[str, Any] | bytes, eid: str | None = None) -> StartReply:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Nats-Msg-Id": eid} if eid else None
    msg = await system.nc.request(START_REQUEST_SUBJECT, data, timeout=10, headers=headers)
    return msgspec.json.decode(msg.data, type=StartReply)


async def register(system: System) -> str:
    path = system.tmp / "requested.yaml"
    path.write_text(OK)
    return (await system.client.register(path)).path


async def test_a_start_request_is_answered_with_its_execution_id_and_runs_once(system: System) -> None:
    playbook = await register(system)
    body = {"playbook": playbook, "payload": {"name": "api"}, "execution_id": "req-ok-1"}
    reply = await request(system, body, "req-ok-1")
    assert reply == StartReply(execution_id="req-ok-1", started=True)
    status = await system.client.wait("req-ok-1", timeout=20)
    assert status.state == "COMPLETED"
    (done,) = of_type(await system.events("req-ok-1"), "playbook.completed")
    assert "hi api" in json.dumps(await system.client.result(done))  # the payload it was sent ran

    again = await request(system, body, "req-ok-1")
    assert again == StartReply(execution_id="req-ok-1", started=True, existing=True)
    assert len(of_type(await system.events("req-ok-1"), "execution.start")) == 1


async def test_a_start_request_without_an_id_gets_one_chosen_and_named(system: System) -> None:
    playbook = await register(system)
    reply = await request(system, {"playbook": playbook, "payload": {"name": "x"}})
    assert reply.started and reply.execution_id
    assert (await system.client.wait(reply.execution_id, timeout=20)).state == "COMPLETED"


async def test_an_unknown_playbook_is_refused_and_the_same_id_starts_once_it_is_registered(system: System) -> None:
    reply = await request(system, {"playbook": "requested", "execution_id": "req-later"})
    assert reply.execution_id == "req-later" and not reply.started
    assert reply.error is not None and reply.error.type == "PlaybookNotFound"
    assert "requested" in reply.error.message
    # refused: nothing started, the dead letter is filed under the id it named
    assert await system.client.exists("req-later", timeout=5) is False
    letters = [i for i in await system.events("req-later") if i.cls == "dlq"]
    assert [i.type for i in letters] == ["dead_letter.start"]
    assert "not registered" in letters[0].data["reason"]

    playbook = await register(system)
    reply = await request(system, {"playbook": playbook, "payload": {"name": "y"}, "execution_id": "req-later"})
    assert reply.started and not reply.existing
    assert (await system.client.wait("req-later", timeout=20)).state == "COMPLETED"


async def test_an_unknown_version_is_refused(system: System) -> None:
    playbook = await register(system)
    reply = await request(system, {"playbook": playbook, "version": 99, "execution_id": "req-v99"})
    assert not reply.started and reply.error is not None and reply.error.type == "PlaybookNotFound"


async def test_a_bad_payload_is_refused_naming_the_field_and_dead_lettered_under_the_id(system: System) -> None:
    playbook = await register(system)
    reply = await request(system, {"playbook": playbook, "payload": [1, 2], "execution_id": "req-badpayload"})
    assert reply.execution_id == "req-badpayload" and not reply.started
    assert reply.error is not None and reply.error.type == "InvalidStart" and "payload" in reply.error.message
    letters = [i for i in await system.events("req-badpayload") if i.cls == "dlq"]
    assert len(letters) == 1 and "payload" in letters[0].data["reason"]
    assert letters[0].data["execution_id"] == "req-badpayload"


async def test_bad_json_and_a_bad_id_are_refused_with_no_execution_id(system: System) -> None:
    reply = await request(system, b"{not json")
    assert reply.execution_id is None and not reply.started
    assert reply.error is not None and "not JSON" in reply.error.message
    reply = await request(system, {"playbook": "p", "execution_id": "a.b"})
    assert reply.execution_id is None and reply.error is not None
    assert reply.error.type == "InvalidStart" and "execution_id" in reply.error.message


async def test_a_bad_start_published_to_the_stream_is_dead_lettered_under_the_id_it_names(system: System) -> None:
    body = json.dumps({"playbook": "p", "payload": "not an object", "execution_id": "stream-bad"}).encode()
    await system.js_publish(START_SUBJECT, body, msg_id="stream-bad")

    async def letters() -> list[Any]:
        return [i for i in await system.events("stream-bad") if i.cls == "dlq"]

    (letter,) = await wait_for(letters)
    assert "payload" in letter.data["reason"] and letter.data["execution_id"] == "stream-bad"
    # one that names no usable id still goes under `_`
    await system.js_publish(START_SUBJECT, b'{"playbook": 1}', msg_id="no-id")

    async def unnamed() -> list[Any]:
        return [i for i in await system.client.dead_letters("start") if i.data["execution_id"] is None]

    assert len(await wait_for(unnamed)) == 1


async def test_client_start_returns_with_the_start_record_written_not_only_queued(system: System) -> None:
    """`Client.start` asks a starter (`start.request`, as a message): when it returns,
    the execution exists, where a start through stream START was only queued; nothing
    went through START."""
    playbook = await register(system)
    before = (await system.nc.jsm().stream_info(START_STREAM)).state.last_seq
    eid = await system.client.start(playbook, payload={"name": "fast"})
    assert await system.client._start_record(eid) is not None  # no wait: it is there
    assert (await system.nc.jsm().stream_info(START_STREAM)).state.last_seq == before
    assert (await system.client.wait(eid, timeout=20)).state == "COMPLETED"


async def test_client_start_with_no_starter_running_is_kept_by_the_stream_and_runs_once_one_starts(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout, timeout=10)
        path = tmp_path / "requested.yaml"
        path.write_text(OK)
        playbook = (await client.register(path)).path
        eid = await client.start(playbook, payload={"name": "later"}, execution_id="no-starter-yet")
        assert eid == "no-starter-yet"
        assert (await nc.jsm().stream_info(START_STREAM)).state.messages == 1  # queued for a starter
        assert await client.exists(eid, timeout=0.5) is None  # queued, not started yet
        runtime = await start_roles(nc, layout=layout)
        try:
            assert (await client.wait(eid, timeout=20)).state == "COMPLETED"
            assert len(of_type(await client.events(eid), "execution.start")) == 1
        finally:
            await runtime.stop()
    finally:
        await nc.close()


async def test_client_start_that_the_starters_cannot_read_is_refused_naming_why(system: System) -> None:
    """A start a starter cannot read (here: its payload sealed with a key the pods lack)
    would be dead-lettered from the stream all the same: the caller is told at once."""
    playbook = await register(system)
    key = parse_key("k1:" + base64.b64encode(b"k" * 32).decode(), where="test")
    nc = await connect(system.server.url, name="sealing client")  # its own codec: not the pods'
    try:
        sealed = Client(nc, layout=system.layout, codec=PayloadCodec(PayloadKeys(key)))
        with pytest.raises(StartRefused, match="refused: start message"):
            await sealed.start(playbook, payload={"name": "secret"}, execution_id="sealed-start")
    finally:
        await nc.close()
    letters = [i for i in await system.events("sealed-start") if i.cls == "dlq"]
    assert [i.type for i in letters] == ["dead_letter.start"]
    assert await system.client.exists("sealed-start", timeout=1) is False


async def test_client_start_that_no_starter_answers_in_time_goes_to_the_stream(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Something takes the request and never answers (a starter stuck, or gone after
    taking it): the client waits its share of the timeout, then the stream keeps the
    start, and it runs once a starter comes."""
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), layout)
        silent = await nc.subscribe(START_REQUEST_SUBJECT)  # takes requests, answers none
        client = Client(nc, layout=layout, timeout=2)  # waits min(2 s, 2 / 4) for an answer
        path = tmp_path / "requested.yaml"
        path.write_text(OK)
        playbook = (await client.register(path)).path
        began = time.monotonic()
        assert await client.start(playbook, payload={"name": "late"}, execution_id="unanswered") == "unanswered"
        assert time.monotonic() - began >= 0.5
        assert (await silent.next_msg(timeout=1)).headers == {START_AS_MESSAGE: "1", START_WAIT: "0.5"}
        assert (await nc.jsm().stream_info(START_STREAM)).state.messages == 1
        runtime = await start_roles(nc, layout=layout)
        try:
            assert (await client.wait("unanswered", timeout=20)).state == "COMPLETED"
        finally:
            await runtime.stop()
    finally:
        await nc.close()


async def test_a_start_request_whose_caller_stopped_waiting_is_dropped_unanswered(system: System) -> None:
    """A request that sat in a starter's backlog past the wait its caller named is not
    handled: that caller has sent the start to the stream meanwhile."""
    playbook = await register(system)
    body = json.dumps({"playbook": playbook, "payload": {"name": "x"}, "execution_id": "too-late"}).encode()
    with pytest.raises(TimeoutError):
        await system.nc.request(START_REQUEST_SUBJECT, body, timeout=1, headers={START_WAIT: "0"})
    assert await system.client.exists("too-late", timeout=1) is False
