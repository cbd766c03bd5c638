"""A step's work: a router or data step decided here, else the command, child execution
or loop (handed to the counter) it issues, and what comes back: a result, the counter's
verdict. A step that completes routes on by its `next` rules (actors/core/decision.py
moves its token); one that fails meets its failure rules (actors/core/failure.py).

What follows an attempt is a value (actors/core/attempt.py) that `settle` applies, here
and nowhere else: failure.py returns the completions and next attempts its rules decide
instead of calling back into this module, so the two import in one direction."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.core import failure, waits
from actors.core.attempt import REISSUE, Complete, Fail, Outcome
from actors.core.decision import Decision, fail_step, leave
from actors.core.effects import child_start
from actors.core.effects import template_error as _template_error
from actors.core.outcome import finish
from actors.core.state import Activation, Execution
from actors.playbook.model import (
    END,
    UNRENDERED_TOOL_FIELDS,
    Loop,
    NoopTool,
    PlaybookTool,
    PythonTool,
    Step,
    WaitTool,
)
from actors.playbook.templates import TemplateError, names_read, render_condition, render_value
from actors.playbook.tool_render import render_tool, sink_call
from actors.wire.events import (
    ActivationStatus,
    ArrivalStatus,
    CommandIssuedData,
    IteratorCompletedData,
    IteratorStartedData,
    StepExitData,
)
from actors.wire.messages import (
    CallDone,
    CallError,
    CodeAt,
    Command,
    ErrorInfo,
    IteratorCompleted,
    IteratorFailed,
    LoopSpec,
    Redrive,
)
from streams.ids import child_execution_id, step_command_id
from streams.subjects import ITERATOR, RESULT, ExecSubjects, answer_request_subject

# the engine semantics (actors/core/replay.py SEMANTICS) from which a step's command is
# answered on the execution's one results subject (`in.result`), the command id in the
# result, instead of a subject per command (`in.result.<command>`): a stored subject
# costs the server an index entry per retained execution (docs/architecture.md
# "The next layout"). Older executions keep theirs, byte for byte (tests/corpus)
SHARED_RESULTS = 4
# from which a step's tool asks the partition's engine pod to store its result with the
# decision it leads to, as one input (`Command.ask_on`, docs/architecture.md "The next
# layout", item 2); the decisions are those of 4
FAST_ANSWERS = 5


def shared_input(subjects: ExecSubjects, semantics: int, type_: str) -> str | None:
    """The execution's one subject for every input of `type_` (every result, every
    loop's verdict) when its semantics has one; None: a subject per command or loop."""
    return subjects.input(type_) if semantics >= SHARED_RESULTS else None


# --- steps -----------------------------------------------------------------------------


def dispatch(decision: Decision, act: Activation, step: Step) -> None:
    if isinstance(step.tool, NoopTool) and not step.retry and step.loop is None and step.sink is None:
        # A router or a pure data step: its result is its rendered args. Deciding it
        # here saves a command round trip and is just as deterministic.
        try:
            # no args, no scope to build (it copies every result so far)
            args = render_value(step.args, decision.ex.scope(act), where="args", step=step.step) if step.args else {}
        except TemplateError as e:
            settle(decision, act, step, Fail(_template_error(step.step, e)))
            return
        step_completed(decision, act, step, args)
        return
    issue(decision, act, step)


def settle(decision: Decision, act: Activation, step: Step, outcome: Outcome) -> None:
    """Apply what follows an attempt until nothing more does: the one place an
    attempt's outcome is applied. A loop, not calls into each other: a failure can lead
    to another attempt now, whose template fails, whose rules ask for another one..."""
    while outcome is not None:
        if isinstance(outcome, Complete):
            outcome = _complete(decision, act, step, outcome.result, ignored_error=outcome.ignored_error)
        elif isinstance(outcome, Fail):
            outcome = failure.meet_failure_rules(decision, act, step, outcome)
        else:
            outcome = _issue(decision, act, step)


def issue(decision: Decision, act: Activation, step: Step) -> None:
    """Send the command (or start the child execution, or the loop) for the current
    attempt."""
    settle(decision, act, step, REISSUE)


