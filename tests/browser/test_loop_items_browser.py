"""A loop's failed items in a real browser (tests/support/browser.py) against a real
nats-server and every actor: actors/ui/static/loopitems.js (what the step panel shows
for a loop node) lists the count and a page of the failed items, pages on, and its
redrive button asks first, then starts a new execution, linked, that runs only them.
The panel is another module's: the test calls `window.renderLoopItems` on a container
of the execution page directly."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.conftest import System
from tests.support.browser import Page, browser, open_ui

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
__all__ = ["browser"]  # the fixture, used by name

# 25 of 60 items fail until the file `fixed` exists; the message has markup, shown as text
PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: ui-items, path: ui/items}
workflow:
  - step: fan
    tool:
      kind: python
      code: |
        import os
        def main(n, fixed):
            if n % 2 == 1 and n < 50 and not os.path.exists(fixed):
                raise KeyError(f"<b>missing</b> {n}")
            return n
    args: {n: "{{ n }}", fixed: "{{ workload.fixed }}"}
    loop: {collection: "{{ range(60) | list }}", element: n, mode: chunked, chunk_size: 10, tolerated_failures: "50%"}
"""


@pytest_asyncio.fixture
async def tab(browser: Any, system: System) -> AsyncIterator[Page]:
    async for page in open_ui(browser, system.client, read_only=False):
        yield page


async def test_failed_items_are_shown_paged_and_redriven(system: System, tab: Page) -> None:
    fixed = system.tmp / "fixed"
    eid, status = await system.run_yaml(PLAYBOOK, payload={"fixed": str(fixed)}, timeout=60)
    assert status.state == "COMPLETED"
    page = tab.page
    await tab.open(f"/executions/{eid}")
    await page.wait_for_function("typeof window.renderLoopItems === 'function'")
    await page.evaluate(
        """([eid]) => {
            const box = document.createElement("div");
            box.id = "items-box";
            document.getElementById("main").append(box);
            return window.renderLoopItems(box, eid, "fan");
        }""",
        [eid],
    )
    box = page.locator("#items-box")
    await expect(box.locator(".li-count")).to_contain_text("25 failed items")
    rows = box.locator("tr[data-index]")
    await expect(rows).to_have_count(20)
    await expect(rows.first).to_contain_text("KeyError")
    await expect(rows.first).to_contain_text("<b>missing</b> ")  # as text, not markup
    assert await box.locator("b").count() == 0
    first = [await r.get_attribute("data-index") for r in await rows.all()]
    await box.locator(".li-next").click()
    await expect(rows).to_have_count(5)
    # items are listed in the order they failed (actors/client/items.py): the two pages hold each once
    second = [await r.get_attribute("data-index") for r in await rows.all()]
    assert sorted(int(i or -1) for i in first + second) == list(range(1, 50, 2))
    await expect(box.locator(".li-next")).to_be_hidden()

    # the redrive asks first; Keep sends nothing
    await asyncio.to_thread(fixed.write_text, "")
    await box.locator(".li-redrive").click()
    await expect(box.locator(".li-ask")).to_contain_text("Run the 25 failed items of fan again")
    await box.locator(".li-keep").click()
    await expect(box.locator(".li-ask")).to_be_hidden()
    await box.locator(".li-redrive").click()
    await box.locator(".li-confirm").click()
    link = box.locator(".li-said a")
    await expect(link).to_have_text(re.compile(r"^r[0-9a-f]{24}$"))
    new = await link.inner_text()
    assert (await system.client.wait(new, timeout=30)).state == "COMPLETED"
    runs = await system.client.iterations(new)
    assert sorted(o.iteration_index for r in runs for o in getattr(r, "outcomes", None) or [r]) == list(range(1, 50, 2))
    await link.click()
    await expect(page).to_have_url(re.compile(f"/executions/{new}$"))
    assert not tab.errors
