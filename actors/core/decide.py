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
* a failed step routes to `end` with `routed_to_end` (no on_error/on_failure yet:
  those arrive with the failure-semantics issue);
* `end` runs once, when every live branch has reached it; it evaluates the workflow:
  FAILED if any failure is unhandled; then `workflow.*` and `playbook.*`;
* only lifecycle events carry execution status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.core.backoff import DEFAULT_ERROR_DELAY, retry_delay, unit_random
from actors.core.state import Activation, Arrival, Execution
from actors.playbook.loader import PlaybookInvalid, load_playbook
from actors.playbook.model import END, UNRENDERED_TOOL_FIELDS, NoopTool, PlaybookTool, Step
from actors.playbook.templates import TemplateError, render_condition, render_value
from actors.wire import (
    CallDone,
    CallError,
    CancelRequest,
    Command,
    ErrorInfo,
    Event,
    Input,
    StartRecord,
    TimerFired,
)

# Lifecycle event types: the only events that decide an execution's status.
PLAYBOOK_INITIALIZED = "playbook.initialized"
WORKFLOW_INITIALIZED = "workflow.initialized"
WORKFLOW_COMPLETED = "workflow.completed"
WORKFLOW_FAILED = "workflow.failed"
PLAYBOOK_COMPLETED = "playbook.completed"
PLAYBOOK_FAILED = "playbook.failed"
EXECUTION_CANCELLED = "execution.cancelled"


_NOT_YET = ("loop", "sink", "on_error", "on_failure")


@dataclass(slots=True)
class Timer:
    """A durable timer to arm: when `due` (epoch seconds) comes, `fire` is delivered to
    the execution as an input."""

    timer_id: str
    due: float
    fire: TimerFired


@dataclass(slots=True)
class Output:
    cause: int
    at: float
    events: list[Event] = field(default_factory=list)
    lifecycle: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.events or self.lifecycle or self.commands or self.timers)


class _Decision:
    """Builder for one decision's output; holds the cause and log time."""

    def __init__(self, ex: Execution, reply_to: str, seq: int, at: float) -> None:
        self.ex = ex
        self.reply_to = reply_to
        self.out = Output(cause=seq, at=at)

    def event(self, type_: str, step: str | None = None, **data: Any) -> None:
        self.out.events.append(
            Event(type=type_, execution_id=self.ex.execution_id, at=self.out.at, cause=self.out.cause, step=step, data=data)
        )

    def lifecycle(self, type_: str, **data: Any) -> None:
        self.out.lifecycle.append(
            Event(type=type_, execution_id=self.ex.execution_id, at=self.out.at, cause=self.out.cause, data=data)
        )


def fold(ex: Execution, inp: Input, *, seq: int, at: float, reply_to: str) -> Output:
    d = _Decision(ex, reply_to, seq, at)
    ex.inputs_folded += 1
    if isinstance(inp, StartRecord):
        _start(d, inp)
    elif ex.terminal or ex.playbook is None:
        pass  # late results after the end, or inputs before a start: nothing to decide
    elif isinstance(inp, (CallDone, CallError)):
        _call_result(d, inp)
    elif isinstance(inp, CancelRequest):
        _cancel(d, inp)
    elif isinstance(inp, TimerFired):
        _timer_fired(d, inp)
    return d.out


# --- start ---------------------------------------------------------------------------


def _start(d: _Decision, rec: StartRecord) -> None:
    ex = d.ex
    if ex.status != "PENDING":
        return  # a second start record for the same id: the first one won
    ex.playbook_path = rec.playbook_path
    ex.started_at = d.out.at
    if rec.error is not None or rec.playbook_source is None:
        err = rec.error or ErrorInfo(type="StartError", message="start record carries no playbook")
        _fail_execution(d, err)
        return
    try:
        ex.playbook = load_playbook(rec.playbook_source, file=rec.playbook_path)
    except PlaybookInvalid as e:
        _fail_execution(d, ErrorInfo(type="PlaybookInvalid", message=str(e)))
        return
    ex.workload = deep_merge(ex.playbook.workload, rec.payload)
    ex.status = "RUNNING"
    meta = {"playbook": ex.playbook_path, "version": rec.playbook_version, "started_at": d.out.at}
    if rec.parent is not None:
        meta["parent_execution_id"] = rec.parent.execution_id
        meta["parent_step"] = rec.parent.step
    d.lifecycle(PLAYBOOK_INITIALIZED, **meta)
    d.lifecycle(WORKFLOW_INITIALIZED, entry=ex.playbook.entry)
    _enter(d, ex.playbook.entry, from_activation=None)


