"""The engine's decisions: fold one input into an execution and say what follows.

`fold(execution, input, seq=..., at=...)` mutates the execution (it *is* the fold step)
and returns the output of that decision: events for the decision record, lifecycle
events, and commands for tool actors. It is a pure function of the execution's log:
ids come from the input's stream sequence, times from its log timestamp, nothing from
clocks or randomness. A replay of the same inputs yields the same outputs, which is
what lets a new engine finish an execution another engine started (no step decided
twice: outputs already in the log are recognised by their cause and not re-sent).

Semantics (shared/DSL.md, seeds 000 and 001):
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
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UnsetType

from actors.core.backoff import unit_random
from actors.core.collect import size
from actors.core.effects import CommandCancel, Effects, Timer, child_start, error_view
from actors.core.effects import template_error as _template_error
from actors.core.envelope import build_envelope, failure_content
from actors.core.retry import after_attempt
from actors.core.state import Activation, Arrival, Execution, Pending
from actors.events import (
    ActivationStatus,
    ArrivalStatus,
    BudgetExceededData,
    CommandCancelledData,
    CommandIssuedData,
    EngineFaultData,
    EventData,
    ExecState,
    ExecutionCancelledData,
    FailureDecidedData,
    FailureRoute,
    IteratorCompletedData,
    IteratorStartedData,
    PlaybookCompletedData,
    PlaybookFailedData,
    PlaybookInitializedData,
    RetryDueData,
    RetryExhaustedData,
    RetryScheduledData,
    RetrySequenceCompletedData,
    RoutingPausedData,
    StepEnterData,
    StepExitData,
    WorkflowCompletedData,
    WorkflowFailedData,
    WorkflowInitializedData,
    make_event,
)
from actors.playbook.loader import PlaybookInvalid, parsed_playbook
from actors.playbook.model import END, UNRENDERED_TOOL_FIELDS, Loop, NoopTool, OnErrorRule, PlaybookTool, Step
from actors.playbook.templates import TemplateError, call_with_limits, names_read, render_condition, render_value
from actors.playbook.tool_render import render_tool, sink_call
from actors.wire import (
    CallDone,
    CallError,
    CancelRequest,
    Command,
    EngineFault,
    ErrorInfo,
    Input,
    IteratorCompleted,
    IteratorFailed,
    LoopCancel,
    LoopSpec,
    StartRecord,
    TimerFired,
)
from streams.ids import attempt_of, child_execution_id, step_command_id
from streams.subjects import ExecSubjects

ON_ERROR_RETRY_DELAY = 60.0  # retry_later without `delay`

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


class _Decision:
    """Builder for one decision's output; holds the cause and log time."""

    def __init__(self, ex: Execution, subjects: ExecSubjects, seq: int, at: float) -> None:
        self.ex = ex
        self.subjects = subjects  # the execution's log: where its commands' results go
        self.out = Effects(cause=seq, at=at)

    def event(self, step: str | None, data: EventData) -> None:
        """An event for the decision record (its type follows from `data`'s)."""
        self.out.events.append(make_event(data, execution_id=self.ex.execution_id, at=self.out.at,
                                          cause=self.out.cause, step=step))

    def lifecycle(self, data: EventData) -> None:
        """A lifecycle event: only these move the execution's status."""
        self.out.lifecycle.append(make_event(data, execution_id=self.ex.execution_id, at=self.out.at,
                                             cause=self.out.cause))

    def later(self, *work: Pending) -> None:
        """Routing to do once the current step is decided, in the order given."""
        self.ex.pending.extend(reversed(work))


def fold(ex: Execution, inp: Input, *, seq: int, at: float, subjects: ExecSubjects) -> Effects:
    # templates are bounded by the execution's limits, fixed in its start record
    limits = inp.limits if isinstance(inp, StartRecord) and ex.status == ExecState.PENDING else ex.limits
    return call_with_limits(limits, lambda: _fold(ex, inp, seq=seq, at=at, subjects=subjects))


def _fold(ex: Execution, inp: Input, *, seq: int, at: float, subjects: ExecSubjects) -> Effects:
    d = _Decision(ex, subjects, seq, at)
    ex.inputs_folded += 1
    if isinstance(inp, StartRecord):
        _start(d, inp)
    elif isinstance(inp, EngineFault):
        _engine_fault(d, inp)
    elif ex.terminal or ex.playbook is None:
        pass  # late results after the end, or inputs before a start: nothing to decide
    elif isinstance(inp, (CallDone, CallError)):
        _call_result(d, inp)
    elif isinstance(inp, CancelRequest):
        _cancel(d, inp)
    elif isinstance(inp, TimerFired):
        _timer_fired(d, inp)
    elif isinstance(inp, (IteratorCompleted, IteratorFailed)):
        _iterator_end(d, inp)
    _route_pending(d)
    return d.out


