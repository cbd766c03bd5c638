"""A command a tool actor holds keeps its execution waiting; it is kept alive while it
runs, but one stuck past its step's timeout (and a margin for storing its answer) is let
go, said in the log, and delivered again, so its execution ends instead of staying
RUNNING for ever."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from actors.client import Client
from actors.pod.roles import Runtime, connect, start_roles
from actors.tools.actor import ToolActor
from actors.tools.held import hold_bound
from actors.wire.messages import Command, SinkCall
from streams.layout import Layout
from streams.server import NatsServer
from tests.conftest import make_layout

pytestmark = [pytest.mark.timeout(60)]

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: held}
workflow:
  - step: work
    timeout: 0.5
    tool: {kind: python, code: "def main(x):\\n    return x * 2\\n"}
    args: {x: 21}
"""


@pytest_asyncio.fixture
async def others(nats_server: NatsServer) -> AsyncIterator[tuple[Any, Runtime, Layout]]:
    """Every role but the tool actors, which each test makes itself."""
    layout = make_layout(ack_wait=1.0)
    nc = await connect(nats_server.url, name="test")
    runtime = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    try:
        yield nc, runtime, layout
    finally:
        await runtime.stop()
        await nc.close()


@pytest.mark.asyncio
async def test_a_command_stuck_past_its_timeout_is_let_go_and_its_execution_still_ends(
    others: tuple[Any, Runtime, Layout], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nc, _, layout = others
    tools = ToolActor(nc, layout=layout, kinds=("python",), hold_margin=0.5)
    runner = tools._runner
    real = runner._run
    stuck = asyncio.Event()

    async def first_run_never_returns(cmd: Command, *args: Any) -> Any:
        """A bug in the pod: the first run waits on something that never comes."""
        if not stuck.is_set():
            stuck.set()
            await asyncio.Event().wait()
        return await real(cmd, *args)

    runner._run = first_run_never_returns  # type: ignore[method-assign]
    await tools.start()
    try:
        client = Client(nc, layout=layout)
        path = tmp_path / "held.yaml"
        path.write_text(PLAYBOOK)
        entry = await client.register(path)
        with caplog.at_level(logging.ERROR, logger="actors.tools"):
            eid = await client.start(entry.path, version=entry.version)
            status = await client.wait(eid, timeout=30)
        assert status.state == "COMPLETED", status
        items = await client.events(eid)
        (end,) = [e for e in items if e.cls == "lc" and e.type == "playbook.completed"]
        assert end.data["result"]["work"] == 42, end
        assert stuck.is_set() and tools._held.let_go == 1
        said = [r.getMessage() for r in caplog.records if "no longer kept alive" in r.getMessage()]
        assert len(said) == 1 and eid in said[0] and "'work'" in said[0], said
        done = [e for e in items if e.type in ("call.done", "call.error")]
        assert [e.type for e in done] == ["call.done"], done  # the stuck run never answered
    finally:
        await tools.stop(drain_timeout=0.1)


def test_the_bound_scales_with_a_chunk_and_a_sink_and_a_step_without_timeout_has_none() -> None:
    def command(**fields: Any) -> Command:
        return Command(
            execution_id="e", command_id="c", step="s", kind="python", reply_to="r", attempt_number=1, **fields
        )

    assert hold_bound(command()) == math.inf
    assert hold_bound(command(timeout=2.0)) == 2.0
    sink = SinkCall(tool={"kind": "noop"}, args={}, scope={})
    assert hold_bound(command(timeout=2.0, sink=sink)) == 4.0