def _fail_execution(d: _Decision, err: ErrorInfo) -> None:
    """The execution cannot run at all (bad start): it fails at once, visibly."""
    ex = d.ex
    ex.status = "FAILED"
    d.lifecycle(PLAYBOOK_FAILED, playbook=ex.playbook_path, started_at=d.out.at, ended_at=d.out.at, error=_err(err))


# --- steps ---------------------------------------------------------------------------


def _enter(d: _Decision, step_name: str, *, from_activation: int | None) -> None:
    _begin(d, _activate(d, step_name, from_activation=from_activation))


def _activate(d: _Decision, step_name: str, *, from_activation: int | None) -> Activation:
    """A new branch token at `step_name`. Tokens of a fan-out are all made live before
    any of them runs, so a fast first branch cannot find the others missing and start
    `end` early."""
    ex = d.ex
    act = Activation(id=len(ex.activations), step=step_name, from_activation=from_activation)
    ex.activations[act.id] = act
    if step_name == END:
        ex.end_activation = act.id
        d.event("step.enter", step_name, activation=act.id, arrivals=[a.step for a in ex.arrivals])
    else:
        ex.live[act.id] = None
        d.event("step.enter", step_name, activation=act.id, from_activation=from_activation)
    return act


def _begin(d: _Decision, act: Activation) -> None:
    assert d.ex.playbook is not None
    step = d.ex.playbook.step(act.step)
    if act.step == END:
        _run_end(d, act, step)
    else:
        _dispatch(d, act, step)


def _dispatch(d: _Decision, act: Activation, step: Step) -> None:
    ex = d.ex
    scope = ex.scope()
    where = f"step '{step.step}'"
    pending = [f for f in _NOT_YET if getattr(step, f) is not None]
    if pending:
        # parsed and validated, but not executed yet: fail loudly rather than ignore
        _step_failed(d, act, ErrorInfo(type="NotSupported", message=f"{where} field {pending[0]}: not executed yet"))
        return
    if isinstance(step.tool, PlaybookTool):
        _step_failed(d, act, ErrorInfo(type="NotSupported", message=f"{where}: tool kind `playbook` is not executed yet"))
        return
    if isinstance(step.tool, NoopTool) and not step.retry:
        # A router or a pure data step: its result is its rendered args. Deciding it
        # here saves a command round trip and is just as deterministic.
        try:
            args = render_value(step.args, scope, where="args")
        except TemplateError as e:
            _step_failed(d, act, ErrorInfo(type="TemplateError", message=f"{where} field {e}"))
            return
        _step_completed(d, act, step, args)
        return
    _issue(d, act, step)


def _issue(d: _Decision, act: Activation, step: Step) -> None:
    """Send the command for the activation's current attempt."""
    ex = d.ex
    scope = ex.scope()
    try:
        args = render_value(step.args, scope, where="args")
        tool = _render_tool(step, scope)
    except TemplateError as e:
        _step_failed(d, act, ErrorInfo(type="TemplateError", message=f"step '{step.step}' field {e}"))
        return
    if act.next_args is not None:
        args = deep_merge(args, act.next_args)
    parent = act.command_id
    command_id = f"{act.id}-{act.attempt}"  # a subject token: no dots
    act.command_id = command_id
    ex.by_command[command_id] = act.id
    kind = str(tool.pop("kind"))
    d.out.commands.append(
        Command(
            execution_id=ex.execution_id,
            command_id=command_id,
            step=step.step,
            kind=kind,
            reply_to=f"{d.reply_to}.{command_id}",
            tool=tool,
            args=args,
            timeout=step.timeout,
            attempt_number=act.attempt,
        )
    )
    link = {"parent_event_id": parent} if act.attempt > 1 else {}
    d.event("command.issued", step.step, activation=act.id, command_id=command_id, kind=kind,
            attempt_number=act.attempt, **link)


