"""actors/natsio/reader.py: the protocol reader that replaces nats-py's parser on every
connection the actors make. It must hand on exactly what nats-py's own parser hands
on, however the server's bytes are split across reads, and read header blocks exactly
as nats-py does; against a real server, large and small messages, raw and direct
subscriptions, and status replies all arrive as they did."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from types import SimpleNamespace
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.errors import NoStreamResponseError
from nats.protocol.parser import Parser

from actors.natsio import private
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.publishing import publish_all, publisher
from actors.natsio.reader import Reader, has_status, install_reader, plain_headers, reader_of, subscribe_raw
from actors.pod.roles import connect
from streams.server import NatsServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader is the fast path: tested with it on, whatever ACTORS_NATS_FASTPATH says."""
    monkeypatch.setattr(private, "FASTPATH", True)


class Recorder:
    """What a parser hands the client: every message and every other operation, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._subs: dict[int, object] = {7: SimpleNamespace(_max_msgs=0)}
        self.stats = {"in_msgs": 0, "in_bytes": 0}

    async def _process_msg(self, sid: int, subject: Any, reply: Any, data: Any, headers: Any) -> None:
        h = None if headers is None else bytes(headers)
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), bytes(data), h))

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.calls.append(("info", info))


HEADERS = b"NATS/1.0\r\nNats-Msg-Id: e1:cmd:0-1\r\nActors-Start-Wait: 2.5\r\n\r\n"
STATUS = b"NATS/1.0 503\r\n\r\n"
WIRE = b"".join(
    [
        b'INFO {"server_id":"x","max_payload":1048576}\r\n',
        b"MSG t.a 1 5\r\nhello\r\n",
        b'MSG t.b 2 _INBOX.abc.17 11\r\n{"seq": 12}\r\n',
        b"MSG t.empty 3 0\r\n\r\n",
        b"PING\r\n",
        b"MSG t.tricky 4 24\r\nMSG t.x 1 3\r\nabc\r\nPING\r\n\r\n",  # a payload that looks like protocol
        b"HMSG t.h 5 %d %d\r\n%sbody\r\n" % (len(HEADERS), len(HEADERS) + 4, HEADERS),
        b"HMSG t.hr 6 $JS.ACK.EXEC.c.1.2.3.4.0 %d %d\r\n%s\r\n" % (len(HEADERS), len(HEADERS), HEADERS),
        b"+OK\r\n",
        b"HMSG _INBOX.x.1 7 %d %d\r\n%s\r\n" % (len(STATUS), len(STATUS), STATUS),
        b"PONG\r\n",
        b"MSG t.big 8 3000\r\n" + bytes(random.Random(1).choice(b"ab\r\n ") for _ in range(3000)) + b"\r\n",
        b"-ERR 'Slow Consumer'\r\n",
        b"MSG  t.spaces\t9   12\r\nwide spacing\r\n",
    ]
)


async def feed(parser: Parser, chunks: list[bytes]) -> None:
    for chunk in chunks:
        await parser.parse(chunk)


async def dispatched(make: type[Parser], chunks: list[bytes], raw: dict[int, Any] | None = None) -> list[Any]:
    nc = Recorder()
    parser = make(nc)
    if raw:
        assert isinstance(parser, Reader)
        parser.raw.update(raw)
    await feed(parser, chunks)
    return nc.calls


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@pytest.mark.asyncio
async def test_the_reader_hands_on_what_nats_py_parser_does_however_the_bytes_are_split() -> None:
    expected = await dispatched(Parser, [WIRE])
    assert len([c for c in expected if c[0] == "msg"]) == 9  # the sample means what it says
    assert await dispatched(Reader, [WIRE]) == expected
    for cut in range(1, len(WIRE)):  # every place one read can end
        assert await dispatched(Reader, split(WIRE, [cut])) == expected, cut
    rng = random.Random(7)
    for _ in range(200):  # many reads of random sizes, one byte included
        cuts = rng.sample(range(1, len(WIRE)), rng.randint(2, 60))
        assert await dispatched(Reader, split(WIRE, cuts)) == expected, cuts


@pytest.mark.asyncio
async def test_a_raw_subscription_gets_bytes_and_a_declined_message_goes_the_usual_way() -> None:
    got: list[tuple[bytes, bytes, bytes, bytes | None]] = []

    def handler(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> bool:
        got.append((subject, reply, data, headers))
        return headers is not None and has_status(headers)  # a status: declined

    calls = await dispatched(Reader, split(WIRE, [100, 101, 400]), raw={7: handler})
    assert got == [(b"_INBOX.x.1", b"", b"", STATUS)]
    assert ("msg", 7, b"_INBOX.x.1", b"", b"", STATUS) in calls  # declined: handed on as before
    got.clear()

    def taken(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        got.append((subject, reply, data, headers))

    nc = Recorder()
    reader = Reader(nc)  # type: ignore[arg-type]
    reader.raw[7] = taken
    await feed(reader, [WIRE])
    assert got == [(b"_INBOX.x.1", b"", b"", STATUS)]  # taken: not handed on, counted here
    assert not any(c[:2] == ("msg", 7) for c in nc.calls)
    assert nc.stats == {"in_msgs": 1, "in_bytes": 0}
    # a raw handler for a sid no longer subscribed is not called: the message is dropped
    got.clear()
    assert await dispatched(Reader, [WIRE], raw={1: taken}) == [
        c for c in await dispatched(Parser, [WIRE]) if c[:2] != ("msg", 1)
    ]
    assert got == []


class Resetting(Recorder):
    """A client that resets its parser while handling one operation (`on`: a PING or
    message 4), as a reconnect does while the read loop awaits."""

    parser: Parser
    on: str

    async def _process_ping(self) -> None:
        await super()._process_ping()
        if self.on == "ping":
            self.parser.reset()

    async def _process_msg(self, sid: int, subject: Any, reply: Any, data: Any, headers: Any) -> None:
        await super()._process_msg(sid, subject, reply, data, headers)
        if self.on == "msg4" and sid == 4:
            self.parser.reset()


@pytest.mark.asyncio
async def test_a_reset_while_handling_drops_the_rest_of_the_read_as_nats_py_does() -> None:
    """The rest of the read that held the operation is the old connection's: dropped;
    the next read (the new connection's) is parsed from scratch."""
    after = b"MSG t.after 1 2\r\nok\r\n"
    for on, at in (("ping", WIRE.index(b"PING")), ("msg4", WIRE.index(b"MSG t.tricky"))):
        for cuts in ([], [5], [at // 2], [at - 1], [3, 40, at - 2]):
            calls = []
            for make in (Parser, Reader):
                nc = Resetting()
                nc.on, nc.parser = on, make(nc)  # type: ignore[arg-type]
                await feed(nc.parser, [*split(WIRE[:at], cuts), WIRE[at:], after])
                calls.append(nc.calls)
            assert calls[1] == calls[0], (on, cuts)
            assert calls[1][-1] == ("msg", 1, b"t.after", b"", b"ok", None), (on, cuts)
            assert ("msg", 5, b"t.h", b"", b"body", HEADERS) not in calls[1]  # dropped with the read


@pytest.mark.asyncio
async def test_protocol_garbage_is_a_protocol_error_as_in_nats_py() -> None:
    for bad in (
        b"NOPE what\r\n",
        b"MSG t 1\r\n",
        b"MSG t x 3\r\nabc\r\n",
        b"HMSG t 1 2\r\n",
        b"MSG t 1 +2\r\nab\r\n",
        b"MSG t 1 -1\r\n\r\n",
        b"HMSG t 1 -5 2\r\nab\r\n",
    ):
        with pytest.raises(nats.errors.ProtocolError):
            await Reader(Recorder()).parse(bad)  # type: ignore[arg-type]


BLOCKS = [
    b"NATS/1.0\r\n\r\n",
    HEADERS,
    b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n",  # the last one wins
    b"NATS/1.0\r\nNo-Space:value\r\nTabbed:\tv \r\nColon: a:b:c\r\nEmpty:\r\n\r\n",
    b"NATS/1.0\r\nNot a header line\r\nBad Name: x\r\n: nameless\r\nGood: y\r\n\r\n",
    "NATS/1.0\r\nCaf\u00e9: x\r\nUtf: caf\u00e9 \u2603\r\n\r\n".encode(),
    b"NATS/1.0\r\nBroken: \xff\xfe\r\n\r\n",
    b"NATS/1.0\r\nSep\x1cName: x\r\n\r\n",
]


@pytest.mark.asyncio
async def test_header_blocks_read_as_nats_py_reads_them() -> None:
    nc, ours = NATS(), install_reader(NATS())
    for block in BLOCKS:
        assert not has_status(block)
        assert plain_headers(block) == await nc._process_headers(block), block
        assert plain_headers(block) == await nc._process_headers(block), block  # names now cached
        assert await ours._process_headers(block) == await nc._process_headers(block), block
    for block in (
        b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 3\r\nNats-Last-Stream: 7\r\n\r\n",
        b"NATS/1.0 503\r\n\r\n",
        b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\nBad Name: x\r\n\r\n",
    ):  # with a status: read by nats-py's code, its lines by `header_lines` on our connections
        assert await ours._process_headers(block) == await nc._process_headers(block), block
    for block in (STATUS, b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", b"NATS/1.0 404 No Messages\r\n\r\n"):
        assert has_status(block)


@pytest.mark.asyncio
async def test_a_pods_connection_reads_every_message_through_the_reader(nats_server: NatsServer) -> None:
    """Small and large messages (a large one spans many reads), with and without headers
    and replies, reach plain, direct and raw subscriptions intact and in order; a status
    reply (no responders) still raises as nats-py raises it; PubAcks resolve."""
    nc = await connect(nats_server.url, name="reader-test")
    try:
        assert reader_of(nc) is not None
        sizes = [0, 1, 100, 70_000, 5, 900_000, 3]
        plain: list[Any] = []
        direct: list[Any] = []
        raw: list[Any] = []
        done = asyncio.Event()

        def arrived(into: list[Any], item: Any) -> None:
            into.append(item)
            if len(plain) == len(direct) == len(raw) == len(sizes):
                done.set()

        async def cb(msg: Any) -> None:
            arrived(plain, (msg.subject, msg.reply, msg.data, msg.headers))

        await nc.subscribe("plain.>", cb=cb)
        await subscribe_direct(nc, "direct.>", lambda m: arrived(direct, (m.subject, m.reply, m.data, m.headers)))
        await subscribe_raw(nc, "raw.>", lambda *a: arrived(raw, a))
        sent = []
        for i, size in enumerate(sizes):
            data = bytes([65 + i % 26]) * size
            headers = {"Nats-Msg-Id": f"m-{i}", "X": "y z"} if i % 2 else None
            reply = f"r.{i}" if i % 3 else ""
            sent.append((f"plain.{i}", reply, data, headers))
            for prefix in ("plain", "direct", "raw"):
                await nc.publish(f"{prefix}.{i}", data, reply=reply, headers=headers)
        await asyncio.wait_for(done.wait(), 20)
        assert plain == sent
        assert direct == [(f"direct.{s[6:]}", r, d, h) for s, r, d, h in sent]
        assert [(s.decode(), r.decode(), d, h and plain_headers(h)) for s, r, d, h in raw] == [
            (f"raw.{s[6:]}", r, d, h) for s, r, d, h in sent
        ]
        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request("nobody.listens", b"?", timeout=5)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="READ", subjects=["read.>"]))
        acks = await publish_all(js, [(f"read.{i}", b"x" * i, f"read-{i}") for i in range(50)])
        assert [a.seq for a in acks] == list(range(1, 51))
        info = await js.stream_info("READ")
        assert info.state.messages == 50
        assert json.loads((await nc.request("$JS.API.INFO", b"", timeout=5)).data)["type"]
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_status_replies_reach_direct_and_raw_subscriptions_as_nats_py_reads_them(
    nats_server: NatsServer,
) -> None:
    """A pull request on an empty consumer is answered "404 No Messages" on the tool
    actor's direct inbox subscription (read by nats-py's own code, the handler gets its
    Status header); a publish no stream takes is answered 503, which the Publisher's raw
    subscription turns into NoStreamResponseError."""
    nc = await connect(nats_server.url, name="reader-status")
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="PULLED", subjects=["pulled.>"]))
        await js.add_consumer("PULLED", ConsumerConfig(durable_name="w", ack_policy=AckPolicy.EXPLICIT))
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        inbox = nc.new_inbox()
        await subscribe_direct(nc, inbox, lambda m: answered.done() or answered.set_result(m))
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.PULLED.w", b'{"batch": 1, "no_wait": true}', reply=inbox)
        msg = await asyncio.wait_for(answered, 10)
        assert msg.headers is not None and msg.headers["Status"] == "404" and msg.data == b""
        sent = await publisher(nc).publish("nowhere.stored", b"x", {"Nats-Msg-Id": "n-1"})
        with pytest.raises(NoStreamResponseError):
            await asyncio.wait_for(sent, 10)
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_a_connection_made_elsewhere_gets_raw_messages_through_a_msg(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)  # nats-py's own parser
    try:
        assert reader_of(nc) is None
        got: list[Any] = []
        both = asyncio.Event()

        def handler(*a: Any) -> None:
            got.append(a)
            if len(got) == 2:
                both.set()

        await subscribe_raw(nc, "raw.>", handler)
        await nc.publish("raw.a", b"one", reply="back", headers={"K": "v"})
        await nc.publish("raw.b", b"two")
        await asyncio.wait_for(both.wait(), 10)
        assert [(s, r, d) for s, r, d, _ in got] == [(b"raw.a", b"back", b"one"), (b"raw.b", b"", b"two")]
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="ELSE", subjects=["else.>"]))
        (ack,) = await publish_all(js, [("else.a", b"x", "else-1")])
        assert ack.seq == 1
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_raw_handlers_of_ended_subscriptions_do_not_pile_up(nats_server: NatsServer) -> None:
    """A client that watches executions one after another (a subscription each, closed
    after) keeps a bounded table of raw handlers, and a live one still gets its messages."""
    nc = await connect(nats_server.url, name="reader-churn")
    try:
        reader = reader_of(nc)
        assert reader is not None
        got = asyncio.Event()
        await subscribe_raw(nc, "live.x", lambda *a: got.set())
        for i in range(500):
            sub = await subscribe_raw(nc, f"gone.{i}", lambda *a: None)
            await sub.unsubscribe()
            assert len(reader.raw) <= 2 * 2 + 65  # two live subscriptions at most here
        await nc.publish("live.x", b"still here")
        await asyncio.wait_for(got.wait(), 10)
    finally:
        await nc.close()
