"""An execution's events and states: every name a reader may compare, in one place.

The engine (actors/core/decide.py) writes these events: decision records (class `ev`)
and lifecycle events (class `lc`); the projector, the client, the CLI and the engine's
own replay read them. Each event type is a tagged msgspec Struct whose `data` is typed
field by field. On the wire an event is
`{"type", "execution_id", "at", "cause", "step", "data": {...}}`, as it was when `data`
was a plain dict: a log written before these types decodes into them.

Inside `data` a key is present exactly when the engine always wrote it (null included);
a key written only sometimes is `UNSET` when absent, so it is omitted as it always was.

An event this code cannot read as one of its types decodes as `UnknownEvent`, its
data kept as a dict: a type it does not know (written by a newer engine), or data that
does not fit the type (a record forged by hand). Readers that only display show it as
it came; readers that decide look only at the typed events (the projector, by type
name, as it always did). A record that is not an event at all is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

from actors.wire.secrecy import SECRET, SECRET_ERROR

# --- states ----------------------------------------------------------------------------


class ExecState(StrEnum):
    """An execution's state, as the status projection (KV `status`) and the engine hold it."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # not terminal: a replay met a decision this code would not make (or semantics it does
    # not know); the execution waits, untouched, for code that decides as its log does
    # (actors/core/replay.py, docs/upgrades.md)
    HALTED = "HALTED"


# a tuple, not a set: metrics list the terminal states in this order
TERMINAL_STATES: tuple[ExecState, ...] = (ExecState.COMPLETED, ExecState.FAILED, ExecState.CANCELLED)


class ActivationStatus(StrEnum):
    """One visit of a step (an activation): running, or how it ended (`step.exit` status)."""

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class ArrivalStatus(StrEnum):
    """How a branch reached `end`: HANDLED is a failure an on_error or on_failure rule took."""

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    HANDLED = "HANDLED"
    CANCELLED = "CANCELLED"


# --- event types -----------------------------------------------------------------------


class EventType(StrEnum):
    # decision records
    STEP_ENTER = "step.enter"
    STEP_EXIT = "step.exit"
    COMMAND_ISSUED = "command.issued"
    COMMAND_CANCELLED = "command.cancelled"
    ITERATOR_STARTED = "iterator.started"
    ITERATOR_COMPLETED = "iterator.completed"
    RETRY_SCHEDULED = "retry.scheduled"
    RETRY_DUE = "retry.due"
    RETRY_EXHAUSTED = "retry.exhausted"
    RETRY_SEQUENCE_COMPLETED = "retry_sequence.completed"
    FAILURE_DECIDED = "step.failure_decided"
    BUDGET_EXCEEDED = "step.budget_exceeded"
    ROUTING_PAUSED = "routing.paused"
    ENGINE_FAULT = "engine.fault"
    RETRY_OF = "execution.retry_of"  # in a retry's log: which execution it retries, from which step
    RETRIED = "execution.retried"  # in the retried execution's log: which execution retries it
    # waits (`tool: wait`, docs/language.md "Waiting"): a step starts waiting, a signal is
    # taken by a wait, kept in the mailbox, dropped past its bound or handed to a loop of
    # waits, a wait's timer fires
    STEP_WAITING = "step.waiting"
    SIGNAL_RECEIVED = "signal.received"
    SIGNAL_KEPT = "signal.kept"
    SIGNAL_DROPPED = "signal.dropped"
    SIGNAL_FORWARDED = "signal.forwarded"
    WAIT_ENDED = "wait.ended"
    # lifecycle events: the only events that decide an execution's status
    PLAYBOOK_INITIALIZED = "playbook.initialized"
    WORKFLOW_INITIALIZED = "workflow.initialized"
    WORKFLOW_COMPLETED = "workflow.completed"
    WORKFLOW_FAILED = "workflow.failed"
    PLAYBOOK_COMPLETED = "playbook.completed"
    PLAYBOOK_FAILED = "playbook.failed"
    EXECUTION_CANCELLED = "execution.cancelled"
    # what a RUNNING execution waits for, each time the set of its waits changes (empty:
    # it waits for nothing any more); the one lifecycle event an execution writes more
    # than once (`REPEATED_LIFECYCLE`), so its message id names its decision
    EXECUTION_WAITING = "execution.waiting"
    # written by the shells, not decided by the fold: a replay's mismatch stops the
    # execution (HALTED); a later replay that matches again resumes it (RUNNING)
    EXECUTION_HALTED = "execution.halted"
    EXECUTION_RESUMED = "execution.resumed"


