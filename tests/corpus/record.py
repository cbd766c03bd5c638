"""Record the corpus: run each scenario's playbook to its end on a fresh embedded
nats-server with every actor in this process, and write every stored message of its
executions to `tests/corpus/<scenario>.jsonl` (tests/corpus/README.md).

    .venv/bin/python -m tests.corpus.record [--only NAME]... [--out DIR] [--force]

An existing file is never overwritten without `--force`: a corpus file is what an
earlier release decided, and re-recording it would erase the evidence a later change
is checked against (README, "When to re-record").

Each scenario gets a server of its own, so its streams hold its executions and nothing
else, and stream sequences start at 1: the file is the same whichever scenarios ran
before it. Actors run with the release's default settings (`Settings()`, not the
environment's `ACTORS_*`), so the limits a start record carries are the defaults."""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from actors.client import Client
from actors.config.settings import Settings
from actors.engine.fires import fire_start
from actors.pod.roles import connect, start_roles
from streams.layout import (
    BLOB_BUCKET,
    CMD_STREAM,
    EXEC_STREAM,
    LOOP_STREAM,
    PAYLOAD_BUCKET,
    PROJECTOR_CONSUMER,
    SCHEDULE_FIRES_CONSUMER,
    SCHEDULE_STREAM,
    START_STREAM,
    STARTER_CONSUMER,
    counter_consumer,
    engine_consumer,
    tool_consumer,
)
from streams.server import NatsServer
from streams.subjects import schedule_fire_subject
from tests.conftest import System, wait_for  # importing it also runs steps as the suite does
from tests.corpus.load import FORMAT, HERE, TERMINAL

PLAYBOOKS = HERE / "playbooks"
STREAMS = (EXEC_STREAM, LOOP_STREAM)  # the logs a replay folds: executions' and loops'
BUCKETS = (BLOB_BUCKET, PAYLOAD_BUCKET)  # where values too large for a message are
# a fixed key (32 bytes, no id: the id is derived from it): the file must hold it anyway
ENCRYPTION_KEY = base64.b64encode(bytes(range(32))).decode()
WAIT = 60.0  # seconds a scenario's execution may take before the recording gives up
# the tool actor names itself `<host>:<pid>` in every result it writes: the files are
# machine-independent with this host name instead
HOST = "corpus"


def semantics() -> int:
    """The engine's semantic version the start records carry (1 until it is versioned)."""
    try:
        from actors.core import replay
    except ImportError:
        return 1
    return int(getattr(replay, "SEMANTICS", 1))


def release() -> str:
    root = HERE.parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--tags", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(frozen=True)
class Recorded:
    """What a scenario ran: the execution the file is about, and when other executions
    ran beside it that are not part of the scenario, the only ones to record."""

    execution_id: str
    only: frozenset[str] | None = None


Run = Callable[["Recording"], Awaitable[Recorded]]


@dataclass(frozen=True)
class Scenario:
    name: str
    expect: str  # the scenario's final state; tests/pure/test_corpus_files.py checks the file says so
    run: Run
    payload_key: str | None = None


class Recording:
    """One scenario's system (a `tests.conftest.System`) and what its runs share."""

    def __init__(self, system: System, name: str) -> None:
        self.system = system
        self.name = name
        self.client: Client = system.client

    @property
    def eid(self) -> str:
        """The scenario's execution id: fixed, so a recording names the same executions."""
        return f"corpus-{self.name}"

    async def register(self, playbook: str) -> str:
        return (await self.client.register(PLAYBOOKS / f"{playbook}.yaml")).path

    async def start(self, playbook: str, *, payload: dict[str, Any] | None = None, eid: str | None = None) -> str:
        return await self.client.start(await self.register(playbook), payload=payload, execution_id=eid or self.eid)

    async def finish(self, eid: str) -> str:
        return str((await self.client.wait(eid, timeout=WAIT)).state)

    async def pending(self, stream: str, consumer: str) -> int:
        info = await self.system.nc.jsm().consumer_info(stream, consumer)
        return int(info.num_pending + info.num_ack_pending)


# --- scenarios ---------------------------------------------------------------------


def plain(playbook: str, payload: dict[str, Any] | None = None) -> Run:
    async def run(r: Recording) -> Recorded:
        await r.finish(await r.start(playbook, payload=payload))
        return Recorded(r.eid)

    return run


async def child(r: Recording) -> Recorded:
    await r.register("child_kid")
    await r.finish(await r.start("child"))
    return Recorded(r.eid)


async def cancel(r: Recording) -> Recorded:
    """Cancelled once the long sleep and two of the loop's iterations are running."""
    eid = await r.start("cancel")
    await wait_for(lambda: _running(r, 3), timeout=WAIT)
    await r.client.cancel(eid, reason="corpus: cancelled while running")
    await r.finish(eid)
    return Recorded(eid)


