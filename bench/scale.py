"""Scaling out: executions/s and steps/s with 1, 2 and 3 engine pods, and how long a
SIGKILLed engine pod's executions take to move again.

    python -m bench.scale [--executions 500] [--pods 1,2,3] [--steps 5] [--skip-recovery]

Every pod is a separate process (``actors-cli serve --role ROLE``, via tests/support/pods.py),
as Kubernetes runs them. For each engine pod count N, in the order given, each against
a fresh nats-server (file store, temporary dir):

1. Raw baseline, on that server before any pod starts: ``bench/loop_fanout.py``'s raw
   child (a separate process): ``--raw-n`` round trips shaped like one step (command on
   a work queue -> pull worker -> result on a stream -> push consumer -> next command),
   ``--executions`` of them in flight, and a plain pipelined publish-then-consume of as
   many messages. Figures are ratios against these, measured seconds before.
2. Pods: N engine pods, ``--tool-pods`` tools pods, one counter and one projector pod,
   with ``ACTORS_PARTITIONS=--partitions``. The run waits until the KV bucket
   ``owners`` holds every ``engine.p<k>`` lease, spread over N distinct pods with none
   above its fair share (ceil(partitions / N)).
3. Warm-up: two executions per partition (every engine pod parses the playbook once).
4. Measured: ``--executions`` executions of a chain of ``--steps`` steps, each a
   ``sleep`` of 0 s (a command round trip through a tools pod that does no work, no
   worker process), all started at once (concurrent ``Client.start``). Not ``noop``:
   the engine decides a plain noop step itself, without a command
   (actors/core/decide.py ``_dispatch``), so a chain of noops is one decision per
   execution (``--step-tool noop`` measures that). Wall time runs from the first start
   to the last terminal lifecycle event seen on a core-NATS subscription to
   ``exec.*.*.lc.>``. executions/s = M / wall, steps/s = M x steps / wall. CPU seconds
   used in that window per role (all threads of each pod process, of the nats-server,
   of this process: /proc/<pid>/task/*/schedstat) say where the two cores went;
   ``other_cores_busy`` (and ``raw_other_cores_busy`` for the baseline) is what the
   rest of the machine used meanwhile (/proc/stat minus ours): the machine is shared,
   and a row measured while something else ran is not comparable with the others.
   ``status_lag_s``: from the last terminal event until the projector's consumer has
   nothing pending or unacked, i.e. until every status in KV (what ``Client.wait`` and
   ``actors-cli status`` read) is written; ``executions_s_status`` is M over first
   start -> that moment. Afterwards: redeliveries counted by the engine and tool
   consumers, and WARNING / ERROR / Traceback lines in the pod logs, during the run
   (``log_issues``) and while the pods stop on SIGTERM (``log_issues_at_stop``).

Recovery (unless ``--skip-recovery``), on a fresh server with a lease TTL and ack wait of
``--lease-ttl`` / ``--ack-wait`` (3 s each by default): 3 engine pods; M executions of a
chain of ``--recovery-steps`` ``sleep`` steps of ``--sleep`` s, so that they are in
flight. Once every execution has a decision in its log, plus ``--kill-after`` seconds,
the engine pod holding partition 0 is SIGKILLed. The executions of its partitions that
were not terminal then are the affected ones. Measured from the kill (this process's
clock, after the pod was reaped):

* ``takeover_s``: every partition of the killed pod leased by a surviving pod
  (``owners`` polled every 50 ms);
* ``progress_s``: each affected execution's first decision record or lifecycle event
  (``exec.*.*.ev.>`` / ``lc.>``, the engine's own output, not tool results) after the
  kill; min, p50, max (max = all of them progressing again);
* ``complete_s``: all executions terminal; the affected ones, the unaffected ones.

A dead pod's leases age out after the lease TTL (the bucket's max age) counted from its
last renewal (every TTL / 4), a survivor takes them at its next balance (every TTL / 4),
then rebuilds each affected execution by replaying its log; inputs the dead pod had
been delivered but not acked come back after the ack wait (counted from their
delivery, so usually over by the time of the takeover when ack wait <= TTL). So
progress resumes at most about TTL x 1.25 + replay after the kill, and no sooner than
TTL x 0.75. ``redelivered`` (the consumers' count) says whether the ack wait came into
play at all: with sleep steps the engine holds an input for milliseconds, so a kill
rarely finds one unacked.

Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.client import Client
from actors.pod.roles import connect
from actors.wire.events import TERMINAL_EVENTS
from streams.layout import (
    OWNERS_BUCKET,
    PROJECTOR_CONSUMER,
    Layout,
    engine_consumer,
    ensure,
    tool_consumer,
    tool_log_consumer,
)
from streams.server import NatsServer
from streams.subjects import ANSWER_LIFECYCLE_FILTER, answer_lifecycle_type, is_answer_record
from tests.support.pods import PodProcess

ROOT = Path(__file__).resolve().parent.parent  # the repository

TIMEOUT = 180.0  # seconds any one wait may take before the configuration is abandoned
DISTURBED = 0.2  # cores used by other processes above which a row is marked


# --- playbooks --------------------------------------------------------------------------


def chain_playbook(name: str, steps: int, tool: str, sleep_s: float) -> str:
    """Steps s1..sK one after the other, each a `noop` or a `sleep` of `sleep_s`."""
    spec = "noop" if tool == "noop" else f"{{kind: sleep, seconds: {sleep_s}}}"
    lines = ["apiVersion: actors/v1", "kind: Playbook", f"metadata: {{name: {name}}}", "workflow:"]
    for k in range(1, steps + 1):
        lines += [f"  - step: s{k}", f"    tool: {spec}", f"    args: {{k: {k}}}"]
        if k < steps:
            lines.append(f"    next: s{k + 1}")
    return "\n".join(lines) + "\n"


# --- observing ---------------------------------------------------------------------------


@dataclass
class Watch:
    """Engine output per execution, as published (core NATS, no polling)."""

    terminal: dict[str, tuple[float, str]] = field(default_factory=dict)  # id -> (time, type)
    decided: set[str] = field(default_factory=set)  # ids with at least one decision record
    since: float | None = None  # record first output after this time
    first_after: dict[str, float] = field(default_factory=dict)
    duplicate_terminals: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def subscribe(self, nc: NATS, *, decisions: bool) -> None:
        async def on(msg: Msg) -> None:
            now = time.perf_counter()
            _, _, eid, cls, type_ = msg.subject.split(".", 4)
            if is_answer_record(msg.subject):  # a step's result with its decision (semantics 5)
                cls, type_ = "ev", answer_lifecycle_type(msg.subject) or ""
            if self.since is not None and now >= self.since and eid not in self.first_after:
                self.first_after[eid] = now
            if cls == "ev":
                self.decided.add(eid)
            elif type_ in TERMINAL_EVENTS:
                if eid in self.terminal:
                    self.duplicate_terminals += 1
                else:
                    self.terminal[eid] = (now, type_)
            self._wake.set()

        await nc.subscribe("exec.*.*.lc.>", cb=on, pending_msgs_limit=-1)
        # semantics 5: a step's result stored with its decision, the execution's end among them
        await nc.subscribe(
            "exec.*.*.in.answer.>" if decisions else ANSWER_LIFECYCLE_FILTER, cb=on, pending_msgs_limit=-1
        )
        if decisions:
            await nc.subscribe("exec.*.*.ev.>", cb=on, pending_msgs_limit=-1)

    async def until(self, done: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
        """Until `done()` is true (checked on every message and every 50 ms)."""
        deadline = time.perf_counter() + timeout
        while not done():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.05)
            except TimeoutError:
                pass


def cpu_s(pid: int) -> float:
    """CPU seconds used so far by every thread of `pid` (0 once it is gone)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just exited
    return total / 1e9


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy so far, every process (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pods: dict[str, list[PodProcess]], server: NatsServer) -> dict[str, float]:
    """CPU seconds so far of every pod (by log name), the nats-server and this process."""
    out = {p.log.stem: cpu_s(p.proc.pid) for group in pods.values() for p in group}
    out["nats-server"] = cpu_s(server.proc.pid)
    out["bench"] = cpu_s(os.getpid())
    out["machine"] = machine_busy_s()
    return out


