"""Where one small execution's time goes: every message it stored, in store order, with
the time since the client sent the start (one host: one clock for client and server).

    python -m bench.profile.trace_execution [--tool python|sleep] [--steps 3] [--warm 10]

Set-up as ``bench/e2e_small.py``: a fresh nats-server, one pod (``actors-cli serve --role
all``) warmed with ``--warm`` executions, the client in this process. Then one execution
(``Client.start``, ``Client.wait``), and each stream's new messages are read back with
their store times. Messages already removed (a work queue's commands and start messages,
a status replaced) are counted but cannot be placed. Prints a table and, as its last
line, one JSON object: ``{"client_ms", "stored", "removed", "rows": [[ms, stream, subject,
bytes], ...]}``. The inside of one step (the engine's and the tool's own points) is
``bench/profile/step_trace.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.pod.roles import connect
from bench.common import chain_playbook
from streams.layout import Layout
from streams.server import NatsServer
from tests.support.pods import PodProcess


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    server = await NatsServer.start()
    pod: PodProcess | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
            pod = await PodProcess.start("all", url=server.url, layout=Layout(), logs=Path(tmp), name="pod")
            await pod.ready()
            nc = await connect(server.url, name="bench-trace")
            js = nc.jetstream()
            client = Client(nc, layout=Layout())
            pb = Path(tmp) / "trace.yaml"
            pb.write_text(chain_playbook(f"trace_{args.tool}", args.steps, args.tool))
            entry = await client.register(pb)

            async def one() -> str:
                eid = await client.start(entry.path, version=entry.version, payload={"i": 0})
                await client.wait(eid, timeout=30)
                return eid

            for _ in range(args.warm):
                await one()
            before = {s.config.name: s.state.last_seq for s in await js.streams_info()}
            t0 = time.time()
            eid = await one()
            t1 = time.time()
            await asyncio.sleep(0.3)  # what follows the status (the projector's ENDED entry) lands too
            rows: list[list[Any]] = []
            removed = 0
            for info in await js.streams_info():
                name = info.config.name
                for seq in range(before.get(name, 0) + 1, info.state.last_seq + 1):
                    try:
                        msg = await js.get_msg(name, seq)
                    except NotFoundError:
                        removed += 1
                        continue
                    at = msg.time.timestamp() if msg.time is not None else t0
                    rows.append(
                        [round((at - t0) * 1000, 3), name, msg.subject.replace(eid, "<id>"), len(msg.data or b"")]
                    )
            await nc.close()
    finally:
        if pod is not None:
            pod.proc.terminate()
            await pod.proc.wait()
        await server.stop()
    rows.sort()
    client_ms = round((t1 - t0) * 1000, 3)
    if not args.json_only:
        print(f"one warm {args.steps}-step {args.tool} execution: {client_ms} ms start to status seen")
        prev = 0.0
        for ms, stream, subject, size in rows:
            print(f"{ms:9.3f} +{ms - prev:6.3f}  {stream:10} {size:6}  {subject}")
            prev = ms
        print(f"{client_ms:9.3f} +{client_ms - prev:6.3f}  the client has the terminal status")
        print(f"({removed} more stored and removed since: commands, start messages, replaced statuses)")
    return {"client_ms": client_ms, "stored": len(rows) + removed, "removed": removed, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tool", choices=("python", "sleep"), default="python")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warm", type=int, default=10, help="executions run first (caches, the python pool)")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    print(json.dumps(uvloop.run(main_async(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
