"""Where an engine step's time goes: a waterfall of the median step.

    python -m bench.profile.step_trace [--steps 50] [--runs 10] [--tool python|sleep]

Runs the step_latency engine measurement with a few functions of the engine and the
tool actor wrapped (in this process only, nothing is changed on disk) to stamp
``time.time()`` at points of the critical path, and lines them up against the server's
store time of the input that started the step (same host clock):

    input stored -> engine callback -> fold done -> command PubAck -> decision PubAck
    -> input acked;  tool: command handled -> tool call done -> result PubAck
    -> next call.done stored

Prints the p50 (and p90) offset of each point from "input stored", in ms, and, as its
last line, a JSON object with the p50 offsets. The wrappers add a few microseconds per
point; use step_latency.py for the headline numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from typing import Any

import actors.engine.actor as engine_mod
import actors.runtime.outbox as outbox_mod
import actors.tools.actor as tools_mod
from actors.client import Client
from actors.natsio import stream_seq
from actors.tools.running import CommandRunner
from bench import step_latency as sl
from streams.layout import IN, class_of

# stamps[(execution_id, point)][key] = time.time(); key = input seq (engine) or command id (tool)
stamps: dict[str, dict[Any, float]] = defaultdict(dict)


def install() -> None:
    Engine, ExecutionActor, ToolActor = engine_mod.Engine, engine_mod.ExecutionActor, tools_mod.ToolActor

    on_msg = Engine._on_msg

    async def _on_msg(self: Any, msg: Any) -> None:
        if msg.reply:
            stamps["recv"][stream_seq(msg)] = time.time()
        await on_msg(self, msg)

    fold_input = ExecutionActor.fold_input

    async def _fold_input(self: Any, entry: Any, into: Any = None) -> Any:
        stamps["handle"][entry.seq] = time.time()
        out = await fold_input(self, entry, into)
        stamps["folded"][entry.seq] = time.time()
        return out

    publish_all = getattr(outbox_mod, "publish_all")  # noqa: B009

    async def _publish_all(js: Any, items: list[tuple[str, bytes, str]], **kw: Any) -> Any:
        acks = await publish_all(js, items, **kw)
        if items:
            # the outbox calls publish_all for commands, ..., then records
            msg_id = items[0][2]
            kind = "cmd_acked" if ":cmd:" in msg_id else "dec_acked"
            cause = current_cause.get(msg_id.split(":", 1)[0])
            if cause is not None:
                stamps[kind][cause] = time.time()
        return acks

    current_cause: dict[str, int] = {}
    publish = ExecutionActor.publish

    async def _publish(self: Any, out: Any) -> None:
        current_cause[self.execution_id] = out.cause
        await publish(self, out)

    handle = ExecutionActor.handle

    async def _handle(self: Any, batch: Any) -> None:
        await handle(self, batch)
        for msg in batch:
            stamps["acked"][stream_seq(msg)] = time.time()

    tool_handle = ToolActor._handle

    async def _tool_handle(self: Any, msg: Any) -> None:
        _, _, eid, cid = msg.subject.split(".", 3)  # cmd.<kind>.<execution>.<command>
        stamps["tool_got"][f"{cid}:{eid}"] = time.time()
        await tool_handle(self, msg)

    reply = CommandRunner.reply

    async def _reply(self: Any, cmd: Any, result: Any, error: Any, started: float, ended: float) -> None:
        await reply(self, cmd, result, error, started, ended)
        stamps["result_acked"][cmd.command_id + ":" + cmd.execution_id] = time.time()

    Engine._on_msg = _on_msg  # type: ignore[method-assign]
    ExecutionActor.fold_input = _fold_input  # type: ignore[method-assign]
    setattr(outbox_mod, "publish_all", _publish_all)  # noqa: B010
    ExecutionActor.publish = _publish  # type: ignore[method-assign,assignment]
    ExecutionActor.handle = _handle  # type: ignore[method-assign]
    ToolActor._handle = _tool_handle  # type: ignore[method-assign]
    CommandRunner.reply = _reply  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tool", choices=("python", "sleep"), default="python")
    args = parser.parse_args()
    install()
    rows: dict[str, list[float]] = defaultdict(list)
    engine_runs = sl.engine_runs

    async def traced_runs(client: Any, nc: Any, layout: Any, path: str, version: int, **kw: Any) -> Any:
        result = await engine_runs(client, nc, layout, path, version, **kw)
        stamps_all = await collect(client, nc, layout)
        for k, v in stamps_all.items():
            rows[k] += v
        return result

    eids: list[str] = []
    start = Client.start

    async def _start(self: Any, *a: Any, **kw: Any) -> str:
        eid: str = await start(self, *a, **kw)
        eids.append(eid)
        return eid

    Client.start = _start  # type: ignore[method-assign]

    async def collect(client: Any, nc: Any, layout: Any) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for eid in eids[1:]:  # not the warm-up
            msgs = await sl.stored_times(nc, layout, eid)
            ins = [(seq, at) for subj, _, seq, at in msgs if class_of(subj) == IN]
            done_items = sorted((i for i in await client.events(eid) if i.type == "call.done"), key=lambda i: i.seq)
            # input k (start record or call.done k-1) -> command of step k -> call.done k
            for (seq, at0), done in zip(ins, done_items, strict=False):
                if seq == ins[0][0]:
                    continue  # the start record: its fold parses the playbook; shown apart
                key = done.data["command_id"] + ":" + eid
                points = {
                    "engine callback": stamps["recv"].get(seq),
                    "fold start": stamps["handle"].get(seq),
                    "fold done": stamps["folded"].get(seq),
                    "command PubAck": stamps["cmd_acked"].get(seq),
                    "decision PubAck": stamps["dec_acked"].get(seq),
                    "input acked": stamps["acked"].get(seq),
                    "tool: command in hand": stamps["tool_got"].get(key),
                    "tool: call started": done.data["started_at"],
                    "tool: call done": done.data["ended_at"],
                    "tool: result PubAck": stamps["result_acked"].get(key),
                    "next input stored": done.at,
                }
                for name, t in points.items():
                    if t is not None:
                        out[name].append(t - at0)
        return out

    sl.engine_runs = traced_runs
    sys.argv = [sys.argv[0], "--steps", str(args.steps), "--runs", str(args.runs), "--tool", args.tool, "--json-only"]
    sl.main(sys.argv[1:])
    print(
        f"\nstep waterfall, offsets from 'input stored' (server time), steps 2..{args.steps}, "
        f"{args.runs} runs, {args.tool} steps:"
    )
    print(f"  {'point':26}{'p50 ms':>9}{'p90 ms':>9}")
    summary = {}
    order = sorted(rows, key=lambda k: sl.pct(rows[k], 50))
    for name in order:
        p50, p90 = sl.pct(rows[name], 50), sl.pct(rows[name], 90)
        summary[name] = sl.ms(p50)
        print(f"  {name:26}{sl.ms(p50):>9.3f}{sl.ms(p90):>9.3f}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
