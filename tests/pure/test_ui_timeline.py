"""The step timeline of the execution page (actors/ui/timeline.py): attempts, retry
delays, waits in the queue, loops as one row, from logs made by the engine's own fold
(tests/harness, whose clock moves only with timers: times are exact). Pure: no NATS."""

from __future__ import annotations

from typing import Any

import pytest

from actors.client.logview import LogItem
from actors.ui.timeline import step_timeline
from tests.conftest import EXAMPLES
from tests.harness import PENDING, Fail, Harness
from tests.harness.driver import START_TIME
from tests.support.graph import HEAD, PY, items_of

pytestmark = [pytest.mark.timeout(60)]


def row(timeline: dict[str, Any], step: str) -> list[dict[str, Any]]:
    return next(r["bars"] for r in timeline["rows"] if r["step"] == step)


def brief(bars: list[dict[str, Any]]) -> list[tuple[str, int, str, float, float | None]]:
    """(kind, attempt, state, start, end) of each bar, times from the run's start."""
    return [
        (
            b["kind"],
            b["attempt"],
            b["state"],
            b["start"] - START_TIME,
            None if b["end"] is None else b["end"] - START_TIME,
        )
        for b in bars
    ]


def test_attempts_and_the_backoff_delays_between_them() -> None:
    calls = {"n": 0}

    def flaky(_: Any) -> int:
        calls["n"] += 1
        if calls["n"] < 3:
            raise Fail("Timeout", "too slow", retryable=True)
        return 1

    run = Harness({"fetch": flaky}).run(
        HEAD % "retries"
        + f"""
  - step: fetch
    tool: {PY}
    retry: {{max_attempts: 5, backoff: exponential, initial_delay: 2}}
    next: store
  - step: store
"""
    )
    timeline = step_timeline(items_of(run))
    assert timeline["start"] == START_TIME and timeline["end"] == START_TIME + 6
    assert [r["step"] for r in timeline["rows"]] == ["fetch", "store", "end"]
    assert brief(row(timeline, "fetch")) == [
        ("run", 1, "failed", 0, 0),
        ("delay", 2, "retrying", 0, 2),  # 2 s, then 4 s: exponential from initial_delay
        ("run", 2, "failed", 2, 2),
        ("delay", 3, "retrying", 2, 6),
        ("run", 3, "completed", 6, 6),
    ]
    assert row(timeline, "fetch")[0]["error"] == "Timeout: too slow"
    assert brief(row(timeline, "store")) == [("run", 1, "completed", 6, 6)]  # a router: entry to exit


def test_a_delay_still_waiting_ends_at_its_due_time_and_a_cancel_cuts_it_short() -> None:
    source = (
        HEAD % "waiting"
        + f"  - step: a\n    tool: {PY}\n    retry: {{max_attempts: 3, backoff: fixed, initial_delay: 60}}\n"
    )
    harness = Harness({"a": Fail("Timeout", "slow", retryable=True)})
    run = harness.run(source, until=lambda h: any(i.type == "retry.scheduled" for i in h.runs["e1"].items))
    timeline = step_timeline(items_of(run))
    assert timeline["end"] is None
    assert brief(row(timeline, "a")) == [("run", 1, "failed", 0, 0), ("delay", 2, "retrying", 0, 60)]
    harness.cancel(run.execution_id, "enough")
    run = harness.run(until=lambda h: h.runs["e1"].status == "CANCELLED")
    timeline = step_timeline(items_of(run))
    assert timeline["end"] == START_TIME
    assert brief(row(timeline, "a")) == [("run", 1, "failed", 0, 0), ("delay", 2, "cancelled", 0, 0)]


def test_a_running_attempt_is_open_and_a_cancelled_one_ends_with_the_cancel() -> None:
    source = HEAD % "running" + f"  - step: a\n    tool: {PY}\n"
    harness = Harness({"a": PENDING})
    run = harness.run(source)
    assert brief(row(step_timeline(items_of(run)), "a")) == [("run", 1, "running", 0, None)]
    harness.cancel(run.execution_id)
    run = harness.run()
    timeline = step_timeline(items_of(run))
    assert brief(row(timeline, "a")) == [("run", 1, "cancelled", 0, 0)]
    assert timeline["end"] == START_TIME


