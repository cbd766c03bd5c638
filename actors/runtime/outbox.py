"""Effects into messages: the one place that turns what a decision asks for
(actors/core/effects.py `Effects`) into subjects, payloads and message ids, and
publishes them, for the engine and the counter alike.

Order (`send`): commands and child starts, loops handed over, signals forwarded to
loops of waits, timers, the parent's
result, cancels of children and loops, commands stopped, a loop's failed iterations
(one record each) and its verdict, then the
decision record and lifecycle events. Each step waits for its PubAcks before the
next: a decision record in the log proves that everything it decided was stored, so
a replay that finds the record sends nothing of that decision again.

Values too large for a message (commands, child payloads, loop collections and scopes,
results) go as blobs (actors/store/blobs.py), named from the message.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from msgspec import UNSET, Raw
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from actors.core.effects import CommandCancel, Effects, SignalForward, Timer
from actors.natsio import SCHEDULE, SCHEDULE_TARGET, publish_all, schedule_at
from actors.natsio.binding import codec_of
from actors.store.blobs import HEADROOM, blob_key, command_items, offload, put_blob, result_message, sealed, start_item
from actors.wire.codec import PayloadCodec
from actors.wire.events import (
    REPEATED_LIFECYCLE,
    DecisionRecord,
    Event,
    LifecycleExtras,
    PlaybookCompletedData,
    PlaybookFailedData,
    carrier_of,
    splice,
)
from actors.wire.messages import CancelRequest, FailedItem, IteratorCompleted, IteratorFailed, LoopSpec, encode
from streams import ids
from streams.layout import TOOL_KINDS, Layout
from streams.subjects import ExecSubjects, LoopSubjects, cancel_subject

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.runtime.exectrace import Carrier
    from actors.wire.events import AnyEvent

TIMER_DUE_SLACK = 0.05  # a timer due within this is delivered at once, not scheduled


class Outbox:
    """Publishes the effects of one log (an execution's or a loop's)."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        layout: Layout,
        *,
        execution_id: str,
        subjects: ExecSubjects | LoopSubjects,
        loop_id: str | None = None,
        sender: str,
    ) -> None:
        self.nc = nc
        self.js = js
        self.layout = layout
        self.execution_id = execution_id
        self.subjects = subjects
        self.loop_id = loop_id
        self.sender = sender  # who answers a command it could not send (`worker` of that answer)
        self.timer_owner = ids.timer_owner(execution_id, loop_id)
        self.limit = layout.max_msg_size - HEADROOM  # larger values go as blobs
        self.cap = layout.max_value_bytes  # larger ones are refused (`ValueTooLarge`)
        self.codec = codec_of(js)  # values encrypted when the pod has a payload key (actors/wire/codec.py)
        # a decision with lifecycle events is stored as one message, its carrier event's
        # (`LifecycleExtras`): set by the engine for executions of semantics 2 on
        self.carry = False
        # the trace context its messages carry in their headers (docs/tracing.md): set
        # by the engine and the counter while tracing is on; None, no headers at all
        self.trace: Carrier | None = None
        # a loop's: where its verdict goes instead of the loop's own subject, the
        # execution's one subject for every loop's verdict (`LoopSpec.answer_on`)
        self.verdict_to: str | None = None

    async def send(self, fx: Effects) -> None:
        js = self.js
        # the decision's record and lifecycle events, as stored messages: fixed first,
        # since one may hold the decision's command (semantics 2: `decision_messages`),
        # which then is not sent to CMD; published last, after everything they decided
        record: list[tuple[str, bytes, str]] = []
        held = False
        if isinstance(self.subjects, ExecSubjects) and (fx.events or fx.lifecycle):
            for ev in fx.lifecycle:
                await self.offload_result(ev)
            record, held = decision_messages(
                self.codec, fx, self.subjects, self.execution_id, carry=self.carry, limit=self.limit
            )
        # each step only when it has something to send: most inputs decide a command or
        # two and a record, and every empty step cost a coroutine or two, per input
        if (fx.commands and not held) or fx.starts:
            commands = [] if held else fx.commands
            starts = [await start_item(js, s, limit=self.limit, cap=self.cap) for s in fx.starts]
            items = await command_items(js, commands, limit=self.limit, cap=self.cap, sender=self.sender) + starts
            trace = self.trace
            headers = (
                None
                if trace is None
                else [trace.command(c) or {} for c in commands] + [trace.start(s) or {} for s in fx.starts]
            )
            await publish_all(js, items, headers=headers)
        if fx.loops:
            await self.hand_over_loops(fx.loops)
        if fx.signal_forwards:
            await self.forward_signals(fx.signal_forwards)
        if fx.timers:
            await self.arm(fx.timers)
        if fx.reply is not None or fx.child_cancels or fx.loop_cancels:
            await publish_all(js, await self.signals(fx))
        if fx.cancels:
            await self.stop(fx.cancels)
        if fx.failures:
            await self.record_failures(fx.failures)
        if fx.verdict is not None:
            await self.send_verdict(fx.verdict)
        if record:
            # a record holding its command carries the command's trace context
            carried = self.trace.command(fx.commands[0]) if held and self.trace is not None else None
            await publish_all(js, record, headers=[carried] * len(record) if carried else None)

    async def hand_over_loops(self, loops: list[LoopSpec]) -> None:
        """Each loop goes to the counter as one spec on the loop's own log; a large
        collection or scope travels as a blob."""
        js, eid = self.js, self.execution_id
        items = []
        for spec in loops:
            ref = await offload(js, f"{eid}/{spec.loop_id}/collection", spec.collection)
            if ref is not None:
                spec.collection, spec.collection_ref = None, ref
            data = self.codec.encode(spec)
            if len(data) > self.limit:  # the values its templates read are large
                scope = sealed(js, encode(spec.scope))
                spec.scope, spec.scope_ref = {}, blob_key(eid, spec.loop_id, "scope", data=scope)
                await put_blob(js, spec.scope_ref, scope)
                data = self.codec.encode(spec)
            items.append((self.loop_subjects(spec.loop_id).spec, data, ids.loop_spec_id(eid, spec.loop_id)))
        trace = self.trace
        await publish_all(js, items, headers=None if trace is None else [trace.loop(spec) or {} for spec in loops])

    async def forward_signals(self, forwards: list[SignalForward]) -> None:
        """Each signal to its loop's log (`in.signal`), after the loop's spec: its id
        makes a re-send (a replay) one signal there, and the counter keeps the ids it
        took past the duplicate window."""
        eid = self.execution_id
        await publish_all(
            self.js,
            [
                (
                    self.loop_subjects(f.loop_id).signal,
                    self.codec.encode(f.signal),
                    ids.signal_forward_id(eid, f.loop_id, f.signal.signal_id),
                )
                for f in forwards
            ],
        )

    def loop_subjects(self, loop_id: str) -> LoopSubjects:
        return LoopSubjects.of(self.execution_id, loop_id, self.layout.partitions)

    async def arm(self, timers: list[Timer]) -> None:
        """Store each timer in the log as a scheduled message (`sch`): the server
        delivers it to `in.timer.<id>` when due, whatever happened to the process that
        armed it. Re-arming is idempotent (one schedule per subject); a timer already
        due (a replay after an outage) is delivered at once."""
        if not timers:
            return
        now, subjects, owner = time.time(), self.subjects, self.timer_owner
        later = [t for t in timers if t.due > now + TIMER_DUE_SLACK]
        due = [t for t in timers if t.due <= now + TIMER_DUE_SLACK]
        await publish_all(
            self.js,
            [(subjects.schedule(t.timer_id), encode(t.fire), ids.schedule_id(owner, t.timer_id)) for t in later],
            headers=[{SCHEDULE: schedule_at(t.due), SCHEDULE_TARGET: subjects.timer(t.timer_id)} for t in later],
        )
        await publish_all(
            self.js, [(subjects.timer(t.timer_id), encode(t.fire), ids.timer_id_msg(owner, t.timer_id)) for t in due]
        )

    async def signals(self, fx: Effects) -> list[tuple[str, bytes, str]]:
        """What a decision tells other logs: the parent's result, children and loops to
        cancel. Each is idempotent on the receiving side (results and cancels by
        state), so a replay may send them again."""
        items = []
        if fx.reply is not None:  # a child's result to its parent: a blob when too large, like a tool's
            subject, msg = fx.reply
            items.append(
                (
                    subject,
                    await result_message(self.js, msg, limit=self.limit, cap=self.cap),
                    ids.result_id(msg.execution_id, msg.command_id),
                )
            )
        why = (
            f"loop {self.loop_id} of {self.execution_id} stopped"
            if self.loop_id is not None
            else f"parent execution {self.execution_id} cancelled it"
        )
        for child in fx.child_cancels:
            items.append(cancel_request(self.layout, child, why))
        for lc in fx.loop_cancels:
            items.append(
                (
                    self.loop_subjects(lc.loop_id).cancel,
                    self.codec.encode(lc),
                    ids.loop_cancel_id(self.execution_id, lc.loop_id),
                )
            )
        return items

    async def stop(self, cancels: list[CommandCancel]) -> None:
        """Tell the tool actors to stop each command: the one running it stops it, and
        one that takes it from the queue later answers `Cancelled` without running it
        (tool actors remember recent cancels).

        Commands are never purged from the work queue: a filtered purge of CMD while
        some of its messages are pending on a consumer whose client has died leaves
        other messages in the stream that the consumer never delivers again
        (nats-server; found by tests/system/test_chaos.py, the same class as nats-server issue
        #7680). A cancelled command that does run anyway (a tool pod that started after
        the cancel) has its result ignored: it answers a command no longer in flight."""
        for c in cancels:
            await self.nc.publish(cancel_subject(self.execution_id, c.command_id), b"")

    async def record_failures(self, failures: list[FailedItem]) -> None:
        """Each iteration failed for good, on its own subject beside the loop's log
        (`fail.<index>`), before the verdict: once the loop's end is known, every failure
        of it can be listed."""
        assert isinstance(self.subjects, LoopSubjects) and self.loop_id is not None
        subjects, eid, loop_id = self.subjects, self.execution_id, self.loop_id
        await publish_all(
            self.js,
            [
                (subjects.failed(f.index), self.codec.encode(f), ids.failed_item_id(eid, loop_id, f.index))
                for f in failures
            ],
        )

    async def send_verdict(self, verdict: IteratorCompleted | IteratorFailed) -> None:
        """A loop's end, into its execution's inputs (`in.iterator.<loop_id>`, or the
        execution's one subject for every verdict, `in.iterator`, when the spec names it:
        `verdict_to`); aggregated results too large for the message go as a blob."""
        assert self.loop_id is not None
        if verdict.results is not None:
            ref = await offload(self.js, f"{self.execution_id}/{self.loop_id}/results", verdict.results)
            if ref is not None:
                verdict.results, verdict.results_ref = None, ref
        subject = self.verdict_to or ExecSubjects.of(self.execution_id, self.layout.partitions).iterator(self.loop_id)
        await publish_all(
            self.js, [(subject, self.codec.encode(verdict), ids.verdict_id(self.execution_id, self.loop_id))]
        )

    async def record(self, fx: Effects) -> None:
        """Only the decision's record and lifecycle events (`decision_messages`; an
        execution result too large for its event goes first as a blob the event names:
        `result_ref`), for a decision that sends nothing else (an engine giving up on an
        input)."""
        if not isinstance(self.subjects, ExecSubjects):
            return
        for ev in fx.lifecycle:
            await self.offload_result(ev)
        items, _ = decision_messages(
            self.codec, fx.copy(commands=[]), self.subjects, self.execution_id, carry=self.carry, limit=self.limit
        )
        await publish_all(self.js, items)

    async def offload_result(self, ev: Event) -> None:
        data = ev.data
        if not isinstance(data, (PlaybookCompletedData, PlaybookFailedData)):
            return
        if data.result is None or data.result is UNSET:
            return
        ref = await offload(self.js, f"{self.execution_id}/result", data.result)
        if ref is not None:
            data.result, data.result_ref = None, ref


