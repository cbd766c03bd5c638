"""Retries end to end: every attempt is a command through the log; delays are durable
timers that outlive every actor process; real HTTP. The retry rules themselves are on
the pure fold harness (tests/pure/test_semantics_retry.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from actors.client import Client
from actors.pod.roles import connect
from streams.layout import Layout, ensure
from streams.server import NatsServer
from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[2]


class Api:
    """A real HTTP server in the test process, counting what it is asked."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.url = ""

    def count(self, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name]

    async def flaky(self, request: web.Request) -> web.Response:
        n = self.count("flaky")
        if n <= 2:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"ok": True, "calls": n})

    async def missing(self, request: web.Request) -> web.Response:
        self.count("missing")
        return web.json_response({"error": "no such thing"}, status=404)

    async def pages(self, request: web.Request) -> web.Response:
        self.count("pages")
        page = int(request.query.get("page", "1"))
        total = int(request.query.get("total", "7"))
        items = [f"p{page}i{i}" for i in range(3)]
        return web.json_response(
            {
                "data": items,
                "extra": {f"page{page}": page},
                "paging": {"page": page, "hasMore": page < total},
            }
        )

    async def slow(self, request: web.Request) -> web.Response:
        self.count("slow")
        await asyncio.sleep(10)
        return web.json_response({"late": True})


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    a = Api()
    app = web.Application()
    app.router.add_get("/flaky", a.flaky)
    app.router.add_get("/missing", a.missing)
    app.router.add_get("/pages", a.pages)
    app.router.add_get("/slow", a.slow)
    # the test is over: a request still held by /slow is not waited for at cleanup
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    a.url = f"http://127.0.0.1:{port}"
    try:
        yield a
    finally:
        await runner.cleanup()


def http_playbook(name: str, url: str, retry: str, extra: str = "") -> str:
    return f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: {name}}}
workflow:
  - step: call
    tool: {{kind: http, url: "{url}"{extra}}}
    retry:
{retry}
"""


ON_RETRYABLE = """      - when: "{{ error is not none and error.retryable }}"
        then: {max_attempts: 5, backoff: exponential, initial_delay: 0.2, max_delay: 1}"""


async def test_503_twice_then_200_retries_on_durable_timers(system: System, api: Api) -> None:
    eid, status = await system.run_yaml(http_playbook("flaky", f"{api.url}/flaky", ON_RETRYABLE))
    assert status.state == "COMPLETED"
    assert api.calls["flaky"] == 3
    items = await system.events(eid)
    issued = of_type(items, "command.issued", "call")
    assert [i.data["attempt_number"] for i in issued] == [1, 2, 3]
    # attempts are linked: each names the command of the attempt before
    assert [i.data.get("parent_event_id") for i in issued] == [
        None,
        issued[0].data["command_id"],
        issued[1].data["command_id"],
    ]
    scheduled = of_type(items, "retry.scheduled", "call")
    assert [s.data["delay"] for s in scheduled] == [0.2, 0.4]
    assert all(s.data["reason"] == "error" and s.data["due"] > 0 for s in scheduled)
    fired = [i for i in of_type(items, "timer.fired") if i.cls == "in"]
    assert len(fired) == 2  # each delay went through a durable timer
    assert len(of_type(items, "retry.due", "call")) == 2
    errors = of_type(items, "call.error", "call")
    assert [e.data["attempt_number"] for e in errors] == [1, 2]
    assert errors[0].data["error"]["status"] == 503
    assert of_type(items, "call.done", "call")[0].data["attempt_number"] == 3
    result = of_type(items, "playbook.completed")[0].data["result"]["call"]
    assert result["status"] == 200 and result["data"] == {"ok": True, "calls": 3}


PAGINATE = """      - when: "{{ result is not none and result.data.paging.hasMore }}"
        then:
          max_attempts: %d
          next_call: {args: {page: "{{ result.data.paging.page + 1 }}"}}
          collect: {strategy: %s, path: %s}"""


async def test_pagination_collects_every_page_in_order_with_append(system: System, api: Api) -> None:
    eid, status = await system.run_yaml(
        http_playbook("pages", f"{api.url}/pages", PAGINATE % (100, "append", "data.data"), ", params: {total: 7}")
        + "    args: {page: 1}\n"
    )
    assert status.state == "COMPLETED"
    assert api.calls["pages"] == 7
    items = await system.events(eid)
    result = of_type(items, "playbook.completed")[0].data["result"]["call"]
    assert result["data"]["data"] == [f"p{p}i{i}" for p in range(1, 8) for i in range(3)]
    assert result["data"]["paging"] == {"page": 7, "hasMore": False}  # the last page's
    done = of_type(items, "retry_sequence.completed", "call")[0].data
    assert done["total_attempts"] == 7 and done["collected_size"] == 21 and done["bounded"] is False
    assert [s.data["reason"] for s in of_type(items, "retry.scheduled")] == ["success"] * 6
    assert not of_type(items, "timer.fired") and not of_type(items, "retry.due")  # no delay: no timer


async def test_timeouts_are_retryable_and_exhaust(system: System, api: Api) -> None:
    eid, status = await system.run_yaml(f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: slow_http}}
workflow:
  - step: call
    timeout: 0.3
    tool: {{kind: http, url: "{api.url}/slow"}}
    retry:
      - when: "{{{{ error is not none and error.type == 'Timeout' }}}}"
        then: {{max_attempts: 2, backoff: fixed, initial_delay: 0.1}}
""")
    assert status.state == "FAILED"
    assert api.calls["slow"] == 2
    items = await system.events(eid)
    exhausted = of_type(items, "retry.exhausted", "call")
    assert len(exhausted) == 1 and exhausted[0].data["attempts"] == 2
    assert of_type(items, "step.exit", "call")[0].data["error"]["type"] == "Timeout"


