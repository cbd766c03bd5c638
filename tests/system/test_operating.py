"""Operating it day to day (issue 13, items 1, 2, 7): `list` executions newest first,
`result` of a finished one, the steps `status` shows running, and the `playbooks`
catalog, through the client and through the CLI against a real nats-server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from actors.client import ExecutionFailed, ExecutionNotFinished, ExecutionNotFound
from actors.status.projector import Projector
from actors.wire.events import ExecState, PlaybookFailedData, make_event
from actors.wire.messages import ExecutionStatus, IndexEntry, encode
from streams import ids
from streams.layout import ENDED_STREAM
from streams.subjects import index_end_subject, index_ends, index_subject
from tests.conftest import System
from tests.support.cli import cli

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

OK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: ok, path: ops/ok}
workflow:
  - step: add
    tool: {kind: python, code: "def main(a, b): return {'sum': a + b}"}
    args: {a: "{{ workload.a }}", b: 2}
"""
FAILS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: fails, path: ops/fails}
workflow:
  - step: boom
    tool: {kind: python, code: "def main(): raise ValueError('no good')"}
"""
SLOW = """apiVersion: actors/v1
kind: Playbook
metadata: {name: slow, path: ops/slow}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""


def env_of(system: System) -> dict[str, str]:
    return {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}


async def run_to_end(system: System, yaml_text: str, eid: str, payload: dict[str, int] | None = None) -> None:
    await system.start_yaml(yaml_text, payload=payload, execution_id=eid)
    await system.client.wait(eid, timeout=30)


