"""A pod's metrics, in the Prometheus text exposition format (0.0.4).

Written by hand rather than with prometheus_client: the one collector that matters,
consumer lag, is an async request to JetStream made at scrape time, which a
synchronous client-library collector cannot await; and three metric types with
labels are a page of code. Everything runs on the event loop, so nothing here locks.

Module-level helpers are what actors call: `observe_step` and `commands_in_flight`
(tool actors), `observe_lifecycle` (the projector). `ConsumerCollector` reports the
JetStream consumers a pod's roles read; `health.py` serves `REGISTRY.render()`.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from actors.events import TERMINAL_STATES, ExecState
from streams.layout import (
    CMD_STREAM,
    EXEC_STREAM,
    LOOP_STREAM,
    PROJECTOR_CONSUMER,
    START_STREAM,
    STARTER_CONSUMER,
    TOOL_KINDS,
    counter_consumer,
    engine_consumer,
    tool_consumer,
)

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[Sample] = field(default_factory=list)


class Collector(Protocol):
    async def collect(self) -> list[Family]: ...


class _Metric:
    type = "untyped"

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labels)

    def key(self, **labels: str) -> tuple[str, ...]:
        """A label set resolved once, for the `*_key` methods on hot paths."""
        return self._key(labels)

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels are {self.labelnames}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def _labels(self, key: tuple[str, ...]) -> Labels:
        return tuple(zip(self.labelnames, key, strict=True))

    def family(self) -> Family:
        raise NotImplementedError


class _Valued(_Metric):
    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help, labels)
        # an unlabelled series exists (at 0) from the start, so rate() has a first point
        self._values: dict[tuple[str, ...], float] = {} if self.labelnames else {(): 0.0}

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def family(self) -> Family:
        return Family(self.name, self.type, self.help,
                      [Sample(self.name, self._labels(k), v) for k, v in sorted(self._values.items())])


class Counter(_Valued):
    type = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.inc_key(self._key(labels), amount)

    def inc_key(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up")
        self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(_Valued):
    type = "gauge"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.inc_key(self._key(labels), amount)

    def inc_key(self, key: tuple[str, ...], amount: float) -> None:
        self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = value



class Histogram(_Metric):
    type = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> None:
        super().__init__(name, help, labels)
        if "le" in self.labelnames:
            raise ValueError("`le` is reserved for histogram buckets")
        self.buckets = tuple(sorted(b for b in buckets if not math.isinf(b)))
        # per label set: a count per bucket (not cumulative), then +Inf; sum
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, **labels: str) -> None:
        self.observe_key(self._key(labels), value)

    def observe_key(self, key: tuple[str, ...], value: float) -> None:
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, value)] += 1  # the first bucket with value <= bound
        self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, **labels: str) -> int:
        return sum(self._counts.get(self._key(labels), []))

    def family(self) -> Family:
        samples: list[Sample] = []
        for key, counts in sorted(self._counts.items()):
            base = self._labels(key)
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                running += n
                samples.append(Sample(f"{self.name}_bucket", (*base, ("le", _le(bound))), running))
            samples.append(Sample(f"{self.name}_sum", base, self._sums[key]))
            samples.append(Sample(f"{self.name}_count", base, running))
        return Family(self.name, self.type, self.help, samples)


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: list[Collector] = []
        self.scrape_errors = 0

    def _add(self, metric: _Metric) -> Any:
        existing = self._metrics.get(metric.name)
        if existing is not None:
            if type(existing) is not type(metric) or existing.labelnames != metric.labelnames:
                raise ValueError(f"metric {metric.name} already registered differently")
            return existing
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        c: Counter = self._add(Counter(name, help, labels))
        return c

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        g: Gauge = self._add(Gauge(name, help, labels))
        return g

    def histogram(self, name: str, help: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> Histogram:
        h: Histogram = self._add(Histogram(name, help, labels, buckets=buckets))
        return h

    def add_collector(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def remove_collector(self, collector: Collector) -> None:
        if collector in self._collectors:
            self._collectors.remove(collector)

    async def render(self) -> str:
        families = [m.family() for m in self._metrics.values()]
        for c in list(self._collectors):
            try:
                families.extend(await c.collect())
            except Exception:
                # one broken collector must not take the whole scrape (and the pod's
                # other metrics) down with it
                self.scrape_errors += 1
                logging.getLogger("actors.metrics").exception("collector %s failed", type(c).__name__)
        return exposition(families)


# --- text format ----------------------------------------------------------------------


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


def _le(bound: float) -> str:
    """Bucket bounds as floats ("1.0", not "1"), as client libraries write them and
    Prometheus 3 normalises them: one series per bucket, whatever wrote it."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(families: Iterable[Family]) -> str:
    lines: list[str] = []
    for f in families:
        help_text = f.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {f.name} {help_text}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for s in f.samples:
            labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in s.labels)
            lines.append(f"{s.name}{{{labels}}} {_num(s.value)}" if labels else f"{s.name} {_num(s.value)}")
    return "\n".join(lines) + "\n"


