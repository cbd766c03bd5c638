"""JetStream durability of the embedded server: `ACTORS_NATS_SYNC=always` makes the
nats-server that `dev` and `run` start fsync before every PubAck (`sync_interval:
always`); the default keeps nats-server's own 2-minute sync."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

import pytest

from actors.config.settings import Settings, SettingsInvalid
from streams.server import NatsServer, free_port

pytestmark = [pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[2]


def _jetstream_config(monitor_port: int) -> dict[str, object]:
    """The running server's own view of its JetStream settings (/varz)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/varz", timeout=5) as reply:
        return dict(json.load(reply)["jetstream"]["config"])


@pytest.mark.asyncio
@pytest.mark.parametrize(("sync", "always"), [("always", True), ("default", False)])
async def test_the_server_syncs_every_write_only_when_asked(sync: str, always: bool) -> None:
    port = free_port()
    async with await NatsServer.start(sync=sync, extra_args=["-m", str(port)]) as server:
        config = await asyncio.to_thread(_jetstream_config, port)
        assert bool(config.get("sync_always")) is always
        # the flags beside the config file still apply: the store is ours, JetStream answers
        assert str(config["store_dir"]).startswith(str(server.store))
        import nats

        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="D", subjects=["d.>"])
            ack = await js.publish("d.1", b"kept")
            assert ack.seq == 1
        finally:
            await nc.close()


@pytest.mark.asyncio
async def test_an_unknown_sync_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="sync must be one of default, always"):
        await NatsServer.start(sync="sometimes")


def test_the_setting_reads_always_and_refuses_anything_else_in_one_line() -> None:
    assert Settings.from_env({}).nats_sync == "default"
    assert Settings.from_env({"ACTORS_NATS_SYNC": "always"}).nats_sync == "always"
    with pytest.raises(SettingsInvalid) as caught:
        Settings.from_env({"ACTORS_NATS_SYNC": "fsync"})
    assert str(caught.value) == "ACTORS_NATS_SYNC='fsync': must be one of default, always"


@pytest.mark.asyncio
async def test_dev_starts_its_server_with_the_setting() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "dev",
        "--port",
        str(free_port()),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ACTORS_NATS_SYNC": "always"},
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("NATS at "), line
        store = Path(line.split("(store ", 1)[1].split(")", 1)[0])
        log = (store / "nats-server.log").read_text()
        assert "Using configuration file" in log and "sync-always.conf" in log
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode in (0, 130)  # stopped (130: it saw the Ctrl-C while starting)


@pytest.mark.asyncio
async def test_run_refuses_an_unknown_sync_mode_exit_3_no_traceback() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "run",
        "examples/hello.yaml",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NATS_URL": "", "ACTORS_NATS_SYNC": "sometimes"},
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 3
    assert err.decode().strip() == "actors-cli: ACTORS_NATS_SYNC='sometimes': must be one of default, always"
