"""Wait steps in the engine's pure fold (issue #29): a step that waits for a signal or a
date, the mailbox of kept signals, timeouts as ordinary failures, approvals, cancels,
parallel waits, loops of waits (signals handed over and forwarded), the status's
`execution.waiting`, the semantics gate, and replay deciding the same. No NATS: the
harness plays the log, the timers and the counter."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from actors.client.logview import LogItem
from actors.client.steps import StepStory, fold_stories
from actors.core import waits
from actors.core.effects import Effects
from actors.playbook.checks import StepChecks
from actors.playbook.loader import PlaybookInvalid, load_playbook
from actors.playbook.until import iso_utc, parse_until
from actors.playbook.waits import signal_bytes
from actors.runtime.outbox import decision_messages
from actors.status.projector import project
from actors.wire.codec import CLEAR
from actors.wire.events import Event, UnknownEvent, event_decoder
from actors.wire.messages import LoopSpec, SignalSent
from streams.subjects import ExecSubjects
from tests.harness import PENDING, Run, Stamped, replay
from tests.harness.driver import START_TIME

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: waits}\n"


class Waits(Stamped):
    """The harness with what the engine shell does for waits: start records stamped
    with this code's semantics (as the starter does while every engine pod runs it),
    signals delivered to the execution's log, forwards delivered to a loop's."""

    def _effects(self, here: tuple[str, ...], run: Run, out: Any) -> None:
        super()._effects(here, run, out)
        for fwd in out.signal_forwards:
            self._deliver(("loop", run.execution_id, fwd.loop_id), fwd.signal)

    def signal(self, name: str, data: Any = None, *, key: str = "", sid: str | None = None, eid: str = "") -> None:
        eid = eid or self._last
        self._ids += 1
        self._deliver(
            ("exec", eid),
            SignalSent(execution_id=eid, signal_id=sid or f"s{self._ids}", name=name, key=key, data=data, by="ann"),
        )


def waiting(run: Run) -> list[list[dict[str, Any]]]:
    """Every `execution.waiting` of the run, in order: its waits (step, signal, key)."""
    return [
        [{k: w[k] for k in ("step", "signal", "key") if k in w} for w in i.data["waits"]]
        for i in run.events("execution.waiting")
    ]


def stories(run: Run) -> dict[str, StepStory]:
    """What `describe` and the UI's step panel show of the run's steps."""
    return fold_stories([LogItem(i.seq, i.at, i.cls, i.type, i.step, i.data) for i in run.items])


def test_a_step_waits_for_its_signal_and_ends_with_its_data() -> None:
    h = Waits({"after": PENDING})
    run = h.run(
        HEAD
        + """workflow:
  - step: ask
    tool: {kind: wait, signal: go, key: "{{ workload.order }}"}
    next: [{then: [after]}]
  - step: after
    tool: {kind: python, code: "def main(got): return got"}
    args: {got: "{{ ask.n }}"}
""",
        {"order": 7},
    )
    assert run.status == "RUNNING"
    (began,) = run.events("step.waiting", "ask")
    assert began.data["signal"] == "go" and began.data["key"] == "7" and began.data["deadline"] is None
    assert waiting(run) == [[{"step": "ask", "signal": "go", "key": "7"}]]
    h.signal("go", {"n": 1}, key="7")
    h.run()
    (got,) = run.events("signal.received", "ask")
    assert got.data["name"] == "go" and got.data["by"] == "ann" and "kept" not in got.data
    assert waiting(run)[-1] == []  # resumed: the status waits for nothing
    (call,) = h.running()
    assert call.args == {"got": 1}
    h.answer(call.command_id, 1)
    h.run()
    assert run.status == "COMPLETED" and run.result == {"after": 1}
    assert run.lifecycle().count("execution.waiting") == 2
    assert replay(run)


def test_a_signal_before_the_wait_is_kept_then_taken_and_one_before_the_start_too() -> None:
    h = Waits({"work": PENDING})
    src = (
        HEAD
        + """workflow:
  - step: work
    tool: {kind: python, code: "def main(): return 1"}
    next: [{then: [ask]}]
  - step: ask
    tool: {kind: wait, signal: go}