# the lifecycle events that end an execution, and the state each one ends it in
TERMINAL_EVENTS: dict[str, ExecState] = {
    EventType.PLAYBOOK_COMPLETED: ExecState.COMPLETED,
    EventType.PLAYBOOK_FAILED: ExecState.FAILED,
    EventType.EXECUTION_CANCELLED: ExecState.CANCELLED,
}

# lifecycle events an execution may write more than once, one per decision at most:
# their message id and their place in a replay's comparison are by decision (cause),
# not by type (actors/runtime/outbox.py, actors/core/replay.py)
REPEATED_LIFECYCLE = frozenset({EventType.EXECUTION_WAITING.value})

# An error as templates and events see it (actors/core/effects.py `error_view`): every
# ErrorInfo field present. A dict, because templates read it as one.
ErrorView = dict[str, Any]


# --- data of each event type -------------------------------------------------------------


class _Data(Struct, kw_only=True):
    """No omit_defaults: a key the engine always wrote stays on the wire even when null;
    a key it wrote only sometimes is typed `... | UnsetType` and omitted while UNSET."""


class StepEnterData(_Data):
    activation: int
    arrivals: list[str] | UnsetType = UNSET  # entering `end`: the steps of the branches that reached it
    from_activation: int | UnsetType | None = UNSET  # any other step: the activation it was routed from
    remediates: str | UnsetType = UNSET  # a remediation step: the step whose failure it handles


class FailureRoute(_Data):
    """Where a failed step's on_failure edges took it, on its `step.exit`."""

    attempted: bool
    status: str  # selected | no_route | skipped_terminal | step_budget_exceeded
    target: str | UnsetType | None = UNSET
    edge: str | UnsetType = UNSET


class StepExitData(_Data):
    activation: int
    status: ActivationStatus
    reason: str | UnsetType = UNSET
    next: list[str] | UnsetType = UNSET
    ignored_error: Annotated[ErrorView, SECRET_ERROR] | UnsetType = UNSET
    error: Annotated[ErrorView, SECRET_ERROR] | UnsetType = UNSET
    routed_to_end: bool | UnsetType = UNSET
    original_failed_step: str | UnsetType = UNSET
    handled: bool | UnsetType = UNSET
    aborted: bool | UnsetType = UNSET
    failure_route: FailureRoute | UnsetType = UNSET


class CommandIssuedData(_Data):
    activation: int
    command_id: str
    kind: str
    attempt_number: int
    child_execution_id: str | UnsetType = UNSET  # `tool: playbook`
    parent_event_id: str | UnsetType | None = UNSET  # a later attempt: the command it follows


class CommandCancelledData(_Data):
    activation: int
    command_id: str
    reason: str


class IteratorStartedData(_Data):
    activation: int
    loop_id: str
    size: int
    mode: str
    element: str
    concurrency: int
    chunk_size: int | None
    tolerated_failures: int | str
    attempt_number: int
    parent_event_id: str | UnsetType | None = UNSET
    # a redrive: how many iterations run again (the others keep their old results)
    redriven: int | UnsetType = UNSET


class IteratorCompletedData(_Data):
    """Written by the engine itself only for an empty collection (the counter's verdicts
    are inputs, actors/wire/messages.py)."""

    activation: int
    loop_id: str
    total: int
    succeeded: int
    failed: int


class RetryScheduledData(_Data):
    activation: int
    attempt_number: int
    delay: float
    due: float
    reason: str
    rule: str | None
    parent_event_id: str | None


class RetryDueData(_Data):
    activation: int
    timer_id: str
    due: float
    late_ms: float


class RetryExhaustedData(_Data):
    activation: int
    attempts: int
    max_attempts: int | None
    error: Annotated[ErrorView, SECRET_ERROR] | None
    rule: str | None


class RetrySequenceCompletedData(_Data):
    activation: int
    total_attempts: int
    collected_size: int
    bounded: bool
    rule: str | UnsetType = UNSET  # bounded: the rule whose bound it hit


class FailureDecidedData(_Data):
    """The on_error decision for one failed attempt. Recorded once, and read back in a
    replay (`Execution.recorded`) instead of being evaluated again."""

    activation: int
    attempt_number: int
    error: Annotated[ErrorView, SECRET_ERROR]
    decision: str  # none | ignore | retry | retry_later | cancel | handled | abort
    rule: str | None
    result: Annotated[Any, SECRET] | UnsetType = UNSET  # ignore: the step's result
    args: Annotated[Any, SECRET] | UnsetType = UNSET  # retry: args over the next attempt's
    delay: float | UnsetType = UNSET  # retry_later


