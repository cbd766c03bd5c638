"""bench/rolling_upgrade.py is run by hand (docs/operating.md, "Rolling upgrade"): it
takes minutes and a git worktree, too much for CI. Checked here, cheaply: its options
and the playbooks it registers, so the command does not rot between runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from actors.playbook.loader import load_playbook_file
from actors.pod.roles import ROLES
from bench import rolling_upgrade

pytestmark = [pytest.mark.timeout(30)]


def test_defaults_upgrade_every_role_from_the_commit_before_the_reorganisation() -> None:
    args = rolling_upgrade.parse_args([])
    assert args.from_commit == "e9e333c"
    assert (args.executions, args.pods) == (50, 2)
    assert args.roles == ROLES


def test_options_are_read() -> None:
    args = rolling_upgrade.parse_args(
        ["--from", "abc123", "--executions", "7", "--pods", "1", "--roles", "engine,tools"]
    )
    assert (args.from_commit, args.executions, args.pods, args.roles) == ("abc123", 7, 1, ("engine", "tools"))


@pytest.mark.parametrize("argv", [["--executions", "0"], ["--pods", "0"], ["--roles", "engine,ui"], ["--roles", ""]])
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        rolling_upgrade.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_its_playbooks_load_and_name_the_paths_it_starts() -> None:
    main = load_playbook_file(rolling_upgrade.PLAYBOOKS / "main.yaml")
    child = load_playbook_file(rolling_upgrade.PLAYBOOKS / "child.yaml")
    assert (main.metadata.catalog_path, child.metadata.catalog_path) == (rolling_upgrade.MAIN, rolling_upgrade.CHILD)
    # the steps whose effects the bench counts, by the names it counts them under
    assert {"begin", "nap", "flaky", "seq", "par", "child", "end"} <= {s.step for s in main.workflow}


def every_effect(attempts: int) -> Counter[str]:
    lines = ["begin -", "nap -", "child -", "end -"]
    lines += [f"seq {i}" for i in range(rolling_upgrade.SEQ)] + [f"par {j}" for j in range(rolling_upgrade.PAR)]
    return Counter(lines + [f"flaky {a}" for a in range(1, attempts + 1)])


def test_effects_once_each_are_neither_lost_nor_duplicated() -> None:
    assert rolling_upgrade.count_effects(every_effect(3), attempts=3) == ([], [])


def test_an_effect_missing_is_lost_and_one_twice_is_a_duplicate() -> None:
    seen = every_effect(3)
    del seen["seq 4"]
    seen["par 2"] += 1
    assert rolling_upgrade.count_effects(seen, attempts=3) == (["seq 4"], ["par 2"])


def test_a_step_run_once_more_than_its_log_has_attempts_is_a_duplicate() -> None:
    # attempt 1 ran twice (a redelivery): its second run wrote "flaky 2" and failed,
    # attempt 2 wrote "flaky 3" and succeeded; the log has 2 attempts, the file 3 lines
    lost, duplicates = rolling_upgrade.count_effects(every_effect(3), attempts=2)
    assert (lost, duplicates) == ([], ["flaky 3"])


def run_report(verdict: rolling_upgrade.Verdict, **overrides: Any) -> dict[str, Any]:
    figures: dict[str, Any] = dict(
        children=1,
        child_problems=[],
        unlisted=[],
        dead=[],
        advisories=[],
        old_exits={"old-engine0": 0},
        in_flight_at=[3],
        upgrade_seconds=1.0,
        elapsed=2.0,
        base=Path("/nonexistent"),
    )
    figures.update(overrides)
    return rolling_upgrade.report(rolling_upgrade.parse_args([]), "e9e333c", [verdict], **figures)


def test_the_run_passes_only_when_every_check_does(capsys: pytest.CaptureFixture[str]) -> None:
    good = rolling_upgrade.Verdict("upgrade-0000", "COMPLETED", terminals=1, attempts=3)
    assert run_report(good)["ok"] is True
    twice = rolling_upgrade.Verdict("upgrade-0000", "COMPLETED", terminals=1, attempts=3, duplicates=["par 2"])
    result = run_report(twice)
    assert (result["ok"], result["duplicates"], result["failed_checks"]) == (False, 1, ["no side effect twice"])
    assert run_report(good, old_exits={"old-engine0": 1})["failed_checks"] == ["every old pod drained and exited 0"]
    assert run_report(good, in_flight_at=[3, 0])["failed_checks"] == ["every replacement met executions in flight"]
    halted = rolling_upgrade.Verdict("upgrade-0000", "RUNNING", terminals=0, attempts=3)
    assert run_report(halted)["failed_checks"] == ["every execution COMPLETED", "one terminal lifecycle event each"]
    assert "FAIL" in capsys.readouterr().out