def _route_pending(d: _Decision) -> None:
    """Do the routing the input set off (and any left by an earlier decision), up to
    ROUTING_SLICE activations."""
    ex = d.ex
    begun = 0
    while ex.pending:
        if ex.terminal:
            ex.pending.clear()  # cancelled, or `end` ran: nothing starts any more
            return
        if begun == ROUTING_SLICE:
            timer_id = f"{RESUME_TIMER}-{d.out.cause}"
            d.event(None, RoutingPausedData(timer_id=timer_id, pending=len(ex.pending)))
            d.out.timers.append(Timer(timer_id, d.out.at, TimerFired(execution_id=ex.execution_id, timer_id=timer_id,
                                                                      due=d.out.at)))
            return
        what, act_id = ex.pending.pop()
        act = ex.activations[act_id]
        if what == "settle":
            _maybe_end(d, act)
        elif act.status == ActivationStatus.RUNNING:  # not cancelled meanwhile (an abort in a sibling branch)
            begun += 1
            _run(d, act)


# --- start ---------------------------------------------------------------------------


def _start(d: _Decision, rec: StartRecord) -> None:
    ex = d.ex
    if ex.status != ExecState.PENDING:
        return  # a second start record for the same id: the first one won
    ex.playbook_path = rec.playbook_path
    ex.playbook_source = rec.playbook_source or ""
    ex.started_at = d.out.at
    ex.parent = rec.parent
    ex.limits = rec.limits
    if rec.error is not None or rec.playbook_source is None:
        _fail_at_start(d, rec.error or ErrorInfo(type="StartError", message="start record carries no playbook"))
        return
    try:
        # the retry ceiling of the record, not of this pod: every pod replays the log alike
        ex.playbook = parsed_playbook(rec.playbook_source, rec.playbook_path, ex.limits.max_attempts)
    except PlaybookInvalid as e:
        _fail_at_start(d, ErrorInfo(type="PlaybookInvalid", message=str(e)))
        return
    ex.workload = deep_merge(ex.playbook.workload, rec.payload)
    ex.status = ExecState.RUNNING
    initialized = PlaybookInitializedData(playbook=ex.playbook_path, version=rec.playbook_version, started_at=d.out.at)
    if rec.parent is not None:
        initialized.parent_execution_id = rec.parent.execution_id
        initialized.parent_step = rec.parent.step
    d.lifecycle(initialized)
    d.lifecycle(WorkflowInitializedData(entry=ex.playbook.entry))
    _enter(d, ex.playbook.entry, from_activation=None)


def _fail_at_start(d: _Decision, error: ErrorInfo) -> None:
    """Fail the execution before its first step: the start record or its playbook is bad."""
    ex = d.ex
    ex.status = ExecState.FAILED
    d.lifecycle(PlaybookFailedData(playbook=ex.playbook_path, started_at=d.out.at, ended_at=d.out.at,
                                   error=execution_error(error, step=None, failed_steps=[])))
    _reply_to_parent(d, result=None, error=ErrorInfo(type="ChildFailed", message=f"child execution {ex.execution_id} "
                                                     f"did not start: {error.message}"))


def _engine_fault(d: _Decision, fault: EngineFault) -> None:
    """The engine could not handle one of this execution's inputs (EngineFault): the
    execution ends FAILED with the error, and whatever runs is stopped as on a cancel."""
    ex = d.ex
    if ex.terminal:
        return
    d.event(None, EngineFaultData(input_seq=fault.input_seq, input_subject=fault.input_subject,
                                  error=error_view(fault.error)))
    for act_id in list(ex.live):
        _cancel_activation(d, ex.activations[act_id], reason=f"engine error: {fault.error.message[:200]}",
                           to_end=False)
    ex.status = ExecState.FAILED
    d.lifecycle(PlaybookFailedData(playbook=ex.playbook_path, started_at=ex.started_at, ended_at=d.out.at,
                                   error=execution_error(fault.error, step=None, failed_steps=list(ex.failed_steps))))
    _reply_to_parent(d, result=None, error=ErrorInfo(
        type="ChildFailed", message=f"child execution {ex.execution_id} failed: {fault.error.message}"))


# --- steps ---------------------------------------------------------------------------


def _enter(d: _Decision, step_name: str, *, from_activation: int | None, failure: dict[str, Any] | None = None) -> None:
    _begin(d, _activate(d, step_name, from_activation=from_activation, failure=failure))


def _activate(d: _Decision, step_name: str, *, from_activation: int | None,
              failure: dict[str, Any] | None = None) -> Activation:
    """A new branch token at `step_name`. Tokens of a fan-out are all made live before
    any of them runs, so a fast first branch cannot find the others missing and start
    `end` early."""
    ex = d.ex
    act = Activation(id=len(ex.activations), step=step_name, from_activation=from_activation, failure=failure)
    ex.activations[act.id] = act
    if step_name == END:
        ex.end_activation = act.id
        d.event(step_name, StepEnterData(activation=act.id, arrivals=[a.step for a in ex.arrivals]))
    else:
        ex.live[act.id] = None
        entered = StepEnterData(activation=act.id, from_activation=from_activation)
        if failure:
            entered.remediates = failure["step"]
        d.event(step_name, entered)
    return act