"""
    )
    # before the start record: the start is still queued
    h.signal("early", {"x": 0}, eid="e1")
    h.start(src, execution_id="e1")
    h.signal("go", {"n": 2})
    run = h.run()
    kept = run.events("signal.kept")
    assert [k.data["name"] for k in kept] == ["early", "go"] and kept[-1].data["kept"] == 2
    assert run.status == "RUNNING" and not run.events("step.waiting")
    (call,) = h.running()
    h.answer(call.command_id, 1)
    h.run()
    (got,) = run.events("signal.received", "ask")
    assert got.data["kept"] is True
    assert stories(run)["ask"].attempt_count == 1  # it took a kept signal at once: never `step.waiting`
    assert run.status == "COMPLETED" and run.result == {"ask": {"n": 2}}
    assert h.state("e1").mailbox[0].name == "early"  # nothing took it
    assert not run.events("execution.waiting")  # it never waited
    assert replay(run)


def test_key_and_when_that_do_not_match_keep_the_signal_for_a_later_wait() -> None:
    h = Waits()
    run = h.run(
        HEAD
        + """workflow:
  - step: first
    tool: {kind: wait, signal: go, key: a, when: "{{ signal.data.ok }}"}
    next: [{then: [second]}]
  - step: second
    tool: {kind: wait, signal: go, key: b}
"""
    )
    h.signal("go", {"ok": True}, key="b")  # another key: kept
    h.signal("go", {"ok": False}, key="a")  # `when` does not hold: kept
    h.run()
    assert [k.data["key"] for k in run.events("signal.kept")] == ["b", "a"]
    assert run.status == "RUNNING"
    h.signal("go", {"ok": True, "n": 3}, key="a")
    h.run()
    # the first wait took the third; the second took the kept one with its key at once
    assert run.status == "COMPLETED"
    assert run.result == {"second": {"ok": True}}
    assert [r.data.get("kept", False) for r in run.events("signal.received")] == [False, True]
    assert len(h.state(run.execution_id).mailbox) == 1  # key a, `when` false: still kept
    assert replay(run)


def test_the_same_signal_id_twice_is_one_signal() -> None:
    h = Waits()
    run = h.run(
        HEAD
        + """workflow:
  - step: one
    tool: {kind: wait, signal: go}
    next: [{then: [two]}]
  - step: two
    tool: {kind: wait, signal: go}
"""
    )
    h.signal("go", 1, sid="same")
    h.signal("go", 2, sid="same")
    h.run()
    assert len(run.events("signal.received")) == 1 and not run.events("signal.kept")
    assert run.status == "RUNNING" and run.events("step.waiting", "two")
    h.signal("go", 3, sid="other")
    h.run()
    assert run.result == {"two": 3}
    assert replay(run)


def test_past_its_bound_the_mailbox_drops_a_signal_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits, "MAILBOX_LIMIT", 2)
    h = Waits({"work": PENDING})
    run = h.run(HEAD + """workflow:\n  - step: work\n    tool: {kind: python, code: "def main(): pass"}\n""")
    for i in range(3):
        h.signal("nobody", i, sid=f"n{i}")
    h.run()
    assert [k.data["signal_id"] for k in run.events("signal.kept")] == ["n0", "n1"]
    (dropped,) = run.events("signal.dropped")
    assert dropped.data["signal_id"] == "n2" and dropped.data["limit"] == 2
    assert replay(run)


def test_a_signal_a_when_cannot_be_evaluated_for_matches_nothing_and_fails_no_step() -> None:
    # signals come from outside: junk data (a string where the `when` compares a number)
    # must not fail the step waiting, nor a later one that finds it kept
    h = Waits({"work": PENDING})
    run = h.run(
        HEAD
        + """workflow:
  - step: fork
    next: [{then: [first, work]}]
  - step: first
    tool: {kind: wait, signal: go, when: "{{ signal.data.n > 2 }}"}
  - step: work
    tool: {kind: python, code: "def main(): pass"}
    next: [{then: [later]}]
  - step: later
    tool: {kind: wait, signal: go, when: "{{ signal.data.n > 2 }}"}
