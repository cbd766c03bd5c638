"""During a rolling upgrade a starter starts new executions under the semantics every
live engine pod runs (actors/runtime/ownership.py `semantics_in_use`): pods say theirs
in their member entry, an entry that says nothing is an older pod's (semantics 1), so
no older engine halts an execution on `SemanticsUnknown`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.client import Client
from actors.core.replay import SEMANTICS
from actors.engine.starter import Starter
from actors.pod.roles import connect, start_roles
from actors.runtime.ownership import MEMBER_RECORD, Leases, member_semantics, semantics_in_use
from streams.layout import OWNERS_BUCKET, Layout, ensure
from streams.server import NatsServer
from tests.conftest import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: gated}
workflow:
  - step: only
"""


async def test_the_lowest_semantics_of_live_engine_pods_is_the_one_in_use(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url, name="test")
    try:
        await ensure(nc.jetstream(), Layout(partitions=2))
        kv = await nc.jetstream().key_value(OWNERS_BUCKET)
        assert await semantics_in_use(nc, kv) == SEMANTICS  # no pod: this code's
        leases = Leases(nc, role="engine", partitions=2, ttl=10, on_gain=_nothing, on_lose=_nothing)
        await leases.start()
        try:
            mine = await kv.get(f"members.engine.{leases.pod}")
            assert mine.value == MEMBER_RECORD and member_semantics(mine.value) == SEMANTICS
            assert await semantics_in_use(nc, kv) == SEMANTICS
            await kv.put("members.engine.older", b"")  # what a pod before the entries said anything writes
            await kv.put("members.counter.older", b"")  # another role's: not the engines'
            assert await semantics_in_use(nc, kv) == 1
            await kv.delete("members.engine.older")  # it stopped
            assert await semantics_in_use(nc, kv) == SEMANTICS
            await kv.put("members.engine.odd", b"not json")  # unreadable: taken for the oldest
            assert await semantics_in_use(nc, kv) == 1
        finally:
            await leases.stop()
    finally:
        await nc.close()


async def _nothing(p: int) -> None:
    return None


async def test_a_starter_stamps_new_executions_with_the_semantics_every_engine_runs(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    layout = Layout(partitions=2, lease_ttl=2.0)  # entries age out, and the starter looks again, quickly
    nc = await connect(nats_server.url, name="test")
    rt = await start_roles(nc, layout=layout, roles=("engine",))
    older: asyncio.Task[None] | None = None
    try:
        client = Client(nc, layout=layout)
        pb = tmp_path / "gated.yaml"
        pb.write_text(PLAYBOOK)
        path = (await client.register(pb)).path
        (starter,) = rt.find(Starter)
        kv = await nc.jetstream().key_value(OWNERS_BUCKET)

        async def stamped() -> int:
            eid = await client.start(path)
            # on its own subject, or (semantics 6) held by the start answer
            record = await client.start_record(eid)
            assert record is not None
            return record.semantics

        async def until(semantics: int) -> None:
            async def there() -> bool:  # it looks again each lease period: no event to await
                return starter.semantics == semantics

            await wait_for(there, timeout=20)

        assert await stamped() == SEMANTICS

        async def an_older_pod() -> None:  # its lease loop: an empty member entry, renewed
            while True:
                await kv.put("members.engine.older", b"")
                await asyncio.sleep(0.3)

        older = asyncio.create_task(an_older_pod())
        await until(1)
        assert await stamped() == 1
        older.cancel()
        await kv.delete("members.engine.older")  # the older pod stopped: it deletes its entry
        await until(SEMANTICS)
        assert await stamped() == SEMANTICS
    finally:
        if older is not None:
            older.cancel()
        await rt.stop()
        await nc.close()
