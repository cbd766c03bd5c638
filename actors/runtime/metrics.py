"""A pod's metrics, served in the Prometheus text format by prometheus-client (or in
OpenMetrics, with the step histogram's exemplars, when the scraper asks for it).

Each `Registry` wraps a `prometheus_client.CollectorRegistry` of its own (never the
library's global one), so several runtimes in one process (tests, benches) never
clash. The metrics actors record as they run (steps, lifecycle, evictions) are one set
per process, included in every registry (`pod_registry`); collectors that read a
runtime's state are added to that runtime's registry only.

The one collector that matters, consumer lag, is an async request to JetStream made at
scrape time, which a synchronous client-library collector cannot await: a `Collector`
here is async, and `Registry.render` awaits them all before the library writes the
text. Everything runs on the event loop.

Multiprocess mode is not needed: no process that records a metric forks. The python
pool's workers and the render processes (both `subprocess`, never forked) are
fresh interpreters that record nothing; every `observe_*` runs in the pod's process.

Module-level helpers are what actors call: `observe_step` and `commands_in_flight`
(tool actors), `observe_lifecycle` (the projector), `EVICTED_ACTORS` (hosting).
`ConsumerCollector` reports the JetStream consumers a pod's roles read; `health.py`
serves `Registry.render()`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import orjson
import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import Exemplar, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.utils import floatToGoString

from actors.wire.events import TERMINAL_STATES, ExecState
from streams.layout import (
    CMD_STREAM,
    DLQ_STREAM,
    ENDED_STREAM,
    LOOP_STREAM,
    PROJECTOR_CONSUMER,
    RETENTION_CONSUMER,
    SCHEDULE_FIRES_CONSUMER,
    SCHEDULE_STREAM,
    START_STREAM,
    STARTER_CONSUMER,
    TOOL_KINDS,
    Layout,
    counter_consumer,
    engine_consumer,
    tool_consumer,
    tool_log_consumer,
)

# `<name>_created` series would double every counter and histogram for a timestamp no
# dashboard or alert here reads, and were never exported
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

LabelKey = Any  # a child of a labelled metric, resolved once by `key()` for hot paths


class Collector(Protocol):
    async def collect(self) -> list[Metric]: ...


_Lib = TypeVar("_Lib", prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram)


class _Metric(Generic[_Lib]):
    """A prometheus-client metric with the label API actors use: labels by keyword,
    or resolved once (`key`) and reused on hot paths (`*_key`)."""

    def __init__(self, lib: _Lib, name: str, labelnames: Sequence[str]) -> None:
        self.lib: _Lib = lib
        self.name = name  # as given: the library drops a counter's `_total` from its own
        self.labelnames = tuple(labelnames)
        self._keys: dict[tuple[tuple[str, str], ...], LabelKey] = {}  # label sets resolved so far

    def key(self, **labels: str) -> LabelKey:
        """A label set resolved once (the library's `labels()` costs microseconds a
        call), for the `*_key` methods on hot paths."""
        seen = tuple(labels.items())
        found = self._keys.get(seen)
        if found is None:
            if set(labels) != set(self.labelnames):
                raise ValueError(f"{self.name}: labels are {self.labelnames}, got {tuple(labels)}")
            found = self._keys[seen] = self.lib.labels(**labels) if self.labelnames else self.lib
        return found

    def value(self, **labels: str) -> float:
        """The current value of one series (0 if it does not exist yet)."""
        wanted = {k: str(v) for k, v in labels.items()}
        for family in self.lib.collect():
            for s in family.samples:
                if s.name == self.name and s.labels == wanted:
                    return float(s.value)
        return 0.0


class Counter(_Metric[prometheus_client.Counter]):
    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.inc_key(self.key(**labels), amount)

    def inc_key(self, key: LabelKey, amount: float = 1.0) -> None:
        key.inc(amount)  # the library refuses a negative amount: a counter only goes up


class Gauge(_Metric[prometheus_client.Gauge]):
    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.inc_key(self.key(**labels), amount)

    def inc_key(self, key: LabelKey, amount: float) -> None:
        key.inc(amount)

    def set(self, value: float, **labels: str) -> None:
        self.key(**labels).set(value)


class Histogram(_Metric[prometheus_client.Histogram]):
    def observe(self, value: float, **labels: str) -> None:
        self.observe_key(self.key(**labels), value)

    def observe_key(self, key: LabelKey, value: float) -> None:
        key.observe(value)


def counter(name: str, help: str, labels: Sequence[str] = ()) -> Counter:
    """A counter registered nowhere yet (a `Registry` includes it)."""
    return Counter(prometheus_client.Counter(name, help, labels, registry=None), name, labels)


def gauge(name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
    return Gauge(prometheus_client.Gauge(name, help, labels, registry=None), name, labels)


def histogram(name: str, help: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> Histogram:
    return Histogram(prometheus_client.Histogram(name, help, labels, registry=None, buckets=buckets), name, labels)


class _Gathered:
    """A prometheus-client collector yielding what the async collectors returned just
    before the text is written (set and read with no await between)."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class Registry:
    def __init__(self) -> None:
        self.lib = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, _Metric[Any] | StepSeconds | InFlight] = {}
        self._collectors: list[Collector] = []
        self._gathered = _Gathered()
        self.lib.register(self._gathered)
        self.scrape_errors = 0

    def include(self, metric: _Metric[Any] | StepSeconds | InFlight) -> Any:
        existing = self._metrics.get(metric.name)
        if existing is not None:
            if type(existing) is not type(metric) or existing.labelnames != metric.labelnames:
                raise ValueError(f"metric {metric.name} already registered differently")
            return existing
        self.lib.register(metric.lib)
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        c: Counter = self.include(counter(name, help, labels))
        return c

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        g: Gauge = self.include(gauge(name, help, labels))
        return g

    def histogram(self, name: str, help: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> Histogram:
        h: Histogram = self.include(histogram(name, help, labels, buckets=buckets))
        return h

    def add_collector(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def remove_collector(self, collector: Collector) -> None:
        if collector in self._collectors:
            self._collectors.remove(collector)

    async def render(self, accept: str = "") -> str:
        """The text of a scrape in the format the scraper's `Accept` header asks for
        (`content_type(accept)`): OpenMetrics, which carries the step histogram's
        exemplars, or else the Prometheus text format 0.0.4."""
        encoder, _ = _negotiated(accept)
        families: list[Metric] = []
        for c in list(self._collectors):
            try:
                families.extend(await c.collect())
            except Exception:
                # one broken collector must not take the whole scrape (and the pod's
                # other metrics) down with it
                self.scrape_errors += 1
                logging.getLogger("actors.runtime.metrics").exception("collector %s failed", type(c).__name__)
        self._gathered.families = families
        try:
            return encoder(self.lib).decode()
        finally:
            self._gathered.families = []

    @staticmethod
    def content_type(accept: str = "") -> str:
        """The Content-Type of what `render(accept)` returns."""
        return _negotiated(accept)[1]


def _negotiated(accept: str) -> tuple[Callable[[Any], bytes], str]:
    """prometheus-client's pick of a format for `accept`, or the 0.0.4 text format when
    it cannot read the header (`version=abc` is a TypeError inside it): a scraper's odd
    header gets the format every scraper reads, never a 500."""
    try:
        return choose_encoder(accept)
    except Exception:
        return generate_latest, CONTENT_TYPE_PLAIN_0_0_4


def gauge_family(name: str, help: str, labels: Sequence[str], values: Iterable[tuple[Sequence[str], float]]) -> Metric:
    """A gauge read at scrape time: (label values, value) pairs."""
    family = GaugeMetricFamily(name, help, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value)
    return family


# --- this process's metrics -------------------------------------------------------------

# steps range from a noop (sub-millisecond) to long python or http calls
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class StepSeconds:
    """`actors_step_seconds{kind,outcome}`, a histogram kept here rather than by
    prometheus-client, whose Histogram takes a lock for each of the two values an
    observation updates: on every command a tool actor runs, a loop's iterations
    included. Observations and scrapes all run on the pod's event loop thread, so plain
    counts do. `collect` hands the library the same family its Histogram would."""

    name = "actors_step_seconds"
    labelnames = ("kind", "outcome")
    help = "Time a tool actor in this pod spent running a command, by tool kind and outcome."

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = (*buckets, math.inf)
        # (kind, outcome) -> observations per bucket (not cumulative) and their sum, last
        self.series: dict[tuple[str, str], list[float]] = {}
        # (kind, outcome) -> the latest exemplar per bucket, only while tracing is on
        self.exemplars: dict[tuple[str, str], list[Exemplar | None]] = {}
        self.lib = self  # what a `Registry` registers with the library

    def observe(self, kind: str, outcome: str, seconds: float, ids: tuple[str, str] | None = None) -> None:
        """`ids`: the (trace id, span id) of the span the command ran in, kept as its
        bucket's exemplar (the latest one wins: OpenMetrics allows one per bucket)."""
        counts = self.series.get((kind, outcome))
        if counts is None:
            counts = self.series[(kind, outcome)] = [0.0] * (len(self.bounds) + 1)
        bucket = bisect_left(self.bounds, seconds)  # the first bucket whose bound >= seconds
        counts[bucket] += 1
        counts[-1] += seconds
        if ids is not None:
            kept = self.exemplars.get((kind, outcome))
            if kept is None:
                kept = self.exemplars[(kind, outcome)] = [None] * len(self.bounds)
            kept[bucket] = Exemplar({"trace_id": ids[0], "span_id": ids[1]}, seconds, time.time())

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.help, labels=self.labelnames)
        for labels, counts in self.series.items():
            cumulative = list(itertools.accumulate(counts[:-1]))
            bounds = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
            kept = self.exemplars.get(labels)
            buckets: list[Any] = (
                list(zip(bounds, cumulative, strict=True))
                if kept is None
                # the text format 0.0.4 drops them; OpenMetrics writes them after the bucket
                else [(b, c) if e is None else (b, c, e) for b, c, e in zip(bounds, cumulative, kept, strict=True)]
            )
            family.add_metric(list(labels), buckets, counts[-1])
        yield family


class InFlight:
    """`actors_commands_in_flight{kind}`, a gauge kept here for the reason `StepSeconds`
    is: it moves twice for every command. Every tool kind's series exists from the start
    (no gaps on dashboards)."""

    name = "actors_commands_in_flight"
    labelnames = ("kind",)
    help = "Commands a tool actor in this pod is running now, by tool kind."

    def __init__(self, kinds: Iterable[str]) -> None:
        self.running = dict.fromkeys(kinds, 0)
        self.lib = self

    def add(self, kind: str, delta: int) -> None:
        self.running[kind] = self.running.get(kind, 0) + delta

    def collect(self) -> Iterator[Metric]:
        yield gauge_family(self.name, self.help, self.labelnames, (((k,), n) for k, n in self.running.items()))


STEP_SECONDS = StepSeconds(STEP_BUCKETS)
COMMANDS_IN_FLIGHT = InFlight(TOOL_KINDS)

EXECUTIONS_STARTED = counter(
    "actors_executions_started_total", "Executions whose status this pod's projector moved to RUNNING."
)
EXECUTIONS_FINISHED = counter(
    "actors_executions_finished_total",
    "Executions whose status this pod's projector moved to a terminal state, by state.",
    ("state",),
)
for _state in TERMINAL_STATES:
    EXECUTIONS_FINISHED.inc(0, state=_state)
LIFECYCLE_EVENTS = counter(
    "actors_lifecycle_events_total", "Lifecycle events this pod's projector applied, by event type.", ("type",)
)

EVICTED_ACTORS = counter(
    "actors_evicted_total",
    "Idle actors this pod dropped from memory to stay within its bound (rebuilt by replay on their next input).",
    ("role",),
)

HALTED_REPLAYS = counter(
    "actors_replay_mismatches_total",
    "Replays that derived a decision other than the one recorded (or met semantics this pod does not know), "
    "each halting its execution, by role and kind (Nondeterminism | SemanticsUnknown).",
    ("role", "kind"),
)
for _role in ("engine", "counter"):
    for _kind in ("Nondeterminism", "SemanticsUnknown"):
        HALTED_REPLAYS.inc(0, role=_role, kind=_kind)

ANSWER_ASKS = counter(
    "actors_answer_asks_total",
    "Tools' asks to store a step's result with the decision it leads to (semantics 5), and starters' to store "
    "an execution's start with its first decision (semantics 6), by outcome: stored (one message), "
    "refused_before_fold (nothing folded: not ready, a duplicate or late result, inputs before a start, a step "
    "known not to fit one message) or refused_after_fold (folded, did not fit: the actor rebuilds by replay). A "
    "refused ask costs the asker one round trip and its input is published as before.",
    ("outcome",),
)
for _outcome in ("stored", "refused_before_fold", "refused_after_fold"):
    ANSWER_ASKS.inc(0, outcome=_outcome)

PROCESS_METRICS = (
    STEP_SECONDS,
    COMMANDS_IN_FLIGHT,
    EXECUTIONS_STARTED,
    EXECUTIONS_FINISHED,
    LIFECYCLE_EVENTS,
    EVICTED_ACTORS,
    HALTED_REPLAYS,
    ANSWER_ASKS,
)


def pod_registry() -> Registry:
    """A registry of its own for one pod (runtime), holding this process's metrics."""
    registry = Registry()
    for metric in PROCESS_METRICS:
        registry.include(metric)
    return registry


def resident_actors(counts: Iterable[tuple[str, int]]) -> Metric:
    """`actors_resident{role}` from (role, actors in memory) pairs, counted at scrape
    time by the runtime (`Runtime.collect`): nothing to keep in step on the hot path."""
    return gauge_family(
        "actors_resident",
        "Execution (engine) or loop (counter) actors this pod holds in memory, by role.",
        ("role",),
        (((role,), n) for role, n in counts),
    )


lifecycle_log = logging.getLogger("actors.lifecycle")


# set by `actors.runtime.logtrace.install` when tracing is on: the (trace id, span id)
# of the current span if it is sampled, else None. Off, an observation pays one check.
_current_ids: Callable[[], tuple[str, str] | None] | None = None


def use_exemplars(current_ids: Callable[[], tuple[str, str] | None] | None) -> None:
    """Give the step histogram an exemplar per observation made inside a sampled span
    (None: none again)."""
    global _current_ids
    _current_ids = current_ids


def observe_step(kind: str, outcome: str, seconds: float, ids: tuple[str, str] | None = None) -> None:
    """A tool actor ran a command of `kind` for `seconds`; outcome: ok, error, timeout
    or cancelled (keep it to a few values: each is a series per bucket). `ids`: the
    command's (trace id, span id) for the bucket's exemplar; by default the current
    span's, when tracing is on."""
    if ids is None and _current_ids is not None:
        ids = _current_ids()
    STEP_SECONDS.observe(kind, outcome, seconds, ids)


def commands_in_flight(kind: str, delta: int) -> None:
    """+1 when a tool actor starts running a command of `kind`, -1 when it ends."""
    COMMANDS_IN_FLIGHT.add(kind, delta)


def step_outcome(error_type: str | None) -> str:
    """The `outcome` label of a command that ended with this error type (None: ok)."""
    if error_type is None:
        return "ok"
    return {"Timeout": "timeout", "Cancelled": "cancelled"}.get(error_type, "error")


def observe_lifecycle(*, execution_id: str, event_type: str, state: str, changed: bool) -> None:
    """The projector handled a lifecycle event; `state` is the execution's status after
    it and `changed` whether the event moved it. Counting only changes counts each
    execution once across projector pods and redeliveries: the status write is a
    compare-and-set, so exactly one apply sees the change."""
    if changed:
        LIFECYCLE_EVENTS.inc(type=event_type)
        if state == ExecState.RUNNING and event_type != "execution.resumed":  # a resume starts nothing
            EXECUTIONS_STARTED.inc()
        elif state in TERMINAL_STATES:
            EXECUTIONS_FINISHED.inc(state=state)
    lines = _lifecycle_lines
    if lines is not None or lifecycle_log.isEnabledFor(logging.INFO):
        line = orjson.dumps(
            {
                "ts": round(time.time(), 3),
                "logger": "actors.lifecycle",
                "execution_id": execution_id,
                "type": event_type,
                "state": state,
                "changed": changed,
            }
        ).decode()
        if lines is not None:
            lines.append(line)  # a pod's JSON lines: no log record to build per event
        else:
            lifecycle_log.info(line)


class LineBatcher(logging.Handler):
    """Writes its records to `stream` one line each, a batch at a time: a line joins a
    buffer that a thread writes out `interval` seconds after the batch's first line
    (at once past `limit` characters, and on `flush`, which logging calls at exit).
    A pod's projector logs several lifecycle events per execution; a write and a flush
    per line cost more than the event's handling."""

    def __init__(self, stream: Any, *, interval: float = 0.2, limit: int = 64 * 1024) -> None:
        super().__init__()
        self.stream = stream
        self.interval = interval
        self.limit = limit
        self._buf: list[str] = []
        self._size = 0
        self._due = threading.Event()  # set: a batch waits to be written
        threading.Thread(target=self._write_batches, daemon=True, name="log-lines").start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.append(line)

    def append(self, line: str) -> None:
        """One formatted line (without its newline)."""
        with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            self._buf.append(line)
            self._size += len(line) + 1
            first, full = len(self._buf) == 1, self._size >= self.limit
        if full:
            self.flush()
        elif first:
            self._due.set()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # the stream's writes keep the lines' order
            if not self._buf:
                return
            batch = "\n".join(self._buf) + "\n"
            self._buf.clear()
            self._size = 0
            try:
                self.stream.write(batch)
                self.stream.flush()
            except Exception:
                pass  # a closed or broken stream: logging must never take the pod down

    def _write_batches(self) -> None:
        while True:
            self._due.wait()
            time.sleep(self.interval)  # what comes meanwhile joins this batch
            self._due.clear()
            self.flush()


_lifecycle_lines: LineBatcher | None = None  # set by `log_lifecycle_as_json`


def log_lifecycle_as_json(stream: Any) -> None:
    """Send `actors.lifecycle` lines to `stream` as bare JSON objects, one per line (a
    log collector parses them as they are), whatever the root logger's format; written
    in batches, at most a fraction of a second late (`LineBatcher`)."""
    global _lifecycle_lines
    handler = LineBatcher(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    lifecycle_log.handlers[:] = [handler]
    lifecycle_log.setLevel(logging.INFO)
    lifecycle_log.propagate = False
    _lifecycle_lines = handler


# --- JetStream consumers ---------------------------------------------------------------


def consumers_for(
    roles: Iterable[str],
    *,
    partitions: Iterable[int],
    tool_kinds: Iterable[str] = TOOL_KINDS,
    layout: Layout | None = None,
) -> list[tuple[str, str]]:
    """(stream, consumer) for every durable consumer the given roles read; those on the
    executions' logs on each of `layout`'s streams of them (EXEC, or EXEC_<k>)."""
    roles = set(roles)
    layout = layout or Layout()
    logs = layout.exec_stream_names
    out: list[tuple[str, str]] = []
    if "engine" in roles:
        out += [(layout.exec_stream(p), engine_consumer(p)) for p in partitions]
        out.append((START_STREAM, STARTER_CONSUMER))
        out.append((SCHEDULE_STREAM, SCHEDULE_FIRES_CONSUMER))  # the starter reads schedules' fires too
    if "counter" in roles:
        out += [(LOOP_STREAM, counter_consumer(p)) for p in partitions]
    if "projector" in roles:
        out += [(log, PROJECTOR_CONSUMER) for log in logs]
    if "retention" in roles:
        out.append((ENDED_STREAM, RETENTION_CONSUMER))
    if "tools" in roles:
        out += [(CMD_STREAM, tool_consumer(k)) for k in tool_kinds]
        # commands held by decision records
        out += [(log, tool_log_consumer(k)) for k in tool_kinds for log in logs]
    return out


class ConsumerCollector:
    """Reads consumer info (and the dead-letter stream's size) from JetStream on each
    scrape. The numbers are the consumer's or the stream's, shared by every pod that
    reads it: aggregate with max(), not sum()."""

    FIELDS = (
        (
            "actors_consumer_pending_messages",
            "num_pending",
            "Messages matching the consumer's filter not yet delivered (consumer lag).",
        ),
        ("actors_consumer_ack_pending_messages", "num_ack_pending", "Messages delivered and not yet acknowledged."),
        (
            "actors_consumer_redelivered_messages",
            "num_redelivered",
            "Messages delivered more than once and not yet acknowledged.",
        ),
    )
    LABELS = ("stream", "consumer")
    STREAM_FIELDS = (
        ("actors_stream_messages", "messages", "Messages stored in the stream now (DLQ: dead letters kept)."),
        (
            "actors_stream_last_sequence",
            "last_seq",
            "The stream's last sequence: grows by one per message ever stored (DLQ: dead letters parked).",
        ),
    )

    def __init__(
        self,
        nc: Any,
        consumers: Sequence[tuple[str, str]],
        *,
        timeout: float = 2.0,
        streams: Sequence[str] = (DLQ_STREAM, LOOP_STREAM),
    ) -> None:
        self.nc = nc
        self.consumers = list(consumers)
        self.timeout = timeout
        # streams whose size is reported too: dead letters have no consumer to lag, and
        # the growth of LOOP is the loops' rate (iteration results, or batches of them)
        self.streams = list(streams)

    async def _stream(self, stream: str) -> Any:
        try:
            return (await asyncio.wait_for(self.nc.jsm().stream_info(stream), self.timeout)).state
        except Exception as e:
            logging.getLogger("actors.runtime.metrics").warning("stream info %s: %r", stream, e)
            return None

    async def _info(self, stream: str, consumer: str) -> Any:
        try:
            return await self.nc.jsm().consumer_info(stream, consumer, timeout=self.timeout)
        except Exception as e:  # missing, timed out, disconnected: report it as down
            logging.getLogger("actors.runtime.metrics").warning("consumer info %s/%s: %r", stream, consumer, e)
            return None

    async def collect(self) -> list[Metric]:
        infos = await asyncio.gather(*(self._info(s, c) for s, c in self.consumers))
        answered = [(labels, info) for labels, info in zip(self.consumers, infos, strict=True) if info is not None]
        families = [
            gauge_family(
                name, help, self.LABELS, ((labels, float(getattr(info, attr) or 0)) for labels, info in answered)
            )
            for name, attr, help in self.FIELDS
        ]
        up = gauge_family(
            "actors_consumer_up",
            "1 if JetStream answered for the consumer at this scrape, else 0.",
            self.LABELS,
            ((labels, 0 if info is None else 1) for labels, info in zip(self.consumers, infos, strict=True)),
        )
        states = await asyncio.gather(*(self._stream(s) for s in self.streams))
        streams = [
            gauge_family(
                name,
                help,
                ("stream",),
                (
                    ((s,), float(getattr(state, attr) or 0))
                    for s, state in zip(self.streams, states, strict=True)
                    if state
                ),
            )
            for name, attr, help in self.STREAM_FIELDS
        ]
        return [*families, up, *streams]
