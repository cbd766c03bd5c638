"""The step budget on the pure fold harness: a cycle of any steps (routers, tools,
remediation) ends with `StepBudgetExceeded`, as an abort does, and the budget is the
smaller of the playbook's and the pod's. No NATS."""

from __future__ import annotations

import pytest

from actors.wire.messages import Limits
from tests.harness import PENDING, Fail, Harness, replay

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\n"


def test_a_router_cycle_fails_with_step_budget_exceeded() -> None:
    run = Harness().run(HEAD % "cycle" + "limits: {max_steps: 50}\nworkflow:\n  - step: a\n    next: a\n")
    assert run.status == "FAILED" and run.error is not None
    assert run.error["type"] == "StepBudgetExceeded" and run.error["step"] == "a" and run.error["failed_steps"] == ["a"]
    assert "50 steps" in run.error["message"] and "step 'a'" in run.error["message"]
    assert len(run.entered()) == 50 + 1  # the budget, then end
    [exceeded] = run.events("step.budget_exceeded")
    assert exceeded.step == "a" and exceeded.data["budget"] == 50
    assert replay(run)


def test_a_python_cycle_is_bounded_and_running_commands_are_cancelled() -> None:
    h = Harness({"nap": PENDING, "spin": 1})  # the sleep never answers: it still runs when the budget runs out
    run = h.run(
        HEAD % "pycycle"
        + """limits: {max_steps: 9}
workflow:
  - step: start
    next: [spin, nap]
  - step: nap
    tool: {kind: sleep, seconds: 60}
  - step: spin
    tool: {kind: python, code: "def main(): return 1"}
    next: again
  - step: again
    next: spin
"""
    )
    assert run.status == "FAILED" and run.error is not None and run.error["type"] == "StepBudgetExceeded"
    [nap] = [c for c in run.calls if c.step == "nap"]
    assert run.cancelled == [nap.command_id] and not h.running()
    assert run.events("step.exit", "nap")[0].data["status"] == "CANCELLED"
    assert len(run.entered()) == 9 + 1


def test_a_remediation_cycle_is_bounded_too() -> None:
    """A step that remediates itself: each failure routes to a new visit of it."""
    run = Harness().run(
        HEAD % "remedy"
        + """limits: {max_steps: 30}
workflow:
  - step: a
    args: {v: "{{ workload.nope }}"}
    on_failure: a
"""
    )
    assert run.status == "FAILED" and run.error is not None and run.error["type"] == "StepBudgetExceeded"
    last = run.events("step.exit", "a")[-1]
    assert last.data["failure_route"]["status"] == "step_budget_exceeded"  # its failure stays unhandled


@pytest.mark.parametrize(("own", "pod", "budget"), [(30, 20, 20), (20, 30, 20), (None, 25, 25)])
def test_the_smaller_of_playbook_and_pod_budget_holds(own: int | None, pod: int, budget: int) -> None:
    limits = f"limits: {{max_steps: {own}}}\n" if own else ""
    source = HEAD % "cycle" + limits + "workflow:\n  - step: a\n    next: a\n"
    run = Harness(limits=Limits(max_activations=pod)).run(source)
    assert run.status == "FAILED" and run.error is not None
    assert len(run.entered()) == budget + 1
    assert f"{budget} steps" in run.error["message"]


def test_retries_are_attempts_not_steps() -> None:
    run = Harness({"a": lambda c: 1 if c.attempt == 5 else Fail("Boom", "again")}).run(
        HEAD % "attempts"
        + """limits: {max_steps: 2}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): pass"}
    retry: {max_attempts: 5, initial_delay: 0.1}
"""
    )
    assert run.status == "COMPLETED" and len(run.calls) == 5
