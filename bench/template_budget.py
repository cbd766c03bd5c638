"""A runaway template must not slow down everybody else's executions, and isolating
templates must cost ordinary steps little.

    python -m bench.template_budget [--ops 2000000] [--template-seconds 2] [--runs 40] [--during 60]
                                    [--rounds 3] [--chain 10] [--blocks 8] [--block 10] [--renders 2000]

One nats-server; one pod process (`actors-cli serve --role all`, as in production) with
ACTORS_TEMPLATE_OPS=--ops and ACTORS_TEMPLATE_SECONDS=--template-seconds; the client in
this process. In one run:

1. Bystanders. A good execution is a 3-step chain of `sleep 0` steps (each a full
   command round trip through a tool actor); its latency is start message to terminal
   status seen by the client. Baseline: good executions one after another, nothing
   else running. Then, for each runaway, good executions one after another while an
   execution whose one step's args hold the runaway template is being evaluated in a
   render process (started again as soon as it ends, until --during good ones started
   and ended while one was in flight):
   * `loop`: the nested `range` loop, charged per iteration: ends `TemplateLimit`
     (template_ops);
   * `shared`: `ns.a == ns.b` over two lists built of shared parts (2^60 elements to
     walk), charged per element walked: ends `TemplateLimit` (template_ops);
   * `deadline`: strings as wide as the output bound built element by element
     (`map('center', 999999)`): within the budget, longer than --template-seconds of
     CPU, so the pod kills it. What `center` builds is now charged, so it ends
     `TemplateLimit` (template_ops) at once: a storm of failing executions beside the
     bystanders (the outcome is printed); the kill is tested in tests/system/test_containment.py.
   Blocks of --during good executions (at least: a block ends with its runaway) during
   each kind in turn, --rounds times, with a baseline block of --runs between any two.
   Figure: p50 during a kind / p50 of the baseline blocks around its blocks (target at
   most 1.5), and what each runaway ended with, after how long.
2. Cost of isolation. A chain of --chain `sleep 0` steps whose args use only templates
   a pod renders on its own thread (`inline_safe`: `{{ workload.x }}`,
   `{{ workload.a.b | default(1) }}`), and the same chain with one argument that must
   render in a render process (`{{ workload.items | map('upper') | list }}`); blocks of
   --block executions of each, alternating, --blocks times; p50 per step (execution
   latency / steps) of each, and their ratio. And a render process's own round trip,
   measured in this process: microseconds per render of that small template (--renders
   of them), and the same render in-process.
3. Calibration: CPU seconds per million operations of each runaway, rendered in this
   process, so the budget (`Limits.template_ops`) can be read as time.

Progress on stderr; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import uvloop

from actors.client import Client
from actors.playbook.budget import begin_budget, end_budget, thread_state
from actors.playbook.inline import inline_safe
from actors.playbook.templates import TemplateLimit, render_value, template_limits
from actors.pod.roles import connect
from actors.runtime.render_process import RenderBounds, RenderProcess
from actors.wire.messages import ExecutionStatus, Limits
from bench.common import chain_playbook, start_server
from streams.layout import Layout
from tests.support.pods import PodProcess

WAIT = 300.0  # seconds any one execution may take here before the bench gives up

NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"
SHARED = (
    "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}"
    "{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}"
)
# ~6 operations and ~20 us of CPU per element: twice over, 1.2M operations, ~4 s
WIDE = "range(99999) | map('center', 999999) | map('length') | sum"
DEADLINE = f"{{{{ ({WIDE}) + ({WIDE}) }}}}"
RUNAWAYS = {"loop": NESTED_LOOP, "shared": SHARED, "deadline": DEADLINE}

INLINE_ARGS = {"x": "{{ workload.x }}", "b": "{{ workload.a.b | default(1) }}"}
PROCESS_ARGS = {"x": "{{ workload.x }}", "items": "{{ workload.items | map('upper') | list }}"}
WORKLOAD = {"x": 1, "a": {"b": 2}, "items": ["a", "b", "c"]}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def one_step(name: str, template: str) -> str:
    return (
        f"apiVersion: actors/v1\nkind: Playbook\nmetadata: {{name: {name}, path: bench/{name}}}\n"
        f"workflow:\n  - step: a\n    args: {{v: {json.dumps(template)}}}\n"
    )


def args_chain(name: str, steps: int, args: dict[str, str]) -> str:
    """`steps` `sleep 0` steps in a row, each with `args` (templates over the workload)."""
    lines = ["apiVersion: actors/v1", "kind: Playbook", f"metadata: {{name: {name}, path: bench/{name}}}"]
    lines += [f"workload: {json.dumps(WORKLOAD)}", "workflow:"]
    for k in range(1, steps + 1):
        lines += [f"  - step: s{k}", "    tool: {kind: sleep, seconds: 0}", "    args:"]
        lines += [f"      {key}: {json.dumps(value)}" for key, value in args.items()]
        if k < steps:
            lines.append(f"    next: s{k + 1}")
    return "\n".join(lines) + "\n"


def outcome(status: ExecutionStatus) -> str:
    """`TemplateLimit template_ops` and the like: what a runaway execution ended with."""
    error = status.error or {}
    kind = error.get("type", status.state)
    message = str(error.get("message", ""))
    limit = next((lim for lim in ("template_ops", "template_seconds", "template_memory") if lim in message), "")
    return f"{kind} {limit}".strip()


class Bench:
    def __init__(self, client: Client, paths: dict[str, str]) -> None:
        self.client, self.paths = client, paths

    async def latency(self, name: str) -> float:
        t = time.perf_counter()
        _, status = await self.client.run(self.paths[name], timeout=WAIT)
        assert status.state == "COMPLETED", status
        return time.perf_counter() - t

    async def baseline(self, runs: int) -> list[float]:
        return [await self.latency("good") for _ in range(runs)]

    async def during(self, runaway: str, want: int) -> tuple[list[float], list[float], Counter[str]]:
        """Good executions while `runaway` is in flight, started again whenever it ends:
        only those that started and ended within one runaway's lifetime count."""
        good: list[float] = []
        lasted: list[float] = []
        ends: Counter[str] = Counter()
        while len(good) < want:
            t0 = time.perf_counter()
            eid = await self.client.start(self.paths[runaway])  # its start record is written
            bad = asyncio.create_task(self.client.wait(eid, timeout=WAIT))
            while not bad.done():
                latency = await self.latency("good")
                if not bad.done():
                    good.append(latency)
            status = await bad
            lasted.append(time.perf_counter() - t0)
            ends[outcome(status)] += 1
        return good, lasted, ends

    async def isolation(self, blocks: int, block: int, steps: int) -> dict[str, list[float]]:
        per_step: dict[str, list[float]] = {"inline": [], "process": []}
        for b in range(blocks):
            order = ("inline", "process") if b % 2 == 0 else ("process", "inline")
            for kind in order:
                for _ in range(block):
                    t = time.perf_counter()
                    _, status = await self.client.run(self.paths[kind], timeout=WAIT)
                    assert status.state == "COMPLETED", status
                    per_step[kind].append((time.perf_counter() - t) / steps)
        return per_step


