"""Every message on the wire, as typed msgspec Structs.

Shared by the engine, the tool actors, the projector and the CLI; it imports no
actor code, so a tool actor can use it without importing the engine.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct, field


class _Wire(Struct, omit_defaults=True):
    pass


class ErrorInfo(_Wire):
    type: str
    message: str
    retryable: bool = False
    status: int | None = None
    traceback: str | None = None


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
    payload: dict[str, Any] = field(default_factory=dict)
    execution_id: str | None = None
    parent: ParentRef | None = None


# --- inputs: what the engine folds (subject class `in`) ------------------------------


class StartRecord(_Wire, tag="execution.start", tag_field="type"):
    """The starter's resolution of a start message: the playbook source is copied in,
    so a replay never depends on the catalog as it is today."""

    execution_id: str
    playbook_path: str
    playbook_version: int | None = None
    playbook_source: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    parent: ParentRef | None = None
    error: ErrorInfo | None = None  # set when the start could not be resolved


class CallDone(_Wire, tag="call.done", tag_field="type"):
    execution_id: str
    command_id: str
    step: str
    attempt_number: int  # required: always on the wire, even for attempt 1
    result: Any = None
    started_at: float = 0.0
    ended_at: float = 0.0
    worker: str = ""


class CallError(_Wire, tag="call.error", tag_field="type"):
    execution_id: str
    command_id: str
    step: str
    error: ErrorInfo
    attempt_number: int
    started_at: float = 0.0
    ended_at: float = 0.0
    worker: str = ""


class CancelRequest(_Wire, tag="execution.cancel", tag_field="type"):
    execution_id: str
    reason: str = ""


class TimerFired(_Wire, tag="timer.fired", tag_field="type"):
    """Delivered by the server when a durable timer (a scheduled message) is due."""

    execution_id: str
    timer_id: str
    due: float = 0.0


Input = StartRecord | CallDone | CallError | CancelRequest | TimerFired
input_decoder = msgspec.json.Decoder(Input)


# --- commands: engine -> tool actors (stream CMD, subject cmd.<kind>) ------------------


class Command(_Wire, kw_only=True):
    execution_id: str
    command_id: str
    step: str
    kind: str
    reply_to: str  # where call.done / call.error go: exec.<p>.<id>.in.result.<command_id>
    tool: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    attempt_number: int
    timeout: float | None = None


command_decoder = msgspec.json.Decoder(Command)


# --- engine output: decision records (class `ev`) and lifecycle events (class `lc`) ---


class Event(_Wire):
    """One event of an execution's history. `at` is the log time of the input that
    caused it (so a replay reproduces it); `cause` that input's stream sequence."""

    type: str
    execution_id: str
    at: float
    cause: int
    step: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


class DecisionRecord(_Wire):
    cause: int
    events: list[Event] = field(default_factory=list)


decision_decoder = msgspec.json.Decoder(DecisionRecord)
event_decoder = msgspec.json.Decoder(Event)


# --- status projection (KV `status`) ---------------------------------------------------


class ExecutionStatus(_Wire):
    execution_id: str
    state: str  # PENDING | RUNNING | COMPLETED | FAILED | CANCELLED
    playbook: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    terminal_event: str | None = None


status_decoder = msgspec.json.Decoder(ExecutionStatus)


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


encode = msgspec.json.Encoder().encode