async def test_list_newest_first_filtered_by_state_playbook_since_and_limit(system: System) -> None:
    await run_to_end(system, OK, "ls-1", {"a": 1})
    await run_to_end(system, FAILS, "ls-2")
    await run_to_end(system, OK, "ls-3", {"a": 3})
    c = system.client

    every = await c.list()
    assert [s.execution_id for s in every] == ["ls-3", "ls-2", "ls-1"]
    assert [s.state for s in every] == [ExecState.COMPLETED, ExecState.FAILED, ExecState.COMPLETED]
    assert every[0].playbook == "ops/ok" and every[0].version == 1
    assert every[0].started_at is not None and every[0].ended_at is not None
    assert [s.execution_id for s in await c.list(state="FAILED")] == ["ls-2"]
    assert [s.execution_id for s in await c.list(playbook="ops/ok")] == ["ls-3", "ls-1"]
    assert [s.execution_id for s in await c.list(limit=2)] == ["ls-3", "ls-2"]
    assert await c.list(since=time.time() + 3600) == []

    code, out, err, _ = await cli("list", "--json", env=env_of(system))
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["execution_id"] for r in rows] == ["ls-3", "ls-2", "ls-1"]
    listed = {"execution_id", "state", "playbook", "version", "started_at", "ended_at", "duration", "error", "waiting"}
    assert set(rows[0]) == listed
    assert rows[1]["state"] == "FAILED" and rows[1]["playbook"] == "ops/fails"

    code, out, err, _ = await cli(
        "list", "--state", "completed", "--playbook", "ops/ok", "--since", "1h", "--limit", "1", env=env_of(system)
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["execution", "state", "playbook"]
    assert len(lines) == 2 and lines[1].split()[:4] == ["ls-3", "COMPLETED", "ops/ok", "1"]

    code, out, _, _ = await cli("list", "--since", "2999-01-01T00:00", env=env_of(system))
    assert code == 0 and len(out.splitlines()) == 1  # the header alone


async def test_list_refuses_bad_filters_in_one_line(system: System) -> None:
    for args, what in (
        (("--since", "yesterday"), "--since 'yesterday'"),
        (("--state", "DONE"), "--state 'DONE': not one of PENDING, RUNNING, COMPLETED, FAILED, CANCELLED"),
        (("--limit", "0"), "--limit 0"),
    ):
        code, out, err, _ = await cli("list", *args, env=env_of(system))
        assert code == 3 and out == ""
        assert len(err.strip().splitlines()) == 1 and what in err, err


async def test_list_reads_back_past_the_first_window_for_a_rare_state(system: System) -> None:
    """300 executions, the only FAILED one the oldest, the only RUNNING one the next: each
    filter reads windows further back until it finds them (index entries and statuses
    written directly, as the projector writes them, as the bench does)."""
    kv = await system.nc.jetstream().key_value("status")
    js, t0 = system.nc.jetstream(), time.time() - 1000
    for i in range(300):
        eid, at = f"many-{i}", t0 + i
        state = {0: ExecState.FAILED, 1: ExecState.RUNNING}.get(i, ExecState.COMPLETED)
        ended = None if state == ExecState.RUNNING else at + 1
        st = ExecutionStatus(
            execution_id=eid, state=state, playbook="ops/many", version=1, started_at=at, ended_at=ended
        )
        entry = IndexEntry(execution_id=eid, playbook="ops/many", version=1, started_at=at)
        await js.publish(index_subject(eid), encode(entry), headers={"Nats-Msg-Id": ids.index_entry_id(eid)})
        await kv.put(eid, encode(st))
        if ended is not None:
            await js.publish(index_end_subject(state, eid), encode(st), headers={"Nats-Msg-Id": ids.index_end_id(eid)})
    assert [s.execution_id for s in await system.client.list(state="FAILED")] == ["many-0"]
    assert [s.execution_id for s in await system.client.list(state="RUNNING")] == ["many-1"]
    completed = await system.client.list(state="COMPLETED", playbook="ops/many", limit=3)
    assert [s.execution_id for s in completed] == ["many-299", "many-298", "many-297"]
    newest = await system.client.list(playbook="ops/many", limit=5)
    assert [s.execution_id for s in newest] == [f"many-{i}" for i in (299, 298, 297, 296, 295)]
    assert len(await system.client.list(limit=1000)) == 300
    assert len(await system.client.list(state="COMPLETED", limit=1000)) == 298
    assert await system.client.list(state="FAILED", since=t0 + 10) == []


async def test_result_of_completed_failed_running_cancelled_and_unknown(system: System) -> None:
    c, env = system.client, env_of(system)
    await run_to_end(system, OK, "res-ok", {"a": 40})
    assert await c.result("res-ok") == {"add": {"sum": 42}}
    code, out, err, _ = await cli("result", "res-ok", env=env)
    assert code == 0 and json.loads(out) == {"add": {"sum": 42}}, err
    code, out, _, _ = await cli("result", "res-ok", "--json", env=env)
    assert json.loads(out) == {
        "execution_id": "res-ok",
        "state": "COMPLETED",
        "result": {"add": {"sum": 42}},
        "error": None,
        "reason": None,
    }

    await run_to_end(system, FAILS, "res-bad")
    with pytest.raises(ExecutionFailed) as failed:
        await c.result("res-bad")
    assert failed.value.error is not None
    assert (failed.value.error["type"], failed.value.error["message"], failed.value.error["step"]) == (
        "ValueError",
        "no good",
        "boom",
    )
    code, out, _, _ = await cli("result", "res-bad", env=env)
    assert code == 1 and out.startswith("error: ValueError: no good (step 'boom'")
    code, out, _, _ = await cli("result", "res-bad", "--json", env=env)
    obj = json.loads(out)
    assert code == 1 and obj["state"] == "FAILED" and obj["error"]["type"] == "ValueError"

    code, _, err, _ = await cli("result", "never-started", env=env)
    assert code == 3 and "no execution 'never-started'" in err
    with pytest.raises(ExecutionNotFound):
        await c.result("never-started")


async def test_status_shows_running_steps_then_the_root_cause(system: System, tmp_path: Path) -> None:
    c, env = system.client, env_of(system)
    await system.start_yaml(SLOW, execution_id="st-slow")
    await _until_running(system, "st-slow", "nap")
    code, out, err, _ = await cli("status", "st-slow", env=env)
    assert code == 0, err
    assert "running         nap" in out
    code, out, _, _ = await cli("status", "st-slow", "--json", env=env)
    obj = json.loads(out)
    assert obj["state"] == "RUNNING" and obj["running_steps"] == ["nap"] and obj["version"] == 1
    code, _, err, _ = await cli("result", "st-slow", env=env)
    assert code == 4 and err.strip() == "actors-cli: execution st-slow is RUNNING: no result yet"
    with pytest.raises(ExecutionNotFinished):
        await c.result("st-slow")

    await c.cancel("st-slow", "enough")
    await c.wait("st-slow", timeout=30)
    code, out, _, _ = await cli("result", "st-slow", env=env)
    assert code == 2 and out.strip() == "CANCELLED: enough"

    await run_to_end(system, FAILS, "st-bad")
    code, out, _, _ = await cli("status", "st-bad", env=env)
    assert code == 1 and "running" not in out
    assert "error           ValueError: no good (step 'boom'" in out


async def _until_running(system: System, eid: str, step: str) -> None:
    """Until the step is entered: the execution's log, followed live."""
    async for item in system.client.follow(eid):
        if item.type == "step.enter" and item.step == step:
            return


async def test_playbooks_lists_every_path_with_its_versions(system: System, tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(OK)
    second.write_text(OK.replace("b: 2", "b: 3"))
    before = time.time()
    await system.client.register(first)
    await system.client.register(second)
    (tmp_path / "c.yaml").write_text(FAILS)
    await system.client.register(tmp_path / "c.yaml")

    entries = await system.client.playbooks()
    assert [(e.path, e.version) for e in entries] == [("ops/fails", 1), ("ops/ok", 1), ("ops/ok", 2)]
    assert all(before <= e.registered_at <= time.time() for e in entries)

    code, out, err, _ = await cli("playbooks", "--json", env=env_of(system))
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["path"], r["latest"]) for r in rows] == [("ops/fails", 1), ("ops/ok", 2)]
    assert [v["version"] for v in rows[1]["versions"]] == [1, 2]
    assert rows[1]["versions"][0]["registered_at"] == entries[1].registered_at

    code, out, _, _ = await cli("playbooks", env=env_of(system))
    lines = out.splitlines()
    assert code == 0 and [ln.split()[:2] for ln in lines[1:]] == [["ops/fails", "1"], ["ops/ok", "1"], ["ops/ok", "2"]]


