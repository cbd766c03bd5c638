"""The graph and timeline renderers (actors/ui/static/graph.js, timeline.js) in a real
browser: a playbook with parallel branches, a loop, a retried step and an on_failure
remediation is run on a real nats-server, its log turned into the graph and timeline
JSON by actors/ui/graph.py and timeline.py, and a test page drawing them is opened in
Debian's chromium through Playwright. The DOM is what is checked: every step with its
state, the remediation edge drawn apart, the loop's counts, the retry's delay bar, and
text from the log (an error with markup in it) shown as text, never run.

Skipped when chromium or the playwright package is missing; CI installs both."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from actors.playbook.loader import load_playbook
from actors.ui.graph import execution_graph, playbook_graph
from actors.ui.timeline import step_timeline
from actors.wire.messages import LoopProgress
from tests.conftest import System
from tests.support.browser import browser

__all__ = ["browser"]  # the fixture, used by name

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

STATIC = Path(__file__).resolve().parents[2] / "actors" / "ui" / "static"
SHOTS = os.environ.get("ACTORS_UI_SHOTS")  # a directory: keep the screenshots there

XSS = "<script>window.__xss = 1</script><img src=x onerror='window.__xss = 2'>"

PLAYBOOK = f"""
apiVersion: actors/v1
kind: Playbook
metadata:
  name: ui_graph_demo
  description: parallel branches, a loop, a retried step and its remediation
workload:
  n: 24
