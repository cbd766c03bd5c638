"""Routing has no recursion limit, every execution has a step budget, and a failed
execution's error names its root cause.

The pure core first (fold driven with synthetic inputs, no I/O), then the same
behaviour against a real nats-server: a 10,000-router chain completes, cycles of
routers and of python steps fail with `StepBudgetExceeded` while other executions
complete, and `run --json`, `status --json` and `playbook.failed` carry the root cause.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from actors.core.decide import ROUTING_SLICE, fold
from actors.core.effects import Effects
from actors.core.state import Execution
from actors.playbook.loader import PlaybookInvalid, load_playbook, parsed_playbook
from actors.wire import CallDone, CallError, CancelRequest, ErrorInfo, Limits, StartRecord
from streams.subjects import ExecSubjects
from tests.conftest import System, of_type
from tests.test_cli import cli

pytestmark = [pytest.mark.timeout(120)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\n"
SUBJECTS = ExecSubjects("exec.0.e")
GOOD = HEAD % "good" + """workflow:
  - step: work
    tool: {kind: python, code: "def main(n): return n * 2"}
    args: {n: 21}
"""


def chain(n: int, name: str = "chain") -> str:
    """n routers, each routing to the next."""
    steps = "".join(f"  - step: s{i}\n    next: s{i + 1}\n" for i in range(n - 1))
    return HEAD % name + "workflow:\n" + steps + f"  - step: s{n - 1}\n"


class Driver:
    """Folds one execution's inputs as the engine would, answering each command with
    `answer` and firing each timer at once; `outputs` holds every decision."""

    def __init__(self, source: str, *, limits: Limits | None = None) -> None:
        self.ex = Execution(execution_id="e")
        self.seq = 0
        self.outputs: list[Effects] = []
        self.queue: list[Any] = []
        self.feed(StartRecord(execution_id="e", playbook_path="p", playbook_source=source, limits=limits or Limits()))

    def feed(self, inp: Any) -> Effects:
        self.seq += 1
        out = fold(self.ex, inp, seq=self.seq, at=float(self.seq), subjects=SUBJECTS)
        self.outputs.append(out)
        self.queue += [t.fire for t in out.timers]
        self.queue += [CallDone(execution_id="e", command_id=c.command_id, step=c.step, result={"n": 1},
                                attempt_number=c.attempt_number) for c in out.commands]
        return out

    def run(self) -> None:
        while self.queue and not self.ex.terminal:
            self.feed(self.queue.pop(0))

    def events(self, type_: str | None = None) -> list[tuple[str, str | None]]:
        return [(e.type, e.step) for o in self.outputs for e in o.events if type_ in (None, e.type)]

    def failed(self) -> dict[str, Any]:
        [ev] = [e for o in self.outputs for e in o.lifecycle if e.type == "playbook.failed"]
        return ev.data


# --- pure core: routing -------------------------------------------------------------


def test_a_chain_of_10000_routers_folds_in_well_under_a_second() -> None:
    source = chain(10_000)
    parsed_playbook(source, "p", Limits().max_attempts)  # parsed (and cached) before the clock starts: the fold is what is timed
    cpu = time.process_time()
    run = Driver(source)
    run.run()
    took = time.process_time() - cpu
    assert run.ex.status == "COMPLETED"
    assert len(run.events("step.exit")) == 10_001  # every router, then end
    assert took < 1.0, f"fold took {took:.2f} s of CPU"
    # no decision starts more than its slice: each decision record stays far below a message's size
    assert max(sum(e.type == "step.enter" for e in o.events) for o in run.outputs) <= ROUTING_SLICE + 1
    assert len(run.outputs) == 10_001 // ROUTING_SLICE + 1


def test_routing_keeps_the_depth_first_order_of_events() -> None:
    """A branch runs on until it waits before its sibling starts, as before routing was
    a loop: logs written by an older engine replay to the same decisions."""
    run = Driver(HEAD % "order" + """workflow:
  - step: start
    next: [a, b]
  - step: a
    next: a2
  - step: a2
    tool: {kind: python, code: "def main(): return 1"}
  - step: b
    next: b2
  - step: b2
