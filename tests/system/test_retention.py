"""Retention: a finished execution is kept `finished_retention` seconds after it ended,
then archived (when the deployment archives) and removed from every stream and bucket,
and still read from the archive by `status`, `result`, `events`, `iterations` and
`list`. A running execution is never removed, however old."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from aiohttp.test_utils import TestClient, TestServer

from actors.client import Client, ExecutionNotFound, RetryRefused
from actors.natsio import dead_letter
from actors.natsio.purge import purge
from actors.natsio.readall import count
from actors.retention.actor import Retention
from actors.store.archive import ArchiveInvalid, DirArchive, ObjectArchive
from actors.store.blobs import get_payload, payload_blob
from actors.store.retire import retire
from actors.ui.server import make_app
from actors.wire.events import ExecState
from streams.layout import (
    ARCHIVE_BUCKET,
    BLOB_BUCKET,
    ENDED_STREAM,
    EXEC_STREAM,
    INDEX_STREAM,
    LOOP_STREAM,
    PAYLOAD_BUCKET,
    STATUS_BUCKET,
    obj_stream,
)
from streams.subjects import (
    index_ends_of,
    index_subject,
    kv_key_subject,
    kv_stream,
    loop_logs_filter,
    object_chunks_subject,
    object_meta_subject,
)
from tests.conftest import System, of_type, wait_for
from tests.support.cli import cli, one_line
from tests.support.ui import ok

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

# a result too large for a message (a blob), a loop, a step that prints
PIPELINE = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: kept}
workflow:
  - step: big
    tool: {kind: python, code: "def main(): return 'z' * 400_000"}
    next: each
  - step: each
    loop: {collection: "{{ [1, 2, 3] }}", element: n}
    tool: {kind: python, code: "def main(n): return n * 10"}
    args: {n: "{{ n }}"}
    next: end
  - step: end
    args: {size: "{{ big | length }}", each: "{{ each }}", big: "{{ big }}"}
"""

WAITS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: waits}
workflow:
  - step: wait
    tool: {kind: sleep, seconds: 120}
"""


async def records_left(system: System, eid: str) -> dict[str, int]:
    """What each stream and bucket still holds of the execution."""
    nc, layout = system.nc, system.layout
    return {
        "log": await count(nc, layout.exec_stream_of(eid), layout.execution(eid).log),
        "loops": await count(nc, LOOP_STREAM, loop_logs_filter(eid, layout.partitions)),
        "index": await count(nc, INDEX_STREAM, index_subject(eid)),
        "ended": await count(nc, ENDED_STREAM, index_ends_of(eid)),
        "status": await count(nc, kv_stream(STATUS_BUCKET), kv_key_subject(STATUS_BUCKET, eid)),
    }


async def retired(system: System, eid: str) -> None:
    """Until nothing of the execution is left (the retention actor's work has no event
    of its own to await: what it removes is what is looked at)."""

    async def gone() -> bool:
        return not any((await records_left(system, eid)).values())

    await wait_for(gone, timeout=30, interval=0.1)


async def ended(system: System, *eids: str) -> None:
    """Until the projector has written each one's ENDED entry (it writes the status first)."""

    async def all_there() -> bool:
        return all([await count(system.nc, ENDED_STREAM, index_ends_of(eid)) for eid in eids])

    await wait_for(all_there, timeout=20)


async def archiving(system: System, monkeypatch: pytest.MonkeyPatch, place: str) -> None:
    monkeypatch.setenv("ACTORS_ARCHIVE", place)
    await system.restart_roles(("retention",))


# and with the logs spread over several streams (EXEC_<k>): removed from its own
SPREAD = {"partitions": 8, "exec_streams": 4}


