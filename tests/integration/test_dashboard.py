"""deploy/grafana/actors-dashboard.json: valid Grafana dashboard JSON, and every metric it
queries is one a pod serves, read from a pod's registry rendered against a real
JetStream (so a renamed or dropped metric breaks this test, not the dashboard)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from actors.pod.health import PodState
from actors.pod.roles import ROLES, connect
from actors.runtime.metrics import (
    PROCESS_METRICS,
    ConsumerCollector,
    StepSeconds,
    consumers_for,
    pod_registry,
    resident_actors,
)
from streams.layout import Layout, ensure
from streams.server import NatsServer

pytestmark = [pytest.mark.timeout(30)]

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "actors-dashboard.json"
SUFFIXES = ("_bucket", "_count", "_sum")  # a histogram's series
# PromQL words that look like a metric name in an expression
PROMQL = {"sum", "max", "min", "count", "rate", "increase", "delta", "deriv", "by", "le", "vector", "or"}
PROMQL |= {"histogram_quantile"}


class _Resident:
    async def collect(self) -> list[Metric]:
        return [resident_actors([("engine", 0), ("counter", 0)])]


async def served_metrics(url: str) -> dict[str, set[str]]:
    """Every metric a pod of every role serves, with its label names (histograms under
    their series' names too)."""
    nc = await connect(url, name="test-dashboard")
    try:
        layout = Layout(partitions=1)
        await ensure(nc.jetstream(), layout)
        registry = pod_registry()
        registry.add_collector(PodState())
        registry.add_collector(ConsumerCollector(nc, consumers_for(ROLES, partitions=range(1))))
        registry.add_collector(_Resident())
        await nc.jetstream().publish("dlq.tools.e1", b"{}")  # one dead letter
        out: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(await registry.render()):
            for s in family.samples:
                out.setdefault(s.name, set()).update(s.labels)
                if s.name.startswith("actors_stream_") and s.labels["stream"] == "DLQ":
                    assert s.value == 1, s  # the dashboard's dead-letter panel reads these
            out.setdefault(family.name, set())
        # a labelled metric has no series until its first value: its labels as declared
        for metric in PROCESS_METRICS:
            names = [metric.name, *(metric.name + s for s in SUFFIXES if isinstance(metric, StepSeconds))]
            for name in names:
                out.setdefault(name, set()).update(metric.labelnames)
        return out
    finally:
        await nc.close()


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out += p.get("panels", [])  # a collapsed row holds its panels
    return out


@pytest.mark.asyncio
async def test_the_dashboard_is_grafana_json_over_metrics_the_pods_serve(nats_server: NatsServer) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"]
    # the datasource is a variable, chosen on import and in the dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"

    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    queried = [p for p in panels(dashboard) if p["type"] != "row"]
    assert len(queried) >= 10
    exprs: list[str] = []
    for p in queried:
        assert p["title"] and set(p["gridPos"]) == {"h", "w", "x", "y"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            exprs.append(t["expr"])

    served = await served_metrics(nats_server.url)
    used: set[str] = set()
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        bare = re.sub(r'"[^"]*"', '""', expr)  # label values are not metric names
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)  # selectors and ranges
        for name in set(re.findall(r"[a-z_][a-z0-9_]*", bare)) - PROMQL:
            if name.startswith("actors_"):
                assert name in served, f"{expr}: {name} is not a metric a pod serves"
                used.add(name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum"))
            else:  # a label in a `by (...)` clause
                assert any(name in labels for labels in served.values()) or name == "instance", f"{expr}: {name}?"
        for metric, selector in re.findall(r"(actors_[a-z_]+)\{([^}]*)\}", expr):
            for label in re.findall(r"([a-z_]+)\s*(?:=|!=|=~|!~)", selector):
                assert label in served[metric], f"{expr}: {metric} has no label {label}"

    # the list: executions by state, step latency, loop rates, queue depths,
    # redeliveries, dead letters, pod health
    assert {
        "actors_executions_finished_total",
        "actors_step_seconds",
        "actors_stream_last_sequence",
        "actors_consumer_pending_messages",
        "actors_consumer_redelivered_messages",
        "actors_stream_messages",
        "actors_ready",
        "actors_nats_connected",
    } <= used
    assert any("histogram_quantile(0.99" in e for e in exprs)
    assert any('stream="DLQ"' in e for e in exprs) and any('stream="LOOP"' in e for e in exprs)