"""
    )
    h.signal("go", {"n": "lots"}, sid="junk")
    h.run()
    (kept,) = run.events("signal.kept")
    assert kept.data["signal_id"] == "junk" and "reason" in kept.data and kept.data["reason"]
    assert run.status == "RUNNING" and not run.events("step.failed")
    (call,) = h.running()
    h.answer(call.command_id, None)  # `later` begins: the kept junk is no match for it either
    h.run()
    assert run.status == "RUNNING" and run.events("step.waiting", "later")
    h.signal("go", {"n": 3}, sid="good1")
    h.signal("go", {"n": 4}, sid="good2")
    h.run()
    assert run.status == "COMPLETED" and run.result == {"first": {"n": 3}, "later": {"n": 4}}
    assert [m.signal_id for m in h.state(run.execution_id).mailbox] == ["junk"]
    assert replay(run)


def test_the_mailbox_is_bounded_by_bytes_too() -> None:
    h = Waits({"work": PENDING})
    run = h.run(HEAD + """workflow:\n  - step: work\n    tool: {kind: python, code: "def main(): pass"}\n""")
    big = "x" * (1 << 20)  # 1 MiB: four fit under MAILBOX_BYTES (4 MiB), not the fourth with its name
    for i in range(5):
        h.signal("nobody", big, sid=f"b{i}")
    h.signal("nobody", "small", sid="s")
    h.run()
    assert [k.data["signal_id"] for k in run.events("signal.kept")] == ["b0", "b1", "b2", "s"]
    dropped = run.events("signal.dropped")
    assert [d.data["signal_id"] for d in dropped] == ["b3", "b4"]
    assert dropped[0].data["limit_bytes"] == waits.MAILBOX_BYTES
    assert h.state(run.execution_id).mailbox_bytes <= waits.MAILBOX_BYTES
    assert replay(run)


def test_an_until_past_any_number_is_a_wait_invalid_not_an_engine_fault() -> None:
    h = Waits()
    run = h.run(HEAD + """workflow:\n  - step: w\n    tool: {kind: wait, until: "{{ 10 ** 400 }}"}\n""")
    assert run.status == "FAILED" and run.error is not None and run.error["type"] == "WaitInvalid"
    assert "401 digits" in run.error["message"]


TIMEOUTS = (
    HEAD
    + """workflow:
  - step: w
    tool: {kind: wait, signal: go}
    timeout: 30
    retry:
      - when: "{{ error is not none and error.type == 'WaitTimeout' }}"
        then: {max_attempts: 2, initial_delay: 5}
    on_failure: [fix]
  - step: fix
    args: {why: "{{ failure.error.type }}", attempts: "{{ failure.attempt }}"}
"""
)


def test_a_timeout_fails_the_wait_for_retry_rules_on_failure_and_on_error() -> None:
    h = Waits()
    run = h.run(TIMEOUTS)
    # attempt 1 waits 30 s, times out; the retry waits 5 s, then waits again (a new
    # deadline, from when it starts waiting); that times out too: on_failure routes it
    began = run.events("step.waiting", "w")
    assert [b.data["attempt_number"] for b in began] == [1, 2]
    assert began[0].data["deadline"] == START_TIME + 30
    assert began[1].data["deadline"] == START_TIME + 30 + 5 + 30
    ended = run.events("wait.ended", "w")
    assert [e.data["reason"] for e in ended] == ["timeout", "timeout"]
    assert run.events("retry.exhausted", "w")
    assert run.result == {"fix": {"why": "WaitTimeout", "attempts": 2}}
    assert run.status == "COMPLETED"
    assert stories(run)["w"].attempt_count == 2  # `describe` counts a wait step's attempts
    # while the retry's timer runs, the step waits for nothing: the status says so
    assert waiting(run) == [[{"step": "w", "signal": "go", "key": ""}], [], [{"step": "w", "signal": "go", "key": ""}]]
    assert replay(run)

    # on_error sees it too
    h2 = Waits()
    src = (
        HEAD
        + """workflow:
  - step: ignored
    tool: {kind: wait, signal: never}
    timeout: 10
    on_error:
      - when: "{{ error.type == 'WaitTimeout' }}"
        decision: ignore
        result: {timed_out: true}
