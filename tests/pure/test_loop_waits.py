"""A loop of waits in the counter's pure core (issue #29: inside a loop, each iteration
waits on its own key): every iteration waits at once, whatever `concurrency`; signals
match by name, key and `when`, in any order, once per id, kept when nothing waits on
their key yet; deadlines share one timer each and fail an iteration `WaitTimeout`
(retry rules per iteration; a retry waits again); an approval rejected fails it
`Rejected`; failures are tolerated and recorded as for any loop; a replay of the log
decides the same."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from actors.core.effects import Effects
from actors.core.loop import MAX_KEPT_BYTES, LoopRun, fold_loop
from actors.core.replay import LoopReplayer
from actors.playbook.loader import parsed_playbook
from actors.playbook.model import Step
from actors.playbook.until import parse_until as until_epoch
from actors.wire.messages import (
    IteratorCompleted,
    IteratorFailed,
    Limits,
    LoopCancel,
    LoopInput,
    LoopSpec,
    SignalSent,
    TimerFired,
)
from streams.subjects import LoopSubjects

pytestmark = pytest.mark.timeout(60)

SUBJECTS = LoopSubjects("loop.0.e1.0-1")
T0 = 1_800_000_000.0  # the log's time at the spec


def source(tool: str, *, extra: str = "", loop: str = "") -> str:
    return f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: waits}}
workflow:
  - step: each
    tool: {tool}
    loop: {{collection: [], element: item, concurrency: 5{loop}}}
{extra}
"""


def parsed(src: str) -> Step:
    return parsed_playbook(src, "waits", Limits().max_attempts).step("each")


def signal(key: Any, data: Any, *, sid: str | None = None, name: str = "done") -> SignalSent:
    return SignalSent(execution_id="e1", signal_id=sid or f"s-{key}-{data}", name=name, key=str(key), data=data)


class Loop:
    """A loop folded input by input, its log and outputs kept for a replay."""

    def __init__(
        self, src: str, collection: list[Any], *, kept: list[SignalSent] | None = None, at: float = T0
    ) -> None:
        self.src = src
        self.run = LoopRun(execution_id="e1", loop_id="0-1")
        self.spec = LoopSpec(
            execution_id="e1",
            loop_id="0-1",
            step="each",
            playbook_path="waits",
            playbook_source=src,
            collection=collection,
            reply_to="exec.0.e1.in.iterator.0-1",
            scope={"workload": {"at": T0 + 50}},
        )
        self.log: list[tuple[LoopInput, float]] = []
        self.outs: list[Effects] = []
        self.fold(self.spec, at)
        for sig in kept or ():  # kept by the execution before the loop: forwarded right after the spec
            self.fold(sig, at)

    def fold(self, inp: LoopInput, at: float) -> Effects:
        out = fold_loop(
            self.run, inp, at=at, subjects=SUBJECTS, step=parsed(self.src) if isinstance(inp, LoopSpec) else None
        )
        self.log.append((inp, at))
        self.outs.append(out)
        return out

    def fire(self, timer_id: str, at: float | None = None) -> Effects:
        due = next(t.due for o in self.outs for t in o.timers if t.timer_id == timer_id)
        return self.fold(TimerFired(execution_id="e1", timer_id=timer_id, due=due), due if at is None else at)

    @property
    def timers(self) -> list[str]:
        return [t.timer_id for o in self.outs for t in o.timers]

    @property
    def verdicts(self) -> list[IteratorCompleted | IteratorFailed]:
        return [o.verdict for o in self.outs if o.verdict is not None]

    def replayed(self, run: LoopRun | None = None) -> list[Effects]:
        """The same log folded by a fresh counter (into `run`), checked as a replay is."""
        run = LoopRun(execution_id="e1", loop_id="0-1") if run is None else run
        checker = LoopReplayer("e1", "0-1")
        outs = []
        for seq, (inp, at) in enumerate(self.log, 1):
            assert checker.admit(seq, "s", inp, run) is None
            out = fold_loop(run, inp, at=at, subjects=SUBJECTS, step=parsed(self.src) if seq == 1 else None)
            checker.derived(out)
            outs.append(out)
        return outs


