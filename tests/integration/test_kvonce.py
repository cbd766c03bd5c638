"""KV writes a client sends again after a lost reply (actors/natsio/kvonce.py): the second
copy finds its own bytes and says the write was done, where a plain `create` or
`update(last=)` would call it a conflict; another writer's value is still a conflict."""

from __future__ import annotations

import nats
import pytest

from actors.natsio.kvonce import create_once, delete_once, update_once
from streams.server import NatsServer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_a_create_sent_again_is_its_own_and_another_writers_is_not(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="once", history=1)
        first = await create_once(kv, "s1", b'{"created": 1}')
        assert first is not None
        # the reply to the first was lost: the same bytes again are that write, done
        assert await create_once(kv, "s1", b'{"created": 1}') == first
        # another client's schedule of the same name: a conflict, and nothing written
        assert await create_once(kv, "s1", b'{"created": 2}') is None
        assert (await kv.get("s1")).value == b'{"created": 1}'

        second = await update_once(kv, "s1", b'{"paused": true}', last=first)
        assert second is not None and second > first
        assert await update_once(kv, "s1", b'{"paused": true}', last=first) == second  # sent again
        # read at `first`, changed by someone else since: a conflict
        assert await update_once(kv, "s1", b'{"paused": false}', last=first) is None
        await kv.delete("s1")
        assert await update_once(kv, "s1", b'{"paused": true}', last=second) is None  # deleted meanwhile
        # a deleted key is created again (nats-py's create takes over a delete marker)
        assert await create_once(kv, "s1", b'{"created": 3}') is not None
    finally:
        await nc.close()


async def test_a_delete_sent_again_is_done_and_never_removes_what_another_writer_put_since(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="gone", history=1)
        mine = await kv.create("h1", b"mine")
        assert await delete_once(kv, "h1", last=mine) is True
        assert await delete_once(kv, "h1", last=mine) is True  # sent again after a lost reply: gone, done
        theirs = await kv.create("h1", b"theirs")  # another client adds it anew meanwhile
        assert await delete_once(kv, "h1", last=mine) is False  # an old delete sent again removes nothing
        assert (await kv.get("h1")).value == b"theirs"
        assert await delete_once(kv, "h1", last=theirs) is True
    finally:
        await nc.close()