@pytest.mark.parametrize(
    "streams",
    [
        pytest.param(1, marks=pytest.mark.layout(finished_retention=1.0)),
        pytest.param(4, marks=pytest.mark.layout(finished_retention=1.0, **SPREAD)),
    ],
)
async def test_a_finished_execution_is_archived_removed_everywhere_and_still_read(
    system: System, monkeypatch: pytest.MonkeyPatch, streams: int
) -> None:
    assert len(system.layout.exec_stream_names) == streams
    await archiving(system, monkeypatch, "objects")
    eid, status = await system.run_yaml(PIPELINE, timeout=30)
    assert status.state == ExecState.COMPLETED
    live_events = await system.events(eid)
    assert (await system.nc.jsm().stream_info(obj_stream(BLOB_BUCKET))).state.messages > 0
    await retired(system, eid)

    # nothing left: its log, loops, index entries, status and blobs
    assert (await system.nc.jsm().stream_info(obj_stream(BLOB_BUCKET))).state.messages == 0
    # and all of it read back from the archive
    again = await system.client.status(eid)
    assert again is not None and again.state == ExecState.COMPLETED and again.playbook == "kept"
    result: Any = await system.client.result(eid)
    assert result["size"] == 400_000 and result["each"] == [10, 20, 30] and result["big"] == "z" * 400_000
    events = await system.events(eid)
    assert [(e.cls, e.type, e.step) for e in events] == [(e.cls, e.type, e.step) for e in live_events]
    assert len(of_type(events, "playbook.completed")) == 1
    assert sorted(r.result for r in await system.client.iterations(eid)) == [10, 20, 30]
    assert eid in [s.execution_id for s in await system.client.list()]
    assert eid in [s.execution_id for s in await system.client.list(state="COMPLETED")]
    assert eid not in [s.execution_id for s in await system.client.list(state="FAILED")]


@pytest.mark.layout(finished_retention=0.5)
async def test_a_running_execution_is_never_removed_however_old(system: System) -> None:
    waiting = await system.start_yaml(WAITS)
    await wait_for(lambda: system.client.running_steps(waiting), timeout=20)
    # an execution that ended after `waiting` started is retired: the actor ran past it
    done, _ = await system.run_yaml(PIPELINE, timeout=30)
    await retired(system, done)
    left = await records_left(system, waiting)
    assert left["log"] > 0 and left["index"] == 1 and left["status"] == 1 and left["ended"] == 0
    status = await system.client.status(waiting)
    assert status is not None and status.state == ExecState.RUNNING
    # once it ends, its turn comes
    await system.client.cancel(waiting)
    assert (await system.client.wait(waiting, timeout=20)).state == ExecState.CANCELLED
    await retired(system, waiting)


@pytest.mark.parametrize(
    "streams",
    [
        pytest.param(1, marks=pytest.mark.layout(finished_retention=0.5)),
        pytest.param(4, marks=pytest.mark.layout(finished_retention=0.5, **SPREAD)),
    ],
)
async def test_without_an_archive_a_retired_execution_is_gone(system: System, streams: int) -> None:
    eid, status = await system.run_yaml(PIPELINE, timeout=30)
    assert status.state == ExecState.COMPLETED
    own = system.layout.exec_stream_of(eid)
    assert await count(system.nc, own, system.layout.execution(eid).log)
    await retired(system, eid)
    assert (await system.nc.jsm().stream_info(own)).state.messages == 0
    assert await system.client.status(eid) is None
    assert await system.events(eid) == []
    with pytest.raises(ExecutionNotFound):
        await system.client.result(eid)
    assert eid not in [s.execution_id for s in await system.client.list()]


