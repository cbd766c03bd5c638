"""Semantics 5: a step's result stored with the decision it leads to, as one input
(`exec.<p>.<id>.in.answer.cmd.<kind>` or `in.answer.ev`; docs/architecture.md "The next
layout", item 2). The tool asks the partition's engine pod (`Command.ask_on`); the
engine folds the result at once and stores the record only if nothing reached the
execution's inputs since the last one it folded. Anything else: the tool publishes
the plain result, as before. The log replays as it ran, readers see every result, a
redelivered command whose answer is in a record is not run again, and a fresh engine
replaying such a log finishes the execution with no step run twice.

Semantics 6: the start too, stored with its first decision as the log's first input
(`in.answer.lc.playbook.initialized.cmd.<kind>`, cause 0): the starter asks the engine
first, and writes the plain start record when refused (a first step that does not fit
one record, a cancel sent before the start, asks not served), never a second start."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.client.outcome import ExecutionFailed
from actors.core.replay import LogRecord, answer_records, lifecycle_records, replay_execution
from actors.engine.readback import read_back
from actors.natsio import held_start, is_answered
from actors.wire.events import answer_decoder, decision_decoder, embedded_command, event_decoder, extras_decoder
from actors.wire.messages import (
    StartRecord,
    command_decoder,
    command_of_answer,
    command_of_record_answer,
    input_decoder,
    start_of_record_answer,
)
from streams.layout import CMD_STREAM, EXEC_STREAM, class_of
from streams.subjects import is_answer_record, is_start_answer
from tests.conftest import System, wait_for
from tests.support.natsio import THREE_STEPS_ANSWERED, execution_log, log_kinds
from tests.support.playbooks import THREE_STEPS
from tests.support.semantics import older_engines_live

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

WAITS_BETWEEN = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fast_then_wait}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    next: b
  - step: b
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ a }}"}
    next: hold
  - step: hold
    timeout: 120
    tool: {kind: wait, signal: go}
    next: c
  - step: c
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ b }}"}
"""

FAN_IN = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fast_fan_in}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    next: [p, q]
  - step: p
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ a }}"}
    next: end
  - step: q
    tool: {kind: python, code: "def main(x): return x + 2"}
    args: {x: "{{ a }}"}
    next: end
  - step: end
    tool: {kind: python, code: "def main(x, y): return x + y"}
    args: {x: "{{ p }}", y: "{{ q }}"}
