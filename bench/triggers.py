"""Trigger throughput: messages on a stream subject turned into started (and completed)
executions per second, against a raw JetStream publish+consume of the same messages in
the same run, on the same server.

    python -m bench.triggers [--n 2000] [--sync default|always] [--json-only]

What it does (everything in this process on uvloop, against its own nats-server):

1. Raw baseline: `n` messages published pipelined (256 in flight) to a stream of their
   own, read by a durable push consumer with explicit acks in this process; rate = n /
   (first publish -> last message acked).
2. Triggers: the roles engine, tools, projector and trigger run in this process; a
   trigger on `bench.in.>` of stream BENCHIN starts a one-step `noop` playbook with a
   payload template over the message (`{"order": "{{ message.data.id }}", "seq":
   "{{ message.seq }}"}`). The same `n` messages are published the same way; timed from
   the first publish to: every start stored in stream START (`queued`: the trigger
   pods' own work, each message rendered, published, acked), every start record written
   by the starters (`started`: the executions exist), every execution ended
   (`completed`: the projector wrote its end to stream ENDED). Each is checked: exactly
   `n` start records under the ids `trg-bench-<seq>`.
3. Prints a few lines and, as its last line, one JSON object: the rates (messages per
   second) and their ratios to raw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from actors.client import Client
from actors.natsio import MSG_ID, publisher
from actors.pod.roles import connect, start_roles
from actors.triggers.actor import TriggerActor
from bench.common import add_sync_flag, start_server
from bench.step_latency import nats_server_version
from streams.layout import ENDED_STREAM, EXEC_STREAM, START_STREAM, STARTER_CONSUMER, Layout
from tests.support.natsio import stored_starts

PLAYBOOK = """apiVersion: actors/v1
kind: Playbook
metadata: {name: bench_trigger, path: bench/trigger}
workflow:
  - step: take
    tool: {kind: noop}
    args: {order: "{{ workload.order }}"}
"""
IN_FLIGHT = 256  # publishes awaiting their PubAck at once, both runs
POLL = 0.02  # seconds between two looks at the streams' counts (the marks' resolution)


async def publish_all(nc: NATS, subject: str, n: int, tag: str) -> None:
    """`n` JSON messages on `subject`, IN_FLIGHT at a time (each with a Nats-Msg-Id)."""
    pub = publisher(nc)
    for first in range(0, n, IN_FLIGHT):
        batch = [
            (subject, json.dumps({"id": f"o{i}"}).encode(), {MSG_ID: f"{tag}-{i}"})
            for i in range(first, min(n, first + IN_FLIGHT))
        ]
        await pub.send(batch)


async def raw(nc: NATS, n: int) -> float:
    """Seconds from the first publish to the last of `n` messages acked by a push consumer."""
    js = nc.jetstream()
    await js.add_stream(api.StreamConfig(name="RAWIN", subjects=["raw.in.>"]))
    got = 0
    done = asyncio.Event()

    async def on(msg: Msg) -> None:
        nonlocal got
        await msg.ack()
        got += 1
        if got >= n:
            done.set()

    sub = await js.subscribe(
        "raw.in.>",
        durable="raw-in",
        stream="RAWIN",
        cb=on,
        manual_ack=True,
        config=api.ConsumerConfig(max_ack_pending=4096),
    )
    began = time.perf_counter()
    await publish_all(nc, "raw.in.x", n, "raw")
    await asyncio.wait_for(done.wait(), 300)
    took = time.perf_counter() - began
    await sub.unsubscribe()
    return took


async def count(nc: NATS, stream: str) -> int:
    """Messages ever stored in `stream` (its last sequence: START is a work queue)."""
    return int((await nc.jsm().stream_info(stream)).state.last_seq)


async def until(what: str, predicate: Any, began: float, timeout: float = 600) -> float:
    """Seconds from `began` until `predicate()` holds (looked at every POLL seconds)."""
    deadline = time.perf_counter() + timeout
    while not await predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:g} s")
        await asyncio.sleep(POLL)
    return time.perf_counter() - began


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n
    server = await start_server(sync=args.sync)
    nc = await connect(server.url, name="bench")
    layout = Layout(partitions=4)
    runtime = await start_roles(nc, layout=layout, roles=("engine", "tools", "projector", "trigger"))
    try:
        client = Client(nc, layout=layout)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trigger.yaml"
            path.write_text(PLAYBOOK)
            playbook = (await client.register(path)).path
        raw_s = await raw(nc, n)

        js = nc.jetstream()
        await js.add_stream(api.StreamConfig(name="BENCHIN", subjects=["bench.in.>"]))
        template = {"order": "{{ message.data.id }}", "seq": "{{ message.seq }}"}
        await client.trigger_add("bench", subject="bench.in.>", stream="BENCHIN", playbook=playbook, payload=template)
        (pod,) = [a for a in runtime.actors if isinstance(a, TriggerActor)]

        async def reading() -> bool:
            return "bench" in pod.triggers()

        await until("the trigger read", reading, time.perf_counter())
        starts0, ended0 = await count(nc, START_STREAM), await count(nc, ENDED_STREAM)

        async def queued() -> bool:
            return await count(nc, START_STREAM) - starts0 >= n

        async def started() -> bool:
            if not await queued():
                return False
            info = await nc.jsm().consumer_info(START_STREAM, STARTER_CONSUMER)
            return info.ack_floor.stream_seq >= starts0 + n and not info.num_ack_pending

        async def completed() -> bool:
            return await count(nc, ENDED_STREAM) - ended0 >= n

        began = time.perf_counter()
        await publish_all(nc, "bench.in.x", n, "trg")
        published_s = time.perf_counter() - began
        queued_s = await until("every start stored", queued, began)
        started_s = await until("every start record written", started, began)
        completed_s = await until("every execution ended", completed, began)

        # a start record, or (semantics 6) the start stored with its first decision: the
        # noop playbook's whole run is then that one message
        starts = await stored_starts(nc, "trg-bench-", stream=EXEC_STREAM)
        if len(starts) != n or set(starts.values()) != {1}:
            raise SystemExit(f"expected {n} starts trg-bench-*, one each, found {sum(starts.values())}")
    finally:
        await runtime.stop(drain_timeout=0)
        await nc.close()
        await server.stop()

    def rate(seconds: float) -> float:
        return round(n / seconds, 1)

    raw_rate = rate(raw_s)
    return {
        "bench": "triggers",
        "n": n,
        "sync": args.sync,
        "raw_msgs_per_s": raw_rate,
        "published_msgs_per_s": rate(published_s),
        "queued_per_s": rate(queued_s),
        "started_per_s": rate(started_s),
        "completed_per_s": rate(completed_s),
        "ratio_started": round(rate(started_s) / raw_rate, 3),
        "ratio_completed": round(rate(completed_s) / raw_rate, 3),
        "python": platform.python_version(),
        "nats_server": nats_server_version(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="messages per run (default 2000)")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    add_sync_flag(parser)
    args = parser.parse_args(argv)
    result = uvloop.run(main_async(args))
    if not args.json_only:
        print(
            f"raw publish+consume {result['raw_msgs_per_s']:,.0f} msg/s; triggers: stored starts "
            f"{result['queued_per_s']:,.0f}/s, started {result['started_per_s']:,.0f}/s "
            f"({result['ratio_started']:.2f}x raw), completed {result['completed_per_s']:,.0f}/s "
            f"({result['ratio_completed']:.2f}x raw)",
            file=sys.stderr,
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