def _render_tool(step: Step, scope: dict[str, Any]) -> dict[str, Any]:
    import msgspec

    raw = msgspec.to_builtins(step.tool)
    return {
        k: (v if k in UNRENDERED_TOOL_FIELDS else render_value(v, scope, where=f"tool.{k}")) for k, v in raw.items()
    }


def _call_result(d: _Decision, res: CallDone | CallError) -> None:
    ex = d.ex
    assert ex.playbook is not None
    act_id = ex.by_command.get(res.command_id)
    if act_id is None:
        return
    act = ex.activations[act_id]
    if act.status != "RUNNING" or act.command_id != res.command_id:
        return  # a duplicate delivery, or a result for a superseded attempt
    step = ex.playbook.step(act.step)
    if act_id == ex.end_activation:
        if isinstance(res, CallDone):
            _finish(d, act, result=res.result, end_error=None)
        else:
            _finish(d, act, result=None, end_error=res.error)
        return
    if step.retry and _retry(d, act, step, res):
        return
    if isinstance(res, CallDone):
        _step_completed(d, act, step, _collected_result(act, res.result))
    else:
        _step_failed(d, act, res.error)


# --- retry ---------------------------------------------------------------------------


def _retry(d: _Decision, act: Activation, step: Step, res: CallDone | CallError) -> bool:
    """Evaluate the step's retry rules after an attempt; first match wins. Returns True
    when the rules decided what happens next (another attempt, exhaustion, a failure
    of the rules themselves), False when no rule matched."""
    assert step.retry is not None
    ok = isinstance(res, CallDone)
    result = res.result if isinstance(res, CallDone) else None
    error = _err(res.error) if isinstance(res, CallError) else None
    scope = d.ex.scope()
    scope.update(result=result, response=result, error=error, attempt=act.attempt)
    for i, rule in enumerate(step.retry):
        where = f"retry[{i}]"
        try:
            matched = render_condition(rule.when, scope, where=f"{where}.when")
        except TemplateError as e:
            _step_failed(d, act, ErrorInfo(type="TemplateError", message=f"step '{step.step}' field {e}"))
            return True
        if not matched:
            continue
        policy = rule.then
        if ok and policy.collect is not None:
            act.collect = policy.collect
            act.collected = collect(act.collected, result, policy.collect.strategy, policy.collect.path)
        if act.attempt >= policy.max_attempts:
            if ok:
                # a continuation (pagination, polling) that hit its bound: the step
                # completes with what it gathered, and says so
                final = _collected_result(act, result, already=True)
                d.event("retry_sequence.completed", step.step, activation=act.id, total_attempts=act.attempt,
                        collected_size=_size(act.collected), bounded=True, rule=where)
                _step_completed(d, act, step, final)
            else:
                d.event("retry.exhausted", step.step, activation=act.id, attempts=act.attempt,
                        max_attempts=policy.max_attempts, error=error, rule=where)
                _step_failed(d, act, res.error if isinstance(res, CallError) else _unknown())
            return True
        if ok and policy.next_call is not None:
            try:
                act.next_args = render_value(policy.next_call.args, scope, where=f"{where}.then.next_call.args")
            except TemplateError as e:
                _step_failed(d, act, ErrorInfo(type="TemplateError", message=f"step '{step.step}' field {e}"))
                return True
        initial = policy.initial_delay
        if initial is None:
            initial = DEFAULT_ERROR_DELAY if not ok else 0.0
        delay = retry_delay(
            backoff=policy.backoff, jitter=policy.jitter, attempt=act.attempt, initial=initial,
            factor=policy.factor, max_delay=policy.max_delay,
            unit=unit_random(d.ex.execution_id, act.id, act.attempt),
        )
        _next_attempt(d, act, step, delay=delay, reason="success" if ok else "error", rule=where)
        return True
    if ok and act.collect is not None:
        final = _collected_result(act, result)
        d.event("retry_sequence.completed", step.step, activation=act.id, total_attempts=act.attempt,
                collected_size=_size(act.collected), bounded=False)
        _step_completed(d, act, step, final)
        return True
    return False


