"""How an execution ends: `end`'s verdict on the workflow (`finish`), the error a failed
execution carries (`execution_error`), and the reply a child execution sends its parent
(`reply_to_parent`)."""

from __future__ import annotations

from typing import Any

from actors.core.decision import Decision
from actors.core.effects import error_view
from actors.core.state import Activation
from actors.playbook.model import END
from actors.wire.events import (
    ActivationStatus,
    ArrivalStatus,
    ExecState,
    PlaybookCompletedData,
    PlaybookFailedData,
    StepExitData,
    WorkflowCompletedData,
    WorkflowFailedData,
)
from actors.wire.messages import CallDone, CallError, ErrorInfo
from streams.ids import attempt_of


def finish(decision: Decision, act: Activation, *, result: Any, end_error: ErrorInfo | None) -> None:
    ex = decision.ex
    ex.live.pop(act.id, None)
    act.status = ActivationStatus.FAILED if end_error else ActivationStatus.COMPLETED
    if end_error is None:
        ex.results[END] = result
    exited = StepExitData(activation=act.id, status=act.status)
    if end_error:
        exited.error = error_view(end_error)
    decision.event(END, exited)
    failed = list(ex.failed_steps) + ([END] if end_error else [])
    # what end's evaluation says about the whole run, on workflow.* and playbook.* alike
    summary: dict[str, Any] = {
        "evaluated_by_end_step": True,
        "total_steps": len({a.step for a in ex.activations.values()}),
        "failed_steps_count": len(failed),
        "handled_failures": [a.step for a in ex.arrivals if a.status == ArrivalStatus.HANDLED],
        "cancelled_steps": [a.step for a in ex.arrivals if a.status == ArrivalStatus.CANCELLED],
    }
    if failed:
        ex.status = ExecState.FAILED
        root_step, root = ex.root_failure or (END, end_error)
        assert root is not None
        decision.lifecycle(
            WorkflowFailedData(
                failed_steps=failed,
                **summary,
            )
        )
        decision.lifecycle(
            PlaybookFailedData(
                playbook=ex.playbook_path,
                started_at=ex.started_at,
                ended_at=decision.out.at,
                error=execution_error(root, step=root_step, failed_steps=failed),
                failed_steps=failed,
                result=result,
                **summary,
            )
        )
        reply_to_parent(
            decision,
            result=None,
            error=ErrorInfo(
                type="ChildFailed",
                message=f"child execution {ex.execution_id} failed at step '{root_step}': {root.type}: {root.message}",
            ),
        )
    else:
        ex.status = ExecState.COMPLETED
        decision.lifecycle(
            WorkflowCompletedData(
                **summary,
            )
        )
        decision.lifecycle(
            PlaybookCompletedData(
                playbook=ex.playbook_path,
                started_at=ex.started_at,
                ended_at=decision.out.at,
                result=result,
                **summary,
            )
        )
        reply_to_parent(decision, result=result, error=None)


def reply_to_parent(decision: Decision, *, result: Any, error: ErrorInfo | None) -> None:
    """A child execution reports its end to its parent as the result of the parent's
    command: the parent's step inherits the child's status."""
    parent = decision.ex.parent
    if parent is None or not parent.reply_to or not parent.command_id or not parent.step:
        return
    attempt = attempt_of(parent.command_id)
    worker = f"execution:{decision.ex.execution_id}"
    msg: CallDone | CallError
    if error is not None:
        msg = CallError(
            execution_id=parent.execution_id,
            command_id=parent.command_id,
            step=parent.step,
            error=error,
            attempt_number=attempt,
            worker=worker,
        )
    else:
        msg = CallDone(
            execution_id=parent.execution_id,
            command_id=parent.command_id,
            step=parent.step,
            attempt_number=attempt,
            result=result,
            worker=worker,
        )
    decision.out.reply = (parent.reply_to, msg)


def execution_error(root: ErrorInfo, *, step: str | None, failed_steps: list[str]) -> dict[str, Any]:
    """A failed execution's error, as `playbook.failed` carries it (and the status, which
    copies it): the root cause, the first unhandled failure (its step; none when the
    execution could not start), and every failed step beside it. The root's traceback
    stays on its step's events."""
    return {
        "type": root.type,
        "message": root.message,
        "step": step,
        "failed_steps": failed_steps,
        "retryable": root.retryable,
        "status": root.status,
    }