async def test_actors_cli_archive_writes_files_removes_and_the_cli_reads_them_back(
    system: System, tmp_path: Path
) -> None:
    """`actors-cli archive --to DIR` now, whatever the retention (7 days here); then the
    CLI with ACTORS_ARCHIVE=DIR reads the execution from its file."""
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    running = await system.start_yaml(WAITS)
    await wait_for(lambda: system.client.running_steps(running), timeout=20)
    await ended(system, eid)
    folder = tmp_path / "archive"
    url = system.server.url

    ran = await cli("archive", "--older-than", "0s", "--to", str(folder), "--json", url=url)
    assert ran.code == 0, ran.err
    summary = json.loads(ran.out)
    assert summary["archived"] == 1 and summary["removed"] == 1 and summary["blobs"] >= 1
    assert not any((await records_left(system, eid)).values())
    files = list(folder.glob("*/*.jsonl.gz"))
    assert [f.name for f in files] == [f"{eid}.jsonl.gz"]
    # the file is JSON Lines anyone can read: a header, then every stored message
    lines = [json.loads(line) for line in gzip.decompress(files[0].read_bytes()).splitlines()]
    assert lines[0]["kind"] == "archive" and lines[0]["execution_id"] == eid
    assert {line.get("stream") for line in lines[1:]} >= {"EXEC", "LOOP", "INDEX", "ENDED", "KV_status"}

    reads = {"ACTORS_ARCHIVE": str(folder)}
    ran = await cli("status", eid, "--json", url=url, env=reads)
    assert ran.code == 0 and json.loads(ran.out)["state"] == "COMPLETED", ran.err
    ran = await cli("result", eid, "--json", url=url, env=reads)
    assert ran.code == 0 and json.loads(ran.out)["result"]["each"] == [10, 20, 30], ran.err
    ran = await cli("events", eid, "--json", url=url, env=reads)
    assert ran.code == 0 and "playbook.completed" in ran.out, ran.err
    ran = await cli("list", "--json", url=url, env=reads)
    assert ran.code == 0 and {json.loads(r)["execution_id"] for r in ran.out.splitlines()} == {eid, running}

    # the running one was never touched; archiving again finds nothing more to do
    assert (await records_left(system, running))["log"] > 0
    ran = await cli("archive", "--older-than", "0s", "--to", str(folder), "--json", url=url)
    assert json.loads(ran.out)["archived"] == 0 and json.loads(ran.out)["removed"] == 0


async def test_actors_cli_archive_refuses_what_it_cannot_do_in_one_line(system: System) -> None:
    url = system.server.url
    for args, says in [
        (("--to", "relative/dir"), "absolute directory"),
        ((), "nowhere to archive"),
        (("--keep",), "nowhere to archive"),
        (("--no-archive", "--keep"), "not with --keep or --to"),
        (("--no-archive", "--older-than", "soon"), "--older-than 'soon'"),
        (("--no-archive", "--limit", "0"), "--limit 0"),
    ]:
        ran = await cli("archive", *args, url=url, env={"ACTORS_ARCHIVE": "off"})
        assert ran.code == 3 and says in one_line(ran.err), (args, ran.err)


class ArchivesThenDies(ObjectArchive):
    """An archive written whole, then the retention actor's pod dies before removing anything."""

    async def put(self, execution_id: str, document: bytes, *, status: str | None) -> None:
        await super().put(execution_id, document, status=status)
        raise ConnectionResetError("the pod died here")


async def test_a_retirement_cut_short_is_finished_by_the_next_and_the_first_archive_kept(system: System) -> None:
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    events = await system.events(eid)
    with pytest.raises(ConnectionResetError):
        await retire(system.nc, system.layout, eid, archive=ArchivesThenDies(system.nc))
    assert all((await records_left(system, eid)).values())  # nothing removed yet
    # half-way through removing: its status and log already gone
    await purge(system.nc, EXEC_STREAM, system.layout.execution(eid).log)
    await purge(system.nc, kv_stream(STATUS_BUCKET), kv_key_subject(STATUS_BUCKET, eid))

    done = await retire(system.nc, system.layout, eid, archive=ObjectArchive(system.nc))
    assert not done.archived and done.kept is None  # the first archive is kept as it was
    assert not any((await records_left(system, eid)).values())
    assert [(e.type, e.step) for e in await system.events(eid)] == [(e.type, e.step) for e in events]
    assert (await system.client.result(eid))["each"] == [10, 20, 30]


