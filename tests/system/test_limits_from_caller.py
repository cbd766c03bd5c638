"""The limits a playbook is registered under are the caller's: a `Client` checks a
playbook's retries against the ceiling it was given (`limits`, from `Settings.limits`
where the settings are read), not against whatever the process's environment says
when `register` runs. `Client.connect` reads the environment once, as the CLI does."""

from __future__ import annotations

import pytest

from actors.client import Client
from actors.playbook.loader import PlaybookInvalid
from actors.wire.messages import Limits
from tests.conftest import System

RETRIES = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: retries}
workflow:
  - step: a
    tool: {kind: noop}
    retry: 3
"""

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_register_checks_retries_against_the_clients_limits_not_the_environment(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = system.tmp / "retries.yaml"
    path.write_text(RETRIES)
    monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", "2")  # read by no one after start-up
    entry = await system.client.register(path)  # built without limits: the defaults' ceiling, 1,000
    assert (entry.path, entry.version) == ("retries", 1)
    strict = Client(system.nc, layout=system.layout, limits=Limits(max_attempts=2))
    with pytest.raises(PlaybookInvalid) as refused:
        await strict.register(path)
    assert "ceiling 2" in str(refused.value.errors[0].message)


async def test_connect_takes_its_limits_from_the_environment_once_unless_given(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = system.tmp / "retries.yaml"
    path.write_text(RETRIES)
    monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", "2")
    async with Client.connect(system.server.url, layout=system.layout) as from_env:
        monkeypatch.delenv("ACTORS_MAX_ATTEMPTS_CEILING")  # too late: read when the client was made
        with pytest.raises(PlaybookInvalid):
            await from_env.register(path)
    monkeypatch.setenv("ACTORS_MAX_ATTEMPTS_CEILING", "2")
    async with Client.connect(system.server.url, layout=system.layout, limits=Limits()) as given:
        assert (await given.register(path)).version == 1
