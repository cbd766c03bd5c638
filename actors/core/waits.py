"""Waits: steps that wait for a signal or a date (`tool: wait`), and the signals an
execution keeps for them (docs/language.md "Waiting: signals, approvals and timers").

A wait step is decided here, never sent to a tool actor. Each attempt renders its
`key` and `until`, then takes the first kept signal that matches (same name and key,
`when` holds), else waits: `step.waiting`, and a durable timer for its deadline (the
earlier of `until` and the step's `timeout` from now) when it has one. A signal
(`SignalSent`, an input like any other) ends the first wait it matches; one nothing
matches is kept in the mailbox (`signal.kept`), in arrival order, up to
`MAILBOX_LIMIT` (then `signal.dropped`). The deadline's timer fails a signal wait with
`WaitTimeout`, or completes a timer to a date; either way the result goes through the
step's retry rules as a command's would (`failure.after_result`). A loop of waits is
the counter's (actors/core/loop.py): the kept signals of its name are forwarded to its
log right after its spec, one message each (never inside the spec: a few large ones
would exceed the max message size), and each later one as it comes while it runs.

Signals come from outside: no signal can fail a step. A `when` that cannot be
evaluated for a signal (its data is not what the condition expects) means that signal
does not match; the mailbox is bounded by count and by the bytes of what it holds.

Whenever the set of waits changes, the decision ends with the lifecycle event
`execution.waiting` listing them (`announce`): a plain workflow never has one, and pays
one flag test per decision for it.

What this module decides is returned as a value (actors/core/attempt.py) for
actors/core/work.py `settle` to apply, as failure.py's is: no import of work.py here.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from actors.core import failure
from actors.core.attempt import Fail, Outcome
from actors.core.decision import Decision
from actors.core.effects import SignalForward, Timer
from actors.core.effects import template_error as _template_error
from actors.core.state import Activation, Wait
from actors.playbook.model import Playbook, Step, WaitTool
from actors.playbook.templates import TemplateError, names_read, render_condition, render_value
from actors.playbook.until import UntilInvalid, iso_utc, parse_until
from actors.playbook.waits import approval_result, rejection, signal_bytes, signal_key, signal_view
from actors.wire.events import (
    ActivationStatus,
    ExecutionWaitingData,
    SignalDroppedData,
    SignalForwardedData,
    SignalKeptData,
    SignalReceivedData,
    StepWaitingData,
    WaitEndedData,
    WaitEntry,
)
from actors.wire.messages import CallDone, CallError, ErrorInfo, SignalSent, TimerFired

MAILBOX_LIMIT = 1000  # signals kept per execution; past it a signal is dropped, saying so
# bytes of kept signals' data per execution (the engine holds them in memory, and a replay
# rebuilds them): past it a signal is dropped too, saying so
MAILBOX_BYTES = 4 << 20
WAIT_TIMER = "-wait"  # a wait's timer id: `<activation>-<attempt>-wait` (a retry's is `<activation>-<attempt>`)
WAITS_SEMANTICS = 3  # the engine semantics wait steps need (actors/core/replay.py SEMANTICS)

# what the fold applies next: the activation, its step, and what follows for it
Next = tuple[Activation, Step, Outcome]


def has_waits(playbook: Playbook) -> bool:
    return any(isinstance(s.tool, WaitTool) for s in playbook.workflow)


def too_old(playbook: Playbook, semantics: int) -> ErrorInfo | None:
    """A playbook with wait steps, in an execution stamped with semantics before waits
    (an engine pod of an older version was live when it started): it cannot run."""
    if semantics >= WAITS_SEMANTICS or not has_waits(playbook):
        return None
    return ErrorInfo(
        type="PlaybookInvalid",
        message=f"wait steps (`tool: wait`) need engine semantics {WAITS_SEMANTICS}: this execution "
        f"started under semantics {semantics} (an engine pod of an older version was live); "
        f"start it again once every engine pod runs this version",
    )


def is_wait_timer(timer_id: str) -> bool:
    return timer_id.endswith(WAIT_TIMER)


# --- a wait step's attempt --------------------------------------------------------------


def begin(decision: Decision, act: Activation, step: Step, tool: WaitTool) -> Outcome:
    """A wait step's attempt starts: take a kept signal, or wait (or end at once: an
    `until` already past)."""
    ex = decision.ex
    scope = ex.scope(act)
    try:
        key = signal_key(render_value(tool.key, scope, where="tool.key", step=step.step)) if tool.key else ""
        raw_until = render_value(tool.until, scope, where="tool.until", step=step.step) if tool.until else None
    except TemplateError as e:
        return Fail(_template_error(step.step, e))
    until: float | None = None
    if raw_until is not None:
        try:
            until = parse_until(raw_until, tool.zone)
        except UntilInvalid as e:
            return Fail(ErrorInfo(type="WaitInvalid", message=f"step '{step.step}' field tool.until: {e}"))
    at = decision.out.at
    if tool.signal is not None:
        index = _kept_match(ex.mailbox, tool, key, scope, step.step)
        if index is not None:
            taken = ex.mailbox.pop(index)
            ex.mailbox_bytes -= signal_bytes(taken)
            return _taken(decision, act, step, tool, taken, kept=True)
    deadline = until
    if step.timeout is not None:
        deadline = min(at + step.timeout, deadline) if deadline is not None else at + step.timeout
    timer_id = f"{act.id}-{act.attempt}{WAIT_TIMER}" if deadline is not None else None
    wait = Wait(
        activation=act.id,
        step=step.step,
        since=at,
        signal=tool.signal,
        key=key,
        until=until,
        deadline=deadline,
        timer_id=timer_id,
        approval=tool.approval,
    )
    if deadline is not None and timer_id is not None and deadline <= at:
        # already past: ends now, as if its timer had fired
        decision.event(step.step, _ended(wait, timer_id, deadline, at))
        return _expired(decision, act, step, wait)
    decision.event(
        step.step,
        StepWaitingData(
            activation=act.id,
            attempt_number=act.attempt,
            signal=tool.signal,
            key=key,
            deadline=deadline,
            timer_id=timer_id,
            approval=True if tool.approval else UNSET,
        ),
    )
    _add(decision, wait)
    if deadline is not None and timer_id is not None:
        decision.out.timers.append(
            Timer(timer_id, deadline, TimerFired(execution_id=ex.execution_id, timer_id=timer_id, due=deadline))
        )
    return None


def _holds(tool: WaitTool, sig: SignalSent, scope: dict[str, Any], step: str) -> tuple[bool, str | None]:
    """Whether the wait's `when` holds for `sig`, and why not when it cannot be
    evaluated for it (a string compared with a number: the sender's data, not the
    step, is at fault): then it does not match, and no sender can fail the step."""
    if tool.when is None:
        return True, None
    try:
        return render_condition(tool.when, {**scope, "signal": signal_view(sig)}, where="tool.when", step=step), None
    except TemplateError as e:
        return False, str(e)


def _kept_match(mailbox: list[SignalSent], tool: WaitTool, key: str, scope: dict[str, Any], step: str) -> int | None:
    """The first kept signal this wait takes (its index in the mailbox)."""
    for i, sig in enumerate(mailbox):
        if sig.name == tool.signal and sig.key == key and _holds(tool, sig, scope, step)[0]:
            return i
    return None


def _taken(decision: Decision, act: Activation, step: Step, tool: WaitTool, sig: SignalSent, *, kept: bool) -> Outcome:
    """The step takes `sig`: its data is the attempt's result (an approval's verdict:
    a rejection fails it), through the step's retry rules as a command's result is."""
    decision.event(
        step.step,
        SignalReceivedData(
            activation=act.id,
            signal_id=sig.signal_id,
            name=sig.name,
            key=sig.key,
            by=sig.by,
            sent_at=sig.sent_at,
            kept=True if kept else UNSET,
        ),
    )
    eid, command_id = decision.ex.execution_id, f"{act.id}-{act.attempt}{WAIT_TIMER}"
    rejected = rejection(step.step, sig) if tool.approval else None
    if rejected is not None:
        error = ErrorInfo(type="Rejected", message=rejected)
        res: CallDone | CallError = CallError(
            execution_id=eid, command_id=command_id, step=step.step, error=error, attempt_number=act.attempt
        )
    else:
        result = approval_result(sig) if tool.approval else sig.data
        res = CallDone(
            execution_id=eid, command_id=command_id, step=step.step, attempt_number=act.attempt, result=result
        )
    return failure.after_result(decision, act, step, res)


def _ended(wait: Wait, timer_id: str, due: float, at: float) -> WaitEndedData:
    reason = "until" if _reaches_until(wait) else "timeout"
    return WaitEndedData(
        activation=wait.activation, timer_id=timer_id, reason=reason, due=due, late_ms=round((at - due) * 1000, 3)
    )


def _reaches_until(wait: Wait) -> bool:
    """A timer to a date whose deadline is its date (not the step's earlier timeout)."""
    return wait.signal is None and wait.until is not None and wait.deadline is not None and wait.deadline >= wait.until


def _expired(decision: Decision, act: Activation, step: Step, wait: Wait) -> Outcome:
    """The deadline came: a timer to a date completes, a signal wait times out."""
    eid, command_id = decision.ex.execution_id, wait.timer_id or ""
    if _reaches_until(wait):
        assert wait.until is not None
        res: CallDone | CallError = CallDone(
            execution_id=eid,
            command_id=command_id,
            step=step.step,
            attempt_number=act.attempt,
            result={"until": iso_utc(wait.until)},
        )
    else:
        assert wait.deadline is not None
        what = f"signal '{wait.signal}'" + (f" (key {wait.key!r})" if wait.key else "") if wait.signal else "its date"
        res = CallError(
            execution_id=eid,
            command_id=command_id,
            step=step.step,
            attempt_number=act.attempt,
            error=ErrorInfo(
                type="WaitTimeout",
                message=f"step '{step.step}' waited {round(wait.deadline - wait.since, 3)}s for {what}: "
                f"its deadline {iso_utc(wait.deadline)} passed",
            ),
        )
    return failure.after_result(decision, act, step, res)


# --- inputs: a signal, a wait's timer ------------------------------------------------------


def signal(decision: Decision, sig: SignalSent) -> Next | None:
    """A signal in the execution's log: the first wait it matches (name, key, `when`)
    takes it; else a loop of waits of its name gets it (forwarded: the counter matches
    the keys); else it is kept. The same id again changes nothing."""
    ex = decision.ex
    if sig.signal_id in ex.signal_ids:
        return None
    if ex.playbook is None:  # before the start record: kept for the steps to come
        _keep(decision, sig)
        return None
    unmatched: str | None = None  # why a waiting step's `when` could not be evaluated for it
    loop: Wait | None = None  # the first waiting loop of its name: it takes what no other wait does
    for wait in list(ex.waits.values()):
        if wait.signal != sig.name:
            continue
        act = ex.activations[wait.activation]
        if wait.loop_id is not None:
            # a wait that matches its key comes first: a loop takes any key (its
            # iterations' keys are the counter's), so taking it first would swallow the
            # signals of every other wait of its name (`validate` refuses such
            # playbooks; this holds for those loaded before it did)
            loop = loop or wait
            continue
        if wait.key != sig.key:
            continue
        step = ex.playbook.step(act.step)
        assert isinstance(step.tool, WaitTool)
        holds, why = _holds(step.tool, sig, ex.scope(act), step.step)
        if not holds:
            unmatched = unmatched or why
            continue
        ex.signal_ids.add(sig.signal_id)
        _remove(decision, act.id)
        return act, step, _taken(decision, act, step, step.tool, sig, kept=False)
    if loop is not None and loop.loop_id is not None:
        ex.signal_ids.add(sig.signal_id)
        _forward(decision, ex.activations[loop.activation], loop.loop_id, sig, kept=False)
        return None
    _keep(decision, sig, reason=unmatched[:500] if unmatched else None)
    return None


def _keep(decision: Decision, sig: SignalSent, *, reason: str | None = None) -> None:
    ex = decision.ex
    size = signal_bytes(sig)
    if len(ex.mailbox) >= MAILBOX_LIMIT or ex.mailbox_bytes + size > MAILBOX_BYTES:
        decision.event(
            None,
            SignalDroppedData(
                signal_id=sig.signal_id,
                name=sig.name,
                key=sig.key,
                by=sig.by,
                limit=MAILBOX_LIMIT,
                limit_bytes=MAILBOX_BYTES if len(ex.mailbox) < MAILBOX_LIMIT else UNSET,
            ),
        )
        return  # not remembered: sent again once there is room, it is kept
    ex.signal_ids.add(sig.signal_id)
    ex.mailbox.append(sig)
    ex.mailbox_bytes += size
    decision.event(
        None,
        SignalKeptData(
            signal_id=sig.signal_id,
            name=sig.name,
            key=sig.key,
            by=sig.by,
            kept=len(ex.mailbox),
            reason=reason if reason is not None else UNSET,
        ),
    )


def timer_fired(decision: Decision, fired: TimerFired) -> Next | None:
    """A wait's deadline: the wait ends (unless it ended already: a signal came first,
    a cancel, the timer delivered twice)."""
    ex = decision.ex
    assert ex.playbook is not None
    head = fired.timer_id.split("-", 1)[0]
    wait = ex.waits.get(int(head)) if head.isdigit() else None
    if wait is None or wait.timer_id != fired.timer_id:
        return None
    act = ex.activations[wait.activation]
    if act.status != ActivationStatus.RUNNING:
        return None
    _remove(decision, act.id)
    step = ex.playbook.step(act.step)
    decision.event(step.step, _ended(wait, fired.timer_id, fired.due, decision.out.at))
    return act, step, _expired(decision, act, step, wait)


# --- loops of waits --------------------------------------------------------------------------


def hand_over(decision: Decision, act: Activation, step: Step, tool: WaitTool, loop_id: str) -> None:
    """A loop of waits starts (its spec is in this decision's `loops`): the kept signals
    of its name are taken out of the mailbox and forwarded to its log, one message each
    after the spec (the outbox sends loops first), as later signals of its name are;
    and it waits."""
    ex = decision.ex
    handed = [s for s in ex.mailbox if s.name == tool.signal]
    if handed:
        ex.mailbox = [s for s in ex.mailbox if s.name != tool.signal]
        ex.mailbox_bytes -= sum(signal_bytes(s) for s in handed)
    for sig in handed:
        _forward(decision, act, loop_id, sig, kept=True)
    deadline = _loop_deadline(decision, act, step, tool)
    decision.event(
        step.step,
        StepWaitingData(
            activation=act.id,
            attempt_number=act.attempt,
            signal=tool.signal,
            key="",
            deadline=deadline,
            timer_id=None,
            approval=True if tool.approval else UNSET,
            loop_id=loop_id,
        ),
    )
    _add(
        decision,
        Wait(
            activation=act.id,
            step=step.step,
            since=decision.out.at,
            signal=tool.signal,
            deadline=deadline,
            approval=tool.approval,
            loop_id=loop_id,
        ),
    )


def _loop_deadline(decision: Decision, act: Activation, step: Step, tool: WaitTool) -> float | None:
    """The deadline every iteration of a loop of waits shares, for its status (`times
    out ...`): the step's `timeout` from the loop's start, or an `until` that does not
    read the loop's element (the same for every iteration), whichever comes first. None
    when they differ per iteration (a retry's deadline is its own: the first shown)."""
    assert step.loop is not None
    deadline = None if step.timeout is None else decision.out.at + step.timeout
    if tool.until is None:
        return deadline
    per_item = {step.loop.element, "iteration"}  # what varies per iteration (precompiled.py)
    if names_read(tool.until) & per_item:
        return None  # each iteration's own date
    try:
        until = parse_until(
            render_value(tool.until, decision.ex.scope(act), where="tool.until", step=step.step), tool.zone
        )
    except (TemplateError, UntilInvalid):
        return None  # every iteration fails at its start, saying why
    return until if deadline is None else min(until, deadline)


def _forward(decision: Decision, act: Activation, loop_id: str, sig: SignalSent, *, kept: bool) -> None:
    decision.out.signal_forwards.append(SignalForward(loop_id, sig))
    decision.event(
        act.step,
        SignalForwardedData(
            activation=act.id,
            loop_id=loop_id,
            signal_id=sig.signal_id,
            name=sig.name,
            key=sig.key,
            kept=True if kept else UNSET,
        ),
    )


# --- the set of waits --------------------------------------------------------------------------


def _add(decision: Decision, wait: Wait) -> None:
    ex = decision.ex
    ex.waits.pop(wait.activation, None)  # a new attempt's wait goes last, as it begins now
    ex.waits[wait.activation] = wait
    ex.waits_changed = True


def _remove(decision: Decision, activation: int) -> None:
    ex = decision.ex
    if ex.waits.pop(activation, None) is not None:
        ex.waits_changed = True


def ended(decision: Decision, act: Activation) -> None:
    """`act` no longer waits (cancelled, its loop's verdict came)."""
    if decision.ex.waits:
        _remove(decision, act.id)


def announce(decision: Decision) -> None:
    """At the end of a decision whose waits changed: `execution.waiting` with what the
    execution waits for now, unless that is what it last said, or it has ended (the
    end clears its status's waits)."""
    ex = decision.ex
    ex.waits_changed = False
    if ex.terminal:
        return
    entries = [
        WaitEntry(
            step=w.step,
            activation=w.activation,
            since=w.since,
            signal=w.signal,
            key=w.key,
            deadline=w.deadline,
            approval=w.approval,
            loop=w.loop_id is not None,
        )
        for w in ex.waits.values()
    ]
    if entries == ex.waits_shown:
        return
    ex.waits_shown = entries
    decision.lifecycle(ExecutionWaitingData(waits=entries))
