"""The CLI meets user errors and NATS trouble with one line and an exit code, and
leaves nothing behind: no stray input in a log, no orphan nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

import pytest

from actors.client import Client
from actors.natsio.dial import CLIENT_TIMEOUT
from actors.store.blobs import ValueTooLarge
from streams.layout import EXEC_STREAM, START_STREAM, ensure
from streams.server import NatsServer, free_port
from streams.subjects import status_subject
from tests.conftest import System, make_layout
from tests.support.cli import CLI, EXIT_INVALID, EXIT_NATS, EXIT_TIMEOUT, ROOT, cli, one_line

pytestmark = [pytest.mark.timeout(60)]
SLOW = """apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 30}
"""


async def log_size(system: System, execution_id: str) -> int:
    """Messages stored under the execution's subjects."""
    info = await system.nc.jsm().stream_info(EXEC_STREAM, subjects_filter=f"exec.*.{execution_id}.>")
    return sum((info.state.subjects or {}).values())


# --- item 8: user errors -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_wildcards_and_dots_in_an_execution_id_are_refused_and_address_nothing(system: System) -> None:
    _, status = await system.run_yaml(SLOW.replace("seconds: 30", "seconds: 0"))
    assert status.state == "COMPLETED"  # a log `events '*'` used to print
    url = system.server.url
    for args in (
        ("status", "*"),
        ("status", "a.b"),
        ("status", "a\n"),
        ("status", "*", "--watch"),
        ("events", "*"),
        ("events", ">"),
        ("cancel", "*"),
        ("start", "examples/hello", "--execution-id", "a.b"),
        ("run", "examples/hello.yaml", "--nats", url, "--execution-id", "bad id"),
    ):
        code, out, err, _ = await cli(*args, url=url)
        assert code == EXIT_INVALID, (args, code, err)
        assert "is not valid" in one_line(err) and out == "", args
    assert await log_size(system, "a") == 0  # nothing started, nothing cancelled
    info = await system.nc.jsm().stream_info(START_STREAM)
    assert info.state.messages == 0


@pytest.mark.asyncio
async def test_cancel_of_an_unknown_execution_says_so_and_writes_nothing(system: System) -> None:
    code, out, err, _ = await cli("cancel", "no-such-run", url=system.server.url)
    assert code == EXIT_INVALID
    assert "no execution 'no-such-run'" in one_line(err) and "cancel requested" not in out
    assert await log_size(system, "no-such-run") == 0
    # an execution that does exist is still cancelled
    eid = await system.start_yaml(SLOW)
    code, out, err, _ = await cli("cancel", eid, url=system.server.url)
    assert code == 0 and "cancel requested" in out, err
    assert (await system.client.wait(eid, timeout=20)).state == "CANCELLED"


