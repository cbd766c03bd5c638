"""Schedules (actors/client/schedules.py, the starter's fires): a cron every second keeps
firing through a restart of every role and starts exactly one execution per fire
time; pause, resume and delete through the CLI; bad input refused in one line."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from actors.engine.fires import fire_start
from actors.wire.events import ExecState
from streams.layout import SCHEDULE_STREAM
from streams.subjects import schedule_definition_subject, schedule_fire_subject
from tests.conftest import System, wait_for
from tests.support.cli import cli
from tests.support.natsio import stored_starts

pytestmark = [pytest.mark.timeout(120)]

TICK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: tick, path: lib/tick}
workflow:
  - step: work
    tool: {kind: noop}
    args: {n: "{{ workload.n }}"}
"""
ALL_ROLES = ("engine", "counter", "tools", "projector")


async def per_subject(system: System, stream: str, subjects: str) -> dict[str, int]:
    info = await system.nc.jsm().stream_info(stream, subjects_filter=subjects)
    return dict(info.state.subjects or {})


async def fired(system: System, name: str) -> list[str]:
    """The execution id of every fire of `name` the stream holds, in order."""
    subject = schedule_fire_subject(name)
    count = (await per_subject(system, SCHEDULE_STREAM, subject)).get(subject, 0)
    sub = await system.nc.jetstream().subscribe(subject, ordered_consumer=True)
    try:
        return [fire_start(await sub.next_msg(timeout=5))[0] for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def start_records(system: System, prefix: str) -> Counter[str]:
    """How many starts (a start record, or semantics 6 the start stored with its first
    decision) each execution whose id starts with `prefix` has."""
    return await stored_starts(system.nc, prefix)


async def completed(system: System, eids: list[str]) -> bool:
    for eid in eids:
        st = await system.client.status(eid)
        if st is None or st.state != ExecState.COMPLETED:
            return False
    return True


async def register(system: System) -> str:
    path = system.tmp / "tick.yaml"
    path.write_text(TICK)
    return (await system.client.register(path)).path


@pytest.mark.asyncio
async def test_cron_every_second_survives_a_restart_of_every_role_one_execution_per_fire(system: System) -> None:
    playbook = await register(system)
    await system.client.schedule_add("tick", playbook=playbook, cron="* * * * * *", payload={"n": 7})

    async def fires_done(n: int) -> list[str] | None:
        eids = await fired(system, "tick")
        return eids if len(eids) >= n and await completed(system, eids) else None

    before = await wait_for(lambda: fires_done(2), timeout=30)
    await system.restart_roles(ALL_ROLES)
    after = await wait_for(lambda: fires_done(len(before) + 3), timeout=30)
    assert await system.client.schedule_pause("tick")
    final = await fired(system, "tick")
    await wait_for(lambda: completed(system, final), timeout=30)

    # one fire per second, each named by its own fire time: no two fires share an id
    assert len(set(final)) == len(final), final
    assert set(after) <= set(final)
    # every fire started exactly one execution, and nothing else started one
    records = await start_records(system, "tick-")
    assert set(records) == set(final)
    assert all(n == 1 for n in records.values()), records
    st = await system.client.status(final[-1])
    assert st is not None and st.state == ExecState.COMPLETED


@pytest.mark.asyncio
async def test_a_fire_delivered_again_starts_nothing_new(system: System) -> None:
    """The starter derives the id from the fire itself: handling the same fire message
    twice (a redelivery after a crash before its ack) finds the execution started."""
    playbook = await register(system)
    await system.client.schedule_add("again", playbook=playbook, cron="* * * * * *", payload={"n": 1})
    first = await wait_for(lambda: fired(system, "again"), timeout=30)
    await system.client.schedule_delete("again")
    await system.client.wait(first[0], timeout=20)
    sub = await system.nc.jetstream().subscribe(schedule_fire_subject("again"), ordered_consumer=True)
    msg = await sub.next_msg(timeout=5)
    await sub.unsubscribe()
    # fires expire with the logs they start (Nats-Schedule-TTL on the definition)
    assert (msg.headers or {}).get("Nats-TTL") == f"{int(system.layout.fire_ttl)}s"
    starter = next(a for a in system.runtime.actors if type(a).__name__ == "Starter")
    await starter.handle_fire(msg)  # type: ignore[attr-defined]
    records = await start_records(system, "again-")
    assert records[first[0]] == 1


async def definition(system: System, name: str) -> bool:
    try:
        await system.nc.jsm().get_last_msg(SCHEDULE_STREAM, schedule_definition_subject(name), direct=True)
        return True
    except NotFoundError:
        return False


@pytest.mark.asyncio
async def test_cli_add_list_pause_resume_delete(system: System, tmp_path: Path) -> None:
    env = {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}
    playbook = await register(system)
    code, out, err, _ = await cli(
        "schedule", "add", "nightly", "--playbook", playbook, "--cron", "* * * * * *", "--payload", '{"n": 3}', env=env
    )
    assert code == 0, err
    first = await wait_for(lambda: fired(system, "nightly"), timeout=30)
    assert (await system.client.wait(first[0], timeout=20)).state == ExecState.COMPLETED

    code, out, err, _ = await cli("schedule", "list", env=env)
    assert code == 0 and "nightly" in out and "active" in out and "lib/tick" in out, err

    code, out, err, _ = await cli("schedule", "pause", "nightly", env=env)
    assert code == 0 and "paused" in out, err
    assert not await definition(system, "nightly")  # the server has nothing left to fire
    code, out, _, _ = await cli("schedule", "list", "--json", env=env)
    assert '"paused":true' in out.replace(" ", "")
    # absence of fires has no event to await: one second's tick and a half of slack
    count = len(await fired(system, "nightly"))
    await asyncio.sleep(2.5)
    assert len(await fired(system, "nightly")) == count

    code, out, err, _ = await cli("schedule", "resume", "nightly", env=env)
    assert code == 0 and "resumed" in out, err
    await wait_for(lambda: _more(system, "nightly", count), timeout=30)

    code, out, err, _ = await cli("schedule", "delete", "nightly", env=env)
    assert code == 0, err
    assert not await definition(system, "nightly")
    code, out, _, _ = await cli("schedule", "list", env=env)
    assert "nightly" not in out
    code, _, err, _ = await cli("schedule", "pause", "nightly", env=env)
    assert code == 3 and err.strip() == "actors-cli: no schedule nightly"


async def _more(system: System, name: str, count: int) -> bool:
    return len(await fired(system, name)) > count


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cron", "61 * * * *"], "invalid cron '0 61 * * * *'"),
        (["--cron", "every day"], "invalid cron 'every day': expected 5 fields"),
        (["--cron", "0 0 * * *", "--timezone", "Mars/Olympus"], "invalid time zone 'Mars/Olympus'"),
        (["--cron", "0 0 * * *", "--payload", "[1]"], "--payload: must be a JSON object"),
        (["--cron", "0 0 * * *", "--payload", "@BIG"], "schedule bad's payload is"),
    ],
)
async def test_cli_bad_input_is_one_line_exit_3_and_leaves_nothing(system: System, args: list[str], says: str) -> None:
    env = {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}
    playbook = await register(system)
    big = system.tmp / "big.json"
    big.write_text('{"x": "' + "y" * 1_100_000 + '"}')  # over the 1 MiB message limit
    args = [f"@{big}" if a == "@BIG" else a for a in args]
    code, _, err, _ = await cli("schedule", "add", "bad", "--playbook", playbook, *args, env=env)
    assert code == 3, err
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert await system.client.schedules() == []
    assert not await definition(system, "bad")


