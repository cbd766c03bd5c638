"""Retry from a failed step against a real nats-server: `Client.retry` and `actors-cli
retry` start one new execution linked to the old one (both logs say so) that keeps
the completed steps' results and runs again from the failed step or the one named."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from actors.client import RetryRefused, UnknownExecution
from tests.conftest import System, of_type
from tests.support.cli import cli

pytestmark = [pytest.mark.timeout(120)]

# `fetch` counts its runs in a file, so a test can tell it did not run again;
# `transform` fails while the payload says so
PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: retry-me, path: tests/retry-me}
workload: {fail: true, factor: 2}
workflow:
  - step: fetch
    tool:
      kind: python
      code: |
        def main(marker):
            with open(marker, "a") as f:
                f.write("x")
            return {"v": 21}
    args: {marker: "{{ workload.marker }}"}
    next: transform
  - step: transform
    tool:
      kind: python
      code: |
        def main(v, fail, factor):
            if fail:
                raise ValueError("upstream outage")
            return {"t": v * factor}
    args: {v: "{{ fetch.v }}", fail: "{{ workload.fail }}", factor: "{{ workload.factor }}"}
    next: store
  - step: store
    args: {t: "{{ transform.t }}"}
"""


async def failed_once(system: System) -> tuple[str, str]:
    marker = system.tmp / "fetch-runs"
    eid, status = await system.run_yaml(PLAYBOOK, payload={"marker": str(marker)})
    assert status.state == "FAILED"
    return eid, str(marker)


@pytest.mark.asyncio
async def test_client_retry_keeps_completed_results_and_links_both_logs(system: System) -> None:
    old, marker = await failed_once(system)
    outcome = await system.client.retry(old, payload={"fail": False})
    assert outcome.retry_of == old and outcome.from_step == "transform" and outcome.kept_steps == ("fetch",)
    assert not outcome.existing
    status = await system.client.wait(outcome.execution_id, timeout=30)
    assert status.state == "COMPLETED", status
    items = await system.events(outcome.execution_id)
    assert of_type(items, "playbook.completed")[0].data["result"] == {"store": {"t": 42}}
    assert next(i.step for i in of_type(items, "step.enter")) == "transform"
    assert await asyncio.to_thread(Path(marker).read_text) == "x"  # fetch ran once, in the old execution only
    new_link = of_type(items, "execution.retry_of")[0].data
    assert new_link == {"execution_id": old, "from_step": "transform", "kept_steps": ["fetch"]}
    start = of_type(items, "execution.start")[0].data
    assert start["payload"] == {"marker": marker, "fail": False}  # merged over the old payload
    await system.engine_idle()  # the link into the old log is folded there on its own time
    old_items = await system.events(old)
    assert [i.data for i in of_type(old_items, "execution.retried")] == [
        {"retry_execution_id": outcome.execution_id, "from_step": "transform"}
    ]
    old_status = await system.client.status(old)
    assert old_status is not None and old_status.state == "FAILED"

    # the same retry again is the same execution, never a second one
    again = await system.client.retry(old, payload={"fail": False})
    assert again.execution_id == outcome.execution_id and again.existing
    await system.engine_idle()
    assert len(of_type(await system.events(old), "execution.retried")) == 1

    # a different payload or step is another retry
    other = await system.client.retry(old, from_step="fetch", payload={"fail": False, "factor": 3})
    assert other.execution_id != outcome.execution_id and other.kept_steps == ()
    assert (await system.client.wait(other.execution_id, timeout=30)).state == "COMPLETED"
    assert await asyncio.to_thread(Path(marker).read_text) == "xx"  # --from fetch ran it again


@pytest.mark.asyncio
async def test_client_retry_refuses_what_it_cannot_retry(system: System) -> None:
    old, _ = await failed_once(system)
    with pytest.raises(RetryRefused, match="step 'store' never ran in execution"):
        await system.client.retry(old, from_step="store")
    with pytest.raises(RetryRefused, match="has no step 'nope'"):
        await system.client.retry(old, from_step="nope")
    with pytest.raises(UnknownExecution, match="no execution 'never-started'"):
        await system.client.retry("never-started")
    slow = await system.start_yaml(
        "apiVersion: actors/v1\nkind: Playbook\nmetadata: {name: slow}\n"
        "workflow:\n  - step: nap\n    tool: {kind: sleep, seconds: 30}\n"
    )
    await system.engine_idle()
    with pytest.raises(RetryRefused, match="is RUNNING: only a terminal execution"):
        await system.client.retry(slow)
    await system.client.cancel(slow)


@pytest.mark.asyncio
async def test_cli_retry_prints_the_new_id_and_answers_user_errors_in_one_line(system: System) -> None:
    old, _ = await failed_once(system)
    env = {"NATS_URL": system.server.url, "ACTORS_PARTITIONS": str(system.layout.partitions)}
    code, out, err, _ = await cli("retry", old, "--payload", '{"fail": false}', "--json", env=env)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["retry_of"] == old and obj["from_step"] == "transform" and obj["kept_steps"] == ["fetch"]
    assert obj["existing"] is False
    code, out, _, _ = await cli("status", obj["execution_id"], "--watch", "--json", "--timeout", "30", env=env)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["state"] == "COMPLETED"
    code, out, err, _ = await cli("retry", old, "--payload", '{"fail": false}', env=env)
    assert code == 0 and out.strip() == obj["execution_id"] and "started before" in err
    for args, says in (
        (["--from", "store"], "step 'store' never ran"),
        (["--from", "nope"], "playbook tests/retry-me has no step 'nope'"),
        (["--from", "end"], "cannot start from 'end'"),
    ):
        code, out, err, _ = await cli("retry", old, *args, env=env)
        assert code == 3 and out == "" and len(err.strip().splitlines()) == 1 and says in err, err
    code, _, err, _ = await cli("retry", "no-such-id", env=env)
    assert code == 3 and "no execution 'no-such-id'" in err
    code, _, err, _ = await cli("retry", obj["execution_id"], env=env)  # COMPLETED, no --from
    assert code == 3 and "no failed step to retry from" in err
