"""The Replayer: fold a recorded log's inputs into fresh state and hold every derived
decision against the one the log recorded. Pure: no NATS, no I/O; the shells read and
decode the log, this module decides whether the code that runs now is the code that
wrote it.

One replay for everything that rebuilds state from a log: the engine when it rebuilds
an execution (actors/engine/actor.py), the counter when it rebuilds a loop
(actors/loops/counter.py), `Client.retry` folding a finished execution
(actors/client/retrying.py), the test harness (tests/harness/folds.py) and the corpus of
recorded logs (tests/integration/test_corpus.py).

An execution's log records each decision twice over: the decision record
(`ev.decision`, its `cause` the input's stream sequence) and the lifecycle events
(`lc.<type>`, each with its `cause`). `Replayer.check` compares what the fold derives
for one input with both; the first difference is a `Mismatch` naming the record (its
stream sequence and subject), what the log holds and what this code decides, one line
each. A decision whose record is missing is not a mismatch when nothing after it is
recorded: a crash between the commands and the record leaves that, and the replay
repairs it (publishing what is missing). A missing record before later inputs' records
is a mismatch: records are written in input order, each before its input is acked, so
no crash leaves such a gap; the code that wrote the log decided nothing there.
Derived events are compared as the log would hold them (JSON: a NaN is stored as null).
A loop's log holds no decision records, only its inputs; the answers in it
prove which commands (and timers) the counter issued, so `LoopReplayer` reports an
answer to a command the fold never issued.

Semantics: `SEMANTICS` is the version of the engine's decision rules. A start record
carries the version it started under (`StartRecord.semantics`, 1 when absent: records
written before the field); the fold branches on `Execution.semantics` where a change
would alter an old execution's decisions, and a start record newer than this code is a
mismatch of its own kind (`SemanticsUnknown`): this code cannot run future semantics
and does not guess. docs/upgrades.md states the promise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from actors.core.decide import fold
from actors.core.effects import Effects
from actors.core.loop import LoopRun, fold_loop
from actors.core.state import Execution
from actors.playbook.loader import parsed_playbook
from actors.playbook.templates import call_with_limits
from actors.wire.events import (
    REPEATED_LIFECYCLE,
    TERMINAL_EVENTS,
    AnyEvent,
    DecisionRecord,
    EventType,
    ExecutionHaltedData,
    ExecutionResumedData,
    FailureDecidedData,
    FailureDecidedEvent,
    LifecycleExtras,
    PlaybookFailedEvent,
    in_order,
)
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    EngineFault,
    ErrorInfo,
    Input,
    LoopInput,
    LoopSpec,
    ResultBatch,
    StartRecord,
    TimerFired,
)
from streams.subjects import ExecSubjects, LoopSubjects

# The version of the engine's decision rules (docs/upgrades.md). Raise it with a change
# that would make an execution already running decide otherwise, and keep the old
# behaviour for `Execution.semantics` below the new number.
#   1: the first release that recorded it.
#   2: a decision with lifecycle events is stored as one message, its carrier event
#      holding the decision record and the others (actors/wire/events.py
#      `LifecycleExtras`); the decisions themselves are those of 1. A pod of 1 halts
#      such an execution (`SemanticsUnknown`) rather than misread its log.
#   3: wait steps and signals (`tool: wait`, actors/core/waits.py): a playbook with a
#      wait step runs only in an execution of 3 on (one of 2 or less fails at its start,
#      saying so); the lifecycle event `execution.waiting` may be written more than
#      once (once per decision, its message id by cause). Executions without wait
#      steps decide as under 2.
#   4: a step's command is answered on one subject per execution (`in.result`,
#      actors/core/work.py `SHARED_RESULTS`), not one per command
#      (`in.result.<command>`): the command id is in the result. Decisions are those
#      of 3; a command names the shared subject in `Command.answer_on` (its own stays
#      in `reply_to`, where an older tool pod answers) and a child's end goes there
#      (`ParentRef.reply_to`). An older engine pod must not read such a log (its
#      replay would take any result for the answer to every command).
#   5: a step's result may be stored with the decision it leads to, as one input
#      (`exec.<p>.<id>.in.answer...`, a DecisionRecord holding the result in `answer`
#      and the time it read in `at`, its cause minus the stream sequence of the input it
#      followed): the tool asks the engine first (`Command.ask_on`). Decisions are those
#      of 4; an older engine pod must not read such a log (it would not fold the answer).
#   6: an execution's start may be stored with its first decision, as one input: an
#      answer record of cause 0 (minus the input before it: none) holding the start
#      record in `answer`, the log's first input (the starter asks the engine first);
#      and an answer record may carry lifecycle events and one command
#      (`exec.<p>.<id>.in.answer.lc.<type>.cmd.<kind>`). Decisions are those of 5; an
#      older engine pod cannot read a start stored so (docs/upgrades.md "From 5 to 6").
SEMANTICS = 6

NONDETERMINISM = "Nondeterminism"
SEMANTICS_UNKNOWN = "SemanticsUnknown"

# lifecycle events the shells write beside the fold's: never derived, never compared
_SHELL_EVENTS = frozenset({EventType.EXECUTION_HALTED.value, EventType.EXECUTION_RESUMED.value})
_ENDS_WITH_RESULT = frozenset({EventType.PLAYBOOK_COMPLETED.value, EventType.PLAYBOOK_FAILED.value})
_ENDS = frozenset(TERMINAL_EVENTS)
SHOWN = 160  # characters of a value shown in a mismatch's line
_json = msgspec.json.Encoder()  # the outbox's encoding (actors/wire/codec.py), values in clear

# a halt in an execution's log: who halted it (engine | counter), the loop (the
# counter's), the input (a stream sequence of that log: EXEC for the engine, LOOP for a
# loop, so the source is part of the key)
HaltKey = tuple[str, str | None, int]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The first record a replay does not reproduce, in a form a user can read."""

    kind: str  # NONDETERMINISM | SEMANTICS_UNKNOWN
    input_seq: int  # the input whose decision differs (stream sequence)
    input_subject: str
    record_seq: int  # the record that differs (the input's own when the log holds none)
    record_subject: str
    expected: str  # what the log records
    derived: str  # what this code decides
    where: str = "the execution's log"
    outline: str = ""  # the records' kinds (event types, steps), no values: what a pod's log line says

    def brief(self) -> str:
        """`describe` without the values (a pod's log is not sealed): kind, seqs,
        subjects and event types."""
        head = (
            f"{self.kind} in {self.where}: input seq {self.input_seq} ({self.input_subject}), "
            f"record seq {self.record_seq} ({self.record_subject})"
        )
        return f"{head}: {self.outline}" if self.outline else head

    def describe(self) -> str:
        if self.kind == SEMANTICS_UNKNOWN:
            return (
                f"{self.where}: the start record (stream seq {self.record_seq}, {self.record_subject}) asks for "
                f"{self.expected}; this code runs {self.derived}: it cannot run newer semantics"
            )
        return (
            f"replay of {self.where} differs from it at stream seq {self.record_seq} ({self.record_subject}), "
            f"deciding input seq {self.input_seq} ({self.input_subject}): the log records {self.expected}; "
            f"this code (semantics {SEMANTICS}) decides {self.derived}"
        )

    def error(self) -> ErrorInfo:
        return ErrorInfo(type=self.kind, message=self.describe())

    def halted_data(self, *, source: str, loop_id: str | UnsetType = UNSET) -> ExecutionHaltedData:
        """The `execution.halted` event's data for this mismatch, found by `source`
        (engine | counter; the counter names its loop)."""
        return ExecutionHaltedData(
            source=source,
            kind=self.kind,
            input_seq=self.input_seq,
            input_subject=self.input_subject,
            record_seq=self.record_seq,
            record_subject=self.record_subject,
            expected=self.expected,
            derived=self.derived,
            semantics=SEMANTICS,
            error=msgspec.to_builtins(self.error()),
            loop_id=loop_id,
        )


