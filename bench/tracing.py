"""What tracing costs per step: a chain run by a pod with tracing on (always-on sampler,
OTLP over HTTP to a receiver this bench runs) and off, each as a ratio to the same
round's raw JetStream round trip; with `--baseline REV`, the same chain on an earlier
commit (before tracing) too, so "off" can be compared with what it was.

    python -m bench.tracing [--baseline REV] [--rounds 3] [--runs 5] [--steps 50]
                            [--tool sleep|python] [--json-only]

Each side gets, each round, a fresh nats-server and one pod as its own process
(`actors-cli serve --role all`, run from that side's code; `on` with the standard
variables OTEL_TRACES_EXPORTER=otlp, OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf,
OTEL_EXPORTER_OTLP_ENDPOINT=<the receiver>, OTEL_TRACES_SAMPLER=always_on), the client
in this process. Sides alternate (A B C, then C B A, ...), so all see the same minutes
of a host whose speed drifts. Per side and round, after 2 warm-up executions, `--runs`
times: one raw chain of `--steps` round trips (bench/step_latency.py's push-consumer
floor: command -> worker -> result -> engine side, on the same server, in this
process), then one execution of a `--steps`-step chain (`sleep 0`: the engine and tool
path with no worker process; `--tool python` adds the pool's IPC). Figures per round:
ms per step (wall / steps, median of runs), the raw round trip's p50, their ratio, and
the pod's CPU per step (its process tree, microseconds). Medians over rounds.

The receiver (aiohttp, in this process) answers every OTLP/HTTP export with 200 and
keeps the bodies; after the pod has stopped (and flushed) they are decoded with
`opentelemetry-proto` and the spans counted: an `on` side that exported nothing says
so (`spans: 0`) instead of passing for free tracing. Any OTEL_* variables of this
process are cleared first, so only `on` traces.

Prints a table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

from actors.client import Client
from actors.pod.roles import connect
from bench.common import ROOT, chain_playbook, checkout_of, process_tree
from bench.step_latency import PUSH, RawChain, cpu_ns, pct, raw_setup
from streams.layout import Layout
from streams.server import NatsServer, free_port
from tests.support.pods import PodProcess

WARM = 2
TIMEOUT = 120.0


class Receiver:
    """An OTLP/HTTP traces endpoint that accepts everything and keeps the bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        # an empty ExportTraceServiceResponse: all accepted
        return web.Response(body=b"", content_type="application/x-protobuf")

    def take_spans(self) -> int:
        """Spans in the bodies received since the last call (-1: no decoder installed)."""
        bodies, self.bodies = self.bodies, []
        try:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        except ImportError:
            return -1
        n = 0
        for body in bodies:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            n += sum(len(s.spans) for r in req.resource_spans for s in r.scope_spans)
        return n


def otel_env(endpoint: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
    }


async def measure(
    name: str, code: Path, env: dict[str, str], receiver: Receiver, args: argparse.Namespace
) -> dict[str, Any]:
    server = await NatsServer.start()
    pod: PodProcess | None = None
    with tempfile.TemporaryDirectory(prefix=f"bench-tracing-{name}-") as tmp:
        try:
            layout = Layout()
            pod = await PodProcess.start(
                "all", url=server.url, layout=layout, logs=Path(tmp), name="pod", code=code, env=env
            )
            await pod.ready(timeout=120)
            nc = await connect(server.url, name="bench-tracing")
            client = Client(nc, layout=layout)
            pb = Path(tmp) / "chain.yaml"
            pb.write_text(chain_playbook(f"tracing_chain{args.steps}", args.steps, args.tool))
            entry = await client.register(pb)
            await raw_setup(nc, PUSH)
            raw = RawChain(nc, PUSH)
            await raw.start()

            async def run() -> float:
                t0 = time.perf_counter()
                eid, st = await client.run(entry.path, version=entry.version, payload={"i": 0}, timeout=TIMEOUT)
                took = time.perf_counter() - t0
                if st.state != "COMPLETED":
                    raise RuntimeError(f"{name}: execution {eid} ended {st.state}")
                return took

            for _ in range(WARM):
                await run()
                await raw.run(args.steps)
            walls: list[float] = []
            raws: list[float] = []
            cpu = 0
            for _ in range(args.runs):
                lat, _wall = await raw.run(args.steps)
                raws += lat
                pids = process_tree(pod.proc.pid)
                before = sum(cpu_ns(p) for p in pids)
                walls.append(await run())
                cpu += sum(cpu_ns(p) for p in pids) - before
            await raw.stop()
            await nc.close()
        finally:
            if pod is not None:
                await pod.stop()  # the pod flushes its spans on the way out
            await server.stop()
    ms_per_step = statistics.median(walls) * 1000 / args.steps
    raw_p50 = pct(raws, 50) * 1000
    out = {
        "ms_per_step": round(ms_per_step, 3),
        "raw_p50_ms": round(raw_p50, 3),
        "ratio": round(ms_per_step / raw_p50, 2),
        "pod_cpu_us_per_step": round(cpu / 1000 / (args.runs * args.steps), 1),
        "spans": receiver.take_spans(),
    }
    return out


