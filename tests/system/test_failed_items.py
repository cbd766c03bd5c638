"""Failed loop items against a real nats-server: a 2,000-item loop that tolerated 8
failures lists exactly those (paged, by `Client.failed_items` and `actors-cli items`),
`run` says so, and a redrive (`Client.redrive`, `actors-cli retry --failed-items`) runs
only those 8 again in one new linked execution that keeps the other 1,992 results. A
bad cursor is one line (CLI) or a 400 (UI); a redrive is refused while a pod of older
code runs, and for a loop step that ran more than once (a cycle), whose `run` summary
shows each loop's own failures. And past the server's limits: a loop with 100,050
failure records (more than one subject listing holds) and 1,001 loops with failures."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer

from actors.client import Client, RetryRefused
from actors.client.items import InvalidCursor
from actors.loops.counter import Counter, LoopActor
from actors.pod.roles import connect
from actors.ui.server import make_app
from actors.wire.messages import ErrorInfo, FailedItem, encode
from streams import ids
from streams.layout import LOOP_STREAM, OWNERS_BUCKET, ensure
from streams.server import NatsServer
from streams.subjects import LoopSubjects, failed_items_filter
from tests.conftest import System, make_layout, of_type, wait_for
from tests.support.cli import EXIT_INVALID, cli

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FAILING = [n for n in range(2000) if n % 250 == 7]  # 8 items, until the file `fixed` exists

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: redrive-me, path: tests/redrive-me}
workflow:
  - step: fan
    tool:
      kind: python
      code: |
        import os
        def main(n, fixed):
            if n % 250 == 7 and not os.path.exists(fixed):
                raise ValueError(f"item {n} is bad")
            return n * 2
    args: {n: "{{ n }}", fixed: "{{ workload.fixed }}"}
    loop:
      collection: "{{ range(2000) | list }}"
      element: n
      mode: chunked
      chunk_size: 100
      concurrency: 400
      tolerated_failures: 10
    next: total
  - step: total
    args: {values: "{{ fan }}"}
"""

# a loop step visited twice (its second visit over other elements), one failure each time
CYCLE = """apiVersion: actors/v1
kind: Playbook
metadata: {name: cycle-redrive, path: tests/cycle-redrive}
workflow:
  - step: fan
    tool:
      kind: python
      code: |
        def main(n):
            if n in (1, 4):
                raise ValueError(f"item {n} is bad")
            return n
    args: {n: "{{ n }}"}
    loop:
      collection: "{{ [0, 1, 2] if again is undefined else [3, 4, 5] }}"
      element: n
      tolerated_failures: 1
    next:
      - when: "{{ again is undefined }}"
        then: again
  - step: again
    args: {visited: true}
    next: fan
"""


