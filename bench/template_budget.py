"""A runaway template must not slow down everybody else's executions.

    python bench/template_budget.py [--ops 30000000] [--runs 30]

One nats-server; the actors in one pod process (`actors-cli serve --role all`, as in
production); the client in this process. A good execution is a 3-step chain of `sleep 0`
steps (each a full command round trip through a tool actor); its latency is start
message to terminal status seen by the client.

For each way of evaluating the runaway template (the nested range loop of the issue,
under a budget of --ops operations), a fresh pod, and in it:
1. baseline: good executions one after another, nothing else running; p50 latency;
2. the same good executions while the runaway one is still being evaluated, and the
   time from its start to its `TemplateLimit`. The ways:
   * `inline`: rendered on the event loop (the slice that moves it off is disabled);
   * `thread`: moved to a fold thread and rendered there, never yielding the
     interpreter on its own;
   * `thread+yield`: the same, yielding the interpreter every YIELD_EVERY operations;
   * `process`: what the engine does: the fold thread hands each render to a render
     process at the lowest CPU priority (actors/render_process.py).
   Figure: p50 latency of good executions during the runaway / baseline p50 (target
   at most 1.5), and how many good executions completed meanwhile.
3. calibration: seconds of CPU per million operations for the nested loop, rendered
   directly, so the default budget (`Limits.template_ops`) can be read as time.

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOOD = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: good_chain}
workflow:
  - step: a
    tool: {kind: sleep, seconds: 0}
    next: b
  - step: b
    tool: {kind: sleep, seconds: 0}
    next: c
  - step: c
    tool: {kind: sleep, seconds: 0}
"""
RUNAWAY_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"
RUNAWAY = f"""
apiVersion: actors/v1
kind: Playbook
metadata: {{name: runaway}}
workflow:
  - step: a
    args: {{v: "{RUNAWAY_TEMPLATE}"}}
"""


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def good_latency(client: Any, path: str) -> float:
    t = time.perf_counter()
    eid = await client.start(path)
    status = await client.wait(eid, timeout=60)
    assert status.state == "COMPLETED", status
    return time.perf_counter() - t


POD = """
import sys
from actors import render_process
from actors.playbook import budget, templates
render_process.INLINE_TEMPLATE_OPS = int(sys.argv[1])
budget.YIELD_EVERY = int(sys.argv[2])
budget.YIELD_PAUSE = float(sys.argv[3])
if sys.argv[4] == "thread":  # render on the fold thread itself, not in a render process
    def run(self, fn):
        with templates.off_the_loop(self._halt):
            return fn()
    render_process.OffLoop._run = run
from actors.cli import entrypoint
sys.argv = ["actors-cli", "serve", "--role", "all", "--http-port", "0"]
entrypoint()
"""


async def measure_mode(
    url: str, paths: dict[str, str], *, ops: int, runs: int, slice_ops: int, every: int, pause: float, where: str
) -> dict[str, Any]:
    """One pod process (every role, as `serve`), evaluating templates the given way; the
    client in this process. Baseline first, then good executions while the runaway runs."""
    import os
    import signal

    from actors.client import Client
    from actors.runtime import connect
    from actors.settings import Settings

    env = {**os.environ, "NATS_URL": url, "ACTORS_TEMPLATE_OPS": str(ops), "PYTHONPATH": str(ROOT)}
    pod = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        POD,
        str(slice_ops),
        str(every),
        str(pause),
        where,
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    nc = await connect(url, name="bench-client")
    client = Client(nc, layout=Settings.from_env().layout)
    try:
        for _ in range(5):  # warm up (and wait for the pod to take its partitions)
            await good_latency(client, paths["good"])
        baseline = [await good_latency(client, paths["good"]) for _ in range(runs)]
        t0 = time.perf_counter()
        bad = await client.start(paths["runaway"])
        during: list[float] = []
        done = asyncio.create_task(client.wait(bad, timeout=600))
        while not done.done():
            during.append(await good_latency(client, paths["good"]))
        status = await done
        took = time.perf_counter() - t0
        assert status.state == "FAILED", status
        # only the good runs that ended while the runaway one was still being evaluated
        during = during[:-1] if len(during) > 1 else during
        return {
            "baseline_p50_ms": round(p50(baseline) * 1000, 3),
            "good_during": len(during),
            "p50_ms": round(p50(during) * 1000, 3),
            "ratio_to_baseline": round(p50(during) / p50(baseline), 2) if during else None,
            "runaway_to_template_limit_s": round(took, 2),
        }
    finally:
        await nc.close()
        pod.send_signal(signal.SIGTERM)
        await pod.wait()


async def run(ops: int, runs: int, variants: list[tuple[int, float]]) -> dict[str, Any]:
    from actors import render_process
    from actors.client import Client
    from actors.playbook import budget, templates
    from actors.runtime import connect
    from actors.settings import Settings
    from actors.wire import Limits
    from streams.layout import ensure
    from streams.server import NatsServer

    server = await NatsServer.start()
    tmp = Path(tempfile.mkdtemp(prefix="template-budget-"))
    out: dict[str, Any] = {"bench": "template_budget", "ops_budget": ops}
    try:
        nc = await connect(server.url, name="bench")
        await ensure(nc.jetstream(), Settings.from_env().layout)
        client = Client(nc, layout=Settings.from_env().layout)
        paths = {}
        for name, text in (("good", GOOD), ("runaway", RUNAWAY)):
            f = tmp / f"{name}.yaml"
            f.write_text(text)
            paths[name] = (await client.register(f)).path
        await nc.close()
        inline = render_process.INLINE_TEMPLATE_OPS
        modes = {
            "inline": (10**12, budget.YIELD_EVERY, budget.YIELD_PAUSE, "thread"),
            "thread": (inline, 10**12, 0.0, "thread"),
            "thread+yield": (inline, budget.YIELD_EVERY, budget.YIELD_PAUSE, "thread"),
            "process": (inline, budget.YIELD_EVERY, budget.YIELD_PAUSE, "process"),
        }
        for every, pause in variants:
            modes[f"thread+yield/{every}/{pause * 1e6:.0f}us"] = (inline, every, pause, "thread")
        for mode, (slice_ops, every, pause, where) in modes.items():
            out[mode] = await measure_mode(
                server.url, paths, ops=ops, runs=runs, slice_ops=slice_ops, every=every, pause=pause, where=where
            )
            print(f"{mode:13} {out[mode]}", file=sys.stderr)
    finally:
        await server.stop()
    # calibration: the operations the nested loop spends per CPU second, rendered directly
    with templates.template_limits(Limits(template_ops=ops)):
        t = time.process_time()
        try:
            templates.render_value(RUNAWAY_TEMPLATE, {})
        except templates.TemplateLimit:
            pass
        cpu = time.process_time() - t
    out["cpu_s_per_million_ops"] = round(cpu / (ops / 1e6), 4)
    out["default_budget_cpu_s"] = round(cpu / ops * Limits().template_ops, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=30_000_000, help="the runaway execution's operation budget")
    ap.add_argument("--runs", type=int, default=30, help="good executions for the baseline")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="EVERY:PAUSE_US",
        help="also measure yielding every EVERY operations with a PAUSE_US sleep",
    )
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    variants = [(int(v.split(":")[0]), float(v.split(":")[1]) / 1e6) for v in args.variant]
    print(json.dumps(asyncio.run(run(args.ops, args.runs, variants))))


if __name__ == "__main__":
    main()
