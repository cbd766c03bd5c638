"""Per-step latency of the engine against raw JetStream round trips, same server, same run.

    python -m bench.step_latency [--tool sleep|python] [--steps 50] [--runs 5] [--json-only]

What it does (everything in this process on uvloop, against its own nats-server):

1. Two raw baselines, shaped like one engine step: a work-queue stream of commands
   drained by a "worker" that acks each command and publishes a result (awaited
   ``js.publish``) to a limits stream; an "engine" side gets results from a durable push
   consumer with explicit ack (a queue subscription on its deliver subject, like
   actors/engine/actor.py), acks, then publishes the next command (awaited
   ``js.publish``). Every publish carries a ``Nats-Msg-Id``, as the engine's do. The
   worker takes commands
   * ``push``: from a durable push consumer, in its subscription's callback: the floor,
     and the baseline of the headline ratio (``ratio_p50``);
   * ``fetch``: with a pull consumer (``fetch``, a task per message, like the tool
     actor), slower than the floor (``ratio_fetch_p50``).
   One warm-up chain each, then ``runs`` chains of ``steps`` round trips each; each
   round trip is timed with ``time.perf_counter`` from just before the command publish
   to the result's arrival in the engine-side callback. Their streams and connection
   are their own; the actors are up (idle) while they run.
2. Engine: a generated playbook of ``steps`` sequential steps (``--tool python``: ``def
   main(i): return i + 1``, each fed the previous result by a template; ``--tool
   sleep``: ``sleep`` 0 s, the same engine path without the python pool's IPC) is
   registered, run once to warm up, then ``runs`` times one after the other, each
   execution right after one chain of each raw kind (interleaved, their order
   alternating: all see the same moment). Per-step latency is the difference between
   consecutive ``call.done`` inputs' log timestamps (server time of the stored message,
   ``LogItem.at``); the first step is measured from the start record. Wall time per
   execution is ``Client.start`` -> terminal status in KV (``Client.wait``); steps/s =
   steps x runs / sum of walls.
3. CPU per engine step and per raw round trip, measured phases only: this process
   (``time.process_time``: the actors and the client, or the raw chain's two sides),
   nats-server and the python pool's workers (``/proc/<pid>/task/*/schedstat``), in
   microseconds, with the client connection's messages out and in and the write
   system calls of this process and of nats-server (``/proc/<pid>/io`` ``syscw``; a
   socket write wakes the server, which answers with writes of its own: steadier than
   CPU time on a busy machine) (``cpu_per_step``, ``cpu_per_raw_push``,
   ``cpu_per_raw_fetch`` in the JSON).
4. Prints a small table and, as its last line, one JSON object.

``--raw-runs N`` sets the number of raw chains apart from ``--runs`` (1 for profiling).
``--cprofile FILE`` profiles the measured engine runs only (pstats file).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import json
import logging
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api

from actors.client import Client
from actors.natsio import MSG_ID
from actors.natsio.binding import bind
from actors.pod.roles import Runtime, connect, start_roles
from actors.tools.actor import ToolActor
from actors.wire.codec import CLEAR, PayloadCodec, PayloadKeys, parse_key
from actors.wire.events import decision_decoder, lifecycle_message
from bench.common import chain_playbook
from streams.layout import EV, EXEC_STREAM, IN, LC, Layout, class_of
from streams.server import SYNC_DEFAULT, SYNC_MODES, NatsServer, find_binary
from streams.subjects import is_answer_record

RAW_CMD_STREAM, RAW_LOG_STREAM = "RAWCMD", "RAWLOG"
FETCH_BATCH = 64  # the tool actor fetches `concurrency - inflight` (64 when idle)
WAIT_TIMEOUT = 60.0


# --- statistics -------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of non-empty `values`."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- cost accounting: CPU per process and messages on the connection -------------------


def cpu_ns(pid: int) -> int:
    """CPU time (ns) used so far by every thread of `pid` (Linux schedstat; 0 elsewhere)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just exited
    return total