async def _running(r: Recording, n: int) -> bool:
    info = await r.system.nc.jsm().consumer_info(CMD_STREAM, tool_consumer("sleep"))
    return int(info.num_ack_pending) >= n


async def retry_from_step(r: Recording) -> Recorded:
    """The failed execution, then its retry from the failed step: the file is about the
    retry, whose log links the old one (both are recorded)."""
    old = await r.start("retry_from_step")
    if await r.finish(old) != "FAILED":
        raise RuntimeError(f"{old} should have failed before its retry")
    outcome = await r.client.retry(old, payload={"fail": False})
    await r.finish(outcome.execution_id)
    return Recorded(outcome.execution_id)


async def redrive(r: Recording) -> Recorded:
    """A loop that tolerated failures, then the redrive of its failed items: the file is
    about the redrive (its start record names the items and the results kept, its
    loop's spec the items to run), whose log links the old one (both are recorded)."""
    old = await r.start("redrive")
    if await r.finish(old) != "COMPLETED":
        raise RuntimeError(f"{old} should have completed, its failures tolerated, before its redrive")
    outcome = await r.client.redrive(old)
    await r.finish(outcome.execution_id)
    return Recorded(outcome.execution_id)


async def schedule(r: Recording) -> Recorded:
    """The first execution a cron schedule (every second) starts; the schedule is
    deleted at once, and a second fire that came first is left out of the file."""
    playbook = await r.register("schedule")
    await r.client.schedule_add("corpus", playbook=playbook, cron="* * * * * *", payload={"n": 7})
    sub = await r.system.nc.jetstream().subscribe(schedule_fire_subject("corpus"), ordered_consumer=True)
    try:
        eid, _ = fire_start(await sub.next_msg(timeout=WAIT))
    finally:
        await sub.unsubscribe()
    await r.client.schedule_delete("corpus")
    await r.finish(eid)
    return Recorded(eid, only=frozenset({eid}))


async def big_value(r: Recording) -> Recorded:
    await r.finish(await r.start("big_value", payload={"blob": "p" * 1_100_000}))
    return Recorded(r.eid)


async def waits(r: Recording) -> Recorded:
    """Signals sent as soon as the execution is started (kept: its first step still
    runs, or its start is still queued), then its waits: an approval takes its kept
    signal, another times out, a timer to a date 1.5 s ahead completes."""
    at = datetime.datetime.fromtimestamp(time.time() + 1.5, datetime.UTC).isoformat()
    eid = await r.start("waits", payload={"at": at})
    approval = {"approved": True, "comment": "corpus", "by": "corpus"}
    await r.client.signal(eid, "approval", approval, signal_id="approval-1", by="corpus")
    await r.client.signal(eid, "nobody", {"n": 1}, signal_id="nobody-1", by="corpus")
    await r.finish(eid)
    return Recorded(eid)


async def waits_loop(r: Recording) -> Recorded:
    """Signals sent as soon as the execution is started (kept): two for the loop of
    waits (one with junk data its `when` cannot read), a rejection for the approval
    step; once the loop waits, the signals of its other keys; once the first attempt
    of `patient` timed out, its signal (its retry takes it)."""
    eid = await r.start("waits_loop")
    c = r.client
    await c.signal(eid, "item", {"ok": 1}, key="1", signal_id="item-1", by="corpus")
    await c.signal(eid, "item", {"ok": "junk"}, key="2", signal_id="item-2-junk", by="corpus")
    rejected = {"approved": False, "comment": "corpus says no", "by": "corpus"}
    await c.signal(eid, "verdict", rejected, signal_id="verdict-1", by="corpus")
    await wait_for(lambda: _logged(r, eid, "step.waiting", "each"), timeout=WAIT)
    await c.signal(eid, "item", {"ok": 2}, key="2", signal_id="item-2", by="corpus")
    await c.signal(eid, "item", {"ok": 3}, key="3", signal_id="item-3", by="corpus")
    await wait_for(lambda: _logged(r, eid, "wait.ended", "patient"), timeout=WAIT)
    await c.signal(eid, "late", {"at_last": True}, signal_id="late-1", by="corpus")
    await r.finish(eid)
    return Recorded(eid)


async def start_answers(r: Recording) -> Recorded:
    """Started with its first decision in one record; once `hold` waits (entered by a's
    result, in a record that also holds b's command), its signal."""
    eid = await r.start("start_answers", payload={"n": 4})
    await wait_for(lambda: _logged(r, eid, "step.waiting", "hold"), timeout=WAIT)
    await r.client.signal(eid, "go", {"went": True}, signal_id="go-1", by="corpus")
    await r.finish(eid)
    return Recorded(eid)


