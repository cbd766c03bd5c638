"""Logs and metrics that join the trace: trace and span ids on the log lines written in a
span, the step histogram's exemplars, and /metrics in OpenMetrics when a scraper asks."""

from __future__ import annotations

import io
import logging
import socket

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from actors.pod.health import HealthServer, PodState
from actors.runtime import logtrace
from actors.runtime.metrics import observe_step, pod_registry

pytestmark = [pytest.mark.timeout(30)]

FORMAT = "%(levelname)s %(name)s: %(message)s"  # the pod's, less its time


def test_tracing_is_on_only_when_the_otel_variables_configure_it() -> None:
    assert not logtrace.configured({})
    assert not logtrace.configured({"OTEL_SERVICE_NAME": "engine"})  # naming a service exports nothing
    assert logtrace.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert logtrace.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert logtrace.configured({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not logtrace.configured({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not logtrace.configured({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


def test_off_nothing_is_installed_and_lines_are_as_before() -> None:
    log, out = _logger("actors.test.off")
    handler = log.handlers[0]
    assert not logtrace.install(enabled=False, logger=log)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("step"):
        log.warning("in a span")
    assert handler.filters == []
    assert out.getvalue() == "WARNING actors.test.off: in a span\n"


@pytest.mark.asyncio
async def test_lines_and_exemplars_carry_the_current_span_and_metrics_speak_openmetrics() -> None:
    log, out = _logger("actors.test.on")
    tracer = TracerProvider().get_tracer("test")
    unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    server = HealthServer(state=PodState(), registry=pod_registry(), host="127.0.0.1", port=0)
    assert logtrace.install(enabled=True, logger=log)
    try:
        assert logtrace.install(enabled=True, logger=log)  # again: one filter, not two
        assert len(log.handlers[0].filters) == 1
        log.warning("before")
        with tracer.start_as_current_span("step") as span:
            ctx = span.get_span_context()
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("failed")
            observe_step("logtrace-test", "ok", 0.003)
        with unsampled.start_as_current_span("not kept"):
            observe_step("logtrace-test", "ok", 0.2)  # a trace the backend never gets: no exemplar
        log.warning("after")
        port = await server.start()
        url = f"http://127.0.0.1:{port}/metrics"
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as r:
                om_type, om = r.headers["Content-Type"], await r.text()
            async with http.get(url) as r:
                plain_type, plain = r.headers["Content-Type"], await r.text()
            # a version prometheus-client cannot read (a TypeError inside it): the 0.0.4 text, not a 500
            async with http.get(url, headers={"Accept": "application/openmetrics-text;version=abc"}) as r:
                odd_status, odd_type, odd = r.status, r.headers["Content-Type"], await r.text()
    finally:
        await server.stop()
        logtrace.uninstall()

    trace_id, span_id = format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
    lines = out.getvalue().splitlines()
    assert lines[0] == "WARNING actors.test.on: before"
    # the ids end the record's first line, before its traceback
    assert lines[1] == f"ERROR actors.test.on: failed trace_id={trace_id} span_id={span_id}"
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "WARNING actors.test.on: after"
    assert sum("trace_id=" in line for line in lines) == 1

    assert om_type.startswith("application/openmetrics-text; version=1.0.0")
    assert om.endswith("# EOF\n")
    buckets = {
        s.labels["le"]: s
        for f in openmetrics_families(om)  # type: ignore[no-untyped-call]
        for s in f.samples
        if s.name == "actors_step_seconds_bucket" and s.labels.get("kind") == "logtrace-test"
    }
    kept = {le: s.exemplar for le, s in buckets.items() if s.exemplar is not None}
    assert set(kept) == {"0.005"}  # the bucket the sampled observation fell in, and only it
    assert kept["0.005"].labels == {"trace_id": trace_id, "span_id": span_id}
    assert kept["0.005"].value == 0.003
    assert buckets["0.25"].value == 2

    assert plain_type == "text/plain; version=0.0.4; charset=utf-8"
    assert "# {" not in plain  # the 0.0.4 text has no exemplars
    counts = {
        s.labels["le"]: s.value
        for f in text_string_to_metric_families(plain)
        for s in f.samples
        if s.name == "actors_step_seconds_bucket" and s.labels.get("kind") == "logtrace-test"
    }
    assert counts["0.005"] == 1 and counts["+Inf"] == 2
    assert (odd_status, odd_type) == (200, plain_type) and "actors_step_seconds_bucket" in odd


@pytest.mark.timeout(20)  # the SDK alone waits 30 s and more on a collector that never answers
def test_a_collector_that_never_answers_does_not_hold_a_stopping_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors.runtime import tracing

    with socket.create_server(("127.0.0.1", 0)) as hung:  # accepts (the backlog), never answers
        port = hung.getsockname()[1]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "60")  # the exporter's own wait, per request
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")  # the exporter reads it here
        assert tracing.configure(["engine"], {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
        try:
            for i in range(3):
                tracing.emit("step x", parent=None, trace_id=1, span_id=i + 1, start=1.0, end=2.0, attributes={})
            tracing.shutdown()  # what a pod does after its roles stop: bounded (tracing.SHUTDOWN_WAIT)
            assert not tracing.enabled()
        finally:
            tracing.use(None)


def _logger(name: str) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(FORMAT))
    log = logging.getLogger(name)
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, out