# --- this process's metrics -------------------------------------------------------------

REGISTRY = Registry()

# steps range from a noop (sub-millisecond) to long python or http calls
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

STEP_SECONDS = REGISTRY.histogram(
    "actors_step_seconds", "Time a tool actor in this pod spent running a command, by tool kind and outcome.",
    ("kind", "outcome"), buckets=STEP_BUCKETS,
)
COMMANDS_IN_FLIGHT = REGISTRY.gauge(
    "actors_commands_in_flight", "Commands a tool actor in this pod is running now, by tool kind.", ("kind",)
)
for _kind in TOOL_KINDS:
    COMMANDS_IN_FLIGHT.set(0, kind=_kind)  # every series exists from the start: no gaps on dashboards

EXECUTIONS_STARTED = REGISTRY.counter(
    "actors_executions_started_total", "Executions whose status this pod's projector moved to RUNNING."
)
EXECUTIONS_FINISHED = REGISTRY.counter(
    "actors_executions_finished_total",
    "Executions whose status this pod's projector moved to a terminal state, by state.", ("state",),
)
for _state in TERMINAL_STATES:
    EXECUTIONS_FINISHED.inc(0, state=_state)
LIFECYCLE_EVENTS = REGISTRY.counter(
    "actors_lifecycle_events_total", "Lifecycle events this pod's projector applied, by event type.", ("type",)
)

EVICTED_ACTORS = REGISTRY.counter(
    "actors_evicted_total",
    "Idle actors this pod dropped from memory to stay within its bound (rebuilt by replay on their next input).",
    ("role",),
)



def resident_actors(counts: Iterable[tuple[str, int]]) -> Family:
    """`actors_resident{role}` from (role, actors in memory) pairs, counted at scrape
    time by the runtime (`Runtime.collect`): nothing to keep in step on the hot path."""
    name = "actors_resident"
    return Family(name, "gauge", "Execution (engine) or loop (counter) actors this pod holds in memory, by role.",
                  [Sample(name, (("role", role),), n) for role, n in counts])


lifecycle_log = logging.getLogger("actors.lifecycle")


# label sets resolved once: these two run for every command a tool actor runs
_step_keys: dict[tuple[str, str], tuple[str, ...]] = {}
_flight_keys: dict[str, tuple[str, ...]] = {}


def observe_step(kind: str, outcome: str, seconds: float) -> None:
    """A tool actor ran a command of `kind` for `seconds`; outcome: ok, error, timeout
    or cancelled (keep it to a few values: each is a series per bucket)."""
    key = _step_keys.get((kind, outcome))
    if key is None:
        key = _step_keys[(kind, outcome)] = STEP_SECONDS.key(kind=kind, outcome=outcome)
    STEP_SECONDS.observe_key(key, seconds)


