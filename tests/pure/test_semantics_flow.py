"""Routing semantics on the pure fold harness: the order steps run in, conditional
routing, parallel branches joining at `end`, what `end` returns, routing slices, and
that every run replays to the same decisions. No NATS: milliseconds per test."""

from __future__ import annotations

import pytest

from actors.core.decide import ROUTING_SLICE
from tests.harness import PENDING, Fail, Harness, replay

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\n"
PY = '{kind: python, code: "def main(): pass"}'


def chain(n: int) -> str:
    """n routers, each routing to the next."""
    steps = "".join(f"  - step: s{i}\n    next: s{i + 1}\n" for i in range(n - 1))
    return HEAD % "chain" + "workflow:\n" + steps + f"  - step: s{n - 1}\n"


def test_success_path_runs_steps_in_order_and_completes_at_end() -> None:
    run = Harness({"start": lambda c: {"v": c.args["x"] + 1}, "double": lambda c: {"v": c.args["v"] * 2}}).run(
        HEAD % "success"
        + f"""
workload: {{x: 2}}
workflow:
  - step: start
    tool: {PY}
    args: {{x: "{{{{ workload.x }}}}"}}
    next: double
  - step: double
    tool: {PY}
    args: {{v: "{{{{ start.v }}}}"}}
    next: end
  - step: end
"""
    )
    assert run.status == "COMPLETED"
    assert run.exits() == [("start", "COMPLETED"), ("double", "COMPLETED"), ("end", "COMPLETED")]
    assert run.lifecycle() == [
        "playbook.initialized",
        "workflow.initialized",
        "workflow.completed",
        "playbook.completed",
    ]
    assert run.result == {"double": {"v": 6}}
    wf = run.events("workflow.completed")[0].data
    assert wf["evaluated_by_end_step"] is True and wf["failed_steps_count"] == 0 and wf["total_steps"] == 3
    assert [c.args for c in run.calls] == [{"x": 2}, {"v": 3}]
    assert replay(run)


def test_failed_step_routes_to_end_which_fails_the_workflow() -> None:
    run = Harness({"divide": Fail("ZeroDivisionError", "division by zero")}).run(
        HEAD % "failure"
        + f"""
workflow:
  - step: start
    next: divide
  - step: divide
    tool: {PY}
    next: never
  - step: never
    tool: {{kind: noop}}
"""
    )
    assert run.status == "FAILED"
    failed = run.events("step.exit", "divide")[0].data
    assert failed["status"] == "FAILED" and failed["routed_to_end"] is True
    assert failed["original_failed_step"] == "divide" and failed["error"]["type"] == "ZeroDivisionError"
    assert "never" not in run.entered()
    # the failed step does not fail the workflow itself: end runs and evaluates
    assert run.entered() == ["start", "divide", "end"]
    assert run.lifecycle()[-2:] == ["workflow.failed", "playbook.failed"]
    meta = run.events("playbook.failed")[0].data
    assert meta["evaluated_by_end_step"] is True and meta["failed_steps_count"] == 1
    assert meta["failed_steps"] == ["divide"]
    assert run.error is not None and run.error["type"] == "ZeroDivisionError" and run.error["step"] == "divide"


def test_step_without_next_routes_implicitly_to_injected_end() -> None:
    run = Harness({"only": 42}).run(HEAD % "implicit" + f"workflow:\n  - step: only\n    tool: {PY}\n")
    assert run.status == "COMPLETED"
    assert run.entered() == ["only", "end"]
    assert run.result == {"only": 42}


@pytest.mark.parametrize(("n", "expected"), [(50, "big"), (5, "small"), (0, "zero")])
def test_conditional_routing_takes_first_matching_rule_else_otherwise(n: int, expected: str) -> None:
    run = Harness({"start": lambda c: {"count": c.args["n"]}}).run(
        HEAD % "routing"
        + f"""
workflow:
  - step: start
    tool: {PY}
    args: {{n: "{{{{ workload.n }}}}"}}
    next:
      - when: "{{{{ result.count > 10 }}}}"
        then: big
      - when: "{{{{ result.count > 0 }}}}"
        then: [small]
      - else: zero
  - step: big
  - step: small
  - step: zero
""",
        {"n": n},
    )
    assert run.status == "COMPLETED"
    assert run.entered() == ["start", expected, "end"]


def test_parallel_branches_join_at_end_exactly_once() -> None:
    h = Harness({"slow": PENDING, "fast": "f", "after_slow": "as", "medium": {"slept": 0.1}})
    source = (
        HEAD % "parallel"
        + f"""
workflow:
  - step: start
    next: [router, fast, slow, medium]
  - step: router
    args: {{decided: "in the engine, before the other branches run"}}
  - step: fast
    tool: {PY}
  - step: slow
    tool: {{kind: sleep, seconds: 0.3}}
    next: after_slow
  - step: after_slow
    tool: {PY}
  - step: medium
    tool: {{kind: sleep, seconds: 0.1}}
  - step: end
"""
    )
    run = h.run(source)
    assert run.status == "RUNNING" and "end" not in run.entered()  # one branch still runs: end waits
    [slow] = h.running()
    h.answer(slow.command_id, {"slept": 0.3})
    run = h.run()
    assert run.status == "COMPLETED"
    assert run.entered().count("end") == 1
    end_at = run.items.index(run.events("step.enter", "end")[0])
    for s in ("router", "fast", "medium", "after_slow"):
        assert run.items.index(run.events("step.exit", s)[0]) < end_at
    assert run.result == {
        "router": {"decided": "in the engine, before the other branches run"},
        "fast": "f",
        "medium": {"slept": 0.1},
        "after_slow": "as",
    }
    assert run.lifecycle().count("playbook.completed") == 1
    assert replay(run)


