"""Bad input gets a clear error naming file, step and field; no actor dies; nothing is
dropped silently."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from actors.cli import main as cli
from actors.store.catalog import CatalogReader
from streams.layout import START_SUBJECT
from tests.conftest import System, of_type, wait_for

pytestmark = [pytest.mark.timeout(60)]

OK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: ok}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 'fine'"}
"""


def test_validate_reports_invalid_yaml_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("apiVersion: actors/v1\nkind: Playbook\nworkflow:\n  - step: a\n    args: {x: [1, 2}\n")
    assert cli(["validate", str(f)]) == 3
    err = capsys.readouterr().err
    assert "broken.yaml:5" in err


def test_validate_names_unknown_key_step_and_missing_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: bad}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    nxt: b
  - step: b
    next: nowhere
""")
    assert cli(["validate", str(f)]) == 3
    err = capsys.readouterr().err
    assert "bad.yaml:7" in err and "'a'" in err and "nxt" in err
    assert "bad.yaml:9" in err and "'b'" in err and "nowhere" in err


def test_validate_accepts_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "hello.yaml"
    assert cli(["validate", str(example)]) == 0


@pytest.mark.asyncio
async def test_undefined_name_at_run_time_fails_the_step_and_the_actor_lives_on(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: undefined_at_runtime}
workflow:
  - step: a
    tool: {kind: python, code: "def main(x): return x"}
    args: {x: "{{ workload.missing_key }}"}
""")
    assert status.state == "FAILED"
    failed = of_type(await system.events(eid), "step.exit", "a")[0].data
    assert failed["error"]["type"] == "TemplateError"
    msg = failed["error"]["message"]
    assert "step 'a'" in msg and "args.x" in msg and "missing_key" in msg
    _, again = await system.run_yaml(OK)
    assert again.state == "COMPLETED"


@pytest.mark.asyncio
async def test_malformed_start_messages_are_dead_lettered_and_the_next_start_works(system: System) -> None:
    js = system.nc.jetstream()
    await js.publish(START_SUBJECT, b"{not json")
    await js.publish(START_SUBJECT, b'{"playbook": 3}')
    await js.publish(START_SUBJECT, b'{"playbook": "ok", "execution_id": "bad id with spaces"}')

    async def three_letters() -> list:
        letters = await system.client.dead_letters("start")
        return letters if len(letters) >= 3 else []

    letters = await wait_for(three_letters)
    reasons = [d.data["reason"] for d in letters]
    assert "not JSON" in reasons[0]
    assert "playbook" in reasons[1] and "int" in reasons[1]
    assert "execution_id" in reasons[2]
    assert letters[0].data["data"] == "{not json"
    _, status = await system.run_yaml(OK)
    assert status.state == "COMPLETED"


@pytest.mark.asyncio
async def test_start_of_an_unknown_playbook_fails_that_execution_visibly(system: System) -> None:
    eid = await system.client.start("no/such/playbook", execution_id="unknown-pb-1")
    status = await system.client.wait(eid, timeout=10)
    assert status.state == "FAILED"
    failed = of_type(await system.events(eid), "playbook.failed")[0].data
    assert failed["error"]["type"] == "PlaybookNotFound"
    assert "no/such/playbook" in failed["error"]["message"]


@pytest.mark.asyncio
async def test_the_same_execution_id_twice_starts_one_execution(system: System) -> None:
    path = system.tmp / "ok.yaml"
    path.write_text(OK)
    await system.client.register(path)
    await system.client.start("ok", execution_id="once")
    await system.client.start("ok", execution_id="once")
    status = await system.client.wait("once", timeout=10)
    assert status.state == "COMPLETED"
    await system.engine_idle()
    items = await system.events("once")
    assert len(of_type(items, "execution.start")) == 1
    assert len(of_type(items, "playbook.initialized")) == 1


@pytest.mark.asyncio
@pytest.mark.layout(duplicate_window=0.1)
async def test_overlapping_starts_of_one_execution_id_start_it_once_past_the_duplicate_window(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The starter handles many start messages at once. Two of one id must not both
    find it unstarted: the first is slow (its catalog read takes longer than the
    server's duplicate window), so the server could not drop the second record."""
    path = system.tmp / "ok.yaml"
    path.write_text(OK)
    await system.client.register(path)
    real_resolve, slowed = CatalogReader.resolve, []

    async def slow_first(self: CatalogReader, playbook: str, version: int | None = None) -> Any:
        if not slowed:
            slowed.append(playbook)
            await asyncio.sleep(0.5)  # the fault: nothing to await instead
        return await real_resolve(self, playbook, version)

    monkeypatch.setattr(CatalogReader, "resolve", slow_first)
    js = system.nc.jetstream()
    for _ in range(3):  # published as a user might: no Nats-Msg-Id, so START keeps all three
        await js.publish(START_SUBJECT, b'{"playbook": "ok", "execution_id": "overlap"}')
    others = [await system.client.start("ok") for _ in range(5)]  # not held up meanwhile
    statuses = await asyncio.gather(*(system.client.wait(e, timeout=20) for e in ["overlap", *others]))
    assert slowed and [s.state for s in statuses] == ["COMPLETED"] * 6
    await system.engine_idle()  # the slow start too
    items = await system.events("overlap")
    assert len(of_type(items, "execution.start")) == 1  # the start record, in the log once
    assert len(of_type(items, "playbook.initialized")) == 1


@pytest.mark.asyncio
async def test_garbage_on_an_execution_input_subject_is_dead_lettered_and_it_goes_on(system: System) -> None:
    path = system.tmp / "slow.yaml"
    path.write_text("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: slowish}
workflow:
  - step: wait
    tool: {kind: sleep, seconds: 0.5}
""")
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path)
    async for item in system.client.follow(eid):
        if item.type == "command.issued":
            break
    await system.nc.jetstream().publish(system.layout.exec_subject(eid, "in", "result.0-1"), b"\x00garbage")
    status = await system.client.wait(eid, timeout=10)
    assert status.state == "COMPLETED"
    letters = [i for i in await system.events(eid) if i.cls == "dlq"]
    assert len(letters) == 1 and "undecodable input" in letters[0].data["reason"]


@pytest.mark.asyncio
async def test_a_result_that_is_not_json_fails_the_step_with_a_clear_error(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: not_json}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return object()"}
""")
    assert status.state == "FAILED"
    err = of_type(await system.events(eid), "step.exit", "a")[0].data["error"]
    assert err["type"] in ("ResultNotSerialisable", "TypeError")
