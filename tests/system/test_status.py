"""Seed 001's checklist: only lifecycle events decide an execution's status."""

from __future__ import annotations

import asyncio

import msgspec
import nats
import pytest
from nats.js.errors import KeyWrongLastSequenceError

from actors.client import Client
from actors.status.projector import Projector
from actors.wire.events import (
    AnyEvent,
    DecisionRecord,
    ExecState,
    PlaybookCompletedData,
    PlaybookFailedData,
    PlaybookInitializedData,
    UnknownEvent,
    WorkflowInitializedData,
    make_event,
)
from actors.wire.messages import CallDone, ExecutionStatus, encode
from streams.layout import INDEX_STREAM, STATUS_BUCKET, Layout, ensure
from streams.server import NatsServer
from streams.subjects import index_subject, kv_stream
from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

SLOW = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: first
    tool: {kind: python, code: "def main(): return 1"}
    next: last
  - step: last
    tool: {kind: sleep, seconds: 30}
"""


async def _start_and_reach_last(system: System) -> str:
    path = system.tmp / "slow.yaml"
    path.write_text(SLOW)
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path)
    async for item in system.client.follow(eid):
        if item.type == "command.issued" and item.step == "last":
            break
    return eid


async def test_status_is_running_while_work_is_issued(system: System) -> None:
    eid = await _start_and_reach_last(system)
    # first's call.done and step.exit are in the log; last's command is in flight
    items = await system.events(eid)
    assert of_type(items, "step.exit", "first")
    status = await system.client.status(eid)
    assert status is not None and status.state == "RUNNING"
    assert status.ended_at is None and status.terminal_event is None
    await system.client.cancel(eid, "test over")
    final = await system.client.wait(eid, timeout=10)
    assert final.state == "CANCELLED" and final.terminal_event == "execution.cancelled"


async def test_lower_layer_events_on_the_last_step_never_complete_an_execution(system: System) -> None:
    eid = await _start_and_reach_last(system)
    prefix = system.layout.exec_prefix(eid)
    # forge what a confused worker or heuristic might emit for the last visible step and for end
    forged = DecisionRecord(
        cause=10**9,
        events=[
            UnknownEvent(
                type="step.exit", execution_id=eid, at=0, cause=10**9, step="end", data={"status": "COMPLETED"}
            ),
            UnknownEvent(type="command.completed", execution_id=eid, at=0, cause=10**9, step="last"),
            UnknownEvent(type="batch.completed", execution_id=eid, at=0, cause=10**9, data={"pending_count": 0}),
        ],
    )
    await system.nc.jetstream().publish(f"{prefix}.ev.decision", encode(forged))
    await system.nc.jetstream().publish(
        f"{prefix}.in.result.999-1",
        encode(CallDone(execution_id=eid, command_id="999-1", step="end", attempt_number=1, result={})),
    )
    # a real lifecycle event follows; if anything above had closed the execution as
    # COMPLETED, this one could not change it (terminal states are final)
    await system.client.cancel(eid, "after forged events")
    final = await system.client.wait(eid, timeout=10)
    assert final.state == "CANCELLED"
    items = await system.events(eid)
    assert not of_type(items, "playbook.completed")


async def test_completed_only_after_playbook_completed(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: quick}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    completed = of_type(items, "playbook.completed")
    assert len(completed) == 1
    assert status.ended_at == completed[0].at
    assert status.terminal_event == "playbook.completed"


async def test_cancel_of_a_terminal_execution_changes_nothing(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: done_already}
workflow:
  - step: a
""")
    assert status.state == "COMPLETED"
    await system.client.cancel(eid, "too late")
    await system.engine_idle()
    # the engine folds the cancel into a terminal execution: no lifecycle event follows
    after = await system.client.status(eid)
    assert after is not None and after.state == "COMPLETED"
    items = await system.events(eid)
    assert not of_type(items, "execution.cancelled")


async def test_a_projector_with_a_stale_status_in_memory_never_moves_a_status_back(system: System) -> None:
    """Two projector pods: each remembers the status it last wrote (and its KV
    revision) to skip a read. When the other pod has written since, the write fails on
    the revision, the status is read again, and a terminal one stays as it is."""
    kv = await system.nc.jetstream().key_value(STATUS_BUCKET)
    a, b = Projector(system.nc), Projector(system.nc)
    a._kv = b._kv = kv  # driven directly, in a chosen order: no subscription

    def event(
        data: PlaybookInitializedData | PlaybookCompletedData | WorkflowInitializedData | PlaybookFailedData, at: float
    ) -> AnyEvent:
        return make_event(data, execution_id="stale-1", at=at, cause=1)

    completed = PlaybookCompletedData(
        playbook="p",
        started_at=1.0,
        ended_at=2.0,
        result=None,
        evaluated_by_end_step=True,
        total_steps=1,
        failed_steps_count=0,
        handled_failures=[],
        cancelled_steps=[],
    )
    failed = PlaybookFailedData(playbook="p", started_at=1.0, ended_at=3.0, error={"type": "E", "message": "m"})
    await a.apply(event(PlaybookInitializedData(playbook="p", version=None, started_at=1.0), 1.0))  # a: RUNNING
    await b.apply(event(completed, 2.0))  # b reads RUNNING, writes COMPLETED
    await a.apply(event(WorkflowInitializedData(entry="a"), 2.5))  # no move forward from a's RUNNING: nothing to write
    await a.apply(event(failed, 3.0))  # a's revision is stale: read again, terminal stays
    status = await system.client.status("stale-1")
    assert status is not None
    assert (status.state, status.terminal_event, status.ended_at) == ("COMPLETED", "playbook.completed", 2.0)


