"""OpenTelemetry traces (docs/tracing.md): one trace per execution, across the engine,
the counter, the tool pods, their outbound HTTP calls and the caller's own trace.

Off unless the standard `OTEL_*` variables ask for it (`configure`); off, every hook
here returns at its first line and no span object is made: the step path pays one
global read. On, the SDK (the `otel` extra) exports through a batch processor, off the
event loop.

What makes the spans right under replays and redeliveries is in their ids, not in
which pod runs: an execution's trace id is its caller's (the `traceparent` its start
record holds) or one derived from its id, and each span's id is derived from what it
stands for (the execution, a step activation, an attempt's command id, a loop id), so
spans made twice would be the same span. They are made once all the same: by the pod
that writes the record that ends them (actors/runtime/exectrace.py), with the start and
end times the log records; a replay that finds the record written emits nothing. The
spans never feed a decision: the engine reads its log, never this module.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

if TYPE_CHECKING:
    from actors.wire.messages import Command

log = logging.getLogger("actors.tracing")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# loop iterations get a span each only when asked (a 100,000-item loop would make
# 100,000 spans); the loop's own span sums them up either way
ITERATIONS_ENV = "ACTORS_TRACE_ITERATIONS"
SCOPE = "actors"

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


# --- ids and W3C trace context ------------------------------------------------------


def _digest(size: int, parts: Sequence[object]) -> int:
    h = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=size, person=b"actors-trace")
    return int.from_bytes(h.digest(), "big") or 1  # never the invalid all-zero id


def trace_id_of(execution_id: str) -> int:
    """The trace id of an execution started with no caller's context: the same on every
    pod and every replay."""
    return _digest(16, ("trace", execution_id))


def span_id_of(*parts: object) -> int:
    """A span's id, from what the span stands for (see the module docstring)."""
    return _digest(8, parts)


@dataclass(frozen=True, slots=True)
class Parent:
    """A span context to hang spans under: a caller's (remote) or one of ours."""

    trace_id: int
    span_id: int
    sampled: bool = True
    remote: bool = False
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    def headers(self) -> dict[str, str]:
        """The W3C headers that carry this context (on a NATS message or an HTTP request)."""
        out = {TRACEPARENT: self.traceparent}
        if self.tracestate:
            out[TRACESTATE] = self.tracestate
        return out

    def child(self, span_id: int) -> Parent:
        """The context of a span of ours under this one."""
        return Parent(self.trace_id, span_id, self.sampled, False, self.tracestate)

    def context(self) -> otel_context.Context:
        state = TraceState.from_header([self.tracestate]) if self.tracestate else None
        ctx = SpanContext(
            self.trace_id,
            self.span_id,
            is_remote=self.remote,
            trace_flags=TraceFlags(TraceFlags.SAMPLED if self.sampled else TraceFlags.DEFAULT),
            trace_state=state,
        )
        return trace.set_span_in_context(NonRecordingSpan(ctx))


def parse_traceparent(value: str | None, tracestate: str | None = None) -> Parent | None:
    """A W3C `traceparent` (and its `tracestate`) as a remote parent; None when absent
    or malformed (a bad header is ignored, as the W3C spec asks, never an error)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(int(m.group(4), 16) & 1), True, tracestate or None)


def from_headers(headers: Mapping[str, str] | None) -> Parent | None:
    if not headers:
        return None
    return parse_traceparent(headers.get(TRACEPARENT), headers.get(TRACESTATE))


def caller_headers() -> dict[str, str]:
    """The caller's current trace context as W3C headers (empty when it has none): what
    the client's `start` puts on a start message. Read through the API alone, so it
    works with whatever SDK the caller set up (or none)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        # a process with no span of its own (the CLI in a traced script): the context
        # its environment hands down, as OpenTelemetry's environment carrier names it
        env = parse_traceparent(os.environ.get("TRACEPARENT"), os.environ.get("TRACESTATE"))
        return env.headers() if env is not None else {}
    parent = Parent(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, True, ctx.trace_state.to_header() or None)
    return parent.headers()