def _issue(decision: Decision, act: Activation, step: Step) -> Outcome:
    ex = decision.ex
    if step.loop is not None:
        return _start_loop(decision, act, step, step.loop)
    if isinstance(step.tool, WaitTool):
        return waits.begin(decision, act, step, step.tool)  # decided here: no tool actor runs it
    scope = ex.scope(act)
    try:
        args = render_value(step.args, scope, where="args", step=step.step)
        tool = render_tool(step, scope)
    except TemplateError as e:
        return Fail(_template_error(step.step, e))
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
    own = decision.subjects.result(command_id)
    shared = shared_input(decision.subjects, ex.semantics, RESULT)
    if isinstance(step.tool, PlaybookTool):
        # a child's end goes to the shared subject when there is one: engines only, all
        # of them of this semantics or later (docs/upgrades.md)
        start = child_start(
            tool, args, execution_id=ex.execution_id, step=step.step, command_id=command_id, reply_to=shared or own
        )
        decision.out.starts.append(start)
        act.child = issued.child_execution_id = child_execution_id(ex.execution_id, command_id)
        decision.event(step.step, issued)
        return None
    # a tool pod older than semantics 4 answers on `reply_to`, a subject of the command's
    # own, and asks whether a redelivered command is answered there: only a tool that
    # knows `answer_on` answers on the shared subject, so a tool pod rolled late loses
    # no step (docs/upgrades.md "From 3 to 4")
    decision.out.commands.append(
        Command(
            execution_id=ex.execution_id,
            command_id=command_id,
            step=step.step,
            kind=kind,
            reply_to=own,
            answer_on=shared,
            ask_on=answer_request_subject(decision.subjects.partition) if ex.semantics >= FAST_ANSWERS else None,
            tool=tool,
            args=args,
            timeout=step.timeout,
            attempt_number=act.attempt,
            sink=sink_call(step, scope),
            code_at=code_at(ex, step),
        )
    )
    decision.event(step.step, issued)
    return None


def code_at(ex: Execution, step: Step) -> CodeAt | None:
    """Where a python step's code starts in its playbook file, for its tracebacks. Only
    when the start record names the file: an execution started before it did decides
    the commands it always did (tests/corpus)."""
    if ex.playbook_file is None or ex.playbook is None or not isinstance(step.tool, PythonTool):
        return None
    line = ex.playbook.code_lines.get(step.step)
    return None if line is None else CodeAt(file=ex.playbook_file, line=line)


# --- loops -----------------------------------------------------------------------------


def _start_loop(decision: Decision, act: Activation, step: Step, loop: Loop) -> Outcome:
    """Render the collection and hand the loop to the counter (one `loop.spec`); the
    iterations never pass through this log, only `iterator.started` and, at the end,
    the counter's verdict."""
    ex = decision.ex
    scope = ex.scope(act)
    try:
        collection = render_value(loop.collection, scope, where="loop.collection", step=step.step)
    except TemplateError as e:
        return Fail(_template_error(step.step, e))
    if not isinstance(collection, list):
        return Fail(
            ErrorInfo(
                type="LoopCollectionInvalid",
                message=f"step '{step.step}' field loop.collection: must render to a list, "
                f"got {type(collection).__name__} ({str(collection)[:80]!r})",
            )
        )
    # a redrive's loop runs only the old loop's failed iterations, once (a second
    # attempt of the step, or a later visit, runs it whole)
    redrive = ex.redrive.pop(step.step, None)
    if redrive is not None and len(collection) != redrive.total:
        return Fail(
            ErrorInfo(
                type="RedriveInvalid",
                message=f"step '{step.step}': the collection has {len(collection)} elements, "
                f"the loop redriven had {redrive.total}: its failed items are not these",
            )
        )
    parent = act.command_id
    loop_id = step_command_id(act.id, act.attempt)  # the loop stands for the step's command
    act.command_id = loop_id
    act.kind = "loop"
    ex.by_command[loop_id] = act.id
    if redrive is not None:
        ex.redriving[loop_id] = redrive
    started = IteratorStartedData(
        activation=act.id,
        loop_id=loop_id,
        size=len(collection),
        mode=loop.mode,
        element=loop.element,
        concurrency=1 if loop.mode == "sequential" else loop.concurrency,
        chunk_size=loop.chunk_size if loop.mode == "chunked" else None,
        tolerated_failures=loop.tolerated_failures,
        attempt_number=act.attempt,
    )
    if act.attempt > 1:
        started.parent_event_id = parent
    if redrive is not None:
        started.redriven = len(redrive.indices)
    decision.event(step.step, started)
    if not collection:
        decision.event(
            step.step, IteratorCompletedData(activation=act.id, loop_id=loop_id, total=0, succeeded=0, failed=0)
        )
        return Complete([])
    wanted = _loop_names(step)
    decision.out.loops.append(
        LoopSpec(
            execution_id=ex.execution_id,
            loop_id=loop_id,
            step=step.step,
            playbook_path=ex.playbook_path,
            playbook_source=ex.playbook_source,
            collection=collection,
            scope={k: v for k, v in scope.items() if k in wanted},
            reply_to=decision.subjects.iterator(loop_id),
            # semantics 4: the verdicts of every loop of the execution on one subject
            answer_on=shared_input(decision.subjects, ex.semantics, ITERATOR),
            parent_event_id=parent,
            limits=ex.limits,
            code_at=code_at(ex, step),
            only=list(redrive.indices) if redrive is not None else None,
        )
    )
    if isinstance(step.tool, WaitTool):
        # a loop of waits: the counter matches signals to its iterations; the kept ones
        # are forwarded to its log after the spec, later ones as they come
        waits.hand_over(decision, act, step, step.tool, loop_id)
    return None


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


