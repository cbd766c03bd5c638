"""Semantics 5 and 6, pure: an execution's log where results are stored with the decision
they led to (answer records, `exec.<p>.<id>.in.answer...`) replays with no mismatch
to the state the live folds reached, the answer folded with the record's cause (minus
the sequence of the input it followed) and time; and what users read of such a
record (`log_items`) is the result, then the decision's events. No NATS."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import msgspec
import pytest

from actors.client.logview import log_items
from actors.core.decide import fold
from actors.core.replay import LogRecord, answer_records, lifecycle_records, replay_execution
from actors.core.state import Execution
from actors.engine.actor import one_message_only
from actors.runtime.outbox import carrier_message, holdable
from actors.wire.codec import CLEAR
from actors.wire.events import DecisionRecord, answer_decoder, decision_decoder, event_decoder, extras_decoder
from actors.wire.messages import CallDone, Limits, StartRecord, encode, input_decoder
from streams.subjects import ExecSubjects
from tests.support.playbooks import THREE_STEPS

pytestmark = [pytest.mark.timeout(30)]


def _run() -> tuple[Execution, list[LogRecord], list[tuple[str, bytes]]]:
    """The three steps as a semantics 5 engine stores them: the start, then each
    result as an answer record: the first two's decisions issue the next command,
    nothing else (`in.answer.cmd.python`); the last's ends the execution, a lifecycle
    carrier holding it (`in.answer.lc.playbook.completed`). Returns the live state, the
    log as a reader turns it into records, and the stored answer records."""
    eid = "e1"
    subjects = ExecSubjects.of(eid, 1)
    live = Execution(execution_id=eid)
    start = StartRecord(
        execution_id=eid,
        playbook_path="pb",
        playbook_source=THREE_STEPS,
        payload={},
        limits=Limits(),
        semantics=5,  # the start stays plain (semantics 6 stores it with its first decision: below)
    )
    log: list[LogRecord] = [LogRecord(1, subjects.start, 10.0, "in", start)]
    fx = fold(live, start, seq=1, at=10.0, subjects=subjects)
    record = DecisionRecord(cause=1, events=fx.events)
    log.append(LogRecord(2, subjects.decision, 10.0, "ev", decision_decoder.decode(msgspec.json.encode(record))))
    for ev in fx.lifecycle:
        stored = event_decoder.decode(msgspec.json.encode(ev))
        log += lifecycle_records(2, subjects.lifecycle(ev.type), 10.0, stored, extras_decoder.decode(b"{}"))
    (cmd,) = fx.commands
    assert cmd.ask_on == "answer.0"
    last_input, seq, stored_answers = 1, 2, []
    for n, value in enumerate((1, 2, 3)):
        seq += 1
        at = 20.0 + n
        done = CallDone(execution_id=eid, command_id=cmd.command_id, step=cmd.step, attempt_number=1, result=value)
        data = encode(done)
        if n < 2:  # stored with its decision
            fx = fold(live, done, seq=-last_input, at=at, subjects=subjects)
            assert not fx.lifecycle and len(fx.commands) == 1 and fx.events
            x = DecisionRecord(
                cause=-last_input, events=fx.events, command=holdable(CLEAR, fx), answer=msgspec.Raw(data), at=at
            )
            subject = subjects.answer_record(fx.commands[0].kind)
            raw = msgspec.json.encode(x)
            stored_answers.append((subject, raw))
            back = decision_decoder.decode(raw)
            assert back.answer is not None
            log += answer_records(seq, subject, back, input_decoder.decode(bytes(back.answer)))
            (cmd,) = fx.commands
        else:  # the last: its decision ends the execution (lifecycle events, no command)
            fx = fold(live, done, seq=-last_input, at=at, subjects=subjects)
            assert fx.lifecycle and not fx.commands and one_message_only(fx, 5) is None
            x = DecisionRecord(cause=-last_input, events=fx.events, answer=msgspec.Raw(data), at=at)
            type_, raw = carrier_message(CLEAR, fx.lifecycle, x)
            subject = subjects.answer_lifecycle(type_)
            assert subject == "exec.0.e1.in.answer.lc.playbook.completed"
            stored_answers.append((subject, raw))
            whole = answer_decoder.decode(raw)
            assert whole.record.answer is not None and whole.lifecycle
            log += answer_records(
                seq, subject, whole.record, input_decoder.decode(bytes(whole.record.answer)), whole.lifecycle
            )
        last_input = seq
    return live, log, stored_answers


def _plain(ex: Execution) -> Any:
    return msgspec.to_builtins(ex)


def test_a_log_with_answer_records_replays_to_the_same_state() -> None:
    live, log, _ = _run()
    assert live.status == "COMPLETED"
    replay = replay_execution("e1", log, subjects=ExecSubjects.of("e1", 1))
    assert replay.mismatch is None, replay.mismatch.describe()
    assert _plain(replay.state) == _plain(live)
    # the answers were folded with the records' causes
    assert [seq for seq, _ in replay.outputs] == [1, -1, -3, -4]


def test_a_record_whose_events_differ_from_the_fold_is_a_mismatch() -> None:
    _, log, _ = _run()
    at = next(i for i, r in enumerate(log) if r.cls == "ev" and r.value.answer is not None)
    changed = msgspec.structs.replace(log[at].value, events=[])
    log[at] = LogRecord(log[at].seq, log[at].subject, log[at].at, "ev", changed)
    replay = replay_execution("e1", log, subjects=ExecSubjects.of("e1", 1))
    # checked at the record's cause (-1), named by the record's own stream seq
    assert replay.mismatch is not None and replay.mismatch.input_seq == log[at].seq


def test_log_items_show_an_answer_record_as_its_result_then_its_events() -> None:
    _, _, stored = _run()
    subject, data = stored[0]
    items = log_items(subject, data, 3, 20.0)
    assert items[0].cls == "in" and items[0].type == "call.done" and items[0].step == "a"
    assert items[0].data["result"] == 1
    assert [i.cls for i in items[1:]] == ["ev"] * (len(items) - 1) and len(items) > 1
    assert "step.exit" in [i.type for i in items[1:]]


def test_log_items_show_the_last_answer_record_as_its_result_its_events_then_the_end() -> None:
    _, _, stored = _run()
    subject, data = stored[-1]
    items = log_items(subject, data, 5, 22.0)
    classes = [i.cls for i in items]
    assert classes[0] == "in" and items[0].type == "call.done" and items[0].data["result"] == 3
    assert set(classes[1 : classes.index("lc")]) == {"ev"}
    assert items[-1].cls == "lc" and items[-1].type == "playbook.completed"
    assert items[-1].data["result"] == {"c": 3}


def test_a_changed_end_in_the_last_answer_record_is_a_mismatch() -> None:
    _, log, _ = _run()
    at = next(i for i, r in enumerate(log) if r.cls == "lc" and r.value.type == "playbook.completed")
    ev = log[at].value
    changed = msgspec.structs.replace(ev, data=msgspec.structs.replace(ev.data, result={"c": 4}))
    log[at] = LogRecord(log[at].seq, log[at].subject, log[at].at, "lc", changed)
    replay = replay_execution("e1", log, subjects=ExecSubjects.of("e1", 1))
    assert replay.mismatch is not None and replay.mismatch.input_seq == log[at].seq


def test_an_input_with_no_decision_before_an_answer_record_is_a_gap() -> None:
    """The gap check (`Recorded.last_decided`): an answer record's cause is negative,
    so the input it is (its own stream seq) is the last decided, and an input before it
    whose decision the log lacks is reported, not passed over."""
    _, log, _ = _run()
    # the first answer record (seq 3) held the decision of a's result: stored plain
    # instead (at seq 3, no record), the record at seq 4 is decided after it
    first = next(i for i, r in enumerate(log) if r.cls == "in" and r.cause is not None)
    plain = log[first]
    gap = [LogRecord(plain.seq, ExecSubjects.of("e1", 1).results, plain.at, "in", plain.value)]
    log = log[:first] + gap + log[first + 2 :]
    replay = replay_execution("e1", log, subjects=ExecSubjects.of("e1", 1))
    assert replay.mismatch is not None and replay.mismatch.input_seq == 3
    assert "no decision for this input" in replay.mismatch.expected


def _started() -> tuple[Execution, Any]:
    eid = "e1"
    live = Execution(execution_id=eid)
    start = StartRecord(
        execution_id=eid,
        playbook_path="pb",
        playbook_source=THREE_STEPS,
        payload={},
        limits=Limits(),
        semantics=5,
    )
    (cmd,) = fold(live, start, seq=1, at=10.0, subjects=ExecSubjects.of(eid, 1)).commands
    return live, cmd


def test_an_ask_for_a_command_not_in_flight_is_refused_before_the_fold() -> None:
    """A duplicate or late result would decide nothing: refused before folding (a
    refusal after the fold costs the actor a replay)."""
    import asyncio
    from types import SimpleNamespace

    from actors.engine.actor import _not_ready

    live, cmd = _started()
    actor: Any = SimpleNamespace(
        hydrated=True,
        halted=None,
        mailbox=asyncio.Queue(),
        turn=asyncio.Lock(),
        waiting=False,
        state=live,
        trace=None,
        last_seq=1,
    )
    done = CallDone(execution_id="e1", command_id=cmd.command_id, step=cmd.step, attempt_number=1, result=1)
    assert _not_ready(actor, done) is None
    late = msgspec.structs.replace(done, command_id=cmd.command_id + "-superseded")
    assert _not_ready(actor, late) == "the result's command is not in flight"


def test_the_misfits_remembered_are_bounded_most_recent_kept() -> None:
    from collections import OrderedDict
    from types import SimpleNamespace

    from actors.engine.actor import MISFITS_REMEMBERED, Engine, misfit_key

    live, _ = _started()
    engine: Any = SimpleNamespace(misfits=OrderedDict())
    first = misfit_key(live, "a")
    Engine.misfit(engine, first)
    for n in range(MISFITS_REMEMBERED):
        Engine.misfit(engine, misfit_key(live, f"s{n}"))
    assert len(engine.misfits) == MISFITS_REMEMBERED and first not in engine.misfits
    # another version of the playbook (another source) is another key
    assert misfit_key(live, "a") != (live.playbook_path, hash(live.playbook_source + " "), "a")


# --- round 3: what a hostile review found --------------------------------------------


class _Bare:
    """A stand-in for an engine, an actor or a connection: attributes only."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def _ready_actor(live: Execution, **more: Any) -> Any:
    import asyncio

    return _Bare(
        hydrated=True,
        halted=None,
        mailbox=asyncio.Queue(),
        turn=asyncio.Lock(),
        waiting=False,
        state=live,
        trace=None,
        last_seq=1,
        busy=False,
        **more,
    )


