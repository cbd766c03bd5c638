"""The step panel (actors/ui/static/steppanel.js) in a real browser against every actor:
clicking a graph node of a failed execution opens the step's story, its traceback as
preformatted text naming the playbook file and line; a loop node shows its counts and
hands its items' box to `window.renderLoopItems` when the page has one. A wait step's
node says what it waits for (signal, key, since, deadline), then the signal it took
(from whom, when) and its data as the result, all as text; a loop of waits its counts."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.conftest import System, wait_for
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


WAITS = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: panel_waits}
workflow:
  - step: gate
    timeout: 300
    tool: {kind: wait, signal: go, key: "<i>k</i>"}
    next: each
  - step: each
    timeout: 300
    loop: {collection: "{{ ['a', 'b'] }}", element: x}
    tool: {kind: wait, signal: item, key: "{{ x }}"}
"""


async def test_a_wait_step_says_what_it_waits_for_then_what_it_took(system: System, tab: Page) -> None:
    c = system.client
    path = system.tmp / "waits.yaml"
    path.write_text(WAITS)
    eid = await c.start((await c.register(path)).path, execution_id="panel-waits")

    async def waiting_at(step: str) -> bool:
        st = await c.status(eid)
        return st is not None and any(w.step == step for w in st.waiting or [])

    await wait_for(lambda: waiting_at("gate"), timeout=20)
    page, panel = tab.page, tab.page.locator("#step-panel")
    await tab.open(f"/executions/{eid}")
    await page.click('#graph g.node[data-step="gate"]')
    line = panel.locator(".sp-wait-line")
    await expect(line).to_contain_text("waiting for signal go (key <i>k</i>) since 20")
    await expect(line).to_contain_text("Z, times out 20")
    await expect(panel.locator(".sp-result")).to_have_count(0)

    await c.signal(eid, "go", {"ok": "<b>yes</b>"}, key="<i>k</i>", by="<alice>")
    await wait_for(lambda: waiting_at("each"), timeout=20)
    await page.click('#graph g.node[data-step="each"]')
    await expect(panel.locator(".sp-title")).to_have_text("each")
    await expect(line).to_contain_text("waiting for signal item (a key per iteration) since ")
    await expect(panel.locator(".sp-loop")).to_have_text("loop RUNNING: 0/2 done, 0 failed")

    await page.click('#graph g.node[data-step="gate"]')
    await expect(panel.locator(".sp-title")).to_have_text("gate")
    await expect(line).to_contain_text("took signal go (key <i>k</i>) from <alice> at 20")
    await expect(panel.locator(".sp-result")).to_contain_text('"ok": "<b>yes</b>"')
    assert await panel.locator("b, i").count() == 0  # values as text, never markup
    await expect(panel.locator(".sp-wait dl")).to_contain_text("<alice>")
    if shots := os.environ.get("ACTORS_TEST_SCREENSHOTS"):
        await page.screenshot(path=f"{shots}/step-panel-wait.png")

    for item in ("a", "b"):
        await c.signal(eid, "item", item, key=item)
    assert (await c.wait(eid, timeout=20)).state == "COMPLETED"
    await page.click('#graph g.node[data-step="each"]')
    await expect(panel.locator(".sp-loop")).to_have_text("loop COMPLETED: 2/2 done, 0 failed")
    await expect(line).to_contain_text(
        "no longer waiting for signal item (a key per iteration): the step ended COMPLETED"
    )
    assert tab.errors == []
