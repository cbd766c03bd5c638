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

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import os
import re
import threading
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
# W3C Trace Context `tracestate`: list-members `key=value` (the keys and values the spec
# allows, as OpenTelemetry's TraceState reads them), at most 32, and a whole header we
# keep of at most 512 bytes, the size the spec asks propagators to keep at least. It
# rides every record, command, loop spec and child start of an execution: a caller's
# 60 KB value would ride them all (and break a start whose payload nearly fills it)
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
TRACESTATE_MAX_MEMBERS = 32
TRACESTATE_MAX_BYTES = 512
# the OpenTelemetry context key under which a tool pod says "no spans here, only the
# context" (a loop iteration while iterations are not traced): the http tool then sends
# its `traceparent` (the loop's) without a client span of its own
_QUIET = otel_context.create_key("actors-untraced-iteration")


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


def valid_tracestate(value: str | None) -> str | None:
    """A W3C `tracestate` as we keep it (its members, whitespace around them dropped), or
    None when it is absent, empty or not one we keep: a malformed member, a key twice,
    more than 32 members, more than 512 bytes. Dropped whole, as a bad `traceparent` is
    (W3C: a vendor's state is all or nothing); never an error and never a log line (a
    caller's header is not ours to complain about, on every record that would carry it)."""
    if not value or len(value) > 4 * TRACESTATE_MAX_BYTES:  # no work on a huge one
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > TRACESTATE_MAX_MEMBERS:
        return None
    if not all(_TRACESTATE_MEMBER.fullmatch(m) for m in members):
        return None
    if len({m.partition("=")[0] for m in members}) != len(members):
        return None
    kept = ",".join(members)
    return kept if len(kept) <= TRACESTATE_MAX_BYTES else None


def parse_traceparent(value: str | None, tracestate: str | None = None) -> Parent | None:
    """A W3C `traceparent` (and its `tracestate`) as a remote parent; None when absent
    or malformed (a bad header is ignored, as the W3C spec asks, never an error). A
    `tracestate` is kept only when valid (`valid_tracestate`): else the parent has none."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(int(m.group(4), 16) & 1), True, valid_tracestate(tracestate))


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
    state = valid_tracestate(ctx.trace_state.to_header())
    return Parent(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, True, state).headers()


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


def exporter_names(environ: Mapping[str, str]) -> list[str] | None:
    """OTEL_TRACES_EXPORTER as the OpenTelemetry spec reads it: a comma-separated list
    (`otlp,console`), each named once; `none` names no exporter (alone: tracing off).
    None when the variable is not set."""
    given = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not given:
        return None
    names = [n.strip() for n in given.split(",")]
    return list(dict.fromkeys(n for n in names if n and n != "none"))


def wanted(environ: Mapping[str, str]) -> bool:
    """Do the `OTEL_*` variables ask for traces? An exporter named, or an OTLP
    endpoint given; `none` alone (or OTEL_SDK_DISABLED) says no."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = exporter_names(environ)
    if names is not None:
        return bool(names)
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

        # every exporter made before any is used: one that cannot be is the whole
        # configuration's error, not half a pod's tracing
        exporters = [_exporter(name, env) for name in exporter_names(env) or ["otlp"]]
        attributes: dict[str, Any] = {"service.name": f"actors-{'+'.join(roles)}"}
        host = env.get("ACTORS_POD_NAME") or env.get("HOSTNAME")  # the pod's name, as its leases say it
        if host:
            attributes |= {"service.instance.id": host, "k8s.pod.name": host}
        provider = TracerProvider(
            resource=Resource.create(attributes | _resource_env(env)),
            id_generator=_id_generator(),
            # no exit hook of the SDK's: its shutdown waits up to 30 s on a collector that
            # does not answer; `shutdown` below is the pod's, bounded
            shutdown_on_exit=False,
        )
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    except Exception as e:  # ImportError (no `otel` extra), ValueError (a bad variable)
        log.error("tracing off: the OTEL_* configuration cannot be used: %s", e)
        use(None)
        return False
    use(provider, iterations=env.get(ITERATIONS_ENV, "").strip().lower() in ("1", "true", "yes"))
    log.info("tracing on: spans exported by %s", ", ".join(type(e).__name__ for e in exporters))
    return True


# how long a stopping pod gives its exporters to send what is queued: a collector that
# does not answer must not keep the pod past its grace period (Kubernetes' default is 30 s,
# and the roles' drain comes first)
SHUTDOWN_WAIT = 3.0


