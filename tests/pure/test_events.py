"""Events on the wire: records written before the typed events decode into them and
encode back byte for byte, and an event type a reader does not know (a newer writer)
is kept, shown, and ignored by what decides. Pure: no server needed."""

from __future__ import annotations

import msgspec
import pytest

from actors.client import log_items
from actors.status.projector import project
from actors.wire.events import (
    ActivationStatus,
    DecisionRecord,
    ExecState,
    ExecutionCancelledEvent,
    FailureDecidedEvent,
    PlaybookFailedEvent,
    RetryScheduledEvent,
    StepEnterEvent,
    StepExitEvent,
    UnknownEvent,
    decision_decoder,
    event_decoder,
)
from actors.wire.messages import ExecutionStatus, encode

pytestmark = [pytest.mark.timeout(30)]

# Records exactly as the engine wrote them before events were typed (`data` a dict
# built from keyword arguments): a decision record of an abort, and lifecycle events.
ABORT_DECISION = (
    b'{"cause":5,"events":[{"type":"step.failure_decided","execution_id":"e","at":1005.0,"cause":5,"st'
    b'ep":"worse","data":{"activation":4,"attempt_number":1,"error":{"type":"ValueError","message":"ba'
    b'd","retryable":false,"status":null,"traceback":null},"decision":"abort","rule":"on_error[0]"}},{'
    b'"type":"step.exit","execution_id":"e","at":1005.0,"cause":5,"step":"worse","data":{"activation":'
    b'4,"status":"FAILED","error":{"type":"ValueError","message":"bad","retryable":false,"status":null'
    b',"traceback":null},"routed_to_end":true,"original_failed_step":"worse","aborted":true}},{"type":'
    b'"step.enter","execution_id":"e","at":1005.0,"cause":5,"step":"end","data":{"activation":5,"arriv'
    b'als":["slow","ignored","worse"]}},{"type":"step.exit","execution_id":"e","at":1005.0,"cause":5,"'
    b'step":"end","data":{"activation":5,"status":"COMPLETED"}}]}'
)
FAILED_AT_END = (
    b'{"type":"playbook.failed","execution_id":"e","at":1005.0,"cause":5,"data":{"playbook":"pb","star'
    b'ted_at":1001.0,"ended_at":1005.0,"error":{"type":"ValueError","message":"bad","step":"worse","fa'
    b'iled_steps":["worse"],"retryable":false,"status":null},"failed_steps":["worse"],"result":{"slow"'
    b':{"n":1,"items":[1],"more":true},"ignored":0,"worse":null},"evaluated_by_end_step":true,"total_s'
    b'teps":6,"failed_steps_count":1,"handled_failures":[],"cancelled_steps":[]}}'
)
RETRY_LATER_DECISION = (
    b'{"cause":5,"events":[{"type":"step.failure_decided","execution_id":"e","at":1005.0,"cause":5,"st'
    b'ep":"rl","data":{"activation":4,"attempt_number":1,"error":{"type":"ValueError","message":"bad",'
    b'"retryable":false,"status":null,"traceback":null},"decision":"retry_later","rule":"on_error[0]",'
    b'"delay":5.0}},{"type":"retry.scheduled","execution_id":"e","at":1005.0,"cause":5,"step":"rl","da'
    b'ta":{"activation":4,"attempt_number":2,"delay":5.0,"due":1010.0,"reason":"on_error:retry_later",'
    b'"rule":"on_error[0]","parent_event_id":"4-1"}}]}'
)
CANCELLED = (
    b'{"type":"execution.cancelled","execution_id":"e","at":1002.0,"cause":2,"data":{"playbook":"pb","'
    b'started_at":1001.0,"ended_at":1002.0,"reason":"stop it","running_commands":["0-1"]}}'
)
NEWER_TYPE = (
    b'{"type":"step.paused","execution_id":"e","at":7.0,"cause":7,"step":"a","data":{"activation":3,"why":"x"}}'
)


@pytest.mark.parametrize("record", [ABORT_DECISION, RETRY_LATER_DECISION])
def test_an_old_decision_record_decodes_into_typed_events_and_encodes_back_the_same(record: bytes) -> None:
    rec = decision_decoder.decode(record)
    assert not any(isinstance(ev, UnknownEvent) for ev in rec.events)
    assert encode(rec) == record


