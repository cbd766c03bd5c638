"""N concurrent retries due within the same second: how late their durable timers fire,
and how many fired exactly once. Against raw JetStream scheduled messages, same run.

    python -m bench.retry_timers [--n 5000] [--delay S] [--json-only] [--timeout 300]

What it does (everything in this process on uvloop, against its own nats-server):

1. Engine. A playbook with one step, ``tool: noop``, whose retry rule matches on the
   first attempt only::

       retry:
         - when: "{{ attempt == 1 }}"
           then: {max_attempts: 2, backoff: fixed, initial_delay: D}

   Attempt 1 succeeds, the rule matches (a success continuation with an explicit
   ``initial_delay``), so the engine logs ``retry.scheduled`` with ``due`` = log time
   of attempt 1's ``call.done`` + D and arms a durable timer: a ``Nats-Schedule: @at``
   message on ``exec.<p>.<id>.sch.0-2`` targeting ``exec.<p>.<id>.in.timer.0-2``. When
   it fires, the engine logs ``retry.due`` and issues attempt 2; the rule no longer
   matches and the execution completes. (The step cannot *fail* once and then succeed
   without outside state: an error retry cannot change its args. The timer path is the
   same for both reasons, ``_next_attempt`` in actors/core/decide.py.)

   To make N timers fall due within the same second, attempt 1's results must land
   within a second of each other. The engine, starter and projector start first
   (``start_roles``); N starts are published concurrently; once all N attempt-1
   commands wait (held by their decision records in the log; from an older engine, in
   the CMD work queue), a ``noop`` tool actor starts (concurrency n by
   default, and the layout's ``tool_max_ack_pending`` raised to match, so it takes them
   all in one fetch) and drains them in a burst. ``spread_s`` (max due - min due) and
   ``max_due_in_1s`` (most dues in any one-second window) say how well that worked. D defaults to 5 s + 1 s per 400
   executions so that every timer is armed before the first one is due; ``armed_late``
   counts the timers whose ``retry.scheduled`` record was stored less than 50 ms
   before due (those the engine delivers itself, without the server's scheduler).

2. Measures, from one ordered read of the whole EXEC stream (server store times):
   * ``late``: store time of the ``timer.fired`` input - due (the server's firing);
   * ``act``: store time of the decision record holding ``retry.due`` - due (the
     engine folded the timer and published attempt 2's command);
   * ``e2e``: store time of attempt 2's ``call.done`` - due;
   and counts, per execution, ``timer.fired`` inputs and attempt-2 ``command.issued``
   events (exactly once / never / more than once), and ``playbook.completed``.
   The ``retry.due`` event's ``late_ms`` (the engine's view) is checked against
   ``late``.

3. Raw baseline, after the engine run on the same server: a scratch stream with
   ``allow_msg_schedules``; N ``Nats-Schedule: @at`` messages published concurrently,
   due at the same offsets from each other as the engine's timers (millisecond
   aligned), each targeting its own subject; an ordered consumer on the targets.
   ``raw_late`` = store time of the target message - due; ``raw_recv`` = arrival in
   this process - due.

4. Prints a table, then one JSON object as the last line. The whole run is bounded by
   ``--timeout`` (asyncio; then the JSON line carries ``error`` and the exit code is 4),
   and by an alarm 60 s later that kills the server and exits if the loop is stuck.

Reading the figures: nats-server runs its scheduler at most every 250 ms (it clamps
the next pass to at least 250 ms away, server/scheduler.go ``resetTimer``), so of a
batch due within a few milliseconds the first message fires on time and the rest on
the next pass, ~250 ms late, raw or engine alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from actors.client import Client
from actors.engine.actor import Engine
from actors.natsio import MSG_ID, SCHEDULE, SCHEDULE_TARGET, schedule_at
from actors.pod.roles import Runtime, connect, start_roles
from actors.tools.actor import ToolActor
from actors.wire.events import CommandIssuedEvent, RetryDueEvent, RetryScheduledEvent, decision_decoder, event_decoder
from actors.wire.messages import StartMessage, encode, input_decoder
from streams.layout import (
    CMD_STREAM,
    EV,
    EXEC_STREAM,
    IN,
    LC,
    SCH,
    START_SUBJECT,
    Layout,
    class_of,
    execution_of,
    tool_log_consumer,
    type_of,
)
from streams.server import NatsServer, find_binary

RAW_STREAM = "RAWSCH"
TIMER_ID = "0-2"  # activation 0, attempt 2
_server: NatsServer | None = None  # for the hard-timeout alarm


# --- statistics -------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3) if not math.isnan(seconds) else math.nan


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": ms(pct(values, 50)),
        "p99": ms(pct(values, 99)),
        "max": ms(max(values) if values else math.nan),
        "min": ms(min(values) if values else math.nan),
    }


def densest_second(times: list[float]) -> int:
    """Most values in any closed window of one second."""
    s = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(s):
        while t - s[lo] > 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


async def wait_until(pred: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


def rss_mb_self() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def rss_mb_proc(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return math.nan


class CountingHandler(logging.Handler):
    """Counts warnings and errors of the actors' loggers (and keeps the first few)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