def test_user_end_with_a_tool_returns_its_result() -> None:
    run = Harness({"a": [1, 2, 3], "end": lambda c: {"sum": sum(c.args["xs"])}}).run(
        HEAD % "user_end"
        + f"""
workflow:
  - step: a
    tool: {PY}
  - step: end
    tool: {PY}
    args: {{xs: "{{{{ a }}}}"}}
"""
    )
    assert run.status == "COMPLETED" and run.result == {"sum": 6}


def test_routing_keeps_the_depth_first_order_of_events() -> None:
    """A branch runs on until it waits before its sibling starts, as before routing was
    a loop: logs written by an older engine replay to the same decisions."""
    run = Harness().run(
        HEAD % "order"
        + f"""workflow:
  - step: start
    next: [a, b]
  - step: a
    next: a2
  - step: a2
    tool: {PY}
  - step: b
    next: b2
  - step: b2
"""
    )
    order = [(i.type, i.step) for i in run.items if i.cls == "ev"]
    assert order == [
        ("step.enter", "start"),
        ("step.exit", "start"),
        ("step.enter", "a"),
        ("step.enter", "b"),
        ("step.exit", "a"),
        ("step.enter", "a2"),
        ("command.issued", "a2"),
        ("step.exit", "b"),
        ("step.enter", "b2"),
        ("step.exit", "b2"),
        ("step.exit", "a2"),
        ("step.enter", "end"),
        ("step.exit", "end"),
    ]


def test_a_chain_of_10000_routers_folds_without_deep_recursion_in_bounded_decisions() -> None:
    """Routing is a loop over pending work, not recursion (no stack overflow), and no
    decision starts more than its slice. How fast it folds is for bench/, not a test."""
    run = Harness().run(chain(10_000))
    assert run.status == "COMPLETED"
    assert len(run.events("step.exit")) == 10_001  # every router, then end
    # no decision starts more than its slice: each decision record stays far below a message's size
    decisions = [i for i in run.items if i.cls == "in"]
    assert (
        max(sum(1 for e in run.items if e.seq == d.seq and e.type == "step.enter") for d in decisions)
        <= ROUTING_SLICE + 1
    )
    assert len(decisions) == 1 + 10_001 // ROUTING_SLICE  # the start, then one resume timer per slice
    assert len(run.events("routing.paused")) == 10_001 // ROUTING_SLICE


def test_a_cancel_between_two_slices_stops_the_chain() -> None:
    h = Harness()
    eid = h.start(chain(5_000))
    run = h.run(until=lambda h: bool(h.runs) and len(h.runs[eid].inputs) == 1)  # the first slice only
    h.cancel(eid, "enough")
    run = h.run()
    assert run.status == "CANCELLED"
    # the slice's routers ran; the next one, entered but not begun, was cancelled
    assert len(run.events("step.exit")) == ROUTING_SLICE and len(run.events("step.enter")) == ROUTING_SLICE + 1
    assert run.events("execution.cancelled")[0].data["reason"] == "enough"


def test_the_first_unhandled_failure_is_the_root_cause() -> None:
    tools = {"a": Fail("Timeout", "no answer after 1s"), "b": Fail("ValueError", "later")}
    run = Harness(tools).run(
        HEAD % "two"
        + f"""workflow:
  - step: start
    next: [a, b]
  - step: a
    tool: {PY}
  - step: b
    tool: {PY}
"""
    )
    assert run.error == {
        "type": "Timeout",
        "message": "no answer after 1s",
        "step": "a",
        "failed_steps": ["a", "b"],
        "retryable": False,
        "status": None,
    }


def test_an_end_that_fails_alone_is_the_root_cause() -> None:
    run = Harness().run(
        HEAD % "endfails"
        + """workflow:
  - step: a
  - step: end
    args: {v: "{{ workload.no_such_key }}"}
"""
    )
    assert run.error is not None
    assert run.error["type"] == "TemplateError" and run.error["step"] == "end" and run.error["failed_steps"] == ["end"]
    assert "no_such_key" in run.error["message"]


def test_replay_notices_a_decision_that_differs() -> None:
    """The determinism check can fail: a run whose log does not fold to what it recorded."""
    run = Harness({"only": 42}).run(HEAD % "tampered" + f"workflow:\n  - step: only\n    tool: {PY}\n")
    assert replay(run)
    other = Harness({"only": 43}).run(HEAD % "tampered" + f"workflow:\n  - step: only\n    tool: {PY}\n")
    run.inputs[-1] = other.inputs[-1]  # a different result than the one the decisions were made on
    assert not replay(run)