def _begin(d: _Decision, act: Activation) -> None:
    d.later(("begin", act.id))


def _run(d: _Decision, act: Activation) -> None:
    assert d.ex.playbook is not None
    step = d.ex.playbook.step(act.step)
    if act.step == END:
        _run_end(d, act, step)
    else:
        _dispatch(d, act, step)


def _dispatch(d: _Decision, act: Activation, step: Step) -> None:
    if isinstance(step.tool, NoopTool) and not step.retry and step.loop is None and step.sink is None:
        # A router or a pure data step: its result is its rendered args. Deciding it
        # here saves a command round trip and is just as deterministic.
        try:
            # no args, no scope to build (it copies every result so far)
            args = render_value(step.args, d.ex.scope(act), where="args") if step.args else {}
        except TemplateError as e:
            _apply_failure_rules(d, act, step, _template_error(step.step, e))
            return
        _step_completed(d, act, step, args)
        return
    _issue(d, act, step)


def _issue(d: _Decision, act: Activation, step: Step) -> None:
    """Send the command (or start the child execution, or the loop) for the current
    attempt."""
    ex = d.ex
    if step.loop is not None:
        _start_loop(d, act, step, step.loop)
        return
    scope = ex.scope(act)
    try:
        args = render_value(step.args, scope, where="args")
        tool = render_tool(step, scope)
    except TemplateError as e:
        _apply_failure_rules(d, act, step, _template_error(step.step, e))
        return
    if act.next_args is not None:
        args = deep_merge(args, act.next_args)
    parent = act.command_id
    command_id = step_command_id(act.id, act.attempt)
    act.command_id = command_id
    ex.by_command[command_id] = act.id
    kind = str(tool.pop("kind"))
    act.kind = kind
    issued = CommandIssuedData(activation=act.id, command_id=command_id, kind=kind, attempt_number=act.attempt)
    if act.attempt > 1:
        issued.parent_event_id = parent
    reply_to = d.subjects.result(command_id)
    if isinstance(step.tool, PlaybookTool):
        start = child_start(tool, args, execution_id=ex.execution_id, step=step.step, command_id=command_id,
                            reply_to=reply_to)
        d.out.starts.append(start)
        act.child = issued.child_execution_id = child_execution_id(ex.execution_id, command_id)
        d.event(step.step, issued)
        return
    d.out.commands.append(
        Command(
            execution_id=ex.execution_id,
            command_id=command_id,
            step=step.step,
            kind=kind,
            reply_to=reply_to,
            tool=tool,
            args=args,
            timeout=step.timeout,
            attempt_number=act.attempt,
            sink=sink_call(step, scope),
        )
    )
    d.event(step.step, issued)


# --- loops ---------------------------------------------------------------------------


def _start_loop(d: _Decision, act: Activation, step: Step, loop: Loop) -> None:
    """Render the collection and hand the loop to the counter (one `loop.spec`); the
    iterations never pass through this log, only `iterator.started` and, at the end,
    the counter's verdict."""
    ex = d.ex
    scope = ex.scope(act)
    try:
        collection = render_value(loop.collection, scope, where="loop.collection")
    except TemplateError as e:
        _apply_failure_rules(d, act, step, _template_error(step.step, e))
        return
    if not isinstance(collection, list):
        _apply_failure_rules(d, act, step, ErrorInfo(
            type="LoopCollectionInvalid",
            message=f"step '{step.step}' field loop.collection: must render to a list, got {type(collection).__name__}"
                    f" ({str(collection)[:80]!r})"))
        return
    parent = act.command_id
    loop_id = step_command_id(act.id, act.attempt)  # the loop stands for the step's command
    act.command_id = loop_id
    act.kind = "loop"
    ex.by_command[loop_id] = act.id
    started = IteratorStartedData(
        activation=act.id, loop_id=loop_id, size=len(collection), mode=loop.mode, element=loop.element,
        concurrency=1 if loop.mode == "sequential" else loop.concurrency,
        chunk_size=loop.chunk_size if loop.mode == "chunked" else None,
        tolerated_failures=loop.tolerated_failures, attempt_number=act.attempt)
    if act.attempt > 1:
        started.parent_event_id = parent
    d.event(step.step, started)
    if not collection:
        d.event(step.step, IteratorCompletedData(activation=act.id, loop_id=loop_id, total=0, succeeded=0, failed=0))
        _step_completed(d, act, step, [])
        return
    wanted = _loop_names(step)
    d.out.loops.append(LoopSpec(
        execution_id=ex.execution_id, loop_id=loop_id, step=step.step, playbook_path=ex.playbook_path,
        playbook_source=ex.playbook_source, collection=collection,
        scope={k: v for k, v in scope.items() if k in wanted},
        reply_to=d.subjects.iterator(loop_id), parent_event_id=parent, limits=ex.limits,
    ))


