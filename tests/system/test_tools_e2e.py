"""Tool actors through the whole system: long tools, timeouts, big results, cancel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


@pytest.mark.layout(ack_wait=1.0)
async def test_a_tool_running_past_ack_wait_keeps_its_command_and_runs_once(system: System, tmp_path: Path) -> None:
    marker = tmp_path / "runs.txt"
    eid, status = await system.run_yaml(f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: long_tool}}
workflow:
  - step: long
    tool:
      kind: python
      code: |
        import time
        def main(f):
            open(f, "a").write("run\\n")
            time.sleep(3)
            return "done"
    args: {{f: "{marker}"}}
""")
    assert status.state == "COMPLETED"
    assert marker.read_text().split() == ["run"]  # not redelivered after ack_wait
    assert len(of_type(await system.events(eid), "call.done", "long")) == 1


async def test_step_timeout_kills_a_runaway_python_step(system: System) -> None:
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: runaway}
workflow:
  - step: spin
    timeout: 0.5
    tool:
      kind: python
      code: |
        def main():
            while True:
                pass
""")
    assert status.state == "FAILED"
    err = of_type(await system.events(eid), "step.exit", "spin")[0].data["error"]
    assert err["type"] == "Timeout" and err["retryable"] is True
    # the pool replaced the killed worker: python steps still run
    _, again = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: after_runaway}
workflow:
  - step: fine
    tool: {kind: python, code: "def main(): return 1"}
""")
    assert again.state == "COMPLETED"


@pytest.mark.layout(max_value_bytes=1_500_000)
async def test_a_result_over_the_value_cap_fails_the_step_naming_it(system: System) -> None:
    # over the message limit a result travels as a blob (tests/system/test_big_values.py); over the cap it fails
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: big_result}
workflow:
  - step: huge
    tool: {kind: python, code: "def main(): return 'x' * 2_000_000"}
""")
    assert status.state == "FAILED"
    err = of_type(await system.events(eid), "step.exit", "huge")[0].data["error"]
    assert err["type"] == "ValueTooLarge" and "step 'huge'" in err["message"]


async def test_cancel_stops_a_running_tool_and_nothing_new_is_issued(system: System) -> None:
    path = system.tmp / "nap.yaml"
    path.write_text("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: nap}
workflow:
  - step: nap
    tool: {kind: python, code: "import time\\ndef main():\\n    time.sleep(30)"}
    next: after
  - step: after
    tool: {kind: python, code: "def main(): return 1"}
""")
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path)
    async for item in system.client.follow(eid):
        if item.type == "command.issued":
            break
    await system.client.cancel(eid, "user asked")
    status = await system.client.wait(eid, timeout=10)
    assert status.state == "CANCELLED"
    # the running python call was told to stop: its result (Cancelled) arrives in seconds, not 30 s
    async for item in system.client.follow(eid, until_terminal=False):
        if item.type == "call.error":
            assert item.data["error"]["type"] == "Cancelled"
            break
    await system.engine_idle()
    items = await system.events(eid)
    assert not of_type(items, "step.enter", "after")
    assert len(of_type(items, "execution.cancelled")) == 1
    assert of_type(items, "execution.cancelled")[0].data["reason"] == "user asked"