@dataclass(frozen=True, slots=True)
class Stored:
    """A record as the log holds it: where, and what."""

    seq: int
    subject: str
    value: Any  # DecisionRecord (ev) or an event (lc)


@dataclass(slots=True)
class Recorded:
    """What a log holds beside its inputs: read once, before the fold, from the same
    read the replay folds (nothing more is fetched to compare)."""

    decisions: dict[int, Stored] = field(default_factory=dict)  # cause -> its decision record
    lifecycle: dict[str, Stored] = field(default_factory=dict)  # event type -> the event
    by_cause: dict[int, list[Stored]] = field(default_factory=dict)  # cause -> its lifecycle events
    failures: dict[tuple[int, int], FailureDecidedData] = field(default_factory=dict)  # read back, not re-evaluated
    results: set[str] = field(default_factory=set)  # command ids answered
    fired: set[str] = field(default_factory=set)  # timers that fired
    skip: set[int] = field(default_factory=set)  # inputs given up on (an EngineFault names them)
    halts: dict[HaltKey, Stored] = field(default_factory=dict)  # open halts: the last, unless resumed since
    rounds: dict[HaltKey, int] = field(default_factory=dict)  # how often each halt was resumed

    def decision(self, seq: int, subject: str, record: DecisionRecord) -> None:
        self.decisions[record.cause] = Stored(seq, subject, record)
        for ev in record.events:
            if isinstance(ev, FailureDecidedEvent):
                self.failures[(ev.data.activation, ev.data.attempt_number)] = ev.data

    def event(self, seq: int, subject: str, ev: AnyEvent) -> None:
        stored = Stored(seq, subject, ev)
        data = ev.data
        if isinstance(data, ExecutionHaltedData):
            loop = data.loop_id if isinstance(data.loop_id, str) else None
            self.halts[(data.source, loop, data.input_seq)] = stored  # read in log order: opens it
        elif isinstance(data, ExecutionResumedData):
            # a resume written before `source` was: the engine's (it ended its own halts)
            source = data.source if isinstance(data.source, str) else "engine"
            loop = data.loop_id if isinstance(data.loop_id, str) else None
            key = (source, loop, data.halted_seq)
            self.halts.pop(key, None)
            self.rounds[key] = self.rounds.get(key, 0) + 1
        else:
            self.lifecycle.setdefault(ev.type, stored)  # one of each type: a re-send past the window is the same
            self.by_cause.setdefault(ev.cause, []).append(stored)

    def has_lifecycle(self, event_type: str, cause: int) -> bool:
        """The log holds this lifecycle event of the decision at `cause` (one written
        more than once, `execution.waiting`: that decision's own), or of the execution."""
        if event_type in REPEATED_LIFECYCLE:
            return any(s.value.type == event_type for s in self.by_cause.get(cause, ()))
        return event_type in self.lifecycle

    def lifecycle_of(self, event_type: str, cause: int) -> Stored | None:
        """The recorded lifecycle event a decision's is held against: the execution's one
        of its type, or (written more than once) the decision's own."""
        if event_type in REPEATED_LIFECYCLE:
            return next((s for s in self.by_cause.get(cause, ()) if s.value.type == event_type), None)
        return self.lifecycle.get(event_type)

    def answered(self, command_id: str) -> None:
        self.results.add(command_id)

    def open_halts(self, source: str, loop_id: str | None = None) -> list[tuple[HaltKey, Stored]]:
        """The halts of `source` (and loop) no replay has ended yet, in input order."""
        return sorted(
            ((k, v) for k, v in self.halts.items() if k[0] == source and k[1] == loop_id), key=lambda kv: kv[0][2]
        )

    def round_of(self, key: HaltKey) -> int:
        """How many times the halt `key` was resumed: part of the next halt's (and
        resume's) message id, so a halt at the same input after a resume is recorded."""
        return self.rounds.get(key, 0)

    @property
    def last_decided(self) -> int:
        """Where in the log the last decided input is (0: none): a decision record's
        cause, or for an answer record (semantics 5, its cause negative: minus the input
        it followed; semantics 6, 0 for the start stored with its first decision) the
        record's own stream seq, the input it is."""
        return max((cause if cause > 0 else s.seq for cause, s in self.decisions.items()), default=0)

    @property
    def ended(self) -> bool:
        """The log records the execution's end."""
        return any(t in self.lifecycle for t in _ENDS)