"""
    )
    run2 = h2.run(src)
    assert run2.status == "COMPLETED" and run2.result == {"ignored": {"timed_out": True}}
    (decided,) = run2.events("step.failure_decided", "ignored")
    assert decided.data["error"]["type"] == "WaitTimeout"
    assert replay(run2)


def test_a_signal_before_the_deadline_wins_and_its_timer_fires_for_nothing() -> None:
    h = Waits()
    run = h.run(
        HEAD + """workflow:\n  - step: w\n    tool: {kind: wait, signal: go}\n    timeout: 60\n""",
        until=lambda hh: bool(hh.runs["e1"].events("step.waiting")),
    )
    h.signal("go", "yes")
    h.run()  # the timer still fires at +60: the wait has ended, nothing happens
    assert run.result == {"w": "yes"}
    assert not run.events("wait.ended")
    assert run.inputs[-1][0].timer_id.endswith("-wait")
    assert replay(run)


def test_an_approval_rejected_fails_the_step_naming_who_and_why() -> None:
    h = Waits()
    run = h.run(HEAD + """workflow:\n  - step: approve\n    tool: {kind: wait, signal: approval, approval: true}\n""")
    (began,) = run.events("step.waiting")
    assert began.data["approval"] is True
    assert waiting(run) and run.events("execution.waiting")[0].data["waits"][0]["approval"] is True
    h.signal("approval", {"approved": False, "comment": "not today", "by": "bob"})
    h.run()
    assert run.status == "FAILED"
    assert run.error is not None and run.error["type"] == "Rejected"
    # the sender the log names (ann, as `by` of the signal), never what the data claims
    assert "ann" in run.error["message"] and "not today" in run.error["message"] and "bob" not in run.error["message"]
    assert replay(run)

    h2 = Waits()
    run2 = h2.run(HEAD + """workflow:\n  - step: approve\n    tool: {kind: wait, signal: ok, approval: true}\n""")
    h2.signal("ok", {"approved": True, "by": "amy"})  # (a webhook's body may say just this)
    h2.run()
    # the result is {approved, comment, by}, `by` the sender the log records (ann), not the data's
    assert run2.status == "COMPLETED" and run2.result == {"approve": {"approved": True, "comment": "", "by": "ann"}}


def test_until_a_date_in_a_zone_and_until_in_the_past() -> None:
    h = Waits()
    src = (
        HEAD
        + """workflow:
  - step: past
    tool: {kind: wait, until: "1970-01-01T00:00:01Z"}
    next: [{then: [later]}]
  - step: later
    tool: {kind: wait, until: "{{ workload.run_at }}", zone: Europe/Paris}
"""
    )
    run = h.run(src, {"run_at": "2026-11-27T12:00:00"})
    # past: completed at once, without waiting
    assert run.events("step.exit", "past")[0].at == START_TIME
    assert not run.events("step.waiting", "past")
    due = parse_until("2026-11-27T11:00:00Z")
    (began,) = run.events("step.waiting", "later")
    assert began.data["deadline"] == due and began.data["signal"] is None
    (ended,) = run.events("wait.ended", "later")
    assert ended.data["reason"] == "until" and ended.at == due
    assert run.result == {"later": {"until": "2026-11-27T11:00:00Z"}}
    assert iso_utc(due) == "2026-11-27T11:00:00Z"
    assert replay(run)

    h2 = Waits()
    run2 = h2.run(
        HEAD + """workflow:\n  - step: w\n    tool: {kind: wait, until: "{{ workload.when }}"}\n""", {"when": "soon"}
    )
    assert run2.status == "FAILED" and run2.error is not None and run2.error["type"] == "WaitInvalid"


def test_cancelling_a_waiting_execution_ends_its_wait() -> None:
    h = Waits()
    run = h.run(
        HEAD + """workflow:\n  - step: w\n    tool: {kind: wait, signal: go}\n    timeout: 100\n""",
        until=lambda hh: bool(hh.runs["e1"].events("step.waiting")),
    )
    h.cancel("e1", "no longer needed")
    h.signal("go", 1)
    h.run()
    assert run.status == "CANCELLED"
    assert h.state("e1").activations[0].status == "CANCELLED"
    assert not run.events("signal.received") and not run.events("wait.ended")
    assert run.lifecycle().count("execution.waiting") == 1  # the end clears it, not another event
    assert not h.state("e1").waits
    assert replay(run)


def test_a_cancelled_execution_shows_its_waiting_and_running_steps_cancelled() -> None:
    """A cancel writes no `step.exit` for the steps it stops: `describe` (and the UI's
    step panel, from the same story) shows them CANCELLED, the wait ENDED, not RUNNING
    and "waiting for signal ..., times out ..." for ever."""
    h = Waits({"s": PENDING})
    src = (
        HEAD
        + """workflow:
  - step: fork
    next: [{then: [w, s]}]
  - step: w
    tool: {kind: wait, signal: go}
    timeout: 100
  - step: s
    tool: {kind: python, code: "def main(): pass"}
