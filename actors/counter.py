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
import functools
import logging
import time

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from actors.blobs import HEADROOM, command_items, get_blob, offload, resolve_chunk, resolve_result, start_item
from actors.core.effects import CommandCancel, Timer, err
from actors.core.loop import LoopOutput, LoopRun, fold_loop
from actors.hosting import PartitionHost, engine_error, hand_back
from actors.natsio import (
    ack,
    arm_timers,
    dead_letter,
    has_message,
    log_time,
    publish_all,
    stop_commands,
    stream_seq,
)
from actors.playbook.loader import PlaybookInvalid, parsed_playbook
from actors.playbook.model import Step
from actors.playbook.templates import DEFAULT_LIMITS, call_with_limits
from actors.wire import (
    CallDone,
    CancelRequest,
    ChunkDone,
    Command,
    IteratorCompleted,
    IteratorFailed,
    LoopInput,
    LoopProgress,
    LoopSpec,
    ResultBatch,
    StartMessage,
    encode,
    loop_input_decoder,
)
from streams.layout import (
    CMD_STREAM,
    EXEC_STREAM,
    IN,
    LOOP_STREAM,
    Layout,
    cmd_subject,
    counter_consumer,
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
        self.key = (execution_id, loop_id)
        self.prefix = counter.layout.loop_prefix(execution_id, loop_id)
        self.reply_prefix = f"{self.prefix}.{IN}.res"
        self.state = LoopRun(execution_id=execution_id, loop_id=loop_id)
        self.last_seq = 0
        self.hydrated = False
        self.replayed = False  # set once a failure made this actor rebuild itself from the log
        self.mailbox: asyncio.Queue[Msg] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # an idle actor may be evicted (PartitionHost._evict)
        self.off_loop = False  # fold on a worker thread: a template took more than its inline slice
        self._progress_at = 0.0

    async def run(self) -> None:
        while True:
            batch = [await self.mailbox.get()]
            while not self.mailbox.empty() and len(batch) < BATCH:
                batch.append(self.mailbox.get_nowait())
            self.busy = True
            try:
                await self.counter.handle_until_done(batch, functools.partial(self.handle, batch), reset=self.reset,
                                                     what=f"loop {self.execution_id}/{self.loop_id}", actor=self,
                                                     give_up=functools.partial(self.give_up, batch))
            except asyncio.CancelledError:
                await hand_back(batch, self.mailbox)  # the partition's next owner replays it
                raise
            finally:
                self.busy = False
            if self.state.finished and self.mailbox.empty():
                self.counter.retire(self.key, self)
                return

    def reset(self) -> None:
        """After a failure: the state may be ahead of the log, rebuild it by replay."""
        self.hydrated = False
        self.replayed = True

    async def handle(self, batch: list[Msg]) -> None:
        if not self.hydrated:
            first = batch[0]
            if not self.replayed and first.metadata.num_delivered == 1 and loop_type(first.subject) == "spec":
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
            await ack(m)  # queued on the connection, not a round trip: no task per ack

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
        elif isinstance(inp, CallDone) and inp.result_ref is not None:  # an iteration's result too large: a blob
            inp = await resolve_result(self.counter.js, inp)
        elif isinstance(inp, ChunkDone):
            inp = await resolve_chunk(self.counter.js, inp)
        spec = inp if isinstance(inp, LoopSpec) else self.state.spec
        limits = spec.limits if spec is not None else DEFAULT_LIMITS

        def fold() -> LoopOutput | None:
            return call_with_limits(limits, lambda: fold_loop(self.state, inp, at=at, reply_prefix=self.reply_prefix,
                                                              step=step, into=into))

        return await self.counter.fold_off_loop(self, fold)

    async def give_up(self, batch: list[Msg], error: Exception, level: int) -> bool:
        """Handling these inputs failed deterministically, again and again: the loop
        fails (its verdict carries an `EngineError`, which the step meets like any loop
        failure), the inputs are acked and the actor stops. A later replay of the loop
        fails the same way and sends the same verdict, which the engine counts once."""
        first = batch[0]
        info = engine_error(error, subject=first.subject, seq=stream_seq(first), data=first.data)
        spec = self.state.spec
        verdict = IteratorFailed(execution_id=self.execution_id, loop_id=self.loop_id,
                                 step=spec.step if spec is not None else "", total=self.state.total,
                                 succeeded=0, failed=1, errors=[{"index": -1, "error": err(info)}])
        reply_to = (spec.reply_to if spec is not None
                    else self.counter.layout.exec_subject(self.execution_id, IN, f"iterator.{self.loop_id}"))
        await self._send_verdict(reply_to, verdict)
        # stop what this loop still runs (as far as its state knows: best effort)
        flights = list(self.state.inflight.items())
        await self._stop([CommandCancel(f.kind, cid) for cid, f in flights if f.child is None],
                         [f.child for _, f in flights if f.child is not None])
        self.state.finished = True
        for m in batch:
            await ack(m)
        return True

    async def _resolve(self, spec: LoopSpec) -> Step | None:
        """Fetch what the spec references, and the step it runs. A spec that cannot be
        used is answered with a failed verdict, so the execution never waits on it."""
        try:
            if spec.collection is None and spec.collection_ref:
                spec.collection = await get_blob(self.counter.js, spec.collection_ref)
            if spec.scope_ref is not None:
                spec.scope = await get_blob(self.counter.js, spec.scope_ref)
            step = parsed_playbook(spec.playbook_source, spec.playbook_path, spec.limits.max_attempts).step(spec.step)
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
            self.state.finished = True
            return None

    # --- output ----------------------------------------------------------------------

    async def publish(self, out: LoopOutput) -> None:
        js, eid = self.counter.js, self.execution_id
        limit = self.counter.layout.max_msg_size - HEADROOM  # larger commands and payloads go as blobs
        await publish_all(js, await command_items(js, out.commands, limit=limit, sender="counter")
                          + [await start_item(js, s, limit=limit) for s in out.starts])
        await arm_timers(js, out.timers, prefix=self.prefix, id_prefix=f"{eid}:{self.loop_id}")
        await self._stop(out.cancels, out.child_cancels)
        if out.verdict is not None and self.state.spec is not None:
            await self._send_verdict(self.state.spec.reply_to, out.verdict)

    async def _send_verdict(self, subject: str, verdict: IteratorCompleted | IteratorFailed) -> None:
        if verdict.results is not None:
            ref = await offload(self.counter.js, f"{self.execution_id}/{self.loop_id}/results", verdict.results)
            if ref is not None:
                verdict.results, verdict.results_ref = None, ref
        await publish_all(self.counter.js, [(subject, encode(verdict), f"{self.execution_id}:iterator:{self.loop_id}")])

    async def _stop(self, cancels: list[CommandCancel], children: list[str]) -> None:
        layout = self.counter.layout
        await publish_all(self.counter.js, [
            (layout.exec_subject(child, IN, "cancel"),
             encode(CancelRequest(execution_id=child, reason=f"loop {self.loop_id} of {self.execution_id} stopped")),
             f"{child}:cancel")
            for child in children
        ])
        await stop_commands(self.counter.nc, self.execution_id, cancels)

    def _progress(self) -> None:
        """Best effort, rate-limited, never stored: for people watching, not decisions."""
        run, now = self.state, time.monotonic()
        if run.spec is None or (now - self._progress_at < PROGRESS_EVERY and not run.finished):
            return
        self._progress_at = now
        p = LoopProgress(execution_id=self.execution_id, loop_id=self.loop_id, step=run.spec.step, total=run.total,
                         done=run.done, failed=run.failed, in_flight=len(run.inflight), at=time.time())
        task = asyncio.ensure_future(self.counter.nc.publish(progress_subject(self.execution_id), encode(p)))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    # --- replay ----------------------------------------------------------------------

    async def _read_log(self, subject: str, after: int = 0) -> list[tuple[str, bytes, int, float]]:
        """The loop log's messages on `subject` (a filter), from sequence `after` + 1 on."""
        js = self.counter.js
        config = None if not after else ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                                       opt_start_seq=after + 1)
        sub = await js.subscribe(subject, stream=LOOP_STREAM, ordered_consumer=True, pending_msgs_limit=-1,
                                 config=config)
        inputs: list[tuple[str, bytes, int, float]] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=REPLAY_IDLE_TIMEOUT)
                except TimeoutError:
                    if inputs or (await sub.consumer_info()).num_pending:
                        # stalled part way (the stream lost its leader): folding part of
                        # the log would build a state behind it; fail and replay again
                        raise
                    break  # an empty log (the spec purged or expired)
                inputs.append((msg.subject, msg.data, stream_seq(msg), log_time(msg)))
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return inputs

    async def _answered_after(self, seq: int) -> set[str]:
        """Command ids answered in the loop's log after sequence `seq`."""
        results = f"{self.prefix}.{IN}.res.>"
        try:
            last = await self.counter.nc.jsm().get_last_msg(LOOP_STREAM, results, direct=True)
        except NotFoundError:
            return set()
        if (last.seq or 0) <= seq:
            return set()
        answered: set[str] = set()
        for subject, data, _, _ in await self._read_log(results, after=seq):
            answered |= _answers(subject, data)
        return answered

    async def rehydrate(self) -> None:
        inputs = await self._read_log(f"{self.prefix}.{IN}.>")
        answered: set[str] = set()
        for subject, data, _, _ in inputs:
            answered |= _answers(subject, data)
        self.state = LoopRun(execution_id=self.execution_id, loop_id=self.loop_id)
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
        run = self.state
        missing = LoopOutput()
        # A command in flight was sent if it is still queued in CMD or answered in the log:
        # a tool acks a command (dropping it from CMD) only once its result is stored. The
        # log is read again after looking in CMD, so an answer stored meanwhile (alone or
        # in a batch of results) is still found.
        unsure: list[Command] = []
        for command_id in run.inflight:
            cmd = commands.get(command_id)
            if cmd is not None and command_id not in answered and not await has_message(
                    self.counter.nc, CMD_STREAM, cmd_subject(cmd.kind, cmd.execution_id, cmd.command_id)):
                unsure.append(cmd)
            if command_id in starts:
                missing.starts.append(starts[command_id])  # idempotent: one execution per id
        if unsure:
            late = await self._answered_after(self.last_seq)
            missing.commands += [c for c in unsure if c.command_id not in late]
        missing.timers = [timers[t] for t in run.waiting if t in timers]
        if run.finished:
            missing.cancels, missing.child_cancels = stopped.cancels, stopped.child_cancels
            if (verdict is not None and run.spec is not None
                    and not await has_message(self.counter.nc, EXEC_STREAM, run.spec.reply_to)):
                missing.verdict = verdict
        if missing:
            await self.publish(missing)
        log.info("loop %s/%s: replayed %d inputs (%d/%d counted, %d re-sent)", self.execution_id, self.loop_id,
                 len(inputs), run.done, run.total, len(missing.commands))


def _answers(subject: str, data: bytes) -> set[str]:
    """The command ids a loop log message answers (a result, or a batch of them)."""
    kind = loop_type(subject)
    if not kind.startswith("res."):
        return set()
    if kind != "res.batch":
        return {kind.split(".", 1)[1]}
    try:
        inp = loop_input_decoder.decode(data)
    except msgspec.DecodeError:
        return set()
    return {r.command_id for r in inp.results} if isinstance(inp, ResultBatch) else set()


class Counter(PartitionHost[tuple[str, str], LoopActor]):
    """Hosts loop actors for the partitions it owns (a loop's partition is its
    execution's)."""

    def __init__(self, nc: NATS, *, layout: Layout, retired_cache: int = 10_000) -> None:
        super().__init__(nc, layout=layout, consumer=counter_consumer, key_of=loop_key,
                         partition_of=lambda key: layout.partition_of(key[0]), retired_cache=retired_cache,
                         max_resident=layout.counter_max_resident, role="counter")

    def spawn(self, key: tuple[str, str]) -> LoopActor:
        return LoopActor(self, *key)