def test_a_thousand_iterations_wait_at_once_and_each_takes_its_own_signal() -> None:
    n = 1_000
    lp = Loop(
        source('{kind: wait, signal: done, key: "{{ item.id }}"}', extra="    timeout: 3600"),
        [{"id": f"k{i}"} for i in range(n)],
        kept=[signal("k7", "early", sid="early")],  # kept by the execution before the loop began
    )
    first = lp.outs[0]
    # every iteration waits now, none as a command (concurrency 5 does not bound waits),
    # under one timer for the deadline they share; the kept signal was taken at once
    assert first.commands == [] and lp.run.waiting_count == n - 1 and lp.run.done == 1
    assert lp.outs[1].timers == []
    assert len(first.timers) == 1 and first.timers[0].due == T0 + 3600
    rng = random.Random(29)
    order = [i for i in range(n) if i != 7]
    rng.shuffle(order)
    sent: list[SignalSent] = []
    for step_no, i in enumerate(order, 1):
        sig = signal(f"k{i}", {"i": i})
        lp.fold(sig, T0 + step_no / 1000)
        sent.append(sig)
        if rng.random() < 0.1:  # the same signal again: one signal
            lp.fold(rng.choice(sent), T0 + step_no / 1000)
        # the same key, another id: k7's iteration is done, so it is kept, never taken
        if step_no == 10:
            lp.fold(signal("k7", "late", sid="late"), T0 + 0.01)
        if step_no < n - 1:
            assert lp.run.done == step_no + 1 and lp.run.waiting_count == n - 1 - step_no
    (v,) = lp.verdicts
    assert isinstance(v, IteratorCompleted) and (v.succeeded, v.failed) == (n, 0)
    assert v.results == ["early" if i == 7 else {"i": i} for i in range(n)]
    assert lp.timers == [first.timers[0].timer_id]  # one timer for a thousand waits
    # after the verdict: signals and the deadline change nothing
    assert not lp.fold(signal("k1", "after", sid="after"), T0 + 2)
    assert not lp.fire(first.timers[0].timer_id)
    # a replay of the log decides exactly the same
    again = lp.replayed()
    assert [o.verdict for o in again] == [o.verdict for o in lp.outs]
    assert [[t.timer_id for t in o.timers] for o in again] == [[t.timer_id for t in o.timers] for o in lp.outs]


