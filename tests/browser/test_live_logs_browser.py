"""The execution page's step logs show what a step prints while it still runs: the step
waits for a file the test creates only once the page has shown its first line."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import expect

from tests.conftest import System
from tests.support.browser import browser, open_ui
from tests.support.ui import register

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
__all__ = ["browser"]  # the fixture, used by name

WAITS = """apiVersion: actors/v1
kind: Playbook
metadata: {name: ui_live_logs}
workflow:
  - step: talk
    tool:
      kind: python
      code: |
        import os, time
        def main(gate):
            print("before the gate")
            while not os.path.exists(gate):
                time.sleep(0.02)
            print("after the gate")
            return 1
    args: {gate: "%s"}
"""


async def test_the_logs_view_shows_a_line_while_the_step_still_runs(browser: Any, system: System) -> None:
    gate = system.tmp / "gate"
    path = await register(system, WAITS % gate)
    eid = await system.client.start(path, execution_id="ui-live-logs")
    async for tab in open_ui(browser, system.client, read_only=True):
        page = tab.page
        await tab.open(f"/executions/{eid}")
        log = page.locator('#logs pre[data-log-step="talk"]')
        await expect(log).to_have_text("before the gate\n")
        await expect(log).to_have_attribute("data-log-running", "1")
        await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "RUNNING")
        gate.touch()
        await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "COMPLETED")
        await expect(log).to_have_text("before the gate\nafter the gate\n")
        await expect(log).to_have_attribute("data-log-running", "0")
        assert tab.errors == []
