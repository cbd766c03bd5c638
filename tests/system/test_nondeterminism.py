"""Nondeterminism is detected, not acted on (issue #32): an engine whose rules decide
otherwise than the log records halts that execution at the first differing record,
says so in its status, publishes nothing for it, and leaves every other execution
alone; the code that decides as the log does (a rollback) resumes it. Also the
Replayer itself, on a recorded log, and a start record of semantics this code does
not know."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import msgspec
import pytest

import actors.core.work as work
from actors.cli.live import follow_steps
from actors.core.replay import NONDETERMINISM, SEMANTICS, SEMANTICS_UNKNOWN, Mismatch, replay_execution
from actors.engine.actor import Engine
from actors.natsio import stream_seq
from actors.runtime.metrics import HALTED_REPLAYS
from actors.wire.events import (
    CommandIssuedEvent,
    DecisionRecord,
    ExecState,
    answer_decoder,
    decision_decoder,
    lifecycle_message,
)
from actors.wire.messages import CallDone, StartRecord, encode
from streams import ids
from streams.layout import EXEC_STREAM
from tests.conftest import System, of_type, wait_for
from tests.harness import PENDING, Harness, log_of, mismatch, replay
from tests.harness.folds import exec_subjects

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"

# `first` routes to `wait`, which runs until the test creates a file: the execution is
# mid-way (a command in flight) when the engine is replaced
WAITS = (
    HEAD % "halts"
    + """  - step: first
    tool: {kind: python, code: "def main(): return {'n': 1}"}
    next:
      - when: "{{ result.n == 1 }}"
        then: wait
      - else: other
  - step: wait
    timeout: 60
    tool:
      kind: python
      code: |
        import os, time
        def main(p):
            while not os.path.exists(p):
                time.sleep(0.02)
            return 'waited'
    args: {p: "{{ workload.p }}"}
  - step: other
"""
)
QUICK = HEAD % "quick" + "  - step: only\n    args: {x: 1}\n"


def _rerouted(original: Any) -> Any:
    """`work._route` with one rule changed: step `first` now routes to `other`."""

    def route(ex: Any, act: Any, step: Any, result: Any) -> list[str]:
        return ["other"] if step.step == "first" else list(original(ex, act, step, result))

    return route


async def _log(system: System, eid: str) -> list[tuple[str, bytes, int]]:
    """Every message the execution's log holds, as stored."""
    prefix = system.layout.exec_prefix(eid)
    sub = await system.nc.jetstream().subscribe(f"{prefix}.>", stream=EXEC_STREAM, ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            out.append((msg.subject, msg.data, stream_seq(msg)))
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


def _nothing_twice(log: list[tuple[str, bytes, int]]) -> None:
    """One decision record per input, one lifecycle event per type (halts and resumes
    once each), one command per activation attempt."""
    # decision records: on `ev.decision` or `ev.cmd.<kind>`, or carried by a lifecycle event (semantics 2)
    records = [decision_decoder.decode(d) for s, d, _ in log if ".ev." in s]
    records += [r for s, d, _ in log if ".lc." in s for r in [lifecycle_message(d)[0]] if r is not None]
    causes = [r.cause for r in records]
    assert len(causes) == len(set(causes)), f"a decision recorded twice: {causes}"
    lifecycle = collections.Counter(e.type for s, d, _ in log if ".lc." in s for e in lifecycle_message(d)[1])
    assert all(n == 1 for n in lifecycle.values()), lifecycle
    issued = [
        (e.data.activation, e.data.attempt_number)
        for r in records
        for e in r.events
        if isinstance(e, CommandIssuedEvent)
    ]
    assert len(issued) == len(set(issued)), issued


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_changed_rule_halts_the_execution_and_a_rollback_resumes_it(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "go"
    eid = await system.start_yaml(WAITS, payload={"p": str(gate)})

    async def waiting() -> bool:
        return bool(of_type(await system.events(eid), "command.issued", "wait"))

    await wait_for(waiting, timeout=30)
    halts = HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM)

    # the new release: one routing rule changed, deployed while `wait` runs
    monkeypatch.setattr(work, "_route", _rerouted(work._route))
    await system.restart_roles(("engine",))
    gate.touch()  # `wait` answers: the new engine replays the log to fold it

    async def halted() -> Any:
        st = await system.client.status(eid)
        return st if st is not None and st.state == ExecState.HALTED else None

    status = await wait_for(halted, timeout=30)
    record = next(
        (s, q)
        for s, d, q in await _log(system, eid)
        # a decision record, or (semantics 5) a result stored with its decision
        if (".ev." in s or ".in.answer." in s)
        and any(
            e.type == "step.exit" and e.step == "first"
            for e in (answer_decoder.decode(d).record if ".in.answer." in s else decision_decoder.decode(d)).events
        )
    )
    message = status.error["message"]
    assert status.error["type"] == NONDETERMINISM
    # the first differing record, by stream sequence and subject, and both decisions
    assert f"stream seq {record[1]} ({record[0]})" in message
    assert "step.exit of step 'first' with next=[\"wait\"]" in message
    assert "decides event 1: step.exit of step 'first' with next=[\"other\"]" in message
    assert HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM) == halts + 1

    # other executions go on meanwhile, on the same engine
    _, other = await system.run_yaml(QUICK)
    assert other.state == ExecState.COMPLETED

    # nothing was decided for it after the halt: no step `other`, no end, nothing twice
    items = await system.events(eid)
    assert not of_type(items, "step.enter", "other")
    assert [i.type for i in items if i.cls == "lc"] == [
        "playbook.initialized",
        "workflow.initialized",
        "execution.halted",
    ]
    _nothing_twice(await _log(system, eid))

    # another engine of the same release replays it again (a restart, a handover): it
    # halts at the same input and records nothing (the halt is open already); in
    # particular it does not take the halt for one before that input and resume it
    # (a halt met at an answer record is keyed by the record's own stream seq)
    await system.restart_roles(("engine",))
    engine = next(a for a in system.runtime.actors if isinstance(a, Engine))

    async def halted_again() -> bool:
        actor = engine.actors.get(eid)
        return actor is not None and actor.hydrated and actor.halted is not None

    await wait_for(halted_again, timeout=30)
    assert (await system.client.status(eid)).state == ExecState.HALTED
    lifecycle = [i.type for i in await system.events(eid) if i.cls == "lc"]
    assert lifecycle == ["playbook.initialized", "workflow.initialized", "execution.halted"], lifecycle
    assert HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM) == halts + 1

    # what `actors-cli run` shows meanwhile: the halt and why, then the resume, then the end
    shown = asyncio.create_task(follow_steps(system.client, eid, quiet=True))

    # the rollback: the rule as it was; its input comes back and the execution goes on
    monkeypatch.undo()
    await system.restart_roles(("engine",))
    final = await system.client.wait(eid, timeout=60)
    assert (await asyncio.wait_for(shown, 30)).type == "playbook.completed"
    said = capsys.readouterr().err
    assert f"halted: {NONDETERMINISM}: replay of the execution's log differs from it at stream seq {record[1]}" in said
    assert "resumed:" in said and said.index("halted:") < said.index("resumed:"), said
    assert final.state == ExecState.COMPLETED and final.error is None
    items = await system.events(eid)
    assert [i.step for i in of_type(items, "step.enter")] == ["first", "wait", "end"]
    assert len(of_type(items, "execution.resumed")) == 1
    assert [i.type for i in items if i.cls == "lc"][2:] == [
        "execution.halted",
        "execution.resumed",
        "workflow.completed",
        "playbook.completed",
    ]
    _nothing_twice(await _log(system, eid))


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_start_record_of_newer_semantics_halts_instead_of_guessing(system: System) -> None:
    eid = "from-the-future"
    subjects = system.layout.execution(eid)
    record = StartRecord(
        execution_id=eid,
        playbook_path="future",
        playbook_source=QUICK,
        semantics=SEMANTICS + 1,
    )
    await system.js_publish(subjects.start, encode(record), msg_id=ids.start_record_id(eid))

    async def halted() -> Any:
        st = await system.client.status(eid)
        return st if st is not None and st.state == ExecState.HALTED else None

    status = await wait_for(halted, timeout=30)
    assert status.error["type"] == SEMANTICS_UNKNOWN
    assert f"semantics {SEMANTICS + 1}" in status.error["message"]
    items = await system.events(eid)
    assert not of_type(items, "step.enter") and not of_type(items, "playbook.initialized")