def _loop_names(step: Step) -> set[str]:
    """The names an iteration's templates read (tool, args, retry rules, sink): the
    counter gets just these, not every result of the execution."""
    raw = msgspec.to_builtins(step.tool)
    names = names_read({k: v for k, v in raw.items() if k not in UNRENDERED_TOOL_FIELDS}) | names_read(step.args)
    for rule in step.retry or []:
        names |= names_read(rule.when) | names_read(rule.then.next_call.args if rule.then.next_call else None)
    if step.sink is not None:
        names |= names_read(msgspec.to_builtins(step.sink.tool)) | names_read(step.sink.args)
    return names | {"execution_id", "workload"}


def _iterator_end(d: _Decision, res: IteratorCompleted | IteratorFailed) -> None:
    """The counter's verdict. A failed loop meets the step's on_error and on_failure
    rules (its retry rules were each iteration's own)."""
    ex = d.ex
    assert ex.playbook is not None
    act_id = ex.by_command.get(res.loop_id)
    act = ex.activations.get(act_id) if act_id is not None else None
    if act is None or act.status != ActivationStatus.RUNNING or act.command_id != res.loop_id:
        return  # a verdict delivered twice, or for a loop since cancelled
    step = ex.playbook.step(act.step)
    if isinstance(res, IteratorCompleted):
        _step_completed(d, act, step, res.results if res.results is not None else [])
        return
    first = res.errors[0] if res.errors else None
    detail = f"; first: iteration {first['index']}: {first['error']['type']}: {first['error']['message'][:300]}" if first else ""
    error = ErrorInfo(type="LoopFailed", message=f"step '{step.step}': {res.failed} of {res.total} iterations failed, "
                                                 f"more than the {res.tolerated} tolerated{detail}")
    _apply_failure_rules(d, act, step, error)


def _call_result(d: _Decision, res: CallDone | CallError) -> None:
    ex = d.ex
    assert ex.playbook is not None
    act_id = ex.by_command.get(res.command_id)
    if act_id is None:
        return
    act = ex.activations[act_id]
    if act.status != ActivationStatus.RUNNING or act.command_id != res.command_id:
        return  # a duplicate delivery, or a result for a superseded or cancelled attempt
    step = ex.playbook.step(act.step)
    if act_id == ex.end_activation:
        if isinstance(res, CallDone):
            _finish(d, act, result=res.result, end_error=None)
        else:
            _finish(d, act, result=None, end_error=res.error)
        return
    if isinstance(res, CallError):
        act.errors.append(_summary_line(act.attempt, res.error))  # the retry summary
    if step.retry and _retry(d, act, step, res):
        return
    if isinstance(res, CallDone):
        _step_completed(d, act, step, act.gathered.final(res.result, add=True))
    else:
        _apply_failure_rules(d, act, step, res.error, summarised=True)


# --- retry ---------------------------------------------------------------------------


def _retry(d: _Decision, act: Activation, step: Step, res: CallDone | CallError) -> bool:
    """Evaluate the step's retry rules after an attempt; first match wins. Returns True
    when the rules decided what happens next (another attempt, exhaustion, a failure
    of the rules themselves), False when no rule matched."""
    assert step.retry is not None
    ok = isinstance(res, CallDone)
    result = res.result if isinstance(res, CallDone) else None
    error = error_view(res.error) if isinstance(res, CallError) else None
    scope = d.ex.scope(act)
    scope.update(result=result, response=result, error=error, attempt=act.attempt)
    try:
        after = after_attempt(step.retry, scope, ok=ok, attempt=act.attempt, result=result, gathered=act.gathered,
                              unit=unit_random(d.ex.execution_id, act.id, act.attempt))
    except TemplateError as e:
        _fail_step(d, act, _template_error(step.step, e))
        return True
    verdict = after.verdict
    if verdict is not None:
        act.max_attempts = verdict.policy.max_attempts
    if after.what == "again":
        assert verdict is not None
        if verdict.next_args is not None:
            act.next_args = verdict.next_args
        _next_attempt(d, act, step, delay=verdict.delay, reason="success" if ok else "error", rule=verdict.rule)
    elif after.what == "completed":
        # a collecting sequence ends: at its rule's bound (`bounded`), or when no rule
        # asks for another attempt; the step completes with what it gathered, and says so
        d.event(step.step, RetrySequenceCompletedData(
            activation=act.id, total_attempts=act.attempt, collected_size=size(act.gathered.value),
            bounded=verdict is not None, rule=verdict.rule if verdict is not None else msgspec.UNSET))
        _step_completed(d, act, step, after.result)
    elif after.what == "exhausted":
        assert isinstance(res, CallError) and verdict is not None
        d.event(step.step, RetryExhaustedData(activation=act.id, attempts=act.attempt,
                                              max_attempts=verdict.policy.max_attempts, error=error, rule=verdict.rule))
        _apply_failure_rules(d, act, step, res.error, exhausted=True, summarised=True)
    return after.what != "no_rule"


