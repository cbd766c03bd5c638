"""A flood of starts of long-running executions: how fast it is absorbed, and what each
open execution costs in memory, with and without a bound on resident actors.

    python -m bench.flood [--n 20000] [--caps 50000,1000]

One nats-server (file store, temporary dir) for the whole run; every measurement in a
fresh child process, so its peak RSS is its own.

1. raw: the message path with no engine logic, from bench/loop_fanout.py (``raw``):
   round trips through a work-queue stream and a reply stream, msgs/s.
2. flood, once per cap (``Layout.engine_max_resident``): every actor in the child (as
   ``actors-cli run`` does, with ``tune_gc``); N starts published 500 at a time through
   ``Client.start``, of a playbook whose second step sleeps for an hour. The flood is
   absorbed when every execution has issued its sleep command (N command subjects);
   each execution is then open, its engine actor either resident or evicted.
   Figures: starts absorbed/s as a ratio of raw round trips/s, RSS growth per open
   execution (KB), resident and evicted engine actors, peak RSS.

The bound trades memory for a replay when an evicted execution's next input comes
(the sleep's result here, an hour later); with the default (50,000) nothing is evicted
at N = 20,000. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loop_fanout import _cores, child, peak_rss_mb, raw, rss_mb

PLAYBOOK = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: flood}
workflow:
  - step: first
    tool: {kind: noop}
    next: nap
  - step: nap
    tool: {kind: sleep, seconds: 3600}
    next: end
"""
CHUNK = 500


async def flood(url: str, n: int, cap: int) -> dict[str, Any]:
    from actors.client import Client
    from actors.engine.actor import Engine
    from actors.pod.roles import connect, start_roles, tune_gc
    from streams.layout import CMD_STREAM, Layout, cmd_subject

    layout = Layout(engine_max_resident=cap)
    nc = await connect(url)
    rt = await start_roles(nc, layout=layout)
    tune_gc()
    engine = next(a for a in rt.actors if isinstance(a, Engine))
    client = Client(nc, layout=layout)
    with tempfile.TemporaryDirectory() as d:
        pb = Path(d) / "flood.yaml"
        pb.write_text(PLAYBOOK)
        entry = await client.register(pb)
    # absorbed: every execution has sent its sleep command (one subject per command)
    napping: set[str] = set()
    absorbed = asyncio.Event()

    async def on_command(msg: Any) -> None:
        napping.add(msg.subject)
        if len(napping) >= n:
            absorbed.set()

    watch = await nc.subscribe(cmd_subject("sleep", "*", "*"), cb=on_command, pending_msgs_limit=-1)
    base = rss_mb()
    t0 = time.perf_counter()
    for start in range(0, n, CHUNK):
        await asyncio.gather(
            *(client.start(entry.path, version=entry.version) for _ in range(start, min(n, start + CHUNK)))
        )
    published = time.perf_counter() - t0
    await absorbed.wait()
    wall = time.perf_counter() - t0
    await watch.unsubscribe()
    assert (await nc.jsm().stream_info(CMD_STREAM)).state.messages == n  # each command stored once
    out = {
        "cap": cap,
        "starts_s": n / wall,
        "publish_s": published,
        "absorbed_s": wall,
        "rss_growth_kb_per_execution": (rss_mb() - base) * 1024 / n,
        "rss_before_mb": base,
        "rss_peak_mb": peak_rss_mb(),
        "resident": len(engine.actors),
        "evicted": engine.evicted,
    }
    await rt.stop()
    await nc.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--caps", default="50000,1000")
    ap.add_argument("--child", choices=["raw", "flood"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    import uvloop

    if a.child == "raw":
        print(json.dumps(uvloop.run(raw(a.url, a.n, CHUNK))))
        return 0
    if a.child == "flood":
        print(json.dumps(uvloop.run(flood(a.url, a.n, a.cap))))
        return 0

    from streams.server import NatsServer

    async def serve() -> NatsServer:
        return await NatsServer.start()

    rows: list[dict[str, Any]] = []
    for cap in [int(x) for x in a.caps.split(",")]:
        server = asyncio.run(serve())  # a fresh store each: the previous flood's commands stay queued
        try:
            base = child(["--child", "raw", "--url", server.url, "--n", str(a.n)], module="bench.flood")
            r = child(
                ["--child", "flood", "--url", server.url, "--n", str(a.n), "--cap", str(cap)], module="bench.flood"
            )
        finally:
            asyncio.run(server.stop())
        row = {"n": a.n, **r, **base, "ratio_vs_raw_roundtrip": r["starts_s"] / base["raw_roundtrip_msgs_s"]}
        rows.append(row)
        print(
            f"cap {cap:>6}  {r['starts_s']:>7,.0f} starts/s  ratio {row['ratio_vs_raw_roundtrip']:.2f} of raw "
            f"round trips ({base['raw_roundtrip_msgs_s']:,.0f}/s)  "
            f"{r['rss_growth_kb_per_execution']:5.1f} KB per open execution  "
            f"resident {r['resident']:,}  evicted {r['evicted']:,}  "
            f"rss {r['rss_before_mb']:.0f}->{r['rss_peak_mb']:.0f} MB",
            flush=True,
        )
    print(json.dumps({"bench": "flood", "python": platform.python_version(), "cores": _cores(), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
