"""`actors-cli` as a user runs it: a subprocess from the checkout's root, its exit code,
its output and how long it took. One helper for every test that runs the CLI, so each
runs it the same way (same environment, nothing left running after a timeout)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from tests.conftest import make_layout

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "actors.cli"]
EXIT_INVALID, EXIT_TIMEOUT, EXIT_NATS = 3, 4, 5


class Ran(NamedTuple):
    code: int
    out: str
    err: str
    seconds: float


async def cli(*args: str, url: str = "", timeout: float = 60, env: dict[str, str] | None = None) -> Ran:
    """Run actors-cli with `args`. `url` is its NATS_URL ("": none, so `run` and `dev`
    start their own server) and the partitions are those of tests/conftest.make_layout:
    a CLI talking to the `system` fixture must address the same subjects. `env` goes
    over both. The process is forked from a server that has imported the CLI once
    (tests/support/cliforks.py), unless the run sets what is read at import time."""
    began = time.monotonic()
    full_env = {**os.environ, "NATS_URL": url, "ACTORS_PARTITIONS": str(make_layout().partitions), **(env or {})}
    if FORKS and FAILPOINTS not in (env or {}):
        return await _forked(list(args), full_env, timeout, began)
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=full_env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:  # timed out or cancelled: leave no command running behind the test
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode(), time.monotonic() - began)


FAILPOINTS = "ACTORS_TEST_FAILPOINTS"  # read at import (actors/tools/failpoints.py): such runs are not forked
FORKS = os.environ.get("ACTORS_TEST_CLI_FORKS", "1") != "0"
_server: subprocess.Popen[bytes] | None = None
_starting = threading.Lock()
_socket = ""


def _fork_server() -> str:
    """The path of this test process's fork server's socket, started on first use and
    killed when the process ends."""
    with _starting:  # runs started together (asyncio.gather) share one server
        return _started_server()


def _started_server() -> str:
    global _server, _socket
    if _server is None or _server.poll() is not None:
        _socket = os.path.join(tempfile.mkdtemp(prefix="cliforks-"), "s")
        _server = subprocess.Popen(
            [sys.executable, "-m", "tests.support.cliforks", _socket],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            env={**os.environ, "ACTORS_PARTITIONS": str(make_layout().partitions)},
        )
        assert _server.stdout is not None
        if _server.stdout.readline() != b"ready\n":
            raise RuntimeError("the CLI fork server did not start (python -m tests.support.cliforks)")
        atexit.register(_server.kill)
    return _socket


async def _forked(args: list[str], env: dict[str, str], timeout: float, began: float) -> Ran:
    loop = asyncio.get_running_loop()
    path = await loop.run_in_executor(None, _fork_server)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pid: int | None = None
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, path)
        request = json.dumps({"args": args, "env": env, "cwd": str(ROOT)}).encode()
        await loop.run_in_executor(None, socket.send_fds, sock, [request], [null, out_w, err_w])
    finally:
        for fd in (null, out_w, err_w):
            os.close(fd)

    async def drain(fd: int) -> bytes:
        with os.fdopen(fd, "rb") as f:
            return await loop.run_in_executor(None, f.read)

    got = b""

    async def answer() -> int:
        nonlocal got, pid
        while chunk := await loop.sock_recv(sock, 4096):
            got += chunk
            if pid is None and b"\n" in got:
                pid = int(got.split(b"\n", 1)[0].split()[1])
        last = got.decode().splitlines()[-1:] if got else []
        return int(last[0].split()[1]) if last and last[0].startswith("exit ") else -9  # killed before it said

    try:
        out, err, code = await asyncio.wait_for(asyncio.gather(drain(out_r), drain(err_r), answer()), timeout)
    except BaseException:
        # timed out or cancelled: leave no command running behind the test (its whole
        # group: an embedded server it started goes too)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        raise
    finally:
        sock.close()
    return Ran(code, out.decode(), err.decode(), time.monotonic() - began)


def one_line(err: str) -> str:
    """The stderr of a refused command: exactly one line, no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
