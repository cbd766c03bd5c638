"""Issue 26 (contain user computation), items 6 to 8: a blob changed after it was written
is refused, naming its key; the cli NATS user writes only start payloads, never a
result; catalog paths map one to one to keys; one malformed record (KV status, stream
INDEX or ENDED, the catalog) never breaks everybody's commands."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from actors.client import Client
from actors.store.blobs import BlobCorrupt, blob_key, payload_blob, put_blob, sealed
from actors.store.catalog import CatalogError, CatalogPathInvalid, CatalogRecordInvalid
from actors.store.records import RecordInvalid
from actors.ui.server import make_app
from actors.wire.messages import CallDone, ExecutionStatus, IndexEntry, StartMessage, StartReply, encode
from streams.layout import BLOB_BUCKET, CATALOG_BUCKET, IN, PAYLOAD_BUCKET, START_SUBJECT, STATUS_BUCKET
from streams.subjects import START_REQUEST_SUBJECT, index_end_subject, index_subject
from tests.conftest import System, of_type, wait_for
from tests.support.cli import cli
from tests.support.secured import Pods, Secured, refused

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]
EXIT_OK, EXIT_INVALID = 0, 3


def playbook(name: str, body: str, path: str | None = None) -> str:
    where = f", path: {json.dumps(path)}" if path is not None else ""
    return f"apiVersion: actors/v1\nkind: Playbook\nmetadata: {{name: {name}{where}}}\nworkflow:\n{body}"


NOOP = "  - step: one\n    tool: noop\n"
BIG_RESULT = "  - step: big\n    tool: {kind: python, code: \"def main(): return 'APPROVED' * 40000\"}\n"
NAP = "  - step: wait\n    tool: {kind: sleep, seconds: 60}\n"
GREET = (
    '  - step: hi\n    tool: {kind: python, code: "def main(who): return who"}\n    args: {who: "{{ workload.who }}"}\n'
)


def one_line(err: str) -> str:
    """The stderr of a refused command: one line, no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def warned(err: str, *names: str) -> None:
    """A command that skipped a bad record: no traceback, a warning naming it."""
    assert "Traceback" not in err, err
    assert "WARNING" in err and all(n in err for n in names), err


@pytest_asyncio.fixture
async def ui(system: System) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as client:
        yield client


def write(system: System, text: str) -> Path:
    path = system.tmp / f"pb{abs(hash(text))}.yaml"
    path.write_text(text)
    return path


async def register(system: System, text: str) -> Path:
    path = write(system, text)
    await system.client.register(path)
    return path


async def overwrite(system: System, key: str, value: Any, *, bucket: str = BLOB_BUCKET) -> None:
    """What the cli user could do before: store other bytes under a key the log names."""
    store = await system.nc.jetstream().object_store(bucket)
    await store.put(key, encode(value))


async def first_command(system: System, eid: str) -> str:
    async for item in system.client.follow(eid, until_terminal=False):
        if item.type == "command.issued":
            return str(item.data["command_id"])
    raise AssertionError("no command issued")


# --- item 6: blobs are what their keys name --------------------------------------------


async def test_a_changed_result_blob_is_refused_by_the_client_and_the_cli(system: System) -> None:
    eid, status = await system.run_yaml(playbook("verdict", BIG_RESULT))
    assert status.state == "COMPLETED"
    ref = of_type(await system.events(eid), "playbook.completed")[0].data["result_ref"]
    assert "APPROVED" in json.dumps(await system.client.result(eid))
    await overwrite(system, ref, "REJECTED")

    with pytest.raises(BlobCorrupt) as caught:
        await system.client.result(eid)
    assert ref in str(caught.value) and "digest" in str(caught.value)
    code, out, err, _ = await cli("result", eid, url=system.server.url)
    assert code == EXIT_INVALID and "REJECTED" not in out
    assert ref in one_line(err)


async def test_a_step_result_blob_changed_before_the_engine_reads_it_fails_the_execution(system: System) -> None:
    eid = await system.start_yaml(playbook("napper", NAP))
    cid = await first_command(system, eid)
    js = system.nc.jetstream()
    data = sealed(js, encode("APPROVED"))
    key = blob_key(eid, "result", cid, data=data)
    await put_blob(js, key, data)
    await overwrite(system, key, "REJECTED")
    # a tool's answer naming that blob, ahead of the sleeping tool's own
    answer = CallDone(execution_id=eid, command_id=cid, step="wait", attempt_number=1, result_ref=key)
    await system.js_publish(system.layout.exec_subject(eid, IN, f"result.{cid}"), encode(answer), msg_id=f"f-{cid}")

    status = await system.client.wait(eid, timeout=30)
    assert status.state == "FAILED" and status.error is not None
    assert status.error["type"] == "ValueCorrupt" and key in status.error["message"]
    (exit_,) = of_type(await system.events(eid), "step.exit", "wait")
    assert exit_.data["error"]["type"] == "ValueCorrupt"