# --- comparing -----------------------------------------------------------------------


def _plain(ev: Any) -> dict[str, Any]:
    plain: dict[str, Any] = msgspec.to_builtins(ev)
    return plain


def _stored(plain: dict[str, Any]) -> dict[str, Any]:
    """`plain` as the log would hold it: encoded as the outbox encodes (a NaN or an
    infinity is stored as null, a key as text, bytes as base64) and read back."""
    back: dict[str, Any] = msgspec.json.decode(_json.encode(plain))
    return back


def _same(recorded: dict[str, Any], derived: dict[str, Any]) -> bool:
    if _equal(recorded, derived):
        return True
    # what differs in memory may not differ as stored (NaN is not equal to itself, and is null in JSON)
    return _equal(_stored(recorded), _stored(derived))


def _equal(recorded: dict[str, Any], derived: dict[str, Any]) -> bool:
    if recorded.get("type") in _ENDS_WITH_RESULT and "result_ref" in recorded.get("data", {}):
        # the recorded result went to a blob (too large for the event): the event names it instead
        keep = {k: v for k, v in recorded["data"].items() if k not in ("result", "result_ref")}
        mine = {k: v for k, v in derived.get("data", {}).items() if k not in ("result", "result_ref")}
        return {**recorded, "data": keep} == {**derived, "data": mine}
    return recorded == derived


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _value(v: Any) -> str:
    return _cut(msgspec.json.encode(v).decode())