# --- the provider -------------------------------------------------------------------

_IDS: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("actors_trace_ids", default=None)


class _Tracing:
    """What is set up when tracing is on: the tracer, and whether loop iterations get spans."""

    def __init__(self, provider: Any, iterations: bool) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)
        self.iterations = iterations

    def sampled(self, parent: Parent | None, trace_id: int, name: str) -> bool:
        """The sampler's word on an execution's root span, asked up front: its children
        are emitted before it (it ends last) and must carry its decision."""
        ctx = parent.context() if parent is not None else None
        return bool(self.provider.sampler.should_sample(ctx, trace_id, name).decision.is_sampled())


_on: _Tracing | None = None


def enabled() -> bool:
    return _on is not None


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class DerivedIds(RandomIdGenerator):
        """The ids `emit` derived, where it set them; random ids elsewhere (live spans)."""

        def generate_span_id(self) -> int:
            ids = _IDS.get()
            return ids[1] if ids is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            ids = _IDS.get()
            return ids[0] if ids is not None else super().generate_trace_id()

    return DerivedIds()


def provider_for_test(exporter: Any, *, iterations: bool = False) -> Any:
    """A provider exporting every span at once to `exporter` (tests: the SDK's
    InMemorySpanExporter), installed as this process's (`use`)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    provider = TracerProvider(
        sampler=ALWAYS_ON, resource=Resource.create({"service.name": "actors-test"}), id_generator=_id_generator()
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use(provider, iterations=iterations)
    return provider


def use(provider: Any | None, *, iterations: bool = False) -> None:
    """Trace through `provider` (an SDK TracerProvider made with this module's id
    generator), or stop tracing (None)."""
    global _on
    _on = _Tracing(provider, iterations) if provider is not None else None


def wanted(environ: Mapping[str, str]) -> bool:
    """Do the `OTEL_*` variables ask for traces? An exporter named, or an OTLP
    endpoint given; `none` (or OTEL_SDK_DISABLED) says no."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: this pod exports otlp or console")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    if protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()  # endpoint, headers, timeout: its own OTEL_EXPORTER_OTLP_* variables


def _resource_env(env: Mapping[str, str]) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES (`key=value,...`, values percent-encoded) and
    OTEL_SERVICE_NAME: what a pod's own defaults give way to."""
    found = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            found[key.strip()] = urllib.parse.unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME", "").strip():
        found["service.name"] = env["OTEL_SERVICE_NAME"].strip()
    return found