@pytest.mark.asyncio
async def test_hostile_and_late_asks_are_refused_before_any_fold() -> None:
    """Garbage, a wrong execution id, a huge body, a result for a command not in
    flight: each refused before the fold; the actor is never handed the result (no
    `store_answer`, so no `reset`, no replay)."""
    from actors.engine.actor import Engine

    live, cmd = _started()
    handed: list[object] = []

    async def store_answer(data: bytes, inp: Any) -> str:
        handed.append(inp)
        return "stored"

    actor = _ready_actor(live, store_answer=store_answer, reset=lambda: handed.append("reset"))
    engine: Any = _Bare(js=_Bare(), actors={"e1": actor}, misfits={})
    done = CallDone(execution_id="e1", command_id=cmd.command_id, step=cmd.step, attempt_number=1, result=1)
    asks = {
        "garbage": b"\xff{not json",
        "not a result": encode(msgspec.structs.replace(done, execution_id="e1")).replace(b"call.done", b"signal"),
        "another execution": encode(msgspec.structs.replace(done, execution_id="e2")),
        "huge": b"[" * 200_000 + b"]" * 200_000,
        "late": encode(msgspec.structs.replace(done, command_id=cmd.command_id + "-superseded")),
    }
    for what, data in asks.items():
        said, folded = await Engine._ask(engine, data)
        assert said.startswith("refused: ") and not folded, (what, said)
    assert handed == []
    said, folded = await Engine._ask(engine, encode(done))  # the one in flight: handed over
    assert (said, folded) == ("stored", True) and handed == [done]