def by_role(cpu: dict[str, float]) -> dict[str, float]:
    """{"engine0": 1.0, "engine1": 2.0, ...} -> {"engine": 3.0, ...}"""
    out: dict[str, float] = {}
    for name, v in cpu.items():
        if name == "machine":
            continue
        role = name.rstrip("0123456789") if name not in ("nats-server", "bench") else name
        out[role] = round(out.get(role, 0.0) + v, 3)
    return out


async def owners(nc: NATS, layout: Layout) -> dict[int, str]:
    """partition -> pod name holding its engine lease (free partitions left out)."""
    kv = await nc.jetstream().key_value(OWNERS_BUCKET)
    held: dict[int, str] = {}
    for p in range(layout.partitions):
        try:
            e = await kv.get(f"engine.p{p}")
        except Exception:
            continue  # free (never taken, released, or aged out)
        if e.value:
            held[p] = e.value.decode()
    return held


async def until_split(nc: NATS, layout: Layout, n: int) -> dict[int, str]:
    """Every partition held, by `n` distinct pods, none above its fair share."""
    fair = math.ceil(layout.partitions / n)
    deadline = time.perf_counter() + 60
    while True:
        held = await owners(nc, layout)
        shares = Counter(held.values())
        if len(held) == layout.partitions and len(shares) == n and max(shares.values()) <= fair:
            return held
        if time.perf_counter() > deadline:
            raise TimeoutError(f"partitions not split over {n} engine pods: {dict(shares)}")
        await asyncio.sleep(0.1)


