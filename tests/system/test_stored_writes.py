"""How a decision is stored, per semantics (docs/architecture.md "Stored writes").

From semantics 6 an execution's start is stored with its first decision, and each
step's result with the decision it leads to: a 3-step workflow stores 4 messages in
EXEC (the start, then one per step).

From semantics 2 on, a decision with lifecycle events is one message: the carrier
event (`lc.playbook.*`) holds the decision record and the decision's other lifecycle
events; and a decision that issues one command to a tool (and has no lifecycle event)
holds the command in its record (`ev.cmd.<kind>`, or `lc.<type>.cmd.<kind>` for the
first decision), where tool actors take it: the command is not stored a second time
in CMD. From semantics 4 on, every result of an execution is on one subject
(`in.result`), the command named in it. An execution started under semantics 1 (while
engine pods of semantics 1 still run, during a rolling upgrade) is continued in the
format it started with, a subject per result too, so an older pod that takes it over
still reads every record it wrote. Either way the replay
reproduces every decision, and the user sees every event once, the status and the result."""

from __future__ import annotations

import pytest

from actors.core.replay import LogRecord, answer_records, lifecycle_records, replay_execution
from actors.engine.readback import read_back
from actors.wire.events import answer_decoder, decision_decoder, embedded_command, event_decoder, extras_decoder
from actors.wire.messages import command_decoder, command_of_answer, input_decoder
from streams.layout import CMD_STREAM, EXEC_STREAM, INDEX_STREAM, class_of
from streams.subjects import is_answer_record
from tests.conftest import System
from tests.support.natsio import THREE_STEPS_ANSWERED, execution_log, log_kinds
from tests.support.playbooks import THREE_STEPS
from tests.support.semantics import older_engines_live

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def _replays_clean(system: System, eid: str, log: list[tuple[str, bytes, int, float]]) -> None:
    records: list[LogRecord] = []
    for subject, data, seq, at in log:
        cls = class_of(subject)
        if is_answer_record(subject):  # a result, or the start (6), with its decision
            whole = answer_decoder.decode(data)
            assert whole.record.answer is not None
            answer = await read_back(system.nc.jetstream(), input_decoder.decode(bytes(whole.record.answer)))
            records += answer_records(seq, subject, whole.record, answer, whole.lifecycle)
        elif cls == "in":
            records.append(
                LogRecord(seq, subject, at, cls, await read_back(system.nc.jetstream(), input_decoder.decode(data)))
            )
        elif cls == "ev":
            records.append(LogRecord(seq, subject, at, cls, decision_decoder.decode(data)))
        elif cls == "lc":
            records += lifecycle_records(seq, subject, at, event_decoder.decode(data), extras_decoder.decode(data))
    replay = replay_execution(eid, records, subjects=system.layout.execution(eid))
    assert replay.mismatch is None, replay.mismatch.describe()
    assert replay.state.status == "COMPLETED"


async def _sees_it_whole(system: System, eid: str) -> None:
    items = await system.events(eid)
    lifecycle = [i.type for i in items if i.cls == "lc"]
    assert lifecycle == ["playbook.initialized", "workflow.initialized", "workflow.completed", "playbook.completed"]
    assert [i.step for i in items if i.type == "step.enter"] == ["a", "b", "c", "end"]
    assert await system.client.result(eid) == {"c": 3}


async def test_an_execution_of_semantics_6_stores_four_messages_in_exec(system: System) -> None:
    """The start stored with its first decision (the starter asks the engine, as a
    step's tool does), then each step's result with the decision it leads to, the last
    with the execution's end: EXEC grows by 4, nothing goes to CMD."""
    jsm = system.nc.jsm()
    exec_before = (await jsm.stream_info(EXEC_STREAM)).state.last_seq
    index_before = (await jsm.stream_info(INDEX_STREAM)).state.last_seq
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED" and status.playbook is not None
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    assert log_kinds(log) == THREE_STEPS_ANSWERED
    assert (await jsm.stream_info(EXEC_STREAM)).state.last_seq - exec_before == 4
    assert (await jsm.stream_info(INDEX_STREAM)).state.last_seq - index_before == 1
    assert (await jsm.stream_info(CMD_STREAM)).state.last_seq == 0
    await _replays_clean(system, eid, log)
    await _sees_it_whole(system, eid)


