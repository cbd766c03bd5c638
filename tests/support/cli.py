"""`actors-cli` as a user runs it: a subprocess from the checkout's root, its exit code,
its output and how long it took. One helper for every test that runs the CLI, so each
runs it the same way (same environment, nothing left running after a timeout)."""

from __future__ import annotations

import asyncio
import os
import sys
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
    over both."""
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NATS_URL": url, "ACTORS_PARTITIONS": str(make_layout().partitions), **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:  # timed out or cancelled: leave no command running behind the test
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode(), time.monotonic() - began)


def one_line(err: str) -> str:
    """The stderr of a refused command: exactly one line, no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