def pod_of(name: str, pods: list[PodProcess]) -> PodProcess | None:
    """The pod whose lease name (`<host>-<pid>`, actors/runtime/ownership.py) is `name`."""
    return next((p for p in pods if name.endswith(f"-{p.proc.pid}")), None)


async def redeliveries(nc: NATS, layout: Layout) -> dict[str, int]:
    jsm = nc.jsm()
    engine = 0
    for p in range(layout.partitions):
        engine += (await jsm.consumer_info("EXEC", engine_consumer(p))).num_redelivered or 0
    out = {"engine": engine}
    for kind in ("noop", "sleep"):
        out[f"tools-{kind}"] = (await jsm.consumer_info("CMD", tool_consumer(kind))).num_redelivered or 0
        held = await jsm.consumer_info("EXEC", tool_log_consumer(kind))  # commands held by decision records
        out[f"tools-{kind}"] += held.num_redelivered or 0
    return out


async def projector_caught_up(nc: NATS, timeout: float = TIMEOUT) -> float:
    """Until the projector's consumer has nothing pending or unacked (every status in KV
    written, what `Client.wait` sees); returns perf_counter() then."""
    jsm = nc.jsm()
    deadline = time.perf_counter() + timeout
    while True:
        info = await jsm.consumer_info("EXEC", PROJECTOR_CONSUMER)
        if not info.num_pending and not info.num_ack_pending:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError(f"projector: {info.num_pending} pending, {info.num_ack_pending} unacked")
        await asyncio.sleep(0.02)


def log_issues(pods: dict[str, list[PodProcess]]) -> list[str]:
    """WARNING / ERROR / Traceback lines of the pod logs (lifecycle JSON lines aside)."""
    out = []
    for group in pods.values():
        for p in group:
            for line in p.log.read_text(errors="replace").splitlines():
                if not line.startswith("{") and any(w in line for w in ("WARNING", "ERROR", "Traceback", "Error")):
                    out.append(f"{p.log.stem}: {line[:300]}")
    return out


# --- one configuration ---------------------------------------------------------------------


class Cluster:
    """A fresh nats-server and pods as processes; `stop()` ends them all."""

    def __init__(self, layout: Layout, logs: Path) -> None:
        self.layout, self.logs = layout, logs
        self.pods: dict[str, list[PodProcess]] = {}
        self.server: NatsServer | None = None
        self.nc: NATS | None = None

    async def start_server(self) -> NatsServer:
        self.server = await NatsServer.start()
        return self.server

    async def start_pods(self, counts: dict[str, int]) -> NATS:
        assert self.server is not None
        self.nc = await connect(self.server.url, name="bench-scale")
        await ensure(self.nc.jetstream(), self.layout)  # before the pods race to create it
        for role, n in counts.items():
            self.pods[role] = [
                await PodProcess.start(role, url=self.server.url, layout=self.layout, logs=self.logs, name=f"{role}{i}")
                for i in range(n)
            ]
        await asyncio.gather(*(p.ready() for group in self.pods.values() for p in group))
        return self.nc

    async def stop(self) -> list[str]:
        """Stop everything (SIGTERM to the pods); the pod log lines of interest written
        while stopping."""
        before = Counter(log_issues(self.pods))
        await asyncio.gather(*(p.stop() for group in self.pods.values() for p in group), return_exceptions=True)
        if self.nc is not None:
            await self.nc.close()
        if self.server is not None:
            await self.server.stop()
        return list((Counter(log_issues(self.pods)) - before).elements())


