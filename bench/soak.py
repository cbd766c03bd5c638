"""A soak: executions at a steady rate for minutes or hours, then a quiet spell, with the
memory of every process, the server's own figures and the streams' sizes sampled
throughout (issue #34: what the server holds per retained execution).

    python -m bench.soak [--rate 100] [--minutes 3] [--concurrency 100] [--idle-minutes 2]
                         [--sample-seconds 2] [--sync default|always] [--baseline REV]
                         [--retain SECONDS] [--archive off|objects|DIR] [--cluster]
                         [--server-env NAME=VALUE ...] [--duplicate-window SECONDS]
                         [--marginal MINUTES] [--rounds 1]
                         [--out DIR] [--json-only]
    python -m bench.soak --heap-top heap-*.txt   (a saved heap profile's summary, no run)

An operator's two-hour run at a modest rate, retention doing its work: `python -m
bench.soak --rate 10 --minutes 120 --idle-minutes 5 --retain 600 --sample-seconds 10`
(72,000 executions run, about 6,000 retained at a time).

`--retain SECONDS` sets the pod's ACTORS_RETAIN_FINISHED (default: unset, the pod's own
default of 7 days: nothing retires within a run); `--archive off|objects|DIR` its
ACTORS_ARCHIVE. A checkout without retention (no actors/retention: 67fe621 and earlier)
ignores both, and the output says so. `--cluster`: a 3-node cluster on this machine,
every stream and bucket R3 (ACTORS_REPLICAS=3); server figures are then summed over the
three nodes (and each node's RSS is sampled too). `--server-env GOMEMLIMIT=128MiB`: the
single server's environment (the Go runtime's settings: GOMEMLIMIT, GOGC).

What one more retained execution costs, apart from what a server keeps after a load
whatever it holds: `python -m bench.soak --rate 100 --minutes 5 --marginal 15
--idle-minutes 5 --sample-seconds 10` runs the load for 5 minutes (side `short`) and for
15 (`long`), each on a fresh server and left idle, and prints the slope between them after
idle (RSS, heap in use, live heap: KB per further execution) and where the RSS line meets
no execution (`marginal` in the summary).

Each run gets a fresh nats-server (file store in a temporary dir, `--sync`, HTTP
monitoring on a free port), one pod as its own process (`actors-cli serve --role all`,
tests/support/pods.py `PodProcess`) and the client in this process (`actors.client.Client`). The
playbook: a python step, a loop of 5 python iterations on its result, a python step
summing them (`PLAYBOOK`); 5 warm-up executions first. Then executions are started at
`--rate` per second, at most `--concurrency` in flight (a start waits for a slot; a
schedule that falls more than a second behind is not caught up in a burst), for
`--minutes`; then `--idle-minutes` with no new load (executions still in flight may
finish; any not finished by the end are counted as such). Every 20th execution's result
is read and checked (`CHECK_EVERY`); a wrong one counts as failed.

Every `--sample-seconds`: RSS of the server, of the pod with its children (python
workers, render processes; RSS summed, so pages the workers share with each other are
counted in each) and of this process; the server's `/varz` (`mem`, `cpu`, connections,
JetStream memory and storage), `/jsz?streams=true` (per stream: messages, bytes,
subjects, interior deletes, consumers), the Go heap from the server's pprof endpoint
(`--profile PORT`; `/debug/pprof/heap?debug=1`'s runtime.MemStats lines: HeapInuse,
HeapAlloc, HeapSys, HeapReleased, Sys), the store dir's size on disk, executions started
and finished and both rates over the last interval. A line every 10 s shows progress.
At the load's end and after the idle period the whole heap profile is kept
(`heap-<side>-<round>-<when>.txt`) and its sampled in-use bytes summed by the first
nats-server function on each stack (`heap_top_*` in the summary).

"Executions retained" = what the server holds, counted from the streams at each sample:
stream INDEX's messages (one per execution; the status bucket's, one per execution too,
are sampled beside it as a check: `status_minus_index`). "Retired" = executions run
(warm-ups included) - retained (during the load, executions started but not yet indexed
count as retired: at most `--concurrency`; exact at the end). Server memory per retained
execution = (server RSS - RSS of the empty server, measured before the pod connects) /
executions retained, at the end of the load and after the idle period (none when
retention has removed them all: then `server_mb_above_empty_after_idle` says what is left).
The memory slope is a least-squares line through the server's (and the pod's) RSS over
the second half of the load, in MB per hour; `server_flat_ratio` is max/min of the
server's RSS over the same half (1.10: within 10%), `server_flat_ratio_5min` the same of
its 5-minute means (the level, without single samples' swing: a message block of 8 MB
loaded or dropped), `server_trend_percent` how far the line moves over the half, in per
cent of the mean (growth). Per stream: messages, subjects and
bytes held per retained execution at the load's end (growth since just before the
warm-ups).

Writes to `--out` (default: a new temporary dir, printed): `samples-<side>-<round>.csv`,
`soak-<side>-<round>.png` (server RSS, pod RSS and executions retained on a second
axis, the load's end marked; matplotlib, `pip install matplotlib`; without it the CSV
only, saying so), `pod-<side>-<round>.log` and `summary.json`; with a baseline also
`soak-compare.png` (every run's server RSS on one plot). `--baseline REV`: REV runs first, from a git
worktree (its pod; this checkout's client), then this checkout; `--rounds N`
alternates them (old new, new old, ...); both are printed side by side with ratios
(medians over rounds). The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import aiohttp
import uvloop

from actors.client import Client
from actors.pod.roles import connect
from bench.common import add_sync_flag, checkout_of, process_tree
from streams.layout import INDEX_STREAM, STATUS_BUCKET, Layout
from streams.server import NatsCluster, NatsServer, free_port
from streams.subjects import kv_stream
from tests.support.pods import PodProcess

ROOT = Path(__file__).resolve().parents[1]
WARM = 5
CHECK_EVERY = 20  # every Nth execution's result is read back and checked (a read per execution would add load)
RUN_TIMEOUT = 600.0  # seconds an execution may take before it is given up on (counted as not finished)
PROGRESS_EVERY = 10.0  # seconds between progress lines
PAGE = resource.getpagesize()
MB = 2**20
TICKS = os.sysconf("SC_CLK_TCK")
STATUS = kv_stream(STATUS_BUCKET)  # one entry per execution, like INDEX: the check on its count

PLAYBOOK = """\
apiVersion: actors/v1
kind: Playbook
metadata:
  name: bench_soak
  path: bench/soak
