"""The CLI's finish as users meet it: help on every option with the exit codes, -v
after the command, a watch or a run that gives up on time, Ctrl-C during `run`, the
loop progress bar beside step lines, entries numbered per execution."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.cli.live import ProgressBars
from actors.cli.main import build_parser
from actors.wire.messages import LoopProgress
from streams.server import NatsServer

pytestmark = [pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "actors.cli"]
SLOW = """apiVersion: actors/v1
kind: Playbook
metadata: {name: slow}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 60}
"""


async def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(env)
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{name} {a.option_strings or a.dest}" for name, sp in _subparsers().items() for a in sp._actions if not a.help
    ]
    assert missing == []


@pytest.mark.asyncio
async def test_help_of_a_command_lists_the_exit_codes_and_v_works_after_the_command() -> None:
    code, out, _ = await cli("status", "--help")
    assert code == 0 and "Exit codes:" in out and "4  timeout" in out and "130 interrupted" in out
    code, out, err = await cli("validate", "-v", "examples/hello.yaml")
    assert code == 0, err
    assert "examples/hello.yaml: ok" in out
    code, out, err = await cli("-v", "validate", "examples/hello.yaml")  # before the command still works
    assert code == 0, err


@pytest.mark.asyncio
async def test_status_watch_timeout_exits_4_in_one_line(nats_server: NatsServer) -> None:
    code, _, err = await cli("status", "never-started", "--watch", "--timeout", "1", env={"NATS_URL": nats_server.url})
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
        env=_env(env),
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
        env = {"NATS_URL": server.url}
        code, _, err = await cli("register", "examples/hello.yaml", env=env)
        assert code == 0, err
        for eid in ("first", "second"):  # the second's stream sequences follow the first's
            code, _, err = await cli("start", "examples/hello", "--execution-id", eid, env=env)
            assert code == 0, err
            code, _, err = await cli("status", eid, "--watch", "--timeout", "60", env=env)
            assert code == 0, err
        code, out, _ = await cli("events", "second", "--json", env=env)
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["n"] for r in rows] == list(range(1, len(rows) + 1))
        assert rows[0]["seq"] > 1  # the stream's own sequence is not what numbers them
        code, out, _ = await cli("events", "second", env=env)
        numbers = [line.split()[0] for line in out.splitlines()[1:]]
        assert numbers == [str(n) for n in range(1, len(rows) + 1)]
    finally:
        serve.terminate()
        await asyncio.wait_for(serve.wait(), 30)
        await server.stop()


@pytest.mark.asyncio
async def test_validate_compiles_python_code_and_warns_on_steps_no_route_reaches(tmp_path: Path) -> None:
    f = tmp_path / "code.yaml"
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: code}
workflow:
  - step: first
    tool:
      kind: python
      code: |
        def main():
            return (1
    next: end
  - step: helper_only
    tool: {kind: python, code: "def helper(): return 1"}
  - step: orphan
    tool: noop
    next: helper_only
""")
    code, out, err = await cli("validate", str(f))
    assert code == 3 and out == ""
    lines = err.splitlines()
    assert f"{f}:8: step 'first' field 'tool.code': python syntax error at line 2 of the code:" in lines[0]
    assert lines[1] == f"{f}:13: step 'helper_only' field 'tool.code': python code defines no main(): " + (
        "the tool calls main(**args)"
    )
    assert lines[2].startswith(f"{f}:12: step 'helper_only': warning: no route reaches this step")
    assert lines[3].startswith(f"{f}:14: step 'orphan': warning: no route reaches this step")
    code, out, _ = await cli("validate", "--json", str(f))
    report = json.loads(out)
    assert report["ok"] is False and len(report["errors"]) == 2
    assert [w["step"] for w in report["warnings"]] == ["helper_only", "orphan"]

    # a warning alone does not fail validation
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: code}
workflow:
  - step: first
    tool: {kind: python, code: "async def main(): return 1"}
  - step: orphan
    tool: noop
""")
    code, out, err = await cli("validate", str(f))
    assert code == 0 and f"{f}: ok" in out
    assert "step 'orphan': warning: no route reaches this step from the first step 'first'" in err


@pytest.mark.asyncio
async def test_an_invalid_enum_value_lists_the_valid_ones(tmp_path: Path) -> None:
    f = tmp_path / "enum.yaml"
    f.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: enum}
workflow:
  - step: a
    tool: noop
    loop: {collection: "{{ [1] }}", element: x, mode: paralel}
    on_error:
      - decision: abrt
""")
    code, _, err = await cli("validate", str(f))
    assert code == 3
    assert f"{f}:7: step 'a' field 'loop.mode': invalid value 'paralel' (one of: async, chunked, sequential)" in err
    assert (
        f"{f}:9: step 'a' field 'on_error[0].decision': invalid value 'abrt' (one of: abort, cancel, handled, "
        "ignore, none, retry, retry_later); did you mean 'abort'?"
    ) in err


@pytest.mark.asyncio
async def test_schema_describes_every_field_for_editor_hover_help() -> None:
    code, out, _ = await cli("schema")
    assert code == 0
    defs = json.loads(out)["$defs"]
    undescribed = [
        f"{name}.{prop}"
        for name, d in defs.items()
        for prop, spec in d.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert undescribed == []
    assert "parallel branches" in defs["Step"]["properties"]["next"]["description"]