@pytest.mark.asyncio
async def test_cli_unknown_playbook_bad_name_and_duplicate(system: System) -> None:
    env = {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}
    code, _, err, _ = await cli("schedule", "add", "s1", "--playbook", "lib/nope", "--cron", "@hourly", env=env)
    assert code == 3 and err.strip() == "actors-cli: playbook 'lib/nope' is not registered", err
    code, _, err, _ = await cli("schedule", "add", "a.b", "--playbook", "lib/nope", "--cron", "@hourly", env=env)
    assert code == 3 and "invalid schedule name 'a.b'" in err and len(err.strip().splitlines()) == 1
    playbook = await register(system)
    code, _, err, _ = await cli("schedule", "add", "s1", "--playbook", playbook, "--cron", "@hourly", env=env)
    assert code == 0, err
    code, _, err, _ = await cli("schedule", "add", "s1", "--playbook", playbook, "--cron", "@daily", env=env)
    assert code == 3 and err.strip() == "actors-cli: schedule s1 already exists (delete it first)"
    views = await system.client.schedules()
    assert [(v.spec.name, v.spec.cron) for v in views] == [("s1", "@hourly")]


@pytest.mark.asyncio
async def test_ticks_missed_while_nats_was_down_are_not_run_one_by_one(tmp_path: Path) -> None:
    """The documented policy for an outage of NATS itself: nothing fires while it is
    down, the ticks it missed are not fired one by one when it is back (at most one
    fire a second), and the schedule goes on, each fire starting one execution."""
    from actors.client import Client
    from actors.pod.roles import connect, start_roles
    from streams.server import NatsServer
    from tests.conftest import make_layout

    layout, store = make_layout(), tmp_path / "store"
    server = await NatsServer.start(store_dir=store)
    nc = await connect(server.url, name="test")
    runtime = await start_roles(nc, layout=layout)
    system = System(server, nc, Client(nc, layout=layout), runtime, layout, tmp_path)
    try:
        playbook = await register(system)
        await system.client.schedule_add("outage", playbook=playbook, cron="* * * * * *", payload={"n": 2})
        await wait_for(lambda: fired(system, "outage"), timeout=30)
    finally:
        await runtime.stop()
        await nc.close()
        await server.stop()
    down = time.time()
    await asyncio.sleep(4)  # the outage: four ticks no server is there to fire
    server = await NatsServer.start(store_dir=store)
    up = time.time()
    nc = await connect(server.url, name="test")
    runtime = await start_roles(nc, layout=layout)
    system = System(server, nc, Client(nc, layout=layout), runtime, layout, tmp_path)
    try:
        await wait_for(lambda: _fired_since(system, "outage", up + 2), timeout=30)
        await system.client.schedule_pause("outage")
        eids = await fired(system, "outage")  # every fire message, duplicates kept
        stamps = [_stamp(e) for e in eids]
        assert len(set(eids)) == len(eids), eids  # no burst of missed ticks at restart
        assert not [t for t in stamps if down + 1 < t < up - 1], (down, up, stamps)  # no fire without a server
        assert [t for t in stamps if t >= up - 1], stamps  # and it goes on
        await wait_for(lambda: completed(system, eids), timeout=30)
        records = await start_records(system, "outage-")
        assert set(records) == set(eids) and all(n == 1 for n in records.values()), records
    finally:
        await runtime.stop()
        await nc.close()
        await server.stop()
        shutil.rmtree(store, ignore_errors=True)