@pytest.mark.asyncio
async def test_asks_beyond_those_in_flight_are_refused_at_once() -> None:
    from actors.engine.actor import ASKS_IN_FLIGHT, Engine
    from actors.runtime.metrics import ANSWER_ASKS

    sent: list[tuple[str, bytes]] = []

    async def publish(subject: str, data: bytes) -> None:
        sent.append((subject, data))

    asked: list[bytes] = []

    async def ask(data: bytes) -> str:
        asked.append(data)
        return "stored"

    engine: Any = _Bare(_asking=set(range(ASKS_IN_FLIGHT)), nc=_Bare(publish=publish), ask=ask)
    for name in ("_answer", "_said", "_full", "_asked"):
        setattr(engine, name, functools.partial(getattr(Engine, name), engine))
    before = ANSWER_ASKS.value(outcome="refused_before_fold")
    Engine._on_ask(engine, _Bare(reply="_INBOX.x", data=b"{}"))  # from the read loop: a task
    await asyncio.gather(*[t for t in engine._asking if isinstance(t, asyncio.Task)])
    assert sent == [("_INBOX.x", b"refused: too many asks in flight")]
    # asked on the pod's own connection (actors/natsio/requests.py): counted the same
    assert await Engine._local_ask(engine, b"{}") == b"refused: too many asks in flight"
    assert await Engine._local_start_ask(engine, b"{}") == b"refused: too many asks in flight"
    assert asked == []  # nothing decoded, nothing folded
    assert ANSWER_ASKS.value(outcome="refused_before_fold") == before + 3


