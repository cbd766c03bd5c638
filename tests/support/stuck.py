"""The report of a test that found executions not finished: where each stopped, what
the consumers hold, what the pods logged and what their tasks wait on. What an operator
would look at first, so that a rare failure says why the first time it happens."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from actors.client import Client
from actors.loops.counter import Counter
from actors.natsio.metadata import stream_seq
from actors.natsio.readall import read_all
from actors.pod import taskdump
from actors.pod.roles import Runtime
from actors.wire.messages import ResultBatch, loop_input_decoder
from streams.layout import LOOP_STREAM, TOOL_KINDS, counter_consumer, engine_consumer, tool_consumer, tool_log_consumer
from tests.support.pods import PodProcess


async def stuck_report(
    client: Client,
    stuck: list[str],
    *,
    logs: Path | None = None,
    pods: Sequence[PodProcess] = (),
    in_process: bool = False,
    runtime: Runtime | None = None,
) -> str:
    """`logs`: a directory of pod logs (their warnings and errors are quoted); `pods`:
    pod processes to ask for a task dump; `in_process`: the actors run in this process
    (its own tasks are dumped)."""
    lines = [f"{len(stuck)} executions did not finish"]
    try:
        await _consumers_and_logs(client, stuck, lines)
    except Exception as e:  # the report must come out even if NATS is half there
        lines.append(f"(reading the streams failed: {e!r})")
    if logs is not None:
        for log in sorted(await asyncio.to_thread(lambda: list(logs.iterdir()))):
            notable = [
                ln
                for ln in log.read_text(errors="replace").splitlines()
                if "ERROR" in ln or "WARNING" in ln or "Traceback" in ln
            ]
            lines += [f"{log.name}: {ln}" for ln in notable[:10]]
    for pod in pods:
        if pod.role in ("tools", "engine", "counter", "all"):
            lines.append(f"--- {pod.log.name}\n{await pod.dump_tasks()}")
    if runtime is not None:
        lines += _loops_in_memory(runtime, stuck)
    if in_process:
        lines.append(taskdump.describe_tasks())
    return "\n".join(lines)


async def _loop_log(client: Client, subject: str) -> list[str]:
    """Each message of a loop's log: its sequence, type and the commands it answers."""
    lines = []
    for msg in await read_all(client.nc, LOOP_STREAM, subject):
        inp = loop_input_decoder.decode(msg.data)
        answers = sorted(r.command_id for r in inp.results) if isinstance(inp, ResultBatch) else []
        lines.append(f"    seq {stream_seq(msg)} {msg.subject.rsplit('.', 1)[-1]}: {answers}")
    return lines


def _loops_in_memory(runtime: Runtime, stuck: list[str]) -> list[str]:
    """What the counters of an in-process runtime hold of the stuck executions' loops."""
    lines = []
    for counter in runtime.find(Counter):
        assert isinstance(counter, Counter)
        for (eid, loop_id), actor in counter.actors.items():
            if eid not in stuck:
                continue
            run = actor.state
            lines.append(
                f"counter holds {eid}/{loop_id}: released {run.released}/{run.total} done {run.done} "
                f"inflight {sorted(run.inflight)[:10]} ready {list(run.ready)[:10]} waiting {dict(run.waiting)} "
                f"finished {run.finished} last_seq {actor.last_seq} hydrated {actor.hydrated} "
                f"replayed {actor.replayed} busy {actor.busy}"
            )
    return lines


async def _consumers_and_logs(client: Client, stuck: list[str], lines: list[str]) -> None:
    jsm = client.nc.jsm()
    for eid in stuck[:5]:
        tail = [(x.cls, x.type, x.step) for x in (await client.events(eid))[-6:]]
        p = client.layout.partition_of(eid)
        lines.append(f"{eid} (partition {p}): {tail}")
        loop = await jsm.stream_info("LOOP", subjects_filter=f"loop.{p}.{eid}.>")
        cmd = await jsm.stream_info("CMD", subjects_filter=f"cmd.*.{eid}.>")
        lines.append(f"  loop log {len(loop.state.subjects or {})} subjects; commands waiting {cmd.state.messages}")
        for subject, count in sorted((loop.state.subjects or {}).items())[:20]:
            lines.append(f"    {subject}: {count}")
        lines += await _loop_log(client, f"loop.{p}.{eid}.>")
    partitions = range(client.layout.partitions)
    consumers = [("EXEC", engine_consumer(p)) for p in partitions] + [("LOOP", counter_consumer(p)) for p in partitions]
    consumers += [("CMD", tool_consumer(kind)) for kind in TOOL_KINDS]
    consumers += [("EXEC", tool_log_consumer(kind)) for kind in TOOL_KINDS]  # commands held by decision records
    for stream, name in consumers:
        try:
            info = await jsm.consumer_info(stream, name)
        except Exception:
            continue  # a kind no pod serves has no consumer
        lines.append(
            f"{name}: pending {info.num_pending} ack_pending {info.num_ack_pending} "
            f"redelivered {info.num_redelivered} waiting {info.num_waiting} push_bound {info.push_bound}"
        )
    cmd_info = await jsm.stream_info("CMD")
    lines.append(f"CMD stream {cmd_info.state}")
    for seq in range(cmd_info.state.first_seq, min(cmd_info.state.last_seq + 1, cmd_info.state.first_seq + 20)):
        try:
            m = await jsm.get_msg("CMD", seq)
        except Exception:
            continue
        lines.append(f"CMD seq {seq} {m.subject} {m.headers}")
    kv = await client.js.key_value("owners")
    for k in await kv.keys():
        e = await kv.get(k)
        lines.append(f"owners {k} = {e.value!r}")
