"""Restart = replay: a new engine finishes what another started, deciding nothing twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from actors.engine.actor import ExecutionActor
from tests.conftest import System, of_type

# A duplicate window far shorter than a replay takes: the server cannot de-duplicate
# what a replay re-sends, so these tests see only the engine's own state-based checks.
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.layout(duplicate_window=0.1)]


def chain(n: int, marker: Path) -> str:
    # each step appends its name to a file: proof of how often a tool really ran
    steps = "\n".join(
        f"""  - step: s{i}
    tool: {{kind: python, code: "def main(f, name):\\n    open(f, 'a').write(name + '\\\\n')\\n    return name"}}
    args: {{f: "{marker}", name: s{i}}}
    next: {f"s{i + 1}" if i + 1 < n else "end"}"""
        for i in range(n)
    )
    return f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: chain{n}}}
workflow:
{steps}
"""


def assert_each_step_decided_once(items: list, n: int) -> None:
    for kind in ("step.enter", "command.issued", "step.exit"):
        counts = Counter(i.step for i in of_type(items, kind))
        assert all(counts[f"s{i}"] == 1 for i in range(n)), (kind, counts)
    terminal = [i for i in items if i.type in ("playbook.completed", "playbook.failed", "execution.cancelled")]
    assert len(terminal) == 1


async def test_engine_restart_mid_execution_finishes_without_deciding_twice(system: System, tmp_path: Path) -> None:
    n = 8
    marker = tmp_path / "ran.txt"
    pb = tmp_path / "chain.yaml"
    pb.write_text(chain(n, marker))
    entry = await system.client.register(pb)
    eid = await system.client.start(entry.path)
    async for item in system.client.follow(eid):
        if item.type == "step.exit" and item.step == "s3":
            break
    await system.restart_roles(("engine",))
    await asyncio.sleep(0.2)  # let the server's duplicate window lapse: only state-based de-duplication is left
    status = await system.client.wait(eid, timeout=30)
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert_each_step_decided_once(items, n)
    assert marker.read_text().split() == [f"s{i}" for i in range(n)]


async def test_crash_between_command_and_decision_record_is_repaired_by_replay(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine dies after publishing a step's command but before its decision record.
    The input comes back, the actor replays the log, finds the record missing, and
    writes it; the command is not run twice."""
    n = 4
    marker = tmp_path / "ran.txt"
    pb = tmp_path / "chain.yaml"
    pb.write_text(chain(n, marker))
    real_publish = ExecutionActor.publish
    crashed: list[int] = []

    async def flaky_publish(self: ExecutionActor, out, **kw):  # type: ignore[no-untyped-def]
        if not crashed and any(c.step == "s2" for c in out.commands):
            crashed.append(out.cause)
            from actors.natsio import publish_all
            from actors.wire import encode
            from streams.layout import cmd_subject

            await publish_all(self.engine.js, [(cmd_subject(c.kind, c.execution_id, c.command_id), encode(c), f"{self.execution_id}:cmd:{c.command_id}") for c in out.commands])
            await asyncio.sleep(0.2)  # past the duplicate window: the replay must not re-send the command
            raise ConnectionError("simulated crash after the command, before the decision record")
        await real_publish(self, out, **kw)

    monkeypatch.setattr(ExecutionActor, "publish", flaky_publish)
    entry = await system.client.register(pb)
    eid = await system.client.start(entry.path)
    status = await system.client.wait(eid, timeout=30)
    assert crashed, "the fault was not injected"
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert_each_step_decided_once(items, n)
    assert marker.read_text().split() == [f"s{i}" for i in range(n)]