class LosesTheMetadataAck(ObjectArchive):
    """The object's metadata is stored, and its PubAck lost (a reconnect, a leader that
    died after storing it): its publish raises as if nothing were known."""

    def __init__(self, nc: Any) -> None:
        super().__init__(nc)
        store, meta_prefix = self.js.publish, object_meta_subject(ARCHIVE_BUCKET, "")

        async def publish(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
            ack = await store(subject, payload, **kwargs)
            if subject.startswith(meta_prefix):
                raise nats.errors.TimeoutError()
            return ack

        self.js.publish = publish  # type: ignore[method-assign]


async def test_an_archive_whose_metadata_ack_was_lost_stays_whole(system: System) -> None:
    """A put that stored its metadata but never heard so keeps its chunks: the next
    retirement finds the archive (`has`) and removes the execution, so purged chunks
    would leave an archive no one can read (review h2: with a try cut at the deadline,
    or any lost PubAck). The put after it finds the first and writes nothing."""
    eid = "a" * 32
    document = bytes(range(256)) * 2000  # 512 KB: several chunks
    with pytest.raises(nats.errors.TimeoutError):
        await LosesTheMetadataAck(system.nc).put(eid, document, status="COMPLETED")
    archive = ObjectArchive(system.nc)
    assert await archive.has(eid)
    store = await system.nc.jetstream().object_store(ARCHIVE_BUCKET)
    assert (await asyncio.wait_for(store.get(eid), 10)).data == document  # a chunk missing waits for ever
    assert await archive.put(eid, b"a second document", status="COMPLETED") is False
    assert (await asyncio.wait_for(store.get(eid), 10)).data == document


async def test_a_damaged_archive_is_said_in_one_line_naming_it(system: System) -> None:
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    store = await system.nc.jetstream().object_store(ARCHIVE_BUCKET)
    await store.put(eid, b"not gzip at all")
    await retire(system.nc, system.layout, eid, archive=None)
    with pytest.raises(ArchiveInvalid, match=f"archive '{eid}' in bucket 'archive': not a gzip-compressed archive"):
        await system.client.status(eid)
    ran = await cli("status", eid, url=system.server.url)
    assert ran.code == 3 and "not a gzip-compressed archive" in one_line(ran.err)


# every kind of blob an execution makes: a start payload (bucket payloads), a command's
# args, what a step printed, a loop's collection, iteration results, a step result and
# the execution's result
BLOBS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: blobs}
workflow:
  - step: args
    tool: {kind: python, code: "def main(s): print(s); return len(s)"}
    args: {s: "{{ workload.big }}"}
    next: items
  - step: items
    tool: {kind: python, code: "def main(): return [c * 200_000 for c in 'abc']"}
    next: each
  - step: each
    loop: {collection: "{{ items }}", element: s, mode: chunked, chunk_size: 2}
    tool: {kind: python, code: "def main(s): return s.upper()"}
    args: {s: "{{ s }}"}
    next: end
  - step: end
    args: {printed: "{{ args }}", kept: "{{ each | map('first') | join }}"}
"""


@pytest.mark.layout(finished_retention=0.5)
async def test_every_blob_of_an_execution_goes_with_it(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    await archiving(system, monkeypatch, "objects")
    payload = {"big": "p" * 1_200_000}
    eid = await system.start_yaml(BLOBS, payload=payload)
    status = await system.client.wait(eid, timeout=60)
    assert status.state == ExecState.COMPLETED, status.error
    jsm = system.nc.jsm()
    assert (await jsm.stream_info(obj_stream(PAYLOAD_BUCKET))).state.messages > 0
    await retired(system, eid)
    # what its records name went with it; a command's args, sent apart, go with the sweep
    (retention,) = system.runtime.find(Retention)
    assert await retention.sweep(grace=0) >= 1  # type: ignore[attr-defined]
    for bucket in (BLOB_BUCKET, PAYLOAD_BUCKET):
        assert (await jsm.stream_info(obj_stream(bucket))).state.messages == 0, bucket
    assert await system.client.result(eid) == {"printed": 1_200_000, "kept": "ABC"}
    printed = await system.client.outputs(eid, step="args")
    assert printed and printed[0].size > 1_200_000
    assert await system.client.output_text(printed[0]) == "p" * 1_200_000 + "\n"


QUICK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: quick}
workflow:
  - step: hello
    tool: {kind: python, code: "def main(n): return n"}
    args: {n: "{{ workload.n }}"}
"""