class BudgetExceededData(_Data):
    from_activation: int
    budget: int
    error: Annotated[ErrorView, SECRET_ERROR]


class RoutingPausedData(_Data):
    timer_id: str
    pending: int


class EngineFaultData(_Data):
    input_seq: int
    input_subject: str
    error: Annotated[ErrorView, SECRET_ERROR]


class RetryOfData(_Data):
    """A retry's first decision: the execution it retries, the step it starts from, and
    the steps whose results it took over (their values are in the start record)."""

    execution_id: str
    from_step: str
    kept_steps: list[str]


class RetriedData(_Data):
    """In a terminal execution's log: a retry of it was started."""

    retry_execution_id: str
    from_step: str


class StepWaitingData(_Data):
    """A wait step's attempt starts waiting (`tool: wait`): for the signal `signal` with
    `key` (None: a timer to a date), until `deadline` (epoch seconds; None: no bound),
    its durable timer `timer_id`. A loop of waits (`loop_id`) waits per iteration, in
    the counter: the execution forwards it the signals of its name."""

    activation: int
    attempt_number: int
    signal: str | None
    key: str
    deadline: float | None
    timer_id: str | None
    approval: bool | UnsetType = UNSET
    loop_id: str | UnsetType = UNSET


class SignalReceivedData(_Data):
    """A waiting step took a signal (`kept`: from the mailbox, where it waited for the
    step): its data is the step's result (not repeated here: the signal is in the log)."""

    activation: int
    signal_id: str
    name: str
    key: str
    by: str
    sent_at: float
    kept: bool | UnsetType = UNSET


class SignalKeptData(_Data):
    """A signal nothing waits for (or whose key or `when` no waiting step matches), kept
    in the execution's mailbox for a later wait; `kept`: how many are kept now.
    `reason`: a waiting step's `when` could not be evaluated for it (what the template
    said): for that step it does not match, and the step goes on waiting."""

    signal_id: str
    name: str
    key: str
    by: str
    kept: int
    reason: str | UnsetType = UNSET


class SignalDroppedData(_Data):
    """A signal the mailbox had no room for: its bound is `limit` kept signals, and
    `limit_bytes` bytes of their data (set when that bound is the one reached)."""

    signal_id: str
    name: str
    key: str
    by: str
    limit: int
    limit_bytes: int | UnsetType = UNSET


class SignalForwardedData(_Data):
    """A signal handed to a running loop of waits (its log's `in.signal`): the counter
    matches it to an iteration. `kept`: handed over with the loop's spec (it was kept
    before the loop started)."""

    activation: int
    loop_id: str
    signal_id: str
    name: str
    key: str
    kept: bool | UnsetType = UNSET


class WaitEndedData(_Data):
    """A wait's timer fired: `until` (a timer to a date, the step completes) or
    `timeout` (a signal wait, the attempt fails `WaitTimeout`)."""

    activation: int
    timer_id: str
    reason: str  # until | timeout
    due: float
    late_ms: float


class WaitEntry(_Data):
    """One wait, as `execution.waiting` lists it: the shape of actors/wire/messages.py
    `WaitInfo` (the status record's), which this module cannot import."""

    step: str
    activation: int
    since: float
    signal: str | None = None
    key: str = ""
    deadline: float | None = None
    approval: bool = False
    loop: bool = False


class ExecutionWaitingData(_Data):
    """What the execution waits for now, written whenever that changes; empty once it
    waits for nothing. The status record's `waiting` (actors/status/projector.py)."""

    waits: list[WaitEntry]


class PlaybookInitializedData(_Data):
    playbook: str
    version: int | None
    started_at: float
    parent_execution_id: str | UnsetType = UNSET
    parent_step: str | UnsetType | None = UNSET


class WorkflowInitializedData(_Data):
    entry: str


class WorkflowCompletedData(_Data):
    evaluated_by_end_step: bool
    total_steps: int
    failed_steps_count: int
    handled_failures: list[str]
    cancelled_steps: list[str]


class WorkflowFailedData(_Data):
    failed_steps: list[str]
    evaluated_by_end_step: bool
    total_steps: int
    failed_steps_count: int
    handled_failures: list[str]
    cancelled_steps: list[str]


class PlaybookCompletedData(_Data):
    playbook: str
    started_at: float | None
    ended_at: float
    result: Annotated[Any, SECRET]
    evaluated_by_end_step: bool
    total_steps: int
    failed_steps_count: int
    handled_failures: list[str]
    cancelled_steps: list[str]
    result_ref: str | UnsetType = UNSET  # a result too large for the event: a blob (result is then null)