"""
    )
    run = h.run(src, until=lambda hh: bool(hh.runs["e1"].events("step.waiting")))
    before = stories(run)
    assert before["w"].state == "RUNNING" and before["w"].wait is not None
    assert before["w"].wait["state"] == "WAITING"
    h.cancel("e1", "no longer needed")
    h.run()
    assert run.status == "CANCELLED"
    after = stories(run)
    assert after["w"].state == "CANCELLED" and after["w"].wait is not None
    assert after["w"].wait["state"] == "ENDED" and after["w"].exited_at is not None
    assert after["w"].attempt_count == 1
    assert after["s"].state == "CANCELLED"
    assert after["fork"].state == "COMPLETED"


def test_parallel_branches_wait_on_different_names() -> None:
    h = Waits()
    run = h.run(
        HEAD
        + """workflow:
  - step: fork
    next: [{then: [a, b]}]
  - step: a
    tool: {kind: wait, signal: left}
  - step: b
    tool: {kind: wait, signal: right}
"""
    )
    assert waiting(run) == [[{"step": "a", "signal": "left", "key": ""}, {"step": "b", "signal": "right", "key": ""}]]
    h.signal("right", "R")
    h.run()
    assert waiting(run)[-1] == [{"step": "a", "signal": "left", "key": ""}]
    assert run.status == "RUNNING"
    h.signal("left", "L")
    h.run()
    assert run.status == "COMPLETED"
    assert run.result == {"b": "R", "a": "L"}
    assert replay(run)


def test_a_loop_of_waits_gets_the_kept_signals_and_the_later_ones_and_none_after_its_verdict() -> None:
    h = Waits({"work": PENDING})
    src = (
        HEAD
        + """workflow:
  - step: work
    tool: {kind: python, code: "def main(): pass"}
    next: [{then: [each]}]
  - step: each
    tool: {kind: wait, signal: done, key: "{{ item }}"}
    loop: {collection: [1, 2, 3], element: item}
"""
    )
    run = h.run(src)
    big = "x" * 400_000  # five of these in the spec would exceed the max message size
    for n in range(5):
        h.signal("done", big, key="9", sid=f"big{n}")  # before the loop: kept
    h.signal("done", "one", key="1", sid="k1")
    h.signal("other", "x", sid="o1")
    h.run()
    (call,) = h.running()
    h.answer(call.command_id, None)
    h.run()
    (loop_id,) = run.loops
    log = [inp for inp, _, _ in run.loops[loop_id]]
    # the spec carries no signal: each kept one is an input of the loop's log right after it
    spec = log[0]
    assert isinstance(spec, LoopSpec) and len(msgspec.json.encode(spec)) < 10_000
    assert [s.signal_id for s in log[1:7]] == ["big0", "big1", "big2", "big3", "big4", "k1"]
    assert [m.signal_id for m in h.state("e1").mailbox] == ["o1"]  # another name stays kept
    assert h.state("e1").mailbox_bytes == signal_bytes(h.state("e1").mailbox[0])
    assert waiting(run)[-1] == [{"step": "each", "signal": "done", "key": ""}]
    assert run.events("execution.waiting")[-1].data["waits"][0]["loop"] is True
    h.signal("done", "three", key="3", sid="k3")
    h.signal("done", "two", key="2", sid="k2")
    h.run()
    forwarded = run.events("signal.forwarded", "each")
    assert [(f.data["signal_id"], f.data.get("kept", False)) for f in forwarded] == [
        *((f"big{n}", True) for n in range(5)),
        ("k1", True),
        ("k3", False),
        ("k2", False),
    ]
    assert run.status == "COMPLETED" and run.result == {"each": ["one", "two", "three"]}
    assert waiting(run)[-1] != []  # the end clears it: no `execution.waiting` in the last decision
    h.signal("done", "late", key="1", sid="k9")
    h.run()
    assert len(run.events("signal.forwarded")) == 8  # none after its verdict
    assert replay(run)


LOOP_AND_SINGLE = """workflow:
  - step: fork
    next: [{then: [l1, single]}]
  - step: l1
    tool: {kind: wait, signal: conf, key: "{{ item }}"}
    loop: {collection: [1, 2], element: item}
  - step: single
    tool: {kind: wait, signal: conf, key: s}
