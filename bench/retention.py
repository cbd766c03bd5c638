"""How fast one retention pod archives and removes finished executions, against how fast
the same pod runs them: can retention keep up with the load (issue #34)?

    python -m bench.retention [--executions 2000] [--archive off,objects,dir] [--json-only]

For each archive place: a fresh nats-server, every actor in this process with
`finished_retention` 1 s (the retention actor among them), and `--executions` runs of
a 2-step playbook (sleep 0 s steps) with a 3-item loop, 100 in flight. Measured: the
executions' rate (started to finished, the baseline), and the retention's rate: from
the first retirement to the ENDED stream empty, executions retired per second. The
ratio is retention rate over execution rate: above 1, one retention pod keeps up with
everything the rest of the pod runs. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from actors.client import Client
from actors.pod.roles import connect, start_roles
from actors.retention.actor import Retention
from streams.layout import ENDED_STREAM, EXEC_STREAM, Layout
from streams.server import NatsServer

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: ret, path: bench/ret}
workflow:
  - step: a
    tool: {kind: sleep, seconds: 0}
    next: each
  - step: each
    loop: {collection: [1, 2, 3], element: i}
    tool: {kind: noop}
    args: {i: "{{ i }}"}
    next: b
  - step: b
    tool: {kind: sleep, seconds: 0}
"""


async def one(place: str, n: int) -> dict[str, Any]:
    server = await NatsServer.start()
    work = Path(tempfile.mkdtemp(prefix="retention-bench-"))
    os.environ["ACTORS_ARCHIVE"] = {"off": "off", "objects": "objects", "dir": str(work / "archive")}[place]
    layout = Layout(finished_retention=1.0)
    nc = await connect(server.url, name="retention-bench")
    runtime = await start_roles(nc, layout=layout)
    (retention,) = runtime.find(Retention)
    client = Client(nc, layout=layout, timeout=60)
    try:
        (work / "pb.yaml").write_text(PLAYBOOK)
        path = (await client.register(work / "pb.yaml")).path
        began = time.monotonic()
        pending: set[asyncio.Task[Any]] = set()
        for _ in range(n):
            pending.add(asyncio.create_task(client.wait(await client.start(path), timeout=600)))
            if len(pending) >= 100:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*pending)
        ran = time.monotonic() - began
        first = retired_at = None
        while True:
            left = (await nc.jsm().stream_info(ENDED_STREAM)).state.messages
            if first is None and retention.retired:  # type: ignore[attr-defined]
                first = time.monotonic()
            if left == 0 and retention.retired >= n:  # type: ignore[attr-defined]
                retired_at = time.monotonic()
                break
            await asyncio.sleep(0.05)  # sampling a count: there is no event for "all retired"
        exec_left = (await nc.jsm().stream_info(EXEC_STREAM)).state.messages
    finally:
        await runtime.stop(drain_timeout=0)
        await nc.close()
        await server.stop()
    assert first is not None
    retire_rate = n / max(retired_at - first, 1e-6)
    run_rate = n / ran
    print(
        f"{place:8} ran {run_rate:7.1f}/s   retired {retire_rate:7.1f}/s   ratio {retire_rate / run_rate:5.2f}",
        flush=True,
    )
    return {"archive": place, "run_per_s": round(run_rate, 1), "retired_per_s": round(retire_rate, 1),
            "ratio": round(retire_rate / run_rate, 2), "exec_messages_left": exec_left}  # fmt: skip


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    results = [await one(place, args.executions) for place in args.archive.split(",")]
    return {"bench": "retention", "executions": args.executions, "results": results, "load": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executions", type=int, default=2000)
    p.add_argument("--archive", default="off,objects,dir")
    p.add_argument("--json-only", action="store_true")
    args = p.parse_args()
    print(json.dumps(uvloop.run(bench(args))))


if __name__ == "__main__":
    main()
