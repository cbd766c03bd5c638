"""Every message on the wire, as typed msgspec Structs.

Shared by the engine, the tool actors, the projector and the CLI; it imports no
actor code, so a tool actor can use it without importing the engine.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Struct, field

# events (classes `ev` and `lc`) and execution states are typed in actors/wire/events.py
from actors.wire.events import ExecState
from actors.wire.secrecy import SECRET, SECRET_ERROR


class _Wire(Struct, omit_defaults=True):
    pass


class ErrorInfo(_Wire):
    type: Annotated[str, SECRET]  # a python step's is its exception's class name: any text (actors/wire/secrecy.py)
    message: Annotated[str, SECRET]
    retryable: bool = False
    status: int | None = None
    traceback: Annotated[str | None, SECRET] = None


class CodeAt(_Wire):
    """Where a python step's code starts in its playbook: `file` (the name it was
    registered from) and the 1-based `line` of the code's first line. The worker
    compiles the code under that name, shifted to that line, so a traceback reads
    `File "flow.yaml", line 42`."""

    file: str
    line: int


class ParentRef(_Wire, forbid_unknown_fields=True):
    """Who started an execution. With `reply_to`, the child's end is reported there as
    the result of the parent's command `command_id` (sub-playbooks)."""

    execution_id: str
    step: str | None = None
    command_id: str | None = None
    reply_to: str | None = None


# --- what users publish to `start` ---------------------------------------------------


class StartMessage(_Wire, forbid_unknown_fields=True):
    playbook: str
    version: int | None = None
    payload: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    execution_id: str | None = None
    parent: ParentRef | None = None
    payload_ref: str | None = None  # a payload too large for the message: a blob (actors/store/blobs.py)
    retry_of: RetryOf | None = None  # a retry of a terminal execution (Client.retry)


class RetryOf(_Wire, forbid_unknown_fields=True):
    """What a retry of a terminal execution starts from, resolved from the old log by
    `Client.retry` and copied into the new execution's start record, so the new
    execution's fold never reads the old log. `results`: the old execution's last result
    of every step that completed there, `from_step`'s aside; `from_step` is entered
    first instead of the playbook's entry."""

    execution_id: str
    from_step: str
    results: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    # a redrive of failed loop items (`Client.redrive`): by loop step, the iterations to
    # run again and the old results of the others, which the loop keeps
    redrive: dict[str, Redrive] = field(default_factory=dict)


class Redrive(_Wire, forbid_unknown_fields=True):
    """One loop step of a redrive: its loop runs only the iterations `indices` of a
    collection of `total` elements (the old loop's failed ones); every other iteration
    keeps its result from `results` (the old loop's list, one entry per element)."""

    indices: list[int]
    total: int
    results: Annotated[list[Any], SECRET] = field(default_factory=list)


# StartReply error types that sending the start again, or through stream START, cannot
# cure: the message as sent cannot be read (a bad field or JSON; a payload sealed with a
# key the starters lack). Any other error is the starter's own (`retryable` or not).
INVALID_START = "InvalidStart"  # a bad field or JSON: the start cannot be used as sent
UNREADABLE_START = (INVALID_START, "PayloadUnreadable")


class RequestError(Struct):  # every field written out: a user's code reads it
    """Why a request (a start request, a result request, a register request) was not done.
    `type` is one of the names its reply documents and stays in clear under a payload key,
    so a client without the key can tell them apart; `message` may quote a user's values
    (a playbook's text, a payload) and is sealed like one. `retryable`: send it again."""

    type: str
    message: Annotated[str, SECRET]
    retryable: bool = False

    @classmethod
    def of(cls, error: ErrorInfo) -> RequestError:
        return cls(type=error.type, message=error.message, retryable=error.retryable)