"""


def test_validate_refuses_a_loop_of_waits_sharing_its_signal_name() -> None:
    """A loop of waits owns its signal name: every signal of it goes to the loop,
    whatever its key, so another wait step of that name (loop or not) is refused,
    naming both steps and the field; a loop with a name of its own is fine."""
    src = (
        HEAD
        + LOOP_AND_SINGLE.replace("[l1, single]", "[l1, l2, single, own]")
        + (
            """  - step: l2
    tool: {kind: wait, signal: conf, key: "{{ item }}"}
    loop: {collection: [3], element: item}
  - step: own
    tool: {kind: wait, signal: mine, key: "{{ item }}"}
    loop: {collection: [3], element: item}
"""
        )
    )
    with pytest.raises(PlaybookInvalid) as caught:
        load_playbook(src)
    lines = str(caught.value).splitlines()
    assert len(lines) == 3, lines
    assert any(
        "step 'l1' field 'tool.signal'" in x and "also waited for by step 'single'" in x and "owns its signal" in x
        for x in lines
    )
    assert any("step 'l2' field 'tool.signal'" in x and "step 'l1'" in x for x in lines)
    assert any("step 'l2' field 'tool.signal'" in x and "step 'single'" in x for x in lines)
    assert not any("'own'" in x or "'mine'" in x for x in lines)
    load_playbook(HEAD + LOOP_AND_SINGLE.replace("signal: conf, key: s", "signal: other, key: s"))


def test_a_signal_goes_to_a_wait_it_matches_before_a_loop_of_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A playbook an older `validate` let through (a loop and a step waiting for one
    name): the step's own signal is its, not the loop's; the loop gets the others."""
    monkeypatch.setattr(StepChecks, "loop_signals", lambda self, ctxs: None)
    h = Waits()
    run = h.run(HEAD.replace("name: waits", "name: waits_older") + LOOP_AND_SINGLE)
    h.signal("conf", "S", key="s", sid="for-single")
    h.signal("conf", "two", key="2", sid="k2")
    h.signal("conf", "one", key="1", sid="k1")
    h.run()
    assert [f.data["signal_id"] for f in run.events("signal.forwarded", "l1")] == ["k2", "k1"]
    (got,) = run.events("signal.received", "single")
    assert got.data["signal_id"] == "for-single"
    assert run.status == "COMPLETED", run.error
    assert run.result == {"l1": ["one", "two"], "single": "S"}
    assert replay(run)