async def test_the_web_ui_lists_and_shows_retired_executions_from_the_archive(system: System) -> None:
    ids = []
    for n in range(3):
        eid = await system.start_yaml(QUICK, payload={"n": n})
        assert (await system.client.wait(eid, timeout=20)).state == ExecState.COMPLETED
        ids.append(eid)
    await ended(system, *ids)
    report = await system.client.archive(ended_before=time.time(), to=ObjectArchive(system.nc), limit=2)
    assert (report.archived, report.removed) == (2, 2)
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as ui:
        first = await ok(await ui.get("/api/executions", params={"limit": 2}))
        assert first["executions"][0]["execution_id"] == ids[2]  # the live one first
        assert first["next"] == "archived:1"
        second = await ok(await ui.get("/api/executions", params={"limit": 2, "before": first["next"]}))
        assert second["next"] is None
        listed = [r["execution_id"] for r in first["executions"] + second["executions"]]
        assert sorted(listed) == sorted(ids) and all(
            r["state"] == "COMPLETED" for r in first["executions"] + second["executions"]
        )
        detail = await ok(await ui.get(f"/api/executions/{ids[0]}"))
        assert detail["status"]["state"] == "COMPLETED" and detail["result"] == {"hello": 0}
        assert detail["timeline"]["rows"][0]["step"] == "hello"
        events = (await ok(await ui.get(f"/api/executions/{ids[0]}/events")))["events"]
        assert events[-1]["type"] == "playbook.completed"
        for bad in ("archived:", "archived:x", "archived:-1", "archived:9999999999999"):
            assert (await ui.get("/api/executions", params={"before": bad})).status == 400, bad
    with pytest.raises(RetryRefused, match="retired after its retention"):
        await system.client.retry(ids[0])


@pytest.mark.layout(finished_retention=0.5)
async def test_an_archive_that_cannot_be_written_removes_nothing_and_is_tried_again(
    system: System, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    await archiving(system, monkeypatch, "/proc/no-such-dir/archive")  # mkdir refused, as a volume not mounted
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    (retention,) = system.runtime.find(Retention)

    async def tried() -> bool:
        return retention.failures >= 1  # type: ignore[attr-defined, no-any-return]

    await wait_for(tried, timeout=30)
    assert all((await records_left(system, eid)).values())  # nothing removed that was not archived
    # the volume mounted (a pod of the fixed configuration): archived, then removed
    await archiving(system, monkeypatch, str(tmp_path / "archive"))
    await retired(system, eid)
    assert DirArchive(tmp_path / "archive").path(eid).exists()


@pytest.mark.layout(finished_retention=0.5)
async def test_a_tampered_ended_entry_is_dead_lettered_and_nothing_is_removed(system: System) -> None:
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    js = system.nc.jetstream()
    # an entry that is not a status, and one naming every execution (`*`) under a real one's subject
    await js.publish("index.end.COMPLETED.tampered", b"{not json")
    await js.publish(f"index.end.FAILED.{eid}x", b'{"execution_id": "*", "state": "FAILED", "ended_at": 1}')

    async def letters() -> list[Any]:
        found = await system.client.dead_letters("retention")
        return found if len(found) == 2 else []

    found = await wait_for(letters, timeout=20)
    assert {"stream ENDED" in item.data["reason"] for item in found} == {True}
    assert any("is not one" in item.data["reason"] for item in found)
    await retired(system, eid)  # the real one's turn came all the same
    assert (await system.nc.jsm().stream_info(ENDED_STREAM)).state.messages == 0  # nothing left behind


async def test_two_retirements_at_once_leave_one_whole_archive(system: System, tmp_path: Path) -> None:
    """A retention pod and `actors-cli archive` (or two pods, or a redelivery) retiring
    the same execution together: whichever archives first, the archive is whole, and the
    other ends too, though what it reads is removed under it."""
    for place in (ObjectArchive(system.nc), DirArchive(tmp_path)):
        eid, _ = await system.run_yaml(PIPELINE, timeout=30)
        events = await system.events(eid)
        twice = await asyncio.gather(
            retire(system.nc, system.layout, eid, archive=place),
            retire(system.nc, system.layout, eid, archive=place),
        )
        assert sorted(r.archived for r in twice) == [False, True]  # one wrote it; the other found it there
        assert not any((await records_left(system, eid)).values())
        archived = await place.get(eid)
        assert archived is not None and archived.objects, "the archive holds its blobs"
        reader = Client(system.nc, layout=system.layout, archive=place)
        assert [(e.type, e.step) for e in await reader.events(eid)] == [(e.type, e.step) for e in events]
        assert (await reader.result(eid))["each"] == [10, 20, 30]
    # what the slower one may meet: a blob whose chunks the other just removed, its metadata
    # not yet (or the buckets' age limit, chunks being older). It is archived without it, not
    # waited for (nats-py's ObjectStore.get waits for ever for chunks that are gone)
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    store = await system.nc.jetstream().object_store(BLOB_BUCKET)
    (big,) = [o for o in await store.list() if o.name.startswith(f"{eid}/result/")]
    await purge(system.nc, obj_stream(BLOB_BUCKET), object_chunks_subject(BLOB_BUCKET, big.nuid))
    place = DirArchive(tmp_path / "short")
    done = await retire(system.nc, system.layout, eid, archive=place)
    assert done.archived and not any((await records_left(system, eid)).values())
    archived = await place.get(eid)
    assert archived is not None and archived.object(BLOB_BUCKET, big.name) is None
    assert (await Client(system.nc, layout=system.layout, archive=place).status(eid)) is not None


async def test_the_blob_sweep_keeps_a_queued_starts_payload(system: System) -> None:
    """A start still waiting in stream START has no status and no log yet; its payload
    blob is not an orphan."""
    key = await payload_blob(system.nc.jetstream(), {"big": "q" * 10}, "queued-1", cap=1 << 20)
    (retention,) = system.runtime.find(Retention)
    await retention.sweep(grace=0)  # type: ignore[attr-defined]
    assert await get_payload(system.nc.jetstream(), key) == {"big": "q" * 10}


async def test_a_retired_executions_dead_letters_go_with_it_and_late_words_do_not_hide_it(
    system: System, tmp_path: Path
) -> None:
    eid, _ = await system.run_yaml(PIPELINE, timeout=30)
    # a dead letter filed under it, as an actor files one for an input it cannot read
    await dead_letter(system.nc.jetstream(), source="engine", reason="unreadable", execution_id=eid, msg_id="dl-1")
    assert len(await system.client.dead_letters()) == 1
    place = DirArchive(tmp_path)
    reader = Client(system.nc, layout=system.layout, archive=place)
    await retire(system.nc, system.layout, eid, archive=place)
    assert await system.client.dead_letters() == []  # removed with it, archived with it
    events = await reader.events(eid)
    assert [e.type for e in events if e.cls == "dlq"] == ["dead_letter.engine"]
    # a cancel of a retired execution is refused (it would be the one record left of it)
    with pytest.raises(ExecutionNotFound, match="retired"):
        await reader.cancel(eid)
    # a late answer that still reaches its log does not hide what was archived
    await system.js_publish(system.layout.execution(eid).result("late-1"), b"{}", msg_id="late-1")
    again = await reader.events(eid)
    assert [e.type for e in again][: len(events) - 1] == [e.type for e in events if e.cls != "dlq"]
    assert len(of_type(again, "playbook.completed")) == 1


ECHO = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: echo}
workflow:
  - step: end
    args: {n: "{{ workload.n }}"}