async def _logged(r: Recording, eid: str, type_: str, step: str) -> bool:
    return any(i.type == type_ and i.step == step for i in await r.client.events(eid))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("routing", "COMPLETED", plain("routing")),
        Scenario("parallel_join", "COMPLETED", plain("parallel_join")),
        Scenario("loop_sequential", "COMPLETED", plain("loop_sequential")),
        Scenario("loop_async", "COMPLETED", plain("loop_async")),
        Scenario("loop_concurrency", "COMPLETED", plain("loop_concurrency")),
        Scenario("loop_chunked", "COMPLETED", plain("loop_chunked")),
        Scenario("loop_large", "COMPLETED", plain("loop_large")),
        Scenario("retry_success", "COMPLETED", plain("retry_success")),
        Scenario("retry_failure", "FAILED", plain("retry_failure")),
        Scenario("decisions", "COMPLETED", plain("decisions")),
        Scenario("abort", "FAILED", plain("abort")),
        Scenario("failure_route", "COMPLETED", plain("failure_route")),
        Scenario("child", "COMPLETED", child),
        Scenario("cancel", "CANCELLED", cancel),
        Scenario("retry_from_step", "COMPLETED", retry_from_step),
        Scenario("redrive", "COMPLETED", redrive),
        Scenario("schedule", "COMPLETED", schedule),
        Scenario("big_value", "COMPLETED", big_value),
        # semantics 2: a decision with lifecycle events is one message (its carrier event)
        Scenario("carried_routing", "COMPLETED", plain("routing")),
        Scenario("carried_one_decision", "COMPLETED", plain("one_decision")),
        Scenario("carried_cancel", "CANCELLED", cancel),
        Scenario("carried_big_value", "COMPLETED", big_value),
        # semantics 3: wait steps and signals
        Scenario("waits", "COMPLETED", waits),
        Scenario("waits_loop", "COMPLETED", waits_loop),
        # semantics 4: every result of an execution on one subject (`in.result`)
        Scenario("shared_results", "COMPLETED", plain("decisions")),
        Scenario("shared_child", "COMPLETED", child),
        # ... and every loop's verdict on one subject (`in.iterator`)
        Scenario("shared_loops", "COMPLETED", plain("loop_async")),
        # semantics 5: a step's result stored with the decision it leads to (`in.answer...`)
        Scenario("fast_answers", "COMPLETED", plain("fast_answers")),
        # semantics 6: the start stored with its first decision (`in.answer.lc.playbook.initialized...`),
        # and an answer record with lifecycle events and a command (`in.answer.lc.<type>.cmd.<kind>`)
        Scenario("start_answers", "COMPLETED", start_answers),
        Scenario("start_answers_big_value", "COMPLETED", big_value),
        Scenario(
            "encryption",
            "COMPLETED",
            plain("encryption", {"secret": "corpus-secret-7", "items": ["x1", "x2", "x3"]}),
            payload_key=ENCRYPTION_KEY,
        ),
    )
}


# --- reading what the server stored ------------------------------------------------


def _time_ns(stamp: str) -> int:
    """RFC 3339 with nanoseconds, as JetStream reports a message's time, in ns since the epoch."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    seconds = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC).timestamp()
    return int(seconds) * 1_000_000_000 + int((frac + "000000000")[:9])


def _headers(block: bytes) -> dict[str, str]:
    """A stored message's NATS header block (`NATS/1.0` then `Name: value` lines)."""
    headers: dict[str, str] = {}
    for line in block.decode().split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    return headers


async def stored(nc: NATS, stream: str, seq: int) -> dict[str, Any] | None:
    """Message `seq` of `stream` as stored, with its timestamp to the nanosecond (the
    engine's clock: nats-py's `get_msg` parses it to microseconds). None: deleted."""
    reply = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode(), timeout=10)
    answer = json.loads(reply.data)
    if "error" in answer:
        if answer["error"].get("err_code") == 10037:  # no message found: deleted (a fired timer)
            return None
        raise RuntimeError(f"{stream} #{seq}: {answer['error']}")
    msg = answer["message"]
    return {
        "stream": stream,
        "seq": int(msg["seq"]),
        "subject": msg["subject"],
        "headers": _headers(base64.b64decode(msg["hdrs"])) if msg.get("hdrs") else {},
        "data_b64": msg.get("data") or "",
        "time_ns": _time_ns(msg["time"]),
    }


def _execution_of(subject: str) -> str:
    return subject.split(".")[2]  # exec.<p>.<id>... and loop.<p>.<id>...


