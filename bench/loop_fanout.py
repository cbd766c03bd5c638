"""Loop fan-out throughput and memory against raw JetStream, same server, same run.

    python -m bench.loop_fanout [--sizes 1000,10000,100000] [--tools noop,python] [--concurrency 500]
                                [--rounds 1] [--sync always]

One nats-server (file store, temporary dir; `--sync always`: fsync before each PubAck)
for the whole run. For each size N, in
this order, each in a fresh child process (so peak RSS is that run's own):

1. raw: the message path of a loop iteration with no engine logic. A "counter" keeps
   `concurrency` commands in flight on a work-queue stream (``js.publish`` with a
   ``Nats-Msg-Id``, pipelined); a "worker" pulls them in batches, acks each and
   publishes a result to a limits stream; the "counter" receives results from a durable
   push consumer (explicit ack, queue group), acks, and releases the next command.
   Also a plain publish-then-consume of N messages (one stream, pipelined publishes,
   then a push consumer with acks) as a second, simpler baseline. Both print msgs/s.
2. loop: every actor in the child (engine, counter, tools, projector, as
   ``actors-cli run`` does, with the pod's GC settings: ``tune_gc``); a playbook with one loop
   step of N iterations in ``async`` mode (``tool`` noop or python ``def main(i): return i``), then a step reading
   ``{{ fan | length }}``. Wall time is ``Client.start`` -> terminal status in KV;
   iterations/s = N / wall. It reports the CPU time the child spent per iteration
   (``cpu_us_per_iteration``: every actor runs in that one process, so this is what an
   iteration costs the client side, the python pool's worker processes aside; steadier
   than wall time on a busy machine), the CPU its child processes (the python pool's
   workers) and nats-server spent per iteration (``workers_cpu_us_per_iteration``,
   ``server_cpu_us_per_iteration``, from /proc), the execution log's event count, the peak
   RSS of the child (``ru_maxrss``) and its RSS before the run.

Figures: iterations/s as a ratio of the raw round-trip rate at the same N
(``ratio_vs_raw_roundtrip``) and of the plain publish+consume rate
(``ratio_vs_raw_pubsub``). The raw runs use nats-py as it comes; they run a second time
on a connection reading with the actors' protocol reader (actors/natsio/reader.py, which
every actor connection uses), and ``ratio_vs_raw_pubsub_reader`` is the loop's rate
against that faster raw publish+consume. ``--rounds R`` runs raw and the loops R times per size,
alternating, and also reports each figure's median over the rounds (``medians``): on a
host whose speed drifts, one raw run measured before the loops makes a noisy ratio. The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import add_sync_flag, start_server

ROOT = Path(__file__).resolve().parent.parent  # the repository


def rss_mb() -> float:
    """Current RSS of this process, from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(exclude: int) -> list[int]:
    """Pids of this process's children (the python pool's workers), `exclude` aside."""
    me, found = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != exclude:
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return found


# --- child: raw baselines --------------------------------------------------------------


