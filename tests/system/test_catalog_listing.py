"""Listing the catalog never answers "empty" for a catalog that has entries.

nats-py's `KeyValue.keys()` could (actors/natsio/kvkeys.py says why): the web UI's
Start button then answered 404 for a playbook its page had just shown."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import System

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_every_listing_of_the_catalog_shows_what_is_registered(system: System) -> None:
    entry = await system.client.register("examples/hello.yaml")
    # many listings at once and in a row, each a fresh read of the bucket: nats-py's
    # `keys()` got about one in 200 of these wrong here, so 1,200 nearly always catch it
    for _ in range(60):
        listings = await asyncio.gather(*(system.client.playbooks() for _ in range(20)))
        for listing in listings:
            assert [(e.path, e.version) for e in listing] == [(entry.path, entry.version)]


async def test_a_deleted_schedule_is_not_listed(system: System) -> None:
    await system.client.register("examples/hello.yaml")
    for name in ("kept", "gone"):
        await system.client.schedule_add(name, playbook="examples/hello", cron="0 0 * * *")
    await system.client.schedule_delete("gone")
    assert [v.spec.name for v in await system.client.schedules()] == ["kept"]
