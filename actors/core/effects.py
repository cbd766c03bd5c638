"""What the pure cores (the engine's decide, the counter's loop) ask their shells to
do (`Effects`: one type for both, turned into messages by actors/runtime/outbox.py), and the
small pure helpers both use to build it. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from actors.playbook.templates import TemplateError
from actors.wire.events import Event
from actors.wire.messages import (
    CallDone,
    CallError,
    Command,
    ErrorInfo,
    FailedItem,
    IteratorCompleted,
    IteratorFailed,
    LoopCancel,
    LoopSpec,
    ParentRef,
    SignalSent,
    StartMessage,
    TimerFired,
)
from streams.ids import child_execution_id


@dataclass(slots=True)
class Timer:
    """A durable timer to arm: when `due` (epoch seconds) comes, `fire` is delivered to
    the log it belongs to as an input."""

    timer_id: str
    due: float
    fire: TimerFired


@dataclass(slots=True)
class CommandCancel:
    """Stop a command: drop it from the work queue if still queued, tell the tool actor
    running it to stop."""

    kind: str
    command_id: str


@dataclass(slots=True)
class SignalForward:
    """A signal handed to a running loop of waits (`tool: wait` in a loop): to the
    loop's log, where the counter matches it to an iteration."""

    loop_id: str
    signal: SignalSent


NAMES_DECISION = {"names_decision": True}  # field metadata: which decision, not something asked for


@dataclass(slots=True)
class Effects:
    """What one decision (the engine's, for one input) or one batch of decisions (the
    counter's) asks for. The shell publishes it in this order (actors/runtime/outbox.py):
    commands, child starts, loops handed over, signals forwarded to loops, timers, the parent's result, cancels,
    the verdict, then the decision record and lifecycle events, so a record in the log
    proves that what it decided was sent.

    Emptiness, `merge`, `copy` and `clear` follow from the fields (`_kinds` below):
    a list field is extended, a field defaulting to None holds one thing (the later
    one wins), a field marked NAMES_DECISION says which decision it is. A new field
    is one edit here; a field of any other kind fails at import."""

    # the input's stream sequence (engine): names the decision record
    cause: int = field(default=0, metadata=NAMES_DECISION)
    at: float = field(default=0.0, metadata=NAMES_DECISION)  # the input's log time
    events: list[Event] = field(default_factory=list)  # the decision record (engine)
    lifecycle: list[Event] = field(default_factory=list)  # execution status (engine)
    commands: list[Command] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)
    cancels: list[CommandCancel] = field(default_factory=list)
    starts: list[StartMessage] = field(default_factory=list)  # child executions to start
    loops: list[LoopSpec] = field(default_factory=list)  # loops handed to the counter (engine)
    loop_cancels: list[LoopCancel] = field(default_factory=list)
    signal_forwards: list[SignalForward] = field(default_factory=list)  # to loops of waits (engine)
    child_cancels: list[str] = field(default_factory=list)  # child executions to cancel
    # the parent's result subject and the message for it, when a child execution ends
    reply: tuple[str, CallDone | CallError] | None = None
    verdict: IteratorCompleted | IteratorFailed | None = None  # a loop's end (counter)
    # iterations that failed for good, each recorded on a subject of its own (counter)
    failures: list[FailedItem] = field(default_factory=list)

    def __bool__(self) -> bool:
        """Asks for anything (what names the decision is not an ask)."""
        return any(getattr(self, name) for name in _LISTS + _SINGLE)

    def merge(self, other: Effects) -> None:
        """Add `other`'s asks after these (one input's effects into a batch's): lists
        extend, a single ask (the reply, the verdict) is `other`'s when it has one, and
        an empty `self` takes `other`'s cause and time."""
        if not self:
            for name in _NAMING:
                setattr(self, name, getattr(other, name))
        for name in _LISTS:
            getattr(self, name).extend(getattr(other, name))
        for name in _SINGLE:
            value = getattr(other, name)
            if value is not None:
                setattr(self, name, value)

    def copy(self, **changes: Any) -> Effects:
        """A copy with lists of its own (extending one leaves `self` as it was), and
        `changes` (field name: value) in place of what `self` has."""
        copied: dict[str, Any] = {n: list(getattr(self, n)) if n in _LISTS else getattr(self, n) for n in _ALL}
        unknown = set(changes) - set(_ALL)
        if unknown:
            raise TypeError(f"Effects has no field {sorted(unknown)}")
        return Effects(**(copied | changes))

    def clear(self) -> None:
        """Every field back to its default (a batch whose decisions are dropped)."""
        empty = Effects()
        for name in _ALL:
            setattr(self, name, getattr(empty, name))


def _kinds() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Effects' fields by how they combine: (naming the decision, lists, single asks)."""
    naming: list[str] = []
    lists: list[str] = []
    single: list[str] = []
    for f in fields(Effects):
        if f.metadata.get("names_decision"):
            naming.append(f.name)
        elif f.default_factory is list:
            lists.append(f.name)
        elif f.default is None:
            single.append(f.name)
        else:  # say how it combines (one of the three) before it can be dropped by a merge
            raise TypeError(f"Effects.{f.name}: a list, a value defaulting to None, or NAMES_DECISION")
    return tuple(naming), tuple(lists), tuple(single)


_NAMING, _LISTS, _SINGLE = _kinds()
_ALL = _NAMING + _LISTS + _SINGLE


def child_start(
    tool: dict[str, Any], payload: dict[str, Any], *, execution_id: str, step: str, command_id: str, reply_to: str
) -> StartMessage:
    """The start of the child execution a `tool: playbook` command stands for (a step's
    attempt, or a loop's iteration): its id follows from the command's, so a replay
    starts the same child, and its end comes back to `reply_to` as the command's result."""
    version = tool.get("version")
    return StartMessage(
        playbook=str(tool.get("path")),
        version=int(version) if version not in (None, "") else None,
        payload=payload,
        execution_id=child_execution_id(execution_id, command_id),
        parent=ParentRef(execution_id=execution_id, step=step, command_id=command_id, reply_to=reply_to),
    )


def loop_failed(
    execution_id: str, loop_id: str, step: str, error: ErrorInfo, *, total: int = 0, succeeded: int = 0, failed: int = 1
) -> IteratorFailed:
    """A loop's verdict when the loop as a whole failed (its spec unusable, its counter
    gave up, its results gone): one error, at iteration index -1."""
    return IteratorFailed(
        execution_id=execution_id,
        loop_id=loop_id,
        step=step,
        total=total,
        succeeded=succeeded,
        failed=failed,
        errors=[iteration_error(-1, error)],
    )


def iteration_error(index: int, error: ErrorInfo) -> dict[str, Any]:
    """One entry of a loop verdict's `errors`: the iteration, and its error as templates see it."""
    return {"index": index, "error": error_view(error)}


def error_view(e: ErrorInfo) -> dict[str, Any]:
    """The error as templates and events see it: every field present, so a rule can
    read `error.status` or `error.retryable` whatever the error was."""
    return {
        "type": e.type,
        "message": e.message,
        "retryable": e.retryable,
        "status": e.status,
        "traceback": e.traceback,
    }


def template_error(step: str, e: TemplateError, *, field: str = "") -> ErrorInfo:
    """A template that could not render fails its step: the message names step and field
    (`e` already names the field inside the step, e.g. `args.x` or `retry[0].when`)."""
    where = f"{field}: " if field else ""
    return ErrorInfo(type=e.kind, message=f"step '{step}' field {where}{e}")
