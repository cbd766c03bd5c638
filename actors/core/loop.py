"""A loop's progress: the counter actor's pure core.

The engine hands a loop over as one `loop.spec` (the playbook, the rendered collection,
the names its templates read). From then on the loop has its own log (stream LOOP):
iteration results, retry timers, a cancel. `fold_loop(run, input, at=...)` folds one
of them and says what follows: iteration commands to release (keeping `concurrency`
in flight; `sequential` is 1), retry timers to arm, commands to stop, and, once every
iteration is counted, the verdict for the execution (`iterator.completed`, or
`iterator.failed` as soon as more iterations failed than `tolerated_failures`).

Exactly once: an iteration is counted when the result of the command in flight for it
arrives, alone (`call.done`/`call.error`) or as an entry of a `result.batch` (a tool
actor gathers results that end close together into one message); any other result (a
redelivery, the same result in a second batch, a stale attempt) finds no command in
flight and changes nothing. Like the engine's fold, this is a pure function of the loop's
log: command ids come from (loop, iteration, attempt), delays from a hash, times from
log timestamps, so a counter that replays the log makes the same decisions.

Each iteration's retry rules apply to that iteration alone (actors/core/retry.py).

A loop of waits (`tool: wait`) sends no command: every iteration waits at once (a
waiting iteration holds no worker, so `concurrency` does not apply) for a signal of
the step's name and its own `key`, forwarded by the engine to the loop's log
(`SignalSent`: those the execution kept before the loop, right after the spec, then
each later one), or for its deadline: one durable timer per distinct deadline, however
many iterations share it. A signal for which an iteration's `when` cannot be evaluated
does not match it (signals come from outside: none can fail an iteration). See `_Waits`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.core.backoff import unit_random
from actors.core.effects import CommandCancel, Effects, Timer, child_start, error_view, iteration_error, template_error
from actors.core.retry import Gathered, after_attempt
from actors.playbook.model import Loop, PlaybookTool, Step, WaitTool
from actors.playbook.precompiled import IterationTemplates
from actors.playbook.templates import TemplateError
from actors.playbook.until import UntilInvalid, iso_utc, parse_until
from actors.playbook.waits import approval_result, rejection, signal_bytes, signal_key, signal_view
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    ChunkItem,
    Command,
    ErrorInfo,
    FailedItem,
    IterationOutcome,
    IteratorCompleted,
    IteratorFailed,
    LoopCancel,
    LoopInput,
    LoopSpec,
    ResultBatch,
    SignalSent,
    TimerFired,
)
from streams.ids import child_execution_id, iteration_command_id
from streams.subjects import LoopSubjects

MAX_ERRORS_KEPT = 20  # failures listed in the verdict; the counts cover the rest
ELEMENT_HEAD = 256  # bytes of an element's JSON a failure record holds (FailedItem)
MAX_KEPT = 1_000  # signals a loop of waits keeps for keys no iteration waits on (yet)
MAX_KEPT_BYTES = 4 << 20  # and the bytes of their data it holds for them (memory: a replay rebuilds them)
WAIT_TIMER = "w"  # a wait deadline's timer id: `w<deadline in ms>` (a retry's is `<index>-<attempt>`)


def tolerated(loop: Loop, total: int) -> int:
    """`tolerated_failures` as a count: 3, or "5%" of the collection, rounded down."""
    tf = loop.tolerated_failures
    if isinstance(tf, str):
        return math.floor(total * float(tf.rstrip("%")) / 100 + 1e-9)
    return tf


@dataclass(slots=True)
class Retrying:
    """An iteration past its first attempt (most never get here: the state of a loop is
    a few integers per iteration, whatever its retry rules)."""

    attempt: int = 1
    next_args: dict[str, Any] | None = None
    gathered: Gathered = field(default_factory=Gathered)


@dataclass(slots=True)
class Waiting:
    """An iteration waiting for its signal (or its `until`)."""

    key: str
    attempt: int
    deadline: int | None  # epoch milliseconds: the deadline's timer is `w<deadline>`
    ends: bool = False  # the deadline is `until` of a wait with no signal: it completes then


@dataclass(slots=True)
class _Waits:
    """A loop of waits: which iteration waits on which key, the signals kept for keys
    nothing waits on yet, the signal ids seen, the deadlines. A few fields per waiting
    iteration and an id per signal."""

    tool: WaitTool
    waiting: dict[int, Waiting] = field(default_factory=dict)
    by_key: dict[str, list[int]] = field(default_factory=dict)  # key -> iterations, in the order they began
    kept: dict[str, list[SignalSent]] = field(default_factory=dict)  # key -> signals, in arrival order
    kept_count: int = 0
    kept_bytes: int = 0
    seen: set[str] = field(default_factory=set)  # signal ids taken or kept: the same id again is no signal
    deadlines: list[tuple[int, int, int]] = field(default_factory=list)  # heap of (ms, iteration, attempt)
    timers: dict[str, int] = field(default_factory=dict)  # armed deadline timers not fired: id -> ms


@dataclass(slots=True)
class InFlight:
    """A command released and not answered: one iteration, or a chunk of them."""

    indices: list[int]
    attempt: int
    kind: str
    child: str | None = None


@dataclass(slots=True)
class LoopRun:
    execution_id: str
    loop_id: str
    spec: LoopSpec | None = None
    step: Step | None = None
    collection: list[Any] = field(default_factory=list)
    slots: int = 1
    chunk_size: int = 1
    tolerated: int = 0
    released: int = 0  # iterations [0, released) have had a first command (of `order`, when set)
    order: list[int] | None = None  # a redrive: the iterations to run (LoopSpec.only), in order
    inflight: dict[str, InFlight] = field(default_factory=dict)  # command id -> what it carries
    waiting: dict[str, int] = field(default_factory=dict)  # timer id -> iteration waiting on it
    ready: deque[int] = field(default_factory=deque)  # iterations due for another attempt
    retrying: dict[int, Retrying] = field(default_factory=dict)
    results: list[Any] = field(default_factory=list)
    counted: bytearray = field(default_factory=bytearray)
    succeeded: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False  # a verdict was given, or the loop was cancelled
    cancelled: bool = False
    waits: _Waits | None = None  # a loop of `tool: wait` steps
    # prepared from the step, at the spec
    templates: IterationTemplates | None = field(default=None, compare=False, repr=False)

    @property
    def total(self) -> int:
        return len(self.collection)

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @property
    def waiting_count(self) -> int:
        """Iterations waiting for a signal or a time now (a loop of waits)."""
        return len(self.waits.waiting) if self.waits is not None else 0

    def pending_timers(self) -> list[str]:
        """The timers armed and not fired yet (retry delays, wait deadlines) that still
        matter: what a replay arms again."""
        out = list(self.waiting)
        if self.waits is not None:
            out += self.waits.timers
        return out


class _Fold:
    __slots__ = ("at", "out", "run", "subjects")

    def __init__(self, run: LoopRun, at: float, subjects: LoopSubjects, out: Effects | None) -> None:
        self.run = run
        self.at = at
        self.subjects = subjects  # the loop's log: where its iterations' results go
        self.out = Effects() if out is None else out


def fold_loop(
    run: LoopRun,
    inp: LoopInput,
    *,
    at: float,
    subjects: LoopSubjects,
    step: Step | None = None,
    into: Effects | None = None,
) -> Effects:
    """Fold one input of the loop's log. For the spec, the shell passes the parsed
    `step` (parsing is cached outside; the core stays free of I/O either way).
    `into`: add the outputs to this one (a batch of inputs folded one after the other
    yields the outputs of each, in order) and return it."""
    fold = _Fold(run, at, subjects, into)
    if isinstance(inp, LoopSpec):
        if run.spec is None and step is not None and step.loop is not None:
            _begin(fold, inp, step, step.loop)
    elif run.finished or run.spec is None:
        pass  # after the verdict or a cancel, or before the spec: nothing to decide
    elif isinstance(inp, (CallDone, CallError)):
        _call_result(fold, inp)
    elif isinstance(inp, ResultBatch):
        _result_batch(fold, inp)
    elif isinstance(inp, ChunkDone):
        _chunk_done(fold, inp)
    elif isinstance(inp, TimerFired):
        if run.waits is not None and inp.timer_id.startswith(WAIT_TIMER):
            _deadline(fold, run.waits, inp)
        else:
            index = run.waiting.pop(inp.timer_id, None)
            if index is not None:
                run.ready.append(index)
    elif isinstance(inp, SignalSent):
        if run.waits is not None:
            _signal(fold, run.waits, inp)
    elif isinstance(inp, LoopCancel):
        _stop(fold)
        run.cancelled = True
    if run.spec is not None and not run.finished:
        _release(fold)
        _maybe_finish(fold)
    return fold.out


def _begin(fold: _Fold, spec: LoopSpec, step: Step, loop: Loop) -> None:
    run = fold.run
    run.spec, run.step = spec, step
    run.collection = spec.collection or []
    run.slots = 1 if loop.mode == "sequential" else loop.concurrency
    # a child execution per iteration: chunks make no sense for nested playbooks
    run.chunk_size = loop.chunk_size if loop.mode == "chunked" and not isinstance(step.tool, PlaybookTool) else 1
    run.tolerated = tolerated(loop, run.total)
    run.results = [None] * run.total
    run.counted = bytearray(run.total)
    run.templates = IterationTemplates(step, spec)
    if isinstance(step.tool, WaitTool):
        run.waits = _Waits(tool=step.tool)
    if spec.only is not None:
        # a redrive: the other iterations succeeded before; the engine puts their kept
        # results back (actors/core/work.py), so here they only count
        run.order = sorted({i for i in spec.only if 0 <= i < run.total})
        run.counted = bytearray(b"\x01" * run.total)
        for i in run.order:
            run.counted[i] = 0
        run.succeeded = run.total - len(run.order)


def _pending(run: LoopRun) -> int:
    """Iterations due a first command in all (every one, or a redrive's)."""
    return run.total if run.order is None else len(run.order)


# --- releasing iterations -------------------------------------------------------------


def _release(fold: _Fold) -> None:
    """Keep `slots` commands in flight: retries due first, then new iterations."""
    run = fold.run
    if run.waits is not None:
        _release_waits(fold, run.waits)
        return
    while len(run.inflight) < run.slots and not run.finished:
        if run.ready:
            _issue(fold, [run.ready.popleft()], chunk=False)
        elif run.released < _pending(run):
            start = run.released
            run.released = min(_pending(run), start + run.chunk_size)
            batch = list(range(start, run.released)) if run.order is None else run.order[start : run.released]
            _issue(fold, batch, chunk=run.chunk_size > 1)
        else:
            break


def _scope(run: LoopRun, index: int) -> dict[str, Any]:
    assert run.spec is not None and run.step is not None and run.step.loop is not None
    return {**run.spec.scope, run.step.loop.element: run.collection[index], "iteration": {"index": index}}


def _issue(fold: _Fold, indices: list[int], *, chunk: bool) -> None:
    """One command for `indices`: one iteration, or (`chunk`) a chunk of first
    attempts. An iteration whose templates cannot render fails on its own, without a
    command."""
    run, step, templates = fold.run, fold.run.step, fold.run.templates
    assert step is not None and step.loop is not None and run.spec is not None and templates is not None
    items: list[ChunkItem] = []
    tool: dict[str, Any] = {}
    for i in indices:
        if run.finished:
            return  # a template failure just failed the loop
        scope = _scope(run, i)
        try:
            args, tool = templates.render(step, scope)
        except TemplateError as e:
            _counted(fold, i, None, template_error(step.step, e), attempt=_attempt(run, i))
            continue
        state = run.retrying.get(i)
        if state is not None and state.next_args is not None:
            args = {**args, **state.next_args}
        items.append(ChunkItem(iteration_index=i, args=args, element=run.collection[i]))
    if not items:
        return
    kind = str(tool.pop("kind"))
    first = items[0].iteration_index
    attempt = run.retrying[first].attempt if first in run.retrying else 1
    command_id = iteration_command_id(run.loop_id, first, attempt, chunk=chunk)
    reply_to = fold.subjects.result(command_id)
    flight = InFlight(indices=[it.iteration_index for it in items], attempt=attempt, kind=kind)
    run.inflight[command_id] = flight
    if isinstance(step.tool, PlaybookTool):
        # nested playbooks: each iteration starts a child execution, whose end comes
        # back as this command's result
        start = child_start(
            tool, items[0].args, execution_id=run.execution_id, step=step.step, command_id=command_id, reply_to=reply_to
        )
        fold.out.starts.append(start)
        flight.child = child_execution_id(run.execution_id, command_id)
        return
    single = None if chunk else items[0]  # one iteration's command carries its args and element
    fold.out.commands.append(
        Command(
            execution_id=run.execution_id,
            command_id=command_id,
            step=step.step,
            kind=kind,
            reply_to=reply_to,
            tool=tool,
            attempt_number=attempt,
            timeout=step.timeout,
            sink=templates.sink,
            args=single.args if single is not None else {},
            iteration_index=single.iteration_index if single is not None else None,
            element=single.element if single is not None else None,
            chunk=None if single is not None else items,
            code_at=run.spec.code_at,
        )
    )


# --- results --------------------------------------------------------------------------


def _call_result(fold: _Fold, res: CallDone | CallError) -> None:
    if isinstance(res, CallDone):
        _answered(fold, res.command_id, res.iteration_index, res.result, None)
    else:
        _answered(fold, res.command_id, res.iteration_index, None, res.error)


def _result_batch(fold: _Fold, batch: ResultBatch) -> None:
    """Each entry as the `call.done`/`call.error` of its command, in order."""
    for r in batch.results:
        _answered(fold, r.command_id, r.iteration_index, r.result, r.error)
        if fold.run.finished:
            return


def _answered(fold: _Fold, command_id: str, iteration_index: int | None, result: Any, error: ErrorInfo | None) -> None:
    """A command's result (`error` None) or error: counted if that command is in
    flight; otherwise (a redelivery, the same result in another batch, a stale
    attempt) it changes nothing."""
    flight = fold.run.inflight.pop(command_id, None)
    if flight is None:
        return  # counted once already
    if error is None:
        index = iteration_index if iteration_index is not None else flight.indices[0]
        _attempted(fold, index, flight.attempt, result, None)
        return
    # an error for the whole command (a chunk the tool actor gave up on) fails each
    # iteration it carried
    for index in flight.indices if iteration_index is None else [iteration_index]:
        _attempted(fold, index, flight.attempt, None, error)
        if fold.run.finished:
            return


def _chunk_done(fold: _Fold, res: ChunkDone) -> None:
    flight = fold.run.inflight.pop(res.command_id, None)
    if flight is None:
        return
    answered: dict[int, IterationOutcome] = {o.iteration_index: o for o in res.outcomes}
    for index in flight.indices:
        o = answered.get(index)
        if o is None:
            _attempted(
                fold,
                index,
                flight.attempt,
                None,
                ErrorInfo(
                    type="ChunkIncomplete", message=f"chunk {res.command_id} has no outcome for iteration {index}"
                ),
            )
        else:
            _attempted(fold, index, flight.attempt, o.result, o.error)
        if fold.run.finished:
            return


def _attempted(fold: _Fold, index: int, attempt: int, result: Any, error: ErrorInfo | None) -> None:
    """One attempt of one iteration ended: its retry rules decide whether it is done."""
    run, step = fold.run, fold.run.step
    assert step is not None
    if run.counted[index]:
        return
    state = run.retrying.get(index)
    if not step.retry:
        _counted(fold, index, result, error, attempt=attempt)
        return
    ok = error is None
    scope = _scope(run, index)
    scope.update(result=result, response=result, error=error_view(error) if error else None, attempt=attempt)
    gathered = state.gathered if state is not None else Gathered()
    try:
        after = after_attempt(
            step.retry,
            scope,
            ok=ok,
            attempt=attempt,
            result=result,
            gathered=gathered,
            unit=unit_random(run.execution_id, run.loop_id, index, attempt),
        )
    except TemplateError as e:
        _counted(fold, index, None, template_error(step.step, e), attempt=attempt)
        return
    if after.what == "completed":
        _counted(fold, index, after.result, None, attempt=attempt)
    elif after.what == "again":
        assert after.verdict is not None
        if state is None:  # most iterations never get here: their state is a few integers
            state = run.retrying[index] = Retrying(gathered=gathered)
        state.attempt = attempt + 1
        if after.verdict.next_args is not None:
            state.next_args = after.verdict.next_args
        if after.verdict.delay <= 0:
            run.ready.append(index)
        else:
            timer_id = f"{index}-{state.attempt}"
            due = fold.at + after.verdict.delay
            run.waiting[timer_id] = index
            fold.out.timers.append(
                Timer(timer_id, due, TimerFired(execution_id=run.execution_id, timer_id=timer_id, due=due))
            )
    else:  # exhausted, or no rule for this attempt
        _counted(fold, index, gathered.final(result, add=True) if ok else None, error, attempt=attempt)


def _attempt(run: LoopRun, index: int) -> int:
    state = run.retrying.get(index)
    return state.attempt if state is not None else 1


def _counted(fold: _Fold, index: int, result: Any, error: ErrorInfo | None, *, attempt: int) -> None:
    run = fold.run
    run.counted[index] = 1
    run.retrying.pop(index, None)
    if error is None:
        run.results[index] = result
        run.succeeded += 1
        return
    run.failed += 1
    if len(run.errors) < MAX_ERRORS_KEPT:
        run.errors.append(iteration_error(index, error))
    fold.out.failures.append(failed_item(run, index, attempt, error, at=fold.at))
    if run.failed > run.tolerated:
        # fail fast: more failures than tolerated decide the loop; what is still
        # running is stopped and nothing new is released
        _stop(fold)
        fold.out.verdict = IteratorFailed(tolerated=run.tolerated, **_verdict_fields(run, results=False))


def failed_item(run: LoopRun, index: int, attempts: int, error: ErrorInfo, *, at: float) -> FailedItem:
    """The record of iteration `index` failed for good: its element whole when its JSON
    is short, else the head of that JSON (a failure record stays small whatever the
    elements are)."""
    assert run.spec is not None
    element = run.collection[index]
    item = FailedItem(
        execution_id=run.execution_id,
        loop_id=run.loop_id,
        step=run.spec.step,
        index=index,
        attempts=attempts,
        error=error,
        at=at,
    )
    try:
        text = msgspec.json.encode(element)
    except (TypeError, msgspec.EncodeError):  # not JSON (it came through templates): say what it is
        text = repr(element).encode()
    if len(text) <= ELEMENT_HEAD:
        item.element = element
    else:
        item.element_head = text[:ELEMENT_HEAD].decode(errors="ignore")
    return item


def _stop(fold: _Fold) -> None:
    run = fold.run
    run.finished = True
    for command_id, flight in run.inflight.items():
        if flight.child is not None:
            fold.out.child_cancels.append(flight.child)
        else:
            fold.out.cancels.append(CommandCancel(flight.kind, command_id))
    run.inflight.clear()
    run.waiting.clear()
    run.ready.clear()
    if run.waits is not None:
        # signals and deadlines after the verdict (or a cancel) change nothing
        run.waits.waiting.clear()
        run.waits.by_key.clear()
        run.waits.kept.clear()
        run.waits.deadlines.clear()
        run.waits.timers.clear()


def _maybe_finish(fold: _Fold) -> None:
    run = fold.run
    if run.done == run.total:
        run.finished = True
        fold.out.verdict = IteratorCompleted(**_verdict_fields(run, results=True))


def _verdict_fields(run: LoopRun, *, results: bool) -> dict[str, Any]:
    assert run.spec is not None
    return dict(
        execution_id=run.execution_id,
        loop_id=run.loop_id,
        step=run.spec.step,
        total=run.total,
        succeeded=run.succeeded,
        failed=run.failed,
        not_run=run.total - run.done,
        results=run.results if results else None,
        errors=run.errors,
    )


# --- a loop of waits ------------------------------------------------------------------


def _release_waits(fold: _Fold, w: _Waits) -> None:
    """Every iteration due waits now: no command, so no slot bounds them. Iterations
    that begin in one fold share their `timeout` deadline, hence its one timer."""
    run = fold.run
    while run.ready and not run.finished:
        _wait_begin(fold, w, run.ready.popleft())
    while run.released < _pending(run) and not run.finished:
        index = run.released if run.order is None else run.order[run.released]
        run.released += 1
        _wait_begin(fold, w, index)


def _wait_begin(fold: _Fold, w: _Waits, index: int) -> None:
    """Iteration `index` starts waiting (each attempt): its key and `until` rendered in
    its scope, then the first kept signal for it taken, else it waits with its deadline."""
    run, step, templates = fold.run, fold.run.step, fold.run.templates
    assert step is not None and templates is not None
    attempt = _attempt(run, index)
    scope = _scope(run, index)
    try:
        key_value, until_value, zone = templates.render_wait(scope)
        key = signal_key(key_value)
        until = None if until_value is None else parse_until(until_value, zone if isinstance(zone, str) else None)
    except TemplateError as e:
        _counted(fold, index, None, template_error(step.step, e), attempt=attempt)
        return
    except UntilInvalid as e:  # rendered, but not a time: `WaitInvalid`, as the engine's wait step says
        message = f"step '{step.step}' iteration {index} field tool.until: {e}"
        _counted(fold, index, None, ErrorInfo(type="WaitInvalid", message=message), attempt=attempt)
        return
    if w.tool.signal is not None:
        kept = w.kept.get(key)
        for n, sig in enumerate(kept or ()):
            if _holds(fold, w, sig, scope):
                assert kept is not None
                del kept[n]
                w.kept_count -= 1
                w.kept_bytes -= signal_bytes(sig)
                if not kept:
                    del w.kept[key]
                _take(fold, w, index, attempt, sig)
                return
    # the deadline: `timeout` from now, or `until`, whichever comes first
    ends = w.tool.signal is None
    deadline = None if step.timeout is None else fold.at + step.timeout
    if until is not None and (deadline is None or until <= deadline):
        deadline = until
    else:
        ends = False  # the step's timeout comes first: a timeout even without a signal
    ms = None if deadline is None else math.ceil(deadline * 1000)
    if ms is not None and ms <= fold.at * 1000:  # already past
        _expired(fold, w, index, attempt, key, ms, ends)
        return
    w.waiting[index] = Waiting(key=key, attempt=attempt, deadline=ms, ends=ends)
    w.by_key.setdefault(key, []).append(index)
    if ms is not None:
        heapq.heappush(w.deadlines, (ms, index, attempt))
        timer_id = f"{WAIT_TIMER}{ms}"
        if timer_id not in w.timers:
            w.timers[timer_id] = ms
            due = ms / 1000
            fold.out.timers.append(
                Timer(timer_id, due, TimerFired(execution_id=run.execution_id, timer_id=timer_id, due=due))
            )


def _holds(fold: _Fold, w: _Waits, sig: SignalSent, scope: dict[str, Any]) -> bool:
    """Whether an iteration's `when` (in its `scope`) holds for `sig`. One that cannot be
    evaluated for it (the sender's data is not what the condition expects) does not
    match: the iteration goes on waiting, the signal is kept."""
    if w.tool.when is None:
        return True
    step, templates = fold.run.step, fold.run.templates
    assert step is not None and templates is not None
    try:
        return templates.wait_holds(step, {**scope, "signal": signal_view(sig)})
    except TemplateError:
        return False


def _signal(fold: _Fold, w: _Waits, sig: SignalSent) -> None:
    """A signal for this loop: the first iteration waiting on its key whose `when`
    holds takes it; else it is kept for a later wait (bounded: past `MAX_KEPT`, or
    `MAX_KEPT_BYTES` of data, it is dropped; it stays in the loop's log as an input)."""
    if sig.name != w.tool.signal or sig.signal_id in w.seen:
        return  # not this loop's signal, or one already taken or kept
    w.seen.add(sig.signal_id)
    for index in list(w.by_key.get(sig.key, ())):
        if fold.run.finished:
            return
        state = w.waiting[index]
        if w.tool.when is None or _holds(fold, w, sig, _scope(fold.run, index)):
            _unwait(w, index)
            _take(fold, w, index, state.attempt, sig)
            return
    size = signal_bytes(sig)
    if fold.run.finished or w.kept_count >= MAX_KEPT or w.kept_bytes + size > MAX_KEPT_BYTES:
        return
    w.kept.setdefault(sig.key, []).append(sig)
    w.kept_count += 1
    w.kept_bytes += size


def _take(fold: _Fold, w: _Waits, index: int, attempt: int, sig: SignalSent) -> None:
    """Iteration `index` (no longer waiting) takes `sig`: its result is the signal's data
    (an approval rejected fails it `Rejected`)."""
    assert fold.run.spec is not None
    why = rejection(fold.run.spec.step, sig) if w.tool.approval else None
    if why is None:
        _attempted(fold, index, attempt, approval_result(sig) if w.tool.approval else sig.data, None)
    else:
        _attempted(fold, index, attempt, None, ErrorInfo(type="Rejected", message=why))


def _unwait(w: _Waits, index: int) -> None:
    state = w.waiting.pop(index, None)
    if state is None:
        return
    keyed = w.by_key.get(state.key)
    if keyed is not None:
        keyed.remove(index)
        if not keyed:
            del w.by_key[state.key]


def _deadline(fold: _Fold, w: _Waits, fired: TimerFired) -> None:
    """A deadline's timer fired: every iteration still waiting with a deadline up to it
    ends (times out, or completes at its `until`)."""
    due = w.timers.pop(fired.timer_id, None)
    if due is None:
        return  # fired before (a redelivery), or not armed by this fold
    while w.deadlines and w.deadlines[0][0] <= due and not fold.run.finished:
        ms, index, attempt = heapq.heappop(w.deadlines)
        state = w.waiting.get(index)
        if state is None or state.attempt != attempt or state.deadline != ms:
            continue  # it took a signal, or waits again with another deadline
        _unwait(w, index)
        _expired(fold, w, index, attempt, state.key, ms, state.ends)


def _expired(fold: _Fold, w: _Waits, index: int, attempt: int, key: str, ms: int, ends: bool) -> None:
    if ends:
        _attempted(fold, index, attempt, {"until": iso_utc(ms / 1000)}, None)
        return
    assert fold.run.spec is not None
    keyed = f" (key {key!r})" if key else ""
    message = (
        f"step '{fold.run.spec.step}' iteration {index} waited for signal '{w.tool.signal}'{keyed}: "
        f"its deadline {iso_utc(ms / 1000)} passed"
    )
    _attempted(fold, index, attempt, None, ErrorInfo(type="WaitTimeout", message=message))
