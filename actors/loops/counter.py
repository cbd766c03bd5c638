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
answered, timers still waiting, children not started, failure records of iterations
(`fail.<index>`) the log lacks, the verdict if the execution has not got it.
Recognising these by state, not by the server's duplicate window,
keeps a replay after hours from duplicating anything.

The replay is held against the log (actors/core/replay.py `LoopReplayer`): every answer
in it is to a command the replayed fold issued first, every timer that fired one it
armed. A loop whose log answers a command this code would not have issued halts: an
`execution.halted` event in the execution's lifecycle names the input (written once
while that halt is open), nothing more is sent for the loop and its inputs are handed
back with a growing delay until code that decides as the log does replays it; that
replay writes `execution.resumed` (with the loop's id) before sending anything.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from actors.core.effects import CommandCancel, Effects, Timer, loop_failed
from actors.core.loop import LoopRun, fold_loop
from actors.core.replay import SEMANTICS, LoopReplayer, Mismatch, Recorded
from actors.natsio import ack, dead_letter, has_message, last_message, publish_all, verdict_sent
from actors.natsio.binding import codec_of
from actors.natsio.subjectlist import stream_subjects
from actors.playbook.loader import PlaybookInvalid, parsed_playbook
from actors.playbook.model import Step
from actors.playbook.templates import DEFAULT_LIMITS, RenderFault, call_with_limits
from actors.runtime.exectrace import loop_carrier, traced_loop
from actors.runtime.hosting import PartitionHost
from actors.runtime.logactor import LogActor, LogEntry
from actors.runtime.metrics import HALTED_REPLAYS
from actors.runtime.outbox import Outbox
from actors.runtime.render_process import RenderBounds
from actors.runtime.supervision import engine_error
from actors.runtime.tracing import handling
from actors.store.blobs import BlobCorrupt, get_blob, resolve_chunk, resolve_result
from actors.wire.events import EventType, ExecutionHaltedData, ExecutionResumedData, event_decoder, make_event
from actors.wire.messages import (
    CallDone,
    CallError,
    ChunkDone,
    Command,
    ErrorInfo,
    FailedItem,
    LoopCancel,
    LoopInput,
    LoopProgress,
    LoopSpec,
    ResultBatch,
    SignalSent,
    StartMessage,
    TimerFired,
    encode,
    loop_input_decoder,
)
from streams import ids
from streams.layout import CMD_STREAM, LOOP_STREAM, Layout, counter_consumer
from streams.subjects import (
    CANCEL,
    LOOP_RESULT,
    SIGNAL,
    SPEC,
    TIMER,
    ExecSubjects,
    LoopSubjects,
    answered_command,
    cmd_subject,
    failed_item_of,
    failed_items_filter,
    is_result_batch,
    loop_key,
    loop_type,
    progress_subject,
)

log = logging.getLogger("actors.loops.counter")
BATCH = 4096  # most inputs folded before one publish round
PROGRESS_EVERY = 0.25  # seconds between progress messages of one loop
# while iterations wait (a loop of `tool: wait`) and nothing changes, the counts are said
# again this often: `status` listens for a second (actors/client/progress.py SNAPSHOT_WAIT)
# and would otherwise show no counts for a loop idly waiting. One small core-NATS message
# a second per waiting loop in memory, not stored
PROGRESS_WAITING = 0.9


class LoopActor(LogActor):
    source = "counter"
    stream = LOOP_STREAM
    max_batch = BATCH

    def __init__(self, counter: Counter, execution_id: str, loop_id: str) -> None:
        subjects = LoopSubjects.of(execution_id, loop_id, counter.layout.partitions)
        super().__init__(
            counter,
            (execution_id, loop_id),
            execution_id,
            Outbox(
                counter.nc,
                counter.js,
                counter.layout,
                execution_id=execution_id,
                subjects=subjects,
                loop_id=loop_id,
                sender="counter",
            ),
        )
        self.counter = counter
        self.loop_id = loop_id
        self.subjects = subjects
        self.state = LoopRun(execution_id=execution_id, loop_id=loop_id)
        self._progress_at = 0.0
        self._shown: tuple[int, ...] | None = None  # the counts last published
        self._later: asyncio.TimerHandle | None = None  # a change held back by PROGRESS_EVERY

    @property
    def finished(self) -> bool:
        return self.state.finished

    def log_inputs(self) -> str:
        return self.subjects.inputs

    def opens_log(self, subject: str) -> bool:
        return loop_type(subject) == SPEC

    async def publish(self, effects: Effects) -> None:
        spec = self.state.spec
        # where the verdict goes: the execution's one subject for every loop's verdict
        # when the spec names it (semantics 4), else the loop's own (`reply_to`)
        self.outbox.verdict_to = None if spec is None else spec.answer_on
        await super().publish(effects)

    async def handle(self, batch: list[Msg]) -> None:
        with handling(traced_loop(self.outbox.trace)):  # the loop's span current: log lines name it
            await super().handle(batch)
        self._progress()

    async def fold_input(self, entry: LogEntry, into: Effects | None = None) -> Effects | None:
        """Fold one input; its effects are returned, or added to `into`."""
        self.last_seq = entry.seq
        inp: LoopInput | None = await self.decode(loop_input_decoder, entry)
        if inp is None:
            return None
        if not _fits(loop_type(entry.subject), inp):
            await self._misfiled(entry, inp)
            return None
        step: Step | None = None
        if isinstance(inp, LoopSpec):
            if inp.execution_id != self.execution_id or inp.loop_id != self.loop_id:
                return None
            step = await self._resolve(inp)
            if step is None:
                return None
            self.outbox.trace = loop_carrier(entry.headers)  # its iterations join its trace (docs/tracing.md)
        elif isinstance(inp, CallDone) and inp.result_ref is not None:  # an iteration's result too large: a blob
            inp = await resolve_result(self.counter.js, inp)
        elif isinstance(inp, ChunkDone):
            inp = await resolve_chunk(self.counter.js, inp)
        spec = inp if isinstance(inp, LoopSpec) else self.state.spec
        limits = spec.limits if spec is not None else DEFAULT_LIMITS
        folded: LoopInput = inp

        def fold() -> Effects:
            return call_with_limits(
                limits, lambda: fold_loop(self.state, folded, at=entry.at, subjects=self.subjects, step=step, into=into)
            )

        try:
            return await self.counter.fold_off_loop(self, fold)
        except RenderFault as fault:
            # cut short by a bound of the render process (not a pure function of the
            # log): the loop fails now with what happened, and nothing else this batch
            # decided is sent. Its verdict, in the execution's log, is the record.
            log.warning("loop %s: input %d: %s", self.loop_id, entry.seq, fault.describe())
            await self._fail(ErrorInfo(type="TemplateLimit", message=fault.describe()))
            if into is not None:
                into.clear()
            return None

    async def _misfiled(self, entry: LogEntry, inp: LoopInput) -> None:
        """An input whose type is not its subject's (a `timer.fired` on `in.signal`):
        never folded, live or in a replay; dead-lettered when met live."""
        if not self.hydrated:
            return
        await dead_letter(
            self.counter.js,
            source="counter",
            reason=f"input of type {type(inp).__name__} on {entry.subject}: not what that subject takes; not folded",
            subject=entry.subject,
            data=entry.data,
            execution_id=self.execution_id,
            msg_id=ids.dead_letter_id("counter", LOOP_STREAM, entry.seq),
        )

    async def give_up(self, batch: list[Msg], error: Exception, level: int) -> bool:
        """Handling these inputs failed deterministically, again and again: the loop
        fails (its verdict carries an `EngineError`, which the step meets like any loop
        failure), the inputs are acked and the actor stops. A later replay of the loop
        fails the same way and sends the same verdict, which the engine counts once."""
        first = batch[0]
        info = engine_error(error, subject=first.subject, seq=int(first.metadata.sequence.stream), data=first.data)
        await self._fail(info)
        for m in batch:
            await ack(m)
        return True

    async def unreadable(self, entry: LogEntry, error: ErrorInfo) -> None:
        """The loop fails at once with `error` (which names the key id), as `give_up` fails it."""
        await self._fail(error)

    async def _fail(self, info: ErrorInfo) -> None:
        spec = self.state.spec
        step = spec.step if spec is not None else ""
        verdict = loop_failed(self.execution_id, self.loop_id, step, info, total=self.state.total)
        # stop what this loop still runs (as far as its state knows: best effort)
        flights = list(self.state.inflight.items())
        await self.publish(
            Effects(
                verdict=verdict,
                cancels=[CommandCancel(f.kind, cid) for cid, f in flights if f.child is None],
                child_cancels=[f.child for _, f in flights if f.child is not None],
            )
        )
        self.state.finished = True

    async def _resolve(self, spec: LoopSpec) -> Step | None:
        """Fetch what the spec references, and the step it runs. A spec that cannot be
        used is answered with a failed verdict, so the execution never waits on it."""
        try:
            if spec.collection is None and spec.collection_ref:
                spec.collection = await get_blob(self.counter.js, spec.collection_ref)
            if spec.scope_ref is not None:
                spec.scope = await get_blob(self.counter.js, spec.scope_ref)
            # loading is user computation: a big playbook is loaded in a render process first
            args = (spec.playbook_source, spec.playbook_path, spec.limits.max_attempts)
            await self.counter.preload_playbook(*args)
            step = await self.counter.fold_off_loop(self, lambda: parsed_playbook(*args).step(spec.step))
            if step.loop is None:
                raise KeyError(f"step {spec.step!r} has no loop")
            return step
        # BlobCorrupt: a blob changed; RenderFault: loading was cut short by a render process's limits
        except (PlaybookInvalid, KeyError, NotFoundError, BlobCorrupt, RenderFault) as e:
            reason = f"loop {spec.loop_id} of step '{spec.step}' cannot run: {e}"
            await dead_letter(
                self.counter.js,
                source="counter",
                reason=reason,
                subject=self.subjects.spec,
                data=codec_of(self.counter.js).encode(spec),
                execution_id=self.execution_id,
            )
            invalid = ErrorInfo(
                type="TemplateLimit" if isinstance(e, RenderFault) else "LoopSpecInvalid", message=reason
            )
            verdict = loop_failed(spec.execution_id, spec.loop_id, spec.step, invalid)
            await self.outbox.send_verdict(verdict)
            self.state.finished = True
            return None

    def _progress(self, *, again: bool = False) -> None:
        """Best effort, rate-limited, never stored: for people watching, not decisions.
        Published when the counts change (once when the loop starts, so a loop of waits
        says how many wait), and while iterations wait, `again` every PROGRESS_WAITING
        (so `status` of an idle loop of waits still shows its counts). A change within
        PROGRESS_EVERY of the last message goes out at its end."""
        run = self.state
        if run.spec is None:
            return
        counts = (run.total, run.done, run.failed, len(run.inflight), run.waiting_count)
        if counts == self._shown and not again:
            return
        now = time.monotonic()
        held = self._progress_at + PROGRESS_EVERY - now
        if held > 0 and not run.finished:
            if self._later is None:
                self._later = asyncio.get_running_loop().call_later(held, self._held_back)
            return
        self._progress_at, self._shown = now, counts
        p = LoopProgress(
            execution_id=self.execution_id,
            loop_id=self.loop_id,
            step=run.spec.step,
            total=run.total,
            done=run.done,
            failed=run.failed,
            in_flight=len(run.inflight),
            waiting=run.waiting_count,
            at=time.time(),
        )
        task = asyncio.ensure_future(self.counter.nc.publish(progress_subject(self.execution_id), encode(p)))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        if run.waiting_count and not run.finished and self._later is None:
            self._later = asyncio.get_running_loop().call_later(PROGRESS_WAITING, self._said_again)

    def _said_again(self) -> None:
        """The counts of a loop whose iterations wait, said again (see `_held_back`)."""
        self._later = None
        if self.counter.actors.get(self.key) is not self or self.task is None or self.task.done() or self.busy:
            return
        self._progress(again=True)

    def _held_back(self) -> None:
        """The change `_progress` held back, while this actor still runs the loop (an
        evicted or retired actor's state may be stale: it says nothing); one handling
        inputs says it when done."""
        self._later = None
        if self.counter.actors.get(self.key) is not self or self.task is None or self.task.done() or self.busy:
            return
        self._progress()

    # --- replay ----------------------------------------------------------------------

    async def _answered_after(self, seq: int) -> set[str]:
        """Command ids answered in the loop's log after sequence `seq`."""
        results = self.subjects.results_filter
        try:
            last = await last_message(self.counter.nc, LOOP_STREAM, results, newest=True)
        except NotFoundError:
            return set()
        if (last.seq or 0) <= seq:
            return set()
        answered: set[str] = set()
        for entry in await self.read_log(results, after=seq, through=last.seq or 0):
            answered |= _answers(entry)
        return answered

    async def rehydrate(self) -> None:
        inputs = await self.read_log(self.subjects.inputs, through=self.replay_through)
        answered: set[str] = set()
        for entry in inputs:
            answered |= _answers(entry)
        self.state = LoopRun(execution_id=self.execution_id, loop_id=self.loop_id)
        self.last_seq = 0
        commands: dict[str, Command] = {}
        starts: dict[str, StartMessage] = {}
        timers: dict[str, Timer] = {}
        # failure records the log lacks, to send again: only those are kept while
        # replaying (a record holds a traceback; a big loop's replay would hold them all)
        failures: dict[int, FailedItem] = {}
        recorded: set[int] | None = None
        stopped = Effects()
        verdict = None
        checker = LoopReplayer(self.execution_id, self.loop_id)
        for entry in inputs:
            kind = loop_type(entry.subject)
            timer = kind.split(".", 1)[1] if kind.startswith(f"{TIMER}.") else None
            mismatch = checker.answers(entry.seq, entry.subject, _answers(entry), timer, self.state)
            if mismatch is not None:
                await self.halt(mismatch, entry)
                return
            out = await self.fold_input(entry)
            checker.derived(out)
            if not out:
                continue
            commands.update((c.command_id, c) for c in out.commands)
            starts.update(((s.parent.command_id or "") if s.parent else "", s) for s in out.starts)
            timers.update((t.timer_id, t) for t in out.timers)
            if out.failures:
                if recorded is None:
                    recorded = await self._failures_recorded()
                failures.update((f.index, f) for f in out.failures if f.index not in recorded)
            stopped.cancels += out.cancels
            stopped.child_cancels += out.child_cancels
            verdict = out.verdict or verdict
        halts = await self._halts()
        for key, stored in halts.open_halts("counter", self.loop_id):
            # this code decides as the loop's log records: the halt is over, said before
            # anything is sent for the loop again
            await self._publish_lifecycle(
                ExecutionResumedData(halted_seq=key[2], semantics=SEMANTICS, source="counter", loop_id=self.loop_id),
                at=stored.value.at,
                cause=key[2],
                msg_id=ids.resumed_id(self.execution_id, key[2], f"counter:{self.loop_id}", halts.round_of(key)),
            )
            log.warning("loop %s/%s: replays as its log records again", self.execution_id, self.loop_id)
        self.hydrated = True
        run = self.state
        missing = Effects()
        # A command in flight was sent if it is still queued in CMD or answered in the log:
        # a tool acks a command (dropping it from CMD) only once its result is stored. The
        # log is read again after looking in CMD, so an answer stored meanwhile (alone or
        # in a batch of results) is still found.
        unsure: list[Command] = []
        for command_id in run.inflight:
            cmd = commands.get(command_id)
            if (
                cmd is not None
                and command_id not in answered
                and not await has_message(
                    self.counter.nc, CMD_STREAM, cmd_subject(cmd.kind, cmd.execution_id, cmd.command_id)
                )
            ):
                unsure.append(cmd)
            if command_id in starts:
                missing.starts.append(starts[command_id])  # idempotent: one execution per id
        if unsure:
            late = await self._answered_after(self.last_seq)
            missing.commands += [c for c in unsure if c.command_id not in late]
        missing.timers = [timers[t] for t in run.pending_timers() if t in timers]
        missing.failures = [f for _, f in sorted(failures.items())]
        if run.finished:
            missing.cancels, missing.child_cancels = stopped.cancels, stopped.child_cancels
            if (
                verdict is not None
                and run.spec is not None
                and not await verdict_sent(
                    self.counter.nc, self.counter.layout.exec_stream_holding(run.spec.reply_to), run.spec
                )
            ):
                missing.verdict = verdict
        if missing:
            await self.publish(missing)
        log.info(
            "loop %s/%s: replayed %d inputs (%d/%d counted, %d re-sent)",
            self.execution_id,
            self.loop_id,
            len(inputs),
            run.done,
            run.total,
            len(missing.commands),
        )

    async def _failures_recorded(self) -> set[int]:
        """The iterations whose failure records the loop's log has: the stream's subjects
        under the loop's `fail.*`, every page of them (a page holds 100,000 at most)."""
        loop_filter = failed_items_filter(self.execution_id, self.counter.layout.partitions, self.loop_id)
        subjects = await stream_subjects(self.counter.nc, LOOP_STREAM, loop_filter)
        return {at[1] for s in subjects if (at := failed_item_of(s)) is not None}

    async def _halts(self) -> Recorded:
        """The execution's halts and resumes, from its lifecycle (EXEC stream). Most
        executions never halted: one lookup says so."""
        seen = Recorded()
        subjects = ExecSubjects.of(self.execution_id, self.counter.layout.partitions)
        stream = self.counter.layout.exec_stream_of(self.execution_id)
        # halts and resumes only: written by the shells on their own subjects, never by a
        # fold, so never in an answer record (`in.answer.lc.<type>`, semantics 5)
        if not await has_message(self.counter.nc, stream, subjects.lifecycle(EventType.EXECUTION_HALTED)):
            return seen
        for entry in await self.read_log(subjects.lifecycle("execution.*"), stream=stream):
            try:
                ev = event_decoder.decode(entry.data)  # ids and seqs only: no value is read
            except msgspec.DecodeError:
                continue
            seen.event(entry.seq, entry.subject, ev)
        return seen

    async def _publish_lifecycle(
        self, data: ExecutionHaltedData | ExecutionResumedData, *, at: float, cause: int, msg_id: str
    ) -> None:
        ev = make_event(data, execution_id=self.execution_id, at=at, cause=cause)
        js = self.counter.js
        subject = ExecSubjects.of(self.execution_id, self.counter.layout.partitions).lifecycle(ev.type)
        await publish_all(js, [(subject, codec_of(js).encode(ev), msg_id)])

    async def halt(self, mismatch: Mismatch, entry: LogEntry) -> None:
        """Stop this loop at `entry`: nothing more is folded or sent for it, its inputs
        are handed back with a growing delay (LogActor.handle), and the execution's
        status says why. Written and counted once while the halt is open (a replay
        after the duplicate window finds it in the log); `halted` is set once it is."""
        halts = await self._halts()
        key = ("counter", self.loop_id, mismatch.input_seq)
        # the pod's log is not sealed: kinds, seqs and subjects only (the values are in the sealed event)
        log.error("loop %s/%s halted: %s", self.execution_id, self.loop_id, mismatch.brief())
        if key not in halts.halts:
            await self._record_halt(mismatch, entry, halts.round_of(key))
            HALTED_REPLAYS.inc(role="counter", kind=mismatch.kind)
        self.halted = mismatch
        self.hydrated = True

    async def _record_halt(self, mismatch: Mismatch, entry: LogEntry, round_: int) -> None:
        data = mismatch.halted_data(source="counter", loop_id=self.loop_id)
        msg_id = ids.halted_id(self.execution_id, f"counter:{self.loop_id}", entry.seq, round_)
        await self._publish_lifecycle(data, at=entry.at, cause=entry.seq, msg_id=msg_id)


# what each loop input subject (`loop.<p>.<id>.<loop>.in.<type>...`) takes: the decoder
# reads the type from the message, so without this one published where another type is
# written would be folded as sent
_LOOP_INPUTS: dict[str, tuple[type, ...]] = {
    SPEC: (LoopSpec,),
    LOOP_RESULT: (CallDone, CallError, ChunkDone),
    TIMER: (TimerFired,),
    CANCEL: (LoopCancel,),
    SIGNAL: (SignalSent,),
}


def _fits(kind: str, inp: LoopInput) -> bool:
    """Is `inp` of a type its input subject's type (`kind`: `spec`, `res.<id>`...) takes?"""
    if is_result_batch(kind):
        return isinstance(inp, ResultBatch)
    return isinstance(inp, _LOOP_INPUTS.get(kind.split(".", 1)[0], ()))


def _answers(entry: LogEntry) -> set[str]:
    """The command ids a loop log message answers (a result, or a batch of them)."""
    kind = loop_type(entry.subject)
    command_id = answered_command(kind)
    if command_id is not None:
        return {command_id}
    if not is_result_batch(kind):
        return set()
    try:
        inp = loop_input_decoder.decode(entry.data)
    except msgspec.DecodeError:  # it answers nothing (the fold dead-letters it)
        return set()
    return {r.command_id for r in inp.results} if isinstance(inp, ResultBatch) else set()


class Counter(PartitionHost[tuple[str, str], LoopActor]):
    """Hosts loop actors for the partitions it owns (a loop's partition is its
    execution's)."""

    def __init__(
        self, nc: NATS, *, layout: Layout, retired_cache: int = 10_000, render_bounds: RenderBounds | None = None
    ) -> None:
        super().__init__(
            nc,
            layout=layout,
            consumer=counter_consumer,
            key_of=loop_key,
            partition_of=lambda key: layout.partition_of(key[0]),
            retired_cache=retired_cache,
            max_resident=layout.counter_max_resident,
            role="counter",
            render_bounds=render_bounds,
        )

    def spawn(self, key: tuple[str, str]) -> LoopActor:
        return LoopActor(self, *key)
