"""`ACTORS_TOOL_CONCURRENCY` caps the commands of a kind a tool pod runs at once,
whichever stream they come from: a loop's or a decision's several commands (CMD) and
the commands held by decision records in the execution logs (EXEC), which the kind's
two pulls fetch side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.tools.actor import ToolActor
from streams.layout import Layout
from streams.server import NatsServer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


def _step(name: str) -> str:
    """A python step that notes when it starts and ends, and runs a moment between."""
    return f"""
  - step: {name}
    tool:
      kind: python
      code: |
        def main(p):
            import time
            open(p, "a").write("{name}+ %r\\n" % time.monotonic())
            time.sleep(0.4)
            open(p, "a").write("{name}- %r\\n" % time.monotonic())
    args: {{p: "{{{{ workload.p }}}}"}}
"""


# two commands in one decision (CMD), and one held by its decision record (EXEC)
PARALLEL = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: par}\nworkflow:\n"
PARALLEL += "  - step: start\n    tool: {kind: noop}\n    next: [a, b]\n" + _step("a") + _step("b")
ONE = "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: one}\nworkflow:\n"
ONE += "  - step: start\n    tool: {kind: noop}\n    next: c\n" + _step("c")


async def test_one_command_at_a_time_from_both_streams(nats_server: NatsServer, tmp_path: Path) -> None:
    layout = Layout(partitions=2)
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    noop = ToolActor(nc, layout=layout, kinds=("noop",))
    python = ToolActor(nc, layout=layout, kinds=("python",), concurrency=1, step_user_fallback=True)
    await noop.start()
    await python.start()
    try:
        client = Client(nc, layout=layout)
        trace = tmp_path / "trace"
        (tmp_path / "par.yaml").write_text(PARALLEL)
        (tmp_path / "one.yaml").write_text(ONE)
        first = await client.start((await client.register(tmp_path / "par.yaml")).path, payload={"p": str(trace)})
        second = await client.start((await client.register(tmp_path / "one.yaml")).path, payload={"p": str(trace)})
        for eid in (first, second):
            assert (await client.wait(eid, timeout=40)).state == "COMPLETED"
        marks = sorted((float(at), what) for what, at in (line.split() for line in trace.read_text().splitlines()))
        assert sorted(m[1] for m in marks) == ["a+", "a-", "b+", "b-", "c+", "c-"]
        running = peak = 0
        for _, what in marks:
            running += 1 if what.endswith("+") else -1
            peak = max(peak, running)
        assert peak == 1, f"{peak} python commands ran at once with concurrency 1: {marks}"
    finally:
        await python.stop()
        await noop.stop()
        await rt.stop()
        await nc.close()
