"""One decision's output, and the moves of branch tokens every part of the fold makes.

`Decision` builds what one input yields: events for the decision record, lifecycle
events, commands (actors/core/effects.py). The moves: a token enters a step
(`activate`), leaves it for the steps it routes to or for `end` (`leave`, within the
step budget: `within_budget`), fails there (`fail_step`), or is cancelled
(`cancel_activation`, `cancel_live`). The parts of the fold (actors/core/decide.py,
work.py, failure.py, outcome.py) call each other; these moves call none of them, so
every part imports them.
"""

from __future__ import annotations

from typing import Any

from actors.core.effects import CommandCancel, Effects, error_view
from actors.core.state import Activation, Arrival, Execution, Pending
from actors.playbook.model import END
from actors.wire.events import (
    ActivationStatus,
    ArrivalStatus,
    BudgetExceededData,
    CommandCancelledData,
    EventData,
    FailureRoute,
    StepEnterData,
    StepExitData,
    make_event,
)
from actors.wire.messages import ErrorInfo, LoopCancel
from streams.subjects import ExecSubjects


class Decision:
    """Builder for one decision's output; holds the cause and log time."""

    def __init__(self, ex: Execution, subjects: ExecSubjects, seq: int, at: float) -> None:
        self.ex = ex
        self.subjects = subjects  # the execution's log: where its commands' results go
        self.out = Effects(cause=seq, at=at)

    def event(self, step: str | None, data: EventData) -> None:
        """An event for the decision record (its type follows from `data`'s)."""
        self.out.events.append(
            make_event(data, execution_id=self.ex.execution_id, at=self.out.at, cause=self.out.cause, step=step)
        )

    def lifecycle(self, data: EventData) -> None:
        """A lifecycle event: only these move the execution's status."""
        self.out.lifecycle.append(
            make_event(data, execution_id=self.ex.execution_id, at=self.out.at, cause=self.out.cause)
        )

    def later(self, *work: Pending) -> None:
        """Routing to do once the current step is decided, in the order given."""
        self.ex.pending.extend(reversed(work))


# --- branch tokens: enter, leave, fail -------------------------------------------------


def activate(
    decision: Decision, step_name: str, *, from_activation: int | None, failure: dict[str, Any] | None = None
) -> Activation:
    """A new branch token at `step_name`. Tokens of a fan-out are all made live before
    any of them runs, so a fast first branch cannot find the others missing and start
    `end` early."""
    ex = decision.ex
    act = Activation(id=len(ex.activations), step=step_name, from_activation=from_activation, failure=failure)
    ex.activations[act.id] = act
    if step_name == END:
        ex.end_activation = act.id
        decision.event(step_name, StepEnterData(activation=act.id, arrivals=[a.step for a in ex.arrivals]))
    else:
        ex.live[act.id] = None
        entered = StepEnterData(activation=act.id, from_activation=from_activation)
        if failure:
            entered.remediates = failure["step"]
        decision.event(step_name, entered)
    return act


def leave(decision: Decision, act: Activation, targets: list[str], *, status: ArrivalStatus) -> None:
    """The branch token of `act` moves on: into new activations, or to `end`. The new
    activations start after this decision's current step (see ROUTING_SLICE), then
    `end` is considered."""
    ex = decision.ex
    ex.live.pop(act.id, None)
    fresh = []
    for target in targets:
        if target == END:
            ex.arrivals.append(Arrival(step=act.step, status=status, routed_to_end=status != ArrivalStatus.COMPLETED))
        elif within_budget(decision, act, target):
            fresh.append(activate(decision, target, from_activation=act.id))
    decision.later(*(("begin", new.id) for new in fresh), ("settle", act.id))


def within_budget(decision: Decision, source: Activation, target: str) -> bool:
    """May `source` route into one more activation (of `target`)? Past the step budget
    the execution fails as an abort would: the other live branches are cancelled, no
    further step starts, `end` evaluates it FAILED with `StepBudgetExceeded`."""
    ex = decision.ex
    budget = ex.step_budget
    if len(ex.activations) < budget:
        return True
    if ex.aborted:
        return False  # already failing (this budget, or an abort): nothing new starts
    error = ErrorInfo(
        type="StepBudgetExceeded",
        message=f"the execution has entered {budget} steps, its budget: step '{target}' (routed from "
        f"'{source.step}') is not entered (budget: the smaller of the playbook's "
        f"limits.max_steps and the pod's ACTORS_MAX_STEPS)",
    )
    decision.event(target, BudgetExceededData(from_activation=source.id, budget=budget, error=error_view(error)))
    ex.aborted = True
    cancel_live(decision, reason=f"step budget of {budget} exceeded", keep=source.id)
    _unhandled(ex, target, error)
    ex.arrivals.append(Arrival(step=target, status=ArrivalStatus.FAILED, routed_to_end=True))
    return False


def fail_step(
    decision: Decision,
    act: Activation,
    error: ErrorInfo,
    *,
    handled: bool = False,
    aborted: bool = False,
    route: FailureRoute | None = None,
) -> None:
    """End the step FAILED and send its branch to `end`, consulting no further rule.

    Unless handled, the failure fails the workflow when `end` evaluates it."""
    ex = decision.ex
    act.status = ActivationStatus.FAILED
    if not handled:
        _unhandled(ex, act.step, error)
    failed = StepExitData(
        activation=act.id,
        status=ActivationStatus.FAILED,
        error=error_view(error),
        routed_to_end=True,
        original_failed_step=act.step,
    )
    if handled:
        failed.handled = True
    if aborted:
        failed.aborted = True
    if route is not None:
        failed.failure_route = route
    decision.event(act.step, failed)
    leave(decision, act, [END], status=ArrivalStatus.HANDLED if handled else ArrivalStatus.FAILED)


def _unhandled(ex: Execution, step: str, error: ErrorInfo) -> None:
    """A failure that fails the workflow; the first one is the execution's root cause."""
    ex.failed_steps.append(step)
    if ex.root_failure is None:
        ex.root_failure = (step, error)


# --- cancellation ----------------------------------------------------------------------


def cancel_live(decision: Decision, *, reason: str, keep: int) -> None:
    """Cancel every live branch but `keep`, each routed to `end`."""
    for other_id in list(decision.ex.live):
        if other_id != keep:
            cancel_activation(decision, decision.ex.activations[other_id], reason=reason)


def cancel_activation(decision: Decision, act: Activation, *, reason: str, to_end: bool = True) -> None:
    ex = decision.ex
    if act.status == ActivationStatus.RUNNING and act.command_id is not None and act.timer_id is None:
        decision.event(act.step, CommandCancelledData(activation=act.id, command_id=act.command_id, reason=reason))
        if act.kind == "loop":
            decision.out.loop_cancels.append(
                LoopCancel(execution_id=ex.execution_id, loop_id=act.command_id, reason=reason)
            )
        elif act.child is not None:
            decision.out.child_cancels.append(act.child)
        elif act.kind is not None:
            decision.out.cancels.append(CommandCancel(act.kind, act.command_id))
    act.timer_id = None
    act.status = ActivationStatus.CANCELLED
    ex.live.pop(act.id, None)
    if ex.waits and ex.waits.pop(act.id, None) is not None:
        ex.waits_changed = True  # it waited (actors/core/waits.py): its timer, if any, fires for nothing
    if to_end:
        decision.event(
            act.step,
            StepExitData(activation=act.id, status=ActivationStatus.CANCELLED, reason=reason, routed_to_end=True),
        )
        ex.arrivals.append(Arrival(step=act.step, status=ArrivalStatus.CANCELLED, routed_to_end=True))