async def raw(url: str, n: int, concurrency: int, *, reader: bool = False) -> dict[str, float]:
    from nats.aio.client import Client as NATS
    from nats.js import api

    from actors.natsio.reader import install_reader

    nc = install_reader(NATS()) if reader else NATS()
    await nc.connect(url)
    js = nc.jetstream()
    tag = f"{n}x{int(time.time() * 1000) % 10**8}{'r' if reader else ''}"
    cmd_stream, res_stream = f"RAWC{tag}", f"RAWR{tag}"
    await js.add_stream(
        api.StreamConfig(name=cmd_stream, subjects=[f"rawc{tag}.>"], retention=api.RetentionPolicy.WORK_QUEUE)
    )
    await js.add_stream(api.StreamConfig(name=res_stream, subjects=[f"rawr{tag}.>"]))
    await js.add_consumer(
        cmd_stream,
        api.ConsumerConfig(durable_name="w", ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=concurrency * 2),
    )
    await js.add_consumer(
        res_stream,
        api.ConsumerConfig(
            durable_name="c",
            deliver_subject=f"_rawdeliver{tag}",
            deliver_group="c",
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=concurrency * 4,
        ),
    )
    done = asyncio.Event()
    state = {"sent": 0, "got": 0}

    async def send() -> None:
        i = state["sent"]
        state["sent"] += 1
        await js.publish(f"rawc{tag}.{i}", b'{"i": %d}' % i, headers={"Nats-Msg-Id": f"c{i}"})

    async def on_result(msg: Any) -> None:
        await msg.ack()
        state["got"] += 1
        if state["got"] == n:
            done.set()
        elif state["sent"] < n:
            await send()

    sub = await nc.subscribe(f"_rawdeliver{tag}", queue="c", cb=on_result, pending_msgs_limit=-1)
    psub = await js.pull_subscribe_bind(durable="w", stream=cmd_stream)

    async def worker() -> None:
        while not done.is_set():
            try:
                msgs = await psub.fetch(concurrency, timeout=1)
            except Exception:
                continue

            async def one(m: Any) -> None:
                await js.publish(
                    f"rawr{tag}.{m.subject.rsplit('.', 1)[1]}", m.data, headers={"Nats-Msg-Id": f"r{m.subject}"}
                )
                await m.ack()

            await asyncio.gather(*(one(m) for m in msgs))

    t0 = time.perf_counter()
    w = asyncio.create_task(worker())
    await asyncio.gather(*(send() for _ in range(min(concurrency, n))))
    await done.wait()
    roundtrip = n / (time.perf_counter() - t0)
    w.cancel()
    await sub.unsubscribe()

    # plain publish then consume
    ps = f"RAWP{tag}"
    await js.add_stream(api.StreamConfig(name=ps, subjects=[f"rawp{tag}.>"]))
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        futs = [
            await js.publish_async(f"rawp{tag}.{i}", b'{"i": %d}' % i, headers={"Nats-Msg-Id": f"p{i}"})
            for i in range(start, min(n, start + 1000))
        ]
        await asyncio.gather(*futs)
    got = asyncio.Event()
    count = {"n": 0}

    async def on_msg(msg: Any) -> None:
        await msg.ack()
        count["n"] += 1
        if count["n"] == n:
            got.set()

    await js.add_consumer(
        ps,
        api.ConsumerConfig(
            durable_name="p",
            deliver_subject=f"_rawp{tag}",
            deliver_group="p",
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=concurrency * 4,
        ),
    )
    sub = await nc.subscribe(f"_rawp{tag}", queue="p", cb=on_msg, pending_msgs_limit=-1)
    await got.wait()
    pubsub = n / (time.perf_counter() - t0)
    await sub.unsubscribe()
    for s in (cmd_stream, res_stream, ps):
        await js.delete_stream(s)
    await nc.close()
    suffix = "_reader" if reader else ""
    return {f"raw_roundtrip_msgs_s{suffix}": roundtrip, f"raw_pubsub_msgs_s{suffix}": pubsub}


# --- child: the loop -------------------------------------------------------------------


PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: fanout_%(tool)s}
workflow:
  - step: fan
    tool: %(tool_yaml)s
    args: {i: "{{ i }}"}
    loop: {collection: "{{ range(workload.n) | list }}", element: i, mode: async, concurrency: %(conc)d}
    next: count
  - step: count
    args: {n: "{{ fan | length }}"}
