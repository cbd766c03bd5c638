"""The UI's schedules and dead-letters pages, a playbook's graph and filled start form,
and a cancel that asks for a reason, in a real browser (tests/support/browser.py)
against a real nats-server and every actor: what an operator sees and does."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from streams.layout import START_SUBJECT
from tests.conftest import System, wait_for
from tests.support.browser import Page, browser, open_ui
from tests.support.ui import HEAD, LOOP, SLOW, register

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
__all__ = ["browser"]  # the fixture, used by name

SHOTS = os.environ.get("ACTORS_UI_SHOTS")  # a directory: the pages are saved there as PNGs to look at

GREET = (
    HEAD % ("greet", "ui/greet")
    + """workload: {who: world, times: 2}
workflow:
  - step: hello
    tool: noop
    args: {who: "{{ workload.who }}"}
    next: bye
  - step: bye
    tool: noop
"""
)


@pytest_asyncio.fixture
async def tab(browser: Any, system: System) -> AsyncIterator[Page]:
    async for page in open_ui(browser, system.client, read_only=False):
        yield page


async def shot(tab: Page, name: str) -> None:
    if SHOTS:
        await tab.page.screenshot(path=f"{SHOTS}/{name}.png", full_page=True)


async def test_schedules_and_dead_letters_pages(browser: Any, system: System, tab: Page) -> None:
    greet = await register(system, GREET)
    await system.client.schedule_add("nightly", playbook=greet, cron="0 3 * * *", payload={"who": "ops"})
    page = tab.page
    await tab.open("/")
    await page.click("nav >> text=Schedules")
    await expect(page).to_have_url(re.compile(r"/schedules$"))
    row = page.locator('tr[data-schedule="nightly"]')
    await expect(row).to_have_attribute("data-state", "ACTIVE")
    await expect(row).to_contain_text("0 0 3 * * *")
    await expect(row).to_contain_text("never fired")

    # pause, resume: the row says so
    await row.locator('button[data-action="pause"]').click()
    await expect(row).to_have_attribute("data-state", "PAUSED")
    await row.locator('button[data-action="resume"]').click()
    await expect(row).to_have_attribute("data-state", "ACTIVE")

    # run now (a double click: one execution), linked, and the schedule's last run
    await row.locator('button[data-action="run"]').dblclick()
    started = page.locator("#run-started a")
    await expect(started).to_have_text(re.compile(r"^nightly-\d{8}T\d{6}Z-n[0-9a-f]{8}$"))
    eid = await started.inner_text()
    assert (await system.client.wait(eid, timeout=20)).state == "COMPLETED"
    await expect(row).to_have_attribute("data-last-state", "COMPLETED", timeout=15_000)
    await expect(row).to_contain_text("run now")
    assert [e.execution_id for e in await system.client.list(playbook=greet)] == [eid]
    await shot(tab, "schedules")
    await started.click()
    await expect(page).to_have_url(re.compile(f"/executions/{eid}$"))
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "COMPLETED")

    # a message no actor can read, and one whose bytes are markup: letters, newest first
    await system.js_publish(START_SUBJECT, b"{not json", msg_id="dl-1")
    xss = b'<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
    await system.js_publish(START_SUBJECT, xss + b"x" * 600, msg_id="dl-2")
    await wait_for(lambda: _letters(system, 2), timeout=20)  # the starter gives up on them
    await page.click("nav >> text=Dead letters")
    await expect(page).to_have_url(re.compile(r"/deadletters$"))
    letters = page.locator("#letters tr[data-seq]")
    await expect(letters).to_have_count(2)
    await expect(letters.nth(0)).to_contain_text("not JSON")
    await expect(letters.nth(0).locator("td.head code")).to_contain_text("<script>window.__xss = 1</script>")
    await expect(letters.nth(0)).to_contain_text(f"first 500 of {len(xss) + 600} characters")
    await expect(letters.nth(1).locator("td.head code")).to_have_text("{not json")
    await expect(letters.nth(1)).to_have_attribute("data-source", "start")
    await expect(letters.nth(0).locator("td.when")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$"))
    assert await page.evaluate("document.querySelectorAll('main img, main script').length") == 0
    assert await page.evaluate("window.__xss") is None
    await shot(tab, "deadletters")
    assert tab.errors == [] and tab.dialogs == []

    # read-only: the schedules are shown, their actions are not
    async for ro in open_ui(browser, system.client, read_only=True):
        await ro.open("/schedules")
        await expect(ro.page.locator('tr[data-schedule="nightly"]')).to_have_attribute("data-last-state", "COMPLETED")
        assert await ro.page.locator("#schedules button").count() == 0


async def _letters(system: System, n: int) -> bool:
    return len((await system.client.dead_letter_page())[0]) == n


async def test_playbook_graph_filled_start_form_and_a_cancel_with_its_reason(system: System, tab: Page) -> None:
    greet = await register(system, GREET)
    page = tab.page
    await tab.open(f"/playbooks/{greet}")
    await expect(page.locator('#graph g.node[data-step="hello"]')).to_have_attribute("data-state", "pending")
    await expect(page.locator('#graph g.node[data-step="bye"]')).to_be_visible()
    assert json.loads(await page.locator("#payload").input_value()) == {"who": "world", "times": 2}
    await shot(tab, "playbook")
    # a loop step's node, with no run to count: none of an execution's loop figures
    await tab.open(f"/playbooks/{await register(system, LOOP)}")
    await expect(page.locator('#graph g.node[data-step="each"]')).to_have_attribute("data-state", "pending")
    assert await page.locator("#graph .loop-text, #graph .loop-track").count() == 0
    await tab.open(f"/playbooks/{greet}")
    await expect(page.locator('#graph g.node[data-step="hello"]')).to_be_visible()
    # the workload, edited, is what the execution starts with
    await page.fill("#payload", '{"who": "you", "times": 2}')
    await page.click("#start")
    await expect(page).to_have_url(re.compile(r"/executions/[0-9a-f]{32}$"))
    record = await system.client.start_record(page.url.rsplit("/", 1)[-1])
    assert record is not None and record.payload == {"who": "you", "times": 2}

    slow = await register(system, SLOW)
    eid = await system.client.start(slow, execution_id="nap-cancel")
    await tab.open(f"/executions/{eid}")
    await expect(page.locator('#graph g.node[data-step="nap"]')).to_have_attribute("data-state", "running")
    # cancel asks first: kept running when not confirmed
    await page.click("#cancel")
    await expect(page.locator("#cancel-ask")).to_be_visible()
    await page.click("#cancel-keep")
    await expect(page.locator("#cancel-ask")).to_be_hidden()
    await page.click("#cancel")
    await page.fill("#cancel-reason", "wrong input file")
    await shot(tab, "cancel-ask")
    await page.click("#cancel-confirm")
    await expect(page.locator("#exec-state .badge")).to_have_attribute("data-state", "CANCELLED")
    await expect(page.locator("#error-message")).to_have_text("wrong input file")
    await expect(page.locator("#error h2")).to_have_text("Cancelled")
    status = await system.client.wait(eid, timeout=10)
    assert status.error == {"type": "Cancelled", "message": "wrong input file"}
    await shot(tab, "cancelled")
    await tab.open("/")
    await expect(page.locator(f'tr[data-id="{eid}"] td.err')).to_have_text("Cancelled: wrong input file")
    assert tab.errors == [] and tab.dialogs == []