workload:
  n: 0
workflow:
  - step: first
    tool:
      kind: python
      code: |
        def main(n):
            return n + 1
    args:
      n: "{{ workload.n }}"
    next: fan
  - step: fan
    tool:
      kind: python
      code: |
        def main(x, k):
            return x * k
    args:
      x: "{{ first }}"
      k: "{{ k }}"
    loop:
      collection: "{{ range(5) | list }}"
      element: k
      mode: async
    next: total
  - step: total
    tool:
      kind: python
      code: |
        def main(values):
            return sum(values)
    args:
      values: "{{ fan }}"
"""


def expected(n: int) -> Any:
    """The result of an execution started with `{"n": n}`: the steps routed into the
    implicit `end` map to their results."""
    return {"total": sum((n + 1) * k for k in range(5))}


# --- sampling ----------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def cpu_seconds(pid: int) -> float:
    """CPU time `pid` has used, user and system (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_rss(pid: int) -> tuple[int, int]:
    """RSS summed over `pid` and its descendants, and how many processes that is."""
    pids = process_tree(pid)
    return sum(rss_bytes(p) for p in pids), len(pids)


def disk_bytes(root: Path) -> int:
    """Bytes the files under `root` take on disk (allocated blocks: sparse files count
    what they use)."""
    total = 0
    for d, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(d, name)).st_blocks * 512
            except OSError:
                pass  # a message block removed meanwhile
    return total