async def test_failed_items_are_listed_by_page_and_redriven_alone(system: System) -> None:
    fixed = system.tmp / "fixed"
    flow = system.tmp / "redrive.yaml"
    flow.write_text(PLAYBOOK)
    eid = "redrive-old"
    payload = json.dumps({"fixed": str(fixed)})
    ran = await cli("run", str(flow), "--payload", payload, "--execution-id", eid, url=system.server.url)
    assert ran.code == 0, ran.err
    # `run` names the loop's tolerated failures and the first few (in the order they failed)
    assert "fan: 8 of 2,000 items failed (tolerated)" in ran.out, ran.out
    shown = re.findall(r"^  fan\[(\d+)\]  1 attempt  ValueError: item (\d+) is bad  element: (\d+)  ", ran.out, re.M)
    assert len(shown) == 3 and all(a == b == c and int(a) in FAILING for a, b, c in shown), ran.out
    assert f"actors-cli retry {eid} --failed-items" in ran.out
    old = of_type(await system.events(eid), "playbook.completed")[0].data["result"]["total"]["values"]
    assert [i for i, v in enumerate(old) if v is None] == FAILING

    # paged: exactly the failed items, each once, with the total
    seen, after, pages = [], None, 0
    while True:
        page = await system.client.failed_items(eid, after=after, limit=3)
        assert page.total == 8
        seen += page.items
        pages += 1
        after = page.next_after
        if after is None:
            break
    assert pages == 3 and sorted(i.index for i in seen) == FAILING
    first = next(i for i in seen if i.index == 7)
    assert (first.step, first.element, first.attempts, first.error_type) == ("fan", 7, 1, "ValueError")
    assert first.message == "item 7 is bad" and "ValueError" in (first.traceback or "")
    # each record under the id its builder gives (a re-send is one record)
    stored = await system.nc.jsm().get_last_msg(LOOP_STREAM, failed_items_filter(eid, system.layout.partitions))
    last = int(str(stored.subject).rsplit(".", 1)[1])  # the last stored: any of them, by arrival
    assert last in FAILING
    assert (stored.headers or {})["Nats-Msg-Id"] == ids.failed_item_id(eid, first.loop_id, last)
    from_cursor = await system.client.failed_items(eid, "fan", after=seen[4].cursor, limit=2)
    assert [i.index for i in from_cursor.items] == [i.index for i in seen[5:7]] and from_cursor.total == 8
    assert (await system.client.failed_items(eid, "total")).total == 0
    with pytest.raises(InvalidCursor):
        await system.client.failed_items(eid, after="x:y")
    listed = await cli("items", eid, "fan", "--limit", "2", "--json", url=system.server.url)
    assert listed.code == 0, listed.err
    doc = json.loads(listed.out)
    assert doc["total"] == 8 and [i["index"] for i in doc["items"]] == [i.index for i in seen[:2]]
    assert doc["next_after"] == seen[1].cursor
    # a cursor that is not a page's: one line and exit 3 in the CLI, 400 in the UI
    for bad in ("²", "9" * 5000):
        refused = await cli("items", eid, "--after", bad, url=system.server.url)
        assert refused.code == EXIT_INVALID and refused.err.strip().count("\n") == 0, refused.err
        assert refused.err.startswith("actors-cli: ") and "Traceback" not in refused.err
    async with TestClient(TestServer(make_app(system.client, read_only=False, token=None))) as ui:
        answer = await ui.get(f"/api/executions/{eid}/items", params={"after": "²"})
        assert answer.status == 400 and "next_after" in (await answer.json())["error"]

    # a pod of older code (no `redrive` in its member entry) would run every item again:
    # the redrive is refused, naming it, until it is gone
    owners = await system.nc.jetstream().key_value(OWNERS_BUCKET)
    await owners.put("members.counter.old-pod", b'{"semantics": 2}')
    with pytest.raises(RetryRefused, match="these run older code: counter/old-pod"):
        await system.client.redrive(eid)
    await owners.delete("members.counter.old-pod")

    # the redrive: the 8 items only, the other 1,992 results kept
    await asyncio.to_thread(fixed.write_text, "")
    outcome = await system.client.redrive(eid)
    assert outcome.from_step == "fan" and outcome.redriven == {"fan": 8} and not outcome.existing
    status = await system.client.wait(outcome.execution_id, timeout=60)
    assert status.state == "COMPLETED", status
    runs = await system.client.iterations(outcome.execution_id)
    ran_again = sorted(o.iteration_index for r in runs for o in getattr(r, "outcomes", None) or [r])
    assert ran_again == FAILING
    items = await system.events(outcome.execution_id)
    values = of_type(items, "playbook.completed")[0].data["result"]["total"]["values"]
    assert values == [n * 2 for n in range(2000)]
    assert of_type(items, "iterator.started", "fan")[0].data["redriven"] == 8
    assert of_type(items, "execution.retry_of")[0].data["execution_id"] == eid

    # the same redrive again is the same execution; through the CLI too
    again = await system.client.redrive(eid)
    assert again.execution_id == outcome.execution_id and again.existing
    by_cli = await cli("retry", eid, "--failed-items", "--json", url=system.server.url)
    assert by_cli.code == 0, by_cli.err
    assert json.loads(by_cli.out)["execution_id"] == outcome.execution_id

    # an execution without failed items is refused, in one line
    with pytest.raises(RetryRefused, match="no failed loop items"):
        await system.client.redrive(outcome.execution_id)
    refused = await cli("retry", outcome.execution_id, "--failed-items", url=system.server.url)
    assert refused.code == EXIT_INVALID and refused.out == ""
    assert refused.err.strip().count("\n") == 0 and "no failed loop items" in refused.err

    # a loop step in a cycle: `run` shows each loop's own failures; its redrive is refused
    cycle = system.tmp / "cycle.yaml"
    cycle.write_text(CYCLE)
    ran = await cli("run", str(cycle), "--execution-id", "cycle-old", url=system.server.url)
    assert ran.code == 0, ran.err
    assert ran.out.count("fan: 1 of 3 items failed (tolerated)") == 2, ran.out
    assert re.findall(r"^  fan\[1\] .* element: (\d+)", ran.out, re.M) == ["1", "4"], ran.out
    with pytest.raises(RetryRefused, match=r"loop step 'fan' ran 2 times .* --from fan"):
        await system.client.redrive("cycle-old")