async def _fired_since(system: System, name: str, since: float) -> bool:
    return any(_stamp(e) >= since - 1 for e in await fired(system, name))


def _stamp(eid: str) -> float:
    when = datetime.datetime.strptime(eid.rsplit("-", 1)[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    return when.timestamp()


def test_a_fire_is_named_by_its_own_tick_even_when_stored_late() -> None:
    """Pure: the tick a fire stands for, from its stored time and the next tick it
    announces (what a redelivery carries unchanged)."""
    from actors.engine.fires import fire_time

    tick = datetime.datetime(2026, 11, 23, 23, 0, 5, tzinfo=datetime.UTC).timestamp()
    assert fire_time(tick + 0.001, "2026-11-23T23:00:06Z") == tick  # on time
    assert fire_time(tick + 1.2, "2026-11-23T23:00:06Z") == tick  # stored late: still its own tick
    assert fire_time(tick + 1.3, "2026-11-23T23:00:07Z") == tick + 1  # the next tick's fire
    assert fire_time(tick + 0.35, "2026-11-24T00:00:06+01:00") == tick  # a time zone's offset
    assert fire_time(tick + 2.0, "2026-11-23T23:05:00Z") == tick + 2  # a sparse cron, stored late
    assert fire_time(tick + 0.5, None) == tick


@pytest.mark.asyncio
async def test_cli_schedule_gives_up_on_nats_in_one_line() -> None:
    """Unreachable: exit 5 after --timeout; credentials refused: exit 5 at once."""
    from streams.server import NatsServer, free_port

    code, _, err, _ = await cli(
        "schedule", "list", "--timeout", "2", env={"NATS_URL": f"nats://127.0.0.1:{free_port()}"}
    )
    assert code == 5 and len(err.strip().splitlines()) == 1 and "cannot reach NATS" in err, err
    async with await NatsServer.start(auth=("ops", "right")) as server:
        url = server.url.replace("ops:right@", "ops:wrong@")
        code, out, err, _ = await cli("schedule", "pause", "x", env={"NATS_URL": url})
        assert code == 5 and "refused the credentials" in err and "wrong" not in err + out, err
