"""Halts on a real server: every halt is recorded (also the second at the same input,
also when the first try to record it fails), counted once, and an ended execution's
late input is not held for ever by its halt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats.errors
import pytest

import actors.core.work as work
import actors.engine.actor as engine_actor
from actors.core.replay import NONDETERMINISM, SEMANTICS, SEMANTICS_UNKNOWN
from actors.natsio import publish_all
from actors.runtime.metrics import HALTED_REPLAYS
from actors.wire.events import ExecState
from actors.wire.messages import CallDone, StartRecord, encode
from streams import ids
from streams.layout import EXEC_STREAM, engine_consumer
from tests.conftest import System, of_type, wait_for

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
GATE = """    tool:
      kind: python
      code: |
        import os, time
        def main(p):
            while not os.path.exists(p):
                time.sleep(0.02)
            return 'waited'
    timeout: 60
"""
# `first` routes to `one` (the rule a changed release breaks, `_rerouted`); `one` and
# `two` run until the test creates their gate files
TWO_GATES = (
    HEAD % "two-gates"
    + """  - step: first
    tool: {kind: python, code: "def main(): return {'n': 1}"}
    next:
      - when: "{{ result.n == 1 }}"
        then: one
      - else: other
  - step: one
"""
    + GATE
    + """    args: {p: "{{ workload.one }}"}
    next: [two]
  - step: two
"""
    + GATE
    + """    args: {p: "{{ workload.two }}"}
  - step: other
"""
)
QUICK = (
    HEAD % "quick"
    + """  - step: first
    tool: {kind: python, code: "def main(): return {'n': 1}"}
    next:
      - when: "{{ result.n == 1 }}"
        then: second
      - else: other
  - step: second
  - step: other
"""
)


def _rerouted(original: Any) -> Any:
    """`work._route` with one rule changed: step `first` now routes to `other`."""

    def route(ex: Any, act: Any, step: Any, result: Any) -> list[str]:
        return ["other"] if step.step == "first" else list(original(ex, act, step, result))

    return route


async def _state(system: System, eid: str, state: ExecState) -> Any:
    async def reached() -> Any:
        st = await system.client.status(eid)
        return st if st is not None and st.state == state else None

    return await wait_for(reached, timeout=30)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_second_halt_at_the_same_input_after_a_resume_is_recorded(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    eid = await system.start_yaml(TWO_GATES, payload={"one": str(one), "two": str(two)})

    async def issued(step: str) -> bool:
        return bool(of_type(await system.events(eid), "command.issued", step))

    await wait_for(lambda: issued("one"), timeout=30)
    halts = HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM)

    # a bad release halts it at `first`'s result; a rollback resumes it
    monkeypatch.setattr(work, "_route", _rerouted(work._route))
    await system.restart_roles(("engine",))
    one.touch()
    first = await _state(system, eid, ExecState.HALTED)
    # its input comes back to the halted engine (its diverged state reads as ended: the
    # input must not be taken for a late one and acked) and is handed back again
    consumer = engine_consumer(system.layout.partition_of(eid))
    jsm = system.nc.jsm()
    seen = (await jsm.consumer_info(EXEC_STREAM, consumer)).delivered.consumer_seq

    async def redelivered() -> bool:
        return bool((await jsm.consumer_info(EXEC_STREAM, consumer)).delivered.consumer_seq > seen)

    await wait_for(redelivered, timeout=30)
    monkeypatch.undo()
    await system.restart_roles(("engine",))
    await wait_for(lambda: issued("two"), timeout=60)
    await _state(system, eid, ExecState.RUNNING)

    # the bad release again: the same input, the same mismatch, a new halt
    monkeypatch.setattr(work, "_route", _rerouted(work._route))
    await system.restart_roles(("engine",))
    two.touch()
    again = await _state(system, eid, ExecState.HALTED)
    assert again.error["message"] == first.error["message"]
    items = await system.events(eid)
    halted = of_type(items, "execution.halted")
    assert len(halted) == 2 and len(of_type(items, "execution.resumed")) == 1
    assert HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM) == halts + 2  # each written halt, once

    # and the rollback resumes that one too; the execution ends, nothing decided twice
    monkeypatch.undo()
    await system.restart_roles(("engine",))
    final = await system.client.wait(eid, timeout=60)
    assert final.state == ExecState.COMPLETED
    items = await system.events(eid)
    assert len(of_type(items, "execution.resumed")) == 2
    assert [i.step for i in of_type(items, "step.enter")] == ["first", "one", "two", "end"]


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_halt_whose_first_record_fails_is_recorded_by_the_next_try(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[str] = []

    async def flaky(js: Any, items: Any, *args: Any, **kwargs: Any) -> Any:
        if not failed and any(s.endswith(".lc.execution.halted") for s, _, _ in items):
            failed.append(items[0][0])
            raise nats.errors.TimeoutError  # NATS away just as the halt is written
        return await publish_all(js, items, *args, **kwargs)

    monkeypatch.setattr(engine_actor, "publish_all", flaky)
    eid = "from-the-future"
    record = StartRecord(execution_id=eid, playbook_path="future", playbook_source=QUICK, semantics=SEMANTICS + 1)
    await system.js_publish(system.layout.execution(eid).start, encode(record), msg_id=ids.start_record_id(eid))

    status = await _state(system, eid, ExecState.HALTED)
    assert failed, "the first try to record the halt did not fail: the test proves nothing"
    assert status.error["type"] == SEMANTICS_UNKNOWN
    assert len(of_type(await system.events(eid), "execution.halted")) == 1


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_late_input_to_an_ended_execution_that_halts_is_acked(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    eid, status = await system.run_yaml(QUICK)
    assert status.state == ExecState.COMPLETED
    await system.engine_idle()
    halts = HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM)

    # a bad release meets a late answer for the ended execution: its replay halts
    monkeypatch.setattr(work, "_route", _rerouted(work._route))
    await system.restart_roles(("engine",))
    late = CallDone(execution_id=eid, command_id="late-1", step="first", attempt_number=9, result={"n": 2})
    subjects = system.layout.execution(eid)
    await system.js_publish(subjects.result("late-1"), encode(late), msg_id=f"{eid}:late-1")

    async def halt_recorded() -> bool:
        return bool(of_type(await system.events(eid), "execution.halted"))

    await wait_for(halt_recorded, timeout=30)
    # visible, but nothing is left to decide for an ended execution: the input is acked,
    # not redelivered for ever
    await system.engine_idle(timeout=30)
    assert HALTED_REPLAYS.value(role="engine", kind=NONDETERMINISM) == halts + 1
    final = await system.client.status(eid)
    assert final is not None and final.state == ExecState.COMPLETED  # the end stands