# --- engine -----------------------------------------------------------------------------


def playbook_yaml(delay: float) -> str:
    return f"""apiVersion: actors/v1
kind: Playbook
metadata:
  name: bench_retry_timers
  path: bench/retry_timers
workflow:
  - step: once_more
    tool: noop
    args: {{x: 1}}
    retry:
      - when: "{{{{ attempt == 1 }}}}"
        then: {{max_attempts: 2, backoff: fixed, initial_delay: {delay}, max_delay: {max(delay, 60.0)}}}
"""


@dataclass
class ExecTrace:
    due: float | None = None
    scheduled_stored: float | None = None  # decision record holding retry.scheduled
    sch_stored: list[float] = field(default_factory=list)  # schedule messages still in the stream
    fired: list[float] = field(default_factory=list)  # timer.fired inputs (store time)
    fired_direct: int = 0  # timer.fired published by the engine itself (due already passed)
    due_events: list[tuple[float, float]] = field(default_factory=list)  # (record stored, late_ms)
    attempt2_issued: int = 0
    attempt2_done: list[float] = field(default_factory=list)
    completed: bool = False
    failed: bool = False


async def read_exec_log(nc: NATS, n_expected: int) -> tuple[dict[str, ExecTrace], int, set[str]]:
    """One ordered pass over the EXEC stream: a trace per execution, the message count,
    and the header names seen on timer.fired inputs."""
    js = nc.jetstream()
    traces: dict[str, ExecTrace] = {}
    fired_headers: set[str] = set()
    info = await nc.jsm().stream_info(EXEC_STREAM)
    total = info.state.messages
    if not total:
        return traces, 0, fired_headers
    sub = await js.subscribe("exec.>", stream=EXEC_STREAM, ordered_consumer=True, pending_msgs_limit=-1)
    count = 0
    try:
        while True:
            msg = await sub.next_msg(timeout=15)
            count += 1
            md = msg.metadata
            stored = float(md.timestamp.timestamp())
            tr = traces.setdefault(execution_of(msg.subject), ExecTrace())
            cls = class_of(msg.subject)
            if cls == EV:
                for ev in decision_decoder.decode(msg.data).events:
                    if isinstance(ev, RetryScheduledEvent):
                        tr.due = ev.data.due
                        tr.scheduled_stored = stored
                    elif isinstance(ev, RetryDueEvent):
                        tr.due_events.append((stored, ev.data.late_ms))
                    elif isinstance(ev, CommandIssuedEvent) and ev.data.attempt_number == 2:
                        tr.attempt2_issued += 1
            elif cls == IN:
                kind = type_of(msg.subject)
                if kind.startswith("timer."):
                    tr.fired.append(stored)
                    hdrs = msg.headers or {}
                    fired_headers.update(hdrs)
                    if ":timer:" in hdrs.get(MSG_ID, ""):
                        tr.fired_direct += 1
                elif kind.startswith("result."):
                    inp = input_decoder.decode(msg.data)
                    if getattr(inp, "attempt_number", 0) == 2 and type(inp).__name__ == "CallDone":
                        tr.attempt2_done.append(stored)
            elif cls == LC:
                ev = event_decoder.decode(msg.data)
                tr.completed |= ev.type == "playbook.completed"
                tr.failed |= ev.type in ("playbook.failed", "execution.cancelled")
            elif cls == SCH:
                tr.sch_stored.append(stored)
            if md.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return traces, count, fired_headers


