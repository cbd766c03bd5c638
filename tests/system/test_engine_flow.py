"""Routing and parallel joins end to end: real server, real actors, real tools. The
routing semantics themselves are on the pure fold harness (tests/pure/test_semantics_flow.py)."""

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
    eid, status = await system.run_yaml(
        HEAD % "success"
        + """
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
"""
    )
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert [i.step for i in of_type(items, "step.exit")] == ["start", "double", "end"]
    assert lifecycle(items) == [
        "playbook.initialized",
        "workflow.initialized",
        "workflow.completed",
        "playbook.completed",
    ]
    done = of_type(items, "playbook.completed")[0].data
    assert done["result"] == {"double": {"v": 6}}
    wf = of_type(items, "workflow.completed")[0].data
    assert wf["evaluated_by_end_step"] is True and wf["failed_steps_count"] == 0 and wf["total_steps"] == 3
    assert status.terminal_event == "playbook.completed"
    assert status.started_at is not None and status.ended_at is not None and status.ended_at >= status.started_at


async def test_parallel_branches_join_at_end_exactly_once(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "parallel"
        + """
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
"""
    )
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


async def test_shell_step_result_feeds_templates(system: System) -> None:
    eid, status = await system.run_yaml(
        HEAD % "shell"
        + """
workflow:
  - step: hello
    tool: {kind: shell, command: "echo hello-$WHO", env: {WHO: "{{ workload.who }}"}}
  - step: end
    args: {said: "{{ hello.stdout | trim }}"}
""",
        payload={"who": "nats"},
    )
    assert status.state == "COMPLETED"
    assert of_type(await system.events(eid), "playbook.completed")[0].data["result"] == {"said": "hello-nats"}
