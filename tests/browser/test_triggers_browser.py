"""The UI's triggers page in a real browser (tests/support/browser.py) against a real
nats-server and every actor: a trigger's row, the execution its message started, pause,
resume and delete."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from nats.js import api
from playwright.async_api import expect

from actors.wire.triggers import stream_execution_id
from tests.conftest import System, wait_for
from tests.support.browser import Page, browser, open_ui
from tests.support.ui import QUICK, register

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
__all__ = ["browser"]  # the fixture, used by name


@pytest_asyncio.fixture
async def tab(browser: Any, system: System) -> AsyncIterator[Page]:
    async for page in open_ui(browser, system.client, read_only=False):
        yield page


async def test_triggers_page_lists_pauses_resumes_and_deletes(browser: Any, system: System, tab: Page) -> None:
    quick = await register(system, QUICK)
    js = system.nc.jetstream()
    await js.add_stream(api.StreamConfig(name="ORDERS", subjects=["orders.>"]))
    spec = await system.client.trigger_add("orders", subject="orders.*", stream="ORDERS", playbook=quick)
    seq = (await js.publish("orders.created", b'{"id": 1}')).seq
    eid = stream_execution_id("orders", seq, spec.add_id)
    assert (await system.client.wait(eid, timeout=20)).state == "COMPLETED"

    async def counted() -> bool:
        return (await system.client.triggers())[0].stats.started == 1

    await wait_for(counted, timeout=10)
    page = tab.page
    await tab.open("/")
    await page.click("nav >> text=Triggers")
    await expect(page).to_have_url(re.compile(r"/triggers$"))
    row = page.locator('tr[data-trigger="orders"]')
    await expect(row).to_have_attribute("data-state", "ACTIVE")
    await expect(row).to_contain_text("orders.*")
    await expect(row).to_contain_text("stream ORDERS")
    await expect(row.locator("td.started")).to_have_text("1")
    await expect(row.locator(f'a[href="/executions/{eid}"]')).to_have_text(eid)

    await row.locator('button[data-action="pause"]').click()
    await expect(row).to_have_attribute("data-state", "PAUSED")
    assert (await system.client.triggers())[0].spec.paused is True
    await row.locator('button[data-action="resume"]').click()
    await expect(row).to_have_attribute("data-state", "ACTIVE")

    # delete asks once more, in place
    delete = row.locator('button[data-action="delete"]')
    await delete.click()
    await expect(delete).to_have_text("Delete for good?")
    await delete.click()
    await expect(page.locator("#triggers")).to_contain_text("no triggers")
    assert await system.client.triggers() == []
