"""Semantics 6, pure: an execution's start stored with its first decision, as one
input (an answer record of cause 0 whose `answer` is the start record as its starter
sent it, on `exec.<p>.<id>.in.answer.lc.<carrier>[.cmd.<kind>]`), and answer records
that carry lifecycle events and a command. The subjects parse, the tool log filter
matches exactly those, a log that opens with such a record replays to the live state
with no mismatch, readers find the start in it, and what users read is the start, then
the first decision's events. No NATS."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from actors.client.logview import log_items
from actors.core.decide import fold
from actors.core.effects import Effects
from actors.core.replay import SEMANTICS, LogRecord, answer_records, replay_execution
from actors.core.state import Execution
from actors.engine.actor import START_ANSWERS, START_STEP, one_message_only
from actors.natsio.replay import held_start
from actors.runtime.outbox import carrier_message, holdable
from actors.wire.codec import CLEAR
from actors.wire.events import DecisionRecord, EventType, answer_decoder, carrier_of, embedded_command
from actors.wire.messages import (
    CallDone,
    Limits,
    StartRecord,
    command_decoder,
    command_of_record_answer,
    encode,
    input_decoder,
    start_of_record_answer,
)
from streams.subjects import (
    EVENT_TYPE_TOKENS,
    ExecSubjects,
    answer_lifecycle_type,
    is_answer_record,
    is_start_answer,
    subject_matches,
    tool_log_filters,
)
from tests.support.playbooks import THREE_STEPS

pytestmark = [pytest.mark.timeout(30)]

EID = "e1"
SUBJECTS = ExecSubjects.of(EID, 1)


# --- subjects ----------------------------------------------------------------------------


def test_an_answer_record_with_lifecycle_events_and_a_command_names_both() -> None:
    assert SUBJECTS.answer_lifecycle("playbook.initialized", "python") == (
        "exec.0.e1.in.answer.lc.playbook.initialized.cmd.python"
    )
    assert SUBJECTS.answer_lifecycle("playbook.completed") == "exec.0.e1.in.answer.lc.playbook.completed"
    for subject, carrier in (
        ("exec.0.e1.in.answer.lc.playbook.initialized.cmd.python", "playbook.initialized"),
        ("exec.0.e1.in.answer.lc.execution.waiting.cmd.http", "execution.waiting"),
        ("exec.0.e1.in.answer.lc.playbook.completed", "playbook.completed"),
    ):
        assert is_answer_record(subject)
        assert answer_lifecycle_type(subject) == carrier, subject
    for other in (
        "exec.0.e1.in.answer.cmd.python",
        "exec.0.e1.in.answer.ev",
        "exec.0.e1.lc.playbook.initialized.cmd.python",
        "exec.0.e1.in.answer.lc.playbook",  # a type is two tokens
        "exec.0.e1.in.answer.lc.playbook.initialized.python",  # a tail that is no `cmd.<kind>`
        "exec.0.e1.in.answer.lc.playbook.initialized.cmd.python.x",
        "loop.0.e1.l.in.answer.lc.playbook.initialized",
    ):
        assert answer_lifecycle_type(other) is None, other


def test_only_the_start_decides_playbook_initialized_so_its_subject_tells_a_start_answer() -> None:
    assert is_start_answer("exec.0.e1.in.answer.lc.playbook.initialized.cmd.python")
    assert is_start_answer("exec.0.e1.in.answer.lc.playbook.initialized")  # a first step that waits
    assert not is_start_answer("exec.0.e1.in.answer.lc.execution.waiting.cmd.python")
    assert not is_start_answer("exec.0.e1.in.answer.lc.playbook.completed")
    assert not is_start_answer("exec.0.e1.lc.playbook.initialized.cmd.python")
    assert not is_start_answer("exec.0.e1.in.start")


def test_every_event_type_is_two_tokens_as_the_tool_log_filters_match_a_carrier() -> None:
    assert {len(t.value.split(".")) for t in EventType} == {EVENT_TYPE_TOKENS}


def test_the_tool_log_filters_match_every_held_command_of_their_kind_once_and_nothing_else() -> None:
    filters = tool_log_filters("python")
    held = [
        "exec.0.e1.ev.cmd.python",
        "exec.0.e1.lc.playbook.initialized.cmd.python",
        "exec.0.e1.in.answer.cmd.python",
        "exec.0.e1.in.answer.lc.playbook.initialized.cmd.python",
        "exec.0.e1.in.answer.lc.execution.waiting.cmd.python",
    ]
    for subject in held:
        assert sum(subject_matches(f, subject) for f in filters) == 1, subject
    for subject in (
        "exec.0.e1.in.answer.lc.playbook.initialized.cmd.http",
        "exec.0.e1.in.answer.lc.playbook.initialized",
        "exec.0.e1.in.answer.lc.playbook.completed",
        "exec.0.e1.in.answer.ev",
        "exec.0.e1.in.start",
        "exec.0.e1.in.result",
    ):
        assert not any(subject_matches(f, subject) for f in filters), subject


# --- what one answer record may hold -----------------------------------------------------


def _fx(**parts: Any) -> Effects:
    return Effects(cause=0, **parts)


def test_lifecycle_events_and_a_command_fit_one_record_from_semantics_6_only() -> None:
    live, start = _start_state(), _start_record()
    fx = fold(live, start, seq=0, at=10.0, subjects=SUBJECTS)
    assert fx.lifecycle and len(fx.commands) == 1  # the first decision: lifecycle events and a's command
    assert one_message_only(fx, START_ANSWERS) is None
    assert one_message_only(fx, 5) == "the decision has lifecycle events and a command"
    # the rest is as under 5, whatever the semantics
    two = fx.copy(commands=[*fx.commands, *fx.commands])
    assert one_message_only(two, START_ANSWERS) == "the decision issues more than one command"
    assert one_message_only(fx.copy(timers=[object()]), START_ANSWERS) == "the decision sends more than a command"  # type: ignore[list-item]
    assert one_message_only(_fx(), START_ANSWERS) == "the decision records nothing"
    assert one_message_only(fx.copy(commands=[]), 5) is None  # lifecycle events alone: an end, as under 5


# --- a log of semantics 6 ------------------------------------------------------------------


def _start_record() -> StartRecord:
    return StartRecord(
        execution_id=EID,
        playbook_path="pb",
        playbook_source=THREE_STEPS,
        payload={"k": 1},
        limits=Limits(),
        semantics=SEMANTICS,
    )


def _start_state() -> Execution:
    return Execution(execution_id=EID)


def _stored_start(live: Execution, start_bytes: bytes, at: float) -> tuple[str, bytes, Effects]:
    """The start stored with its first decision as the engine stores it (`store_start`)."""
    start = input_decoder.decode(start_bytes)
    fx = fold(live, start, seq=0, at=at, subjects=SUBJECTS)
    assert one_message_only(fx, SEMANTICS) is None
    command = holdable(CLEAR, fx)
    assert command is not None
    record = DecisionRecord(cause=0, events=fx.events, command=command, answer=msgspec.Raw(start_bytes), at=at)
    type_, raw = carrier_message(CLEAR, fx.lifecycle, record)
    return SUBJECTS.answer_lifecycle(type_, fx.commands[0].kind), raw, fx


def _run(copy_after: int | None = None) -> tuple[Execution, list[LogRecord], list[tuple[str, bytes]]]:
    """The three steps as an engine of semantics 6 stores them: the start with its
    first decision (seq 1, cause 0), then each result with the decision it leads to.
    `copy_after`: a plain copy of the start record after that many results
    (`Client.prepare_rollback`'s), folded live: it must decide nothing."""
    live = _start_state()
    start_bytes = encode(_start_record())
    subject, raw, fx = _stored_start(live, start_bytes, 10.0)
    stored = [(subject, raw)]
    whole = answer_decoder.decode(raw)
    log = answer_records(1, subject, whole.record, input_decoder.decode(start_bytes), whole.lifecycle)
    (cmd,) = fx.commands
    last_input = 1
    for n, value in enumerate((1, 2, 3)):
        if n == copy_after:
            last_input += 1
            copy = held_start(*stored[0])
            assert copy == start_bytes
            before = msgspec.to_builtins(live)
            decided = fold(live, input_decoder.decode(copy), seq=last_input, at=15.0 + n, subjects=SUBJECTS)
            assert not decided, decided  # a second start: the first won
            assert msgspec.to_builtins(live) == {**before, "inputs_folded": before["inputs_folded"] + 1}
            stored.append((SUBJECTS.start, copy))
            log.append(LogRecord(last_input, SUBJECTS.start, 15.0 + n, "in", input_decoder.decode(copy)))
        seq, at = last_input + 1, 20.0 + n
        done = CallDone(execution_id=EID, command_id=cmd.command_id, step=cmd.step, attempt_number=1, result=value)
        data = encode(done)
        fx = fold(live, done, seq=-last_input, at=at, subjects=SUBJECTS)
        x = DecisionRecord(
            cause=-last_input, events=fx.events, command=holdable(CLEAR, fx), answer=msgspec.Raw(data), at=at
        )
        if fx.lifecycle:
            type_, raw = carrier_message(CLEAR, fx.lifecycle, x)
            subject = SUBJECTS.answer_lifecycle(type_)
        else:
            raw, subject = msgspec.json.encode(x), SUBJECTS.answer_record(fx.commands[0].kind)
            (cmd,) = fx.commands
        stored.append((subject, raw))
        whole = answer_decoder.decode(raw)
        assert whole.record.answer is not None
        log += answer_records(
            seq, subject, whole.record, input_decoder.decode(bytes(whole.record.answer)), whole.lifecycle
        )
        last_input = seq
    return live, log, stored


def test_a_log_opened_by_the_start_with_its_first_decision_replays_to_the_same_state() -> None:
    live, log, stored = _run()
    assert live.status == "COMPLETED"
    assert [s.split(".", 3)[3] for s, _ in stored] == [
        "in.answer.lc.playbook.initialized.cmd.python",
        "in.answer.cmd.python",
        "in.answer.cmd.python",
        "in.answer.lc.playbook.completed",
    ]
    replay = replay_execution(EID, log, subjects=SUBJECTS)
    assert replay.mismatch is None, replay.mismatch.describe()
    assert msgspec.to_builtins(replay.state) == msgspec.to_builtins(live)
    # the start folded with cause 0 (minus the input before it: none), each result with
    # minus the input it followed; the replay finds the start record
    assert [seq for seq, _ in replay.outputs] == [0, -1, -2, -3]
    assert replay.start is not None and replay.start.payload == {"k": 1}


def test_a_changed_first_decision_is_a_mismatch_named_by_the_records_own_seq() -> None:
    _, log, _ = _run()
    at = next(i for i, r in enumerate(log) if r.cls == "ev" and r.value.cause == 0)
    log[at] = LogRecord(
        log[at].seq, log[at].subject, log[at].at, "ev", msgspec.structs.replace(log[at].value, events=[])
    )
    replay = replay_execution(EID, log, subjects=SUBJECTS)
    assert replay.mismatch is not None and replay.mismatch.input_seq == 1


def test_a_second_start_record_folded_after_a_start_answer_decides_nothing() -> None:
    """A plain start stored after the start answer (another starter's, past the
    duplicate window: a plain start checks only its own subject) is folded as a second
    start: the first won, nothing is decided, the state is unchanged."""
    live, log, _ = _run()
    again = msgspec.structs.replace(_start_record(), payload={"k": 2})
    log.insert(3, LogRecord(2, SUBJECTS.start, 11.0, "in", again))  # after the start answer's records
    replay = replay_execution(EID, log, subjects=SUBJECTS)
    assert replay.mismatch is None, replay.mismatch.describe()
    assert msgspec.to_builtins(replay.state) == {**msgspec.to_builtins(live), "inputs_folded": live.inputs_folded + 1}
    second = next(fx for seq, fx in replay.outputs if seq == 2)
    assert not second.events and not second.lifecycle and not second.commands
    assert replay.start is not None and replay.start.payload == {"k": 1}


@pytest.mark.parametrize("copy_after", [0, 1, 2])
def test_a_plain_copy_of_the_start_decides_nothing_live_or_in_a_replay(copy_after: int) -> None:
    """The copy `actors-cli prepare-rollback` writes (review r6): the start answer's own
    start record, as its starter sent it, on `in.start` after the start answer and any
    result since. Folded live by the running execution it decides nothing (`_run`
    checks it) and changes nothing but the inputs folded; a replay of the log with it
    finds no mismatch and reaches the same state, and the execution completes."""
    live, log, stored = _run(copy_after=copy_after)
    assert live.status == "COMPLETED"
    assert [s.split(".", 3)[3] for s, _ in stored].count("in.start") == 1
    replay = replay_execution(EID, log, subjects=SUBJECTS)
    assert replay.mismatch is None, replay.mismatch.describe()
    assert msgspec.to_builtins(replay.state) == msgspec.to_builtins(live)
    copy_seq = 2 + copy_after
    assert not next(fx for seq, fx in replay.outputs if seq == copy_seq)
    assert replay.start is not None and replay.start.payload == {"k": 1}


def test_readers_find_the_start_in_the_start_answer_and_the_tools_its_command() -> None:
    _, _, stored = _run()
    subject, raw = stored[0]
    start_bytes = encode(_start_record())
    assert start_of_record_answer(raw) == start_bytes
    assert held_start(subject, raw) == start_bytes
    assert held_start(SUBJECTS.start, start_bytes) == start_bytes
    # a step's answer record holds a result, not a start
    assert all(start_of_record_answer(r) is None and held_start(s, r) is None for s, r in stored[1:])
    assert command_of_record_answer(raw) is None  # a start is no command's answer
    held = embedded_command(raw)  # what a tool actor takes from the log (a tool of 5 too)
    assert held is not None and command_decoder.decode(held).step == "a"


def test_log_items_show_the_start_answer_as_the_start_then_its_decision() -> None:
    _, _, stored = _run()
    subject, raw = stored[0]
    items = log_items(subject, raw, 1, 10.0)
    assert items[0].cls == "in" and items[0].type == "execution.start" and items[0].data["payload"] == {"k": 1}
    assert "playbook_source" not in items[0].data
    classes = [i.cls for i in items]
    assert set(classes[1 : classes.index("lc")]) == {"ev"}
    assert [i.type for i in items if i.cls == "lc"] == ["playbook.initialized", "workflow.initialized"]
    assert [i.step for i in items if i.type == "step.enter"] == ["a"]


def test_the_carrier_of_a_first_decision_is_playbook_initialized() -> None:
    live = _start_state()
    fx = fold(live, _start_record(), seq=0, at=10.0, subjects=SUBJECTS)
    assert fx.lifecycle[carrier_of(fx.lifecycle)].type == "playbook.initialized"


# --- the engine's ask for a start, refused before any fold ---------------------------------


class _Bare:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


@pytest.mark.asyncio
async def test_asks_to_store_a_start_are_refused_before_the_fold_where_they_must_be() -> None:
    """A start asked on the tools' subject (`answer.<p>`: the tools user may publish
    there, review r6), a result on the starters' (`answer.start.<p>`), a start of
    semantics 5, of a partition this pod does not serve, of an execution whose actor is
    resident (inputs before the start), or of a playbook whose first decision did not
    fit before: refused, nothing spawned, nothing folded."""
    from actors.engine.actor import Engine, misfit_key_of
    from streams.layout import Layout

    start = _start_record()
    layout = Layout(partitions=1)
    spawned: list[str] = []

    def engine(**over: Any) -> Any:
        attrs: dict[str, Any] = dict(
            js=_Bare(), layout=layout, actors={}, misfits={}, _asks={0: object()}, retired={}, spawn=spawned.append
        )
        attrs.update(over)
        e = _Bare(**attrs)
        e._ask_start = lambda data, record: Engine._ask_start(e, data, record)
        return e

    cases = {
        "asked where tools ask (`answer.<p>`)": (engine(), start),
        "semantics 5": (engine(), msgspec.structs.replace(start, semantics=5)),
        "a newer semantics": (engine(), msgspec.structs.replace(start, semantics=SEMANTICS + 1)),
        "a partition not served": (engine(_asks={}), start),
        "an actor resident": (engine(actors={EID: object()}), start),
        "a misfit": (engine(misfits={misfit_key_of(start, START_STEP): None}), start),
    }
    for what, (e, record) in cases.items():
        said, folded = await Engine._ask(e, encode(record), start=not what.startswith("asked where tools"))
        assert said.startswith("refused: ") and not folded, (what, said)
    # a result asked where starters ask (`answer.start.<p>`)
    done = CallDone(execution_id=EID, command_id="c1", step="a", attempt_number=1, result=1)
    said, folded = await Engine._ask(engine(), encode(done), start=True)
    assert said == "refused: not a start record" and not folded
    assert spawned == []
