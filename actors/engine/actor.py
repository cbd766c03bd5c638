"""Per-execution engine actors, hosted by partition consumers.

An `Engine` owns a set of partitions. Each partition is a durable push consumer on
`exec.<p>.*.in.>` (inputs only). Messages are dispatched by execution id to an
`ExecutionActor`, which processes its inputs one at a time:

    input -> fold(state, input) -> publish commands -> publish decision record and
    lifecycle events -> ack input

Commands go first: a `command.issued` in the log then proves its command was
published, so a replay never needs to guess. The input is acked last: if the
process dies anywhere before, the input is redelivered and the new actor rebuilds
its state by replaying the execution's subject.

Replay (rehydrate): read the execution's whole subject with an ordered consumer,
fold every input again (same outputs, by determinism), and publish only the outputs
whose decision record or lifecycle event is missing from the log. Recognising them by
cause (the input's stream sequence) rather than relying on the server's duplicate
window is what keeps a replay after hours from duplicating anything.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from actors.blobs import (
    BLOB_MISSING,
    HEADROOM,
    blob_key,
    command_items,
    get_blob,
    offload,
    put_blob,
    resolve_result,
    result_message,
    start_item,
)
from actors.core.decide import PLAYBOOK_FAILED, Output, execution_error, fold
from actors.core.state import Execution
from actors.hosting import PartitionHost, engine_error, hand_back
from actors.natsio import (
    ack,
    arm_timers,
    command_sent,
    dead_letter,
    has_message,
    log_time,
    publish_all,
    stop_commands,
    stream_seq,
)
from actors.wire import (
    CallDone,
    CancelRequest,
    DecisionRecord,
    EngineFault,
    ErrorInfo,
    Event,
    IteratorCompleted,
    IteratorFailed,
    LoopSpec,
    StartRecord,
    decision_decoder,
    encode,
    event_decoder,
    input_decoder,
)
from streams.layout import (
    EV,
    EXEC_STREAM,
    IN,
    LC,
    LOOP_STREAM,
    Layout,
    class_of,
    engine_consumer,
    execution_of,
    type_of,
)

log = logging.getLogger("actors.engine")
fault_decoder = msgspec.json.Decoder(EngineFault)
REPLAY_IDLE_TIMEOUT = 10.0


class ExecutionActor:
    def __init__(self, engine: Engine, execution_id: str) -> None:
        self.engine = engine
        self.execution_id = execution_id
        self.prefix = engine.layout.exec_prefix(execution_id)
        self.reply_to = f"{self.prefix}.{IN}.result"
        self.state = Execution(execution_id=execution_id)
        self.last_seq = 0
        self.hydrated = False
        self.replayed = False  # set once a failure made this actor rebuild itself from the log
        self.mailbox: asyncio.Queue[Msg] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # an idle actor may be evicted (PartitionHost._evict)
        self.off_loop = False  # fold on a worker thread: a template took more than its inline slice
        self.skip: set[int] = set()  # stream seqs of inputs given up on (EngineFault): never folded

    # --- live ------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            msg = await self.mailbox.get()
            self.busy = True
            try:
                await self.engine.handle_until_done([msg], functools.partial(self.handle, msg), reset=self.reset,
                                                    what=f"execution {self.execution_id} ({msg.subject})", actor=self,
                                                    give_up=functools.partial(self.give_up, msg))
            except asyncio.CancelledError:
                await hand_back([msg], self.mailbox)  # the partition's next owner replays it
                raise
            finally:
                self.busy = False
            if self.state.terminal and self.mailbox.empty():
                self.engine.retire(self.execution_id, self)
                return

    def reset(self) -> None:
        """After a failure: the state may be ahead of the log (folded, not all
        published), rebuild it by replay."""
        self.hydrated = False
        self.replayed = True

    async def give_up(self, msg: Msg, error: Exception, level: int) -> bool:
        """Handling `msg` failed deterministically, again and again. The first time, an
        `EngineFault` naming it goes to the execution's inputs: the replay that follows
        skips `msg` and folds the fault, which fails the execution with the error. If
        even that fails, the execution's end is written straight to its lifecycle and
        the actor stops: no execution stays RUNNING because of an engine bug."""
        seq = stream_seq(msg)
        info = engine_error(error, subject=msg.subject, seq=seq, data=msg.data)
        eid, js = self.execution_id, self.engine.js
        if level == 1:
            fault = EngineFault(execution_id=eid, input_seq=seq, input_subject=msg.subject, error=info)
            await publish_all(js, [(f"{self.prefix}.{IN}.fault", encode(fault), f"{eid}:fault:{seq}")])
            self.skip.add(seq)
            return False
        ended = Event(type=PLAYBOOK_FAILED, execution_id=eid, at=log_time(msg), cause=seq,
                      data={"playbook": self.state.playbook_path, "started_at": self.state.started_at,
                            "ended_at": log_time(msg),
                            "error": execution_error(info, step=None, failed_steps=list(self.state.failed_steps))})
        await publish_all(js, [(f"{self.prefix}.{LC}.{PLAYBOOK_FAILED}", encode(ended), f"{eid}:lc:{PLAYBOOK_FAILED}")])
        self.state.status = "FAILED"
        await ack(msg)
        return True

    async def handle(self, msg: Msg) -> None:
        seq = stream_seq(msg)
        if not self.hydrated:
            first_start = not self.replayed and msg.metadata.num_delivered == 1 and type_of(msg.subject) == "start"
            if first_start:
                self.hydrated = True  # a first delivery of a start record: nothing precedes it
            else:
                await self.rehydrate()
        if seq > self.last_seq:
            out = await self.fold_message(msg.subject, msg.data, seq, log_time(msg))
            if out:
                await self.publish(out)
        await ack(msg)

    async def fold_message(self, subject: str, data: bytes, seq: int, at: float) -> Output | None:
        self.last_seq = seq
        try:
            inp = input_decoder.decode(data)
        except msgspec.DecodeError as e:
            if self.hydrated:
                await dead_letter(
                    self.engine.js,
                    source="engine",
                    reason=f"undecodable input on {subject}: {e}",
                    subject=subject,
                    data=data,
                    execution_id=self.execution_id,
                )
            return None
        if isinstance(inp, StartRecord) and inp.execution_id != self.execution_id:
            return None
        if seq in self.skip:
            return None  # given up on (EngineFault): folding it failed, and would again
        inp = await self._read_back(inp)
        state = self.state
        return await self.engine.fold_off_loop(
            self, functools.partial(fold, state, inp, seq=seq, at=at, reply_to=self.reply_to))

    async def _read_back(self, inp: Any) -> Any:
        """The input with the values it carries as blobs (too large for a message) read
        back, live and in a replay alike. A blob that is gone becomes the input's error
        (the step or the execution fails saying so), never an input retried for ever."""
        js = self.engine.js
        if isinstance(inp, CallDone) and inp.result_ref is not None:
            return await resolve_result(js, inp)
        if isinstance(inp, StartRecord) and inp.payload_ref is not None:
            try:
                payload = await get_blob(js, inp.payload_ref)
            except BLOB_MISSING:
                payload = None
            if isinstance(payload, dict):
                inp.payload, inp.payload_ref = payload, None
            elif inp.error is None:
                inp.error = ErrorInfo(type="ValueMissing", message=f"start payload blob {inp.payload_ref} not found "
                                                                   "(expired or removed)")
            return inp
        if isinstance(inp, IteratorCompleted) and inp.results is None and inp.results_ref:
            try:
                inp.results = await get_blob(js, inp.results_ref)
            except NotFoundError:
                # the blob expired or was removed: the loop's results are gone, say so
                return IteratorFailed(execution_id=inp.execution_id, loop_id=inp.loop_id, step=inp.step,
                                      total=inp.total, succeeded=inp.succeeded, failed=inp.failed, errors=[{
                                          "index": -1, "error": {"type": "ResultsMissing", "status": None,
                                                                 "message": f"blob {inp.results_ref} not found",
                                                                 "retryable": False, "traceback": None}}])
        return inp

    async def publish(
        self, out: Output, *, seen_ev: bool = False, seen_lc: frozenset[str] = frozenset(),
        results_seen: frozenset[str] | None = None, timers_fired: frozenset[str] = frozenset(),
    ) -> None:
        """Publish a decision's outputs: commands and timers, then its record, then
        lifecycle events. In a replay, `seen_*` say what the log already holds,
        `results_seen` the commands whose results it holds and `timers_fired` the timers
        that fired; only the rest is sent."""
        js, eid = self.engine.js, self.execution_id
        if not seen_ev:
            commands = out.commands
            if results_seen is not None:
                commands = [c for c in commands
                            if not await command_sent(self.engine.nc, c, results_seen, reply_stream=EXEC_STREAM)]
            # a command too large for a message goes as a blob (over the cap: its step fails)
            await publish_all(js, await command_items(js, commands, limit=self.engine.layout.max_msg_size - HEADROOM))
            await self._hand_over_loops(out.loops, replay=results_seen is not None)
            await arm_timers(js, [t for t in out.timers if t.timer_id not in timers_fired], prefix=self.prefix,
                             id_prefix=eid)
            await self._signal(out)
        items = []
        if out.events and not seen_ev:
            record = DecisionRecord(cause=out.cause, events=out.events)
            items.append((f"{self.prefix}.{EV}.decision", encode(record), f"{eid}:ev:{out.cause}"))
        for ev in out.lifecycle:
            if ev.type not in seen_lc:
                await self._offload_result(ev)
                items.append((f"{self.prefix}.{LC}.{ev.type}", encode(ev), f"{eid}:lc:{ev.type}"))
        await publish_all(js, items)

    async def _hand_over_loops(self, loops: list[LoopSpec], *, replay: bool) -> None:
        """Each loop goes to the counter as one spec on the loop's own log; a large
        collection or scope travels as a blob. In a replay, a spec already in the
        loop's log is not sent again."""
        js, eid, layout = self.engine.js, self.execution_id, self.engine.layout
        items = []
        for spec in loops:
            subject = layout.loop_subject(eid, spec.loop_id, IN, "spec")
            if replay and await has_message(self.engine.nc, LOOP_STREAM, subject):
                continue
            ref = await offload(js, f"{eid}/{spec.loop_id}/collection", spec.collection)
            if ref is not None:
                spec.collection, spec.collection_ref = None, ref
            data = encode(spec)
            if len(data) > layout.max_msg_size - HEADROOM:  # the values its templates read are large
                scope = encode(spec.scope)
                spec.scope, spec.scope_ref = {}, blob_key(eid, spec.loop_id, "scope", data=scope)
                await put_blob(js, spec.scope_ref, scope)
                data = encode(spec)
            items.append((subject, data, f"{eid}:loop:{spec.loop_id}"))
        await publish_all(js, items)

    async def _offload_result(self, ev: Event) -> None:
        """An execution result too large for its lifecycle event goes to a blob; the
        event names it (`result_ref`) and the client reads it from there."""
        result = ev.data.get("result")
        ref = await offload(self.engine.js, f"{self.execution_id}/result", result) if result is not None else None
        if ref is not None:
            ev.data = {**ev.data, "result": None, "result_ref": ref}

    async def _signal(self, out: Output) -> None:
        """What a decision tells other executions and tool actors: children to start or
        cancel, the parent's result, commands to stop. Each is idempotent on the
        receiving side (start by execution id, results and cancels by state), so a
        replay may send them again."""
        js, layout = self.engine.js, self.engine.layout
        limit = layout.max_msg_size - HEADROOM
        items = []
        for s in out.starts:
            items.append(await start_item(js, s, limit=limit))
        if out.reply is not None:  # a child's result to its parent: a blob when too large, like a tool's
            subject, msg = out.reply
            items.append((subject, await result_message(js, msg, limit=limit), f"{msg.execution_id}:res:{msg.command_id}"))
        for child in out.child_cancels:
            req = CancelRequest(execution_id=child, reason=f"parent execution {self.execution_id} cancelled it")
            items.append((layout.exec_subject(child, IN, "cancel"), encode(req), f"{child}:cancel"))
        for lc in out.loop_cancels:
            items.append((layout.loop_subject(self.execution_id, lc.loop_id, IN, "cancel"), encode(lc),
                          f"{self.execution_id}:loopcancel:{lc.loop_id}"))
        await publish_all(js, items)
        await stop_commands(self.engine.nc, self.execution_id, out.cancels)

    # --- replay ----------------------------------------------------------------------

    async def rehydrate(self) -> None:
        js = self.engine.js
        sub = await js.subscribe(
            f"{self.prefix}.>", stream=EXEC_STREAM, ordered_consumer=True, pending_msgs_limit=-1
        )
        inputs: list[tuple[str, bytes, int, float]] = []
        results: set[str] = set()
        fired: set[str] = set()
        recorded: dict[tuple[int, int], dict[str, Any]] = {}
        seen_ev: set[int] = set()
        seen_lc: set[str] = set()
        try:
            while True:
                msg = await sub.next_msg(timeout=REPLAY_IDLE_TIMEOUT)
                cls = class_of(msg.subject)
                if cls == IN:
                    inputs.append((msg.subject, msg.data, stream_seq(msg), log_time(msg)))
                    kind = type_of(msg.subject)
                    if kind.startswith("result."):
                        results.add(kind.split(".", 1)[1])
                    elif kind.startswith("timer."):
                        fired.add(kind.split(".", 1)[1])
                    elif kind == "fault":
                        self.skip.add(fault_decoder.decode(msg.data).input_seq)
                elif cls == EV:
                    record = decision_decoder.decode(msg.data)
                    seen_ev.add(record.cause)
                    for ev in record.events:
                        if ev.type == "step.failure_decided":
                            recorded[(int(ev.data["activation"]), int(ev.data["attempt_number"]))] = ev.data
                elif cls == LC:
                    seen_lc.add(event_decoder.decode(msg.data).type)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        self.state = Execution(execution_id=self.execution_id, recorded=recorded)
        self.last_seq = 0
        frozen_lc, frozen_results, frozen_fired = frozenset(seen_lc), frozenset(results), frozenset(fired)
        for subject, data, seq, at in inputs:
            out = await self.fold_message(subject, data, seq, at)
            if out:
                await self.publish(out, seen_ev=out.cause in seen_ev, seen_lc=frozen_lc,
                                   results_seen=frozen_results, timers_fired=frozen_fired)
        self.hydrated = True
        log.info("execution %s: replayed %d inputs, state %s", self.execution_id, len(inputs), self.state.status)


class Engine(PartitionHost[str, ExecutionActor]):
    """Hosts execution actors for the partitions it owns."""

    def __init__(self, nc: NATS, *, layout: Layout, retired_cache: int = 10_000) -> None:
        super().__init__(nc, layout=layout, consumer=engine_consumer, key_of=execution_of,
                         partition_of=layout.partition_of, retired_cache=retired_cache,
                         max_resident=layout.engine_max_resident, role="engine")

    def spawn(self, key: str) -> ExecutionActor:
        return ExecutionActor(self, key)
