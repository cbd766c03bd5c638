"""The engine's decisions: fold one input into an execution and say what follows.

`fold(execution, input, seq=..., at=...)` mutates the execution (it *is* the fold step)
and returns the output of that decision: events for the decision record, lifecycle
events, and commands for tool actors. It is a pure function of the execution's log:
ids come from the input's stream sequence, times from its log timestamp, nothing from
clocks or randomness. A replay of the same inputs yields the same outputs, which is
what lets a new engine finish an execution another engine started (no step decided
twice: outputs already in the log are recognised by their cause and not re-sent).

Semantics (docs/language.md: Routing, Retry, Failure, States):
* the first step is the entry; `next` rules route on success, first match wins;
  a step without `next` routes to `end`; `next: [a, b]` starts parallel branches;
* retry rules run after every attempt (actors/core/backoff.py for delays); a step that
  still fails meets its `on_error` rules (a decision, recorded once), then its
  `on_failure` edges (a remediation step with `failure` in scope), else it routes to
  `end` with `routed_to_end`; `abort` cancels every other live branch;
* `tool: playbook` starts a child execution; the child reports its end to the parent
  as the result of the parent's command;
* `end` runs once, when every live branch has reached it; it evaluates the workflow:
  FAILED if any failure is unhandled; then `workflow.*` and `playbook.*`;
* only lifecycle events carry execution status;
* an execution enters at most `Execution.step_budget` steps (activations): past it,
  it fails with `StepBudgetExceeded` like an abort, so no cycle runs for ever;
* a failed execution's error names its root cause: the first unhandled failure (step,
  type, message), with every failed step beside it.

The fold's parts, one idea each: this module takes an input to its handler, keeps the
routing loop, starts the execution and runs its steps and `end`; the others are
actors/core/decision.py (the decision's builder; branch tokens entering, leaving,
failing, cancelled; the step budget), work.py (a step's commands, child executions and
loops, their results, routing on), failure.py (retry, on_error, on_failure, abort,
cancel) and outcome.py (the execution's end, its error, the reply to a parent).
"""

from __future__ import annotations

from typing import Any

from actors.core import waits
from actors.core.decision import Decision, activate
from actors.core.effects import Effects, Timer
from actors.core.effects import template_error as _template_error
from actors.core.failure import cancel, engine_fault
from actors.core.outcome import execution_error, finish, reply_to_parent
from actors.core.state import Activation, Execution
from actors.core.work import call_result, deep_merge, dispatch, issue, iterator_end, settle
from actors.playbook.loader import PlaybookInvalid, parsed_playbook
from actors.playbook.model import END, NoopTool, Step
from actors.playbook.templates import TemplateError, call_with_limits, render_value
from actors.wire.events import (
    ActivationStatus,
    ExecState,
    PlaybookFailedData,
    PlaybookInitializedData,
    RetriedData,
    RetryDueData,
    RetryOfData,
    RoutingPausedData,
    WorkflowInitializedData,
)
from actors.wire.messages import (
    CallDone,
    CallError,
    CancelRequest,
    EngineFault,
    ErrorInfo,
    Input,
    IteratorCompleted,
    IteratorFailed,
    RetriedBy,
    SignalSent,
    StartRecord,
    TimerFired,
)
from streams.subjects import ExecSubjects

__all__ = ["ROUTING_SLICE", "deep_merge", "execution_error", "fold"]  # imported from here elsewhere

# Routing is a loop over a stack of pending work (`Execution.pending`), not recursion: a
# step that completes schedules the activations it routes to, and a check for `end`
# after them, instead of starting them from inside its own call. A long chain or a
# cycle of routers (decided here, with no round trip) would otherwise overflow Python's
# stack. Last in, first out: a branch runs on until it waits (a command, a timer) before
# its sibling starts, which is the order of events recursion gave.
# One decision starts at most ROUTING_SLICE activations; the rest waits for a `resume`
# timer that is due at once. So no decision record outgrows a message and no execution
# holds the engine for long; a replay folds the same inputs into the same stack.
ROUTING_SLICE = 1000
RESUME_TIMER = "resume"


def fold(ex: Execution, inp: Input, *, seq: int, at: float, subjects: ExecSubjects) -> Effects:
    # templates are bounded by the execution's limits, fixed in its start record
    limits = inp.limits if isinstance(inp, StartRecord) and ex.status == ExecState.PENDING else ex.limits
    return call_with_limits(limits, lambda: _fold(ex, inp, seq=seq, at=at, subjects=subjects))