class StartReply(Struct):  # every field written out: a user's code reads it
    """A starter's answer to a start message sent as a request on `start.request`.
    `started`: the execution's start record is written (by this request, or before it
    when `existing`). Otherwise `error` says why the start was refused (`InvalidStart`:
    bad JSON, field or execution id; `PlaybookNotFound`: unknown playbook or version;
    `PlaybookPathInvalid`: not a catalog path, or its key holds another path's playbook;
    `CatalogRecordInvalid`: a catalog record that cannot be read, named by its key;
    `ValueTooLarge`; `retryable` when the starter could not reach NATS: send it again,
    same id). `execution_id` is None only when the message named no usable one."""

    execution_id: str | None
    started: bool
    existing: bool = False
    error: RequestError | None = None


class ResultRequest(_Wire, forbid_unknown_fields=True):
    """Asks for an execution's status and result, on `result.request` (core NATS, answered
    by the engine pods in a queue group): what `actors-cli result` reads, for any NATS
    client. Header `Actors-Result-Wait: SECONDS` waits up to that long (at most 60) for the
    execution to end before answering; without it the answer is immediate."""

    execution_id: str


class ResultReply(Struct):  # every field written out: a user's code reads it
    """The answer to a `ResultRequest`. `status`: the execution's status as the `status`
    bucket holds it (None when no execution has that id yet). `result`: a COMPLETED
    execution's result (None otherwise). `result_ref`: set instead of `result` when the
    result is too large for a reply: the object's name in object store bucket `blobs`.
    `error`: why the request could not be answered (`InvalidRequest`: bad JSON or field;
    `ExecutionNotFound`: no such id; `ResultUnreadable`: its record cannot be read;
    `retryable` when NATS could not be reached: ask again); None when it was."""

    execution_id: str | None
    status: ExecutionStatus | None = None
    result: Annotated[Any, SECRET] = None
    result_ref: str | None = None
    error: RequestError | None = None


class CancelAsk(_Wire, forbid_unknown_fields=True):
    """Asks an execution to stop, on `execution.cancel` (core NATS, answered by the engine
    pods in a queue group): what `actors-cli cancel` does, for a client that does not know
    the deployment's partition count (the cancel input's subject names its partition)."""

    execution_id: str
    reason: str = ""


class CancelReply(Struct):  # every field written out: a user's code reads it
    """The answer to a `CancelAsk`. `cancelled`: the cancel is in the execution's log, so it
    ends CANCELLED (its running commands stopped) unless it ends otherwise first; false for
    an execution that had ended (`status` says how). `error`: `InvalidRequest`;
    `ExecutionNotFound` (no execution has that id: nothing is written); `retryable` when
    NATS could not be reached."""

    execution_id: str | None
    cancelled: bool
    status: ExecutionStatus | None = None
    error: RequestError | None = None


class SignalAsk(_Wire, forbid_unknown_fields=True):
    """Sends a signal to an execution, on `execution.signal` (core NATS, answered by the
    engine pods in a queue group): what `actors-cli signal` and `Client.signal` do. A step
    waiting for `name` (and `key`, when it waits on one) takes it, with `data` as its
    result; one that comes before the step waits is kept for it (docs/language.md,
    Signals). `signal_id`: sending twice under the same id is one signal (the requester's
    to choose; the Python client makes one up when none is given)."""

    execution_id: str
    name: str
    data: Annotated[Any, SECRET] = None  # sealed like a start's payload when the deployment has a key
    key: str = ""
    signal_id: str | None = None
    # who sends it (shown in `describe` and the step's result of an approval): one line,
    # control characters made spaces, at most 200 characters (a longer one is refused)
    by: str = ""


class SignalReply(Struct):  # every field written out: a user's code reads it
    """The answer to a `SignalAsk`. `accepted`: the signal is in the execution's log (a
    step waiting for it takes it; else it is kept, see docs/language.md). False for an
    execution that has ended (`status` says how): nothing is written. `duplicate`: a
    signal of this `signal_id` was in the log already (sent before, by this requester or
    another: two answers to one approval wait share its id), so this one was not written:
    the first one stands. `error`: `InvalidRequest`; `ExecutionNotFound`; `retryable`
    when NATS could not be reached, or whether the execution exists cannot be told yet."""

    execution_id: str | None
    signal_id: str | None
    accepted: bool
    status: ExecutionStatus | None = None
    error: RequestError | None = None
    duplicate: bool = False


