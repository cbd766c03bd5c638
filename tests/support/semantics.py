"""Engine pods of an older semantics beside this one, as a starter sees them during a
rolling upgrade (actors/runtime/ownership.py `semantics_in_use`): for tests of what an
execution started under semantics 1 looks like. (A real older pod's member entry would
also take its share of the partitions, which no pod of a test would then consume;
tests/integration/test_semantics_gate.py checks the entries themselves.)"""

from __future__ import annotations

import asyncio

import pytest

from actors.engine import starter
from actors.engine.starter import Starter
from actors.pod.roles import Runtime


async def older_engines_live(monkeypatch: pytest.MonkeyPatch, runtime: Runtime, semantics: int = 1) -> None:
    """From now on `runtime`'s starter finds engine pods of `semantics` live: returns
    once it starts new executions under it (its next refresh, within a lease period)."""

    async def lowest(kv: object, role: str = "engine") -> int:
        return semantics

    monkeypatch.setattr(starter, "semantics_in_use", lowest)
    (found,) = runtime.find(Starter)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while found.semantics != semantics:  # its refresh comes with the lease period: no event to await
        assert loop.time() < deadline, "the starter never refreshed the semantics it starts under"
        await asyncio.sleep(0.05)