def _fold(ex: Execution, inp: Input, *, seq: int, at: float, subjects: ExecSubjects) -> Effects:
    decision = Decision(ex, subjects, seq, at)
    ex.inputs_folded += 1
    if isinstance(inp, StartRecord):
        _start(decision, inp)
    elif isinstance(inp, EngineFault):
        engine_fault(decision, inp)
    elif isinstance(inp, RetriedBy):
        _retried(decision, inp)  # a link in the log, whatever the state: it decides nothing
    elif isinstance(inp, CancelRequest) and ex.status == ExecState.PENDING:
        ex.early_cancel = ex.early_cancel or inp  # kept for the start (the first reason wins)
    elif isinstance(inp, SignalSent) and ex.status == ExecState.PENDING:
        waits.signal(decision, inp)  # kept for the steps to come (a start still queued)
    elif ex.terminal or ex.playbook is None:
        pass  # late results after the end, or inputs before a start: nothing to decide
    elif isinstance(inp, (CallDone, CallError)):
        call_result(decision, inp)
    elif isinstance(inp, CancelRequest):
        cancel(decision, inp)
    elif isinstance(inp, TimerFired):
        _timer_fired(decision, inp)
    elif isinstance(inp, (IteratorCompleted, IteratorFailed)):
        iterator_end(decision, inp)
    elif isinstance(inp, SignalSent):
        _then(decision, waits.signal(decision, inp))
    _route_pending(decision)
    if ex.waits_changed:
        waits.announce(decision)
    return decision.out


def _then(decision: Decision, what: waits.Next | None) -> None:
    """Apply what a wait's end decided for its step (a result, a failure)."""
    if what is not None:
        settle(decision, *what)


def _route_pending(decision: Decision) -> None:
    """Do the routing the input set off (and any left by an earlier decision), up to
    ROUTING_SLICE activations."""
    ex = decision.ex
    begun = 0
    while ex.pending:
        if ex.terminal:
            ex.pending.clear()  # cancelled, or `end` ran: nothing starts any more
            return
        if begun == ROUTING_SLICE:
            timer_id = f"{RESUME_TIMER}-{decision.out.cause}"
            decision.event(None, RoutingPausedData(timer_id=timer_id, pending=len(ex.pending)))
            decision.out.timers.append(
                Timer(
                    timer_id,
                    decision.out.at,
                    TimerFired(execution_id=ex.execution_id, timer_id=timer_id, due=decision.out.at),
                )
            )
            return
        what, act_id = ex.pending.pop()
        act = ex.activations[act_id]
        if what == "settle":
            _maybe_end(decision, act)
        elif act.status == ActivationStatus.RUNNING:  # not cancelled meanwhile (an abort in a sibling branch)
            begun += 1
            _run(decision, act)


def _timer_fired(decision: Decision, fired: TimerFired) -> None:
    ex = decision.ex
    assert ex.playbook is not None
    if fired.timer_id.startswith(f"{RESUME_TIMER}-"):
        return  # routing goes on where the last decision paused it (_route_pending)
    if waits.is_wait_timer(fired.timer_id):
        _then(decision, waits.timer_fired(decision, fired))
        return
    head = fired.timer_id.split("-", 1)[0]
    act = ex.activations.get(int(head)) if head.isdigit() else None
    if act is None or act.status != ActivationStatus.RUNNING or act.timer_id != fired.timer_id:
        return  # a timer for an attempt that no longer waits (fired twice, or cancelled)
    act.timer_id = None
    decision.event(
        act.step,
        RetryDueData(
            activation=act.id,
            timer_id=fired.timer_id,
            due=fired.due,
            late_ms=round((decision.out.at - fired.due) * 1000, 3),
        ),
    )
    issue(decision, act, ex.playbook.step(act.step))


# --- start -----------------------------------------------------------------------------