def shutdown(wait: float = SHUTDOWN_WAIT) -> None:
    """Send what is queued and stop (a pod stopping), for at most `wait` seconds: what
    is not sent by then is lost. The SDK cannot bound it itself: its batch processor's
    `force_flush` ignores its timeout and its `shutdown` waits up to 30 s for the export
    under way (opentelemetry-python #4568, #4555), so both run on a daemon thread this
    waits for no longer; the process may exit while that thread still waits on the
    collector."""
    on = _on
    if on is None:
        return
    use(None)  # nothing more is made meanwhile

    def stop() -> None:
        with contextlib.suppress(Exception):
            on.provider.force_flush(int(wait * 1000))
        with contextlib.suppress(Exception):
            on.provider.shutdown()

    stopping = threading.Thread(target=stop, name="actors-tracing-shutdown", daemon=True)
    stopping.start()
    stopping.join(wait)
    if stopping.is_alive():
        log.warning("tracing: the collector took no spans for %gs; what was queued is dropped", wait)


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


def fail(span: Any, exc: BaseException) -> None:
    """An HTTP client span's request that got no response: ERROR, with its category
    (`http_error_type`) as `error.type` and status, never the exception's message."""
    if span is not None:
        category = http_error_type(exc)
        span.set_attribute("error.type", category)
        span.set_status(Status(StatusCode.ERROR, category))


def now() -> float:
    return time.time()


# --- a tool pod's side ----------------------------------------------------------------


# the data tools' run spans as database client spans (semantic conventions: `db.system.name`);
# only the system: a statement, table or database name is the step's value (sealed in the
# log when a payload key is set), so it stays out of the span
DB_SYSTEMS: dict[str, dict[str, Any]] = {
    "postgres": {"db.system.name": "postgresql"},
    "duckdb": {"db.system.name": "duckdb"},
}


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
            # the loop's context, current for the log lines and the http tool's
            # `traceparent`, marked so that no span is made under it (`http_client`)
            self.token = otel_context.attach(otel_context.set_value(_QUIET, True, parent.context()))
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
                attributes={
                    "actors.execution_id": eid,
                    "actors.step": cmd.step,
                    "actors.attempt": cmd.attempt_number,
                    **DB_SYSTEMS.get(cmd.kind, {}),
                },
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


# what a span says of an error whose type is sealed in the log (a payload key is set):
# a python step's error type is the class its code raised, which may be built from any
# value (actors/wire/secrecy.py), so it stays out of the span like the value itself
SEALED_ERROR = "error"


def span_error_type(error_type: str, *, sealed: bool) -> str:
    """An error's type as a span may carry it: as it is, or `SEALED_ERROR` when the
    deployment seals error types in the log."""
    return SEALED_ERROR if sealed else error_type


def http_error_type(exc: BaseException) -> str:
    """What an http client span's `error.type` says of a request that got no response:
    a fixed category (`timeout`, `connection`, `cancelled`, `client`: the client refused
    or could not read it, `other`), never a name or a message that came with it."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, TimeoutError):
        return "timeout"
    names = {c.__name__ for c in type(exc).__mro__}  # aiohttp's, without importing it here
    if isinstance(exc, OSError) or names & {"ClientConnectionError", "ClientPayloadError"}:
        return "connection"
    return "client" if "ClientError" in names else "other"


def _url_origin(url: str) -> dict[str, Any]:
    """The scheme, host and port of `url`: all an http span says of where it went. The
    path and the query are the step's values (templated from its input, a token in a
    query, sealed in the log when a payload key is set), the user info a credential;
    none is exported. `hostname` takes the host after the LAST `@` (a password with an
    `@` in it is not taken for the host)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:  # a bad port, a bad IPv6 literal: the request fails on its own
        return {}
    if not host:
        return {}
    scheme = parts.scheme.lower()
    port = port or {"http": 80, "https": 443}.get(scheme)
    attrs: dict[str, Any] = {"url.scheme": scheme, "server.address": host}
    if port is not None:
        attrs["server.port"] = port
    return attrs


@contextlib.contextmanager
def http_client(method: str, url: str, headers: dict[str, str]) -> Iterator[Any]:
    """An HTTP client span (semantic conventions: `http.request.method`, `url.scheme`,
    `server.address`, `server.port`, `http.response.status_code`; no `url.full`: see
    `_url_origin`) under the current context, whose `traceparent` (and `tracestate`)
    `headers` gets for the server; one the tool's own headers set wins. A loop iteration
    not traced (`ACTORS_TRACE_ITERATIONS` off) makes no span: the server gets the loop's
    context."""
    on = _on
    if on is None:
        yield None
        return
    if otel_context.get_value(_QUIET):
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid and not any(k.lower() == TRACEPARENT for k in headers):
            state = valid_tracestate(ctx.trace_state.to_header())
            headers.update(Parent(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, tracestate=state).headers())
        yield None
        return
    attrs = {"http.request.method": method, **_url_origin(url)}
    with live_span(method, kind=SpanKind.CLIENT, attributes=attrs) as span:
        ctx = span.get_span_context()
        if not any(k.lower() == TRACEPARENT for k in headers):
            state = ctx.trace_state.to_header()
            sent = Parent(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, tracestate=state or None)
            headers.update(sent.headers())
        yield span
