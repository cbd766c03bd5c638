"""What follows a failed attempt, and how an execution stops early.

A step's retry rules run after every attempt (another attempt now, or on a timer). A
step that still fails meets its `on_error` rules (a decision, recorded once and read
back on replay), then its `on_failure` edges (a remediation step with the failure's
envelope in scope), else it fails unhandled. An abort fails the execution at once, a
cancel request cancels it, an input the engine could not handle fails it.

What of a decision takes the step further in its work (complete and route on, the next
attempt now, the failure rules) is returned as a value (actors/core/attempt.py) for
actors/core/work.py `settle` to apply: this module never calls into work.py.
"""

from __future__ import annotations

import msgspec
from msgspec import UnsetType

from actors.core.attempt import REISSUE, Complete, Fail, Outcome
from actors.core.backoff import unit_random
from actors.core.collect import size
from actors.core.decision import Decision, activate, cancel_activation, cancel_live, fail_step, leave, within_budget
from actors.core.effects import Timer, error_view
from actors.core.effects import template_error as _template_error
from actors.core.envelope import build_envelope, failure_content
from actors.core.outcome import execution_error, reply_to_parent
from actors.core.retry import after_attempt
from actors.core.state import Activation
from actors.playbook.model import END, OnErrorRule, Step
from actors.playbook.templates import TemplateError, render_condition, render_value
from actors.wire.events import (
    ActivationStatus,
    ArrivalStatus,
    EngineFaultData,
    ExecState,
    ExecutionCancelledData,
    FailureDecidedData,
    FailureRoute,
    PlaybookFailedData,
    RetryExhaustedData,
    RetryScheduledData,
    RetrySequenceCompletedData,
    StepExitData,
)
from actors.wire.messages import CallDone, CallError, CancelRequest, EngineFault, ErrorInfo, TimerFired

ON_ERROR_RETRY_DELAY = 60.0  # retry_later without `delay`


# --- retry -----------------------------------------------------------------------------


def after_result(decision: Decision, act: Activation, step: Step, res: CallDone | CallError) -> Outcome:
    """What follows the current attempt's result: the step's retry rules, evaluated
    after every attempt (first match wins: another attempt, a collecting sequence
    completed, exhaustion, a failure of the rules themselves), else the result as it
    is (a completion, or a failure for the failure rules)."""
    if isinstance(res, CallError):
        act.errors.append(summary_line(act.attempt, res.error))  # the retry summary
    if not step.retry:
        return _as_is(act, res)
    ok = isinstance(res, CallDone)
    result = res.result if isinstance(res, CallDone) else None
    error = error_view(res.error) if isinstance(res, CallError) else None
    scope = decision.ex.scope(act)
    scope.update(result=result, response=result, error=error, attempt=act.attempt)
    try:
        after = after_attempt(
            step.retry,
            scope,
            ok=ok,
            attempt=act.attempt,
            result=result,
            gathered=act.gathered,
            unit=unit_random(decision.ex.execution_id, act.id, act.attempt),
        )
    except TemplateError as e:
        fail_step(decision, act, _template_error(step.step, e))
        return None
    verdict = after.verdict
    if verdict is not None:
        act.max_attempts = verdict.policy.max_attempts
    if after.what == "again":
        assert verdict is not None
        if verdict.next_args is not None:
            act.next_args = verdict.next_args
        return _next_attempt(
            decision, act, step, delay=verdict.delay, reason="success" if ok else "error", rule=verdict.rule
        )
    if after.what == "completed":
        # a collecting sequence ends: at its rule's bound (`bounded`), or when no rule
        # asks for another attempt; the step completes with what it gathered, and says so
        decision.event(
            step.step,
            RetrySequenceCompletedData(
                activation=act.id,
                total_attempts=act.attempt,
                collected_size=size(act.gathered.value),
                bounded=verdict is not None,
                rule=verdict.rule if verdict is not None else msgspec.UNSET,
            ),
        )
        return Complete(after.result)
    if after.what == "exhausted":
        assert isinstance(res, CallError) and verdict is not None
        decision.event(
            step.step,
            RetryExhaustedData(
                activation=act.id,
                attempts=act.attempt,
                max_attempts=verdict.policy.max_attempts,
                error=error,
                rule=verdict.rule,
            ),
        )
        return Fail(res.error, exhausted=True, summarised=True)
    return _as_is(act, res)  # no rule matched


def _as_is(act: Activation, res: CallDone | CallError) -> Outcome:
    """The attempt's result when no retry rule takes it: a completion with what the
    step gathered, or a failure (its error already in the retry summary)."""
    if isinstance(res, CallDone):
        return Complete(act.gathered.final(res.result, add=True))
    return Fail(res.error, summarised=True)


