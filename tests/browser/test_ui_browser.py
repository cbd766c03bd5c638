"""The web UI in a real browser (tests/support/browser.py: Debian's chromium via Playwright),
against a real nats-server and every actor: what a person sees and does."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.conftest import System
from tests.support.browser import Page, browser, open_ui
from tests.support.ui import BREAKS, LOOP, PRINTS, QUICK, SLOW, register

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
__all__ = ["browser"]  # the fixture, used by name

XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2; alert(1)">'


@pytest_asyncio.fixture
async def tab(browser: Any, system: System) -> AsyncIterator[Page]:
    async for page in open_ui(browser, system.client, read_only=False):
        yield page


async def test_start_a_loop_from_the_playbooks_page_and_see_it_complete_live(system: System, tab: Page) -> None:
    await register(system, LOOP)
    await register(system, QUICK)
    page = tab.page
    await tab.open("/")
    await expect(page.locator("#executions")).to_be_visible()

    # the list is live: an execution started elsewhere appears, and finishes, with no reload
    eid = await system.client.start("ui/quick", execution_id="from-cli")
    await expect(page.locator('tr[data-id="from-cli"]')).to_have_attribute("data-state", "COMPLETED")

    await page.click("text=Playbooks")
    await expect(page).to_have_url(re.compile(r"/playbooks$"))
    await page.click('tr[data-playbook="ui/loop"] a')
    await expect(page.locator("#playbook-name")).to_have_text("ui/loop")
    await expect(page.locator("#yaml")).to_contain_text("loop:")
    await page.fill("#payload", '{"n": 2000}')
    await page.click("#start")
    await expect(page).to_have_url(re.compile(r"/executions/[0-9a-f]{32}$"))
    eid = page.url.rsplit("/", 1)[-1]

    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "COMPLETED")
    node = page.locator('#graph g.node[data-step="each"]')
    await expect(node).to_have_attribute("data-state", "completed")
    await expect(page.locator('#loops tr[data-loop="each"]')).to_have_attribute("data-done", "2000")
    await expect(page.locator('#timeline .tl-row[data-step="each"]')).to_be_visible()
    await expect(page.locator('#events tr[data-type="iterator.started"]')).to_have_count(1)

    await page.go_back()  # to the playbook
    await page.click("text=Executions")
    await expect(page.locator(f'tr[data-id="{eid}"]')).to_have_attribute("data-state", "COMPLETED")
    await page.click(f'tr[data-id="{eid}"] a')
    await expect(page).to_have_url(re.compile(f"/executions/{eid}$"))
    assert tab.errors == []


async def test_cancel_a_running_execution(system: System, tab: Page) -> None:
    slow = await register(system, SLOW)
    eid = await system.client.start(slow, execution_id="nap-long")
    page = tab.page
    await tab.open(f"/executions/{eid}")
    await expect(page.locator('#graph g.node[data-step="nap"]')).to_have_attribute("data-state", "running")
    await expect(page.locator("#retry")).to_be_hidden()
    await page.click("#cancel")
    await page.click("#cancel-confirm")  # it asks first (no reason given: the default one)
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "CANCELLED")
    await expect(page.locator("#error-message")).to_have_text("cancelled from the web UI")
    await expect(page.locator("#cancel")).to_be_hidden()
    await expect(page.locator("#retry")).to_be_visible()
    assert (await system.client.wait(eid, timeout=10)).state == "CANCELLED"


async def test_retry_a_failed_execution_from_its_page_and_follow_the_links(system: System, tab: Page) -> None:
    breaks = await register(system, BREAKS)
    old = await system.client.start(breaks, payload={"msg": "first try"}, execution_id="breaks-1")
    await system.client.wait(old, timeout=20)
    page = tab.page
    await tab.open("/")
    await expect(page.locator(f'tr[data-id="{old}"] td.err')).to_have_text("ValueError: first try (step 'boom')")
    await page.click(f'tr[data-id="{old}"] a')
    await expect(page.locator("#facts")).to_contain_text("ui/breaks")
    await page.click("#retry")
    # the retry's page, linked back to the execution it retries
    await expect(page.locator("#links")).to_contain_text(f"retry of {old}")
    new = page.url.rsplit("/", 1)[-1]
    assert new != old
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "FAILED")
    await page.click(f'#links a[href="/executions/{old}"]')
    await expect(page.locator(f'#links [data-retry="{new}"]')).to_contain_text(f"retried by {new}")

    # what a step printed, under its step and attempt
    prints = await register(system, PRINTS)
    eid = await system.client.start(prints, payload={"who": "world"})
    await system.client.wait(eid, timeout=20)
    await tab.open(f"/executions/{eid}")
    await expect(page.locator('#logs pre[data-log-step="talk"]')).to_have_text("hello world\n")
    await expect(page.locator("#logs")).to_contain_text("talk · attempt 1")
    assert tab.errors == []


async def test_payloads_and_errors_are_text_never_html(system: System, tab: Page) -> None:
    breaks = await register(system, BREAKS)
    eid = await system.client.start(breaks, payload={"msg": XSS}, execution_id="xss-1")
    await system.client.wait(eid, timeout=20)
    page = tab.page
    for path in ("/", f"/executions/{eid}"):
        await tab.open(path)
        await expect(page.locator("[data-state=FAILED]").first).to_be_visible()
        await page.wait_for_load_state("networkidle")
        assert await page.evaluate("document.querySelectorAll('main img, main script, main iframe').length") == 0
        assert await page.evaluate("window.__xss") is None
    await expect(page.locator("#error-message")).to_have_text(XSS)
    await expect(page.locator("#events")).to_contain_text("<script>")
    assert tab.dialogs == [] and tab.errors == []


async def test_read_only_hides_every_action(browser: Any, system: System) -> None:
    slow = await register(system, SLOW)
    eid = await system.client.start(slow, execution_id="nap-ro")
    async for tab in open_ui(browser, system.client, read_only=True):
        page = tab.page
        await tab.open(f"/executions/{eid}")
        await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "RUNNING")
        await expect(page.locator("#mode")).to_have_text("read-only")
        assert await page.locator("#cancel, #retry").count() == 0
        await tab.open("/playbooks/ui/slow")
        await expect(page.locator("#yaml")).to_contain_text("sleep")
        assert await page.locator("#start, #payload").count() == 0
    await system.client.cancel(eid)


async def test_an_unknown_execution_says_not_found_and_waits_for_it_only_when_asked(system: System, tab: Page) -> None:
    quick = await register(system, QUICK)
    page = tab.page
    await tab.open("/executions/later-1")  # a typo, or an id not started yet: not a PENDING execution
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "NOT FOUND")
    await expect(page.locator("#flash")).to_contain_text("no execution 'later-1'")
    # nothing to show of what does not exist: no empty graph, timeline, logs or events
    for heading in ("Graph", "Timeline", "Step logs", "Events"):
        await expect(page.get_by_role("heading", name=heading)).to_be_hidden()
    await page.click("#wait")  # asked to wait: the page follows the id until it starts
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "PENDING")
    await system.client.start(quick, execution_id="later-1")
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "COMPLETED")
    await expect(page.locator('#graph g.node[data-step="one"]')).to_have_attribute("data-state", "completed")
    await expect(page.locator("#exec-sections")).to_be_visible()
    await expect(page.locator('#events tr[data-type="playbook.completed"]')).to_have_count(1)