async def test_an_execution_of_semantics_2_to_4_stores_its_first_and_last_decisions_as_one_message_each(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    # semantics 5 stores a result with its decision (tests/system/test_fast_answers.py)
    await older_engines_live(monkeypatch, system.runtime, semantics=4)
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED" and status.playbook is not None
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    kinds = [".".join(s.split(".")[3:5]) for s, _, _, _ in log]
    # start, first decision (carried by playbook.initialized), then a result and its
    # decision per step, each middle decision holding the next step's command (which
    # the python tool actors took from the log), the last carried by playbook.completed
    assert kinds == [
        "in.start",
        "lc.playbook",
        "in.result",
        "ev.cmd",
        "in.result",
        "ev.cmd",
        "in.result",
        "lc.playbook",
    ]
    # semantics 4: every result on the execution's one results subject, naming its command
    results = [(s, d) for s, d, _, _ in log if class_of(s) == "in" and ".in.result" in s]
    assert {s for s, _ in results} == {system.layout.execution(eid).results}
    answered = [command_of_answer(d) for _, d in results]
    assert len(set(answered)) == 3 and None not in answered
    held = [embedded_command(d) for s, d, _, _ in log if ".cmd." in s]
    assert [s.split(".", 3)[3] for s, _, _, _ in log if ".cmd." in s] == [
        "lc.playbook.initialized.cmd.python",
        "ev.cmd.python",
        "ev.cmd.python",
    ]
    assert [command_decoder.decode(h).step for h in held if h is not None] == ["a", "b", "c"]
    # every command was held by its decision, none went to CMD: the first step's by the
    # record that `playbook.initialized` carries, on a subject that names its kind too
    assert (await system.nc.jsm().stream_info(CMD_STREAM)).state.last_seq == 0
    _, last = (lc for lc in log if class_of(lc[0]) == "lc")
    assert last[0].endswith(".lc.playbook.completed")
    carried = extras_decoder.decode(last[1])
    assert carried.decision is not None and [e.type for e in carried.before] == ["workflow.completed"]
    await _replays_clean(system, eid, log)
    await _sees_it_whole(system, eid)


async def test_an_execution_started_under_semantics_1_keeps_its_format_for_older_pods(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    await older_engines_live(monkeypatch, system.runtime)  # mid-roll: engine pods of semantics 1 live
    eid, status = await system.run_yaml(THREE_STEPS)
    assert status.state == "COMPLETED"
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    lc = [(s, d) for s, d, _, _ in log if class_of(s) == "lc"]
    # one message per lifecycle event, each a plain event (what a pod of semantics 1 reads)
    assert [s.split(".lc.", 1)[1] for s, _ in lc] == [
        "playbook.initialized",
        "workflow.initialized",
        "workflow.completed",
        "playbook.completed",
    ]
    assert all(extras_decoder.decode(d).empty for _, d in lc)
    # a record for every decision, on `ev.decision`, holding no command: commands went to CMD
    assert [s.rsplit(".", 2)[1:] for s, _, _, _ in log if class_of(s) == "ev"] == [["ev", "decision"]] * 4
    assert not [d for s, d, _, _ in log if class_of(s) == "ev" and embedded_command(d) is not None]
    assert (await system.nc.jsm().stream_info(CMD_STREAM)).state.last_seq == 3
    # a subject per result (semantics 3 and before), as an older pod's replay reads them
    results = [(s, command_of_answer(d)) for s, d, _, _ in log if ".in.result" in s]
    assert len({s for s, _ in results}) == 3
    assert all(c is not None and s == system.layout.execution(eid).result(c) for s, c in results)
    await _replays_clean(system, eid, log)
    await _sees_it_whole(system, eid)