async def _serve(url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "serve",
        "--role",
        "all",
        "--nats",
        url,
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "ACTORS_ACK_WAIT": "2"},
    )


async def test_a_backoff_survives_killing_every_actor_process(tmp_path: Path) -> None:
    marker = tmp_path / "attempts.txt"
    server = await NatsServer.start()
    pods = [await _serve(server.url)]
    nc = await connect(server.url)
    try:
        layout = Layout(ack_wait=2.0)
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout)
        pb = tmp_path / "durable.yaml"
        pb.write_text(f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: durable_retry}}
workflow:
  - step: flaky
    retry: {{max_attempts: 3, backoff: fixed, initial_delay: 5}}
    tool:
      kind: python
      code: |
        def main(f):
            open(f, "a").write("attempt\\n")
            if len(open(f).read().split()) == 1:
                raise RuntimeError("fails the first time")
            return "ok"
    args: {{f: "{marker}"}}
""")
        entry = await client.register(pb)
        eid = await client.start(entry.path)
        started = time.monotonic()
        async for item in client.follow(eid):
            if item.type == "retry.scheduled":
                break
        for pod in pods:  # every actor process dies during the 5 s backoff
            pod.send_signal(signal.SIGKILL)
            await pod.wait()
        pods = [await _serve(server.url)]
        status = await client.wait(eid, timeout=40)
        assert status.state == "COMPLETED"
        assert time.monotonic() - started >= 4.5  # the delay was kept, not skipped
        assert marker.read_text().split() == ["attempt", "attempt"]  # retried exactly once
        items = await client.events(eid)
        assert len(of_type(items, "timer.fired")) == 1
        assert len(of_type(items, "command.issued")) == 2
    finally:
        for pod in pods:
            if pod.returncode is None:
                pod.send_signal(signal.SIGTERM)
                await pod.wait()
        await nc.close()
        await server.stop()


async def test_each_attempt_runs_its_sink_with_it(system: System, api: Api, tmp_path: Path) -> None:
    saved = tmp_path / "pages"
    saved.mkdir()
    sink = f"""    sink:
      tool:
        kind: python
        code: |
          import json
          def main(d, page, items):
              open(d + "/" + str(page), "w").write(json.dumps(items))
      args: {{d: "{saved}", page: "{{{{ result.data.paging.page }}}}", items: "{{{{ result.data.data }}}}"}}
"""
    _, status = await system.run_yaml(
        http_playbook("sinkpages", f"{api.url}/pages", PAGINATE % (100, "append", "data.data"), ", params: {total: 4}")
        + "    args: {page: 1}\n"
        + sink
    )
    assert status.state == "COMPLETED"
    assert sorted(p.name for p in saved.iterdir()) == ["1", "2", "3", "4"]  # one save per attempt
    assert json.loads((saved / "3").read_text()) == [f"p3i{i}" for i in range(3)]
