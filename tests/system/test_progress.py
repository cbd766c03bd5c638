"""`actors-cli status` of a running execution shows the steps running now and a loop's
done/total; `status --watch` prints that progress while it runs, not only the end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import msgspec
import pytest

from actors.cli.exits import EXIT_CANCELLED
from actors.wire.messages import LoopProgress
from streams.layout import progress_subject
from tests.conftest import System

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]

# slow enough to be seen running, cancelled by the test once it has seen it
SLOW_LOOP = """apiVersion: actors/v1
kind: Playbook
metadata: {name: slow_loop}
workflow:
  - step: each
    loop: {collection: "{{ range(1000) | list }}", element: n, mode: async, concurrency: 2}
    tool:
      kind: python
      code: |
        import time
        def main(n):
            time.sleep(0.05)
            return n
    args: {n: "{{ n }}"}
"""


async def _spawn(system: System, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


async def _cli(system: System, *args: str) -> tuple[int, str, str]:
    proc = await _spawn(system, *args)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_status_shows_a_running_loops_progress_and_watch_prints_it_before_the_end(system: System) -> None:
    heard: asyncio.Queue[LoopProgress] = asyncio.Queue()

    async def progress(msg: object) -> None:
        heard.put_nowait(msgspec.json.decode(msg.data, type=LoopProgress))  # type: ignore[attr-defined]

    sub = await system.nc.subscribe(progress_subject("slow-1"), cb=progress)
    pb = system.tmp / "slow.yaml"
    pb.write_text(SLOW_LOOP)
    entry = await system.client.register(pb)
    await system.client.start(entry.path, version=entry.version, execution_id="slow-1")
    first = await asyncio.wait_for(heard.get(), 60)  # the loop is under way
    assert first.total == 1000
    await sub.unsubscribe()

    code, out, err = await _cli(system, "status", "slow-1")
    assert code == 0, err
    assert re.search(r"^state\s+RUNNING$", out, re.M), out
    assert re.search(r"^running\s+each$", out, re.M), out
    [line] = [x for x in out.splitlines() if x.startswith("  each ")]
    done = re.search(r"  ([\d,]+)/1,000 done .* in flight", line)
    assert done is not None and int(done.group(1).replace(",", "")) > 0, line

    code, out, err = await _cli(system, "status", "slow-1", "--json")
    assert code == 0, err
    row = json.loads(out)
    [running] = row["running"]
    assert row["running_steps"] == ["each"] and running["step"] == "each"
    assert running["loop"]["total"] == 1000 and running["loop"]["done"] > 0, row

    watch = await _spawn(system, "status", "slow-1", "--watch")
    assert watch.stdout is not None
    assert (await asyncio.wait_for(watch.stdout.readline(), 60)).decode() == "RUNNING\n"

    async def counted() -> str:  # the loop's counts, once its counter has said them
        while True:
            line = (await watch.stdout.readline()).decode()  # type: ignore[union-attr]
            assert line.startswith("  each "), line
            if not line.startswith("?", line.index(" s  ") + 4):
                return line

    line = await asyncio.wait_for(counted(), 60)
    assert re.search(r"^  each\s+[\d.]+ s  [\d,]+/1,000 done", line), line  # progress, before the end
    await system.client.cancel("slow-1", reason="seen running")
    rest, err_b = await asyncio.wait_for(watch.communicate(), 60)
    assert watch.returncode == EXIT_CANCELLED, err_b
    assert re.search(r"^state\s+CANCELLED$", rest.decode(), re.M), rest


async def test_a_watch_with_no_timeout_gives_up_once_nats_is_gone_for_the_connection_timeout(tmp_path: Path) -> None:
    """`status --watch` with no --timeout waits for the end for ever, not for NATS: gone
    for the connection's timeout (30 s by default, 2 s here), it ends (exit 5)."""
    from actors.cli import progress
    from actors.client import Client
    from actors.errors import Unavailable
    from actors.natsio import close_connection
    from actors.pod.roles import connect, start_roles
    from streams.server import NatsServer
    from tests.conftest import make_layout

    server = await NatsServer.start()
    nc = await connect(server.url, name="test")
    rt = await start_roles(nc, layout=make_layout())
    watcher = await connect(server.url, name="watcher")
    try:
        client = Client(nc, layout=make_layout())
        (tmp_path / "slow.yaml").write_text(SLOW_LOOP)
        entry = await client.register(tmp_path / "slow.yaml")
        eid = await client.start(entry.path, version=entry.version)
        watch = asyncio.ensure_future(
            progress.watch_until_end(Client(watcher, layout=make_layout(), timeout=2.0), eid, None, as_json=True)
        )
        await server.stop()
        with pytest.raises(Unavailable, match="NATS unreachable for 2s while watching it"):
            await asyncio.wait_for(watch, 30)
    finally:
        await rt.stop(drain_timeout=0)
        await close_connection(nc)
        await close_connection(watcher)


SLEEPY = """apiVersion: actors/v1
kind: Playbook
metadata: {name: sleepy}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 600}
"""


async def test_run_with_no_timeout_gives_up_once_nats_is_gone_for_the_connection_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --nats URL` with no --timeout follows its execution for as long as it takes,
    not for ever once NATS is gone: after the connection's timeout (30 s by default, 2 s
    here) it ends with exit 5 and one line (it used to wait on a dead connection)."""
    from actors import cli
    from actors.cli import inputs
    from actors.cli.exits import EXIT_NATS
    from actors.client import Client
    from actors.natsio import close_connection
    from actors.pod.roles import connect, start_roles
    from streams.server import NatsServer
    from tests.conftest import make_layout

    monkeypatch.setattr(inputs, "CLIENT_TIMEOUT", 2.0)
    layout = make_layout()
    monkeypatch.setenv("ACTORS_PARTITIONS", str(layout.partitions))
    server = await NatsServer.start()
    nc = await connect(server.url, name="test")
    # no tools role: the step's command waits in its queue, and the run follows it
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    try:
        (tmp_path / "sleepy.yaml").write_text(SLEEPY)
        # `cli.main` in a thread: it runs its own event loop (signals stay the main thread's)
        run = asyncio.ensure_future(
            asyncio.to_thread(
                cli.main, ["run", str(tmp_path / "sleepy.yaml"), "--nats", server.url, "--execution-id", "gone-1"]
            )
        )
        async for item in Client(nc, layout=layout).follow("gone-1"):
            if item.type == "command.issued":
                break  # the run follows a step that will not end
        await server.stop()
        assert await asyncio.wait_for(run, 60) == EXIT_NATS
    finally:
        await rt.stop(drain_timeout=0)
        await close_connection(nc)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "execution gone-1: NATS unreachable for 2s while following it: its outcome is unknown here"
