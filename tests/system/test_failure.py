"""Failure end to end: an abort stopping a real sleep, child executions through the
starter and the catalog, a cancel reaching a child. The on_error and on_failure
semantics are on the pure fold harness (tests/pure/test_semantics_failure.py)."""

from __future__ import annotations

import pytest

from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
FAIL = "{kind: python, code: \"def main(): raise ValueError('bad input')\"}"


async def test_abort_cancels_a_sleeping_sibling_and_fails_within_two_seconds(system: System) -> None:
    """Seed 000's parallel failure path: 2b fails critically, 2a is cancelled, end joins."""
    eid, status = await system.run_yaml(
        HEAD % "abort"
        + f"""
  - step: start
    next: [step2a, step2b]
  - step: step2a
    tool: {{kind: sleep, seconds: 30}}
    next: after_2a
  - step: after_2a
  - step: step2b
    tool: {FAIL}
    on_error: [{{decision: abort}}]
""",
        timeout=10,
    )
    assert status.state == "FAILED"  # within run_yaml's 10 s: step2a's 30 s sleep was not waited for
    items = await system.events(eid)
    assert of_type(items, "command.cancelled", "step2a")
    assert of_type(items, "step.exit", "step2a")[0].data["status"] == "CANCELLED"
    assert of_type(items, "step.exit", "step2b")[0].data["aborted"] is True
    assert not of_type(items, "step.enter", "after_2a")
    assert len(of_type(items, "step.enter", "end")) == 1
    wf = of_type(items, "workflow.failed")[0].data
    assert wf["failed_steps"] == ["step2b"] and wf["cancelled_steps"] == ["step2a"]


CHILD = """apiVersion: actors/v1
kind: Playbook
metadata: {name: child, path: lib/child}
workflow:
  - step: work
    tool: {kind: python, code: "def main(n, fail):\\n    if fail: raise ValueError('child broke')\\n    return n * 10"}
    args: {n: "{{ workload.n }}", fail: "{{ workload.fail }}"}
  - step: end
    args: {value: "{{ work }}"}
"""


async def test_sub_playbook_result_and_status_are_inherited(system: System) -> None:
    child = system.tmp / "child.yaml"
    child.write_text(CHILD)
    await system.client.register(child)
    parent = (
        HEAD % "parent"
        + """
  - step: call_child
    tool: {kind: playbook, path: lib/child}
    args: {n: 4, fail: "{{ workload.fail }}"}
    on_failure: fallback
  - step: fallback
    args: {reason: "{{ failure.error.message }}"}
"""
    )
    eid, status = await system.run_yaml(parent, payload={"fail": False})
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    child_id = of_type(items, "command.issued", "call_child")[0].data["child_execution_id"]
    assert of_type(items, "playbook.completed")[0].data["result"] == {"call_child": {"value": 40}}
    child_status = await system.client.status(child_id)
    assert child_status is not None and child_status.state == "COMPLETED"
    child_init = of_type(await system.events(child_id), "playbook.initialized")[0].data
    assert child_init["parent_execution_id"] == eid and child_init["parent_step"] == "call_child"

    eid, status = await system.run_yaml(parent, payload={"fail": True})
    assert status.state == "COMPLETED"  # the child failed; the parent remediated
    items = await system.events(eid)
    failed = of_type(items, "step.exit", "call_child")[0].data
    assert failed["status"] == "FAILED" and failed["error"]["type"] == "ChildFailed"
    reason = of_type(items, "playbook.completed")[0].data["result"]["fallback"]["reason"]
    # the child's error names its root cause (its first unhandled failure), not a list of steps
    assert "failed at step 'work': ValueError: child broke" in reason
    child_id = of_type(items, "command.issued", "call_child")[0].data["child_execution_id"]
    assert (await system.client.status(child_id)).state == "FAILED"  # type: ignore[union-attr]


async def test_cancelling_a_parent_cancels_its_child(system: System) -> None:
    child = system.tmp / "sleepy.yaml"
    child.write_text("""apiVersion: actors/v1
kind: Playbook
metadata: {name: sleepy}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 30}
""")
    await system.client.register(child)
    path = system.tmp / "parent.yaml"
    path.write_text(HEAD % "parent_of_sleepy" + "  - step: call\n    tool: {kind: playbook, path: sleepy}\n")
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path)
    child_id = None
    async for item in system.client.follow(eid):
        if item.type == "command.issued":
            child_id = item.data["child_execution_id"]
            break
    assert child_id
    async for item in system.client.follow(child_id):
        if item.type == "command.issued":
            break
    await system.client.cancel(eid, "no longer needed")
    assert (await system.client.wait(eid, timeout=10)).state == "CANCELLED"
    assert (await system.client.wait(child_id, timeout=10)).state == "CANCELLED"


async def test_an_unknown_child_playbook_fails_the_parent_step(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "orphan" + "  - step: call\n    tool: {kind: playbook, path: nope/missing}\n"
    )
    assert status.state == "FAILED"
    err = of_type(await system.events(eid), "step.exit", "call")[0].data["error"]
    assert err["type"] == "ChildFailed" and "nope/missing" in err["message"]
