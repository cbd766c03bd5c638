"""A message the server gives up on (delivered `max_deliver` times, never acked) ends
in a dead letter with the reason; a command nobody will run fails its step instead of
leaving the execution running forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.tools.actor import ToolActor
from streams.layout import CMD_STREAM, EXEC_STREAM, Layout, tool_consumer, tool_log_consumer
from streams.server import NatsServer
from tests.support.semantics import older_engines_live

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: doomed}
workflow:
  - step: crashy
    tool: {kind: python, code: "def main(): return 1"}
"""


async def test_a_command_whose_every_delivery_dies_fails_its_step_with_a_dead_letter(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lease_ttl 2 s: the starter looks at the engine pods' semantics every 0.5 s
    layout = Layout(partitions=2, max_deliver=2, ack_wait=1.0, lease_ttl=2.0)
    nc = await connect(nats_server.url, name="test")
    # no tool actor of ours: the command's deliveries go to a "pod" that takes it and
    # dies before answering, each time
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    try:
        # an execution of semantics 1, whose commands are messages of their own in CMD
        # (as a loop's iterations are, and a decision's several commands)
        await older_engines_live(monkeypatch, rt)
        client = Client(nc, layout=layout)
        pb = tmp_path / "doomed.yaml"
        pb.write_text(PLAYBOOK)
        entry = await client.register(pb)
        eid = await client.start(entry.path)
        dying_pod = await nc.jetstream().pull_subscribe_bind(tool_consumer("python"), stream=CMD_STREAM)
        for delivery in (1, 2):
            (msg,) = await dying_pod.fetch(1, timeout=10)  # the second comes after ack_wait
            assert msg.metadata.num_delivered == delivery
        # a pod asks for more: the server would redeliver now, gives up instead, and says so
        third = asyncio.create_task(dying_pod.fetch(1, timeout=layout.ack_wait * 4))
        status = await client.wait(eid, timeout=20)
        assert status.state == "FAILED"
        items = await client.events(eid)
        failed = [i for i in items if i.type == "call.error"]
        assert failed and failed[0].data["error"]["type"] == "DeliveryExhausted"
        letters = [i for i in items if i.cls == "dlq"]
        assert len(letters) == 1 and letters[0].type == "dead_letter.tools"
        assert "delivered 2 times to consumer tools-python" in letters[0].data["reason"]
        assert letters[0].data["subject"].startswith(f"cmd.python.{eid}.")
        with pytest.raises(asyncio.TimeoutError):
            await third  # nothing is delivered a third time
    finally:
        await rt.stop()
        await nc.close()


HELD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: doomed-later}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 0}
    next: crashy
  - step: crashy
    tool: {kind: python, code: "def main(): return 1"}
"""


async def test_a_command_held_by_its_decision_record_that_no_delivery_answers_fails_its_step_too(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The second step's command is held by the decision record in the execution's log
    (semantics 2, `ev.cmd.python`), not stored in CMD: the server's giving up on it is
    dead-lettered and answered the same way, and the record stays in the log."""
    layout = Layout(partitions=2, max_deliver=2, ack_wait=1.0)
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    sleeper = ToolActor(nc, layout=layout, kinds=("sleep",))  # runs `nap`; nobody runs python
    await sleeper.start()
    try:
        client = Client(nc, layout=layout)
        pb = tmp_path / "doomed.yaml"
        pb.write_text(HELD)
        eid = await client.start((await client.register(pb)).path)
        dying_pod = await nc.jetstream().pull_subscribe_bind(tool_log_consumer("python"), stream=EXEC_STREAM)
        for delivery in (1, 2):
            (msg,) = await dying_pod.fetch(1, timeout=10)
            assert msg.metadata.num_delivered == delivery
            # semantics 5: held by the record that stores `nap`'s result with its decision
            assert msg.subject == f"{layout.exec_prefix(eid)}.in.answer.cmd.python"
        third = asyncio.create_task(dying_pod.fetch(1, timeout=layout.ack_wait * 4))
        status = await client.wait(eid, timeout=20)
        assert status.state == "FAILED"
        items = await client.events(eid)
        failed = [i for i in items if i.type == "call.error"]
        assert [(i.step, i.data["error"]["type"]) for i in failed] == [("crashy", "DeliveryExhausted")]
        letters = [i for i in items if i.cls == "dlq"]
        assert len(letters) == 1 and "delivered 2 times to consumer tools-python-log" in letters[0].data["reason"]
        assert letters[0].data["subject"] == msg.subject
        assert (await nc.jsm().stream_info(CMD_STREAM)).state.last_seq == 0  # every command held in the log
        with pytest.raises(asyncio.TimeoutError):
            await third
    finally:
        await sleeper.stop()
        await rt.stop()
        await nc.close()