def _outline(recorded: dict[str, Any] | None, derived: dict[str, Any] | None) -> str:
    """The two records' kinds, no values."""
    r = _head(recorded) if recorded is not None else "nothing"
    d = _head(derived) if derived is not None else "nothing"
    return f"the log records {r}; this code decides {d}"


def _head(ev: dict[str, Any]) -> str:
    step = ev.get("step")
    return f"{ev.get('type')}" + (f" of step '{step}'" if step is not None else "")


def _show(ev: dict[str, Any], other: dict[str, Any] | None = None) -> str:
    """One event on one line; beside `other` (the same event as the other side has
    it), only the fields where the two differ."""
    data = ev.get("data", {})
    if other is not None and other.get("type") == ev.get("type"):
        theirs = other.get("data", {})
        keys = [k for k in sorted(set(data) | set(theirs)) if data.get(k) != theirs.get(k)]
        tops = [k for k in ("step", "at", "cause") if ev.get(k) != other.get(k)]
        parts = [f"{k}={_value(ev.get(k))}" for k in tops] + [f"{k}={_value(data.get(k))}" for k in keys[:3]]
        return f"{_head(ev)} with " + ", ".join(parts) if parts else _head(ev)
    return f"{_head(ev)} {_value(data)}"


def _first_difference(recorded: list[dict[str, Any]], derived: list[dict[str, Any]]) -> tuple[str, str, str] | None:
    for i in range(max(len(recorded), len(derived))):
        r = recorded[i] if i < len(recorded) else None
        d = derived[i] if i < len(derived) else None
        if r is not None and d is not None and _same(r, d):
            continue
        pos = f"event {i + 1} of {len(recorded)}"
        expected = f"{pos}: {_show(r, d)}" if r is not None else f"no event {i + 1} (the record ends)"
        shown = f"event {i + 1}: {_show(d, r)}" if d is not None else f"no event {i + 1} (its decision ends)"
        return expected, shown, f"event {i + 1}: {_outline(r, d)}"
    return None


def _given_up(stored: Stored) -> bool:
    """A terminal event the engine wrote itself when it gave up on an input (hosting's
    last resort), not a decision of the fold: a replay does not derive it."""
    ev = stored.value
    return isinstance(ev, PlaybookFailedEvent) and ev.data.error.get("type") == "EngineError"