""")
    assert run.events() == [
        ("step.enter", "start"), ("step.exit", "start"), ("step.enter", "a"), ("step.enter", "b"),
        ("step.exit", "a"), ("step.enter", "a2"), ("command.issued", "a2"),
        ("step.exit", "b"), ("step.enter", "b2"), ("step.exit", "b2"),
    ]
    run.run()
    assert run.events()[-3:] == [("step.exit", "a2"), ("step.enter", "end"), ("step.exit", "end")]


def test_a_cancel_between_two_slices_stops_the_chain() -> None:
    run = Driver(chain(5_000))
    assert run.queue and not run.ex.terminal  # paused after its first slice, a resume timer armed
    run.feed(CancelRequest(execution_id="e", reason="enough"))
    run.run()
    assert run.ex.status == "CANCELLED"
    # the slice's routers ran; the next one, entered but not begun, was cancelled
    assert len(run.events("step.exit")) == ROUTING_SLICE and len(run.events("step.enter")) == ROUTING_SLICE + 1


# --- pure core: step budget ---------------------------------------------------------


def test_a_router_cycle_fails_with_step_budget_exceeded() -> None:
    run = Driver(HEAD % "cycle" + "limits: {max_steps: 50}\nworkflow:\n  - step: a\n    next: a\n")
    assert run.ex.status == "FAILED"
    error = run.failed()["error"]
    assert error["type"] == "StepBudgetExceeded" and error["step"] == "a" and error["failed_steps"] == ["a"]
    assert "50 steps" in error["message"] and "step 'a'" in error["message"]
    assert len(run.events("step.enter")) == 50 + 1  # the budget, then end
    assert run.events("step.budget_exceeded") == [("step.budget_exceeded", "a")]


def test_a_python_cycle_is_bounded_and_running_commands_are_cancelled() -> None:
    run = Driver(HEAD % "pycycle" + """limits: {max_steps: 9}
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
""")
    nap = run.queue.pop(1)  # the sleep never answers: it is still running when the budget runs out
    assert nap.step == "nap"
    run.run()
    assert run.ex.status == "FAILED"
    assert run.failed()["error"]["type"] == "StepBudgetExceeded"
    cancels = [c.command_id for o in run.outputs for c in o.cancels]
    assert cancels == [nap.command_id]
    assert ("step.exit", "nap") in run.events() and len(run.events("step.enter")) == 9 + 1


def test_a_remediation_cycle_is_bounded_too() -> None:
    """A step that remediates itself: each failure routes to a new visit of it."""
    run = Driver(HEAD % "remedy" + """limits: {max_steps: 30}
workflow:
  - step: a
    args: {v: "{{ workload.nope }}"}
    on_failure: a
""")
    assert run.ex.status == "FAILED" and run.failed()["error"]["type"] == "StepBudgetExceeded"
    last = [e for o in run.outputs for e in o.events if e.type == "step.exit" and e.step == "a"][-1]
    assert last.data["failure_route"]["status"] == "step_budget_exceeded"  # its failure stays unhandled


@pytest.mark.parametrize(("own", "pod", "budget"), [(30, 20, 20), (20, 30, 20), (None, 25, 25)])
def test_the_smaller_of_playbook_and_pod_budget_holds(own: int | None, pod: int, budget: int) -> None:
    limits = f"limits: {{max_steps: {own}}}\n" if own else ""
    run = Driver(HEAD % "cycle" + limits + "workflow:\n  - step: a\n    next: a\n",
                 limits=Limits(max_activations=pod))
    assert run.ex.status == "FAILED"
    assert len(run.events("step.enter")) == budget + 1
    assert f"{budget} steps" in run.failed()["error"]["message"]


def test_the_playbook_budget_is_validated() -> None:
    with pytest.raises(PlaybookInvalid) as bad:
        load_playbook(HEAD % "x" + "limits: {max_steps: 0, max_stesp: 3}\nworkflow:\n  - step: a\n", file="x.yaml")
    text = str(bad.value)
    assert "x.yaml:4" in text and "limits.max_stesp" in text and "did you mean 'max_steps'" in text
    with pytest.raises(PlaybookInvalid) as bad:
        load_playbook(HEAD % "x" + "limits: {max_steps: 0}\nworkflow:\n  - step: a\n", file="x.yaml")
    assert "limits.max_steps" in str(bad.value) and ">= 1" in str(bad.value)
    limits = load_playbook(HEAD % "x" + "limits: {max_steps: 7}\nworkflow:\n  - step: a\n").limits
    assert limits is not None and limits.max_steps == 7


# --- pure core: root cause ----------------------------------------------------------


def test_the_first_unhandled_failure_is_the_root_cause() -> None:
    run = Driver(HEAD % "two" + """workflow:
  - step: start
    next: [a, b]
  - step: a
    tool: {kind: python, code: "def main(): pass"}
  - step: b
    tool: {kind: python, code: "def main(): pass"}
""")
    run.queue.clear()
    run.feed(CallError(execution_id="e", command_id="1-1", step="a", attempt_number=1,
                       error=ErrorInfo(type="Timeout", message="no answer after 1s")))
    run.feed(CallError(execution_id="e", command_id="2-1", step="b", attempt_number=1,
                       error=ErrorInfo(type="ValueError", message="later")))
    error = run.failed()["error"]
    assert error == {"type": "Timeout", "message": "no answer after 1s", "step": "a", "failed_steps": ["a", "b"],
                     "retryable": False, "status": None}


def test_an_end_that_fails_alone_is_the_root_cause() -> None:
    run = Driver(HEAD % "endfails" + """workflow:
  - step: a
  - step: end
    args: {v: "{{ workload.no_such_key }}"}
