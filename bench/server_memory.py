"""What the server holds per retained execution once a load has stopped, by subject
layout (issue #34 item 1): the same messages stored under the subjects semantics 3
writes, or under fewer subjects per execution, each in a fresh nats-server, then
left idle; the server's memory is sampled until the end of the idle spell.

    python -m bench.server_memory                       # 50,000 executions, 5 minutes idle
    python -m bench.server_memory --executions 20000 --idle-minutes 2 --gogc 50

No engine runs: every execution is the 8 messages a 3-step python workflow stores in
EXEC (docs/architecture.md "Stored writes"), each with its message id, published as
fast as the server takes them. Layouts:

* `today`: the subjects semantics 3 writes, one per message but for the two decisions
  holding a python command (`in.start`, `lc.playbook.initialized.cmd.python`,
  `in.result.<command>` three times, `ev.cmd.python` twice, `lc.playbook.completed`):
  7 subjects per execution;
* `results`: the command results on one subject (`in.result`): 5 subjects;
* `two`: an execution's inputs on one subject and its records on another: 2.

The baseline is `today`, run in the same process, alternating with the others round
by round. Figures: the server's RSS right after the load and at the
end of the idle spell, and what it holds above an empty server per retained execution
then (KB). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import nats

from streams.server import NatsServer

LAYOUTS = ("today", "results", "two")
BODY_BYTES = 800  # about what an EXEC message of the soak's workload holds (bench.soak: 6.75 KB in 8)


def subjects_of(layout: str, partition: int, execution_id: str) -> list[str]:
    """The subjects of one execution's 8 messages, in the order a workflow stores them."""
    p = f"exec.{partition}.{execution_id}"
    if layout == "today":
        return [
            f"{p}.in.start",
            f"{p}.lc.playbook.initialized.cmd.python",
            f"{p}.in.result.a1-1",
            f"{p}.ev.cmd.python",
            f"{p}.in.result.a2-1",
            f"{p}.ev.cmd.python",
            f"{p}.in.result.a3-1",
            f"{p}.lc.playbook.completed",
        ]
    if layout == "results":
        return [
            f"{p}.in.start",
            f"{p}.lc.playbook.initialized.cmd.python",
            f"{p}.in.result",
            f"{p}.ev.cmd.python",
            f"{p}.in.result",
            f"{p}.ev.cmd.python",
            f"{p}.in.result",
            f"{p}.lc.playbook.completed",
        ]
    if layout == "two":
        return [f"{p}.in", f"{p}.out", f"{p}.in", f"{p}.out", f"{p}.in", f"{p}.out", f"{p}.in", f"{p}.out"]
    raise ValueError(layout)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def one_run(layout: str, *, executions: int, idle_s: float, sample_s: float, gogc: int | None) -> dict[str, Any]:
    """One layout in a fresh server: load, then idle; the figures of the run."""
    env = {"GOGC": str(gogc)} if gogc is not None else None
    server = await NatsServer.start(env=env)
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="EXEC", subjects=["exec.>"])
        await asyncio.sleep(1.0)
        empty = rss_mb(server.proc.pid)
        body = b"x" * BODY_BYTES
        started = time.monotonic()
        for first in range(0, executions, 500):
            acks = []
            for i in range(first, min(executions, first + 500)):
                eid = f"ex-{i:010d}-bench"
                for k, subject in enumerate(subjects_of(layout, i % 16, eid)):
                    acks.append(await js.publish_async(subject, body, headers={"Nats-Msg-Id": f"{eid}:{k}"}))
            await asyncio.gather(*acks)
            if first % 10_000 == 0:
                print(f"  {layout}: {first + 500:>7} of {executions} stored", file=sys.stderr, flush=True)
        load_s = time.monotonic() - started
        after_load = rss_mb(server.proc.pid)
        samples = [(0.0, after_load)]
        quiet_from = time.monotonic()
        while time.monotonic() - quiet_from < idle_s:
            await asyncio.sleep(min(sample_s, idle_s - (time.monotonic() - quiet_from)))
            samples.append((time.monotonic() - quiet_from, rss_mb(server.proc.pid)))
        after_idle = samples[-1][1]
        await nc.close()
    finally:
        await server.stop()
    return {
        "layout": layout,
        "subjects_per_execution": len(set(subjects_of(layout, 0, "x"))),
        "load_s": round(load_s, 1),
        "rss_mb_empty": round(empty, 1),
        "rss_mb_after_load": round(after_load, 1),
        "rss_mb_after_idle": round(after_idle, 1),
        "kb_per_execution_after_idle": round((after_idle - empty) * 1024 / executions, 3),
        "kb_per_execution_after_load": round((after_load - empty) * 1024 / executions, 3),
        "samples": [(round(t), round(m, 1)) for t, m in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=50_000)
    parser.add_argument("--idle-minutes", type=float, default=5.0, help="how long after the load the figure is read")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--gogc", type=int, default=None, help="GOGC for the server (default: Go's, 100)")
    args = parser.parse_args()
    layouts = ["today", *[x for x in args.layouts if x != "today"]]
    runs: dict[str, list[dict[str, Any]]] = {x: [] for x in layouts}
    for r in range(args.rounds):
        order = layouts if r % 2 == 0 else list(reversed(layouts))
        for layout in order:
            print(f"round {r + 1} of {args.rounds}: {layout}", file=sys.stderr, flush=True)
            run = asyncio.run(
                one_run(
                    layout,
                    executions=args.executions,
                    idle_s=args.idle_minutes * 60,
                    sample_s=args.sample_seconds,
                    gogc=args.gogc,
                )
            )
            runs[layout].append(run)
            print(
                f"  {layout}: {run['kb_per_execution_after_load']:.2f} KB per execution after the load, "
                f"{run['kb_per_execution_after_idle']:.2f} KB after {args.idle_minutes:g} min idle",
                file=sys.stderr,
                flush=True,
            )
    medians = {
        x: {
            k: statistics.median(run[k] for run in rs)
            for k in ("kb_per_execution_after_load", "kb_per_execution_after_idle", "rss_mb_after_idle")
        }
        | {"subjects_per_execution": rs[0]["subjects_per_execution"]}
        for x, rs in runs.items()
    }
    base = medians["today"]["kb_per_execution_after_idle"]
    print(f"\n{args.executions:,} executions of 8 messages; medians of {args.rounds} round(s); GOGC {args.gogc or 100}")
    print(f"{'layout':<10}{'subjects':>10}{'KB/exec load end':>18}{'KB/exec idle':>14}{'vs today':>10}")
    for x, m in medians.items():
        ratio = m["kb_per_execution_after_idle"] / base if base else float("nan")
        print(
            f"{x:<10}{m['subjects_per_execution']:>10}{m['kb_per_execution_after_load']:>18.2f}"
            f"{m['kb_per_execution_after_idle']:>14.2f}{ratio:>10.2f}"
        )
        m["ratio_to_today_after_idle"] = round(ratio, 3)
    print(
        json.dumps(
            {
                "bench": "server_memory",
                "date": time.strftime("%Y-%m-%d"),
                "executions": args.executions,
                "idle_minutes": args.idle_minutes,
                "gogc": args.gogc,
                "rounds": args.rounds,
                "medians": medians,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
