"""Clients ride out the loss of a NATS node (issue 16): starts through `actors-cli
start` and through `Client` go on while stream leaders are killed, and none is lost
or run twice; the commands and `serve` connect with a node of the listed cluster down;
when the cluster cannot take a start within --timeout the CLI says so in one line
(exit 5)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from actors import cli
from actors.client import Client
from actors.config.settings import Settings
from actors.natsio.dial import NatsUnavailable
from actors.playbook.loader import load_playbook_file
from actors.pod.roles import connect, serve, start_roles
from actors.wire.events import TERMINAL_EVENTS
from streams.layout import EXEC_STREAM, START_STREAM, ensure
from streams.server import NatsCluster
from tests.conftest import wait_for
from tests.support.cluster import leader_of

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(150)]

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: ridden}
workflow:
  - step: only
    tool: noop
"""
STARTS = 100  # through the CLI, and as many through the client
CLI_AT_ONCE = 4  # CLI calls in flight (each a thread with its own event loop and connection)
CLIENT_AT_ONCE = 8


@pytest_asyncio.fixture
async def cluster(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NatsCluster]:
    # the CLI reads its layout from the environment: the same one the actors here use
    for name, value in (("ACTORS_PARTITIONS", "4"), ("ACTORS_REPLICAS", "3"), ("ACTORS_ACK_WAIT", "3")):
        monkeypatch.setenv(name, value)
    c = await NatsCluster.start(3)
    try:
        yield c
    finally:
        await c.discard()


async def run_cli(*args: str) -> int:
    """`actors-cli ARGS` in-process (`cli.main`, in a thread: it runs its own event loop)."""
    return await asyncio.to_thread(cli.main, list(args))


async def caught_up(nc: NATS, *streams: str) -> None:
    """Every replica of each stream is back and current (a restarted node has caught up),
    so killing another node leaves a quorum."""

    async def current() -> bool:
        for stream in streams:
            try:
                info = await nc.jsm().stream_info(stream)
            except Exception:
                return False
            replicas = info.cluster.replicas if info.cluster is not None else None
            if info.cluster is None or not info.cluster.leader or not replicas or len(replicas) != 2:
                return False
            if not all(r.current and not r.offline for r in replicas):
                return False
        return True

    await wait_for(current, timeout=60, interval=0.2)