def _next_attempt(d: _Decision, act: Activation, step: Step, *, delay: float, reason: str, rule: str | None) -> None:
    act.attempt += 1
    due = d.out.at + delay
    d.event(step.step, RetryScheduledData(activation=act.id, attempt_number=act.attempt, delay=delay, due=due,
                                          reason=reason, rule=rule, parent_event_id=act.command_id))
    if delay <= 0:
        _issue(d, act, step)
        return
    timer_id = f"{act.id}-{act.attempt}"
    act.timer_id = timer_id
    d.out.timers.append(Timer(timer_id, due, TimerFired(execution_id=d.ex.execution_id, timer_id=timer_id, due=due)))


def _timer_fired(d: _Decision, fired: TimerFired) -> None:
    ex = d.ex
    assert ex.playbook is not None
    if fired.timer_id.startswith(f"{RESUME_TIMER}-"):
        return  # routing goes on where the last decision paused it (_route_pending)
    head = fired.timer_id.split("-", 1)[0]
    act = ex.activations.get(int(head)) if head.isdigit() else None
    if act is None or act.status != ActivationStatus.RUNNING or act.timer_id != fired.timer_id:
        return  # a timer for an attempt that no longer waits (fired twice, or cancelled)
    act.timer_id = None
    d.event(act.step, RetryDueData(activation=act.id, timer_id=fired.timer_id, due=fired.due,
                                   late_ms=round((d.out.at - fired.due) * 1000, 3)))
    _issue(d, act, ex.playbook.step(act.step))


# --- failure: on_error decisions, on_failure edges --------------------------------------


def _apply_failure_rules(d: _Decision, act: Activation, step: Step, error: ErrorInfo, *, exhausted: bool = False,
                         summarised: bool = False) -> None:
    """A step failed for good: its on_error rules, then its on_failure edges, say what follows.

    No retry rule takes the failure any more. The `on_error` rules say what it means;
    with the default meaning, the `on_failure` edges may route it to remediation
    (`_remediate`); otherwise the step fails unhandled (`_fail_step`). `summarised`: a
    tool's error, already in the retry summary when its result arrived."""
    if not summarised:
        act.errors.append(_summary_line(act.attempt, error))
    if step.on_error:
        decided = _decide_on_error(d, act, step, error)
        if decided is None:
            return  # the rules themselves failed; the step failed naming the rule
        decision = decided.decision
        if decision == "ignore":
            result = None if isinstance(decided.result, UnsetType) else decided.result
            _step_completed(d, act, step, result, ignored_error=error_view(error))
            return
        if decision in ("retry", "retry_later"):
            if act.attempt >= d.ex.limits.max_attempts:
                d.event(step.step, RetryExhaustedData(activation=act.id, attempts=act.attempt,
                                                      max_attempts=d.ex.limits.max_attempts, error=error_view(error),
                                                      rule=decided.rule))
            else:
                if not isinstance(decided.args, UnsetType) and decided.args is not None:
                    act.next_args = decided.args
                delay = 0.0
                if decision == "retry_later" and not isinstance(decided.delay, UnsetType):
                    delay = float(decided.delay or 0.0)
                _next_attempt(d, act, step, delay=delay, reason=f"on_error:{decision}", rule=decided.rule)
                return
        elif decision == "cancel":
            act.status = ActivationStatus.CANCELLED
            d.event(step.step, StepExitData(activation=act.id, status=ActivationStatus.CANCELLED,
                                            error=error_view(error), routed_to_end=True))
            _leave(d, act, [END], status=ArrivalStatus.CANCELLED)
            return
        elif decision == "handled":
            _fail_step(d, act, error, handled=True)
            return
        elif decision == "abort":
            _abort(d, act, step, error)
            return
    if step.on_failure:
        _remediate(d, act, step, error, exhausted=exhausted)
        return
    _fail_step(d, act, error)


def _decide_on_error(d: _Decision, act: Activation, step: Step, error: ErrorInfo) -> FailureDecidedData | None:
    """The first matching on_error rule's decision, rendered, recorded as
    `step.failure_decided`. In a replay the recorded decision is read back, never
    evaluated again."""
    assert step.on_error is not None
    key = (act.id, act.attempt)
    recorded = d.ex.recorded.get(key)
    if recorded is not None:
        d.event(step.step, recorded)
        return recorded
    scope = d.ex.scope(act)
    scope.update(result=None, response=None, error=error_view(error), attempt=act.attempt)
    chosen: tuple[int, OnErrorRule] | None = None
    try:
        for i, rule in enumerate(step.on_error):
            if render_condition(rule.when, scope, where=f"on_error[{i}].when"):
                chosen = (i, rule)
                break
        decided = FailureDecidedData(activation=act.id, attempt_number=act.attempt, error=error_view(error),
                                     decision="none", rule=None)
        if chosen is not None:
            i, rule = chosen
            decided.decision, decided.rule = rule.decision, f"on_error[{i}]"
            if rule.decision == "ignore":
                decided.result = render_value(rule.result, scope, where=f"on_error[{i}].result")
            if rule.args is not None:
                decided.args = render_value(rule.args, scope, where=f"on_error[{i}].args")
            if rule.decision == "retry_later":
                decided.delay = rule.delay if rule.delay is not None else ON_ERROR_RETRY_DELAY
    except TemplateError as e:
        _fail_step(d, act, _template_error(step.step, e))
        return None
    d.event(step.step, decided)
    return decided