def configure(roles: Sequence[str], environ: Mapping[str, str] | None = None) -> bool:
    """Set up tracing for a pod of `roles` from the `OTEL_*` variables; True when on.
    Service name: OTEL_SERVICE_NAME, else `actors-<role>` (roles joined by `+`); the
    pod's name (ACTORS_POD_NAME, else HOSTNAME) is `service.instance.id` and `k8s.pod.name` unless
    OTEL_RESOURCE_ATTRIBUTES says otherwise. A configuration that cannot be used (an
    unknown exporter or protocol, the `otel` extra not installed) is said in one line
    and the pod runs without tracing."""
    env = os.environ if environ is None else environ
    if not wanted(env):
        use(None)
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter = _exporter(env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp", env)
        attributes: dict[str, Any] = {"service.name": f"actors-{'+'.join(roles)}"}
        host = env.get("ACTORS_POD_NAME") or env.get("HOSTNAME")  # the pod's name, as its leases say it
        if host:
            attributes |= {"service.instance.id": host, "k8s.pod.name": host}
        provider = TracerProvider(
            resource=Resource.create(attributes | _resource_env(env)), id_generator=_id_generator()
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
    except Exception as e:  # ImportError (no `otel` extra), ValueError (a bad variable)
        log.error("tracing off: the OTEL_* configuration cannot be used: %s", e)
        use(None)
        return False
    use(provider, iterations=env.get(ITERATIONS_ENV, "").strip().lower() in ("1", "true", "yes"))
    log.info("tracing on: spans exported by %s", type(exporter).__name__)
    return True


def shutdown() -> None:
    """Flush what is queued and stop (a pod stopping)."""
    on = _on
    if on is not None:
        with contextlib.suppress(Exception):
            on.provider.shutdown()


def iterations_traced() -> bool:
    return _on is not None and _on.iterations


def root_sampled(parent: Parent | None, trace_id: int) -> bool:
    """Whether an execution whose trace is `trace_id` (under `parent`) is sampled."""
    return _on is not None and _on.sampled(parent, trace_id, "execution")


# --- spans --------------------------------------------------------------------------


def _ns(t: float) -> int:
    return int(t * 1e9)


def emit(
    name: str,
    *,
    parent: Parent | None,
    trace_id: int,
    span_id: int,
    start: float,
    end: float,
    attributes: Mapping[str, Any],
    kind: SpanKind = SpanKind.INTERNAL,
    events: Sequence[tuple[str, float, Mapping[str, Any]]] = (),
    error: str | None = None,
) -> None:
    """One finished span with the ids and times given (taken from the log)."""
    on = _on
    if on is None:
        return
    token = _IDS.set((trace_id, span_id))
    try:
        span = on.tracer.start_span(
            name,
            context=parent.context() if parent is not None else otel_context.Context(),
            kind=kind,
            attributes=dict(attributes),
            start_time=_ns(start),
        )
    finally:
        _IDS.reset(token)
    for ev_name, at, ev_attrs in events:
        span.add_event(ev_name, dict(ev_attrs), timestamp=_ns(at))
    if error is not None:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=_ns(max(end, start)))


@contextlib.contextmanager
def handling(parent: Parent | None) -> Iterator[None]:
    """`parent` as the current span context while a pod works for it: log lines written
    meanwhile find its trace and span ids (`trace.get_current_span()`), and what is
    started meanwhile (an HTTP request) hangs under it."""
    if parent is None or _on is None:
        yield
        return
    token = otel_context.attach(parent.context())
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def live_span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    span_id: int | None = None,
    start: float | None = None,
) -> Iterator[Any]:
    """A span around work this pod does now, under the current context, current while
    it runs; yields the span (None when tracing is off). `span_id`: a derived id."""
    on = _on
    if on is None:
        yield None
        return
    parent_ctx = trace.get_current_span().get_span_context()
    token = _IDS.set((parent_ctx.trace_id, span_id)) if span_id is not None and parent_ctx.is_valid else None
    try:
        span = on.tracer.start_span(
            name, kind=kind, attributes=dict(attributes or {}), start_time=_ns(start) if start is not None else None
        )
    finally:
        if token is not None:
            _IDS.reset(token)
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        yield span


def responded(span: Any, status: int) -> None:
    """An HTTP client span's response: its status code, an error from 400 on."""
    if span is not None:
        span.set_attribute("http.response.status_code", status)
        if status >= 400:
            span.set_status(Status(StatusCode.ERROR, str(status)))
            span.set_attribute("error.type", str(status))


def fail(span: Any, message: str) -> None:
    if span is not None:
        span.set_status(Status(StatusCode.ERROR, message))


def now() -> float:
    return time.time()


# --- a tool pod's side ----------------------------------------------------------------