class RegisterRequest(_Wire, forbid_unknown_fields=True):
    """Registers a playbook in the catalog, on `catalog.register` (core NATS, answered by
    the engine pods in a queue group): what `actors-cli register` does, for any NATS
    client. `source`: the playbook's YAML text; `file`: the name its errors give it."""

    source: str
    file: str = "<request>"


class RegisterReply(Struct):  # every field written out: a user's code reads it
    """The answer to a `RegisterRequest`: the catalog `path` and `version` to start (the
    same source registered again gets its existing version), or `error` (`InvalidRequest`;
    `PlaybookInvalid` with every problem of the file, one per line; `PlaybookPathInvalid`;
    `VersionConflict`: its `metadata.version` is registered with other content;
    `retryable` when NATS could not be reached)."""

    path: str | None
    version: int | None
    registered: bool
    error: RequestError | None = None


class ScheduleSpec(_Wire, forbid_unknown_fields=True):
    """A schedule as `actors-cli schedule add` wrote it (KV `schedules`, key = name):
    what each fire starts, and when. `cron` is the server's pattern (6 fields, seconds
    first, or `@hourly`-style); `paused`: its definition is removed until resumed."""

    name: str
    playbook: str
    cron: str
    timezone: str | None = None
    version: int | None = None
    payload: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    paused: bool = False
    created: float = 0.0


# --- inputs: what the engine folds (subject class `in`) ------------------------------


class Limits(Struct):  # every field written out: a default changed later must not change a replay
    """Bounds that feed decisions, fixed for an execution when it starts: the starter
    copies its pod's settings (actors/config/settings.py) into the start record, so every pod
    replays one log the same way whatever its own settings. A record written before a
    field existed decodes with that field's default."""

    # templates (actors/playbook/templates.py): operations one render may take, counted
    # deterministically (loop iterations, calls, characters built), and the characters
    # it may produce
    template_ops: int = 10_000_000  # about 1 s of CPU for plain loops (bench/template_budget.py)
    template_output: int = 1_000_000
    # steps (activations) one execution may enter: bounds a cycle of any steps
    max_activations: int = 10_000
    # attempts of one step, retry rules and on_error retries together
    max_attempts: int = 1_000


class StartRecord(_Wire, tag="execution.start", tag_field="type"):
    """The starter's resolution of a start message: the playbook source is copied in,
    so a replay never depends on the catalog as it is today."""

    execution_id: str
    playbook_path: str
    playbook_version: int | None = None
    playbook_source: str | None = None
    payload: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    parent: ParentRef | None = None
    error: ErrorInfo | None = None  # set when the start could not be resolved
    limits: Limits = field(default_factory=Limits)
    payload_ref: str | None = None  # the payload as a blob; the engine reads it back before folding
    retry_of: RetryOf | None = None  # set when this execution retries another (its results, its first step)
    # the engine semantics it started under (actors/core/replay.py SEMANTICS): the fold
    # keeps it on them; a record written before the field existed is version 1
    semantics: int = 1
    # the name of the file the playbook was registered from (`CatalogEntry.file`): its
    # python steps' commands then say where their code starts (`Command.code_at`), so
    # tracebacks name the file's lines. None (a record from before, or a playbook
    # registered without a file name): commands carry no `code_at`, as they did.
    playbook_file: str | None = None
    # the W3C trace context the start came with (its message's `traceparent` and
    # `tracestate` headers, docs/tracing.md): the parent of the execution's span, kept in
    # the log so every engine pod and every replay hangs the spans under the same one
    traceparent: str | None = None
    tracestate: str | None = None