async def engine_run(server: NatsServer, args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    n, delay = args.n, args.delay
    # the tool consumer must let the noop actor hold every attempt-1 command at once
    layout = Layout(tool_max_ack_pending=max(1024, args.tool_concurrency))
    nc = await connect(server.url, name="bench-engine")
    runtime: Runtime | None = None
    tools: ToolActor | None = None
    terminal = 0

    async def on_terminal(msg: Msg) -> None:
        nonlocal terminal
        terminal += 1

    try:
        runtime = await start_roles(nc, layout=layout, roles=("engine", "projector"))
        client = Client(nc, layout=layout)
        with tempfile.TemporaryDirectory(prefix="bench-retry-") as tmp:
            pb = Path(tmp) / "retry_timers.yaml"
            pb.write_text(playbook_yaml(delay))
            entry = await client.register(pb)
        tsubs = [
            await nc.subscribe(subject, cb=on_terminal)
            for t in ("playbook.completed", "playbook.failed", "execution.cancelled")
            # the end on its own subject, or (semantics 5) in the last step's answer record
            for subject in (f"exec.*.*.lc.{t}", f"exec.*.*.in.answer.lc.{t}")
        ]
        js, jsm = nc.jetstream(), nc.jsm()

        t0 = time.time()
        futs = []
        for i in range(n):
            eid = f"rt{i:06d}"
            start = StartMessage(playbook=entry.path, version=entry.version, payload={}, execution_id=eid)
            futs.append(await js.publish_async(START_SUBJECT, encode(start), headers={MSG_ID: eid}))
        await asyncio.gather(*futs)
        t_published = time.time()

        async def queued() -> bool:
            # each attempt-1 command is held by its decision record in the log (semantics
            # 2, consumer tools-noop-log) or, from an older engine, queued in CMD
            held = (await jsm.consumer_info(EXEC_STREAM, tool_log_consumer("noop"))).num_pending
            return (await jsm.stream_info(CMD_STREAM)).state.messages + held >= n

        await wait_until(queued, timeout=args.timeout, what=f"{n} attempt-1 commands in CMD")
        t_queued = time.time()
        say(
            f"{n} starts published in {t_published - t0:.2f} s; all attempt-1 commands queued after "
            f"{t_queued - t0:.2f} s; starting the noop tool actor"
        )
        tools = ToolActor(nc, layout=layout, kinds=("noop",), concurrency=args.tool_concurrency)
        await tools.start()
        t_tools = time.time()

        async def all_terminal() -> bool:
            return terminal >= n

        await wait_until(all_terminal, timeout=args.timeout, what=f"{n} executions to end", interval=0.2)
        t_done = time.time()
        engine_rss = rss_mb_self()  # peak so far: before this process reads the whole log
        await asyncio.sleep(args.settle)  # room for a late second firing to show up
        # execution actors still alive once every execution ended and --settle passed
        actors_left = sum(len(e.actors) for e in runtime.find(Engine) if isinstance(e, Engine))
        for ts in tsubs:
            await ts.unsubscribe()
        traces, msgs, fired_headers = await read_exec_log(nc, n)
        sch_left = sum(len(t.sch_stored) for t in traces.values())
    finally:
        if tools is not None:
            await tools.stop()
        if runtime is not None:
            await runtime.stop()
        await nc.close()

    dues = [t.due for t in traces.values() if t.due is not None]
    late, act, e2e, view_diff = [], [], [], []
    fired_once = fired_zero = fired_more = a2_once = a2_zero = a2_more = 0
    armed_late = direct = 0
    for t in traces.values():
        nf = len(t.fired)
        fired_once += nf == 1
        fired_zero += nf == 0
        fired_more += nf > 1
        a2_once += t.attempt2_issued == 1
        a2_zero += t.attempt2_issued == 0
        a2_more += t.attempt2_issued > 1
        direct += t.fired_direct
        if t.due is None:
            continue
        if t.scheduled_stored is not None and t.scheduled_stored > t.due - 0.05:
            armed_late += 1
        if t.fired:
            late.append(min(t.fired) - t.due)
        if t.due_events:
            stored, late_ms = t.due_events[0]
            act.append(stored - t.due)
            if t.fired:
                view_diff.append(abs(late_ms - (min(t.fired) - t.due) * 1000))
        if t.attempt2_done:
            e2e.append(min(t.attempt2_done) - t.due)
    completed = sum(t.completed for t in traces.values())
    failed = sum(t.failed for t in traces.values())
    armed_last = max((t.scheduled_stored or 0.0) for t in traces.values()) if traces else math.nan
    return {
        "executions_seen": len(traces),
        "exec_msgs": msgs,
        "dues": dues,
        "spread_s": round(max(dues) - min(dues), 3) if dues else math.nan,
        "max_due_in_1s": densest_second(dues),
        "first_due_after_last_armed_s": round(min(dues) - armed_last, 3) if dues else math.nan,
        "armed_late": armed_late,
        "direct_fires": direct,
        "late": late,
        "act": act,
        "e2e": e2e,
        "late_ms_view_max_diff": round(max(view_diff), 3) if view_diff else math.nan,
        "fired_once": fired_once,
        "fired_zero": fired_zero,
        "fired_more": fired_more,
        "attempt2_once": a2_once,
        "attempt2_zero": a2_zero,
        "attempt2_more": a2_more,
        "completed": completed,
        "failed": failed,
        "sch_left": sch_left,
        "fired_headers": sorted(fired_headers),
        "start_to_queued_s": round(t_queued - t0, 3),
        "tools_start_to_all_done_s": round(t_done - t_tools, 3),
        "actors_proc_max_rss_mb": engine_rss,
        "engine_actors_left": actors_left,
    }


# --- raw JetStream baseline -------------------------------------------------------------


async def raw_run(server: NatsServer, offsets: list[float], args: argparse.Namespace) -> dict[str, Any]:
    n = len(offsets)
    nc = await connect(server.url, name="bench-raw")
    js = nc.jetstream()
    stored: dict[str, list[float]] = {}
    recv: dict[str, float] = {}
    got = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        now = time.time()
        key = msg.subject.rsplit(".", 1)[1]
        stored.setdefault(key, []).append(float(msg.metadata.timestamp.timestamp()))
        recv.setdefault(key, now)
        if len(recv) >= n:
            got.set()

    try:
        await js.add_stream(
            api.StreamConfig(
                name=RAW_STREAM,
                subjects=["rawsch.>"],
                storage=api.StorageType.FILE,
                num_replicas=1,
                retention=api.RetentionPolicy.LIMITS,
                allow_msg_schedules=True,
                allow_direct=True,
            )
        )
        sub = await js.subscribe(
            "rawsch.in.>", stream=RAW_STREAM, ordered_consumer=True, cb=on_msg, pending_msgs_limit=-1
        )
        # publishing N schedules takes a moment: start the first due well after that
        base = math.ceil((time.time() + args.raw_lead) * 1000) / 1000
        dues = [round(base + off, 3) for off in offsets]  # millisecond aligned, as @at is
        futs = []
        for i, due in enumerate(dues):
            futs.append(
                await js.publish_async(
                    f"rawsch.sch.{i}",
                    b'{"i": %d}' % i,
                    headers={MSG_ID: f"raw:{i}", SCHEDULE: schedule_at(due), SCHEDULE_TARGET: f"rawsch.in.{i}"},
                )
            )
        await asyncio.gather(*futs)
        published_last = time.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got.wait(), max(dues) - time.time() + args.raw_wait)
        await asyncio.sleep(args.settle)
        await sub.unsubscribe()
        sch_left = 0
        info = await nc.jsm().stream_info(RAW_STREAM, subjects_filter="rawsch.sch.>")
        sch_left = sum((info.state.subjects or {}).values())
        await js.delete_stream(RAW_STREAM)
    finally:
        await nc.close()
    late, rlate = [], []
    for i, due in enumerate(dues):
        key = str(i)
        if key in stored:
            late.append(min(stored[key]) - due)
            rlate.append(recv[key] - due)
    counts = [len(stored.get(str(i), [])) for i in range(n)]
    return {
        "late": late,
        "recv": rlate,
        "fired_once": sum(c == 1 for c in counts),
        "fired_zero": sum(c == 0 for c in counts),
        "fired_more": sum(c > 1 for c in counts),
        "sch_left": sch_left,
        "first_due_after_last_published_s": round(min(dues) - published_last, 3),
    }


