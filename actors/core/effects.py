"""What the pure cores (the engine's decide, the counter's loop) ask their shells to
do (`Effects`: one type for both, turned into messages by actors/runtime/outbox.py), and the
small pure helpers both use to build it. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.playbook.templates import TemplateError
from actors.wire.events import Event
from actors.wire.messages import (
    CallDone,
    CallError,
    Command,
    ErrorInfo,
    IteratorCompleted,
    IteratorFailed,
    LoopCancel,
    LoopSpec,
    ParentRef,
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
class Effects:
    """What one decision (the engine's, for one input) or one batch of decisions (the
    counter's) asks for. The shell publishes it in this order (actors/runtime/outbox.py):
    commands, child starts, loops handed over, timers, the parent's result, cancels,
    the verdict, then the decision record and lifecycle events, so a record in the log
    proves that what it decided was sent."""

    cause: int = 0  # the input's stream sequence (engine): names the decision record
    at: float = 0.0  # the input's log time
    events: list[Event] = field(default_factory=list)  # the decision record (engine)
    lifecycle: list[Event] = field(default_factory=list)  # execution status (engine)
    commands: list[Command] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)
    cancels: list[CommandCancel] = field(default_factory=list)
    starts: list[StartMessage] = field(default_factory=list)  # child executions to start
    loops: list[LoopSpec] = field(default_factory=list)  # loops handed to the counter (engine)
    loop_cancels: list[LoopCancel] = field(default_factory=list)
    child_cancels: list[str] = field(default_factory=list)  # child executions to cancel
    # the parent's result subject and the message for it, when a child execution ends
    reply: tuple[str, CallDone | CallError] | None = None
    verdict: IteratorCompleted | IteratorFailed | None = None  # a loop's end (counter)

    def __bool__(self) -> bool:
        return bool(
            self.events
            or self.lifecycle
            or self.commands
            or self.timers
            or self.cancels
            or self.starts
            or self.child_cancels
            or self.reply
            or self.loops
            or self.loop_cancels
            or self.verdict
        )


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