def _remediate(d: _Decision, act: Activation, step: Step, error: ErrorInfo, *, exhausted: bool) -> None:
    """Route a failed step to its remediation step: the first on_failure edge that matches.

    Edges are tried in declared order; the failure is then handled, and the remediation
    step gets `failure` in scope. No edge that matches: the step fails unhandled."""
    assert step.on_failure is not None
    ex = d.ex
    if ex.aborted:
        _fail_step(d, act, error, route=FailureRoute(attempted=False, status="skipped_terminal"))
        return
    scope = ex.scope(act)
    scope.update(result=None, response=None, error=error_view(error), attempt=act.attempt)
    target: str | None = None
    edge = ""  # the on_failure edge taken, named once a target is found
    try:
        for i, e in enumerate(step.on_failure):
            if render_condition(e.when, scope, where=f"on_failure[{i}].when"):
                target, edge = e.step, f"on_failure[{i}]"
                break
    except TemplateError as te:
        _fail_step(d, act, _template_error(step.step, te))
        return
    if target is None:
        _fail_step(d, act, error, route=FailureRoute(attempted=True, status="no_route", target=None))
        return
    summary = {"attempts": act.attempt, "max_attempts": act.max_attempts, "exhausted": exhausted,
               "errors": act.errors[-10:]}
    content = failure_content(error=error_view(error), attempt=act.attempt, max_attempts=act.max_attempts,
                              retry_summary=summary)
    text, truncation = build_envelope(
        execution_id=ex.execution_id, target_step=target, source_step=step.step, source_activation=act.id,
        source_attempt=act.attempt, created_at=d.out.at, content=content,
    )
    failure = {"step": step.step, "attempt": act.attempt, "max_attempts": act.max_attempts, "error": error_view(error),
               "retry_summary": summary, "envelope": text, "truncation": truncation, "untrusted_data": True}
    if not _within_budget(d, act, target):
        # the remediation cannot start: the step's failure stays unhandled
        _fail_step(d, act, error, route=FailureRoute(attempted=True, status="step_budget_exceeded", target=target,
                                                     edge=edge))
        return
    act.status = ActivationStatus.FAILED
    route = FailureRoute(attempted=True, status="selected", target=target, edge=edge)
    d.event(step.step, StepExitData(activation=act.id, status=ActivationStatus.FAILED, error=error_view(error),
                                    handled=True, failure_route=route))
    ex.live.pop(act.id, None)
    new = _activate(d, target, from_activation=act.id, failure=failure)
    d.later(("begin", new.id), ("settle", act.id))


def _summary_line(attempt: int, error: ErrorInfo) -> str:
    return f"attempt {attempt}: {error.type}: {error.message[:200]}"


# --- abort and cancellation -----------------------------------------------------------


def _abort(d: _Decision, act: Activation, step: Step, error: ErrorInfo) -> None:
    """Fail the execution now: every other live branch is cancelled (running commands
    stopped, queued ones dropped, timers disarmed, children cancelled) and routed to
    `end`, which then evaluates the workflow as FAILED."""
    d.ex.aborted = True
    _cancel_live(d, reason=f"aborted by step '{step.step}'", keep=act.id)
    _fail_step(d, act, error, aborted=True)


def _cancel_live(d: _Decision, *, reason: str, keep: int) -> None:
    """Cancel every live branch but `keep`, each routed to `end`."""
    for other_id in list(d.ex.live):
        if other_id != keep:
            _cancel_activation(d, d.ex.activations[other_id], reason=reason)


def _cancel_activation(d: _Decision, act: Activation, *, reason: str, to_end: bool = True) -> None:
    ex = d.ex
    if act.status == ActivationStatus.RUNNING and act.command_id is not None and act.timer_id is None:
        d.event(act.step, CommandCancelledData(activation=act.id, command_id=act.command_id, reason=reason))
        if act.kind == "loop":
            d.out.loop_cancels.append(LoopCancel(execution_id=ex.execution_id, loop_id=act.command_id, reason=reason))
        elif act.child is not None:
            d.out.child_cancels.append(act.child)
        elif act.kind is not None:
            d.out.cancels.append(CommandCancel(act.kind, act.command_id))
    act.timer_id = None
    act.status = ActivationStatus.CANCELLED
    ex.live.pop(act.id, None)
    if to_end:
        d.event(act.step, StepExitData(activation=act.id, status=ActivationStatus.CANCELLED, reason=reason,
                                       routed_to_end=True))
        ex.arrivals.append(Arrival(step=act.step, status=ArrivalStatus.CANCELLED, routed_to_end=True))


