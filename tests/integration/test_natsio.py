"""natsio.fast.send writes what Client.publish would: same subject, reply, headers and
payload on the wire; anything unusual goes through Client.publish (and its errors).
Publisher.send re-sends a publish whose PubAck was lost only while the stream would
drop the copy. A command's answer is found by its command id where results share a
subject."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import nats.errors
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import KeyWrongLastSequenceError

from actors.natsio import (
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    command_sent,
    is_answered,
    publishing,
    subject_taken,
    verdict_sent,
)
from actors.natsio.batchget import on_subject
from actors.natsio.fast import ack, send, send_nowait
from actors.natsio.kvput import put_if_last
from actors.wire.messages import CallDone, Command, IteratorCompleted, LoopSpec, command_of_answer, encode
from streams.layout import EXEC_STREAM, ensure
from streams.server import NatsServer
from streams.subjects import ITERATOR
from tests.conftest import make_layout
from tests.support.natsio import received

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_send_matches_client_publish(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        cases: list[dict[str, Any]] = [
            dict(subject="t.a", payload=b"plain"),
            dict(subject="t.b", payload=b"with reply", reply="r.1"),
            dict(subject="t.c", payload=b"", reply="r.2", headers={"Nats-Msg-Id": "e1:cmd:0-1x3-1"}),
            dict(
                subject="t.d",
                payload=b'{"x": 1}',
                headers={"Nats-Msg-Id": "id", "Nats-Schedule": "@at 2026-01-01T00:00:00.000Z"},
            ),
        ]
        done, got = await received(nc, 2 * len(cases))
        for c in cases:
            await nc.publish(c["subject"], c["payload"], reply=c.get("reply", ""), headers=c.get("headers"))
            await send(nc, c["subject"], c["payload"], reply=c.get("reply", ""), headers=c.get("headers"))
        await asyncio.wait_for(done.wait(), 10)
        pairs = [(got[2 * i], got[2 * i + 1]) for i in range(len(cases))]
        for a, b in pairs:
            assert (a.subject, a.reply, a.data, a.headers) == (b.subject, b.reply, b.data, b.headers)
        assert [p[1].headers for p in pairs] == [None, None, *[c["headers"] for c in cases[2:]]]
        with pytest.raises(nats.errors.BadSubjectError):  # handed to Client.publish, which refuses it
            await send(nc, "t.bad subject", b"x")
    finally:
        await nc.close()


async def test_ack_is_a_plain_publish_to_the_reply_subject(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        done, got = await received(nc, 1)
        sub = await nc.subscribe("q.in")
        await nc.publish("q.in", b"job", reply="t.ack")
        msg = await sub.next_msg(timeout=5)
        await ack(msg)
        await asyncio.wait_for(done.wait(), 10)
        assert got[0].subject == "t.ack" and got[0].data == b""
        with pytest.raises(nats.errors.MsgAlreadyAckdError):
            await ack(msg)  # as msg.ack() would
    finally:
        await nc.close()


async def test_a_publish_expecting_an_empty_subject_is_stored_once(nats_server: NatsServer) -> None:
    """The starter's one execution per id: a second record on the subject is refused
    (`subject_taken`), whatever its message id, within the duplicate window or past it."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="ONCE", subjects=["once.>"]))
        only = [{EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}]
        await publishing.publish_all(js, [("once.a", b"1", "id-1")], headers=only)
        with pytest.raises(Exception) as refused:
            await publishing.publish_all(js, [("once.a", b"2", "id-2")], headers=only)
        assert subject_taken(refused.value)
        with pytest.raises(Exception) as again:  # the same id too: the server checks the subject first
            await publishing.publish_all(js, [("once.a", b"1", "id-1")], headers=only)
        assert subject_taken(again.value)
        (other,) = await publishing.publish_all(js, [("once.b", b"3", "id-3")], headers=only)
        assert not other.duplicate
        assert (await js.get_last_msg("ONCE", "once.a")).data == b"1"
        assert not subject_taken(RuntimeError("no"))
    finally:
        await nc.close()