class CallDone(_Wire, tag="call.done", tag_field="type"):
    execution_id: str
    command_id: str
    step: str
    attempt_number: int  # required: always on the wire, even for attempt 1
    result: Annotated[Any, SECRET] = None
    started_at: float = 0.0
    ended_at: float = 0.0
    worker: str = ""
    iteration_index: int | None = None  # set for one iteration of a loop
    result_ref: str | None = None  # a result too large for a message: a blob, read back before folding

    def failed(self, error: ErrorInfo) -> CallError:
        """The same command's answer as an error instead (its result could not be used)."""
        return CallError(
            execution_id=self.execution_id,
            command_id=self.command_id,
            step=self.step,
            error=error,
            attempt_number=self.attempt_number,
            started_at=self.started_at,
            ended_at=self.ended_at,
            worker=self.worker,
            iteration_index=self.iteration_index,
        )


class CallError(_Wire, tag="call.error", tag_field="type"):
    execution_id: str
    command_id: str
    step: str
    error: ErrorInfo
    attempt_number: int
    started_at: float = 0.0
    ended_at: float = 0.0
    worker: str = ""
    iteration_index: int | None = None


class _Names(Struct):
    """What a stored answer says it is and what it answers; its other fields are not
    read (and nothing here is sealed: the codec seals values, never ids)."""

    type: str = ""
    command_id: str = ""
    loop_id: str = ""


_names_decoder = msgspec.json.Decoder(_Names)
_NULL_RAW = msgspec.Raw(b"null")


class _HeldAnswer(Struct):
    answer: msgspec.Raw = _NULL_RAW
    cause: int | None = None


class _RecordAnswer(Struct):
    answer: msgspec.Raw = _NULL_RAW
    cause: int | None = None
    decision: _HeldAnswer | None = None  # `in.answer.lc.<type>`: a lifecycle carrier holding the record


_record_answer_decoder = msgspec.json.Decoder(_RecordAnswer)


def _named(data: bytes, types: tuple[str, ...]) -> _Names | None:
    """`data` read as an answer of one of `types`; None for anything else."""
    try:
        found = _names_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    return found if found.type in types else None


def command_of_answer(data: bytes) -> str | None:
    """The command a stored result (`call.done`, `call.error`) answers: how a reader
    tells the results on an execution's shared subject (`in.result`, semantics 4)
    apart. None: not a result this can read."""
    found = _named(data, ("call.done", "call.error"))
    return found.command_id or None if found is not None else None


def command_of_record_answer(data: bytes) -> str | None:
    """The command whose result a stored answer record holds (semantics 5,
    `exec.<p>.<id>.in.answer...`: a decision record with the result in `answer`, or a
    lifecycle event carrying such a record in `decision`, `in.answer.lc.<type>`).
    None: not such a record, or its answer is not a result this can read."""
    try:
        found = _record_answer_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    raw = found.decision.answer if found.decision is not None else found.answer
    return command_of_answer(bytes(raw)) if raw != _NULL_RAW else None


def start_of_record_answer(data: bytes) -> bytes | None:
    """The start record a stored answer record holds, as its starter sent it (values as
    sealed), when the record is an execution's start stored with its first decision
    (semantics 6: its cause is 0, minus the input before it, none: the log's first
    input); None for any other record, or for a message that is none."""
    try:
        found = _record_answer_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    held = found.decision if found.decision is not None else found
    return bytes(held.answer) if held.cause == 0 and held.answer != _NULL_RAW else None


def loop_of_verdict(data: bytes) -> str | None:
    """The loop a stored verdict (`iterator.completed`, `iterator.failed`) ends: how a
    reader tells the verdicts on an execution's shared subject (`in.iterator`,
    semantics 4) apart. None: not a verdict this can read."""
    found = _named(data, ("iterator.completed", "iterator.failed"))
    return found.loop_id or None if found is not None else None


class IterationOutcome(_Wire):
    """One iteration of a chunk: its result, or its error."""

    iteration_index: int
    result: Annotated[Any, SECRET] = None
    error: ErrorInfo | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    result_ref: str | None = None  # a result that did not fit in the chunk's message: a blob


class ChunkDone(_Wire, tag="chunk.done", tag_field="type"):
    """The answer to a chunk command (loop mode `chunked`): one outcome per iteration."""

    execution_id: str
    command_id: str
    step: str
    attempt_number: int
    outcomes: list[IterationOutcome] = field(default_factory=list)
    worker: str = ""


