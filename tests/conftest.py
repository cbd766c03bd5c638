"""Fixtures: a real nats-server per test (temporary store, free loopback port), and
the actors running against it in this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from actors.client import Client, LogItem
from actors.config.settings import Settings
from actors.pod.roles import Runtime, connect, start_roles
from actors.runtime import children
from streams.layout import Layout
from streams.server import NatsServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TESTS = Path(__file__).resolve().parent

# A test's kind is the directory it is in (README.md, "Tests by kind"): `pytest -m pure` runs in
# seconds with no server, `-m "not browser"` without chromium.
KINDS = ("pure", "integration", "system", "browser")


def kind_of(path: Path) -> str:
    """The kind of the tests in `path`, from the directory under tests/ holding it."""
    rel = path.resolve().relative_to(TESTS)
    if len(rel.parts) > 1 and rel.parts[0] in KINDS:
        return rel.parts[0]
    raise pytest.UsageError(f"{path}: a test belongs under tests/{{{','.join(KINDS)}}}/ (its kind), not {rel.parent}/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, kind_of(item.path)))


# The suite's steps run as the user running it, as they did before ACTORS_STEP_USER: they
# read and write the tests' own files, and CI runs as root with an interpreter `nobody`
# may not be able to read (a pyenv under /root). Pods in this process take it as a root
# pod's default, pods in subprocesses from the environment. tests/system/test_step_secrets.py
# runs a pod with the real default.
TEST_USER = f"{os.geteuid()}:{os.getegid()}"
children.DEFAULT_STEP_USER = TEST_USER
os.environ.setdefault(children.STEP_USER_SETTING, TEST_USER)


@pytest_asyncio.fixture
async def nats_server() -> AsyncIterator[NatsServer]:
    server = await NatsServer.start()
    try:
        yield server
    finally:
        await server.discard()  # its store goes with it: no orderly shutdown to wait for


@dataclass
class System:
    server: NatsServer
    nc: NATS
    client: Client
    runtime: Runtime
    layout: Layout
    tmp: Path

    async def start_yaml(
        self, yaml_text: str, *, payload: dict[str, Any] | None = None, execution_id: str | None = None
    ) -> str:
        """Register a playbook and start it; returns the execution id."""
        path = self.tmp / f"pb{abs(hash(yaml_text))}.yaml"
        path.write_text(yaml_text)
        entry = await self.client.register(path)
        return await self.client.start(entry.path, version=entry.version, payload=payload, execution_id=execution_id)

    async def run_yaml(
        self, yaml_text: str, *, payload: dict[str, Any] | None = None, timeout: float = 20
    ) -> tuple[str, Any]:
        """Register a playbook, start it, wait for its terminal status."""
        eid = await self.start_yaml(yaml_text, payload=payload)
        status = await self.client.wait(eid, timeout=timeout)
        return eid, status

    async def events(self, eid: str) -> list[LogItem]:
        return await self.client.events(eid)

    async def engine_idle(self, timeout: float = 10.0) -> None:
        """Every start message and every input delivered to the engine so far is
        processed and acked."""
        from streams.layout import START_STREAM, STARTER_CONSUMER, engine_consumer

        jsm = self.nc.jsm()
        consumers = [
            (START_STREAM, STARTER_CONSUMER),
            *((self.layout.exec_stream(p), engine_consumer(p)) for p in range(self.layout.partitions)),
        ]

        async def idle() -> bool:
            for stream, consumer in consumers:
                info = await jsm.consumer_info(stream, consumer)
                if info.num_pending or info.num_ack_pending:
                    return False
            return True

        await wait_for(idle, timeout=timeout)

    async def js_publish(self, subject: str, data: bytes, *, msg_id: str) -> None:
        await self.nc.jetstream().publish(subject, data, headers={"Nats-Msg-Id": msg_id})

    async def restart_roles(self, roles: tuple[str, ...] = ("engine",)) -> None:
        """Stop the named roles and start fresh instances on the same server: an
        engine or counter with its leases, which the fresh one (a new member) wins at
        once since the old one handed them back."""
        await self.stop_roles(roles)
        await self.start_roles(roles)

    async def start_roles(self, roles: tuple[str, ...]) -> None:
        """Start fresh instances of the named roles (stopped by `stop_roles`)."""
        fresh = await start_roles(self.nc, layout=self.layout, roles=roles)
        self.runtime.actors.extend(fresh.actors)

    async def stop_roles(self, roles: tuple[str, ...]) -> None:
        """Stop the named roles of this process (a pod of another release may then take
        their place: tests/support/pods.py)."""
        from actors.engine.actor import Engine
        from actors.engine.starter import Starter
        from actors.gateway.answers import Gateway
        from actors.loops.counter import Counter
        from actors.retention.actor import Retention
        from actors.runtime.ownership import Leases
        from actors.status.projector import Projector
        from actors.tools.actor import ToolActor

        kinds = {
            "engine": (Engine, Starter, Gateway),
            "counter": (Counter,),
            "tools": (ToolActor,),
            "projector": (Projector,),
            "retention": (Retention,),
        }

        def doomed(a: object) -> bool:
            if isinstance(a, Leases):
                return a.role in roles
            return isinstance(a, tuple(k for r in roles for k in kinds[r]))

        # last started first, as Runtime.stop does: leases are handed back before their host stops
        for a in [a for a in reversed(self.runtime.actors) if doomed(a)]:
            await a.stop()
            self.runtime.actors.remove(a)


def make_layout(**overrides: Any) -> Layout:
    # short ack_wait so a crashed actor's inputs come back quickly in tests
    settings: dict[str, Any] = {"partitions": 4, "ack_wait": 2.0, **overrides}
    return Layout(**settings)


@contextlib.asynccontextmanager
async def running_system(
    server: NatsServer, tmp_path: Path, *, layout: Layout | None = None, settings: Settings | None = None
) -> AsyncIterator[System]:
    """Every role in this process on `server` (`settings`: credentials, a payload key...)."""
    layout = layout if layout is not None else make_layout()
    nc = await connect(server.url, name="test")
    runtime = await start_roles(nc, layout=layout, settings=settings)
    try:
        yield System(server, nc, Client(nc, layout=layout), runtime, layout, tmp_path)
    finally:
        # the test is over: steps still running are not waited for (5 s each, by default);
        # draining is what tests/system/test_health.py tests
        await runtime.stop(drain_timeout=0.2)
        await nc.close()


@pytest_asyncio.fixture
async def system(nats_server: NatsServer, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[System]:
    """`@pytest.mark.layout(duplicate_window=0.1)` changes the layout for one test."""
    marker = request.node.get_closest_marker("layout")
    async with running_system(nats_server, tmp_path, layout=make_layout(**(marker.kwargs if marker else {}))) as s:
        yield s


async def wait_for(predicate: Any, *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll an async predicate; for conditions with no event to await (rare)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(interval)


def of_type(items: list[LogItem], type_: str, step: str | None = None) -> list[LogItem]:
    return [i for i in items if i.type == type_ and (step is None or i.step == step)]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster for the test process (tests/support/postgres.py):
    database `actors_test`, owned by role `actors_app`, whose password is `Database.password`. Skipped
    only when the server's programs are missing, and not in CI (.ci/run installs them)."""
    from tests.support import postgres as pg

    why = pg.available()
    if why is not None:
        if os.environ.get("CI"):  # .ci/run installs it: there, a missing server fails, never skips
            pytest.fail(f"no PostgreSQL server here: {why}")
        pytest.skip(f"no PostgreSQL server here: {why}")
    server, database = pg.start_database("pg-S3cret-" + os.urandom(6).hex())
    try:
        yield database
    finally:
        asyncio.run(server.stop())
