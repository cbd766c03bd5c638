"""OpenTelemetry traces of executions (docs/tracing.md), with the SDK's in-memory
exporter and every role in this process: the span tree of a 3-step execution started
under a caller's span, a retry that ends in a failure, a loop, a child playbook; and an
engine restarted mid-execution (its replay) emitting no span twice."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from actors.config.settings import Settings
from actors.runtime import tracing
from tests.conftest import NatsServer, System, running_system

pytestmark = [pytest.mark.asyncio, pytest.mark.system]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
THREE = HEAD % "trace/three" + (
    '  - step: a\n    tool: {kind: python, code: "def main(): return 1"}\n    next: b\n'
    "  - step: b\n    tool: {kind: noop}\n    next: end\n"
    "  - step: end\n"
)
FLAKY = HEAD % "trace/flaky" + (
    "  - step: flaky\n    tool: {kind: python, code: \"def main(): raise ValueError('no')\"}\n"
    "    retry:\n"
    '      - when: "{{ error is not none }}"\n'
    "        then: {max_attempts: 2, initial_delay: 0.05}\n"
)
LOOP = HEAD % "trace/loop" + (
    '  - step: each\n    tool: {kind: python, code: "def main(n): return n"}\n    args: {n: "{{ n }}"}\n'
    '    loop: {collection: "{{ range(3) | list }}", element: n}\n'
)
CHILD = HEAD % "trace/child" + '  - step: inner\n    tool: {kind: python, code: "def main(): return 2"}\n'
PARENT = HEAD % "trace/parent" + "  - step: call\n    tool: {kind: playbook, path: trace/child}\n"
SLOW = HEAD % "trace/slow" + (
    "  - step: first\n    tool: {kind: noop}\n    next: wait\n"
    "  - step: wait\n    tool: {kind: sleep, seconds: 0.5}\n    next: last\n"
    '  - step: last\n    tool: {kind: python, code: "def main(n): return n"}\n    args: {n: "{{ n }}"}\n'
    '    loop: {collection: "{{ range(2) | list }}", element: n}\n'
)


ENV_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    tracing.provider_for_test(spans)
    try:
        yield spans
    finally:
        tracing.use(None)


async def _register(system: System, *texts: str) -> dict[str, Any]:
    entries = {}
    for i, text in enumerate(texts):
        path = system.tmp / f"pb{i}.yaml"
        path.write_text(text)
        entry = await system.client.register(path)
        entries[entry.path] = entry
    return entries


def _of(spans: list[ReadableSpan], eid: str) -> list[ReadableSpan]:
    return [s for s in spans if (s.attributes or {}).get("actors.execution_id") == eid]


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@pytest.mark.timeout(60)
async def test_span_trees_of_steps_retries_loops_children_and_a_caller(
    exporter: InMemorySpanExporter, nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_system(nats_server, tmp_path) as system:
        await _register(system, THREE, FLAKY, LOOP, CHILD, PARENT)
        caller_tracer = tracing._on.provider.get_tracer("caller")  # type: ignore[union-attr]
        with caller_tracer.start_as_current_span("caller request") as caller:
            three = await system.client.start("trace/three")
        flaky = await system.client.start("trace/flaky")
        # a process with no span of its own (the CLI, `start_execution`) passes on its environment's
        monkeypatch.setenv("TRACEPARENT", ENV_PARENT)
        loop = (await system.client.start_execution("trace/loop")).execution_id
        monkeypatch.delenv("TRACEPARENT")
        parent = await system.client.start("trace/parent")
        states = await asyncio.gather(*(system.client.wait(e, timeout=30) for e in (three, flaky, loop, parent)))
        assert [s.state for s in states] == ["COMPLETED", "FAILED", "COMPLETED", "COMPLETED"]
        await system.engine_idle()
    spans = list(exporter.get_finished_spans())
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids)), "a span exported twice"

    # a caller's span parents the execution; steps, attempts and the tool pod's spans nest below
    ctx = caller.get_span_context()
    mine = _of(spans, three)
    execution = _one(mine, "execution trace/three")
    assert execution.context.trace_id == ctx.trace_id and _parent_id(execution) == ctx.span_id
    assert all(s.context.trace_id == ctx.trace_id for s in mine)
    attrs = execution.attributes or {}
    assert attrs["actors.playbook"] == "trace/three" and attrs["actors.execution.status"] == "COMPLETED"
    steps = {s.name: s for s in mine if s.name.startswith("step ")}
    assert set(steps) == {"step a", "step b", "step end"}
    assert all(_parent_id(s) == execution.context.span_id for s in steps.values())
    attempt_a = _one(mine, "attempt a")
    assert _parent_id(attempt_a) == steps["step a"].context.span_id
    assert (attempt_a.attributes or {})["messaging.system"] == "nats"
    assert (attempt_a.attributes or {})["actors.attempt"] == 1 and attempt_a.kind == SpanKind.PRODUCER
    process = _one(mine, "cmd.python process")
    assert _parent_id(process) == attempt_a.context.span_id and process.kind == SpanKind.CONSUMER
    assert (process.attributes or {})["actors.queue_wait_s"] >= 0
    run = _one(mine, "tool python")
    assert _parent_id(run) == process.context.span_id
    # times come from the log: each step inside its execution
    assert all(execution.start_time <= s.start_time <= s.end_time <= execution.end_time for s in steps.values())

    # a retry: two attempts under one step, the delay as an event; the failure marks them all
    failed = _of(spans, flaky)
    assert failed[0].context.trace_id == tracing.trace_id_of(flaky)  # no caller: derived from the id
    step = _one(failed, "step flaky")
    attempts = [s for s in failed if s.name == "attempt flaky"]
    assert sorted((s.attributes or {})["actors.attempt"] for s in attempts) == [1, 2]
    assert all(_parent_id(s) == step.context.span_id and s.status.status_code == StatusCode.ERROR for s in attempts)
    retry = [e for e in step.events if e.name == "retry.scheduled"]
    assert len(retry) == 1 and (retry[0].attributes or {})["actors.retry.delay_s"] == 0.05
    assert step.status.status_code == StatusCode.ERROR
    assert _one(failed, "execution trace/flaky").status.status_code == StatusCode.ERROR

    # a loop: one span with its counts, under its step; no span per iteration by default
    looped = _of(spans, loop)
    loop_span = _one(looped, "loop each")
    env_parent = tracing.parse_traceparent(ENV_PARENT)
    assert env_parent is not None
    loop_execution = _one(looped, "execution trace/loop")
    assert loop_execution.context.trace_id == env_parent.trace_id and _parent_id(loop_execution) == env_parent.span_id
    la = loop_span.attributes or {}
    assert (la["actors.loop.total"], la["actors.loop.succeeded"], la["actors.loop.failed"]) == (3, 3, 0)
    assert la["actors.loop.rate_per_s"] > 0
    assert _parent_id(loop_span) == _one(looped, "step each").context.span_id
    assert not [s for s in looped if s.name.startswith(("cmd.", "tool "))]

    # a child playbook joins its parent's trace, under the attempt that started it
    attempt = _one(_of(spans, parent), "attempt call")
    child_id = (attempt.attributes or {})["actors.child_execution_id"]
    child = _one(_of(spans, child_id), "execution trace/child")
    assert child.context.trace_id == attempt.context.trace_id == tracing.trace_id_of(parent)
    assert _parent_id(child) == attempt.context.span_id
    assert (child.attributes or {})["actors.parent_execution_id"] == parent
    # and its tool call too: the context went on the child's start record, then its command
    inner = _one(_of(spans, child_id), "cmd.python process")
    assert inner.context.trace_id == attempt.context.trace_id


@pytest.mark.timeout(60)
async def test_an_engine_restarted_mid_execution_emits_no_span_twice(
    exporter: InMemorySpanExporter, nats_server: NatsServer, tmp_path: Path
) -> None:
    tracing.provider_for_test(exporter, iterations=True)  # a span per loop iteration, asked for
    async with running_system(nats_server, tmp_path) as system:
        await _register(system, SLOW)
        eid = await system.client.start("trace/slow")
        async for item in system.client.follow(eid):
            if item.type == "command.issued" and item.step == "wait":
                break
        await system.engine_idle()
        before = len(exporter.get_finished_spans())
        await system.restart_roles(("engine",))  # the next input is folded by a fresh actor, after a replay
        status = await system.client.wait(eid, timeout=30)
        assert status.state == "COMPLETED"
        await system.engine_idle()
    spans = _of(list(exporter.get_finished_spans()), eid)
    assert before > 0
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids)), sorted(s.name for s in spans)
    names = sorted(s.name for s in spans if not s.name.startswith(("cmd.", "tool ")))
    # (noop steps are done by the engine itself: no attempt)
    expected = ["attempt wait", "execution trace/slow", "loop last", "step end", "step first", "step last", "step wait"]
    assert names == expected
    # iterations, asked for: each under its loop's span, whose context the counter got with the loop
    loop = _one(spans, "loop last")
    iterations = [s for s in spans if s.name == "cmd.python process"]
    assert sorted((s.attributes or {})["actors.iteration"] for s in iterations) == [0, 1]
    assert all(_parent_id(s) == loop.context.span_id for s in iterations)


HTTP_LOOP = HEAD % "trace/http-loop" + (
    "  - step: call\n"
    '    tool: {kind: http, url: "http://127.0.0.1:%d/{{ workload.tag }}/{{ n }}"}\n'
    '    loop: {collection: "{{ range(3) | list }}", element: n}\n'
)


@pytest.mark.timeout(60)
async def test_a_callers_tracestate_is_kept_only_when_valid_and_http_iterations_make_no_spans(
    exporter: InMemorySpanExporter, nats_server: NatsServer, tmp_path: Path
) -> None:
    from aiohttp import web

    from actors.wire.messages import StartMessage
    from streams.ids import start_id
    from streams.layout import START_SUBJECT

    received: dict[str, list[tuple[str, str | None]]] = {}

    async def remember(request: web.Request) -> web.Response:
        tag = request.match_info["tag"]
        received.setdefault(tag, []).append((request.headers["traceparent"], request.headers.get("tracestate")))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/{tag}/{n}", remember)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    huge = "k=" + "v" * 48_000  # the review's: it rode every command, loop spec and log line
    states = {"big": huge, "ok": "congo=t61rcWkgMzE"}
    try:
        async with running_system(nats_server, tmp_path) as system:
            await _register(system, HTTP_LOOP % port)
            js = system.nc.jetstream()
            for tag, state in states.items():
                # a start message as any NATS client sends it, W3C context in its headers
                start = StartMessage(playbook="trace/http-loop", payload={"tag": tag}, execution_id=f"ts-{tag}")
                headers = {"traceparent": ENV_PARENT, "tracestate": state, "Nats-Msg-Id": start_id(f"ts-{tag}")}
                await js.publish(START_SUBJECT, system.client.codec.encode(start), headers=headers)
            done = await asyncio.gather(*(system.client.wait(f"ts-{tag}", timeout=30) for tag in states))
            assert [s.state for s in done] == ["COMPLETED", "COMPLETED"]
            records = {tag: await system.client.start_record(f"ts-{tag}") for tag in states}
            await system.engine_idle()
    finally:
        await runner.cleanup()
    env_parent = tracing.parse_traceparent(ENV_PARENT)
    assert env_parent is not None
    spans = list(exporter.get_finished_spans())
    for tag in states:
        record = records[tag]
        assert record is not None and record.traceparent == ENV_PARENT
        mine = _of(spans, f"ts-{tag}")
        execution = _one(mine, "execution trace/http-loop")
        assert execution.context.trace_id == env_parent.trace_id and _parent_id(execution) == env_parent.span_id
        loop_span = _one(mine, "loop call")
        # no span per iteration, the http client's neither: the server hears of the loop's span
        trace_spans = [s for s in spans if s.context.trace_id == env_parent.trace_id]
        assert not [s for s in trace_spans if s.kind == SpanKind.CLIENT or s.name.startswith(("cmd.", "tool "))]
        sent = received[tag]
        assert len(sent) == 3
        assert {tp for tp, _ in sent} == {f"00-{env_parent.trace_id:032x}-{loop_span.context.span_id:016x}-01"}
    # a valid state is kept and passed on; one W3C would not keep is dropped before it is recorded
    assert records["ok"] is not None and records["ok"].tracestate == "congo=t61rcWkgMzE"
    assert {ts for _, ts in received["ok"]} == {"congo=t61rcWkgMzE"}
    assert records["big"] is not None and records["big"].tracestate is None
    assert {ts for _, ts in received["big"]} == {None}


SECRET_TYPE = HEAD % "trace/sealed" + (
    "  - step: leak\n    tool:\n      kind: python\n      code: |\n"
    "        def main():\n"
    "            raise type('Token_s3cr3t', (Exception,), {})('no')\n"
)


@pytest.mark.timeout(60)
async def test_with_a_payload_key_spans_name_no_error_type(
    exporter: InMemorySpanExporter, nats_server: NatsServer, tmp_path: Path
) -> None:
    """A python step's error type is whatever class its code raised, sealed in the log when
    a payload key is set: its spans then say `error` and nothing more."""
    key = "k1:" + base64.b64encode(b"K" * 32).decode()
    async with running_system(nats_server, tmp_path, settings=Settings(payload_key=key)) as system:
        await _register(system, SECRET_TYPE)
        eid = await system.client.start("trace/sealed")
        assert (await system.client.wait(eid, timeout=30)).state == "FAILED"
        await system.engine_idle()
    spans = _of(list(exporter.get_finished_spans()), eid)
    assert _one(spans, "attempt leak").status.status_code == StatusCode.ERROR
    said = repr([(s.name, dict(s.attributes or {}), s.status.description, s.events) for s in spans])
    assert "s3cr3t" not in said
    assert (_one(spans, "attempt leak").attributes or {})["error.type"] == "error"


DUCK = HEAD % "trace/duck" + '  - step: sum\n    tool: {kind: duckdb, query: "SELECT 41 + 1 AS answer"}\n'


@pytest.mark.timeout(60)
async def test_a_data_tools_run_is_a_database_client_span(
    exporter: InMemorySpanExporter, nats_server: NatsServer, tmp_path: Path
) -> None:
    """The data tools' runs carry the semantic conventions' `db.system.name`, and nothing of
    the statement (a step's value)."""
    async with running_system(nats_server, tmp_path) as system:
        await _register(system, DUCK)
        eid = await system.client.start("trace/duck")
        assert (await system.client.wait(eid, timeout=30)).state == "COMPLETED"
        await system.engine_idle()
    run = _one(_of(list(exporter.get_finished_spans()), eid), "tool duckdb")
    attrs = dict(run.attributes or {})
    assert attrs["db.system.name"] == "duckdb"
    assert "41 + 1" not in repr(attrs)
