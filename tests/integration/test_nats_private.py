"""The nats-py internals that actors/natsio/private.py uses are still there, of the
types it expects, and still behave as it expects, against a real nats-server: a
buffered publish reaches the stream without a flush, the flusher is kicked once per
batch and forced past the pending limit, an ack marks the message acked and a second
ack sends nothing, and the publisher kept on a connection is that connection's own.
When an upgrade of nats-py breaks one of these, this fails before the actors do. And
no module of actors/ or streams/ but that one door touches a private name of nats-py.
These are tests of the fast path: they run with it on whatever ACTORS_NATS_FASTPATH
says (tests/system/test_fastpath_off.py tests the switch)."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, StreamConfig
from nats.protocol.parser import Parser

from actors.natsio import private
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.fast import ack, send
from actors.natsio.publishing import MSG_ID, publish_all, publisher
from actors.natsio.reader import Reader, install_reader, reader_of
from actors.pod.roles import connect
from streams.server import NatsServer
from tests.conftest import wait_for
from tests.support.natsio import received

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

ROOT = Path(__file__).resolve().parents[2]
DOOR = Path("actors/natsio/private.py")  # the one module allowed nats-py's private names


@pytest.fixture(autouse=True)
def fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(private, "FASTPATH", True)


def nats_private_names() -> set[str]:
    """Every private name nats-py's own code uses on an object (`x._name`) or defines
    (`def _name`): what a module outside the door must not touch."""
    names: set[str] = set()
    for path in Path(nats.__file__).resolve().parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            else:
                continue
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return names


def private_uses(source: str, names: set[str]) -> list[str]:
    """Where `source` reaches into nats-py: an attribute in `names` read or written on
    anything but the object's own class (`self`, `cls`, or one `cls(...)` just made);
    `getattr`/`hasattr`/`delattr` of a name in `names`; `setattr` of any private name
    on another object (an attribute of our own set on a client); or an import of
    nats-py's parser. A name given as a module constant (`_ATTR = "_x"`) is resolved."""
    found: list[str] = []
    tree = ast.parse(source)
    own: set[str] = {"self", "cls"}
    constants: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            constants |= {t.id: stmt.value.value for t in stmt.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        # `watch = cls(...)`: an instance of the class being defined, as `self` is
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id == "cls":
                own |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    def foreign(target: ast.expr) -> bool:
        return not (isinstance(target, ast.Name) and target.id in own)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names and foreign(node.value):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            arg = node.args[1]
            name = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
            if not isinstance(name, str) or not foreign(node.args[0]):
                continue
            private_name = name.startswith("_") and not name.startswith("__")
            if (node.func.id in ("getattr", "hasattr", "delattr") and name in names) or (
                node.func.id == "setattr" and private_name
            ):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nats.protocol"):
            found.append(f"{node.lineno}: from {node.module} import ...")
    return found


async def test_the_scan_finds_each_way_of_reaching_into_nats_py() -> None:
    names = nats_private_names()
    assert {"_pending", "_ackd", "_id", "_nc", "_ps", "_process_msg", "_pending_queue"} <= names
    reaching = (
        "nc._pending.append(b'x')\n"
        "sub._id\n"
        "_ATTR = '_actors_codec'\n"
        "setattr(nc, _ATTR, c)\n"
        "getattr(nc, '_pending_data_size', 0)\n"
        "msg._ackd = True\n"
        "from nats.protocol.parser import Parser\n"
    )
    assert len(private_uses(reaching, names)) == 6
    own = "class W:\n    def f(self):\n        self._pending = 1\n    @classmethod\n    def g(cls):\n"
    own += "        w = cls()\n        w._sub = None\n        return w\n"
    own += "getattr(task, '_fut_waiter', None)\n"  # another library's private name: not ours to police
    assert private_uses(own, names) == []


async def test_only_the_door_touches_nats_py_private_names() -> None:
    """Every use of nats-py's internals is behind actors/natsio/private.py: a module
    elsewhere that reads `nc._something`, `sub._id`, `msg._ackd`, `js._nc`, sets an
    attribute of its own on a client or imports nats-py's parser fails here, naming
    the line."""
    names = nats_private_names()
    offenders = []
    for top in ("actors", "streams"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == DOOR:
                continue
            offenders += [f"{rel}:{where}" for where in private_uses(path.read_text(), names)]
    assert offenders == [], "nats-py internals outside actors/natsio/private.py:\n" + "\n".join(offenders)


async def test_the_readers_internals_exist() -> None:
    """actors/natsio/reader.py: the client's read loop calls the parser it finds in
    `_ps` for each chunk; the parser keeps a `buf` the client's `reset` empties; the
    client's handlers the reader calls are still coroutines."""
    nc = NATS()
    assert isinstance(nc._ps, Parser) and nc._ps.nc is nc
    assert "self._ps.parse(" in inspect.getsource(NATS._read_loop)
    assert isinstance(nc._ps.buf, bytearray) and callable(nc._ps.reset)
    assert isinstance(nc._subs, dict) and {"in_msgs", "in_bytes"} <= set(nc.stats)
    for name in ("_process_msg", "_process_err", "_process_ping", "_process_pong", "_process_info", "_process_headers"):
        assert inspect.iscoroutinefunction(getattr(nc, name)), name
    assert "self._parse_header_lines(" in inspect.getsource(NATS._process_headers)
    assert install_reader(nc) is nc and isinstance(nc._ps, Reader)
    # nats-py reads header blocks with fast_mail_parser when it is installed; the
    # reader's `plain_headers` follows the other way it has
    import nats.aio.client

    assert nats.aio.client.parse_email is None


async def test_client_internals_exist_with_their_types(nats_server: NatsServer) -> None:
    assert private.DIRECT_WRITE, "a private name of Client is gone: every publish takes the slow path"
    nc = await nats.connect(nats_server.url)
    try:
        assert type(nc._status) is int and nc._status == NATS.CONNECTED
        assert type(nc._max_payload) is int and nc._max_payload == nc.max_payload > 0
        assert type(nc._pending) is list
        assert type(nc._pending_data_size) is int
        assert type(nc._max_pending_size) is int and nc._max_pending_size > 0
        assert isinstance(nc._flush_queue, asyncio.Queue)
        assert inspect.iscoroutinefunction(nc._flush_pending)
        assert {"out_msgs", "out_bytes", "reconnects"} <= set(nc.stats)
        assert private.can_write_directly(nc, nc._max_payload)
        assert not private.can_write_directly(nc, nc._max_payload + 1)
        assert private.connection_of(nc.jetstream()) is nc
    finally:
        await nc.close()
    assert nc._status == NATS.CLOSED and not private.can_write_directly(nc, 0)


async def test_a_buffered_publish_is_stored_without_a_flush(nats_server: NatsServer) -> None:
    """What `fast.send` appends to the buffer is counted, flushed by the client's own
    flusher (nobody calls flush) and stored by the stream with its headers."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="FAST", subjects=["fast.>"]))
        out_msgs, out_bytes = nc.stats["out_msgs"], nc.stats["out_bytes"]
        (puback,) = await publish_all(js, [("fast.a", b"payload", "fast-1")])
        assert nc.stats["out_msgs"] >= out_msgs + 1 and nc.stats["out_bytes"] >= out_bytes + len(b"payload")
        stored = await js.get_msg("FAST", puback.seq)
        assert (stored.subject, stored.data) == ("fast.a", b"payload")
        assert stored.headers is not None and stored.headers[MSG_ID] == "fast-1"
        assert nc._pending == [] and nc._pending_data_size == 0  # the flusher emptied what we appended
    finally:
        await nc.close()


async def test_the_flusher_is_kicked_once_per_batch(nats_server: NatsServer) -> None:
    """The first command into an idle buffer kicks the flusher (a future on its queue,
    no coroutine to await); one queued behind it needs no kick; both reach the server."""
    nc = await nats.connect(nats_server.url)
    try:
        done, got = await received(nc, 2, "kick.>")
        await nc.flush()  # the subscription's own kick is served: the buffer is idle
        assert nc._flush_queue is not None and nc._flush_queue.empty()
        assert private.buffer_publish(nc, b"PUB kick.a 1\r\na\r\n", 1) is None
        assert nc._flush_queue.qsize() == 1  # kicked; the flusher has not run yet
        assert private.buffer_publish(nc, b"PUB kick.b 1\r\nb\r\n", 1) is None
        assert nc._flush_queue.qsize() == 1  # one kick for both
        await asyncio.wait_for(done.wait(), 10)
        assert [(m.subject, m.data) for m in got] == [("kick.a", b"a"), ("kick.b", b"b")]
    finally:
        await nc.close()


async def test_past_the_pending_limit_the_flush_is_forced(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url, pending_size=64)
    try:
        assert nc._max_pending_size == 64
        done, got = await received(nc, 1, "big.>")
        await send(nc, "big.a", b"x" * 100)
        await asyncio.wait_for(done.wait(), 10)
        assert got[0].data == b"x" * 100
        assert nc._pending_data_size == 0  # flushed before send returned
    finally:
        await nc.close()


async def test_what_may_not_be_buffered_goes_through_client_publish(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        with pytest.raises(nats.errors.MaxPayloadError):
            await send(nc, "t.big", b"x" * (nc._max_payload + 1))
    finally:
        await nc.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await send(nc, "t.closed", b"x")


async def test_an_ack_marks_the_message_and_a_second_ack_sends_nothing(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="WORK", subjects=["work.>"]))
        await js.publish("work.a", b"job")
        sub = await js.pull_subscribe("work.>", durable="w", config=ConsumerConfig(ack_wait=30))
        (msg,) = await sub.fetch(1, timeout=5)
        assert msg._ackd is False and msg._client is nc
        assert private.ack_connection(msg) is nc
        await nc.flush()  # nothing buffered
        assert nc._flush_queue is not None and nc._flush_queue.empty()
        await ack(msg)
        assert msg._ackd is True and msg.is_acked
        assert private.ack_connection(msg) is None
        # lazy: in the buffer, the flusher not kicked; it leaves within LAZY_FLUSH all the same
        assert nc._pending and nc._flush_queue.empty()

        async def acked() -> bool:
            return (await js.consumer_info("WORK", "w")).num_ack_pending == 0

        await wait_for(acked)
        sent = nc.stats["out_msgs"]
        with pytest.raises(nats.errors.MsgAlreadyAckdError):
            await ack(msg)
        assert nc.stats["out_msgs"] == sent
        core = await nc.subscribe("plain")
        await nc.publish("plain", b"no reply")
        plain = await core.next_msg(timeout=5)
        assert private.ack_connection(plain) is None
        with pytest.raises(nats.errors.NotJSMessageError):
            await ack(plain)  # as msg.ack() raises
    finally:
        await nc.close()


async def test_a_delivered_message_carries_what_its_host_tagged_it_with(nats_server: NatsServer) -> None:
    """actors/runtime/gaps.py marks each delivery on the message itself: nats-py's Msg
    must keep taking attributes of ours (no `__slots__`)."""
    nc = await connect(nats_server.url)
    try:
        sub = await nc.subscribe("tagged")
        await nc.publish("tagged", b"x")
        msg = await sub.next_msg(timeout=5)
        assert private.message_tag(msg, "_actors_test") is None
        private.tag_message(msg, "_actors_test", 7)
        assert private.message_tag(msg, "_actors_test") == 7
    finally:
        await nc.close()


async def test_a_connection_keeps_its_own_publisher(nats_server: NatsServer) -> None:
    a = await nats.connect(nats_server.url)
    b = await nats.connect(nats_server.url)
    try:
        assert publisher(a) is publisher(a) and publisher(a).nc is a
        assert publisher(b) is not publisher(a) and publisher(b).nc is b
        js = a.jetstream()
        await js.add_stream(StreamConfig(name="OWN", subjects=["own.>"]))
        kept = publisher(a)
        await publish_all(js, [("own.a", b"x", "own-1")])
        assert publisher(private.connection_of(js)) is kept
        assert kept._sub is not None  # publish_all went through the connection's publisher
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("reader", [True, False], ids=["actors-reader", "nats-py-parser"])
async def test_a_direct_subscription_hands_each_message_over_as_read_in_order(
    nats_server: NatsServer, reader: bool
) -> None:
    """`subscribe_direct`: the handler sees every message in order, in the read loop (no
    task of the subscription's); the subscription counts nothing as pending, so no
    slow-consumer limit is ever reached; a handler that raises costs that message only,
    not the connection; after unsubscribe nothing more arrives. Through the actors'
    reader (`connect`) and through nats-py's own parser (`nats.connect`) alike."""
    nc = await (connect(nats_server.url) if reader else nats.connect(nats_server.url))
    assert (reader_of(nc) is not None) == reader
    try:
        got: list[bytes] = []
        done = asyncio.Event()
        n = 2_000

        def handler(msg: Any) -> None:
            got.append(msg.data)
            if msg.data == b"boom":
                raise RuntimeError("a bug in a handler")
            if len(got) == n + 1:
                done.set()

        sub = await subscribe_direct(nc, "direct.>", handler)
        assert sub._wait_for_msgs_task is None  # nats-py made no task for it
        await nc.publish("direct.x", b"boom")
        for i in range(n):
            await nc.publish(f"direct.{i % 7}", str(i).encode())
        await asyncio.wait_for(done.wait(), 10)
        assert got == [b"boom", *(str(i).encode() for i in range(n))]
        assert sub.pending_msgs == 0 and sub._pending_size == 0
        assert nc.is_connected
        await sub.unsubscribe()
        await nc.publish("direct.after", b"late")
        await private.flush(nc)
        assert got[-1] == str(n - 1).encode()
    finally:
        await nc.close()


async def test_flush_returns_after_the_server_has_seen_what_was_sent_before_it(nats_server: NatsServer) -> None:
    """`private.flush` after a subscribe: a request from another connection finds the
    responder every time. nats-py 2.16's own `flush` sends its PING ahead of a SUB still
    in the buffer, and some of these requests (one in fourteen in a plain script, fewer
    under pytest) drew "no responders"."""
    responders = await nats.connect(nats_server.url)
    requests = await nats.connect(nats_server.url)

    async def answer(msg: Any) -> None:
        await msg.respond(b"here")

    try:
        for i in range(1000):
            await responders.subscribe(f"flushed.{i}", cb=answer)
            await private.flush(responders)
            assert await requests.request(f"flushed.{i}", b"", timeout=10) is not None
    finally:
        await requests.close()
        await responders.close()
