"""`list --limit 50` at 1k, 10k and 100k executions: the INDEX stream read backwards
against a scan of the whole status bucket.

    python -m bench.list [--sizes 1000,10000,100000] [--repeat 15]

One nats-server (file store, temporary dir). The executions are made by writing what
the projector would have written, directly: each execution's entry in stream INDEX
(`index.start.<id>`, with its Nats-Msg-Id), its status in KV `status` (a JetStream
publish to the bucket's subject) and its final status in ENDED (`index.end.<state>.<id>`),
pipelined, 5,000 at a time; 1% of them FAILED, ten playbooks,
start times one second apart. The bucket grows from one size to the next.

At each size, medians over `--repeat` runs, in ms:
* `index`: `Client.list(limit=50)` (what `actors-cli list` calls);
* `index_failed`: `Client.list(state="FAILED", limit=50)`, a filter that matches 1%
  (about 5,000 executions back): the server picks the FAILED entries out of ENDED;
* `index_playbook`: `Client.list(playbook=..., limit=50)`, a filter that matches 10%,
  read from the start entries with a status read each;
* `scan`: the baseline, what a user without `list` does: read every status in the
  bucket (an ordered consumer over it), sort by start time, keep 50;
* `kv_get`: one status read, the smallest round trip;
* `cli`: `actors-cli list --limit 50 --json`, a whole process, once; `cli_status`:
  `actors-cli status ID --json`, the same process start, connection and set-up
  around one status read, once.
Ratios: `index` as a share of `scan` and in KV gets, `cli` over `cli_status`. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository


CHUNK = 5000


async def grow(nc: Any, start: int, stop: int, t0: float) -> None:
    """Executions start..stop-1, as the projector writes them: index entry, status, then
    (they are all finished) the final status's index entry."""
    from actors.natsio import MSG_ID, publisher
    from actors.wire.events import ExecState
    from actors.wire.messages import ExecutionStatus, IndexEntry, encode
    from streams import ids
    from streams.layout import STATUS_BUCKET
    from streams.subjects import index_end_subject, index_subject, kv_key_subject

    pub = publisher(nc)
    for lo in range(start, stop, CHUNK):
        index, status, ends = [], [], []
        for i in range(lo, min(stop, lo + CHUNK)):
            eid, at, pb = f"bench-{i:07d}", t0 + i, f"bench/pb{i % 10}"
            state = ExecState.FAILED if i % 100 == 7 else ExecState.COMPLETED
            entry = IndexEntry(execution_id=eid, playbook=pb, version=1, started_at=at)
            st = ExecutionStatus(
                execution_id=eid, state=state, playbook=pb, version=1, started_at=at, ended_at=at + 0.5
            )
            index.append((index_subject(eid), encode(entry), {MSG_ID: ids.index_entry_id(eid)}))
            ends.append((index_end_subject(state, eid), encode(st), {MSG_ID: ids.index_end_id(eid)}))
            status.append((kv_key_subject(STATUS_BUCKET, eid), encode(st), {}))  # a KV put is this publish
        await pub.send(index)
        await pub.send(status)
        await pub.send(ends)  # after the status, as the projector does


async def scan(nc: Any, limit: int) -> list[Any]:
    """The baseline: every status in the bucket, newest `limit` by start time."""
    from actors.wire.messages import status_decoder
    from streams.layout import STATUS_BUCKET
    from streams.subjects import kv_key_subject, kv_stream

    js = nc.jetstream()
    info = await js.stream_info(kv_stream(STATUS_BUCKET))
    total = info.state.messages
    sub = await js.subscribe(kv_key_subject(STATUS_BUCKET, ">"), ordered_consumer=True, pending_msgs_limit=-1)
    out = []
    try:
        for _ in range(total):
            msg = await sub.next_msg(timeout=10)
            out.append(status_decoder.decode(msg.data))
    finally:
        await sub.unsubscribe()
    out.sort(key=lambda s: s.started_at or 0.0, reverse=True)
    return out[:limit]


async def timed(call: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def cli_ms(url: str, *args: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "actors.cli", *args],
        cwd=ROOT,
        env={**os.environ, "NATS_URL": url},
        capture_output=True,
        check=True,
    )
    return (time.perf_counter() - t) * 1000, out.stdout


async def run(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    from actors.client import Client
    from actors.pod.roles import connect
    from streams.layout import STATUS_BUCKET, Layout, ensure
    from streams.server import NatsServer

    server = await NatsServer.start()
    rows = []
    try:
        nc = await connect(server.url)
        layout = Layout()
        await ensure(nc.jetstream(), layout)
        client = Client(nc, layout=layout)
        kv = await nc.jetstream().key_value(STATUS_BUCKET)
        t0, have = time.time() - max(sizes) - 10, 0
        for n in sizes:
            t = time.perf_counter()
            await grow(nc, have, n, t0)
            made_s, have = time.perf_counter() - t, n
            newest = await client.list(limit=50)
            assert [s.execution_id for s in newest] == [f"bench-{i:07d}" for i in range(n - 1, n - 51, -1)]
            assert [s.execution_id for s in await scan(nc, 50)] == [s.execution_id for s in newest]
            failed = await client.list(state="FAILED", limit=50)
            assert len(failed) == min(50, n // 100) and all(s.state == "FAILED" for s in failed)
            index = await timed(lambda: client.list(limit=50), repeat)
            index_failed = await timed(lambda: client.list(state="FAILED", limit=50), repeat)
            index_playbook = await timed(lambda: client.list(playbook="bench/pb3", limit=50), max(3, repeat // 3))
            base = await timed(lambda: scan(nc, 50), max(3, repeat // 5))
            get = await timed(lambda: kv.get("bench-0000000"), repeat)
            cli, out = cli_ms(server.url, "list", "--limit", "50", "--json")
            assert len(out.splitlines()) == 50
            # the same process, connection and set-up, reading one status: what `list` adds is the rest
            cli_status, _ = cli_ms(server.url, "status", "bench-0000000", "--json")
            row = {
                "executions": n,
                "made_s": round(made_s, 1),
                "index_ms": round(index, 2),
                "index_failed_ms": round(index_failed, 2),
                "index_playbook_ms": round(index_playbook, 2),
                "scan_ms": round(base, 2),
                "kv_get_ms": round(get, 3),
                "cli_ms": round(cli, 1),
                "index_vs_scan": round(index / base, 4),
                "cli_status_ms": round(cli_status, 1),
                "cli_vs_cli_status": round(cli / cli_status, 2),
                "index_in_kv_gets": round(index / get, 1),
            }
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
        await nc.close()
    finally:
        await server.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    rows = asyncio.run(run([int(x) for x in a.sizes.split(",")], a.repeat))
    print(json.dumps({"bench": "list", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
