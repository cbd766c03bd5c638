"""Schedules, hooks and triggers are added, changed and removed through a restart of
NATS, as starts are (tests/system/test_ride_out.py): a call made while the server is away
keeps trying within the client's timeout; a write whose reply is lost is sent again and
recognised as done (actors/natsio/kvonce.py; tests/integration/test_kvonce.py); an add
whose definition NATS stored after its client gave up can still be deleted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.client import Client
from actors.client.schedules import ScheduleError
from actors.natsio.dial import NatsUnavailable
from actors.pod.roles import connect, start_roles
from actors.wire.messages import ScheduleSpec
from actors.wire.triggers import TriggerSpec
from streams.layout import HOOKS_BUCKET, SCHEDULE_STREAM, SCHEDULES_BUCKET, TRIGGERS_BUCKET
from streams.server import NatsServer
from streams.subjects import schedule_definition_subject
from tests.conftest import System, make_layout

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: admin_ridden}
workflow:
  - step: only
    tool: noop
"""


async def _registered(system: System) -> str:
    """PLAYBOOK registered: its catalog path."""
    path = system.tmp / "admin.yaml"
    path.write_text(PLAYBOOK)
    return (await system.client.register(path)).path


async def _quietly(close: Callable[[], Awaitable[Any]]) -> None:
    """A cleanup that must not stop the next one (a connection closing on a server gone)."""
    with contextlib.suppress(Exception):
        await close()


class _TimedOutAndAskedAgain(logging.Handler):
    """Set once a call has waited out a whole request timeout with no server and is
    asked again (actors/natsio/transient.py `ride_out` says so): the outage has then
    lasted longer than anything nats-py itself waits through."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("NATS request failed") and "Timeout" in text:
            self.seen.set()


async def test_schedules_hooks_and_triggers_are_changed_through_a_restart_of_nats(tmp_path: Path) -> None:
    layout, store = make_layout(), tmp_path / "store"
    said, retried = logging.getLogger("actors"), _TimedOutAndAskedAgain()
    level = said.level
    server = await NatsServer.start(store_dir=store)  # the store outlives the server: restarted below
    port = server.port
    async with AsyncExitStack() as stack:
        stack.push_async_callback(lambda: server.discard())  # the server running at the end
        pods = await connect(server.url, name="pods")
        stack.push_async_callback(_quietly, pods.close)
        runtime = await start_roles(pods, layout=layout, roles=("engine",))  # declares the streams and buckets
        stack.push_async_callback(_quietly, runtime.stop)
        client = await Client.connect(server.url, layout=layout, timeout=60)
        stack.push_async_callback(_quietly, client.close)
        said.addHandler(retried)
        said.setLevel(logging.INFO)  # ride_out says at INFO that it asks again
        stack.callback(said.setLevel, level)
        stack.callback(said.removeHandler, retried)
        path = tmp_path / "admin.yaml"
        path.write_text(PLAYBOOK)
        playbook = (await client.register(path)).path
        await client.schedule_add("hourly", playbook=playbook, cron="@hourly")
        await client.trigger_add("paused-later", subject="orders.paused", playbook=playbook)

        await server.stop()
        calls = asyncio.ensure_future(
            asyncio.gather(
                client.schedule_add("daily", playbook=playbook, cron="@daily"),
                client.schedule_pause("hourly"),
                client.hook_add("orders", playbook=playbook),
                client.trigger_add("orders", subject="orders.new", playbook=playbook),
                client.trigger_pause("paused-later"),
            )
        )
        # NATS stays away until a call has timed out and tried again (about 5 s)
        seen = asyncio.ensure_future(retried.seen.wait())
        waiting: list[asyncio.Future[Any]] = [calls, seen]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        seen.cancel()
        assert not calls.done(), calls.exception()  # none gave up while NATS was away
        server = await NatsServer.start(port=port, store_dir=store)
        daily, paused, (hook, token), trigger, trigger_paused = await calls

        assert paused is True and trigger_paused is True
        views = {v.spec.name: v.spec for v in await client.schedules()}
        assert views == {"daily": daily, "hourly": views["hourly"]} and views["hourly"].paused
        assert await client.hook_authorized("orders", token) == hook
        assert {v.spec.name: v.spec.paused for v in await client.triggers()} == {
            "orders": False,
            "paused-later": True,
        }
        assert trigger.subject == "orders.new"


_schedule_spec = msgspec.json.Decoder(ScheduleSpec)


class _LosesFirstReply:
    """A bucket's JetStream context whose first publish is stored and its reply lost (a
    reconnect, a leader dying after the write): the call sees a timeout and sends it again."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    async def publish(self, *args: Any, **kwargs: Any) -> Any:
        ack = await self._js.publish(*args, **kwargs)
        if not self.lost:
            self.lost += 1
            raise TimeoutError("the reply was lost")
        return ack

    @classmethod
    def on(cls, kv: Any) -> _LosesFirstReply:
        """Put in front of bucket `kv`'s own context (nats-py's KeyValue._js)."""
        lossy = cls(kv._js)
        kv._js = lossy
        return lossy

    def off(self, kv: Any) -> None:
        kv._js = self._js


