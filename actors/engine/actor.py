"""Per-execution engine actors, hosted by partition consumers.

An `Engine` owns a set of partitions. Each partition is a durable push consumer on
`exec.<p>.*.in.>` (inputs only). Messages are dispatched by execution id to an
`ExecutionActor` (a log actor: actors/runtime/logactor.py), which processes its inputs one at
a time:

    input -> fold(state, input) -> publish commands -> publish decision record and
    lifecycle events -> ack input

Commands go first: a `command.issued` in the log then proves its command was
published, so a replay never needs to guess. The input is acked last: if the
process dies anywhere before, the input is redelivered and the new actor rebuilds
its state by replaying the execution's subject.

Replay (rehydrate): read the execution's whole subject, fold every input again (same
outputs, by determinism), and publish only the outputs whose decision record or
lifecycle event is missing from the log. Recognising them by cause (the input's
stream sequence) rather than relying on the server's duplicate window is what keeps a
replay after hours from duplicating anything.

Each replayed decision is held against the one recorded (actors/core/replay.py
`Replayer`): if this code decides otherwise (a changed rule, a template engine that
renders differently, a start record of semantics it does not know) the execution halts
at that input: an `execution.halted` lifecycle event names the first differing record
(once per halt: a halt at the same input after a resume is a new one), nothing more is
published for it, and its inputs are handed back with a delay that grows
(LogActor.handle), so an engine that decides as the log does (a rollback) replays it,
writes `execution.resumed` and goes on. An execution whose log already records its end
has nothing left to decide: its late input is acked once the halt is recorded. Other
executions are untouched. Only the engine's own halts are resumed here: a loop's halt
(its input seq is a LOOP stream sequence) is the counter's to resume.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from actors.core.decide import execution_error, fold
from actors.core.effects import Effects
from actors.core.replay import SEMANTICS, HaltKey, Mismatch, Recorded, Replayer, Stored
from actors.core.state import Execution
from actors.engine.readback import read_back
from actors.natsio import (
    EXPECTED_LAST_SUBJECT_FILTER,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    MSG_ID,
    ack,
    command_sent,
    dead_letter,
    has_message,
    log_time,
    publish_all,
    publisher,
    stream_seq,
)
from actors.natsio.binding import codec_of
from actors.natsio.dispatch import subscribe_direct
from actors.natsio.replay import first_message
from actors.natsio.replies import is_inbox
from actors.natsio.requests import requester
from actors.playbook.budget import RenderHalted, SliceExhausted
from actors.playbook.templates import RenderFault
from actors.runtime import tracing
from actors.runtime.exectrace import ExecutionTrace
from actors.runtime.hosting import PartitionHost
from actors.runtime.logactor import LogActor, LogEntry
from actors.runtime.metrics import ANSWER_ASKS, HALTED_REPLAYS
from actors.runtime.outbox import Outbox, carrier_message, holdable
from actors.runtime.render_process import RenderBounds
from actors.runtime.stopping import cancel_and_wait
from actors.runtime.supervision import Refold, engine_error, is_transient
from actors.wire.events import (
    ActivationStatus,
    DecisionRecord,
    ExecState,
    ExecutionHaltedData,
    ExecutionResumedData,
    PlaybookFailedData,
    answer_decoder,
    decision_decoder,
    event_decoder,
    extras_decoder,
    in_order,
    make_event,
)
from actors.wire.messages import (
    CallDone,
    CallError,
    CancelRequest,
    EngineFault,
    ErrorInfo,
    Input,
    IteratorCompleted,
    IteratorFailed,
    RetriedBy,
    SignalSent,
    StartRecord,
    TimerFired,
    command_of_answer,
    input_decoder,
)
from streams import ids
from streams.layout import EXECUTION_ID, LOOP_STREAM, Layout, engine_consumer
from streams.subjects import (
    ANSWER,
    CANCEL,
    EV,
    FAULT,
    IN,
    ITERATOR,
    LC,
    RESULT,
    RETRIED,
    SIGNAL,
    START,
    TIMER,
    ExecSubjects,
    answer_request_subject,
    class_of,
    execution_of,
    is_answer_record,
    is_start_answer,
    start_ask_subject,
    type_of,
)

log = logging.getLogger("actors.engine")
fault_decoder = msgspec.json.Decoder(EngineFault)

# what each input subject (`exec.<p>.<id>.in.<type>...`) takes: the decoder reads the
# type from the message, so without this a message of one type published where another
# is written (a user may publish `in.signal` and `in.cancel`) would be folded as sent
INPUT_TYPES: dict[str, tuple[type, ...]] = {
    START: (StartRecord,),
    RESULT: (CallDone, CallError),
    ITERATOR: (IteratorCompleted, IteratorFailed),
    TIMER: (TimerFired,),
    FAULT: (EngineFault,),
    CANCEL: (CancelRequest,),
    RETRIED: (RetriedBy,),
    SIGNAL: (SignalSent,),
    # the result an answer record holds (semantics 5), or the start record an execution's
    # first answer record holds (semantics 6: its start stored with its first decision)
    ANSWER: (CallDone, CallError, StartRecord),
}

FAST_SEMANTICS = 5  # from which a tool asks (actors/core/work.py FAST_ANSWERS)
# from which a starter asks too (an execution's start stored with its first decision),
# and an answer record may carry lifecycle events and a command (`one_message_only`)
START_ANSWERS = 6
STORED = "stored"  # the reply that tells a tool (or a starter) its input is stored (actors/tools/running.py `_ask`)
NOT_STORED = "not stored"  # a refusal of the server's (or no PubAck): the log may hold inputs the actor lacks
# the step a start's first decision is remembered under in `Engine.misfits` (no step is
# named so: a step name is a YAML key the loader checks, never `<...>`)
START_STEP = "<start>"


def start_step(record: StartRecord) -> str:
    """What `Engine.misfits` remembers a start's first decision under: the playbook's
    entry, or the step a retry starts from (another first decision)."""
    return START_STEP if record.retry_of is None else f"{START_STEP}{record.retry_of.from_step}"


def one_message_only(fx: Effects, semantics: int) -> str | None:
    """Why the decision `fx` of an execution of `semantics` cannot be stored as one
    answer record (None: it can): it must be some events and at most one command, or
    lifecycle events (the last step's decision: the execution's end) and no command,
    and nothing else at all. From semantics 6, lifecycle events and one command too (an
    execution's first decision, a step's that enters a wait beside another's command):
    the record is a lifecycle carrier whose subject names the command's kind
    (`in.answer.lc.<type>.cmd.<kind>`), which both the projector and that kind's tool
    actors read. An execution of 5 keeps refusing it: a pod of 5 never meets one in a
    log of 5."""
    others = (fx.starts or fx.loops or fx.signal_forwards or fx.timers or fx.reply is not None or fx.child_cancels) or (
        fx.loop_cancels or fx.cancels or fx.failures or fx.verdict is not None
    )
    if others:
        return "the decision sends more than a command"
    if fx.lifecycle and fx.commands and semantics < START_ANSWERS:
        return "the decision has lifecycle events and a command"
    if len(fx.commands) > 1:
        return "the decision issues more than one command"
    if not fx.events and not fx.lifecycle:
        return "the decision records nothing"
    return None


def answer_cause(data: bytes, seq: int) -> int:
    """The cause an answer record's decision is recorded under (minus the input it
    followed), read with no codec (a cause is never sealed); `seq`, the record's own
    stream seq, when it cannot be read."""
    try:
        return answer_decoder.decode(data).record.cause
    except (msgspec.DecodeError, RecursionError):
        return seq


def fits_subject(subject: str, inp: Input) -> bool:
    """Is `inp` of a type its input subject takes (INPUT_TYPES)?"""
    return isinstance(inp, INPUT_TYPES.get(type_of(subject).split(".", 1)[0], ()))


def _not_ready(actor: ExecutionActor | None, inp: CallDone | CallError) -> str | None:
    """Why `actor` cannot fold `inp` and store it with its decision now (None: it can)."""
    if actor is None:
        return "no resident actor"
    if not actor.hydrated or actor.halted is not None:
        return "the actor is not hydrated"
    if not actor.mailbox.empty() or actor.turn.locked() or actor.waiting:
        return "the actor is busy"
    if actor.state.semantics < FAST_SEMANTICS or actor.state.terminal:
        return "not an execution of semantics 5 that runs"
    if actor.trace is not None:
        return "tracing is on"
    if getattr(inp, "result_ref", None) is not None or inp.iteration_index is not None:
        return "the result is a blob, or a loop iteration's"
    if actor.last_seq <= 0:
        return "nothing folded yet"
    act_id = actor.state.by_command.get(inp.command_id)
    act = actor.state.activations.get(act_id) if act_id is not None else None
    if act is None or act.status != ActivationStatus.RUNNING or act.command_id != inp.command_id:
        # the fold would decide nothing (`call_result`): a duplicate or a late result
        return "the result's command is not in flight"
    return None


# asks an engine pod handles at once (`Engine._asking`): any more are refused at once
ASKS_IN_FLIGHT = 1024
T = TypeVar("T")

# steps remembered as deciding what one answer record cannot hold (`Engine.misfits`)
MISFITS_REMEMBERED = 4096
MisfitKey = tuple[str, int, str]  # playbook path, its source's hash (the version), step


def misfit_key(state: Execution, step: str) -> MisfitKey:
    # the state holds no version number: its source's hash tells versions apart (a str
    # caches its hash, so this costs nothing after the first ask)
    return state.playbook_path, hash(state.playbook_source), step


def misfit_key_of(record: StartRecord, step: str) -> MisfitKey:
    """`misfit_key` of the state `record`'s fold starts (`_start` copies both)."""
    return record.playbook_path, hash(record.playbook_source or ""), step


