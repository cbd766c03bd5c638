"""A real browser for the UI's tests: Debian's chromium driven by Playwright (its own
browser download is not used), and the UI served on a free loopback port.

Without /usr/bin/chromium the browser tests are skipped on a developer's machine and
fail in CI (CI=true): `.ci/run` installs chromium, so there they always run."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from actors.client import Client
from actors.ui.server import serve_ui

CHROMIUM = Path(os.environ.get("ACTORS_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def need_chromium() -> None:
    if CHROMIUM.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium for the browser tests")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Any]:
    """A headless chromium, closed after the test."""
    need_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


@dataclass
class Page:
    """A browser tab on a served UI, and what it showed that a test must not see."""

    page: Any
    base: str
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def open(self, path: str) -> None:
        await self.page.goto(self.base.rstrip("/") + path)


async def open_ui(browser: Any, client: Client, **options: Any) -> AsyncIterator[Page]:
    """Serve the UI on `client` (read_only, token, ...) and open a tab on it."""
    runner, url = await serve_ui(client, host="127.0.0.1", port=0, **options)
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(20_000)
    seen = Page(page, url)

    async def dialog(d: Any) -> None:
        seen.dialogs.append(d.message)
        await d.dismiss()

    page.on("dialog", dialog)
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    try:
        yield seen
    finally:
        await context.close()
        await runner.cleanup()
