"""What a retained execution, a loop iteration and a blob byte cost the NATS server: the
figures docs/operating.md "Capacity" sizes a cluster with (issue #34 item 5).

    python -m bench.capacity [--executions 2000] [--loops 10] [--iterations 1000]
                             [--blobs 20] [--blob-bytes 1000000] [--cluster] [--json-only]

A fresh nats-server (or, with `--cluster`, three nodes and every stream at 3 replicas),
every actor in this process, and three workloads run one after the other, each measured
by the growth of every stream (messages, distinct subjects, bytes as the server counts
them), of the store directories on disk (summed over the nodes) and of the servers'
resident memory (summed):

* `execution`: `--executions` runs of a 2-step playbook (sleep 0 s steps: the engine's
  path without python workers); per execution.
* `step`: a quarter as many runs of a 6-step playbook; per step beyond the first two.
* `iteration`: `--loops` runs of a playbook whose one step is a loop of `--iterations`
  noop iterations; per iteration, less the executions' own share (from `execution`).
* `blob byte`: `--blobs` runs of a python step returning a string of `--blob-bytes`
  characters (a value too large for a message: the object store); per byte of value,
  less the executions' share. The ratio against 1.0 is the store's overhead on a value.

Memory is resident set size, which a Go server gives back slowly: read it as what the
server holds while that many records are retained, not as what one record allocates.
Nothing is removed during a run (retention is off). The last line is one JSON object.
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
from bench.common import chain_playbook
from streams.layout import Layout
from streams.server import NatsCluster, NatsServer

MORE_STEPS = 4  # the `step` workload: executions of 2 + MORE_STEPS steps, against those of 2
STREAMS = ("EXEC", "LOOP", "INDEX", "ENDED", "KV_status", "OBJ_blobs", "DLQ", "CMD")

LOOP = """apiVersion: actors/v1
kind: Playbook
metadata: {{name: cap_loop, path: bench/cap_loop}}
workflow:
  - step: each
    loop: {{collection: "{{{{ range({n}) | list }}}}", element: i}}
    tool: {{kind: noop}}
    args: {{i: "{{{{ i }}}}"}}
"""

BLOB = """apiVersion: actors/v1
kind: Playbook
metadata: {{name: cap_blob, path: bench/cap_blob}}
workflow:
  - step: big
    tool: {{kind: python, code: "def main(): return 'b' * {n}"}}
"""


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Servers:
    """One server or a 3-node cluster: what the bench measures."""

    def __init__(self, single: NatsServer | None, cluster: NatsCluster | None) -> None:
        self.single, self.cluster = single, cluster

    @property
    def url(self) -> str:
        return self.single.url if self.single is not None else self.cluster.url  # type: ignore[union-attr]

    def pids(self) -> list[int]:
        if self.single is not None:
            return [self.single.proc.pid]
        return [n.proc.pid for n in self.cluster.nodes if n is not None]  # type: ignore[union-attr]

    def stores(self) -> list[Path]:
        if self.single is not None:
            return [self.single.store]
        return [n.store for n in self.cluster.nodes if n is not None]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.single is not None:
            await self.single.stop()
        else:
            await self.cluster.stop()  # type: ignore[union-attr]


async def snapshot(nc: Any, servers: Servers) -> dict[str, Any]:
    jsm = nc.jsm()
    streams: dict[str, dict[str, int]] = {}
    for name in STREAMS:
        try:
            info = await jsm.stream_info(name, subjects_filter=">")
        except Exception:
            continue
        streams[name] = {
            "messages": info.state.messages,
            "subjects": len(info.state.subjects or {}),
            "bytes": info.state.bytes,
        }
    return {
        "streams": streams,
        "disk": sum(du(p) for p in servers.stores()),
        "rss_kb": sum(rss_kb(pid) for pid in servers.pids()),
    }


def growth(before: dict[str, Any], after: dict[str, Any], per: float) -> dict[str, Any]:
    streams = {}
    for name, now in after["streams"].items():
        was = before["streams"].get(name, {"messages": 0, "subjects": 0, "bytes": 0})
        streams[name] = {k: round((now[k] - was[k]) / per, 3) for k in now}
    return {
        "streams": streams,
        "messages": round(sum(s["messages"] for s in streams.values()), 3),
        "subjects": round(sum(s["subjects"] for s in streams.values()), 3),
        "bytes": round(sum(s["bytes"] for s in streams.values()), 1),
        "disk": round((after["disk"] - before["disk"]) / per, 1),
        "rss_bytes": round((after["rss_kb"] - before["rss_kb"]) * 1024 / per, 1),
    }


def less_executions(
    per_unit: dict[str, Any], per_execution: dict[str, Any], share: float, *, digits: int
) -> dict[str, Any]:
    """`per_unit` less the executions' own cost: `share` executions per unit (one
    execution holds 1 / share iterations, or blob bytes). The streams' detail stays whole."""
    totals = ("messages", "subjects", "bytes", "disk", "rss_bytes")
    return {**per_unit, **{k: round(per_unit[k] - per_execution[k] * share, digits) for k in totals}}


