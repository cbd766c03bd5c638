"""An execution's spans, as its engine actor folds its log (docs/tracing.md).

Spans are built from what the fold decides (its events) and the inputs that end
them, with the times the log records: the execution (start record to terminal
lifecycle event), each step activation (`step.enter` to `step.exit`, retries and
on_error decisions as span events), each attempt (`command.issued` to its result or
cancel), each loop (`iterator.started` to the counter's verdict, its counts and rate as
attributes). Every fold feeds this, a replay's too, so an actor rebuilt from the log
knows what is open; a span is queued only for an input whose decision this pod writes
(`emit`), and exported once that decision is stored (`flush`, after the publish). A
replay that finds the decision in the log queues nothing: no second set of spans. The
fold never reads any of this.

The context travels on the messages the engine publishes (`Carrier`): a command
carries its attempt's span, a child's start the same (the child's execution span hangs
under the parent's attempt), a loop's spec its loop's span (the counter passes it on
to the iterations' commands).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.trace import SpanKind

from actors.core.effects import Effects
from actors.runtime import tracing
from actors.runtime.tracing import Parent, span_id_of
from actors.wire.events import (
    ActivationStatus,
    CommandCancelledData,
    CommandIssuedData,
    ExecutionCancelledData,
    FailureDecidedData,
    IteratorCompletedData,
    IteratorStartedData,
    PlaybookCompletedData,
    PlaybookFailedData,
    RetryScheduledData,
    StepEnterData,
    StepExitData,
)
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    Command,
    IteratorCompleted,
    IteratorFailed,
    LoopSpec,
    StartMessage,
    StartRecord,
)


class Carrier(Protocol):
    """The W3C headers each message an outbox publishes carries (None: none)."""

    def command(self, cmd: Command) -> dict[str, str] | None: ...
    def start(self, s: StartMessage) -> dict[str, str] | None: ...
    def loop(self, spec: LoopSpec) -> dict[str, str] | None: ...


def _messaging(destination: str) -> dict[str, Any]:
    return {"messaging.system": "nats", "messaging.destination.name": destination, "messaging.operation.type": "send"}


@dataclass(slots=True)
class _Open:
    """A span begun in the log, not yet ended."""

    start: float
    attributes: dict[str, Any]
    parent_id: int
    events: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)


@dataclass(slots=True)
class _Span:
    name: str
    span_id: int
    parent_id: int | None  # None: the execution span (its parent is the caller's, or none)
    start: float
    end: float
    attributes: dict[str, Any]
    kind: SpanKind = SpanKind.INTERNAL
    events: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None


class ExecutionTrace:
    """One execution's spans (see the module docstring). Made only when tracing is on."""

    def __init__(self, execution_id: str, *, sealed: bool = False) -> None:
        """`sealed`: the deployment seals payloads (a payload key is set), error types
        included, so spans name no error type (`tracing.span_error_type`)."""
        self.execution_id = execution_id
        self.sealed = sealed
        self.span_id = span_id_of(execution_id, "execution")
        self.caller: Parent | None = None
        self.root: Parent | None = None  # the execution span's context, once its start record is folded
        self.base: dict[str, Any] = {"actors.execution_id": execution_id}
        self.started_at = 0.0
        self.steps: dict[tuple[str, int], _Open] = {}
        self.attempts: dict[str, _Open] = {}  # by command id
        self.loops: dict[str, _Open] = {}  # by loop id
        self.pending: list[_Span] = []
        self.ended = False

    # --- what the log says ---------------------------------------------------------

    def clear(self) -> None:
        """Before a replay: everything is folded again."""
        self.steps.clear()
        self.attempts.clear()
        self.loops.clear()
        self.pending.clear()
        self.ended = False

    def started(self, record: StartRecord, at: float) -> None:
        if self.root is not None:
            return  # a second start record under the same id changes nothing
        self.caller = tracing.parse_traceparent(record.traceparent, record.tracestate)
        trace_id = self.caller.trace_id if self.caller is not None else tracing.trace_id_of(self.execution_id)
        sampled = tracing.root_sampled(self.caller, trace_id)
        self.root = Parent(trace_id, self.span_id, sampled, False, self.caller.tracestate if self.caller else None)
        self.base = {
            "actors.execution_id": self.execution_id,
            "actors.playbook": record.playbook_path,
            "actors.version": record.playbook_version if record.playbook_version is not None else 0,
        }
        if record.parent is not None:
            self.base["actors.parent_execution_id"] = record.parent.execution_id
        self.started_at = at

    def observe(self, inp: Any, fx: Effects | None, at: float, *, emit: bool) -> None:
        """One folded input and its effects; `emit`: this pod writes its decision."""
        if self.root is None:
            return
        if isinstance(inp, (CallDone, CallError, ChunkDone)):
            # an error's type alone: its message may hold values (sealed in the log with a payload key)
            error = tracing.span_error_type(inp.error.type, sealed=self.sealed) if isinstance(inp, CallError) else None
            worker = {"actors.worker": inp.worker} if inp.worker else {}
            self._end_attempt(inp.command_id, at, emit, error=error, more=worker)
        elif isinstance(inp, (IteratorCompleted, IteratorFailed)):
            failed = isinstance(inp, IteratorFailed)
            self._end_loop(inp.loop_id, at, emit, inp.total, inp.succeeded, inp.failed, failed=failed)
        if fx is None:
            return
        for ev in (*fx.events, *fx.lifecycle):
            self._event(ev, emit)

    def _event(self, ev: Any, emit: bool) -> None:
        data, at, step = ev.data, ev.at, ev.step or ""
        if isinstance(data, StepEnterData):
            attrs = {**self.base, "actors.step": step, "actors.activation": data.activation}
            self.steps[(step, data.activation)] = _Open(at, attrs, self.span_id)
        elif isinstance(data, CommandIssuedData):
            attrs = {
                **self.base,
                "actors.step": step,
                "actors.attempt": data.attempt_number,
                "actors.command_id": data.command_id,
                "actors.tool.kind": data.kind,
                **_messaging(f"cmd.{data.kind}"),
            }
            if isinstance(data.child_execution_id, str):
                attrs["actors.child_execution_id"] = data.child_execution_id
            self.attempts[data.command_id] = _Open(
                at, attrs, span_id_of(self.execution_id, "step", step, data.activation)
            )
        elif isinstance(data, CommandCancelledData):
            self._end_attempt(data.command_id, at, emit, error="cancelled")
        elif isinstance(data, RetryScheduledData):
            self._step_event(
                step,
                data.activation,
                "retry.scheduled",
                at,
                {
                    "actors.attempt": data.attempt_number,
                    "actors.retry.delay_s": data.delay,
                    "actors.retry.reason": data.reason,
                },
            )
        elif isinstance(data, FailureDecidedData):
            self._step_event(
                step,
                data.activation,
                "failure.decided",
                at,
                {
                    "actors.attempt": data.attempt_number,
                    "actors.decision": data.decision,
                    "error.type": tracing.span_error_type(str(data.error.get("type", "")), sealed=self.sealed),
                },
            )
        elif isinstance(data, IteratorStartedData):
            attrs = {
                **self.base,
                "actors.step": step,
                "actors.loop_id": data.loop_id,
                "actors.loop.size": data.size,
                "actors.loop.mode": data.mode,
                "actors.loop.concurrency": data.concurrency,
                **_messaging("loop.spec"),
            }
            self.loops[data.loop_id] = _Open(at, attrs, span_id_of(self.execution_id, "step", step, data.activation))
        elif isinstance(data, IteratorCompletedData):
            self._end_loop(data.loop_id, at, emit, data.total, data.succeeded, data.failed, failed=False)
        elif isinstance(data, StepExitData):
            self._end_step(step, data, at, emit)
        elif isinstance(data, (PlaybookCompletedData, PlaybookFailedData, ExecutionCancelledData)):
            self._end_execution(data, at, emit)

    def _step_event(self, step: str, activation: int, name: str, at: float, attrs: dict[str, Any]) -> None:
        opened = self.steps.get((step, activation))
        if opened is not None:
            opened.events.append((name, at, attrs))

    def _end_attempt(
        self, command_id: str, at: float, emit: bool, *, error: str | None = None, more: Mapping[str, Any] = {}
    ) -> None:
        opened = self.attempts.pop(command_id, None)
        if opened is None or not emit:
            return
        step = opened.attributes.get("actors.step", "")
        self.pending.append(
            _Span(
                f"attempt {step}",
                span_id_of(self.execution_id, "attempt", command_id),
                opened.parent_id,
                opened.start,
                at,
                {**opened.attributes, **more},
                SpanKind.PRODUCER,
                error=error,
            )
        )

    def _end_loop(
        self, loop_id: str, at: float, emit: bool, total: int, succeeded: int, failed_n: int, *, failed: bool
    ) -> None:
        opened = self.loops.pop(loop_id, None)
        if opened is None or not emit:
            return
        took = max(at - opened.start, 0.0)
        attrs = {
            **opened.attributes,
            "actors.loop.total": total,
            "actors.loop.succeeded": succeeded,
            "actors.loop.failed": failed_n,
            "actors.loop.rate_per_s": round(total / took, 3) if took > 0 else float(total),
        }
        self.pending.append(
            _Span(
                f"loop {opened.attributes.get('actors.step', '')}",
                span_id_of(self.execution_id, "loop", loop_id),
                opened.parent_id,
                opened.start,
                at,
                attrs,
                SpanKind.PRODUCER,
                error=f"{failed_n} of {total} iterations failed" if failed else None,
            )
        )

    def _end_step(self, step: str, data: StepExitData, at: float, emit: bool) -> None:
        opened = self.steps.pop((step, data.activation), None)
        if opened is None or not emit:
            return
        error = None
        if data.status == ActivationStatus.FAILED:
            err = data.error if isinstance(data.error, dict) else {}
            error = tracing.span_error_type(str(err.get("type") or "failed"), sealed=self.sealed)
        attrs = {**opened.attributes, "actors.step.status": str(data.status)}
        span_id = span_id_of(self.execution_id, "step", step, data.activation)
        self.pending.append(
            _Span(f"step {step}", span_id, opened.parent_id, opened.start, at, attrs, events=opened.events, error=error)
        )

    def _end_execution(self, data: Any, at: float, emit: bool) -> None:
        if self.ended:
            return
        self.ended = True
        if not emit:
            return
        # what the end cut short (a cancel, a failure elsewhere) ends with it
        for cid in list(self.attempts):
            self._end_attempt(cid, at, emit, error="unfinished: the execution ended")
        for lid, opened in list(self.loops.items()):
            self.loops.pop(lid)
            self.pending.append(
                _Span(
                    f"loop {opened.attributes.get('actors.step', '')}",
                    span_id_of(self.execution_id, "loop", lid),
                    opened.parent_id,
                    opened.start,
                    at,
                    opened.attributes,
                    SpanKind.PRODUCER,
                    error="unfinished: the execution ended",
                )
            )
        for (step, activation), opened in list(self.steps.items()):
            self.steps.pop((step, activation))
            span_id = span_id_of(self.execution_id, "step", step, activation)
            self.pending.append(
                _Span(
                    f"step {step}",
                    span_id,
                    opened.parent_id,
                    opened.start,
                    at,
                    opened.attributes,
                    events=opened.events,
                    error="unfinished: the execution ended",
                )
            )
        status = (
            "COMPLETED"
            if isinstance(data, PlaybookCompletedData)
            else "FAILED"
            if isinstance(data, PlaybookFailedData)
            else "CANCELLED"
        )
        error = None
        if isinstance(data, PlaybookFailedData):
            error = tracing.span_error_type(str(data.error.get("type") or "failed"), sealed=self.sealed)
        elif isinstance(data, ExecutionCancelledData):
            error = "cancelled"
        start = data.started_at if data.started_at else self.started_at
        attrs = {**self.base, "actors.execution.status": status}
        self.pending.append(
            _Span(
                f"execution {self.base.get('actors.playbook', '')}", self.span_id, None, start, at, attrs, error=error
            )
        )

    # --- export ----------------------------------------------------------------------

    def flush(self) -> None:
        """Export the spans of decisions now stored."""
        root = self.root
        if not self.pending or root is None:
            return
        spans, self.pending = self.pending, []
        for s in spans:
            parent = self.caller if s.parent_id is None else root.child(s.parent_id)
            tracing.emit(
                s.name,
                parent=parent,
                trace_id=root.trace_id,
                span_id=s.span_id,
                start=s.start,
                end=s.end,
                attributes=s.attributes,
                kind=s.kind,
                events=s.events,
                error=s.error,
            )

    # --- what travels (Carrier) --------------------------------------------------------

    def command(self, cmd: Command) -> dict[str, str] | None:
        if self.root is None:
            return None
        return self.root.child(span_id_of(self.execution_id, "attempt", cmd.command_id)).headers()

    def start(self, s: StartMessage) -> dict[str, str] | None:
        if self.root is None or s.parent is None or not s.parent.command_id:
            return None
        return self.root.child(span_id_of(self.execution_id, "attempt", s.parent.command_id)).headers()

    def loop(self, spec: LoopSpec) -> dict[str, str] | None:
        if self.root is None:
            return None
        return self.root.child(span_id_of(self.execution_id, "loop", spec.loop_id)).headers()


class LoopCarrier:
    """A counter's loop: its iterations' commands and children hang under the loop's
    span, whose context came on the loop's spec (its NATS headers, kept in the log)."""

    def __init__(self, parent: Parent) -> None:
        self.parent = parent
        self.headers = parent.headers()

    def command(self, cmd: Command) -> dict[str, str] | None:
        return self.headers

    def start(self, s: StartMessage) -> dict[str, str] | None:
        return self.headers

    def loop(self, spec: LoopSpec) -> dict[str, str] | None:
        return None


def loop_carrier(headers: Mapping[str, str] | None) -> LoopCarrier | None:
    """The carrier of a loop whose spec came with `headers` (None: tracing off, or a
    spec sent untraced)."""
    if not tracing.enabled():
        return None
    parent = tracing.from_headers(headers)
    return LoopCarrier(parent) if parent is not None else None


def traced_loop(carrier: Carrier | None) -> Parent | None:
    """The loop span's context, where a counter's outbox carries one."""
    return carrier.parent if isinstance(carrier, LoopCarrier) else None