class PlaybookFailedData(_Data):
    """A failed execution. Evaluated by `end`, it carries the summary fields too; an
    execution that could not start or that the engine gave up on carries just its error."""

    playbook: str
    started_at: float | None
    ended_at: float
    error: Annotated[dict[str, Any], SECRET_ERROR]  # decide.execution_error: the root cause and every failed step
    failed_steps: list[str] | UnsetType = UNSET
    result: Annotated[Any, SECRET] | UnsetType = UNSET
    evaluated_by_end_step: bool | UnsetType = UNSET
    total_steps: int | UnsetType = UNSET
    failed_steps_count: int | UnsetType = UNSET
    handled_failures: list[str] | UnsetType = UNSET
    cancelled_steps: list[str] | UnsetType = UNSET
    result_ref: str | UnsetType = UNSET


class ExecutionCancelledData(_Data):
    playbook: str
    started_at: float | None
    ended_at: float
    reason: str
    running_commands: list[str]


class ExecutionHaltedData(_Data):
    """A replay (engine: the execution's log; counter: one loop's) derived a decision
    other than the one recorded, or met a start record of semantics this code does not
    know: the execution makes no progress until code that decides as the log does
    replays it (actors/core/replay.py `Mismatch`)."""

    source: str  # engine | counter
    kind: str  # Nondeterminism | SemanticsUnknown
    input_seq: int  # the input whose decision differs (stream sequence)
    input_subject: str
    record_seq: int  # the first differing record (its stream sequence; the input's when none)
    record_subject: str
    # what the log records and what this code decides, one line each: they quote the
    # values that differ (a result, args), so they are sealed like any value
    expected: Annotated[str, SECRET]
    derived: Annotated[str, SECRET]
    semantics: int  # the semantics this code runs (actors/core/replay.py SEMANTICS)
    error: Annotated[ErrorView, SECRET_ERROR]  # type = kind, message = the whole story in one line
    loop_id: str | UnsetType = UNSET  # the counter: the loop whose replay differs


class ExecutionResumedData(_Data):
    """A replay that matches the log again, after a halt: the execution goes on."""

    halted_seq: int  # the input_seq of the halt it ends
    semantics: int
    # whose halt it ends: the engine's (absent: written before the field) or a loop's
    # (the counter's replay of that loop matches again)
    source: str | UnsetType = UNSET
    loop_id: str | UnsetType = UNSET


# --- events ------------------------------------------------------------------------------


class _Event(Struct, omit_defaults=True, tag_field="type"):
    """One event of an execution's history. `at` is the log time of the input that
    caused it (so a replay reproduces it); `cause` that input's stream sequence."""

    execution_id: str
    at: float
    cause: int
    step: str | None = None

    @property
    def type(self) -> EventType:
        # read about twenty times per execution: the enum is made once per class, not per read
        cls = self.__class__
        found = _EVENT_TYPES.get(cls)
        if found is None:
            found = _EVENT_TYPES[cls] = EventType(str(cls.__struct_config__.tag))
        return found


_EVENT_TYPES: dict[type[_Event], EventType] = {}  # event class -> its type (`_Event.type`)


# `data` is keyword-only so it follows `step` on the wire, as it always did
class StepEnterEvent(_Event, tag=EventType.STEP_ENTER.value, kw_only=True):
    data: StepEnterData


class StepExitEvent(_Event, tag=EventType.STEP_EXIT.value, kw_only=True):
    data: StepExitData


class CommandIssuedEvent(_Event, tag=EventType.COMMAND_ISSUED.value, kw_only=True):
    data: CommandIssuedData


class CommandCancelledEvent(_Event, tag=EventType.COMMAND_CANCELLED.value, kw_only=True):
    data: CommandCancelledData


class IteratorStartedEvent(_Event, tag=EventType.ITERATOR_STARTED.value, kw_only=True):
    data: IteratorStartedData


class IteratorCompletedEvent(_Event, tag=EventType.ITERATOR_COMPLETED.value, kw_only=True):
    data: IteratorCompletedData


class RetryScheduledEvent(_Event, tag=EventType.RETRY_SCHEDULED.value, kw_only=True):
    data: RetryScheduledData


class RetryDueEvent(_Event, tag=EventType.RETRY_DUE.value, kw_only=True):
    data: RetryDueData


class RetryExhaustedEvent(_Event, tag=EventType.RETRY_EXHAUSTED.value, kw_only=True):
    data: RetryExhaustedData


