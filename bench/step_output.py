"""What keeping a step's output costs: the p50 latency of one-step python executions
whose step prints a line, as a ratio to the same step printing nothing, measured in
the same run on one embedded nats-server with every role in this process (the printing
step stores one `step.output` event before its answer).

    python bench/step_output.py [--runs 200]

The two playbooks alternate, so drift in the machine's load hits both alike. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.client import Client
from actors.runtime import connect, start_roles
from streams.layout import Layout
from streams.server import NatsServer

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: %s}
workflow:
  - step: work
    tool:
      kind: python
      code: |
        def main():
            %s
            return 1
"""


async def bench(runs: int) -> dict[str, float]:
    server = await NatsServer.start()
    nc = await connect(server.url, name="bench-step-output")
    layout = Layout()
    runtime = await start_roles(nc, layout=layout)
    client = Client(nc, layout=layout)
    times: dict[str, list[float]] = {"silent": [], "prints": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            entries = {}
            for name, body in (("silent", "pass"), ("prints", 'print("one line of output")')):
                f = Path(tmp) / f"{name}.yaml"
                f.write_text(PLAYBOOK % (name, body))
                entries[name] = await client.register(f)
            for i in range(runs + 10):  # the first 10 of each warm the pool and the caches
                for name, entry in entries.items():
                    t0 = time.perf_counter()
                    eid = await client.start(entry.path, version=entry.version)
                    await client.wait(eid, timeout=30)
                    if i >= 10:
                        times[name].append(time.perf_counter() - t0)
    finally:
        await runtime.stop()
        await nc.close()
        await server.stop()
    silent, prints = statistics.median(times["silent"]), statistics.median(times["prints"])
    return {
        "runs": runs,
        "silent_p50_ms": round(silent * 1000, 2),
        "prints_p50_ms": round(prints * 1000, 2),
        "prints_to_silent_p50": round(prints / silent, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200)
    args = p.parse_args()
    print(json.dumps(asyncio.run(bench(args.runs))))


if __name__ == "__main__":
    main()
