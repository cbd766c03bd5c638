"""Seed 000's four scenarios, routing, parallel joins: real server, real actors."""

from __future__ import annotations

import pytest

from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

HEAD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: %s}
"""


def lifecycle(items):  # the lifecycle events, in log order
    return [i.type for i in items if i.cls == "lc"]


async def test_success_path_runs_steps_in_order_and_completes_at_end(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "success" + """
workload: {x: 2}
workflow:
  - step: start
    tool: {kind: python, code: "def main(x): return {'v': x + 1}"}
    args: {x: "{{ workload.x }}"}
    next: double
  - step: double
    tool: {kind: python, code: "def main(v): return {'v': v * 2}"}
    args: {v: "{{ start.v }}"}
    next: end
  - step: end
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert [i.step for i in of_type(items, "step.exit")] == ["start", "double", "end"]
    assert lifecycle(items) == ["playbook.initialized", "workflow.initialized", "workflow.completed", "playbook.completed"]
    done = of_type(items, "playbook.completed")[0].data
    assert done["result"] == {"double": {"v": 6}}
    wf = of_type(items, "workflow.completed")[0].data
    assert wf["evaluated_by_end_step"] is True and wf["failed_steps_count"] == 0 and wf["total_steps"] == 3
    assert status.terminal_event == "playbook.completed"
    assert status.started_at is not None and status.ended_at is not None and status.ended_at >= status.started_at


async def test_failed_step_routes_to_end_which_fails_the_workflow(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "failure" + """
workflow:
  - step: start
    next: divide
  - step: divide
    tool: {kind: python, code: "def main(): return 1 / 0"}
    next: never
  - step: never
    tool: {kind: noop}
""")
    assert status.state == "FAILED"
    items = await system.events(eid)
    failed = of_type(items, "step.exit", "divide")[0].data
    assert failed["status"] == "FAILED"
    assert failed["routed_to_end"] is True and failed["original_failed_step"] == "divide"
    assert failed["error"]["type"] == "ZeroDivisionError"
    assert "division by zero" in failed["error"]["message"]
    assert of_type(items, "call.error", "divide")[0].data["error"]["traceback"]
    assert not of_type(items, "step.enter", "never")
    # the failed step does not fail the workflow itself: end runs and evaluates
    types = [i.type for i in items]
    assert types.index("step.exit") < types.index("workflow.failed")
    assert of_type(items, "step.enter", "end")
    assert lifecycle(items)[-2:] == ["workflow.failed", "playbook.failed"]
    meta = of_type(items, "playbook.failed")[0].data
    assert meta["evaluated_by_end_step"] is True and meta["failed_steps_count"] == 1
    assert meta["failed_steps"] == ["divide"]


async def test_step_without_next_routes_implicitly_to_injected_end(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "implicit" + """
workflow:
  - step: only
    tool: {kind: python, code: "def main(): return 42"}
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert [i.step for i in of_type(items, "step.enter")] == ["only", "end"]
    assert of_type(items, "playbook.completed")[0].data["result"] == {"only": 42}


async def test_conditional_routing_takes_first_matching_rule_else_otherwise(system: System) -> None:
    yaml = HEAD % "routing" + """
workflow:
  - step: start
    tool: {kind: python, code: "def main(n): return {'count': n}"}
    args: {n: "{{ workload.n }}"}
    next:
      - when: "{{ result.count > 10 }}"
        then: big
      - when: "{{ result.count > 0 }}"
        then: [small]
      - else: zero
  - step: big
  - step: small
  - step: zero
"""
    for n, expected in ((50, "big"), (5, "small"), (0, "zero")):
        eid, status = await system.run_yaml(yaml, payload={"n": n})
        assert status.state == "COMPLETED"
        entered = [i.step for i in of_type(await system.events(eid), "step.enter")]
        assert entered == ["start", expected, "end"], (n, entered)


async def test_parallel_branches_join_at_end_exactly_once(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "parallel" + """
workflow:
  - step: start
    next: [router, fast, slow, medium]
  - step: router
    args: {decided: "in the engine, before the other branches run"}
  - step: fast
    tool: {kind: python, code: "def main(): return 'f'"}
  - step: slow
    tool: {kind: sleep, seconds: 0.3}
    next: after_slow
  - step: after_slow
    tool: {kind: python, code: "def main(): return 'as'"}
  - step: medium
    tool: {kind: sleep, seconds: 0.1}
  - step: end
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert len(of_type(items, "step.enter", "end")) == 1
    end_enter = items.index(of_type(items, "step.enter", "end")[0])
    # every branch finished before end started
    for s in ("router", "fast", "medium", "after_slow"):
        assert items.index(of_type(items, "step.exit", s)[0]) < end_enter
    result = of_type(items, "playbook.completed")[0].data["result"]
    assert result == {
        "router": {"decided": "in the engine, before the other branches run"},
        "fast": "f",
        "medium": {"slept": 0.1},
        "after_slow": "as",
    }
    assert len([t for t in lifecycle(items) if t == "playbook.completed"]) == 1


async def test_user_end_with_a_tool_returns_its_result(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "user_end" + """
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return [1, 2, 3]"}
  - step: end
    tool: {kind: python, code: "def main(xs): return {'sum': sum(xs)}"}
    args: {xs: "{{ a }}"}
""")
    assert status.state == "COMPLETED"
    assert of_type(await system.events(eid), "playbook.completed")[0].data["result"] == {"sum": 6}


async def test_shell_step_result_feeds_templates(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "shell" + """
workflow:
  - step: hello
    tool: {kind: shell, command: "echo hello-$WHO", env: {WHO: "{{ workload.who }}"}}
  - step: end
    args: {said: "{{ hello.stdout | trim }}"}
""", payload={"who": "nats"})
    assert status.state == "COMPLETED"
    assert of_type(await system.events(eid), "playbook.completed")[0].data["result"] == {"said": "hello-nats"}