def _next_attempt(d: _Decision, act: Activation, step: Step, *, delay: float, reason: str, rule: str) -> None:
    act.attempt += 1
    due = d.out.at + delay
    d.event("retry.scheduled", step.step, activation=act.id, attempt_number=act.attempt, delay=delay, due=due,
            reason=reason, rule=rule, parent_event_id=act.command_id)
    if delay <= 0:
        _issue(d, act, step)
        return
    timer_id = f"{act.id}-{act.attempt}"
    act.timer_id = timer_id
    d.out.timers.append(Timer(timer_id, due, TimerFired(execution_id=d.ex.execution_id, timer_id=timer_id, due=due)))


def _timer_fired(d: _Decision, fired: TimerFired) -> None:
    ex = d.ex
    assert ex.playbook is not None
    act_id = int(fired.timer_id.split("-", 1)[0]) if fired.timer_id.split("-", 1)[0].isdigit() else -1
    act = ex.activations.get(act_id)
    if act is None or act.status != "RUNNING" or act.timer_id != fired.timer_id:
        return  # a timer for an attempt that no longer waits (fired twice, or cancelled)
    act.timer_id = None
    d.event("retry.due", act.step, activation=act.id, timer_id=fired.timer_id, due=fired.due,
            late_ms=round((d.out.at - fired.due) * 1000, 3))
    _issue(d, act, ex.playbook.step(act.step))


def _collected_result(act: Activation, result: Any, *, already: bool = False) -> Any:
    """The step's result when a retry rule collected: the last attempt's result with the
    value at `path` replaced by the accumulation (the whole accumulation without path)."""
    if act.collect is None:
        return result
    if not already:
        act.collected = collect(act.collected, result, act.collect.strategy, act.collect.path)
    if act.collect.path is None:
        return act.collected
    return _set_path(result, act.collect.path, act.collected)


def collect(acc: Any, result: Any, strategy: str, path: str | None) -> Any:
    """Accumulate one attempt's value (at `path`) into `acc`."""
    value = _get_path(result, path) if path else result
    if strategy == "replace":
        return value
    if strategy == "merge":
        merged = dict(acc) if isinstance(acc, dict) else {}
        if isinstance(value, dict):
            merged.update(value)
        return merged
    items = list(acc) if isinstance(acc, list) else []
    if path is not None and isinstance(value, list):
        items.extend(value)
    else:
        items.append(value)
    return items


def _get_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.lstrip("-").isdigit():
            obj = obj[int(part)] if -len(obj) <= int(part) < len(obj) else None
        else:
            return None
    return obj


def _set_path(obj: Any, path: str, value: Any) -> Any:
    if not isinstance(obj, dict):
        return {path: value} if "." not in path else obj
    head, _, rest = path.partition(".")
    out = dict(obj)
    out[head] = _set_path(obj.get(head), rest, value) if rest else value
    return out


def _size(collected: Any) -> int:
    return len(collected) if isinstance(collected, (list, dict)) else (0 if collected is None else 1)


def _unknown() -> ErrorInfo:
    return ErrorInfo(type="RetryExhausted", message="retry bound reached")


def _step_completed(d: _Decision, act: Activation, step: Step, result: Any) -> None:
    ex = d.ex
    scope = ex.scope()
    scope.update(result=result, response=result, error=None, attempt=act.attempt)
    try:
        targets = _route(step, scope)
    except TemplateError as e:
        _step_failed(d, act, ErrorInfo(type="TemplateError", message=f"step '{step.step}' field next: {e}"))
        return
    act.status = "COMPLETED"
    ex.results[step.step] = result
    d.event("step.exit", step.step, activation=act.id, status="COMPLETED", next=targets)
    _leave(d, act, targets, status="COMPLETED")


