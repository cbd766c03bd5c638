"""Retry from a step (`actors-cli retry`, `Client.retry`) on the pure fold harness: what
a retry keeps of the old execution (completed steps' results, last visit wins, loops
whole), where it starts, the payload merged over the old one, what it refuses, and
that both logs name each other and replay the same. No NATS."""

from __future__ import annotations

from typing import Any

import pytest

from actors.core.rerun import RetryRefused
from actors.wire.messages import RetryOf
from tests.harness import PENDING, Call, Fail, Harness, replay

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\n"
PY = '{kind: python, code: "def main(): pass"}'

CHAIN = (
    HEAD % "chain"
    + f"""
workload: {{x: 1, cfg: {{p: 1, q: 2}}}}
workflow:
  - step: fetch
    tool: {PY}
    args: {{x: "{{{{ workload.x }}}}"}}
    next: transform
  - step: transform
    tool: {PY}
    args: {{v: "{{{{ fetch.v }}}}", q: "{{{{ workload.cfg.q }}}}"}}
    next: store
  - step: store
    tool: {PY}
    args: {{t: "{{{{ transform.t }}}}"}}
"""
)


def failing_chain() -> tuple[Harness, str]:
    """CHAIN run with `transform` failing: fetch completed, store never ran."""
    h = Harness({"fetch": {"v": 10}, "transform": Fail("Boom", "transient outage"), "store": "stored"})
    run = h.run(CHAIN)
    assert run.status == "FAILED" and run.error is not None and run.error["step"] == "transform"
    return h, run.execution_id


def test_retry_runs_again_from_the_failed_step_with_the_completed_results_in_scope() -> None:
    h, old = failing_chain()
    seen: list[Call] = []

    def transform(c: Call) -> Any:
        seen.append(c)
        return {"t": c.args["v"] * 2}

    h.tools = {"fetch": Fail("Unexpected", "fetch must not run again"), "transform": transform, "store": "stored"}
    new = h.retry(old)
    run = h.run()
    assert run.status == "COMPLETED"
    assert run.entered()[0] == "transform" and "fetch" not in run.entered()
    assert [c.step for c in run.calls] == ["transform", "store"]
    assert seen[0].args == {"v": 10, "q": 2}  # {{ fetch.v }} is the old execution's result
    assert run.result == {"store": "stored"}
    assert run.events("workflow.initialized")[0].data["entry"] == "transform"
    link = run.events("execution.retry_of")[0].data
    assert link == {"execution_id": old, "from_step": "transform", "kept_steps": ["fetch"]}
    # the old log names its retry, and stays FAILED
    old_run = h.runs[old]
    assert [e.data for e in old_run.events("execution.retried")] == [
        {"retry_execution_id": new, "from_step": "transform"}
    ]
    assert old_run.status == "FAILED"
    assert replay(run) and replay(old_run)


def test_from_a_completed_step_runs_it_again_and_drops_its_old_result() -> None:
    h, old = failing_chain()
    h.tools = {"fetch": lambda c: {"v": c.args["x"] + 100}, "transform": lambda c: {"t": c.args["v"]}}
    h.retry(old, from_step="fetch")
    run = h.run()
    assert run.status == "COMPLETED"
    assert [c.step for c in run.calls] == ["fetch", "transform", "store"]
    assert run.calls[1].args["v"] == 101  # the new fetch's result, not the kept one
    assert run.events("execution.retry_of")[0].data["kept_steps"] == []


def test_the_payload_given_is_merged_over_the_old_start_payload() -> None:
    h = Harness({"fetch": {"v": 1}, "transform": Fail("Boom"), "store": "s"})
    old = h.run(CHAIN, {"x": 5, "cfg": {"p": 7}}).execution_id
    h.tools = {"transform": lambda c: {"t": c.args["q"]}, "store": "s"}
    h.retry(old, payload={"cfg": {"q": 9}})
    run = h.run()
    assert run.status == "COMPLETED"
    assert h.state(run.execution_id).workload == {"x": 5, "cfg": {"p": 7, "q": 9}}
    assert run.calls[0].args == {"v": 1, "q": 9}


def test_a_step_visited_more_than_once_keeps_its_last_completed_visit() -> None:
    source = (
        HEAD % "cycle"
        + f"""
workflow:
  - step: count
    tool: {PY}
    args: {{n: "{{{{ (count.n + 1) if count is defined else 1 }}}}"}}
    next:
      - when: "{{{{ result.n < 3 }}}}"
        then: [count]
      - then: [report]
  - step: report
    tool: {PY}
    args: {{n: "{{{{ count.n }}}}"}}
"""
    )
    h = Harness({"count": lambda c: {"n": c.args["n"]}, "report": Fail("Boom")})
    old = h.run(source)
    assert old.status == "FAILED" and [c.args["n"] for c in old.calls if c.step == "count"] == [1, 2, 3]
    h.tools = {"report": lambda c: c.args}
    h.retry(old.execution_id)
    run = h.run()
    assert run.status == "COMPLETED" and [c.step for c in run.calls] == ["report"]
    assert run.calls[0].args == {"n": 3}


