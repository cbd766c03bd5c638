"""natsio.requests: a request gets its own reply (headers delivered as sent), a
subject nobody listens on fails at once, a reply that never comes times out, and a
reply after that is dropped, on connections with and without the actors' reader; a
request the connection itself answers (`answer_locally`) never reaches the server."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import nats.errors
import pytest

from actors.natsio import private
from actors.natsio.requests import requester
from actors.pod.roles import connect
from streams.server import NatsServer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def answering(nc: Any, subject: str) -> list[Any]:
    """A responder on `subject` that answers each request with its payload and headers
    reversed back; the requests it saw."""
    seen: list[Any] = []

    async def cb(msg: Any) -> None:
        seen.append(msg)
        await msg.respond(msg.data[::-1] + b"|" + (msg.headers or {}).get("X-Test", "").encode())

    await nc.subscribe(subject, cb=cb)
    return seen


@pytest.mark.parametrize("ours", [True, False], ids=["our reader", "nats-py's parser"])
async def test_each_request_gets_its_own_reply_with_its_headers(nats_server: NatsServer, ours: bool) -> None:
    server_side = await nats.connect(nats_server.url)
    nc = await (connect(nats_server.url) if ours else nats.connect(nats_server.url))
    try:
        seen = await answering(server_side, "svc.echo")
        await private.flush(server_side)
        replies = await asyncio.gather(
            *(
                requester(nc).request("svc.echo", f"req-{i}".encode(), timeout=5, headers={"X-Test": str(i)})
                for i in range(50)
            )
        )
        assert replies == [f"req-{i}".encode()[::-1] + b"|" + str(i).encode() for i in range(50)]
        assert len(seen) == 50
        assert requester(nc) is requester(nc)  # one per connection: one reply subscription
    finally:
        await nc.close()
        await server_side.close()


@pytest.mark.parametrize("ours", [True, False], ids=["our reader", "nats-py's parser"])
async def test_a_request_nobody_listens_to_fails_at_once(nats_server: NatsServer, ours: bool) -> None:
    nc = await (connect(nats_server.url) if ours else nats.connect(nats_server.url))
    try:
        # a long timeout: the server's "no responders" status, not the timer, ends it
        task = asyncio.ensure_future(requester(nc).request("svc.nobody", b"x", timeout=25))
        with pytest.raises(nats.errors.NoRespondersError):
            await asyncio.wait_for(task, 10)
    finally:
        await nc.close()


async def test_a_reply_that_does_not_come_times_out_and_a_late_one_is_dropped(nats_server: NatsServer) -> None:
    server_side = await nats.connect(nats_server.url)
    nc = await connect(nats_server.url)
    held: list[Any] = []
    got_it = asyncio.Event()

    async def slow(msg: Any) -> None:  # answers only when told to
        held.append(msg)
        got_it.set()

    try:
        await server_side.subscribe("svc.slow", cb=slow)
        await private.flush(server_side)
        with pytest.raises(nats.errors.TimeoutError):
            await requester(nc).request("svc.slow", b"x", timeout=0.5)
        await got_it.wait()
        await held[0].respond(b"late")  # to a request that gave up: dropped
        await private.flush(server_side)
        # the next request on the connection still gets its own reply, not the late one
        echo = await answering(server_side, "svc.echo")
        await private.flush(server_side)
        assert await requester(nc).request("svc.echo", b"ab", timeout=5) == b"ba|"
        assert len(echo) == 1
    finally:
        await nc.close()
        await server_side.close()


def served_here(answers: dict[bytes, bytes]) -> tuple[list[bytes], Any]:
    """A service on the asking connection (`Requester.answer_locally`): answers each
    payload from `answers` (or holds it, unanswered, when absent) in a task it owns;
    the payloads it was asked, and the service with the tasks it made (a queue)."""
    asked: list[bytes] = []
    tasks: asyncio.Queue[asyncio.Task[bytes]] = asyncio.Queue()

    async def answer(data: bytes) -> bytes:
        if data in answers:
            return answers[data]
        await asyncio.Event().wait()  # held until cancelled
        raise AssertionError("unreachable")

    def service(data: bytes) -> asyncio.Task[bytes]:
        asked.append(data)
        task = asyncio.create_task(answer(data))
        tasks.put_nowait(task)
        return task

    return asked, (service, tasks)


async def test_a_request_the_connection_itself_answers_never_reaches_the_server(nats_server: NatsServer) -> None:
    """A pod whose engine serves a partition's asks answers its own tools and starter
    without a request through the server; a request on another connection, and one made
    once the service stopped answering locally, goes to the server as always."""
    spy_side = await nats.connect(nats_server.url)
    nc = await connect(nats_server.url)
    other = await connect(nats_server.url)
    try:
        remote = await answering(spy_side, "answer.3")  # every request that crosses the server
        await private.flush(spy_side)
        asked, (service, _) = served_here({b"result": b"stored"})
        requester(nc).answer_locally("answer.3", service)
        assert await requester(nc).request("answer.3", b"result", timeout=5, headers={"X-Test": "1"}) == b"stored"
        assert asked == [b"result"] and remote == []
        # another connection (another pod in this process) is not answered by this one's service
        assert await requester(other).request("answer.3", b"xy", timeout=5) == b"yx|"
        assert asked == [b"result"] and len(remote) == 1
        requester(nc).stop_answering_locally("answer.3", served_here({})[1][0])  # another's: stays
        assert await requester(nc).request("answer.3", b"result", timeout=5) == b"stored"
        assert asked == [b"result"] * 2 and len(remote) == 1
        requester(nc).stop_answering_locally("answer.3", service)
        assert await requester(nc).request("answer.3", b"result", timeout=5) == b"tluser|"
        assert asked == [b"result"] * 2 and len(remote) == 2
    finally:
        await other.close()
        await nc.close()
        await spy_side.close()


async def test_an_answer_here_that_does_not_come_or_whose_service_stopped_is_a_timeout(
    nats_server: NatsServer,
) -> None:
    """As a reply lost on the way: the asker gets TimeoutError and does what it does when
    nothing is known; its giving up does not cancel the service's work, which goes on
    as it would on another pod."""
    nc = await connect(nats_server.url)
    try:
        asked, (service, tasks) = served_here({})
        requester(nc).answer_locally("answer.1", service)
        with pytest.raises(nats.errors.TimeoutError):
            await requester(nc).request("answer.1", b"slow", timeout=0.2)
        slow = tasks.get_nowait()
        assert asked == [b"slow"] and not slow.done()  # still working on it
        asking = asyncio.ensure_future(requester(nc).request("answer.1", b"stopping", timeout=25))
        (await tasks.get()).cancel()  # the service stopping (Engine.stop cancels its asks)
        with pytest.raises(nats.errors.TimeoutError):
            await asyncio.wait_for(asking, 10)
        slow.cancel()
    finally:
        await nc.close()