def _cancel(d: _Decision, req: CancelRequest) -> None:
    ex = d.ex
    running = [a.command_id for a in ex.activations.values() if a.status == ActivationStatus.RUNNING and a.command_id]
    for act_id in list(ex.live):
        _cancel_activation(d, ex.activations[act_id], reason=req.reason or "execution cancelled", to_end=False)
    ex.status = ExecState.CANCELLED
    d.lifecycle(ExecutionCancelledData(playbook=ex.playbook_path, started_at=ex.started_at, ended_at=d.out.at,
                                       reason=req.reason, running_commands=running))
    _reply_to_parent(d, result=None, error=ErrorInfo(type="ChildCancelled",
                                                     message=f"child execution {ex.execution_id} was cancelled: {req.reason}"))


# --- completion and routing -------------------------------------------------------------


def _step_completed(d: _Decision, act: Activation, step: Step, result: Any,
                    *, ignored_error: dict[str, Any] | None = None) -> None:
    """The step completed with `result` (for an `ignore` decision, despite the error it
    records) and routes on. A routing error after an ignored failure fails the step
    directly: it must not re-enter the on_error rules that just decided."""
    try:
        targets = _route(d.ex, act, step, result)
    except TemplateError as e:
        routing_error = _template_error(step.step, e, field="next")
        if ignored_error is None:
            _apply_failure_rules(d, act, step, routing_error)
        else:
            _fail_step(d, act, routing_error)
        return
    act.status = ActivationStatus.COMPLETED
    d.ex.results[step.step] = result
    completed = StepExitData(activation=act.id, status=ActivationStatus.COMPLETED, next=targets)
    if ignored_error is not None:
        completed.ignored_error = ignored_error
    d.event(step.step, completed)
    _leave(d, act, targets, status=ArrivalStatus.COMPLETED)


def _route(ex: Execution, act: Activation, step: Step, result: Any) -> list[str]:
    if step.next is None:
        return [END]
    scope: dict[str, Any] | None = None  # built for the first condition: it copies every result so far
    for i, rule in enumerate(step.next):
        if rule.when is not None:
            if scope is None:
                scope = ex.scope(act)
                scope.update(result=result, response=result, error=None, attempt=act.attempt)
            if not render_condition(rule.when, scope, where=f"next[{i}].when"):
                continue
        return list(rule.then) or [END]
    return [END]  # no rule matched: the branch converges at end


def _fail_step(d: _Decision, act: Activation, error: ErrorInfo, *, handled: bool = False, aborted: bool = False,
              route: FailureRoute | None = None) -> None:
    """End the step FAILED and send its branch to `end`, consulting no further rule.

    Unless handled, the failure fails the workflow when `end` evaluates it."""
    ex = d.ex
    act.status = ActivationStatus.FAILED
    if not handled:
        _unhandled(ex, act.step, error)
    failed = StepExitData(activation=act.id, status=ActivationStatus.FAILED, error=error_view(error),
                          routed_to_end=True, original_failed_step=act.step)
    if handled:
        failed.handled = True
    if aborted:
        failed.aborted = True
    if route is not None:
        failed.failure_route = route
    d.event(act.step, failed)
    _leave(d, act, [END], status=ArrivalStatus.HANDLED if handled else ArrivalStatus.FAILED)


def _leave(d: _Decision, act: Activation, targets: list[str], *, status: ArrivalStatus) -> None:
    """The branch token of `act` moves on: into new activations, or to `end`. The new
    activations start after this decision's current step (see ROUTING_SLICE), then
    `end` is considered."""
    ex = d.ex
    ex.live.pop(act.id, None)
    fresh = []
    for target in targets:
        if target == END:
            ex.arrivals.append(Arrival(step=act.step, status=status, routed_to_end=status != ArrivalStatus.COMPLETED))
        elif _within_budget(d, act, target):
            fresh.append(_activate(d, target, from_activation=act.id))
    d.later(*(("begin", new.id) for new in fresh), ("settle", act.id))


def _within_budget(d: _Decision, source: Activation, target: str) -> bool:
    """May `source` route into one more activation (of `target`)? Past the step budget
    the execution fails as an abort would: the other live branches are cancelled, no
    further step starts, `end` evaluates it FAILED with `StepBudgetExceeded`."""
    ex = d.ex
    budget = ex.step_budget
    if len(ex.activations) < budget:
        return True
    if ex.aborted:
        return False  # already failing (this budget, or an abort): nothing new starts
    error = ErrorInfo(type="StepBudgetExceeded",
                      message=f"the execution has entered {budget} steps, its budget: step '{target}' (routed from "
                              f"'{source.step}') is not entered (budget: the smaller of the playbook's "
                              f"limits.max_steps and the pod's ACTORS_MAX_STEPS)")
    d.event(target, BudgetExceededData(from_activation=source.id, budget=budget, error=error_view(error)))
    ex.aborted = True
    _cancel_live(d, reason=f"step budget of {budget} exceeded", keep=source.id)
    _unhandled(ex, target, error)
    ex.arrivals.append(Arrival(step=target, status=ArrivalStatus.FAILED, routed_to_end=True))
    return False


