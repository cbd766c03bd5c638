"""What an execution came to, as `Client.result(ID)` gives it, and which of its steps are
running now (entered and not exited, from its log)."""

from __future__ import annotations

from collections import Counter

from actors.client.logview import LogItem
from actors.errors import ActorsError, NotFinished, UserError
from actors.wire.events import EventType, ExecState
from actors.wire.messages import ExecutionStatus
from streams.layout import EV


class ExecutionNotFound(UserError):
    """No execution has the id (or the projector has not recorded it yet)."""


class ExecutionNotFinished(NotFinished):
    """The execution has no result yet: it is still pending or running."""

    def __init__(self, status: ExecutionStatus) -> None:
        self.status = status
        super().__init__(f"execution {status.execution_id} is {status.state}: no result yet")


class ExecutionFailed(ActorsError):
    """The execution ended FAILED or CANCELLED: `status.error` is the root cause (type,
    message, step) and every failed step; `reason` is a cancel's."""

    def __init__(self, status: ExecutionStatus, reason: str | None = None) -> None:
        self.status = status
        self.error = status.error
        self.reason = reason
        if status.state == ExecState.CANCELLED:
            what = f"cancelled: {reason}" if reason else "cancelled"
        else:
            e = status.error or {}
            at = f" (step '{e['step']}')" if e.get("step") else ""
            what = f"failed: {e.get('type')}: {e.get('message')}{at}"
        super().__init__(f"execution {status.execution_id} {what}")


def running_steps(items: list[LogItem]) -> list[str]:
    """The steps entered and not exited yet, in the order they were first entered."""
    entered: Counter[str] = Counter()
    order: dict[str, None] = {}
    for it in items:
        if it.cls != EV or it.step is None:
            continue
        if it.type == EventType.STEP_ENTER:
            entered[it.step] += 1
            order.setdefault(it.step)
        elif it.type == EventType.STEP_EXIT:
            entered[it.step] -= 1
    return [s for s in order if entered[s] > 0]
