"""Schedules, hooks and triggers are added and changed through a restart of NATS, as
starts are (tests/system/test_ride_out.py): a call made while the server is away keeps
trying within the client's timeout, and its write is made once, even when its reply is
lost on the way (actors/natsio/kvonce.py; tests/integration/test_kvonce.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from actors.client import Client
from actors.pod.roles import connect, start_roles
from streams.server import NatsServer
from tests.conftest import make_layout

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: admin_ridden}
workflow:
  - step: only
    tool: noop
"""


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
    pods = await connect(server.url, name="pods")
    runtime = await start_roles(pods, layout=layout, roles=("engine",))  # declares the streams and buckets
    client = await Client.connect(server.url, layout=layout, timeout=60)
    said.addHandler(retried)
    said.setLevel(logging.INFO)  # ride_out says at INFO that it asks again
    try:
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
        await asyncio.wait([calls, asyncio.ensure_future(retried.seen.wait())], return_when=asyncio.FIRST_COMPLETED)
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
    finally:
        said.removeHandler(retried)
        said.setLevel(level)
        await client.close()
        await runtime.stop()
        await pods.close()
        await server.discard()