class IterationResult(_Wire):
    """One iteration's answer inside a `ResultBatch`: what a `call.done` or
    `call.error` for its command would carry."""

    command_id: str
    attempt_number: int
    iteration_index: int | None = None
    result: Annotated[Any, SECRET] = None
    error: ErrorInfo | None = None
    started_at: float = 0.0
    ended_at: float = 0.0


class ResultBatch(_Wire, tag="result.batch", tag_field="type"):
    """Answers to several iteration commands of one loop, in one message: a tool actor
    gathers the results that end close together (loop results only; see
    actors/tools/batching.py). Each entry counts as the `call.done`/`call.error` of its
    command; an entry whose command is not in flight changes nothing."""

    execution_id: str
    loop_id: str
    step: str
    results: list[IterationResult] = field(default_factory=list)
    worker: str = ""


class ResultBatchOut(_Wire, tag="result.batch", tag_field="type"):
    """`ResultBatch` as a tool actor writes it: each entry already encoded (it was
    encoded once to measure it)."""

    execution_id: str
    loop_id: str
    step: str
    results: list[msgspec.Raw] = field(default_factory=list)
    worker: str = ""


class CancelRequest(_Wire, tag="execution.cancel", tag_field="type"):
    execution_id: str
    reason: str = ""


class SignalSent(_Wire, tag="signal.sent", tag_field="type"):
    """A signal, in an execution's inputs (`exec.<p>.<id>.in.signal`) or handed by the
    engine to a waiting loop's (`loop.<p>.<id>.<loop>.in.signal`). Its `signal_id` makes
    it one signal however often it is sent (Nats-Msg-Id `signal_msg_id`, and the folds
    keep the ids they took). `sent_at` and `by` are what the sender says, shown to
    users; the fold's times come from the log."""

    execution_id: str
    signal_id: str
    name: str
    key: str = ""
    data: Annotated[Any, SECRET] = None
    sent_at: float = 0.0
    by: str = ""  # who sent it: a user, `ui`, `hook:<name>`, ... (free text, at most 200 characters)


class RetriedBy(_Wire, tag="execution.retried_by", tag_field="type"):
    """Written by the starter into a retried execution's inputs when it starts its
    retry: the old log then says which execution retries it (event `execution.retried`)."""

    execution_id: str
    retry_execution_id: str
    from_step: str


class TimerFired(_Wire, tag="timer.fired", tag_field="type"):
    """Delivered by the server when a durable timer (a scheduled message) is due."""

    execution_id: str
    timer_id: str
    due: float = 0.0


class _IteratorEnd(_Wire):
    """The counter's verdict on a loop, appended to the execution's inputs. `results`
    (collection order, null where an iteration failed) is inline when it fits in a
    message, else stored as a blob named by `results_ref`."""

    execution_id: str
    loop_id: str
    step: str
    total: int
    succeeded: int
    failed: int
    not_run: int = 0
    results: Annotated[list[Any] | None, SECRET] = None
    results_ref: str | None = None
    errors: Annotated[list[dict[str, Any]], SECRET] = field(default_factory=list)  # the first failures: index, error


class IteratorCompleted(_IteratorEnd, tag="iterator.completed", tag_field="type"):
    pass


class IteratorFailed(_IteratorEnd, tag="iterator.failed", tag_field="type"):
    tolerated: int = 0


class EngineFault(_Wire, tag="engine.fault", tag_field="type"):
    """The engine gave up on one of an execution's inputs: handling it failed the same
    way several times in a row (a bug, or an input the fold cannot take; see
    actors/runtime/hosting.py). Folding this ends the execution FAILED with `error`
    (`EngineError`), and a replay skips the input it names, so the execution is not
    stuck on it for ever."""

    execution_id: str
    input_seq: int  # the stream sequence of the input given up on
    input_subject: str
    error: ErrorInfo


