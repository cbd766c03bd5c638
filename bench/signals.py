"""The signal round trip against a raw JetStream publish+consume, same server, same run.

    python -m bench.signals [--steps 30] [--runs 3] [--sync default|always] [--json-only]

What it does (everything in this process on uvloop, against its own nats-server):

1. Raw baselines, their own streams and connection:
   * ``raw``: one awaited ``js.publish`` (with a ``Nats-Msg-Id``) to a limits stream,
     consumed by a durable push consumer with explicit ack in this process; timed from
     just before the publish to the message's arrival in the callback. The headline's
     baseline (``ratio_p50``).
   * ``chain``: bench/step_latency.py's push round trip (command -> worker -> result
     -> engine side: two publishes, two consumes), for scale (``ratio_chain_p50``): a
     signal is also two stored messages (the signal, the decision that takes it).
2. Signals: a playbook of ``steps`` wait steps in a row (``tool: {kind: wait, signal:
   go}``); the bench follows the execution's log (an ordered consumer) and, each time a
   step's ``step.waiting`` decision arrives, sends ``go`` and times from just before the
   send to the arrival of the ``signal.received`` decision (the waiting step's result)
   in the log. Sent two ways, alternating steps: ``Client.signal`` (its checks: the pods'
   features, the execution's status, then the publish; its own time and the time from
   its return, the signal's PubAck, to the step taking it are reported apart), and ``POST /hooks/go/<id>`` on a
   UI server in this process (the token's check and the body's, then the same call). One
   warm-up execution, then ``runs`` executions, each right after one raw batch of
   ``steps`` round trips of each kind (interleaved: all see the same moment).
3. Prints a small table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from actors.client import Client, log_items
from actors.natsio import MSG_ID
from actors.pod.roles import Runtime, connect, start_roles
from actors.ui.server import serve_ui
from bench.common import add_sync_flag
from bench.step_latency import PUSH, RawChain, ms, nats_server_version, pct, raw_setup
from streams.layout import EXEC_STREAM, Layout
from streams.server import NatsServer

RAW_STREAM, RAW_PREFIX, RAW_DURABLE = "RAWSIG", "rawsig", "rawsig-consumer"
WAIT_TIMEOUT = 60.0


def waits_playbook(steps: int) -> str:
    lines = ["apiVersion: actors/v1", "kind: Playbook", "metadata:", "  name: bench_signals"]
    lines += ["  path: bench/signals", "workflow:"]
    for k in range(1, steps + 1):
        lines += [f"  - step: w{k}", "    tool: {kind: wait, signal: go}", "    timeout: 120"]
        if k < steps:
            lines.append(f"    next: w{k + 1}")
    return "\n".join(lines) + "\n"


# --- raw: one publish, one consume ------------------------------------------------------


class RawRoundTrip:
    """An awaited publish to a stream, its delivery to this process's push consumer."""

    def __init__(self, nc: NATS) -> None:
        self.nc, self.js = nc, nc.jetstream()
        self.seq = 0
        self.sent_at = 0.0
        self.arrived: asyncio.Future[float] | None = None
        self.latencies: list[float] = []
        self._sub: Any = None

    async def start(self) -> None:
        await self.js.add_stream(
            api.StreamConfig(
                name=RAW_STREAM,
                subjects=[f"{RAW_PREFIX}.>"],
                storage=api.StorageType.FILE,
                num_replicas=1,
                duplicate_window=120.0,
            )
        )
        deliver = f"_deliver.{RAW_DURABLE}"
        await self.js.add_consumer(
            RAW_STREAM,
            api.ConsumerConfig(
                durable_name=RAW_DURABLE,
                deliver_subject=deliver,
                deliver_group=RAW_DURABLE,
                filter_subject=f"{RAW_PREFIX}.>",
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=30.0,
                max_ack_pending=1024,
            ),
        )
        self._sub = await self.nc.subscribe(deliver, queue=RAW_DURABLE, cb=self._on_msg, pending_msgs_limit=-1)

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            return  # flow control, heartbeats
        now = time.perf_counter()
        await msg.ack()
        if self.arrived is not None and not self.arrived.done():
            self.arrived.set_result(now)

    async def once(self) -> float:
        self.seq += 1
        self.arrived = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        await self.js.publish(f"{RAW_PREFIX}.{self.seq}", b'{"go": 1}', headers={MSG_ID: f"raw:{self.seq}"})
        return await asyncio.wait_for(self.arrived, WAIT_TIMEOUT) - t0

    async def run(self, n: int) -> None:
        for _ in range(n):
            self.latencies.append(await self.once())

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()


