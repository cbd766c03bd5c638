"""Traces end to end as a platform team runs them: an engine pod and a tool pod as
processes, configured only by OTEL_* variables, export OTLP over HTTP to a receiver
started here (the protobuf decoded with opentelemetry-proto), while an http step calls
a server here that records the `traceparent` it receives. One trace runs from the
caller's span, through the execution, its step, attempt and the tool pod's spans, to
the downstream request."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import aiohttp.web
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.runtime.tracing import parse_traceparent
from streams.layout import Layout
from streams.server import free_port
from tests.conftest import NatsServer
from tests.support.pods import PodProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.system]

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: trace/otlp}
workflow:
  - step: fetch
    tool: {kind: http, url: "%s"}
"""


class Receiver:
    """An OTLP/HTTP traces endpoint and a downstream API, on one local server."""

    def __init__(self) -> None:
        self.spans: list[dict[str, object]] = []
        self.traceparents: list[str] = []
        self.arrived = asyncio.Event()

    async def traces(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for rs in export.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        {
                            "name": s.name,
                            "trace": s.trace_id.hex(),
                            "id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(),
                            "service": resource.get("service.name"),
                            "pod": resource.get("k8s.pod.name"),
                        }
                    )
        self.arrived.set()
        body = ExportTraceServiceResponse().SerializeToString()
        return aiohttp.web.Response(body=body, content_type="application/x-protobuf")

    async def downstream(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.traceparents.append(request.headers.get("traceparent", ""))
        return aiohttp.web.json_response({"ok": True})

    async def until(self, name: str, timeout: float = 30) -> dict[str, object]:
        async with asyncio.timeout(timeout):
            while True:
                found = [s for s in self.spans if s["name"] == name]
                if found:
                    return found[0]
                self.arrived.clear()
                await self.arrived.wait()


@pytest.mark.timeout(120)
async def test_one_trace_from_the_callers_span_to_the_downstream_request(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    receiver = Receiver()
    app = aiohttp.web.Application()
    app.router.add_post("/v1/traces", receiver.traces)
    app.router.add_get("/api", receiver.downstream)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    layout = Layout(partitions=2, ack_wait=5.0)
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans leave at once, not after 5 s
    }
    pods: list[PodProcess] = []
    nc = None
    runtime = None
    try:
        engine = await PodProcess.start(
            "engine",
            url=nats_server.url,
            layout=layout,
            logs=tmp_path,
            name="engine",
            env={**otel, "HOSTNAME": "engine-0"},
        )
        pods.append(engine)
        await engine.ready()  # it declares the streams
        tools = await PodProcess.start(
            "tools",
            url=nats_server.url,
            layout=layout,
            logs=tmp_path,
            name="tools",
            env={**otel, "HOSTNAME": "tools-0"},
        )
        pods.append(tools)
        await tools.ready()
        nc = await connect(nats_server.url, name="test")
        runtime = await start_roles(nc, layout=layout, roles=("projector",))  # what `wait` reads
        client = Client(nc, layout=layout)
        path = tmp_path / "otlp.yaml"
        path.write_text(PLAYBOOK % f"http://127.0.0.1:{port}/api")
        entry = await client.register(path)
        caller = TracerProvider().get_tracer("caller")  # the caller's own SDK, not the pods'
        with caller.start_as_current_span("caller request") as span:
            eid = await client.start(entry.path)
        assert (await client.wait(eid, timeout=30)).state == "COMPLETED"

        ctx = span.get_span_context()
        trace_id, caller_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        execution = await receiver.until("execution trace/otlp")
        http = await receiver.until("GET")
        step = await receiver.until("step fetch")
        attempt = await receiver.until("attempt fetch")
        process = await receiver.until("cmd.http process")
        run = await receiver.until("tool http")
    finally:
        if runtime is not None:
            await runtime.stop(drain_timeout=0.2)
        if nc is not None:
            await nc.close()
        for pod in pods:
            await pod.stop()
        await runner.cleanup()

    # one trace, parent to child: caller -> execution -> step -> attempt -> process -> run -> GET -> downstream
    chain = [execution, step, attempt, process, run, http]
    assert all(s["trace"] == trace_id for s in chain), chain
    assert execution["parent"] == caller_id
    for parent, child in itertools.pairwise(chain):
        assert child["parent"] == parent["id"], (parent, child)
    sent = parse_traceparent(receiver.traceparents[0])
    assert sent is not None and f"{sent.trace_id:032x}" == trace_id and f"{sent.span_id:016x}" == http["id"]
    # a service per role, the pod's name from HOSTNAME: the engine's spans, then the tool pod's
    assert (execution["service"], execution["pod"]) == ("actors-engine", "engine-0")
    assert (http["service"], http["pod"]) == ("actors-tools", "tools-0")