Items = list[tuple[str, bytes, str]]


def decision_messages(
    codec: PayloadCodec, fx: Effects, subjects: ExecSubjects, execution_id: str, *, carry: bool, limit: int
) -> tuple[Items, bool]:
    """The stored messages of a decision's record and lifecycle events, and whether
    one of them holds the decision's command (which then is not sent to CMD). Pure: a
    replay that derives the same decision gets the same bytes under the same ids.

    Semantics 1 (`carry` False): a decision record (`ev.decision`), then each lifecycle
    event on its own subject. Semantics 2 (`carry`), one message per decision:

    * with lifecycle events, the carrier event holds the record and the others
      (actors/wire/events.py `LifecycleExtras`), on its own subject
      (`lc.playbook.completed`);
    * the decision's one command to a tool kind, when it has exactly one, is held by
      its record (`DecisionRecord.command`), and the message's subject says the kind:
      `ev.cmd.<kind>`, or `lc.<type>.cmd.<kind>` for a carrier (an execution's first
      decision: its first step's command), where that kind's tool actors take it
      (streams/layout.py `tool_log_consumer`);
    * what would pass `limit` (large values in several events) falls back: without the
      command (it goes to CMD as its own message), then to semantics 1's messages."""
    if not carry:
        return _separate(codec, fx, subjects, execution_id), False
    command = holdable(codec, fx)
    for held in (command, None) if command is not None else (None,):
        one = _one_message(codec, fx, subjects, execution_id, held)
        if one is not None and len(one[1]) <= limit:
            return [one], held is not None
    return _separate(codec, fx, subjects, execution_id), False


