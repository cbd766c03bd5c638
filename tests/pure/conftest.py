"""Pure tests need no server and start no process: a test here that reaches for one
fails at once, so `pytest -m pure` stays seconds long and runs anywhere."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from streams.server import NatsServer


@pytest.fixture(autouse=True)
def no_server_no_subprocess(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a pure test started a process or a nats-server: move it to tests/integration/")

    # asyncio's subprocesses go through subprocess.Popen too; NatsServer.start would, but
    # is refused by name so the message says which
    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    monkeypatch.setattr(NatsServer, "start", refused)
    yield
