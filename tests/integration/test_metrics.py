"""The metrics registry's text format (prometheus-client's), one registry per runtime, and
consumer lag read from a real JetStream."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from actors.pod.roles import connect
from actors.runtime.metrics import (
    EVICTED_ACTORS,
    STEP_BUCKETS,
    ConsumerCollector,
    InFlight,
    LineBatcher,
    Registry,
    StepSeconds,
    consumers_for,
    pod_registry,
)
from streams.layout import (
    CMD_STREAM,
    EXEC_STREAM,
    LOOP_STREAM,
    SCHEDULE_STREAM,
    START_STREAM,
    Layout,
    ensure,
    tool_consumer,
)
from streams.server import NatsServer

pytestmark = [pytest.mark.timeout(30)]


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


@pytest.mark.asyncio
async def test_text_format_parses_with_escaping_and_cumulative_buckets() -> None:
    reg = Registry()
    c = reg.counter("t_events_total", 'Events, with a "quote" and a \\ backslash\nand a newline.', ("kind",))
    c.inc(kind='a"b\\c\nd')
    c.inc(2, kind="plain")
    g = reg.gauge("t_inflight", "In flight.", ("kind",))
    g.inc(3, kind="x")
    g.inc(-1, kind="x")
    h = reg.histogram("t_seconds", "Latency.", ("kind",), buckets=(0.1, 1, math.inf))
    for v in (0.05, 0.1, 0.5, 7):
        h.observe(v, kind="x")
    plain = reg.counter("t_plain_total", "No labels: present at 0 from the start.")

    values = parsed(await reg.render())
    assert values[("t_events_total", (("kind", 'a"b\\c\nd'),))] == 1
    assert values[("t_events_total", (("kind", "plain"),))] == 2
    assert values[("t_inflight", (("kind", "x"),))] == 2
    assert values[("t_plain_total", ())] == 0
    buckets = {dict(k[1])["le"]: v for k, v in values.items() if k[0] == "t_seconds_bucket"}
    assert buckets == {"0.1": 2, "1.0": 3, "+Inf": 4}  # cumulative; le=0.1 includes 0.1
    assert values[("t_seconds_count", (("kind", "x"),))] == 4
    assert values[("t_seconds_sum", (("kind", "x"),))] == pytest.approx(7.65)
    assert plain is reg.counter("t_plain_total", "same metric, asked again")

    with pytest.raises(ValueError):
        c.inc(-1, kind="plain")
    with pytest.raises(ValueError):
        c.inc(kind="a", extra="b")
    with pytest.raises(ValueError):
        reg.gauge("t_events_total", "registered as a counter already", ("kind",))


@pytest.mark.asyncio
async def test_the_step_histogram_and_in_flight_gauge_render_as_prometheus_clients_own() -> None:
    """The two metrics a tool actor moves for every command are kept without the
    library's locks (actors/runtime/metrics.py `StepSeconds`, `InFlight`); a scrape must read
    exactly what the library's Histogram and Gauge would have written."""
    ours_steps, ours_flight = StepSeconds(STEP_BUCKETS), InFlight(("python", "noop"))
    lib = Registry()
    lib_steps = lib.histogram(ours_steps.name, ours_steps.help, ours_steps.labelnames, buckets=STEP_BUCKETS)
    lib_flight = lib.gauge(ours_flight.name, ours_flight.help, ours_flight.labelnames)
    lib_flight.set(0, kind="python")
    lib_flight.set(0, kind="noop")
    observed = [("python", "ok", v) for v in (0.0, 0.001, 0.0011, 0.3, 1.0, 599.9, 600.0, 601.0, 1e9)]
    observed += [("noop", "ok", 0.0004), ("python", "timeout", 30.0), ("http", "error", 0.02)]
    for kind, outcome, seconds in observed:
        ours_steps.observe(kind, outcome, seconds)
        lib_steps.observe(seconds, kind=kind, outcome=outcome)
    for kind, delta in (("python", 1), ("python", 1), ("http", 1), ("python", -1)):
        ours_flight.add(kind, delta)
        lib_flight.inc(delta, kind=kind)
    ours = Registry()
    ours.include(ours_steps)
    ours.include(ours_flight)
    assert parsed(await ours.render()) == parsed(await lib.render())
    assert parsed(await ours.render())[("actors_commands_in_flight", (("kind", "python"),))] == 1