async def run_all(client: Client, path: str, n: int, payload: dict[str, Any] | None = None, at_once: int = 50) -> None:
    pending: set[asyncio.Task[Any]] = set()
    for _ in range(n):
        eid = await client.start(path, payload=payload)
        pending.add(asyncio.create_task(client.wait(eid, timeout=600)))
        if len(pending) >= at_once:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                assert d.result().state == "COMPLETED", d.result()
    for st in await asyncio.gather(*pending):
        assert st.state == "COMPLETED", st


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.cluster:
        servers = Servers(None, await NatsCluster.start(3))
        replicas = 3
    else:
        servers = Servers(await NatsServer.start(), None)
        replicas = 1
    layout = Layout(replicas=replicas, finished_retention=0)  # nothing removed while measuring
    nc = await connect(servers.url, name="capacity")
    runtime = await start_roles(nc, layout=layout)
    client = Client(nc, layout=layout, timeout=60)
    work = Path(tempfile.mkdtemp(prefix="capacity-"))
    try:
        files = {
            "chain": chain_playbook("cap_chain", 2, "sleep"),
            "long": chain_playbook("cap_long", 2 + MORE_STEPS, "sleep"),
            "loop": LOOP.format(n=args.iterations),
            "blob": BLOB.format(n=args.blob_bytes),
        }
        paths = {}
        for name, text in files.items():
            (work / f"{name}.yaml").write_text(text)
            paths[name] = (await client.register(work / f"{name}.yaml")).path
        await run_all(client, paths["chain"], 5)  # warm: streams, buckets and consumers made, caches filled
        figures: dict[str, Any] = {}
        last = await snapshot(nc, servers)

        async def grown(name: str, n: int, per: float, at_once: int = 50) -> dict[str, Any]:
            """Run `n` executions of playbook `name`: what the servers grew by, per `per`."""
            nonlocal last
            before = last
            await run_all(client, paths[name], n, at_once=at_once)
            last = await snapshot(nc, servers)
            return growth(before, last, per)

        t0 = time.monotonic()
        figures["execution"] = await grown("chain", args.executions, args.executions)
        print(f"execution: {args.executions} in {time.monotonic() - t0:.1f}s", flush=True)

        t0 = time.monotonic()
        longer = await grown("long", args.executions // 4, args.executions // 4)
        step = {k: round((longer[k] - figures["execution"][k]) / MORE_STEPS, 3) for k in longer if k != "streams"}
        figures["step"] = {"streams": {}, **step}
        print(f"step: {args.executions // 4} of {2 + MORE_STEPS} steps in {time.monotonic() - t0:.1f}s", flush=True)

        t0 = time.monotonic()
        loop = await grown("loop", args.loops, args.loops * args.iterations, at_once=2)
        figures["iteration"] = less_executions(loop, figures["execution"], 1 / args.iterations, digits=3)
        print(f"iteration: {args.loops} x {args.iterations} in {time.monotonic() - t0:.1f}s", flush=True)

        t0 = time.monotonic()
        blob = await grown("blob", args.blobs, args.blobs * args.blob_bytes, at_once=4)
        figures["blob_byte"] = less_executions(blob, figures["execution"], 1 / args.blob_bytes, digits=4)
        print(f"blob: {args.blobs} x {args.blob_bytes} B in {time.monotonic() - t0:.1f}s", flush=True)
    finally:
        await runtime.stop(drain_timeout=0)
        await nc.close()
        await servers.stop()
    return {
        "bench": "capacity",
        "replicas": replicas,
        "executions": args.executions,
        "iterations": args.loops * args.iterations,
        "blob_bytes": args.blobs * args.blob_bytes,
        **figures,
        # the baseline: a value's own bytes (1.0 = the store keeps a blob at no overhead)
        "blob_disk_ratio": figures["blob_byte"]["disk"],
        "load": os.getloadavg()[0],
    }


def table(result: dict[str, Any]) -> None:
    print(f"\nper unit, {'3 nodes, R3 (summed over nodes)' if result['replicas'] == 3 else 'one server'}:")
    print(f"{'':12} {'messages':>9} {'subjects':>9} {'bytes':>10} {'disk B':>10} {'server RSS B':>13}")
    for unit in ("execution", "step", "iteration", "blob_byte"):
        f = result[unit]
        print(f"{unit:12} {f['messages']:>9} {f['subjects']:>9} {f['bytes']:>10} {f['disk']:>10} {f['rss_bytes']:>13}")
    for name, s in result["execution"]["streams"].items():
        if any(s.values()):
            print(f"  execution in {name:10} {s['messages']:>7} msgs {s['subjects']:>7} subjects {s['bytes']:>9} B")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executions", type=int, default=2000)
    p.add_argument("--loops", type=int, default=10)
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--blobs", type=int, default=20)
    p.add_argument("--blob-bytes", type=int, default=1_000_000)
    p.add_argument("--cluster", action="store_true", help="three nodes, every stream at 3 replicas")
    p.add_argument("--json-only", action="store_true")
    args = p.parse_args()
    result = uvloop.run(bench(args))
    if not args.json_only:
        table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