# --- main -------------------------------------------------------------------------------


def nats_server_version() -> str:
    out = subprocess.run([find_binary(), "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip().rsplit(" ", 1)[-1] if out else "unknown"


def server_log_problems(server: NatsServer) -> tuple[int, list[str]]:
    try:
        lines = (server.store / "nats-server.log").read_text(errors="replace").splitlines()
    except OSError:
        return 0, []
    bad = [ln for ln in lines if "[ERR]" in ln or "[WRN]" in ln or "[FTL]" in ln]
    return len(bad), bad[:5]


async def main_async(args: argparse.Namespace, logs: CountingHandler) -> dict[str, Any]:
    global _server
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    t0 = time.time()
    server = _server = await NatsServer.start()
    try:
        async with asyncio.timeout(args.timeout):
            eng = await engine_run(server, args, say)
            dues = eng.pop("dues")
            if not dues:
                raise RuntimeError("no retry.scheduled event in the log")
            first = min(dues)
            raw = await raw_run(server, [d - first for d in dues], args)
        server_rss = rss_mb_proc(server.proc.pid)
        srv_problems, srv_first = server_log_problems(server)
    finally:
        try:
            await server.stop()
        finally:
            kill_server()
    wall = time.time() - t0

    el, ea, ee = summary(eng.pop("late")), summary(eng.pop("act")), summary(eng.pop("e2e"))
    rl, rr = summary(raw.pop("late")), summary(raw.pop("recv"))

    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b and not math.isnan(a) and not math.isnan(b) else math.nan

    result: dict[str, Any] = {
        "n": args.n,
        "delay_s": args.delay,
        "spread_s": eng["spread_s"],
        "max_due_in_1s": eng["max_due_in_1s"],
        "engine_late_p50_ms": el["p50"],
        "engine_late_p99_ms": el["p99"],
        "engine_late_max_ms": el["max"],
        "engine_late_min_ms": el["min"],
        "engine_act_p50_ms": ea["p50"],
        "engine_act_p99_ms": ea["p99"],
        "engine_act_max_ms": ea["max"],
        "engine_e2e_p50_ms": ee["p50"],
        "engine_e2e_p99_ms": ee["p99"],
        "engine_e2e_max_ms": ee["max"],
        "raw_late_p50_ms": rl["p50"],
        "raw_late_p99_ms": rl["p99"],
        "raw_late_max_ms": rl["max"],
        "raw_late_min_ms": rl["min"],
        "raw_recv_p50_ms": rr["p50"],
        "raw_recv_p99_ms": rr["p99"],
        "raw_recv_max_ms": rr["max"],
        "ratio_late_p50": ratio(el["p50"], rl["p50"]),
        "ratio_late_p99": ratio(el["p99"], rl["p99"]),
        "fired_once": eng["fired_once"],
        "fired_zero": eng["fired_zero"],
        "fired_more": eng["fired_more"],
        "attempt2_once": eng["attempt2_once"],
        "attempt2_zero": eng["attempt2_zero"],
        "attempt2_more": eng["attempt2_more"],
        "completed": eng["completed"],
        "failed": eng["failed"],
        "executions_seen": eng["executions_seen"],
        "armed_late": eng["armed_late"],
        "direct_fires": eng["direct_fires"],
        "first_due_after_last_armed_s": eng["first_due_after_last_armed_s"],
        "late_ms_view_max_diff": eng["late_ms_view_max_diff"],
        "sch_left": eng["sch_left"],
        "raw_fired_once": raw["fired_once"],
        "raw_fired_zero": raw["fired_zero"],
        "raw_fired_more": raw["fired_more"],
        "raw_sch_left": raw["sch_left"],
        "raw_first_due_after_last_published_s": raw["first_due_after_last_published_s"],
        "fired_headers": eng["fired_headers"],
        "start_to_queued_s": eng["start_to_queued_s"],
        "tools_start_to_all_done_s": eng["tools_start_to_all_done_s"],
        "exec_msgs": eng["exec_msgs"],
        "actors_proc_max_rss_mb": eng["actors_proc_max_rss_mb"],
        "engine_actors_left": eng["engine_actors_left"],
        "server_rss_mb": server_rss,
        "log_warnings": logs.count,
        "server_log_problems": srv_problems,
        "wall_s": round(wall, 1),
        "python": platform.python_version(),
        "nats_server": nats_server_version(),
    }
    say(
        f"{args.n} retries, fixed delay {args.delay} s, nats-server {result['nats_server']}, "
        f"python {result['python']}, uvloop"
    )
    say(
        f"dues: spread {result['spread_s']} s, at most {result['max_due_in_1s']} in one second; first due "
        f"{result['first_due_after_last_armed_s']} s after the last timer was armed ({result['armed_late']} armed late)"
    )
    say(f"{'ms after due':40}{'p50':>10}{'p99':>10}{'max':>10}")
    for name, s in (
        ("engine: timer.fired stored", el),
        ("engine: retry.due decided (cmd sent)", ea),
        ("engine: attempt 2 call.done stored", ee),
        ("raw: scheduled target stored", rl),
        ("raw: target received by consumer", rr),
    ):
        say(f"{name:40}{s['p50']:>10.1f}{s['p99']:>10.1f}{s['max']:>10.1f}")
    say(f"{'ratio engine/raw (stored)':40}{result['ratio_late_p50']:>10.2f}{result['ratio_late_p99']:>10.2f}")
    say(
        f"timers fired exactly once {result['fired_once']}, never {result['fired_zero']}, more than once "
        f"{result['fired_more']}; attempt 2 issued once {result['attempt2_once']}, never {result['attempt2_zero']}, "
        f"twice+ {result['attempt2_more']}; COMPLETED {result['completed']}/{args.n}, failed {result['failed']}"
    )
    say(
        f"raw: fired once {result['raw_fired_once']}, never {result['raw_fired_zero']}, more "
        f"{result['raw_fired_more']}; schedules left in stream: "
        f"engine {result['sch_left']}, raw {result['raw_sch_left']}"
    )
    say(
        f"actors process max RSS {result['actors_proc_max_rss_mb']} MB (all actors, at the end; after --settle "
        f"{result['engine_actors_left']} execution actors left), nats-server max RSS {result['server_rss_mb']} MB; "
        f"actor log warnings {logs.count}, server log warnings/errors {srv_problems}; wall {result['wall_s']} s"
    )
    for line in logs.first + srv_first:
        say(f"  log: {line}")
    return result


def kill_server() -> None:
    """SIGKILL the server's process group if it is still there (it runs in its own
    session); then forget it."""
    global _server
    srv, _server = _server, None
    if srv is not None and srv.proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()


def _hard_timeout(signum: int, frame: Any) -> None:
    """The loop is stuck past --timeout: kill the server and leave."""
    kill_server()
    sys.stderr.write("retry_timers: hard timeout, server killed\n")
    os._exit(124)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=5000, help="concurrent executions, one retry timer each")
    parser.add_argument("--delay", type=float, default=None, help="retry delay D in s (default 5 + n/400)")
    parser.add_argument(
        "--tool-concurrency",
        type=int,
        default=None,
        help="noop tool actor concurrency (default n: attempt 1 is drained in one fetch)",
    )
    parser.add_argument("--settle", type=float, default=2.0, help="s to wait after the end for late duplicates")
    parser.add_argument(
        "--raw-lead", type=float, default=None, help="s from now to the first raw due (default 3 + n/2000)"
    )
    parser.add_argument("--raw-wait", type=float, default=30.0, help="s to wait for raw targets after the last due")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on the whole run, s")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    if args.delay is None:
        args.delay = round(5 + args.n / 400, 1)
    if args.tool_concurrency is None:
        args.tool_concurrency = args.n
    if args.raw_lead is None:
        args.raw_lead = 3 + args.n / 2000
    logs = CountingHandler()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger().addHandler(logs)
    signal.signal(signal.SIGALRM, _hard_timeout)
    signal.alarm(int(args.timeout) + 60)
    try:
        result = uvloop.run(main_async(args, logs))
    except TimeoutError as e:
        print(json.dumps({"n": args.n, "error": str(e) or f"run exceeded --timeout {args.timeout:g} s"}), flush=True)
        return 4
    finally:
        signal.alarm(0)
        kill_server()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