workflow:
  - step: prepare
    desc: "fan out into three branches <b onmouseover='window.__xss = 3'>now</b>"
    next:
      - when: "{{{{ '<i>' not in workload.n | string }}}}"
        then: [squares, flaky, notify]
  - step: squares
    tool:
      kind: python
      code: |
        def main(x):
            return x * x
    args: {{x: "{{{{ number }}}}"}}
    loop:
      collection: "{{{{ range(workload.n) | list }}}}"
      element: number
      concurrency: 4
    next: summary
  - step: summary
    args:
      total: "{{{{ squares | sum }}}}"
  - step: flaky
    tool:
      kind: python
      code: |
        def main():
            raise ValueError({XSS!r})
    retry: {{max_attempts: 2, backoff: fixed, initial_delay: 0.3}}
    on_failure: cleanup
  - step: cleanup
    tool: noop
  - step: notify
    tool: noop
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>graph and timeline</title>
<style>body { margin: 16px; background: #fff; } section { margin: 0 0 20px; width: 1100px; }</style>
</head><body>
<section id="graph"></section>
<section id="timeline"></section>
<script type="module">
import { renderGraph, updateGraph } from "/static/graph.js";
import { renderTimeline } from "/static/timeline.js";
const data = await (await fetch("/data.json")).json();
const graph = document.getElementById("graph");
renderGraph(graph, data.structure);
window.__firstNode = graph.querySelector(".node");
updateGraph(graph, data.graph);
renderTimeline(document.getElementById("timeline"), data.timeline);
window.__drawn = true;
</script>
</body></html>
"""


async def _run_demo(system: System) -> dict[str, Any]:
    eid, status = await system.run_yaml(PLAYBOOK, timeout=60)
    assert status.state == "COMPLETED", status
    items = await system.client.events(eid)
    playbook = load_playbook(PLAYBOOK)
    return {
        "structure": playbook_graph(playbook),
        "graph": execution_graph(playbook, items, {}),
        "timeline": step_timeline(items),
    }


@pytest_asyncio.fixture
async def page_server(system: System) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The test page, the renderers and the JSON of a real run, on a loopback port."""
    data = await _run_demo(system)

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def json_data(_: web.Request) -> web.Response:
        return web.json_response(data)

    async def no_content(_: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/data.json", json_data)
    app.router.add_get("/favicon.ico", no_content)
    app.router.add_static("/static", STATIC)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/", data
    finally:
        await runner.cleanup()


@pytest_asyncio.fixture
async def browser_page(browser: Any) -> AsyncIterator[Any]:
    """A tab of tests/support/browser.py's chromium (skipped without it, failed in CI)."""
    page = await browser.new_page(viewport={"width": 1140, "height": 900})
    try:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.errors = errors
        yield page
    finally:
        await page.close()


async def test_graph_and_timeline_of_a_real_run_in_chromium(
    page_server: tuple[str, dict[str, Any]], browser_page: Any, tmp_path: Path
) -> None:
    url, data = page_server
    page = browser_page
    await page.goto(url)
    await page.wait_for_function("window.__drawn === true")
    assert page.errors == []

    # every step is a node carrying its name and its state, as the log has it
    expected = {
        "prepare": "completed",
        "squares": "completed",
        "summary": "completed",
        "flaky": "failed",
        "cleanup": "completed",
        "notify": "completed",
        "end": "completed",
    }
    assert {n["id"]: n["state"] for n in data["graph"]["nodes"]} == expected
    drawn = await page.eval_on_selector_all(
        "#graph .node", "els => els.map(e => [e.dataset.step, e.dataset.state, e.getAttribute('class')])"
    )
    assert {step: state for step, state, _ in drawn} == expected
    assert all(f"state-{state}" in cls.split() for _, state, cls in drawn)
    labels = await page.eval_on_selector_all("#graph .node .node-label", "els => els.map(e => e.textContent)")
    assert sorted(labels) == sorted(expected)
    # updateGraph re-coloured the nodes drawn from the structure, in place
    assert await page.evaluate("window.__firstNode.isConnected && window.__firstNode.dataset.state === 'completed'")

    # the remediation edge is drawn apart: dashed, labelled, marked as the route taken
    edge = page.locator('#graph .edge[data-kind="on_failure"][data-from="flaky"][data-to="cleanup"]')
    assert await edge.count() == 1
    assert "taken" in (await edge.get_attribute("class") or "")
    dash = await edge.locator("path").evaluate("p => getComputedStyle(p).strokeDasharray")
    assert dash not in ("", "none")
    assert await edge.locator(".edge-label").text_content() == "on failure"
    plain = page.locator('#graph .edge[data-kind="next"][data-from="squares"][data-to="summary"] path')
    assert await plain.evaluate("p => getComputedStyle(p).strokeDasharray") == "none"

    # the loop is one node with its progress: done/total, rate, in flight, failed
    loop = page.locator('#graph .node[data-step="squares"]')
    assert await loop.get_attribute("data-kind") == "loop"
    text = await loop.locator(".loop-text").text_content()
    assert text is not None and text.startswith("24/24 · ") and "0 in flight · 0 failed" in text
    assert float(await loop.locator(".loop-fill").get_attribute("width") or 0) > 0

    # the timeline: a row per step, the retry's delay between the two failed attempts
    rows = await page.eval_on_selector_all("#timeline .tl-row", "els => els.map(e => e.dataset.step)")
    assert set(rows) == set(expected)
    flaky = page.locator('#timeline .tl-row[data-step="flaky"] .tl-bar')
    bars = await flaky.evaluate_all(
        "els => els.map(e => [e.dataset.kind, e.dataset.attempt, e.dataset.state, e.getBoundingClientRect().width])"
    )
    runs = [(a, s) for k, a, s, _ in bars if k == "run"]
    assert runs == [("1", "failed"), ("2", "failed")]
    delays = [(a, w) for k, a, s, w in bars if k == "delay"]
    assert len(delays) == 1 and delays[0][0] == "2" and delays[0][1] > 3
    assert await page.locator('#timeline .tl-row[data-step="squares"]').get_attribute("data-loop") == "true"

    # the error's markup is text: in the hover title, never run, never parsed
    title = await page.locator('#graph .node[data-step="flaky"] > title').text_content()
    assert title is not None and "<script>window.__xss = 1</script>" in title and "attempts: 2" in title
    assert await page.evaluate("window.__xss") is None
    assert await page.locator("#graph script, #timeline script, #graph img, #timeline img, #graph b").count() == 0
    prepare = await page.locator('#graph .node[data-step="prepare"] > title').text_content()
    assert prepare is not None and "<b onmouseover='window.__xss = 3'>now</b>" in prepare
    when = page.locator('#graph .edge[data-from="prepare"][data-to="squares"] .edge-label')
    assert await when.text_content() == "'<i>' not in workload.n | string"
    bar_title = await page.locator('#timeline .tl-row[data-step="flaky"] .tl-bar[data-kind="run"]').first.get_attribute(
        "title"
    )
    assert bar_title is not None and "<img src=x" in bar_title

    # a click on a node tells the page which step (to show its logs, say)
    await page.evaluate(
        "document.getElementById('graph').addEventListener('step-select', e => { window.__picked = e.detail.step; })"
    )
    await page.locator('#graph .node[data-step="summary"] .node-box').click()
    assert await page.evaluate("window.__picked") == "summary"

    shots = Path(SHOTS) if SHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    await page.locator("#graph").screenshot(path=str(shots / "graph.png"))
    await page.locator("#timeline").screenshot(path=str(shots / "timeline.png"))
    (shots / "data.json").write_text(json.dumps(data))


LIVE = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: ui_graph_live}
workflow:
  - step: wait
    tool: {kind: sleep, seconds: 0.1}
    loop: {collection: "{{ range(60) | list }}", element: n, concurrency: 5}
    next: after
  - step: after
    tool: noop
"""

BARE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>live</title></head><body>
<section id="graph" style="width: 900px"></section><section id="timeline" style="width: 900px"></section>
<script type="module">
import * as graph from "/static/graph.js";
import * as timeline from "/static/timeline.js";
window.graphjs = graph;
window.timelinejs = timeline;
window.__ready = true;
</script>
</body></html>
"""


@pytest_asyncio.fixture
async def bare_page(browser_page: Any) -> AsyncIterator[Any]:
    """A page with the renderers loaded and nothing drawn: the test draws."""

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=BARE, content_type="text/html")

    async def no_content(_: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/favicon.ico", no_content)
    app.router.add_static("/static", STATIC)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await browser_page.goto(f"http://127.0.0.1:{port}/")
        await browser_page.wait_for_function("window.__ready === true")
        yield browser_page
    finally:
        await runner.cleanup()


async def test_a_running_loop_shows_live_progress_then_turns_completed_in_place(system: System, bare_page: Any) -> None:
    page = bare_page
    playbook = load_playbook(LIVE)
    eid = "ui-graph-live-1"
    seen: asyncio.Queue[LoopProgress] = asyncio.Queue()

    async def watch() -> None:
        async for p in system.client.progress(eid):
            await seen.put(p)

    watcher = asyncio.create_task(watch())
    try:
        await system.start_yaml(LIVE, execution_id=eid)
        while True:  # the counter's progress, part way through the loop
            progress = await asyncio.wait_for(seen.get(), 30)
            if 0 < progress.done < 60:
                break
        items = await system.client.events(eid)
        graph = execution_graph(playbook, items, {progress.loop_id: progress})
        await page.evaluate(
            "([g, t]) => { graphjs.renderGraph(document.getElementById('graph'), g);"
            " timelinejs.renderTimeline(document.getElementById('timeline'), t);"
            " window.__loopNode = document.querySelector('.node[data-step=\"wait\"]'); }",
            [graph, step_timeline(items)],
        )
        node = page.locator('#graph .node[data-step="wait"]')
        assert await node.get_attribute("data-state") == "running"
        text = await node.locator(".loop-text").text_content()
        assert text is not None and text.startswith(f"{progress.done}/60 · ")
        assert f"{progress.in_flight} in flight · {progress.failed} failed" in text
        assert await page.locator('#graph .node[data-step="after"]').get_attribute("data-state") == "pending"
        bar = page.locator('#timeline .tl-row[data-step="wait"] .tl-bar[data-kind="run"]')
        assert await bar.get_attribute("data-state") == "running" and await bar.get_attribute("data-end") == ""

        status = await system.client.wait(eid, timeout=60)
        assert status.state == "COMPLETED"
        items = await system.client.events(eid)
        await page.evaluate(
            "([g]) => graphjs.updateGraph(document.getElementById('graph'), g)",
            [execution_graph(playbook, items, {progress.loop_id: progress})],
        )
        # the same node, re-coloured: the verdict in the log wins over the stale progress
        assert await page.evaluate("window.__loopNode.isConnected && window.__loopNode.dataset.state") == "completed"
        text = await node.locator(".loop-text").text_content()
        assert text is not None and text.startswith("60/60 · ") and "0 in flight · 0 failed" in text
        assert await page.locator('#graph .node[data-step="after"]').get_attribute("data-state") == "completed"
        assert page.errors == []
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
