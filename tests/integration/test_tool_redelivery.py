"""A tool pod that stored a command's answer and died before acking it: the command is
delivered again, and the next tool actor finds the answer in the execution's log and
acks it without running the step a second time. Every result of an execution of
semantics 4 is on one subject (`in.result`): only an answer naming the command counts,
another step's does not."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.client import Client
from actors.natsio import publish_all
from actors.natsio.batchget import on_subject
from actors.pod.roles import connect, start_roles
from actors.tools import running
from actors.tools.actor import ToolActor
from actors.wire.events import embedded_command
from actors.wire.messages import (
    CallDone,
    Command,
    answer_subject,
    command_decoder,
    command_of_answer,
    command_of_record_answer,
    encode,
    start_of_record_answer,
)
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


@dataclass
class Run:
    """Engine, counter and projector running, the playbook started once (its effect
    written to `effects`), and the tool actors a test starts, stopped at the end."""

    nc: NATS
    layout: Layout
    client: Client
    eid: str
    effects: Path
    tools: list[ToolActor] = field(default_factory=list)

    async def tool_actor(self, *kinds: str) -> ToolActor:
        actor = ToolActor(self.nc, layout=self.layout, kinds=kinds, step_user_fallback=True)
        self.tools.append(actor)
        await actor.start()
        return actor


@contextlib.asynccontextmanager
async def started(nats_server: NatsServer, tmp_path: Path, layout: Layout, *kinds: str) -> AsyncIterator[Run]:
    """`kinds`: the tool actor running from the start (more with `Run.tool_actor`)."""
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine", "counter", "projector"))
    client = Client(nc, layout=layout)
    run = Run(nc, layout, client, "", tmp_path / "effects")
    try:
        await run.tool_actor(*kinds)
        pb = tmp_path / "once.yaml"
        pb.write_text(PLAYBOOK)
        run.eid = await client.start((await client.register(pb)).path, payload={"path": str(run.effects)})
        yield run
    finally:
        for actor in reversed(run.tools):
            await actor.stop()
        await rt.stop()
        await nc.close()


async def held_command_taken(nc: NATS) -> tuple[Msg, Command]:
    """A tool "pod" takes the python step's command (held by its decision record)."""
    pod = await nc.jetstream().pull_subscribe_bind(tool_log_consumer("python"), stream=EXEC_STREAM)
    (msg,) = await pod.fetch(1, timeout=10)
    await pod.unsubscribe()  # and is gone, unacked: the command comes back after ack_wait
    held = embedded_command(msg.data)
    assert held is not None
    return msg, command_decoder.decode(held)


@pytest.mark.parametrize("answered_on", ["shared", "own"])
async def test_a_command_answered_before_its_pod_died_is_not_run_again(
    nats_server: NatsServer, tmp_path: Path, answered_on: str
) -> None:
    """The pod that dies stored the answer on the execution's shared results subject (a
    tool of this version) or on the command's own subject (a tool pod older than
    semantics 4, which knows no `answer_on`): either way the next pod finds it."""
    async with started(nats_server, tmp_path, Layout(partitions=2, ack_wait=1.0), "sleep") as run:
        nc, eid = run.nc, run.eid
        # the pod that dies: takes `effect`'s command, stores its answer, and is gone before the ack
        _, cmd = await held_command_taken(nc)
        subjects = run.layout.execution(eid)
        assert cmd.answer_on == subjects.results  # shared with `nap`'s answer (semantics 4)
        assert cmd.reply_to == subjects.result(cmd.command_id)  # where an older tool pod answers
        answer = CallDone(
            execution_id=eid, command_id=cmd.command_id, step=cmd.step, attempt_number=1, result="stored before dying"
        )
        where = answer_subject(cmd) if answered_on == "shared" else cmd.reply_to
        await publish_all(nc.jetstream(), [(where, encode(answer), result_id(eid, cmd.command_id))])
        # a python tool actor comes up: the command comes back to it after ack_wait
        await run.tool_actor("python")
        assert (await run.client.wait(eid, timeout=20)).state == "COMPLETED"
        assert await run.client.result(eid) == {"effect": "stored before dying"}

        async def acked() -> bool:
            info = await nc.jsm().consumer_info(EXEC_STREAM, tool_log_consumer("python"))
            return info.num_ack_pending == 0 and info.delivered.consumer_seq >= 2  # delivered again, acked

        await wait_for(acked, timeout=20)
        assert not run.effects.exists()  # the step never ran: its answer was in the log


