"""Engine pods of an older semantics beside this one, as a starter sees them during a
rolling upgrade (actors/runtime/ownership.py `semantics_in_use`): for tests of what an
execution started under semantics 1 looks like. (A real older pod's member entry would
also take its share of the partitions, which no pod of a test would then consume;
tests/integration/test_semantics_gate.py checks the entries themselves.)"""

from __future__ import annotations

import pytest

from actors.engine import starter
from actors.engine.starter import Starter
from actors.pod.roles import Runtime
from tests.conftest import wait_for


async def older_engines_live(monkeypatch: pytest.MonkeyPatch, runtime: Runtime, semantics: int = 1) -> None:
    """From now on `runtime`'s starter finds engine pods of `semantics` live: returns
    once it starts new executions under it (its next refresh, within a lease period)."""

    async def lowest(nc: object, kv: object, role: str = "engine") -> int:
        return semantics

    monkeypatch.setattr(starter, "semantics_in_use", lowest)
    (found,) = runtime.find(Starter)

    async def refreshed() -> bool:  # it looks again each lease period: no event to await
        return found.semantics == semantics

    await wait_for(refreshed, timeout=20)