async def test_a_change_whose_reply_is_lost_is_made_once_and_said_done(system: System) -> None:
    client = system.client
    playbook = await _registered(system)
    schedules, hooks = await client.bucket(SCHEDULES_BUCKET), await client.bucket(HOOKS_BUCKET)

    lossy = _LosesFirstReply.on(schedules)
    spec = await client.schedule_add("nightly", playbook=playbook, cron="@daily")  # a create
    assert lossy.lost == 1 and [v.spec for v in await client.schedules()] == [spec]
    lossy.off(schedules)
    lossy = _LosesFirstReply.on(schedules)
    assert await client.schedule_pause("nightly") is True  # an update
    assert lossy.lost == 1 and [v.spec.paused for v in await client.schedules()] == [True]

    await client.hook_add("deploys", playbook=playbook)
    lossy.off(schedules)
    lossy = _LosesFirstReply.on(hooks)
    await client.hook_delete("deploys")  # a delete
    assert lossy.lost == 1 and await client.hooks() == []
    lossy.off(hooks)


async def test_a_trigger_deletion_whose_mark_was_acted_on_before_its_reply_is_done(system: System) -> None:
    """A stream trigger is deleted by marking it `deleting`; a trigger pod then removes
    its consumer and its key. When the mark's reply is lost and the pod is quicker than
    the mark sent again, the key is gone: the deletion is done, not a conflict."""
    client = system.client
    kv = await client.bucket(TRIGGERS_BUCKET)
    spec = TriggerSpec(name="orders", subject="orders.x", playbook="p", stream="ORDERS", add_id="a1")
    await kv.create("orders", client.codec.encode(spec))
    update, lost = kv.update, list[str]()

    async def stored_acted_on_and_reply_lost(key: str, value: bytes, last: int | None = None) -> int:
        if lost:
            return await update(key, value, last=last)
        await update(key, value, last=last)  # the mark is stored...
        await kv.delete(key)  # ...a trigger pod removes the consumer, then the key...
        lost.append(key)
        raise TimeoutError("the reply was lost")  # ...and the reply never came

    kv.update = stored_acted_on_and_reply_lost  # type: ignore[method-assign,assignment]
    try:
        assert await client.trigger_delete("orders") is True
    finally:
        del kv.update  # the bucket's own method again
    assert lost == ["orders"] and await client.triggers() == []


async def test_a_definition_left_without_its_schedule_is_removed_by_delete(system: System) -> None:
    """An add whose client gave up may leave the cron definition NATS stored after all,
    without the schedule's entry: it fires, and `schedule delete NAME` still removes it."""
    client = system.client
    playbook = await _registered(system)
    await client.schedule_add("orphan", playbook=playbook, cron="@daily")
    await (await client.bucket(SCHEDULES_BUCKET)).delete("orphan")  # the entry gone, the definition not
    definition = schedule_definition_subject("orphan")
    assert (await system.nc.jsm().stream_info(SCHEDULE_STREAM, subjects_filter=definition)).state.subjects
    await client.schedule_delete("orphan")
    assert not (await system.nc.jsm().stream_info(SCHEDULE_STREAM, subjects_filter=definition)).state.subjects
    with pytest.raises(ScheduleError, match="no schedule orphan"):
        await client.schedule_delete("orphan")


