"""Log lines and step-duration exemplars that join the trace.

While a pod handles an execution's input or runs a command, the execution's span
context is the current OpenTelemetry context (`actors.runtime.tracing`). With tracing
on, `install()`:

* adds a `TraceIds` filter to the root logger's handlers: each record gets
  `trace_id` and `span_id` (lowercase hex, as W3C traceparent writes them) when a span
  is current, and the handlers' format ends such a line with
  `trace_id=<32 hex> span_id=<16 hex>` (`TraceFormatter`); a line logged outside any
  execution is written as before;
* has the step histogram (`actors_step_seconds`) keep the trace and span ids of a
  command run in a sampled span as its bucket's exemplar (`metrics.use_exemplars`).

With tracing off nothing is installed and nothing imported: not a filter call per log
record, not an OpenTelemetry import, and the log format is unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from actors.runtime import metrics


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard `OTEL_*` variables turn tracing on, by the rule the pod's
    tracing itself follows (`tracing.wanted`: an OTLP endpoint or a traces exporter
    other than `none`, and the SDK not disabled)."""
    from actors.runtime.tracing import wanted

    return wanted(environ)


def _ids_of(span: Any) -> tuple[str, str, bool] | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), bool(ctx.trace_flags.sampled)


class TraceIds(logging.Filter):
    """Adds `trace_id` and `span_id` to a record logged while a span is current (the
    attributes are absent otherwise, so a formatter can tell). Never drops a record."""

    def __init__(self) -> None:
        super().__init__()
        from opentelemetry import trace

        self._current = trace.get_current_span

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _ids_of(self._current())
        if ids is not None:
            record.trace_id, record.span_id = ids[0], ids[1]
        return True


class TraceFormatter(logging.Formatter):
    """A handler's own format, with ` trace_id=... span_id=...` at the end of the
    first line of a record that has them (before a traceback, if any)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace_id = record.__dict__.get("trace_id")
        if trace_id is None:
            return line
        return f"{line} trace_id={trace_id} span_id={record.__dict__.get('span_id')}"


def current_sampled_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span if it is sampled: an exemplar names a
    trace the backend has, or nothing."""
    from opentelemetry import trace

    ids = _ids_of(trace.get_current_span())
    return (ids[0], ids[1]) if ids is not None and ids[2] else None


_installed: list[tuple[logging.Handler, logging.Filter, logging.Formatter | None]] = []


def install(enabled: bool | None = None, logger: logging.Logger | None = None) -> bool:
    """Join logs and exemplars to the trace when tracing is on (`enabled`, by default
    `configured()`) and the OpenTelemetry API is importable; returns whether it did.
    Applies to `logger`'s handlers (the root logger's by default) as they are now;
    idempotent."""
    if not (configured() if enabled is None else enabled):
        return False
    try:
        import opentelemetry.trace  # noqa: F401  # the API: installed with tracing's extras
    except ImportError:
        logging.getLogger("actors.runtime.logtrace").warning(
            "OTEL_* variables are set but the OpenTelemetry packages are not installed: no trace ids in logs"
        )
        return False
    target = logger if logger is not None else logging.getLogger()
    done = {h for h, _, _ in _installed}
    for handler in target.handlers:
        if handler in done:
            continue
        ids = TraceIds()
        handler.addFilter(ids)
        old = handler.formatter
        style = old._style._fmt if old is not None else None  # the format string as given
        handler.setFormatter(
            TraceFormatter(style, old.datefmt if old is not None else None) if style else TraceFormatter()
        )
        _installed.append((handler, ids, old))
    metrics.use_exemplars(current_sampled_ids)
    return True


def uninstall() -> None:
    """Undo `install` (tests)."""
    while _installed:
        handler, ids, old = _installed.pop()
        handler.removeFilter(ids)
        handler.setFormatter(old)
    metrics.use_exemplars(None)