def write_syscalls(pid: int | str) -> int:
    """Write-like system calls made so far by `pid` (`syscw` of /proc/<pid>/io; 0 where
    unreadable). Each socket write of a client wakes the server to read it; steadier
    than CPU time on a busy machine."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("syscw:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Costs:
    """CPU ms of this process, the nats-server and the python workers, and messages
    sent and received on the measured connection, over one phase."""

    python_ms: float = 0.0
    server_ms: float = 0.0
    workers_ms: float = 0.0
    msgs_out: int = 0
    msgs_in: int = 0
    writes: int = 0  # write syscalls of this process
    server_writes: int = 0  # ... of nats-server (sockets and its file store)


class Meter:
    def __init__(self, server_pid: int, nc: NATS, worker_pids: Callable[[], list[int]] = list) -> None:
        self.server_pid, self.nc, self.worker_pids = server_pid, nc, worker_pids
        self.costs = Costs()
        self._mark: tuple[int, ...] | None = None

    def _now(self) -> tuple[int, ...]:
        st = self.nc.stats
        return (
            time.process_time_ns(),
            cpu_ns(self.server_pid),
            sum(cpu_ns(p) for p in self.worker_pids()),
            int(st["out_msgs"]),
            int(st["in_msgs"]),
            write_syscalls("self"),
            write_syscalls(self.server_pid),
        )

    def start(self) -> None:
        self._mark = self._now()

    def stop(self) -> None:
        assert self._mark is not None
        py, srv, wk, out, inn, wr, swr = (b - a for a, b in zip(self._mark, self._now(), strict=True))
        c = self.costs
        c.python_ms += py / 1e6
        c.server_ms += srv / 1e6
        c.workers_ms += wk / 1e6
        c.msgs_out += out
        c.msgs_in += inn
        c.writes += wr
        c.server_writes += swr
        self._mark = None


# --- raw JetStream baseline -------------------------------------------------------------


@dataclass(frozen=True)
class RawShape:
    """The streams and consumers of one raw baseline: its worker takes commands with a
    pull consumer (`fetch`) or a push consumer."""

    worker: str  # "fetch" or "push"

    @property
    def cmd_stream(self) -> str:
        return RAW_CMD_STREAM if self.worker == "fetch" else RAW_CMD_STREAM + "P"

    @property
    def log_stream(self) -> str:
        return RAW_LOG_STREAM if self.worker == "fetch" else RAW_LOG_STREAM + "P"

    @property
    def cmd_prefix(self) -> str:
        return "rawcmd" if self.worker == "fetch" else "rawpcmd"

    @property
    def log_prefix(self) -> str:
        return "rawlog" if self.worker == "fetch" else "rawplog"

    def durable(self, side: str) -> str:
        return f"raw-{side}" if self.worker == "fetch" else f"rawp-{side}"

    def deliver(self, side: str) -> str:
        return f"_deliver.{self.durable(side)}"


FETCH, PUSH = RawShape("fetch"), RawShape("push")


async def raw_setup(nc: NATS, shape: RawShape) -> None:
    js = nc.jetstream()
    common: dict[str, Any] = dict(storage=api.StorageType.FILE, num_replicas=1, duplicate_window=120.0)
    await js.add_stream(
        api.StreamConfig(
            name=shape.cmd_stream,
            subjects=[f"{shape.cmd_prefix}.>"],
            retention=api.RetentionPolicy.WORK_QUEUE,
            **common,
        )
    )
    await js.add_stream(
        api.StreamConfig(
            name=shape.log_stream, subjects=[f"{shape.log_prefix}.>"], retention=api.RetentionPolicy.LIMITS, **common
        )
    )
    acked: dict[str, Any] = dict(ack_policy=api.AckPolicy.EXPLICIT, ack_wait=30.0, max_deliver=5)
    worker = shape.durable("worker")
    if shape.worker == "fetch":
        await js.add_consumer(
            shape.cmd_stream,
            api.ConsumerConfig(
                durable_name=worker, filter_subject=f"{shape.cmd_prefix}.>", max_ack_pending=1024, **acked
            ),
        )
    else:
        await js.add_consumer(
            shape.cmd_stream,
            api.ConsumerConfig(
                durable_name=worker,
                deliver_subject=shape.deliver("worker"),
                deliver_group=worker,
                filter_subject=f"{shape.cmd_prefix}.>",
                max_ack_pending=1024,
                **acked,
            ),
        )
    engine = shape.durable("engine")
    await js.add_consumer(
        shape.log_stream,
        api.ConsumerConfig(
            durable_name=engine,
            deliver_subject=shape.deliver("engine"),
            deliver_group=engine,
            filter_subject=f"{shape.log_prefix}.>",
            max_ack_pending=4096,
            deliver_policy=api.DeliverPolicy.ALL,
            **acked,
        ),
    )


class RawChain:
    """Command -> worker -> result -> engine side -> next command, `n` times in a row.
    The worker takes commands with `fetch` (a task per message, as the tool actor has)
    or from a push consumer (its subscription's callback: the floor)."""

    def __init__(self, nc: NATS, shape: RawShape) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.shape = shape
        self.seq = 0  # unique command/result subjects and message ids across chains
        self.sent_at = 0.0
        self.left = 0
        self.latencies: list[float] = []
        self.done: asyncio.Event = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None
        self._subs: list[Any] = []

    async def start(self) -> None:
        shape = self.shape
        if shape.worker == "fetch":
            psub = await self.js.pull_subscribe_bind(durable=shape.durable("worker"), stream=shape.cmd_stream)
            self._worker = asyncio.create_task(self._pull(psub), name="raw-worker")
        else:
            self._subs.append(
                await self.nc.subscribe(
                    shape.deliver("worker"), queue=shape.durable("worker"), cb=self._on_command, pending_msgs_limit=-1
                )
            )
        self._subs.append(
            await self.nc.subscribe(
                shape.deliver("engine"), queue=shape.durable("engine"), cb=self._on_result, pending_msgs_limit=-1
            )
        )

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self._subs:
            await sub.unsubscribe()

    # fetch worker: pull, a task per command (as the tool actor does)
    async def _pull(self, psub: Any) -> None:
        while True:
            try:
                msgs = await psub.fetch(FETCH_BATCH, timeout=5)
            except (TimeoutError, NatsTimeoutError):
                continue
            for m in msgs:
                task = asyncio.create_task(self._work(m))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    # push worker: the subscription's callback does the work
    async def _on_command(self, msg: Msg) -> None:
        if msg.reply:  # not flow control / heartbeats
            await self._work(msg)

    async def _work(self, msg: Msg) -> None:
        n = msg.subject.rsplit(".", 1)[1]
        value = json.loads(msg.data)["i"] + 1
        await msg.ack()
        await self.js.publish(
            f"{self.shape.log_prefix}.{n}", json.dumps({"i": value}).encode(), headers={MSG_ID: f"res:{n}"}
        )

    # engine side: push consumer, explicit ack, then the next command
    async def _on_result(self, msg: Msg) -> None:
        if not msg.reply:
            return  # flow control / heartbeats
        now = time.perf_counter()
        await msg.ack()
        self.latencies.append(now - self.sent_at)
        self.left -= 1
        if self.left <= 0:
            self.done.set()
            return
        await self._send(json.loads(msg.data)["i"])

    async def _send(self, value: int) -> None:
        self.seq += 1
        self.sent_at = time.perf_counter()
        await self.js.publish(
            f"{self.shape.cmd_prefix}.{self.seq}",
            json.dumps({"i": value}).encode(),
            headers={MSG_ID: f"cmd:{self.seq}"},
        )

    async def run(self, n: int) -> tuple[list[float], float]:
        """Chain `n` round trips; their latencies and the chain's wall time."""
        self.latencies, self.left, self.done = [], n, asyncio.Event()
        t0 = time.perf_counter()
        await self._send(0)
        await asyncio.wait_for(self.done.wait(), WAIT_TIMEOUT)
        return self.latencies, time.perf_counter() - t0


# --- engine -----------------------------------------------------------------------------


@dataclass
class Breakdown:
    """Per step, from the log itself (server store times and the tool's own clock)."""

    dispatch: list[float] = field(default_factory=list)  # input stored -> tool starts the call
    run: list[float] = field(default_factory=list)  # tool call (python: pool IPC + exec)
    report: list[float] = field(default_factory=list)  # tool call ends -> call.done stored
    decided: list[float] = field(default_factory=list)  # input stored -> decision record stored


async def stored_times(nc: NATS, layout: Layout, eid: str) -> list[tuple[str, bytes, int, float]]:
    """(subject, data, stream seq, server store time) of every message of an execution."""
    js = nc.jetstream()
    sub = await js.subscribe(
        f"{layout.exec_prefix(eid)}.>", stream=EXEC_STREAM, ordered_consumer=True, pending_msgs_limit=-1
    )
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            md = msg.metadata
            out.append((msg.subject, msg.data, int(md.sequence.stream), float(md.timestamp.timestamp())))
            if md.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


async def engine_runs(
    client: Client,
    nc: NATS,
    layout: Layout,
    path: str,
    version: int,
    *,
    steps: int,
    runs: int,
    profiler: cProfile.Profile | None,
    meter: Meter,
    before_each: Callable[[], Awaitable[None]],
) -> tuple[list[float], list[float], Breakdown]:
    """Warm up, then `runs` executions one after the other, each preceded by
    `before_each` (the raw chain: both see the same conditions); then read the logs."""

    async def one() -> tuple[str, float]:
        t0 = time.perf_counter()
        eid = await client.start(path, version=version, payload={"i": 0})
        st = await client.wait(eid, timeout=WAIT_TIMEOUT)
        wall = time.perf_counter() - t0
        if st.state != "COMPLETED":
            raise RuntimeError(f"execution {eid} ended {st.state}")
        return eid, wall

    await one()  # warm-up: first render/compile of every template, first pool call, ...
    eids, walls = [], []
    for _ in range(runs):
        await before_each()
        if profiler is not None:
            profiler.enable()
        meter.start()
        try:
            eid, wall = await one()
        finally:
            meter.stop()
            if profiler is not None:
                profiler.disable()
        eids.append(eid)
        walls.append(wall)
    step_lat: list[float] = []
    bd = Breakdown()
    for eid in eids:
        items = await client.events(eid)
        start = [i for i in items if i.cls == IN and i.type == "execution.start"]
        done = sorted((i for i in items if i.cls == IN and i.type == "call.done"), key=lambda i: i.seq)
        if len(start) != 1 or len(done) != steps:
            raise RuntimeError(f"execution {eid}: {len(start)} start records, {len(done)} call.done (want {steps})")
        ended = [i for i in items if i.type == "playbook.completed"]
        if tool_of(path) == "python" and (not ended or ended[0].data.get("result") != {f"s{steps}": steps}):
            raise RuntimeError(f"execution {eid}: unexpected result {ended[0].data.get('result') if ended else None}")
        marks = [start[0].at] + [i.at for i in done]
        step_lat += [b - a for a, b in pairwise(marks)]
        # breakdown: the k-th call.done answers the command decided on input k-1
        msgs = await stored_times(nc, layout, eid)
        ins = [(seq, at, data) for subj, data, seq, at in msgs if class_of(subj) == IN]
        # decision records on `ev.*`, and those a lifecycle event carries (semantics 2: the first and last)
        decided_at = {decision_decoder.decode(data).cause: at for subj, data, _, at in msgs if class_of(subj) == EV}
        for subj, data, seq, at in msgs:
            carried = lifecycle_message(data)[0] if class_of(subj) == LC else None
            if carried is not None:
                decided_at[carried.cause] = at
            if is_answer_record(subj):  # semantics 5: the result and its decision are one message
                decided_at[seq] = at
        for (seq0, at0, _), done_item in zip(ins, done, strict=False):
            d = done_item.data
            bd.dispatch.append(d["started_at"] - at0)
            bd.run.append(d["ended_at"] - d["started_at"])
            bd.report.append(done_item.at - d["ended_at"])
            if seq0 in decided_at:
                bd.decided.append(decided_at[seq0] - at0)
    return step_lat, walls, bd


async def encrypted_runs(
    server: NatsServer, nc: NATS, layout: Layout, path: str, version: int, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """Step latencies of executions in clear and with a payload key (actors/wire/codec.py),
    alternating one of each, on the runtime already running: the codec bound to its
    connection is switched between executions (every actor looks it up per message),
    so both see the same warm worker pool, server and moment. (clear, encrypted)."""
    keyed = PayloadCodec(PayloadKeys(parse_key(base64.b64encode(os.urandom(32)).decode(), where="bench")))
    clients = {}
    for name, codec in (("clear", CLEAR), ("encrypted", keyed)):
        bind(nc, codec)
        clients[name] = Client(nc, layout=layout)
    lat: dict[str, list[float]] = {"clear": [], "encrypted": []}

    async def nothing() -> None:
        return None

    for _ in range(args.runs):
        for name, codec in (("clear", CLEAR), ("encrypted", keyed)):
            bind(nc, codec)
            got, _, _ = await engine_runs(
                clients[name],
                nc,
                layout,
                path,
                version,
                steps=args.steps,
                runs=1,
                profiler=None,
                meter=Meter(server.proc.pid, nc),
                before_each=nothing,
            )
            lat[name] += got
    bind(nc, CLEAR)
    return lat["clear"], lat["encrypted"]


def tool_of(path: str) -> str:
    return "python" if "_python_" in path else "sleep"


# --- main -------------------------------------------------------------------------------


def nats_server_version() -> str:
    out = subprocess.run([find_binary(), "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip().rsplit(" ", 1)[-1] if out else "unknown"


def cpu_report(c: Costs, n: int) -> dict[str, float]:
    """CPU microseconds per round trip (or step) of each process, and client messages."""
    return {
        "process_us": round(c.python_ms * 1000 / n, 1),
        "nats_server_us": round(c.server_ms * 1000 / n, 1),
        "workers_us": round(c.workers_ms * 1000 / n, 1),
        "msgs_out": round(c.msgs_out / n, 2),
        "msgs_in": round(c.msgs_in / n, 2),
        "write_syscalls": round(c.writes / n, 2),
        "nats_server_write_syscalls": round(c.server_writes / n, 2),
    }


@dataclass
class RawRuns:
    """One raw baseline's chains over the measured phase."""

    chain: RawChain
    meter: Meter
    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0

    async def once(self, steps: int) -> None:
        self.meter.start()
        lat, wall = await self.chain.run(steps)
        self.meter.stop()
        self.latencies.extend(lat)
        self.wall += wall


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    # SIGINT/SIGTERM cancel this task, so the `finally` below still stops the actors, the
    # python workers and the server (it runs in its own session: no signal reaches it)
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, me.cancel)
    server = await NatsServer.start(sync=args.sync)
    nc_raw: NATS | None = None
    nc: NATS | None = None
    runtime: Runtime | None = None
    chains: list[RawChain] = []
    clear_lat: list[float] = []
    enc_lat: list[float] = []
    try:
        # raw: its own connection (one for both its sides, as the actors share one)
        nc_raw = await connect(server.url, name="bench-raw")
        raws: dict[str, RawRuns] = {}
        for shape in (PUSH, FETCH):
            await raw_setup(nc_raw, shape)
            chain = RawChain(nc_raw, shape)
            chains.append(chain)
            await chain.start()
            raws[shape.worker] = RawRuns(chain, Meter(server.proc.pid, nc_raw))
        layout = Layout()
        nc = await connect(server.url, name="bench")
        runtime = await start_roles(nc, layout=layout)
        client = Client(nc, layout=layout)
        with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
            pb = Path(tmp) / "steps.yaml"
            pb.write_text(chain_playbook(f"step_latency_{args.tool}_{args.steps}", args.steps, args.tool))
            entry = await client.register(pb)

        for chain in chains:
            await chain.run(max(50, args.steps))  # warm-up
        raw_chains = args.runs if args.raw_runs is None else args.raw_runs
        chains_done = 0

        async def raw_chain() -> None:
            """One raw chain of each kind before each engine execution (the first
            `raw_chains` ones), their order alternating: interleaved, raw and engine see
            the same server, machine and moment."""
            nonlocal chains_done
            if chains_done >= raw_chains:
                return
            order = list(raws.values())
            for r in order if chains_done % 2 else reversed(order):
                await r.once(args.steps)
            chains_done += 1

        profiler = cProfile.Profile() if args.cprofile else None
        assert runtime is not None
        tools = next(a for a in runtime.actors if isinstance(a, ToolActor))
        eng_meter = Meter(server.proc.pid, nc, tools.resources.python_pool().pids)
        step_lat, walls, bd = await engine_runs(
            client,
            nc,
            layout,
            entry.path,
            entry.version,
            steps=args.steps,
            runs=args.runs,
            profiler=profiler,
            meter=eng_meter,
            before_each=raw_chain,
        )
        while chains_done < raw_chains:  # --raw-runs above --runs
            await raw_chain()
        if args.payload_key:
            clear_lat, enc_lat = await encrypted_runs(server, nc, layout, entry.path, entry.version, args)
        if profiler is not None:
            profiler.dump_stats(args.cprofile)
        for chain in chains:
            await chain.stop()
        chains = []
    finally:
        for chain in chains:
            await chain.stop()
        if runtime is not None:
            await runtime.stop()
        for conn in (nc, nc_raw):
            if conn is not None:
                await conn.close()
        await server.stop()

    push, fetch = raws["push"], raws["fetch"]
    push_p50, push_p99 = pct(push.latencies, 50), pct(push.latencies, 99)
    fetch_p50, fetch_p99 = pct(fetch.latencies, 50), pct(fetch.latencies, 99)
    step_p50, step_p99 = pct(step_lat, 50), pct(step_lat, 99)
    n_eng = len(step_lat)
    result: dict[str, Any] = {
        "tool": args.tool,
        "sync": args.sync,
        "steps": args.steps,
        "runs": args.runs,
        "step_p50_ms": ms(step_p50),
        "step_p99_ms": ms(step_p99),
        "raw_push_p50_ms": ms(push_p50),
        "raw_push_p99_ms": ms(push_p99),
        "raw_fetch_p50_ms": ms(fetch_p50),
        "raw_fetch_p99_ms": ms(fetch_p99),
        # the headline: against the floor, a push-consumer worker
        "ratio_p50": round(step_p50 / push_p50, 2),
        "ratio_p99": round(step_p99 / push_p99, 2),
        "ratio_fetch_p50": round(step_p50 / fetch_p50, 2),
        "ratio_fetch_p99": round(step_p99 / fetch_p99, 2),
        "steps_per_s": round(args.steps * args.runs / sum(walls), 1),
        "raw_push_round_trips_per_s": round(len(push.latencies) / push.wall, 1),
        "raw_fetch_round_trips_per_s": round(len(fetch.latencies) / fetch.wall, 1),
        # CPU per engine step / per raw round trip: this process (actors and client, or
        # the raw chain's two sides), nats-server, the python pool's workers
        "cpu_per_step": cpu_report(eng_meter.costs, n_eng),
        "cpu_per_raw_push": cpu_report(push.meter.costs, len(push.latencies)),
        "cpu_per_raw_fetch": cpu_report(fetch.meter.costs, len(fetch.latencies)),
        "python": platform.python_version(),
        "nats_server": nats_server_version(),
    }
    if args.payload_key:
        result["interleaved_clear_step_p50_ms"] = ms(pct(clear_lat, 50))
        result["encrypted_step_p50_ms"] = ms(pct(enc_lat, 50))
        result["encrypted_step_p99_ms"] = ms(pct(enc_lat, 99))
        result["ratio_encrypted_p50"] = round(pct(enc_lat, 50) / pct(clear_lat, 50), 2)
        result["ratio_encrypted_p99"] = round(pct(enc_lat, 99) / pct(clear_lat, 99), 2)
    say(
        f"{args.steps} steps x {args.runs} runs ({args.tool} steps), nats-server {result['nats_server']}, "
        f"python {result['python']}, uvloop"
    )
    say(f"{'':26}{'p50 ms':>10}{'p99 ms':>10}{'per s':>10}")
    for name, p50, p99, rate in (
        ("raw round trip, push", push_p50, push_p99, result["raw_push_round_trips_per_s"]),
        ("raw round trip, fetch", fetch_p50, fetch_p99, result["raw_fetch_round_trips_per_s"]),
        ("engine step", step_p50, step_p99, result["steps_per_s"]),
    ):
        say(f"{name:26}{ms(p50):>10.3f}{ms(p99):>10.3f}{rate:>10.1f}")
    say(f"{'ratio engine/raw push':26}{result['ratio_p50']:>10.2f}{result['ratio_p99']:>10.2f}")
    say(f"{'ratio engine/raw fetch':26}{result['ratio_fetch_p50']:>10.2f}{result['ratio_fetch_p99']:>10.2f}")
    if args.payload_key:
        say(
            f"{'engine step, encrypted':26}{result['encrypted_step_p50_ms']:>10.3f}"
            f"{result['encrypted_step_p99_ms']:>10.3f}"
        )
        say(f"{'ratio encrypted/clear':26}{result['ratio_encrypted_p50']:>10.2f}{result['ratio_encrypted_p99']:>10.2f}")
    say(f"execution wall p50 {ms(statistics.median(walls)):.1f} ms (start -> terminal status, {args.steps} steps)")
    first_excluded = [x for i, x in enumerate(step_lat) if i % args.steps]
    if first_excluded:
        say(
            f"{'engine step, not 1st':26}{ms(pct(first_excluded, 50)):>10.3f}"
            f"{ms(pct(first_excluded, 99)):>10.3f}   (the 1st step's fold parses the playbook)"
        )
    say("CPU us per round trip / per step (measured phase only), client msgs out/in, write syscalls:")
    say(f"  {'':10}{'process':>9}{'server':>9}{'workers':>9}{'msgs out':>10}{'msgs in':>9}{'writes':>8}{'srv wr':>8}")
    for name in ("raw_push", "raw_fetch", "step"):
        r = result[f"cpu_per_{name}"]
        say(
            f"  {name:10}{r['process_us']:>9.1f}{r['nats_server_us']:>9.1f}{r['workers_us']:>9.1f}"
            f"{r['msgs_out']:>10.2f}{r['msgs_in']:>9.2f}{r['write_syscalls']:>8.2f}{r['nats_server_write_syscalls']:>8.2f}"
        )
    say("engine step breakdown (log store times and the tool's clock), p50 / p99 ms:")
    for name, values, what in (
        ("dispatch", bd.dispatch, "input stored -> tool starts the call (its command delivered, decoded, handed on)"),
        ("run", bd.run, "the tool call itself (python: pool IPC + exec)"),
        ("report", bd.report, "call ends -> call.done stored (semantics 5 on: ask, fold, store)"),
        ("decided", bd.decided, "input stored -> its decision stored (0: stored with it, semantics 5 on)"),
    ):
        if values:
            say(f"  {name:9}{ms(pct(values, 50)):>8.3f}{ms(pct(values, 99)):>9.3f}  {what}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=50, help="steps per execution, and round trips per raw chain")
    parser.add_argument("--runs", type=int, default=5, help="measured executions (and raw chains)")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    parser.add_argument("--tool", choices=("python", "sleep"), default="python", help="step tool (default python)")
    parser.add_argument(
        "--sync",
        choices=SYNC_MODES,
        default=SYNC_DEFAULT,
        help="JetStream file store sync: default (every 2 minutes) or always (fsync before each PubAck)",
    )
    parser.add_argument("--cprofile", metavar="FILE", help="cProfile the measured engine runs into FILE")
    parser.add_argument(
        "--raw-runs",
        type=int,
        help="raw chains (default: --runs; 1 keeps a sampling profile of the process mostly on the engine)",
    )
    parser.add_argument(
        "--payload-key",
        action="store_true",
        help="then alternate executions in clear and with payload encryption (a fresh key) on the same runtime: "
        "ratio_encrypted_p50/p99 = encrypted step latency / clear step latency, measured interleaved",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.runs < 1 or (args.raw_runs is not None and args.raw_runs < 1):
        parser.error("--steps, --runs and --raw-runs must be at least 1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = uvloop.run(main_async(args))
    except asyncio.CancelledError:
        print("step_latency: interrupted; stopped everything", file=sys.stderr)
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