LOOPED = (
    HEAD % "looped"
    + f"""
workload: {{xs: [1, 2, 3]}}
workflow:
  - step: each
    tool: {PY}
    args: {{x: "{{{{ x }}}}"}}
    loop: {{collection: "{{{{ workload.xs }}}}", element: x, mode: async, concurrency: 3}}
    next: total
  - step: total
    tool: {PY}
    args: {{xs: "{{{{ each }}}}"}}
"""
)


def test_a_completed_loop_is_kept_whole_and_a_failed_loop_runs_every_iteration_again() -> None:
    h = Harness({"each": lambda c: c.args["x"] * 10, "total": Fail("Boom")})
    old = h.run(LOOPED)
    assert old.status == "FAILED"
    h.tools = {"total": lambda c: sum(c.args["xs"])}
    h.retry(old.execution_id)
    run = h.run()
    assert run.status == "COMPLETED" and [c.step for c in run.calls] == ["total"]
    assert run.result == {"total": 60}

    def each(c: Call) -> Any:
        if c.args["x"] == 2:
            raise Fail("Boom", "iteration 2")
        return c.args["x"]

    h = Harness({"each": each})
    old = h.run(LOOPED)
    assert old.status == "FAILED" and old.error is not None and old.error["step"] == "each"
    h.tools = {"each": lambda c: c.args["x"], "total": lambda c: sum(c.args["xs"])}
    h.retry(old.execution_id)
    run = h.run()
    assert run.status == "COMPLETED"
    assert sorted(c.args["x"] for c in run.calls if c.step == "each") == [1, 2, 3]  # the whole loop again
    assert run.result == {"total": 6}


def test_parallel_branches_not_downstream_of_the_step_are_not_run_again() -> None:
    source = (
        HEAD % "fan"
        + f"""
workflow:
  - step: start
    next: [left, right]
  - step: left
    tool: {PY}
  - step: right
    tool: {PY}
    next: after
  - step: after
    tool: {PY}
    args: {{l: "{{{{ left }}}}"}}
  - step: end
"""
    )
    h = Harness({"left": "L", "right": Fail("Boom")})
    old = h.run(source)
    assert old.status == "FAILED"
    h.tools = {"right": "R", "after": lambda c: c.args}
    h.retry(old.execution_id)
    run = h.run()
    assert run.status == "COMPLETED"
    assert [c.step for c in run.calls] == ["right", "after"]
    assert run.calls[1].args == {"l": "L"}  # the other branch's result is in scope
    assert run.result == {"after": {"l": "L"}}  # end maps the branches this execution ran


def test_what_a_retry_refuses() -> None:
    h = Harness({"fetch": PENDING})
    running = h.run(CHAIN).execution_id
    with pytest.raises(RetryRefused, match=r"is RUNNING: only a terminal execution"):
        h.retry(running)
    h, old = failing_chain()
    with pytest.raises(RetryRefused, match=r"step 'store' never ran in execution .*: --from takes a step it entered"):
        h.retry(old, from_step="store")
    with pytest.raises(RetryRefused, match=r"has no step 'nope' \(steps: fetch, transform, store"):
        h.retry(old, from_step="nope")
    with pytest.raises(RetryRefused, match=r"cannot start from 'end'"):
        h.retry(old, from_step="end")
    h = Harness({"fetch": {"v": 1}, "transform": {"t": 2}, "store": "s"})
    done = h.run(CHAIN).execution_id
    with pytest.raises(RetryRefused, match=r"is COMPLETED with no failed step to retry from: name one with --from"):
        h.retry(done)
    h.retry(done, from_step="store")  # a completed execution retried from a named step
    assert h.run().status == "COMPLETED"
    h = Harness()
    bad = h.run("not: [a playbook").execution_id
    with pytest.raises(RetryRefused, match=r"failed before its first step \(its playbook .*\): start it again"):
        h.retry(bad)


def test_a_retry_record_naming_a_step_the_playbook_lacks_fails_at_start_saying_so() -> None:
    """A start message published by hand can name any step: the fold checks it."""
    h = Harness()
    h.start(CHAIN, retry_of=RetryOf(execution_id="old", from_step="gone", results={}))
    run = h.run()
    assert run.status == "FAILED" and run.error is not None
    assert run.error["type"] == "RetryInvalid" and "has no step 'gone'" in run.error["message"]