async def measure(cluster: Cluster, body: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Await `body` (the measurement), then stop the cluster whatever happened."""
    try:
        result = await body
    except BaseException:
        await cluster.stop()
        raise
    result["log_issues_at_stop"] = await cluster.stop()
    return result


async def raw_baseline(server: NatsServer, n: int, concurrency: int) -> dict[str, float]:
    """loop_fanout's raw child, and the CPU others used meanwhile (`raw_other_cores_busy`)."""
    t0, m0, s0, c0 = time.perf_counter(), machine_busy_s(), cpu_s(server.proc.pid), children_cpu_s()
    url = server.url
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.loop_fanout",
        "--child",
        "raw",
        "--url",
        url,
        "--n",
        str(n),
        "--concurrency",
        str(concurrency),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"raw baseline failed:\n{err.decode()[-3000:]}")
    ours = cpu_s(server.proc.pid) - s0 + children_cpu_s() - c0
    others = (machine_busy_s() - m0 - ours) / (time.perf_counter() - t0)
    return {**json.loads(out.decode().strip().splitlines()[-1]), "raw_other_cores_busy": round(others, 2)}


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def ids_per_partition(layout: Layout, per: int) -> list[str]:
    """`per` fresh execution ids in every partition."""
    out: list[str] = []
    for p in range(layout.partitions):
        got = 0
        while got < per:
            eid = uuid.uuid4().hex
            if layout.partition_of(eid) == p:
                out.append(eid)
                got += 1
    return out


async def warm_up(client: Client, path: str, watch: Watch) -> None:
    ids = ids_per_partition(client.layout, 2)
    await asyncio.gather(*(client.start(path, execution_id=eid) for eid in ids))
    await watch.until(lambda: all(e in watch.terminal for e in ids), "warm-up")
    await projector_caught_up(client.nc)  # no status backlog carried into the measurement


async def throughput(engines: int, a: argparse.Namespace, logs: Path) -> dict[str, Any]:
    layout = Layout(partitions=a.partitions)  # production ack wait and lease TTL
    cluster = Cluster(layout, logs)
    cluster.logs.mkdir()
    return await measure(cluster, _throughput(cluster, engines, a))


async def _throughput(cluster: Cluster, engines: int, a: argparse.Namespace) -> dict[str, Any]:
    layout = cluster.layout
    server = await cluster.start_server()
    raw = await raw_baseline(server, a.raw_n, a.executions)
    nc = await cluster.start_pods({"engine": engines, "tools": a.tool_pods, "counter": 1, "projector": 1})
    held = await until_split(nc, layout, engines)
    watch = Watch()
    await watch.subscribe(nc, decisions=False)
    client = Client(nc, layout=layout)
    pb = cluster.logs / "chain.yaml"
    pb.write_text(chain_playbook("scale_chain", a.steps, a.step_tool, 0))
    path = (await client.register(pb)).path
    await warm_up(client, path, watch)

    ids = [uuid.uuid4().hex for _ in range(a.executions)]
    cpu0 = cpu_snapshot(cluster.pods, server)
    t0 = time.perf_counter()
    await asyncio.gather(*(client.start(path, execution_id=eid) for eid in ids))
    t_started = time.perf_counter()
    await watch.until(lambda: all(e in watch.terminal for e in ids), f"{engines} engine pods")
    t_end = max(watch.terminal[e][0] for e in ids)
    cpu1 = cpu_snapshot(cluster.pods, server)
    t_status = await projector_caught_up(nc)
    wall = t_end - t0
    states = Counter(watch.terminal[e][1] for e in ids)
    per_pod = {name: cpu1[name] - cpu0[name] for name in cpu0}
    cpu = by_role(per_pod)
    return {
        "engine_pods": engines,
        "executions": a.executions,
        "steps_per_execution": a.steps,
        "step_tool": a.step_tool,
        "wall_s": wall,
        "starts_s": t_started - t0,
        "status_lag_s": t_status - t_end,
        "executions_s_status": a.executions / (t_status - t0),
        "executions_s": a.executions / wall,
        "steps_s": a.executions * a.steps / wall,
        **raw,
        "ratio_steps_vs_raw_roundtrip": a.executions * a.steps / wall / raw["raw_roundtrip_msgs_s"],
        "ratio_steps_vs_raw_pubsub": a.executions * a.steps / wall / raw["raw_pubsub_msgs_s"],
        "cpu_s": cpu,
        "cpu_cores_busy": round(sum(cpu.values()) / wall, 2),
        # the machine is shared: CPU others used meanwhile (a figure much above 0 means
        # the row was measured on fewer free cores than the others)
        "other_cores_busy": round((per_pod["machine"] - sum(cpu.values())) / wall, 2),
        "engine_pod_cpu_s": [round(v, 3) for k, v in per_pod.items() if k.startswith("engine")],
        "partitions_per_engine_pod": sorted(Counter(held.values()).values()),
        "terminal_states": dict(states),
        "duplicate_terminal_events": watch.duplicate_terminals,
        "redelivered": await redeliveries(nc, layout),
        "log_issues": log_issues(cluster.pods),
    }