async def test_a_changed_start_payload_blob_fails_the_execution_naming_the_key(system: System) -> None:
    await register(system, playbook("greet", GREET))
    js = system.nc.jetstream()
    eid = "tampered-payload-1"
    key = await payload_blob(js, {"who": "alice"}, eid, cap=system.layout.max_value_bytes)
    await overwrite(system, key, {"who": "mallory"}, bucket=PAYLOAD_BUCKET)
    start = StartMessage(playbook="greet", payload={}, payload_ref=key, execution_id=eid)
    await system.js_publish(START_SUBJECT, encode(start), msg_id=eid)

    status = await system.client.wait(eid, timeout=30)
    assert status.state == "FAILED" and status.error is not None
    assert status.error["type"] == "ValueCorrupt" and key in status.error["message"]
    assert not of_type(await system.events(eid), "step.enter")  # no step ran on the changed payload


@pytest.mark.timeout(300)
async def test_the_cli_user_writes_start_payloads_but_never_a_result_blob(
    secured: Secured,
    pods: Pods,
    tmp_path: Path,
) -> None:
    for role in ("engine", "tools", "projector"):  # the engine first: it declares the buckets
        await pods.start(secured, role)
    # a result's blob, as `put` writes one: its chunks, then its metadata under its name
    name = base64.urlsafe_b64encode(b"some-execution/result/0123456789abcdef01234567").decode()
    await refused(secured, "cli", f"$O.{BLOB_BUCKET}.C.forgedchunks", b"REJECTED")
    await refused(secured, "cli", f"$O.{BLOB_BUCKET}.M.{name}", b"{}")
    # while a payload too large for a start message still travels as the cli's own blob
    (tmp_path / "measure.yaml").write_text(
        playbook("measure", '  - step: n\n    tool: noop\n    args: {n: "{{ workload.big | length }}"}\n')
        + '  - step: end\n    args: {n: "{{ workload.big | length }}"}\n'
    )
    big = "x" * 1_200_000
    async with Client.connect(secured.url("cli"), options=secured.options("cli"), layout=secured.layout) as client:
        entry = await client.register(tmp_path / "measure.yaml")
        eid = await client.start(entry.path, payload={"big": big})
        assert (await client.wait(eid, timeout=60)).state == "COMPLETED"
        assert await client.result(eid) == {"n": len(big)}
    assert all(f'Subject "$O.{BLOB_BUCKET}.' in v for v in secured.violations()), secured.violations()


# --- item 7: one catalog path, one key ---------------------------------------------------


async def test_a_catalog_path_that_is_not_one_is_refused_by_register_start_and_the_cli(system: System) -> None:
    dotted = system.tmp / "dotted.yaml"
    dotted.write_text(playbook("backup", NOOP, path="ops/nightly.backup"))
    with pytest.raises(CatalogPathInvalid) as caught:
        await system.client.register(dotted)
    assert "ops/nightly.backup" in str(caught.value) and "letters, digits" in str(caught.value)
    for bad in ("ops/nightly.backup", "/ops/backup", "ops backup"):
        with pytest.raises(CatalogPathInvalid):
            await system.client.start(bad)
    # an allowed path keeps the key it always had
    entry = await system.client.register(write(system, playbook("backup", NOOP, path="ops/nightly_backup")))
    kv = await system.nc.jetstream().key_value(CATALOG_BUCKET)
    assert (await kv.get("ops/nightly_backup.latest")).value == b"1" and entry.version == 1

    url = system.server.url
    (code_r, _, err_r, _), (code_s, _, err_s, _) = await asyncio.gather(
        cli("register", str(dotted), url=url), cli("start", "ops/nightly.backup", url=url)
    )
    assert code_r == EXIT_INVALID and "ops/nightly.backup" in one_line(err_r) and "'/'" in err_r
    assert code_s == EXIT_INVALID and "ops/nightly.backup" in one_line(err_s)
    assert [(e.path, e.version) for e in await system.client.playbooks()] == [("ops/nightly_backup", 1)]


