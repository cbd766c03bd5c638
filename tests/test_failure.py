"""Failure semantics: on_error decisions, on_failure remediation, abort, children, cancel."""

from __future__ import annotations

import time

import pytest

from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
FAIL = '{kind: python, code: "def main(): raise ValueError(\'bad input\')"}'


def decided(items, step):  # type: ignore[no-untyped-def]
    return [i.data for i in of_type(items, "step.failure_decided", step)]


async def test_ignore_completes_the_step_with_the_given_result_and_routes_on(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "ignore" + f"""
  - step: lookup
    tool: {FAIL}
    on_error:
      - when: "{{{{ error.type == 'ValueError' }}}}"
        decision: ignore
        result: {{found: false}}
    next: use
  - step: use
    args: {{found: "{{{{ lookup.found }}}}"}}
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert decided(items, "lookup")[0]["decision"] == "ignore"
    assert decided(items, "lookup")[0]["rule"] == "on_error[0]"
    assert of_type(items, "step.exit", "lookup")[0].data["status"] == "COMPLETED"
    assert of_type(items, "playbook.completed")[0].data["result"] == {"use": {"found": False}}


async def test_none_is_default_handling_and_fails_the_playbook(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "none" + f"""
  - step: a
    tool: {FAIL}
    on_error:
      - when: "{{{{ error.status == 404 }}}}"
        decision: ignore
      - decision: none
""")
    assert status.state == "FAILED"
    d = decided(await system.events(eid), "a")
    assert d[0]["decision"] == "none" and d[0]["rule"] == "on_error[1]"


async def test_cancel_decision_cancels_the_step_and_its_branch_goes_to_end(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "cancel_step" + f"""
  - step: start
    next: [optional, main]
  - step: optional
    tool: {FAIL}
    on_error: [{{decision: cancel}}]
    next: never
  - step: never
  - step: main
    tool: {{kind: python, code: "def main(): return 'main done'"}}
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert of_type(items, "step.exit", "optional")[0].data["status"] == "CANCELLED"
    assert not of_type(items, "step.enter", "never")
    assert of_type(items, "workflow.completed")[0].data["cancelled_steps"] == ["optional"]


async def test_retry_decision_retries_now_with_new_args(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "retry_args" + """
  - step: divide
    tool: {kind: python, code: "def main(d): return 10 / d"}
    args: {d: 0}
    on_error:
      - when: "{{ error.type == 'ZeroDivisionError' and attempt == 1 }}"
        decision: retry
        args: {d: 5}
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert [c.data["attempt_number"] for c in of_type(items, "command.issued", "divide")] == [1, 2]
    assert of_type(items, "playbook.completed")[0].data["result"] == {"divide": 2.0}


async def test_retry_later_waits_on_a_durable_timer_outside_the_retry_budget(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "retry_later" + """
  - step: flaky
    tool: {kind: python, code: "def main(ok): \\n    if not ok: raise RuntimeError('RateLimited')\\n    return 'ok'"}
    args: {ok: false}
    retry: {max_attempts: 1}
    on_error:
      - when: "{{ attempt == 1 }}"
        decision: retry_later
        delay: 0.3
        args: {ok: true}
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    sched = of_type(items, "retry.scheduled", "flaky")
    assert len(sched) == 1 and sched[0].data["delay"] == 0.3 and sched[0].data["reason"] == "on_error:retry_later"
    assert len([i for i in of_type(items, "timer.fired") if i.cls == "in"]) == 1


async def test_handled_failure_does_not_fail_the_playbook(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "handled" + f"""
  - step: a
    tool: {FAIL}
    on_error: [{{decision: handled}}]
""")
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    exit_ = of_type(items, "step.exit", "a")[0].data
    assert exit_["status"] == "FAILED" and exit_["handled"] is True
    wf = of_type(items, "workflow.completed")[0].data
    assert wf["failed_steps_count"] == 0 and wf["handled_failures"] == ["a"]


async def test_abort_cancels_a_sleeping_sibling_and_fails_within_two_seconds(system: System) -> None:
    """Seed 000's parallel failure path: 2b fails critically, 2a is cancelled, end joins."""
    started = time.monotonic()
    eid, status = await system.run_yaml(HEAD % "abort" + f"""
  - step: start
    next: [step2a, step2b]
  - step: step2a
    tool: {{kind: sleep, seconds: 30}}
    next: after_2a
  - step: after_2a
  - step: step2b
    tool: {FAIL}
    on_error: [{{decision: abort}}]
""", timeout=10)
    assert status.state == "FAILED"
    assert time.monotonic() - started < 2.0
    items = await system.events(eid)
    assert of_type(items, "command.cancelled", "step2a")
    assert of_type(items, "step.exit", "step2a")[0].data["status"] == "CANCELLED"
    assert of_type(items, "step.exit", "step2b")[0].data["aborted"] is True
    assert not of_type(items, "step.enter", "after_2a")
    assert len(of_type(items, "step.enter", "end")) == 1
    wf = of_type(items, "workflow.failed")[0].data
    assert wf["failed_steps"] == ["step2b"] and wf["cancelled_steps"] == ["step2a"]


async def test_on_failure_routes_to_remediation_with_a_bounded_failure_envelope(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "remediate" + """
  - step: load
    tool: {kind: python, code: "def main(): raise RuntimeError('disk full ' + 'x' * 20000)"}
    retry: {max_attempts: 2, initial_delay: 0.05}
    on_failure: cleanup
  - step: cleanup
    tool:
      kind: python
      code: |
        def main(f):
            return {"step": f["step"], "attempt": f["attempt"], "max": f["max_attempts"],
                    "type": f["error"]["type"], "attempts": f["retry_summary"]["attempts"],
                    "exhausted": f["retry_summary"]["exhausted"], "envelope": f["envelope"],
                    "truncation": f["truncation"], "untrusted": f["untrusted_data"]}
    args: {f: "{{ failure }}"}
""")
    assert status.state == "COMPLETED"  # the failure was handled by remediation
    items = await system.events(eid)
    route = of_type(items, "step.exit", "load")[0].data["failure_route"]
    assert route == {"attempted": True, "status": "selected", "target": "cleanup", "edge": "on_failure[0]"}
    got = of_type(items, "playbook.completed")[0].data["result"]["cleanup"]
    assert got["step"] == "load" and got["attempt"] == 2 and got["max"] == 2 and got["type"] == "RuntimeError"
    assert got["attempts"] == 2 and got["exhausted"] is True and got["untrusted"] is True
    env = got["envelope"]
    assert env.startswith("ACTORS_FAILURE_ROUTE_CONTEXT v1") and "untrusted_data: true" in env
    body = env.split("<<<BEGIN>>>\n", 1)[1].rsplit("\n<<<END>>>", 1)[0]
    assert len(body) <= 6000 and "disk full" in body
    t = got["truncation"]
    assert t["applied"] is True and t["method"] == "head_tail"
    assert t["included_chars"] + t["dropped_chars"] == t["original_chars"] > 20000


async def test_on_failure_takes_the_first_matching_edge(system: System) -> None:
    yaml = HEAD % "edges" + """
  - step: work
    timeout: 0.3
    tool: {kind: python, code: "import time\\ndef main(slow):\\n    time.sleep(5 if slow else 0)\\n    raise ValueError('no')"}
    args: {slow: "{{ workload.slow }}"}
    on_failure:
      - when: "{{ error.type == 'Timeout' }}"
        step: slow_path
      - step: cleanup
  - step: slow_path
  - step: cleanup
"""
    for slow, target in ((True, "slow_path"), (False, "cleanup")):
        eid, status = await system.run_yaml(yaml, payload={"slow": slow})
        assert status.state == "COMPLETED"
        entered = [i.step for i in of_type(await system.events(eid), "step.enter")]
        assert entered == ["work", target, "end"]


async def test_no_matching_edge_routes_to_end_unhandled(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "no_route" + f"""
  - step: a
    tool: {FAIL}
    on_failure:
      - when: "{{{{ error.type == 'Timeout' }}}}"
        step: b
  - step: b
""")
    assert status.state == "FAILED"
    ex = of_type(await system.events(eid), "step.exit", "a")[0].data
    assert ex["failure_route"]["status"] == "no_route" and ex["routed_to_end"] is True
    assert ex["original_failed_step"] == "a"


async def test_a_cancelled_execution_schedules_no_remediation(system: System) -> None:
    path = system.tmp / "cancel_then_fail.yaml"
    path.write_text(HEAD % "cancel_then_fail" + """
  - step: slow_fail
    tool: {kind: shell, command: "sleep 20; exit 1"}
    on_failure: cleanup
  - step: cleanup
""")
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path)
    async for item in system.client.follow(eid):
        if item.type == "command.issued":
            break
    await system.client.cancel(eid, "stop")
    assert (await system.client.wait(eid, timeout=10)).state == "CANCELLED"
    async for item in system.client.follow(eid, until_terminal=False):
        if item.type == "call.error":  # the stopped tool's late failure arrives...
            break
    await system.engine_idle()
    items = await system.events(eid)
    assert not of_type(items, "step.enter", "cleanup")  # ...and remediates nothing


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
    parent = HEAD % "parent" + """
  - step: call_child
    tool: {kind: playbook, path: lib/child}
    args: {n: 4, fail: "{{ workload.fail }}"}
    on_failure: fallback
  - step: fallback
    args: {reason: "{{ failure.error.message }}"}
"""
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
    started = time.monotonic()
    await system.client.cancel(eid, "no longer needed")
    assert (await system.client.wait(eid, timeout=10)).state == "CANCELLED"
    assert (await system.client.wait(child_id, timeout=10)).state == "CANCELLED"
    assert time.monotonic() - started < 5


async def test_an_unknown_child_playbook_fails_the_parent_step(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "orphan" + "  - step: call\n    tool: {kind: playbook, path: nope/missing}\n")
    assert status.state == "FAILED"
    err = of_type(await system.events(eid), "step.exit", "call")[0].data["error"]
    assert err["type"] == "ChildFailed" and "nope/missing" in err["message"]


async def test_the_retry_summary_records_a_failure_that_never_reached_a_tool(system: System) -> None:
    eid, status = await system.run_yaml(HEAD % "summary" + """
  - step: a
    tool: {kind: python, code: "def main(x): return x"}
    args: {x: "{{ workload.missing }}"}
    retry: 2
    on_failure: b
  - step: b
    args: {errors: "{{ failure.retry_summary.errors }}"}
""")
    assert status.state == "COMPLETED"
    errors = of_type(await system.events(eid), "playbook.completed")[0].data["result"]["b"]["errors"]
    assert len(errors) == 1 and errors[0].startswith("attempt 1: TemplateError:") and "missing" in errors[0]