def test_a_loop_is_one_row_with_its_span_and_counts() -> None:
    source = (EXAMPLES / "fanout.yaml").read_text().replace("n: 1000", "n: 30")
    run = Harness(lambda call: call.iteration).run(source)
    timeline = step_timeline(items_of(run))
    rows = {r["step"]: r for r in timeline["rows"]}
    assert rows["square"]["loop"] and not rows["summary"]["loop"]
    (bar,) = rows["square"]["bars"]  # one bar for 30 iterations
    assert bar["kind"] == "run" and bar["state"] == "completed" and bar["iteration"] is None
    assert bar["loop"] == {"size": 30, "succeeded": 30, "failed": 0}
    assert bar["end"] is not None and bar["end"] >= bar["start"]

    failing = Harness({"square": Fail("ValueError", "unlucky")}).run(source)
    (bar,) = row(step_timeline(items_of(failing)), "square")
    assert bar["state"] == "failed" and bar["loop"]["failed"] >= 1
    assert bar["error"] is not None and "ValueError: unlucky" in bar["error"]


def _item(seq: int, at: float, cls: str, type_: str, step: str | None, **data: Any) -> LogItem:
    return LogItem(seq, at, cls, type_, step, data)


def test_time_in_the_queue_is_a_waiting_bar_and_an_early_answer_is_matched_to_its_command() -> None:
    """The tool's own clock says when it started; the engine publishes a command before
    its decision record, so a fast answer may come first in the log."""
    t = 5_000.0
    items = [
        _item(1, t, "in", "execution.start", None),
        _item(
            2, t + 0.9, "in", "call.done", "a", command_id="0-1", attempt_number=1, started_at=t + 0.5, ended_at=t + 0.8
        ),
        _item(3, t, "ev", "step.enter", "a", activation=0, from_activation=None),
        _item(3, t, "ev", "command.issued", "a", activation=0, command_id="0-1", kind="python", attempt_number=1),
        _item(4, t, "lc", "playbook.initialized", None, playbook="p", version=1, started_at=t),
        _item(5, t + 0.9, "ev", "step.exit", "a", activation=0, status="COMPLETED", next=["end"]),
    ]
    timeline = step_timeline(items)
    assert [(b["kind"], b["state"], b["start"] - t, b["end"] - t) for b in row(timeline, "a")] == [
        ("waiting", "pending", 0, pytest.approx(0.5)),
        ("run", "completed", pytest.approx(0.5), pytest.approx(0.8)),
    ]


def test_a_late_answer_after_the_end_changes_nothing() -> None:
    source = (
        HEAD % "abort"
        + f"""
  - step: s
    next: [a, b]
  - step: a
    tool: {PY}
  - step: b
    tool: {PY}
    on_error:
      - decision: abort
"""
    )
    run = Harness({"a": PENDING, "b": Fail("X", "bad")}).run(source)
    assert run.items[-1].type == "call.error"  # a's answer, after the execution failed
    timeline = step_timeline(items_of(run))
    assert [b["state"] for b in row(timeline, "a")] == ["cancelled"]
    assert [b["state"] for b in row(timeline, "b")] == ["failed"]


def test_a_wait_step_is_a_bar_per_attempt_open_while_it_waits() -> None:
    from tests.pure.test_waits import TIMEOUTS, Waits

    # two attempts that time out (30 s each, 5 s apart): failed bars, the delay between
    timed_out = step_timeline(items_of(Waits().run(TIMEOUTS)))
    assert brief(row(timed_out, "w")) == [
        ("run", 1, "failed", 0, 30),
        ("delay", 2, "retrying", 30, 35),
        ("run", 2, "failed", 35, 65),
    ]
    assert row(timed_out, "w")[0]["error"] == "WaitTimeout"

    # one still waiting is open; the signal closes it; a rejected approval fails it
    source = HEAD % "approve" + "  - step: ok\n    tool: {kind: wait, signal: go, approval: true}\n"
    h = Waits()
    run = h.run(source)
    assert brief(row(step_timeline(items_of(run)), "ok")) == [("run", 1, "running", 0, None)]
    h.signal("go", {"approved": False, "comment": "no", "by": "ann"})
    h.run()
    (bar,) = row(step_timeline(items_of(run)), "ok")
    assert (bar["state"], bar["end"]) == ("failed", START_TIME) and "Rejected" in bar["error"]
