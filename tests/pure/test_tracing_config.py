"""Tracing's configuration (actors/runtime/tracing.py): the standard OTEL_* variables
turn it on; a configuration that cannot be used is one log line and no tracing; W3C
trace context is read as the spec says (a malformed header is ignored)."""

from __future__ import annotations

import logging

import pytest

from actors.runtime import tracing

pytestmark = pytest.mark.timeout(30)


def test_off_unless_asked_on_when_asked_and_a_bad_configuration_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    try:
        assert not tracing.configure(["engine"], {})
        assert not tracing.configure(["engine"], {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
        assert not tracing.enabled()
        with caplog.at_level(logging.ERROR, logger="actors.tracing"):
            bad = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "pigeon"}
            assert not tracing.configure(["engine"], bad)
        assert not tracing.enabled()
        [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert "\n" not in line and "OTEL_EXPORTER_OTLP_PROTOCOL='pigeon'" in line
        # a collector named: on, with the role's service name and the pod's name
        good = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "HOSTNAME": "engine-7"}
        assert tracing.configure(["engine"], good)
        assert tracing._on is not None
        resource = tracing._on.provider.resource.attributes
        assert resource["service.name"] == "actors-engine" and resource["k8s.pod.name"] == "engine-7"
        tracing.shutdown()
        named = {**good, "OTEL_SERVICE_NAME": "billing-engine", "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=b%2D1,team=x"}
        assert tracing.configure(["engine"], named)
        assert tracing._on is not None
        resource = tracing._on.provider.resource.attributes
        assert (resource["service.name"], resource["k8s.pod.name"], resource["team"]) == ("billing-engine", "b-1", "x")
    finally:
        tracing.shutdown()
        tracing.use(None)


def test_w3c_trace_context_is_read_and_written_as_the_spec_says() -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    parent = tracing.parse_traceparent(tp, "congo=t61rcWkgMzE")
    assert parent is not None and parent.traceparent == tp and parent.remote and parent.sampled
    assert parent.headers() == {"traceparent": tp, "tracestate": "congo=t61rcWkgMzE"}
    for bad in (
        "",
        "garbage",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    ):
        assert tracing.parse_traceparent(bad) is None
    # derived ids: the same on every pod and every replay, different per thing
    assert tracing.trace_id_of("e1") == tracing.trace_id_of("e1") != tracing.trace_id_of("e2")
    assert tracing.span_id_of("e1", "step", "a", 1) != tracing.span_id_of("e1", "step", "a", 2)
    assert 0 < tracing.span_id_of("e1", "execution") < 2**64


def test_a_tracestate_is_kept_only_when_w3c_would_keep_it(caplog: pytest.LogCaptureFixture) -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.valid_tracestate(" congo=t61rcWkgMzE ,, rojo=00f067aa0ba902b7\t") == (
        "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )
    assert tracing.valid_tracestate("tenant@vendor=x") == "tenant@vendor=x"
    at_most = ",".join(f"k{i}=" + "v" * 10 for i in range(32))  # 32 members, 511 bytes
    assert len(at_most) <= 512 and tracing.valid_tracestate(at_most) == at_most
    with caplog.at_level(logging.DEBUG):
        for bad in (
            ",".join(f"k{i}=v" for i in range(33)),  # more than 32 members
            ",".join(f"k{i}=" + "v" * 60 for i in range(9)),  # 9 valid members, past 512 bytes
            "k=" + "v" * 60_000,  # the review's 60 KB
            "a=1,a=2",  # a key twice
            "Upper=1",
            "k=has,comma=no=",
            "k=",
            "k=\x7f",
        ):
            assert tracing.valid_tracestate(bad) is None, bad
            parent = tracing.parse_traceparent(tp, bad)
            assert parent is not None and parent.tracestate is None  # the traceparent stays, the state goes
            assert parent.headers() == {"traceparent": tp}
            parent.context()  # what every record's spans are built from: nothing to warn about
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # the client's side: a caller's current span with a state we would drop sends none
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    wide = TraceState([(f"k{i}", "v" * 200) for i in range(10)])
    span = NonRecordingSpan(SpanContext(1, 2, True, TraceFlags(TraceFlags.SAMPLED), wide))
    with trace.use_span(span):
        assert tracing.caller_headers() == {"traceparent": f"00-{1:032x}-{2:016x}-01"}


def test_otel_traces_exporter_is_a_list(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
    try:
        assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": " OTLP , console,otlp"}) == ["otlp", "console"]
        assert tracing.configure(["engine"], {**endpoint, "OTEL_TRACES_EXPORTER": "otlp,console"})
        assert tracing._on is not None
        processors = tracing._on.provider._active_span_processor._span_processors
        exporters = sorted(type(p.span_exporter).__name__ for p in processors)
        assert exporters == ["ConsoleSpanExporter", "OTLPSpanExporter"]
        tracing.shutdown()
        assert tracing.configure(["engine"], {"OTEL_TRACES_EXPORTER": "none,console"})  # `none` names nothing
        tracing.shutdown()
        assert not tracing.configure(["engine"], {**endpoint, "OTEL_TRACES_EXPORTER": "none"})
        assert not tracing.configure(["engine"], {**endpoint, "OTEL_TRACES_EXPORTER": " none , "})
        with caplog.at_level(logging.ERROR, logger="actors.tracing"):
            assert not tracing.configure(["engine"], {**endpoint, "OTEL_TRACES_EXPORTER": "otlp,pigeon"})
        assert not tracing.enabled()
        [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert "'pigeon'" in line
    finally:
        tracing.shutdown()
        tracing.use(None)


def test_an_http_span_carries_where_it_went_never_what_it_sent() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    tracing.provider_for_test(spans)
    try:
        # a password with an `@` in it, a path and a query made of the step's values
        url = "https://svc:p@ss@api.example/v1/customers/4111111111111111?token=s3cr3t#frag"
        headers: dict[str, str] = {}
        with tracing.http_client("GET", url, headers) as span:
            tracing.responded(span, 503)
        with tracing.http_client("POST", "http://u:pw@10.0.0.7:8080/hook?k=v", {}) as span:
            tracing.fail(span, TimeoutError("timed out after reading s3cr3t"))
        with tracing.http_client("GET", "http://h/", {}) as span:
            tracing.fail(span, type("ClientConnectorError", (OSError,), {})("refused: s3cr3t"))
        with tracing.http_client("GET", "http://h/", {}) as span:
            tracing.fail(span, type("CustomerDefinedError4111", (Exception,), {})())
    finally:
        tracing.use(None)
    first, second, third, fourth = spans.get_finished_spans()
    assert headers["traceparent"].split("-")[2] == format(first.context.span_id, "016x")
    assert dict(first.attributes or {}) == {
        "http.request.method": "GET",
        "url.scheme": "https",
        "server.address": "api.example",
        "server.port": 443,
        "http.response.status_code": 503,
        "error.type": "503",
    }
    assert dict(second.attributes or {}) == {
        "http.request.method": "POST",
        "url.scheme": "http",
        "server.address": "10.0.0.7",
        "server.port": 8080,
        "error.type": "timeout",
    }
    assert (third.attributes or {})["error.type"] == "connection"
    assert (fourth.attributes or {})["error.type"] == "other"
    for span in (first, second, third, fourth):
        said = " ".join(str(v) for v in (span.attributes or {}).values()) + str(span.status.description)
        for secret in ("ss@", "p@ss", "pw", "4111", "customers", "token", "s3cr3t", "frag", "Customer"):
            assert secret not in said, (secret, said)