def _start(decision: Decision, rec: StartRecord) -> None:
    ex = decision.ex
    if ex.status != ExecState.PENDING:
        return  # a second start record for the same id: the first one won
    ex.playbook_path = rec.playbook_path
    ex.playbook_source = rec.playbook_source or ""
    ex.playbook_file = rec.playbook_file
    ex.started_at = decision.out.at
    ex.parent = rec.parent
    ex.limits = rec.limits
    ex.semantics = rec.semantics
    if rec.error is not None or rec.playbook_source is None:
        _fail_at_start(decision, rec.error or ErrorInfo(type="StartError", message="start record carries no playbook"))
        return
    try:
        # the retry ceiling of the record, not of this pod: every pod replays the log alike
        ex.playbook = parsed_playbook(rec.playbook_source, rec.playbook_path, ex.limits.max_attempts)
    except PlaybookInvalid as e:
        _fail_at_start(decision, ErrorInfo(type="PlaybookInvalid", message=str(e)))
        return
    too_old = waits.too_old(ex.playbook, ex.semantics)
    if too_old is not None:
        _fail_at_start(decision, too_old)
        return
    entry = ex.playbook.entry
    if rec.retry_of is not None:
        retry = rec.retry_of
        if retry.from_step == END or retry.from_step not in ex.playbook.steps:
            _fail_at_start(
                decision,
                ErrorInfo(
                    type="RetryInvalid",
                    message=f"retry of execution {retry.execution_id}: playbook {rec.playbook_path} "
                    f"has no step '{retry.from_step}' to start from",
                ),
            )
            return
        # the old execution's results are in scope from the start, as if its steps had run here
        ex.results = dict(retry.results)
        ex.redrive = dict(retry.redrive)
        entry = retry.from_step
        decision.event(
            None, RetryOfData(execution_id=retry.execution_id, from_step=entry, kept_steps=sorted(retry.results))
        )
    ex.workload = deep_merge(ex.playbook.workload, rec.payload)
    ex.status = ExecState.RUNNING
    initialized = PlaybookInitializedData(
        playbook=ex.playbook_path, version=rec.playbook_version, started_at=decision.out.at
    )
    if rec.parent is not None:
        initialized.parent_execution_id = rec.parent.execution_id
        initialized.parent_step = rec.parent.step
    decision.lifecycle(initialized)
    decision.lifecycle(WorkflowInitializedData(entry=entry))
    if ex.early_cancel is not None:
        cancel(decision, ex.early_cancel)  # cancelled before it started: no step is entered
        return
    _enter(decision, entry, from_activation=None)


def _retried(decision: Decision, link: RetriedBy) -> None:
    """A retry of this execution was started: say so once in its log."""
    ex = decision.ex
    if link.retry_execution_id in ex.retries:
        return  # the same link written again (a starter's redelivery past the duplicate window)
    ex.retries.append(link.retry_execution_id)
    decision.event(None, RetriedData(retry_execution_id=link.retry_execution_id, from_step=link.from_step))


def _fail_at_start(decision: Decision, error: ErrorInfo) -> None:
    """Fail the execution before its first step: the start record or its playbook is bad."""
    ex = decision.ex
    ex.status = ExecState.FAILED
    decision.lifecycle(
        PlaybookFailedData(
            playbook=ex.playbook_path,
            started_at=decision.out.at,
            ended_at=decision.out.at,
            error=execution_error(error, step=None, failed_steps=[]),
        )
    )
    reply_to_parent(
        decision,
        result=None,
        error=ErrorInfo(
            type="ChildFailed", message=f"child execution {ex.execution_id} did not start: {error.message}"
        ),
    )


# --- steps -----------------------------------------------------------------------------


def _enter(
    decision: Decision, step_name: str, *, from_activation: int | None, failure: dict[str, Any] | None = None
) -> None:
    _begin(decision, activate(decision, step_name, from_activation=from_activation, failure=failure))


def _begin(decision: Decision, act: Activation) -> None:
    decision.later(("begin", act.id))


def _run(decision: Decision, act: Activation) -> None:
    assert decision.ex.playbook is not None
    step = decision.ex.playbook.step(act.step)
    if act.step == END:
        _run_end(decision, act, step)
    else:
        dispatch(decision, act, step)


def _maybe_end(decision: Decision, act: Activation) -> None:
    ex = decision.ex
    if not ex.live and ex.end_activation is None and not ex.terminal:
        _begin(decision, activate(decision, END, from_activation=act.id))


# --- end -------------------------------------------------------------------------------


def _run_end(decision: Decision, act: Activation, step: Step) -> None:
    ex = decision.ex
    if isinstance(step.tool, NoopTool):
        if step.args:
            try:
                result = render_value(step.args, ex.scope(), where="args", step=END)
            except TemplateError as e:
                finish(decision, act, result=None, end_error=_template_error(END, e))
                return
        else:
            result = {a.step: ex.results.get(a.step) for a in ex.arrivals}
        finish(decision, act, result=result, end_error=None)
        return
    ex.live[act.id] = None
    issue(decision, act, step)