"""

Log = list[tuple[str, bytes, int, float]]


async def _records(system: System, log: Log) -> list[LogRecord]:
    js = system.nc.jetstream()
    records: list[LogRecord] = []
    for subject, data, seq, at in log:
        cls = class_of(subject)
        if cls == "in" and is_answer_record(subject):
            whole = answer_decoder.decode(data)  # `in.answer.lc.<type>`: with its lifecycle events
            record = whole.record
            assert record.answer is not None
            answer = await read_back(js, input_decoder.decode(bytes(record.answer)))  # a start's payload blob (6)
            records += answer_records(seq, subject, record, answer, whole.lifecycle)
        elif cls == "in":
            records.append(LogRecord(seq, subject, at, cls, await read_back(js, input_decoder.decode(data))))
        elif cls == "ev":
            records.append(LogRecord(seq, subject, at, cls, decision_decoder.decode(data)))
        elif cls == "lc":
            records += lifecycle_records(seq, subject, at, event_decoder.decode(data), extras_decoder.decode(data))
    return records


async def _replays_clean(system: System, eid: str, log: Log) -> None:
    replay = replay_execution(eid, await _records(system, log), subjects=system.layout.execution(eid))
    assert replay.mismatch is None, replay.mismatch.describe()
    assert replay.state.status == "COMPLETED"


def _answered(log: Log) -> list[str | None]:
    """The command each stored result answers, plain or held by an answer record (not
    the start stored with its first decision, semantics 6: it answers no command)."""
    out = []
    for subject, data, _, _ in log:
        if is_answer_record(subject) and start_of_record_answer(data) is None:
            out.append(command_of_record_answer(data))
        elif class_of(subject) == "in" and ".in.result" in subject:
            out.append(command_of_answer(data))
    return out


async def _each_step_held_and_answered_once(system: System, eid: str, log: Log) -> None:
    """THREE_STEPS' log: each step's command held by a decision in the log (none went to
    CMD), each answered once, each answer record's cause minus the sequence of the input
    it followed (the engine's own records in between are not inputs), and the log
    replays clean."""
    held = [embedded_command(d) for s, d, _, _ in log if ".cmd." in s]
    assert [command_decoder.decode(h).step for h in held if h is not None] == ["a", "b", "c"]
    answered = _answered(log)
    assert len(answered) == 3 and len(set(answered)) == 3 and None not in answered
    assert (await system.nc.jsm().stream_info(CMD_STREAM)).state.last_seq == 0
    last_input = 0
    for subject, data, seq, _ in log:
        if is_answer_record(subject):
            assert answer_decoder.decode(data).record.cause == -last_input
        if class_of(subject) == "in":
            last_input = seq
    await _replays_clean(system, eid, log)


async def test_three_steps_of_semantics_5_store_five_messages_three_of_them_a_result_with_its_decision(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    await older_engines_live(monkeypatch, system.runtime, semantics=5)  # mid-roll: an engine pod of 5 live
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED"
    assert await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    kinds = [s.split(".", 3)[3] for s, _, _, _ in log]
    # start; the first decision (carried by playbook.initialized) holding a's command;
    # a's result with the decision holding b's command; b's with c's; c's result with
    # its decision, which ends the execution (its lifecycle events, a carrier's shape)
    assert kinds == [
        "in.start",
        "lc.playbook.initialized.cmd.python",
        "in.answer.cmd.python",
        "in.answer.cmd.python",
        "in.answer.lc.playbook.completed",
    ]
    assert input_decoder.decode(log[0][1]).semantics == 5  # stamped 5 while a pod of 5 is live
    await _each_step_held_and_answered_once(system, eid, log)
    items = await system.events(eid)
    assert [i.step for i in items if i.type == "call.done"] == ["a", "b", "c"]
    assert [i.step for i in items if i.type == "step.enter"] == ["a", "b", "c", "end"]
    assert [i.type for i in items if i.cls == "lc"][-1] == "playbook.completed"
    # what `actors-cli status`, `result` and `list` read: the projector had the end
    # (its consumer reads `in.answer.lc.>` too), the status written, the execution listed
    status, end = await system.client.terminal(eid)
    assert status.state == "COMPLETED" and status.terminal_event == "playbook.completed"
    assert end is not None and end.type == "playbook.completed" and end.data["result"] == {"c": 3}
    listed = await system.client.list(state="COMPLETED")
    assert eid in [s.execution_id for s in listed]
    followed = [i async for i in system.client.follow(eid)]
    assert followed[-1].cls == "lc" and followed[-1].type == "playbook.completed"


async def test_three_steps_of_semantics_6_store_four_messages_the_start_with_its_first_decision(
    system: System,
) -> None:
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED"
    assert await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    # the start with the first decision (carried by playbook.initialized) holding a's
    # command; a's result with the decision holding b's; b's with c's; c's with the end
    assert log_kinds(log) == THREE_STEPS_ANSWERED
    first = answer_decoder.decode(log[0][1]).record
    assert first.cause == 0 and first.answer is not None  # minus the input before it: none
    start = input_decoder.decode(bytes(first.answer))
    assert isinstance(start, StartRecord) and start.execution_id == eid and start.semantics == 6
    assert start_of_record_answer(log[0][1]) == bytes(first.answer)
    await _each_step_held_and_answered_once(system, eid, log)
    items = await system.events(eid)
    assert items[0].cls == "in" and items[0].type == "execution.start"
    assert [i.step for i in items if i.type == "call.done"] == ["a", "b", "c"]
    assert [i.step for i in items if i.type == "step.enter"] == ["a", "b", "c", "end"]
    assert [i.type for i in items if i.cls == "lc"] == [
        "playbook.initialized",
        "workflow.initialized",
        "workflow.completed",
        "playbook.completed",
    ]
    status, end = await system.client.terminal(eid)
    assert status.state == "COMPLETED" and status.terminal_event == "playbook.completed"
    assert status.playbook is not None and status.version == 1 and status.started_at is not None
    assert end is not None and end.data["result"] == {"c": 3}
    assert eid in [s.execution_id for s in await system.client.list(state="COMPLETED")]
    followed = [i async for i in system.client.follow(eid)]
    assert followed[0].type == "execution.start" and followed[-1].type == "playbook.completed"


async def _asks_seen(system: System) -> list[str]:
    """The subjects of the asks that cross the server from now on (a plain subscriber
    beside the engine's queue group gets a copy of each)."""
    seen: list[str] = []

    async def spy(msg: Any) -> None:
        seen.append(msg.subject)

    await system.nc.subscribe("answer.>", cb=spy)
    await system.nc.flush()
    return seen


async def _three_steps_stored_with_their_decisions(system: System) -> str:
    """THREE_STEPS run to its result, its start and each result stored with the decision
    it leads to (semantics 6, asks served); its id, once every ask made is seen."""
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED" and await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    assert log_kinds(log) == THREE_STEPS_ANSWERED
    await _each_step_held_and_answered_once(system, eid, log)
    await system.nc.flush()  # what `_asks_seen` was sent has come
    return eid


async def test_a_pods_own_tools_and_starter_ask_its_engine_without_a_request_through_the_server(
    system: System,
) -> None:
    """Engine, starter and tools on one connection (one pod, `serve --role all`): the
    start and every result are stored with their decisions as when asked through the
    server, and no ask crosses it (actors/natsio/requests.py `answer_locally`)."""
    seen = await _asks_seen(system)
    await _three_steps_stored_with_their_decisions(system)
    assert seen == []


async def test_tools_of_another_pod_ask_the_engine_through_the_server(system: System) -> None:
    """Tools on a connection of their own (a tools pod beside an engine pod): each
    result is asked for through the server, on the partition's `answer.<p>`, and
    stored with its decision all the same."""
    from actors.pod.roles import connect, start_roles

    await system.stop_roles(("tools",))
    tools_nc = await connect(system.server.url, name="tools-pod")
    tools = await start_roles(tools_nc, layout=system.layout, roles=("tools",))
    try:
        seen = await _asks_seen(system)
        eid = await _three_steps_stored_with_their_decisions(system)
        # a, b and c's results; the start was the engine pod's own starter's: not among them
        assert seen == [f"answer.{system.layout.partition_of(eid)}"] * 3
    finally:
        await tools.stop()
        await tools_nc.close()
        await system.start_roles(("tools",))


def _same_shape(text: str) -> list[str]:
    """`actors-cli status|events --json` output with what differs from run to run (ids,
    times, sequences, workers, durations) left out."""
    varying = {"execution_id", "seq", "at", "started_at", "ended_at", "duration_ms", "worker", "cause", "semantics"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in varying}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return [json.dumps(strip(json.loads(line)), sort_keys=True) for line in text.splitlines() if line.strip()]


async def test_the_user_sees_a_start_stored_with_its_first_decision_as_a_plain_start(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events, status, result and `actors-cli status/events` read the same of an
    execution of 6 (its start stored with its first decision) as of one of 5; the start
    record, `exists` and a second start of the same id read it too."""
    from tests.support.cli import cli

    path = system.tmp / "three.yaml"
    path.write_text(THREE_STEPS)
    entry = await system.client.register(path)
    six = await system.client.start(entry.path, payload={"k": 1}, execution_id="seen-six")
    assert (await system.client.wait(six, timeout=20)).state == "COMPLETED"
    await older_engines_live(monkeypatch, system.runtime, semantics=5)
    five = await system.client.start(entry.path, payload={"k": 1}, execution_id="seen-five")
    assert (await system.client.wait(five, timeout=20)).state == "COMPLETED"
    await system.engine_idle()
    logs = {eid: await execution_log(system.nc, system.layout, eid) for eid in (six, five)}
    assert is_answer_record(logs[six][0][0]) and logs[five][0][0].endswith(".in.start")
    assert len(logs[six]) == len(logs[five]) - 1

    def shape(items: list[Any]) -> list[tuple[str, str, str | None]]:
        return [(i.cls, i.type, i.step) for i in items]

    assert shape(await system.events(six)) == shape(await system.events(five))
    st6, st5 = await system.client.status(six), await system.client.status(five)
    assert st6 is not None and st5 is not None
    for field in ("state", "playbook", "version", "terminal_event", "error", "waiting"):
        assert getattr(st6, field) == getattr(st5, field), field
    assert await system.client.result(six) == await system.client.result(five) == {"c": 3}
    for command in (("status", "--json"), ("events", "--json")):
        outs = [await cli(command[0], eid, *command[1:], url=system.server.url) for eid in (six, five)]
        assert [o.code for o in outs] == [0, 0], [o.err for o in outs]
        assert _same_shape(outs[0].out) == _same_shape(outs[1].out), command
    # what reads the start: the start record, whether the execution exists, a second start
    record = await system.client.start_record(six)
    assert record is not None and record.payload == {"k": 1} and record.playbook_path == entry.path
    assert await system.client.exists(six) is True
    again = await system.client.start_execution(entry.path, payload={"k": 2}, execution_id=six)
    assert again.existing and again.differs == ("payload",)
    same = await system.client.start_execution(entry.path, payload={"k": 1}, execution_id=six)
    assert same.existing and same.differs == ()
    assert len(await execution_log(system.nc, system.layout, six)) == len(logs[six])  # nothing written


FIRST_A_LOOP = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: first_a_loop}
workflow:
  - step: square
    loop: {collection: "{{ [1, 2, 3] }}", element: n}
    tool: {kind: python, code: "def main(n): return n * n"}
    args: {n: "{{ n }}"}
    next: total
  - step: total
    tool: {kind: python, code: "def main(xs): return sum(xs)"}
    args: {xs: "{{ square }}"}
"""


async def test_a_start_whose_first_decision_does_not_fit_is_stored_plain_and_runs(system: System) -> None:
    """The first step is a loop (a loop spec handed to the counter: not one record):
    the engine folds the start, refuses, remembers the playbook's first decision as a
    misfit, and the starter writes the plain start record; the next execution of the
    playbook is refused before its fold."""
    from actors.runtime.metrics import ANSWER_ASKS

    before = ANSWER_ASKS.value(outcome="refused_after_fold")
    eid, status = await system.run_yaml(FIRST_A_LOOP)
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(eid) == {"total": 14}
    assert ANSWER_ASKS.value(outcome="refused_after_fold") == before + 1
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    assert log[0][0].endswith(".in.start")
    assert not [s for s, _, _, _ in log if is_start_answer(s)]
    refused = ANSWER_ASKS.value(outcome="refused_before_fold")
    second, status = await system.run_yaml(FIRST_A_LOOP)
    assert status.state == "COMPLETED"
    assert ANSWER_ASKS.value(outcome="refused_after_fold") == before + 1  # not folded again
    assert ANSWER_ASKS.value(outcome="refused_before_fold") > refused
    assert (await execution_log(system.nc, system.layout, second))[0][0].endswith(".in.start")
    await _replays_clean(system, eid, log)


FIRST_FAILS_TO_FOLD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: first_fails_to_fold_NAME}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
"""


async def test_a_first_decision_whose_fold_failed_for_good_is_remembered_a_transient_failure_not(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold of a start asked to be stored with its first decision fails: an error
    that would fail it again (the playbook's) is remembered as a misfit, and the next
    start of the playbook is refused before its fold; a NATS error (a payload blob
    that could not be read back) is not, and the next start is folded again. Either
    way the start is written plain and runs. (Review r6: neither was remembered.)"""
    import nats.errors

    from actors.engine.actor import START_STEP, Engine, ExecutionActor, misfit_key_of
    from actors.runtime.metrics import ANSWER_ASKS

    (engine,) = system.runtime.find(Engine)
    real = ExecutionActor._read_back
    failing: list[BaseException] = []

    async def read_back_once(self: ExecutionActor, inp: Any) -> Any:
        if failing and isinstance(inp, StartRecord) and self.replayer is None and not self.hydrated:
            raise failing.pop()
        return await real(self, inp)

    monkeypatch.setattr(ExecutionActor, "_read_back", read_back_once)
    for name, error, remembered in (
        ("good", ValueError("a bug"), True),
        ("transient", nats.errors.TimeoutError(), False),
    ):
        failing.append(error)
        before = ANSWER_ASKS.value(outcome="refused_after_fold")
        eid, status = await system.run_yaml(FIRST_FAILS_TO_FOLD.replace("NAME", name))
        assert status.state == "COMPLETED", status.error
        assert ANSWER_ASKS.value(outcome="refused_after_fold") == before + 1
        assert not failing
        record = await system.client.start_record(eid)
        assert record is not None
        assert (misfit_key_of(record, START_STEP) in engine.misfits) is remembered, name
        folded = ANSWER_ASKS.value(outcome="refused_after_fold")
        second, status = await system.run_yaml(FIRST_FAILS_TO_FOLD.replace("NAME", name))
        assert status.state == "COMPLETED"
        log = await execution_log(system.nc, system.layout, second)
        # remembered: refused before the fold, stored plain; else folded and stored with it
        assert is_start_answer(log[0][0]) is not remembered, (name, log[0][0])
        assert ANSWER_ASKS.value(outcome="refused_after_fold") == folded


BIG_FIRST_COMMAND = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: big_first_command}
workflow:
  - step: a
    tool: {kind: python, code: "def main(blob): return len(blob)"}
    args: {blob: BLOB}
"""


@pytest.mark.layout(max_msg_size=64 * 1024)
async def test_a_first_decision_too_large_for_the_playbooks_size_is_remembered_for_its_payloads_not(
    system: System,
) -> None:
    """The start stored with its first decision does not fit one message: remembered as
    a misfit when it would not fit whatever the start's payload (here the first step's
    command holds a large constant of the playbook's, beside the playbook's source in
    the start record), and the next start of the playbook is refused before its fold;
    one that does not fit only for its payload is not (the next start, with a small
    payload, is stored with its first decision). (Review r6: neither was remembered.)"""
    from actors.engine.actor import START_STEP, Engine, misfit_key_of
    from actors.runtime.metrics import ANSWER_ASKS

    (engine,) = system.runtime.find(Engine)
    before = ANSWER_ASKS.value(outcome="refused_after_fold")
    eid, status = await system.run_yaml(BIG_FIRST_COMMAND.replace("BLOB", repr("x" * 32_000)))
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(eid) == {"a": 32_000}
    assert ANSWER_ASKS.value(outcome="refused_after_fold") == before + 1
    record = await system.client.start_record(eid)
    assert record is not None and misfit_key_of(record, START_STEP) in engine.misfits
    second, status = await system.run_yaml(BIG_FIRST_COMMAND.replace("BLOB", repr("x" * 32_000)))
    assert status.state == "COMPLETED"
    assert ANSWER_ASKS.value(outcome="refused_after_fold") == before + 1  # not folded again
    assert (await execution_log(system.nc, system.layout, second))[0][0].endswith(".in.start")
    # too large for its payload: the playbook's source and decision are small
    small = BIG_FIRST_COMMAND.replace("BLOB", "'{{ workload.blob }}'")
    eid, status = await system.run_yaml(small, payload={"blob": "y" * 40_000})
    assert status.state == "COMPLETED", status.error
    assert ANSWER_ASKS.value(outcome="refused_after_fold") == before + 2
    record = await system.client.start_record(eid)
    assert record is not None and misfit_key_of(record, START_STEP) not in engine.misfits
    third, status = await system.run_yaml(small, payload={"blob": "y"})
    assert status.state == "COMPLETED"
    assert is_start_answer((await execution_log(system.nc, system.layout, third))[0][0])


@pytest.mark.parametrize("resident", [True, False])
async def test_a_cancel_sent_before_the_start_makes_it_plain_and_cancels_it_as_it_starts(
    system: System, resident: bool
) -> None:
    """A cancel in the log before the start: refused before the fold while the actor
    that folded the cancel is resident, after it (the server's check over the inputs)
    once it was evicted; either way the plain start record follows the cancel and the
    execution ends CANCELLED as it starts, no step entered."""
    from actors.engine.actor import Engine

    path = system.tmp / "three.yaml"
    path.write_text(THREE_STEPS)
    entry = await system.client.register(path)
    eid = f"cancelled-first-{resident}"
    await system.client.cancel(eid, "not wanted")
    await system.engine_idle()
    (engine,) = system.runtime.find(Engine)
    actor = engine.actors.get(eid)
    assert actor is not None  # the cancel folded into a state still PENDING
    if not resident:  # evicted: the log's check refuses the start answer
        engine.forget(eid, actor)
        assert actor.task is not None
        actor.task.cancel()
    await system.client.start_execution(entry.path, execution_id=eid)
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "CANCELLED"
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    kinds = [s.split(".", 3)[3] for s, _, _, _ in log]
    assert kinds[:2] == ["in.cancel", "in.start"], kinds
    assert not [k for k in kinds if k.startswith("in.answer")]
    items = await system.events(eid)
    assert not [i for i in items if i.type == "step.enter"]
    assert (await system.client.start_record(eid)) is not None


@pytest.mark.parametrize("how", ["evicted", "moved"])
async def test_a_cancel_sent_before_the_start_is_folded_first_when_its_actor_went_before_the_start(
    system: System, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A cancel in the log before the start, folded into a PENDING actor that then goes
    before the plain start record's first delivery (evicted: idle, between the
    starter's refused ask and its plain write; moved: the partition changes pods, here
    with asks not served). The fresh actor meeting that delivery does not take it for
    the log's first input on its subject alone (`ExecutionActor.first_input`: one
    direct get of the first input), replays, folds the cancel first: CANCELLED.
    (Review r6: it skipped the replay and ran the execution to COMPLETED.)"""
    from actors.engine.actor import Engine
    from actors.engine.starter import Starter

    path = system.tmp / "three.yaml"
    path.write_text(THREE_STEPS)
    entry = await system.client.register(path)
    eid = f"cancel-first-{how}"
    if how == "moved":
        monkeypatch.setenv("ACTORS_FAST_ANSWERS", "0")  # an R3 stream, or the roll back's step (1)
        await system.restart_roles(("engine",))
    await system.client.cancel(eid, "not wanted")
    await system.engine_idle()
    (engine,) = system.runtime.find(Engine)
    assert eid in engine.actors  # the cancel folded into a state still PENDING
    if how == "moved":
        await system.restart_roles(("engine",))  # another pod holds the partition: no actor
    else:
        real = Starter._write_plain

        async def evicting(self: Starter, eid_: str, data: bytes, **kwargs: Any) -> bool:
            # idle and its mailbox empty: what `PartitionHost._evict` drops first
            for found in system.runtime.find(Engine):
                actor = found.actors.get(eid_)
                if actor is not None and not actor.busy and actor.mailbox.empty():
                    found.forget(eid_, actor)
                    assert actor.task is not None
                    actor.task.cancel()
            return await real(self, eid_, data, **kwargs)

        monkeypatch.setattr(Starter, "_write_plain", evicting)
    await system.client.start_execution(entry.path, execution_id=eid)
    status = await system.client.wait(eid, timeout=20)
    await system.engine_idle()
    kinds = [s.split(".", 3)[3] for s, _, _, _ in await execution_log(system.nc, system.layout, eid)]
    assert kinds[:2] == ["in.cancel", "in.start"], kinds
    assert status.state == "CANCELLED", (status.state, kinds)
    items = await system.events(eid)
    assert not [i for i in items if i.type == "step.enter"]


MARKED = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: marked}
workflow:
  - step: a
    tool:
      kind: python
      code: |
        def main(eid):
            open(MARKS + '/' + eid + '.a', 'a').write('x')
            return 1
    args: {eid: "{{ execution_id }}"}
    next: b
  - step: b
    tool:
      kind: python
      code: |
        def main(eid, x):
            open(MARKS + '/' + eid + '.b', 'a').write('x')
            return x + 1
    args: {eid: "{{ execution_id }}", x: "{{ a }}"}