class Replayer:
    """Compares an execution's replay, input by input, with its log (`Recorded`)."""

    def __init__(self, execution_id: str, recorded: Recorded, *, where: str = "the execution's log") -> None:
        self.execution_id = execution_id
        self.recorded = recorded
        self.where = where
        # an input the log decided on that this replay cannot fold (a value sealed with a
        # key this pod lacks, an input given up on): the decisions after it rest on other
        # inputs than the log's, and the execution fails with that input's error (its
        # EngineFault) instead; nothing after it is compared
        self.diverged = False

    def fresh(self, *, read_back: bool = True) -> Execution:
        """The state a replay folds into: the recorded failure decisions read back
        (`read_back`: as the engine does; without, the rules are evaluated again)."""
        return Execution(execution_id=self.execution_id, recorded=dict(self.recorded.failures) if read_back else {})

    def admit(self, seq: int, subject: str, inp: Input) -> Mismatch | None:
        """Before folding `inp`: a start record of semantics newer than this code's."""
        if isinstance(inp, StartRecord) and inp.semantics > SEMANTICS:
            return Mismatch(
                SEMANTICS_UNKNOWN,
                seq,
                subject,
                seq,
                subject,
                expected=f"semantics {inp.semantics}",
                derived=f"semantics {SEMANTICS} at most",
                where=self.where,
                outline=f"asks for semantics {inp.semantics}; this code runs {SEMANTICS} at most",
            )
        return None

    def check(self, seq: int, subject: str, fx: Effects | None, *, cause: int | None = None) -> Mismatch | None:
        """What the fold derived for the input at `seq` (None: nothing, the input was
        skipped or could not be read) against the records of that input, recorded under
        `cause` when it is not `seq` (an answer record's decision, semantics 5: minus the
        input it followed). A mismatch names the input by `seq`, its place in the log."""
        key = seq if cause is None else cause
        rec = self.recorded.decisions.get(key)
        if fx is None and (rec is not None or key in self.recorded.by_cause):
            self.diverged = True
        if self.diverged:
            return None
        derived = [_plain(e) for e in fx.events] if fx is not None else []
        if rec is not None:
            assert isinstance(rec.value, DecisionRecord)
            diff = _first_difference([_plain(e) for e in rec.value.events], derived)
            if diff is not None:
                return self._mismatch(seq, subject, rec, *diff)
        elif derived and seq < self.recorded.last_decided:
            # later inputs have records, written in input order before each ack: no crash
            # leaves this gap, the code that wrote the log decided nothing for this input
            first = derived[0]
            return self._mismatch(
                seq,
                subject,
                Stored(seq, subject, None),
                "no decision for this input (later inputs have theirs)",
                f"event 1: {_show(first)}",
                f"the log records nothing for this input; this code decides {_head(first)}",
            )
        lifecycle = {ev.type: _plain(ev) for ev in fx.lifecycle} if fx is not None else {}
        for type_, mine in lifecycle.items():
            stored = self.recorded.lifecycle_of(type_, key)
            if stored is None:
                continue  # not written yet (a crash before it): the replay sends it
            theirs = _plain(stored.value)
            if not _same(theirs, mine):
                return self._mismatch(
                    seq, subject, stored, _show(theirs, mine), _show(mine, theirs), _outline(theirs, mine)
                )
        for stored in self.recorded.by_cause.get(key, []):
            if stored.value.type not in lifecycle and not _given_up(stored):
                theirs = _plain(stored.value)
                return self._mismatch(
                    seq, subject, stored, _show(theirs), f"no {theirs.get('type')} event", _outline(theirs, None)
                )
        return None

    def _mismatch(self, seq: int, subject: str, stored: Stored, expected: str, derived: str, outline: str) -> Mismatch:
        return Mismatch(
            NONDETERMINISM, seq, subject, stored.seq, stored.subject, expected, derived, self.where, outline
        )


