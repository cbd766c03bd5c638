"""Ctrl-C reaches a CLI command as the CLI really runs it: `uvloop.run` (an asyncio.Runner
on Python 3.11+) installs a SIGINT handler of its own before the command starts, which
cancels once. A command that swallowed that one cancel (Python 3.11's wait_for can, inside
nats-py's requests) ran on to its end: `actors-cli run` followed a 60 s step after Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from tests.support.cli import ROOT

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

# the CLI's own way of running a command (actors/cli/main.py `_run`), on a command that
# swallows the first cancel and would then sleep for an hour
SCRIPT = """
import asyncio, sys
from actors.cli.main import _run

async def command():
    print("started", flush=True)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        print("swallowed", flush=True)
    await asyncio.sleep(3600)

try:
    _run(command())
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal starts it (not a background job's SIG_IGN)


async def test_one_ctrl_c_ends_a_command_that_swallowed_the_runners_cancel() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    assert await proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)  # one Ctrl-C
    out, _ = await proc.communicate()  # before the fix: an hour (the test's timeout)
    assert out.decode().split() == ["swallowed", "interrupted"]
    assert proc.returncode == 130