def test_deadlines_one_timer_each_time_out_tolerated_and_recorded() -> None:
    # `until` per item: two distinct dates, and the step's timeout earlier than the later one
    src = source(
        '{kind: wait, signal: done, key: "{{ item.k }}", until: "{{ item.until }}"}',
        extra="    timeout: 100",
        loop=", tolerated_failures: 3",
    )
    soon, late = "2027-01-15T08:00:30Z", "2027-01-15T09:00:00+01:00"  # late is 08:00 UTC: soon's 30 s before
    t0 = until_epoch("2027-01-15T08:00:00Z")
    items = [{"k": f"a{i}", "until": soon if i % 2 else late} for i in range(6)]
    lp = Loop(src, items, at=t0 - 10)
    # deadlines: `late` = 08:00:00 (before start+100), `soon` = 08:00:30: two timers for six waits
    timers = sorted(lp.outs[0].timers, key=lambda t: t.due)
    assert [t.due for t in timers] == [t0, t0 + 30]
    lp.fold(signal("a0", "ok"), t0 - 5)  # a0 (late) signalled in time
    out = lp.fire(timers[0].timer_id)
    # a2 and a4 time out: failures tolerated, each recorded with its element and error
    assert sorted(f.index for f in out.failures) == [2, 4]
    assert {f.error.type for f in out.failures} == {"WaitTimeout"}
    assert out.failures[0].element == items[out.failures[0].index]
    assert "waited for signal 'done' (key 'a2')" in next(f.error.message for f in out.failures if f.index == 2)
    lp.fold(signal("a2", "too late"), t0 + 1)  # after its timeout: kept, no iteration takes it
    assert lp.run.done == 3
    lp.fold(signal("a1", "ok"), t0 + 2)
    # a counter replaying this log (a restart) knows the timer still to come: it arms it again
    again = LoopRun(execution_id="e1", loop_id="0-1")
    lp.replayed(again)
    assert again.pending_timers() == lp.run.pending_timers() == [timers[1].timer_id]
    assert again.waiting_count == lp.run.waiting_count == 2
    lp.fold(signal("a3", "ok"), t0 + 2)
    out = lp.fire(timers[1].timer_id)  # a5 times out: 3 failures, tolerated
    (v,) = lp.verdicts
    assert isinstance(v, IteratorCompleted) and (v.succeeded, v.failed) == (3, 3)
    assert v.results == ["ok", "ok", None, "ok", None, None]
    # one failure more than tolerated fails the loop at once
    lp2 = Loop(source("{kind: wait, signal: done}", extra="    timeout: 5", loop=", tolerated_failures: 1"), [1, 2, 3])
    (timer,) = lp2.timers
    out = lp2.fire(timer)
    assert isinstance(out.verdict, IteratorFailed) and out.verdict.failed == 2 and out.verdict.not_run == 1
    assert len(out.failures) == 2


def test_a_retry_waits_again_and_takes_a_signal_kept_meanwhile() -> None:
    src = source(
        '{kind: wait, signal: done, key: "{{ item }}"}',
        extra="""    timeout: 10
    retry:
      when: "{{ error is not none and error.type == 'WaitTimeout' }}"
      then: {max_attempts: 3, backoff: fixed, initial_delay: 4}""",
    )
    lp = Loop(src, ["x", "y"])
    (deadline,) = lp.timers
    lp.fold(signal("y", "Y"), T0 + 1)
    out = lp.fire(deadline)  # x times out: a retry after 4 s (a retry timer), not a failure
    assert not out.failures and lp.run.waiting_count == 0
    (backoff,) = [t for t in out.timers]
    lp.fold(signal("x", "X1"), T0 + 11)  # while x waits for its retry: kept
    assert lp.run.done == 1
    out = lp.fire(backoff.timer_id)  # x waits again: takes the kept signal at once
    (v,) = lp.verdicts
    assert v.results == ["X1", "Y"] and not out.timers
    # exhausted: every attempt timed out, each waiting again with a deadline of its own
    lp = Loop(src, ["x"])
    while not lp.verdicts:
        lp.fire(lp.timers[-1])  # a deadline, then a retry's delay, and again
    fails = [f for o in lp.outs for f in o.failures]
    assert [(f.index, f.attempts, f.error.type) for f in fails] == [(0, 3, "WaitTimeout")]
    deadlines = [t for t in lp.timers if t.startswith("w")]
    assert len(deadlines) == len(set(deadlines)) == 3


