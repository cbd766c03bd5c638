"""Engine decisions are a pure function of the log: replaying a real log reproduces every
recorded decision exactly and adds nothing. (Any harness run checks the same property
on synthetic inputs: `tests.fold_harness.replay`.)"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from actors.wire.events import FailureDecidedEvent, answer_decoder, decision_decoder, lifecycle_message
from actors.wire.messages import input_decoder
from streams.layout import IN, class_of
from streams.subjects import ExecSubjects, is_answer_record
from tests.conftest import System, of_type
from tests.harness import decisions, refold
from tests.support.natsio import execution_log

pytestmark = [pytest.mark.timeout(60)]

PLAYBOOKS = {
    "parallel_and_routing": """
  - step: start
    tool: {kind: python, code: "def main(): return {'n': 3}"}
    next:
      - when: "{{ result.n > 2 }}"
        then: [a, b]
      - else: c
  - step: a
    tool: {kind: sleep, seconds: 0.05}
  - step: b
  - step: c
""",
    "retry_with_jitter_then_remediation": """
  - step: flaky
    tool: {kind: python, code: "def main(): raise OSError('unreachable')"}
    retry:
      - when: "{{ error is not none }}"
        then: {max_attempts: 3, backoff: exponential, initial_delay: 0.05, jitter: full}
    on_failure: cleanup
  - step: cleanup
    args: {what: "{{ failure.step }}"}
""",
    "on_error_and_abort": """
  - step: start
    next: [slow, bad, ignored]
  - step: slow
    tool: {kind: sleep, seconds: 20}
  - step: ignored
    tool: {kind: python, code: "def main(): raise KeyError('k')"}
    on_error: [{decision: ignore, result: 0}]
  - step: bad
    tool: {kind: sleep, seconds: 0.1}
    next: worse
  - step: worse
    tool: {kind: python, code: "def main(): raise ValueError('v')"}
    on_error: [{decision: abort}]
""",
}


def _replay(eid: str, subjects: ExecSubjects, log: list[Any], *, with_recorded: bool) -> dict[int, list[Any]]:
    recorded = {}
    if with_recorded:
        for subject, data, _, _ in log:
            cls = class_of(subject)
            rec = (
                answer_decoder.decode(data).record
                if is_answer_record(subject)
                else decision_decoder.decode(data)
                if cls == "ev"
                else lifecycle_message(data)[0]
                if cls == "lc"
                else None
            )
            if rec is not None:
                for ev in rec.events:
                    if isinstance(ev, FailureDecidedEvent):
                        recorded[(ev.data.activation, ev.data.attempt_number)] = msgspec.to_builtins(ev.data)
    inputs = _inputs(log)
    outputs = refold(eid, inputs, subjects=subjects, recorded=recorded)
    return {seq: decisions(out) for (_, seq, _), out in zip(inputs, outputs, strict=True) if decisions(out)}


def _inputs(log: list[Any]) -> list[tuple[Any, int, float]]:
    """Each input with the seq and time it is folded with: a result stored with its
    decision (semantics 5, an answer record) with the record's cause and time."""
    out = []
    for subject, data, seq, at in log:
        if class_of(subject) != IN:
            continue
        if is_answer_record(subject):
            rec = answer_decoder.decode(data).record  # either shape (`in.answer.lc.<type>` too)
            assert rec.answer is not None and rec.at is not None
            out.append((input_decoder.decode(bytes(rec.answer)), rec.cause, rec.at))
        else:
            out.append((input_decoder.decode(data), seq, at))
    return out


def _recorded(log: list[Any]) -> dict[int, list[Any]]:
    got: dict[int, list[Any]] = {}
    for subject, data, _, _ in log:
        cls = class_of(subject)
        if is_answer_record(subject):  # a result with its decision, and (the last step's) its lifecycle events
            whole = answer_decoder.decode(data)
            got.setdefault(whole.record.cause, [])[0:0] = [msgspec.to_builtins(e) for e in whole.record.events]
            for ev in whole.lifecycle:
                got.setdefault(ev.cause, []).append(msgspec.to_builtins(ev))
        elif cls == "ev":
            rec = decision_decoder.decode(data)
            got.setdefault(rec.cause, [])[0:0] = [msgspec.to_builtins(e) for e in rec.events]
        elif cls == "lc":
            carried, events = lifecycle_message(data)  # a decision it carries (semantics 2) comes first
            if carried is not None:
                got.setdefault(carried.cause, [])[0:0] = [msgspec.to_builtins(e) for e in carried.events]
            for ev in events:
                got.setdefault(ev.cause, []).append(msgspec.to_builtins(ev))
    return got


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(PLAYBOOKS))
async def test_replaying_the_log_reproduces_every_decision_exactly(system: System, name: str) -> None:
    eid, status = await system.run_yaml(
        f"apiVersion: actors/v1\nkind: Playbook\nmetadata: {{name: {name}}}\nworkflow:\n" + PLAYBOOKS[name]
    )
    assert status.state in ("COMPLETED", "FAILED")
    await system.engine_idle()
    log = await execution_log(system.nc, system.layout, eid)
    subjects = system.layout.execution(eid)
    recorded = _recorded(log)
    assert recorded, "nothing recorded"
    # the engine's way (recorded failure decisions read back) and pure re-evaluation agree
    assert _replay(eid, subjects, log, with_recorded=True) == recorded
    assert _replay(eid, subjects, log, with_recorded=False) == recorded


@pytest.mark.asyncio
async def test_a_new_engine_replaying_a_finished_execution_adds_nothing(system: System) -> None:
    eid, status = await system.run_yaml(
        "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: replay_me}\nworkflow:\n"
        + PLAYBOOKS["retry_with_jitter_then_remediation"]
    )
    assert status.state == "COMPLETED"
    await system.engine_idle()
    before = await execution_log(system.nc, system.layout, eid)
    await system.restart_roles(("engine",))
    await system.client.cancel(eid, "wake the execution up: forces a replay in the new engine")
    await system.engine_idle()
    after = await execution_log(system.nc, system.layout, eid)
    added = after[len(before) :]
    assert [class_of(s) for s, *_ in added] == ["in"]  # only the cancel request itself
    assert after[: len(before)] == before
    assert not of_type(await system.events(eid), "execution.cancelled")
