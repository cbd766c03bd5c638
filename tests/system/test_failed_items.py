"""Failed loop items against a real nats-server: a 2,000-item loop that tolerated 8
failures lists exactly those (paged, by `Client.failed_items` and `actors-cli items`),
`run` says so, and a redrive (`Client.redrive`, `actors-cli retry --failed-items`) runs
only those 8 again in one new linked execution that keeps the other 1,992 results."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.client import RetryRefused
from actors.client.items import InvalidCursor
from streams import ids
from streams.layout import LOOP_STREAM
from streams.subjects import failed_items_filter
from tests.conftest import System, of_type
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


async def test_failed_items_are_listed_by_page_and_redriven_alone(system: System) -> None:
    fixed = system.tmp / "fixed"
    flow = system.tmp / "redrive.yaml"
    flow.write_text(PLAYBOOK)
    eid = "redrive-old"
    payload = json.dumps({"fixed": str(fixed)})
    ran = await cli("run", str(flow), "--payload", payload, "--execution-id", eid, url=system.server.url)
    assert ran.code == 0, ran.err
    # `run` names the loop's tolerated failures and the first few
    assert "fan: 8 of 2,000 items failed (tolerated)" in ran.out, ran.out
    assert "fan[7]  1 attempt  ValueError: item 7 is bad  element: 7" in ran.out, ran.out
    assert f"actors-cli retry {eid} --failed-items" in ran.out
    old = of_type(await system.events(eid), "playbook.completed")[0].data["result"]["total"]["values"]
    assert [i for i, v in enumerate(old) if v is None] == FAILING

    # paged: exactly the failed items, in index order, each once, with the total
    seen, after, pages = [], None, 0
    while True:
        page = await system.client.failed_items(eid, after=after, limit=3)
        assert page.total == 8
        seen += page.items
        pages += 1
        after = page.next_after
        if after is None:
            break
    assert pages == 3 and [i.index for i in seen] == FAILING
    first = seen[0]
    assert (first.step, first.element, first.attempts, first.error_type) == ("fan", 7, 1, "ValueError")
    assert first.message == "item 7 is bad" and "ValueError" in (first.traceback or "")
    # each record under the id its builder gives (a re-send is one record)
    stored = await system.nc.jsm().get_last_msg(LOOP_STREAM, failed_items_filter(eid, system.layout.partitions))
    last = int(str(stored.subject).rsplit(".", 1)[1])  # the last stored: any of them, by arrival
    assert last in FAILING
    assert (stored.headers or {})["Nats-Msg-Id"] == ids.failed_item_id(eid, first.loop_id, last)
    by_index = await system.client.failed_items(eid, "fan", after=507, limit=2)  # an index: one loop
    assert [i.index for i in by_index.items] == [757, 1007] and by_index.total == 8
    assert (await system.client.failed_items(eid, "total")).total == 0
    with pytest.raises(InvalidCursor):
        await system.client.failed_items(eid, after="x:y")
    listed = await cli("items", eid, "fan", "--limit", "2", "--json", url=system.server.url)
    assert listed.code == 0, listed.err
    doc = json.loads(listed.out)
    assert doc["total"] == 8 and [i["index"] for i in doc["items"]] == [7, 257] and doc["next_after"]

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
