"""What `run`, `status --watch` and `events` show while an execution goes on: a watch that
gives up on time, Ctrl-C during `run` (embedded or on a server), the loop progress bar
beside step lines, entries numbered per execution."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from actors.cli.live import ProgressBars
from actors.wire.messages import LoopProgress
from streams.server import NatsServer
from tests.support.cli import CLI, ROOT, cli

pytestmark = [pytest.mark.timeout(120)]


SLOW = """apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""


@pytest.mark.asyncio
async def test_status_watch_timeout_exits_4_in_one_line(nats_server: NatsServer) -> None:
    code, _, err, _ = await cli(
        "status", "never-started", "--watch", "--timeout", "1", env={"NATS_URL": nats_server.url}
    )
    assert code == 4
    assert err.strip() == "execution never-started: not finished after 1s"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def _interrupt_run(tmp_path: Path, env: dict[str, str]) -> tuple[int, str, str]:
    slow = tmp_path / "slow.yaml"
    slow.write_text(SLOW)
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        str(slow),
        "--execution-id",
        "ctrl-c-1",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
        # as a user's shell starts it: a job started in the background by a non-interactive
        # shell (a CI script's `&`) inherits SIGINT ignored, and would never see the Ctrl-C
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 60)  # started: "execution ID: slow v1"
    assert first.decode().startswith("execution ctrl-c-1")
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.asyncio
async def test_ctrl_c_during_an_embedded_run_says_the_execution_stopped_with_it(tmp_path: Path) -> None:
    code, _, err = await _interrupt_run(tmp_path, {"NATS_URL": ""})
    assert code == 130
    assert "Traceback" not in err
    assert "interrupted: execution ctrl-c-1 stopped with this run's own NATS server" in err


@pytest.mark.asyncio
async def test_ctrl_c_during_a_run_on_a_server_says_it_goes_on_and_how_to_cancel(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    code, _, err = await _interrupt_run(tmp_path, {"NATS_URL": nats_server.url})
    assert code == 130
    assert "Traceback" not in err
    assert "execution ctrl-c-1 goes on running" in err and "actors-cli cancel ctrl-c-1" in err


def _progress(done: int, total: int = 10, failed: int = 0, at: float = 0.0) -> LoopProgress:
    return LoopProgress("e", "loop-1", "fan", total=total, done=done, failed=failed, in_flight=2, at=at)


def test_progress_bar_in_place_is_erased_before_a_step_line_and_ends_in_a_line_of_its_own() -> None:
    out = io.StringIO()
    bars = ProgressBars(out, tty=True)
    bars.show(_progress(3))
    assert not out.getvalue().endswith("\n")  # redrawn in place
    bars.settle("other-step")  # a line of another step is about to be printed
    assert out.getvalue().endswith("\r\x1b[K")  # the bar is gone from the line
    bars.show(_progress(4, failed=4, at=0.5))
    bars.settle("fan")  # the loop's own step ended (it failed: never 10/10)
    text = out.getvalue()
    assert text.endswith("4/10  2 it/s  2 in flight  4 failed\n")


def test_progress_without_a_terminal_is_whole_lines_and_a_final_one_for_a_loop_that_failed() -> None:
    out = io.StringIO()
    bars = ProgressBars(out, tty=False)
    for i in range(1, 6):
        bars.show(_progress(i, failed=i, at=i * 0.1))  # within one second: only the first is shown
    bars.settle("fan")
    lines: list[Any] = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert len(lines) == 2
    assert " 1/10 " in lines[0] and " 5/10 " in lines[1] and lines[1].endswith("5 failed")
    bars.settle()  # nothing left to show: nothing printed twice
    assert out.getvalue().splitlines() == lines


@pytest.mark.asyncio
async def test_events_numbers_each_executions_entries_from_1(tmp_path: Path) -> None:
    server = await NatsServer.start()
    serve = await asyncio.create_subprocess_exec(
        *CLI,
        "serve",
        "--nats",
        server.url,
        "--http-port",
        "0",
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        env = {"NATS_URL": server.url, "ACTORS_PARTITIONS": ""}  # serve's own default layout, not make_layout's
        code, _, err, _ = await cli("register", "examples/hello.yaml", env=env)
        assert code == 0, err
        for eid in ("first", "second"):  # the second's stream sequences follow the first's
            code, _, err, _ = await cli("start", "examples/hello", "--execution-id", eid, env=env)
            assert code == 0, err
            code, _, err, _ = await cli("status", eid, "--watch", "--timeout", "60", env=env)
            assert code == 0, err
        code, out, _, _ = await cli("events", "second", "--json", env=env)
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["n"] for r in rows] == list(range(1, len(rows) + 1))
        assert rows[0]["seq"] > 1  # the stream's own sequence is not what numbers them
        code, out, _, _ = await cli("events", "second", env=env)
        numbers = [line.split()[0] for line in out.splitlines()[1:]]
        assert numbers == [str(n) for n in range(1, len(rows) + 1)]
    finally:
        serve.terminate()
        await asyncio.wait_for(serve.wait(), 30)
        await server.stop()
