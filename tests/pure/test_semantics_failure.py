"""Failure semantics on the pure fold harness: on_error decisions, on_failure
remediation and its envelope, abort, cancel, templates failing a step, nested
playbooks and how a child's end reaches its parent. No NATS."""

from __future__ import annotations

import pytest

from tests.harness import PENDING, Call, Fail, Harness, Run, decisions, refold, replay

pytestmark = [pytest.mark.timeout(60)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\nworkflow:\n"
PY = '{kind: python, code: "def main(): pass"}'
BAD = Fail("ValueError", "bad input")


def decided(run: Run, step: str) -> list[dict[str, object]]:
    return [i.data for i in run.events("step.failure_decided", step)]


def test_ignore_completes_the_step_with_the_given_result_and_routes_on() -> None:
    run = Harness({"lookup": BAD}).run(
        HEAD % "ignore"
        + f"""
  - step: lookup
    tool: {PY}
    on_error:
      - when: "{{{{ error.type == 'ValueError' }}}}"
        decision: ignore
        result: {{found: false}}
    next: use
  - step: use
    args: {{found: "{{{{ lookup.found }}}}"}}
"""
    )
    assert run.status == "COMPLETED"
    assert decided(run, "lookup")[0]["decision"] == "ignore" and decided(run, "lookup")[0]["rule"] == "on_error[0]"
    exit_ = run.events("step.exit", "lookup")[0].data
    assert exit_["status"] == "COMPLETED" and exit_["ignored_error"]["type"] == "ValueError"
    assert run.result == {"use": {"found": False}}
    assert replay(run) and replay(run, read_back=False)


def test_none_is_default_handling_and_fails_the_playbook() -> None:
    run = Harness({"a": BAD}).run(
        HEAD % "none"
        + f"""
  - step: a
    tool: {PY}
    on_error:
      - when: "{{{{ error.status == 404 }}}}"
        decision: ignore
      - decision: none
"""
    )
    assert run.status == "FAILED"
    d = decided(run, "a")
    assert d[0]["decision"] == "none" and d[0]["rule"] == "on_error[1]"


def test_cancel_decision_cancels_the_step_and_its_branch_goes_to_end() -> None:
    run = Harness({"optional": BAD, "main": "main done"}).run(
        HEAD % "cancel_step"
        + f"""
  - step: start
    next: [optional, main]
  - step: optional
    tool: {PY}
    on_error: [{{decision: cancel}}]
    next: never
  - step: never
  - step: main
    tool: {PY}
"""
    )
    assert run.status == "COMPLETED"
    assert run.events("step.exit", "optional")[0].data["status"] == "CANCELLED"
    assert "never" not in run.entered()
    assert run.events("workflow.completed")[0].data["cancelled_steps"] == ["optional"]


def test_retry_decision_retries_now_with_new_args() -> None:
    def divide(call: Call) -> float:
        if call.args["d"] == 0:
            raise Fail("ZeroDivisionError", "division by zero")
        return 10 / float(call.args["d"])

    run = Harness({"divide": divide}).run(
        HEAD % "retry_args"
        + f"""
  - step: divide
    tool: {PY}
    args: {{d: 0}}
    on_error:
      - when: "{{{{ error.type == 'ZeroDivisionError' and attempt == 1 }}}}"
        decision: retry
        args: {{d: 5}}
"""
    )
    assert run.status == "COMPLETED"
    assert [c.data["attempt_number"] for c in run.events("command.issued", "divide")] == [1, 2]
    assert [c.args for c in run.calls] == [{"d": 0}, {"d": 5}]
    assert not run.events("timer.fired")  # a retry now: no timer
    assert run.result == {"divide": 2.0}


def test_retry_later_waits_on_a_durable_timer_outside_the_retry_budget() -> None:
    def flaky(call: Call) -> str:
        if not call.args["ok"]:
            raise Fail("RuntimeError", "RateLimited")
        return "ok"

    run = Harness({"flaky": flaky}).run(
        HEAD % "retry_later"
        + f"""
  - step: flaky
    tool: {PY}
    args: {{ok: false}}
    retry: {{max_attempts: 1}}
    on_error:
      - when: "{{{{ attempt == 1 }}}}"
        decision: retry_later
        delay: 0.3
        args: {{ok: true}}
"""
    )
    assert run.status == "COMPLETED"
    [sched] = run.events("retry.scheduled", "flaky")
    assert sched.data["delay"] == 0.3 and sched.data["reason"] == "on_error:retry_later"
    [fired] = run.events("timer.fired")
    assert fired.at == pytest.approx(sched.at + 0.3)  # the attempt waited for its timer
    assert run.calls[1].attempt == 2 and run.calls[1].args == {"ok": True}


def test_retry_later_without_a_delay_waits_a_minute() -> None:
    run = Harness({"a": BAD}).run(
        HEAD % "later"
        + f"""
  - step: a
    tool: {PY}
    on_error:
      - when: "{{{{ attempt == 1 }}}}"
        decision: retry_later
"""
    )
    assert run.status == "FAILED"
    assert [s.data["delay"] for s in run.events("retry.scheduled")] == [60.0]
    assert len(run.calls) == 2


def test_handled_failure_does_not_fail_the_playbook() -> None:
    source = HEAD % "handled" + f"  - step: a\n    tool: {PY}\n    on_error: [{{decision: handled}}]\n"
    run = Harness({"a": BAD}).run(source)
    assert run.status == "COMPLETED"
    exit_ = run.events("step.exit", "a")[0].data
    assert exit_["status"] == "FAILED" and exit_["handled"] is True
    wf = run.events("workflow.completed")[0].data
    assert wf["failed_steps_count"] == 0 and wf["handled_failures"] == ["a"]


def test_abort_stops_every_other_branch_whatever_it_waits_on() -> None:
    """`decision: abort` cancels every other live branch: a running command, a retry
    waiting on its timer, a running loop and a running child; each branch reaches
    `end`, which fails the workflow."""
    tools = {"running": PENDING, "waiting": Fail("Boom", "retry me"), "critical": BAD, "fan": PENDING, "nap": PENDING}
    h = Harness(tools, playbooks={"sleepy": HEAD % "sleepy" + f"  - step: nap\n    tool: {PY}\n"})
    run = h.run(
        HEAD % "abort"
        + f"""
  - step: start
    next: [running, waiting, critical, fan, child]
  - step: running
    tool: {PY}
    next: after_running
  - step: after_running
  - step: waiting
    tool: {PY}
    retry: {{max_attempts: 3, backoff: fixed, initial_delay: 5}}
  - step: fan
    tool: {PY}
    loop: {{collection: [1, 2, 3], element: x, concurrency: 2}}
  - step: child
    tool: {{kind: playbook, path: sleepy}}
  - step: critical
    tool: {PY}
    on_error: [{{decision: abort}}]
"""
    )
    assert run.status == "FAILED" and not h.running()
    others = ("running", "waiting", "fan", "child")
    assert {(s, st) for s, st in run.exits() if s in others} == {(s, "CANCELLED") for s in others}
    assert {i.step for i in run.events("command.cancelled")} == {"running", "fan", "child"}
    assert run.events("step.exit", "critical")[0].data["aborted"] is True
    assert run.events("retry.scheduled", "waiting") and run.events("timer.fired")  # it waited; the timer came...
    assert [c.attempt for c in run.calls if c.step == "waiting"] == [1]  # ...disarmed: no second attempt
    assert len([c for c in run.calls if c.step == "fan"]) == 2  # the loop released nothing more
    assert h.runs[run.children[0]].status == "CANCELLED"
    assert "after_running" not in run.entered() and run.entered().count("end") == 1
    wf = run.events("workflow.failed")[0].data
    assert wf["failed_steps"] == ["critical"] and sorted(wf["cancelled_steps"]) == sorted(others)
    assert replay(run)


def test_on_failure_routes_to_remediation_with_a_bounded_failure_envelope() -> None:
    run = Harness({"load": Fail("RuntimeError", "disk full " + "x" * 20000)}).run(
        HEAD % "remediate"
        + f"""
  - step: load
    tool: {PY}
    retry: {{max_attempts: 2, initial_delay: 0.05}}
    on_failure: cleanup
  - step: cleanup
    tool: {PY}
    args: {{f: "{{{{ failure }}}}"}}
"""
    )
    assert run.status == "COMPLETED"  # the failure was handled by remediation
    route = run.events("step.exit", "load")[0].data["failure_route"]
    assert route == {"attempted": True, "status": "selected", "target": "cleanup", "edge": "on_failure[0]"}
    f = run.calls[-1].args["f"]
    assert f["step"] == "load" and f["attempt"] == 2 and f["max_attempts"] == 2 and f["error"]["type"] == "RuntimeError"
    assert f["retry_summary"]["attempts"] == 2 and f["retry_summary"]["exhausted"] is True
    assert f["untrusted_data"] is True
    env = f["envelope"]
    assert env.startswith("ACTORS_FAILURE_ROUTE_CONTEXT v1") and "untrusted_data: true" in env
    body = env.split("<<<BEGIN>>>\n", 1)[1].rsplit("\n<<<END>>>", 1)[0]
    assert len(body) <= 6000 and "disk full" in body
    t = f["truncation"]
    assert t["applied"] is True and t["method"] == "head_tail"
    assert t["included_chars"] + t["dropped_chars"] == t["original_chars"] > 20000
    assert run.events("step.enter", "cleanup")[0].data["remediates"] == "load"


@pytest.mark.parametrize(("error", "target"), [("Timeout", "slow_path"), ("ValueError", "cleanup")])
def test_on_failure_takes_the_first_matching_edge(error: str, target: str) -> None:
    run = Harness({"work": Fail(error, "no")}).run(
        HEAD % "edges"
        + f"""
  - step: work
    tool: {PY}
    on_failure:
      - when: "{{{{ error.type == 'Timeout' }}}}"
        step: slow_path
      - step: cleanup
  - step: slow_path
  - step: cleanup
"""
    )
    assert run.status == "COMPLETED"
    assert run.entered() == ["work", target, "end"]


def test_no_matching_edge_routes_to_end_unhandled() -> None:
    run = Harness({"a": BAD}).run(
        HEAD % "no_route"
        + f"""
  - step: a
    tool: {PY}
    on_failure:
      - when: "{{{{ error.type == 'Timeout' }}}}"
        step: b
  - step: b
"""
    )
    assert run.status == "FAILED"
    ex = run.events("step.exit", "a")[0].data
    assert ex["failure_route"]["status"] == "no_route" and ex["routed_to_end"] is True
    assert ex["original_failed_step"] == "a"


def test_a_cancelled_execution_schedules_no_remediation() -> None:
    h = Harness({"slow_fail": PENDING})
    eid = h.start(
        HEAD % "cancel_then_fail"
        + f"""
  - step: slow_fail
    tool: {PY}
    on_failure: cleanup
  - step: cleanup
"""
    )
    h.run()
    h.cancel(eid, "stop")
    run = h.run()
    assert run.status == "CANCELLED"
    cancelled = run.events("execution.cancelled")[0].data
    assert cancelled["reason"] == "stop" and cancelled["running_commands"] == [run.calls[0].command_id]
    # the stopped tool's late failure arrives...
    assert run.events("call.error", "slow_fail")[0].data["error"]["type"] == "Cancelled"
    assert "cleanup" not in run.entered()  # ...and remediates nothing
    assert run.lifecycle().count("execution.cancelled") == 1


def test_a_cancel_logged_before_the_start_record_cancels_the_execution_as_it_starts() -> None:
    """A start still queued in stream START when the cancel was sent: the cancel is in
    the log first. The execution starts and ends CANCELLED at once: no step runs."""
    h = Harness()
    h.cancel("early", "changed my mind")
    h.cancel("early", "a second cancel")
    h.start(HEAD % "early" + f"  - step: a\n    tool: {PY}\n", execution_id="early")
    run = h.run()
    assert run.status == "CANCELLED" and not run.calls and "a" not in run.entered()
    assert run.events("execution.cancelled")[0].data["reason"] == "changed my mind"
    assert run.lifecycle() == ["playbook.initialized", "workflow.initialized", "execution.cancelled"]


def test_cancelling_a_terminal_execution_changes_nothing() -> None:
    h = Harness()
    run = h.run(HEAD % "done" + "  - step: a\n")
    before = list(run.items)
    h.cancel(run.execution_id, "too late")
    run = h.run()
    assert run.status == "COMPLETED" and [i for i in run.items if i.cls != "in"] == [i for i in before if i.cls != "in"]


def test_the_retry_summary_records_a_failure_that_never_reached_a_tool() -> None:
    run = Harness().run(
        HEAD % "summary"
        + f"""
  - step: a
    tool: {PY}
    args: {{x: "{{{{ workload.missing }}}}"}}
    retry: 2
    on_failure: b
  - step: b
    args: {{errors: "{{{{ failure.retry_summary.errors }}}}"}}
"""
    )
    assert run.status == "COMPLETED" and not run.calls
    errors = run.result["b"]["errors"]
    assert len(errors) == 1 and errors[0].startswith("attempt 1: TemplateError:") and "missing" in errors[0]


def test_a_template_that_cannot_render_fails_its_step_naming_the_field() -> None:
    run = Harness().run(
        HEAD % "tpl"
        + f"""
  - step: a
    tool: {PY}
    args: {{x: "{{{{ workload.settings.no_such_key }}}}"}}
"""
    )
    assert run.status == "FAILED" and not run.calls
    error = run.events("step.exit", "a")[0].data["error"]
    assert error["type"] == "TemplateError" and "step 'a' field args.x" in error["message"]


def test_a_recorded_failure_decision_is_read_back_not_evaluated_again() -> None:
    """Even if the rules would now decide otherwise, a replay follows the decision the
    log recorded (rules that read anything but the log could decide differently on replay)."""
    source = HEAD % "recorded" + f"  - step: a\n    tool: {PY}\n    on_error: [{{decision: none}}]\n"
    run = Harness({"a": BAD}).run(source)
    assert run.status == "FAILED"
    assert replay(run)
    [decision] = run.events("step.failure_decided", "a")
    other = {**decision.data, "decision": "ignore", "result": 7}  # a log that says otherwise: the replay follows it
    key = (decision.data["activation"], decision.data["attempt_number"])
    last = decisions(refold(run.execution_id, run.inputs, recorded={key: other})[-1])
    assert [e["type"] for e in last][-2:] == ["workflow.completed", "playbook.completed"]
    assert replay(run, read_back=False)  # evaluated again, the rules decide as the first time


CHILD = (
    HEAD % "child"
    + f"""
  - step: work
    tool: {PY}
    args: {{n: "{{{{ workload.n }}}}", fail: "{{{{ workload.fail }}}}"}}
  - step: end
    args: {{value: "{{{{ work }}}}"}}
"""
)
PARENT = (
    HEAD % "parent"
    + """
  - step: delegate
    tool: {kind: playbook, path: lib/child, version: 2}
    args: {n: "{{ workload.n }}", fail: "{{ workload.fail }}"}
    on_failure:
      - when: "{{ error.type == 'ChildFailed' }}"
        step: fallback
  - step: fallback
    args: {reason: "{{ failure.error.message }}"}
"""
)


def child_work(call: Call) -> int:
    if call.args["fail"]:
        raise Fail("ValueError", "child broke")
    return int(call.args["n"]) * 10


def test_a_child_playbook_result_and_status_are_inherited() -> None:
    h = Harness({"work": child_work}, playbooks={"lib/child": CHILD})
    run = h.run(PARENT, {"n": 4, "fail": False})
    assert run.status == "COMPLETED" and run.result == {"delegate": {"value": 40}}
    [child_id] = run.children
    assert run.events("command.issued", "delegate")[0].data["child_execution_id"] == child_id
    child = h.runs[child_id]
    assert child.status == "COMPLETED"
    init = child.events("playbook.initialized")[0].data
    assert init["parent_execution_id"] == run.execution_id and init["parent_step"] == "delegate"
    assert init["version"] == 2 and h.runs[child_id].calls[0].args == {"n": 4, "fail": False}  # args: its payload
    assert replay(run) and replay(child)


def test_a_failed_child_fails_the_parent_step_naming_its_root_cause() -> None:
    h = Harness({"work": child_work}, playbooks={"lib/child": CHILD})
    run = h.run(PARENT, {"n": 4, "fail": True})
    assert run.status == "COMPLETED"  # the child failed; the parent remediated
    failed = run.events("step.exit", "delegate")[0].data
    assert failed["status"] == "FAILED" and failed["error"]["type"] == "ChildFailed"
    # the child's error names its root cause (its first unhandled failure), not a list of steps
    assert "failed at step 'work': ValueError: child broke" in run.result["fallback"]["reason"]
    assert h.runs[run.children[0]].status == "FAILED"


def test_an_unknown_child_playbook_fails_the_parent_step() -> None:
    run = Harness().run(HEAD % "orphan" + "  - step: call\n    tool: {kind: playbook, path: nope/missing}\n")
    assert run.status == "FAILED"
    err = run.events("step.exit", "call")[0].data["error"]
    assert err["type"] == "ChildFailed" and "nope/missing" in err["message"]


def test_cancelling_a_parent_cancels_its_child() -> None:
    h = Harness({"nap": PENDING}, playbooks={"sleepy": HEAD % "sleepy" + "  - step: nap\n    tool: {kind: sleep}\n"})
    eid = h.start(HEAD % "parent" + "  - step: call\n    tool: {kind: playbook, path: sleepy}\n")
    run = h.run()
    [child_id] = run.children
    assert h.runs[child_id].status == "RUNNING"
    h.cancel(eid, "no longer needed")
    run = h.run()
    assert run.status == "CANCELLED" and h.runs[child_id].status == "CANCELLED"
    assert not h.running()  # the child's sleep was stopped too
