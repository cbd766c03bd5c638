"""Routing has no recursion limit, every execution has a step budget, and a failed
execution's error names its root cause: against a real nats-server (the semantics, on
the pure fold, are in tests/pure/test_semantics_budget.py and tests/pure/test_semantics_flow.py).
A 10,000-router chain completes through its resume timers, a cycle fails with
`StepBudgetExceeded` while other executions complete, the pod's budget comes from
ACTORS_MAX_STEPS, and `run --json`, `status --json` and `playbook.failed` carry the
root cause.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from actors.playbook.loader import PlaybookInvalid, load_playbook
from tests.conftest import System, of_type
from tests.support.cli import cli

pytestmark = [pytest.mark.timeout(120)]

HEAD = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: %s}\n"
GOOD = (
    HEAD % "good"
    + """workflow:
  - step: work
    tool: {kind: python, code: "def main(n): return n * 2"}
    args: {n: 21}
"""
)


def chain(n: int, name: str = "chain") -> str:
    """n routers, each routing to the next."""
    steps = "".join(f"  - step: s{i}\n    next: s{i + 1}\n" for i in range(n - 1))
    return HEAD % name + "workflow:\n" + steps + f"  - step: s{n - 1}\n"


# --- the playbook's budget, as the loader reads it --------------------------------


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
    eid, status = await _with_good_one(
        system,
        HEAD % "router_cycle"
        + """limits: {max_steps: 40}
workflow:
  - step: start
    next: [nap, spin]
  - step: nap
    tool: {kind: sleep, seconds: 60}
  - step: spin
    next: spin
""",
    )
    assert status.state == "FAILED"
    assert status.error is not None and status.error["type"] == "StepBudgetExceeded"
    assert status.error["step"] == "spin" and "40 steps" in status.error["message"]
    items = await system.events(eid)
    assert of_type(items, "command.cancelled", "nap")  # the running sleep was stopped, as by an abort
    assert len(of_type(items, "step.enter")) == 40 + 1


@pytest.mark.asyncio
async def test_the_pod_budget_comes_from_actors_max_steps(tmp_path: Path) -> None:
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(HEAD % "pod_budget" + "workflow:\n  - step: a\n    next: a\n")
    code, out, err, _ = await cli("run", str(cycle), "--json", env={"NATS_URL": "", "ACTORS_MAX_STEPS": "25"})
    assert code == 1, err
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert error["type"] == "StepBudgetExceeded" and "25 steps" in error["message"]


ROOT_CAUSES = {
    "Timeout": (
        """
  - step: a
    tool: {kind: python, code: "import time\\ndef main():\\n    time.sleep(30)"}
    timeout: 0.5
""",
        "Timeout",
        "",
    ),
    "TemplateError": (
        """
  - step: a
    tool: {kind: python, code: "def main(x): return x"}
    args: {x: "{{ workload.settings.no_such_key }}"}
""",
        "TemplateError",
        "no_such_key",
    ),
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
    code, out, err, _ = await cli("run", str(path), "--json", "--nats", url, env=env)
    assert code == 1, err
    run = json.loads(out.strip().splitlines()[-1])
    error = run["error"]
    assert error["type"] == type_ and error["step"] == "a" and error["failed_steps"] == ["a"]
    assert words in error["message"]
    eid = run["execution_id"]

    code, out, _, _ = await cli("status", eid, "--json", "--nats", url, env=env)
    assert code == 1 and json.loads(out)["error"] == error
    code, out, _, _ = await cli("status", eid, "--nats", url, env=env)
    assert code == 1
    [line] = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert f"{type_}: " in line and "(step 'a'; failed steps: a)" in line
    assert of_type(await system.events(eid), "playbook.failed")[0].data["error"] == error