async def recovery(a: argparse.Namespace, logs: Path) -> dict[str, Any]:
    layout = Layout(partitions=a.partitions, ack_wait=a.ack_wait, lease_ttl=a.lease_ttl)
    cluster = Cluster(layout, logs / "recovery")
    cluster.logs.mkdir()
    return await measure(cluster, _recovery(cluster, a))


async def _recovery(cluster: Cluster, a: argparse.Namespace) -> dict[str, Any]:
    layout = cluster.layout
    await cluster.start_server()
    nc = await cluster.start_pods({"engine": 3, "tools": a.tool_pods, "counter": 1, "projector": 1})
    await until_split(nc, layout, 3)
    watch = Watch()
    await watch.subscribe(nc, decisions=True)
    client = Client(nc, layout=layout)
    pb = cluster.logs / "recovery.yaml"
    pb.write_text(chain_playbook("scale_recovery", a.recovery_steps, "sleep", a.sleep))
    path = (await client.register(pb)).path
    await warm_up(client, path, watch)

    ids = [uuid.uuid4().hex for _ in range(a.executions)]
    t0 = time.perf_counter()
    await asyncio.gather(*(client.start(path, execution_id=eid) for eid in ids))
    await watch.until(lambda: all(e in watch.decided for e in ids), "every execution decided once")
    await asyncio.sleep(a.kill_after)

    held = await owners(nc, layout)
    victim = pod_of(held[0], cluster.pods["engine"])
    assert victim is not None, held
    lost = sorted(p for p, name in held.items() if name == held[0])
    in_flight = [e for e in ids if e not in watch.terminal]
    affected = [e for e in in_flight if layout.partition_of(e) in lost]
    others = [e for e in in_flight if layout.partition_of(e) not in lost]
    await victim.kill()
    t_kill = time.perf_counter()
    watch.since = t_kill

    async def takeover() -> float:
        while True:
            now = await owners(nc, layout)
            if all(p in now and now[p] != held[0] for p in lost):
                return time.perf_counter() - t_kill
            await asyncio.sleep(0.05)

    taken = asyncio.create_task(takeover())
    await watch.until(lambda: all(e in watch.first_after for e in affected), "affected executions progressing")
    t_progress = time.perf_counter()
    await watch.until(lambda: all(e in watch.terminal for e in ids), "every execution terminal")
    takeover_s = await asyncio.wait_for(taken, TIMEOUT)
    t_status = await projector_caught_up(nc)
    progress = sorted(watch.first_after[e] - t_kill for e in affected)
    done_aff = [watch.terminal[e][0] - t_kill for e in affected]
    done_oth = [watch.terminal[e][0] - t_kill for e in others]
    return {
        "engine_pods": 3,
        "executions": a.executions,
        "steps": a.recovery_steps,
        "sleep_s": a.sleep,
        "lease_ttl_s": a.lease_ttl,
        "ack_wait_s": a.ack_wait,
        "lease_period_s": a.lease_ttl / 4,
        "started_to_kill_s": t_kill - t0,
        "killed_partitions": lost,
        "in_flight_at_kill": len(in_flight),
        "affected": len(affected),
        "takeover_s": takeover_s,
        "progress_min_s": progress[0] if progress else None,
        "progress_p50_s": statistics.median(progress) if progress else None,
        "progress_max_s": progress[-1] if progress else None,
        "all_progressing_s": t_progress - t_kill,
        "complete_affected_s": max(done_aff, default=None),
        "complete_others_s": max(done_oth, default=None),
        "complete_all_s": max(watch.terminal[e][0] for e in ids) - t_kill,
        "status_caught_up_s": t_status - t_kill,
        "terminal_states": dict(Counter(watch.terminal[e][1] for e in ids)),
        "duplicate_terminal_events": watch.duplicate_terminals,
        "redelivered": await redeliveries(nc, layout),
        "log_issues": log_issues(cluster.pods),
    }