def _route(step: Step, scope: dict[str, Any]) -> list[str]:
    if step.next is None:
        return [END]
    for i, rule in enumerate(step.next):
        if render_condition(rule.when, scope, where=f"next[{i}].when"):
            return list(rule.then) or [END]
    return [END]  # no rule matched: the branch converges at end


def _step_failed(d: _Decision, act: Activation, error: ErrorInfo) -> None:
    ex = d.ex
    act.status = "FAILED"
    ex.failed_steps.append(act.step)
    d.event(
        "step.exit",
        act.step,
        activation=act.id,
        status="FAILED",
        error=_err(error),
        routed_to_end=True,
        original_failed_step=act.step,
    )
    _leave(d, act, [END], status="FAILED")


def _leave(d: _Decision, act: Activation, targets: list[str], *, status: str) -> None:
    """The branch token of `act` moves on: into new activations, or to `end`."""
    ex = d.ex
    ex.live.pop(act.id, None)
    fresh = []
    for target in targets:
        if target == END:
            ex.arrivals.append(Arrival(step=act.step, status=status, routed_to_end=status == "FAILED"))
        else:
            fresh.append(_activate(d, target, from_activation=act.id))
    for new in fresh:
        if not ex.terminal:
            _begin(d, new)
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
                _finish(d, act, result=None, end_error=ErrorInfo(type="TemplateError", message=f"step 'end' field {e}"))
                return
        else:
            result = {a.step: ex.results.get(a.step) for a in ex.arrivals}
        _finish(d, act, result=result, end_error=None)
        return
    ex.live[act.id] = None
    _dispatch(d, act, step)


def _finish(d: _Decision, act: Activation, *, result: Any, end_error: ErrorInfo | None) -> None:
    ex = d.ex
    ex.live.pop(act.id, None)
    act.status = "FAILED" if end_error else "COMPLETED"
    if end_error is None:
        ex.results[END] = result
    d.event("step.exit", END, activation=act.id, status=act.status, **({"error": _err(end_error)} if end_error else {}))
    failed = list(ex.failed_steps) + ([END] if end_error else [])
    meta = {
        "evaluated_by_end_step": True,
        "total_steps": len({a.step for a in ex.activations.values()}),
        "failed_steps_count": len(failed),
    }
    if failed:
        ex.status = "FAILED"
        error = end_error or ErrorInfo(type="StepFailed", message=f"failed steps: {', '.join(failed)}")
        d.lifecycle(WORKFLOW_FAILED, failed_steps=failed, **meta)
        d.lifecycle(
            PLAYBOOK_FAILED,
            playbook=ex.playbook_path,
            started_at=ex.started_at,
            ended_at=d.out.at,
            error=_err(error),
            failed_steps=failed,
            result=result,
            **meta,
        )
    else:
        ex.status = "COMPLETED"
        d.lifecycle(WORKFLOW_COMPLETED, **meta)
        d.lifecycle(
            PLAYBOOK_COMPLETED, playbook=ex.playbook_path, started_at=ex.started_at, ended_at=d.out.at, result=result, **meta
        )


# --- cancel --------------------------------------------------------------------------


def _cancel(d: _Decision, req: CancelRequest) -> None:
    ex = d.ex
    ex.status = "CANCELLED"
    running = [a.command_id for a in ex.activations.values() if a.status == "RUNNING" and a.command_id]
    for act_id in list(ex.live):
        ex.live.pop(act_id)
    d.lifecycle(
        EXECUTION_CANCELLED,
        playbook=ex.playbook_path,
        started_at=ex.started_at,
        ended_at=d.out.at,
        reason=req.reason,
        running_commands=running,
    )


# --- helpers -------------------------------------------------------------------------


def _err(e: ErrorInfo) -> dict[str, Any]:
    """The error as templates and events see it: every field present, so a rule can
    read `error.status` or `error.retryable` whatever the error was."""
    return {"type": e.type, "message": e.message, "retryable": e.retryable, "status": e.status, "traceback": e.traceback}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """The start payload over the playbook's workload: mappings merge, the rest replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