class ExecutionActor(LogActor):
    source = "engine"

    def __init__(self, engine: Engine, execution_id: str) -> None:
        subjects = ExecSubjects.of(execution_id, engine.layout.partitions)
        super().__init__(
            engine,
            execution_id,
            execution_id,
            Outbox(engine.nc, engine.js, engine.layout, execution_id=execution_id, subjects=subjects, sender="engine"),
        )
        self.engine = engine
        self.subjects = subjects
        self.stream = engine.layout.exec_stream_of(execution_id)
        self.state = Execution(execution_id=execution_id)
        self.skip: set[int] = set()  # stream seqs of inputs given up on (EngineFault): never folded
        self.replayer: Replayer | None = None  # while a replay folds: holds each decision against the log
        self.start_seq: int | None = None  # where the start record this actor folded is in the log
        # the seq the last input was folded with: its stream sequence, or an answer
        # record's cause (semantics 5)
        self.folded_seq = 0
        self.last_at = 0.0  # the log time of the last input folded (an answer record's `at` is never before it)
        # its spans (docs/tracing.md): fed by every fold, read by nothing the fold decides
        self.trace = ExecutionTrace(execution_id, sealed=codec_of(engine.js).encrypts) if tracing.enabled() else None
        self.outbox.trace = self.trace

    @property
    def finished(self) -> bool:
        return self.state.terminal

    async def publish(self, effects: Effects) -> None:
        # from semantics 2 on, a decision with lifecycle events is one message (docs/upgrades.md)
        self.outbox.carry = self.state.semantics >= 2
        await super().publish(effects)
        if self.trace is not None:
            self.trace.flush()  # the spans of what is now stored

    async def handle(self, batch: list[Msg]) -> None:
        if self.trace is None:
            await super().handle(batch)
            return
        # the execution's span is the current one while its input is handled (log lines
        # carry its ids); not yet for the input an actor folds its start record from
        with tracing.handling(self.trace.root):
            await super().handle(batch)

    def reset(self) -> None:
        super().reset()
        if self.trace is not None:
            self.trace.pending.clear()  # not stored: the replay that follows decides again

    def log_inputs(self) -> str:
        return self.subjects.inputs

    def opens_log(self, subject: str) -> bool:
        # a start record, or (semantics 6) the start stored with its first decision
        return type_of(subject) == START or is_start_answer(subject)

    async def first_input(self, msg: Msg) -> bool:
        """A start stored with its first decision is the log's first input: the server
        stores it only while the log holds no input (its check over `in.>`). A plain
        start record is checked on its own subject only (or, from semantics 6, over the
        inputs by a starter of this release): a cancel or a signal sent before it, or a
        start answer (a starter of another release, past the duplicate window), may
        precede it, folded by an actor gone since (evicted, the partition moved), and
        one direct get of the first input tells."""
        if not self.opens_log(msg.subject):
            return False
        if is_start_answer(msg.subject):
            return True
        try:
            first = await first_message(self.engine.nc, self.stream, self.subjects.inputs)
        except NotFoundError:  # gone since (retired): replayed, which reads what is there
            return False
        return first.seq == stream_seq(msg)

    async def give_up(self, batch: list[Msg], error: Exception, level: int) -> bool:
        """Handling the input failed deterministically, again and again. The first time,
        an `EngineFault` naming it goes to the execution's inputs: the replay that
        follows skips the input and folds the fault, which fails the execution with the
        error. If even that fails, the execution's end is written straight to its
        lifecycle and the actor stops: no execution stays RUNNING because of an engine
        bug."""
        msg = batch[0]
        seq = stream_seq(msg)
        info = engine_error(error, subject=msg.subject, seq=seq, data=msg.data)
        eid, js = self.execution_id, self.engine.js
        if level == 1:
            fault = EngineFault(execution_id=eid, input_seq=seq, input_subject=msg.subject, error=info)
            await publish_all(js, [(self.subjects.fault, codec_of(js).encode(fault), ids.fault_id(eid, seq))])
            self.skip.add(seq)
            return False
        ended = make_event(
            PlaybookFailedData(
                playbook=self.state.playbook_path,
                started_at=self.state.started_at,
                ended_at=log_time(msg),
                error=execution_error(info, step=None, failed_steps=list(self.state.failed_steps)),
            ),
            execution_id=eid,
            at=log_time(msg),
            cause=seq,
        )
        await self.outbox.record(Effects(cause=seq, lifecycle=[ended]))
        self.state.status = ExecState.FAILED
        await ack(msg)
        return True

    async def unreadable(self, entry: LogEntry, error: ErrorInfo) -> None:
        """An `EngineFault` naming the input, as `give_up` records one, but at once: its
        fold fails the execution with `error` (which names the key id)."""
        eid, js = self.execution_id, self.engine.js
        fault = EngineFault(execution_id=eid, input_seq=entry.seq, input_subject=entry.subject, error=error)
        await publish_all(js, [(self.subjects.fault, codec_of(js).encode(fault), ids.fault_id(eid, entry.seq))])
        self.skip.add(entry.seq)

    async def fold_input(self, entry: LogEntry, into: Effects | None = None) -> Effects | None:
        before = self.last_seq
        self.last_seq = entry.seq
        self.folded_seq = fold_seq = entry.seq
        fold_at = entry.at
        self.last_at = max(self.last_at, entry.at)
        if entry.seq in self.skip:
            if is_answer_record(entry.subject):
                # its decision is in the log at its cause: a replay that finds it skipped
                # knows it diverged (`Replayer.check`), and fails the execution with the
                # fault's error instead of comparing the records after it
                self.folded_seq = answer_cause(entry.data, entry.seq)
            return None  # given up on (EngineFault): folding it failed, and would again (checked before decoding)
        if is_answer_record(entry.subject):
            if self.replayer is None:
                if is_start_answer(entry.subject) and before == 0 and self.state.inputs_folded == 0:
                    # the log's first input (semantics 6: its start stored with its first
                    # decision, `opens_log`), met by an actor that folded nothing: the
                    # replay of a log of this one input, the records it holds its own,
                    # without reading the log (nothing precedes it, what follows is
                    # delivered after it)
                    await self._replay([entry])
                    return None
                # met live by an actor that did not write it (another pod's, during a
                # handover): rebuilt by a replay instead, which folds it and holds its
                # decision against this code's (a live fold would compare nothing)
                raise Refold
            # a result stored with the decision it led to (semantics 5): folded with that
            # decision's cause and time, as when it was decided
            held = await self.decode(answer_decoder, entry)
            if held is None:  # (unreadable: as for one skipped above)
                self.folded_seq = answer_cause(entry.data, entry.seq)
                return None
            record = held.record
            self.folded_seq = record.cause
            if record.answer is None:
                await self._misfiled(entry, None)
                return None
            # decoded under its own stream seq (a fault names that), folded with the cause
            entry = LogEntry(entry.subject, bytes(record.answer), entry.seq, entry.at, entry.headers)
            fold_seq, fold_at = record.cause, record.at if record.at is not None else entry.at
        inp = await self.decode(input_decoder, entry)
        if inp is None:
            return None
        if not fits_subject(entry.subject, inp):
            await self._misfiled(entry, inp)
            return None
        if isinstance(inp, StartRecord) and inp.execution_id != self.execution_id:
            return None
        if isinstance(inp, StartRecord):
            if self.trace is not None:
                self.trace.started(inp, entry.at)
            if self.start_seq is None or self.state.status == ExecState.PENDING:
                self.start_seq = entry.seq
            elif entry.seq != self.start_seq and self.replayer is None and await self._history_gone():
                # a start under the id of the execution this actor holds, whose records
                # were retired since (actors/store/retire.py): it begins a new execution,
                # folded from the log as it is now
                raise Refold from None
        too_new = (self.replayer or Replayer(self.execution_id, Recorded())).admit(entry.seq, entry.subject, inp)
        if too_new is not None:  # future semantics: not guessed at, live or in a replay
            await self.halt(too_new, entry, self.replayer.recorded if self.replayer else None)
            return None
        inp = await self._ready_to_fold(inp)
        state = self.state
        try:
            fx = await self.engine.fold_off_loop(
                self, functools.partial(fold, state, inp, seq=fold_seq, at=fold_at, subjects=self.subjects)
            )
        except RenderFault as fault:
            # cut short by a bound of the render process, not decided by the template:
            # recorded first (an EngineFault naming this input, which fails the
            # execution), and every replay folds that record instead of rendering again
            log.warning("execution %s: input %d: %s", self.execution_id, entry.seq, fault.describe())
            await self.unreadable(entry, ErrorInfo(type="TemplateLimit", message=fault.describe()))
            raise Refold from None  # the fold may have changed the state part way: rebuild it
        if self.trace is not None:
            self._traced(LogEntry(entry.subject, entry.data, fold_seq, fold_at, entry.headers), inp, fx)
        if into is not None:  # live: never an answer record (met live, it raised Refold above)
            into.merge(fx)
        return fx

    async def _misfiled(self, entry: LogEntry, inp: Input | None) -> None:
        """An input whose type is not its subject's (a `timer.fired` published on
        `in.signal`, where any user may publish): never folded, live or in a replay,
        and dead-lettered the first time it is met live, saying why."""
        if not self.hydrated:
            return
        await dead_letter(
            self.engine.js,
            source=self.source,
            reason=f"input of type {type(inp).__name__} on {entry.subject}: not what that subject takes; not folded"
            if inp is not None
            else f"answer record on {entry.subject} holds no answer; not folded",
            subject=entry.subject,
            data=entry.data,
            execution_id=self.execution_id,
            msg_id=ids.dead_letter_id(self.source, self.stream, entry.seq),
        )

    async def store_answer(self, data: bytes, inp: CallDone | CallError) -> str:
        """A tool's result (`data`, as it sent it) folded now and stored with the
        decision it leads to as one input, an answer record (semantics 5,
        docs/architecture.md "The next layout", item 2). The caller holds `turn` and
        checked that nothing else is being handled. Returns `stored`, or why not: then
        the tool publishes the result itself, and the actor, if its state moved,
        rebuilds by replay (`reset`)."""
        last = self.last_seq  # the last input folded: the state is the fold of every input up to it
        # the step as the state knows it (checked in flight by `_not_ready`), not as the
        # request says: a request naming other steps must not fill `misfits`
        step = self.state.activations[self.state.by_command[inp.command_id]].step
        # never before the log's own time (a pod whose clock is behind): recorded, so
        # deterministic either way, but a step's time should not run backwards
        at = max(time.time(), self.last_at)
        return await self._store_with_decision(
            data,
            inp,
            last=last,
            at=at,
            key=misfit_key(self.state, step),
            msg_id=ids.result_id(self.execution_id, inp.command_id),
        )

    async def store_start(self, data: bytes, record: StartRecord) -> str:
        """A starter's start record (`data`, as it sent it) folded by this fresh actor
        and stored with the first decision as one input, the log's first (semantics 6):
        an answer record of cause 0 (minus the input before it: none) under the start
        record's own message id, stored only while the execution has no input at all
        (`Nats-Expected-Last-Subject-Sequence: 0` over `exec.<p>.<id>.in.>`), so never a
        second start. Folded as `fold_input` folds a start record: its payload read back
        from a blob, a big playbook loaded off the loop first. Returns `stored`, or why
        not: then the starter writes the plain start record, and the actor rebuilds by
        replay at its next input (`reset`)."""
        return await self._store_with_decision(
            data,
            record,
            last=0,
            at=time.time(),
            key=misfit_key_of(record, start_step(record)),
            msg_id=ids.start_record_id(self.execution_id),
        )

    async def _store_with_decision(
        self,
        data: bytes,
        inp: CallDone | CallError | StartRecord,
        *,
        last: int,
        at: float,
        key: MisfitKey,
        msg_id: str,
    ) -> str:
        """`inp` folded now on the actor's state with cause -`last` and time `at`, and
        stored with the decision it leads to as one answer record, checked by the server
        to follow input `last` (`store_answer`, `store_start`). Refused for the step's
        (or the playbook's) sake, not this input's, the step `key` is remembered
        (`Engine.misfits`): its shape (a loop, a fan-out, a timer...), a fold that
        fails for good (not a transient error, a render process killed or stopped), a
        record too large even without this input's own value (`_own_bytes`)."""
        stored = False
        try:  # from the fold on, anything but `stored` leaves the state moved: rebuilt by replay
            try:
                folded = await self._ready_to_fold(inp)  # as `fold_input` folds it
                fx = await self.engine.fold_off_loop(
                    self, functools.partial(fold, self.state, folded, seq=-last, at=at, subjects=self.subjects)
                )
            except (Exception, RenderFault, RenderHalted, SliceExhausted) as e:
                # a template that must render in isolation, an error that would fail the
                # same fold again: the playbook's; a NATS error (a payload blob read
                # back), a render process killed or stopped: not
                if isinstance(e, SliceExhausted) or (isinstance(e, Exception) and not is_transient(e)):
                    self.engine.misfit(key)
                return f"the fold failed: {type(e).__name__}"
            why = one_message_only(fx, self.state.semantics)
            command = holdable(self.outbox.codec, fx) if fx.commands else None
            if why is None and fx.commands and command is None:
                why = "its command cannot be held by the record"
            if why is not None:  # the step's shape (a loop, a fan-out, a timer...): remembered
                self.engine.misfit(key)
                return why
            record = DecisionRecord(cause=-last, events=fx.events, command=command, answer=msgspec.Raw(data), at=at)
            kind = fx.commands[0].kind if command is not None else None
            if fx.lifecycle:
                # the last step's decision (the execution's end), or from semantics 6 the
                # first decision of an execution: shaped as a lifecycle carrier is
                # (actors/runtime/outbox.py `carrier_message`), on
                # `in.answer.lc.<carrier type>[.cmd.<kind>]`; a large result goes as a
                # blob, as there
                for ev in fx.lifecycle:
                    await self.outbox.offload_result(ev)
                type_, payload = carrier_message(self.outbox.codec, fx.lifecycle, record)
                subject = self.subjects.answer_lifecycle(type_, kind)
            else:
                payload = self.outbox.codec.encode(record)
                subject = self.subjects.answer_record(kind)
            if len(payload) > self.outbox.limit:
                if len(payload) - self._own_bytes(data, inp) > self.outbox.limit:  # the playbook's size
                    self.engine.misfit(key)
                return "the record is too large"
            headers = {
                MSG_ID: msg_id,
                EXPECTED_LAST_SUBJECT_SEQUENCE: str(last),
                EXPECTED_LAST_SUBJECT_FILTER: self.subjects.inputs,
            }
            try:
                # the pod's pipelined publisher (actors/natsio/publishing.py): one PubAck
                # future, no retry (a refusal is an answer here, not an outage)
                puback = await (await publisher(self.engine.nc).publish(subject, payload, headers))
            except Exception as e:  # a wrong last sequence (another input came), a timeout, ...
                return f"{NOT_STORED}: {e!r}"
            if puback.duplicate:
                return "a duplicate"
            self.folded(puback.seq)  # its delivery, when it comes, is of an input folded
            self.last_at = at
            if isinstance(inp, StartRecord):  # the log's first input: nothing precedes it
                self.start_seq = puback.seq
                self.hydrated = True
                # inputs stored after it come in this gap epoch, or a later one if one
                # of their deliveries goes missing (LogActor.in_order)
                self.seen_epoch = self.host.gap_epoch(self.stream, self.key)
            stored = True
            return STORED
        finally:
            if not stored:
                self.reset()

    def _own_bytes(self, data: bytes, inp: Input) -> int:
        """How much of `data` (an input as asked) is its own value, which the next input
        of the step need not share: a result, all of it; a start record, its payload
        (its playbook's source is the playbook's, in every start of it)."""
        if not isinstance(inp, StartRecord):
            return len(data)
        return max(0, len(data) - len(self.outbox.codec.encode(msgspec.structs.replace(inp, payload={}))))

    def _traced(self, entry: LogEntry, inp: Input, fx: Effects | None) -> None:
        """Feed the execution's spans: every fold, live or replayed, so what is open is
        known; spans are queued only for an input whose decision this pod writes (live,
        or a replay that finds none recorded), never for one the log already holds."""
        trace = self.trace
        assert trace is not None
        recorded = self.replayer.recorded if self.replayer is not None else None
        emit = recorded is None or (entry.seq not in recorded.decisions and entry.seq not in recorded.by_cause)
        trace.observe(inp, fx, entry.at, emit=emit)

    async def _history_gone(self) -> bool:
        """Is the start record this actor folded no longer in the log?"""
        assert self.start_seq is not None
        try:
            await self.engine.nc.jsm().get_msg(self.stream, self.start_seq)
        except NotFoundError:
            return True
        return False

    async def _read_back(self, inp: Input) -> Input:
        return await read_back(self.engine.js, inp)

    async def _ready_to_fold(self, inp: Input) -> Input:
        """`inp` as the fold takes it: the values it names as blobs read back, and a
        start's playbook loaded off the loop first (a big one would hold the loop)."""
        inp = await self._read_back(inp)
        if isinstance(inp, StartRecord) and inp.playbook_source:
            await self.engine.preload_playbook(inp.playbook_source, inp.playbook_path, inp.limits.max_attempts)
        return inp

    # --- replay ----------------------------------------------------------------------

    async def rehydrate(self) -> None:
        await self._replay(await self.read_log(self.subjects.log, through=self.replay_through))

    async def _replay(self, entries: list[LogEntry]) -> None:
        """Fold the inputs of `entries` (the log, or its part read so far) into fresh
        state, each decision held against the records `entries` hold, and publish what
        they lack."""
        inputs: list[LogEntry] = []
        seen = Recorded()
        codec = codec_of(self.engine.js)
        for entry in entries:
            cls = class_of(entry.subject)
            if cls == IN:
                inputs.append(entry)
                kind = type_of(entry.subject)
                if kind == RESULT:  # every result on one subject (semantics 4): the command is in it
                    answered = command_of_answer(entry.data)
                    if answered is not None:
                        seen.answered(answered)
                elif kind.startswith(f"{RESULT}."):
                    seen.answered(kind.split(".", 1)[1])
                elif kind.startswith(f"{TIMER}."):
                    seen.fired.add(kind.split(".", 1)[1])
                elif kind == FAULT:
                    seen.skip.add(fault_decoder.decode(entry.data).input_seq)
                elif is_answer_record(entry.subject):  # a result (or the start, 6) with its decision (semantics 5)
                    held = codec.decode(answer_decoder, entry.data)
                    record = held.record
                    seen.decision(entry.seq, entry.subject, record)
                    # a carrier's (`in.answer.lc.<type>[.cmd.<kind>]`): the last step's, the
                    # execution's end; from semantics 6 the first decision's too
                    for one in held.lifecycle:
                        seen.event(entry.seq, entry.subject, one)
                    answered = command_of_answer(bytes(record.answer)) if record.answer is not None else None
                    if answered is not None:
                        seen.answered(answered)
            elif cls == EV:
                seen.decision(entry.seq, entry.subject, codec.decode(decision_decoder, entry.data))  # decrypted
            elif cls == LC:
                ev = codec.decode(event_decoder, entry.data)
                extras = codec.decode(extras_decoder, entry.data)  # a decision it carries (semantics 2)
                if extras.decision is not None:
                    seen.decision(entry.seq, entry.subject, extras.decision)
                for one in in_order(ev, extras):
                    seen.event(entry.seq, entry.subject, one)
        self.skip |= seen.skip
        self.replayer = replayer = Replayer(self.execution_id, seen)
        self.state = replayer.fresh()
        self.last_seq = 0
        self.last_at = 0.0
        if self.trace is not None:
            self.trace.clear()
        # the engine's halts no replay has ended yet (a loop's are the counter's to end)
        halted = seen.open_halts("engine")
        try:
            for entry in inputs:
                fx = await self.fold_input(entry)
                if self.halted is not None:
                    return  # semantics it does not know (fold_input halted it)
                # an answer record's decision is recorded at its cause (`folded_seq`); a
                # mismatch names its own stream seq, so a halt there is resumed (below,
                # `entry.seq >= halted seq`) only once a replay reaches it
                mismatch = replayer.check(entry.seq, entry.subject, fx, cause=self.folded_seq)
                if mismatch is not None:
                    await self.halt(mismatch, entry, seen)
                    return
                while halted and entry.seq >= halted[0][0][2] and not replayer.diverged:
                    # the code that halted it is gone: this one decides as the log does, up
                    # to the halted input. Resumed before anything decided for that input
                    # is published, so the log reads halt, resume, then what follows. Not
                    # after a replay that stopped comparing (`diverged`): it proves nothing
                    await self._resumed(*halted.pop(0), seen)
                if fx:
                    await self.publish(await self._missing(fx, seen))
        finally:
            self.replayer = None
        if not replayer.diverged:
            for key, stored in halted:  # the halted input is not in this log's replay: resume at its end
                await self._resumed(key, stored, seen)
        self.hydrated = True
        log.info("execution %s: replayed %d inputs, state %s", self.execution_id, len(inputs), self.state.status)

    async def halt(self, mismatch: Mismatch, entry: LogEntry, seen: Recorded | None = None) -> None:
        """Stop this execution at `entry`: record why (unless the log holds that halt
        open already), count it when recorded, fold and publish nothing more. Its
        inputs are handed back with a growing delay (LogActor.handle) and wait for code
        that decides as the log does; an engine that does replays it from the start.
        `self.halted` is set only once the halt is recorded: a publish that fails is
        retried by the replay that follows (`on_failure`), not taken for done."""
        seen = seen or Recorded()
        key = ("engine", None, mismatch.input_seq)
        # the pod's log is not sealed: kinds, seqs and subjects only (the values are in the sealed event)
        log.error("execution %s halted: %s", self.execution_id, mismatch.brief())
        if key not in seen.halts:  # else recorded by an earlier replay (this pod's or another's), still open
            await self._record_halt(mismatch, entry, seen.round_of(key))
            HALTED_REPLAYS.inc(role="engine", kind=mismatch.kind)
        self.halted = mismatch
        self.halted_ended = seen.ended
        self.hydrated = True

    async def _record_halt(self, mismatch: Mismatch, entry: LogEntry, round_: int) -> None:
        await self._lifecycle(
            mismatch.halted_data(source="engine"),
            cause=entry.seq,
            at=entry.at,
            msg_id=ids.halted_id(self.execution_id, "engine", entry.seq, round_),
        )

    async def _resumed(self, key: HaltKey, halted: Stored, seen: Recorded) -> None:
        halted_seq = key[2]
        log.warning(
            "execution %s: replays as its log records again (halted at input %d)", self.execution_id, halted_seq
        )
        await self._lifecycle(
            ExecutionResumedData(halted_seq=halted_seq, semantics=SEMANTICS, source="engine"),
            cause=halted_seq,
            at=halted.value.at,  # the halt's own time: the event is the same whoever writes it
            msg_id=ids.resumed_id(self.execution_id, halted_seq, "engine", seen.round_of(key)),
        )

    async def _lifecycle(
        self, data: ExecutionHaltedData | ExecutionResumedData, *, cause: int, at: float, msg_id: str
    ) -> None:
        """A lifecycle event the shell writes (the fold never decides these)."""
        ev = make_event(data, execution_id=self.execution_id, at=at, cause=cause)
        js = self.engine.js
        await publish_all(js, [(self.subjects.lifecycle(ev.type), codec_of(js).encode(ev), msg_id)])

    async def _missing(self, fx: Effects, seen: Recorded) -> Effects:
        """What of a replayed decision the log lacks. A stored decision record proves
        that everything it decided was sent before it: only lifecycle events it lacks
        remain. Otherwise: commands neither answered nor still queued, loops not handed
        over, timers that have not fired, and every signal (idempotent downstream: a
        signal forwarded to a loop of waits too, by its message id and the counter's
        memory of the ids it took)."""
        lifecycle = [ev for ev in fx.lifecycle if not seen.has_lifecycle(ev.type, fx.cause)]
        if fx.cause in seen.decisions:
            return Effects(cause=fx.cause, at=fx.at, lifecycle=lifecycle)
        nc = self.engine.nc
        return fx.copy(
            lifecycle=lifecycle,
            commands=[c for c in fx.commands if not await command_sent(nc, c, seen.results, reply_stream=self.stream)],
            loops=[
                s for s in fx.loops if not await has_message(nc, LOOP_STREAM, self.outbox.loop_subjects(s.loop_id).spec)
            ],
            timers=[t for t in fx.timers if t.timer_id not in seen.fired],
        )