# --- main --------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


async def run(a: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    rec: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        logs = Path(a.keep_logs) if a.keep_logs else Path(d)
        logs.mkdir(parents=True, exist_ok=True)
        for i, n in enumerate(int(x) for x in a.pods.split(",") if x.strip()):
            r = await throughput(n, a, logs / f"{i + 1}-engines{n}")
            rows.append(r)
            print(
                f"{n} engine pod(s): {r['executions_s']:7.1f} executions/s  {r['steps_s']:7.1f} steps/s  "
                f"wall {r['wall_s']:5.2f} s  status lag {r['status_lag_s']:5.2f} "
                f"s  raw rt {r['raw_roundtrip_msgs_s']:7.0f}/s  "
                f"ratio {r['ratio_steps_vs_raw_roundtrip']:.3f}  raw pub+sub {r['raw_pubsub_msgs_s']:7.0f}/s  "
                f"ratio {r['ratio_steps_vs_raw_pubsub']:.3f} (others {r['raw_other_cores_busy']}) "
                f" cores busy {r['cpu_cores_busy']} (others {r['other_cores_busy']})  "
                f"cpu {r['cpu_s']}  {r['terminal_states']}  issues {len(r['log_issues'])} "
                f"(at stop {len(r['log_issues_at_stop'])})",
                flush=True,
            )
        if not a.skip_recovery:
            rec = await recovery(a, logs)
            print(
                f"recovery: kill at {rec['started_to_kill_s']:.2f} s, {rec['affected']} of "
                f"{rec['in_flight_at_kill']} in flight affected; takeover {rec['takeover_s']:.2f} s, progress "
                f"min/p50/max {fmt(rec['progress_min_s'])}/{fmt(rec['progress_p50_s'])}/"
                f"{fmt(rec['progress_max_s'])} s, all complete {rec['complete_all_s']:.2f} s "
                f"(others {fmt(rec['complete_others_s'])} s)  {rec['terminal_states']}  "
                f"issues {len(rec['log_issues'])} (at stop {len(rec['log_issues_at_stop'])})",
                flush=True,
            )
    ones = [r for r in rows if r["engine_pods"] == 1]
    base = statistics.median(r["executions_s"] for r in ones) if ones else None
    base_ratio = statistics.median(r["ratio_steps_vs_raw_roundtrip"] for r in ones) if ones else None
    print()
    print(
        "| engine pods | executions/s | steps/s | wall s | steps/s ÷ raw round trips/s | steps/s ÷ raw pub+consume/s "
        "| speedup vs 1 pod | speedup (normalised) | cores busy (ours / others) | status lag s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if base is not None and base_ratio is not None:  # against the median of the 1-pod rows
            r["speedup_vs_1"] = r["executions_s"] / base
            r["speedup_vs_1_normalised"] = r["ratio_steps_vs_raw_roundtrip"] / base_ratio
        busy = max(r["other_cores_busy"], r["raw_other_cores_busy"]) > DISTURBED
        print(
            f"| {r['engine_pods']}{' *' if busy else ''} | {r['executions_s']:.1f} | {r['steps_s']:.0f} "
            f"| {r['wall_s']:.2f} | {r['ratio_steps_vs_raw_roundtrip']:.3f} | {r['ratio_steps_vs_raw_pubsub']:.3f} "
            f"| {fmt(r.get('speedup_vs_1'))} | {fmt(r.get('speedup_vs_1_normalised'))} "
            f"| {r['cpu_cores_busy']} / {r['other_cores_busy']} | {r['status_lag_s']:.2f} |"
        )
    if any(max(r["other_cores_busy"], r["raw_other_cores_busy"]) > DISTURBED for r in rows):
        print(f"* other processes used more than {DISTURBED} of a core during the row or its baseline")
    summary: dict[str, dict[str, float]] = {}
    for n in sorted({r["engine_pods"] for r in rows}):
        mine = [r for r in rows if r["engine_pods"] == n]
        summary[str(n)] = {
            "rows": len(mine),
            "executions_s": statistics.median(r["executions_s"] for r in mine),
            "steps_s": statistics.median(r["steps_s"] for r in mine),
            "ratio_steps_vs_raw_roundtrip": statistics.median(r["ratio_steps_vs_raw_roundtrip"] for r in mine),
        }
        if base is not None and base_ratio is not None:
            summary[str(n)]["speedup_vs_1"] = summary[str(n)]["executions_s"] / base
            summary[str(n)]["speedup_vs_1_normalised"] = summary[str(n)]["ratio_steps_vs_raw_roundtrip"] / base_ratio
    if len(summary) < len(rows):
        print()
        print(
            "| engine pods | rows | median executions/s | median steps/s | median ratio vs raw round trips "
            "| speedup vs 1 pod | speedup (normalised) |"
        )
        print("|---|---|---|---|---|---|---|")
        for key, m in summary.items():
            print(
                f"| {key} | {m['rows']:.0f} | {m['executions_s']:.1f} | {m['steps_s']:.0f} "
                f"| {m['ratio_steps_vs_raw_roundtrip']:.3f} | {fmt(m.get('speedup_vs_1'))} "
                f"| {fmt(m.get('speedup_vs_1_normalised'))} |"
            )
    if rec is not None:
        print()
        print(
            f"recovery (lease TTL {rec['lease_ttl_s']} s, ack wait {rec['ack_wait_s']} s): takeover "
            f"{rec['takeover_s']:.2f} s, all affected progressing {rec['all_progressing_s']:.2f} s, "
            f"all complete {rec['complete_all_s']:.2f} s after the kill"
        )
    return {
        "bench": "scale",
        "python": platform.python_version(),
        "cores": len(os.sched_getaffinity(0)),
        "partitions": a.partitions,
        "tool_pods": a.tool_pods,
        "raw_n": a.raw_n,
        "rows": rows,
        "summary": summary,
        "recovery": rec,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--executions", type=int, default=500, help="executions started at once (default 500)")
    ap.add_argument(
        "--pods",
        default="1,2,3",
        help="engine pod counts to measure, in this order; repeats allowed, e.g. 1,2,3,3,2,1, "
        "then medians per count (default 1,2,3)",
    )
    ap.add_argument("--steps", type=int, default=5, help="steps per execution (default 5)")
    ap.add_argument(
        "--step-tool",
        choices=["sleep", "noop"],
        default="sleep",
        help="sleep: `sleep` of 0 s, a command round trip through a tools pod (default); "
        "noop: decided inside the engine, no command",
    )
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--tool-pods", type=int, default=1)
    ap.add_argument("--raw-n", type=int, default=10_000, help="round trips in the raw baseline (default 10000)")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--lease-ttl", type=float, default=3.0, help="recovery: ACTORS_LEASE_TTL (default 3)")
    ap.add_argument("--ack-wait", type=float, default=3.0, help="recovery: ACTORS_ACK_WAIT (default 3)")
    ap.add_argument("--sleep", type=float, default=0.5, help="recovery: seconds per sleep step (default 0.5)")
    ap.add_argument("--recovery-steps", type=int, default=4, help="recovery: sleep steps per execution (default 4)")
    ap.add_argument(
        "--kill-after",
        type=float,
        default=0.5,
        help="recovery: seconds after every execution's first decision (default 0.5)",
    )
    ap.add_argument("--keep-logs", help="keep pod logs in this directory")
    a = ap.parse_args()
    import uvloop

    async def guarded() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)  # the finally blocks stop the pods and servers
        return await run(a)

    try:
        result = uvloop.run(guarded())
    except asyncio.CancelledError:
        return 130
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