class ToolCall:
    """A command run on a tool pod: a `process` span (messaging, consumer) from when the
    command was stored to its answer, with the queue wait as an attribute, and a `tool`
    span for the run itself. Current while it runs: an HTTP request hangs under it. A
    loop's iteration gets spans only when iterations are traced (`ACTORS_TRACE_ITERATIONS`);
    its loop's context is current all the same. Ids are derived from the command and
    its delivery: a redelivery that runs the tool again is work done again."""

    def __init__(
        self, on: _Tracing, cmd: Command, headers: Mapping[str, str] | None, stored: float | None, delivered: int
    ) -> None:
        eid = cmd.execution_id
        parent = from_headers(headers)
        if parent is None:  # sent untraced: the trace its execution would have, had it no caller
            trace_id = trace_id_of(eid)
            parent = Parent(
                trace_id, span_id_of(eid, "attempt", cmd.command_id), on.sampled(None, trace_id, "execution")
            )
        self.spans: list[Any] = []
        iteration = cmd.iteration_index is not None or cmd.chunk is not None
        if iteration and not on.iterations:
            self.token = otel_context.attach(parent.context())
            return
        now_s = time.time()
        attrs: dict[str, Any] = {
            "messaging.system": "nats",
            "messaging.destination.name": f"cmd.{cmd.kind}",
            "messaging.operation.type": "process",
            "actors.execution_id": eid,
            "actors.step": cmd.step,
            "actors.attempt": cmd.attempt_number,
            "actors.command_id": cmd.command_id,
            "actors.tool.kind": cmd.kind,
            "actors.delivery": delivered,
        }
        if cmd.iteration_index is not None:
            attrs["actors.iteration"] = cmd.iteration_index
        if stored is not None:
            attrs["actors.queue_wait_s"] = round(max(now_s - stored, 0.0), 6)
        ids = (eid, "call", cmd.command_id, cmd.iteration_index, delivered)
        token = _IDS.set((parent.trace_id, span_id_of(*ids)))
        try:
            process = on.tracer.start_span(
                f"cmd.{cmd.kind} process",
                context=parent.context(),
                kind=SpanKind.CONSUMER,
                attributes=attrs,
                start_time=_ns(stored) if stored is not None and stored <= now_s else None,
            )
            _IDS.set((parent.trace_id, span_id_of(*ids, "run")))
            run = on.tracer.start_span(
                f"tool {cmd.kind}",
                context=trace.set_span_in_context(process),
                attributes={"actors.execution_id": eid, "actors.step": cmd.step, "actors.attempt": cmd.attempt_number},
            )
        finally:
            _IDS.reset(token)
        self.spans = [run, process]
        self.token = otel_context.attach(trace.set_span_in_context(run))

    def outcome(self, error: str | None) -> None:
        """The tool is done (`error`: why it failed): its run span ends; the process span
        ends once the answer is stored (`end`)."""
        if error is not None:
            for span in self.spans:
                span.set_status(Status(StatusCode.ERROR, error))
        if self.spans:
            self.spans[0].end()

    def end(self) -> None:
        for span in self.spans:
            if span.is_recording():  # the run span ended at `outcome`
                span.end()
        self.spans = []
        otel_context.detach(self.token)


def tool_call(
    cmd: Command, headers: Mapping[str, str] | None, stored: datetime | None, delivered: int
) -> ToolCall | None:
    """The command's spans, begun now (None when tracing is off): `outcome`, then `end`.
    `stored`: when the command was stored (its JetStream timestamp)."""
    on = _on
    if on is None:
        return None
    return ToolCall(on, cmd, headers, stored.timestamp() if stored is not None else None, delivered)


@contextlib.contextmanager
def http_client(method: str, url: str, headers: dict[str, str]) -> Iterator[Any]:
    """An HTTP client span (semantic conventions: `http.request.method`, `url.full`,
    `http.response.status_code`) under the current context, whose `traceparent` (and
    `tracestate`) `headers` gets for the server; one the tool's own headers set wins."""
    on = _on
    if on is None:
        yield None
        return
    # no query, no user info: either may hold a secret
    attrs = {"http.request.method": method, "url.full": re.sub(r"//[^/@]*@", "//", url.split("?", 1)[0])}
    with live_span(method, kind=SpanKind.CLIENT, attributes=attrs) as span:
        ctx = span.get_span_context()
        if not any(k.lower() == TRACEPARENT for k in headers):
            state = ctx.trace_state.to_header()
            sent = Parent(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, tracestate=state or None)
            headers.update(sent.headers())
        yield span
