"""Stored writes per workflow under `sync always`: what every 3-step workflow and every
step of a chain stores, stream by stream, and the fsyncs it costs, against an earlier
commit run alternating on the same machine.

    python -m bench.writes [--baseline REV] [--rounds 2] [--runs 40] [--chain 50]
                           [--concurrent 200] [--fsync-delay-ms 0] [--cluster] [--exec-streams 1]
                           [--sync always|default]
                           [--json-only]

Each side (this checkout; with `--baseline`, REV checked out in a temporary git
worktree) gets, each round, a fresh nats-server with JetStream's `sync_interval:
always` (fsync before every PubAck: nothing acknowledged is lost to a power cut) and one
pod as its own process (`actors-cli serve --role all`, run from that side's code), the
client in this process. Rounds alternate the sides (A B, then B A, ...), so both see the
same minutes of a host whose speed drifts; figures are medians over rounds.

Per side and round, after 5 warm-up workflows:

* **Counts** (`--runs` 3-step python workflows, one at a time): messages stored per
  workflow in each stream (the growth of each stream's last sequence: a work queue's
  message counts though it is deleted once done; leases, KV owners, are shown apart),
  and fsyncs per workflow by what they wrote, from the lines the server's `strace -y`
  wrote during this pass (the server runs under strace from its start, with a seccomp
  filter that stops it only at fsyncs: bench/peers/fsync.py). *On the write path*: a
  stream's message blocks (or, on a cluster, its raft log), one fsync per stored
  message and per work-queue delete; *background*: consumer state (each consumer's
  acks, flushed at most every 100 ms whatever the load, never before a PubAck), leases
  (a pod's partition leases, renewed every few seconds) and the cluster's meta log.
* **Latency**: `--runs` 3-step workflows one at a time, start to terminal status, p50
  and p99. With `--fsync-delay-ms` every fsync of the server is slowed by that much
  for the whole run (the counts pass too, which then sees a little more background),
  with strace's fault injection, on both sides: the latency of many cloud disks. The
  tracer itself adds ~0.1 ms to each fsync, and nothing to other system calls.
* **Chain**: one execution of `--chain` python steps; messages stored per step, and ms
  per step (the median of 3).
* **Concurrent**: `--concurrent` 3-step workflows at once, workflows per second.

`--cluster`: the same on a 3-node cluster on this machine, every stream and bucket R3,
each node with `sync_interval: always` (for a replicated stream the server flushes its
raft log instead of each message block: a stored message is a quorum write), every node
under strace, fsyncs counted (and slowed) on all three.

`--exec-streams N`: this checkout's pod spreads the executions' logs over N streams
(ACTORS_EXEC_STREAMS; partitions: 8, or N if more); the baseline's keeps one. So
`--baseline HEAD --exec-streams 4` runs 4 streams against 1 on the same code, alternating.

`--sync default`: the servers with their default sync (every 2 minutes) instead, for the
latency and rate figures of a default deployment against a baseline (the fsync counts
then are the background ones only).

Prints a table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from actors.client import Client
from actors.pod.roles import connect
from bench.common import chain_playbook, checkout_of
from bench.peers.fsync import STRACE, FsyncTrace
from streams.layout import Layout
from streams.server import SYNC_ALWAYS, SYNC_MODES, NatsCluster, NatsServer
from tests.support.pods import PodProcess

ROOT = Path(__file__).resolve().parents[1]
WARM = 5
TIMEOUT = 120.0


# --- one side: a server and a pod run from some checkout's code --------------------------


_SYNCED = re.compile(r"f(?:data)?sync\(\d+<([^>]*)>")


def fsyncs_by_file(trace: str) -> Counter[str]:
    """What each fsync flushed, by class: `<STREAM> messages` (a stream's message
    blocks), `stream raft logs` (on a cluster: a replicated stream's log, where a
    stored message is appended before it is acknowledged), `consumer state` (a
    consumer's file, or its raft log), `leases` (KV owners), `cluster meta` (the
    cluster's own raft log: assignments, leaders), `other`."""
    out: Counter[str] = Counter()
    for line in trace.splitlines():
        m = _SYNCED.search(line)
        if m is None:
            continue
        path = m.group(1)
        raft = re.search(r"/_js_/(S-|C-|_meta_)", path)
        if raft is not None:
            out[{"S-": "stream raft logs", "C-": "consumer state", "_meta_": "cluster meta"}[raft.group(1)]] += 1
            continue
        stream = re.search(r"/streams/([^/]+)/(msgs|obs)/", path)
        if stream is None:
            out["other"] += 1
        elif stream.group(2) == "obs":
            out["consumer state"] += 1
        elif stream.group(1) == "KV_owners":
            out["leases"] += 1
        else:
            out[f"{stream.group(1)} messages"] += 1
    return out


BACKGROUND = ("consumer state", "leases", "cluster meta", "other")
BACKGROUND_STREAMS = ("KV_owners",)  # leases, renewed on a timer whatever the load


async def last_seqs(client: Client) -> dict[str, int]:
    return {s.config.name or "": s.state.last_seq for s in await client.nc.jsm().streams_info()}


async def settled(client: Client) -> dict[str, int]:
    """Every stream's last sequence once nothing has been stored for 200 ms (the
    projector's index entries land just after the status the client waits for)."""
    seqs = await last_seqs(client)
    while True:
        await asyncio.sleep(0.2)
        again = await last_seqs(client)
        if again == seqs:
            return seqs
        seqs = again


def per(after: dict[str, int], before: dict[str, int], n: int) -> dict[str, float]:
    return {k: round((v - before.get(k, 0)) / n, 2) for k, v in sorted(after.items()) if v != before.get(k, 0)}


async def measure(code: Path, args: argparse.Namespace, say: Callable[[str], None], name: str) -> dict[str, Any]:
    replicas = 3 if args.cluster else 1
    pod: PodProcess | None = None
    with tempfile.TemporaryDirectory(prefix=f"bench-writes-{name}-") as tmp:
        # the server(s) under strace from the start: counts, and --fsync-delay-ms
        trace = FsyncTrace(Path(tmp) / "strace", delay_ms=args.fsync_delay_ms, paths=True)
        servers: NatsServer | NatsCluster
        if args.cluster:  # three nodes, every stream R3: each stored message a consensus round
            servers = await NatsCluster.start(3, sync=args.sync, wrap=lambda i: trace.wrap(f"node{i}"))
            pids = [n.proc.pid for n in servers.nodes if n is not None]
        else:
            servers = await NatsServer.start(sync=args.sync, wrap=trace.wrap("nats"))
            pids = [servers.proc.pid]
        try:
            trace.check(pids)
            streams = args.exec_streams if name == "new" else 1  # the baseline's pod: one stream
            layout = Layout(replicas=replicas, partitions=max(8, streams), exec_streams=streams)
            pod = await PodProcess.start("all", url=servers.url, layout=layout, logs=Path(tmp), name="pod", code=code)
            await pod.ready(timeout=120)
            nc = await connect(servers.url, name="bench-writes")
            client = Client(nc, layout=layout)
            entries = {}
            for steps in (3, args.chain):
                pb = Path(tmp) / f"chain{steps}.yaml"
                pb.write_text(chain_playbook(f"writes_chain{steps}", steps, "python"))
                entries[steps] = await client.register(pb)

            async def run(steps: int) -> float:
                e = entries[steps]
                t0 = time.perf_counter()
                eid, st = await client.run(e.path, version=e.version, payload={"i": 0}, timeout=TIMEOUT)
                took = time.perf_counter() - t0
                if st.state != "COMPLETED":
                    raise RuntimeError(f"{name}: execution {eid} ended {st.state}")
                return took

            for _ in range(WARM):
                await run(3)
            out: dict[str, Any] = {}

            # counts: the streams' growth, and the lines strace wrote meanwhile
            before = await settled(client)
            since = trace.mark()
            for _ in range(args.runs):
                await run(3)
            after = await settled(client)
            synced = fsyncs_by_file(trace.text(since))
            out["stored_per_workflow"] = per(after, before, args.runs)
            out["stored_per_workflow_total"] = round(
                sum(v for k, v in out["stored_per_workflow"].items() if k not in BACKGROUND_STREAMS), 2
            )
            out["fsyncs_per_workflow"] = {k: round(v / args.runs, 2) for k, v in sorted(synced.items())}
            out["fsyncs_write_path"] = round(sum(v for k, v in synced.items() if k not in BACKGROUND) / args.runs, 2)
            out["fsyncs_background"] = round(sum(v for k, v in synced.items() if k in BACKGROUND) / args.runs, 2)

            lat = [await run(3) for _ in range(args.runs)]
            out["p50_ms"] = round(statistics.median(lat) * 1000, 2)
            out["p99_ms"] = round(sorted(lat)[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2)

            before = await settled(client)
            chain = [await run(args.chain)]
            after = await settled(client)
            chained = per(after, before, args.chain)
            out["stored_per_chain_step"] = round(sum(v for k, v in chained.items() if k not in BACKGROUND_STREAMS), 2)
            chain += [await run(args.chain) for _ in range(2)]
            out["chain_ms_per_step"] = round(statistics.median(chain) * 1000 / args.chain, 3)

            t0 = time.perf_counter()
            await asyncio.gather(*(run(3) for _ in range(args.concurrent)))
            out["concurrent_per_s"] = round(args.concurrent / (time.perf_counter() - t0), 1)
            await nc.close()
            say(
                f"  {name}: {out['stored_per_workflow_total']} stored, {out['fsyncs_write_path']}+"
                f"{out['fsyncs_background']} fsyncs per workflow; p50 {out['p50_ms']} ms; "
                f"chain {out['chain_ms_per_step']} ms/step; {out['concurrent_per_s']}/s at once"
            )
            return out
        finally:
            if pod is not None:
                await pod.stop()
            await servers.stop()  # and with them their strace


# --- the two sides, alternating -----------------------------------------------------------


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over rounds (per-stream and per-file maps key by key)."""
    out: dict[str, Any] = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        if isinstance(values[0], dict):
            names = sorted({k for v in values for k in v})
            out[key] = {n: round(statistics.median(v.get(n, 0) for v in values), 2) for n in names}
        else:
            out[key] = round(statistics.median(values), 3)
    return out


ROWS = (
    ("stored messages per 3-step workflow", "stored_per_workflow_total"),
    ("fsyncs per workflow, write path", "fsyncs_write_path"),
    ("fsyncs per workflow, background", "fsyncs_background"),
    ("stored messages per chain step", "stored_per_chain_step"),
    ("3-step one by one, p50 ms", "p50_ms"),
    ("3-step one by one, p99 ms", "p99_ms"),
    ("chain, ms per step", "chain_ms_per_step"),
    ("at once, workflows per s", "concurrent_per_s"),
)


async def main_async(args: argparse.Namespace, sides: dict[str, Path], head: str) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        say(f"round {r + 1} of {args.rounds}")
        for name in order:
            results[name].append(await measure(sides[name], args, say, name))
    medians = {name: median_of(rs) for name, rs in results.items()}
    say("")
    say(
        f"{'3-node R3 cluster, ' if args.cluster else ''}sync {args.sync}"
        f"{f', every fsync +{args.fsync_delay_ms} ms' if args.fsync_delay_ms else ''}"
        f"{f', new: {args.exec_streams} streams of logs' if args.exec_streams > 1 else ''}; "
        f"medians of {args.rounds} rounds; {args.runs} one by one, chain of {args.chain}, {args.concurrent} at once"
    )
    cols = list(medians)
    say(f"{'':40}" + "".join(f"{c:>12}" for c in cols) + (f"{'new/old':>10}" if "old" in medians else ""))
    for label, key in ROWS:
        line = f"{label:40}" + "".join(f"{medians[c][key]:>12}" for c in cols)
        if "old" in medians and medians["old"][key]:
            line += f"{medians['new'][key] / medians['old'][key]:>10.2f}"
        say(line)
    for c in cols:
        say(f"{c}: stored per workflow by stream {medians[c]['stored_per_workflow']}")
        say(f"{c}: fsyncs per workflow by file {medians[c]['fsyncs_per_workflow']}")
    return {
        "bench": "writes",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "head": head,
        "baseline": args.baseline,
        "sync": args.sync,
        "fsync_delay_ms": args.fsync_delay_ms,
        "cluster": args.cluster,
        "exec_streams": args.exec_streams,
        "rounds": args.rounds,
        "runs": args.runs,
        "chain": args.chain,
        "concurrent": args.concurrent,
        "medians": medians,
        "rounds_raw": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--baseline", help="an earlier commit to run alternating with this checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=40, help="3-step workflows one at a time, per pass")
    parser.add_argument("--chain", type=int, default=50, help="steps of the chain")
    parser.add_argument("--concurrent", type=int, default=200, help="3-step workflows at once")
    parser.add_argument("--fsync-delay-ms", type=float, default=0.0, help="slow every fsync of the server by this")
    parser.add_argument("--cluster", action="store_true", help="a 3-node R3 cluster (fsyncs of all three)")
    parser.add_argument(
        "--sync",
        choices=SYNC_MODES,
        default=SYNC_ALWAYS,
        help="the servers' sync_interval: always (the default here: what the counts are for) or default",
    )
    parser.add_argument(
        "--exec-streams",
        type=int,
        default=1,
        help="streams of executions' logs, this checkout's pod",
    )
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if min(args.rounds, args.runs, args.chain, args.concurrent, args.exec_streams) < 1 or args.fsync_delay_ms < 0:
        parser.error("counts must be at least 1 and the delay not negative")
    if not os.access(STRACE, os.X_OK):
        parser.error(f"{STRACE} is needed (fsync counts; Debian package strace)")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    with checkout_of(args.baseline) as old:
        sides = {"new": ROOT, **({"old": old} if old is not None else {})}
        result = uvloop.run(main_async(args, sides, head.stdout.strip()))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