async def test_a_path_whose_key_holds_another_paths_playbook_is_refused(system: System) -> None:
    """`ops/nightly.backup`, registered before paths were checked, sits under the key of
    `ops/nightly_backup`: registering or starting the second never runs the first."""
    kv = await system.nc.jetstream().key_value(CATALOG_BUCKET)
    old = playbook("backup", NOOP, path="ops/nightly.backup")
    stored = msgspec.json.encode({"path": "ops/nightly.backup", "version": 1, "source": old, "registered_at": 1.0})
    await kv.put("ops/nightly_backup.v1", stored)
    await kv.put("ops/nightly_backup.latest", b"1")
    other = system.tmp / "other.yaml"
    other.write_text(playbook("backup2", NOOP, path="ops/nightly_backup"))

    with pytest.raises(CatalogPathInvalid) as caught:
        await system.client.register(other)
    assert "collides with 'ops/nightly.backup'" in str(caught.value)
    with pytest.raises(CatalogPathInvalid):
        await system.client.start_execution("ops/nightly_backup")
    reply = await starter_reply(system, "ops/nightly_backup", "collide-1")
    assert not reply.started and reply.error is not None and reply.error.type == "PlaybookPathInvalid"
    code, _, err, _ = await cli("register", str(other), url=system.server.url)
    assert code == EXIT_INVALID and "collides" in one_line(err)
    assert (await kv.get("ops/nightly_backup.latest")).value == b"1"  # nothing was registered over it


async def starter_reply(system: System, path: str, eid: str) -> StartReply:
    """A start request answered by the starter (not as a start message: refusals come back)."""
    body = encode(StartMessage(playbook=path, execution_id=eid))
    msg = await system.nc.request(START_REQUEST_SUBJECT, body, timeout=10)
    return msgspec.json.decode(msg.data, type=StartReply)


# --- item 8: one bad record --------------------------------------------------------------


async def test_a_malformed_status_is_skipped_by_listings_and_named_by_status(
    system: System, ui: TestClient[Any, Any]
) -> None:
    good, status = await system.run_yaml(playbook("fine", NOOP))
    assert status.state == "COMPLETED"
    js = system.nc.jetstream()
    index = IndexEntry(execution_id="bad-status-1", playbook="fine", started_at=time.time())
    await js.publish(index_subject("bad-status-1"), encode(index))
    kv = await js.key_value(STATUS_BUCKET)
    await kv.put("bad-status-1", b'{"execution_id": "bad-status-1", "state": "GARBAGE"}')

    assert [s.execution_id for s in await system.client.list()] == [good]
    with pytest.raises(RecordInvalid) as caught:
        await system.client.status("bad-status-1")
    assert "'bad-status-1'" in str(caught.value)
    url = system.server.url
    (code_l, out_l, err_l, _), (code_s, _, err_s, _) = await asyncio.gather(
        cli("list", "--json", url=url), cli("status", "bad-status-1", url=url)
    )
    assert code_l == EXIT_OK and [json.loads(line)["execution_id"] for line in out_l.splitlines()] == [good]
    warned(err_l, "'bad-status-1'")
    assert code_s == EXIT_INVALID and "'bad-status-1'" in one_line(err_s) and "status" in err_s

    listed = await ui.get("/api/executions")
    assert listed.status == 200 and [r["execution_id"] for r in (await listed.json())["executions"]] == [good]
    detail = await ui.get("/api/executions/bad-status-1")
    assert detail.status == 502 and "'bad-status-1'" in (await detail.json())["error"]


