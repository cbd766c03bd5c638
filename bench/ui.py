"""The web UI with 10,000 executions in the status bucket and a 100,000-iteration loop:
how long the pages' data takes and how many bytes they send, against the client calls
they stand on, measured in the same run.

    python -m bench.ui [--executions 10000] [--iterations 100000] [--repeat 15]

One nats-server (temporary store); every actor in a pod process of its own (`actors-cli
serve --role all`), the UI in this one, as `actors-cli ui` runs it. The executions are
written as the projector writes them (bench/list.py `grow`); the loop is a real
execution of a `noop` step over `range(iterations)`. The UI is served on a free
loopback port and asked over HTTP (aiohttp), medians over `--repeat` runs, in ms:

* `list_ms`, `list_bytes`: `GET /api/executions?limit=50`, the list page's data;
  baseline `client_list_ms`: `Client.list(limit=50)` (what `actors-cli list` calls),
  and `kv_get_ms`, one status read, the smallest round trip;
* `list_next_ms`: the second page (`before=` the first page's cursor);
* `detail_ms`, `detail_bytes`: `GET /api/executions/<loop>` once the loop completed;
  `detail_running_ms` while it ran (at least one sample); baselines `events_ms`
  (`Client.events`, the execution's own log, which the page reads) and `iterations_ms`
  (`Client.iterations`, the loop's 100,000 results in stream LOOP, which the page
  never reads: what a page drawing one node per iteration would have to read);
* `shell_bytes`: the page itself (index.html, app.js, style.css, graph.js, timeline.js);
* with /usr/bin/chromium, in the page (`performance.now()` from the navigation's start):
  `browser_list_ms` to the list's 50 rows in the DOM, `browser_list_first_paint_ms` its
  first contentful paint, `browser_detail_ms` to the loop's node drawn in the graph.

Ratios: `list_ms / client_list_ms`, `detail_ms / events_ms`, `iterations_ms / detail_ms`.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository


LOOP = """apiVersion: actors/v1
kind: Playbook
metadata: {name: wide, path: bench/wide}
workflow:
  - step: each
    tool: noop
    args: {x: "{{ n }}"}
    loop: {collection: "{{ range(workload.n) | list }}", element: n, concurrency: 256}
  - step: summary
    args: {count: "{{ each | length }}"}
"""


async def median_ms(call: Callable[[], Awaitable[Any]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 2)


async def main(executions: int, iterations: int, repeat: int) -> dict[str, Any]:
    import aiohttp

    from actors.client import Client
    from actors.pod.roles import connect
    from actors.ui.server import serve_ui
    from bench.list import grow
    from streams.layout import Layout
    from streams.server import NatsServer

    out: dict[str, Any] = {"executions": executions, "iterations": iterations, "repeat": repeat}
    server = await NatsServer.start()
    nc = await connect(server.url, name="bench-ui")
    layout = Layout()
    pod = await start_pod(server.url)
    client = Client(nc, layout=layout)
    runner, url = await serve_ui(client, host="127.0.0.1", port=0)
    try:
        await grow(nc, 0, executions, time.time() - executions)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "wide.yaml"
            path.write_text(LOOP)
            entry = await client.register(path)
        async with aiohttp.ClientSession() as http:

            async def get(path: str) -> bytes:
                async with http.get(url.rstrip("/") + path) as r:
                    assert r.status == 200, (path, r.status)
                    return await r.read()

            page = json.loads(await get("/api/executions?limit=50"))
            assert len(page["executions"]) == 50
            out["list_ms"] = await median_ms(lambda: get("/api/executions?limit=50"), repeat)
            out["list_bytes"] = len(await get("/api/executions?limit=50"))
            out["list_next_ms"] = await median_ms(
                lambda: get(f"/api/executions?limit=50&before={page['next']}"), repeat
            )
            out["client_list_ms"] = await median_ms(lambda: client.list(limit=50), repeat)
            some = page["executions"][0]["execution_id"]
            out["kv_get_ms"] = await median_ms(lambda: client.status(some), repeat)
            shell = ("/", "/static/app.js", "/static/style.css", "/static/graph.js", "/static/timeline.js")
            out["shell_bytes"] = sum([len(await get(p)) for p in shell])

            t0 = time.perf_counter()
            eid = await client.start(entry.path, payload={"n": iterations}, execution_id="wide-loop")
            running: list[float] = []
            while (st := await client.status(eid)) is None or st.state in ("PENDING", "RUNNING"):
                if st is not None:
                    t = time.perf_counter()
                    await get(f"/api/executions/{eid}")
                    running.append((time.perf_counter() - t) * 1000)
                await asyncio.sleep(0.5)
            out["loop_s"] = round(time.perf_counter() - t0, 1)
            out["loop_state"] = str(st.state)
            out["detail_running_ms"] = round(statistics.median(running), 2) if running else None
            out["detail_ms"] = await median_ms(lambda: get(f"/api/executions/{eid}"), repeat)
            detail = await get(f"/api/executions/{eid}")
            out["detail_bytes"] = len(detail)
            node = next(n for n in json.loads(detail)["graph"]["nodes"] if n["id"] == "each")
            out["detail_loop_node"] = node["loop"]
            out["events_ms"] = await median_ms(lambda: client.events(eid), repeat)
            out["iterations_ms"] = await median_ms(lambda: client.iterations(eid), max(1, repeat // 5))
            out.update(await browser_times(url, eid))
    finally:
        await runner.cleanup()
        pod.terminate()
        await pod.wait()
        await nc.close()
        await server.stop()
    out["list_over_client_list"] = round(out["list_ms"] / out["client_list_ms"], 2)
    out["detail_over_events"] = round(out["detail_ms"] / out["events_ms"], 2)
    out["iterations_over_detail"] = round(out["iterations_ms"] / out["detail_ms"], 1)
    return out


async def start_pod(url: str) -> asyncio.subprocess.Process:
    """Every actor in a process of its own, serving once it says so."""
    pod = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "actors.cli",
        "-v",
        "serve",
        "--role",
        "all",
        "--nats",
        url,
        "--http-port",
        "0",
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert pod.stderr is not None
    while b"serving roles" not in (line := await pod.stderr.readline()):
        assert line, "the pod ended before serving"
    asyncio.get_running_loop().create_task(_drain(pod.stderr))
    return pod


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def browser_times(url: str, eid: str) -> dict[str, Any]:
    """A fresh tab's time to the list's rows and to the loop's node, when chromium is here."""
    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        return {}
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = await (await browser.new_context(bypass_csp=True)).new_page()  # the probes below are evaluated
            await page.goto(url)  # once, so that the times below are a warm browser's
            await page.wait_for_selector("#executions tr:nth-child(50)")
            await page.goto(url)
            rows = await page.wait_for_function(ROWS_AT)
            list_ms = await rows.json_value()
            fcp = await page.evaluate(FCP)
            await page.goto(f"{url}executions/{eid}")
            node = await page.wait_for_function(NODE_AT)
            detail_ms = await node.json_value()
        finally:
            await browser.close()
    return {
        "browser_list_ms": round(list_ms, 1),
        "browser_list_first_paint_ms": round(fcp, 1),
        "browser_detail_ms": round(detail_ms, 1),
    }


# in the page: ms from the navigation's start (performance.now) to the data in the DOM
ROWS_AT = "document.querySelectorAll('#executions tr').length >= 50 ? performance.now() : 0"
NODE_AT = "document.querySelector('#graph g.node[data-step=each][data-state=completed]') ? performance.now() : 0"
FCP = "performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? 0"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executions", type=int, default=10_000)
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.executions, a.iterations, a.repeat))))