async def entries(nc: NATS, only: frozenset[str] | None) -> list[dict[str, Any]]:
    found = []
    for stream in STREAMS:
        state = (await nc.jsm().stream_info(stream)).state
        if not state.messages:
            continue  # an empty stream reports first 0 (or last + 1): no sequence to ask for
        for seq in range(state.first_seq, state.last_seq + 1):
            entry = await stored(nc, stream, seq)
            if entry is not None and (only is None or _execution_of(entry["subject"]) in only):
                found.append(entry)
    return found


async def blobs(nc: NATS) -> list[dict[str, Any]]:
    """Every object of the value buckets, compressed (a big value is mostly repetition;
    an encrypted one would not compress, so the encryption scenario has none)."""
    js = nc.jetstream()
    found = []
    for bucket in BUCKETS:
        try:
            store = await js.object_store(bucket)
            infos = await store.list()
        except NotFoundError:
            continue
        for info in sorted(infos, key=lambda i: i.name):
            if info.deleted:
                continue
            data = (await store.get(info.name)).data or b""
            found.append(
                {
                    "bucket": bucket,
                    "key": info.name,
                    "size": len(data),
                    "zlib_b64": base64.b64encode(zlib.compress(data, 9)).decode(),
                }
            )
    return found


async def settled(r: Recording) -> bool:
    """Nothing left to happen: every consumer of the logs and starts has taken and
    acked all it was given, and no command waits for a tool (a late result, a
    cancelled command's answer, would land in the log after the snapshot)."""
    layout = r.system.layout
    consumers = [
        (START_STREAM, STARTER_CONSUMER),
        (SCHEDULE_STREAM, SCHEDULE_FIRES_CONSUMER),
        (EXEC_STREAM, PROJECTOR_CONSUMER),
        *((EXEC_STREAM, engine_consumer(p)) for p in range(layout.partitions)),
        *((LOOP_STREAM, counter_consumer(p)) for p in range(layout.partitions)),
    ]
    for stream, consumer in consumers:
        if await r.pending(stream, consumer):
            return False
    return int((await r.system.nc.jsm().stream_info(CMD_STREAM)).state.messages) == 0


# --- one scenario ------------------------------------------------------------------


async def record(scenario: Scenario, out: Path, *, release_name: str | None = None) -> Path:
    settings = Settings(payload_key=scenario.payload_key)
    layout = settings.layout
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        # the steps' temporary directory (TMPDIR is one of the few variables a step
        # inherits): fresh per scenario, so a step counting its attempts in a file starts at 0
        os.environ["TMPDIR"] = tmp
        server = await NatsServer.start()
        try:
            nc = await connect(server.url, name="corpus")
            with mock.patch("socket.gethostname", return_value=HOST):
                runtime = await start_roles(nc, layout=layout, settings=settings, pod=HOST)
            system = System(server, nc, Client(nc, layout=layout), runtime, layout, Path(tmp))
            try:
                r = Recording(system, scenario.name)
                recorded = await scenario.run(r)
                await wait_for(lambda: settled(r), timeout=WAIT)
                status = await r.client.status(recorded.execution_id)
                state = None if status is None else str(status.state)
                if state != scenario.expect:
                    raise RuntimeError(
                        f"{scenario.name}: {recorded.execution_id} ended {state}, not {scenario.expect}"
                        f" ({None if status is None else status.error})"
                    )
                header = {
                    "corpus": FORMAT,
                    "scenario": scenario.name,
                    "release": release_name or release(),
                    "semantics": semantics(),
                    "execution_id": recorded.execution_id,
                    "state": state,
                    "payload_key": scenario.payload_key,
                    "partitions": layout.partitions,
                    "blobs": await blobs(nc),
                }
                lines = [header, *await entries(nc, recorded.only)]
            finally:
                await runtime.stop()
                await nc.close()
        finally:
            await server.discard()
    assert header["state"] in TERMINAL
    path = out / f"{scenario.name}.jsonl"
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    return path


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.corpus.record", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), metavar="NAME", help="this scenario only")
    parser.add_argument("--out", type=Path, default=HERE, help="where the files go (default: tests/corpus)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files (see README)")
    parser.add_argument(
        "--release", default=None, help="what the header names as the recording release (default: git describe)"
    )
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    for name in names:
        path = args.out / f"{name}.jsonl"
        if path.exists() and not args.force:
            print(f"{name}: {path} exists, kept (--force to record it again)", file=sys.stderr)
            continue
        t0 = time.monotonic()
        written = await record(SCENARIOS[name], args.out, release_name=args.release)
        print(f"{name}: {written.stat().st_size} bytes in {time.monotonic() - t0:.1f}s", flush=True)
    print(f"done in {time.monotonic() - began:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
