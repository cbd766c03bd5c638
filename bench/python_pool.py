"""The python worker pool alone: calls/s and CPU per call, in the pod's process and in
its workers, for many calls at once (a loop) and for one at a time (a chain).

    python -m bench.python_pool [--calls 20000] [--concurrency 64] [--sequential 2000]

`def main(i): return i` through `PythonPool.run_json` (what the python tool runs), on
uvloop, with the pool's default size (the CPUs this process may use). CPU per call is
this process's (`time.process_time`) and the workers' (from /proc/<pid>/stat). The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time

from actors.tools.capture import OutputBox
from actors.tools.pypool import PythonPool

CODE = "def main(i): return i"


def workers_cpu(pool: PythonPool) -> float:
    """Seconds of CPU the pool's live workers used (user + system)."""
    total = 0.0
    for pid in pool.pids():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def measure(calls: int, concurrency: int, sequential: int) -> dict[str, float]:
    pool = PythonPool()
    await pool.start()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> bytes:
        async with gate:
            return await pool.run_json(CODE, {"i": i}, timeout=30, output=OutputBox(1 << 20))

    try:
        await asyncio.gather(*(one(i) for i in range(200)))  # warm: the code is known quick
        w0, t0, c0 = workers_cpu(pool), time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(calls)))
        wall, cpu, wcpu = time.perf_counter() - t0, time.process_time() - c0, workers_cpu(pool) - w0
        lat = []
        c1 = time.process_time()
        for i in range(sequential):
            s = time.perf_counter()
            await pool.run_json(CODE, {"i": i}, timeout=30, output=OutputBox(1 << 20))
            lat.append(time.perf_counter() - s)
        seq_cpu = time.process_time() - c1
    finally:
        await pool.close()
    lat.sort()
    return {
        "calls_s": calls / wall,
        "parent_cpu_us_per_call": cpu / calls * 1e6,
        "workers_cpu_us_per_call": wcpu / calls * 1e6,
        "sequential_p50_us": lat[len(lat) // 2] * 1e6,
        "sequential_p90_us": lat[len(lat) * 9 // 10] * 1e6,
        "sequential_parent_cpu_us_per_call": seq_cpu / sequential * 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=2000)
    a = ap.parse_args()
    import uvloop

    r = uvloop.run(measure(a.calls, a.concurrency, max(1, a.sequential)))
    print(
        f"{r['calls_s']:,.0f} calls/s ({a.concurrency} at once); CPU per call: "
        f"pod {r['parent_cpu_us_per_call']:.1f} us, workers {r['workers_cpu_us_per_call']:.1f} us; "
        f"one at a time: p50 {r['sequential_p50_us']:.0f} us"
    )
    print(json.dumps({"bench": "python_pool", "python": platform.python_version(), "concurrency": a.concurrency, **r}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