@pytest.mark.asyncio
async def test_cancel_waits_for_a_start_still_queued_and_says_when_it_cannot_tell(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A start message not yet turned into a record (no engine running yet) is neither
    cancelled blindly nor called unknown."""
    from actors.client import Client
    from actors.pod.roles import connect, start_roles

    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout)
        (tmp_path / "slow.yaml").write_text(SLOW)
        entry = await client.register(tmp_path / "slow.yaml")
        eid = await client.start(entry.path, execution_id="queued-1")
        code, _, err, _ = await cli("cancel", eid, "--timeout", "1", url=nats_server.url)
        assert code == EXIT_TIMEOUT and "cannot tell yet" in one_line(err)
        cancelling = asyncio.create_task(cli("cancel", eid, "--timeout", "30", url=nats_server.url))
        runtime = await start_roles(nc, layout=layout)  # the engine comes: the start is handled
        try:
            code, out, err, _ = await cancelling
            assert code == 0 and "cancel requested" in out, err
            assert (await client.wait(eid, timeout=20)).state == "CANCELLED"
        finally:
            await runtime.stop()
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_a_payload_over_the_cap_or_a_playbook_over_the_message_limit_is_refused_naming_it(
    system: System, tmp_path: Path
) -> None:
    """A payload over the message limit travels as a blob (tests/system/test_big_values.py);
    one over the cap on values (ACTORS_MAX_VALUE_BYTES), and a playbook over the
    message limit, are refused with one line before anything is sent."""
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"name": "x" * 1_200_000}))
    url = system.server.url
    code, _, err, _ = await cli("register", "examples/hello.yaml", url=url)
    assert code == 0, err
    cap = {"ACTORS_MAX_VALUE_BYTES": "1000000"}
    code, _, err, _ = await cli("start", "examples/hello", "--payload", f"@{big}", url=url, env=cap)
    line = one_line(err)
    assert code == EXIT_INVALID and "payload is 1,200,0" in line and "1,000,000-byte cap" in line
    code, _, err, _ = await cli("run", "examples/hello.yaml", "--nats", url, "--payload", f"@{big}", url=url, env=cap)
    assert code == EXIT_INVALID and "payload is 1,200,0" in one_line(err)
    huge = tmp_path / "huge.yaml"
    huge.write_text((ROOT / "examples" / "hello.yaml").read_text() + "# " + "x" * 1_200_000 + "\n")
    code, _, err, _ = await cli("register", str(huge), url=url)
    line = one_line(err)
    assert code == EXIT_INVALID and "huge.yaml" in line and "the playbook is 1,201," in line
    assert (await system.nc.jsm().stream_info(START_STREAM)).state.messages == 0  # nothing was sent
    capped = Client(system.nc, layout=make_layout(max_value_bytes=1_000_000))
    with pytest.raises(ValueTooLarge):  # the library refuses it too, before publishing
        await capped.start("examples/hello", payload={"name": "x" * 1_200_000})


@pytest.mark.asyncio
async def test_status_watch_past_its_timeout_exits_4_with_one_line(system: System) -> None:
    eid = await system.start_yaml(SLOW)
    code, _, err, _ = await cli("status", eid, "--watch", "--timeout", "1", url=system.server.url)
    assert code == EXIT_TIMEOUT and "not finished after 1s" in one_line(err)


# --- item 8: NATS unreachable or refusing the credentials ----------------------------------


@pytest.mark.asyncio
async def test_a_watch_whose_server_goes_away_says_so_and_exits_5_not_4(tmp_path: Path) -> None:
    """`status --watch` rides out an outage (the connection reconnects), but says at once
    that it lost NATS, and when its --timeout ends with NATS still gone it exits 5 saying
    the outcome is unknown, not 4 ("not finished")."""
    from actors.natsio import close_connection
    from actors.pod.roles import connect, start_roles

    server = await NatsServer.start()
    nc = await connect(server.url, name="test")
    rt = await start_roles(nc, layout=make_layout())
    watch: asyncio.subprocess.Process | None = None
    try:
        client = Client(nc, layout=make_layout())
        (tmp_path / "slow.yaml").write_text(SLOW)
        entry = await client.register(tmp_path / "slow.yaml")
        statuses = await nc.subscribe(status_subject("*"))  # the bucket's writes, republished
        eid = await client.start(entry.path, version=entry.version)
        if await client.status(eid) is None:
            await statuses.next_msg(timeout=20)  # RUNNING: the CLI prints it once it watches
        watch = await asyncio.create_subprocess_exec(
            *CLI,
            *("status", eid, "--watch", "--timeout", "8"),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "NATS_URL": server.url, "ACTORS_PARTITIONS": str(make_layout().partitions)},
        )
        assert watch.stdout is not None and watch.stderr is not None
        assert (await asyncio.wait_for(watch.stdout.readline(), 20)).strip() == b"RUNNING"  # it watches now
        await server.stop()
        _, err = await asyncio.wait_for(watch.communicate(), 30)
        lines = err.decode().strip().splitlines()
        assert "Traceback" not in err.decode(), err
        assert len(lines) == 2 and "lost the connection to NATS" in lines[0], err
        assert watch.returncode == EXIT_NATS and "NATS is unreachable: its outcome is unknown here" in lines[1], err
    finally:
        if watch is not None and watch.returncode is None:
            watch.kill()
            await watch.wait()
        await rt.stop(drain_timeout=0)
        await close_connection(nc)
        await server.stop()


CLIENT_COMMANDS: list[tuple[str, ...]] = [
    ("register", "examples/hello.yaml"),
    ("start", "examples/hello"),
    ("status", "some-id"),
    ("status", "some-id", "--watch"),
    ("events", "some-id"),
    ("cancel", "some-id"),
    ("retry", "some-id"),
    ("prepare-rollback",),
]


@pytest.mark.asyncio
async def test_every_command_gives_up_on_an_unreachable_server_within_its_timeout() -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nobody listens there
    runs = [cli(*args, "--timeout", "2", url=url) for args in CLIENT_COMMANDS]
    runs.append(cli("run", "examples/hello.yaml", "--nats", url, "--timeout", "2"))
    runs.append(cli("status", "some-id", url=url, timeout=CLIENT_TIMEOUT + 20))  # no --timeout: the default
    results = await asyncio.gather(*runs)
    for (code, _, err, took), bound in zip(results, [2.0] * (len(runs) - 1) + [CLIENT_TIMEOUT], strict=True):
        line = one_line(err)
        assert code == EXIT_NATS and "cannot reach NATS" in line, err
        assert took >= bound, (line, took)  # tried for its timeout, then gave up (and gave up: it exited)


@pytest.mark.asyncio
async def test_every_command_says_at_once_when_the_server_refuses_the_credentials() -> None:
    server = await NatsServer.start(auth=("ops", "right"))
    try:
        url = server.url.replace("ops:right@", "ops:wrong@")
        # no retrying: a wrong password stays wrong. With a timeout of 600 s a command that
        # retried would outlast `cli`'s own 40 s and fail the test; one that gives up answers
        runs = [cli(*args, "--timeout", "600", url=url) for args in CLIENT_COMMANDS]
        runs.append(cli("run", "examples/hello.yaml", "--nats", url, "--timeout", "600"))
        runs.append(cli("status", "some-id", url=server.url.replace("ops:right@", "")))  # no credentials at all
        for code, out, err, _took in await asyncio.gather(*runs):
            line = one_line(err)
            assert code == EXIT_NATS and "refused the credentials" in line, err
            assert "wrong" not in line + out  # never echo a password
        code, out, err, _ = await cli("register", "examples/hello.yaml", url=server.url)  # the right one works
        assert code == 0, err
    finally:
        await server.discard()


# --- item 9: a second start of the same id -------------------------------------------------


@pytest.mark.asyncio
async def test_a_second_start_of_an_id_says_it_exists_and_the_first_start_runs(system: System) -> None:
    url = system.server.url
    code, _, err, _ = await cli("register", "examples/hello.yaml", url=url)
    assert code == 0, err
    code, out, err, _ = await cli(
        "start", "examples/hello", "--execution-id", "twice", "--payload", '{"name": "first"}', "--json", url=url
    )
    assert code == 0 and json.loads(out) == {"execution_id": "twice", "existing": False, "differs": []}
    assert err == ""
    code, out, err, _ = await cli(
        "start", "examples/hello", "--execution-id", "twice", "--payload", '{"name": "second"}', "--json", url=url
    )
    assert code == 0 and json.loads(out) == {"execution_id": "twice", "existing": True, "differs": ["payload"]}
    assert "already exists" in one_line(err) and "payload differs" in err
    code, out, err, _ = await cli(
        "run",
        "examples/hello.yaml",
        "--nats",
        url,
        "--execution-id",
        "twice",
        "--payload",
        '{"name": "third"}',
        "--json",
        url=url,
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and result["existing"] is True and "already exists" in err
    assert result["result"]["shout"] == "HELLO, FIRST!"  # the first start record is what ran
    starts = [i for i in await system.events("twice") if i.type == "execution.start"]
    assert len(starts) == 1 and starts[0].data["payload"] == {"name": "first"}


@pytest.mark.asyncio
async def test_client_start_execution_reports_existing_and_what_differs(system: System) -> None:
    (system.tmp / "slow.yaml").write_text(SLOW)
    path = (await system.client.register(system.tmp / "slow.yaml")).path
    eid = await system.client.start(path, payload={"n": 1}, execution_id="api-twice")
    # at once: its start message may still be queued (the duplicate is then seen by its
    # message id, and its record awaited) or already turned into a record
    other = await system.client.start_execution(path, payload={"n": 2}, execution_id=eid)
    assert other.existing and other.differs == ("payload",)
    assert other.running is not None and other.running.payload == {"n": 1}
    fresh = await system.client.start_execution(path, payload={"n": 1}, execution_id="api-once")
    assert not fresh.existing and fresh.differs == ()
    same = await system.client.start_execution(path, payload={"n": 1}, execution_id=eid)
    assert same.existing and same.differs == () and same.running is not None
    moved = await system.client.start_execution("elsewhere", payload={"n": 1}, execution_id=eid)
    assert moved.existing and moved.differs == ("playbook",)
    assert await system.client.start(path, payload={"n": 3}, execution_id=eid) == eid  # unchanged for old callers


# --- item 10: ports in use, no orphan server -------------------------------------------------


@pytest.mark.asyncio
async def test_serve_on_a_busy_http_port_and_dev_on_a_busy_port_exit_with_one_line(nats_server: NatsServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, _, err, _ = await cli("serve", "--nats", nats_server.url, "--http-host", "127.0.0.1", "--http-port", port)
        line = one_line(err)
        assert code == EXIT_INVALID and port in line and "--http-port" in line
        code, _, err, _ = await cli("dev", "--port", port)
        line = one_line(err)
        assert code == EXIT_NATS and "nats-server could not start" in line and port in line


def children_named(pid: int, name: str) -> list[int]:
    """Pids of the processes `pid` started that run `name`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm_and_rest = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        comm = comm_and_rest[comm_and_rest.index("(") + 1 : comm_and_rest.rindex(")")]
        ppid = int(comm_and_rest[comm_and_rest.rindex(")") + 2 :].split()[1])
        if ppid == pid and comm == name:
            found.append(int(stat.parent.name))
    return found


def store_of(server_pid: int) -> Path:
    """The JetStream store dir a nats-server was started with (`-sd`)."""
    argv = Path(f"/proc/{server_pid}/cmdline").read_bytes().split(b"\0")
    return Path(argv[argv.index(b"-sd") + 1].decode())


async def gone(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to end: its pidfd becomes readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(True)

    loop.add_reader(fd, readable)
    try:
        return await asyncio.wait_for(ended, timeout)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def kill_hard_and_check_its_server_dies(args: list[str], ready: bytes) -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "NATS_URL": ""},
    )
    try:
        assert proc.stdout is not None
        while ready not in (line := await asyncio.wait_for(proc.stdout.readline(), 30)):
            assert line, "the command ended before it was ready"
        servers = children_named(proc.pid, "nats-server")
        assert len(servers) == 1
        store = store_of(servers[0])
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert await gone(servers[0], timeout=10), "nats-server outlived its parent"
        shutil.rmtree(store, ignore_errors=True)  # a parent killed hard cannot remove its temporary store
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.asyncio
async def test_dev_killed_hard_leaves_no_nats_server() -> None:
    await kill_hard_and_check_its_server_dies(["dev", "--port", str(free_port())], b"export NATS_URL=")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.asyncio
async def test_run_without_nats_killed_hard_leaves_no_nats_server(tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text(SLOW)
    await kill_hard_and_check_its_server_dies(["run", str(slow)], b"execution ")