async def test_failed_items_past_the_servers_page_of_subjects_and_of_many_loops(nats_server: NatsServer) -> None:
    """A loop with more failed items than the server lists in one answer (100,000
    subjects) and an execution with more loops with failures than one batched get may
    name (1,000): every failed item is counted and read, by the listing, a redrive and
    the counter's replay. Records written straight to the stream: no loop runs them."""
    layout = make_layout()
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout)
        big, many = "capped", "many-loops"
        n = 100_050
        error = ErrorInfo(type="ValueError", message="bad")

        def record(eid: str, loop: str, step: str, index: int) -> bytes:
            return encode(FailedItem(execution_id=eid, loop_id=loop, step=step, index=index, attempts=1, error=error))

        for i in range(n):
            await nc.publish(LoopSubjects.of(big, "1-1", layout.partitions).failed(i), record(big, "1-1", "fan", i))
        loops = [f"{a}-1" for a in range(1, 1_002)]
        for a, loop in enumerate(loops):
            subjects = LoopSubjects.of(many, loop, layout.partitions)
            # the loop's spec subject names the loop (its content is not read here)
            await nc.publish(subjects.spec, b"{}")
            await nc.publish(subjects.failed(a), record(many, loop, "fan" if a % 2 else "other", a))
        await nc.flush()
        jsm = nc.jsm()
        await wait_for(lambda: _stored(jsm, n + 2 * len(loops)), timeout=60)

        # a redrive reads every index, and so does the counter's replay (past 100,000)
        keys = await client.failed_keys(big, ["1-1"])
        assert len(keys["1-1"]) == n and keys["1-1"][-1] == n - 1
        assert len(await LoopActor(Counter(nc, layout=layout), big, "1-1")._failures_recorded()) == n
        # the listing counts them all and pages to the last, from a cursor
        page = await client.failed_items(big, loop_id="1-1", limit=1000)
        assert page.total == n and [i.index for i in page.items] == list(range(1000))
        last = await jsm.get_last_msg(LOOP_STREAM, failed_items_filter(big, layout.partitions))
        tail = await client.failed_items(big, after=f"1-1:{(last.seq or 0) - 2}", loop_id="1-1")
        assert [i.index for i in tail.items] == [n - 2, n - 1] and tail.next_after is None and tail.total == n

        # 1,001 loops with failures: one step's, listed and paged across loops in loop order
        fan = await client.failed_items(many, "fan", limit=400)
        assert fan.total == 500 and [i.index for i in fan.items] == list(range(1, 800, 2))
        rest = await client.failed_items(many, "fan", after=fan.next_after, limit=400)
        assert [i.index for i in rest.items] == list(range(801, 1001, 2)) and rest.next_after is None
        assert (await client.failed_items(many)).total == len(loops)
        # a cursor that names no position is refused, in one line (not a crash)
        for bad in ("²", "9" * 5000, "1-1:²", "x:y", "1-1:-3"):
            with pytest.raises(InvalidCursor):
                await client.failed_items(many, after=bad)
        with pytest.raises(InvalidCursor, match="no loop 5000-1"):
            await client.failed_items(many, after="5000-1:3")
    finally:
        await nc.close()


async def _stored(jsm: object, count: int) -> bool:
    info = await jsm.stream_info(LOOP_STREAM)  # type: ignore[attr-defined]
    return bool(info.state.messages >= count)
