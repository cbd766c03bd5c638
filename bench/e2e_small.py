"""A small execution end to end: a 3-step python playbook, from the client's start
message to the terminal status the client sees, on a warm pod; against a raw JetStream
floor of the same shape, measured in the same run.

    python -m bench.e2e_small [--runs 50] [--block 10] [--concurrent 200] [--rounds 3] [--tool python|sleep]
                               [--start run|request|stream] [--pods all|roles] [--json-only]

Set-up: a fresh nats-server (file store), one pod as its own process (``actors-cli serve
--role all``; its python pool warm) or, ``--pods roles``, one pod per role (engine,
counter, tools, projector: each ``actors-cli serve --role ROLE``, as deploy/ runs them),
the client (``actors.client.Client``) in this process. The playbook is registered and
run a few times before measuring.

* **Sequential**: ``--runs`` executions one after the other: ``Client.run`` (the status
  watched from before a start request, which is answered once the start record is
  written; as the raw floor's client does), or ``--start request``: ``Client.start`` then
  ``Client.wait`` (a watch and a read of the status key), or ``--start stream``: a start
  message published to stream START, as a user's code may, then ``Client.wait``. In
  blocks of ``--block`` executions, engine and raw blocks alternating (both see the same
  minutes of a host whose speed drifts): within a block each side runs one execution
  after another, as a pod serving a steady trickle of work does, and the CPU meter
  (a walk of /proc, ~1 ms) runs between blocks, not between executions. ``--block 1``
  interleaves single executions: each side then starts every execution with caches the
  other side's run has just cooled. p50 and p99 latency.
* **Concurrent**: ``--rounds`` times, ``--concurrent`` executions started at once
  (each its own start and wait), alternating with as many raw ones; executions per
  second = how many / (first start -> last terminal status seen). The median round.

The raw floor, every message through JetStream as the engine's are, each with a
``Nats-Msg-Id``, the raw actors in this process (one connection, uvloop): the client
subscribes to the execution's status subject (a core subscription, made before the
start: cheaper than the client's watch), publishes a start message (awaited PubAck)
into a log stream; an "engine" side reads the log through a durable push consumer, and
for each of 3 steps publishes a command (awaited PubAck) to a work-queue stream whose
push-consumer "worker" acks it and publishes the result (awaited PubAck) into the log;
after the third result the engine side publishes the status (awaited PubAck) to a
limits stream, and acks its input. The client is done when the status arrives.

CPU per execution, measured phases only, in microseconds: the pod or pods (their
processes and every child: python workers, render processes), nats-server, this process (the client;
for raw: client and raw actors), from ``/proc/<pid>/task/*/schedstat``.

Prints a table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import pstats
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.natsio import MSG_ID
from actors.pod.roles import ROLES, connect
from actors.wire.messages import StartMessage, encode
from bench.common import chain_playbook, process_tree
from streams.layout import EXEC_STREAM, START_SUBJECT, STATUS_BUCKET, Layout
from streams.server import SYNC_DEFAULT, SYNC_MODES, NatsServer
from streams.subjects import ExecSubjects
from tests.support.pods import PodProcess

ROOT = Path(__file__).resolve().parent.parent  # the repository

STEPS = 3
WAIT_TIMEOUT = 60.0
RAW_LOG, RAW_CMD, RAW_STATUS = "E2ELOG", "E2ECMD", "E2ESTATUS"


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of non-empty `values`."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- CPU of a process tree --------------------------------------------------------------


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""  # gone meanwhile


def cpu_ns(pid: int) -> int:
    """CPU ns used so far by every thread of `pid` (0 once it is gone)."""
    total = 0
    for t in _threads(pid):
        fields = _read(f"/proc/{pid}/task/{t}/schedstat").split()
        total += int(fields[0]) if fields else 0
    return total


class TreeMeter:
    """CPU of a set of process trees (a root and its descendants) over measured phases,
    and of this process (`own`: without its children, the pods and the server)."""

    def __init__(self, roots: dict[str, tuple[int, ...]], *, own: str) -> None:
        self.roots = roots  # name -> the processes counted under it (the pods: one or one per role)
        self.own = own
        self.total: dict[str, int] = dict.fromkeys([*roots, own], 0)
        self._mark: dict[str, dict[int, int]] = {}
        self._own_mark = 0

    def _now(self) -> dict[str, dict[int, int]]:
        return {
            name: {p: cpu_ns(p) for root in roots for p in process_tree(root)} for name, roots in self.roots.items()
        }

    def start(self) -> None:
        self._mark = self._now()
        self._own_mark = time.process_time_ns()  # last: walking /proc (~1 ms) is the meter's work

    def stop(self) -> None:
        self.total[self.own] += time.process_time_ns() - self._own_mark  # first, for the same reason
        now = self._now()
        for name, pids in now.items():
            before = self._mark.get(name, {})
            # a process born in the phase counts from 0; one that ended in it is lost
            self.total[name] += sum(ns - before.get(p, 0) for p, ns in pids.items())
        self._mark = {}

    def per(self, n: int) -> dict[str, float]:
        return {f"{name}_us": round(ns / 1000 / n, 1) for name, ns in self.total.items()}


# --- raw floor --------------------------------------------------------------------------


class RawExecutions:
    """Start -> 3 command/result round trips -> status, every message in JetStream."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def setup(self) -> None:
        js = self.js
        common: dict[str, Any] = dict(storage=api.StorageType.FILE, num_replicas=1, duplicate_window=120.0)
        await js.add_stream(api.StreamConfig(name=RAW_LOG, subjects=["e2elog.>"], **common))
        await js.add_stream(
            api.StreamConfig(name=RAW_CMD, subjects=["e2ecmd.>"], retention=api.RetentionPolicy.WORK_QUEUE, **common)
        )
        await js.add_stream(api.StreamConfig(name=RAW_STATUS, subjects=["e2estatus.>"], **common))
        acked: dict[str, Any] = dict(ack_policy=api.AckPolicy.EXPLICIT, ack_wait=30.0, max_ack_pending=4096)
        for stream, name, filt, cb in (
            (RAW_LOG, "e2e-engine", "e2elog.>", self._on_input),
            (RAW_CMD, "e2e-worker", "e2ecmd.>", self._on_command),
        ):
            deliver = f"_deliver.{name}"
            await js.add_consumer(
                stream,
                api.ConsumerConfig(
                    durable_name=name, deliver_subject=deliver, deliver_group=name, filter_subject=filt, **acked
                ),
            )
            self._subs.append(await self.nc.subscribe(deliver, queue=name, cb=self._spawn(cb), pending_msgs_limit=-1))

    def _spawn(self, cb: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """A task per message (as the actors have one mailbox per execution): concurrent
        executions do not queue behind each other's PubAcks."""

        async def on_msg(msg: Msg) -> None:
            if not msg.reply:
                return  # flow control, heartbeats
            task = asyncio.get_running_loop().create_task(cb(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return on_msg

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_input(self, msg: Msg) -> None:
        # e2elog.<id>.start | e2elog.<id>.result.<k>
        _, eid, kind, *rest = msg.subject.split(".")
        done = 0 if kind == "start" else int(rest[0])
        value = json.loads(msg.data)["i"]
        if done < STEPS:
            k = done + 1
            await self.js.publish(
                f"e2ecmd.{eid}.{k}", json.dumps({"i": value}).encode(), headers={MSG_ID: f"{eid}:cmd:{k}"}
            )
        else:
            await self.js.publish(
                f"e2estatus.{eid}", json.dumps({"state": "COMPLETED", "result": value}).encode(), headers={MSG_ID: eid}
            )
        await msg.ack()

    async def _on_command(self, msg: Msg) -> None:
        _, eid, k = msg.subject.split(".")
        value = json.loads(msg.data)["i"] + 1
        await msg.ack()
        await self.js.publish(
            f"e2elog.{eid}.result.{k}", json.dumps({"i": value}).encode(), headers={MSG_ID: f"{eid}:res:{k}"}
        )

    async def one(self) -> float:
        """One execution; its latency (start publish -> status received)."""
        eid = uuid.uuid4().hex
        sub = await self.nc.subscribe(f"e2estatus.{eid}", max_msgs=1)
        t0 = time.perf_counter()
        await self.js.publish(f"e2elog.{eid}.start", b'{"i": 0}', headers={MSG_ID: f"{eid}:start"})
        msg = await sub.next_msg(timeout=WAIT_TIMEOUT)
        took = time.perf_counter() - t0
        if json.loads(msg.data)["result"] != STEPS:
            raise RuntimeError(f"raw execution {eid}: {msg.data!r}")
        return took


# --- engine -----------------------------------------------------------------------------


@dataclass
class Engine:
    client: Client
    path: str
    version: int
    # execution id -> (client's clock before the start, after the terminal status was seen)
    clocks: dict[str, tuple[float, float]] = field(default_factory=dict)

    how: str = "run"  # `--start`: run (Client.run), request (Client.start, Client.wait) or stream

    async def one(self) -> float:
        t0, w0 = time.perf_counter(), time.time()
        if self.how == "run":
            eid, st = await self.client.run(self.path, version=self.version, payload={"i": 0}, timeout=WAIT_TIMEOUT)
        else:
            if self.how == "stream":
                eid = uuid.uuid4().hex
                start = StartMessage(playbook=self.path, version=self.version, payload={"i": 0}, execution_id=eid)
                await self.client.js.publish(START_SUBJECT, encode(start), headers={MSG_ID: eid})
            else:
                eid = await self.client.start(self.path, version=self.version, payload={"i": 0})
            st = await self.client.wait(eid, timeout=WAIT_TIMEOUT)
        took = time.perf_counter() - t0
        self.clocks[eid] = (w0, time.time())
        if st.state != "COMPLETED":
            raise RuntimeError(f"execution {eid} ended {st.state}")
        return took

    async def timeline(self, nc: NATS, eids: list[str]) -> dict[str, float]:
        """p50 ms of each leg, from the client's clock and the server's store times (one
        host: one clock): start sent -> start record stored (client publish, starter)
        -> 1st command's result stored -> ... -> playbook.completed stored -> status
        stored (projector) -> the client has it (its watch)."""
        js = nc.jetstream()
        partitions = self.client.layout.partitions
        legs: dict[str, list[float]] = {}
        for eid in eids:
            items = await self.client.events(eid)
            start = next(i.at for i in items if i.type == "execution.start")
            done = sorted(i.at for i in items if i.type == "call.done")
            # an event's own time is its input's (deterministic): the stored message's is wanted
            # the end: its own message, or (semantics 5) the last step's answer record
            subjects = ExecSubjects.of(eid, partitions)
            try:
                ended = stored_at(await js.get_last_msg(EXEC_STREAM, subjects.lifecycle("playbook.completed")))
            except NotFoundError:
                ended = stored_at(await js.get_last_msg(EXEC_STREAM, subjects.answer_lifecycle("playbook.completed")))
            status_at = stored_at(await js.get_last_msg(f"KV_{STATUS_BUCKET}", f"$KV.{STATUS_BUCKET}.{eid}"))
            sent, seen = self.clocks[eid]
            marks = [("start record stored", sent, start)]
            prev = start
            for k, at in enumerate(done, 1):
                marks.append((f"step {k} result stored", prev, at))
                prev = at
            marks += [
                ("playbook.completed stored", prev, ended),
                ("status stored (projector)", ended, status_at),
                ("client has it (watch)", status_at, seen),
            ]
            for name, a, b in marks:
                legs.setdefault(name, []).append(b - a)
        return {name: ms(pct(v, 50)) for name, v in legs.items()}


def stored_at(msg: RawStreamMsg) -> float:
    return msg.time.timestamp() if msg.time is not None else float("nan")


async def concurrently(one: Callable[[], Awaitable[float]], n: int) -> float:
    """`n` executions at once; executions per second over first start -> last end."""
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - t0)


# --- main -------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, me.cancel)  # the `finally` below still stops pod and server
    server = await NatsServer.start(sync=args.sync)
    nc: NATS | None = None
    nc_raw: NATS | None = None
    pods: list[PodProcess] = []
    raw: RawExecutions | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
            env = {}
            if args.pod_cprofile:  # bench/profile/podprofile/sitecustomize.py profiles the pod
                env = {
                    "PYTHONPATH": str(ROOT / "bench" / "profile" / "podprofile"),
                    "BENCH_POD_CPROFILE": args.pod_cprofile,
                }
            for role in ("all",) if args.pods == "all" else ROLES:
                pod = await PodProcess.start(role, url=server.url, layout=Layout(), logs=Path(tmp), name=role, env=env)
                pods.append(pod)
            for pod in pods:
                await pod.ready()
            nc = await connect(server.url, name="bench-e2e")
            nc_raw = await connect(server.url, name="bench-e2e-raw")
            raw = RawExecutions(nc_raw)
            await raw.setup()
            client = Client(nc, layout=Layout())
            pb = Path(tmp) / "e2e.yaml"
            pb.write_text(chain_playbook(f"e2e_small_{args.tool}", STEPS, args.tool))
            entry = await client.register(pb)
            engine = Engine(client, entry.path, entry.version, how=args.start)

            for _ in range(5):  # warm: the pod's caches, the python pool, both sides' connections
                await engine.one()
                await raw.one()
            await concurrently(engine.one, min(args.concurrent, 50))
            await concurrently(raw.one, min(args.concurrent, 50))

            roots = {"pod": tuple(pod.proc.pid for pod in pods), "nats_server": (server.proc.pid,)}
            eng_seq, raw_seq = TreeMeter(roots, own="bench"), TreeMeter(roots, own="bench")
            eng_lat, raw_lat = [], []
            for first in range(0, args.runs, args.block):
                block = range(first, min(first + args.block, args.runs))
                raw_seq.start()
                raw_lat += [await raw.one() for _ in block]
                raw_seq.stop()
                eng_seq.start()
                eng_lat += [await engine.one() for _ in block]
                eng_seq.stop()

            timeline = await engine.timeline(nc, list(engine.clocks)[-args.runs :])
            eng_con, raw_con = TreeMeter(roots, own="bench"), TreeMeter(roots, own="bench")
            eng_rate, raw_rate = [], []
            for r in range(args.rounds):
                for meter, one, rates in (
                    (eng_con, engine.one, eng_rate),
                    (raw_con, raw.one, raw_rate),
                )[:: 1 if r % 2 else -1]:
                    meter.start()
                    rates.append(await concurrently(one, args.concurrent))
                    meter.stop()
            while pods:
                await pods.pop().stop()
    finally:
        if raw is not None:
            await raw.stop()
        for pod in pods:
            await pod.stop()
        for conn in (nc, nc_raw):
            if conn is not None:
                await conn.close()
        await server.stop()

    n_con = args.concurrent * args.rounds
    result: dict[str, Any] = {
        "tool": args.tool,
        "sync": args.sync,
        "start": args.start,
        "pods": args.pods,
        "steps": STEPS,
        "runs": args.runs,
        "block": args.block,
        "p50_ms": ms(pct(eng_lat, 50)),
        "p99_ms": ms(pct(eng_lat, 99)),
        "raw_p50_ms": ms(pct(raw_lat, 50)),
        "raw_p99_ms": ms(pct(raw_lat, 99)),
        "ratio_p50": round(pct(eng_lat, 50) / pct(raw_lat, 50), 2),
        "concurrent": args.concurrent,
        "rounds": args.rounds,
        "per_s": round(statistics.median(eng_rate), 1),
        "raw_per_s": round(statistics.median(raw_rate), 1),
        "ratio_per_s": round(statistics.median(eng_rate) / statistics.median(raw_rate), 3),
        # CPU per execution: the pod (with its python workers), nats-server, this process
        "cpu_per_execution": eng_seq.per(args.runs),
        "cpu_per_raw_execution": raw_seq.per(args.runs),
        "cpu_per_execution_concurrent": eng_con.per(n_con),
        "cpu_per_raw_execution_concurrent": raw_con.per(n_con),
        "timeline_p50_ms": timeline,
        "python": platform.python_version(),
    }
    if args.pod_cprofile:
        # Python calls per execution: a measure of the pod's work that the host's noise
        # does not move (start-up included, spread over every execution of the run)
        executions = 5 + min(args.concurrent, 50) + args.runs + args.concurrent * args.rounds
        stats = pstats.Stats(args.pod_cprofile)
        calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]  # untyped in typeshed
        result["pod_python_calls_per_execution"] = round(calls / executions)
    shape = "a warm pod (serve --role all)" if args.pods == "all" else "warm pods, one per role"
    say(f"{STEPS}-step {args.tool} playbook, {shape}, python {result['python']}")
    say(
        f"{'':28}{'p50 ms':>9}{'p99 ms':>9}{'per s':>10}"
        f"   ({args.runs} one by one, blocks of {args.block}; {args.concurrent} at once)"
    )
    say(f"{'raw JetStream':28}{result['raw_p50_ms']:>9.3f}{result['raw_p99_ms']:>9.3f}{result['raw_per_s']:>10.1f}")
    say(f"{'engine':28}{result['p50_ms']:>9.3f}{result['p99_ms']:>9.3f}{result['per_s']:>10.1f}")
    say(f"{'ratio engine/raw':28}{result['ratio_p50']:>9.2f}{'':>9}{result['ratio_per_s']:>10.3f}")
    say("CPU us per execution (one by one | at once): pod(s) (with workers), nats-server, this process")
    for name in ("execution", "raw_execution"):
        a, b = result[f"cpu_per_{name}"], result[f"cpu_per_{name}_concurrent"]
        say(
            f"  {name:14}"
            + "".join(f"{k[:-3]:>13} {a[k]:>8.1f} |{b[k]:>8.1f}" for k in ("pod_us", "nats_server_us", "bench_us"))
        )
    say("one by one, p50 of each leg (ms; client clock and server store times):")
    for name, v in timeline.items():
        say(f"  {name:28}{v:>8.3f}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=50, help="executions one by one (and raw ones)")
    parser.add_argument(
        "--block", type=int, default=10, help="one-by-one executions per block, engine and raw blocks alternating"
    )
    parser.add_argument("--concurrent", type=int, default=200, help="executions started at once")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of concurrent executions (and raw ones)")
    parser.add_argument("--tool", choices=("python", "sleep"), default="python", help="step tool (default python)")
    parser.add_argument(
        "--sync",
        choices=SYNC_MODES,
        default=SYNC_DEFAULT,
        help="JetStream file store sync: default (every 2 minutes) or always (fsync before each PubAck)",
    )
    parser.add_argument(
        "--start",
        choices=("run", "request", "stream"),
        default="run",
        help="how the engine side starts and waits: Client.run (the default: the status watched from "
        "before the start, as the raw floor does), Client.start (a start request, answered once the "
        "start record is written) then Client.wait (a watch and a read of the status key), or a start "
        "message published to stream START then Client.wait",
    )
    parser.add_argument(
        "--pods",
        choices=("all", "roles"),
        default="all",
        help="one pod with every role (serve --role all; the default) or one pod per role (engine, counter, "
        "tools, projector), as deploy/ runs them",
    )
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    parser.add_argument(
        "--pod-cprofile", metavar="FILE", help="cProfile the pod into FILE; report its Python calls per execution"
    )
    args = parser.parse_args(argv)
    if min(args.runs, args.block, args.concurrent, args.rounds) < 1:
        parser.error("--runs, --block, --concurrent and --rounds must be at least 1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = uvloop.run(main_async(args))
    except asyncio.CancelledError:
        print("e2e_small: interrupted; stopped everything", file=sys.stderr)
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