ROWS = (
    ("ms per step", "ms_per_step"),
    ("raw round trip p50, ms", "raw_p50_ms"),
    ("step / raw round trip", "ratio"),
    ("pod CPU per step, us", "pod_cpu_us_per_step"),
    ("spans received", "spans"),
)


async def main_async(args: argparse.Namespace, sides: dict[str, tuple[Path, bool]], head: str) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    receiver = Receiver()
    endpoint = await receiver.start()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    try:
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            say(f"round {r + 1} of {args.rounds}: {' '.join(order)}")
            for name in order:
                code, traced = sides[name]
                res = await measure(name, code, otel_env(endpoint) if traced else {}, receiver, args)
                results[name].append(res)
                say(f"  {name}: {res}")
    finally:
        await receiver.stop()
    medians = {n: {k: round(statistics.median(x[k] for x in rs), 3) for _, k in ROWS} for n, rs in results.items()}
    say("")
    say(f"chain of {args.steps} {args.tool} steps, {args.runs} runs a round; medians of {args.rounds} rounds")
    say(f"{'':28}" + "".join(f"{n:>12}" for n in medians))
    for label, key in ROWS:
        say(f"{label:28}" + "".join(f"{medians[n][key]:>12}" for n in medians))
    out: dict[str, Any] = {
        "bench": "tracing",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "head": head,
        "baseline": args.baseline,
        "tool": args.tool,
        "steps": args.steps,
        "runs": args.runs,
        "rounds": args.rounds,
        "medians": medians,
    }
    # per round, then the median: each round's sides ran minutes apart at most
    if "on" in results:
        out["on_over_off"] = round(
            statistics.median(a["ratio"] / b["ratio"] for a, b in zip(results["on"], results["off"], strict=True)), 3
        )
        out["on_cpu_over_off"] = round(
            statistics.median(
                a["pod_cpu_us_per_step"] / b["pod_cpu_us_per_step"]
                for a, b in zip(results["on"], results["off"], strict=True)
            ),
            3,
        )
    if "before" in results:
        out["off_over_before"] = round(
            statistics.median(a["ratio"] / b["ratio"] for a, b in zip(results["off"], results["before"], strict=True)),
            3,
        )
    if "on" in results:
        # an `on` that exported nothing measured a pod that ignores OTEL_*, not tracing
        out["on_exported"] = all(r["spans"] != 0 for r in results["on"])
        if not out["on_exported"]:
            say("WARNING: the `on` pod exported no spans: its figures are not tracing's cost")
    out["rounds_raw"] = results
    for key in ("on_over_off", "on_cpu_over_off", "off_over_before"):
        if key in out:
            say(f"{key}: {out[key]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--baseline", help="an earlier commit (before tracing) to run alternating as `before`")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5, help="chain executions (and raw chains) per round")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tool", choices=("sleep", "python"), default="sleep")
    parser.add_argument("--off-only", action="store_true", help="no `on` side (a checkout without tracing)")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if min(args.rounds, args.runs, args.steps) < 1:
        parser.error("counts must be at least 1")
    for k in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[k]  # the pods inherit this environment: only `on` traces
    traced = not args.off_only and (ROOT / "actors" / "runtime" / "tracing.py").exists()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    with checkout_of(args.baseline) as old:
        sides: dict[str, tuple[Path, bool]] = {"off": (ROOT, False)}
        if traced:
            sides["on"] = (ROOT, True)
        if old is not None:
            sides["before"] = (old, False)
        result = uvloop.run(main_async(args, sides, head.stdout.strip()))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