""")
    error = run.failed()["error"]
    assert error["type"] == "TemplateError" and error["step"] == "end" and error["failed_steps"] == ["end"]
    assert "no_such_key" in error["message"]


# --- against a real nats-server -----------------------------------------------------


@pytest.mark.asyncio
async def test_a_chain_of_10000_routers_completes(system: System) -> None:
    eid, status = await system.run_yaml(chain(10_000, "long_chain"), timeout=90)
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert len(of_type(items, "step.exit")) == 10_001
    assert of_type(items, "playbook.completed")[0].data["result"] == {"s9999": {}}


async def _with_good_one(system: System, bad: str) -> tuple[str, Any]:
    """Start `bad` and a good execution together; both must end."""
    bad_id = await system.start_yaml(bad)
    good_id = await system.start_yaml(GOOD)
    good, status = await asyncio.gather(system.client.wait(good_id, timeout=30), system.client.wait(bad_id, timeout=30))
    assert good.state == "COMPLETED"
    return bad_id, status


@pytest.mark.asyncio
async def test_a_router_cycle_fails_with_step_budget_exceeded_and_others_complete(system: System) -> None:
    eid, status = await _with_good_one(system, HEAD % "router_cycle" + """limits: {max_steps: 40}
workflow:
  - step: start
    next: [nap, spin]
  - step: nap
    tool: {kind: sleep, seconds: 60}
  - step: spin
    next: spin
""")
    assert status.state == "FAILED"
    assert status.error is not None and status.error["type"] == "StepBudgetExceeded"
    assert status.error["step"] == "spin" and "40 steps" in status.error["message"]
    items = await system.events(eid)
    assert of_type(items, "command.cancelled", "nap")  # the running sleep was stopped, as by an abort
    assert len(of_type(items, "step.enter")) == 40 + 1


@pytest.mark.asyncio
async def test_a_python_cycle_fails_with_step_budget_exceeded_and_others_complete(system: System) -> None:
    eid, status = await _with_good_one(system, HEAD % "python_cycle" + """limits: {max_steps: 12}
workflow:
  - step: a
    tool: {kind: python, code: "def main(n): return n + 1"}
    args: {n: 1}
    next: b
  - step: b
    next: a
""")
    assert status.state == "FAILED"
    assert status.error is not None and status.error["type"] == "StepBudgetExceeded"
    items = await system.events(eid)
    assert len(of_type(items, "call.done", "a")) == 6
    assert of_type(items, "playbook.failed")[0].data["error"] == status.error


@pytest.mark.asyncio
async def test_the_pod_budget_comes_from_actors_max_steps(tmp_path: Path) -> None:
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(HEAD % "pod_budget" + "workflow:\n  - step: a\n    next: a\n")
    code, out, err = await cli("run", str(cycle), "--json", env={"NATS_URL": "", "ACTORS_MAX_STEPS": "25"})
    assert code == 1, err
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert error["type"] == "StepBudgetExceeded" and "25 steps" in error["message"]


ROOT_CAUSES = {
    "Timeout": ("""
  - step: a
    tool: {kind: python, code: "import time\\ndef main():\\n    time.sleep(30)"}
    timeout: 0.5
""", "Timeout", ""),
    "TemplateError": ("""
  - step: a
    tool: {kind: python, code: "def main(x): return x"}
    args: {x: "{{ workload.settings.no_such_key }}"}
""", "TemplateError", "no_such_key"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(ROOT_CAUSES))
async def test_run_status_and_playbook_failed_name_the_root_cause(system: System, tmp_path: Path, case: str) -> None:
    body, type_, words = ROOT_CAUSES[case]
    path = tmp_path / "root.yaml"
    path.write_text(HEAD % f"root_{case.lower()}" + "workload: {settings: {}}\nworkflow:" + body)
    url = system.server.url
    # the CLI must see the test system's layout: the partitions decide where an execution's log is
    env = {"ACTORS_PARTITIONS": str(system.layout.partitions), "ACTORS_ACK_WAIT": str(system.layout.ack_wait)}
    code, out, err = await cli("run", str(path), "--json", "--nats", url, env=env)
    assert code == 1, err
    run = json.loads(out.strip().splitlines()[-1])
    error = run["error"]
    assert error["type"] == type_ and error["step"] == "a" and error["failed_steps"] == ["a"]
    assert words in error["message"]
    eid = run["execution_id"]

    code, out, _ = await cli("status", eid, "--json", "--nats", url, env=env)
    assert code == 1 and json.loads(out)["error"] == error
    code, out, _ = await cli("status", eid, "--nats", url, env=env)
    assert code == 1
    [line] = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert f"{type_}: " in line and "(step 'a'; failed steps: a)" in line
    assert of_type(await system.events(eid), "playbook.failed")[0].data["error"] == error
