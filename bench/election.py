"""How long a client is refused while a stream elects a new leader, on the 3-node
loopback cluster the tests use (`streams.server.NatsCluster`, streams at R3).

    python -m bench.election [--runs 5] [--stream START]

Each run SIGKILLs the node leading `--stream`, then publishes to it (the way
`actors-cli start` does: JetStream publish, wait for the PubAck, same Nats-Msg-Id again
on a refusal or a lost PubAck) until one is acked, and brings the node back. Figures per
run: seconds from the kill until the stream names a new leader (`elected`) and until a
publish is acked (`writable`). The client's default timeout (`actors.client
.CLIENT_TIMEOUT`) is chosen from the largest `writable`. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from actors.natsio import MSG_ID, publisher
from actors.pod.roles import connect
from streams.layout import EXEC_STREAM, START_STREAM, START_SUBJECT, Layout, ensure
from streams.server import NatsCluster

# a subject of each stream that nothing consumes here (no actors run)
SUBJECTS = {START_STREAM: START_SUBJECT, EXEC_STREAM: "exec.0.election-bench.in.bench"}


async def leader(cluster: NatsCluster, stream: str, *, not_node: int | None = None) -> int | None:
    """The node leading `stream`, asked of a surviving node; None while there is none."""
    ask = next(i for i in range(cluster.n) if i != not_node)
    nc = await connect(cluster.urls[ask], name="election-probe")
    try:
        info = await nc.jsm(timeout=0.25).stream_info(stream)  # unanswered while electing
        name = info.cluster.leader if info.cluster is not None else None
        return int(name.removeprefix("node")) if name else None
    except Exception:
        return None
    finally:
        await nc.close()


async def one_run(cluster: NatsCluster, stream: str, run: int) -> dict[str, float]:
    victim = await leader(cluster, stream)
    assert victim is not None
    survivor = cluster.urls[(victim + 1) % cluster.n]
    nc = await connect(survivor, name="election-bench")  # on a node that lives: only the election is measured
    try:
        pub = publisher(nc)
        await pub.send([(SUBJECTS[stream], b"{}", {MSG_ID: f"bench-warm-{run}"})])
        killed = time.monotonic()
        cluster.kill(victim)
        elected: float | None = None

        async def watch() -> None:
            nonlocal elected
            while elected is None:
                new = await leader(cluster, stream, not_node=victim)
                if new is not None and new != victim:
                    elected = time.monotonic() - killed
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        await pub.send([(SUBJECTS[stream], b"{}", {MSG_ID: f"bench-{run}"})], budget=60.0)
        writable = time.monotonic() - killed
        await asyncio.wait_for(watcher, 30)
        assert elected is not None
    finally:
        await nc.close()
    await cluster.restart(victim)
    await asyncio.sleep(2.0)  # let it catch up before the next run kills a leader again
    return {"elected": round(elected, 2), "writable": round(writable, 2)}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stream", default=START_STREAM, choices=sorted(SUBJECTS))
    args = ap.parse_args()
    cluster = await NatsCluster.start(3)
    try:
        nc = await connect(cluster.url, name="election-setup")
        await ensure(nc.jetstream(), Layout(partitions=4, replicas=3))
        await nc.close()
        runs = []
        for run in range(args.runs):
            runs.append(await one_run(cluster, args.stream, run))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        await cluster.stop()
    writable = [r["writable"] for r in runs]
    print(
        json.dumps(
            {
                "stream": args.stream,
                "runs": runs,
                "writable_max": max(writable),
                "writable_median": statistics.median(writable),
                "elected_max": max(r["elected"] for r in runs),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
