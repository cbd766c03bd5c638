"""Webhooks (actors/ui/hooks.py, actors/client/hooks.py, actors/cli/hooks.py) against a
real nats-server, every actor and one UI server for the module (with a UI token of its
own, which the hooks do not need and every other action still does): a start hook's
round trip, its token checks, its Idempotency-Key, its bounds; a signal hook ending a
waiting step; the CLI's token printed once and never stored; its user errors; and the
hooks managed and called on the least-privilege account's cli user."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
import pytest_asyncio

from actors.client import Client
from actors.pod import permissions
from actors.ui.server import MAX_BODY, serve_ui
from actors.wire.events import ExecState
from actors.wire.hooks import hook_execution_id
from streams import layout as streams_layout
from streams.layout import HOOKS_BUCKET, START_STREAM
from streams.server import NatsServer
from tests.conftest import System, running_system, wait_for
from tests.support.cli import EXIT_INVALID, cli, one_line
from tests.support.natsio import stored_starts
from tests.support.secured import Secured

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

ECHO = """apiVersion: actors/v1
kind: Playbook
metadata: {name: echo, path: hooks/echo}
workflow:
  - step: echo
    tool: {kind: noop}
    args: {order: "{{ workload.order }}"}
"""
WAITS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: waits, path: hooks/waits}
workflow:
  - step: approve
    tool: {kind: wait, signal: go, key: first}
    timeout: 60
    next: confirm
  - step: confirm
    tool: {kind: wait, signal: go, key: second}
    timeout: 60
"""
UI_TOKEN = "ui-secret-token"
TOKEN = re.compile(r"ahk_[A-Za-z0-9_-]{40,}")