def _one_message(
    codec: PayloadCodec, fx: Effects, subjects: ExecSubjects, execution_id: str, held: Raw | None
) -> tuple[str, bytes, str] | None:
    """The decision as one message, holding `held` (its command) or not; None when one
    message is not its shape (no lifecycle event and no command held)."""
    kind = fx.commands[0].kind if held is not None else ""
    if fx.lifecycle:
        decided = fx.events or held is not None
        type_, body = carrier_message(
            codec, fx.lifecycle, DecisionRecord(cause=fx.cause, events=fx.events, command=held) if decided else None
        )
        subject = subjects.lifecycle_with_command(type_, kind) if held is not None else subjects.lifecycle(type_)
        return subject, body, lifecycle_msg_id(execution_id, type_, fx.cause)
    if held is None:
        return None
    record = DecisionRecord(cause=fx.cause, events=fx.events, command=held)
    return subjects.decision_with_command(kind), codec.encode(record), ids.decision_id(execution_id, fx.cause)


def carrier_message(
    codec: PayloadCodec, lifecycle: Sequence[AnyEvent], decision: DecisionRecord | None
) -> tuple[str, bytes]:
    """A decision's lifecycle events as one message: the carrier event (`carrier_of`)
    spliced with `LifecycleExtras` holding `decision` and the other events. Returns the
    carrier's type and the body. Pure; also the body of an answer record that ends or
    changes the execution (semantics 5, `in.answer.lc.<type>`, the engine's
    `store_answer`), whose `decision` holds the result."""
    at = carrier_of(lifecycle)
    ev = lifecycle[at]
    extras = LifecycleExtras(decision=decision, before=lifecycle[:at], after=lifecycle[at + 1 :])
    return ev.type, splice(codec.encode(ev), codec.encode(extras))