def _next_attempt(
    decision: Decision, act: Activation, step: Step, *, delay: float, reason: str, rule: str | None
) -> Outcome:
    """Count and record the next attempt: sent now (`REISSUE`), or when its timer fires."""
    act.attempt += 1
    due = decision.out.at + delay
    decision.event(
        step.step,
        RetryScheduledData(
            activation=act.id,
            attempt_number=act.attempt,
            delay=delay,
            due=due,
            reason=reason,
            rule=rule,
            parent_event_id=act.command_id,
        ),
    )
    if delay <= 0:
        return REISSUE
    timer_id = f"{act.id}-{act.attempt}"
    act.timer_id = timer_id
    decision.out.timers.append(
        Timer(timer_id, due, TimerFired(execution_id=decision.ex.execution_id, timer_id=timer_id, due=due))
    )
    return None


# --- failure: on_error decisions, on_failure edges -------------------------------------


def meet_failure_rules(decision: Decision, act: Activation, step: Step, failed: Fail) -> Outcome:
    """A step failed for good: its on_error rules, then its on_failure edges, say what follows.

    No retry rule takes the failure any more. The `on_error` rules say what it means
    (an ignored failure completes the step, a retry is the next attempt); with the
    default meaning, the `on_failure` edges may route it to remediation (`_remediate`);
    otherwise the step fails unhandled (`fail_step`)."""
    error, exhausted = failed.error, failed.exhausted
    if not failed.summarised:
        act.errors.append(summary_line(act.attempt, error))
    if step.on_error:
        decided = _decide_on_error(decision, act, step, error)
        if decided is None:
            return None  # the rules themselves failed; the step failed naming the rule
        meaning = decided.decision
        if meaning == "ignore":
            result = None if isinstance(decided.result, UnsetType) else decided.result
            return Complete(result, ignored_error=error_view(error))
        if meaning in ("retry", "retry_later"):
            if act.attempt >= decision.ex.limits.max_attempts:
                decision.event(
                    step.step,
                    RetryExhaustedData(
                        activation=act.id,
                        attempts=act.attempt,
                        max_attempts=decision.ex.limits.max_attempts,
                        error=error_view(error),
                        rule=decided.rule,
                    ),
                )
            else:
                if not isinstance(decided.args, UnsetType) and decided.args is not None:
                    act.next_args = decided.args
                delay = 0.0
                if meaning == "retry_later" and not isinstance(decided.delay, UnsetType):
                    delay = float(decided.delay or 0.0)
                return _next_attempt(decision, act, step, delay=delay, reason=f"on_error:{meaning}", rule=decided.rule)
        elif meaning == "cancel":
            act.status = ActivationStatus.CANCELLED
            decision.event(
                step.step,
                StepExitData(
                    activation=act.id, status=ActivationStatus.CANCELLED, error=error_view(error), routed_to_end=True
                ),
            )
            leave(decision, act, [END], status=ArrivalStatus.CANCELLED)
            return None
        elif meaning == "handled":
            fail_step(decision, act, error, handled=True)
            return None
        elif meaning == "abort":
            _abort(decision, act, step, error)
            return None
    if step.on_failure:
        _remediate(decision, act, step, error, exhausted=exhausted)
        return None
    fail_step(decision, act, error)
    return None


def _decide_on_error(decision: Decision, act: Activation, step: Step, error: ErrorInfo) -> FailureDecidedData | None:
    """The first matching on_error rule's decision, rendered, recorded as
    `step.failure_decided`. In a replay the recorded decision is read back, never
    evaluated again."""
    assert step.on_error is not None
    key = (act.id, act.attempt)
    recorded = decision.ex.recorded.get(key)
    if recorded is not None:
        decision.event(step.step, recorded)
        return recorded
    scope = decision.ex.scope(act)
    scope.update(result=None, response=None, error=error_view(error), attempt=act.attempt)
    chosen: tuple[int, OnErrorRule] | None = None
    try:
        for i, rule in enumerate(step.on_error):
            if render_condition(rule.when, scope, where=f"on_error[{i}].when", step=step.step):
                chosen = (i, rule)
                break
        decided = FailureDecidedData(
            activation=act.id, attempt_number=act.attempt, error=error_view(error), decision="none", rule=None
        )
        if chosen is not None:
            i, rule = chosen
            decided.decision, decided.rule = rule.decision, f"on_error[{i}]"
            if rule.decision == "ignore":
                decided.result = render_value(rule.result, scope, where=f"on_error[{i}].result", step=step.step)
            if rule.args is not None:
                decided.args = render_value(rule.args, scope, where=f"on_error[{i}].args", step=step.step)
            if rule.decision == "retry_later":
                decided.delay = rule.delay if rule.delay is not None else ON_ERROR_RETRY_DELAY
    except TemplateError as e:
        fail_step(decision, act, _template_error(step.step, e))
        return None
    decision.event(step.step, decided)
    return decided