Input = (
    StartRecord
    | CallDone
    | CallError
    | CancelRequest
    | TimerFired
    | IteratorCompleted
    | IteratorFailed
    | EngineFault
    | RetriedBy
    | SignalSent
)
input_decoder = msgspec.json.Decoder(Input)


# --- loops: engine -> counter (stream LOOP, loop.<p>.<id>.<loop>.in.*) ------------------


class LoopSpec(_Wire, tag="loop.spec", tag_field="type", kw_only=True):
    """What a counter needs to run a loop on its own: the playbook (to read the step),
    the collection (inline, or a blob when large), the names templates read, and where
    the verdict goes."""

    execution_id: str
    loop_id: str
    step: str
    playbook_path: str
    playbook_source: str
    collection: Annotated[list[Any] | None, SECRET] = None
    collection_ref: str | None = None
    scope: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    scope_ref: str | None = None  # the scope as a blob, when the spec would not fit in a message
    # exec.<p>.<id>.in.iterator.<loop_id>, where a counter older than semantics 4 sends
    # the loop's verdict; `answer_on` (semantics 4 on) is the execution's one subject for
    # every loop's verdict, the loop named in it, where a counter of this version sends it
    reply_to: str
    parent_event_id: str | None = None
    limits: Limits = field(default_factory=Limits)  # the execution's, from its start record
    code_at: CodeAt | None = None  # a python loop step's: where its code starts (each command carries it)
    # a redrive: only these iterations run (in this order); the others count as
    # succeeded, their results kept by the engine (RetryOf.redrive). None: every one
    only: list[int] | None = None
    answer_on: str | None = None  # see `reply_to`
    # (a loop of `tool: wait` steps gets the signals the execution kept for it as inputs
    # of its log right after this spec, one message each, as it gets later ones: not
    # here, where a few large ones would make the spec exceed the max message size)


class FailedItem(_Wire, tag="loop.item.failed", tag_field="type", kw_only=True):
    """One loop iteration that failed for good (its retry rules exhausted), written by
    the counter beside the loop's log on a subject of its own (`...fail.<index>`,
    streams/subjects.py), so failures are listed and paged without reading the log:
    no message for an iteration that succeeded. `element` is the iteration's element
    when its JSON is short, else `element_head` holds the head of that JSON."""

    execution_id: str
    loop_id: str
    step: str
    index: int
    attempts: int
    error: ErrorInfo
    element: Annotated[Any, SECRET] = None
    element_head: Annotated[str | None, SECRET] = None
    at: float = 0.0  # the log time of the input that counted it


class LoopCancel(_Wire, tag="loop.cancel", tag_field="type"):
    execution_id: str
    loop_id: str
    reason: str = ""


LoopInput = LoopSpec | CallDone | CallError | ChunkDone | ResultBatch | TimerFired | LoopCancel | SignalSent
loop_input_decoder = msgspec.json.Decoder(LoopInput)


class LoopProgress(_Wire):
    """Published (core NATS, not stored) by the counter while a loop runs, for
    `actors-cli run` to draw a progress bar. Never read by any decision."""

    execution_id: str
    loop_id: str
    step: str
    total: int
    done: int
    failed: int
    in_flight: int
    at: float
    waiting: int = 0  # iterations waiting for a signal or a time (a loop of `tool: wait`): not done


# --- commands: engine -> tool actors (stream CMD, subject cmd.<kind>) ------------------


class SinkCall(_Wire, kw_only=True):
    """A second tool run after the command's tool succeeds, in the same command: its
    templates are rendered by the tool actor with `result` in scope, because the result
    exists only there. `scope` holds just the names those templates read."""

    tool: Annotated[dict[str, Any], SECRET]
    args: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    scope: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    element: str | None = None  # the loop element's name, bound per iteration
    limits: Limits | None = None  # the execution's template bounds (from its start record)


class ChunkItem(_Wire):
    iteration_index: int
    args: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    element: Annotated[Any, SECRET] = None