# --- signals ----------------------------------------------------------------------------


class LogWatch:
    """The decisions of one execution as they are stored: `step.waiting` and
    `signal.received` events, handed to whoever waits for them, by step."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.received: dict[str, asyncio.Future[float]] = {}

    def future(self, table: dict[str, asyncio.Future[float]], step: str) -> asyncio.Future[float]:
        found = table.get(step)
        if found is None:
            found = table[step] = asyncio.get_running_loop().create_future()
        return found

    async def on_msg(self, msg: Msg) -> None:
        now = time.perf_counter()
        # every stored message as a reader sees it (actors/client/logview.py): a decision
        # record, a lifecycle carrier, or (semantics 5) a result stored with its decision
        for item in log_items(msg.subject, msg.data, 0, 0.0):
            table = {"step.waiting": self.waiting, "signal.received": self.received}.get(item.type)
            if table is not None and item.step is not None:
                fut = self.future(table, item.step)
                if not fut.done():
                    fut.set_result(now)


async def one_execution(
    client: Client, nc: NATS, layout: Layout, http: aiohttp.ClientSession, token: str, steps: int, eid: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """One execution of the waits playbook, each step signalled once it waits: the
    round trips by Client.signal, by the hook, the time Client.signal took, and the
    time from its return (the signal's PubAck) to the step taking it."""
    watch = LogWatch()
    sub = await nc.jetstream().subscribe(
        f"{layout.exec_prefix(eid)}.>", stream=EXEC_STREAM, ordered_consumer=True, cb=watch.on_msg
    )
    by_client: list[float] = []
    by_hook: list[float] = []
    calls: list[float] = []
    after_ack: list[float] = []
    try:
        await client.start("bench/signals", execution_id=eid)
        for k in range(1, steps + 1):
            step = f"w{k}"
            await asyncio.wait_for(watch.future(watch.waiting, step), WAIT_TIMEOUT)
            t0 = time.perf_counter()
            if k % 2:
                reply = await client.signal(eid, "go", {"k": k})
                calls.append(time.perf_counter() - t0)
                if not reply.accepted:
                    raise RuntimeError(f"signal refused: {reply}")
            else:
                async with http.post(
                    f"/hooks/go/{eid}", json={"k": k}, headers={"Authorization": f"Bearer {token}"}
                ) as resp:
                    if resp.status != 202:
                        raise RuntimeError(f"hook answered {resp.status}: {await resp.text()}")
            done = await asyncio.wait_for(watch.future(watch.received, step), WAIT_TIMEOUT)
            (by_client if k % 2 else by_hook).append(done - t0)
            if k % 2:
                after_ack.append(done - t0 - calls[-1])
        status = await client.wait(eid, timeout=WAIT_TIMEOUT)
        if status.state != "COMPLETED":
            raise RuntimeError(f"execution {eid} ended {status.state}")
    finally:
        await sub.unsubscribe()
    return by_client, by_hook, calls, after_ack


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, me.cancel)  # the `finally` below still stops everything
    server = await NatsServer.start(sync=args.sync)
    nc_raw: NATS | None = None
    nc: NATS | None = None
    runtime: Runtime | None = None
    ui: Any = None
    raw: RawRoundTrip | None = None
    chain: RawChain | None = None
    chain_lat: list[float] = []
    by_client: list[float] = []
    by_hook: list[float] = []
    calls: list[float] = []
    after_ack: list[float] = []
    try:
        nc_raw = await connect(server.url, name="bench-raw")
        raw = RawRoundTrip(nc_raw)
        await raw.start()
        await raw_setup(nc_raw, PUSH)
        chain = RawChain(nc_raw, PUSH)
        await chain.start()
        layout = Layout()
        nc = await connect(server.url, name="bench")
        runtime = await start_roles(nc, layout=layout)
        client = Client(nc, layout=layout)
        with tempfile.TemporaryDirectory(prefix="bench-signals-") as tmp:
            pb = Path(tmp) / "waits.yaml"
            pb.write_text(waits_playbook(args.steps))
            await client.register(pb)
        _, token = await client.hook_add("go", signal="go", playbook="bench/signals")
        ui, url = await serve_ui(client, host="127.0.0.1", port=0)
        async with aiohttp.ClientSession(base_url=url) as http:
            await raw.run(args.steps)  # warm-up
            await chain.run(args.steps)
            await one_execution(client, nc, layout, http, token, args.steps, "bench-signals-warmup")
            raw.latencies = []
            for r in range(args.runs):
                if r % 2:
                    await raw.run(args.steps)
                    chain_lat += (await chain.run(args.steps))[0]
                else:
                    chain_lat += (await chain.run(args.steps))[0]
                    await raw.run(args.steps)
                c, h, t, a = await one_execution(client, nc, layout, http, token, args.steps, f"bench-signals-{r}")
                by_client += c
                by_hook += h
                calls += t
                after_ack += a
    finally:
        if ui is not None:
            await ui.cleanup()
        for part in (raw, chain):
            if part is not None:
                await part.stop()
        if runtime is not None:
            await runtime.stop()
        for conn in (nc, nc_raw):
            if conn is not None:
                await conn.close()
        await server.stop()

    assert raw is not None
    raw_p50, raw_p99 = pct(raw.latencies, 50), pct(raw.latencies, 99)
    chain_p50 = pct(chain_lat, 50)
    sig_p50, sig_p99 = pct(by_client, 50), pct(by_client, 99)
    hook_p50, hook_p99 = pct(by_hook, 50), pct(by_hook, 99)
    result: dict[str, Any] = {
        "sync": args.sync,
        "steps": args.steps,
        "runs": args.runs,
        "signals": len(by_client),
        "hook_signals": len(by_hook),
        "signal_p50_ms": ms(sig_p50),
        "signal_p99_ms": ms(sig_p99),
        "signal_call_p50_ms": ms(pct(calls, 50)),  # Client.signal alone: its checks and the publish
        "signal_taken_after_ack_p50_ms": ms(pct(after_ack, 50)),  # its PubAck -> the step took it
        "hook_p50_ms": ms(hook_p50),
        "hook_p99_ms": ms(hook_p99),
        "raw_p50_ms": ms(raw_p50),
        "raw_p99_ms": ms(raw_p99),
        "raw_chain_p50_ms": ms(chain_p50),
        # the headline: send -> the waiting step's result in the log, against one raw publish+consume
        "ratio_p50": round(sig_p50 / raw_p50, 2),
        "ratio_p99": round(sig_p99 / raw_p99, 2),
        "ratio_chain_p50": round(sig_p50 / chain_p50, 2),
        "ratio_hook_p50": round(hook_p50 / raw_p50, 2),
        "python": platform.python_version(),
        "nats_server": nats_server_version(),
    }
    say(f"{args.steps} wait steps x {args.runs} runs, nats-server {result['nats_server']}, python {result['python']}")
    say(f"{'':34}{'p50 ms':>10}{'p99 ms':>10}")
    for name, p50, p99 in (
        ("raw publish+consume", raw_p50, raw_p99),
        ("raw chain (2 publishes+consumes)", chain_p50, pct(chain_lat, 99)),
        ("signal (Client.signal -> taken)", sig_p50, sig_p99),
        ("  of which Client.signal", pct(calls, 50), pct(calls, 99)),
        ("  of which PubAck -> taken", pct(after_ack, 50), pct(after_ack, 99)),
        ("signal by hook (HTTP -> taken)", hook_p50, hook_p99),
    ):
        say(f"{name:34}{ms(p50):>10.3f}{ms(p99):>10.3f}")
    say(f"{'ratio signal / raw':34}{result['ratio_p50']:>10.2f}{result['ratio_p99']:>10.2f}")
    say(f"{'ratio signal / raw chain':34}{result['ratio_chain_p50']:>10.2f}")
    say(f"{'ratio hook / raw':34}{result['ratio_hook_p50']:>10.2f}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="wait steps per execution (default 30)")
    parser.add_argument("--runs", type=int, default=3, help="measured executions (default 3)")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    add_sync_flag(parser)
    args = parser.parse_args(argv)
    result = uvloop.run(main_async(args))
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