async def test_a_terminal_event_delivered_again_restores_a_lost_final_index_entry(system: System) -> None:
    """A projector that crashed between the terminal status and its index entry: the
    status is FAILED, the entry was never written. The event comes again; the status no
    longer changes, but the entry is written (once)."""
    js, kv = system.nc.jetstream(), await system.nc.jetstream().key_value("status")
    error = {"type": "ValueError", "message": "no good", "step": "boom", "failed_steps": ["boom"]}
    st = ExecutionStatus(
        execution_id="lost-end",
        state=ExecState.FAILED,
        playbook="ops/fails",
        started_at=1.0,
        ended_at=2.0,
        terminal_event="playbook.failed",
        error=error,
    )
    entry = IndexEntry(execution_id="lost-end", playbook="ops/fails", started_at=1.0)
    await js.publish(index_subject("lost-end"), encode(entry), headers={"Nats-Msg-Id": ids.index_entry_id("lost-end")})
    await kv.put("lost-end", encode(st))
    assert await system.client.list(state="FAILED") == []

    projector = Projector(system.nc)
    projector._kv = kv  # driven directly: no subscription
    data = PlaybookFailedData(playbook="ops/fails", started_at=1.0, ended_at=2.0, error=error)
    ev = make_event(data, execution_id="lost-end", at=2.0, cause=1)
    await projector.apply(ev)
    await projector.apply(ev)
    again = await system.client.list(state="FAILED")
    assert [(s.execution_id, s.error) for s in again] == [("lost-end", error)]
    info = await system.nc.jsm().stream_info(ENDED_STREAM, subjects_filter=index_ends("FAILED"))
    assert info.state.subjects == {index_end_subject("FAILED", "lost-end"): 1}