# --- the Replayer, pure ----------------------------------------------------------------

PY = '{kind: python, code: "def main(): return 1"}'
BRANCHES = HEAD % "pure" + f"  - step: a\n    tool: {PY}\n    next: [b, c]\n  - step: b\n  - step: c\n"


def test_the_replayer_reproduces_a_recorded_log() -> None:
    run = Harness({"a": 1}).run(BRANCHES)
    assert run.status == "COMPLETED"
    assert mismatch(run) is None and replay(run)


def test_the_replayer_names_the_first_record_a_changed_log_does_not_match() -> None:
    run = Harness({"a": 1}).run(BRANCHES)
    log = log_of(run)
    # the record of `a`'s result, as if an older release had routed it to `b` alone
    at = next(
        i
        for i, r in enumerate(log)
        if r.cls == "ev" and any(e.step == "a" for e in r.value.events if e.type == "step.exit")
    )
    rec: DecisionRecord = log[at].value
    plain = msgspec.to_builtins(rec)
    for ev in plain["events"]:
        if ev["type"] == "step.exit":
            ev["data"]["next"] = ["b"]
    log[at] = type(log[at])(
        log[at].seq, log[at].subject, log[at].at, "ev", decision_decoder.decode(msgspec.json.encode(plain))
    )
    found = replay_execution(run.execution_id, log, subjects=exec_subjects(run.execution_id)).mismatch
    assert isinstance(found, Mismatch) and found.kind == NONDETERMINISM
    assert (found.record_seq, found.record_subject) == (log[at].seq, log[at].subject)
    assert 'next=["b"]' in found.expected and 'next=["b","c"]' in found.derived
    assert found.describe().startswith(f"replay of the execution's log differs from it at stream seq {log[at].seq}")


def test_a_loop_log_answering_a_command_never_issued_is_reported() -> None:
    source = (
        HEAD % "loop"
        + '  - step: each\n    tool: {kind: python, code: "def main(x): return x"}\n'
        + "    args: {x: '{{ item }}'}\n    loop: {collection: '{{ [1, 2, 3] }}', element: item}\n"
    )
    run = Harness({"each": PENDING}).run(source)
    assert run.loops, "the loop was handed over"
    assert mismatch(run) is None
    [loop_id] = run.loops
    # an answer to a command this code would not have issued (another release's ids)
    _, at, first = run.loops[loop_id][0]
    forged = CallDone(execution_id=run.execution_id, command_id="elsewhere", step="each", attempt_number=1, result=0)
    run.loops[loop_id].append((forged, at, first))
    found = mismatch(run)
    assert found is not None and "command elsewhere" in found.expected
