"""An input whose delivery is lost on the way (a connection or a node that died with it
in flight) comes again only after `ack_wait`, while the inputs stored after it come at
once. The engine and the counter must still fold their logs in order and lose nothing:
seen in CI as a loop that waited for ever on 11 results its log held, after the node its
pod was connected to died (tests/system/test_cluster.py). Here the loss is made on
purpose, in the pod: every delivery of one input is dropped until a later input of the
same log has been handed to its actor, so the order that lost it is certain, whatever
the machine's speed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from actors.natsio.metadata import stream_seq
from actors.runtime.hosting import PartitionHost
from streams.server import NatsServer
from tests.conftest import make_layout, of_type, running_system

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

HEAD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: %s}
"""


class LostOnTheWay:
    """Drops the deliveries of the first input of `role` whose subject holds `part`
    until a later input of the same log has gone through to its actor."""

    def __init__(self, role: str, part: str) -> None:
        self.role = role
        self.part = part
        self.target: tuple[Any, int] | None = None  # (actor key, stream sequence)
        self.dropped = 0
        self.overtaken = False  # a later input of its log went through first

    def around(self, on_msg: Callable[[PartitionHost[Any, Any], Msg], None]) -> Callable[..., None]:
        def lossy(host: PartitionHost[Any, Any], msg: Msg) -> None:
            if host.role == self.role and msg.reply:
                key, seq = host._key_of(msg.subject), stream_seq(msg)
                if self.target is None and self.part in msg.subject:
                    self.target = (key, seq)
                if self.target is not None and key == self.target[0]:
                    if seq == self.target[1] and not self.overtaken:
                        self.dropped += 1
                        return
                    if seq > self.target[1]:
                        self.overtaken = True
            on_msg(host, msg)

        return lossy


def losing(monkeypatch: pytest.MonkeyPatch, role: str, part: str) -> LostOnTheWay:
    lost = LostOnTheWay(role, part)
    # before the hosts subscribe: they hand `self._on_msg` to the subscription
    monkeypatch.setattr(PartitionHost, "_on_msg", lost.around(PartitionHost._on_msg))
    return lost


async def completed_despite(
    lost: LostOnTheWay, server: NatsServer, tmp_path: Path, name: str, workflow: str
) -> list[Any]:
    """Run playbook `name` (`workflow`) on a pod whose deliveries `lost` drops, with a
    short `ack_wait` (the lost input comes back after it): once the loss happened in
    that order, the execution completes. Its log."""
    async with running_system(server, tmp_path, layout=make_layout(ack_wait=1.0)) as system:
        eid, status = await system.run_yaml(HEAD % name + workflow, timeout=60)
        assert lost.dropped >= 1 and lost.overtaken  # the loss happened, in that order
        assert status.state == "COMPLETED", status.error
        return await system.events(eid)


async def test_a_loop_result_delivered_after_later_ones_is_counted(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # iteration 1 runs longest: the results of 0 and 2 come without it, and are lost
    lost = losing(monkeypatch, "counter", ".in.res.")
    workflow = """
workflow:
  - step: fan
    tool: {kind: sleep, seconds: "{{ 0.3 if i == 1 else 0.01 }}"}
    loop: {collection: "{{ range(30) | list }}", element: i, concurrency: 3}
  - step: end
"""
    items = await completed_despite(lost, nats_server, tmp_path, "lost-result", workflow)
    verdict = of_type(items, "iterator.completed", "fan")
    assert len(verdict) == 1
    assert (verdict[0].data["total"], verdict[0].data["succeeded"], verdict[0].data["failed"]) == (30, 30, 0)
    assert verdict[0].data["results"] == [{"slept": 0.3 if i == 1 else 0.01} for i in range(30)]


async def test_a_step_result_delivered_after_a_later_one_is_folded_in_log_order(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two branches that join: the quick branch's verdict is lost on the way and comes
    after the slow one's. Folded live out of order, the join would be decided on a state
    the log does not hold (a replay would halt on it); skipped, it would wait for ever."""
    lost = losing(monkeypatch, "engine", ".in.iterator")
    workflow = """
workflow:
  - step: start
    next: [quick, slow]
  - step: quick
    tool: {kind: sleep, seconds: 0.01}
    loop: {collection: "{{ range(2) | list }}", element: i}
  - step: slow
    tool: {kind: sleep, seconds: 0.2}
    loop: {collection: "{{ range(2) | list }}", element: i, concurrency: 1}
  - step: end
"""
    items = await completed_despite(lost, nats_server, tmp_path, "lost-verdict", workflow)
    assert not of_type(items, "execution.halted")
    assert len(of_type(items, "step.enter", "end")) == 1
    assert [i.step for i in of_type(items, "iterator.completed")] == ["quick", "slow"]  # the log's order
    assert of_type(items, "playbook.completed")[0].data["result"] == {
        "quick": [{"slept": 0.01}] * 2,
        "slow": [{"slept": 0.2}] * 2,
    }