@pytest.mark.asyncio
async def test_an_ask_whose_reply_is_not_an_inbox_is_ignored() -> None:
    """The engine may publish on every execution's log, the tools user may not: an ask
    naming a log subject (or no reply at all) for its answer is not handled, so nothing
    is stored for it and nothing is published where it points."""
    from actors.engine.actor import Engine

    sent: list[tuple[str, bytes]] = []

    async def publish(subject: str, data: bytes) -> None:
        sent.append((subject, data))

    asked: list[bytes] = []

    async def ask(data: bytes, *, start: bool = False) -> str:
        asked.append(data)
        return "stored"

    engine: Any = _Bare(_asking=set(), nc=_Bare(publish=publish), ask=ask)
    for name in ("_answer", "_said", "_full", "_asked"):
        setattr(engine, name, functools.partial(getattr(Engine, name), engine))
    for reply in ("exec.3.x.in.cancel", "", "_INBOX"):
        Engine._on_ask(engine, _Bare(subject="answer.3", reply=reply, data=b"{}"))
    assert engine._asking == set() and asked == [] and sent == []
    Engine._on_ask(engine, _Bare(subject="answer.3", reply="_INBOX.abc.1", data=b"{}"))
    await asyncio.gather(*engine._asking)
    assert asked == [b"{}"] and sent == [("_INBOX.abc.1", b"stored")]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("version", "replicas", "served"),
    [("2.12.1", 1, True), ("2.11.0", 1, True), ("2.10.22", 1, False), ("2.12.1", 3, False)],
)
async def test_asks_are_served_only_on_a_single_replica_stream_of_a_server_from_2_11(
    version: str, replicas: int, served: bool
) -> None:
    """On a stream of more than one replica nats-server checks the last subject
    sequence against committed messages only, and does not see an input still being
    proposed under the filter `exec.<p>.<id>.in.>`; before 2.11 it ignores the filter
    header. There the engine does not subscribe `answer.<p>` at all."""
    from nats.aio.client import ServerVersion

    from actors.engine.actor import Engine
    from streams.layout import Layout

    async def stream_info(stream: str) -> Any:
        return _Bare(config=_Bare(num_replicas=replicas))

    nc = _Bare(connected_server_version=ServerVersion(version), jsm=lambda: _Bare(stream_info=stream_info))
    engine: Any = _Bare(fast_answers=True, layout=Layout(partitions=4), _serves={}, nc=nc)
    engine._not_served = lambda stream: Engine._not_served(engine, stream)
    assert await Engine.serves_asks(engine, 1) is served
    engine.fast_answers, engine._serves = False, {}  # ACTORS_FAST_ANSWERS=0
    assert await Engine.serves_asks(engine, 1) is False


@pytest.mark.asyncio
async def test_an_answer_record_skipped_through_a_fault_makes_the_replay_diverge() -> None:
    """An answer record given up on (an EngineFault names it: say, sealed with a key
    this pod lacks) is not folded; its decision is in the log at its cause, so the
    replay knows it diverged and compares nothing after it (the execution fails with
    the fault's error), rather than halting on the next record."""
    from actors.core.replay import Recorded, Replayer
    from actors.engine.actor import ExecutionActor
    from actors.runtime.logactor import LogEntry

    _, log, stored = _run()
    subject, raw = stored[0]
    cause = answer_decoder.decode(raw).record.cause
    seq = next(r.seq for r in log if r.subject == subject and r.cls == "in")
    actor: Any = ExecutionActor.__new__(ExecutionActor)
    actor.skip, actor.last_seq, actor.folded_seq, actor.last_at = {seq}, 0, 0, 0.0
    assert await actor.fold_input(LogEntry(subject, raw, seq, 21.0, None)) is None
    assert actor.folded_seq == cause
    seen = Recorded()
    seen.decision(seq, subject, answer_decoder.decode(raw).record)
    replayer = Replayer("e1", seen)
    assert replayer.check(actor.folded_seq, subject, None) is None and replayer.diverged


def test_a_trigger_may_not_read_the_engines_asks() -> None:
    """`answer.<p>` carries every step's result, and `answer.start.<p>` (semantics 6)
    every execution's start record, payload included, to the engine pods: a trigger on
    them would read what it may not and start an execution per ask, each of which asks
    again (it feeds itself, as one on `exec.*.*.in.start` would, which the guard
    refuses). (Review r6.)"""
    from actors.triggers.guard import refusal

    for subject in ("answer.*", "answer.>", "answer.3", "answer.start.*", "answer.start.3", "*.start.*"):
        assert refusal(subject, None) is not None, subject
