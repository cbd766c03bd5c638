"""A loop of waits against a real nats-server (issue #29: inside a loop, each iteration
waits on its own key): 1,000 iterations keyed by item, signalled in random order (some
twice) through the execution's log, which the engine forwards to the loop: the loop
completes with each iteration's result the data of its own signal; the one iteration
nobody signals times out at its deadline, a tolerated failure listed by
`Client.failed_items` and `actors-cli items`; the progress records show waiting
iterations as not done, and come only when the counts change."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from typing import Any

import msgspec
import pytest

from actors.cli.progress import running_lines
from actors.client.progress import running_now
from actors.natsio import publish_all
from actors.natsio.binding import codec_of
from actors.wire.messages import LoopProgress, SignalSent
from streams import ids
from streams.subjects import ExecSubjects, progress_subject
from tests.conftest import System, of_type, wait_for
from tests.support.cli import cli

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

N = 1_000
SILENT = 613  # the item nobody signals

PLAYBOOK = f"""apiVersion: actors/v1
kind: Playbook
metadata: {{name: loop-waits, path: tests/loop-waits}}
workflow:
  - step: approvals
    tool:
      kind: wait
      signal: done
      key: "{{{{ item }}}}"
      until: "{{{{ workload.soon if item == {SILENT} else workload.late }}}}"
    loop:
      collection: "{{{{ range({N}) | list }}}}"
      element: item
      concurrency: 10
      tolerated_failures: 1
    next: total
  - step: total
    args: {{values: "{{{{ approvals }}}}"}}
"""


async def test_a_thousand_waits_signalled_in_random_order(system: System) -> None:
    progress: list[LoopProgress] = []
    decoder = msgspec.json.Decoder(LoopProgress)
    eid = "loop-waits-1"

    async def heard(msg: Any) -> None:
        progress.append(decoder.decode(msg.data))

    await system.nc.subscribe(progress_subject(eid), cb=heard)
    # the silent item's deadline: long enough for the 999 signals to land first on a loaded host
    soon, late = time.time() + 12, time.time() + 3600
    await system.start_yaml(PLAYBOOK, payload={"soon": soon, "late": late}, execution_id=eid)

    # the counter says how many iterations wait once the loop starts waiting (then when
    # that changes, and again about every second while iterations wait)
    async def started() -> bool:
        return any(p.waiting for p in progress)

    await wait_for(started)
    first = next(p for p in progress if p.waiting)

    # while every iteration waits, with nothing changing, the counter says its counts
    # again (so `status` of an idle loop of waits still shows them): seen before any
    # signal is sent, so it does not hang on how fast the signals land
    def idle_repeats() -> list[tuple[LoopProgress, LoopProgress]]:
        return [
            (a, b)
            for a, b in itertools.pairwise(progress)
            if (a.done, a.waiting) == (b.done, b.waiting) and a.waiting > 0 and a.in_flight == 0
        ]

    async def repeated() -> bool:
        return bool(idle_repeats())

    await wait_for(repeated, timeout=10)
    again = idle_repeats()
    assert all(b.at - a.at >= 0.5 for a, b in again), [(p.done, p.waiting, p.at) for p in progress]
    assert first.done + first.waiting == N and first.waiting >= N - 1  # (the silent one may have timed out)

    js = system.nc.jetstream()
    codec = codec_of(js)
    subject = ExecSubjects.of(eid, system.layout.partitions).signal
    rng = random.Random(29)
    order = [i for i in range(N) if i != SILENT]
    rng.shuffle(order)
    sigs = [SignalSent(execution_id=eid, signal_id=f"sig-{i}", name="done", key=str(i), data={"n": i}) for i in order]
    sigs += rng.sample(sigs, 50)  # sent twice under the same id: one signal each
    # `status` while they land: the loop's counts as the counter says them (the loop
    # cannot end before the silent item's deadline)
    snapshot = asyncio.ensure_future(running_now(system.client, eid, wait=5))
    for start in range(0, len(sigs), 200):
        batch = sigs[start : start + 200]
        await publish_all(js, [(subject, codec.encode(s), ids.signal_msg_id(eid, s.signal_id)) for s in batch])
    (running,) = await snapshot
    loop = running.loop
    assert loop is not None and loop.done is not None and loop.waiting is not None
    assert loop.done + loop.waiting == N and loop.waiting >= 1
    line = running_lines([running])[0]
    assert f"{loop.done}/{N:,} done" in line and f"{loop.waiting:,} waiting" in line, line

    status = await system.client.wait(eid, timeout=60)
    assert status.state == "COMPLETED", status
    items = await system.events(eid)
    values = of_type(items, "playbook.completed")[0].data["result"]["total"]["values"]
    assert values == [None if i == SILENT else {"n": i} for i in range(N)]
    # the silent one timed out at its deadline, not before: a tolerated failure, listed
    page = await system.client.failed_items(eid)
    assert page.total == 1
    (failed,) = page.items
    assert (failed.index, failed.element, failed.error_type, failed.attempts) == (SILENT, SILENT, "WaitTimeout", 1)
    assert "waited for signal 'done' (key '613')" in failed.message
    assert of_type(items, "iterator.completed", "approvals")[0].at >= soon
    listed = await cli("items", eid, "approvals", "--json", url=system.server.url)
    assert listed.code == 0, listed.err
    assert [(i["index"], i["error"]["type"]) for i in json.loads(listed.out)["items"]] == [(SILENT, "WaitTimeout")]
    # while it ran, the progress records counted waiting iterations apart from the done ones
    assert progress and all(p.done + p.waiting <= N and p.in_flight == 0 for p in progress)
    assert any(p.waiting > 0 for p in progress)
    assert progress[-1].done == N and progress[-1].waiting == 0
