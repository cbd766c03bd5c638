"""Counter actors: run loops handed over by the engine, one actor per loop.

A `Counter` owns partitions of the LOOP stream, like the engine owns partitions of
EXEC: one durable push consumer per partition on `loop.<p>.*.*.in.>`. Inputs are
dispatched by (execution, loop) to a `LoopActor`, which folds them with the pure core
(actors/core/loop.py) and publishes what follows: iteration commands, retry timers,
cancels, and at the end the verdict into the execution's inputs.

A loop actor takes what has arrived in its mailbox as one batch: fold every input,
publish every output, then ack the inputs. With thousands of iterations in flight that
turns thousands of round trips into a few pipelined ones, and the fold stays exact.

Replay: a loop actor that did not see its loop from the start (a restart, another
pod) reads the loop's inputs from the log, folds them (same decisions), then sends
only what the log shows missing: commands in flight that are neither queued nor
answered, timers still waiting, children not started, the verdict if the execution
has not got it. Recognising these by state, not by the server's duplicate window,
keeps a replay after hours from duplicating anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from actors.blobs import fits_inline, get_blob, put_blob
from actors.core.effects import CommandCancel, Timer
from actors.core.loop import LoopOutput, LoopRun, fold_loop
from actors.natsio import SCHEDULE, SCHEDULE_TARGET, dead_letter, log_time, publish_all, schedule_at, stream_seq
from actors.playbook.loader import PlaybookInvalid, parsed_playbook
from actors.playbook.model import Step
from actors.wire import (
    CancelRequest,
    Command,
    IteratorCompleted,
    IteratorFailed,
    LoopInput,
    LoopProgress,
    LoopSpec,
    StartMessage,
    encode,
    loop_input_decoder,
)
from streams.layout import (
    CMD_STREAM,
    EXEC_STREAM,
    IN,
    LOOP_STREAM,
    SCH,
    START_SUBJECT,
    Layout,
    cmd_subject,
    counter_consumer,
    deliver_subject,
    loop_key,
    loop_type,
    progress_subject,
)

log = logging.getLogger("actors.counter")
REPLAY_IDLE_TIMEOUT = 10.0
BATCH = 4096  # most inputs folded before one publish round
PROGRESS_EVERY = 0.25  # seconds between progress messages of one loop


class LoopActor:
    def __init__(self, counter: Counter, execution_id: str, loop_id: str) -> None:
        self.counter = counter
        self.execution_id = execution_id
        self.loop_id = loop_id
        self.prefix = counter.layout.loop_prefix(execution_id, loop_id)
        self.reply_prefix = f"{self.prefix}.{IN}.res"
        self.run = LoopRun(execution_id=execution_id, loop_id=loop_id)
        self.last_seq = 0
        self.hydrated = False
        self.mailbox: asyncio.Queue[Msg] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self._progress_at = 0.0

    async def loop(self) -> None:
        while True:
            batch = [await self.mailbox.get()]
            while not self.mailbox.empty() and len(batch) < BATCH:
                batch.append(self.mailbox.get_nowait())
            try:
                await self.handle(batch)
            except asyncio.CancelledError:
                await self._hand_back(batch)
                raise
            except Exception:
                log.exception("loop %s/%s: failed to handle a batch; will replay", self.execution_id, self.loop_id)
                self.counter.forget(self)
                await self._hand_back(batch)
                return
            if self.run.finished and self.mailbox.empty():
                self.counter.retire(self)
                return

    async def _hand_back(self, batch: list[Msg]) -> None:
        pending = list(batch)
        while not self.mailbox.empty():
            pending.append(self.mailbox.get_nowait())
        for m in pending:
            try:
                await m.nak()
            except Exception:
                pass

    async def handle(self, batch: list[Msg]) -> None:
        if not self.hydrated:
            first = batch[0]
            if first.metadata.num_delivered == 1 and loop_type(first.subject) == "spec":
                self.hydrated = True  # the spec, first delivery: nothing precedes it
            else:
                await self.rehydrate()
        total = LoopOutput()
        for msg in batch:
            seq = stream_seq(msg)
            if seq <= self.last_seq:
                continue
            await self.fold_message(msg.subject, msg.data, seq, log_time(msg), into=total)
        if total:
            await self.publish(total)
        self._progress()
        for m in batch:
            await m.ack()  # queued on the connection, not a round trip: no task per ack

    async def fold_message(self, subject: str, data: bytes, seq: int, at: float,
                           into: LoopOutput | None = None) -> LoopOutput | None:
        """Fold one input; its outputs are returned, or added to `into`."""
        self.last_seq = seq
        try:
            inp: LoopInput = loop_input_decoder.decode(data)
        except msgspec.DecodeError as e:
            if self.hydrated:
                await dead_letter(self.counter.js, source="counter", reason=f"undecodable loop input on {subject}: {e}",
                                  subject=subject, data=data, execution_id=self.execution_id)
            return None
        step: Step | None = None
        if isinstance(inp, LoopSpec):
            if inp.execution_id != self.execution_id or inp.loop_id != self.loop_id:
                return None
            step = await self._resolve(inp)
            if step is None:
                return None
        return fold_loop(self.run, inp, at=at, reply_prefix=self.reply_prefix, step=step, into=into)

    async def _resolve(self, spec: LoopSpec) -> Step | None:
        """Fetch what the spec references, and the step it runs. A spec that cannot be
        used is answered with a failed verdict, so the execution never waits on it."""
        try:
            if spec.collection is None and spec.collection_ref:
                spec.collection = await get_blob(self.counter.js, spec.collection_ref)
            step = parsed_playbook(spec.playbook_source, spec.playbook_path).step(spec.step)
            if step.loop is None:
                raise KeyError(f"step {spec.step!r} has no loop")
            return step
        except (PlaybookInvalid, KeyError, NotFoundError) as e:
            reason = f"loop {spec.loop_id} of step '{spec.step}' cannot run: {e}"
            await dead_letter(self.counter.js, source="counter", reason=reason, subject=f"{self.prefix}.{IN}.spec",
                              data=encode(spec), execution_id=self.execution_id)
            verdict = IteratorFailed(execution_id=spec.execution_id, loop_id=spec.loop_id, step=spec.step, total=0,
                                     succeeded=0, failed=1, errors=[{"index": -1, "error": {
                                         "type": "LoopSpecInvalid", "message": reason, "retryable": False,
                                         "status": None, "traceback": None}}])
            await self._send_verdict(spec.reply_to, verdict)
            self.run.finished = True
            return None

    # --- output ----------------------------------------------------------------------

    async def publish(self, out: LoopOutput) -> None:
        js, eid = self.counter.js, self.execution_id
        await publish_all(js, [
            (cmd_subject(c.kind, eid, c.command_id), encode(c), f"{eid}:cmd:{c.command_id}") for c in out.commands
        ] + [(START_SUBJECT, encode(s), s.execution_id or "") for s in out.starts])
        await self._arm(out.timers)
        await self._stop(out.cancels, out.child_cancels)
        if out.verdict is not None and self.run.spec is not None:
            await self._send_verdict(self.run.spec.reply_to, out.verdict)

    async def _send_verdict(self, subject: str, verdict: IteratorCompleted | IteratorFailed) -> None:
        if verdict.results is not None and not fits_inline(verdict.results):
            verdict.results_ref = await put_blob(self.counter.js, f"{self.execution_id}/{self.loop_id}/results",
                                                 verdict.results)
            verdict.results = None
        await publish_all(self.counter.js, [(subject, encode(verdict), f"{self.execution_id}:iterator:{self.loop_id}")])

    async def _arm(self, timers: list[Timer]) -> None:
        """Retry delays as scheduled messages in the loop's own log (see the engine's
        `_arm`: the server fires them into `in.timer.<id>` whatever happens to us)."""
        if not timers:
            return
        eid, now = self.execution_id, time.time()
        later = [t for t in timers if t.due > now + 0.05]
        due = [t for t in timers if t.due <= now + 0.05]
        await publish_all(
            self.counter.js,
            [(f"{self.prefix}.{SCH}.{t.timer_id}", encode(t.fire), f"{eid}:{self.loop_id}:sch:{t.timer_id}") for t in later],
            headers=[{SCHEDULE: schedule_at(t.due), SCHEDULE_TARGET: f"{self.prefix}.{IN}.timer.{t.timer_id}"}
                     for t in later],
        )
        await publish_all(self.counter.js, [
            (f"{self.prefix}.{IN}.timer.{t.timer_id}", encode(t.fire), f"{eid}:{self.loop_id}:timer:{t.timer_id}")
            for t in due
        ])

    async def _stop(self, cancels: list[CommandCancel], children: list[str]) -> None:
        layout = self.counter.layout
        await publish_all(self.counter.js, [
            (layout.exec_subject(child, IN, "cancel"),
             encode(CancelRequest(execution_id=child, reason=f"loop {self.loop_id} of {self.execution_id} stopped")),
             f"{child}:cancel")
            for child in children
        ])
        jsm = self.counter.nc.jsm()
        for c in cancels:
            await jsm.purge_stream(CMD_STREAM, subject=cmd_subject(c.kind, self.execution_id, c.command_id))
            await self.counter.nc.publish(f"cancel.{self.execution_id}.{c.command_id}", b"")

    def _progress(self) -> None:
        """Best effort, rate-limited, never stored: for people watching, not decisions."""
        run, now = self.run, time.monotonic()
        if run.spec is None or (now - self._progress_at < PROGRESS_EVERY and not run.finished):
            return
        self._progress_at = now
        p = LoopProgress(execution_id=self.execution_id, loop_id=self.loop_id, step=run.spec.step, total=run.total,
                         done=run.done, failed=run.failed, in_flight=len(run.inflight), at=time.time())
        task = asyncio.ensure_future(self.counter.nc.publish(progress_subject(self.execution_id), encode(p)))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    # --- replay ----------------------------------------------------------------------

    async def rehydrate(self) -> None:
        js = self.counter.js
        sub = await js.subscribe(f"{self.prefix}.{IN}.>", stream=LOOP_STREAM, ordered_consumer=True,
                                 pending_msgs_limit=-1)
        inputs: list[tuple[str, bytes, int, float]] = []
        answered: set[str] = set()
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=REPLAY_IDLE_TIMEOUT)
                except TimeoutError:
                    break  # an empty log (the spec purged or expired)
                inputs.append((msg.subject, msg.data, stream_seq(msg), log_time(msg)))
                kind = loop_type(msg.subject)
                if kind.startswith("res."):
                    answered.add(kind.split(".", 1)[1])
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        self.run = LoopRun(execution_id=self.execution_id, loop_id=self.loop_id)
        self.last_seq = 0
        commands: dict[str, Command] = {}
        starts: dict[str, StartMessage] = {}
        timers: dict[str, Timer] = {}
        stopped = LoopOutput()
        verdict = None
        for subject, data, seq, at in inputs:
            out = await self.fold_message(subject, data, seq, at)
            if not out:
                continue
            commands.update((c.command_id, c) for c in out.commands)
            starts.update(((s.parent.command_id or "") if s.parent else "", s) for s in out.starts)
            timers.update((t.timer_id, t) for t in out.timers)
            stopped.cancels += out.cancels
            stopped.child_cancels += out.child_cancels
            verdict = out.verdict or verdict
        self.hydrated = True
        run = self.run
        missing = LoopOutput()
        for command_id in run.inflight:
            if command_id in commands and not await self._command_exists(commands[command_id], answered):
                missing.commands.append(commands[command_id])
            if command_id in starts:
                missing.starts.append(starts[command_id])  # idempotent: one execution per id
        missing.timers = [timers[t] for t in run.waiting if t in timers]
        if run.finished:
            missing.cancels, missing.child_cancels = stopped.cancels, stopped.child_cancels
            if verdict is not None and run.spec is not None and await self._verdict_missing(run.spec.reply_to):
                missing.verdict = verdict
        if missing:
            await self.publish(missing)
        log.info("loop %s/%s: replayed %d inputs (%d/%d counted, %d re-sent)", self.execution_id, self.loop_id,
                 len(inputs), run.done, run.total, len(missing.commands))

    async def _command_exists(self, cmd: Command, answered: set[str]) -> bool:
        """Still queued, or answered: a tool acks a command only after its result is
        published, so a command that was ever sent is in one place or the other."""
        if cmd.command_id in answered:
            return True
        jsm = self.counter.nc.jsm()
        for stream, subject in ((CMD_STREAM, cmd_subject(cmd.kind, self.execution_id, cmd.command_id)),
                                (LOOP_STREAM, cmd.reply_to)):
            try:
                await jsm.get_last_msg(stream, subject, direct=True)
                return True
            except NotFoundError:
                pass
        return False

    async def _verdict_missing(self, subject: str) -> bool:
        try:
            await self.counter.nc.jsm().get_last_msg(EXEC_STREAM, subject, direct=True)
            return False
        except NotFoundError:
            return True


class Counter:
    """Hosts loop actors for the partitions it owns."""

    def __init__(self, nc: NATS, *, layout: Layout, partitions: Iterable[int] | None = None,
                 retired_cache: int = 10_000) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.layout = layout
        self.partitions = list(range(layout.partitions) if partitions is None else partitions)
        self.actors: dict[tuple[str, str], LoopActor] = {}
        self.retired: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._retired_cache = retired_cache
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        for p in self.partitions:
            name = counter_consumer(p)
            self._subs.append(await self.nc.subscribe(deliver_subject(name), queue=name, cb=self._on_msg,
                                                      pending_msgs_limit=-1))

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            return  # flow-control/heartbeat status messages carry no ack subject
        key = loop_key(msg.subject)
        actor = self.actors.get(key)
        if actor is None:
            if key in self.retired:
                await msg.ack()  # a late result for a loop already decided
                return
            actor = self.actors[key] = LoopActor(self, *key)
            actor.task = asyncio.create_task(actor.loop(), name=f"loop:{key[0]}/{key[1]}")
        actor.mailbox.put_nowait(msg)

    def forget(self, actor: LoopActor) -> None:
        key = (actor.execution_id, actor.loop_id)
        if self.actors.get(key) is actor:
            del self.actors[key]

    def retire(self, actor: LoopActor) -> None:
        self.forget(actor)
        self.retired[(actor.execution_id, actor.loop_id)] = None
        if len(self.retired) > self._retired_cache:
            self.retired.popitem(last=False)

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        tasks = [a.task for a in self.actors.values() if a.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.actors.clear()