async def test_a_waiting_client_takes_only_a_status_the_bucket_stored(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Client.wait` follows each status as the server republishes it once stored: a
    compare-and-set the stream refused (a projector with a stale revision) is never
    taken for the execution's status, however terminal it looks."""
    kv = await system.nc.jetstream().key_value(STATUS_BUCKET)
    eid = "stored-only-1"
    revision = await kv.create(eid, encode(ExecutionStatus(execution_id=eid, state=ExecState.RUNNING)))
    subscribed = asyncio.Event()
    read_once = system.client._status_once

    async def status_once(execution_id: str) -> ExecutionStatus | None:
        st = await read_once(execution_id)
        subscribed.set()  # the wait subscribes before it reads: the server has its interest now
        return st

    monkeypatch.setattr(system.client, "_status_once", status_once)
    waiting = asyncio.create_task(system.client.wait(eid, timeout=30))
    await subscribed.wait()
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update(eid, encode(ExecutionStatus(execution_id=eid, state=ExecState.COMPLETED)), last=revision + 7)
    await kv.update(eid, encode(ExecutionStatus(execution_id=eid, state=ExecState.FAILED)), last=revision)
    assert (await waiting).state == ExecState.FAILED


async def test_engine_pods_give_a_status_bucket_of_an_earlier_version_its_republish(nats_server: NatsServer) -> None:
    """Buckets made before waits followed republished statuses have no RePublish: an
    engine pod's `ensure` adds it and keeps the statuses already there."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=STATUS_BUCKET, history=1)
        await kv.put("old-1", encode(ExecutionStatus(execution_id="old-1", state=ExecState.COMPLETED)))
        assert (await js.stream_info(kv_stream(STATUS_BUCKET))).config.republish is None
        await ensure(js, Layout())
        republish = (await js.stream_info(kv_stream(STATUS_BUCKET))).config.republish
        assert republish is not None and republish.dest == "status.>"
        client = Client(nc, layout=Layout())
        assert (await client.wait("old-1", timeout=10)).state == ExecState.COMPLETED
    finally:
        await nc.close()


async def test_an_executions_index_entry_is_written_once_and_follows_a_status_stored_without_it(
    system: System,
) -> None:
    """The first status and the index entry go out together; a redelivered
    `playbook.initialized` (another projector, a restart) neither duplicates nor moves
    the entry, and a status stored without its entry (the entry's write failed) gets it."""
    js = system.nc.jetstream()
    kv = await js.key_value(STATUS_BUCKET)

    def initialized(eid: str) -> AnyEvent:
        return make_event(
            PlaybookInitializedData(playbook="p", version=1, started_at=1.0), execution_id=eid, at=1.0, cause=1
        )

    first = Projector(system.nc)
    first._kv = kv
    await first.apply(initialized("idx-1"))
    entry = await js.get_last_msg(INDEX_STREAM, index_subject("idx-1"))
    status = await system.client.status("idx-1")
    assert status is not None and status.state == ExecState.RUNNING

    again = Projector(system.nc)  # nothing remembered: reads the status, decides nothing
    again._kv = kv
    await again.apply(initialized("idx-1"))
    assert (await js.get_last_msg(INDEX_STREAM, index_subject("idx-1"))).seq == entry.seq

    await kv.create("idx-2", encode(ExecutionStatus(execution_id="idx-2", state=ExecState.RUNNING, playbook="p")))
    await again.apply(initialized("idx-2"))
    assert (await js.get_last_msg(INDEX_STREAM, index_subject("idx-2"))).subject == index_subject("idx-2")


async def test_the_index_entry_names_the_playbook_when_another_pod_applies_a_later_event_first(
    system: System,
) -> None:
    """Two projector pods: the pod that takes `workflow.initialized` may apply it before
    the other applies `playbook.initialized`. The status it creates names no playbook;
    the index entry waits for the event that does, so `list --playbook` finds the
    execution (it missed 2 to 12 of 50 children in the rolling upgrade bench)."""
    js = system.nc.jetstream()
    kv = await js.key_value(STATUS_BUCKET)
    a, b = Projector(system.nc), Projector(system.nc)
    a._kv = b._kv = kv  # driven directly, in the racing order: no subscription
    await b.apply(make_event(WorkflowInitializedData(entry="a"), execution_id="race-1", at=1.0, cause=2))
    await a.apply(
        make_event(
            PlaybookInitializedData(playbook="p", version=1, started_at=1.0), execution_id="race-1", at=1.0, cause=1
        )
    )
    entry = await js.get_last_msg(INDEX_STREAM, index_subject("race-1"))
    assert msgspec.json.decode(entry.data)["playbook"] == "p"
    assert [e.execution_id for e in await system.client.list(playbook="p")] == ["race-1"]
