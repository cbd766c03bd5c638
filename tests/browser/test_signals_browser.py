"""An approval step in a real browser (actors/ui/static/waits.js, actors/ui/signals.py):
the execution page says what a waiting execution waits for; Approve completes it, Reject
with a comment fails it `Rejected` naming the comment; a read-only UI shows the wait and
no buttons. The answer goes through the public client, as `actors-cli approve` does."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from playwright.async_api import expect

from tests.conftest import System
from tests.support.browser import browser, open_ui

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]
__all__ = ["browser"]  # the fixture, used by name

FLOW = """\
apiVersion: actors/v1
kind: Playbook
metadata: {name: browser_approval}
workflow:
  - step: sign_off
    timeout: 300
    tool: {kind: wait, signal: sign-off, approval: true}
"""


async def test_approve_and_reject_from_the_execution_page(system: System, browser: Any) -> None:
    c = system.client
    path = system.tmp / "approval.yaml"
    path.write_text(FLOW)
    entry = await c.register(path)
    yes, no = await asyncio.gather(*(c.start(entry.path, execution_id=f"ui-appr-{n}") for n in ("yes", "no")))

    async for tab in open_ui(browser, c, read_only=False, token="s3cret"):
        page = tab.page
        await tab.open("/")
        await page.evaluate("() => localStorage.setItem('actors-ui-token', 's3cret')")
        # the list says which executions wait, and for what
        await tab.open("/")
        tag = page.locator(f'tr[data-id="{yes}"] .waiting-tag')
        await expect(tag).to_have_text("waiting")
        await expect(tag).to_have_attribute("title", "waiting for approval sign-off (step sign_off)")
        if shots := os.environ.get("ACTORS_TEST_SCREENSHOTS"):
            await page.screenshot(path=f"{shots}/list-waiting.png")

        await tab.open(f"/executions/{yes}")
        wait = page.locator('#waits .wait[data-step="sign_off"]')
        await expect(wait.locator(".wait-what")).to_contain_text("approval sign-off since ")
        await expect(wait.locator(".wait-what")).to_contain_text(", times out ")
        if shots:
            await page.screenshot(path=f"{shots}/execution-waiting.png")
        # a rejection needs a comment: nothing is sent without one
        await wait.locator("button.reject").click()
        await expect(page.locator("#flash")).to_have_text("a rejection needs a comment: say why")
        await wait.locator("button.approve").click()
        await expect(page.locator("#exec-state .badge")).to_have_text("COMPLETED")
        await expect(page.locator("#waits")).to_be_hidden()
        story = await c.step_story(yes, "sign_off")
        assert story.result == {"approved": True, "comment": "", "by": "ui"}

        await tab.open(f"/executions/{no}")
        wait = page.locator('#waits .wait[data-step="sign_off"]')
        await wait.locator("input.approval-comment").fill("not <b>this</b> week")
        await wait.locator("button.reject").click()
        await expect(page.locator("#exec-state .badge")).to_have_text("FAILED")
        await expect(page.locator("#error-message")).to_contain_text("not <b>this</b> week")
        status = await c.status(no)
        assert status is not None and status.error is not None and status.error["type"] == "Rejected"
        assert tab.errors == []

    # read-only: the wait is shown, nothing to click
    waiting = await c.start(entry.path, execution_id="ui-appr-ro")
    async for tab in open_ui(browser, c, read_only=True):
        await tab.open(f"/executions/{waiting}")
        wait = tab.page.locator('#waits .wait[data-step="sign_off"]')
        await expect(wait.locator(".wait-what")).to_contain_text("approval sign-off since ")
        await expect(wait.locator("button")).to_have_count(0)
    await c.cancel(waiting)
