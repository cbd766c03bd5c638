"""The step panel (actors/ui/static/steppanel.js) in a real browser against every actor:
clicking a graph node of a failed execution opens the step's story, its traceback as
preformatted text naming the playbook file and line; a loop node shows its counts and
hands its items' box to `window.renderLoopItems` when the page has one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.conftest import System
from tests.support.browser import Page, browser, open_ui

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
__all__ = ["browser"]  # the fixture, used by name

FLOW = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: panel_flow}
workflow:
  - step: each
    loop: {collection: "{{ [1, 2] }}", element: x}
    args: {x: "{{ x }}"}
    tool: {kind: python, code: "def main(x): return x * 2"}
    next: fetch
  - step: fetch
    tool:
      kind: python
      code: |
        def main():
            return {}["<b>missing</b>"]
"""

# the loop items' renderer another module provides, replaced by one that records its call
LOOP_ITEMS = """
window.renderLoopItems = (container, executionId, step) => {
  window.__loopItems = [executionId, step];
  container.textContent = `items of ${step}`;
};
"""


@pytest_asyncio.fixture
async def tab(browser: Any, system: System) -> AsyncIterator[Page]:
    async for page in open_ui(browser, system.client, read_only=True):
        yield page


async def test_clicking_a_node_shows_its_story_with_the_traceback_on_the_yaml_line(system: System, tab: Page) -> None:
    path = system.tmp / "flow.yaml"
    path.write_text(FLOW)
    entry = await system.client.register(path)
    eid = await system.client.start(entry.path, execution_id="panel-1")
    assert (await system.client.wait(eid, timeout=30)).state == "FAILED"
    page = tab.page
    await tab.open(f"/executions/{eid}")

    await page.click('#graph g.node[data-step="fetch"]')
    panel = page.locator("#step-panel")
    await expect(panel.locator(".sp-title")).to_have_text("fetch")
    traceback = panel.locator("pre.sp-traceback")
    await expect(traceback).to_contain_text('File "flow.yaml", line 15, in main')
    # preformatted text with real line breaks (not an escaped "\n"), markup shown as text
    text = await traceback.inner_text()
    assert "\\n" not in text and text.splitlines()[-1] == "KeyError: '<b>missing</b>'"
    await expect(panel.locator(".sp-error-line")).to_have_text("KeyError: '<b>missing</b>'  at flow.yaml:15")
    await expect(panel.locator('.sp-attempt[data-attempt="1"]')).to_contain_text("worker")

    # put after the page's own (another module's): this test checks only the call
    await page.evaluate(f"() => {{ {LOOP_ITEMS} }}")
    await page.click('#graph g.node[data-step="each"]')
    await expect(panel.locator(".sp-title")).to_have_text("each")
    await expect(panel.locator(".sp-loop")).to_have_text("loop COMPLETED: 2/2 done, 0 failed")
    await expect(panel.locator(".sp-loop-items")).to_have_text("items of each")
    assert await page.evaluate("window.__loopItems") == [eid, "each"]
    assert tab.errors == []
