"""The README's pictures of the web UI: docs/ui/executions.png, execution.png and
playbooks.png, taken by Debian's chromium (Playwright) from a private nats-server with
every actor in this process and a few real executions (completed, failed, cancelled,
running, a loop, a remediated failure).

    python -m bench.tools.ui_screenshots [--out docs/ui]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository


PLAYBOOKS = {
    "etl.yaml": """apiVersion: actors/v1
kind: Playbook
metadata: {name: nightly-etl, path: data/nightly-etl, description: "extract, transform each file, load"}
workload: {files: 400}
workflow:
  - step: extract
    tool: {kind: python, code: "def main(n):\\n    print(f'listing {n} files')\\n    return list(range(n))"}
    args: {n: "{{ workload.files }}"}
    next: [transform, audit]
  - step: transform
    tool: noop
    args: {file: "{{ f }}"}
    loop: {collection: "{{ extract }}", element: f, concurrency: 20}
    next: load
  - step: audit
    tool: {kind: sleep, seconds: 0.3}
  - step: load
    tool: {kind: python, code: "def main(rows):\\n    return {'loaded': len(rows)}"}
    args: {rows: "{{ transform }}"}
""",
    "report.yaml": """apiVersion: actors/v1
kind: Playbook
metadata: {name: report, path: ops/report}
workload: {region: eu}
workflow:
  - step: fetch
    tool: {kind: python, code: "def main(region):\\n    raise ConnectionError(f'upstream {region} refused: 503')"}
    args: {region: "{{ workload.region }}"}
    retry:
      - then: {max_attempts: 2, initial_delay: 0.1}
    on_failure: notify
  - step: notify
    tool: {kind: python, code: "def main(text):\n    raise RuntimeError('pager unreachable while reporting: ' + text)"}
    args: {text: "{{ failure.error.message }}"}
""",
    "backup.yaml": """apiVersion: actors/v1
kind: Playbook
metadata: {name: backup, path: ops/backup}
workflow:
  - step: snapshot
    tool: {kind: sleep, seconds: 600}
""",
}


async def main(out: Path) -> list[Path]:
    from actors.client import Client
    from actors.pod.roles import connect, start_roles
    from actors.ui.server import serve_ui
    from streams.layout import Layout
    from streams.server import NatsServer
    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    server = await NatsServer.start()
    nc = await connect(server.url, name="screenshots")
    layout = Layout()
    rt = await start_roles(nc, layout=layout)
    client = Client(nc, layout=layout)
    runner, url = await serve_ui(client, host="127.0.0.1", port=0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in PLAYBOOKS.items():
                (Path(tmp) / name).write_text(text)
                await client.register(Path(tmp) / name)
        done = []
        for i in range(6):
            done.append(await client.start("data/nightly-etl", payload={"files": 100 + 50 * i}))
        failed = await client.start("ops/report", payload={"region": "us-east"})
        for eid in [*done, failed]:
            await client.wait(eid, timeout=60)
        cancelled = await client.start("ops/backup")
        if await client.exists(cancelled):
            await client.cancel(cancelled, "maintenance window")
        await client.wait(cancelled, timeout=30)
        await client.start("ops/backup")  # running
        etl = await client.start("data/nightly-etl", payload={"files": 3000})

        from playwright.async_api import async_playwright

        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = await browser.new_page(viewport={"width": 1280, "height": 760})
            await page.goto(url)
            await page.wait_for_selector("#executions tr:nth-child(9)")
            await client.wait(etl, timeout=60)
            await page.wait_for_selector(f'tr[data-id="{etl}"][data-state="COMPLETED"]')
            await page.screenshot(path=str(out / "executions.png"))
            await page.goto(f"{url}executions/{etl}")
            await page.wait_for_selector('#graph g.node[data-step="load"][data-state="completed"]')
            await page.wait_for_selector("#events tr")
            await page.set_viewport_size({"width": 1280, "height": 1000})
            await page.screenshot(path=str(out / "execution.png"))
            await page.goto(f"{url}executions/{failed}")
            await page.wait_for_selector("#envelope", state="attached")
            await page.screenshot(path=str(out / "execution-failed.png"))
            await page.set_viewport_size({"width": 1280, "height": 620})
            await page.goto(f"{url}playbooks/data/nightly-etl")
            await page.wait_for_selector("#yaml")
            await page.screenshot(path=str(out / "playbooks.png"))
            await browser.close()
    finally:
        await runner.cleanup()
        await rt.stop(drain_timeout=0)
        await nc.close()
        await server.stop()
    return [out / name for name in ("executions.png", "execution.png", "execution-failed.png", "playbooks.png")]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "ui")
    where = ap.parse_args().out
    where.mkdir(parents=True, exist_ok=True)
    for f in asyncio.run(main(where)):
        print(f"{f}: {f.stat().st_size:,} bytes")
