"""The Python client as docs/client.md shows it: `Client.connect(url)` as an async
context manager (credentials in the URL), each documented call, and
examples/client_example.py run as a user runs it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.natsio.dial import NatsUnavailable
from actors.pod.roles import connect, start_roles
from actors.wire.events import TERMINAL_EVENTS
from streams.layout import EXEC_STREAM, ensure
from streams.server import NatsServer, free_port
from tests.conftest import System, make_layout, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]

SLOW = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""


async def test_connect_as_a_context_manager_register_start_wait_events_result_cancel(system: System) -> None:
    async with Client.connect(system.server.url, layout=system.layout) as client:
        entry = await client.register(ROOT / "examples" / "hello.yaml")
        eid = await client.start(entry.path, payload={"name": "api"})
        status = await client.wait(eid, timeout=30)
        assert status.state == "COMPLETED"
        log = await client.events(eid)
        terminal = next(i for i in reversed(log) if i.type in TERMINAL_EVENTS)
        assert (await client.result(terminal))["shout"] == "HELLO, API!"

        slow = system.tmp / "slow.yaml"
        slow.write_text(SLOW)
        eid = await client.start((await client.register(slow)).path)
        assert await client.exists(eid) is True  # its start record is in its log: a cancel comes after it
        await client.cancel(eid, reason="enough")
        assert (await client.wait(eid, timeout=30)).state == "CANCELLED"
    assert client.nc.is_closed  # the context manager closed the connection it made


async def test_run_starts_and_waits_and_a_timeout_leaves_the_execution_running(system: System) -> None:
    client = Client(system.nc, layout=system.layout)
    entry = await client.register(ROOT / "examples" / "hello.yaml")
    eid, status = await client.run(entry.path, payload={"name": "run"}, timeout=30)
    subscriptions = len(system.nc._subs)  # the connection's own inboxes are made by now
    assert status.state == "COMPLETED" and status.execution_id == eid
    assert (await client.result(eid))["shout"] == "HELLO, RUN!"
    slow = system.tmp / "slow.yaml"
    slow.write_text(SLOW)
    with pytest.raises(TimeoutError):
        await client.run((await client.register(slow)).path, timeout=0.5)
    assert len(system.nc._subs) == subscriptions  # no status watch left behind

    async def listed_running() -> Any:
        # the start was answered; the projector lists it once it has folded its start
        found = [s for s in await client.list(playbook="slow") if s.state == "RUNNING"]
        return found[0] if len(found) == 1 else None

    running = await wait_for(listed_running, timeout=20)
    await client.cancel(running.execution_id, reason="enough")
    assert (await client.wait(running.execution_id, timeout=30)).state == "CANCELLED"


async def test_a_cancel_sent_while_the_start_is_still_queued_ends_the_execution_as_it_starts(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout)
        slow = tmp_path / "slow.yaml"
        slow.write_text(SLOW)
        eid = await client.start((await client.register(slow)).path)  # no starter yet: queued in START
        assert await client.exists(eid, timeout=0.5) is None  # queued: it cannot be told yet
        await client.cancel(eid, reason="not any more")
        runtime = await start_roles(nc, layout=layout)
        try:
            status = await client.wait(eid, timeout=20)
        finally:
            await runtime.stop()
        assert status.state == "CANCELLED"
        log = await client.events(eid)
        assert not [i for i in log if i.type in ("step.enter", "command.issued")], log  # nothing ran
        (cancelled,) = [i for i in log if i.type == "execution.cancelled"]
        assert cancelled.data["reason"] == "not any more"
    finally:
        await nc.close()


async def test_events_read_while_a_message_of_the_log_goes_ends_at_once(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message of the log deleted (or expired) between the read's count and the read
    itself: `events` returns what is there, without waiting for the message that went
    (it used to wait out a 10 s read timeout, then read everything again)."""
    from nats.js.manager import JetStreamManager

    async with Client.connect(system.server.url, layout=system.layout) as client:
        entry = await client.register(ROOT / "examples" / "hello.yaml")
        eid, status = await client.run(entry.path, payload={"name": "gone"}, timeout=30)
        assert status.state == "COMPLETED"
        whole = await client.events(eid)
        log = system.layout.execution(eid).log
        subjects = system.layout.execution(eid)
        try:
            last = await client.js.get_last_msg(EXEC_STREAM, subjects.lifecycle("playbook.completed"))
        except NotFoundError:  # semantics 5: the end is in the last step's answer record
            last = await client.js.get_last_msg(EXEC_STREAM, subjects.answer_lifecycle("playbook.completed"))
        counted = JetStreamManager.stream_info
        deleted: list[int] = []

        async def count_then_delete(self: JetStreamManager, name: str, subjects_filter: str | None = None) -> object:
            info = await counted(self, name, subjects_filter=subjects_filter)
            if subjects_filter == log and not deleted:  # the race: the count is made, then the message goes
                await counted_js.delete_msg(EXEC_STREAM, last.seq)
                deleted.append(last.seq)
            return info

        counted_js = system.nc.jsm()
        monkeypatch.setattr(JetStreamManager, "stream_info", count_then_delete)
        items = await asyncio.wait_for(client.events(eid), 8)  # not the 10 s read timeout
        assert deleted == [last.seq]
        # the message held the end and the decision it carries (semantics 2; and from 5 the
        # last step's result): its items go, no others
        assert items == [i for i in whole if i.seq != last.seq] and len(items) < len(whole)


async def test_await_connect_and_close_leave_a_given_connection_open(system: System) -> None:
    client = await Client.connect(system.server.url, layout=system.layout)
    assert await client.status("never-started") is None
    await client.close()
    assert client.nc.is_closed
    mine = Client(system.nc, layout=system.layout)  # a connection of the caller's
    await mine.close()
    assert not system.nc.is_closed


async def test_connect_with_credentials_in_the_url_and_a_refused_password_fails_at_once(tmp_path: Path) -> None:
    server = await NatsServer.start(auth=("ops", "s3cret"))
    try:
        assert "ops:s3cret@" in server.url
        async with Client.connect(server.url) as client:
            assert await client.status("nothing") is None
        wrong = server.url.replace("s3cret", "wrong")
        with pytest.raises(NatsUnavailable, match="refused the credentials") as e:
            await Client.connect(wrong, timeout=20)
        assert "wrong" not in str(e.value)  # the password is never printed
    finally:
        await server.discard()


async def test_connect_to_nothing_gives_up_within_its_timeout() -> None:
    with pytest.raises(NatsUnavailable, match="cannot reach NATS"):
        async with Client.connect(f"nats://127.0.0.1:{free_port()}", timeout=1):
            pass


async def run_example(env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "examples/client_example.py",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 80)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_client_example_runs_embedded() -> None:
    code, out, err = await run_example({"NATS_URL": ""})
    assert code == 0, err
    assert "COMPLETED" in out and "HELLO, CLIENT!" in out


async def test_the_client_example_runs_against_a_running_system(system: System) -> None:
    env = {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions), "ACTORS_ACK_WAIT": "2"}
    code, out, err = await run_example(env)
    assert code == 0, err
    assert "COMPLETED" in out and "HELLO, CLIENT!" in out