class RetrySequenceCompletedEvent(_Event, tag=EventType.RETRY_SEQUENCE_COMPLETED.value, kw_only=True):
    data: RetrySequenceCompletedData


class FailureDecidedEvent(_Event, tag=EventType.FAILURE_DECIDED.value, kw_only=True):
    data: FailureDecidedData


class BudgetExceededEvent(_Event, tag=EventType.BUDGET_EXCEEDED.value, kw_only=True):
    data: BudgetExceededData


class RoutingPausedEvent(_Event, tag=EventType.ROUTING_PAUSED.value, kw_only=True):
    data: RoutingPausedData


class EngineFaultEvent(_Event, tag=EventType.ENGINE_FAULT.value, kw_only=True):
    data: EngineFaultData


class RetryOfEvent(_Event, tag=EventType.RETRY_OF.value, kw_only=True):
    data: RetryOfData


class RetriedEvent(_Event, tag=EventType.RETRIED.value, kw_only=True):
    data: RetriedData


class StepWaitingEvent(_Event, tag=EventType.STEP_WAITING.value, kw_only=True):
    data: StepWaitingData


class SignalReceivedEvent(_Event, tag=EventType.SIGNAL_RECEIVED.value, kw_only=True):
    data: SignalReceivedData


class SignalKeptEvent(_Event, tag=EventType.SIGNAL_KEPT.value, kw_only=True):
    data: SignalKeptData


class SignalDroppedEvent(_Event, tag=EventType.SIGNAL_DROPPED.value, kw_only=True):
    data: SignalDroppedData


class SignalForwardedEvent(_Event, tag=EventType.SIGNAL_FORWARDED.value, kw_only=True):
    data: SignalForwardedData


class WaitEndedEvent(_Event, tag=EventType.WAIT_ENDED.value, kw_only=True):
    data: WaitEndedData


class ExecutionWaitingEvent(_Event, tag=EventType.EXECUTION_WAITING.value, kw_only=True):
    data: ExecutionWaitingData


class PlaybookInitializedEvent(_Event, tag=EventType.PLAYBOOK_INITIALIZED.value, kw_only=True):
    data: PlaybookInitializedData


class WorkflowInitializedEvent(_Event, tag=EventType.WORKFLOW_INITIALIZED.value, kw_only=True):
    data: WorkflowInitializedData


class WorkflowCompletedEvent(_Event, tag=EventType.WORKFLOW_COMPLETED.value, kw_only=True):
    data: WorkflowCompletedData


class WorkflowFailedEvent(_Event, tag=EventType.WORKFLOW_FAILED.value, kw_only=True):
    data: WorkflowFailedData


class PlaybookCompletedEvent(_Event, tag=EventType.PLAYBOOK_COMPLETED.value, kw_only=True):
    data: PlaybookCompletedData


class PlaybookFailedEvent(_Event, tag=EventType.PLAYBOOK_FAILED.value, kw_only=True):
    data: PlaybookFailedData


class ExecutionCancelledEvent(_Event, tag=EventType.EXECUTION_CANCELLED.value, kw_only=True):
    data: ExecutionCancelledData


class ExecutionHaltedEvent(_Event, tag=EventType.EXECUTION_HALTED.value, kw_only=True):
    data: ExecutionHaltedData


class ExecutionResumedEvent(_Event, tag=EventType.EXECUTION_RESUMED.value, kw_only=True):
    data: ExecutionResumedData


Event = (
    StepEnterEvent
    | StepExitEvent
    | CommandIssuedEvent
    | CommandCancelledEvent
    | IteratorStartedEvent
    | IteratorCompletedEvent
    | RetryScheduledEvent
    | RetryDueEvent
    | RetryExhaustedEvent
    | RetrySequenceCompletedEvent
    | FailureDecidedEvent
    | BudgetExceededEvent
    | RoutingPausedEvent
    | EngineFaultEvent
    | RetryOfEvent
    | RetriedEvent
    | StepWaitingEvent
    | SignalReceivedEvent
    | SignalKeptEvent
    | SignalDroppedEvent
    | SignalForwardedEvent
    | WaitEndedEvent
    | ExecutionWaitingEvent
    | PlaybookInitializedEvent
    | WorkflowInitializedEvent
    | WorkflowCompletedEvent
    | WorkflowFailedEvent
    | PlaybookCompletedEvent
    | PlaybookFailedEvent
    | ExecutionCancelledEvent
    | ExecutionHaltedEvent
    | ExecutionResumedEvent
)
EventData = (
    StepEnterData
    | StepExitData
    | CommandIssuedData
    | CommandCancelledData
    | IteratorStartedData
    | IteratorCompletedData
    | RetryScheduledData
    | RetryDueData
    | RetryExhaustedData
    | RetrySequenceCompletedData
    | FailureDecidedData
    | BudgetExceededData
    | RoutingPausedData
    | EngineFaultData
    | RetryOfData
    | RetriedData
    | StepWaitingData
    | SignalReceivedData
    | SignalKeptData
    | SignalDroppedData
    | SignalForwardedData
    | WaitEndedData
    | ExecutionWaitingData
    | PlaybookInitializedData
    | WorkflowInitializedData
    | WorkflowCompletedData
    | WorkflowFailedData
    | PlaybookCompletedData
    | PlaybookFailedData
    | ExecutionCancelledData
    | ExecutionHaltedData
    | ExecutionResumedData
)