def round_trip(renders: int) -> dict[str, float]:
    """A render process's round trip (pipe, JSON both ways, the render), in this process;
    the same render in-process for comparison."""
    template, scope = PROCESS_ARGS["items"], {"workload": WORKLOAD}
    proc = RenderProcess(RenderBounds())
    try:
        for _ in range(50):  # its imports, the template's compilation, both caches
            proc.render(template, scope, "args.items", Limits(), "s1")
        times = []
        for _ in range(renders):
            t = time.perf_counter()
            proc.render(template, scope, "args.items", Limits(), "s1")
            times.append(time.perf_counter() - t)
    finally:
        proc.close()
    render_value(template, scope)
    t = time.perf_counter()
    for _ in range(renders):
        render_value(template, scope)
    inline = (time.perf_counter() - t) / renders
    return {
        "render_process_p50_us": round(p50(times) * 1e6, 1),
        "render_process_mean_us": round(statistics.fmean(times) * 1e6, 1),
        "in_process_us": round(inline * 1e6, 1),
    }


def calibrate(ops: int) -> dict[str, float]:
    """CPU seconds per million operations of each runaway, rendered here to the end of
    `ops` (the wide one on fewer elements: it ends within any budget)."""
    out = {}
    wide = "{{ " + WIDE.replace("99999", "20000") + " }}"
    for name, template in (("loop", NESTED_LOOP), ("shared", SHARED), ("deadline", wide)):
        with template_limits(Limits(template_ops=ops)):
            outer = begin_budget()  # read its count after the render
            t = time.process_time()
            try:
                render_value(template, {})
            except TemplateLimit:
                pass
            finally:
                cpu, used = time.process_time() - t, thread_state.budget.used
                end_budget(outer)
        out[name] = round(cpu / (used / 1e6), 4)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    for name, template in (("inline", INLINE_ARGS), ("process", PROCESS_ARGS)):
        safe = all(inline_safe(v) for v in template.values())
        assert safe == (name == "inline"), f"{name} chain: inline_safe says {safe}"
    server = await start_server()
    pod: PodProcess | None = None
    nc = None
    out: dict[str, Any] = {
        "bench": "template_budget",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "ops_budget": args.ops,
        "template_seconds": args.template_seconds,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="template-budget-") as tmp:
            env = {
                "ACTORS_TEMPLATE_OPS": str(args.ops),
                "ACTORS_TEMPLATE_SECONDS": str(args.template_seconds),
                # only sleep steps here: they run as nobody else, and a root pod refuses to
                # start without a step user its python can run as (actors/config/settings.py)
                "ACTORS_STEP_USER": os.environ.get("ACTORS_STEP_USER", f"{os.geteuid()}:{os.getegid()}"),
            }
            pod = await PodProcess.start("all", url=server.url, layout=Layout(), logs=Path(tmp), name="pod", env=env)
            await pod.ready()
            nc = await connect(server.url, name="bench-template-budget")
            client = Client(nc, layout=Layout())
            texts = {
                "good": chain_playbook("template_good", 3, "sleep"),
                "inline": args_chain("template_inline", args.chain, INLINE_ARGS),
                "process": args_chain("template_process", args.chain, PROCESS_ARGS),
                **{name: one_step(f"template_{name}", t) for name, t in RUNAWAYS.items()},
            }
            paths = {}
            for name, text in texts.items():
                f = Path(tmp) / f"{name}.yaml"
                f.write_text(text)
                paths[name] = (await client.register(f)).path
            bench = Bench(client, paths)
            for _ in range(5):  # warm: the pod's caches, its render process, the connections
                await bench.latency("good")
            await bench.isolation(1, 2, args.chain)

            say(f"1. bystanders (3 sleep-0 steps; budget {args.ops:,} ops, deadline {args.template_seconds} s of CPU)")
            # baseline blocks between the runaway blocks, kinds in turn, so each runaway is
            # compared with the minutes around it on a host whose speed drifts
            baselines = [await bench.baseline(args.runs)]
            say(f"   baseline        p50 {ms(p50(baselines[-1])):8.2f} ms  ({args.runs} runs)")
            good: dict[str, list[float]] = {name: [] for name in RUNAWAYS}
            around: dict[str, list[float]] = {name: [] for name in RUNAWAYS}
            lasted: dict[str, list[float]] = {name: [] for name in RUNAWAYS}
            ends: dict[str, Counter[str]] = {name: Counter() for name in RUNAWAYS}
            for _ in range(args.rounds):
                for name in RUNAWAYS:
                    during, took, ended = await bench.during(name, args.during)
                    baselines.append(await bench.baseline(args.runs))
                    good[name] += during
                    around[name] += baselines[-2] + baselines[-1]
                    lasted[name] += took
                    ends[name] += ended
                    say(
                        f"   during {name:8} p50 {ms(p50(during)):8.2f} ms  ({len(during)} runs; {len(took)} runaways, "
                        f"{p50(took):.2f} s each, {dict(ended)})"
                    )
                    say(f"   baseline        p50 {ms(p50(baselines[-1])):8.2f} ms  ({args.runs} runs)")
            out["baseline_p50_ms"] = ms(p50([x for b in baselines for x in b]))
            out["baseline_p50_ms_blocks"] = [ms(p50(b)) for b in baselines]
            out["bystanders"] = {
                name: {
                    "p50_ms": ms(p50(good[name])),
                    "baseline_around_p50_ms": ms(p50(around[name])),
                    "ratio_to_baseline": round(p50(good[name]) / p50(around[name]), 2),
                    "good_during": len(good[name]),
                    "runaways": len(lasted[name]),
                    "runaway_s_p50": round(p50(lasted[name]), 2),
                    "ended": dict(ends[name]),
                }
                for name in RUNAWAYS
            }
            for name, fig in out["bystanders"].items():
                around_ms = fig["baseline_around_p50_ms"]
                say(f"   {name:8} ratio {fig['ratio_to_baseline']} (p50 {fig['p50_ms']} ms / {around_ms} ms around)")

            say(f"2. isolation: {args.chain}-step chains, {args.blocks} x {args.block} executions of each")
            await bench.isolation(1, 2, args.chain)  # a fresh render process: the deadline killed the last
            per_step = await bench.isolation(args.blocks, args.block, args.chain)
            inline, process = p50(per_step["inline"]), p50(per_step["process"])
            out["isolation"] = {
                "steps": args.chain,
                "executions_each": len(per_step["inline"]),
                "inline_step_p50_ms": ms(inline),
                "process_step_p50_ms": ms(process),
                "ratio": round(process / inline, 2),
            }
            say(f"   p50 per step: inline {ms(inline):.3f} ms, render process {ms(process):.3f} ms")
            await pod.stop()
            pod = None
    finally:
        if pod is not None:
            await pod.stop()
        if nc is not None:
            await nc.close()
        await server.stop()
    out["round_trip"] = round_trip(args.renders)
    say(f"   round trip of one render: {out['round_trip']}")
    out["cpu_s_per_million_ops"] = calibrate(args.ops)
    out["default_budget_cpu_s"] = {
        k: round(v * Limits().template_ops / 1e6, 2) for k, v in out["cpu_s_per_million_ops"].items()
    }
    say(f"3. CPU s per million operations: {out['cpu_s_per_million_ops']}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=2_000_000, help="the pod's operation budget (ACTORS_TEMPLATE_OPS)")
    ap.add_argument(
        "--template-seconds",
        type=float,
        default=2.0,
        help="the pod's render deadline, CPU seconds (ACTORS_TEMPLATE_SECONDS); the charged runaways must end "
        "within it, the deadline one must not",
    )
    ap.add_argument("--runs", type=int, default=40, help="good executions per baseline block")
    ap.add_argument(
        "--during", type=int, default=60, help="good executions (at least) per block during one runaway kind"
    )
    ap.add_argument("--rounds", type=int, default=3, help="blocks of each runaway kind, kinds in turn")
    ap.add_argument("--chain", type=int, default=10, help="steps of the isolation chains")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of each isolation chain, alternating")
    ap.add_argument("--block", type=int, default=10, help="executions per isolation block")
    ap.add_argument("--renders", type=int, default=2000, help="renders timed for the round trip")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = uvloop.run(run(args))
    except (asyncio.CancelledError, KeyboardInterrupt):
        say("template_budget: interrupted; stopped everything")
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