"""


async def test_an_id_of_a_retired_execution_names_that_one_for_ever(system: System, tmp_path: Path) -> None:
    path = tmp_path / "echo.yaml"
    path.write_text(ECHO)
    entry = await system.client.register(path)
    place = ObjectArchive(system.nc)
    reader = Client(system.nc, layout=system.layout, archive=place)
    await reader.start(entry.path, payload={"n": 1}, execution_id="order-1")
    await reader.wait("order-1", timeout=20)
    await ended(system, "order-1")
    await retire(system.nc, system.layout, "order-1", archive=place)
    again = await reader.start_execution(entry.path, payload={"n": 2}, execution_id="order-1")
    assert again.existing  # the checked start: that id ran, and is read from the archive
    assert await reader.result("order-1") == {"n": 1}


@pytest.mark.layout(duplicate_window=0.2)
async def test_without_an_archive_an_id_started_again_after_retirement_runs_anew(system: System) -> None:
    """Nothing is left of a retired execution: a start under its id is a new one, run
    (an engine that had the old one in memory rebuilds it from the log)."""
    eid, _ = await system.run_yaml(ECHO, payload={"n": 1})
    await ended(system, eid)
    await retire(system.nc, system.layout, eid, archive=None)
    await asyncio.sleep(0.3)  # past the streams' duplicate window: a time, nothing to await
    path = system.tmp / "echo.yaml"
    path.write_text(ECHO)
    await system.client.start((await system.client.register(path)).path, payload={"n": 2}, execution_id=eid)
    assert (await system.client.wait(eid, timeout=20)).state == ExecState.COMPLETED
    assert await system.client.result(eid) == {"n": 2}