# which event a data Struct belongs to, read off the event types themselves
EVENT_OF: dict[type[EventData], type[Event]] = {msgspec.structs.fields(cls)[-1].type: cls for cls in Event.__args__}


def make_event(data: EventData, *, execution_id: str, at: float, cause: int, step: str | None = None) -> Event:
    """The event that carries `data` (its type follows from the data's)."""
    kind = EVENT_OF[type(data)]
    return kind(execution_id=execution_id, at=at, cause=cause, step=step, data=data)  # type: ignore[arg-type]


class UnknownEvent(Struct, omit_defaults=True):
    """An event this code cannot read as one of its types (see the module): kept as it
    came, encoded back the same."""

    type: str
    execution_id: str
    at: float
    cause: int
    step: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


AnyEvent = Event | UnknownEvent


class DecisionRecord(Struct, omit_defaults=True):
    """The events of one decision, written as one message (class `ev`). `command`: the
    one command the decision issued, as its own message would hold it (values sealed),
    when the record is its only stored copy (semantics 2, subject `ev.cmd.<kind>`: tool
    actors take it from the log; `embedded_command`).

    Semantics 5: a step's result stored with the decision it led to, as one input
    (`exec.<p>.<id>.in.answer...`, written by the engine for the tool that asked):
    `answer` is the result message's bytes exactly as the tool sent them, `at` the time
    the decision read (a replay folds the answer with it, and with `cause`, minus the
    stream sequence of the input it followed). Both omitted when unset, so every other
    record's bytes are as before."""

    cause: int
    events: Sequence[AnyEvent] = field(default_factory=list)
    command: msgspec.Raw | None = None
    answer: msgspec.Raw | None = None
    at: float | None = None


_NULL = msgspec.Raw(b"null")


class _HeldByRecord(Struct):
    command: msgspec.Raw = _NULL  # msgspec decodes Raw alone, not in a union with None


class _HeldCommand(Struct):
    command: msgspec.Raw = _NULL  # a decision record's
    decision: _HeldByRecord | None = None  # a lifecycle event's that carries its decision


_held_command = msgspec.json.Decoder(_HeldCommand)


def embedded_command(message: bytes) -> bytes | None:
    """The command a stored decision holds (its own message's bytes, values as sealed):
    a decision record's (`ev.cmd.<kind>`, or an answer record's, `in.answer.cmd.<kind>`,
    semantics 5) or that of the record a lifecycle event carries (`lc.<type>.cmd.<kind>`);
    None when it holds none. Raises msgspec.DecodeError for a
    message that is neither."""
    held = _held_command.decode(message)
    raw = held.decision.command if held.command == _NULL and held.decision is not None else held.command
    return None if raw == _NULL else bytes(raw)


class _TypedDecision(Struct):
    cause: int
    events: list[Event] = field(default_factory=list)
    answer: msgspec.Raw = _NULL  # msgspec decodes Raw alone, not in a union with None
    at: float | None = None


class _RawDecision(Struct):
    cause: int
    events: list[msgspec.Raw] = field(default_factory=list)
    answer: msgspec.Raw = _NULL
    at: float | None = None


def _answer_of(raw: msgspec.Raw) -> msgspec.Raw | None:
    return None if raw == _NULL else msgspec.Raw(bytes(raw))


class EventDecoder:
    """Decodes one event; one that does not fit any type becomes an `UnknownEvent`."""

    def __init__(self) -> None:
        self._typed: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)
        self._any = msgspec.json.Decoder(UnknownEvent)

    def decode(self, data: bytes | msgspec.Raw) -> AnyEvent:
        try:
            return self._typed.decode(data)
        except msgspec.ValidationError:
            return self._any.decode(data)


