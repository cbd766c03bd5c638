"""An execution's history as users see it: `LogItem`, one input, event or dead letter
with its data as plain JSON values, and the expansion of stored messages into them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.wire.codec import CLEAR, PayloadCodec, PayloadUnreadable
from actors.wire.events import (
    answer_decoder,
    any_output_decoder,
    decision_decoder,
    event_decoder,
    extras_decoder,
    in_order,
)
from actors.wire.messages import DeadLetter, TimerFired, input_decoder
from streams.layout import EV, IN, LC, class_of
from streams.subjects import OUT, SCH, is_answer_record

_dead = msgspec.json.Decoder(DeadLetter)


@dataclass(slots=True)
class LogItem:
    """One entry of an execution's history as users see it: an input, an event, or a
    dead letter, its data as plain JSON values (what `actors-cli events --json` prints)."""

    seq: int
    at: float
    cls: str  # in | ev | lc | out (what a step printed) | sch (a durable timer armed) | dlq
    type: str
    step: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    # why some of `data`'s values are shown as `<encrypted ...>`: they are encrypted with
    # a payload key this reader lacks (None: every value is readable)
    unreadable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "class": self.cls,
            "type": self.type,
            "step": self.step,
            "data": self.data,
        }


def log_items(subject: str, data: bytes, seq: int, at: float, codec: PayloadCodec = CLEAR) -> list[LogItem]:
    """Expand one stored message into the events it holds (a decision record holds
    several), its values decrypted with `codec`. A value it cannot decrypt is shown as
    `<encrypted with payload key 'ID'>`, the item's `unreadable` saying why."""
    try:
        return _log_items(subject, data, seq, at, codec.open)
    except PayloadUnreadable as e:
        items = _log_items(subject, data, seq, at, codec.open_for_display)
        for item in items:
            item.unreadable = str(e)
        return items


def _log_items(subject: str, data: bytes, seq: int, at: float, opened: Callable[[Any], Any]) -> list[LogItem]:
    cls = class_of(subject)
    try:
        if cls == EV:
            rec = opened(decision_decoder.decode(data))
            return [LogItem(seq, ev.at, EV, str(ev.type), ev.step, msgspec.to_builtins(ev.data)) for ev in rec.events]
        if cls == LC:
            ev = opened(event_decoder.decode(data))
            extras = opened(extras_decoder.decode(data))  # the decision it carries (semantics 2), if any
            decided = extras.decision.events if extras.decision is not None else []
            return [LogItem(seq, e.at, EV, str(e.type), e.step, msgspec.to_builtins(e.data)) for e in decided] + [
                LogItem(seq, e.at, LC, str(e.type), e.step, msgspec.to_builtins(e.data)) for e in in_order(ev, extras)
            ]
        if cls == OUT:
            out = opened(any_output_decoder.decode(data))  # a step's output, or a part of it (while it ran)
            raw = msgspec.to_builtins(out)
            raw.pop("execution_id", None)
            return [LogItem(seq, out.at, OUT, raw.pop("type"), raw.pop("step", None), raw)]
        if cls == SCH:
            # a durable timer armed and not fired yet (the server holds its schedule until
            # it is due, then removes it): its body is the `timer.fired` input it will
            # deliver, which has not happened; shown as what it is, with when it is due
            fired = opened(input_decoder.decode(data))
            if isinstance(fired, TimerFired):
                return [LogItem(seq, at, SCH, "timer.armed", None, {"timer_id": fired.timer_id, "due": fired.due})]
            odd = {"error": f"a schedule holding a {type(fired).__name__}"}
            return [LogItem(seq, at, SCH, "undecodable", None, odd)]
        if is_answer_record(subject):
            # a step's result stored with the decision it led to (semantics 5): the result
            # as an input, then the decision's events, then (the last step's:
            # `in.answer.lc.<type>`) its lifecycle events
            whole = opened(answer_decoder.decode(data))
            rec = whole.record
            held = [] if rec.answer is None else _input_items(opened(input_decoder.decode(rec.answer)), seq, at)
            return (
                held
                + [LogItem(seq, ev.at, EV, str(ev.type), ev.step, msgspec.to_builtins(ev.data)) for ev in rec.events]
                + [
                    LogItem(seq, ev.at, LC, str(ev.type), ev.step, msgspec.to_builtins(ev.data))
                    for ev in whole.lifecycle
                ]
            )
        return _input_items(opened(input_decoder.decode(data)), seq, at)
    except msgspec.DecodeError as e:
        return [LogItem(seq, at, cls, "undecodable", None, {"error": str(e)})]


def _input_items(inp: Any, seq: int, at: float) -> list[LogItem]:
    raw = msgspec.to_builtins(inp)
    type_ = raw.pop("type")
    raw.pop("execution_id", None)
    raw.pop("playbook_source", None)  # the whole playbook: too long to show per event
    return [LogItem(seq, at, IN, type_, raw.pop("step", None), raw)]


def dead_letter_execution(subject: str) -> str | None:
    """The execution a dead letter is filed under (`dlq.<source>.<id>`); None for `_`."""
    eid = subject.rsplit(".", 1)[-1]
    return None if eid == "_" or subject.count(".") < 2 else eid


def dead_letter_items(subject: str, data: bytes, seq: int, at: float) -> list[LogItem]:
    try:
        d = _dead.decode(data)
        return [
            LogItem(
                seq,
                at,
                "dlq",
                f"dead_letter.{d.source}",
                None,
                {
                    "reason": d.reason,
                    "subject": d.subject,
                    "data": d.data,
                    "source": d.source,
                    "execution_id": dead_letter_execution(subject),
                },
            )
        ]
    except msgspec.DecodeError as e:
        return [LogItem(seq, at, "dlq", "undecodable", None, {"error": str(e)})]