@dataclass
class Env:
    system: System
    http: aiohttp.ClientSession
    url: str

    async def post(self, path: str, body: Any = None, *, token: str | None = None, **headers: str) -> tuple[int, Any]:
        sent = dict(headers)
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if isinstance(body, bytes):
            sent.setdefault("Content-Type", "application/json")
            resp = await self.http.post(path, data=body, headers=sent)
        else:
            resp = await self.http.post(path, json=body, headers=sent)
        async with resp:
            return resp.status, await resp.json(content_type=None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    server = await NatsServer.start()
    try:
        tmp: Path = tmp_path_factory.mktemp("hooks")
        async with running_system(server, tmp) as system:
            for text in (ECHO, WAITS):
                path = tmp / f"{abs(hash(text))}.yaml"
                path.write_text(text)
                await system.client.register(path)
            runner, url = await serve_ui(system.client, host="127.0.0.1", port=0, token=UI_TOKEN)
            try:
                async with aiohttp.ClientSession(base_url=url) as http:
                    yield Env(system, http, url)
            finally:
                await runner.cleanup()
    finally:
        await server.discard()


async def started(system: System) -> set[str]:
    """Every execution with a start in EXEC (a start record, or semantics 6 the start
    stored with its first decision)."""
    return set(await stored_starts(system.nc))


async def add(env: Env, *args: str) -> str:
    """`actors-cli hook add ...`; the token it printed (once)."""
    ran = await cli("hook", "add", *args, url=env.system.server.url)
    assert ran.code == 0, ran.err
    tokens = TOKEN.findall(ran.out)
    assert len(tokens) == 1, ran.out  # printed once (the curl line names $TOKEN)
    return str(tokens[0])


async def test_start_hook_round_trip_token_idempotency_and_bounds(env: Env) -> None:
    system = env.system
    token = await add(env, "orders", "--playbook", "hooks/echo")
    spec = await system.client.hook("orders")

    # the token is never stored: KV holds its digest, and `list` shows none
    raw = (await (await system.nc.jetstream().key_value(HOOKS_BUCKET)).get("orders")).value or b""
    assert token.encode() not in raw
    assert f"sha256:{hashlib.sha256(token.encode()).hexdigest()}".encode() in raw
    listed = await cli("hook", "list", "--json", url=system.server.url)
    assert listed.code == 0 and '"orders"' in listed.out and "ahk_" not in listed.out

    # wrong, missing or malformed tokens, and a name that is no hook: one 401 for all, nothing started
    refused = [
        await env.post("/hooks/orders", {"order": 0}, token="ahk_wrong", **{"Idempotency-Key": "k0"}),
        await env.post("/hooks/orders", {"order": 0}, **{"Idempotency-Key": "k0"}),
        await env.post("/hooks/orders", {"order": 0}, Authorization=token, **{"Idempotency-Key": "k0"}),
        await env.post("/hooks/orders", {"order": 0}, token=UI_TOKEN),  # the UI's token is not a hook's
        await env.post("/hooks/nohook", {"order": 0}, token=token),
        await env.post("/hooks/bad.name", {"order": 0}, token=token),
    ]
    assert {status for status, _ in refused} == {401}
    assert len({str(body) for _, body in refused}) == 1, refused  # says nothing of which

    # bounds, with the right token: nothing started either
    assert (await env.post("/hooks/orders", b"order=1", token=token, **{"Content-Type": "text/plain"}))[0] == 415
    assert (await env.post("/hooks/orders", b"{not json", token=token))[0] == 400
    status, body = await env.post("/hooks/orders", [1, 2], token=token)
    assert status == 400 and "JSON object" in body["error"]
    status, body = await env.post("/hooks/orders", b"[" * 100 + b"]" * 100, token=token)
    assert status == 400 and "deeper than 64" in body["error"]
    status, body = await env.post("/hooks/orders", b'{"a": "' + b"x" * MAX_BODY + b'"}', token=token)
    assert status == 413, body
    status, body = await env.post("/hooks/orders/some-execution", {}, token=token)
    assert status == 404 and "POST /hooks/orders" in body["error"]

    # the same Idempotency-Key twice: one execution; without one: an execution per request
    first = await env.post("/hooks/orders", {"order": 7}, token=token, **{"Idempotency-Key": "k1"})
    again = await env.post("/hooks/orders", {"order": 7}, token=token, **{"Idempotency-Key": "k1"})
    other = await env.post("/hooks/orders", {"order": 8}, token=token, Origin="https://elsewhere.example")
    assert first[0] == again[0] == other[0] == 202
    eid = first[1]["execution_id"]
    assert eid == hook_execution_id(spec, "k1") and again[1] == {"execution_id": eid, "existing": True}
    assert first[1]["existing"] is False and other[1]["execution_id"] != eid
    for run, order in ((eid, 7), (other[1]["execution_id"], 8)):
        status_ = await system.client.wait(run, timeout=20)
        assert status_.state == ExecState.COMPLETED
        record = await system.client.start_record(run)
        assert record is not None and record.payload == {"order": order}
    assert await started(system) == {eid, other[1]["execution_id"]}
    assert (await system.nc.jsm().stream_info(START_STREAM)).state.messages == 0  # none queued either

    # the UI's other actions are guarded as before: no UI token, no cancel
    resp = await env.http.post(f"/api/executions/{eid}/cancel", json={})
    assert resp.status == 401
    resp.close()

    # rotate: the old token is refused at once, the new one works; delete: refused
    rotated = await cli("hook", "rotate", "orders", url=system.server.url)
    assert rotated.code == 0, rotated.err
    (new,) = TOKEN.findall(rotated.out)
    assert (await env.post("/hooks/orders", {"order": 9}, token=token))[0] == 401
    status, body = await env.post("/hooks/orders", {"order": 7}, token=new, **{"Idempotency-Key": "k1"})
    assert (status, body) == (202, {"execution_id": eid, "existing": True})  # a key names what it named
    await system.client.hook_delete("orders")
    assert (await env.post("/hooks/orders", {"order": 9}, token=new))[0] == 401


async def test_signal_hook_ends_a_waiting_step(env: Env) -> None:
    system = env.system
    _, token = await system.client.hook_add("go", signal="go", playbook="hooks/waits")
    eid = await system.client.start("hooks/waits", execution_id="waits-1")
    # bound to its playbook: an execution of another is unknown to the hook (404, as for none)
    other = await system.client.start("hooks/echo", payload={"order": 1})
    assert (await system.client.wait(other, timeout=20)).state == ExecState.COMPLETED
    status, body = await env.post(f"/hooks/go/{other}", {"ok": True}, token=token)
    assert (status, body) == (404, {"error": f"no execution {other!r}: nothing to signal"})

    async def waiting() -> bool:
        st = await system.client.status(eid)
        return st is not None and bool(st.waiting)

    await wait_for(waiting, timeout=20)
    assert (await env.post(f"/hooks/go/{eid}", {"ok": True}, token="ahk_wrong"))[0] == 401
    status, body = await env.post("/hooks/go", {"ok": True}, token=token)
    assert status == 404 and "/hooks/go/<execution id>" in body["error"]
    assert (await env.post("/hooks/go/no-such-execution", {}, token=token))[0] == 404
    # the same Idempotency-Key twice is one signal (the second says `duplicate`); `?key=`
    # names the wait's key, and the same Idempotency-Key for another key is another signal
    sent = [
        await env.post(f"/hooks/go/{eid}?key={k}", body, token=token, **{"Idempotency-Key": "s1"})
        for k, body in (("first", {"ok": True}), ("first", {"ok": "again"}), ("second", {"n": 2}))
    ]
    assert [s[0] for s in sent] == [202, 202, 202], sent
    first, again, second = (s[1] for s in sent)
    assert first == {**again, "duplicate": False} and again["duplicate"] is True
    assert first["accepted"] is True and first["execution_id"] == eid
    assert second["duplicate"] is False and second["signal_id"] not in (first["signal_id"], None)
    final = await system.client.wait(eid, timeout=20)
    assert final.state == ExecState.COMPLETED
    assert await system.client.result(eid) == {"confirm": {"n": 2}}  # each body, as its step's result
    assert (await system.client.step_story(eid, "approve")).result == {"ok": True}
    signals = [i.to_dict()["data"] for i in await system.client.events(eid) if i.type == "signal.sent"]
    assert [(s["key"], s["data"], s["by"]) for s in signals] == [
        ("first", {"ok": True}, "hook:go"),
        ("second", {"n": 2}, "hook:go"),
    ]

    # a finished execution takes no signal: 409, nothing written
    status, body = await env.post(f"/hooks/go/{eid}", {"ok": False}, token=token)
    assert status == 409 and body["accepted"] is False and body["state"] == "COMPLETED"
    assert len([i for i in await system.client.events(eid) if i.type == "signal.sent"]) == 2


async def test_cli_user_errors_are_one_line(env: Env) -> None:
    url = env.system.server.url
    await env.system.client.hook_add("taken", playbook="hooks/echo")
    runs = await asyncio.gather(
        cli("hook", "add", "bad.name", "--playbook", "hooks/echo", url=url),
        cli("hook", "add", "nopb", "--playbook", "hooks/nothere", url=url),
        cli("hook", "add", "taken", "--signal", "go", "--playbook", "hooks/waits", url=url),
        cli("hook", "add", "unbound", "--signal", "go", url=url),
        cli("hook", "add", "sig", "--signal", "go", "--playbook", "hooks/waits", "--version", "2", url=url),
        cli("hook", "rotate", "missing", url=url),
        cli("hook", "delete", "missing", url=url),
    )
    lines = [one_line(r.err) for r in runs]
    assert all(r.code == EXIT_INVALID for r in runs), [(r.code, r.err) for r in runs]
    assert "invalid hook name 'bad.name'" in lines[0]
    assert "hooks/nothere" in lines[1]
    assert "hook taken already exists" in lines[2]
    assert "the following arguments are required: --playbook" in lines[3]  # a signal hook names its playbook
    assert "--version goes with a start hook" in lines[4]
    assert lines[5] == lines[6] == "actors-cli: no hook missing"
    # none of the refused adds left a hook behind (the module's other tests add theirs,
    # on this worker or not: xdist may run them elsewhere)
    names = {s.name for s in await env.system.client.hooks()}
    assert "taken" in names and not names & {"bad.name", "nopb", "unbound", "sig"}, names


@pytest.mark.asyncio(loop_scope="function")
async def test_the_cli_user_manages_hooks_and_starts_through_one(secured: Secured, tmp_path: Path) -> None:
    """On the least-privilege account (deploy/nats/permissions.conf): KV `hooks` is
    declared by the engine user, and the cli user (the UI's) adds, lists, rotates,
    checks, calls and deletes hooks with no violation."""
    engine = await nats.connect(secured.url("engine"), inbox_prefix=permissions.inbox_prefix("engine"))
    await streams_layout.ensure(engine.jetstream(), secured.layout)
    await engine.close()
    (tmp_path / "echo.yaml").write_text(ECHO)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        await client.register(tmp_path / "echo.yaml")
        spec, token = await client.hook_add("orders", playbook="hooks/echo")
        await client.hook_add("go", signal="go", playbook="hooks/echo")
        assert [h.name for h in await client.hooks()] == ["go", "orders"]
        assert await client.hook_authorized("orders", token) == spec
        _, new = await client.hook_rotate("orders")
        assert await client.hook_authorized("orders", token) is None
        checked = await client.hook_authorized("orders", new)
        assert checked is not None
        outcome = await client.hook_start(checked, {"order": 1}, idempotency_key="k")
        assert outcome.execution_id == hook_execution_id(spec, "k")  # queued: no engine pod runs here
        await client.hook_delete("orders")
        assert await client.hook_authorized("orders", new) is None
    assert secured.violations() == []