async def monitor(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """The server's `/varz` figures and, per stream, `/jsz?streams=true`'s state."""
    async with http.get(f"{base}/varz") as r:
        varz = await r.json()
    async with http.get(f"{base}/jsz?streams=true") as r:
        jsz = await r.json()
    js = varz.get("jetstream", {}).get("stats", {})
    out: dict[str, Any] = {
        "varz_mem_mb": round(varz.get("mem", 0) / MB, 2),
        "varz_cpu": varz.get("cpu", 0),
        "connections": varz.get("connections", 0),
        "js_memory_mb": round(js.get("memory", 0) / MB, 3),
        "js_storage_mb": round(js.get("storage", 0) / MB, 3),
        # JetStream API requests served (stream infos, consumer creations, purges, msg gets)
        "js_api_total": js.get("api", {}).get("total", 0),
        "js_api_errors": js.get("api", {}).get("errors", 0),
    }
    for account in jsz.get("account_details") or []:
        for s in account.get("stream_detail") or []:
            st, name = s.get("state", {}), s["name"]
            out[f"{name}.messages"] = st.get("messages", 0)
            out[f"{name}.bytes"] = st.get("bytes", 0)
            out[f"{name}.subjects"] = st.get("num_subjects", 0)
            out[f"{name}.deleted"] = st.get("num_deleted", 0)
            out[f"{name}.consumers"] = st.get("consumer_count", 0)
    return out


HEAP_FIELDS = ("HeapInuse", "HeapAlloc", "HeapSys", "HeapReleased", "Sys")
HEAP_LINE = re.compile(r"^# (\w+) = (\d+)$", re.MULTILINE)


async def heap_profile(http: aiohttp.ClientSession, base: str) -> str:
    """The server's heap profile as text (`debug=1`: sampled stacks, then runtime.MemStats)."""
    async with http.get(f"{base}/debug/pprof/heap?debug=1") as r:
        return await r.text()


def heap_stats(text: str) -> dict[str, float]:
    """MemStats' heap figures from a `debug=1` heap profile, in MB (`heap_inuse_mb`, ...)."""
    found = dict(HEAP_LINE.findall(text))
    return {f"heap_{k.lower()}_mb": round(int(found[k]) / MB, 2) for k in HEAP_FIELDS if k in found}


RECORD = re.compile(r"^(\d+): (\d+) \[\d+: \d+\] @")
RATE = re.compile(r"@ heap/(\d+)")
POOL_NEW = re.compile(r"init\.func\d+")
SERVER_FRAME = re.compile(r"nats-server/v2/server(?:/(\w+))?\.(\S+?)\+0x")


def heap_top(text: str, n: int = 8) -> dict[str, float]:
    """In-use bytes by the first nats-server function on each stack of a `debug=1` heap
    profile (as of the last GC), as shares of the profile's in-use total. The text format
    gives what was sampled, one allocation per 512 KB on average: each record is scaled
    up by 1 / (1 - exp(-size / rate)) as pprof does, or small objects would vanish beside
    the file store's large buffers."""
    rate_m = RATE.search(text)
    rate = int(rate_m.group(1)) / 2 if rate_m else 512 * 1024  # the header says 2 * MemProfileRate
    by: dict[str, float] = {}

    def add(objects: int, size: int, frames: list[str]) -> None:
        # a sync.Pool's New (`init.funcN`: the file store's block buffer pools) says little:
        # name the server function that took from the pool, and its caller (a write, a load)
        named = [f for f in frames if not POOL_NEW.fullmatch(f)]
        name = named[0] if named else "(outside server package)"
        if ":" in name:  # in a subpackage (stree: the subject trees): named by the server function using it
            caller = next((f for f in named if ":" not in f), "?")
            name = f"{name.split(':', 1)[0]} <- {caller}"
        if frames and POOL_NEW.fullmatch(frames[0]):
            name += f" <- {named[1]} [sync.Pool]" if len(named) > 1 else " [sync.Pool]"
        scale = 1 / (1 - math.exp(-size / objects / rate)) if rate > 0 else 1.0
        by[name] = by.get(name, 0) + size * scale

    current: tuple[int, int, list[str]] | None = None
    for line in text.splitlines():
        m = RECORD.match(line)
        if m or not line.startswith("#"):
            if current is not None and current[0] and current[1]:
                add(*current)
            current = (int(m.group(1)), int(m.group(2)), []) if m else None
            continue
        f = SERVER_FRAME.search(line)
        if current is not None and f:
            current[2].append(f"{f.group(1)}:{f.group(2)}" if f.group(1) else f.group(2))
    total = sum(by.values())
    if not total:
        return {}
    top = sorted(by.items(), key=lambda kv: -kv[1])[:n]
    return {"profile_inuse_mb": round(total / MB, 2), **{k: round(v / total, 3) for k, v in top}}


class MonitoredCluster(NatsCluster):
    """NatsCluster with a monitoring and a pprof port on every node."""

    def __init__(self, n: int, *, sync: str) -> None:
        super().__init__(n, sync=sync)
        self.monitor_ports = [free_port() for _ in range(n)]
        self.profile_ports = [free_port() for _ in range(n)]

    def _args(self, i: int) -> list[str]:
        return [*super()._args(i), "-m", str(self.monitor_ports[i]), "--profile", str(self.profile_ports[i])]


class Servers:
    """The server (or a cluster's nodes) under test: pids, monitoring and pprof bases, stores."""

    def __init__(self, url: str, nodes: list[NatsServer], monitors: list[str], profiles: list[str]) -> None:
        self.url, self.nodes, self.monitors, self.profiles = url, nodes, monitors, profiles
        self.cluster: MonitoredCluster | None = None
        self.single: NatsServer | None = None

    @classmethod
    async def start(cls, *, sync: str, cluster: bool, env: dict[str, str] | None = None) -> Servers:
        if cluster:
            c = cast(MonitoredCluster, await MonitoredCluster.start(3, sync=sync))
            nodes = [n for n in c.nodes if n is not None]
            out = cls(
                c.url,
                nodes,
                [f"http://127.0.0.1:{p}" for p in c.monitor_ports],
                [f"http://127.0.0.1:{p}" for p in c.profile_ports],
            )
            out.cluster = c
            return out
        mport, pport = free_port(), free_port()
        server = await NatsServer.start(sync=sync, extra_args=["-m", str(mport), "--profile", str(pport)], env=env)
        out = cls(server.url, [server], [f"http://127.0.0.1:{mport}"], [f"http://127.0.0.1:{pport}"])
        out.single = server
        return out

    def rss(self) -> list[int]:
        return [rss_bytes(n.proc.pid) for n in self.nodes]

    def cpu(self) -> float:
        return sum(cpu_seconds(n.proc.pid) for n in self.nodes)

    def disk(self) -> int:
        return sum(disk_bytes(n.store) for n in self.nodes)

    async def monitor(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        """/varz figures summed over the nodes; the streams as the first node holds them
        (on R3 every node holds a replica of every stream)."""
        each = [await monitor(http, b) for b in self.monitors]
        out = dict(each[0])
        for k in ("varz_mem_mb", "varz_cpu", "connections", "js_memory_mb", "js_storage_mb", "js_api_total"):
            out[k] = round(sum(e.get(k, 0) for e in each), 3)
        return out

    async def heap(self, http: aiohttp.ClientSession) -> tuple[dict[str, float], list[str]]:
        texts = [await heap_profile(http, b) for b in self.profiles]
        total: dict[str, float] = {}
        for t in texts:
            for k, v in heap_stats(t).items():
                total[k] = round(total.get(k, 0) + v, 2)
        return total, texts

    async def stop(self) -> None:
        if self.cluster is not None:
            await self.cluster.stop()
        if self.single is not None:
            await self.single.stop()


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per hour (None under 3 points)."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx * 3600, 2)


FLAT_WINDOW_S = 300.0  # the means `flat_ratio_of_means` compares: 5 minutes


def flat_ratio_of_means(points: list[tuple[float, float]], window: float = FLAT_WINDOW_S) -> float | None:
    """max/min of the means of (seconds, MB) points over consecutive `window`-second
    spans (a last span shorter than half a window is left out): how far the level moves,
    without the swing of single samples (8 MB message blocks loaded and dropped). None
    under two whole spans."""
    if not points:
        return None
    t0 = points[0][0]
    spans: dict[int, list[float]] = {}
    for t, mb in points:
        spans.setdefault(int((t - t0) // window), []).append(mb)
    end = points[-1][0] - t0
    means = [
        statistics.fmean(v) for i, v in sorted(spans.items()) if min((i + 1) * window, end) - i * window >= window / 2
    ]
    if len(means) < 2 or min(means) <= 0:
        return None
    return round(max(means) / min(means), 3)


def trend_percent(points: list[tuple[float, float]]) -> float | None:
    """How much the least-squares line through (seconds, MB) points moves from their
    first to their last time, in per cent of their mean: growth (or shrinking) over the
    span, whatever the samples swing around it."""
    slope = slope_per_hour(points)
    if slope is None:
        return None
    mean = statistics.fmean(p[1] for p in points)
    return round(slope * (points[-1][0] - points[0][0]) / 3600 / mean * 100, 1) if mean > 0 else None


# --- one run: a server, a pod from some checkout, the load -------------------------------


class Load:
    """Executions started at a steady rate, at most `concurrency` in flight."""

    def __init__(self, client: Client, path: str, version: int, concurrency: int) -> None:
        self.client, self.path, self.version = client, path, version
        self.slots = asyncio.Semaphore(concurrency)
        self.started = self.completed = self.failed = self.checked = 0
        self.ended = 0.0
        self.late = 0  # starts that waited more than a second for a slot or the loop
        self.errors: dict[str, int] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    async def one(self, n: int) -> None:
        try:
            eid, st = await self.client.run(self.path, version=self.version, payload={"n": n}, timeout=RUN_TIMEOUT)
            ok = st.state == "COMPLETED"
            if ok and n % CHECK_EVERY == 0:
                got = await self.client.result(eid)
                self.checked += 1
                ok = got == expected(n)
                if not ok:
                    self._error(f"wrong result {got!r}")
            elif not ok:
                self._error(f"ended {st.state}")
            if ok:
                self.completed += 1
            else:
                self.failed += 1
        except TimeoutError:
            self._error("not finished in time")
        except Exception as e:  # counted, not raised: one broken execution must not end a two-hour run
            self._error(type(e).__name__)
        finally:
            self.slots.release()

    async def run(self, rate: float, seconds: float, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        due = t0
        while not stop.is_set():
            now = loop.time()
            if now - t0 >= seconds:
                self.ended = loop.time()
                return
            if due > now:
                try:
                    await asyncio.wait_for(stop.wait(), due - now)
                    return
                except TimeoutError:
                    continue  # the time is checked again before every start
            await self.slots.acquire()
            now = loop.time()
            if now - due > 1.0:  # fell behind (no slot, or a slow loop): go on from now, no burst
                self.late += 1
                due = now
            n = self.started
            self.started += 1
            task = asyncio.create_task(self.one(n))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            due += 1 / rate

    async def cancel(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def has_retention(code: Path) -> bool:
    """Whether the checkout at `code` has the retention role (753ae33 on)."""
    return (code / "actors" / "retention").is_dir()


def pod_env(code: Path, args: argparse.Namespace) -> tuple[dict[str, str], str]:
    """The pod's retention settings, and what the output says of them."""
    if not has_retention(code):
        wanted = args.retain is not None or args.archive is not None
        return {}, "not applicable: this checkout has no retention" + (
            " (--retain/--archive ignored)" if wanted else ""
        )
    env = {}
    if args.retain is not None:
        env["ACTORS_RETAIN_FINISHED"] = str(args.retain)
    if args.archive is not None:
        env["ACTORS_ARCHIVE"] = args.archive
    retain = f"{args.retain:g} s" if args.retain is not None else "the pod's default (7 days)"
    return env, f"{retain}, archive {args.archive or 'off (default)'}"


async def soak(
    code: Path, args: argparse.Namespace, out: Path, tag: str, say: Callable[[str], None], stop: asyncio.Event
) -> dict[str, Any]:
    servers = await Servers.start(sync=args.sync, cluster=args.cluster, env=dict(args.server_env or []))
    layout = Layout(replicas=3 if args.cluster else 1, duplicate_window=args.duplicate_window)
    env, retention = pod_env(code, args)
    say(f"  {tag}: retention {retention}")
    pod: PodProcess | None = None
    nc = None
    load: Load | None = None
    samples: list[dict[str, Any]] = []
    heaps: dict[str, str] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await servers.monitor(http)  # the server answers before anything is measured
            empty_rss = sum(servers.rss())
            empty = await servers.monitor(http)
            empty_heap, _ = await servers.heap(http)
            pod = await PodProcess.start(
                "all", url=servers.url, layout=layout, logs=out, name=f"pod-{tag}", code=code, env=env
            )
            await pod.ready(timeout=120)
            nc = await connect(servers.url, name="bench-soak")
            client = Client(nc, layout=layout)
            with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
                pb = Path(tmp) / "soak.yaml"
                pb.write_text(PLAYBOOK)
                entry = await client.register(pb)
            before = await servers.monitor(http)  # streams declared, nothing run yet
            for n in range(WARM):
                eid, st = await client.run(entry.path, version=entry.version, payload={"n": n}, timeout=120)
                if st.state != "COMPLETED" or await client.result(eid) != expected(n):
                    raise RuntimeError(f"{tag}: warm-up execution {eid} ended {st.state}")
            idle_rss = sum(servers.rss())

            load = Load(client, entry.path, entry.version, args.concurrency)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            load_s, idle_s = minutes_of(args, tag) * 60, args.idle_minutes * 60
            driver = asyncio.create_task(load.run(args.rate, load_s, stop))
            load_end = 0.0
            phase, wake, last = "load", t0, (t0, 0, 0)
            next_progress = t0 + PROGRESS_EVERY
            stopped = asyncio.create_task(stop.wait())
            while True:
                now = loop.time()
                ended = phase == "load" and driver.done()  # this sample is the load's last
                if ended:
                    load_end = (load.ended or now) - t0
                last_of_all = phase == "idle" and (now - t0 >= load_end + idle_s or stop.is_set())
                nodes_rss = servers.rss()
                pod_rss, procs = tree_rss(pod.proc.pid)
                dt = max(now - last[0], 1e-9)
                run = WARM + load.started
                sample: dict[str, Any] = {
                    "t": round(now - t0, 2),
                    "phase": phase,
                    "started": load.started,
                    "finished": load.finished,
                    "failed": load.failed,
                    "in_flight": load.started - load.finished,
                    "run": run,
                    "retained": run,  # replaced by INDEX's count below when the server answers
                    "start_rate": round((load.started - last[1]) / dt, 1),
                    "finish_rate": round((load.finished - last[2]) / dt, 1),
                    "server_rss_mb": round(sum(nodes_rss) / MB, 2),
                    **({f"node{i}_rss_mb": round(r / MB, 2) for i, r in enumerate(nodes_rss)} if args.cluster else {}),
                    "server_cpu_s": round(servers.cpu(), 2),
                    "pod_cpu_s": round(cpu_seconds(pod.proc.pid), 2),
                    "pod_rss_mb": round(pod_rss / MB, 2),
                    "pod_processes": procs,
                    "pod_main_rss_mb": round(rss_bytes(pod.proc.pid) / MB, 2),
                    "client_rss_mb": round(rss_bytes(os.getpid()) / MB, 2),
                    "disk_mb": round(await asyncio.to_thread(servers.disk) / MB, 2),
                }
                try:
                    sample.update(await servers.monitor(http))
                    heap, texts = await servers.heap(http)
                    sample.update(heap)
                    if ended or last_of_all:
                        when = "load-end" if ended else "after-idle"
                        for i, text in enumerate(texts):
                            (out / f"heap-{tag}-{when}{f'-node{i}' if args.cluster else ''}.txt").write_text(text)
                        heaps[when] = "\n".join(texts)
                except (aiohttp.ClientError, TimeoutError) as e:
                    say(f"  {tag}: monitoring did not answer at {now - t0:.0f} s: {e!r}")
                if f"{INDEX_STREAM}.messages" in sample:
                    sample["retained"] = sample[f"{INDEX_STREAM}.messages"] - before.get(f"{INDEX_STREAM}.messages", 0)
                    sample["status_minus_index"] = (
                        sample.get(f"{STATUS}.messages", 0) - sample[f"{INDEX_STREAM}.messages"]
                    )
                sample["retired"] = run - sample["retained"]
                samples.append(sample)
                last = (now, load.started, load.finished)
                if now >= next_progress or ended or last_of_all:
                    next_progress = now + PROGRESS_EVERY - args.sample_seconds / 2  # a sample's lateness aside
                    say(
                        f"  {tag} {sample['t']:>6.0f} s {sample['phase']:4}  started {sample['started']:>7}  "
                        f"finished {sample['finished']:>7}  in flight {sample['in_flight']:>4}  "
                        f"retained {sample['retained']:>6}  {sample['finish_rate']:>6.1f}/s  "
                        f"server {sample['server_rss_mb']:>7.1f} MB (heap {sample.get('heap_heapinuse_mb', '-')})  "
                        f"pod {sample['pod_rss_mb']:>6.1f} MB"
                    )
                    if load.errors:
                        say(f"  {tag} errors so far: {load.errors}")
                if ended:
                    say(f"  {tag}: load ended at {load_end:.0f} s; {args.idle_minutes} min idle")
                    phase, wake = "idle", now  # idle samples count from the load's end
                if last_of_all:
                    break
                wake += args.sample_seconds
                # woken early by the load's end (its last sample is taken then) or by Ctrl-C
                await asyncio.wait(
                    [stopped, *([driver] if phase == "load" else [])],
                    timeout=max(0.0, wake - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            stopped.cancel()
            if not driver.done():
                driver.cancel()
            await asyncio.gather(driver, stopped, return_exceptions=True)
            not_finished = load.started - load.finished
            await load.cancel()
            after = samples[-1]
    finally:
        if nc is not None:
            await nc.close()
        if pod is not None:
            await pod.stop()
        await servers.stop()

    result = summarize(samples, before, load, load_end, empty_rss, empty, empty_heap, idle_rss, not_finished, args)
    result["retention"] = retention
    if not has_retention(code):  # nothing retires there: no backlog to speak of
        result["due_not_retired_load_end"] = result["due_not_retired_after_idle"] = None
    result["nodes"] = len(servers.nodes)
    for when, text in heaps.items():
        result[f"heap_top_{when.replace('-', '_')}"] = heap_top(text)
    result["files"] = write_files(samples, load_end, out, tag)
    say(
        f"  {tag}: {load.started} started, {load.completed} completed, {load.failed} failed, "
        f"{not_finished} not finished; {result['executions_per_s']}/s; {result['retired']} retired; "
        f"server {result['server_rss_mb_load_end']} MB at the load's end with {result['retained_load_end']} retained "
        f"({result['server_kb_per_retained_load_end']} KB per retained execution), "
        f"{after['server_rss_mb']} MB after idle with {result['retained_after_idle']} retained "
        f"({result['server_kb_per_retained_after_idle']} KB); slope {result['server_slope_mb_per_h']} MB/h, "
        f"max/min {result['server_flat_ratio']} over the load's 2nd half"
    )
    return result


def summarize(
    samples: list[dict[str, Any]],
    before: dict[str, Any],
    load: Load,
    load_end: float,
    empty_rss: int,
    empty: dict[str, Any],
    empty_heap: dict[str, float],
    idle_rss: int,
    not_finished: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    during = [s for s in samples if s["phase"] == "load"]
    at_load_end = during[-1] if during else samples[0]
    at_end = samples[-1]
    second_half = [s for s in during if s["t"] >= load_end / 2]
    empty_mb = empty_rss / MB

    def per_exec_kb(s: dict[str, Any]) -> float | None:
        # too few held to divide by (retention removed nearly all): server_mb_above_empty says it
        return round((s["server_rss_mb"] - empty_mb) * 1024 / s["retained"], 2) if s["retained"] >= 100 else None

    held = max(at_load_end["retained"], 1)
    streams = sorted({k.split(".", 1)[0] for k in at_load_end if k.endswith(".subjects")})
    grown = {
        name: {
            what: round((at_load_end.get(f"{name}.{what}", 0) - before.get(f"{name}.{what}", 0)) / held, 2)
            for what in ("messages", "subjects", "bytes", "deleted")
        }
        for name in streams
    }
    per_stream = {name: v for name, v in grown.items() if any(v.values())}  # streams this workload writes
    rss2 = [s["server_rss_mb"] for s in second_half]
    rss_points2 = [(s["t"], s["server_rss_mb"]) for s in second_half]
    heap2 = [(s["t"], s["heap_heapinuse_mb"]) for s in second_half if "heap_heapinuse_mb" in s]
    check = [abs(s["status_minus_index"]) for s in samples if "status_minus_index" in s]
    ran = int(max(at_load_end["finished"] - samples[0]["finished"], 1))

    def per_execution(key: str, digits: int = 4) -> float | None:
        """How much of a cumulative figure (CPU seconds, API requests) one execution of
        the load took: its growth over the load / executions finished."""
        if key not in at_load_end or key not in samples[0]:
            return None
        return round(float(at_load_end[key] - samples[0][key]) / ran, digits)

    def due_not_retired(s: dict[str, Any]) -> int | None:
        """Executions that ended over `--retain` seconds before sample `s` and were still
        held then: retention's backlog (the finished count of the last sample at or
        before s.t - retain; warm-ups count as ended before the load)."""
        if args.retain is None or not args.retain:
            return None
        ended = [x["finished"] for x in samples if x["t"] <= s["t"] - args.retain]
        due = WARM + (ended[-1] if ended else 0) if s["t"] >= args.retain else 0
        return max(int(due - s["retired"]), 0)

    def idle_growth(key: str) -> float | None:
        return round(at_end[key] - at_load_end[key], 2) if key in at_end and key in at_load_end else None

    return {
        "rate": args.rate,
        "concurrency": args.concurrency,
        "load_s": round(load_end, 1),
        "idle_s": round(at_end["t"] - load_end, 1),
        "sync": args.sync,
        "started": load.started,
        "completed": load.completed,
        "failed": load.failed,
        "not_finished": not_finished,
        "results_checked": load.checked,
        "errors": load.errors,
        "late_starts": load.late,
        "run": WARM + load.started,
        "retained_load_end": at_load_end["retained"],
        "retained_after_idle": at_end["retained"],
        "retained_max": max(s["retained"] for s in samples),
        "retired": at_end["retired"],
        "retired_load_end": at_load_end["retired"],
        "due_not_retired_load_end": due_not_retired(at_load_end),
        "due_not_retired_after_idle": due_not_retired(at_end),
        "status_minus_index_max": max(check) if check else None,
        "executions_per_s": round(at_load_end["finished"] / load_end, 1) if load_end else None,
        "server_cpu_ms_per_execution": None if (c := per_execution("server_cpu_s")) is None else round(c * 1000, 2),
        "pod_cpu_ms_per_execution": None if (c := per_execution("pod_cpu_s")) is None else round(c * 1000, 2),
        "js_api_requests_per_execution": per_execution("js_api_total", 2),
        "server_cpu_s_idle": idle_growth("server_cpu_s"),
        "js_api_requests_idle": idle_growth("js_api_total"),
        "server_rss_mb_empty": round(empty_mb, 2),
        "server_varz_mem_mb_empty": empty.get("varz_mem_mb"),
        "server_heap_inuse_mb_empty": empty_heap.get("heap_heapinuse_mb"),
        "server_rss_mb_after_warmup": round(idle_rss / MB, 2),
        "server_rss_mb_load_end": at_load_end["server_rss_mb"],
        "server_rss_mb_after_idle": at_end["server_rss_mb"],
        "server_mb_above_empty_after_idle": round(at_end["server_rss_mb"] - empty_mb, 2),
        "server_rss_mb_peak": max(s["server_rss_mb"] for s in samples),
        "server_kb_per_retained_load_end": per_exec_kb(at_load_end),
        "server_kb_per_retained_after_idle": per_exec_kb(at_end),
        "server_slope_mb_per_h": slope_per_hour(rss_points2),
        "server_flat_ratio": round(max(rss2) / min(rss2), 3) if rss2 and min(rss2) > 0 else None,
        "server_flat_ratio_5min": flat_ratio_of_means(rss_points2),
        "server_trend_percent": trend_percent(rss_points2),
        "heap_inuse_mb_load_end": at_load_end.get("heap_heapinuse_mb"),
        "heap_inuse_mb_after_idle": at_end.get("heap_heapinuse_mb"),
        "heap_alloc_mb_after_idle": at_end.get("heap_heapalloc_mb"),
        "heap_sys_mb_load_end": at_load_end.get("heap_heapsys_mb"),
        "heap_released_mb_after_idle": at_end.get("heap_heapreleased_mb"),
        "heap_slope_mb_per_h": slope_per_hour(heap2),
        "varz_mem_mb_load_end": at_load_end.get("varz_mem_mb"),
        "varz_mem_mb_after_idle": at_end.get("varz_mem_mb"),
        "pod_slope_mb_per_h": slope_per_hour([(s["t"], s["pod_rss_mb"]) for s in second_half]),
        "pod_rss_mb_load_end": at_load_end["pod_rss_mb"],
        "pod_rss_mb_after_idle": at_end["pod_rss_mb"],
        "disk_mb_load_end": at_load_end["disk_mb"],
        "disk_mb_after_idle": at_end["disk_mb"],
        "disk_kb_per_retained_load_end": round(at_load_end["disk_mb"] * 1024 / held, 2),
        "js_storage_mb_after_idle": at_end.get("js_storage_mb"),
        "per_retained_execution_by_stream": per_stream,
        "subjects_per_execution": round(sum(v["subjects"] for v in per_stream.values()), 2),
        "messages_per_execution": round(sum(v["messages"] for v in per_stream.values()), 2),
        "bytes_per_execution": round(sum(v["bytes"] for v in per_stream.values()), 1),
        "held_at_end_by_stream": {
            name: {what: at_end.get(f"{name}.{what}", 0) for what in ("messages", "subjects", "bytes", "deleted")}
            for name in streams
            if name in per_stream
        },
    }


def write_files(samples: list[dict[str, Any]], load_end: float, out: Path, tag: str) -> dict[str, str]:
    """The samples as CSV and, when matplotlib is importable, the plot."""
    files: dict[str, str] = {}
    columns = list(dict.fromkeys(k for s in samples for k in s))
    path = out / f"samples-{tag}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        w.writerows(samples)
    files["csv"] = str(path)
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: a file
        import matplotlib.pyplot as plt
    except ImportError:
        files["plot"] = "none: matplotlib is not installed (pip install matplotlib); the CSV has every sample"
        return files
    t = [s["t"] / 60 for s in samples]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ax.plot(t, [s["server_rss_mb"] for s in samples], label="server RSS", color="tab:red")
    ax.plot(t, [s["pod_rss_mb"] for s in samples], label="pod RSS (with its workers)", color="tab:blue")
    if any("heap_heapinuse_mb" in s for s in samples):
        ax.plot(
            t,
            [float(s.get("heap_heapinuse_mb", math.nan)) for s in samples],
            label="server Go heap in use",
            color="tab:orange",
        )
    ax.axvline(load_end / 60, color="grey", linestyle="--", label="load ends")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MB")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(t, [s["retained"] for s in samples], label="executions retained (INDEX)", color="tab:green")
    ax2.plot(t, [s["retired"] for s in samples], label="executions retired", color="tab:olive", linestyle=":")
    ax2.set_ylabel("executions")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left")
    ax.set_title(f"soak {tag}")
    fig.tight_layout()
    png = out / f"soak-{tag}.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    files["plot"] = str(png)
    return files


def compare_plot(results: dict[str, list[dict[str, Any]]], out: Path) -> str:
    """Every run's server RSS against executions retained, on one plot (from the CSVs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "none: matplotlib is not installed"
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name, runs in results.items():
        for r in runs:
            with open(r["files"]["csv"], newline="") as f:
                rows = list(csv.DictReader(f))
            ax.plot(
                [float(x["t"]) / 60 for x in rows],
                [float(x["server_rss_mb"]) for x in rows],
                label=f"{name} server RSS ({Path(r['files']['csv']).stem.removeprefix('samples-')})",
                color={"old": "tab:grey", "short": "tab:blue"}.get(name, "tab:red"),
            )
            ax.axvline(r["load_s"] / 60, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("minutes (dashed: the load ends)")
    ax.set_ylabel("MB")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    ax.set_title(f"soak: server RSS, {' and '.join(results)}")
    fig.tight_layout()
    png = out / "soak-compare.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return str(png)


# --- the sides, alternating ----------------------------------------------------------------

ROWS = (
    ("executions started", "started"),
    ("not finished", "not_finished"),
    ("failed", "failed"),
    ("executions per s", "executions_per_s"),
    ("retained at load end (INDEX)", "retained_load_end"),
    ("retained after idle", "retained_after_idle"),
    ("retired", "retired"),
    ("ended > retain ago, not retired, at load end", "due_not_retired_load_end"),
    ("status - INDEX, max |diff|", "status_minus_index_max"),
    ("server CPU ms per execution (load)", "server_cpu_ms_per_execution"),
    ("pod main process CPU ms per execution", "pod_cpu_ms_per_execution"),
    ("JS API requests per execution", "js_api_requests_per_execution"),
    ("server CPU s during idle", "server_cpu_s_idle"),
    ("JS API requests during idle", "js_api_requests_idle"),
    ("server RSS empty, MB", "server_rss_mb_empty"),
    ("server RSS at load end, MB", "server_rss_mb_load_end"),
    ("server RSS after idle, MB", "server_rss_mb_after_idle"),
    ("server RSS peak, MB", "server_rss_mb_peak"),
    ("server KB per retained, load end", "server_kb_per_retained_load_end"),
    ("server KB per retained, after idle", "server_kb_per_retained_after_idle"),
    ("server MB above empty, after idle", "server_mb_above_empty_after_idle"),
    ("server slope, MB/h (2nd half)", "server_slope_mb_per_h"),
    ("server max/min RSS (2nd half)", "server_flat_ratio"),
    ("server max/min of 5-min means (2nd half)", "server_flat_ratio_5min"),
    ("server trend over 2nd half, %", "server_trend_percent"),
    ("heap in use empty, MB", "server_heap_inuse_mb_empty"),
    ("heap in use at load end, MB", "heap_inuse_mb_load_end"),
    ("heap in use after idle, MB", "heap_inuse_mb_after_idle"),
    ("heap allocated (live) after idle, MB", "heap_alloc_mb_after_idle"),
    ("heap released after idle, MB", "heap_released_mb_after_idle"),
    ("heap slope, MB/h (2nd half)", "heap_slope_mb_per_h"),
    ("varz mem at load end, MB", "varz_mem_mb_load_end"),
    ("pod RSS at load end, MB", "pod_rss_mb_load_end"),
    ("pod slope, MB/h (2nd half)", "pod_slope_mb_per_h"),
    ("disk at load end, MB", "disk_mb_load_end"),
    ("disk after idle, MB", "disk_mb_after_idle"),
    ("disk KB per retained, load end", "disk_kb_per_retained_load_end"),
    ("messages per execution", "messages_per_execution"),
    ("subjects per execution", "subjects_per_execution"),
    ("bytes per execution", "bytes_per_execution"),
)


def minutes_of(args: argparse.Namespace, side: str) -> float:
    """How long a side's load runs: `--marginal`'s for the long side (its tag or name)."""
    return float(args.marginal) if args.marginal is not None and side.startswith("long") else float(args.minutes)


MARGINAL_KEYS = (
    ("server_rss_kb", "server_rss_mb_after_idle"),
    ("heap_inuse_kb", "heap_inuse_mb_after_idle"),
    ("heap_alloc_kb", "heap_alloc_mb_after_idle"),
)


def marginal(short: dict[str, Any], long: dict[str, Any]) -> dict[str, Any]:
    """What one more retained execution costs the server once the load is over: the
    slope of each figure after idle between a short and a long run of the same load (KB
    per execution), and where the RSS line meets no execution (MB): what a server keeps
    after such a load whatever it retains (the Go heap's partly filled spans, its
    runtime). None where the two runs retained the same number."""
    n0, n1 = short.get("retained_after_idle") or 0, long.get("retained_after_idle") or 0
    out: dict[str, Any] = {"retained_short": n0, "retained_long": n1}
    for name, key in MARGINAL_KEYS:
        a, b = short.get(key), long.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and n1 != n0:
            out[f"{name}_per_further_execution"] = round((b - a) * 1024 / (n1 - n0), 3)
        else:
            out[f"{name}_per_further_execution"] = None
    slope = out["server_rss_kb_per_further_execution"]
    rss0 = short.get("server_rss_mb_after_idle")
    out["server_rss_mb_at_none_retained"] = (
        round(rss0 - slope * n0 / 1024, 1) if slope is not None and isinstance(rss0, int | float) else None
    )
    return out


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of each figure (the first round's for the rest)."""
    if len(rounds) == 1:
        return rounds[0]
    out = dict(rounds[0])
    for _, key in ROWS:
        values = [r[key] for r in rounds if r.get(key) is not None]
        out[key] = round(statistics.median(values), 2) if values else None
    return out


async def main_async(args: argparse.Namespace, sides: dict[str, Path], out: Path, head: str) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()

    def interrupted() -> None:  # first Ctrl-C: end the run, keep what was sampled; second: give up
        if stop.is_set() and me is not None:
            me.cancel()
        stop.set()

    loop.add_signal_handler(signal.SIGINT, interrupted)
    loop.add_signal_handler(signal.SIGTERM, interrupted)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            if stop.is_set():
                break
            minutes = minutes_of(args, name)
            say(f"round {r + 1} of {args.rounds}: {name} ({sides[name]}), {args.rate}/s for {minutes} min")
            results[name].append(await soak(sides[name], args, out, f"{name}-{r + 1}", say, stop))
    medians = {name: median_of(rs) for name, rs in results.items() if rs}
    cols = list(medians)
    say("")
    say(
        f"{args.rate}/s for {args.minutes} min, then {args.idle_minutes} min idle; sync {args.sync}; "
        f"{'3-node R3 cluster' if args.cluster else 'one server'}"
    )
    for c in cols:
        say(f"{c}: retention {medians[c]['retention']}")
    ratio = "old" in medians and "new" in medians
    say(f"{'':48}" + "".join(f"{c:>12}" for c in cols) + (f"{'new/old':>10}" if ratio else ""))
    for label, key in ROWS:
        line = f"{label:48}" + "".join(f"{medians[c].get(key)!s:>12}" for c in cols)
        o, n = (medians["old"].get(key), medians["new"].get(key)) if ratio else (None, None)
        if isinstance(o, int | float) and isinstance(n, int | float) and o:
            line += f"{n / o:>10.2f}"
        say(line)
    for c in cols:
        say(f"{c}: per retained execution at the load's end by stream (messages, subjects, bytes, deleted):")
        for stream, v in medians[c]["per_retained_execution_by_stream"].items():
            if any(v.values()):
                say(f"    {stream:14} {v['messages']:>6} {v['subjects']:>6} {v['bytes']:>9} {v['deleted']:>7}")
        for key in ("heap_top_load_end", "heap_top_after_idle"):
            if medians[c].get(key):
                say(f"{c}: {key}: {medians[c][key]}")
    summary: dict[str, Any] = {
        "bench": "soak",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "head": head,
        "baseline": args.baseline,
        "retain": args.retain,
        "archive": args.archive,
        "cluster": args.cluster,
        "server_env": dict(args.server_env or []),
        "duplicate_window": args.duplicate_window,
        "load_average": os.getloadavg(),
        "rounds": args.rounds,
        "out": str(out),
    }
    if ratio:
        summary["ratios_new_over_old"] = {
            key: round(medians["new"][key] / medians["old"][key], 3)
            for _, key in ROWS
            if isinstance(medians["old"].get(key), int | float)
            and isinstance(medians["new"].get(key), int | float)
            and medians["old"][key]
        }
    if args.marginal is not None and "short" in medians and "long" in medians:
        summary["marginal"] = marginal(medians["short"], medians["long"])
        say("per further retained execution, after idle (long - short) / (retained long - retained short):")
        for key, value in summary["marginal"].items():
            say(f"    {key:44} {value}")
    summary["sides"] = medians if len(cols) > 1 or args.rounds > 1 else None
    if summary["sides"] is None:
        summary.update(medians[cols[0]] if cols else {})
        del summary["sides"]
    if args.rounds > 1:
        summary["rounds_raw"] = results
    if len(cols) > 1:
        summary["compare_plot"] = compare_plot(results, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    say(f"files in {out}")
    return summary


def _name_value(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=100.0, help="executions started per second")
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the load runs")
    parser.add_argument("--concurrency", type=int, default=100, help="executions in flight at most")
    parser.add_argument("--idle-minutes", type=float, default=2.0, help="sampling on after the load, no new starts")
    parser.add_argument("--sample-seconds", type=float, default=2.0)
    add_sync_flag(parser)
    parser.add_argument("--baseline", help="an earlier commit to run first (and alternating with --rounds)")
    parser.add_argument(
        "--retain", type=float, help="ACTORS_RETAIN_FINISHED for the pod, seconds (default: the pod's own)"
    )
    parser.add_argument("--archive", help="ACTORS_ARCHIVE for the pod: off, objects or an absolute directory")
    parser.add_argument("--cluster", action="store_true", help="a 3-node cluster, every stream R3")
    parser.add_argument(
        "--server-env",
        action="append",
        type=_name_value,
        metavar="NAME=VALUE",
        help="the nats-server's environment (single server), e.g. GOMEMLIMIT=128MiB; repeatable",
    )
    parser.add_argument(
        "--duplicate-window",
        type=float,
        default=Layout().duplicate_window,
        metavar="SECONDS",
        help="ACTORS_DUPLICATE_WINDOW for the streams and the pod (default: the layout's)",
    )
    parser.add_argument(
        "--marginal",
        type=float,
        metavar="MINUTES",
        help="run the load twice, --minutes (side 'short') and MINUTES (side 'long'), on fresh servers "
        "alternating with --rounds, and print what one more retained execution costs after idle",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, help="where the CSV, PNG and summary go (default: a new temporary dir)")
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument(
        "--heap-top",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="no run: summarise saved heap profiles (heap-*.txt) as the summary's heap_top_* does",
    )
    args = parser.parse_args(argv)
    if args.heap_top:
        for f in args.heap_top:
            text = f.read_text()
            print(json.dumps({"file": str(f), **heap_stats(text), "top": heap_top(text, 12)}))
        return 0
    if args.rate <= 0 or args.minutes <= 0 or args.concurrency < 1 or args.sample_seconds <= 0:
        parser.error("--rate, --minutes, --sample-seconds must be positive and --concurrency at least 1")
    if args.server_env and args.cluster:
        parser.error("--server-env is for a single server")
    if args.idle_minutes < 0 or args.rounds < 1:
        parser.error("--idle-minutes must not be negative and --rounds at least 1")
    if args.retain is not None and args.retain < 0:
        parser.error("--retain must not be negative (0: kept for ever)")
    if args.archive is not None and args.archive not in ("off", "objects") and not os.path.isabs(args.archive):
        parser.error("--archive is off, objects or an absolute directory")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if args.marginal is not None and (args.baseline or args.marginal <= args.minutes):
        parser.error("--marginal runs this checkout only, for longer than --minutes")
    with checkout_of(args.baseline) as old:
        sides = {**({"old": old} if old is not None else {}), "new": ROOT}
        if args.marginal is not None:
            sides = {"short": ROOT, "long": ROOT}
        result = uvloop.run(main_async(args, sides, out, head.stdout.strip()))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