async def test_the_projector_writes_a_malformed_status_anew_instead_of_retrying_for_ever(system: System) -> None:
    """Only the projector writes `status`: garbage under an execution's key is damage it
    repairs from that execution's next lifecycle event (on the same revision), never an
    event it fails to apply and is given again and again."""
    kv = await system.nc.jetstream().key_value(STATUS_BUCKET)
    eid = await system.start_yaml(playbook("napper", "  - step: nap\n    tool: {kind: sleep, seconds: 2}\n"))

    async def stored() -> ExecutionStatus | None:
        try:
            return msgspec.json.decode((await kv.get(eid)).value or b"", type=ExecutionStatus)
        except Exception:
            return None

    async def running() -> bool:
        status = await stored()
        return status is not None and status.state == "RUNNING"

    async def completed() -> bool:
        status = await stored()
        return status is not None and status.state == "COMPLETED"

    await wait_for(running, timeout=30)
    await kv.put(eid, b"\x00 not a status")  # the step still sleeps: its end is the next event
    await wait_for(completed, timeout=30)
    await system.engine_idle()
    info = await system.nc.jsm().consumer_info("EXEC", "projector")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def test_malformed_index_and_ended_entries_are_skipped_with_a_warning(
    system: System, ui: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    good, status = await system.run_yaml(playbook("fine", NOOP))
    assert status.state == "COMPLETED"
    js = system.nc.jetstream()
    await js.publish(index_subject("junk-1"), b"{not an index entry")
    await js.publish(index_subject("junk-2"), encode({"execution_id": "two.tokens", "playbook": "fine"}))
    ended = await js.publish(index_end_subject("COMPLETED", "junk-3"), b"NaN")
    caplog.set_level(logging.WARNING, logger="actors.store.records")

    assert [s.execution_id for s in await system.client.list()] == [good]
    assert [s.execution_id for s in await system.client.list(state="COMPLETED")] == [good]
    assert f"stream ENDED message {ended.seq}" in caplog.text and "stream INDEX message" in caplog.text
    url = system.server.url
    (code_a, out_a, err_a, _), (code_c, out_c, err_c, _) = await asyncio.gather(
        cli("list", "--json", url=url), cli("list", "--state", "COMPLETED", "--json", url=url)
    )
    assert code_a == EXIT_OK and [json.loads(line)["execution_id"] for line in out_a.splitlines()] == [good]
    warned(err_a, "stream INDEX message", "two.tokens")
    assert code_c == EXIT_OK and [json.loads(line)["execution_id"] for line in out_c.splitlines()] == [good]
    warned(err_c, f"stream ENDED message {ended.seq}")

    for query in ("", "?state=COMPLETED"):
        listed = await ui.get(f"/api/executions{query}")
        assert listed.status == 200, await listed.text()
        assert [r["execution_id"] for r in (await listed.json())["executions"]] == [good]


async def test_a_latest_version_that_is_not_a_number_is_named_by_start_run_and_the_starter(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    text = playbook("backup", NOOP, path="ops/backup")
    path = await register(system, text)
    kv = await system.nc.jetstream().key_value(CATALOG_BUCKET)
    await kv.put("ops/backup.latest", b"NaN")
    caplog.set_level(logging.WARNING, logger="actors.starter")

    with pytest.raises(CatalogRecordInvalid) as caught:
        await system.client.start_execution("ops/backup")
    assert "'ops/backup.latest'" in str(caught.value)
    with pytest.raises(CatalogError):
        await system.client.register(path)
    # the starter: a start request is refused, a start message fails its execution, both naming the key
    reply = await starter_reply(system, "ops/backup", "nan-request-1")
    assert not reply.started and reply.error is not None and reply.error.type == "CatalogRecordInvalid"
    assert "'ops/backup.latest'" in reply.error.message
    await system.js_publish(
        START_SUBJECT, encode(StartMessage(playbook="ops/backup", execution_id="nan-1")), msg_id="nan-1"
    )
    failed = await system.client.wait("nan-1", timeout=30)
    assert failed.state == "FAILED" and failed.error is not None
    assert failed.error["type"] == "CatalogRecordInvalid" and "'ops/backup.latest'" in failed.error["message"]
    assert "'ops/backup.latest'" in caplog.text
    # the version asked for by number is still there to run
    ok = await system.client.start("ops/backup", version=1)
    assert (await system.client.wait(ok, timeout=30)).state == "COMPLETED"

    url = system.server.url
    (code_s, _, err_s, _), (code_r, _, err_r, _), (code_p, out_p, _, _) = await asyncio.gather(
        cli("start", "ops/backup", url=url), cli("run", str(path), url=url), cli("playbooks", "--json", url=url)
    )
    assert code_s == EXIT_INVALID and "'ops/backup.latest'" in one_line(err_s)
    assert code_r == EXIT_INVALID and "'ops/backup.latest'" in one_line(err_r)
    assert code_p == EXIT_OK and json.loads(out_p)["path"] == "ops/backup"


async def test_a_malformed_catalog_entry_is_skipped_by_listings_and_named_when_started(
    system: System, ui: TestClient[Any, Any]
) -> None:
    await register(system, playbook("fine", NOOP, path="lib/fine"))
    await register(system, playbook("broken", NOOP, path="lib/broken"))
    kv = await system.nc.jetstream().key_value(CATALOG_BUCKET)
    await kv.put("lib/broken.v1", b'{"path": "lib/broken", "version": "one"}')

    assert [e.path for e in await system.client.playbooks()] == ["lib/fine"]
    listed = await ui.get("/api/playbooks")
    assert listed.status == 200 and [p["path"] for p in (await listed.json())["playbooks"]] == ["lib/fine"]
    with pytest.raises(CatalogRecordInvalid):
        await system.client.start_execution("lib/broken")
    url = system.server.url
    (code_p, out_p, err_p, _), (code_s, _, err_s, _) = await asyncio.gather(
        cli("playbooks", url=url), cli("start", "lib/broken", url=url)
    )
    assert code_p == EXIT_OK and "lib/fine" in out_p and "lib/broken" not in out_p
    warned(err_p, "'lib/broken.v1'")
    assert code_s == EXIT_INVALID and "'lib/broken.v1'" in one_line(err_s)
    eid = await system.client.start("lib/broken")  # as a start message: it fails, saying why
    status = await system.client.wait(eid, timeout=30)
    assert status.state == "FAILED" and status.error is not None and "'lib/broken.v1'" in status.error["message"]
