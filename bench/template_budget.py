"""A runaway template must not slow down everybody else's executions.

    python bench/template_budget.py [--ops 30000000] [--runs 30]

One nats-server and every actor in this process (as `actors-cli run`/`dev` do). A good
execution is a 3-step chain of `sleep 0` steps (each a full command round trip through a
tool actor); its latency is start message to terminal status seen by the client.

1. baseline: good executions one after another, nothing else running; p50 latency.
2. for each way of evaluating the runaway template (the nested range loop of the issue,
   under a budget of --ops operations), the same good executions while the runaway one
   is still being evaluated, and the time from its start to its `TemplateLimit`:
   * `inline`: rendered on the event loop (the slice that moves it off is disabled);
   * `thread`: moved to a worker thread, but never yielding the interpreter on its own;
   * `thread+yield`: what the engine does (actors/playbook/templates.py).
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


async def run(ops: int, runs: int, variants: list[tuple[int, float]]) -> dict[str, Any]:
    from actors import hosting
    from actors.client import Client
    from actors.engine.starter import Starter
    from actors.playbook import templates
    from actors.runtime import connect, start_roles, tune_gc
    from actors.wire import Limits
    from streams.layout import Layout
    from streams.server import NatsServer

    server = await NatsServer.start()
    nc = await connect(server.url, name="bench")
    layout = Layout()
    rt = await start_roles(nc, layout=layout)
    tune_gc()
    client = Client(nc, layout=layout)
    tmp = Path(tempfile.mkdtemp(prefix="template-budget-"))
    out: dict[str, Any] = {"bench": "template_budget", "ops_budget": ops}
    try:
        paths = {}
        for name, text in (("good", GOOD), ("runaway", RUNAWAY)):
            f = tmp / f"{name}.yaml"
            f.write_text(text)
            paths[name] = (await client.register(f)).path
        for _ in range(5):  # warm up
            await good_latency(client, paths["good"])
        baseline = [await good_latency(client, paths["good"]) for _ in range(runs)]
        out["baseline_p50_ms"] = round(p50(baseline) * 1000, 3)
        for starter in rt.find(Starter):
            assert isinstance(starter, Starter)
            starter.limits = Limits(template_ops=ops)
        modes = {
            "inline": {"slice": 10**12, "yield_every": templates.YIELD_EVERY, "pause": templates.YIELD_PAUSE},
            "thread": {"slice": templates.INLINE_TEMPLATE_OPS, "yield_every": 10**12, "pause": 0.0},
            "thread+yield": {"slice": templates.INLINE_TEMPLATE_OPS, "yield_every": templates.YIELD_EVERY,
                             "pause": templates.YIELD_PAUSE},
        }
        for every, pause in variants:
            modes[f"thread+yield/{every}/{pause * 1e6:.0f}us"] = {
                "slice": templates.INLINE_TEMPLATE_OPS, "yield_every": every, "pause": pause}
        default_slice, default_yield = hosting.INLINE_TEMPLATE_OPS, templates.YIELD_EVERY
        default_pause = templates.YIELD_PAUSE
        for mode, how in modes.items():
            hosting.INLINE_TEMPLATE_OPS = how["slice"]  # type: ignore[misc]
            templates.YIELD_EVERY = how["yield_every"]  # type: ignore[misc]
            templates.YIELD_PAUSE = how["pause"]  # type: ignore[misc]
            try:
                t0 = time.perf_counter()
                bad = await client.start(paths["runaway"])
                during: list[float] = []
                done = asyncio.create_task(client.wait(bad, timeout=300))
                while not done.done():
                    during.append(await good_latency(client, paths["good"]))
                status = await done
                took = time.perf_counter() - t0
                assert status.state == "FAILED", status
                # the last good run may have ended after the runaway one: count only
                # those that ran entirely while it was being evaluated
                during = during[:-1] if len(during) > 1 else during
                out[mode] = {
                    "good_during": len(during),
                    "p50_ms": round(p50(during) * 1000, 3),
                    "ratio_to_baseline": round(p50(during) / p50(baseline), 2) if during else None,
                    "runaway_to_template_limit_s": round(took, 2),
                }
            finally:
                hosting.INLINE_TEMPLATE_OPS = default_slice  # type: ignore[misc]
                templates.YIELD_EVERY = default_yield  # type: ignore[misc]
                templates.YIELD_PAUSE = default_pause  # type: ignore[misc]
            print(f"{mode:13} {out[mode]}", file=sys.stderr)
    finally:
        await rt.stop()
        await nc.close()
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
    ap.add_argument("--variant", action="append", default=[], metavar="EVERY:PAUSE_US",
                    help="also measure yielding every EVERY operations with a PAUSE_US sleep")
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