"""
TOOLS = {"noop": "{kind: noop}", "python": '{kind: python, code: "def main(i): return i"}'}


async def loop(url: str, n: int, tool: str, concurrency: int, server_pid: int) -> dict[str, Any]:
    from actors.client import Client
    from actors.pod.roles import connect, start_roles, tune_gc
    from streams.layout import Layout

    layout = Layout()
    nc = await connect(url)
    rt = await start_roles(nc, layout=layout)
    tune_gc()  # as a pod does once its roles run (`actors-cli serve`)
    client = Client(nc, layout=layout)
    with tempfile.TemporaryDirectory() as d:
        pb = Path(d) / f"fanout_{tool}.yaml"
        pb.write_text(PLAYBOOK % {"tool": tool, "tool_yaml": TOOLS[tool], "conc": concurrency})
        entry = await client.register(pb)
    base = rss_mb()
    workers = children(server_pid)
    w0, s0 = sum(cpu_s(p) for p in workers), cpu_s(server_pid)
    t0, c0 = time.perf_counter(), time.process_time()
    eid = await client.start(entry.path, payload={"n": n})
    status = await client.wait(eid, timeout=3600)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    w1, s1 = sum(cpu_s(p) for p in workers), cpu_s(server_pid)
    items = await client.events(eid)
    result = None
    for it in items:
        if it.type == "playbook.completed":
            result = await client.result(it)
    assert status.state == "COMPLETED" and result == {"count": {"n": n}}, (status, result)
    await rt.stop()
    await nc.close()
    return {
        "wall_s": wall,
        "iterations_s": n / wall,
        "cpu_us_per_iteration": cpu / n * 1e6,
        "workers_cpu_us_per_iteration": (w1 - w0) / n * 1e6,
        "server_cpu_us_per_iteration": (s1 - s0) / n * 1e6,
        "log_events": len(items),
        "rss_before_mb": base,
        "rss_peak_mb": peak_rss_mb(),
    }


# --- parent ----------------------------------------------------------------------------


def child(args: list[str], module: str = "bench.loop_fanout") -> dict[str, Any]:
    """Run `python -m module` with `args` in a fresh interpreter, from the repository (so
    `bench` imports); its last line is its JSON result."""
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--tools", default="noop,python")
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument(
        "--rounds", type=int, default=1, help="raw and loop runs alternated this many times per size; medians"
    )
    add_sync_flag(ap)
    ap.add_argument("--child", choices=["raw", "loop"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tool", help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    import uvloop

    if a.child == "raw":

        async def both() -> dict[str, float]:
            return {
                **await raw(a.url, a.n, a.concurrency),
                **await raw(a.url, a.n, a.concurrency, reader=True),
            }

        print(json.dumps(uvloop.run(both())))
        return 0
    if a.child == "loop":
        print(json.dumps(uvloop.run(loop(a.url, a.n, a.tool, a.concurrency, a.server_pid))))
        return 0

    from streams.server import NatsServer

    async def serve() -> NatsServer:
        return await start_server(sync=a.sync)

    server = asyncio.run(serve())
    rows: list[dict[str, Any]] = []
    try:
        for n, rnd in [(int(x), r) for x in a.sizes.split(",") for r in range(a.rounds)]:
            base = child(["--child", "raw", "--url", server.url, "--n", str(n), "--concurrency", str(a.concurrency)])
            for tool in a.tools.split(","):
                r = child(
                    [
                        "--child",
                        "loop",
                        "--url",
                        server.url,
                        "--n",
                        str(n),
                        "--tool",
                        tool,
                        "--concurrency",
                        str(a.concurrency),
                        "--server-pid",
                        str(server.proc.pid),
                    ]
                )
                row = {
                    "n": n,
                    "tool": tool,
                    "round": rnd,
                    **r,
                    **base,
                    "ratio_vs_raw_roundtrip": r["iterations_s"] / base["raw_roundtrip_msgs_s"],
                    "ratio_vs_raw_pubsub": r["iterations_s"] / base["raw_pubsub_msgs_s"],
                    "ratio_vs_raw_pubsub_reader": r["iterations_s"] / base["raw_pubsub_msgs_s_reader"],
                }
                rows.append(row)
                print(
                    f"{n:>7} {tool:6}  {r['iterations_s']:>8,.0f} it/s  wall {r['wall_s']:6.2f} s  "
                    f"cpu {r['cpu_us_per_iteration']:4.0f} us/it (workers {r['workers_cpu_us_per_iteration']:3.0f}, "
                    f"nats-server {r['server_cpu_us_per_iteration']:3.0f})  "
                    f"raw rt {base['raw_roundtrip_msgs_s']:>8,.0f}/s  ratio {row['ratio_vs_raw_roundtrip']:.2f}  "
                    f"raw pub+sub {base['raw_pubsub_msgs_s']:>8,.0f}/s  ratio {row['ratio_vs_raw_pubsub']:.2f}  "
                    f"(with our reader {base['raw_pubsub_msgs_s_reader']:>8,.0f}/s  "
                    f"ratio {row['ratio_vs_raw_pubsub_reader']:.2f})  "
                    f"log events {r['log_events']}  rss {r['rss_before_mb']:.0f}->{r['rss_peak_mb']:.0f} MB",
                    flush=True,
                )
    finally:
        asyncio.run(server.stop())
    medians = _medians(rows)
    if a.rounds > 1:
        print(f"medians of {a.rounds} rounds (each against its own raw run):")
        for m in medians:
            print(
                f"{m['n']:>7} {m['tool']:6}  {m['iterations_s']:>8,.0f} it/s  "
                f"ratio {m['ratio_vs_raw_roundtrip']:.2f} of raw round trips  "
                f"{m['ratio_vs_raw_pubsub']:.2f} of raw pub+sub "
                f"({m['ratio_vs_raw_pubsub_reader']:.2f} of it with our reader)",
                flush=True,
            )
    print(
        json.dumps(
            {
                "bench": "loop_fanout",
                "python": platform.python_version(),
                "cores": _cores(),
                "concurrency": a.concurrency,
                "sync": a.sync,
                "rounds": a.rounds,
                "rows": rows,
                "medians": medians,
            }
        )
    )
    return 0


def _medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size and tool, the median over rounds of its rate and of its ratios (each
    round's ratio is against the raw run just before it: the host's drift cancels)."""
    keys = ("iterations_s", "ratio_vs_raw_roundtrip", "ratio_vs_raw_pubsub", "ratio_vs_raw_pubsub_reader")
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["n"], row["tool"]), []).append(row)
    return [
        {"n": n, "tool": tool, **{k: statistics.median(r[k] for r in group) for k in keys}}
        for (n, tool), group in groups.items()
    ]


def _cores() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    raise SystemExit(main())