async def test_starts_through_cli_and_client_survive_killing_the_start_and_exec_leaders(
    cluster: NatsCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """100 `actors-cli start` and 100 `Client.start` calls, 4 and 8 at a time; a third
    of the way in the node leading START is killed (SIGKILL), two thirds in, once it is
    back and caught up, the node leading EXEC. Every start returns (the CLI exits 0),
    and all 200 executions exist and complete, each with one terminal event. During
    the second election `status`, `events` and `cancel` of a finished execution answer
    too (exit 0).

    The CLI runs in-process (`cli.main` in a thread, its own event loop and its own
    NATS connection per call, as a process would have): argument parsing, the bounded
    connect, `ensure`, `Client.start_execution` and the mapping of errors to exit codes
    are the code a user's `actors-cli start` runs; only Python's start-up (about 1 s of
    CPU per process, 100 s in all on this 2-core machine) is left out."""
    layout = Settings.from_env().layout
    nc = await connect(cluster.url, name="ride-actors")
    runtime = await start_roles(nc, layout=layout)
    cnc = await connect(cluster.url, name="ride-client")
    try:
        client = Client(cnc, layout=layout)
        pb = tmp_path / "ridden.yaml"
        pb.write_text(PLAYBOOK)
        path = (await client.register(pb)).path
        cli_ids = [f"cli-{i:03d}" for i in range(STARTS)]
        py_ids = [f"py-{i:03d}" for i in range(STARTS)]
        done, codes = 0, {}
        took: dict[str, float] = {}  # seconds each start took
        third, two_thirds = asyncio.Event(), asyncio.Event()
        gate = asyncio.Event()  # cleared while a killed node comes back: the kills must meet starts
        gate.set()

        def progressed() -> None:
            nonlocal done
            done += 1
            if done == 2 * STARTS // 3:
                third.set()
            if done == 4 * STARTS // 3:
                two_thirds.set()

        # client starts take a few ms, CLI ones far longer: the client's would all be done
        # before the first kill. One start of each kind waits for a kill and is sent
        # then, so an election surely meets both kinds: the CLI's (which publishes to
        # START) waits for START's leader to die; the client's (a start request: the
        # starter writes the record into EXEC) for EXEC's, where its request finds no
        # answer in time (or no starter: the pod lost its node) and the start goes to
        # START instead.
        start_killed, exec_killed = asyncio.Event(), asyncio.Event()
        waits_for = {cli_ids[-2]: start_killed, py_ids[-2]: exec_killed}

        async def worker(ids: list[str], start: Callable[[str], Awaitable[None]]) -> None:
            while ids:
                await gate.wait()
                if not ids:  # another worker took the last one while this one waited at the gate
                    return
                eid = ids.pop(0)
                if eid in waits_for:
                    await waits_for[eid].wait()
                began = time.monotonic()
                await start(eid)
                took[eid] = time.monotonic() - began
                progressed()

        async def through_cli(eid: str) -> None:
            codes[eid] = await run_cli("start", path, "--execution-id", eid, "--nats", cluster.url)

        async def through_client(eid: str) -> None:
            assert await client.start(path, execution_id=eid) == eid

        async def chaos() -> dict[str, int]:
            await third.wait()
            victim = await leader_of(nc, START_STREAM)
            cluster.kill(victim)
            start_killed.set()
            seen = done

            async def moving_again() -> bool:  # START has a leader again: starts are taken
                return done >= seen + 20

            await wait_for(moving_again, timeout=60, interval=0.1)
            gate.clear()
            await cluster.restart(victim)
            await caught_up(nc, START_STREAM, EXEC_STREAM)
            gate.set()
            await two_thirds.wait()
            exec_victim = await leader_of(nc, EXEC_STREAM)
            cluster.kill(exec_victim)
            exec_killed.set()
            # reads meet the election too: a finished execution looked at while EXEC elects
            answers = dict(
                zip(
                    ("status", "events", "cancel"),
                    await asyncio.gather(
                        run_cli("status", py_ids[0], "--nats", cluster.url),
                        run_cli("events", py_ids[0], "--nats", cluster.url),
                        run_cli("cancel", py_ids[0], "--nats", cluster.url),
                    ),
                    strict=True,
                )
            )
            await cluster.restart(exec_victim)
            return answers

        chaos_task = asyncio.create_task(chaos())
        pending_cli, pending_py = list(cli_ids), list(py_ids)
        # the first client start goes alone, so it has finished long before EXEC's leader dies
        await through_client(pending_py.pop(0))
        progressed()
        await client.wait(py_ids[0], timeout=30)
        await asyncio.gather(
            *(worker(pending_cli, through_cli) for _ in range(CLI_AT_ONCE)),
            *(worker(pending_py, through_client) for _ in range(CLIENT_AT_ONCE)),
        )
        answers = await asyncio.wait_for(chaos_task, 90)
        assert codes == dict.fromkeys(cli_ids, cli.EXIT_OK)
        # the kills met starts of both kinds: a CLI start waited out START's election (4-10 s);
        # a client start was sent once EXEC's leader was dead (`waits_for`): its request met
        # the election, or no starter (the pod's node died) and went to START instead
        assert max(took[e] for e in cli_ids) > 3, took
        assert answers == {"status": cli.EXIT_OK, "events": cli.EXIT_OK, "cancel": cli.EXIT_OK}
        assert "Traceback" not in capsys.readouterr().err

        statuses = await asyncio.gather(*(client.wait(eid, timeout=60) for eid in cli_ids + py_ids))
        assert [s.state for s in statuses] == ["COMPLETED"] * (2 * STARTS)
        for eid in cli_ids + py_ids:
            terminal = [i for i in await client.events(eid) if i.cls == "lc" and i.type in TERMINAL_EVENTS]
            assert [t.type for t in terminal] == ["playbook.completed"], eid
    finally:
        await cnc.close()
        await runtime.stop()
        await nc.close()


async def test_serve_and_every_command_connect_with_a_node_of_the_cluster_down(
    cluster: NatsCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With one of the three listed nodes dead, a pod (`serve`) starts and runs
    executions, and `register`, `start`, `status --watch`, `events` and `cancel` all
    answer (exit 0): a node that refuses is skipped for the next one in the URL."""
    nc = await connect(cluster.url, name="ride-setup")
    await ensure(nc.jetstream(), Settings.from_env().layout)  # R3 streams need all three nodes to be created
    await nc.close()
    cluster.kill(0)
    stop = asyncio.Event()
    pod = asyncio.create_task(serve(Settings.from_env().with_flags(nats_url=cluster.url, http_port=0), stop=stop))
    try:
        pb = tmp_path / "ridden.yaml"
        pb.write_text(PLAYBOOK)
        path = load_playbook_file(str(pb)).metadata.catalog_path
        url = ("--nats", cluster.url)
        assert await run_cli("register", str(pb), *url) == cli.EXIT_OK
        assert await run_cli("start", path, "--execution-id", "node-down", *url) == cli.EXIT_OK
        assert await run_cli("status", "node-down", "--watch", "--timeout", "60", *url) == cli.EXIT_OK  # COMPLETED
        assert await run_cli("events", "node-down", *url) == cli.EXIT_OK
        assert await run_cli("cancel", "node-down", *url) == cli.EXIT_OK  # already finished: nothing to do
        assert "Traceback" not in capsys.readouterr().err
    finally:
        stop.set()
        assert await asyncio.wait_for(pod, 60) is True  # drained cleanly


async def test_a_start_the_cluster_cannot_take_in_time_fails_in_one_line_naming_it(
    cluster: NatsCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two of three nodes dead: no stream can elect a leader. `actors-cli start` keeps
    trying for its --timeout, then exits 5 with one line; `Client.start` raises
    NatsUnavailable naming the execution, so the caller can send it again (same id)."""
    nc = await connect(cluster.url, name="ride-setup")
    layout = Settings.from_env().layout
    await ensure(nc.jetstream(), layout)
    await nc.close()
    cluster.kill(1)
    cluster.kill(2)
    nc = await connect(cluster.urls[0], name="ride-survivor")
    try:
        began = time.monotonic()
        code = await run_cli(
            "start", "ridden", "--execution-id", "no-quorum", "--timeout", "3", "--nats", cluster.urls[0]
        )
        took = time.monotonic() - began
        err = capsys.readouterr().err
        assert code == cli.EXIT_NATS and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert took >= 3, took  # tried for its timeout, then gave up (it returned)
        client = Client(nc, layout=layout, timeout=2)
        began = time.monotonic()
        with pytest.raises(NatsUnavailable, match="did not confirm the start of execution no-quorum"):
            await client.start("ridden", execution_id="no-quorum")
        assert time.monotonic() - began >= 2  # tried for its timeout, then gave up (it raised)
    finally:
        await nc.close()