def test_a_loop_of_waits_shows_the_deadline_its_iterations_share() -> None:
    h = Waits()
    src = (
        HEAD
        + """workflow:
  - step: fork
    next: [{then: [shared, until, own]}]
  - step: shared
    tool: {kind: wait, signal: a, key: "{{ item }}", until: "{{ workload.until }}"}
    loop: {collection: [1, 2], element: item}
    timeout: 600
  - step: until
    tool: {kind: wait, signal: b, until: "{{ workload.until }}"}
    loop: {collection: [1, 2], element: item}
  - step: own
    tool: {kind: wait, signal: c, until: "{{ item }}"}
    loop: {collection: [1, 2], element: item}
"""
    )
    run = h.run(src, {"until": START_TIME + 60}, until=lambda h: bool(h.runs[h._last].events("execution.waiting")))
    (shown,) = run.events("execution.waiting")
    deadlines = {w["step"]: (w["deadline"], w["since"]) for w in shown.data["waits"]}
    # the step's timeout from the loop's start, or an `until` that reads no element,
    # whichever comes first; an `until` per element: none the loop shares
    assert deadlines["shared"][0] == pytest.approx(START_TIME + 60)
    assert deadlines["until"][0] == pytest.approx(START_TIME + 60)
    assert deadlines["own"][0] is None
    h2 = Waits()
    run2 = h2.run(
        HEAD
        + """workflow:
  - step: each
    tool: {kind: wait, signal: a}
    loop: {collection: [1], element: item}
    timeout: 30
""",
        until=lambda h: bool(h.runs[h._last].events("execution.waiting")),
    )
    (w,) = run2.events("execution.waiting")[0].data["waits"]
    assert w["deadline"] == pytest.approx(w["since"] + 30)
    assert replay(run)


def test_a_wait_step_needs_semantics_3() -> None:
    h = Waits(semantics=2)
    run = h.run(HEAD + """workflow:\n  - step: w\n    tool: {kind: wait, signal: go}\n""")
    assert run.status == "FAILED" and run.error is not None
    assert run.error["type"] == "PlaybookInvalid" and "semantics 3" in run.error["message"]
    # a playbook without one runs as it always did
    h2 = Waits(semantics=2)
    assert h2.run(HEAD + """workflow:\n  - step: a\n""").status == "COMPLETED"


def test_execution_waiting_is_stored_once_per_decision_and_never_carries_the_state() -> None:
    h = Waits()
    run = h.run(
        HEAD
        + """workflow:
  - step: fork
    next: [{then: [a, b]}]
  - step: a
    tool: {kind: wait, signal: left}
  - step: b
    tool: {kind: wait, signal: right}
"""
    )
    h.signal("right", 1)
    h.run()
    subjects = ExecSubjects.of(run.execution_id, 1)
    stored = []
    for (_, seq, at), out in zip(run.inputs, run.outputs, strict=True):
        fx = Effects(cause=seq, at=at, lifecycle=[msgspec.convert(e, Event) for e in out["lifecycle"]])
        fx.events = [msgspec.convert(e, Event) for e in out["events"]]
        stored += decision_messages(CLEAR, fx, subjects, run.execution_id, carry=True, limit=1 << 20)[0]
    by_subject = [
        (subject.split(".lc.")[-1], msg_id.split(":lc:")[-1]) for subject, _, msg_id in stored if ".lc." in subject
    ]
    # the first decision is carried by `playbook.initialized` (the waiting rides along);
    # the next one's own `execution.waiting` has an id of its decision: not a duplicate
    assert by_subject == [
        ("playbook.initialized", "playbook.initialized"),
        ("execution.waiting", f"execution.waiting:{run.inputs[1][1]}"),
    ]


def test_the_projector_copies_the_waits_and_clears_them_at_the_end() -> None:
    h = Waits()
    run = h.run(HEAD + """workflow:\n  - step: w\n    tool: {kind: wait, signal: go, approval: true}\n""")
    h.signal("go", {"approved": True})
    h.run()
    status = None
    seen = []
    for item in run.items:
        if item.cls == "lc":
            ev = event_decoder.decode(
                msgspec.json.encode(
                    {
                        "type": item.type,
                        "execution_id": run.execution_id,
                        "at": item.at,
                        "cause": item.seq,
                        "data": item.data,
                    }
                )
            )
            status = project(status, ev) or status
            assert status is not None
            seen.append((status.state, [w.step for w in status.waiting or []]))
    assert ("RUNNING", ["w"]) in seen
    assert status is not None and status.state == "COMPLETED" and status.waiting is None
    # a projector that does not know the event reads it as an unknown one: no change, no error
    unknown = UnknownEvent(type="execution.waiting", execution_id="x", at=1.0, cause=1, data={"waits": []})
    assert project(None, unknown) is None