@pytest.mark.asyncio
async def test_a_failing_collector_does_not_break_the_scrape() -> None:
    class Broken:
        async def collect(self) -> list[Metric]:
            raise RuntimeError("boom")

    reg = Registry()
    reg.gauge("t_up", "Up.").set(1)
    reg.add_collector(Broken())
    assert parsed(await reg.render())[("t_up", ())] == 1
    assert reg.scrape_errors == 1


@pytest.mark.asyncio
async def test_each_pod_registry_has_the_process_metrics_and_only_its_own_collectors() -> None:
    class Resident:
        def __init__(self, n: int) -> None:
            self.n = n

        async def collect(self) -> list[Metric]:
            from actors.runtime.metrics import resident_actors

            return [resident_actors([("engine", self.n)])]

    one, two = pod_registry(), pod_registry()  # two runtimes in one process: no clash
    one.add_collector(Resident(3))
    two.add_collector(Resident(5))
    before = EVICTED_ACTORS.value(role="engine")
    EVICTED_ACTORS.inc(2, role="engine")
    first, second = parsed(await one.render()), parsed(await two.render())
    assert first[("actors_resident", (("role", "engine"),))] == 3
    assert second[("actors_resident", (("role", "engine"),))] == 5
    for values in (first, second):  # what actors record is the process's, in both
        assert values[("actors_evicted_total", (("role", "engine"),))] == before + 2
        assert values[("actors_commands_in_flight", (("kind", "python"),))] == 0
        assert values[("actors_executions_finished_total", (("state", "FAILED"),))] >= 0
        assert not any(name.endswith("_created") for name, _ in values)  # never exported before


def test_consumers_for_each_role() -> None:
    assert consumers_for(["engine"], partitions=[0, 3]) == [
        (EXEC_STREAM, "engine-p0"),
        (EXEC_STREAM, "engine-p3"),
        (START_STREAM, "starter"),
        (SCHEDULE_STREAM, "schedule-fires"),
    ]
    assert consumers_for(["counter"], partitions=[1]) == [(LOOP_STREAM, "counter-p1")]
    assert consumers_for(["projector"], partitions=[]) == [(EXEC_STREAM, "projector")]
    # commands as their own messages, and held by their decision records in the log
    assert consumers_for(["tools"], partitions=[], tool_kinds=["python"]) == [
        (CMD_STREAM, "tools-python"),
        (EXEC_STREAM, "tools-python-log"),
    ]


@pytest.mark.asyncio
async def test_consumer_lag_is_read_from_jetstream(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), Layout(partitions=1))
        for i in range(3):  # three queued commands nobody runs: lag 3
            await nc.jetstream().publish(f"cmd.noop.e1.c{i}", b"{}")
        reg = Registry()
        reg.add_collector(ConsumerCollector(nc, [(CMD_STREAM, tool_consumer("noop")), (CMD_STREAM, "no-such")]))
        values: dict[Any, float] = parsed(await reg.render())
        noop = (("consumer", "tools-noop"), ("stream", CMD_STREAM))
        assert values[("actors_consumer_pending_messages", noop)] == 3
        assert values[("actors_consumer_ack_pending_messages", noop)] == 0
        assert values[("actors_consumer_redelivered_messages", noop)] == 0
        assert values[("actors_consumer_up", noop)] == 1
        assert values[("actors_consumer_up", (("consumer", "no-such"), ("stream", CMD_STREAM)))] == 0
    finally:
        await nc.close()


class _Sink:
    """A stream that records each write, and says when one came."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.wrote = threading.Event()

    def write(self, text: str) -> None:
        self.writes.append(text)
        self.wrote.set()

    def flush(self) -> None:
        pass


def test_lifecycle_lines_are_written_in_order_a_batch_at_a_time() -> None:
    """A pod's lifecycle lines (`LineBatcher`): every line, in order, one write for the
    lines of a moment; what is left is written on flush (logging flushes at exit)."""
    sink = _Sink()
    lines = LineBatcher(sink, interval=0.05)
    for i in range(3):
        lines.append(f'{{"n": {i}}}')
    assert sink.wrote.wait(5), "the batch was never written"
    assert sink.writes == ['{"n": 0}\n{"n": 1}\n{"n": 2}\n']
    lines.append('{"n": 3}')
    lines.flush()
    assert "".join(sink.writes).splitlines() == [f'{{"n": {i}}}' for i in range(4)]
    small = LineBatcher(sink := _Sink(), interval=60, limit=10)
    small.append("x" * 12)  # past the limit: written at once, no waiting for the interval
    assert sink.writes == ["x" * 12 + "\n"]