def _lose_first_puback(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first publish's PubAck goes to an inbox nobody listens on (what Publisher
    calls per publish, `send_nowait`, patched); returns the list that holds that
    publish's real reply subject once the fault was injected."""
    real_send, lost = send_nowait, []

    def lose_first_puback(
        nc: Any, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> Any:
        if not lost:
            lost.append(reply)
            reply = "_INBOX.nobody.listens"
        return real_send(nc, subject, payload, reply, headers)

    monkeypatch.setattr(publishing, "send_nowait", lose_first_puback)
    return lost


@pytest.mark.parametrize("window", [120.0, 0.2])
async def test_a_publish_whose_puback_was_lost_is_stored_once(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch, window: float
) -> None:
    """The stream stores a message and its PubAck is lost. Within the duplicate window
    `send` sends it again and the stream drops the copy (PubAck duplicate=True); past
    it `send` raises PublishOutcomeUnknown instead of storing a second copy."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="LOST", subjects=["lost.>"], duplicate_window=window))
        lost = _lose_first_puback(monkeypatch)
        pub = publishing.Publisher(nc, timeout=0.3, duplicate_window=window)
        message = ("lost.a", b"x", {publishing.MSG_ID: "a-1"})
        if window > 1:
            (ack,) = await pub.send([message])
            assert ack.duplicate and ack.seq == 1
        else:
            with pytest.raises(publishing.PublishOutcomeUnknown, match=r"lost\.a"):
                await pub.send([message])
        assert lost, "the fault was not injected"
        assert (await js.stream_info("LOST")).state.messages == 1
    finally:
        await nc.close()


async def test_a_publish_refused_for_its_own_copy_whose_puback_was_lost_says_so(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish stored only on an empty subject (`EXPECTED_LAST_SUBJECT_SEQUENCE` 0),
    its PubAck lost: sent again, the stream refuses it (the check comes before the
    duplicate window's), and the error says a try of it may be what is stored
    (`resent_after_lost_puback`), which a refusal on the first try does not."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="LOSTONCE", subjects=["lostonce.>"]))
        lost = _lose_first_puback(monkeypatch)
        pub = publishing.Publisher(nc, timeout=0.3)
        headers = {publishing.MSG_ID: "a-1", EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
        with pytest.raises(Exception) as refused:
            await pub.send([("lostonce.a", b"x", headers)])
        assert subject_taken(refused.value) and publishing.resent_after_lost_puback(refused.value)
        with pytest.raises(Exception) as again:
            await pub.send([("lostonce.a", b"x", {**headers, publishing.MSG_ID: "a-2"})])
        assert subject_taken(again.value) and not publishing.resent_after_lost_puback(again.value)
        assert lost and (await js.stream_info("LOSTONCE")).state.messages == 1
    finally:
        await nc.close()


async def test_a_compare_and_set_write_stores_only_on_the_revision_it_names(nats_server: NatsServer) -> None:
    """`put_if_last`: stored when the key's last revision is `last` (0: no message yet),
    refused with nats-py's KeyWrongLastSequenceError otherwise, storing nothing."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="cas", history=1)
        first = await put_if_last(js, "cas", "k", b"one", last=0)
        with pytest.raises(KeyWrongLastSequenceError):
            await put_if_last(js, "cas", "k", b"again", last=0)
        with pytest.raises(KeyWrongLastSequenceError):
            await put_if_last(js, "cas", "k", b"stale", last=first + 1)
        second = await put_if_last(js, "cas", "k", b"two", last=first)
        entry = await kv.get("k")
        assert (entry.value, entry.revision) == (b"two", second) and second > first
    finally:
        await nc.close()


async def test_a_command_is_answered_only_by_a_result_naming_it(nats_server: NatsServer) -> None:
    """`is_answered` and a replay's `command_sent`: on the subject every result of an
    execution of semantics 4 shares (`in.result`) only a result naming the command
    answers it (another step's, or a message that names none, does not); on a subject
    per command (older executions) whatever is there does."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        layout = make_layout()
        await ensure(js, layout)
        shared, older = layout.execution("e-new"), layout.execution("e-old")

        def done(eid: str, command_id: str) -> bytes:
            return encode(CallDone(execution_id=eid, command_id=command_id, step="s", attempt_number=1, result=1))

        await publishing.publish_all(
            js,
            [
                (shared.results, done("e-new", "1-1"), "r1"),
                (shared.results, b"not a result", "junk"),
                (shared.results, done("e-new", "2-1"), "r2"),
                (older.result("1-1"), done("e-old", "1-1"), "o1"),
            ],
        )

        def command(command_id: str, *, eid: str = "e-new") -> Command:
            subjects = shared if eid == "e-new" else older
            return Command(
                execution_id=eid,
                command_id=command_id,
                step="s",
                kind="python",
                reply_to=subjects.result(command_id),
                answer_on=shared.results if eid == "e-new" else None,
                attempt_number=1,
            )

        assert [await is_answered(nc, EXEC_STREAM, command(c)) for c in ("1-1", "2-1", "3-1")] == [True, True, False]
        assert await is_answered(nc, EXEC_STREAM, command("1-1", eid="e-old"))
        assert not await is_answered(nc, EXEC_STREAM, command("2-1", eid="e-old"))
        # an older tool pod answers a command of semantics 4 on the command's own subject
        await publishing.publish_all(js, [(shared.result("4-1"), done("e-new", "4-1"), "r4")])
        assert await is_answered(nc, EXEC_STREAM, command("4-1"))
        # something that is not a result, naming a command, answers nothing
        forged = b'{"type":"signal.sent","command_id":"5-1"}'
        await publishing.publish_all(js, [(shared.results, forged, "f5")])
        assert not await is_answered(nc, EXEC_STREAM, command("5-1"))
        # an answer is looked for after the record that held the command: one before it is not its
        r2 = next(
            m.seq for m in await on_subject(nc, EXEC_STREAM, shared.results) if command_of_answer(m.data) == "2-1"
        )
        assert await is_answered(nc, EXEC_STREAM, command("2-1"), after=r2 - 1)
        assert not await is_answered(nc, EXEC_STREAM, command("2-1"), after=r2)

        assert await command_sent(nc, command("2-1"), set(), reply_stream=EXEC_STREAM)
        assert not await command_sent(nc, command("3-1"), set(), reply_stream=EXEC_STREAM)
        assert await command_sent(nc, command("3-1"), {"3-1"}, reply_stream=EXEC_STREAM)  # read with the log
    finally:
        await nc.close()


async def test_a_loop_verdict_is_found_only_by_one_naming_its_loop(nats_server: NatsServer) -> None:
    """`verdict_sent` (a counter's replay: is this loop's end in the execution's log?): on
    the execution's one subject for every loop's verdict (semantics 4) only a verdict
    naming the loop counts; on the loop's own subject (an older counter's) any does."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        layout = make_layout()
        await ensure(js, layout)
        ex = layout.execution("e-loops")
        shared = ex.input(ITERATOR)

        def verdict(loop_id: str) -> bytes:
            done = IteratorCompleted(execution_id="e-loops", loop_id=loop_id, step="s", total=1, succeeded=1, failed=0)
            return encode(done)

        def spec(loop_id: str) -> LoopSpec:
            return LoopSpec(
                execution_id="e-loops",
                loop_id=loop_id,
                step="s",
                playbook_path="p",
                playbook_source="",
                reply_to=ex.iterator(loop_id),
                answer_on=shared,
            )

        forged = b'{"type":"call.done","loop_id":"3-1"}'
        await publishing.publish_all(
            js,
            [
                (shared, verdict("1-1"), "v1"),
                (shared, forged, "f3"),
                (ex.iterator("2-1"), verdict("2-1"), "v2"),  # an older counter's
            ],
        )
        assert [await verdict_sent(nc, EXEC_STREAM, spec(loop)) for loop in ("1-1", "2-1", "3-1")] == [
            True,
            True,
            False,
        ]
    finally:
        await nc.close()