def _unhandled(ex: Execution, step: str, error: ErrorInfo) -> None:
    """A failure that fails the workflow; the first one is the execution's root cause."""
    ex.failed_steps.append(step)
    if ex.root_failure is None:
        ex.root_failure = (step, error)


def _maybe_end(d: _Decision, act: Activation) -> None:
    ex = d.ex
    if not ex.live and ex.end_activation is None and not ex.terminal:
        _begin(d, _activate(d, END, from_activation=act.id))


# --- end -----------------------------------------------------------------------------


def _run_end(d: _Decision, act: Activation, step: Step) -> None:
    ex = d.ex
    if isinstance(step.tool, NoopTool):
        if step.args:
            try:
                result = render_value(step.args, ex.scope(), where="args")
            except TemplateError as e:
                _finish(d, act, result=None, end_error=_template_error(END, e))
                return
        else:
            result = {a.step: ex.results.get(a.step) for a in ex.arrivals}
        _finish(d, act, result=result, end_error=None)
        return
    ex.live[act.id] = None
    _issue(d, act, step)


def _finish(d: _Decision, act: Activation, *, result: Any, end_error: ErrorInfo | None) -> None:
    ex = d.ex
    ex.live.pop(act.id, None)
    act.status = ActivationStatus.FAILED if end_error else ActivationStatus.COMPLETED
    if end_error is None:
        ex.results[END] = result
    exited = StepExitData(activation=act.id, status=act.status)
    if end_error:
        exited.error = error_view(end_error)
    d.event(END, exited)
    failed = list(ex.failed_steps) + ([END] if end_error else [])
    total_steps = len({a.step for a in ex.activations.values()})
    handled_failures = [a.step for a in ex.arrivals if a.status == ArrivalStatus.HANDLED]
    cancelled_steps = [a.step for a in ex.arrivals if a.status == ArrivalStatus.CANCELLED]
    if failed:
        ex.status = ExecState.FAILED
        root_step, root = ex.root_failure or (END, end_error)
        assert root is not None
        d.lifecycle(WorkflowFailedData(
            failed_steps=failed, evaluated_by_end_step=True, total_steps=total_steps, failed_steps_count=len(failed),
            handled_failures=handled_failures, cancelled_steps=cancelled_steps))
        d.lifecycle(PlaybookFailedData(
            playbook=ex.playbook_path, started_at=ex.started_at, ended_at=d.out.at,
            error=execution_error(root, step=root_step, failed_steps=failed), failed_steps=failed, result=result,
            evaluated_by_end_step=True, total_steps=total_steps, failed_steps_count=len(failed),
            handled_failures=handled_failures, cancelled_steps=cancelled_steps))
        _reply_to_parent(d, result=None, error=ErrorInfo(
            type="ChildFailed",
            message=f"child execution {ex.execution_id} failed at step '{root_step}': {root.type}: {root.message}"))
    else:
        ex.status = ExecState.COMPLETED
        d.lifecycle(WorkflowCompletedData(
            evaluated_by_end_step=True, total_steps=total_steps, failed_steps_count=len(failed),
            handled_failures=handled_failures, cancelled_steps=cancelled_steps))
        d.lifecycle(PlaybookCompletedData(
            playbook=ex.playbook_path, started_at=ex.started_at, ended_at=d.out.at, result=result,
            evaluated_by_end_step=True, total_steps=total_steps, failed_steps_count=len(failed),
            handled_failures=handled_failures, cancelled_steps=cancelled_steps))
        _reply_to_parent(d, result=result, error=None)


def _reply_to_parent(d: _Decision, *, result: Any, error: ErrorInfo | None) -> None:
    """A child execution reports its end to its parent as the result of the parent's
    command: the parent's step inherits the child's status."""
    parent = d.ex.parent
    if parent is None or not parent.reply_to or not parent.command_id or not parent.step:
        return
    attempt = attempt_of(parent.command_id)
    worker = f"execution:{d.ex.execution_id}"
    msg: CallDone | CallError
    if error is not None:
        msg = CallError(execution_id=parent.execution_id, command_id=parent.command_id, step=parent.step,
                        error=error, attempt_number=attempt, worker=worker)
    else:
        msg = CallDone(execution_id=parent.execution_id, command_id=parent.command_id, step=parent.step,
                       attempt_number=attempt, result=result, worker=worker)
    d.out.reply = (parent.reply_to, msg)


# --- helpers -------------------------------------------------------------------------


def execution_error(root: ErrorInfo, *, step: str | None, failed_steps: list[str]) -> dict[str, Any]:
    """A failed execution's error, as `playbook.failed` carries it (and the status, which
    copies it): the root cause, the first unhandled failure (its step; none when the
    execution could not start), and every failed step beside it. The root's traceback
    stays on its step's events."""
    return {"type": root.type, "message": root.message, "step": step, "failed_steps": failed_steps,
            "retryable": root.retryable, "status": root.status}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """The start payload over the playbook's workload: mappings merge, the rest replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