def holdable(codec: PayloadCodec, fx: Effects) -> Raw | None:
    """The decision's command, encoded as its own message would be, when a record may
    hold it: exactly one command, to a kind tool actors take from the log, small
    enough to travel in a message (not a stub naming a blob)."""
    if len(fx.commands) != 1:
        return None
    cmd = fx.commands[0]
    if cmd.kind not in TOOL_KINDS or cmd.body_ref is not None or cmd.iteration_index is not None:
        return None
    return Raw(codec.encode(cmd))


def _separate(codec: PayloadCodec, fx: Effects, subjects: ExecSubjects, execution_id: str) -> Items:
    items = []
    if fx.events:
        record = DecisionRecord(cause=fx.cause, events=fx.events)
        items.append((subjects.decision, codec.encode(record), ids.decision_id(execution_id, fx.cause)))
    for ev in fx.lifecycle:
        items.append((subjects.lifecycle(ev.type), codec.encode(ev), lifecycle_msg_id(execution_id, ev.type, fx.cause)))
    return items


def lifecycle_msg_id(execution_id: str, event_type: str, cause: int) -> str:
    """A lifecycle event's message id: once per execution, but an event written more
    than once (`execution.waiting`) once per decision, so the next is not a duplicate."""
    if event_type in REPEATED_LIFECYCLE:
        return f"{ids.lifecycle_id(execution_id, event_type)}:{cause}"
    return ids.lifecycle_id(execution_id, event_type)


def cancel_request(layout: Layout, execution_id: str, reason: str) -> tuple[str, bytes, str]:
    """The publish item that asks an execution to cancel (a parent, a loop, a user)."""
    req = CancelRequest(execution_id=execution_id, reason=reason)
    return ExecSubjects.of(execution_id, layout.partitions).cancel, encode(req), ids.cancel_id(execution_id)
