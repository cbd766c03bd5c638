"""How a user starts the web UI: `actors-cli ui`, the UI `dev` starts, and `serve
--role ui` (a pod); each prints where it is, serves the page, and stops on a signal.
A user error (NATS unreachable, the port taken) is one line and an exit code."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from streams.server import NatsServer, free_port

pytestmark = [pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "actors.cli"]
ADDRESS = re.compile(rb"Web UI at (http://127\.0\.0\.1:[0-9]+/)")


async def running(*args: str, env: dict[str, str] | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """Start actors-cli; return it with the UI address it printed (stdout or stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NATS_URL": "", **(env or {})},
    )
    assert proc.stdout is not None
    seen = b""
    while not (m := ADDRESS.search(seen)):
        line = await asyncio.wait_for(proc.stdout.readline(), 40)
        assert line, f"ended before serving the UI: {seen.decode()}"
        seen += line
    return proc, m.group(1).decode()


async def fetch(url: str) -> tuple[int, bytes]:
    def get() -> tuple[int, bytes]:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()

    return await asyncio.to_thread(get)


async def stop(proc: asyncio.subprocess.Process, sig: int = signal.SIGINT) -> int:
    proc.send_signal(sig)
    try:
        return await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.asyncio
async def test_ui_command_serves_the_page_and_its_api(nats_server: NatsServer) -> None:
    proc, url = await running("ui", "--nats", nats_server.url, "--port", "0", "--read-only")
    try:
        status, page = await fetch(url)
        assert status == 200 and b'<script type="module" src="/static/app.js">' in page
        status, app = await fetch(url + "static/app.js")
        assert status == 200 and b"renderGraph" in app
        _, config = await fetch(url + "api/config")
        assert json.loads(config) == {"read_only": True, "token_required": False}
        _, listed = await fetch(url + "api/executions")
        assert json.loads(listed) == {"executions": [], "next": None}
    finally:
        assert await stop(proc) == 0


@pytest.mark.asyncio
async def test_ui_command_says_what_is_wrong_in_one_line() -> None:
    unreachable = await asyncio.create_subprocess_exec(
        *CLI,
        "ui",
        "--nats",
        f"nats://127.0.0.1:{free_port()}",
        "--timeout",
        "1",
        "--port",
        "0",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(unreachable.communicate(), 30)
    assert unreachable.returncode == 5 and len(err.decode().strip().splitlines()) == 1, err

    server = await NatsServer.start()
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            proc = await asyncio.create_subprocess_exec(
                *CLI,
                "ui",
                "--nats",
                server.url,
                "--port",
                str(port),
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 3, err
        assert (
            err.decode().strip().splitlines() == [err.decode().strip()]
            and f"cannot serve the web UI on 127.0.0.1:{port}" in err.decode()
        )
    finally:
        await server.discard()


@pytest.mark.asyncio
async def test_dev_prints_its_ui() -> None:
    proc, url = await running("dev", "--port", str(free_port()), "--ui-port", str(free_port()))
    try:
        status, _ = await fetch(url + "api/playbooks")
        assert status == 200
    finally:
        assert await stop(proc) == 0


@pytest.mark.asyncio
async def test_serve_role_ui_is_a_pod_with_health_and_the_ui(nats_server: NatsServer) -> None:
    health = free_port()
    proc, url = await running(
        "serve", "--role", "ui", "--nats", nats_server.url, "--http-port", str(health), env={"ACTORS_UI_PORT": "0"}
    )
    try:
        status, _ = await fetch(url + "api/config")
        assert status == 200
        status, _ = await fetch(f"http://127.0.0.1:{health}/healthz")
        assert status == 200
    finally:
        assert await stop(proc, signal.SIGTERM) == 0


def test_the_wheel_ships_every_asset_of_the_page() -> None:
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["actors"]
    static = ROOT / "actors" / "ui" / "static"
    assets = sorted(p.relative_to(ROOT / "actors").as_posix() for p in static.iterdir())
    assert assets and all(any(fnmatch.fnmatch(a, g) for g in globs) for a in assets), (assets, globs)


def test_ui_settings_from_the_environment_and_flags() -> None:
    from actors.config.settings import Settings, SettingsInvalid

    s = Settings.from_env({"ACTORS_UI_READ_ONLY": "1", "ACTORS_UI_PORT": "9000", "ACTORS_UI_TOKEN": "t0k"})
    assert (s.ui_read_only, s.ui_port, s.ui_host, s.ui_token) == (True, 9000, "127.0.0.1", "t0k")
    assert "t0k" not in repr(s)  # a secret
    assert Settings.from_env({"ACTORS_UI_READ_ONLY": "no"}).ui_read_only is False
    with pytest.raises(SettingsInvalid, match="ACTORS_UI_READ_ONLY"):
        Settings.from_env({"ACTORS_UI_READ_ONLY": "maybe"})


@pytest.mark.asyncio
async def test_the_ui_token_comes_from_a_file_or_the_environment_never_argv(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """`--token T` would show the secret to every user of the machine (`ps`): the flag
    is `--token-file FILE`, and ACTORS_UI_TOKEN still works."""
    secret = tmp_path / "ui-token"
    secret.write_text("s3cret-from-file\n")  # as `echo` leaves it: the newline is not part of it

    async def start_status(url: str, token: str | None) -> int:
        def post() -> int:
            headers = {"Content-Type": "application/json", **({"X-Actors-Token": token} if token else {})}
            req = urllib.request.Request(url + "api/playbooks/x/start", data=b"{}", headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)

        return await asyncio.to_thread(post)

    for args, env, token in (
        (("--token-file", str(secret)), {}, "s3cret-from-file"),
        ((), {"ACTORS_UI_TOKEN": "s3cret-from-env"}, "s3cret-from-env"),
        ((), {"ACTORS_UI_TOKEN_FILE": str(secret)}, "s3cret-from-file"),
    ):
        proc, url = await running("ui", "--nats", nats_server.url, "--port", "0", *args, env=env)
        try:
            _, config = await fetch(url + "api/config")
            assert json.loads(config)["token_required"] is True
            assert await start_status(url, None) == 401
            assert await start_status(url, token) != 401  # past the guard (the playbook is unknown)
        finally:
            assert await stop(proc) == 0

    old = await asyncio.create_subprocess_exec(
        *CLI, "ui", "--token", "T", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(old.communicate(), 30)
    assert old.returncode == 3 and b"--token is refused" in err, err

    missing = await asyncio.create_subprocess_exec(
        *CLI,
        "ui",
        "--nats",
        nats_server.url,
        "--port",
        "0",
        "--token-file",
        str(tmp_path / "nope"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(missing.communicate(), 30)
    assert missing.returncode == 3 and b"ACTORS_UI_TOKEN_FILE" in err and len(err.strip().splitlines()) == 1, err