class DecisionDecoder:
    """Decodes a decision record, each event as `EventDecoder` does."""

    def __init__(self) -> None:
        self._typed = msgspec.json.Decoder(_TypedDecision)
        self._raw = msgspec.json.Decoder(_RawDecision)

    def decode(self, data: bytes) -> DecisionRecord:
        try:
            rec = self._typed.decode(data)
            return DecisionRecord(cause=rec.cause, events=rec.events, answer=_answer_of(rec.answer), at=rec.at)
        except msgspec.ValidationError:
            raw = self._raw.decode(data)
            return DecisionRecord(
                cause=raw.cause,
                events=[event_decoder.decode(e) for e in raw.events],
                answer=_answer_of(raw.answer),
                at=raw.at,
            )


event_decoder = EventDecoder()
decision_decoder = DecisionDecoder()


# --- a lifecycle event that carries its whole decision (semantics 2) -------------------


class LifecycleExtras(Struct, omit_defaults=True):
    """What a lifecycle event carries beside its own fields when it is the one message
    of its decision (executions of semantics 2 on, docs/architecture.md "Stored
    writes"): the decision's record and its other lifecycle events, in the order the
    decision made them around this one. An execution's first decision (its first step
    entered, `playbook.initialized`, `workflow.initialized`) and its last (the last step
    left, `workflow.completed`, `playbook.completed`) are then one stored message each,
    not three: one write, one fsync under `sync always`, and the decision lands whole or
    not at all.

    On the wire these are extra keys of the event's own JSON object (`decision`,
    `before`, `after`), so a reader that knows only events (an older projector, a client
    reading `data.result`) reads the event as it always did."""

    decision: DecisionRecord | None = None
    before: Sequence[AnyEvent] = field(default_factory=list)
    after: Sequence[AnyEvent] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.decision is None and not self.before and not self.after


class _TypedExtras(Struct):
    decision: _TypedDecision | None = None
    before: list[Event] = field(default_factory=list)
    after: list[Event] = field(default_factory=list)


class _RawExtras(Struct):
    decision: _RawDecision | None = None
    before: list[msgspec.Raw] = field(default_factory=list)
    after: list[msgspec.Raw] = field(default_factory=list)


class ExtrasDecoder:
    """Decodes the `LifecycleExtras` of a lifecycle message (empty for one that carries
    none: every lifecycle event of semantics 1), each event as `EventDecoder` does."""

    def __init__(self) -> None:
        self._typed = msgspec.json.Decoder(_TypedExtras)
        self._raw = msgspec.json.Decoder(_RawExtras)

    def decode(self, data: bytes) -> LifecycleExtras:
        try:
            t = self._typed.decode(data)
            d = t.decision
            rec = (
                None
                if d is None
                else DecisionRecord(cause=d.cause, events=d.events, answer=_answer_of(d.answer), at=d.at)
            )
            return LifecycleExtras(decision=rec, before=t.before, after=t.after)
        except msgspec.ValidationError:
            r = self._raw.decode(data)
            rec = (
                None
                if r.decision is None
                else DecisionRecord(
                    cause=r.decision.cause,
                    events=[event_decoder.decode(e) for e in r.decision.events],
                    answer=_answer_of(r.decision.answer),
                    at=r.decision.at,
                )
            )
            return LifecycleExtras(
                decision=rec,
                before=[event_decoder.decode(e) for e in r.before],
                after=[event_decoder.decode(e) for e in r.after],
            )


extras_decoder = ExtrasDecoder()


def carrier_of(lifecycle: Sequence[AnyEvent]) -> int:
    """Which of a decision's lifecycle events carries it: the last that is the
    playbook's or the execution's own, else the last. So an execution's end is always
    on its own subject (`lc.playbook.completed`: what `Client.terminal` and readers of
    `data.result` look up), even when one decision starts and ends the execution, and
    a reader that knows only events (an older projector) meets the event that names
    the playbook and decides the status."""
    for i in range(len(lifecycle) - 1, -1, -1):
        kind = lifecycle[i].type
        # never `execution.waiting` while another can carry: it says no more than a sub-state
        if kind.startswith(("playbook.", "execution.")) and kind not in REPEATED_LIFECYCLE:
            return i
    return len(lifecycle) - 1


def splice(event_json: bytes, extras_json: bytes) -> bytes:
    """One JSON object: an event's fields and its extras' (no key in common)."""
    if extras_json == b"{}":
        return event_json
    return event_json[:-1] + b"," + extras_json[1:]


def in_order(ev: AnyEvent, extras: LifecycleExtras) -> list[AnyEvent]:
    """The lifecycle events of one lifecycle message, in the order they were decided."""
    return [*extras.before, ev, *extras.after]