async def test_a_consumer_made_again_runs_none_of_the_old_commands_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Someone deletes the tool consumer on EXEC; the next engine pod makes it again,
    which delivers every command the log holds once more: each was answered, so none
    runs twice."""
    layout = Layout(partitions=2, ack_wait=1.0)
    async with started(nats_server, tmp_path, layout, "sleep", "python") as run:
        nc = run.nc
        assert (await run.client.wait(run.eid, timeout=20)).state == "COMPLETED"
        assert run.effects.read_text() == "ran\n"
        await run.tools.pop().stop()
        await nc.jsm().delete_consumer(EXEC_STREAM, tool_log_consumer("python"))
        await ensure(nc.jetstream(), layout)  # an engine pod starting: made again, delivering from the start
        await run.tool_actor("python")

        async def redelivered_and_acked() -> bool:
            info = await nc.jsm().consumer_info(EXEC_STREAM, tool_log_consumer("python"))
            return info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.consumer_seq >= 1

        await wait_for(redelivered_and_acked, timeout=20)
        assert run.effects.read_text() == "ran\n"  # not a second time


async def test_a_command_delivered_again_runs_when_only_another_steps_answer_is_stored(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The pod that took `effect`'s command died before running it: the command comes
    back, the execution's log holds `nap`'s answer (semantics 5: stored with the decision
    that holds this command, an answer record) and not its own, so it runs (once)."""
    async with started(nats_server, tmp_path, Layout(partitions=2, ack_wait=1.0), "sleep") as run:
        nc, eid = run.nc, run.eid
        _, cmd = await held_command_taken(nc)
        subjects = run.layout.execution(eid)
        results = subjects.results
        assert cmd.answer_on == results and cmd.ask_on is not None
        # `nap`'s answer, which issued this command (and, semantics 6, the start stored
        # with the first decision, which held `nap`'s: no command's answer)
        answers = await on_subject(nc, EXEC_STREAM, subjects.answers)
        held = [m for m in answers if start_of_record_answer(m.data) is None]
        assert len(held) == 1 and command_of_record_answer(held[0].data) not in (None, cmd.command_id)
        assert not await on_subject(nc, EXEC_STREAM, results)
        await run.tool_actor("python")
        assert (await run.client.wait(eid, timeout=20)).state == "COMPLETED"
        assert await run.client.result(eid) == {"effect": "from a run"}
        assert run.effects.read_text() == "ran\n"
        steps = {command_of_answer(m.data) for m in await on_subject(nc, EXEC_STREAM, results)}
        steps |= {command_of_record_answer(m.data) for m in await on_subject(nc, EXEC_STREAM, subjects.answers)}
        steps.discard(None)  # the start stored with its first decision answers no command
        assert len(steps) == 2 and cmd.command_id in steps  # both answers, each once


async def test_a_command_delivered_again_runs_when_the_log_cannot_be_asked(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a command delivered again is answered is asked of the log; when that
    question fails (a node down, a timeout), the command runs, as a redelivery always
    did: it does not fail delivery after delivery into a dead letter."""
    async with started(nats_server, tmp_path, Layout(partitions=2, ack_wait=1.0, max_deliver=3), "sleep") as run:
        await held_command_taken(run.nc)  # taken, and never answered: it comes back

        async def unreachable(*args: object, **kwargs: object) -> bool:
            raise TimeoutError

        monkeypatch.setattr(running, "is_answered", unreachable)
        await run.tool_actor("python")
        assert (await run.client.wait(run.eid, timeout=20)).state == "COMPLETED"
        assert run.effects.read_text() == "ran\n"
        assert not await run.client.dead_letters()