def test_old_lifecycle_events_decode_into_typed_events_and_encode_back_the_same() -> None:
    for record in (FAILED_AT_END, CANCELLED):
        assert encode(event_decoder.decode(record)) == record
    failed = event_decoder.decode(FAILED_AT_END)
    assert isinstance(failed, PlaybookFailedEvent)
    assert failed.data.error["step"] == "worse" and failed.data.failed_steps == ["worse"]
    assert failed.data.result == {"slow": {"n": 1, "items": [1], "more": True}, "ignored": 0, "worse": None}
    cancelled = event_decoder.decode(CANCELLED)
    assert isinstance(cancelled, ExecutionCancelledEvent) and cancelled.data.running_commands == ["0-1"]


def test_typed_fields_read_what_the_old_dicts_held() -> None:
    decided, exited, entered, _ = decision_decoder.decode(ABORT_DECISION).events
    assert isinstance(decided, FailureDecidedEvent)
    assert (decided.data.activation, decided.data.attempt_number, decided.data.decision) == (4, 1, "abort")
    assert decided.data.result is msgspec.UNSET  # absent in the record: still absent when written again
    assert isinstance(exited, StepExitEvent) and exited.data.status is ActivationStatus.FAILED
    assert exited.data.aborted is True and exited.data.handled is msgspec.UNSET
    assert isinstance(entered, StepEnterEvent) and entered.data.arrivals == ["slow", "ignored", "worse"]
    later = decision_decoder.decode(RETRY_LATER_DECISION).events
    assert isinstance(later[0], FailureDecidedEvent) and later[0].data.delay == 5.0
    assert isinstance(later[1], RetryScheduledEvent) and later[1].data.parent_event_id == "4-1"


def test_an_unknown_event_type_is_kept_as_it_came() -> None:
    ev = event_decoder.decode(NEWER_TYPE)
    assert isinstance(ev, UnknownEvent) and ev.type == "step.paused" and ev.data == {"activation": 3, "why": "x"}
    assert encode(ev) == NEWER_TYPE
    # inside a decision record, the events beside it keep their types
    mixed = ABORT_DECISION[:-2] + b"," + NEWER_TYPE + b"]}"
    rec = decision_decoder.decode(mixed)
    assert isinstance(rec.events[0], FailureDecidedEvent) and isinstance(rec.events[-1], UnknownEvent)
    assert encode(rec) == mixed


def test_a_known_type_with_data_that_does_not_fit_is_kept_untyped_and_a_non_event_is_an_error() -> None:
    forged = b'{"type":"step.exit","execution_id":"e","at":1.0,"cause":1,"data":{"status":"FAILED"}}'
    ev = event_decoder.decode(forged)
    assert isinstance(ev, UnknownEvent) and ev.data == {"status": "FAILED"} and encode(ev) == forged
    with pytest.raises(msgspec.ValidationError):
        event_decoder.decode(b'{"type":"step.exit","at":1.0}')


def test_an_unknown_event_is_shown_by_the_log_and_changes_no_status() -> None:
    [item] = log_items("exec.0.e.lc.step.paused", NEWER_TYPE, 9, 7.0)
    assert item.to_dict() == {
        "seq": 9,
        "at": 7.0,
        "class": "lc",
        "type": "step.paused",
        "step": "a",
        "data": {"activation": 3, "why": "x"},
    }
    running = ExecutionStatus(execution_id="e", state=ExecState.RUNNING, playbook="pb", started_at=1.0)
    assert project(running, event_decoder.decode(NEWER_TYPE)) is None


def test_the_log_shows_a_typed_event_with_the_keys_it_was_written_with() -> None:
    items = log_items("exec.0.e.ev.decision", ABORT_DECISION, 5, 1005.0)
    written = msgspec.json.decode(ABORT_DECISION)["events"]
    assert [(i.type, i.step, i.data) for i in items] == [(e["type"], e["step"], e["data"]) for e in written]
    assert [list(i.data) for i in items] == [list(e["data"]) for e in written]  # same keys, same order


def test_an_empty_decision_record_stays_as_it_was() -> None:
    assert encode(DecisionRecord(cause=3)) == b'{"cause":3}'
    assert decision_decoder.decode(b'{"cause":3}').events == []
