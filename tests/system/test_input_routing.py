"""Inputs an engine must not fold, against a real nats-server (issue #29: the signal
subject is public): an input published in a partition that is not its execution's is
not in the log a replay reads, and a message of one input type published on another's
subject (a `timer.fired` on `in.signal`, where any user may publish) is not what that
subject takes. Neither is folded: each is dead-lettered saying why, the execution goes
on waiting, and the real signal ends its wait."""

from __future__ import annotations

import pytest

from actors.natsio import publish_all
from actors.natsio.binding import codec_of
from actors.wire.messages import SignalSent, TimerFired
from streams.subjects import ExecSubjects
from tests.conftest import System, of_type

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

APPROVAL = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: routing_approval}
workflow:
  - step: approve
    timeout: 120
    tool: {kind: wait, signal: approval, approval: true}
"""


async def test_inputs_in_another_partition_or_of_another_type_are_dead_lettered_not_folded(system: System) -> None:
    eid = "route-1"
    await system.start_yaml(APPROVAL, execution_id=eid)
    await system.engine_idle()
    js = system.nc.jetstream()
    codec = codec_of(js)
    parts = system.layout.partitions
    home = ExecSubjects.of(eid, parts)
    wrong = ExecSubjects(f"exec.{(system.layout.partition_of(eid) + 1) % parts}.{eid}")
    approved = {"approved": True, "comment": "", "by": "mallory"}
    forged = SignalSent(execution_id=eid, signal_id="elsewhere", name="approval", data=approved, by="mallory")
    (waiting,) = of_type(await system.events(eid), "step.waiting", "approve")
    timer = TimerFired(execution_id=eid, timer_id=waiting.data["timer_id"], due=waiting.data["deadline"])
    await publish_all(
        js,
        [
            (wrong.signal, codec.encode(forged), "route-elsewhere"),  # folded, it would approve
            (home.signal, codec.encode(timer), "route-timer"),  # folded, it would time the wait out
        ],
    )
    await system.engine_idle()
    letters = {i.data["subject"]: i.data["reason"] for i in await system.client.dead_letters("engine")}
    assert "not in its partition" in letters[wrong.signal], letters
    assert "TimerFired" in letters[home.signal] and "not what that subject takes" in letters[home.signal]
    items = await system.events(eid)
    assert not of_type(items, "signal.received") and not of_type(items, "wait.ended")
    status = await system.client.status(eid)
    assert status is not None and status.state == "RUNNING" and status.waiting
    reply = await system.client.signal(eid, "approval", {"approved": True, "comment": "ok", "by": "ann"})
    assert reply.accepted
    done = await system.client.wait(eid, timeout=20)
    assert done.state == "COMPLETED"
    (got,) = of_type(await system.events(eid), "signal.received")
    assert got.data["signal_id"] == reply.signal_id
