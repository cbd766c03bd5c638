"""The Replayer's checks and the halts' bookkeeping, pure: what a replay calls a
mismatch (and what it must not), which halts a log holds open, what a halt's record
and a pod's log line reveal, and what the status shows around a halt."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest

from actors.core.replay import NONDETERMINISM, SEMANTICS_UNKNOWN, Mismatch, Recorded, Replayer, _show, replay_execution
from actors.runtime.logactor import HALTED_DELAY_MAX, halted_delay
from actors.status.projector import project
from actors.wire.codec import PayloadCodec, PayloadKeys, parse_key
from actors.wire.events import (
    ExecState,
    ExecutionHaltedData,
    ExecutionResumedData,
    PlaybookInitializedData,
    make_event,
)
from actors.wire.messages import StartRecord
from streams import ids
from tests.harness import Harness, log_of, mismatch
from tests.harness.folds import exec_subjects

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
PY = '{kind: python, code: "def main(): return 1"}'


def _halted(source: str, seq: int, loop_id: str | None = None, *, at: float = 1.0) -> Any:
    data = ExecutionHaltedData(
        source=source,
        kind=NONDETERMINISM,
        input_seq=seq,
        input_subject="s",
        record_seq=seq,
        record_subject="s",
        expected="x",
        derived="y",
        semantics=1,
        error={"type": NONDETERMINISM, "message": "m"},
    )
    if loop_id is not None:
        data.loop_id = loop_id
    return make_event(data, execution_id="e", at=at, cause=seq)


def _resumed(seq: int, source: str | None = None, loop_id: str | None = None) -> Any:
    data = ExecutionResumedData(halted_seq=seq, semantics=1)
    if source is not None:
        data.source = source
    if loop_id is not None:
        data.loop_id = loop_id
    return make_event(data, execution_id="e", at=1.0, cause=seq)


# --- which halts are open -----------------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_loops_halt_is_not_the_engines_to_resume() -> None:
    # the loop's input seq 3 is a LOOP stream sequence: an engine replay must not end it
    r = Recorded()
    r.event(50, "lc", _halted("counter", 3, "L1"))
    assert r.open_halts("engine") == []
    assert [k for k, _ in r.open_halts("counter", "L1")] == [("counter", "L1", 3)]
    assert r.open_halts("counter", "L2") == []


@pytest.mark.timeout(10)
def test_an_engine_halt_and_a_loop_halt_at_the_same_number_are_two_halts() -> None:
    r = Recorded()
    r.event(50, "lc", _halted("counter", 7, "L1"))
    assert ("engine", None, 7) not in r.halts  # the engine's halt at exec seq 7 is still written
    r.event(51, "lc", _halted("engine", 7))
    assert len(r.halts) == 2


@pytest.mark.timeout(10)
def test_a_halt_after_a_resume_at_the_same_input_is_open_and_has_a_new_id() -> None:
    r = Recorded()
    key = ("engine", None, 10)
    r.event(50, "lc", _halted("engine", 10))
    first = ids.halted_id("e", "engine", 10, r.round_of(key))
    r.event(60, "lc", _resumed(10, "engine"))
    assert r.open_halts("engine") == []
    # halting again at input 10 is a new event: its id differs, so the server keeps it
    again = ids.halted_id("e", "engine", 10, r.round_of(key))
    assert again != first
    r.event(70, "lc", _halted("engine", 10))
    assert [k for k, _ in r.open_halts("engine")] == [key]
    # and its resume is a new event too
    assert ids.resumed_id("e", 10, "engine", r.round_of(key)) != ids.resumed_id("e", 10, "engine", 0)


@pytest.mark.timeout(10)
def test_a_resume_written_before_sources_were_named_ends_only_the_engines_halt() -> None:
    r = Recorded()
    r.event(50, "lc", _halted("counter", 4, "L1"))
    r.event(51, "lc", _halted("engine", 4))
    r.event(52, "lc", _resumed(4))  # an old record: no source
    assert r.open_halts("engine") == []
    assert len(r.open_halts("counter", "L1")) == 1


@pytest.mark.timeout(10)
def test_a_loops_resume_ends_that_loops_halt() -> None:
    r = Recorded()
    r.event(50, "lc", _halted("counter", 4, "L1"))
    r.event(52, "lc", _resumed(4, "counter", "L1"))
    assert r.open_halts("counter", "L1") == []


# --- what a halt reveals ------------------------------------------------------------------


def _secret_mismatch() -> Mismatch:
    rec = {"type": "playbook.completed", "data": {"result": {"secret": "hunter2-OLD"}}}
    der = {"type": "playbook.completed", "data": {"result": {"secret": "hunter2-NEW"}}}
    return Mismatch(NONDETERMINISM, 5, "s", 6, "s2", _show(rec, der), _show(der, rec), outline="playbook.completed")


@pytest.mark.timeout(10)
def test_a_halted_event_sealed_with_a_payload_key_holds_no_value_in_clear() -> None:
    codec = PayloadCodec(PayloadKeys(parse_key(base64.b64encode(b"k" * 32).decode(), where="t")))
    m = _secret_mismatch()
    assert "hunter2" in m.expected and "hunter2" in m.derived  # the values are what the status shows
    data = ExecutionHaltedData(
        source="engine",
        kind=m.kind,
        input_seq=5,
        input_subject="s",
        record_seq=6,
        record_subject="s2",
        expected=m.expected,
        derived=m.derived,
        semantics=1,
        error=msgspec.to_builtins(m.error()),
    )
    wire = codec.encode(make_event(data, execution_id="e", at=1.0, cause=5))
    assert b"hunter2" not in wire
    from actors.wire.events import event_decoder

    back = codec.decode(event_decoder, wire).data
    assert isinstance(back, ExecutionHaltedData)
    assert "hunter2-OLD" in back.expected and "hunter2-NEW" in back.derived  # the key opens them


@pytest.mark.timeout(10)
def test_a_mismatchs_log_line_names_seqs_subjects_and_types_but_no_value() -> None:
    m = _secret_mismatch()
    line = m.brief()
    assert "hunter2" not in line
    assert "input seq 5 (s)" in line and "record seq 6 (s2)" in line and "playbook.completed" in line


@pytest.mark.timeout(10)
def test_a_replayed_mismatchs_outline_names_the_event_types() -> None:
    run = Harness({"a": 1}).run(HEAD % "p" + f"  - step: a\n    tool: {PY}\n    args: {{x: 's3cr3t'}}\n")
    log = log_of(run)
    rec = next(r for r in log if r.cls == "ev" and any(e.type == "command.issued" for e in r.value.events))
    for e in rec.value.events:
        if e.type == "command.issued":
            e.step = "renamed"  # what a changed rule would have decided
    found = replay_execution(run.execution_id, log, subjects=exec_subjects(run.execution_id)).mismatch
    assert found is not None
    assert "command.issued of step 'renamed'" in found.brief() and "s3cr3t" not in found.brief()


# --- false positives: values as the log stores them ---------------------------------------

VALUES = {
    "nan": "  - step: end\n    args: {x: \"{{ 'nan' | float }}\"}\n",
    "inf": "  - step: end\n    args: {x: \"{{ 'inf' | float }}\"}\n",
    "minus_inf": "  - step: end\n    args: {x: \"{{ '-inf' | float }}\"}\n",
    "int_key": "  - step: end\n    args: {1: a}\n",
    "template_int_key": "  - step: end\n    args: {x: \"{{ {1: 'a'} }}\"}\n",
    "date": "  - step: end\n    args: {d: 2024-01-01}\n",
    "bytes": "  - step: end\n    args: {b: !!binary aGVsbG8=}\n",
    "tuple_key": "  - step: end\n    args: {x: \"{{ {(1,2): 'a'} }}\"}\n",
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(VALUES))
def test_a_value_whose_json_differs_from_memory_replays_without_a_mismatch(name: str) -> None:
    run = Harness({}).run(HEAD % "v" + VALUES[name])
    assert run.status in ("COMPLETED", "FAILED")  # a key JSON cannot hold fails the step: decided, and replayed
    found = mismatch(run)
    assert found is None, found.describe()


# --- false negatives: a gap before later records ------------------------------------------

BRANCHES = (
    HEAD % "gap"
    + f"  - step: a\n    tool: {PY}\n    next: [b, c]\n  - step: b\n    tool: {PY}\n  - step: c\n    tool: {PY}\n"
)


@pytest.mark.timeout(30)
def test_a_decision_the_log_never_made_before_later_records_is_a_mismatch() -> None:
    run = Harness({"a": 1, "b": 1, "c": 1}).run(BRANCHES)
    log = log_of(run)
    victim = [r.seq for r in log if r.cls == "in"][1]  # a's result
    assert any(r.cls == "ev" and r.value.cause > victim for r in log)
    cut = [r for r in log if not (r.cls == "ev" and r.value.cause == victim)]
    found = replay_execution(run.execution_id, cut, subjects=exec_subjects(run.execution_id)).mismatch
    assert found is not None and found.kind == NONDETERMINISM
    assert found.input_seq == victim and "no decision for this input" in found.expected
    assert "the log records nothing for this input" in found.brief()


@pytest.mark.timeout(30)
def test_a_missing_last_record_is_a_crash_the_replay_repairs() -> None:
    run = Harness({"a": 1, "b": 1, "c": 1}).run(BRANCHES)
    log = log_of(run)
    last = max(r.value.cause for r in log if r.cls == "ev")
    cut = [r for r in log if not (r.cls == "ev" and r.value.cause == last)]
    assert replay_execution(run.execution_id, cut, subjects=exec_subjects(run.execution_id)).mismatch is None


# --- semantics unknown ---------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_start_record_of_newer_semantics_is_outlined_without_values() -> None:
    start = StartRecord(execution_id="e", playbook_path="p", playbook_source="x", semantics=99)
    found = Replayer("e", Recorded()).admit(1, "start", start)
    assert found is not None and found.kind == SEMANTICS_UNKNOWN
    assert "semantics 99" in found.brief()


# --- the status around a halt --------------------------------------------------------------


def _unknown_halt() -> Any:
    data = ExecutionHaltedData(
        source="engine",
        kind=SEMANTICS_UNKNOWN,
        input_seq=1,
        input_subject="s",
        record_seq=1,
        record_subject="s",
        expected="semantics 2",
        derived="semantics 1 at most",
        semantics=1,
        error={"type": SEMANTICS_UNKNOWN, "message": "m"},
    )
    return make_event(data, execution_id="e", at=1.0, cause=1)


def _initialized() -> Any:
    return make_event(
        PlaybookInitializedData(playbook="pb", version=7, started_at=0.5), execution_id="e", at=1.0, cause=1
    )


@pytest.mark.timeout(10)
def test_a_halt_at_the_start_record_keeps_the_playbook_named_later() -> None:
    halted = project(None, _unknown_halt())
    assert halted is not None and halted.state == ExecState.HALTED and halted.playbook is None
    named = project(halted, _initialized())
    assert named is not None
    assert (named.state, named.playbook, named.version, named.started_at) == (ExecState.HALTED, "pb", 7, 0.5)
    assert named.error == halted.error  # still halted, for the same reason
    assert project(named, _initialized()) is None  # nothing more to add


@pytest.mark.timeout(10)
def test_a_playbook_named_after_the_resume_is_kept() -> None:
    halted = project(None, _unknown_halt())
    assert halted is not None
    running = project(halted, _resumed(1, "engine"))
    assert running is not None and running.state == ExecState.RUNNING and running.playbook is None
    named = project(running, _initialized())
    assert named is not None and (named.state, named.playbook, named.version) == (ExecState.RUNNING, "pb", 7)


# --- a halted execution's inputs -----------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_halted_input_comes_back_later_each_time_up_to_the_cap() -> None:
    delays = [halted_delay(n, 30.0) for n in range(1, 12)]
    assert delays[:3] == [30.0, 60.0, 120.0]  # from ack_wait on, doubling
    assert delays == sorted(delays)
    assert delays[-1] == HALTED_DELAY_MAX
    assert halted_delay(10_000, 30.0) == HALTED_DELAY_MAX