def commands_in_flight(kind: str, delta: int) -> None:
    """+1 when a tool actor starts running a command of `kind`, -1 when it ends."""
    key = _flight_keys.get(kind)
    if key is None:
        key = _flight_keys[kind] = COMMANDS_IN_FLIGHT.key(kind=kind)
    COMMANDS_IN_FLIGHT.inc_key(key, delta)


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
        if state == ExecState.RUNNING:
            EXECUTIONS_STARTED.inc()
        elif state in TERMINAL_STATES:
            EXECUTIONS_FINISHED.inc(state=state)
    if lifecycle_log.isEnabledFor(logging.INFO):
        lifecycle_log.info(orjson.dumps({
            "ts": round(time.time(), 3), "logger": "actors.lifecycle", "execution_id": execution_id,
            "type": event_type, "state": state, "changed": changed,
        }).decode())


def log_lifecycle_as_json(stream: Any) -> None:
    """Send `actors.lifecycle` lines to `stream` as bare JSON objects, one per line (a
    log collector parses them as they are), whatever the root logger's format."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    lifecycle_log.handlers[:] = [handler]
    lifecycle_log.setLevel(logging.INFO)
    lifecycle_log.propagate = False


# --- JetStream consumers ---------------------------------------------------------------


def consumers_for(
    roles: Iterable[str], *, partitions: Iterable[int], tool_kinds: Iterable[str] = TOOL_KINDS
) -> list[tuple[str, str]]:
    """(stream, consumer) for every durable consumer the given roles read."""
    roles = set(roles)
    out: list[tuple[str, str]] = []
    if "engine" in roles:
        out += [(EXEC_STREAM, engine_consumer(p)) for p in partitions]
        out.append((START_STREAM, STARTER_CONSUMER))
    if "counter" in roles:
        out += [(LOOP_STREAM, counter_consumer(p)) for p in partitions]
    if "projector" in roles:
        out.append((EXEC_STREAM, PROJECTOR_CONSUMER))
    if "tools" in roles:
        out += [(CMD_STREAM, tool_consumer(k)) for k in tool_kinds]
    return out


class ConsumerCollector:
    """Reads consumer info from JetStream on each scrape. The numbers are the
    consumer's, shared by every pod that reads it: aggregate with max(), not sum()."""

    FIELDS = (
        ("actors_consumer_pending_messages", "num_pending",
         "Messages matching the consumer's filter not yet delivered (consumer lag)."),
        ("actors_consumer_ack_pending_messages", "num_ack_pending",
         "Messages delivered and not yet acknowledged."),
        ("actors_consumer_redelivered_messages", "num_redelivered",
         "Messages delivered more than once and not yet acknowledged."),
    )

    def __init__(self, nc: Any, consumers: Sequence[tuple[str, str]], *, timeout: float = 2.0) -> None:
        self.nc = nc
        self.consumers = list(consumers)
        self.timeout = timeout

    async def _info(self, stream: str, consumer: str) -> Any:
        try:
            return await self.nc.jsm().consumer_info(stream, consumer, timeout=self.timeout)
        except Exception as e:  # missing, timed out, disconnected: report it as down
            logging.getLogger("actors.metrics").warning("consumer info %s/%s: %r", stream, consumer, e)
            return None

    async def collect(self) -> list[Family]:
        infos = await asyncio.gather(*(self._info(s, c) for s, c in self.consumers))
        families = {name: Family(name, "gauge", help) for name, _, help in self.FIELDS}
        up = Family("actors_consumer_up", "gauge", "1 if JetStream answered for the consumer at this scrape, else 0.")
        for (stream, consumer), info in zip(self.consumers, infos, strict=True):
            labels: Labels = (("stream", stream), ("consumer", consumer))
            up.samples.append(Sample(up.name, labels, 0 if info is None else 1))
            if info is None:
                continue
            for name, attr, _ in self.FIELDS:
                families[name].samples.append(Sample(name, labels, float(getattr(info, attr) or 0)))
        return [*families.values(), up]
