"""What `actors-cli` says before it connects to anything: each command's --help (its
own options first, examples, the connection options behind `help connect`), `validate`
reporting every problem of a file in one pass, and times printed with their zone."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from actors.cli import main
from actors.cli.output import duration, use_local_time, when

pytestmark = [pytest.mark.timeout(30)]


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main([*args]) == 0
    return capsys.readouterr().out


def test_a_command_help_shows_its_own_options_first_and_points_to_the_connection_ones(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    status = help_of(capsys, "status", "--help")
    body = status[status.index("\noptions:") :]  # after the usage line
    assert body.index("--watch") < body.index("-h, --help") < body.index("\nconnection:") < body.index("--nats URL")
    assert "actors-cli help connect" in status and "examples:\n  actors-cli status ID" in status
    assert "--tls-ca" not in status and "--nats-creds" not in status  # listed once, by `help connect`
    assert len(status.splitlines()) < 35, status  # was 65: ten connection flags and 17 lines of exit codes
    assert "exit codes: 0 done" in status
    # every connection flag is still taken by every command, and `help connect` lists them all
    connect = help_of(capsys, "help", "connect")
    for flag in ("--nats URL", "--nats-creds", "--nats-password-file", "--tls-ca", "--tls-key", "--payload-key-file"):
        assert flag in connect
    assert help_of(capsys, "help", "status") == status
    assert "0  COMPLETED" in help_of(capsys, "help", "exits")
    # the texts the issue found wrong
    dev = help_of(capsys, "dev", "--help")
    assert "Start a nats-server with JetStream, every actor and the web UI" in dev
    schedule = help_of(capsys, "schedule", "--help")
    assert "stop a schedule firing until it is resumed" in schedule and "resumed a schedule" not in schedule
    assert "counter (loops)" in help_of(capsys, "serve", "--help")
    assert "--local" in help_of(capsys, "list", "--help") and "--local" in help_of(capsys, "schedule", "list", "--help")


def test_an_unknown_help_topic_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help", "nosuch"]) == 3
    err = capsys.readouterr().err
    assert (
        err.startswith("actors-cli: no help topic 'nosuch': connect, exits, or one of run, ") and err.count("\n") == 1
    )


BROKEN = """apiVersion: actors/v1
kind: Playbook
metadata: {name: broken}
workflow:
  - step: start
    next: nowhere
    tool:
      kind: python
      code: |
        def main(:
            return 1
  - step: two
    tool: {kind: python, code: "def main(): return 1", bogus: 1}
  - step: three
    tool: {kind: python, code: "x = 1"}
"""


def test_validate_reports_every_problem_of_a_file_in_one_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    assert main(["validate", str(path)]) == 3
    lines = capsys.readouterr().err.splitlines()
    # the loader's errors and the code's, in the file's order: a syntax error no longer waits for the others
    assert lines == [
        f"{path}:6: step 'start' field 'next': unknown step 'nowhere'",
        f"{path}:9: step 'start' field 'tool.code': python syntax error at line 1 of the code: invalid syntax",
        f"{path}:13: step 'two' field 'tool.bogus': unknown key 'bogus'",
        f"{path}:15: step 'three' field 'tool.code': python code defines no main(): the tool calls main(**args)",
    ], lines
    assert main(["validate", "--json", str(path)]) == 3
    assert capsys.readouterr().out.count('"field":"tool.code"') == 2


def test_times_print_with_their_zone_utc_unless_local(monkeypatch: pytest.MonkeyPatch) -> None:
    t = dt.datetime(2026, 11, 26, 21, 4, 5, 250_000, tzinfo=dt.UTC).timestamp()
    assert when(t) == "2026-11-26 21:04:05Z" and when(t, ms=True) == "2026-11-26 21:04:05.250Z"
    assert when("2026-11-27T03:00:00+01:00") == "2026-11-27 02:00:00Z"  # a schedule's next fire, in its zone
    assert when(None) == "-"
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        use_local_time(True)
        assert when(t) == "2026-11-27 02:34:05+05:30"
    finally:
        use_local_time(False)
        monkeypatch.delenv("TZ")
        time.tzset()
    assert [duration(s) for s in (0.0123, 12.34, 245, 7980, 270000, None)] == [
        "12ms",
        "12.3s",
        "4m05s",
        "2h13m",
        "3d03h",
        "-",
    ]
