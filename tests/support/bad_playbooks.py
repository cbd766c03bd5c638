"""Bad playbooks against a running system: a good playbook that must still complete
beside them, one-step playbooks to put a bad template in, the error a failed step
reports, and the limits the starter fixes in each start record."""

from __future__ import annotations

from typing import Any

from actors.engine.starter import Starter
from actors.wire.messages import Limits
from tests.conftest import System, of_type

GOOD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: good}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 'fine'"}
"""


def one_step(name: str, args: str, tool: str = "") -> str:
    return f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: {name}}}
workflow:
  - step: a
{tool}    args: {args}
"""


async def failed_step_error(system: System, eid: str, step: str = "a") -> dict[str, Any]:
    exits = [e for e in of_type(await system.events(eid), "step.exit", step) if e.data["status"] == "FAILED"]
    assert exits, f"no failed step.exit for {step}"
    error: dict[str, Any] = exits[0].data["error"]
    return error


async def good_run_completes(system: System) -> None:
    _, status = await system.run_yaml(GOOD)
    assert status.state == "COMPLETED"


def set_limits(system: System, **limits: int) -> None:
    """What the pod's environment would set (ACTORS_TEMPLATE_OPS, ...), for the
    executions started from now on: the starter fixes them in each start record."""
    for starter in system.runtime.find(Starter):
        assert isinstance(starter, Starter)
        starter.limits = Limits(**limits)
