"""The JSON API of the UI's schedules and dead-letters pages, a playbook's graph and
workload, and a cancel's reason (actors/ui/schedules.py, deadletters.py,
playbookview.py, server.py), against a real nats-server and every actor: what the pages
show, and bad input answered with a JSON error and a status, never a 500."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from actors.client.writing import CancelReasonTooLong, cancel_reason
from actors.ui.deadletters import HEAD
from actors.ui.server import LOG_TEXT_MAX, LOGS_SHOWN, make_app
from actors.wire.codec import CLEAR
from actors.wire.events import StepOutput, StepOutputPart
from streams.layout import START_SUBJECT
from tests.conftest import System, wait_for
from tests.support.ui import HEAD as PB_HEAD
from tests.support.ui import SLOW, ok, post, register

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

GREET = (
    PB_HEAD % ("greet", "ui/greet")
    + """workload: {who: world, times: 2}
workflow:
  - step: hello
    tool: noop
    args: {who: "{{ workload.who }}"}
    next: bye
  - step: bye
    tool: noop
"""
)


@pytest_asyncio.fixture
async def ui(system: System) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as client:
        yield client


async def _error(resp: Any, status: int) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert set(body) == {"error"} and "Traceback" not in body["error"]
    return str(body["error"])


async def _row(ui: TestClient[Any, Any], name: str) -> dict[str, Any]:
    rows = (await ok(await ui.get("/api/schedules")))["schedules"]
    return next(r for r in rows if r["name"] == name)


async def test_schedules_their_last_fire_and_run_now(system: System, ui: TestClient[Any, Any]) -> None:
    greet = await register(system, GREET)
    assert (await ok(await ui.get("/api/schedules"))) == {"schedules": []}
    # a cron that will not fire during the test, and one firing every second
    await system.client.schedule_add("yearly", playbook=greet, cron="0 0 1 1 *", payload={"who": "ops"})
    await system.client.schedule_add("often", playbook=greet, cron="* * * * * *")

    # the last fire of a running cron names the execution the starter started for it
    fired = await wait_for(lambda: _fired(ui, "often"), timeout=20)
    assert fired["last_run_now"] is False and fired["next_fire"] is not None
    assert (await system.client.wait(fired["last_execution_id"], timeout=20)).state == "COMPLETED"
    assert (await ok(await post(ui, "/api/schedules/often/delete")))["changed"] is True

    row = await _row(ui, "yearly")
    assert row["playbook"] == greet and row["cron"] == "0 0 0 1 1 *" and row["timezone"] == "UTC"
    assert row["paused"] is False and row["payload"] == {"who": "ops"}
    assert row["last_fire"] is None and row["last_execution_id"] is None and row["last_state"] is None
    assert row["next_fire"].endswith("-01-01T00:00:00+00:00")  # before any fire: from the cron itself

    # run now: an execution of its playbook with its payload; the same click twice is one
    first = await ok(await post(ui, "/api/schedules/yearly/run", {"request": "click-1"}))
    again = await ok(await post(ui, "/api/schedules/yearly/run", {"request": "click-1"}))
    assert first == again and first["execution_id"].startswith("yearly-")
    eid = first["execution_id"]
    assert (await system.client.wait(eid, timeout=20)).state == "COMPLETED"
    record = await system.client.start_record(eid)
    assert record is not None and record.playbook_path == greet and record.payload == {"who": "ops"}
    row = await _row(ui, "yearly")
    assert row["last_execution_id"] == eid and row["last_run_now"] is True and row["last_state"] == "COMPLETED"
    # a sparse cron the server has not fired yet: its next tick computed from the cron
    assert row["last_fire"] is not None and row["next_fire"].endswith("-01-01T00:00:00+00:00")
    # two requests in one second are two executions (a fire's time is to the second: the
    # request names the execution too), each the one the starter started
    two = await asyncio.gather(*(system.client.schedule_run_now("yearly", request_id=f"click-{n}") for n in (2, 3)))
    assert len({eid, *two}) == 3 and all(x.startswith("yearly-") for x in two), two
    for x in two:
        assert (await system.client.wait(x, timeout=20)).state == "COMPLETED"

    # pause and resume say whether they changed anything
    assert (await ok(await post(ui, "/api/schedules/yearly/pause"))) == {"name": "yearly", "changed": True}
    assert (await ok(await post(ui, "/api/schedules/yearly/pause")))["changed"] is False
    assert (await _row(ui, "yearly"))["paused"] is True
    assert (await ok(await post(ui, "/api/schedules/yearly/resume")))["changed"] is True
    assert (await _row(ui, "yearly"))["paused"] is False

    # bad input: a JSON error and a status, nothing changed
    assert "request must be" in await _error(await post(ui, "/api/schedules/yearly/run"), 400)
    assert "request must be" in await _error(await post(ui, "/api/schedules/yearly/run", {"request": "a b"}), 400)
    assert "request must be" in await _error(await post(ui, "/api/schedules/yearly/run", {"request": 7}), 400)
    assert "invalid schedule name" in await _error(await post(ui, "/api/schedules/a.b/pause"), 400)
    assert "no schedule nope" in await _error(await post(ui, "/api/schedules/nope/run", {"request": "x"}), 404)
    assert "no schedule nope" in await _error(await post(ui, "/api/schedules/nope/pause"), 404)
    bad = await ui.post("/api/schedules/yearly/pause", data=b"[1]", headers={"Content-Type": "application/json"})
    assert "JSON object" in await _error(bad, 400)
    bad = await ui.post("/api/schedules/yearly/pause", data=b"{", headers={"Content-Type": "application/json"})
    assert "not JSON" in await _error(bad, 400)
    assert "JSON" in await _error(await ui.post("/api/schedules/yearly/pause", data=b"{}"), 400)  # not JSON-typed
    assert (await _row(ui, "yearly"))["paused"] is False

    assert (await ok(await post(ui, "/api/schedules/yearly/delete")))["changed"] is True
    assert await _error(await post(ui, "/api/schedules/yearly/delete"), 404) == "no schedule yearly"
    assert (await ok(await ui.get("/api/schedules"))) == {"schedules": []}


async def _fired(ui: TestClient[Any, Any], name: str) -> dict[str, Any] | None:
    row = await _row(ui, name)
    return row if row["last_execution_id"] else None


async def test_dead_letters_newest_first_paged_and_bounded(system: System, ui: TestClient[Any, Any]) -> None:
    assert (await ok(await ui.get("/api/deadletters"))) == {"letters": [], "next": None}
    big = b"{" + b"<b>x</b>" * 200  # not JSON, and longer than the head the page gets
    for i in range(3):
        await system.js_publish(START_SUBJECT, b"{garbage %d" % i, msg_id=f"dl-{i}")
    await system.js_publish(START_SUBJECT, big, msg_id="dl-big")
    letters: list[Any] = []

    async def four() -> bool:
        letters[:] = (await ok(await ui.get("/api/deadletters")))["letters"]
        return len(letters) == 4

    await wait_for(four, timeout=20)
    newest = letters[0]
    assert newest["source"] == "start" and "not JSON" in newest["reason"] and newest["subject"] == START_SUBJECT
    assert newest["head"] == big.decode()[:HEAD] and newest["size"] == len(big) and newest["execution_id"] is None
    assert [lt["head"] for lt in letters[1:]] == ["{garbage 2", "{garbage 1", "{garbage 0"]
    assert [lt["seq"] for lt in letters] == sorted((lt["seq"] for lt in letters), reverse=True)
    assert letters[0]["at"] >= letters[-1]["at"] > 0

    # pages follow each other: none twice, none missed, the last says there is no more
    seen, cursor = [], None
    while True:
        page = await ok(await ui.get("/api/deadletters", params={"limit": 3, **({"before": cursor} if cursor else {})}))
        seen += [lt["seq"] for lt in page["letters"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [lt["seq"] for lt in letters]

    for query in ("limit=0", "limit=501", "limit=x", "before=0", "before=-3", "before=1e3"):
        assert "must be" in await _error(await ui.get(f"/api/deadletters?{query}"), 400), query


async def test_a_playbook_page_has_its_graph_and_workload_and_a_cancel_its_reason(
    system: System, ui: TestClient[Any, Any]
) -> None:
    greet = await register(system, GREET)
    pb = await ok(await ui.get(f"/api/playbooks/{greet}"))
    assert pb["workload"] == {"who": "world", "times": 2}
    assert [n["id"] for n in pb["graph"]["nodes"]][:2] == ["hello", "bye"]
    assert {n["state"] for n in pb["graph"]["nodes"]} == {"pending"}
    assert any(e["from"] == "hello" and e["to"] == "bye" for e in pb["graph"]["edges"])

    slow = await register(system, SLOW)
    eid = await system.client.start(slow, execution_id="to-cancel")
    for body, said in (({"reason": 7}, "reason must be a string"), ({"reason": "x" * 1001}, "at most 1000")):
        assert said in await _error(await post(ui, f"/api/executions/{eid}/cancel", body), 400)
    await ok(await post(ui, f"/api/executions/{eid}/cancel", {"reason": "  wrong payload, rerun tomorrow "}))
    status = await system.client.wait(eid, timeout=20)
    # the reason is in the status: `actors-cli status`, the lists and the page show it (and
    # the refused cancels above sent nothing: the first cancel's reason would be the one)
    assert status.state == "CANCELLED"
    assert status.error == {"type": "Cancelled", "message": "wrong payload, rerun tomorrow"}
    row = (await ok(await ui.get("/api/executions?state=CANCELLED")))["executions"][0]
    assert row["execution_id"] == eid and row["error"]["message"] == "wrong payload, rerun tomorrow"
    detail = await ok(await ui.get(f"/api/executions/{eid}"))
    assert detail["error"]["root_cause"]["type"] == "Cancelled"


async def test_step_logs_are_bounded_and_a_poll_while_it_runs_reads_no_object(
    system: System, ui: TestClient[Any, Any]
) -> None:
    eid = "logs-1"
    prefix = system.layout.execution(eid).prefix
    common: dict[str, Any] = {"execution_id": eid, "step": "s"}

    async def put(o: StepOutput | StepOutputPart, command: str) -> None:
        await system.js_publish(f"{prefix}.out.{command}", CLEAR.encode(o), msg_id=f"{eid}-{command}")

    # one output whose whole text is an object (gone here: reading it says so), one step
    # still running with 100,000 bytes so far, and 201 small ones
    big = StepOutput(**common, command_id="big", size=10_000, stored=10_000, head="first", tail="last")
    await put(msgspec.structs.replace(big, output_ref="out.logs-1.big.gone", at=1.0), "big")
    await put(StepOutputPart(**common, command_id="run", text="r" * 100_000, at=2.0), "run")
    for n in range(201):
        await put(StepOutput(**common, command_id=f"c{n}", size=2, head=f"{n}\n", at=10.0 + n), f"c{n}")

    whole = await ok(await ui.get(f"/api/executions/{eid}/logs"))
    polled = await ok(await ui.get(f"/api/executions/{eid}/logs?live=1"))
    for got in (whole, polled):
        assert got["total"] == 203 and len(got["logs"]) == LOGS_SHOWN
        running = got["logs"][1]
        assert running["running"] is True and running["text"].startswith("r" * 1000)
        assert LOG_TEXT_MAX - 200 < len(running["text"]) < LOG_TEXT_MAX + 200  # its start and its end, cut
        assert got["logs"][2]["text"] == "0\n"
    # the page's poll shows what the record holds; the whole read looked for the object
    assert (
        polled["logs"][0]["text"].startswith("first\n... 10,000 bytes in all")
        and "gone" not in polled["logs"][0]["text"]
    )
    assert "gone from the store" in whole["logs"][0]["text"]

    # an id that names nothing is not found (no start of it is queued)
    resp = await ui.get("/api/executions/nosuch-1")
    assert resp.status == 404 and (await resp.json())["queued"] is False
    assert await system.client.start_queued("nosuch-1") is False

    # a cancel's reason: one line, no control characters, at most 1,000 characters
    assert cancel_reason("\x1b[31m  disk\nfull\t\u200b ") == "[31m disk full"
    with pytest.raises(CancelReasonTooLong, match="at most 1,000 characters"):
        await system.client.cancel(eid, "x" * 1001)
