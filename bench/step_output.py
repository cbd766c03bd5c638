"""What keeping a step's output costs: the p50 latency of one-step python executions
whose step prints a line, as a ratio to the same step printing nothing, measured in
the same run on one embedded nats-server with every role in this process (the printing
step stores one `step.output` event before its answer).

    python -m bench.step_output [--runs 200] [--loop 1000] [--loop-runs 3]

Then the same for a loop of `--loop` python iterations, each printing a line or not
(one `step.output` per iteration, in the loop's stream): the ratio of the medians of
the whole loop's wall time. The playbooks alternate, so drift in the machine's load
hits both alike. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from actors.client import Client
from actors.pod.roles import connect, start_roles
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

LOOP = """apiVersion: actors/v1
kind: Playbook
metadata: {name: %s}
workflow:
  - step: each
    tool:
      kind: python
      code: |
        def main(x):
            %s
            return x
    args: {x: "{{ n }}"}
    loop: {collection: "{{ range(%d) | list }}", element: n, mode: async, concurrency: 64}
"""


async def bench(runs: int, loop: int, loop_runs: int) -> dict[str, float]:
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
            loops = {}
            for name, body in (("loop_silent", "pass"), ("loop_prints", 'print("iteration", x)')):
                f = Path(tmp) / f"{name}.yaml"
                f.write_text(LOOP % (name, body, loop))
                loops[name] = await client.register(f)
                times[name] = []
            for _ in range(loop_runs):
                for name, entry in loops.items():
                    t0 = time.perf_counter()
                    eid = await client.start(entry.path, version=entry.version)
                    await client.wait(eid, timeout=600)
                    times[name].append(time.perf_counter() - t0)
    finally:
        await runtime.stop()
        await nc.close()
        await server.stop()
    silent, prints = statistics.median(times["silent"]), statistics.median(times["prints"])
    loop_silent, loop_prints = statistics.median(times["loop_silent"]), statistics.median(times["loop_prints"])
    return {
        "runs": runs,
        "loop": loop,
        "loop_runs": loop_runs,
        "loop_silent_s": round(loop_silent, 3),
        "loop_prints_s": round(loop_prints, 3),
        "loop_prints_to_silent": round(loop_prints / loop_silent, 3),
        "silent_p50_ms": round(silent * 1000, 2),
        "prints_p50_ms": round(prints * 1000, 2),
        "prints_to_silent_p50": round(prints / silent, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--loop", type=int, default=1000)
    p.add_argument("--loop-runs", type=int, default=3)
    args = p.parse_args()
    print(json.dumps(asyncio.run(bench(args.runs, args.loop, args.loop_runs))))


if __name__ == "__main__":
    main()