async def test_a_resume_cut_short_is_finished_by_resume(system: System) -> None:
    """A resume whose entry was stored but whose definition was not (NATS went away in
    between) leaves a schedule that says it runs and never fires: resume defines it."""
    client = system.client
    playbook = await _registered(system)
    await client.schedule_add("weekly", playbook=playbook, cron="@weekly")
    assert await client.schedule_pause("weekly") is True
    kv = await client.bucket(SCHEDULES_BUCKET)
    entry = await kv.get("weekly")
    spec = client.codec.decode(_schedule_spec, entry.value or b"")
    spec.paused = False
    await kv.update("weekly", client.codec.encode(spec), last=entry.revision)  # the resume's first half only
    definition = schedule_definition_subject("weekly")
    assert not (await system.nc.jsm().stream_info(SCHEDULE_STREAM, subjects_filter=definition)).state.subjects
    assert await client.schedule_resume("weekly") is True
    assert (await system.nc.jsm().stream_info(SCHEDULE_STREAM, subjects_filter=definition)).state.subjects
    assert await client.schedule_resume("weekly") is False  # defined and running: nothing to do


async def test_a_pause_sent_again_leaves_the_definition_a_resume_stored_meanwhile(system: System) -> None:
    """A pause removes the cron definition; its reply lost, the removal is sent again.
    A resume made in between has stored a new definition: the one sent again must not
    remove it (the schedule would say it runs and never fire)."""
    client = system.client
    playbook = await _registered(system)
    await client.schedule_add("hourly", playbook=playbook, cron="@hourly")
    purge, resumed = client.js.purge_stream, list[bool]()

    async def purged_then_resumed_then_reply_lost(*args: Any, **kwargs: Any) -> bool:
        done = await purge(*args, **kwargs)
        if not resumed:
            resumed.append(await client.schedule_resume("hourly"))  # another client, quicker
            raise TimeoutError("the reply was lost")
        return done

    client.js.purge_stream = purged_then_resumed_then_reply_lost  # type: ignore[method-assign]
    try:
        assert await client.schedule_pause("hourly") is True
    finally:
        del client.js.purge_stream
    assert resumed == [True]
    [view] = await client.schedules()
    assert view.spec.paused is False  # the resume came last
    definition = schedule_definition_subject("hourly")
    assert (await system.nc.jsm().stream_info(SCHEDULE_STREAM, subjects_filter=definition)).state.subjects


async def test_a_command_of_several_requests_gives_up_within_its_timeout_as_a_whole(system: System) -> None:
    """A pause reads the schedule, writes it, reads its definition and removes it: four
    requests, each ridden out through an election. Each of the first two answered only
    when asked again, after its first try took most of the timeout: the command has
    then spent its timeout, and says so, rather than taking a timeout per request."""
    playbook = await _registered(system)
    await system.client.schedule_add("slow", playbook=playbook, cron="@daily")
    nc = await connect(system.server.url, name="slow-client")
    client = Client(nc, layout=system.layout, timeout=1.0)
    try:
        kv = await client.bucket(SCHEDULES_BUCKET)
        tried: list[str] = []

        def slow_first(name: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def once_slow(*args: Any, **kwargs: Any) -> Any:
                if name not in tried:
                    tried.append(name)
                    await asyncio.sleep(0.6)  # a request that took its time, then no answer
                    raise TimeoutError(f"{name}: no answer")
                return await call(*args, **kwargs)

            return once_slow

        kv.get = slow_first("read", kv.get)  # type: ignore[method-assign]
        kv.update = slow_first("write", kv.update)  # type: ignore[method-assign]
        with pytest.raises(NatsUnavailable, match="NATS did not answer within 1s: changing schedule slow failed"):
            await client.schedule_pause("slow")
        assert tried == ["read", "write"]
    finally:
        await nc.close()
