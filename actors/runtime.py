"""Start and stop actor roles against a NATS server: what `serve`, `dev`, `run`, the
tests and the benches share."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Protocol

import nats
from nats.aio.client import Client as NATS

from actors.engine.actor import Engine
from actors.engine.starter import Starter
from actors.projector import Projector
from actors.tools.actor import ToolActor
from streams.layout import Layout, ensure

log = logging.getLogger("actors")
ROLES = ("engine", "tools", "projector")


class Actor(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def connect(url: str, *, name: str = "actors") -> NATS:
    async def on_error(e: Exception) -> None:
        log.warning("nats: %s", e)

    return await nats.connect(
        url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=on_error
    )


class Runtime:
    """A set of running actors on one connection."""

    def __init__(self, nc: NATS, actors: list[Actor]) -> None:
        self.nc = nc
        self.actors = actors

    def find(self, kind: type) -> list[Actor]:
        return [a for a in self.actors if isinstance(a, kind)]

    async def stop(self) -> None:
        for a in reversed(self.actors):
            try:
                await a.stop()
            except Exception:
                log.exception("stopping %s", type(a).__name__)


async def start_roles(
    nc: NATS,
    *,
    layout: Layout,
    roles: Iterable[str] = ROLES,
    tool_concurrency: int = 64,
    partitions: Iterable[int] | None = None,
) -> Runtime:
    roles = list(roles)
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role(s) {sorted(unknown)}; roles are {', '.join(ROLES)}")
    await ensure(nc.jetstream(), layout)
    actors: list[Actor] = []
    if "projector" in roles:
        actors.append(Projector(nc))
    if "tools" in roles:
        actors.append(ToolActor(nc, layout=layout, concurrency=tool_concurrency))
    if "engine" in roles:
        actors.append(Engine(nc, layout=layout, partitions=partitions))
        actors.append(Starter(nc, layout=layout))
    for a in actors:
        await a.start()
    return Runtime(nc, actors)


@asynccontextmanager
async def running(url: str, *, layout: Layout | None = None, roles: Iterable[str] = ROLES) -> AsyncIterator[Runtime]:
    nc = await connect(url)
    rt = await start_roles(nc, layout=layout or Layout.from_env(), roles=roles)
    try:
        yield rt
    finally:
        await rt.stop()
        await nc.close()


async def wait_forever() -> None:
    await asyncio.Event().wait()
