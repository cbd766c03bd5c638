"""The web UI's HTTP API (actors/ui/server.py) against a real nats-server and every
actor: each endpoint, the live feeds, and the guards on actions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from actors.ui.listing import ERROR_SUMMARY
from actors.ui.server import allowed_hosts, make_app, serve_ui
from actors.wire.messages import ExecutionStatus
from tests.conftest import System, of_type, wait_for
from tests.support.ui import BREAKS, CHILD, LOOP, PARENT, PRINTS, QUICK, SLOW, Events, ok, post, register

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


@pytest_asyncio.fixture
async def ui(system: System) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as client:
        yield client


async def test_list_is_newest_first_filtered_and_paged(system: System, ui: TestClient[Any, Any]) -> None:
    quick, breaks = await register(system, QUICK), await register(system, BREAKS)
    ids = []
    for i in range(5):
        ids.append(await system.client.start(quick, execution_id=f"q-{i}"))
        await system.client.wait(ids[-1], timeout=20)
    failed = await system.client.start(breaks, payload={"msg": "no"}, execution_id="b-0")
    await system.client.wait(failed, timeout=20)

    rows = (await ok(await ui.get("/api/executions")))["executions"]
    assert [r["execution_id"] for r in rows] == ["b-0", "q-4", "q-3", "q-2", "q-1", "q-0"]
    # a row is the status value KV `status` holds, under the wire's names, every field written out
    for row in rows[:2]:
        status = await system.client.status(row["execution_id"])
        assert status is not None
        assert row == {f: None for f in ExecutionStatus.__struct_fields__} | msgspec.to_builtins(status)
    assert rows[0]["state"] == "FAILED" and rows[0]["error"]["type"] == "ValueError"
    assert rows[0]["error"]["message"] == "no" and rows[0]["error"]["step"] == "boom"
    assert rows[1]["error"] is None and rows[1]["terminal_event"] == "playbook.completed"

    # pages follow each other: no row twice, none missed, and the last says there is no more
    seen, cursor = [], None
    while True:
        page = await ok(await ui.get("/api/executions", params={"limit": 2, **({"before": cursor} if cursor else {})}))
        seen += [r["execution_id"] for r in page["executions"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [r["execution_id"] for r in rows]

    by = {
        "state=FAILED": ["b-0"],
        "state=COMPLETED&limit=2": ["q-4", "q-3"],
        "playbook=ui/quick&q=Q-1": ["q-1"],
        "q=b-": ["b-0"],
        "state=RUNNING": [],
    }
    for query, expected in by.items():
        got = await ok(await ui.get(f"/api/executions?{query}"))
        assert [r["execution_id"] for r in got["executions"]] == expected, query
    assert (await ui.get("/api/executions?state=NOPE")).status == 400
    assert (await ui.get("/api/executions?limit=x")).status == 400


async def test_list_stream_shows_a_start_a_change_and_the_end(system: System, ui: TestClient[Any, Any]) -> None:
    slow = await register(system, SLOW)
    await register(system, QUICK)
    resp = await ui.get("/api/executions/stream", params={"playbook": "ui/slow"})
    assert resp.headers["Content-Type"] == "text/event-stream"
    feed = Events(resp)
    await system.client.start("ui/quick", execution_id="other")  # filtered out: another playbook
    eid = await system.client.start(slow, execution_id="nap-1")
    running = await feed.until("status", lambda r: r["state"] == "RUNNING")
    assert running["execution_id"] == eid and running["playbook"] == "ui/slow"
    await system.client.cancel(eid)
    ended = await feed.until("status", lambda r: r["state"] == "CANCELLED")
    assert ended["execution_id"] == eid and ended["ended_at"] is not None
    resp.close()


async def test_execution_detail_graph_timeline_result_events_and_logs(system: System, ui: TestClient[Any, Any]) -> None:
    prints = await register(system, PRINTS)
    eid = await system.client.start(prints, payload={"who": "<script>alert(1)</script>"})
    await system.client.wait(eid, timeout=20)
    d = await ok(await ui.get(f"/api/executions/{eid}"))
    assert d["execution_id"] == d["status"]["execution_id"] == eid and d["status"]["state"] == "COMPLETED"
    assert (d["playbook_path"], d["playbook_version"]) == ("ui/prints", 1)
    assert {n["id"]: n["state"] for n in d["graph"]["nodes"]}["talk"] == "completed"
    assert d["timeline"]["rows"][0]["step"] == "talk"
    assert d["result"] == {"talk": "<script>alert(1)</script>"} and d["result_ref"] is None
    assert (d["parent"], d["children"], d["retry_of"], d["retried_by"], d["error"]) == (None, [], None, [], None)

    events = (await ok(await ui.get(f"/api/executions/{eid}/events")))["events"]
    assert events[0]["type"] == "execution.start" and events[-1]["type"] == "playbook.completed"
    logs = (await ok(await ui.get(f"/api/executions/{eid}/logs", params={"step": "talk"})))["logs"]
    talk = {
        "step": "talk",
        "iteration_index": None,
        "attempt_number": 1,
        "running": False,
        "text": "hello <script>alert(1)</script>\n",
    }
    assert logs == [talk]
    assert (await ok(await ui.get(f"/api/executions/{eid}/logs?step=nope")))["logs"] == []

    missing = await ui.get("/api/executions/never-started")  # no start queued: the page says "not found"
    assert missing.status == 404
    assert await missing.json() == {"error": "no execution 'never-started'", "queued": False}
    assert (await ui.get("/api/executions/a.b")).status == 400


async def test_failure_root_cause_envelope_children_and_retry_both_ways(
    system: System, ui: TestClient[Any, Any]
) -> None:
    await register(system, CHILD)
    parent = await register(system, PARENT)
    eid = await system.client.start(parent)
    await system.client.wait(eid, timeout=20)
    d = await ok(await ui.get(f"/api/executions/{eid}"))
    [child] = d["children"]
    assert d["error"]["envelope"]["step"] == "call_child"
    assert "child broke" in d["error"]["envelope"]["text"]
    c = await ok(await ui.get(f"/api/executions/{child}"))
    assert c["parent"] == {"execution_id": eid, "step": "call_child"} and c["status"]["state"] == "FAILED"
    assert c["error"]["root_cause"]["type"] == "ValueError" and c["error"]["root_cause"]["step"] == "work"

    breaks = await register(system, BREAKS)
    failed = await system.client.start(breaks, payload={"msg": "first try"})
    await system.client.wait(failed, timeout=20)
    got = await ok(await post(ui, f"/api/executions/{failed}/retry", {"from": None, "payload": {"msg": "again"}}))
    retried = got["execution_id"]
    assert got["existing"] is False
    await system.client.wait(retried, timeout=20)
    r = await ok(await ui.get(f"/api/executions/{retried}"))
    assert r["retry_of"] == {"execution_id": failed, "from_step": "boom"}
    assert r["error"]["root_cause"]["message"] == "again"
    assert (await ok(await ui.get(f"/api/executions/{failed}")))["retried_by"] == [retried]
    refused = await post(ui, f"/api/executions/{failed}/retry", {"from": "nope"})
    assert refused.status == 400 and "nope" in (await refused.json())["error"]
    assert (await post(ui, "/api/executions/never-started/retry")).status == 404


BIG_RESULT = (
    "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: big, path: ui/big}\n"
    "workflow:\n  - step: big\n    tool: {kind: python, code: \"def main(): return 'x' * 2_000_000\"}\n"
)


async def test_a_big_result_is_named_by_its_blob_and_a_long_error_is_cut_in_rows(
    system: System, ui: TestClient[Any, Any]
) -> None:
    # a result too large for its event: `result_ref` names its blob, as result.request's reply does
    eid, status = await system.run_yaml(BIG_RESULT, timeout=60)
    assert status.state == "COMPLETED"
    d = await ok(await ui.get(f"/api/executions/{eid}"))
    ref = of_type(await system.events(eid), "playbook.completed")[0].data["result_ref"]
    assert (d["result"], d["result_ref"], d["result_truncated"]) == (None, ref, True)

    # a long error message: cut in a row (a page of rows stays small), whole on the execution's page
    breaks = await register(system, BREAKS)
    failed = await system.client.start(breaks, payload={"msg": "m" * 1000})
    await system.client.wait(failed, timeout=20)

    async def failed_rows() -> list[dict[str, Any]]:
        # listed from the ENDED index, which the projector writes just after the status
        rows: list[dict[str, Any]] = (await ok(await ui.get("/api/executions", params={"state": "FAILED"})))[
            "executions"
        ]
        return rows

    [row] = await wait_for(failed_rows, timeout=20)
    assert row["execution_id"] == failed and row["error"]["message"] == "m" * ERROR_SUMMARY + "…"
    detail = await ok(await ui.get(f"/api/executions/{failed}"))
    assert detail["status"] == row and detail["error"]["root_cause"]["message"] == "m" * 1000


async def test_execution_stream_follows_a_loop_to_its_end(system: System, ui: TestClient[Any, Any]) -> None:
    loop = await register(system, LOOP)
    eid = "loop-1"
    resp = await ui.get(f"/api/executions/{eid}/stream")
    feed = Events(resp)
    await system.client.start(loop, payload={"n": 300}, execution_id=eid)
    done = await feed.until("update", lambda d: d["status"]["state"] == "COMPLETED")
    [node] = [n for n in done["graph"]["nodes"] if n["id"] == "each"]
    assert node["state"] == "completed" and node["loop"]["done"] == node["loop"]["total"] == 300
    resp.close()


async def test_start_and_cancel_from_the_api(system: System, ui: TestClient[Any, Any]) -> None:
    await register(system, SLOW)
    catalog = await ok(await ui.get("/api/playbooks"))
    assert [(p["path"], [v["version"] for v in p["versions"]]) for p in catalog["playbooks"]] == [("ui/slow", [1])]
    # an entry as KV `catalog` holds it
    pb = await ok(await ui.get("/api/playbooks/ui/slow"))
    [entry] = await system.client.playbooks()
    graph, workload = pb.pop("graph"), pb.pop("workload")  # beside the entry: the page's graph and start form
    assert pb == msgspec.to_builtins(entry) and pb["path"] == "ui/slow" and "kind: sleep" in pb["source"]
    assert [n["id"] for n in graph["nodes"]] == ["nap", "end"] and workload == {}
    assert (await ui.get("/api/playbooks/ui/slow?version=7")).status == 404
    assert (await ui.get("/api/playbooks/nope")).status == 404

    eid = (await ok(await post(ui, "/api/playbooks/ui/slow/start", {"payload": {"a": 1}, "version": 1})))[
        "execution_id"
    ]
    # cancelled at once: the UI waits for the start record a moment, as `actors-cli cancel` does
    assert await ok(await post(ui, f"/api/executions/{eid}/cancel", {"reason": "enough"})) == {"execution_id": eid}
    status = await system.client.wait(eid, timeout=20)
    assert status.state == "CANCELLED"
    items = await system.events(eid)
    assert of_type(items, "execution.cancelled")[0].data["reason"] == "enough"

    assert (await post(ui, "/api/playbooks/nope/start")).status == 404
    assert (await post(ui, "/api/playbooks/ui/slow/start", {"payload": [1]})).status == 400
    assert (await post(ui, "/api/executions/never-started/cancel")).status == 404


async def test_actions_are_guarded(system: System) -> None:
    await register(system, QUICK)

    async def answer(app: Any, headers: dict[str, str], *, body: str = "{}") -> int:
        async with TestClient(TestServer(app)) as c:
            resp = await c.post("/api/playbooks/ui/quick/start", data=body, headers=headers)
            return resp.status

    json_ct = {"Content-Type": "application/json"}
    read_only = make_app(system.client, read_only=True, token=None)
    assert await answer(read_only, json_ct) == 403
    async with TestClient(TestServer(make_app(system.client, read_only=True, token="s3cret"))) as c:
        assert await (await c.get("/api/config")).json() == {"read_only": True, "token_required": True}

    tokened = make_app(system.client, read_only=False, token="s3cret")
    assert await answer(tokened, json_ct) == 401
    assert await answer(tokened, {**json_ct, "X-Actors-Token": "wrong"}) == 401
    assert await answer(tokened, {**json_ct, "X-Actors-Token": "s3cret"}) == 200
    assert await answer(tokened, {**json_ct, "Authorization": "Bearer s3cret"}) == 200

    proxied = make_app(system.client, read_only=False, token=None, user_header="X-Forwarded-User")
    assert await answer(proxied, json_ct) == 401
    assert await answer(proxied, {**json_ct, "X-Forwarded-User": "ada"}) == 200

    open_app = make_app(system.client, read_only=False, token=None)
    # a form post from another site: not JSON, so refused before anything starts
    assert await answer(open_app, {"Content-Type": "text/plain"}) == 400
    assert await answer(open_app, {**json_ct, "Origin": "http://evil.example"}) == 403
    assert await answer(open_app, json_ct, body="not json") == 400


async def test_a_dns_rebound_request_is_refused_on_every_route(system: System) -> None:
    """The proof's request (/tmp/review/rebind.py) over real HTTP: a page at
    attacker.example whose name now resolves to 127.0.0.1 sends its own Host (and
    Origin). A UI bound to loopback refuses it on every route, GETs and SSE included;
    this machine's names, and one given with --allow-host, pass."""
    await register(system, QUICK)
    runner, url = await serve_ui(system.client, host="127.0.0.1", port=0)
    port = url.rstrip("/").rsplit(":", 1)[1]
    routes = [
        ("GET", "/"),
        ("GET", "/static/app.js"),
        ("GET", "/api/config"),
        ("GET", "/api/executions"),
        ("GET", "/api/executions/stream"),
        ("GET", "/api/executions/x1/stream"),
        ("GET", "/api/executions/x1/events"),
        ("GET", "/api/playbooks"),
        ("POST", "/api/playbooks/ui/quick/start"),
    ]

    def rebound(name: str) -> dict[str, str]:
        return {"Host": f"{name}:{port}", "Origin": f"http://{name}:{port}", "Content-Type": "application/json"}

    try:
        async with aiohttp.ClientSession() as http:
            for method, path in routes:
                async with http.request(
                    method, url.rstrip("/") + path, headers=rebound("attacker.example"), data="{}"
                ) as r:
                    assert r.status == 403, (method, path, r.status)
                    assert "attacker.example" in (await r.json())["error"]
            for name in ("localhost", "127.0.0.1", "[::1]", "LOCALHOST"):
                async with http.get(url + "api/config", headers={"Host": f"{name}:{port}"}) as r:
                    assert r.status == 200, name
            start = url + "api/playbooks/ui/quick/start"
            async with http.post(start, headers=rebound("localhost"), data="{}") as r:
                assert r.status == 200, await r.text()
    finally:
        await runner.cleanup()

    runner, url = await serve_ui(system.client, host="127.0.0.1", port=0, extra_hosts=["ui.example.com"])
    port = url.rstrip("/").rsplit(":", 1)[1]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "api/config", headers={"Host": f"ui.example.com:{port}"}) as r:
                assert r.status == 200
            async with http.get(url + "api/config", headers={"Host": f"attacker.example:{port}"}) as r:
                assert r.status == 403
    finally:
        await runner.cleanup()
    # bound elsewhere (a pod behind a Service): names checked only when given
    assert allowed_hosts("0.0.0.0") is None
    assert allowed_hosts("0.0.0.0", ["ui.example.com"]) == {"ui.example.com"}
    assert allowed_hosts("::1") == {"localhost", "127.0.0.1", "[::1]"}


async def test_live_feeds_are_capped_per_process(system: System) -> None:
    """Each live feed holds NATS consumers: past `max_streams` open at once, a feed is
    refused with 503 (the list's feed and an execution's alike)."""
    app = make_app(system.client, read_only=False, token=None, max_streams=2)
    async with TestClient(TestServer(app)) as c:
        first = await c.get("/api/executions/stream")
        second = await c.get("/api/executions/x1/stream")
        assert (first.status, second.status) == (200, 200)
        for path in ("/api/executions/stream", "/api/executions/x2/stream"):
            refused = await c.get(path)
            assert refused.status == 503 and "ACTORS_UI_MAX_STREAMS" in (await refused.json())["error"]
        async with await c.get("/api/executions") as listed:
            assert listed.status == 200  # what is not a feed is not capped
        first.close()
        second.close()


@pytest.mark.asyncio
async def test_a_request_body_nested_past_any_sense_is_refused_with_400(ui: TestClient[Any, Any]) -> None:
    """Measured before it is decoded (decoding recurses per level): a 400, never a 500."""
    body = b'{"payload": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = await ui.post("/api/playbooks/any/start", data=body, headers={"Content-Type": "application/json"})
    assert response.status == 400
    assert "nests deeper" in (await response.json())["error"]
