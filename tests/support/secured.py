"""A nats-server with the least-privilege account of deploy/nats/permissions.conf, and
each role on a connection of its own user (fixtures `secured` and `pods`), plus a check
that the server refuses a publish. Import the fixtures into a test module to use them."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from actors.natsio import private
from actors.natsio.connopts import ConnectOptions
from actors.pod import permissions
from actors.pod.roles import Runtime, connect, start_roles
from streams.layout import Layout
from streams.server import NatsServer


@dataclass
class Secured:
    server: NatsServer
    passwords: dict[str, str]
    layout: Layout

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.server.port}"

    def options(self, user: str) -> ConnectOptions:
        """A connection of `user` as its Deployment makes one: its own inbox prefix, the
        only inboxes the server lets it read (the password is in the URL)."""
        return ConnectOptions(inbox_prefix=permissions.inbox_prefix(user))

    def log(self) -> str:
        return (self.server.store / "nats-server.log").read_text(errors="replace")

    def violations(self) -> list[str]:
        return [line for line in self.log().splitlines() if "Violation" in line]


@pytest_asyncio.fixture
async def secured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Secured]:
    """A nats-server with deploy/nats/permissions.conf as committed, each password in
    the server's environment as the file expects. No user without credentials: the
    server is ready once its monitoring endpoint says so (a connection of a user of the
    file could not ask, its replies refused on the default `_INBOX`)."""
    # a letter first: nats-server reads a `$VAR` of digits only as a number and refuses the file
    passwords = {u: "p" + secrets.token_hex(8) for u in permissions.USERS}
    for u in permissions.users(permissions.deployed_layout()):
        monkeypatch.setenv(u.password_variable, passwords[u.name])
    server = await NatsServer.start(config=permissions.CONF_FILE.read_text())
    try:
        yield Secured(server, passwords, permissions.deployed_layout())
    finally:
        await server.discard()


class Pods:
    """Each role on a connection of its own user, as pods run; stopped last first."""

    def __init__(self) -> None:
        self.running: list[tuple[NATS, Runtime]] = []

    async def start(self, secured: Secured, role: str, layout: Layout | None = None) -> Runtime:
        nc = await connect(secured.url(role), name=f"actors-{role}", options=secured.options(role))
        runtime = await start_roles(nc, layout=layout or secured.layout, roles=[role], tool_concurrency=4)
        self.running.append((nc, runtime))
        return runtime

    async def stop(self) -> None:
        for nc, runtime in reversed(self.running):
            await runtime.stop(drain_timeout=0)
            await nc.close()


@pytest_asyncio.fixture
async def pods() -> AsyncIterator[Pods]:
    running = Pods()
    try:
        yield running
    finally:
        await running.stop()


async def refused(secured: Secured, user: str, subject: str, data: bytes) -> None:
    """A JetStream publish by `user` that the server must refuse: no PubAck comes (the
    server drops the message and tells the client so), and the server logs the
    violation naming the user and the subject."""
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    nc = await nats.connect(
        secured.url(user), inbox_prefix=permissions.inbox_prefix(user), error_cb=on_error, allow_reconnect=False
    )
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await nc.jetstream().publish(subject, data, timeout=1.0)
        await private.flush(nc)
    finally:
        await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors), errors
    assert any(f'user:{user}" - Publish Violation - Subject "{subject}"' in line for line in secured.violations())