def _remediate(decision: Decision, act: Activation, step: Step, error: ErrorInfo, *, exhausted: bool) -> None:
    """Route a failed step to its remediation step: the first on_failure edge that matches.

    Edges are tried in declared order; the failure is then handled, and the remediation
    step gets `failure` in scope. No edge that matches: the step fails unhandled."""
    assert step.on_failure is not None
    ex = decision.ex
    if ex.aborted:
        fail_step(decision, act, error, route=FailureRoute(attempted=False, status="skipped_terminal"))
        return
    scope = ex.scope(act)
    scope.update(result=None, response=None, error=error_view(error), attempt=act.attempt)
    target: str | None = None
    edge = ""  # the on_failure edge taken, named once a target is found
    try:
        for i, e in enumerate(step.on_failure):
            if render_condition(e.when, scope, where=f"on_failure[{i}].when", step=step.step):
                target, edge = e.step, f"on_failure[{i}]"
                break
    except TemplateError as te:
        fail_step(decision, act, _template_error(step.step, te))
        return
    if target is None:
        fail_step(decision, act, error, route=FailureRoute(attempted=True, status="no_route", target=None))
        return
    summary = {
        "attempts": act.attempt,
        "max_attempts": act.max_attempts,
        "exhausted": exhausted,
        "errors": act.errors[-10:],
    }
    content = failure_content(
        error=error_view(error), attempt=act.attempt, max_attempts=act.max_attempts, retry_summary=summary
    )
    text, truncation = build_envelope(
        execution_id=ex.execution_id,
        target_step=target,
        source_step=step.step,
        source_activation=act.id,
        source_attempt=act.attempt,
        created_at=decision.out.at,
        content=content,
    )
    failure = {
        "step": step.step,
        "attempt": act.attempt,
        "max_attempts": act.max_attempts,
        "error": error_view(error),
        "retry_summary": summary,
        "envelope": text,
        "truncation": truncation,
        "untrusted_data": True,
    }
    if not within_budget(decision, act, target):
        # the remediation cannot start: the step's failure stays unhandled
        fail_step(
            decision,
            act,
            error,
            route=FailureRoute(attempted=True, status="step_budget_exceeded", target=target, edge=edge),
        )
        return
    act.status = ActivationStatus.FAILED
    route = FailureRoute(attempted=True, status="selected", target=target, edge=edge)
    decision.event(
        step.step,
        StepExitData(
            activation=act.id,
            status=ActivationStatus.FAILED,
            error=error_view(error),
            handled=True,
            failure_route=route,
        ),
    )
    ex.live.pop(act.id, None)
    new = activate(decision, target, from_activation=act.id, failure=failure)
    decision.later(("begin", new.id), ("settle", act.id))


def summary_line(attempt: int, error: ErrorInfo) -> str:
    return f"attempt {attempt}: {error.type}: {error.message[:200]}"


# --- abort and cancellation ------------------------------------------------------------


def _abort(decision: Decision, act: Activation, step: Step, error: ErrorInfo) -> None:
    """Fail the execution now: every other live branch is cancelled (running commands
    stopped, queued ones dropped, timers disarmed, children cancelled) and routed to
    `end`, which then evaluates the workflow as FAILED."""
    decision.ex.aborted = True
    cancel_live(decision, reason=f"aborted by step '{step.step}'", keep=act.id)
    fail_step(decision, act, error, aborted=True)


def cancel(decision: Decision, req: CancelRequest) -> None:
    ex = decision.ex
    running = [a.command_id for a in ex.activations.values() if a.status == ActivationStatus.RUNNING and a.command_id]
    for act_id in list(ex.live):
        cancel_activation(decision, ex.activations[act_id], reason=req.reason or "execution cancelled", to_end=False)
    ex.status = ExecState.CANCELLED
    decision.lifecycle(
        ExecutionCancelledData(
            playbook=ex.playbook_path,
            started_at=ex.started_at,
            ended_at=decision.out.at,
            reason=req.reason,
            running_commands=running,
        )
    )
    reply_to_parent(
        decision,
        result=None,
        error=ErrorInfo(
            type="ChildCancelled", message=f"child execution {ex.execution_id} was cancelled: {req.reason}"
        ),
    )


def engine_fault(decision: Decision, fault: EngineFault) -> None:
    """The engine could not handle one of this execution's inputs (EngineFault): the
    execution ends FAILED with the error, and whatever runs is stopped as on a cancel."""
    ex = decision.ex
    if ex.terminal:
        return
    decision.event(
        None,
        EngineFaultData(input_seq=fault.input_seq, input_subject=fault.input_subject, error=error_view(fault.error)),
    )
    for act_id in list(ex.live):
        cancel_activation(
            decision, ex.activations[act_id], reason=f"engine error: {fault.error.message[:200]}", to_end=False
        )
    ex.status = ExecState.FAILED
    decision.lifecycle(
        PlaybookFailedData(
            playbook=ex.playbook_path,
            started_at=ex.started_at,
            ended_at=decision.out.at,
            error=execution_error(fault.error, step=None, failed_steps=list(ex.failed_steps)),
        )
    )
    reply_to_parent(
        decision,
        result=None,
        error=ErrorInfo(type="ChildFailed", message=f"child execution {ex.execution_id} failed: {fault.error.message}"),
    )
