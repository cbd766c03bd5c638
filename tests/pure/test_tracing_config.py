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