class Engine(PartitionHost[str, ExecutionActor]):
    """Hosts execution actors for the partitions it owns."""

    def __init__(
        self,
        nc: NATS,
        *,
        layout: Layout,
        retired_cache: int = 10_000,
        render_bounds: RenderBounds | None = None,
        fast_answers: bool = True,
    ) -> None:
        super().__init__(
            nc,
            layout=layout,
            consumer=engine_consumer,
            key_of=execution_of,
            partition_of=layout.partition_of,
            retired_cache=retired_cache,
            max_resident=layout.engine_max_resident,
            role="engine",
            render_bounds=render_bounds,
        )
        # partition -> its subscriptions to asks: `answer.<p>` (tools), `answer.start.<p>` (starters)
        self._asks: dict[int, list[Subscription]] = {}
        # the steps whose decision did not fit one answer record (a loop, a child, a
        # fan-out, a timer, lifecycle events with a command, a command not holdable, too
        # large), most recent last: the next ask for one is refused before its fold,
        # which would be wasted (a refusal after the fold rebuilds the actor by replay).
        # Not a determinism concern: where a result is stored (in an answer record, or
        # on its own as before) never changes what is decided, and both shapes replay
        # to the same state; this only saves work, and differs from pod to pod
        self.misfits: OrderedDict[MisfitKey, None] = OrderedDict()
        self._asking: set[asyncio.Task[Any]] = set()
        # whether this pod serves asks at all (ACTORS_FAST_ANSWERS; `0` before rolling
        # back to a release before semantics 5: docs/upgrades.md), and for which streams
        self.fast_answers = fast_answers
        self._serves: dict[str, bool] = {}
        if not fast_answers:
            log.warning(
                "engine: ACTORS_FAST_ANSWERS=0: no answer records stored; tools and starters write results and starts"
            )

    async def gain(self, partition: int) -> None:
        await super().gain(partition)
        if partition not in self._asks and await self.serves_asks(partition):
            # read as it arrives (no task per subscription): each ask its own task. Kept
            # as each is made, so a gain cancelled between the two leaves none that
            # `lose` or `stop` would not unsubscribe
            subs = self._asks[partition] = []
            for subject, on_msg, _ in self._ask_subjects(partition):
                subs.append(await subscribe_direct(self.nc, subject, on_msg, queue="engine.answer"))
            # and the tools and the starter on this pod's own connection ask without a
            # request through the server (actors/natsio/requests.py): same answer
            local = requester(self.nc)
            for subject, _, answer in self._ask_subjects(partition):
                local.answer_locally(subject, answer)

    def _ask_subjects(
        self, partition: int
    ) -> tuple[tuple[str, Callable[[Msg], None], Callable[[bytes], asyncio.Task[bytes]]], ...]:
        """Where partition `partition`'s asks come, with what takes one from the server
        and what answers one made on this pod's own connection: a tool's (`answer.<p>`)
        and a starter's (`answer.start.<p>`), each taking its own."""
        return (
            (answer_request_subject(partition), self._on_ask, self._local_ask),
            (start_ask_subject(partition), self._on_start_ask, self._local_start_ask),
        )

    async def serves_asks(self, partition: int) -> bool:
        """Does this pod store answer records for partition `partition`? Not when told
        not to (ACTORS_FAST_ANSWERS=0), on a nats-server before 2.11 (it ignores
        `Nats-Expected-Last-Subject-Sequence-Subject`: the check would be against the
        record's own subject), nor on a stream of more than one replica: there the
        server checks the last sequence against committed messages only, and its guard
        for messages still being proposed looks up the exact subject, not the filter
        `exec.<p>.<id>.in.>`, so an input in flight is not seen and the record could be
        stored after it (docs/architecture.md "The next layout", item 2). Not served:
        the partition's `answer.<p>` is not subscribed, and a tool asking gets no
        responders at once and publishes its result itself (semantics 4's layout). The
        stream's own replicas are read, once: they can differ from ACTORS_REPLICAS."""
        if not self.fast_answers:
            return False
        stream = self.layout.exec_stream(partition)
        serves = self._serves.get(stream)
        if serves is None:
            why = await self._not_served(stream)
            if why is None:
                serves = self._serves[stream] = True
            else:
                serves = False
                if why[1]:  # a fact of the deployment, not a failure to read it: remembered
                    self._serves[stream] = False
                log.warning("engine: asks to store answer records on %s not served: %s", stream, why[0])
        return serves

    async def _not_served(self, stream: str) -> tuple[str, bool] | None:
        """Why asks on `stream` are not served (and whether that is settled), or None."""
        try:
            version = self.nc.connected_server_version
            too_old = (version.major, version.minor) < (2, 11)
        except Exception as e:  # a version nats-py cannot parse: not known to check the subject
            return f"the server's version is not known ({e!r})", True
        if too_old:
            return f"nats-server {version} is before 2.11 (no Nats-Expected-Last-Subject-Sequence-Subject)", True
        try:
            info = await self.nc.jsm().stream_info(stream)
        except Exception as e:  # asked again at the next gain
            return f"its stream could not be read ({e!r})", False
        replicas = info.config.num_replicas or 1
        if replicas > 1:
            return f"the stream has {replicas} replicas (the last-sequence check holds on one only)", True
        return None

    async def lose(self, partition: int) -> None:
        self._stop_answering_locally(partition)
        for sub in self._asks.pop(partition, []):
            await sub.unsubscribe()
        await super().lose(partition)

    async def stop(self) -> None:
        for partition in self._asks:
            self._stop_answering_locally(partition)
        for subs in self._asks.values():
            for sub in subs:
                await sub.unsubscribe()
        self._asks.clear()
        await cancel_and_wait(list(self._asking))  # unanswered: each tool publishes its result itself
        await super().stop()

    def _on_ask(self, msg: Msg, *, start: bool = False) -> None:
        """An ask, called from the connection's read loop: handled in a task of its own."""
        if not is_inbox(msg.reply):
            # the engine may publish where an asker may not (every execution's log): an
            # answer goes only to an inbox, never where a request points it; and an ask
            # whose answer cannot reach its asker is not one to store anything for
            log.warning("engine: an ask on %s named reply subject %.80r, not an inbox: ignored", msg.subject, msg.reply)
            return
        self._asked(self._answer(msg, full=self._full(), start=start))  # never blocks the read loop

    def _on_start_ask(self, msg: Msg) -> None:
        """A starter's ask (`answer.start.<p>`, semantics 6)."""
        self._on_ask(msg, start=True)

    def _local_ask(self, data: bytes) -> asyncio.Task[bytes]:
        """A tool's ask made on this pod's own connection (`Requester.answer_locally`)."""
        return self._asked(self._said(data, full=self._full(), start=False))

    def _local_start_ask(self, data: bytes) -> asyncio.Task[bytes]:
        """A starter's ask made on this pod's own connection."""
        return self._asked(self._said(data, full=self._full(), start=True))

    def _full(self) -> bool:
        return len(self._asking) >= ASKS_IN_FLIGHT

    def _asked(self, answering: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """An ask's task, counted against ASKS_IN_FLIGHT and cancelled at `stop`."""
        task = asyncio.create_task(answering)
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)
        return task

    def _stop_answering_locally(self, partition: int) -> None:
        local = requester(self.nc)
        for subject, _, answer in self._ask_subjects(partition):
            local.stop_answering_locally(subject, answer)

    async def _answer(self, msg: Msg, *, full: bool = False, start: bool = False) -> None:
        said = await self._said(msg.data, full=full, start=start)
        try:  # to its inbox (`_on_ask`)
            await self.nc.publish(msg.reply, said)
        except Exception as e:  # the tool times out and publishes the result itself
            log.debug("answer request: no reply sent: %r", e)

    async def _said(self, data: bytes, *, full: bool, start: bool) -> bytes:
        """What an ask is answered: `stored`, or `refused: <why>`."""
        if full:
            # a burst beyond what the pod handles: refused at once, before anything is
            # decoded; each tool publishes its result itself
            ANSWER_ASKS.inc(outcome="refused_before_fold")
            return b"refused: too many asks in flight"
        try:
            return (await self.ask(data, start=start)).encode()
        except Exception as e:
            return f"refused: {type(e).__name__}".encode()

    def misfit(self, key: MisfitKey) -> None:
        """Remember that step `key` decided what one answer record cannot hold."""
        self.misfits[key] = None
        self.misfits.move_to_end(key)
        while len(self.misfits) > MISFITS_REMEMBERED:
            self.misfits.popitem(last=False)

    async def ask(self, data: bytes, *, start: bool = False) -> str:
        """`_ask`, counted by outcome (`actors_answer_asks_total`)."""
        said, folded = await self._ask(data, start=start)
        outcome = "stored" if said == STORED else "refused_after_fold" if folded else "refused_before_fold"
        ANSWER_ASKS.inc(outcome=outcome)
        return said

    async def _ask(self, data: bytes, *, start: bool = False) -> tuple[str, bool]:
        """A tool asks to store its result (`data`) with the decision it leads to
        (`ExecutionActor.store_answer`, on `answer.<p>`), or a starter its start record
        with the first decision (`start`: on `answer.start.<p>`, semantics 6,
        `_ask_start`): `stored`, or `refused: <why>`; and whether the input was folded
        (a refusal after it costs a replay). Each subject takes its own: the tools user
        may publish `answer.<p>`, and a start record taken there would start an
        execution of any playbook source, limits and parent it names, none of the
        starter's checks made; only the engine user (its starter) publishes
        `answer.start.<p>`."""
        try:
            inp = codec_of(self.js).decode(input_decoder, data)
        except Exception as e:
            return f"refused: not a {'start record' if start else 'result'} ({type(e).__name__})", False
        if start:
            if not isinstance(inp, StartRecord):
                return "refused: not a start record", False
            return await self._ask_start(data, inp)
        if not isinstance(inp, (CallDone, CallError)):
            return "refused: not a result", False
        actor = self.actors.get(inp.execution_id)
        why = _not_ready(actor, inp)
        if why is not None or actor is None:
            return f"refused: {why}", False
        step = actor.state.activations[actor.state.by_command[inp.command_id]].step  # in flight (`_not_ready`)
        if misfit_key(actor.state, step) in self.misfits:
            return "refused: this step's decision did not fit one message before", False
        async with actor.turn:
            actor.busy = True  # `_evict` leaves it
            try:
                said = await actor.store_answer(data, inp)
            finally:
                actor.busy = actor.waiting
        return (STORED, True) if said == STORED else (f"refused: {said}", True)

    async def _ask_start(self, data: bytes, record: StartRecord) -> tuple[str, bool]:
        """A starter asks to store an execution's start record (`data`, as it sent it)
        with its first decision, as the log's first input (semantics 6,
        `ExecutionActor.store_start`). Refused before the fold unless the record is of
        semantics 6 to this code's, of an execution in a partition whose asks this pod
        serves (it holds the partition, `serves_asks`), tracing is off, no actor of the
        execution is resident (one that is has inputs to fold: a cancel or a signal sent
        before the start, which then must come first) and its first step is not one
        remembered as deciding what one record cannot hold (`misfits`). Else the actor is
        spawned here, as the partition's consumer would spawn it for the start's
        delivery, and folds it holding its `turn`; refused after the fold, it is dropped,
        unless the log may hold inputs it lacks (the server refused the record, or an
        input reached it meanwhile): then it is rebuilt by replay at its next input."""
        eid = record.execution_id
        if not START_ANSWERS <= record.semantics <= SEMANTICS:
            return f"refused: a start of semantics {record.semantics}", False
        if not EXECUTION_ID.fullmatch(eid) or self.layout.partition_of(eid) not in self._asks:
            return "refused: not an execution of a partition this pod serves asks for", False
        if tracing.enabled():
            return "refused: tracing is on", False
        if eid in self.actors:
            return "refused: the execution's actor is resident (inputs before the start)", False
        if misfit_key_of(record, start_step(record)) in self.misfits:
            return "refused: this playbook's first decision did not fit one message before", False
        self.retired.pop(eid, None)  # a new execution of a retired one's id: its log holds no input
        actor = self.spawn(eid)
        actor.busy = True  # `_evict` leaves it
        actor.task = asyncio.create_task(actor.run(), name=f"{type(actor).__name__}:{eid}")
        self.actors[eid] = actor
        if len(self.actors) > self.max_resident:
            self._evict()
        said = "the actor stopped"
        try:
            async with actor.turn:
                said = await actor.store_start(data, record)
        finally:
            actor.busy = actor.waiting
            refused_before_publish = said != STORED and not said.startswith(NOT_STORED)
            if refused_before_publish and actor.mailbox.empty() and not actor.waiting:
                # the log holds nothing it lacks: dropped, and the plain start record its
                # starter writes next is the first delivery of the log's first input (no
                # replay). Refused by the server (inputs came first: a cancel, a signal),
                # it stays, reset: the start is folded after them, by replay
                self.forget(eid, actor)
                if actor.task is not None:
                    actor.task.cancel()
        return (STORED, True) if said == STORED else (f"refused: {said}", True)

    def wakes_retired(self, subject: str) -> bool:
        """A retry of a finished execution is linked in its log (`execution.retried`);
        and a start record under a finished execution's id is folded by an actor
        rebuilt from the log: while the old log is there it is a second start, which
        changes nothing, and once the old execution was retired (its records removed,
        actors/store/retire.py) it is the start of a new one. A start stored with its
        first decision (semantics 6) is stored only in a log with no input: always a
        new one's."""
        return type_of(subject) in (RETRIED, START) or is_start_answer(subject)

    def spawn(self, key: str) -> ExecutionActor:
        return ExecutionActor(self, key)