def test_validate_refuses_what_a_wait_step_cannot_be() -> None:
    src = (
        HEAD
        + """workflow:
  - step: a
    tool: {kind: wait, signal: go, when: "{{ signal.data.ok and workload.x }}", zone: Mars/Base}
    sink: {tool: {kind: noop}}
  - step: b
    tool: {kind: wait, until: "next tuesday"}
  - step: c
    tool: {kind: wait, approval: true, until: "2026-01-01"}
  - step: end
    tool: {kind: wait, signal: last}
"""
    )
    with pytest.raises(PlaybookInvalid) as caught:
        load_playbook(src)
    lines = str(caught.value).splitlines()
    assert any("'tool.zone'" in x and "unknown time zone 'Mars/Base'" in x for x in lines)
    assert any("'sink'" in x and "no sink" in x for x in lines)
    assert any("'tool.until'" in x and "next tuesday" in x for x in lines)
    assert any("step 'c'" in x and "approval" in x for x in lines)
    assert any("step 'end'" in x and "cannot wait" in x for x in lines)
    assert not any("signal" in x and "undefined name" in x for x in lines)  # `signal` is in a `when`'s scope


def test_the_projector_drops_an_older_set_of_waits_applied_after_a_newer_one() -> None:
    def ev(type_: str, cause: int, data: dict[str, Any]) -> Any:
        return event_decoder.decode(
            msgspec.json.encode({"type": type_, "execution_id": "e1", "at": float(cause), "cause": cause, "data": data})
        )

    def waits_of(*steps: str) -> dict[str, Any]:
        return {"waits": [{"step": s, "activation": i, "since": 1.0, "signal": s} for i, s in enumerate(steps)]}

    status = project(None, ev("playbook.initialized", 1, {"playbook": "p", "version": 1}))
    assert status is not None
    newer = project(status, ev("execution.waiting", 7, waits_of("b")))
    assert newer is not None and [w.step for w in newer.waiting or []] == ["b"] and newer.waiting_cause == 7
    # a redelivery, or a second projector replica, applies decision 5's set late: dropped
    assert project(newer, ev("execution.waiting", 5, waits_of("a", "b"))) is None
    assert project(newer, ev("execution.waiting", 7, waits_of("b"))) is None
    latest = project(newer, ev("execution.waiting", 9, {"waits": []}))
    assert latest is not None and latest.waiting is None and latest.waiting_cause == 9
    assert project(latest, ev("execution.waiting", 8, waits_of("c"))) is None


def test_the_projector_orders_waits_set_by_answer_records_by_their_place_in_the_log() -> None:
    """Semantics 5: a decision stored with the step result that led to it (an answer
    record) has cause minus the sequence of the input it follows. Its waits are newer
    than that input's decision and than any before, older than any later input's: an
    approval entered that way must show (a user approves it from the status)."""

    def ev(cause: int, *steps: str) -> Any:
        waits = [{"step": s, "activation": i, "since": 1.0, "signal": s} for i, s in enumerate(steps)]
        body = {"type": "execution.waiting", "execution_id": "e1", "at": 1.0, "cause": cause, "data": {"waits": waits}}
        return event_decoder.decode(msgspec.json.encode(body))

    status = project(None, ev(4, "w1"))  # a signal's decision (input 4) set w1
    after = project(status, ev(-9, "w2"))  # then an answer record that followed input 9
    assert after is not None and [w.step for w in after.waiting or []] == ["w2"] and after.waiting_cause == -9
    assert project(after, ev(4, "w1")) is None  # input 4's set, applied late: older
    assert project(after, ev(9, "w1")) is None  # input 9's own decision comes before the record after it
    later = project(after, ev(-12, "w3"))  # an answer record after input 12
    assert later is not None and [w.step for w in later.waiting or []] == ["w3"]
    assert project(later, ev(-9, "w2")) is None  # the earlier record, applied late
    newest = project(later, ev(13, "w4"))  # a plain input after both
    assert newest is not None and [w.step for w in newest.waiting or []] == ["w4"]