"""


def _marked(marks: Path) -> str:
    return MARKED.replace("MARKS", repr(str(marks)))


async def test_two_starts_of_one_id_at_once_one_asked_one_plain_make_one_execution(
    system: System, tmp_path: Path
) -> None:
    """A start asked to be stored with its first decision and a plain start record of
    the same id at once (two starters: a redelivered start message, a start request):
    whichever is stored first, the other is refused (the start answer's check over the
    inputs) or dropped (the same message id); one execution, each step run once. A
    plain start checked over the inputs (a starter whose ask was refused) is never
    stored after a start answer, however late. The two starts differ (their payloads),
    as two starters' may: each tells its own start from the other's by its bytes, so
    which one says it wrote the start does not hang on how long an ask takes (one
    past its timeout is looked up)."""
    from actors.engine.starter import Starter
    from actors.natsio.binding import codec_of
    from actors.wire.messages import StartMessage

    marks = tmp_path / "marks"
    marks.mkdir()
    path = system.tmp / "marked.yaml"
    path.write_text(_marked(marks))
    entry = await system.client.register(path)
    (starter,) = system.runtime.find(Starter)
    codec = codec_of(system.nc)
    ids = [f"twice-{n}" for n in range(6)]
    for eid in ids:
        asked = await starter._record(eid, StartMessage(playbook=entry.path, payload={"by": "ask"}, execution_id=eid))
        plain = await starter._record(eid, StartMessage(playbook=entry.path, payload={"by": "plain"}, execution_id=eid))
        data = codec.encode(plain)
        wrote = await asyncio.gather(starter._write(asked), starter._write_plain(eid, data, over_inputs=False))
        assert sorted(wrote) == [False, True], (eid, wrote)
    kinds: set[str] = set()
    for eid in ids:
        status = await system.client.wait(eid, timeout=20)
        assert status.state == "COMPLETED", (eid, status.error)
        assert await system.client.result(eid) == {"b": 2}
        for step in ("a", "b"):
            assert (marks / f"{eid}.{step}").read_text() == "x", f"{eid}: step {step} ran more than once"
        await system.engine_idle()
        log = await execution_log(system.nc, system.layout, eid)
        starts = [s for s, d, _, _ in log if held_start(s, d) is not None]
        assert len(starts) == 1, (eid, starts)
        kinds.add(starts[0].split(".", 4)[4])
        # a starter whose ask was refused, late: checked over the inputs, it stores nothing
        late = await starter._record(eid, StartMessage(playbook=entry.path, payload={"by": "late"}, execution_id=eid))
        assert await starter._write_plain(eid, codec.encode(late), over_inputs=True) is False
        assert len(await execution_log(system.nc, system.layout, eid)) == len(log)
        await _replays_clean(system, eid, log)
    assert kinds  # which won varies: both orders are one execution


async def test_a_plain_start_stored_whose_puback_was_lost_is_reported_written(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain start record stored, its PubAck lost: the publish is sent again, and
    the server refuses the copy (the subject's check comes before the duplicate
    window's). The start found there is this call's, its bytes the ones it sent:
    written, not an existing execution's. The same start sent again later (by another
    handling: a start message delivered again, a request sent again) is an existing
    execution's, though its bytes are the same."""
    from actors.engine.starter import Starter
    from actors.natsio import publisher, publishing
    from actors.natsio.binding import codec_of
    from actors.wire.messages import StartMessage

    path = system.tmp / "three.yaml"
    path.write_text(THREE_STEPS)
    entry = await system.client.register(path)
    (starter,) = system.runtime.find(Starter)
    codec = codec_of(system.nc)
    eid = "puback-lost"
    subjects = system.layout.execution(eid)
    real_send, lost = publishing.send_nowait, []

    def lose_its_first_puback(
        nc: Any, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> Any:
        if subject == subjects.start and not lost:
            lost.append(reply)
            reply = "_INBOX.nobody.listens"
        return real_send(nc, subject, payload, reply, headers)

    monkeypatch.setattr(publishing, "send_nowait", lose_its_first_puback)  # what Publisher calls per publish
    monkeypatch.setattr(publisher(system.nc), "timeout", 0.5)  # the PubAck waited for
    record = await starter._record(eid, StartMessage(playbook=entry.path, payload={}, execution_id=eid))
    data = codec.encode(record)
    assert await starter._write_plain(eid, data, over_inputs=True) is True
    assert lost, "the fault was not injected"
    assert await starter._write_plain(eid, data, over_inputs=True) is False  # sent again: it exists
    other = await starter._record(eid, StartMessage(playbook=entry.path, payload={"k": 1}, execution_id=eid))
    assert await starter._write_plain(eid, codec.encode(other), over_inputs=True) is False
    assert (await system.client.wait(eid, timeout=20)).state == "COMPLETED"
    await system.engine_idle()
    assert len([s for s, d, _, _ in await execution_log(system.nc, system.layout, eid) if held_start(s, d)]) == 1


async def test_a_start_sent_again_while_asks_are_not_served_is_not_a_second_execution(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An execution started with its start stored with its first decision; later the
    same start is sent again ("one execution per id": a producer's retry, a trigger's
    redelivery) while no engine pod serves asks for the partition
    (ACTORS_FAST_ANSWERS=0, the roll back's step (1); or a partition between owners).
    The starter gets no responders and writes the plain start checked over the inputs
    all the same (`_write_plain`, `over_inputs`): refused, the start answer is found,
    nothing is stored, and the execution's step does not run again. (Review r6: checked
    over `in.start` alone, it was stored, and a fresh actor took it for the log's first
    input and ran the finished execution again.) Past the duplicate window: the second
    start's message id is another (what an id the server no longer remembers is to
    it), so the test waits for no window to pass."""
    from actors.engine import starter as starter_module

    marks = tmp_path / "marks"
    marks.mkdir()
    path = system.tmp / "marked.yaml"
    path.write_text(_marked(marks))
    entry = await system.client.register(path)
    eid = "started-again"
    await system.client.start(entry.path, execution_id=eid)
    assert (await system.client.wait(eid, timeout=20)).state == "COMPLETED"
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    assert is_start_answer(log[0][0])
    monkeypatch.setenv("ACTORS_FAST_ANSWERS", "0")
    await system.restart_roles(("engine",))
    monkeypatch.setattr(starter_module, "start_record_id", lambda eid_: f"{eid_}:start:past-the-window")
    await system.client.start(entry.path, execution_id=eid)  # to the starter (`start_execution` looks first)
    await system.engine_idle()
    assert await execution_log(system.nc, system.layout, eid) == log  # nothing stored
    assert (await system.client.status(eid)).state == "COMPLETED"  # type: ignore[union-attr]
    for step in ("a", "b"):
        assert (marks / f"{eid}.{step}").read_text() == "x", f"step {step} ran more than once"


async def test_an_engine_that_stored_a_start_and_stopped_before_replying_runs_it_once(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine stores the start with its first decision, then goes (its pod killed
    before the reply left): the starter's ask times out, it finds the start it asked
    for stored (`start_message`) and writes no other; a fresh engine takes the
    partition and the execution runs once, each step once."""
    from actors.engine.actor import Engine
    from actors.engine.starter import Starter
    from actors.wire.messages import StartMessage

    marks = tmp_path / "marks"
    marks.mkdir()
    path = system.tmp / "marked.yaml"
    path.write_text(_marked(marks))
    entry = await system.client.register(path)
    stored = asyncio.Event()
    real = Engine.ask

    async def stores_then_hangs(self: Engine, data: bytes, *, start: bool = False) -> str:
        said = await real(self, data, start=start)
        if said == "stored" and start:
            stored.set()
            await asyncio.Event().wait()  # no reply: the pod is gone before it leaves
        return said

    monkeypatch.setattr(Engine, "ask", stores_then_hangs)
    eid = "killed-after-store"
    (starter,) = system.runtime.find(Starter)
    record = await starter._record(eid, StartMessage(playbook=entry.path, payload={}, execution_id=eid))
    wrote = asyncio.ensure_future(starter._write(record))  # what handling its start message does
    await asyncio.wait_for(stored.wait(), timeout=20)
    monkeypatch.setattr(Engine, "ask", real)
    await system.restart_roles(("engine",))  # the stopping engine never replies; its asks are cancelled
    assert await wrote is True  # the ask timed out; the start found is the one it sent: written, by it
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "COMPLETED", status.error
    for step in ("a", "b"):
        assert (marks / f"{eid}.{step}").read_text() == "x", f"step {step} ran more than once"
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    assert is_start_answer(log[0][0])
    assert len([s for s, d, _, _ in log if held_start(s, d) is not None]) == 1
    await _replays_clean(system, eid, log)


async def test_a_start_answer_another_pod_stored_opens_the_log_without_reading_it(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start stored with its first decision by another engine pod (one that lost the
    partition before its delivery) reaches this pod's engine as the log's first input,
    delivered once: it opens the log (`opens_log`), and the fresh actor replays that one
    input from the message itself, holding its decision against the record, without
    reading the log; the execution then runs, each step once."""
    import time

    from actors.core.decide import fold
    from actors.core.state import Execution
    from actors.engine.actor import ExecutionActor
    from actors.engine.starter import Starter
    from actors.natsio import EXPECTED_LAST_SUBJECT_FILTER, EXPECTED_LAST_SUBJECT_SEQUENCE
    from actors.natsio.binding import codec_of
    from actors.runtime.outbox import carrier_message, holdable
    from actors.wire.events import DecisionRecord
    from actors.wire.messages import StartMessage
    from streams import ids

    marks = tmp_path / "marks"
    marks.mkdir()
    path = system.tmp / "marked.yaml"
    path.write_text(_marked(marks))
    entry = await system.client.register(path)
    eid = "stored-elsewhere"
    read: list[str] = []
    real_read = ExecutionActor.read_log

    async def reading(self: ExecutionActor, *args: Any, **kwargs: Any) -> Any:
        read.append(self.execution_id)
        return await real_read(self, *args, **kwargs)

    monkeypatch.setattr(ExecutionActor, "read_log", reading)
    (starter,) = system.runtime.find(Starter)
    record = await starter._record(eid, StartMessage(playbook=entry.path, payload={}, execution_id=eid))
    codec = codec_of(system.nc)
    data = codec.encode(record)
    subjects = system.layout.execution(eid)
    at = time.time()
    fx = fold(Execution(execution_id=eid), record, seq=0, at=at, subjects=subjects)  # as the other pod folded it
    held = DecisionRecord(cause=0, events=fx.events, command=holdable(codec, fx), answer=msgspec.Raw(data), at=at)
    type_, body = carrier_message(codec, fx.lifecycle, held)
    await system.nc.jetstream().publish(
        subjects.answer_lifecycle(type_, fx.commands[0].kind),
        body,
        headers={
            "Nats-Msg-Id": ids.start_record_id(eid),
            EXPECTED_LAST_SUBJECT_SEQUENCE: "0",
            EXPECTED_LAST_SUBJECT_FILTER: subjects.inputs,
        },
    )
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "COMPLETED", status.error
    for step in ("a", "b"):
        assert (marks / f"{eid}.{step}").read_text() == "x", f"step {step} ran more than once"
    assert eid not in read  # opened from the message: no read of the log, then live
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    assert is_start_answer(log[0][0]) and len([s for s, _, _, _ in log if is_start_answer(s)]) == 1
    assert not [s for s, _, _, _ in log if class_of(s) in ("ev", "lc")]  # nothing of the first decision again
    await _replays_clean(system, eid, log)


WAIT_FIRST = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: wait_first}
workflow:
  - step: hold
    tool: {kind: wait, signal: go}
    next: done
  - step: done
    tool: noop
"""


@pytest.mark.timeout(180)
async def test_a_plain_copy_of_the_start_makes_an_engine_of_5_halt_and_6_resume_it(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll back from 6 to 5 (docs/upgrades.md "From 5 to 6"), with a real engine pod
    of semantics 5 (the last commit of 5, checked out here). An execution of 6 waits for
    a signal, its start stored with its first decision; (1) the engine pods stop serving
    asks (ACTORS_FAST_ANSWERS=0); (3) `actors-cli prepare-rollback` writes a plain copy
    of its start on `in.start` (not of an execution that ended; run again, nothing
    new), which the engine of 6 folds as a second start, deciding nothing; (4) an engine
    of 5 takes over: the signal reaches it and it halts at the copy (`SemanticsUnknown`)
    and stores no decision. Without the copy it stored `signal.kept` as the decision of
    the signal (it folded the signal into a state that never started: its replay stops
    comparing at the start answer), which 6 later halted on for good (review r6). Once
    6 is back it resumes the execution, and the signal 5 held comes back to it: the
    execution completes."""
    from actors.wire.messages import SignalSent
    from tests.support.cli import cli
    from tests.support.pods import SEMANTICS_5, PodProcess, checkout

    wait_first = system.tmp / "wait_first.yaml"
    wait_first.write_text(WAIT_FIRST)
    path = (await system.client.register(wait_first)).path
    eid = "six-then-five"
    await system.client.start(path, execution_id=eid)
    ended, status = await system.run_yaml(THREE_STEPS)  # ended: left alone
    assert status.state == "COMPLETED"

    async def waiting() -> bool:
        st = await system.client.status(eid)
        return st is not None and bool(st.waiting)

    await wait_for(waiting, timeout=20)
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    ended_log = await execution_log(system.nc, system.layout, ended)
    assert is_start_answer(log[0][0]) and is_start_answer(ended_log[0][0])
    # (1) no more asks: starts and results stored plain from now on
    monkeypatch.setenv("ACTORS_FAST_ANSWERS", "0")
    await system.restart_roles(("engine",))
    # (3) the copies
    ran = await cli("prepare-rollback", url=system.server.url)
    assert (ran.code, ran.out) == (
        0,
        "1 executions not ended: 1 start copies written, 0 written before, 0 started plain (nothing to do)\n",
    ), ran
    await system.engine_idle()
    copied = await execution_log(system.nc, system.layout, eid)
    assert [s.split(".", 3)[3] for s, _, _, _ in copied[len(log) :]] == ["in.start"]  # and nothing decided for it
    assert copied[-1][1] == held_start(log[0][0], log[0][1])  # the start record as its starter sent it
    ran = await cli("prepare-rollback", "--json", url=system.server.url)
    assert ran.code == 0 and json.loads(ran.out) == {"running": 1, "copied": 0, "copied_before": 1, "plain": 0}, ran
    assert await execution_log(system.nc, system.layout, eid) == copied
    assert await execution_log(system.nc, system.layout, ended) == ended_log  # ended: left alone
    # (4) an engine pod of 5 in this one's place
    await system.stop_roles(("engine",))
    with checkout(SEMANTICS_5, tmp_path / "semantics5") as code:
        five = await PodProcess.start(
            "engine", url=system.server.url, layout=system.layout, logs=tmp_path, name="engine5", code=code
        )
        try:
            await five.ready()
            await system.client.signal(eid, "go")

            async def halted_by_five() -> list[Any]:
                return [i.data for i in await system.events(eid) if i.type == "execution.halted"]

            halts = await wait_for(halted_by_five, timeout=60, interval=0.1)
        finally:
            await five.stop()
    assert [h["kind"] for h in halts] == ["SemanticsUnknown"], halts
    after = await execution_log(system.nc, system.layout, eid)
    signal_seq = next(seq for s, d, seq, _ in after if s.endswith(".in.signal"))
    by_five = [s.split(".", 3)[3] for s, _, seq, _ in after if seq > signal_seq]
    assert by_five == ["lc.execution.halted"], by_five  # no decision of 5's
    assert isinstance(input_decoder.decode(next(d for s, d, _, _ in after if s.endswith(".in.signal"))), SignalSent)
    # roll forward: 6 again resumes it at the copy, and the signal comes back to it
    await system.start_roles(("engine",))
    status = await system.client.wait(eid, timeout=60)
    assert status.state == "COMPLETED", status
    items = await system.events(eid)
    assert [i.type for i in items if i.type.startswith("execution.")][-2:] == ["execution.halted", "execution.resumed"]


LAST_FAILS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fast_last_fails}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    next: b
  - step: b
    tool: {kind: python, code: "def main(x): raise ValueError('no')"}
    args: {x: "{{ a }}"}
"""


async def test_a_last_step_that_fails_stores_its_end_in_its_answer_record(system: System) -> None:
    eid, status = await system.run_yaml(LAST_FAILS)
    assert status.state == "FAILED"
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    kinds = [s.split(".", 3)[3] for s, _, _, _ in log]
    assert kinds[-1] == "in.answer.lc.playbook.failed", kinds
    assert not [k for k in kinds if k.startswith("lc.playbook.failed")]
    status, end = await system.client.terminal(eid)
    assert status.state == "FAILED" and status.terminal_event == "playbook.failed"
    assert end is not None and end.type == "playbook.failed"
    with pytest.raises(ExecutionFailed):
        await system.client.result(eid)
    listed = await system.client.list(state="FAILED")
    assert eid in [s.execution_id for s in listed]
    replay = replay_execution(eid, await _records(system, log), subjects=system.layout.execution(eid))
    assert replay.mismatch is None, replay.mismatch.describe()
    assert replay.state.status == "FAILED"


async def test_a_redelivered_command_whose_answer_is_in_an_answer_record_is_answered(system: System) -> None:
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED"
    log = await execution_log(system.nc, system.layout, eid)
    (carrier,) = [(d, seq) for s, d, seq, _ in log if s.endswith(".lc.playbook.initialized.cmd.python")]
    held = embedded_command(carrier[0])
    assert held is not None
    first = command_decoder.decode(held)  # step a's: its result is held by the next record
    assert first.ask_on is not None and first.step == "a"
    assert await is_answered(system.nc, EXEC_STREAM, first, after=carrier[1])
    other = msgspec.structs.replace(first, command_id=first.command_id + "-not-run")
    assert not await is_answered(system.nc, EXEC_STREAM, other, after=carrier[1])


async def test_a_fresh_engine_replays_a_log_with_answer_records_and_runs_no_step_twice(system: System) -> None:
    eid = await system.start_yaml(WAITS_BETWEEN)

    async def waiting() -> bool:
        status = await system.client.status(eid)
        return status is not None and bool(status.waiting)

    await wait_for(waiting, timeout=20)
    await system.engine_idle()
    before = await execution_log(system.nc, system.layout, eid)
    assert any(is_answer_record(s) for s, _, _, _ in before)  # a's result is held by a record
    await system.restart_roles(("engine",))
    await system.client.signal(eid, "go")
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    answered = _answered(log)
    assert len(answered) == 3 and len(set(answered)) == 3  # a, b, c: each once
    items = await system.events(eid)
    assert sorted(i.step or "" for i in items if i.type == "call.done") == ["a", "b", "c"]
    await _replays_clean(system, eid, log)


async def test_parallel_steps_fall_back_where_they_must_and_complete(system: System) -> None:
    eid, status = await system.run_yaml(FAN_IN)
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(eid) == 5
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    answered = _answered(log)
    assert len(answered) == 4 and len(set(answered)) == 4 and None not in answered
    # a's decision issues two commands: never one record; its result is plain
    items = await system.events(eid)
    assert sorted(i.step or "" for i in items if i.type == "call.done") == ["a", "end", "p", "q"]
    await _replays_clean(system, eid, log)


async def test_a_tool_log_consumer_of_an_older_deployment_gets_the_answer_records_filter(system: System) -> None:
    """A deployment upgraded from semantics 4 has tool log consumers without
    `in.answer.cmd.<kind>`: declaring the streams again (an engine pod's start) gives
    them the new filter, or the commands answer records hold would never be delivered."""
    from nats.js.api import ConsumerConfig

    from streams.layout import ensure, tool_log_consumer
    from streams.subjects import tool_log_filters

    jsm = system.nc.jsm()
    name = tool_log_consumer("python")
    info = await jsm.consumer_info(EXEC_STREAM, name)
    old = [f for f in tool_log_filters("python") if ".in.answer." not in f]
    config: ConsumerConfig = info.config
    config.filter_subjects = old
    config.filter_subject = None
    await jsm.add_consumer(EXEC_STREAM, config)  # as a deployment of semantics 4 made it
    assert sorted((await jsm.consumer_info(EXEC_STREAM, name)).config.filter_subjects or []) == sorted(old)
    await ensure(system.nc.jetstream(), system.layout)
    found = (await jsm.consumer_info(EXEC_STREAM, name)).config.filter_subjects or []
    assert sorted(found) == sorted(tool_log_filters("python"))


async def test_a_live_actor_that_did_not_write_an_answer_record_replays_it_and_sends_nothing_again(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a handover two engine pods may hold one execution for a moment: the one
    that did not store an answer record meets it live, after the last input it folded.
    It rebuilds by replay, which folds the answer with the record's cause, holds the
    decision against the record, and sends nothing of it again (the record holds it: a
    second copy of its command would run the step twice)."""
    import copy

    from actors.engine.actor import ExecutionActor

    real = ExecutionActor.store_answer
    done: list[int] = []

    async def as_another_pod(self: ExecutionActor, data: bytes, inp: Any) -> str:
        if done:
            return await real(self, data, inp)
        state, last = copy.deepcopy(self.state), self.last_seq
        said = await real(self, data, inp)
        if said == "stored":
            done.append(self.last_seq)
            self.state, self.last_seq = state, last  # this actor never folded it: it is another pod's record
        return said

    monkeypatch.setattr(ExecutionActor, "store_answer", as_another_pod)
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED", status.error
    assert done, "no answer record was stored"
    assert await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    # no decision sent again: each step's command held once (a second copy would run it
    # twice), the end stored once (the actor that meets the record rebuilds by replay,
    # which finds the record's decision stored; a later step may fall back to a plain
    # result while it replays, whose decision then is a record of its own)
    held = [embedded_command(d) for s, d, _, _ in log if ".cmd." in s]
    assert sorted(command_decoder.decode(h).step for h in held if h is not None) == ["a", "b", "c"]
    assert len([s for s, _, _, _ in log if s.endswith(".lc.playbook.completed")]) == 1
    answered = _answered(log)
    assert len(answered) == 3 and len(set(answered)) == 3
    await _replays_clean(system, eid, log)


async def test_a_step_whose_decision_did_not_fit_is_refused_before_its_fold_next_time(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a's decision issues two commands (a fan-out): folded once, refused, and
    remembered; the next execution's ask for a is refused before the fold (no replay
    wasted). `actors_answer_asks_total` counts each outcome. Which steps were folded is
    read from the engine itself: p and q ask at once, and under load one of them may be
    refused after its fold too (the other's plain result reached the log meanwhile), so
    the counter alone cannot say that a was not folded again."""
    from actors.engine.actor import ExecutionActor
    from actors.runtime.metrics import ANSWER_ASKS

    def counts() -> dict[str, float]:
        return {o: ANSWER_ASKS.value(outcome=o) for o in ("stored", "refused_before_fold", "refused_after_fold")}

    folded: list[tuple[str, str]] = []  # (execution, step) of every ask folded
    store_answer = ExecutionActor.store_answer

    async def spied(self: ExecutionActor, data: bytes, inp: Any) -> str:
        folded.append((self.key, self.state.activations[self.state.by_command[inp.command_id]].step))
        return await store_answer(self, data, inp)

    monkeypatch.setattr(ExecutionActor, "store_answer", spied)
    before = counts()
    first, status = await system.run_yaml(FAN_IN)
    assert status.state == "COMPLETED", status.error
    after_first = counts()
    assert (first, "a") in folded
    assert after_first["refused_after_fold"] > before["refused_after_fold"]  # a's fan-out, folded once
    second, status = await system.run_yaml(FAN_IN)
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(second) == 5
    after_second = counts()
    assert (second, "a") not in folded  # a known: not folded again
    assert after_second["refused_before_fold"] > after_first["refused_before_fold"]
    assert after_second["stored"] > after_first["stored"]


async def test_the_projector_consumer_of_an_older_deployment_gets_the_answer_lifecycle_filter(system: System) -> None:
    """A deployment upgraded from semantics 4 has a projector consumer filtering only
    `exec.*.*.lc.>`: declaring the streams again gives it `exec.*.*.in.answer.lc.>` too,
    or the ends stored in answer records would never be projected."""
    from nats.js.api import ConsumerConfig

    from streams.layout import PROJECTOR_CONSUMER, PROJECTOR_FILTER, ensure
    from streams.subjects import LIFECYCLE_FILTER

    jsm = system.nc.jsm()
    info = await jsm.consumer_info(EXEC_STREAM, PROJECTOR_CONSUMER)
    config: ConsumerConfig = info.config
    assert sorted(config.filter_subjects or []) == sorted(PROJECTOR_FILTER)
    config.filter_subjects = None
    config.filter_subject = LIFECYCLE_FILTER
    await jsm.add_consumer(EXEC_STREAM, config)  # as a deployment of semantics 4 made it
    assert (await jsm.consumer_info(EXEC_STREAM, PROJECTOR_CONSUMER)).config.filter_subject == LIFECYCLE_FILTER
    await ensure(system.nc.jetstream(), system.layout)
    found = await jsm.consumer_info(EXEC_STREAM, PROJECTOR_CONSUMER)
    assert sorted(found.config.filter_subjects or []) == sorted(PROJECTOR_FILTER)
    _, status = await system.run_yaml(THREE_STEPS)  # its end, in an answer record, projected
    assert status.state == "COMPLETED"


async def test_declaring_the_streams_never_narrows_a_consumers_filters(system: System) -> None:
    """An engine pod of an older release declaring the streams again (a rollback, or
    one old pod left in a roll) must not drop a filter a newer one added: answer
    records stored meanwhile would never be delivered. Declaring only widens: an
    existing consumer's extra filter is kept."""
    from nats.js.api import ConsumerConfig

    from streams.layout import ensure, tool_log_consumer
    from streams.subjects import tool_log_filters

    jsm = system.nc.jsm()
    name = tool_log_consumer("python")
    config: ConsumerConfig = (await jsm.consumer_info(EXEC_STREAM, name)).config
    extra = "exec.*.*.in.later.python"  # what a later release's filter could be
    config.filter_subjects = [*tool_log_filters("python"), extra]
    config.filter_subject = None
    await jsm.add_consumer(EXEC_STREAM, config)
    await ensure(system.nc.jetstream(), system.layout)
    found = (await jsm.consumer_info(EXEC_STREAM, name)).config.filter_subjects or []
    assert sorted(found) == sorted([*tool_log_filters("python"), extra])


async def test_a_failure_after_the_fold_rebuilds_the_actor_and_the_execution_completes(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything raised between the fold and the publish (here: holding the command)
    refuses the ask and resets the actor: its state moved with the fold, and left so
    it would take the tool's plain result for a duplicate and stall RUNNING."""
    import actors.engine.actor as engine_actor

    real = engine_actor.holdable
    failed: list[bool] = []

    def fails_once(codec: Any, fx: Any) -> Any:
        if not failed:
            failed.append(True)
            raise RuntimeError("between the fold and the publish")
        return real(codec, fx)

    monkeypatch.setattr(engine_actor, "holdable", fails_once)
    eid, status = await system.run_yaml(THREE_STEPS, timeout=20)
    assert failed
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    answered = _answered(log)
    assert len(answered) == 3 and len(set(answered)) == 3
    await _replays_clean(system, eid, log)


async def test_an_answer_records_time_is_never_before_the_logs(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod whose clock is behind: the time recorded in an answer record is at least
    the time of the input it follows (its log time; an answer record's, the time it
    records) (deterministic either way: it is recorded). A start stored with its first
    decision (semantics 6) follows no input: it records the pod's clock, and the
    records after it never go back from it."""
    import time as real
    import types

    import actors.engine.actor as engine_actor

    behind = 3600.0  # an hour (not days: retention reads an end's time)
    monkeypatch.setattr(engine_actor, "time", types.SimpleNamespace(time=lambda: real.time() - behind))
    six, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED", status.error
    await older_engines_live(monkeypatch, system.runtime, semantics=5)  # a plain start: the log's time first
    five, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED", status.error
    await system.engine_idle()
    for eid in (five, six):
        log = await execution_log(system.nc, system.layout, eid)
        last_in = 0.0
        records = []
        for subject, data, _, at in log:
            if is_answer_record(subject):
                recorded = answer_decoder.decode(data).record.at
                assert recorded is not None and recorded >= last_in
                records.append(recorded)
                last_in = recorded  # the time it is folded with
            elif class_of(subject) == "in":
                last_in = at
        if eid == five:  # each follows a plain start, stored at the log's time
            assert len(records) == 3 and min(records) >= log[0][3]
        else:  # the start's own is the pod's
            assert len(records) == 4 and records[0] < log[0][3] - behind / 2
        await _replays_clean(system, eid, log)


async def test_an_engine_told_not_to_serves_no_asks_and_results_are_stored_plain(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACTORS_FAST_ANSWERS=0 (the first step of a roll back to a release before 5 or
    6): the engine does not subscribe `answer.<p>`, starters and tools get no
    responders and write the start record and results plain; the execution, still of
    semantics 6, completes."""
    from actors.engine.actor import Engine

    monkeypatch.setenv("ACTORS_FAST_ANSWERS", "0")
    await system.restart_roles(("engine",))
    engine = next(a for a in system.runtime.actors if isinstance(a, Engine))
    assert not engine.fast_answers and engine._asks == {}
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(eid) == {"c": 3}
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    # the starter's ask had no responders either: a plain start record (semantics 6)
    assert log[0][0].endswith(".in.start") and input_decoder.decode(log[0][1]).semantics == 6
    assert not [s for s, _, _, _ in log if is_answer_record(s)]
    answered = _answered(log)
    assert len(answered) == 3 and len(set(answered)) == 3 and None not in answered
    await _replays_clean(system, eid, log)


TWO_APPROVALS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fast_two_approvals}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    next: w1
  - step: w1
    tool: {kind: wait, signal: first, approval: true}
    next: b
  - step: b
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ a }}"}
    next: w2
  - step: w2
    tool: {kind: wait, signal: second, approval: true}
    next: c
  - step: c
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ b }}"}
"""


async def test_approvals_entered_by_answer_records_show_in_the_status_and_are_approved(system: System) -> None:
    """A wait entered by a step result's answer record (`in.answer.lc.execution.waiting`,
    cause minus the input it followed) is newer than the waits an earlier plain input
    set: the status shows it, so a user can approve it (the projector orders waits by
    their place in the log, not by the sign of the cause)."""
    eid = await system.start_yaml(TWO_APPROVALS)

    async def waiting_on(step: str) -> bool:
        status = await system.client.status(eid)
        return status is not None and [w.step for w in status.waiting or []] == [step]

    for step in ("w1", "w2"):
        await wait_for(lambda s=step: waiting_on(s), timeout=20)  # type: ignore[misc]
        reply = await system.client.approve(eid, step, comment="ok")
        assert reply.accepted
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "COMPLETED"
    assert await system.client.result(eid) == {"c": 3}
    log = await execution_log(system.nc, system.layout, eid)
    # both waits were entered by a step result stored with its decision (no deadline:
    # a wait with one arms a timer, which no answer record holds)
    assert sum(1 for s, _, _, _ in log if s.endswith("in.answer.lc.execution.waiting")) == 2