# --- an execution's log, folded here (the client, the harness, the corpus) ---------------


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One message of a log, decoded by the reader: an input (class `in`; None when it
    cannot be decoded), a `DecisionRecord` (`ev`), an event (`lc`)."""

    seq: int
    subject: str
    at: float
    cls: str  # in | ev | lc | anything else (ignored)
    value: Any
    # the seq the input is folded and checked with, when not its own: a result stored
    # with its decision (semantics 5, `answer_records`) is folded with that decision's
    # cause, minus the sequence of the input it followed
    cause: int | None = None

    @property
    def fold_seq(self) -> int:
        return self.seq if self.cause is None else self.cause


@dataclass(slots=True)
class Replay:
    """A replay's outcome: the state folded (up to the mismatch, if any), each input's
    derived effects, the first mismatch."""

    state: Execution
    outputs: list[tuple[int, Effects]]
    mismatch: Mismatch | None
    start: StartRecord | None = None


def lifecycle_records(seq: int, subject: str, at: float, ev: AnyEvent, extras: LifecycleExtras) -> list[LogRecord]:
    """The records one lifecycle message holds: the decision it carries (semantics 2),
    then its lifecycle events in decided order; one event for a message of semantics 1."""
    records = [LogRecord(seq, subject, at, "ev", extras.decision)] if extras.decision is not None else []
    return records + [LogRecord(seq, subject, at, "lc", one) for one in in_order(ev, extras)]


def answer_records(
    seq: int, subject: str, record: DecisionRecord, answer: Input | None, lifecycle: Sequence[AnyEvent] = ()
) -> list[LogRecord]:
    """The records one answer record holds (semantics 5, `exec.<p>.<id>.in.answer...`):
    the result it stores (or, semantics 6, the execution's start record: the log's
    first input, cause 0), an input folded with the record's cause and time (`answer`:
    that input decoded, and read back, by the reader; None when it cannot be read or is
    neither), then its decision record, then the lifecycle events one on
    `in.answer.lc.<type>[.cmd.<kind>]` carries (`lifecycle`, decided order:
    `AnswerRecord.lifecycle`)."""
    at = record.at if record.at is not None else 0.0
    if not isinstance(answer, (CallDone, CallError, StartRecord)):
        answer = None
    return [
        LogRecord(seq, subject, at, "in", answer, cause=record.cause),
        LogRecord(seq, subject, at, "ev", record),
        *(LogRecord(seq, subject, at, "lc", one) for one in lifecycle),
    ]


def recorded_of(log: Iterable[LogRecord]) -> Recorded:
    recorded = Recorded()
    for r in log:
        if r.cls == "ev" and isinstance(r.value, DecisionRecord):
            recorded.decision(r.seq, r.subject, r.value)
        elif r.cls == "lc" and r.value is not None:
            recorded.event(r.seq, r.subject, r.value)
        elif r.cls == "in":
            if isinstance(r.value, EngineFault):
                recorded.skip.add(r.value.input_seq)
            elif isinstance(r.value, (CallDone, CallError)):
                recorded.answered(r.value.command_id)
            elif isinstance(r.value, TimerFired):
                recorded.fired.add(r.value.timer_id)
    return recorded


def replay_execution(
    execution_id: str,
    log: list[LogRecord],
    *,
    subjects: ExecSubjects,
    read_back: bool = True,
    fold_one: Callable[[Execution, Input, int, float], Effects] | None = None,
) -> Replay:
    """Fold the execution's inputs (already read back: blobs resolved) into fresh
    state, as a replaying engine does, checking each decision against the log; stops at
    the first mismatch."""
    recorded = recorded_of(log)
    replayer = Replayer(execution_id, recorded)
    state = replayer.fresh(read_back=read_back)
    decide = fold_one or (lambda ex, inp, seq, at: fold(ex, inp, seq=seq, at=at, subjects=subjects))
    outputs: list[tuple[int, Effects]] = []
    start: StartRecord | None = None
    for r in log:
        if r.cls != "in":
            continue
        inp = r.value
        fx: Effects | None = None
        seq = r.fold_seq
        if inp is not None and r.seq not in recorded.skip:
            if isinstance(inp, StartRecord):
                if inp.execution_id != execution_id:
                    continue
                start = start or inp
            early = replayer.admit(r.seq, r.subject, inp)
            if early is not None:
                return Replay(state, outputs, early, start)
            fx = decide(state, inp, seq, r.at)
            outputs.append((seq, fx))
        mismatch = replayer.check(r.seq, r.subject, fx, cause=r.cause)
        if mismatch is not None:
            return Replay(state, outputs, mismatch, start)
    return Replay(state, outputs, None, start)


# --- a loop's log -------------------------------------------------------------------------


def _answers(inp: LoopInput) -> list[str]:
    if isinstance(inp, (CallDone, CallError, ChunkDone)):
        return [inp.command_id]
    if isinstance(inp, ResultBatch):
        return [r.command_id for r in inp.results]
    return []


class LoopReplayer:
    """A loop's replay against its log: every answer in the log is to a command the
    fold issued before it (and every timer that fired, one it armed). The log holds no
    decision records; what it answers is what the counter decided."""

    def __init__(self, execution_id: str, loop_id: str) -> None:
        self.where = f"loop {loop_id}'s log"
        self.issued: dict[str, None] = {}  # command ids, in order
        self.armed: set[str] = set()

    def admit(self, seq: int, subject: str, inp: LoopInput, run: LoopRun) -> Mismatch | None:
        """Before folding `inp`: does the log answer anything this replay never sent?"""
        timer = inp.timer_id if isinstance(inp, TimerFired) else None
        return self.answers(seq, subject, _answers(inp), timer, run)

    def answers(
        self, seq: int, subject: str, commands: Iterable[str], timer: str | None, run: LoopRun
    ) -> Mismatch | None:
        """`admit` with what the input answers read off its subject by the shell: the
        commands it answers, the timer that fired."""
        if run.finished:
            return None  # the loop ended (a verdict, a cancel): later answers change nothing
        for command_id in commands:
            if command_id not in self.issued:
                sent = list(self.issued)[-3:]
                return Mismatch(
                    NONDETERMINISM,
                    seq,
                    subject,
                    seq,
                    subject,
                    expected=f"an answer to command {command_id} (so the counter issued it)",
                    derived=f"no command {command_id} (the last issued: {', '.join(sent) or 'none'})",
                    where=self.where,
                    outline=f"the log answers command {command_id}, which this code never issued",
                )
        if timer is not None and timer not in self.armed:
            return Mismatch(
                NONDETERMINISM,
                seq,
                subject,
                seq,
                subject,
                expected=f"timer {timer} fired (so the counter armed it)",
                derived=f"no timer {timer}",
                where=self.where,
                outline=f"timer {timer} fired in the log, which this code never armed",
            )
        return None

    def derived(self, fx: Effects | None) -> None:
        """What the fold of one input issued."""
        if fx is None:
            return
        self.issued.update((c.command_id, None) for c in fx.commands)
        self.issued.update((s.parent.command_id, None) for s in fx.starts if s.parent and s.parent.command_id)
        self.armed.update(t.timer_id for t in fx.timers)


def loop_fold(run: LoopRun, inp: LoopInput, at: float, subjects: LoopSubjects) -> Effects:
    """One input of a loop's log folded as the counter folds it: the spec with its
    parsed step, every input under the execution's template limits."""
    spec = inp if isinstance(inp, LoopSpec) else run.spec
    assert spec is not None, "a loop's log starts with its spec"
    step = (
        parsed_playbook(inp.playbook_source, inp.playbook_path, spec.limits.max_attempts).step(inp.step)
        if isinstance(inp, LoopSpec)
        else None
    )
    return call_with_limits(spec.limits, lambda: fold_loop(run, inp, at=at, subjects=subjects, step=step))


@dataclass(slots=True)
class LoopReplay:
    state: LoopRun
    outputs: list[Effects]
    mismatch: Mismatch | None


def replay_loop(
    execution_id: str,
    loop_id: str,
    log: Iterable[LogRecord],
    *,
    subjects: LoopSubjects,
    fold_one: Callable[[LoopRun, LoopInput, float], Effects] | None = None,
) -> LoopReplay:
    """Fold a loop's inputs into fresh state, checking each answer against what the
    fold issued; stops at the first mismatch."""
    run = LoopRun(execution_id=execution_id, loop_id=loop_id)
    checker = LoopReplayer(execution_id, loop_id)
    decide = fold_one or (lambda state, inp, at: loop_fold(state, inp, at, subjects))
    outputs: list[Effects] = []
    for r in log:
        if r.cls != "in" or r.value is None:
            continue
        mismatch = checker.admit(r.seq, r.subject, r.value, run)
        if mismatch is not None:
            return LoopReplay(run, outputs, mismatch)
        fx = decide(run, r.value, r.at)
        checker.derived(fx)
        outputs.append(fx)
    return LoopReplay(run, outputs, None)
