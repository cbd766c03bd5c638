"""`ACTORS_NATS_FASTPATH=0`: every NATS call through nats-py's public API alone, with
the same behaviour. A pod's connection keeps nats-py's own parser; publishes, acks,
requests, subscriptions and flushes go the public way and do what the fast path does
(PubAcks, duplicates, acks the server sees, messages in order, no responders, ordered
flush); an execution runs to the same result; and the CLI reads the switch from the
environment (a value that is not a boolean stops it at start-up, naming it)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import nats.errors
import pytest
from nats.js.api import ConsumerConfig, StreamConfig
from nats.protocol.parser import Parser

from actors.natsio import private
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.fast import ack
from actors.natsio.publishing import MSG_ID, publish_all
from actors.natsio.reader import reader_of, subscribe_raw
from actors.natsio.requests import requester
from actors.pod.roles import connect
from streams.server import NatsServer
from tests.conftest import System
from tests.support.cli import cli, one_line

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ACTORS_NATS_FASTPATH=0 at import, for the connections this test makes (the
    `system` fixture's too: autouse fixtures are set up first)."""
    monkeypatch.setattr(private, "FASTPATH", False)


async def test_a_pods_connection_keeps_nats_pys_parser_and_publishes_the_public_way(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server.url)
    try:
        assert reader_of(nc) is None and type(nc._ps) is Parser  # no custom reader
        assert not private.can_write_directly(nc, 0)  # every publish is `Client.publish`
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="OFF", subjects=["off.>"]))
        acks = await publish_all(js, [("off.a", b"1", "id-a"), ("off.b", b"2", "id-b")])
        assert [(a.seq, a.duplicate) for a in acks] == [(1, None), (2, None)]
        (again,) = await publish_all(js, [("off.a", b"1", "id-a")])  # same Nats-Msg-Id
        assert again.seq == 1 and again.duplicate
        stored = await js.get_msg("OFF", 2)
        assert stored.data == b"2" and stored.headers is not None and stored.headers[MSG_ID] == "id-b"
    finally:
        await nc.close()


async def test_an_ack_is_msg_ack_and_the_server_sees_it(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="ACKS", subjects=["acks.>"]))
        await publish_all(js, [("acks.a", b"x", "a")])
        sub = await js.pull_subscribe("acks.>", "worker", config=ConsumerConfig(ack_wait=30))
        (msg,) = await sub.fetch(1, timeout=5)
        assert private.ack_connection(msg) is None  # no direct write: `msg.ack()` sends it
        await ack(msg)
        assert msg.is_acked
        with pytest.raises(nats.errors.MsgAlreadyAckdError):
            await ack(msg)  # as `msg.ack()` raises
        await private.flush(nc)
        info = await js.consumer_info("ACKS", "worker")
        assert info.num_ack_pending == 0 and info.ack_floor.consumer_seq == 1
    finally:
        await nc.close()


async def test_subscriptions_are_callbacks_and_hand_over_every_message_in_order(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url)
    sender = await nats.connect(nats_server.url)
    direct: list[tuple[str, bytes, Any]] = []
    raw: list[tuple[bytes, bytes, bytes | None]] = []
    done = asyncio.Event()

    def on_direct(msg: Any) -> None:
        direct.append((msg.subject, msg.data, msg.headers))

    def on_raw(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        raw.append((subject, data, headers))
        if len(raw) == 200:
            done.set()

    try:
        sub = await subscribe_direct(nc, "direct.>", on_direct)
        await subscribe_raw(nc, "raw.>", on_raw)
        assert sub._wait_for_msgs_task is not None  # nats-py's own task calls the handler
        await private.flush(nc)
        for i in range(200):
            await sender.publish(f"direct.{i}", str(i).encode(), headers={"N": str(i)})
            await sender.publish(f"raw.{i}", str(i).encode(), headers={"N": str(i)})
        await asyncio.wait_for(done.wait(), 10)
        await private.flush(sender)
        await private.flush(nc)
        assert direct[:200] == [(f"direct.{i}", str(i).encode(), {"N": str(i)}) for i in range(200)]
        assert raw == [
            (f"raw.{i}".encode(), str(i).encode(), f"NATS/1.0\r\nN: {i}\r\n\r\n".encode()) for i in range(200)
        ]
    finally:
        await sender.close()
        await nc.close()


async def test_requests_are_client_request(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url)
    responder = await nats.connect(nats_server.url)

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data[::-1] + (msg.headers or {}).get("X", "").encode())

    try:
        await responder.subscribe("svc.echo", cb=echo)
        await private.flush(responder)
        replies = await asyncio.gather(
            *(requester(nc).request("svc.echo", f"r{i}".encode(), timeout=5, headers={"X": str(i)}) for i in range(20))
        )
        assert replies == [f"r{i}".encode()[::-1] + str(i).encode() for i in range(20)]
        assert requester(nc)._sub is None  # no wildcard inbox of ours: nats-py's request muxer
        with pytest.raises(nats.errors.NoRespondersError):
            await requester(nc).request("svc.nobody", b"", timeout=30)
    finally:
        await responder.close()
        await nc.close()


async def test_the_public_flush_is_ordered(nats_server: NatsServer) -> None:
    """A responder subscribed and flushed on one connection is found by a request from
    another every time (nats-py's single flush missed it about once in fourteen)."""
    responders = await nats.connect(nats_server.url)
    requests = await nats.connect(nats_server.url)

    async def answer(msg: Any) -> None:
        await msg.respond(b"here")

    try:
        for i in range(500):
            await responders.subscribe(f"flushed.{i}", cb=answer)
            await private.flush(responders)
            assert (await requests.request(f"flushed.{i}", b"", timeout=10)).data == b"here"
    finally:
        await requests.close()
        await responders.close()


HELLO = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fastpath-off}
workload: {name: world}
workflow:
  - step: greet
    tool:
      kind: python
      code: |
        def main(name):
            return {"greeting": f"Hello, {name}!"}
    args: {name: "{{ workload.name }}"}
    next: [shout, whisper]
  - step: shout
    tool: {kind: python, code: "def main(text):\\n    return text.upper()\\n"}
    args: {text: "{{ greet.greeting }}"}
  - step: whisper
    tool: noop
    args: {text: "{{ greet.greeting | lower }}"}
"""


async def test_an_execution_runs_end_to_end_on_the_public_api(system: System) -> None:
    assert reader_of(system.nc) is None
    eid, status = await system.run_yaml(HELLO, payload={"name": "nats"})
    assert status.state == "COMPLETED", status
    result = await system.client.result(eid)
    assert "HELLO, NATS!" in str(result) and "hello, nats!" in str(result)


async def test_the_cli_reads_the_switch_and_refuses_a_value_that_is_not_a_boolean() -> None:
    code, out, err, _ = await cli(
        "run", "examples/hello.yaml", "--payload", '{"name": "nats"}', env={"ACTORS_NATS_FASTPATH": "0"}
    )
    assert code == 0, err
    assert "HELLO, NATS!" in out
    code, _, err, _ = await cli("run", "examples/hello.yaml", env={"ACTORS_NATS_FASTPATH": "maybe"})
    assert code == 3
    assert "ACTORS_NATS_FASTPATH" in one_line(err)
