"""Semantics 5: a step's result stored with the decision it leads to, as one input
(`exec.<p>.<id>.in.answer.cmd.<kind>` or `in.answer.ev`; docs/architecture.md "The next
layout", item 2). The tool asks the partition's engine pod (`Command.ask_on`); the
engine folds the result at once and stores the record only if nothing reached the
execution's inputs since the last one it folded. Anything else: the tool publishes
the plain result, as before. The log replays as it ran, readers see every result, a
redelivered command whose answer is in a record is not run again, and a fresh engine
replaying such a log finishes the execution with no step run twice."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from actors.client.outcome import ExecutionFailed
from actors.core.replay import LogRecord, answer_records, lifecycle_records, replay_execution
from actors.engine.readback import read_back
from actors.natsio import is_answered
from actors.wire.events import answer_decoder, decision_decoder, embedded_command, event_decoder, extras_decoder
from actors.wire.messages import command_decoder, command_of_answer, command_of_record_answer, input_decoder
from streams.layout import CMD_STREAM, EXEC_STREAM, class_of
from streams.subjects import is_answer_record
from tests.conftest import System, wait_for
from tests.support.natsio import execution_log
from tests.support.playbooks import THREE_STEPS

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
            records += answer_records(seq, subject, record, input_decoder.decode(bytes(record.answer)), whole.lifecycle)
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
    """The command each stored result answers, plain or held by an answer record."""
    out = []
    for subject, data, _, _ in log:
        if is_answer_record(subject):
            out.append(command_of_record_answer(data))
        elif class_of(subject) == "in" and ".in.result" in subject:
            out.append(command_of_answer(data))
    return out


async def test_three_steps_store_five_messages_three_of_them_a_result_with_its_decision(system: System) -> None:
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
    held = [embedded_command(d) for s, d, _, _ in log if ".cmd." in s]
    assert [command_decoder.decode(h).step for h in held if h is not None] == ["a", "b", "c"]
    answered = _answered(log)
    assert len(answered) == 3 and len(set(answered)) == 3 and None not in answered
    assert (await system.nc.jsm().stream_info(CMD_STREAM)).state.last_seq == 0
    # each answer record's cause is minus the sequence of the input it followed (the
    # engine's own records in between are not inputs)
    last_input = 0
    for subject, data, seq, _ in log:
        if is_answer_record(subject):
            assert answer_decoder.decode(data).record.cause == -last_input
        if class_of(subject) == "in":
            last_input = seq
    await _replays_clean(system, eid, log)
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


async def test_a_step_whose_decision_did_not_fit_is_refused_before_its_fold_next_time(system: System) -> None:
    """a's decision issues two commands (a fan-out): folded once, refused, and
    remembered; the next execution's ask for a is refused before the fold (no replay
    wasted). `actors_answer_asks_total` counts each outcome."""
    from actors.runtime.metrics import ANSWER_ASKS

    def counts() -> dict[str, float]:
        return {o: ANSWER_ASKS.value(outcome=o) for o in ("stored", "refused_before_fold", "refused_after_fold")}

    before = counts()
    _, status = await system.run_yaml(FAN_IN)
    assert status.state == "COMPLETED", status.error
    after_first = counts()
    assert after_first["refused_after_fold"] > before["refused_after_fold"]  # a's fan-out, folded once
    second, status = await system.run_yaml(FAN_IN)
    assert status.state == "COMPLETED", status.error
    assert await system.client.result(second) == 5
    after_second = counts()
    assert after_second["refused_after_fold"] == after_first["refused_after_fold"]  # a known: not folded again
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
    records) (deterministic either way: it is recorded)."""
    import types

    import actors.engine.actor as engine_actor

    monkeypatch.setattr(engine_actor, "time", types.SimpleNamespace(time=lambda: 1000.0))  # 1970
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED", status.error
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    last_in = 0.0
    records = 0
    for subject, data, _, at in log:
        if is_answer_record(subject):
            recorded = answer_decoder.decode(data).record.at
            assert recorded is not None and recorded >= last_in > 1000.0
            records += 1
            last_in = recorded  # the time it is folded with
        elif class_of(subject) == "in":
            last_in = at
    assert records == 3
    await _replays_clean(system, eid, log)


async def test_an_engine_told_not_to_serves_no_asks_and_results_are_stored_plain(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACTORS_FAST_ANSWERS=0 (the first step of a roll back to a release before 5):
    the engine does not subscribe `answer.<p>`, tools get no responders and publish
    their results plain; the execution, still of semantics 5, completes."""
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
