"""Restart = replay: a new engine finishes what another started, deciding nothing twice."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from actors import natsio
from actors.engine.actor import ExecutionActor
from actors.wire.messages import ResultBatch, loop_input_decoder
from streams.layout import CMD_STREAM, ensure, stream_configs
from tests.conftest import System, of_type
from tests.support.semantics import older_engines_live

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
    writes it; the command is not run twice. Under semantics 4: from 5 on a result and
    the decision it leads to may be one message stored at once (no such gap), and the
    fault below is injected where the decision is published the other way."""
    await older_engines_live(monkeypatch, system.runtime, semantics=4)
    n = 4
    marker = tmp_path / "ran.txt"
    pb = tmp_path / "chain.yaml"
    pb.write_text(chain(n, marker))
    real_publish = ExecutionActor.publish
    crashed: list[int] = []

    async def flaky_publish(self: ExecutionActor, out):  # type: ignore[no-untyped-def]
        if not crashed and any(c.step == "s2" for c in out.commands):
            crashed.append(out.cause)
            from actors.natsio import publish_all
            from actors.wire.messages import encode
            from streams.ids import command_msg_id
            from streams.layout import cmd_subject

            await publish_all(
                self.engine.js,
                [
                    (
                        cmd_subject(c.kind, c.execution_id, c.command_id),
                        encode(c),
                        command_msg_id(self.execution_id, c.command_id),
                    )
                    for c in out.commands
                ],
            )
            await asyncio.sleep(0.2)  # past the duplicate window: the replay must not re-send the command
            raise ConnectionError("simulated crash after the command, before the decision record")
        await real_publish(self, out)

    monkeypatch.setattr(ExecutionActor, "publish", flaky_publish)
    entry = await system.client.register(pb)
    eid = await system.client.start(entry.path)
    status = await system.client.wait(eid, timeout=30)
    assert crashed, "the fault was not injected"
    assert status.state == "COMPLETED"
    items = await system.events(eid)
    assert_each_step_decided_once(items, n)
    assert marker.read_text().split() == [f"s{i}" for i in range(n)]


async def test_a_stream_refusing_publishes_for_a_while_loses_and_doubles_nothing(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream whose leader died refuses publishes (503 no responders) until another
    node is elected, 4-9 s later. Here CMD refuses them while a loop releases commands
    (its subjects taken away: the server answers exactly as it does during an
    election). The counter must wait and send again, not fail and replay in a tight
    loop: each replay redelivered its inputs, and an input delivered max_deliver times
    is dropped by the server, leaving the loop waiting forever."""
    caplog.set_level(logging.INFO, logger="actors")
    text = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: refused}
workflow:
  - step: fan
    tool: {kind: sleep, seconds: 0.1}
    loop: {collection: "{{ range(200) | list }}", element: i, concurrency: 20}
"""
    eid = system.client.new_id()
    midway, count = asyncio.Event(), 0

    async def result(msg: Msg) -> None:
        nonlocal count
        inp = loop_input_decoder.decode(msg.data)
        count += len(inp.results) if isinstance(inp, ResultBatch) else 1  # a batch counts as its entries
        if count >= 40:
            midway.set()

    await system.nc.subscribe(f"{system.layout.loop_prefix(eid, '*')}.in.res.>", cb=result)
    await system.start_yaml(text, execution_id=eid)
    await asyncio.wait_for(midway.wait(), 20)
    js = system.nc.jetstream()
    refusing = next(c for c in stream_configs(system.layout) if c.name == CMD_STREAM)
    refusing.subjects = ["refused.cmd.>"]  # cmd.> now has no responders, as while a leader is elected
    await js.update_stream(refusing)
    await asyncio.sleep(2.0)  # the deliberate outage: longer than max_deliver tight replays take
    await ensure(js, system.layout)  # a leader again
    status = await system.client.wait(eid, timeout=40)
    assert status.state == "COMPLETED"
    assert any("publishes refused" in r.getMessage() for r in caplog.records), "the fault was not injected"
    items = await system.events(eid)
    verdict = [i for i in items if i.type in ("iterator.completed", "iterator.failed")]
    assert len(verdict) == 1 and verdict[0].type == "iterator.completed"
    assert (verdict[0].data["total"], verdict[0].data["succeeded"], verdict[0].data["failed"]) == (200, 200, 0)
    assert verdict[0].data["results"] == [{"slept": 0.1}] * 200
    assert len([i for i in items if i.type in ("playbook.completed", "playbook.failed")]) == 1
    assert not [i for i in items if i.cls == "dlq"]


async def test_a_lost_puback_past_the_duplicate_window_doubles_no_event(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream stores `playbook.completed` but its PubAck is lost (the leader died
    right after storing it), and the time to find out is longer than the stream's
    duplicate window (0.1 s here; minutes in production, but an election can outlast
    a short one). Sending it again would store it twice; the engine must instead
    rebuild by replay, find it there, and send nothing."""
    real_send = natsio.publishing.send_nowait
    dropped: list[str] = []

    def lose_one_puback(nc, subject, payload=b"", reply="", headers=None):  # type: ignore[no-untyped-def]
        if subject.endswith(".lc.playbook.completed") and not dropped:
            dropped.append(subject)
            reply = "_INBOX.nobody.listens"  # stored, and its PubAck goes nowhere
        return real_send(nc, subject, payload, reply, headers)

    monkeypatch.setattr(natsio.publishing, "send_nowait", lose_one_puback)
    natsio.publisher(system.nc).timeout = 0.5  # no PubAck: TimeoutError after 0.5-1 s, past the window
    eid, status = await system.run_yaml("""
apiVersion: actors/v1
kind: Playbook
metadata: {name: lost-ack}
workflow:
  - step: only
    tool: {kind: noop}
    next: end
""")
    assert dropped, "the fault was not injected"
    assert status.state == "COMPLETED"
    await system.engine_idle()  # the engine has dealt with its unacknowledged publish
    items = await system.events(eid)
    terminal = [i for i in items if i.type in ("playbook.completed", "playbook.failed")]
    assert [i.type for i in terminal] == ["playbook.completed"]