def test_approval_when_and_signals_of_other_names() -> None:
    src = source(
        '{kind: wait, signal: ok, approval: true, key: "{{ item.k }}", when: "{{ signal.data.level >= item.min }}"}',
        loop=", tolerated_failures: 1",
    )
    lp = Loop(src, [{"k": "a", "min": 2}, {"k": "b", "min": 0}])
    assert lp.timers == []  # no timeout, no until: no deadline
    lp.fold(signal("a", {"approved": True, "level": 5}, name="other"), T0)  # another name: not for this loop
    lp.fold(signal("a", {"approved": True, "level": 1}, name="ok", sid="low"), T0)  # `when` false: kept
    assert lp.run.done == 0
    hi = signal("a", {"approved": True, "level": 3, "by": "mallory", "comment": "fine"}, name="ok", sid="hi")
    lp.fold(msgspec.structs.replace(hi, by="ann"), T0)
    rej = signal("b", {"approved": False, "level": 0, "by": "mallory", "comment": "no way"}, name="ok", sid="rej")
    lp.fold(msgspec.structs.replace(rej, by="bob"), T0)
    (v,) = lp.verdicts
    # an approval's result is {approved, comment, by}, `by` the sender the log records
    assert isinstance(v, IteratorCompleted) and v.results == [{"approved": True, "comment": "fine", "by": "ann"}, None]
    (fail,) = [f for o in lp.outs for f in o.failures]
    # who rejected is the signal's sender, never the `by` its data claims
    assert fail.error.type == "Rejected" and fail.error.message == "step 'each' was rejected by bob: no way"
    # a `when` that cannot be evaluated for a signal (junk from a sender) does not match
    # it: the iteration goes on waiting, the signal is kept; a later iteration's wait
    # (a retry, a later key) meets the kept junk and is not failed by it either
    lp = Loop(source('{kind: wait, signal: ok, key: "{{ item }}", when: "{{ signal.data.n > 2 }}"}'), [1, 2])
    out = lp.fold(signal(1, {"n": "lots"}, name="ok", sid="junk"), T0)
    assert not out.failures and out.verdict is None and lp.run.waiting_count == 2
    assert lp.run.waits is not None and lp.run.waits.kept_count == 1
    lp.fold(signal(1, {"n": 3}, name="ok"), T0)
    lp.fold(signal(2, {"n": 5}, name="ok"), T0)
    (v,) = lp.verdicts
    assert isinstance(v, IteratorCompleted) and v.results == [{"n": 3}, {"n": 5}]


def test_kept_signals_are_bounded_by_bytes() -> None:
    lp = Loop(source('{kind: wait, signal: done, key: "{{ item }}"}'), ["a"])
    big = "x" * (1 << 20)
    for i in range(5):  # for a key nothing waits on: kept, up to MAX_KEPT_BYTES (4 MiB)
        lp.fold(signal("zzz", big, sid=f"big{i}"), T0)
    w = lp.run.waits
    assert w is not None and w.kept_count == 3 and w.kept_bytes <= MAX_KEPT_BYTES
    lp.fold(signal("a", "A"), T0)  # the iteration's own signal still gets through
    (v,) = lp.verdicts
    assert v.results == ["A"]


def test_until_alone_completes_and_bad_until_fails() -> None:
    src = source('{kind: wait, until: "{{ item }}", zone: Europe/Paris}', loop=", tolerated_failures: 2")
    # 09:00 in Paris is 08:00 UTC; an epoch already past completes at once; text that is
    # no time fails `WaitInvalid` (as a wait step does), and so does a number past any float
    lp = Loop(src, ["2027-01-15T09:00:00", T0 - 101, "tomorrow", 10**400], at=T0 - 100)
    (timer,) = lp.outs[0].timers
    assert timer.due == until_epoch("2027-01-15T08:00:00Z")
    assert lp.run.done == 3
    bad, huge = lp.outs[0].failures
    assert bad.index == 2 and bad.error.type == "WaitInvalid" and "tomorrow" in bad.error.message
    assert huge.index == 3 and huge.error.type == "WaitInvalid" and "401 digits" in huge.error.message
    out = lp.fire(timer.timer_id)
    assert isinstance(out.verdict, IteratorCompleted)
    assert out.verdict.results == [{"until": "2027-01-15T08:00:00Z"}, {"until": "2027-01-15T07:58:19Z"}, None, None]


def test_cancel_stops_waiting() -> None:
    lp = Loop(source('{kind: wait, signal: done, key: "{{ item }}"}', extra="    timeout: 60"), [1, 2])
    lp.fold(LoopCancel(execution_id="e1", loop_id="0-1"), T0 + 1)
    assert lp.run.finished and lp.run.waiting_count == 0 and lp.run.pending_timers() == []
    assert not lp.fold(signal(1, "late"), T0 + 2) and lp.verdicts == []
