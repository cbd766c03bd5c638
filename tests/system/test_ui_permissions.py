"""The web UI on the `cli` NATS user of deploy/nats/permissions.conf (least privilege,
actors/pod/permissions.py), every role on its own user: its list, live feeds, detail and
actions need nothing more than `actors-cli` may do, and the server refuses nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from actors.client import Client
from actors.ui.server import make_app
from tests.support.secured import Pods, Secured
from tests.support.ui import LOOP, Events, ok

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


async def test_the_ui_works_as_the_cli_user(secured: Secured, pods: Pods, tmp_path: Path) -> None:
    for role in ("engine", "counter", "tools", "projector"):  # the engine first: it declares the streams
        await pods.start(secured, role)
    (tmp_path / "loop.yaml").write_text(LOOP)
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        await client.register(tmp_path / "loop.yaml")
        app = make_app(client, read_only=False, token=None)
        async with TestClient(TestServer(app)) as ui:
            listed = Events(await ui.get("/api/executions/stream"))
            eid = (await ok(await ui.post("/api/playbooks/ui/loop/start", json={"payload": {"n": 50}})))["execution_id"]
            followed = Events(await ui.get(f"/api/executions/{eid}/stream"))
            done: Any = await followed.until("update", lambda d: d["status"]["state"] == "COMPLETED", timeout=60)
            assert {n["id"]: n["state"] for n in done["graph"]["nodes"]}["each"] == "completed"
            row = await listed.until(
                "status", lambda r: r["execution_id"] == eid and r["state"] == "COMPLETED", timeout=30
            )
            assert row["playbook"] == "ui/loop"
            assert [r["execution_id"] for r in (await ok(await ui.get("/api/executions")))["executions"]] == [eid]
            assert (await ok(await ui.get(f"/api/executions/{eid}/events")))["events"]
            assert (await ok(await ui.get(f"/api/executions/{eid}/logs")))["logs"] == []
    assert secured.violations() == []