class Command(_Wire, kw_only=True):
    execution_id: str
    command_id: str
    step: str
    kind: str
    # where call.done / call.error go: exec.<p>.<id>.in.result.<command_id>, a subject of
    # the command's own, unless `answer_on` says otherwise (`answer_subject`)
    reply_to: str
    tool: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    args: Annotated[dict[str, Any], SECRET] = field(default_factory=dict)
    attempt_number: int
    timeout: float | None = None
    sink: SinkCall | None = None
    # loops: one iteration (iteration_index, element), or a chunk of them (`chunk`,
    # answered by one chunk.done); the tool runs once per item with the item's args
    iteration_index: int | None = None
    element: Annotated[Any, SECRET] = None
    chunk: list[ChunkItem] | None = None
    # a command too large for a message is sent as a stub naming a blob that holds all
    # of it (args, element, chunk, sink); the tool actor reads it back
    body_ref: str | None = None
    code_at: CodeAt | None = None  # a python step's: where its code starts in the playbook
    # semantics 4 on: the execution's one results subject (`exec.<p>.<id>.in.result`),
    # where a tool of this version answers instead of `reply_to`; a tool pod older than
    # that does not know the field and answers on `reply_to`, which the engine reads too
    answer_on: str | None = None
    # semantics 5 on, a step's (never a loop iteration's): where the tool first asks the
    # partition's engine pod to store its result with the decision it leads to, as one
    # message (`answer.<p>`, core NATS); anything but `stored` and it publishes the result
    # as before. A tool pod that does not know the field just publishes it
    ask_on: str | None = None


command_decoder = msgspec.json.Decoder(Command)


def answer_subject(cmd: Command) -> str:
    """Where a tool answers `cmd` (its result, or that it could not be run)."""
    return cmd.answer_on or cmd.reply_to


# --- status projection (KV `status`) ---------------------------------------------------


class WaitInfo(_Wire):
    """What a running execution waits for (a `tool: wait` step), in its status: the
    projector copies it from lifecycle event `execution.waiting`. `signal` None: a timer
    to a date (`until`). `deadline`: when the wait fails with `WaitTimeout` (or, with no
    signal, ends), epoch seconds. `loop`: a loop of waits (each iteration its own key)."""

    step: str
    activation: int
    since: float
    signal: str | None = None
    key: str = ""
    deadline: float | None = None
    approval: bool = False
    loop: bool = False


class ExecutionStatus(_Wire):
    execution_id: str
    state: ExecState
    playbook: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    terminal_event: str | None = None
    # a failed execution's error, copied from `playbook.failed`: its root cause (type,
    # message, step) and every failed step (decide.execution_error); a cancelled one's
    # `{"type": "Cancelled", "message": <the cancel's reason>}`
    error: Annotated[dict[str, Any] | None, SECRET_ERROR] = None
    version: int | None = None  # the catalog version it runs (from `playbook.initialized`)
    # a RUNNING execution's waits, from its latest `execution.waiting` (empty or None: none)
    waiting: list[WaitInfo] | None = None
    # the decision (its input's stream sequence, the event's `cause`) whose
    # `execution.waiting` set `waiting`: an older one applied late (a redelivery, another
    # projector replica) is dropped, so a stale set of waits never shows after a newer one
    waiting_cause: int | None = None


status_decoder = msgspec.json.Decoder(ExecutionStatus)


class IndexEntry(_Wire):
    """An execution's entry in stream INDEX (`index.<execution_id>`): written once by the
    projector when it first records the execution's status, so reading the stream
    backwards gives the newest executions first without reading the status bucket."""

    execution_id: str
    playbook: str | None = None
    version: int | None = None
    started_at: float | None = None


index_decoder = msgspec.json.Decoder(IndexEntry)


# --- dead letters ----------------------------------------------------------------------


class DeadLetter(_Wire):
    source: str  # which actor gave up
    reason: str
    subject: str
    data: str  # the original payload, as text (replacement chars for bad bytes)
    execution_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class CatalogEntry(_Wire):
    path: str
    version: int
    source: str
    registered_at: float
    file: str | None = None  # the name of the file it was registered from (tracebacks name it)


encode = msgspec.json.Encoder().encode