class AnswerRecord(Struct):
    """What one answer record holds (semantics 5, `exec.<p>.<id>.in.answer...`): the
    decision record (the result in `answer`) and, for one stored on
    `in.answer.lc.<type>` (the decision ended or changed the execution: a lifecycle
    carrier, as `LifecycleExtras` shapes it), its lifecycle events in decided order."""

    record: DecisionRecord
    lifecycle: list[AnyEvent] = field(default_factory=list)


class _Carries(Struct):
    decision: msgspec.Raw = _NULL


_carries = msgspec.json.Decoder(_Carries)


class AnswerDecoder:
    """Decodes an answer record of either shape: a decision record (`in.answer.ev`,
    `in.answer.cmd.<kind>`) or a lifecycle event carrying it (`in.answer.lc.<type>`,
    told by its `decision` key)."""

    def decode(self, data: bytes) -> AnswerRecord:
        if _carries.decode(data).decision != _NULL:
            extras = extras_decoder.decode(data)
            if extras.decision is None:
                raise msgspec.ValidationError("an answer record's carrier holds no decision")
            return AnswerRecord(record=extras.decision, lifecycle=in_order(event_decoder.decode(data), extras))
        return AnswerRecord(record=decision_decoder.decode(data))


answer_decoder = AnswerDecoder()


def lifecycle_message(data: bytes) -> tuple[DecisionRecord | None, list[AnyEvent]]:
    """What one stored lifecycle message holds, values as stored (no codec): the
    decision record it carries (semantics 2; else None) and its lifecycle events in
    decided order."""
    extras = extras_decoder.decode(data)
    return extras.decision, in_order(event_decoder.decode(data), extras)


# --- step output: what a tool printed (class `out`, written by tool actors) -------------


class StepOutput(Struct, omit_defaults=True, tag="step.output", tag_field="type", kw_only=True):
    """What one attempt of a step (or one loop iteration's attempt) printed: python
    stdout and stderr interleaved as written, or a shell command's stdout then stderr.

    Written by the tool actor beside the answer, on a subject of its own
    (`exec.<p>.<id>.out.<command>`, or `loop.<p>.<id>.<loop>.out.<command>.<index>` for
    an iteration), never an input: no engine or counter reads it, so it cannot change a
    decision, and an iteration's output stays in the loop's stream. `head` and `tail`
    keep the start and the end of the text (`tail` empty when `head` is all of it);
    `output_ref` names the whole text in the object store when it is longer, up to the
    cap (`ACTORS_STEP_OUTPUT_MAX_BYTES`); `size` counts every byte printed."""

    execution_id: str
    step: str
    command_id: str
    attempt_number: int = 1
    iteration_index: int | None = None
    at: float = 0.0
    size: int = 0
    head: Annotated[str, SECRET] = ""
    tail: Annotated[str, SECRET] = ""
    output_ref: str | None = None
    stored: int = 0  # bytes of the text behind `output_ref` (the first `stored` of `size`)
    # the command's delivery that ran (JetStream's delivery count; 0: not known, an older
    # writer): a redelivered command run again writes its own, and readers show the last
    delivery: int = 0
    # `step.output.part` events this delivery published while it ran (0: none, the step
    # ended before the first was due): together, the first bytes of the text up to the cap
    parts: int = 0
    # bytes at the end of the kept text the parts do not hold (a part that could not be
    # stored): readers that showed the parts show those after them
    rest: int = 0


class StepOutputPart(Struct, omit_defaults=True, tag="step.output.part", tag_field="type", kw_only=True):
    """What a step printed while it runs: a slice of its text, published by the tool
    actor about every half second (or every `PART_MAX` bytes) once the step has run
    half a second, on the subject of its `step.output` (actors/tools/outputs.py). Parts
    `0..n-1` of one `delivery` are its text from the first byte, in order, up to the cap;
    the `step.output` written when the step ends says how many there were (`parts`).
    A redelivered command run again writes parts of its own delivery: readers show the
    last delivery's (actors/client/outputs.py)."""

    execution_id: str
    step: str
    command_id: str
    attempt_number: int = 1
    iteration_index: int | None = None
    delivery: int = 0
    part: int = 0  # its number in this delivery, from 0
    offset: int = 0  # bytes of the text before it
    at: float = 0.0
    text: Annotated[str, SECRET] = ""


step_output_decoder = msgspec.json.Decoder(StepOutput)
# what is stored on an `out` subject: the final output or a part of it
any_output_decoder = msgspec.json.Decoder(StepOutput | StepOutputPart)
