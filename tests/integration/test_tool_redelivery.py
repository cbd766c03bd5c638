"""A tool pod that stored a command's answer and died before acking it: the command is
delivered again, and the next tool actor finds the answer in the execution's log and
acks it without running the step a second time."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.client import Client
from actors.natsio import publish_all
from actors.pod.roles import connect, start_roles
from actors.tools import running
from actors.tools.actor import ToolActor
from actors.wire.events import embedded_command
from actors.wire.messages import CallDone, command_decoder, encode
from streams.ids import result_id
from streams.layout import EXEC_STREAM, Layout, ensure, tool_log_consumer
from streams.server import NatsServer
from tests.conftest import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: once}
workflow:
  - step: nap
    tool: {kind: sleep, seconds: 0}
    next: effect
  - step: effect
    tool:
      kind: python
      code: |
        def main(path):
            with open(path, "a") as f:
                f.write("ran\\n")
            return "from a run"
    args: {path: "{{ workload.path }}"}
"""


async def test_a_command_answered_before_its_pod_died_is_not_run_again(nats_server: NatsServer, tmp_path: Path) -> None:
    layout = Layout(partitions=2, ack_wait=1.0)
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    sleeper = ToolActor(nc, layout=layout, kinds=("sleep",))
    await sleeper.start()
    tools: ToolActor | None = None
    try:
        client = Client(nc, layout=layout)
        pb = tmp_path / "once.yaml"
        pb.write_text(PLAYBOOK)
        effects = tmp_path / "effects"
        eid = await client.start((await client.register(pb)).path, payload={"path": str(effects)})
        # the pod that dies: takes `effect`'s command (held by its decision record),
        # stores its answer, and is gone before the ack
        dying_pod = await nc.jetstream().pull_subscribe_bind(tool_log_consumer("python"), stream=EXEC_STREAM)
        (msg,) = await dying_pod.fetch(1, timeout=10)
        held = embedded_command(msg.data)
        assert held is not None
        cmd = command_decoder.decode(held)
        answer = CallDone(
            execution_id=eid, command_id=cmd.command_id, step=cmd.step, attempt_number=1, result="stored before dying"
        )
        await publish_all(nc.jetstream(), [(cmd.reply_to, encode(answer), result_id(eid, cmd.command_id))])
        await dying_pod.unsubscribe()
        # a python tool actor comes up: the command comes back to it after ack_wait
        tools = ToolActor(nc, layout=layout, kinds=("python",), step_user_fallback=True)
        await tools.start()
        assert (await client.wait(eid, timeout=20)).state == "COMPLETED"
        assert await client.result(eid) == {"effect": "stored before dying"}

        async def acked() -> bool:
            info = await nc.jsm().consumer_info(EXEC_STREAM, tool_log_consumer("python"))
            return info.num_ack_pending == 0 and info.delivered.consumer_seq >= 2  # delivered again, acked

        await wait_for(acked, timeout=20)
        assert not effects.exists()  # the step never ran: its answer was in the log
    finally:
        if tools is not None:
            await tools.stop()
        await sleeper.stop()
        await rt.stop()
        await nc.close()


async def test_a_consumer_made_again_runs_none_of_the_old_commands_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Someone deletes the tool consumer on EXEC; the next engine pod makes it again,
    which delivers every command the log holds once more: each was answered, so none
    runs twice."""
    layout = Layout(partitions=2, ack_wait=1.0)
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    tools = [ToolActor(nc, layout=layout, kinds=("sleep", "python"), step_user_fallback=True)]
    await tools[0].start()
    try:
        client = Client(nc, layout=layout)
        pb = tmp_path / "once.yaml"
        pb.write_text(PLAYBOOK)
        effects = tmp_path / "effects"
        eid = await client.start((await client.register(pb)).path, payload={"path": str(effects)})
        assert (await client.wait(eid, timeout=20)).state == "COMPLETED"
        assert effects.read_text() == "ran\n"
        await tools[0].stop()
        await nc.jsm().delete_consumer(EXEC_STREAM, tool_log_consumer("python"))
        await ensure(nc.jetstream(), layout)  # an engine pod starting: made again, delivering from the start
        tools.append(ToolActor(nc, layout=layout, kinds=("python",), step_user_fallback=True))
        await tools[1].start()

        async def redelivered_and_acked() -> bool:
            info = await nc.jsm().consumer_info(EXEC_STREAM, tool_log_consumer("python"))
            return info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.consumer_seq >= 1

        await wait_for(redelivered_and_acked, timeout=20)
        assert effects.read_text() == "ran\n"  # not a second time
    finally:
        await tools[-1].stop()
        await rt.stop()
        await nc.close()


async def test_a_command_delivered_again_runs_when_the_log_cannot_be_asked(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a command delivered again is answered is asked of the log; when that
    question fails (a node down, a timeout), the command runs, as a redelivery always
    did: it does not fail delivery after delivery into a dead letter."""
    layout = Layout(partitions=2, ack_wait=1.0, max_deliver=3)
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    sleeper = ToolActor(nc, layout=layout, kinds=("sleep",))
    await sleeper.start()
    tools: ToolActor | None = None
    try:
        client = Client(nc, layout=layout)
        pb = tmp_path / "once.yaml"
        pb.write_text(PLAYBOOK)
        effects = tmp_path / "effects"
        eid = await client.start((await client.register(pb)).path, payload={"path": str(effects)})
        dying_pod = await nc.jetstream().pull_subscribe_bind(tool_log_consumer("python"), stream=EXEC_STREAM)
        await dying_pod.fetch(1, timeout=10)  # taken, and never answered: it comes back
        await dying_pod.unsubscribe()

        async def unreachable(*args: object, **kwargs: object) -> bool:
            raise TimeoutError

        monkeypatch.setattr(running, "has_message", unreachable)
        tools = ToolActor(nc, layout=layout, kinds=("python",), step_user_fallback=True)
        await tools.start()
        assert (await client.wait(eid, timeout=20)).state == "COMPLETED"
        assert effects.read_text() == "ran\n"
        assert not await client.dead_letters()
    finally:
        if tools is not None:
            await tools.stop()
        await sleeper.stop()
        await rt.stop()
        await nc.close()