def iterator_end(decision: Decision, res: IteratorCompleted | IteratorFailed) -> None:
    """The counter's verdict. A failed loop meets the step's on_error and on_failure
    rules (its retry rules were each iteration's own)."""
    ex = decision.ex
    assert ex.playbook is not None
    act_id = ex.by_command.get(res.loop_id)
    act = ex.activations.get(act_id) if act_id is not None else None
    if act is None or act.status != ActivationStatus.RUNNING or act.command_id != res.loop_id:
        return  # a verdict delivered twice, or for a loop since cancelled
    step = ex.playbook.step(act.step)
    waits.ended(decision, act)  # a loop of waits: no signal is forwarded to it any more
    redrive = ex.redriving.pop(res.loop_id, None)
    if isinstance(res, IteratorCompleted):
        results = res.results if res.results is not None else []
        if redrive is not None:
            results = _kept(results, redrive)
        step_completed(decision, act, step, results)
        return
    first = res.errors[0] if res.errors else None
    detail = (
        f"; first: iteration {first['index']}: {first['error']['type']}: {first['error']['message'][:300]}"
        if first
        else ""
    )
    error = ErrorInfo(
        type="LoopFailed",
        message=f"step '{step.step}': {res.failed} of {res.total} iterations failed, "
        f"more than the {res.tolerated} tolerated{detail}",
    )
    settle(decision, act, step, Fail(error))


def _kept(results: list[Any], redrive: Redrive) -> list[Any]:
    """A redriven loop's results: the iterations run again from its verdict, every
    other one from the redriven loop (the start record's)."""
    again = set(redrive.indices)
    old = redrive.results
    return [
        (results[i] if i < len(results) else None) if i in again else (old[i] if i < len(old) else None)
        for i in range(redrive.total)
    ]


# --- results ---------------------------------------------------------------------------


def call_result(decision: Decision, res: CallDone | CallError) -> None:
    ex = decision.ex
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
            finish(decision, act, result=res.result, end_error=None)
        else:
            finish(decision, act, result=None, end_error=res.error)
        return
    settle(decision, act, step, failure.after_result(decision, act, step, res))


# --- completion and routing ------------------------------------------------------------


def step_completed(
    decision: Decision, act: Activation, step: Step, result: Any, *, ignored_error: dict[str, Any] | None = None
) -> None:
    """The step completed with `result` (for an `ignore` decision, despite the error it
    records) and routes on."""
    settle(decision, act, step, Complete(result, ignored_error))


def _complete(
    decision: Decision, act: Activation, step: Step, result: Any, *, ignored_error: dict[str, Any] | None
) -> Outcome:
    """Route on. A routing error after an ignored failure fails the step directly: it
    must not re-enter the on_error rules that just decided."""
    try:
        targets = _route(decision.ex, act, step, result)
    except TemplateError as e:
        routing_error = _template_error(step.step, e, field="next")
        if ignored_error is None:
            return Fail(routing_error)
        fail_step(decision, act, routing_error)
        return None
    act.status = ActivationStatus.COMPLETED
    decision.ex.results[step.step] = result
    completed = StepExitData(activation=act.id, status=ActivationStatus.COMPLETED, next=targets)
    if ignored_error is not None:
        completed.ignored_error = ignored_error
    decision.event(step.step, completed)
    leave(decision, act, targets, status=ArrivalStatus.COMPLETED)
    return None


def _route(ex: Execution, act: Activation, step: Step, result: Any) -> list[str]:
    if step.next is None:
        return [END]
    scope: dict[str, Any] | None = None  # built for the first condition: it copies every result so far
    for i, rule in enumerate(step.next):
        if rule.when is not None:
            if scope is None:
                scope = ex.scope(act)
                scope.update(result=result, response=result, error=None, attempt=act.attempt)
            if not render_condition(rule.when, scope, where=f"next[{i}].when", step=step.step):
                continue
        return list(rule.then) or [END]
    return [END]  # no rule matched: the branch converges at end


# --- helpers ---------------------------------------------------------------------------


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """The start payload over the playbook's workload: mappings merge, the rest replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
